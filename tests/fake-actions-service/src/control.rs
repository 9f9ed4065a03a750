//! Types of the control API (`/_fake/...`) and of the in-process handle: requests, and views of the state.
//! Everything is camelCase JSON, both ways, so tests can use the HTTP form and the in-process form alike.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::wire::{Label, Statistics};

/// Where a job is in its life (see `docs/fake-actions-service.md`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum JobState {
    /// Its scale set was deleted; it waits for a scale set of the same name in the same tenant.
    Queued,
    /// Offered to its scale set (`JobAvailable` sent or pending), not acquired.
    Available,
    /// Acquired by the scale set (`JobAssigned` sent), waiting for an idle online runner.
    Acquired,
    /// Given to a runner, not started yet.
    Assigned,
    /// Started on its runner (`JobStarted` sent).
    Running,
    /// Finished or cancelled (`JobCompleted` sent if the scale set had acquired it).
    Completed,
}

/// Request to enqueue jobs for a scale set, found by id or by name (and optionally the tenant scope path such as
/// `my-org` or `my-org/my-repo` when names repeat across tenants).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct EnqueueJobs {
    /// Target scale set id.
    pub scale_set_id: Option<i64>,
    /// Target scale set name (case-insensitive).
    pub scale_set_name: Option<String>,
    /// Tenant scope path to disambiguate names.
    pub scope: Option<String>,
    /// Number of jobs (one workflow run); 0 means 1.
    pub count: u32,
    /// Repository name; defaults to `repo`.
    pub repository: Option<String>,
    /// Repository owner; defaults to the tenant's owner.
    pub owner: Option<String>,
    /// Workflow ref; defaults to `{owner}/{repo}/.github/workflows/ci.yml@refs/heads/main`.
    pub workflow_ref: Option<String>,
    /// `runs-on` labels; default: the scale set name.
    pub labels: Option<Vec<String>>,
    /// Triggering event; defaults to `push`.
    pub event_name: Option<String>,
    /// Display name prefix; jobs are named `{prefix}-{n}`; defaults to `job`.
    pub display_name: Option<String>,
}

/// Which runner to mark online: by id or by the encoded JIT config it was given (a runner pod only has that).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct RunnerSelector {
    /// Runner id.
    pub runner_id: Option<i64>,
    /// Encoded JIT config.
    pub jit_config: Option<String>,
}

/// Which tokens to expire.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum TokenKind {
    /// Message-queue access tokens (queue calls then get 401 until the session is refreshed).
    MessageQueue,
    /// Admin tokens (Actions Service calls then get 401; clients only refresh by the `exp` claim).
    Admin,
    /// Registration tokens.
    Registration,
    /// App installation tokens.
    Installation,
}

/// Request to expire tokens now.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ExpireTokens {
    /// Token kind.
    pub kind: TokenKind,
    /// Only the message-queue tokens of this session.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Only tokens of this scale set's sessions (message queue) .
    #[serde(default)]
    pub scale_set_id: Option<i64>,
    /// Only admin tokens of this tenant.
    #[serde(default)]
    pub tenant_id: Option<i64>,
}

/// Request to drop sessions server-side (the next queue call gets 401, the refresh 404).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct DropSessions {
    /// Only this session.
    pub session_id: Option<String>,
    /// Only this scale set's session.
    pub scale_set_id: Option<i64>,
}

/// Request to add a runner group to a tenant (created if new).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AddRunnerGroup {
    /// Tenant scope path, e.g. `my-org`.
    pub scope: String,
    /// Group name.
    pub name: String,
}

/// Request to finish a job.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct FinishJob {
    /// Result carried by `JobCompleted`; defaults to `succeeded`.
    pub result: Option<String>,
}

/// A runner group of a tenant.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RunnerGroupView {
    /// Id within the tenant (1 is `Default`).
    pub id: i64,
    /// Name.
    pub name: String,
    /// Whether it is `Default`.
    pub is_default: bool,
}

/// A tenant: one per organization, repository or enterprise config URL seen.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TenantView {
    /// Tenant id (in Actions Service paths `/tenant/{id}/`).
    pub id: i64,
    /// Scope path as first seen, e.g. `my-org/my-repo`.
    pub scope: String,
    /// Actions Service URL last handed out, if any.
    pub service_url: Option<String>,
    /// Runner groups.
    pub runner_groups: Vec<RunnerGroupView>,
}

/// A scale set.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleSetView {
    /// Id.
    pub id: i64,
    /// Tenant id.
    pub tenant_id: i64,
    /// Name.
    pub name: String,
    /// Runner group id.
    pub runner_group_id: i64,
    /// Runner group name.
    pub runner_group_name: String,
    /// Labels.
    pub labels: Vec<Label>,
    /// `RunnerSetting.disableUpdate`.
    pub disable_update: bool,
    /// Statistics now.
    pub statistics: Statistics,
    /// The active session, if any.
    pub session_id: Option<String>,
    /// Job messages not yet packed into a queue message.
    pub pending_job_messages: usize,
    /// Ids of delivered-or-packed queue messages not acknowledged yet.
    pub unacked_message_ids: Vec<i64>,
}

/// A message session.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SessionView {
    /// Session id.
    pub id: String,
    /// Scale set id.
    pub scale_set_id: i64,
    /// Owner name given at creation.
    pub owner_name: String,
    /// Last `X-ScaleSetMaxCapacity` received on a poll.
    pub last_max_capacity: Option<i64>,
    /// Polls received.
    pub polls: u64,
}

/// A registered runner.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RunnerView {
    /// Runner id.
    pub id: i64,
    /// Runner name.
    pub name: String,
    /// Scale set id.
    pub scale_set_id: i64,
    /// Tenant id.
    pub tenant_id: i64,
    /// Whether the runner process reported in.
    pub online: bool,
    /// Job request id it holds, if any.
    pub job_request_id: Option<i64>,
    /// Work folder from the JIT request.
    pub work_folder: String,
}

/// A job.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct JobView {
    /// `runnerRequestId`.
    pub request_id: i64,
    /// `jobId`.
    pub job_id: String,
    /// Tenant id.
    pub tenant_id: i64,
    /// Scale set id (absent while `queued`).
    pub scale_set_id: Option<i64>,
    /// Name of the scale set it targets.
    pub scale_set_name: String,
    /// State.
    pub state: JobState,
    /// Runner holding or having run the job.
    pub runner_id: Option<i64>,
    /// Its name.
    pub runner_name: Option<String>,
    /// Result once completed.
    pub result: Option<String>,
    /// Repository.
    pub repository: String,
    /// Owner.
    pub owner: String,
    /// Workflow ref.
    pub workflow_ref: String,
    /// Workflow run id.
    pub workflow_run_id: i64,
    /// Labels.
    pub labels: Vec<String>,
    /// Times acquired (more than one after requeues).
    pub times_acquired: u32,
    /// Times started.
    pub times_started: u32,
    /// Times requeued by the control API or a scale-set deletion.
    pub times_requeued: u32,
    /// Failed because its runner stopped renewing it (see `Config::runner_lost_timeout`).
    #[serde(default)]
    pub runner_lost: bool,
    /// Display name (`jobDisplayName`; `name` in the GitHub REST API).
    #[serde(default)]
    pub display_name: String,
    /// Id of this job attempt in the GitHub REST API (`/actions/jobs/{id}`); not the request id.
    #[serde(default)]
    pub rest_id: i64,
    /// Attempt of the workflow run the job belongs to: 1, then one more per re-run in the run.
    #[serde(default)]
    pub run_attempt: u32,
    /// Request id of the job attempt this one re-runs.
    #[serde(default)]
    pub rerun_of: Option<i64>,
    /// Request id of the attempt that re-ran this one; set once it is re-run.
    #[serde(default)]
    pub next_attempt: Option<i64>,
    /// The re-run that created this attempt asked for debug logging.
    #[serde(default)]
    pub debug_logging: bool,
}

/// Everything the fake holds, for assertions.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StateSnapshot {
    /// Tenants.
    pub tenants: Vec<TenantView>,
    /// Scale sets.
    pub scale_sets: Vec<ScaleSetView>,
    /// Sessions.
    pub sessions: Vec<SessionView>,
    /// Registered runners (deregistered ones are gone).
    pub runners: Vec<RunnerView>,
    /// Every job ever enqueued.
    pub jobs: Vec<JobView>,
    /// Runner reports refused because their JIT config had been used by another runner process before.
    #[serde(default)]
    pub jit_config_reuses: u64,
    /// Jobs re-run through the GitHub REST API (`POST .../actions/jobs/{id}/rerun` answered 201).
    #[serde(default)]
    pub job_reruns: u64,
}

/// Requests received per endpoint name (see `routes::ENDPOINT_NAMES`), injected faults included.
pub type Counters = BTreeMap<String, u64>;
