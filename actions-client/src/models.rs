//! Wire types of the Actions Service and the GitHub REST calls, with the exact JSON key spelling
//! (docs/reference/actions-service-protocol.md, "Data model").
//!
//! Encoding follows the reference client's omission rules; decoding goes through [`crate::decode`], which adds
//! case-insensitive keys and `null` tolerance, and every struct defaults missing keys.

use std::fmt;
use std::str::FromStr;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::decode::go_time;
use crate::secret::SecretString;

fn is_zero(value: &i64) -> bool {
    *value == 0
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// The label type the client fills in when a label has none.
pub const SYSTEM_LABEL_TYPE: &str = "System";

/// Name of the runner group every scale set belongs to unless configured otherwise. Its id is always 1, so
/// callers use [`DEFAULT_RUNNER_GROUP_ID`] without looking it up.
pub const DEFAULT_RUNNER_GROUP_NAME: &str = "default";

/// Id of the `default` runner group.
pub const DEFAULT_RUNNER_GROUP_ID: i64 = 1;

/// A runner scale set.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RunnerScaleSet {
    /// Assigned by the service.
    #[serde(skip_serializing_if = "is_zero")]
    pub id: i64,
    /// Unique within its runner group; also the default label.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Runner group id.
    #[serde(skip_serializing_if = "is_zero")]
    pub runner_group_id: i64,
    /// Filled by the service.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub runner_group_name: String,
    /// Labels workflows target.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<Label>,
    /// Always emitted, with a capital `R` as the service expects.
    #[serde(rename = "RunnerSetting")]
    pub runner_setting: RunnerSetting,
    /// Always emitted; `None` is Go's zero time.
    #[serde(with = "go_time")]
    pub created_on: Option<Timestamp>,
    /// Filled by the service.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub runner_jit_config_url: String,
    /// Current statistics, when the service includes them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statistics: Option<Statistics>,
}

/// A scale-set label. Both keys are always emitted, `type` first.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Label {
    /// `System` unless the caller says otherwise.
    #[serde(rename = "type")]
    pub label_type: String,
    /// The label text.
    pub name: String,
}

impl Label {
    /// A `System` label.
    pub fn system(name: impl Into<String>) -> Self {
        Self {
            label_type: SYSTEM_LABEL_TYPE.to_owned(),
            name: name.into(),
        }
    }
}

/// Runner settings of a scale set. `ephemeral` and `isElastic` exist only in ARC's older client.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RunnerSetting {
    /// Runners must not self-update (the controller pins images).
    #[serde(skip_serializing_if = "is_false")]
    pub disable_update: bool,
    /// ARC only.
    #[serde(skip_serializing_if = "is_false")]
    pub ephemeral: bool,
    /// ARC only, never set by the controller.
    #[serde(skip_serializing_if = "is_false")]
    pub is_elastic: bool,
}

/// Scale-set statistics; all keys always emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Statistics {
    /// Offered to the set, not yet acquired.
    pub total_available_jobs: i64,
    /// Acquired by the set.
    pub total_acquired_jobs: i64,
    /// The scaling signal: assigned jobs, waiting or running.
    pub total_assigned_jobs: i64,
    /// Running on runners of the set.
    pub total_running_jobs: i64,
    /// Runners registered in the set.
    pub total_registered_runners: i64,
    /// Registered runners running a job.
    pub total_busy_runners: i64,
    /// Registered runners not running a job.
    pub total_idle_runners: i64,
}

/// A message session id: a UUID, sent in canonical lower-case hyphenated form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SessionId(u128);

impl SessionId {
    /// The nil UUID, which the reference client always sends when creating a session.
    pub const NIL: Self = Self(0);

    /// Whether this is the nil UUID.
    pub fn is_nil(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = format!("{:032x}", self.0);
        write!(
            f,
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }
}

/// The text is not a UUID in any of the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidSessionId(String);

impl fmt::Display for InvalidSessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid UUID {:?}", self.0)
    }
}

impl std::error::Error for InvalidSessionId {}

impl FromStr for SessionId {
    type Err = InvalidSessionId;

    /// Accepts the forms Go's UUID parser accepts: hyphenated, `{hyphenated}`, `urn:uuid:hyphenated` and 32 hex
    /// digits.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || InvalidSessionId(text.to_owned());
        let inner = if let Some(rest) = text.strip_prefix("urn:uuid:") {
            rest
        } else if let Some(rest) = text.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
            rest
        } else {
            text
        };
        let digits: String = match inner.len() {
            32 => inner.to_owned(),
            36 => {
                let bytes = inner.as_bytes();
                if [8, 13, 18, 23].iter().any(|&i| bytes[i] != b'-') {
                    return Err(bad());
                }
                inner.chars().filter(|c| *c != '-').collect()
            }
            _ => return Err(bad()),
        };
        if digits.len() != 32 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad());
        }
        u128::from_str_radix(&digits, 16)
            .map(Self)
            .map_err(|_| bad())
    }
}

impl Serialize for SessionId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SessionId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A message session.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RunnerScaleSetSession {
    /// Always emitted (nil when creating).
    pub session_id: SessionId,
    /// Identifies the listener instance.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub owner_name: String,
    /// The scale set the session belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner_scale_set: Option<RunnerScaleSet>,
    /// Absolute URL of the long-poll queue.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message_queue_url: String,
    /// Bearer token for the queue and acquire-jobs.
    #[serde(skip_serializing_if = "SecretString::is_empty")]
    pub message_queue_access_token: SecretString,
    /// Statistics at session creation or refresh.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statistics: Option<Statistics>,
}

/// A runner group.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RunnerGroup {
    /// Group id.
    pub id: i64,
    /// Group name.
    pub name: String,
    /// Number of runners (as reported).
    pub size: i64,
    /// Whether this is the default group.
    pub is_default_group: bool,
}

/// A registered runner.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RunnerReference {
    /// Runner id.
    pub id: i64,
    /// Runner name.
    pub name: String,
    /// Scale set the runner belongs to (0 for runners outside scale sets).
    pub runner_scale_set_id: i64,
}

/// Request body of generate-JIT-config; both keys always emitted.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct JitSetting {
    /// Unique runner name to register.
    pub name: String,
    /// Runner work directory; empty for the runner's default.
    pub work_folder: String,
}

/// Response of generate-JIT-config.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct JitRunnerConfig {
    /// The registered runner.
    pub runner: Option<RunnerReference>,
    /// Opaque configuration for the runner (`ACTIONS_RUNNER_INPUT_JITCONFIG`); a secret.
    #[serde(rename = "encodedJITConfig")]
    pub encoded_jit_config: SecretString,
}

/// The generic `{count, value}` list envelope. Decisions use `count`, as the reference client does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ListEnvelope<T> {
    /// Number of items according to the service.
    pub count: i64,
    /// The items.
    pub value: Vec<T>,
}

impl<T> Default for ListEnvelope<T> {
    fn default() -> Self {
        Self {
            count: 0,
            value: Vec::new(),
        }
    }
}

/// A job offered to the scale set, from the acquirable-jobs endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AcquirableJob {
    /// Carried but never called by either reference client.
    pub acquire_job_url: String,
    /// Kind of message (normally `JobAvailable`).
    pub message_type: String,
    /// What acquire-jobs takes.
    pub runner_request_id: i64,
    /// Repository name.
    pub repository_name: String,
    /// Repository owner.
    pub owner_name: String,
    /// `{owner}/{repo}/.github/workflows/{file}@{ref}`.
    pub job_workflow_ref: String,
    /// Triggering event.
    pub event_name: String,
    /// `runs-on` labels.
    pub request_labels: Vec<String>,
}

/// A GitHub token response (installation token, registration token).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct GitHubToken {
    /// The token.
    pub token: SecretString,
    /// Expiry (read, unused by the protocol).
    #[serde(with = "go_time")]
    pub expires_at: Option<Timestamp>,
}

/// One attempt of one job of a workflow run, as `GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs` lists it.
/// Only the fields the controllers use; GitHub sends many more.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default)]
pub struct WorkflowJob {
    /// The REST job id (what a re-run takes); not the Actions Service's `runnerRequestId` or `jobId`.
    pub id: i64,
    /// The workflow run.
    pub run_id: i64,
    /// The run attempt this job belongs to: 1, then one more per re-run.
    pub run_attempt: i64,
    /// The job's display name.
    pub name: String,
    /// `queued`, `in_progress`, `completed`, `waiting`, `requested` or `pending`.
    pub status: String,
    /// `success`, `failure`, `cancelled`, `skipped`, ...; `None` until the job completes.
    pub conclusion: Option<String>,
    /// The runner that picked the job up, if any.
    pub runner_name: Option<String>,
}

/// One page of a workflow run's jobs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default)]
pub struct WorkflowJobsPage {
    /// Jobs on all pages together.
    pub total_count: i64,
    /// This page's jobs.
    pub jobs: Vec<WorkflowJob>,
}

/// What GitHub answered a request to re-run a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RerunOutcome {
    /// 201: a new attempt is queued.
    Requested,
    /// 403: GitHub refused; the message says why (the run is still running, the job was re-run already, or the
    /// token lacks `actions: write`, e.g. "Resource not accessible by integration").
    Refused(String),
    /// 404: no such job in that repository (or the token cannot see it).
    NotFound,
}

/// Body of runner-registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunnerRegistrationRequest<'a> {
    /// The canonical config URL.
    pub url: &'a str,
    /// Always `register`.
    pub runner_event: &'a str,
}

/// Response of runner-registration.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct AdminConnectionResponse {
    /// Actions Service base URL for the tenant.
    pub url: String,
    /// The admin token (a JWT).
    pub token: SecretString,
}

/// The raw long-poll envelope before its `body` is parsed.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RawMessage {
    /// Id to acknowledge and to pass as `lastMessageId`.
    pub message_id: i64,
    /// Must be `RunnerScaleSetJobMessages`.
    pub message_type: String,
    /// JSON array of job messages, encoded as a string.
    pub body: String,
    /// Current statistics.
    pub statistics: Option<Statistics>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode;
    use pretty_assertions::assert_eq;

    #[test]
    fn create_body_matches_the_spec_example() {
        let set = RunnerScaleSet {
            name: "my-set".into(),
            runner_group_id: 1,
            labels: vec![Label::system("linux"), Label::system("x64")],
            runner_setting: RunnerSetting {
                disable_update: true,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&set).expect("encodes"),
            r#"{"name":"my-set","runnerGroupId":1,"labels":[{"type":"System","name":"linux"},{"type":"System","name":"x64"}],"RunnerSetting":{"disableUpdate":true},"createdOn":"0001-01-01T00:00:00Z"}"#
        );
    }

    #[test]
    fn partial_update_body_keeps_the_always_present_keys() {
        let update = RunnerScaleSet {
            runner_group_id: 2,
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&update).expect("encodes"),
            r#"{"runnerGroupId":2,"RunnerSetting":{},"createdOn":"0001-01-01T00:00:00Z"}"#
        );
    }

    #[test]
    fn scale_set_decodes_either_setting_spelling() {
        let body = br#"{"id":42,"name":"my-set","runnerGroupId":1,"runnerGroupName":"Default","labels":[{"type":"System","name":"my-set"}],"runnerSetting":{"disableUpdate":true},"createdOn":"2025-01-01T00:00:00Z","unknown":1}"#;
        let set: RunnerScaleSet = decode::from_slice(body).expect("decodes");
        assert_eq!(set.id, 42);
        assert!(set.runner_setting.disable_update);
        assert_eq!(set.labels, vec![Label::system("my-set")]);
        assert_eq!(
            set.created_on,
            Some("2025-01-01T00:00:00Z".parse().expect("ts"))
        );
    }

    #[test]
    fn session_round_trip_and_create_body() {
        let create = RunnerScaleSetSession {
            owner_name: "listener-host-1".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&create).expect("encodes"),
            r#"{"sessionId":"00000000-0000-0000-0000-000000000000","ownerName":"listener-host-1"}"#
        );
        let body = br#"{"sessionId":"3F2B7C9E-5A41-4D0E-9A8B-2C6F1E0D7A55","ownerName":"o","runnerScaleSet":{"id":42,"name":"my-set","RunnerSetting":{},"createdOn":"2025-01-01T00:00:00Z"},"messageQueueUrl":"https://broker.example/queue/abc","messageQueueAccessToken":"mq-token-1","statistics":{"totalAvailableJobs":0,"totalAcquiredJobs":0,"totalAssignedJobs":2,"totalRunningJobs":1,"totalRegisteredRunners":1,"totalBusyRunners":1,"totalIdleRunners":0}}"#;
        let session: RunnerScaleSetSession = decode::from_slice(body).expect("decodes");
        assert_eq!(
            session.session_id.to_string(),
            "3f2b7c9e-5a41-4d0e-9a8b-2c6f1e0d7a55"
        );
        assert_eq!(
            session.message_queue_access_token.expose_secret(),
            "mq-token-1"
        );
        assert_eq!(session.statistics.map(|s| s.total_assigned_jobs), Some(2));
        assert!(!format!("{session:?}").contains("mq-token-1"));
    }

    #[test]
    fn session_id_forms() {
        let canonical = "3f2b7c9e-5a41-4d0e-9a8b-2c6f1e0d7a55";
        for form in [
            canonical.to_owned(),
            format!("{{{canonical}}}"),
            format!("urn:uuid:{canonical}"),
            canonical.replace('-', ""),
            canonical.to_uppercase(),
        ] {
            let id: SessionId = form.parse().unwrap_or_else(|e| panic!("{form}: {e}"));
            assert_eq!(id.to_string(), canonical);
        }
        for bad in [
            "",
            "xyz",
            "3f2b7c9e-5a41-4d0e-9a8b-2c6f1e0d7a5",
            "3f2b7c9e+5a41-4d0e-9a8b-2c6f1e0d7a55",
        ] {
            assert!(bad.parse::<SessionId>().is_err(), "{bad}");
        }
        assert!(SessionId::NIL.is_nil());
        assert!(decode::from_slice::<RunnerScaleSetSession>(br#"{"sessionId":"nope"}"#).is_err());
    }

    #[test]
    fn jit_types() {
        let setting = JitSetting {
            name: "runner-1".into(),
            work_folder: String::new(),
        };
        assert_eq!(
            serde_json::to_string(&setting).expect("encodes"),
            r#"{"name":"runner-1","workFolder":""}"#
        );
        let body = br#"{"runner":{"id":1024,"name":"runner-1","runnerScaleSetId":42},"encodedJITConfig":"eyJzZXR0aW5ncyI6Ii4uLiJ9"}"#;
        let config: JitRunnerConfig = decode::from_slice(body).expect("decodes");
        assert_eq!(config.runner.as_ref().map(|r| r.id), Some(1024));
        assert_eq!(
            config.encoded_jit_config.expose_secret(),
            "eyJzZXR0aW5ncyI6Ii4uLiJ9"
        );
        assert!(!format!("{config:?}").contains("eyJz"));
    }

    #[test]
    fn envelope_tolerates_missing_value() {
        let list: ListEnvelope<i64> = decode::from_slice(br#"{"count":1}"#).expect("decodes");
        assert_eq!(list.count, 1);
        assert!(list.value.is_empty());
    }

    #[test]
    fn workflow_jobs_decode_leniently() {
        let body = br#"{"total_count":2,"jobs":[{"id":30000001,"run_id":7,"run_attempt":1,"name":"build-1","status":"completed","conclusion":"failure","runner_id":3,"runner_name":"runner-1","labels":["linux"],"steps":[]},{"id":30000002,"run_id":7,"name":"build-2","status":"queued","conclusion":null,"runner_name":null}]}"#;
        let page: WorkflowJobsPage = decode::from_slice(body).expect("decodes");
        assert_eq!(page.total_count, 2);
        assert_eq!(
            page.jobs,
            vec![
                WorkflowJob {
                    id: 30_000_001,
                    run_id: 7,
                    run_attempt: 1,
                    name: "build-1".into(),
                    status: "completed".into(),
                    conclusion: Some("failure".into()),
                    runner_name: Some("runner-1".into()),
                },
                WorkflowJob {
                    id: 30_000_002,
                    run_id: 7,
                    name: "build-2".into(),
                    status: "queued".into(),
                    ..Default::default()
                },
            ]
        );
        let empty: WorkflowJobsPage = decode::from_slice(b"{}").expect("decodes");
        assert_eq!(empty, WorkflowJobsPage::default());
    }

    #[test]
    fn runner_registration_body_has_exact_keys() {
        let body = RunnerRegistrationRequest {
            url: "https://github.com/my-org/my-repo",
            runner_event: "register",
        };
        assert_eq!(
            serde_json::to_string(&body).expect("encodes"),
            r#"{"url":"https://github.com/my-org/my-repo","runner_event":"register"}"#
        );
    }
}
