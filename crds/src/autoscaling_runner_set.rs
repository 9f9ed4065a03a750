//! `AutoscalingRunnerSet`: the user-facing kind, one per runner scale set.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{MetricsConfig, ProxyConfig, ResourceMeta, TlsConfig, VaultConfig};
use crate::schedule::MinRunnersSchedule;

// No field is schema-required; all are omitted from JSON when empty (Go `omitempty`).
/// Desired state of a runner scale set.
// Every `printcolumn(...)` repeats the same keys, which clippy mistakes for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "actions.github.com",
    version = "v1alpha1",
    kind = "AutoscalingRunnerSet",
    doc = "A runner scale set: GitHub Actions runners created on demand for the jobs of an organization, repository or enterprise.",
    namespaced,
    status = "AutoscalingRunnerSetStatus",
    derive = "PartialEq",
    derive = "Default",
    crates(kube_core = "::kube_core"),
    printcolumn(name = "Minimum Runners", type_ = "integer", json_path = ".spec.minRunners"),
    printcolumn(name = "Maximum Runners", type_ = "integer", json_path = ".spec.maxRunners"),
    printcolumn(name = "Current Runners", type_ = "integer", json_path = ".status.currentRunners"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Pending Runners", type_ = "integer", json_path = ".status.pendingEphemeralRunners"),
    printcolumn(name = "Running Runners", type_ = "integer", json_path = ".status.runningEphemeralRunners"),
    // The next two point at status fields that do not exist (ARC's CRD has the same columns); kept so `kubectl
    // get` prints the same table as with ARC.
    printcolumn(name = "Finished Runners", type_ = "integer", json_path = ".status.finishedEphemeralRunners"),
    printcolumn(name = "Deleting Runners", type_ = "integer", json_path = ".status.deletingEphemeralRunners"),
    // Not in ARC (appended, so ARC's columns keep their places): whether jobs reach runners of this set, i.e.
    // the `Ready` condition (scale set found, listener holding its session, runners able to start).
    printcolumn(name = "Served", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status")
)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingRunnerSetSpec {
    /// GitHub organization, repository or enterprise URL the runners register with. Functionally required.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub github_config_url: String,
    /// Name of the Secret with GitHub credentials in this namespace, or the vault lookup key when `vaultConfig`
    /// is set. Functionally required.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub github_config_secret: String,
    /// Runner group; empty means the default group.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub runner_group: String,
    /// Scale set name in GitHub; defaults to `metadata.name` and is then written back here.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub runner_scale_set_name: String,
    /// Extra labels of the scale set in GitHub.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runner_scale_set_labels: Vec<String>,
    /// Proxy for connections to GitHub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyConfig>,
    /// TLS settings for a GitHub Enterprise Server.
    #[serde(
        default,
        rename = "githubServerTLS",
        skip_serializing_if = "Option::is_none"
    )]
    pub github_server_tls: Option<TlsConfig>,
    /// Read credentials from a vault instead of a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vault_config: Option<VaultConfig>,
    /// Runner pod template.
    #[serde(default)]
    #[schemars(transform = crate::schema::no_default)]
    pub template: PodTemplateSpec,
    /// Extra labels and annotations for the AutoscalingListener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling_listener: Option<ResourceMeta>,
    /// Metric selection passed to the listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener_metrics: Option<MetricsConfig>,
    /// Customisation of the listener pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener_template: Option<PodTemplateSpec>,
    /// Extra metadata for the listener ServiceAccount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener_service_account_metadata: Option<ResourceMeta>,
    /// Extra metadata for the listener Role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener_role_metadata: Option<ResourceMeta>,
    /// Extra metadata for the listener RoleBinding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener_role_binding_metadata: Option<ResourceMeta>,
    /// Extra metadata for the listener config Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener_config_secret_metadata: Option<ResourceMeta>,
    /// Extra metadata for the EphemeralRunnerSet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_runner_set_metadata: Option<ResourceMeta>,
    /// Extra metadata for each EphemeralRunner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_runner_metadata: Option<ResourceMeta>,
    /// Extra metadata for each runner's JIT config Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_runner_config_secret_metadata: Option<ResourceMeta>,
    /// Upper bound of runners; absent means no bound (2147483647).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0), transform = crate::schema::go_int)]
    pub max_runners: Option<i64>,
    /// Number of idle runners kept ready; absent means 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0), transform = crate::schema::go_int)]
    pub min_runners: Option<i64>,
    /// Not in ARC: time windows (recurring, in an IANA time zone) in which another minimum replaces
    /// `minRunners`; where windows overlap the highest minimum wins. Absent: `minRunners` always applies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub min_runners_schedules: Vec<MinRunnersSchedule>,
    /// Not in ARC: after demand falls, the desired runner count stays at its peak of the last this many seconds
    /// (never above `maxRunners`), so the next burst finds idle runners. Absent or 0: off, as in ARC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86400), transform = crate::schema::go_int)]
    pub scale_down_delay_seconds: Option<i64>,
    /// Not in ARC: ask GitHub to run a job again when the cluster, not the workflow, ended it (its runner pod
    /// OOM-killed, evicted, deleted, or its node lost). Absent: never, as in ARC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_interrupted_jobs: Option<RerunInterruptedJobs>,
}

/// Not in ARC: the re-run of jobs the infrastructure interrupted (docs/runner-lifecycle.md, "Jobs the cluster
/// interrupted run again").
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RerunInterruptedJobs {
    /// Ask for the re-runs.
    #[serde(default)]
    #[schemars(transform = crate::schema::no_default)]
    pub enabled: bool,
    /// How many times one job is re-run at most, counted by its run's attempt number (a run re-run by hand
    /// counts too), 1 to 5. Absent: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 5), transform = crate::schema::go_int)]
    pub max_reruns: Option<i64>,
}

impl RerunInterruptedJobs {
    /// The re-run limit in effect, when enabled (absent: 1; kept within the schema's bounds).
    pub fn limit(&self) -> Option<i64> {
        self.enabled
            .then(|| self.max_reruns.unwrap_or(1).clamp(1, 5))
    }
}

// Fields are always serialised, zero values included (not `omitempty` in ARC).
/// Observed state, copied from the EphemeralRunnerSet.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingRunnerSetStatus {
    /// Runners that exist (pending + running + failed).
    #[serde(default)]
    #[schemars(transform = crate::schema::go_int, transform = crate::schema::no_default)]
    pub current_runners: i64,
    /// `Pending`, `Running` or `Outdated`.
    #[serde(default)]
    #[schemars(transform = crate::schema::no_default)]
    pub phase: String,
    /// Runners whose pod is not running yet.
    #[serde(default)]
    #[schemars(transform = crate::schema::go_int, transform = crate::schema::no_default)]
    pub pending_ephemeral_runners: i64,
    /// Runners whose pod is running.
    #[serde(default)]
    #[schemars(transform = crate::schema::go_int, transform = crate::schema::no_default)]
    pub running_ephemeral_runners: i64,
    /// Runners that failed.
    #[serde(default)]
    #[schemars(transform = crate::schema::go_int, transform = crate::schema::no_default)]
    pub failed_ephemeral_runners: i64,
    /// Not in ARC: why runners are (or are not) being created, e.g. `Ready=False` with reason
    /// `CredentialsInvalid` or `RunnerGroupNotFound`. Omitted when empty, so the status ARC writes is unchanged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = crate::schema::no_default)]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    /// Not in ARC, only with `minRunnersSchedules`: the minimum in effect (a window's or `minRunners`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::go_int)]
    pub effective_min_runners: Option<i64>,
    /// Not in ARC: the schedule whose window sets the minimum now; absent outside all windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_min_runners_schedule: Option<String>,
}

impl AutoscalingRunnerSetSpec {
    /// The scale set name used in GitHub: `runnerScaleSetName`, or the object name when it is empty.
    pub fn scale_set_name<'a>(&'a self, object_name: &'a str) -> &'a str {
        if self.runner_scale_set_name.is_empty() {
            object_name
        } else {
            &self.runner_scale_set_name
        }
    }

    /// Effective minimum number of runners (absent ⇒ 0).
    pub fn effective_min_runners(&self) -> i64 {
        self.min_runners.unwrap_or(0)
    }

    /// The scale-down delay (absent or negative ⇒ 0, off).
    pub fn scale_down_delay(&self) -> std::time::Duration {
        std::time::Duration::from_secs(
            self.scale_down_delay_seconds
                .and_then(|s| u64::try_from(s).ok())
                .unwrap_or(0),
        )
    }

    /// Effective maximum number of runners (absent ⇒ `i32::MAX`, as ARC).
    pub fn effective_max_runners(&self) -> i64 {
        self.max_runners.unwrap_or(i64::from(i32::MAX))
    }
}
