//! The message loop: session, long poll, message handling in ARC's order, scaling, and recovery.
//!
//! # Expected flow
//! Create a session, scale to its statistics, then poll forever. Each message is handled completely, in this
//! order: keep its statistics, acknowledge it, acquire every `JobAvailable`, note every `JobStarted` and
//! `JobCompleted` (metrics), scale to the message's `totalAssignedJobs`, then write the started runners' job
//! fields (docs/listener.md, "The message loop", says why scaling comes first). An empty poll re-sends the
//! scaling patch for the last statistics.
//!
//! # Guarantees (beyond ARC: docs/reference/beyond-arc.md, items 1 to 3 and 5)
//! * No service or Kubernetes error ends the loop. Transient ones are retried in place for a short budget, then
//!   the loop backs off (capped, jittered) and resumes; the session is replaced when the service no longer
//!   accepts it. Errors that need a person back off up to 5 minutes and set `gha_listener_fatal_error`.
//! * The last message id survives session replacement. A message whose acknowledgement failed is polled again.
//! * Scaling is never skipped: a failed replica patch is re-sent before the next poll, and the step after it
//!   never asks the EphemeralRunnerSet to converge.
//! * A failed EphemeralRunner status patch is retried before later polls instead of being dropped.
//! * Jobs whose acquisition failed after their offer was acknowledged are acquired again before the next poll (on
//!   a new session when the old one is replaced): recovery does not rest on the service offering them again.
//!
//! # Shutdown
//! Cancelling the token aborts a long poll or a backoff wait, but a message already received is handled to the
//! end. The session is then deleted, bounded by a timeout rather than by the signal.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use actions_client::retry::{JitteredBackoff, JitteredBackoffBuilder};
use actions_client::{
    ActionsClient, ClientOptions, Credentials, GitHubConfig, HttpOptions, MessageSessionClient,
    RetryPolicy, RunnerScaleSetMessage, SessionId, Statistics,
};
use backon::Retryable as _;
use futures::{StreamExt, stream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff;
use crate::completions::Completions;
use crate::error::{Error, Result, Severity};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::scaling::{Scaler, runner_job_status_patch, runner_set_patch};
use crate::status::{Report, StatusHandle};
use crate::target::{RunnerPatched, RunnerSetTarget};

/// EphemeralRunner status patches in flight at once for one message (the API server takes them in parallel; a
/// batch of 50 one after the other would hold up the next poll).
const RUNNER_PATCH_CONCURRENCY: usize = 16;
/// Timings of the loop. The defaults are for production; tests shorten them.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Backoff after transient errors ([`backoff::TRANSIENT`]; `max_retries` is not used).
    pub transient_backoff: RetryPolicy,
    /// Backoff after errors that need a person ([`backoff::FATAL`]; `max_retries` is not used).
    pub fatal_backoff: RetryPolicy,
    /// How long one step of message handling (ack, acquire, a patch) is retried in place before the loop backs
    /// off as a whole.
    pub step_retry_budget: Duration,
    /// How long the loop may go without progress before `/healthz` fails: the long-poll attempt timeout plus a
    /// margin for handling a message.
    pub health_limit: Duration,
    /// Transport settings of the Actions client.
    pub http: HttpOptions,
    /// Upper bound of deleting a session (at shutdown, or before replacing it).
    pub close_timeout: Duration,
    /// Tries of a failed EphemeralRunner status patch before it is given up.
    pub runner_patch_attempts: u32,
    /// How often the AutoscalingListener status is rewritten when only the last poll time or the figures
    /// changed (changes of session or errors are written at once).
    pub status_heartbeat: Duration,
    /// How long a scaling patch that cannot raise the target may wait to be joined by the next ones (0: every
    /// message patches at once, as ARC's listener does). See [`crate::scaling::may_defer`].
    pub patch_coalesce_window: Duration,
}

impl Settings {
    /// How old the reported last poll time can grow while the listener works: the longest long poll plus the
    /// status heartbeat. The controller judges the report stale after this (plus its own margin).
    pub fn poll_stale_after(&self) -> Duration {
        self.http.timeouts.long_poll_request + self.status_heartbeat
    }
}

impl Default for Settings {
    fn default() -> Self {
        let http = HttpOptions::default();
        Self {
            transient_backoff: backoff::TRANSIENT,
            fatal_backoff: backoff::FATAL,
            step_retry_budget: Duration::from_secs(20),
            health_limit: http.timeouts.long_poll_request + Duration::from_secs(30),
            http,
            close_timeout: Duration::from_secs(30),
            runner_patch_attempts: 10,
            patch_coalesce_window: Duration::from_secs(1),
            status_heartbeat: Duration::from_secs(30),
        }
    }
}

/// What the loop needs to know about its scale set.
#[derive(Debug, Clone)]
pub struct ScaleSet {
    /// The parsed config URL.
    pub github: GitHubConfig,
    /// GitHub credentials.
    pub credentials: Credentials,
    /// Actions client options (User-Agent, transport).
    pub client_options: ClientOptions,
    /// Scale set ID.
    pub id: i64,
    /// Session owner (the pod name).
    pub owner_name: String,
    /// `min_runners`.
    pub min_runners: i64,
    /// `max_runners`, also sent as the capacity on every poll.
    pub max_runners: u32,
}

/// Why an iteration ended without error.
enum Flow {
    Continue,
    Stop,
}

/// How a scaling step treats its patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepKind {
    /// Patch, as ARC does.
    Always,
    /// Patch; a quiet step whose target did not change asks the set to converge even above the minimum
    /// ([`crate::scaling::Scaler::settle`]).
    Settle,
    /// After a message with job events: a patch that does not raise the target may wait
    /// ([`crate::scaling::may_defer`]).
    MayDefer,
}

/// A status patch that failed and is tried again later.
struct PendingRunnerPatch {
    runner: String,
    /// The registration the job started on.
    runner_id: i64,
    patch: serde_json::Value,
    /// Failed tries so far.
    attempts: u32,
}

/// A job's fields refused because the runner records another registration than the one the job started on: it
/// registered again since (its pod was taken away before the listener heard of the job). The manager forgets a
/// registration before it makes the next one, so waiting would not help.
fn other_registration(runner: &str, runner_id: i64) {
    tracing::info!(
        runner,
        runner_id,
        "the EphemeralRunner runs under another registration than the one this job started on; its job fields are not written"
    );
}

/// The message loop.
pub struct MessageLoop<T> {
    scale_set: ScaleSet,
    settings: Settings,
    target: T,
    metrics: Option<Arc<Metrics>>,
    health: Health,
    client: ActionsClient,
    rebuild_client: bool,
    session: Option<MessageSessionClient>,
    scaler: Scaler,
    last_message_id: i64,
    latest: Statistics,
    rescale_pending: bool,
    pending_runner_patches: Vec<PendingRunnerPatch>,
    /// Jobs offered in an acknowledged message whose acquisition failed: acquired again before the next poll, as
    /// the service need not offer an acknowledged job again.
    pending_acquire: Vec<i64>,
    transient_failures: u32,
    fatal_failures: u32,
    /// The next waits after transient errors, and after repeated errors that need a person; restarted when an
    /// iteration succeeds.
    transient_waits: JitteredBackoff,
    fatal_waits: JitteredBackoff,
    /// What the controller is told (through the AutoscalingListener's status, when a publisher subscribes).
    status: StatusHandle,
    /// Scheduled minimums and the scale-down delay (not in ARC; by default neither).
    policy: Policy,
    /// When the policy changes the target without a message (a window boundary, the end of a hold).
    wake_at: Option<tokio::time::Instant>,
    /// The decision of the last scaling step.
    last_decision: Option<crate::scaling::Decision>,
    /// When a deferred scaling patch is due ([`crate::scaling::may_defer`]); `None` when none is waiting.
    flush_at: Option<tokio::time::Instant>,
    /// Runners whose finished jobs the target leaves out, listed in every patch until the set has acted on one
    /// that carried them (not in ARC).
    completions: Completions,
    /// A session a predecessor recorded and may have left behind (it was killed): deleted once, before this loop
    /// creates its first, so the service does not refuse that as a second session until it expires the old one.
    predecessor: Option<SessionId>,
}

impl<T: RunnerSetTarget> MessageLoop<T> {
    /// A loop for `scale_set`, writing to `target`. Builds the Actions client (no network I/O).
    pub fn new(
        scale_set: ScaleSet,
        settings: Settings,
        target: T,
        metrics: Option<Arc<Metrics>>,
        health: Health,
    ) -> Result<Self> {
        let client = build_client(&scale_set)?;
        let transient_waits = JitteredBackoff::new(settings.transient_backoff);
        let fatal_waits = JitteredBackoff::new(settings.fatal_backoff);
        let policy = Policy::new(
            Vec::new(),
            scale_set.min_runners,
            i64::from(scale_set.max_runners),
            Duration::ZERO,
        );
        Ok(Self {
            scale_set,
            settings,
            target,
            metrics,
            health,
            client,
            rebuild_client: false,
            session: None,
            scaler: Scaler::default(),
            last_message_id: 0,
            latest: Statistics::default(),
            rescale_pending: false,
            pending_runner_patches: Vec::new(),
            pending_acquire: Vec::new(),
            transient_failures: 0,
            fatal_failures: 0,
            transient_waits,
            fatal_waits,
            status: StatusHandle::new(),
            policy,
            wake_at: None,
            last_decision: None,
            flush_at: None,
            completions: Completions::default(),
            predecessor: None,
        })
    }

    /// Deletes session `id`, which a predecessor recorded (on the AutoscalingListener's status), before creating the
    /// first session: a successor then holds the set's session at once instead of after the service's expiry.
    /// Only for a predecessor known to have stopped, or to be stopping: a live one would lose its session.
    #[must_use]
    pub fn with_predecessor(mut self, id: Option<SessionId>) -> Self {
        if let Some(id) = id {
            self.status.predecessor(id.to_string());
        }
        self.predecessor = id;
        self
    }

    /// Replaces the scaling policy (scheduled minimums, scale-down delay); without this call the loop scales as
    /// ARC's listener does.
    #[must_use]
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// The loop's reports for the controller; the channel closes when the loop ends, after its last report.
    pub fn status(&self) -> watch::Receiver<Report> {
        self.status.subscribe()
    }

    /// Runs until `shutdown` is cancelled (`Ok`) or an unrecoverable error happens; deletes the session either way.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<()> {
        tracing::info!(scale_set_id = self.scale_set.id, "message loop starting");
        let outcome = loop {
            if shutdown.is_cancelled() {
                break Ok(());
            }
            match self.iteration(&shutdown).await {
                Ok(Flow::Continue) => self.succeeded(),
                Ok(Flow::Stop) => break Ok(()),
                Err(error) => match self.recover(error, &shutdown).await {
                    Ok(Flow::Continue) => {}
                    Ok(Flow::Stop) => break Ok(()),
                    Err(error) => break Err(error),
                },
            }
        };
        self.close_session().await;
        tracing::info!("message loop stopped");
        outcome
    }

    fn succeeded(&mut self) {
        if self.fatal_failures > 0 || self.transient_failures > 0 {
            tracing::info!("recovered; polling normally again");
        }
        self.transient_failures = 0;
        self.fatal_failures = 0;
        self.transient_waits = JitteredBackoff::new(self.settings.transient_backoff);
        self.fatal_waits = JitteredBackoff::new(self.settings.fatal_backoff);
        if let Some(m) = &self.metrics {
            m.set_fatal(false);
        }
    }

    /// One poll, with whatever has to happen before it (a new session, a pending scaling patch).
    async fn iteration(&mut self, shutdown: &CancellationToken) -> Result<Flow> {
        self.flush_runner_patches().await;
        if self.session.is_none() {
            let created = tokio::select! {
                created = self.create_session() => created,
                () = shutdown.cancelled() => return Ok(Flow::Stop),
            };
            created?;
        } else if self.rescale_pending {
            let desired = self.scale(self.latest.total_assigned_jobs).await?;
            self.record_desired(desired);
        }
        if !self.pending_acquire.is_empty() {
            let ids = std::mem::take(&mut self.pending_acquire);
            if let Err(error) = self.acquire(&ids).await {
                self.pending_acquire = ids;
                return Err(error);
            }
        }
        let Some(session) = self.session.take() else {
            return Ok(Flow::Continue);
        };
        tracing::info!(
            last_message_id = self.last_message_id,
            "polling for a message"
        );
        // The session is out of `self` while the poll runs, so a policy wake-up can scale in the meantime.
        let polled = self.poll_with_wakeups(&session, shutdown).await;
        self.session = Some(session);
        let Some(polled) = polled? else {
            return Ok(Flow::Stop);
        };
        let message = polled.map_err(Error::GetMessage)?;
        self.health.poll_completed();
        self.status.polled();
        match message {
            // Same statistics as before; ARC does not update the desired gauge on this path.
            None => {
                self.scale(self.latest.total_assigned_jobs).await?;
            }
            Some(message) => self.process(message).await?,
        }
        Ok(Flow::Continue)
    }

    /// Long-polls, and meanwhile scales at each policy wake-up (a window opening or closing, a hold ending), so a
    /// change no message announces is applied on time without cutting the poll short. `None`: shut down.
    async fn poll_with_wakeups(
        &mut self,
        session: &MessageSessionClient,
        shutdown: &CancellationToken,
    ) -> Result<Option<actions_client::Result<Option<RunnerScaleSetMessage>>>> {
        let poll = session.get_message(self.last_message_id, self.scale_set.max_runners);
        tokio::pin!(poll);
        loop {
            let wake = self.wake_at;
            let flush = self.flush_at;
            tokio::select! {
                polled = &mut poll => return Ok(Some(polled)),
                () = sleep_until(wake) => self.wake_up().await?,
                () = sleep_until(flush) => {
                    let desired = self.scale(self.latest.total_assigned_jobs).await?;
                    self.record_desired(desired);
                }
                () = shutdown.cancelled() => return Ok(None),
            }
        }
    }

    /// A scaling step without a message. When it lowers the target, a second step follows at once: nothing
    /// happened since the first, so it asks the set to converge, and idle runners above the new target leave now
    /// rather than when the assigned jobs have drained (busy runners stay: the set never removes a runner with a
    /// job, and it deregisters a runner before deleting it, which the service refuses for one just given a job).
    async fn wake_up(&mut self) -> Result<()> {
        self.wake_at = None;
        tracing::info!("scaling policy changed the target (window boundary or end of a hold)");
        let before = self.scaler.target();
        let desired = self.scale(self.latest.total_assigned_jobs).await?;
        self.record_desired(desired);
        if desired < before && self.last_decision.is_some_and(|d| d.patch_id != 0) {
            self.scale_step(self.latest.total_assigned_jobs, StepKind::Settle)
                .await?;
        }
        Ok(())
    }

    /// Creates a session and performs ARC's initial step: scale to the session's statistics. Jobs queued while
    /// no listener ran are counted there, so they are served at once.
    async fn create_session(&mut self) -> Result<()> {
        if std::mem::take(&mut self.rebuild_client) {
            // A fresh client fetches a fresh admin token: the old one may have been revoked server-side, and the
            // client only renews it by its expiry claim.
            self.client = build_client(&self.scale_set)?;
        }
        if let Some(id) = self.predecessor.take() {
            // Whatever the answer: gone already (closed at its shutdown, expired) or deleted now, creating is next.
            match self
                .client
                .delete_message_session(self.scale_set.id, id)
                .await
            {
                Ok(()) => {
                    tracing::info!(session_id = %id, "deleted the session a predecessor left")
                }
                Err(error) => {
                    tracing::info!(session_id = %id, %error, "the predecessor's session was not deleted")
                }
            }
        }
        let session = self
            .client
            .message_session(self.scale_set.id, &self.scale_set.owner_name)
            .await
            .map_err(Error::CreateSession)?;
        let snapshot = session.session().await;
        if snapshot.session_id.is_nil() {
            return Err(Error::InvalidSession("its id is the nil UUID"));
        }
        let Some(statistics) = snapshot.statistics else {
            close_quietly(&session, self.settings.close_timeout).await;
            return Err(Error::InvalidSession("it carries no statistics"));
        };
        tracing::info!(session_id = %snapshot.session_id, owner = %snapshot.owner_name, "message session created");
        self.session = Some(session);
        self.health.poll_completed();
        self.status
            .session_created(snapshot.session_id.to_string(), snapshot.owner_name.clone());
        self.latest = statistics;
        self.status.statistics(&statistics);
        if let Some(m) = &self.metrics {
            m.record_statistics(&statistics);
        }
        tracing::info!(
            total_assigned_jobs = statistics.total_assigned_jobs,
            "handling the session's initial statistics"
        );
        let desired = self.scale(statistics.total_assigned_jobs).await?;
        self.record_desired(desired);
        Ok(())
    }

    fn record_desired(&self, desired: i64) {
        self.status.desired(desired);
        if let Some(m) = &self.metrics {
            m.record_desired(desired);
        }
    }

    /// Handles one message in ARC's order. Everything after the acknowledgement runs even when acquiring failed,
    /// so job events and scaling are never lost to an acquire error.
    async fn process(&mut self, message: RunnerScaleSetMessage) -> Result<()> {
        let previous_id = std::mem::replace(&mut self.last_message_id, message.message_id);
        match message.statistics {
            Some(statistics) => {
                self.latest = statistics;
                self.status.statistics(&statistics);
                if let Some(m) = &self.metrics {
                    m.record_statistics(&statistics);
                }
            }
            None => tracing::warn!(
                message_id = message.message_id,
                "message has no statistics; scaling on the last known ones"
            ),
        }
        let Some(session) = &self.session else {
            return Ok(());
        };
        let acked = retry_transient(&self.settings, "acknowledge the message", || {
            session.delete_message(message.message_id)
        })
        .await;
        if let Err(source) = acked {
            // Not acknowledged: poll it again rather than skip it.
            self.last_message_id = previous_id;
            return Err(Error::DeleteMessage {
                message_id: message.message_id,
                source,
            });
        }
        let offered: Vec<i64> = message
            .available()
            .map(|job| job.job.runner_request_id)
            .collect();
        let acquire_error = self.acquire(&offered).await.err();
        if acquire_error.is_some() {
            self.pending_acquire.extend(offered);
        }
        let mut started = Vec::new();
        for job in message.started() {
            if let Some(m) = &self.metrics {
                m.record_job_started(job);
            }
            let info = &job.job;
            tracing::info!(
                runner_name = %job.runner_name,
                owner = %info.owner_name,
                repository = %info.repository_name,
                job_id = %info.job_id,
                workflow_ref = %info.job_workflow_ref,
                workflow_run_id = info.workflow_run_id,
                job_display_name = %info.job_display_name,
                request_id = info.runner_request_id,
                "job started"
            );
            // Before any patch, so a failed patch still counts as an event.
            self.scaler.mark_dirty();
            if job.runner_name.is_empty() {
                tracing::warn!(
                    request_id = info.runner_request_id,
                    "JobStarted without a runner name; no runner to update"
                );
                continue;
            }
            started.push((
                job.runner_name.clone(),
                job.runner_id,
                runner_job_status_patch(job),
            ));
        }
        for job in message.completed() {
            if let Some(m) = &self.metrics {
                m.record_job_completed(job);
            }
            tracing::info!(runner_name = %job.runner_name, result = %job.result, request_id = job.job.runner_request_id, "job completed");
            self.scaler.mark_dirty();
            self.completions.record(&job.runner_name, job.runner_id);
        }
        // Scale before the runners' job fields are written (ARC writes them first): the statistics describe the
        // moment the message was fetched, and every second spent on status patches lets more of the jobs they
        // count finish, so the ERS would create runners for jobs that are already done. A batch with JobStarted
        // is eventful, so this patch can only scale up: busy runners are never at risk before their patch lands.
        // After a message with job events: a patch that raises the target goes now, any other waits up to
        // `Settings::patch_coalesce_window` for the next ones.
        let scaled = self
            .scale_step(self.latest.total_assigned_jobs, StepKind::MayDefer)
            .await;
        self.patch_started_runners(started).await;
        let desired = scaled?;
        self.record_desired(desired);
        acquire_error.map_or(Ok(()), Err)
    }

    /// Writes the job fields of the runners that started jobs, [`RUNNER_PATCH_CONCURRENCY`] at a time (a batch
    /// may hold 50 starts). Transient failures are retried in place; what still fails is queued for later.
    async fn patch_started_runners(&mut self, started: Vec<(String, i64, serde_json::Value)>) {
        let settings = &self.settings;
        let target = &self.target;
        let results: Vec<(String, i64, serde_json::Value, Result<RunnerPatched>)> =
            stream::iter(started)
                .map(|(runner, runner_id, patch)| async move {
                    let result =
                        retry_transient(settings, "patch the EphemeralRunner status", || {
                            target.patch_runner_status(&runner, runner_id, &patch)
                        })
                        .await;
                    (runner, runner_id, patch, result)
                })
                .buffer_unordered(RUNNER_PATCH_CONCURRENCY)
                .collect()
                .await;
        for (runner, runner_id, patch, result) in results {
            match result {
                Ok(RunnerPatched::Patched) => {
                    tracing::info!(runner = %runner, "EphemeralRunner status updated")
                }
                Ok(RunnerPatched::NotFound) => {
                    tracing::info!(runner = %runner, "EphemeralRunner not found; skipping its status update");
                }
                Ok(RunnerPatched::OtherRegistration) => other_registration(&runner, runner_id),
                Err(error) => {
                    tracing::warn!(error = %error_chain(&error), runner = %runner, "EphemeralRunner status update failed; will retry");
                    self.record_error(&error);
                    self.pending_runner_patches.push(PendingRunnerPatch {
                        runner,
                        runner_id,
                        patch,
                        attempts: 1,
                    });
                }
            }
        }
    }

    /// Acquires jobs `ids` (those offered with `JobAvailable`; github.com assigns jobs directly and offers none).
    /// Ids the service does not hand over (taken, cancelled) are simply not acquired.
    async fn acquire(&self, ids: &[i64]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let Some(session) = &self.session else {
            return Ok(());
        };
        tracing::info!(count = ids.len(), "acquiring jobs");
        let acquired =
            retry_transient(&self.settings, "acquire jobs", || session.acquire_jobs(ids))
                .await
                .map_err(|source| Error::AcquireJobs {
                    count: ids.len(),
                    source,
                })?;
        tracing::info!(count = acquired.len(), "acquired jobs");
        Ok(())
    }

    async fn flush_runner_patches(&mut self) {
        let pending = std::mem::take(&mut self.pending_runner_patches);
        for mut item in pending {
            match self
                .target
                .patch_runner_status(&item.runner, item.runner_id, &item.patch)
                .await
            {
                Ok(RunnerPatched::OtherRegistration) => {
                    other_registration(&item.runner, item.runner_id)
                }
                Ok(_) => {
                    tracing::info!(runner = %item.runner, "EphemeralRunner status updated on retry")
                }
                Err(error) => {
                    item.attempts += 1;
                    self.record_error(&error);
                    if item.attempts >= self.settings.runner_patch_attempts {
                        tracing::error!(error = %error_chain(&error), runner = %item.runner, attempts = item.attempts, "giving up on the EphemeralRunner status update");
                    } else {
                        self.pending_runner_patches.push(item);
                    }
                }
            }
        }
    }

    /// ARC's scaling step: decide, then always patch, even when nothing changed. The policy supplies the
    /// minimum in effect and, while the scale-down delay holds a peak, the demand to scale for.
    async fn scale(&mut self, assigned_jobs: i64) -> Result<i64> {
        self.scale_step(assigned_jobs, StepKind::Always).await
    }

    /// A scaling step of `kind`.
    async fn scale_step(&mut self, assigned_jobs: i64, kind: StepKind) -> Result<i64> {
        let plan = self.policy.plan(
            assigned_jobs,
            jiff::Timestamp::now(),
            tokio::time::Instant::now(),
        );
        self.wake_at = plan.wake_at;
        let max = i64::from(self.scale_set.max_runners);
        if kind == StepKind::MayDefer {
            let target =
                crate::scaling::desired_replicas(plan.assigned_jobs, plan.min_runners, max);
            let window = self.settings.patch_coalesce_window;
            if !self.rescale_pending
                && crate::scaling::may_defer(
                    target,
                    self.scaler.target(),
                    self.scaler.is_dirty(),
                    window,
                )
            {
                let due = tokio::time::Instant::now() + window;
                self.flush_at = Some(self.flush_at.map_or(due, |at| at.min(due)));
                tracing::debug!(target, "scaling patch deferred to join the next ones");
                return Ok(target);
            }
        }
        let decision = if kind == StepKind::Settle {
            self.scaler
                .settle(plan.assigned_jobs, plan.min_runners, max)
        } else {
            self.scaler
                .decide(plan.assigned_jobs, plan.min_runners, max)
        };
        self.last_decision = Some(decision);
        if let Some(m) = &self.metrics {
            m.record_policy(plan.min_runners, plan.held_runners);
        }
        // This patch carries the latest demand: whatever waited to be joined is in it.
        self.flush_at = None;
        let mut patch = runner_set_patch(decision);
        self.completions.annotate(&mut patch);
        tracing::info!(
            assigned_jobs,
            target = decision.target,
            patch_id = decision.patch_id,
            min = plan.min_runners,
            max = self.scale_set.max_runners,
            schedule = plan.active_schedule.as_deref().unwrap_or(""),
            held_runners = plan.held_runners,
            "scaling decision"
        );
        let result = retry_transient(&self.settings, "patch the EphemeralRunnerSet", || {
            self.target.patch_runner_set(&patch)
        })
        .await;
        match result {
            Ok(patched) => {
                self.rescale_pending = false;
                self.completions
                    .patched(patched.generation, patched.applied_generation);
                tracing::info!(replicas = patched.replicas, patch = %patch, "EphemeralRunnerSet patched");
                Ok(decision.target)
            }
            Err(error) => {
                self.scaler.patch_failed();
                self.rescale_pending = true;
                Err(error)
            }
        }
    }

    fn record_error(&self, error: &Error) {
        if let Some(m) = &self.metrics {
            m.record_error(error.severity(), error.operation());
        }
    }

    /// Logs and counts the error, replaces the session if needed, and waits. The first fatal error in a row uses
    /// the short backoff: a revoked admin token, for one, is fixed by the new client built for the new session.
    async fn recover(&mut self, error: Error, shutdown: &CancellationToken) -> Result<Flow> {
        let severity = error.severity();
        self.status.failed(&error);
        if severity == Severity::Unrecoverable {
            tracing::error!(error = %error_chain(&error), "unrecoverable error; stopping");
            return Err(error);
        }
        self.record_error(&error);
        if error.needs_new_session() {
            self.drop_session().await;
        }
        let (waits, policy) = if severity == Severity::Fatal && self.fatal_failures > 0 {
            self.fatal_failures += 1;
            (&mut self.fatal_waits, self.settings.fatal_backoff)
        } else {
            if severity == Severity::Fatal {
                self.fatal_failures += 1;
            }
            self.transient_failures += 1;
            (&mut self.transient_waits, self.settings.transient_backoff)
        };
        if let Some(m) = &self.metrics {
            m.set_fatal(severity == Severity::Fatal);
        }
        // The listener's schedules do not run out; a custom one that does keeps its longest wait.
        let wait = waits.next().unwrap_or(policy.max_wait);
        if severity == Severity::Fatal {
            tracing::error!(error = %error_chain(&error), operation = error.operation(), wait_secs = wait.as_secs_f64(), "error that needs attention; backing off");
        } else {
            tracing::warn!(error = %error_chain(&error), operation = error.operation(), wait_secs = wait.as_secs_f64(), "transient error; backing off");
        }
        self.health.backing_off(wait);
        tokio::select! {
            () = tokio::time::sleep(wait) => Ok(Flow::Continue),
            () = shutdown.cancelled() => Ok(Flow::Stop),
        }
    }

    /// Forgets the session after deleting it on the service, so the next one is not refused as a second session.
    async fn drop_session(&mut self) {
        if let Some(session) = self.session.take() {
            close_quietly(&session, self.settings.close_timeout).await;
            self.status.session_released();
        }
        self.rebuild_client = true;
    }

    async fn close_session(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        let closed = tokio::time::timeout(self.settings.close_timeout, session.close()).await;
        // Whatever the service answered, this listener no longer uses the session.
        self.status.session_released();
        match closed {
            Ok(Ok(())) => tracing::info!("message session deleted"),
            Ok(Err(error)) => {
                tracing::error!(error = %error, "deleting the message session failed")
            }
            Err(_) => {
                tracing::error!(timeout = ?self.settings.close_timeout, "deleting the message session timed out")
            }
        }
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn build_client(scale_set: &ScaleSet) -> Result<ActionsClient> {
    ActionsClient::new(
        scale_set.github.clone(),
        &scale_set.credentials,
        scale_set.client_options.clone(),
    )
    .map_err(Error::BuildActionsClient)
}

async fn close_quietly(session: &MessageSessionClient, timeout: Duration) {
    match tokio::time::timeout(timeout, session.close()).await {
        Ok(Ok(())) => tracing::debug!("old message session deleted"),
        Ok(Err(error)) => {
            tracing::debug!(error = %error, "old message session could not be deleted (probably gone already)")
        }
        Err(_) => tracing::debug!("deleting the old message session timed out"),
    }
}

/// Retries `op` while it fails transiently and the budget lasts. Errors that need a new session or a person
/// are returned at once.
async fn retry_transient<F, Fut, V, E>(settings: &Settings, what: &str, op: F) -> Result<V, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<V, E>>,
    E: Classify + std::fmt::Display,
{
    let started = tokio::time::Instant::now();
    let budget = settings.step_retry_budget;
    op.retry(JitteredBackoffBuilder(settings.transient_backoff))
        .when(Classify::retry_in_place)
        // No wait that would end past the budget: the loop's own backoff takes over from there.
        .adjust(|_, wait| wait.filter(|wait| started.elapsed() + *wait <= budget))
        .notify(|error, wait| {
            tracing::warn!(error = %error, what, wait_secs = wait.as_secs_f64(), "transient failure; retrying");
        })
        .await
}

/// Whether an error is worth retrying in place.
trait Classify {
    fn retry_in_place(&self) -> bool;
}

impl Classify for Error {
    fn retry_in_place(&self) -> bool {
        self.severity() == Severity::Transient && !self.needs_new_session()
    }
}

impl Classify for actions_client::Error {
    fn retry_in_place(&self) -> bool {
        // Session trouble (expired queue token after the refresh, dropped session) is for the loop to handle.
        self.is_retryable()
    }
}

/// The error and its sources on one line, for logs.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
