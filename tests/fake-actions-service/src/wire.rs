//! JSON bodies of the protocol, spelled exactly as on the wire
//! (docs/reference/actions-service-protocol.md, "Data model").
//!
//! Output types serialize every field the reference client reads; input types are lenient in the way the
//! real service is (missing keys and `null` mean "not given") so that a client is judged on what it sends,
//! not on how this fake happens to parse it.

use serde::{Deserialize, Serialize};

/// A scale-set label.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Label {
    /// Label type; the clients only ever send `System`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The label workflows target with `runs-on`.
    #[serde(default)]
    pub name: String,
}

impl Label {
    /// A `System` label with the given name.
    pub fn system(name: &str) -> Self {
        Self {
            kind: "System".to_owned(),
            name: name.to_owned(),
        }
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// Runner settings of a scale set, including the two flags only ARC's older client sends.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RunnerSetting {
    /// Runners must not self-update.
    #[serde(default, skip_serializing_if = "is_false")]
    pub disable_update: bool,
    /// Runners take one job (ARC's older client only).
    #[serde(default, skip_serializing_if = "is_false")]
    pub ephemeral: bool,
    /// Never set by ARC; kept for completeness.
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_elastic: bool,
}

/// `RunnerScaleSetStatistic`. All seven counters are always emitted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Statistics {
    /// Jobs offered to the set and not acquired yet.
    pub total_available_jobs: i64,
    /// Jobs acquired by the set that are not running yet.
    pub total_acquired_jobs: i64,
    /// Jobs assigned to the set, waiting for a runner or running: the scaling signal.
    pub total_assigned_jobs: i64,
    /// Jobs running on runners of the set.
    pub total_running_jobs: i64,
    /// Runners registered in the set.
    pub total_registered_runners: i64,
    /// Registered runners that hold a job.
    pub total_busy_runners: i64,
    /// Registered runners that hold no job.
    pub total_idle_runners: i64,
}

/// A scale set as the fake sends it.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleSetJson {
    /// Service-assigned id.
    pub id: i64,
    /// Scale-set name.
    pub name: String,
    /// Runner group id.
    pub runner_group_id: i64,
    /// Runner group name.
    pub runner_group_name: String,
    /// Labels as stored.
    pub labels: Vec<Label>,
    /// Spelled with a capital `R`, as the reference client's field tag is.
    #[serde(rename = "RunnerSetting")]
    pub runner_setting: RunnerSetting,
    /// RFC 3339 creation time.
    pub created_on: String,
    /// URL of the JIT-config endpoint (informational; no client calls it).
    pub runner_jit_config_url: String,
    /// Current statistics.
    pub statistics: Statistics,
}

/// A scale set as a client sends it on create (POST) and update (PATCH).
#[derive(Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleSetInput {
    /// Name; required on create.
    #[serde(default)]
    pub name: Option<String>,
    /// Runner group id; 0 or absent means "not given".
    #[serde(default)]
    pub runner_group_id: Option<i64>,
    /// Labels; absent, `null` or empty means "not given".
    #[serde(default)]
    pub labels: Option<Vec<Label>>,
    /// The clients send `RunnerSetting`; the real service matches keys case-insensitively, so the camel-case
    /// spelling is accepted as well.
    #[serde(default, rename = "RunnerSetting", alias = "runnerSetting")]
    pub runner_setting: Option<RunnerSetting>,
}

/// `{"count": N, "value": [...]}`. `count` always equals `value.len()`.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct ListEnvelope<T> {
    /// Number of items.
    pub count: usize,
    /// The items.
    pub value: Vec<T>,
}

impl<T> From<Vec<T>> for ListEnvelope<T> {
    fn from(value: Vec<T>) -> Self {
        Self {
            count: value.len(),
            value,
        }
    }
}

/// A runner group.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RunnerGroupJson {
    /// Group id (1 is the default group).
    pub id: i64,
    /// Group name.
    pub name: String,
    /// Number of runners registered in the group's scale sets.
    pub size: i64,
    /// Whether this is the `Default` group.
    pub is_default_group: bool,
}

/// A runner reference.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RunnerReferenceJson {
    /// Runner id.
    pub id: i64,
    /// Runner name.
    pub name: String,
    /// Scale set the runner belongs to.
    pub runner_scale_set_id: i64,
}

/// Body of a JIT-config request.
#[derive(Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct JitRequest {
    /// Runner name to register.
    #[serde(default)]
    pub name: Option<String>,
    /// Runner work folder.
    #[serde(default)]
    pub work_folder: Option<String>,
}

/// Response of a JIT-config request.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct JitResponse {
    /// The registered runner.
    pub runner: RunnerReferenceJson,
    /// Opaque base64 blob for the runner; note the upper-case `JIT`.
    #[serde(rename = "encodedJITConfig")]
    pub encoded_jit_config: String,
}

/// Body of a session create request.
#[derive(Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SessionInput {
    /// Always the nil UUID from the scaleset client; absent from ARC's.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Free text identifying the listener instance.
    #[serde(default)]
    pub owner_name: Option<String>,
}

/// A message session.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SessionJson {
    /// Canonical lower-case UUID.
    pub session_id: String,
    /// Owner given at creation.
    pub owner_name: String,
    /// The scale set the session listens for.
    pub runner_scale_set: ScaleSetJson,
    /// Absolute URL of the long-poll queue.
    pub message_queue_url: String,
    /// Bearer token for the queue and acquire-jobs.
    pub message_queue_access_token: String,
    /// Current statistics.
    pub statistics: Statistics,
}

/// One element of a message's `body` array.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct JobMessage {
    /// `JobAvailable`, `JobAssigned`, `JobStarted` or `JobCompleted`.
    pub message_type: String,
    /// Only on `JobAvailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquire_job_url: Option<String>,
    /// Job request id; what acquire-jobs takes.
    pub runner_request_id: i64,
    /// Repository name.
    pub repository_name: String,
    /// Repository owner.
    pub owner_name: String,
    /// Job id (a string).
    pub job_id: String,
    /// `{owner}/{repo}/.github/workflows/{file}@{ref}`.
    pub job_workflow_ref: String,
    /// Display name.
    pub job_display_name: String,
    /// Workflow run id.
    pub workflow_run_id: i64,
    /// Triggering event.
    pub event_name: String,
    /// `runs-on` labels.
    pub request_labels: Vec<String>,
    /// RFC 3339.
    pub queue_time: String,
    /// RFC 3339; the zero time until assigned to the set.
    pub scale_set_assign_time: String,
    /// RFC 3339; the zero time until assigned to a runner.
    pub runner_assign_time: String,
    /// RFC 3339; the zero time until finished.
    pub finish_time: String,
    /// On `JobStarted` and `JobCompleted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<i64>,
    /// On `JobStarted` and `JobCompleted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_name: Option<String>,
    /// On `JobCompleted` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
}

/// The 200 answer of a long poll.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MessageJson {
    /// Id to acknowledge and to pass as `lastMessageId`.
    pub message_id: i64,
    /// Always `RunnerScaleSetJobMessages`.
    pub message_type: String,
    /// The job messages, JSON-encoded into a string.
    pub body: String,
    /// Statistics at delivery time.
    pub statistics: Statistics,
}

/// An acquirable job (ARC's older client only).
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AcquirableJobJson {
    /// Acquire URL (never called by clients).
    pub acquire_job_url: String,
    /// Always `JobAvailable`.
    pub message_type: String,
    /// Job request id.
    pub runner_request_id: i64,
    /// Repository name.
    pub repository_name: String,
    /// Repository owner.
    pub owner_name: String,
    /// Workflow ref.
    pub job_workflow_ref: String,
    /// Triggering event.
    pub event_name: String,
    /// `runs-on` labels.
    pub request_labels: Vec<String>,
}

/// Token answer of the GitHub API.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct TokenJson {
    /// The token.
    pub token: String,
    /// RFC 3339 expiry.
    pub expires_at: String,
}

/// Body of `POST /actions/runner-registration`.
#[derive(Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct RunnerRegistrationInput {
    /// The canonical config URL.
    #[serde(default)]
    pub url: Option<String>,
    /// Always `register`.
    #[serde(default)]
    pub runner_event: Option<String>,
}

/// Answer of `POST /actions/runner-registration`.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct RunnerRegistrationJson {
    /// Actions Service base URL of the tenant, ending in `/`.
    pub url: String,
    /// Admin token (a JWT with `exp`).
    pub token: String,
    /// What GitHub sends alongside; clients ignore it.
    pub token_schema: String,
}

/// Error body of the Actions Service, with the extra keys .NET services add.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct ExceptionJson {
    /// Reference id of the serialized exception.
    #[serde(rename = "$id")]
    pub id: String,
    /// Always null here.
    #[serde(rename = "innerException")]
    pub inner_exception: Option<()>,
    /// Human-readable text.
    pub message: String,
    /// Fully qualified .NET type name with assembly.
    #[serde(rename = "typeName")]
    pub type_name: String,
    /// Short type name.
    #[serde(rename = "typeKey")]
    pub type_key: String,
    /// Always 0.
    #[serde(rename = "errorCode")]
    pub error_code: i64,
    /// Always 3000.
    #[serde(rename = "eventId")]
    pub event_id: i64,
}

/// A job of a workflow run in the GitHub REST API (one attempt of the job): the fields GitHub's job object has.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct WorkflowJobJson {
    /// REST id, unique per attempt.
    pub id: i64,
    /// Workflow run id.
    pub run_id: i64,
    /// API URL of the run (not served by the fake).
    pub run_url: String,
    /// Attempt of the run this job ran in: 1, then one more per re-run.
    pub run_attempt: u32,
    /// Opaque GraphQL id.
    pub node_id: String,
    /// Commit of the run (made up, the same for every job of a run).
    pub head_sha: String,
    /// Branch of the run, from the workflow ref (`refs/heads/...`).
    pub head_branch: Option<String>,
    /// API URL of the job (not served by the fake).
    pub url: String,
    /// Web URL of the job (not served by the fake).
    pub html_url: String,
    /// `queued`, `in_progress` or `completed`.
    pub status: String,
    /// `success`, `failure`, `cancelled` or `skipped` once completed; null before.
    pub conclusion: Option<String>,
    /// When the job was queued.
    pub created_at: String,
    /// When it started on its runner (until then, when it was queued).
    pub started_at: String,
    /// When it completed; null before.
    pub completed_at: Option<String>,
    /// Display name.
    pub name: String,
    /// Steps; the fake has none.
    pub steps: Vec<serde_json::Value>,
    /// API URL of the job's check run (not served by the fake).
    pub check_run_url: String,
    /// `runs-on` labels.
    pub labels: Vec<String>,
    /// Runner that took the job; null before one did.
    pub runner_id: Option<i64>,
    /// Its name.
    pub runner_name: Option<String>,
    /// Runner group of the runner's scale set.
    pub runner_group_id: Option<i64>,
    /// Its name.
    pub runner_group_name: Option<String>,
    /// Workflow name: the workflow file's path, from the workflow ref.
    pub workflow_name: Option<String>,
}

/// Answer of `GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs`: one page of jobs and the total.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct WorkflowJobsJson {
    /// Jobs matching the filter, on all pages.
    pub total_count: usize,
    /// This page.
    pub jobs: Vec<WorkflowJobJson>,
}

/// Body of `POST /repos/{owner}/{repo}/actions/jobs/{job_id}/rerun` (optional).
#[derive(Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct RerunJobInput {
    /// Re-run with debug logging.
    #[serde(default)]
    pub enable_debug_logging: Option<bool>,
}

/// Error body of the GitHub REST API.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct GitHubErrorJson {
    /// Human-readable text.
    pub message: String,
    /// Link GitHub adds.
    pub documentation_url: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn scale_set_serializes_runner_setting_with_capital_r() {
        let set = ScaleSetJson {
            id: 7,
            name: "set".into(),
            runner_group_id: 1,
            runner_group_name: "Default".into(),
            labels: vec![Label::system("set")],
            runner_setting: RunnerSetting {
                disable_update: true,
                ..RunnerSetting::default()
            },
            created_on: "2025-01-01T00:00:00Z".into(),
            runner_jit_config_url: String::new(),
            statistics: Statistics::default(),
        };
        let value = serde_json::to_value(&set).unwrap();
        assert_eq!(value["RunnerSetting"], json!({"disableUpdate": true}));
        assert_eq!(value["labels"], json!([{"type": "System", "name": "set"}]));
        assert!(value.get("runnerSetting").is_none());
    }

    #[test]
    fn scale_set_input_accepts_nulls_and_both_spellings() {
        let input: ScaleSetInput =
            serde_json::from_value(json!({"name": "a", "labels": null, "RunnerSetting": {}}))
                .unwrap();
        assert_eq!(input.labels, None);
        assert_eq!(input.runner_setting, Some(RunnerSetting::default()));
        let input: ScaleSetInput =
            serde_json::from_value(json!({"runnerSetting": {"disableUpdate": true}})).unwrap();
        assert!(input.runner_setting.unwrap().disable_update);
    }

    #[test]
    fn job_message_omits_kind_specific_fields_when_absent() {
        let message = JobMessage {
            message_type: "JobAssigned".into(),
            acquire_job_url: None,
            runner_request_id: 1,
            repository_name: "r".into(),
            owner_name: "o".into(),
            job_id: "j".into(),
            job_workflow_ref: "o/r/.github/workflows/ci.yml@refs/heads/main".into(),
            job_display_name: "build".into(),
            workflow_run_id: 2,
            event_name: "push".into(),
            request_labels: vec!["set".into()],
            queue_time: "2025-01-01T00:00:00Z".into(),
            scale_set_assign_time: "0001-01-01T00:00:00Z".into(),
            runner_assign_time: "0001-01-01T00:00:00Z".into(),
            finish_time: "0001-01-01T00:00:00Z".into(),
            runner_id: None,
            runner_name: None,
            result: None,
        };
        let value = serde_json::to_value(&message).unwrap();
        for key in ["acquireJobUrl", "runnerId", "runnerName", "result"] {
            assert!(value.get(key).is_none(), "{key} should be omitted");
        }
        assert_eq!(value["runnerRequestId"], json!(1));
    }
}
