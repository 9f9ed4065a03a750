//! What the listener tells the controller: whether it holds its message session, when it last polled, its last
//! error and its scaling figures, written into its AutoscalingListener's `status` (beyond ARC, whose status is
//! empty). The controller reads it to say on the AutoscalingRunnerSet whether jobs can reach runners.
//!
//! The message loop records facts in a [`Report`] as they happen ([`StatusHandle`], no I/O); a [`Publisher`] task
//! writes the report with a server-side apply of the status subresource under the listener's own field
//! manager. Writes are bounded: a change of what the controller judges by (session held, polls failing, the
//! error's category) is written at once but never more often than [`Timing::min_interval`]; everything else
//! (the last poll time, figures, an error's text) at most every [`Timing::heartbeat`]. A failed write never
//! holds up the loop: the publisher retries on its own.

use std::sync::Arc;
use std::time::Duration;

use actions_client::Statistics;
use crds::{
    AutoscalingListener, AutoscalingListenerStatus, ListenerError, ListenerSession,
    ListenerStatistics,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::config::StatusTarget;
use crate::error::Error;
use crate::target::FIELD_MANAGER;

/// Longest error message written (the status is no place for a whole response body).
const MAX_MESSAGE_BYTES: usize = 1024;

/// The listener's view, as the loop last recorded it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Whether the loop holds a message session.
    pub session_held: bool,
    /// Since when `session_held` has had its value (the start counts as a change).
    pub session_since: Option<Timestamp>,
    /// The session held, or last held: its id and owner.
    pub session: Option<(String, String)>,
    /// The last successful long poll or session creation.
    pub last_poll: Option<Timestamp>,
    /// The last error of the loop.
    pub last_error: Option<ReportedError>,
    /// The last desired runner count sent to the EphemeralRunnerSet.
    pub desired_runners: Option<i64>,
    /// The last statistics received.
    pub statistics: Option<Statistics>,
}

/// An error as reported: a fixed category, the logged text, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportedError {
    /// [`Error::category`] of the error.
    pub category: &'static str,
    /// The error chain, truncated.
    pub message: String,
    /// When it happened.
    pub time: Timestamp,
}

/// What the controller judges by; a change of it is written at once.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Verdict {
    session_held: bool,
    failing: Option<&'static str>,
}

impl Report {
    /// A report at start-up: no session yet, since `now`.
    pub fn starting(now: Timestamp) -> Self {
        Self {
            session_since: Some(now),
            ..Self::default()
        }
    }

    /// Whether the last error came after the last success: the loop is failing right now.
    pub fn failing(&self) -> bool {
        match (&self.last_error, self.last_poll) {
            (Some(error), Some(poll)) => error.time > poll,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    fn verdict(&self) -> Verdict {
        Verdict {
            session_held: self.session_held,
            failing: self
                .failing()
                .then(|| self.last_error.as_ref().map(|e| e.category))
                .flatten(),
        }
    }

    /// The session was created (`true`) or given up (`false`) at `now`.
    pub fn set_session(&mut self, held: bool, now: Timestamp) {
        if self.session_held != held || self.session_since.is_none() {
            self.session_held = held;
            self.session_since = Some(now);
        }
    }

    /// A poll (or a session creation) succeeded at `now`.
    pub fn polled(&mut self, now: Timestamp) {
        self.last_poll = Some(now);
    }

    /// The loop failed with `error` at `now`.
    pub fn failed(&mut self, error: &Error, now: Timestamp) {
        self.last_error = Some(ReportedError {
            category: error.category().as_str(),
            message: truncate(crate::listener::error_chain(error)),
            time: now,
        });
    }

    /// The status subresource the report stands for; `stale_after` is how old the last poll may get while the
    /// listener works.
    pub fn to_status(&self, stale_after: Duration) -> AutoscalingListenerStatus {
        AutoscalingListenerStatus {
            session_held: Some(self.session_held),
            session_since: self.session_since.map(Time),
            session: self.session.as_ref().map(|(id, owner)| ListenerSession {
                id: id.clone(),
                owner: owner.clone(),
            }),
            last_poll_time: self.last_poll.map(Time),
            poll_stale_after_seconds: Some(
                i64::try_from(stale_after.as_secs() + u64::from(stale_after.subsec_nanos() > 0))
                    .unwrap_or(i64::MAX),
            ),
            last_error: self.last_error.as_ref().map(|error| ListenerError {
                category: error.category.to_owned(),
                message: error.message.clone(),
                time: Some(Time(error.time)),
            }),
            desired_runners: self.desired_runners,
            statistics: self.statistics.map(|s| ListenerStatistics {
                total_available_jobs: s.total_available_jobs,
                total_acquired_jobs: s.total_acquired_jobs,
                total_assigned_jobs: s.total_assigned_jobs,
                total_running_jobs: s.total_running_jobs,
                total_registered_runners: s.total_registered_runners,
                total_busy_runners: s.total_busy_runners,
                total_idle_runners: s.total_idle_runners,
            }),
            pod_failures: None,
        }
    }
}

fn truncate(mut text: String) -> String {
    if text.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES - 3;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    text
}

/// How often the publisher writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Changes that do not alter the verdict (the last poll time, figures, an error's text) wait this long
    /// after the previous write.
    pub heartbeat: Duration,
    /// No two writes come closer than this, so a flapping state costs at most one write per interval.
    pub min_interval: Duration,
}

impl Timing {
    /// Production timing: a heartbeat every 30 s, verdict changes at most once a second.
    pub fn with_heartbeat(heartbeat: Duration) -> Self {
        Self {
            heartbeat,
            min_interval: Duration::from_secs(1).min(heartbeat),
        }
    }
}

/// When the current report is due for a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Write now.
    Now,
    /// Write after this long (unless the report changes again before).
    After(Duration),
    /// Nothing to write until the report changes.
    Idle,
}

/// Whether `current` must be written, given what was `published` last (`None`: nothing yet) and how long ago
/// the last write attempt was.
pub fn due(
    published: Option<&Report>,
    current: &Report,
    since_attempt: Duration,
    timing: &Timing,
) -> Due {
    let wait_for = |interval: Duration| match interval.checked_sub(since_attempt) {
        Some(left) if !left.is_zero() => Due::After(left),
        _ => Due::Now,
    };
    match published {
        // A new session is the record a successor deletes if this listener dies: never held back.
        Some(published) if published.session != current.session => Due::Now,
        None => wait_for(timing.min_interval),
        Some(published) if published.verdict() != current.verdict() => {
            wait_for(timing.min_interval)
        }
        Some(published) if published != current => wait_for(timing.heartbeat),
        Some(_) => Due::Idle,
    }
}

/// The loop's side: records facts into the report (cheap, never blocks). Dropping it (the loop ended) makes the
/// publisher write the final report and stop.
#[derive(Debug)]
pub struct StatusHandle {
    tx: watch::Sender<Report>,
}

impl Default for StatusHandle {
    fn default() -> Self {
        Self::new()
    }
}

impl StatusHandle {
    /// A handle whose report starts now.
    pub fn new() -> Self {
        let (tx, _) = watch::channel(Report::starting(Timestamp::now()));
        Self { tx }
    }

    /// A receiver of the report, for a [`Publisher`].
    pub fn subscribe(&self) -> watch::Receiver<Report> {
        self.tx.subscribe()
    }

    /// The current report.
    pub fn report(&self) -> Report {
        self.tx.borrow().clone()
    }

    fn update(&self, change: impl FnOnce(&mut Report)) {
        self.tx.send_if_modified(|report| {
            let before = report.clone();
            change(report);
            *report != before
        });
    }

    /// Session `id` was created for `owner`: it counts as contact with the service.
    pub fn session_created(&self, id: String, owner: String) {
        let now = Timestamp::now();
        self.update(|r| {
            r.set_session(true, now);
            r.session = Some((id, owner));
            r.polled(now);
        });
    }

    /// Session `id`, a predecessor's, is the one on record until this listener holds its own: the first report
    /// keeps it there, so the record is not lost if this listener dies before creating one.
    pub fn predecessor(&self, id: String) {
        self.update(|r| r.session = Some((id, String::new())));
    }

    /// The session was given up (replaced, deleted at shutdown).
    pub fn session_released(&self) {
        self.update(|r| r.set_session(false, Timestamp::now()));
    }

    /// A long poll succeeded.
    pub fn polled(&self) {
        self.update(|r| r.polled(Timestamp::now()));
    }

    /// The loop failed.
    pub fn failed(&self, error: &Error) {
        self.update(|r| r.failed(error, Timestamp::now()));
    }

    /// The desired runner count sent.
    pub fn desired(&self, desired: i64) {
        self.update(|r| r.desired_runners = Some(desired));
    }

    /// Statistics received.
    pub fn statistics(&self, statistics: &Statistics) {
        self.update(|r| r.statistics = Some(*statistics));
    }
}

/// Writes reports into an AutoscalingListener's status.
pub struct Publisher {
    api: Api<AutoscalingListener>,
    name: String,
    timing: Timing,
    stale_after: Duration,
    final_timeout: Duration,
    /// Asks for the current report to be written again at once, changed or not.
    rewrite: Arc<Notify>,
}

impl Publisher {
    /// A publisher for `target`. `stale_after` is how old the last poll may get while the listener works (its
    /// longest long poll plus the heartbeat); `final_timeout` bounds the last write at shutdown.
    pub fn new(
        client: Client,
        target: &StatusTarget,
        timing: Timing,
        stale_after: Duration,
        final_timeout: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, &target.namespace),
            name: target.name.clone(),
            timing,
            stale_after,
            final_timeout,
            rewrite: Arc::new(Notify::new()),
        }
    }

    /// Asks for the current report to be written again at once: another writer (a listener pod stopping after
    /// the manager's loop took its session over) may have replaced it.
    pub fn rewriter(&self) -> Arc<Notify> {
        Arc::clone(&self.rewrite)
    }

    async fn write(&self, report: &Report) -> Result<(), kube::Error> {
        let patch = json!({
            "apiVersion": crds::constants::API_VERSION,
            "kind": "AutoscalingListener",
            "metadata": {"name": self.name},
            "status": report.to_status(self.stale_after),
        });
        self.api
            .patch_status(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map(drop)
    }

    /// Writes reports until the loop's [`StatusHandle`] is dropped, then writes the last one (bounded by the
    /// final timeout) and returns.
    pub async fn run(self, mut reports: watch::Receiver<Report>) {
        let mut published: Option<Report> = None;
        let mut last_attempt: Option<Instant> = None;
        let mut failures: u32 = 0;
        let mut open = true;
        let mut rewrite = false;
        while open {
            let current = reports.borrow_and_update().clone();
            let since = last_attempt.map_or(Duration::MAX, |at| at.elapsed());
            let mut plan = due(published.as_ref(), &current, since, &self.timing);
            if std::mem::take(&mut rewrite) {
                plan = Due::Now;
            }
            if failures > 0 && plan != Due::Idle {
                // After a failed write, wait a little longer each time, up to the heartbeat.
                let retry = self
                    .timing
                    .min_interval
                    .saturating_mul(1 << failures.min(6))
                    .min(self.timing.heartbeat);
                plan = match retry.checked_sub(since) {
                    Some(left) if !left.is_zero() => Due::After(left),
                    _ => plan,
                };
            }
            match plan {
                Due::Now => {
                    last_attempt = Some(Instant::now());
                    match self.write(&current).await {
                        Ok(()) => {
                            if failures > 0 {
                                tracing::info!("listener status written again");
                            }
                            failures = 0;
                            published = Some(current);
                        }
                        Err(error) => {
                            failures = failures.saturating_add(1);
                            if failures == 1 || failures.is_multiple_of(10) {
                                tracing::warn!(%error, listener = %self.name, failures, "writing the listener status failed; retrying");
                            }
                        }
                    }
                }
                Due::After(wait) => {
                    tokio::select! {
                        changed = reports.changed() => open = changed.is_ok(),
                        () = tokio::time::sleep(wait) => {}
                        () = self.rewrite.notified() => rewrite = true,
                    }
                }
                Due::Idle => {
                    tokio::select! {
                        changed = reports.changed() => open = changed.is_ok(),
                        () = self.rewrite.notified() => rewrite = true,
                    }
                }
            }
        }
        let last = reports.borrow().clone();
        if published.as_ref() != Some(&last) {
            match tokio::time::timeout(self.final_timeout, self.write(&last)).await {
                Ok(Ok(())) => tracing::debug!("final listener status written"),
                Ok(Err(error)) => {
                    tracing::warn!(%error, "writing the final listener status failed")
                }
                Err(_) => tracing::warn!("writing the final listener status timed out"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actions_client::{ErrorKind, Operation, RequestError};
    use http::Method;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn actions(kind: ErrorKind) -> actions_client::Error {
        actions_client::Error::from(RequestError {
            operation: Operation::CreateMessageSession,
            kind,
            method: Method::POST,
            url: "http://fake/sessions".into(),
            status: None,
            exception: None,
            body: None,
            activity_id: None,
            github_request_id: None,
            attempts: 1,
            detail: None,
            source: None,
        })
    }

    #[test]
    fn an_error_is_current_until_a_later_success() {
        let mut report = Report::starting(at(0));
        assert!(!report.failing());
        report.failed(&Error::CreateSession(actions(ErrorKind::Connect)), at(5));
        assert!(report.failing(), "no success yet");
        report.set_session(true, at(6));
        report.polled(at(6));
        assert!(!report.failing());
        report.failed(&Error::GetMessage(actions(ErrorKind::Timeout)), at(8));
        assert!(report.failing());
        let status = report.to_status(Duration::from_millis(120_500));
        assert_eq!(status.session_held, Some(true));
        assert_eq!(status.session_since, Some(Time(at(6))));
        assert_eq!(status.poll_stale_after_seconds, Some(121));
        let error = status.last_error.unwrap();
        assert_eq!(error.category, "ServiceUnreachable");
        assert_eq!(error.time, Some(Time(at(8))));
        assert!(status.pod_failures.is_none(), "the controller's field");
    }

    #[test]
    fn session_since_changes_only_with_the_session() {
        let mut report = Report::starting(at(0));
        report.set_session(false, at(3));
        assert_eq!(report.session_since, Some(at(0)));
        report.set_session(true, at(4));
        report.set_session(true, at(9));
        assert_eq!(report.session_since, Some(at(4)));
    }

    #[test]
    fn messages_are_truncated_on_a_character_boundary() {
        let text = truncate("é".repeat(MAX_MESSAGE_BYTES));
        assert!(text.len() <= MAX_MESSAGE_BYTES, "{}", text.len());
        assert!(text.ends_with("..."));
        assert_eq!(truncate("short".into()), "short");
    }

    #[test]
    fn a_new_session_is_recorded_at_once_and_a_predecessors_stays_on_record_until_then() {
        let timing = Timing {
            heartbeat: Duration::from_secs(30),
            min_interval: Duration::from_secs(1),
        };
        let handle = StatusHandle::new();
        handle.predecessor("old".to_owned());
        let first = handle.report();
        assert_eq!(first.session, Some(("old".to_owned(), String::new())));
        assert!(!first.session_held);
        assert_eq!(
            first
                .to_status(Duration::from_secs(60))
                .session
                .map(|s| s.id),
            Some("old".to_owned()),
            "the first write keeps the predecessor's session on record"
        );
        handle.session_created("new".to_owned(), "manager-0".to_owned());
        let created = handle.report();
        assert_eq!(
            due(Some(&first), &created, Duration::from_millis(10), &timing),
            Due::Now,
            "not held back by the minimum interval"
        );
        let status = created.to_status(Duration::from_secs(60));
        assert_eq!(
            status.session,
            Some(ListenerSession {
                id: "new".to_owned(),
                owner: "manager-0".to_owned()
            })
        );
        handle.session_released();
        assert_eq!(
            handle.report().session.map(|(id, _)| id),
            Some("new".to_owned()),
            "the session last held stays on record"
        );
    }

    #[test]
    fn verdict_changes_are_written_at_once_and_the_rest_at_the_heartbeat() {
        let timing = Timing {
            heartbeat: Duration::from_secs(30),
            min_interval: Duration::from_secs(1),
        };
        let secs = Duration::from_secs;
        let start = Report::starting(at(0));
        assert_eq!(due(None, &start, Duration::MAX, &timing), Due::Now);
        assert_eq!(
            due(None, &start, Duration::from_millis(400), &timing),
            Due::After(Duration::from_millis(600))
        );
        assert_eq!(due(Some(&start), &start, secs(100), &timing), Due::Idle);

        let mut held = start.clone();
        held.set_session(true, at(1));
        held.polled(at(1));
        assert_eq!(due(Some(&start), &held, secs(2), &timing), Due::Now);

        // Polls go on: only the time changes, written at the heartbeat.
        let mut later = held.clone();
        later.polled(at(20));
        assert_eq!(
            due(Some(&held), &later, secs(10), &timing),
            Due::After(secs(20))
        );
        assert_eq!(due(Some(&held), &later, secs(30), &timing), Due::Now);

        // A failing poll changes the verdict; the same failure again does not.
        let mut failing = later.clone();
        failing.failed(&Error::GetMessage(actions(ErrorKind::Connect)), at(21));
        assert_eq!(due(Some(&later), &failing, secs(5), &timing), Due::Now);
        let mut again = failing.clone();
        again.failed(&Error::GetMessage(actions(ErrorKind::Connect)), at(25));
        assert_eq!(
            due(Some(&failing), &again, secs(4), &timing),
            Due::After(secs(26))
        );
        // Another category is news.
        let mut other = again.clone();
        other.failed(&Error::GetMessage(actions(ErrorKind::Unauthorized)), at(26));
        assert_eq!(due(Some(&again), &other, secs(1), &timing), Due::Now);
        // Recovery is news too.
        let mut recovered = other.clone();
        recovered.polled(at(27));
        assert_eq!(
            due(
                Some(&other),
                &recovered,
                Duration::from_millis(300),
                &timing
            ),
            Due::After(Duration::from_millis(700))
        );
    }
}
