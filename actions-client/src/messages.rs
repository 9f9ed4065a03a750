//! Long-poll messages and the job messages inside them
//! (docs/reference/actions-service-protocol.md, "Get a message" and "Job messages").

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::decode::{self, go_time};
use crate::models::{RawMessage, Statistics};

/// The only envelope `messageType` the protocol defines.
pub const RUNNER_SCALE_SET_JOB_MESSAGES: &str = "RunnerScaleSetJobMessages";

/// Fields every job message carries.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct JobInfo {
    /// The job request id; what acquire-jobs takes.
    pub runner_request_id: i64,
    /// Repository name.
    pub repository_name: String,
    /// Repository owner.
    pub owner_name: String,
    /// Job id (a GUID-like string).
    pub job_id: String,
    /// `{owner}/{repo}/.github/workflows/{file}@{ref}`.
    pub job_workflow_ref: String,
    /// Display name of the job.
    pub job_display_name: String,
    /// Workflow run id.
    pub workflow_run_id: i64,
    /// Triggering event, e.g. `push`.
    pub event_name: String,
    /// `runs-on` labels.
    pub request_labels: Vec<String>,
    /// When the job was queued.
    #[serde(with = "go_time")]
    pub queue_time: Option<Timestamp>,
    /// When the job was assigned to the scale set.
    #[serde(with = "go_time")]
    pub scale_set_assign_time: Option<Timestamp>,
    /// When a runner was assigned.
    #[serde(with = "go_time")]
    pub runner_assign_time: Option<Timestamp>,
    /// When the job finished.
    #[serde(with = "go_time")]
    pub finish_time: Option<Timestamp>,
}

/// A job the scale set may acquire.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct JobAvailable {
    /// Common fields.
    #[serde(flatten)]
    pub job: JobInfo,
    /// Carried, never called by the reference clients.
    pub acquire_job_url: String,
}

/// A job assigned to the scale set, waiting for a runner.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct JobAssigned {
    /// Common fields.
    #[serde(flatten)]
    pub job: JobInfo,
}

/// A runner of the set picked up a job.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct JobStarted {
    /// Common fields.
    #[serde(flatten)]
    pub job: JobInfo,
    /// The runner's id.
    pub runner_id: i64,
    /// The runner's name.
    pub runner_name: String,
}

/// A job finished, or its assignment was cancelled (`result` = `canceled`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct JobCompleted {
    /// Common fields.
    #[serde(flatten)]
    pub job: JobInfo,
    /// Free-form result, e.g. `succeeded`, `failed`, `canceled`.
    pub result: String,
    /// The runner's id (may refer to a runner that never became busy).
    pub runner_id: i64,
    /// The runner's name.
    pub runner_name: String,
}

/// One element of a message body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobMessage {
    /// `JobAvailable`.
    Available(JobAvailable),
    /// `JobAssigned`.
    Assigned(JobAssigned),
    /// `JobStarted`.
    Started(JobStarted),
    /// `JobCompleted`.
    Completed(JobCompleted),
}

impl JobMessage {
    /// The common fields.
    pub fn job(&self) -> &JobInfo {
        match self {
            Self::Available(m) => &m.job,
            Self::Assigned(m) => &m.job,
            Self::Started(m) => &m.job,
            Self::Completed(m) => &m.job,
        }
    }

    /// The wire `messageType`.
    pub fn message_type(&self) -> &'static str {
        match self {
            Self::Available(_) => "JobAvailable",
            Self::Assigned(_) => "JobAssigned",
            Self::Started(_) => "JobStarted",
            Self::Completed(_) => "JobCompleted",
        }
    }
}

/// A parsed long-poll message.
#[derive(Debug, Clone, PartialEq)]
pub struct RunnerScaleSetMessage {
    /// Id to acknowledge and to pass as `lastMessageId` next time.
    pub message_id: i64,
    /// Statistics at the time of the message; absent only if the service left them out.
    pub statistics: Option<Statistics>,
    /// Job messages in arrival order; unknown kinds are already skipped.
    pub jobs: Vec<JobMessage>,
}

impl RunnerScaleSetMessage {
    /// `JobAvailable` entries in arrival order.
    pub fn available(&self) -> impl Iterator<Item = &JobAvailable> {
        self.jobs.iter().filter_map(|m| match m {
            JobMessage::Available(a) => Some(a),
            _ => None,
        })
    }

    /// `JobAssigned` entries in arrival order.
    pub fn assigned(&self) -> impl Iterator<Item = &JobAssigned> {
        self.jobs.iter().filter_map(|m| match m {
            JobMessage::Assigned(a) => Some(a),
            _ => None,
        })
    }

    /// `JobStarted` entries in arrival order.
    pub fn started(&self) -> impl Iterator<Item = &JobStarted> {
        self.jobs.iter().filter_map(|m| match m {
            JobMessage::Started(s) => Some(s),
            _ => None,
        })
    }

    /// `JobCompleted` entries in arrival order.
    pub fn completed(&self) -> impl Iterator<Item = &JobCompleted> {
        self.jobs.iter().filter_map(|m| match m {
            JobMessage::Completed(c) => Some(c),
            _ => None,
        })
    }
}

/// Why a message could not be used; the client turns it into an [`crate::Error`] with the response's details.
#[derive(Debug)]
pub enum MessageProblem {
    /// The envelope's `messageType` is not [`RUNNER_SCALE_SET_JOB_MESSAGES`].
    UnsupportedType(String),
    /// One job message does not decode.
    Decode(serde_json::Error),
}

impl From<serde_json::Error> for MessageProblem {
    fn from(value: serde_json::Error) -> Self {
        Self::Decode(value)
    }
}

/// Parses a long-poll envelope and its `body`: unknown job kinds are skipped, a malformed element fails
/// the whole message.
pub fn parse_message(raw: RawMessage) -> Result<RunnerScaleSetMessage, MessageProblem> {
    if raw.message_type != RUNNER_SCALE_SET_JOB_MESSAGES {
        return Err(MessageProblem::UnsupportedType(raw.message_type));
    }
    let jobs = if raw.body.is_empty() {
        Vec::new()
    } else {
        parse_job_messages(&raw.body)?
    };
    Ok(RunnerScaleSetMessage {
        message_id: raw.message_id,
        statistics: raw.statistics,
        jobs,
    })
}

/// Parses a message `body`: a JSON array of job messages.
pub fn parse_job_messages(body: &str) -> Result<Vec<JobMessage>, serde_json::Error> {
    let elements: Vec<Value> = serde_json::from_str(body)?;
    let mut out = Vec::with_capacity(elements.len());
    for element in elements {
        let kind = element
            .as_object()
            .and_then(|o| {
                o.iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("messageType"))
            })
            .and_then(|(_, v)| v.as_str())
            .unwrap_or_default()
            .to_owned();
        let message = match kind.as_str() {
            "JobAvailable" => JobMessage::Available(decode::from_value(element)?),
            "JobAssigned" => JobMessage::Assigned(decode::from_value(element)?),
            "JobStarted" => JobMessage::Started(decode::from_value(element)?),
            "JobCompleted" => JobMessage::Completed(decode::from_value(element)?),
            _ => continue,
        };
        out.push(message);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const BODY: &str = r#"[
      {"messageType":"JobAvailable","acquireJobUrl":"https://x/acquire","runnerRequestId":9002,"repositoryName":"my-repo","ownerName":"my-org","jobId":"aa","jobWorkflowRef":"my-org/my-repo/.github/workflows/ci.yml@refs/heads/main","jobDisplayName":"test","workflowRunId":123457,"eventName":"push","requestLabels":["my-set"],"queueTime":"2025-01-01T10:00:00Z","scaleSetAssignTime":"0001-01-01T00:00:00Z","runnerAssignTime":"0001-01-01T00:00:00Z","finishTime":"0001-01-01T00:00:00Z"},
      {"messageType":"SomethingNew","runnerRequestId":1},
      {"messageType":"JobAssigned","runnerRequestId":9001},
      {"messageType":"JobStarted","runnerId":1024,"runnerName":"runner-1a2b3c4d","runnerRequestId":9001,"jobId":"bb"},
      {"messageType":"JobCompleted","result":"succeeded","runnerId":1024,"runnerName":"runner-1a2b3c4d","runnerRequestId":9001,"finishTime":"2025-01-01T10:05:00Z"}
    ]"#;

    fn raw(message_type: &str, body: &str) -> RawMessage {
        RawMessage {
            message_id: 17,
            message_type: message_type.into(),
            body: body.into(),
            statistics: Some(Statistics {
                total_assigned_jobs: 1,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn parses_every_kind_in_order_and_skips_unknown_kinds() {
        let message = parse_message(raw(RUNNER_SCALE_SET_JOB_MESSAGES, BODY)).expect("parses");
        let kinds: Vec<_> = message.jobs.iter().map(JobMessage::message_type).collect();
        assert_eq!(
            kinds,
            ["JobAvailable", "JobAssigned", "JobStarted", "JobCompleted"]
        );
        let available: Vec<_> = message.available().collect();
        assert_eq!(available[0].job.runner_request_id, 9002);
        assert_eq!(available[0].acquire_job_url, "https://x/acquire");
        assert_eq!(available[0].job.request_labels, ["my-set"]);
        assert_eq!(available[0].job.scale_set_assign_time, None);
        let started: Vec<_> = message.started().collect();
        assert_eq!(
            (started[0].runner_id, started[0].runner_name.as_str()),
            (1024, "runner-1a2b3c4d")
        );
        let completed: Vec<_> = message.completed().collect();
        assert_eq!(completed[0].result, "succeeded");
        assert_eq!(
            completed[0].job.finish_time,
            Some("2025-01-01T10:05:00Z".parse().expect("ts"))
        );
        assert_eq!(message.assigned().count(), 1);
        assert_eq!(message.message_id, 17);
        assert_eq!(message.statistics.map(|s| s.total_assigned_jobs), Some(1));
    }

    #[test]
    fn empty_body_means_no_jobs() {
        let message = parse_message(raw(RUNNER_SCALE_SET_JOB_MESSAGES, "")).expect("parses");
        assert!(message.jobs.is_empty());
        let message = parse_message(raw(RUNNER_SCALE_SET_JOB_MESSAGES, "[]")).expect("parses");
        assert!(message.jobs.is_empty());
    }

    #[test]
    fn wrong_envelope_type_is_rejected() {
        let err = parse_message(raw("SomethingElse", "[]")).expect_err("rejected");
        assert!(matches!(err, MessageProblem::UnsupportedType(t) if t == "SomethingElse"));
    }

    #[test]
    fn one_malformed_element_fails_the_message() {
        let body = r#"[{"messageType":"JobAssigned","runnerRequestId":1},{"messageType":"JobStarted","runnerId":"x"}]"#;
        assert!(matches!(
            parse_message(raw(RUNNER_SCALE_SET_JOB_MESSAGES, body)),
            Err(MessageProblem::Decode(_))
        ));
        assert!(
            parse_message(raw(RUNNER_SCALE_SET_JOB_MESSAGES, "{}")).is_err(),
            "body must be an array"
        );
    }

    #[test]
    fn job_keys_are_case_insensitive() {
        let body = r#"[{"MessageType":"JobStarted","RunnerId":5,"RUNNERNAME":"r"}]"#;
        let message = parse_message(raw(RUNNER_SCALE_SET_JOB_MESSAGES, body)).expect("parses");
        let started: Vec<_> = message.started().collect();
        assert_eq!(
            (started[0].runner_id, started[0].runner_name.as_str()),
            (5, "r")
        );
    }
}
