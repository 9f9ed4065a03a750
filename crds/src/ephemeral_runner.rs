//! `EphemeralRunner`: one single-use runner (one pod, one JIT config Secret).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{ProxyConfig, ResourceMeta, TlsConfig, VaultConfig};
use crate::constants::{CONTAINER_HOOKS_ENV, RUNNER_CONTAINER_NAME, phase};
use crate::is_zero;

// The schema requires `githubConfigUrl`, `githubConfigSecret` and `runnerScaleSetId`; all fields are omitted
// from JSON when empty (Go `omitempty`), so an object with `runnerScaleSetId` 0 cannot be stored, as with ARC.
/// Desired runner.
// Every `printcolumn(...)` repeats the same keys, which clippy mistakes for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "actions.github.com",
    version = "v1alpha1",
    kind = "EphemeralRunner",
    doc = "One single-use runner: a pod registered with GitHub Actions through a just-in-time configuration.",
    namespaced,
    status = "EphemeralRunnerStatus",
    derive = "PartialEq",
    derive = "Default",
    crates(kube_core = "::kube_core"),
    printcolumn(
        name = "GitHub Config URL",
        type_ = "string",
        json_path = ".spec.githubConfigUrl"
    ),
    printcolumn(name = "RunnerId", type_ = "number", json_path = ".status.runnerId"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "JobRepository",
        type_ = "string",
        json_path = ".status.jobRepositoryName"
    ),
    printcolumn(
        name = "JobWorkflowRef",
        type_ = "string",
        json_path = ".status.jobWorkflowRef"
    ),
    printcolumn(
        name = "WorkflowRunId",
        type_ = "number",
        json_path = ".status.workflowRunId"
    ),
    printcolumn(
        name = "JobDisplayName",
        type_ = "string",
        json_path = ".status.jobDisplayName"
    ),
    printcolumn(name = "JobId", type_ = "string", json_path = ".status.jobId"),
    printcolumn(name = "Message", type_ = "string", json_path = ".status.message"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct EphemeralRunnerSpec {
    /// GitHub configuration URL.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub github_config_url: String,
    /// Credentials Secret name (or vault key).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub github_config_secret: String,
    /// TLS settings for a GitHub Enterprise Server.
    #[serde(
        default,
        rename = "githubServerTLS",
        skip_serializing_if = "Option::is_none"
    )]
    pub github_server_tls: Option<TlsConfig>,
    /// Scale set ID in the Actions Service.
    #[serde(skip_serializing_if = "is_zero")]
    #[schemars(transform = crate::schema::go_int)]
    pub runner_scale_set_id: i64,
    /// Proxy for connections to GitHub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyConfig>,
    /// Name of the EphemeralRunnerSet's proxy Secret; set at creation when `proxy` is set.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub proxy_secret_ref: String,
    /// Read credentials from a vault instead of a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vault_config: Option<VaultConfig>,
    /// Extra metadata for the JIT config Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_runner_config_secret_metadata: Option<ResourceMeta>,
    // `metadata` and `spec` are behind an `Arc`: the manager's cache holds a copy of every runner (and
    // kube-runtime's store makes a new one on every watch event), and even without the template, which the cache
    // does not keep, these two structs inline are most of a runner's size (2.4 of 3 KiB); with an `Arc` every
    // cached copy shares one empty template (docs/benchmarks.md, manager memory). The serialised form is the same.
    /// Runner pod metadata (inlined from the pod template): labels and annotations of the pod.
    #[serde(default, skip_serializing_if = "is_empty_meta")]
    pub metadata: Arc<ObjectMeta>,
    /// Runner pod spec (inlined from the pod template).
    #[serde(default)]
    #[schemars(transform = crate::schema::no_default)]
    pub spec: Arc<PodSpec>,
}

fn is_empty_meta(meta: &Arc<ObjectMeta>) -> bool {
    **meta == ObjectMeta::default()
}

// Only `ready` is always serialised; the other fields are `omitempty` in ARC.
/// Observed runner.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EphemeralRunnerStatus {
    /// Whether the runner pod is Ready.
    #[serde(default)]
    #[schemars(transform = crate::schema::no_default)]
    pub ready: bool,
    /// `Pending`, `Running`, `Succeeded`, `Failed` or `Outdated`; empty when new.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    /// Machine-readable reason of the last phase change.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Human-readable message of the last phase change.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Runner ID in the Actions Service.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(transform = crate::schema::go_int)]
    pub runner_id: i64,
    /// Runner name as registered.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub runner_name: String,
    /// Failed pods: pod UID → when the failure was recorded.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failures: BTreeMap<String, Time>,
    /// Job request ID (written by the listener).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub job_request_id: i64,
    /// Job ID (written by the listener); non-empty means the runner has a job.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub job_id: String,
    /// `owner/repo` of the job (written by the listener).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub job_repository_name: String,
    /// Workflow ref of the job (written by the listener).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub job_workflow_ref: String,
    /// Workflow run ID of the job (written by the listener).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub workflow_run_id: i64,
    /// Display name of the job (written by the listener).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub job_display_name: String,
}

impl EphemeralRunnerSpec {
    /// The runner pod template (metadata and spec inlined in this spec).
    pub fn pod_template(&self) -> PodTemplateSpec {
        PodTemplateSpec {
            metadata: Some(ObjectMeta::clone(&self.metadata)),
            spec: Some(PodSpec::clone(&self.spec)),
        }
    }

    /// Whether the first container named `runner` sets `ACTIONS_RUNNER_CONTAINER_HOOKS` (any value), i.e. the
    /// runner uses container hooks ("kubernetes" container mode).
    pub fn has_container_hooks(&self) -> bool {
        self.spec
            .containers
            .iter()
            .find(|container| container.name == RUNNER_CONTAINER_NAME)
            .and_then(|container| container.env.as_ref())
            .is_some_and(|env| env.iter().any(|var| var.name == CONTAINER_HOOKS_ENV))
    }
}

impl EphemeralRunnerStatus {
    /// The JSON names of the job fields the listener writes, which belong to the registration recorded with them.
    pub const JOB_FIELDS: [&'static str; 6] = [
        "jobRequestId",
        "jobId",
        "jobRepositoryName",
        "jobWorkflowRef",
        "workflowRunId",
        "jobDisplayName",
    ];

    /// Whether the runner reached a terminal phase (`Succeeded`, `Failed` or `Outdated`).
    pub fn is_done(&self) -> bool {
        matches!(
            self.phase.as_str(),
            phase::SUCCEEDED | phase::FAILED | phase::OUTDATED
        )
    }

    /// Whether the listener recorded a job for this runner.
    pub fn has_job(&self) -> bool {
        // ARC 0.12 records a job by its request id only (no `jobId`); its runners are taken over as they are.
        !self.job_id.is_empty() || self.job_request_id > 0
    }

    /// The latest recorded pod failure, `None` when there is none (ARC uses the zero time).
    pub fn last_failure(&self) -> Option<&Time> {
        self.failures.values().max()
    }
}

impl EphemeralRunner {
    /// [`EphemeralRunnerStatus::is_done`]; a runner without status is not done.
    pub fn is_done(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(EphemeralRunnerStatus::is_done)
    }

    /// [`EphemeralRunnerStatus::has_job`]; a runner without status has no job.
    pub fn has_job(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(EphemeralRunnerStatus::has_job)
    }

    /// [`EphemeralRunnerSpec::has_container_hooks`].
    pub fn has_container_hooks(&self) -> bool {
        self.spec.has_container_hooks()
    }

    /// [`EphemeralRunnerStatus::last_failure`].
    pub fn last_failure(&self) -> Option<&Time> {
        self.status
            .as_ref()
            .and_then(EphemeralRunnerStatus::last_failure)
    }
}

/// The server-side apply (for the status subresource, without force) writing a job's `fields` (status field name
/// → value) into EphemeralRunner `name`'s status together with `runnerId`, the registration the job started on.
/// The API server decides in the same request as the write: a status that records no registration takes the job
/// and the identity; one that records this registration (the manager's write) shares the field; one that records
/// another makes it a conflict (409), so one registration's job never lands on the next one. The listener's write
/// (docs/runner-lifecycle.md, "Status writes").
pub fn job_fields_apply(
    name: &str,
    runner_id: i64,
    mut fields: serde_json::Map<String, serde_json::Value>,
) -> serde_json::Value {
    use kube_core::Resource;
    fields.insert("runnerId".to_owned(), runner_id.into());
    serde_json::json!({
        "apiVersion": EphemeralRunner::api_version(&()),
        "kind": EphemeralRunner::kind(&()),
        "metadata": { "name": name },
        "status": fields,
    })
}

/// A JSON patch writing `fields` (status field name → value) into an EphemeralRunner's status only while the
/// status records registration `runner_id`. The API server checks the `test` in the same request as the writes,
/// so a writer whose view is a moment old can neither put one registration's facts (a job) on the next one nor
/// take them from it. A null value removes its field: added first, then removed, so the patch holds whether the
/// field is there or not.
pub fn registration_guarded_status_patch(
    runner_id: i64,
    fields: &serde_json::Map<String, serde_json::Value>,
) -> json_patch::Patch {
    use json_patch::jsonptr::PointerBuf;
    use json_patch::{AddOperation, PatchOperation, RemoveOperation, TestOperation};
    let path = |field: &str| PointerBuf::from_tokens(["status", field]);
    let test = PatchOperation::Test(TestOperation {
        path: path("runnerId"),
        value: runner_id.into(),
    });
    let writes = fields.iter().flat_map(|(field, value)| {
        let add = PatchOperation::Add(AddOperation {
            path: path(field),
            value: value.clone(),
        });
        let remove = value
            .is_null()
            .then(|| PatchOperation::Remove(RemoveOperation { path: path(field) }));
        std::iter::once(add).chain(remove)
    });
    json_patch::Patch(std::iter::once(test).chain(writes).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, EnvVar};
    use k8s_openapi::jiff::Timestamp;

    fn container(name: &str, env: &[&str]) -> Container {
        Container {
            name: name.to_owned(),
            env: (!env.is_empty()).then(|| {
                env.iter()
                    .map(|name| EnvVar {
                        name: (*name).to_owned(),
                        ..EnvVar::default()
                    })
                    .collect()
            }),
            ..Container::default()
        }
    }

    fn spec_with(containers: Vec<Container>) -> EphemeralRunnerSpec {
        EphemeralRunnerSpec {
            spec: PodSpec {
                containers,
                ..PodSpec::default()
            }
            .into(),
            ..EphemeralRunnerSpec::default()
        }
    }

    fn status_in(phase: &str) -> EphemeralRunnerStatus {
        EphemeralRunnerStatus {
            phase: phase.to_owned(),
            ..EphemeralRunnerStatus::default()
        }
    }

    #[test]
    fn a_job_is_applied_with_the_registration_it_started_on() {
        let fields = serde_json::json!({"jobRequestId": 7, "jobDisplayName": "build"});
        assert_eq!(
            job_fields_apply("runner-a", 42, fields.as_object().unwrap().clone()),
            serde_json::json!({
                "apiVersion": "actions.github.com/v1alpha1",
                "kind": "EphemeralRunner",
                "metadata": {"name": "runner-a"},
                "status": {"runnerId": 42, "jobRequestId": 7, "jobDisplayName": "build"},
            })
        );
    }

    #[test]
    fn done_phases() {
        for done in [phase::SUCCEEDED, phase::FAILED, phase::OUTDATED] {
            assert!(status_in(done).is_done(), "{done}");
        }
        for not_done in ["", phase::PENDING, phase::RUNNING, "Unknown"] {
            assert!(!status_in(not_done).is_done(), "{not_done:?}");
        }
        assert!(!EphemeralRunner::new("r", EphemeralRunnerSpec::default()).is_done());
    }

    #[test]
    fn has_job_iff_a_job_id_or_request_id_is_set() {
        let mut status = EphemeralRunnerStatus {
            job_repository_name: "o/r".to_owned(),
            ..EphemeralRunnerStatus::default()
        };
        assert!(!status.has_job());
        status.job_id = "1".to_owned();
        assert!(status.has_job());
        let arc_0_12 = EphemeralRunnerStatus {
            job_request_id: 7,
            ..EphemeralRunnerStatus::default()
        };
        assert!(arc_0_12.has_job(), "ARC 0.12 writes only jobRequestId");
    }

    #[test]
    fn container_hooks_are_read_from_the_first_runner_container_only() {
        assert!(
            spec_with(vec![container("runner", &["A", CONTAINER_HOOKS_ENV])]).has_container_hooks()
        );
        assert!(
            spec_with(vec![
                container("init", &[]),
                container("runner", &[CONTAINER_HOOKS_ENV])
            ])
            .has_container_hooks()
        );
        assert!(!spec_with(vec![container("runner", &["A"])]).has_container_hooks());
        assert!(
            !spec_with(vec![container("sidecar", &[CONTAINER_HOOKS_ENV])]).has_container_hooks()
        );
        assert!(
            !spec_with(vec![
                container("runner", &[]),
                container("runner", &[CONTAINER_HOOKS_ENV])
            ])
            .has_container_hooks()
        );
        assert!(!spec_with(Vec::new()).has_container_hooks());
    }

    #[test]
    fn last_failure_is_the_latest_time() {
        let time = |s: &str| Time(s.parse::<Timestamp>().expect("timestamp"));
        let mut status = EphemeralRunnerStatus::default();
        assert_eq!(status.last_failure(), None);
        status
            .failures
            .insert("b".to_owned(), time("2025-01-01T00:00:10Z"));
        status
            .failures
            .insert("a".to_owned(), time("2025-01-01T00:00:30Z"));
        status
            .failures
            .insert("c".to_owned(), time("2025-01-01T00:00:20Z"));
        assert_eq!(status.last_failure(), Some(&time("2025-01-01T00:00:30Z")));
    }

    #[test]
    fn the_job_fields_are_named_as_the_status_serialises_them() {
        let status = EphemeralRunnerStatus {
            job_request_id: 1,
            job_id: "j".into(),
            job_repository_name: "o/r".into(),
            job_workflow_ref: "o/r/w@main".into(),
            workflow_run_id: 2,
            job_display_name: "build".into(),
            ..EphemeralRunnerStatus::default()
        };
        let value = serde_json::to_value(status).unwrap();
        // Fields serialised even when empty (`ready`) are not job fields.
        let without = serde_json::to_value(EphemeralRunnerStatus::default()).unwrap();
        let mut names: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .filter(|name| without.get(name.as_str()).is_none())
            .map(String::as_str)
            .collect();
        let mut expected = EphemeralRunnerStatus::JOB_FIELDS.to_vec();
        names.sort_unstable();
        expected.sort_unstable();
        assert_eq!(names, expected);
    }

    #[test]
    fn a_guarded_status_patch_tests_the_registration_then_writes_or_removes_each_field() {
        let fields =
            serde_json::json!({"jobRequestId": 7, "jobDisplayName": "build", "jobId": null});
        let patch = registration_guarded_status_patch(42, fields.as_object().unwrap());
        assert_eq!(
            serde_json::to_value(patch).unwrap(),
            serde_json::json!([
                {"op": "test", "path": "/status/runnerId", "value": 42},
                {"op": "add", "path": "/status/jobDisplayName", "value": "build"},
                {"op": "add", "path": "/status/jobId", "value": null},
                {"op": "remove", "path": "/status/jobId"},
                {"op": "add", "path": "/status/jobRequestId", "value": 7},
            ])
        );
    }

    #[test]
    fn a_guarded_status_patch_removes_a_field_whether_or_not_it_is_there() {
        let fields = serde_json::json!({"jobId": null, "runnerId": 43});
        let patch = registration_guarded_status_patch(42, fields.as_object().unwrap());
        for status in [
            serde_json::json!({"runnerId": 42}),
            serde_json::json!({"runnerId": 42, "jobId": "j"}),
        ] {
            let mut doc = serde_json::json!({ "status": status });
            json_patch::patch(&mut doc, &patch).expect("the registration matches");
            assert_eq!(doc, serde_json::json!({"status": {"runnerId": 43}}));
        }
        let mut other = serde_json::json!({"status": {"runnerId": 41, "jobId": "j"}});
        assert!(
            json_patch::patch(&mut other, &patch).is_err(),
            "another registration's status is left alone"
        );
    }
}
