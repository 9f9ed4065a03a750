//! `AutoscalingListener`: created by the AutoscalingRunnerSet controller (never by users) to run one listener pod.

use k8s_openapi::api::core::v1::{LocalObjectReference, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{MetricsConfig, ProxyConfig, ResourceMeta, TlsConfig, VaultConfig};
use crate::is_zero;
use crate::schedule::MinRunnersSchedule;

// No field is schema-required; all are omitted from JSON when empty (Go `omitempty`).
/// Desired state of a listener.
// Every `printcolumn(...)` repeats the same keys, which clippy mistakes for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "actions.github.com",
    version = "v1alpha1",
    kind = "AutoscalingListener",
    doc = "Runs the listener of one AutoscalingRunnerSet, which turns GitHub job demand into EphemeralRunnerSet replicas. Created by the controller.",
    namespaced,
    status = "AutoscalingListenerStatus",
    derive = "PartialEq",
    derive = "Default",
    crates(kube_core = "::kube_core"),
    printcolumn(
        name = "GitHub Configure URL",
        type_ = "string",
        json_path = ".spec.githubConfigUrl"
    ),
    printcolumn(
        name = "AutoscalingRunnerSet Namespace",
        type_ = "string",
        json_path = ".spec.autoscalingRunnerSetNamespace"
    ),
    printcolumn(
        name = "AutoscalingRunnerSet Name",
        type_ = "string",
        json_path = ".spec.autoscalingRunnerSetName"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingListenerSpec {
    /// GitHub configuration URL, copied from the AutoscalingRunnerSet.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub github_config_url: String,
    /// Credentials Secret name (or vault key), copied from the AutoscalingRunnerSet.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub github_config_secret: String,
    /// Scale set ID in the Actions Service.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(transform = crate::schema::go_int)]
    pub runner_scale_set_id: i64,
    /// Namespace of the AutoscalingRunnerSet.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub autoscaling_runner_set_namespace: String,
    /// Name of the AutoscalingRunnerSet.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub autoscaling_runner_set_name: String,
    /// Name of the EphemeralRunnerSet the listener scales.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ephemeral_runner_set_name: String,
    /// Upper bound of runners.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0), transform = crate::schema::go_int)]
    pub max_runners: i64,
    /// Idle runners kept ready.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0), transform = crate::schema::go_int)]
    pub min_runners: i64,
    /// Not in ARC: the AutoscalingRunnerSet's `minRunnersSchedules`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub min_runners_schedules: Vec<MinRunnersSchedule>,
    /// Not in ARC: the AutoscalingRunnerSet's `scaleDownDelaySeconds` (0: off).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 86400), transform = crate::schema::go_int)]
    pub scale_down_delay_seconds: i64,
    /// Listener container image.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// Pull secrets for the listener image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
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
    /// Metric selection for the listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsConfig>,
    /// Customisation of the listener pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PodTemplateSpec>,
    /// Extra metadata for the listener config Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_secret_metadata: Option<ResourceMeta>,
    /// Extra metadata for the listener ServiceAccount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_metadata: Option<ResourceMeta>,
    /// Extra metadata for the listener Role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_metadata: Option<ResourceMeta>,
    /// Extra metadata for the listener RoleBinding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_binding_metadata: Option<ResourceMeta>,
}

/// Observed state (not in ARC, whose status is an empty object; every field is optional, so objects ARC wrote stay
/// valid). Two writers own disjoint fields: the listener process reports its view of the Actions Service
/// (`sessionHeld` to `statistics`, under its own field manager, on changes and at a bounded rate), and the
/// AutoscalingListener controller reports the listener pod's failures (`podFailures`). The AutoscalingRunnerSet
/// controller turns both into the set's `ListenerReady` condition.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingListenerStatus {
    /// Whether the listener holds the scale set's message session (only the holder is offered jobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_held: Option<bool>,
    /// Since when `sessionHeld` has had its current value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_since: Option<Time>,
    /// The message session the listener holds or last held: a listener that takes over (a new manager leader, a
    /// restarted listener) deletes this session before it creates its own, rather than wait for the service to
    /// expire it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<ListenerSession>,
    /// When a long poll of the message queue (or a session creation) last succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_poll_time: Option<Time>,
    /// How old `lastPollTime` can grow while the listener works: its longest long poll plus its report interval.
    /// Older means it stopped polling (hung, or unable to report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0), transform = crate::schema::go_int)]
    pub poll_stale_after_seconds: Option<i64>,
    /// The last error of the message loop. It is current while its `time` is later than `lastPollTime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<ListenerError>,
    /// The runner count the listener last asked the EphemeralRunnerSet for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::schema::go_int)]
    pub desired_runners: Option<i64>,
    /// The scale set's statistics, as of the last message or session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statistics: Option<ListenerStatistics>,
    /// Written by the controller: consecutive failures of the listener pod, while it keeps failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_failures: Option<ListenerPodFailures>,
}

/// A message session as the service named it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListenerSession {
    /// The session's id.
    #[serde(default)]
    #[schemars(transform = crate::schema::no_default)]
    pub id: String,
    /// Who created it: the listener pod's name, or the manager pod's in the manager's listener mode.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
}

/// An error of the listener's message loop, without secrets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListenerError {
    /// A fixed word: `SessionConflict`, `CredentialsRejected`, `PermissionDenied`, `ScaleSetNotFound`,
    /// `ServiceUnreachable`, `SessionLost`, `TlsCertificateRejected`, `RunnerSetNotFound`, `KubernetesForbidden`,
    /// `KubernetesError` or `ServiceError`.
    #[serde(default)]
    #[schemars(transform = crate::schema::no_default)]
    pub category: String,
    /// What failed, as the listener logged it (truncated).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When it happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
}

/// The scale set's statistics as the Actions Service reports them to the listener.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatistics {
    /// Jobs waiting for a runner of the scale set.
    #[serde(default)]
    #[schemars(transform = crate::schema::go_int, transform = crate::schema::no_default)]
    pub total_available_jobs: i64,
    /// Jobs the listener acquired.
    #[serde(default)]
    #[schemars(transform = crate::schema::go_int, transform = crate::schema::no_default)]
    pub total_acquired_jobs: i64,
    /// Jobs assigned to the scale set (what scaling follows).
    #[serde(default)]
    #[schemars(transform = crate::schema::go_int, transform = crate::schema::no_default)]
    pub total_assigned_jobs: i64,
    /// Jobs running.
    #[serde(default)]
    #[schemars(transform = crate::schema::go_int, transform = crate::schema::no_default)]
    pub total_running_jobs: i64,
    /// Runners registered.
    #[serde(default)]
    #[schemars(transform = crate::schema::go_int, transform = crate::schema::no_default)]
    pub total_registered_runners: i64,
    /// Runners running a job.
    #[serde(default)]
    #[schemars(transform = crate::schema::go_int, transform = crate::schema::no_default)]
    pub total_busy_runners: i64,
    /// Runners waiting for a job.
    #[serde(default)]
    #[schemars(transform = crate::schema::go_int, transform = crate::schema::no_default)]
    pub total_idle_runners: i64,
}

/// Consecutive failures of the listener pod (it exited or was evicted), recorded by the controller, which
/// recreates the pod with a growing delay.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListenerPodFailures {
    /// Failures in a row.
    #[serde(default)]
    #[schemars(range(min = 0), transform = crate::schema::go_int, transform = crate::schema::no_default)]
    pub count: i64,
    /// How the last pod ended (exit code, reason).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last: String,
    /// When the last failure was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    /// The earliest time the next pod is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_time: Option<Time>,
}
