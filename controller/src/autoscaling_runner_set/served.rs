//! Whether the listener serves the set, from what the listener reports in its AutoscalingListener's status
//! (written by the listener itself; see `listener/src/status.rs`) and from its pod, as one pure function.
//!
//! A set is served only while its listener holds the scale set's message session and its polls succeed: the
//! service offers jobs to the session holder alone. The listener writes a change of either at once, so the
//! condition follows within a second or so; a listener that stops writing (hung, or unable to reach the API
//! server) is caught by the age of its last successful poll.

use std::time::Duration;

use crds::AutoscalingListener;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::conditions::Finding;
use crate::listener_tasks::{Ended, TaskView};
use crate::pods::{PodState, pod_state};

/// Added to the listener's own bound on the age of its last poll before the report counts as stale: the
/// report's way to the API server and this controller's watch, and clock differences between the node and the
/// manager.
pub const REPORT_MARGIN: Duration = Duration::from_secs(15);

/// The listener's bound on the age of its last poll when its report does not state one: the listener's default
/// long-poll attempt timeout (90 s, which a poll either completes or fails within) plus its default status
/// heartbeat (30 s, the longest it waits before writing a newer poll time).
pub const DEFAULT_POLL_STALE_AFTER: Duration = Duration::from_secs(120);

/// A report whose session time is this much older than the listener container's start was written by an
/// earlier listener process (the pod was replaced); it says nothing about the running one. The slack covers
/// clock differences and the second-granularity of Kubernetes times.
const EARLIER_PROCESS_SLACK: Duration = Duration::from_secs(5);

/// Where a listener runs, as this process sees it.
#[derive(Debug, Clone, Copy)]
pub enum ListenerHost<'a> {
    /// In its pod (ARC's way), from the cache.
    Pod(Option<&'a Pod>),
    /// As a loop of this manager (the manager's listener mode), if one was started; `pod`: the manager's pod,
    /// whose log carries the loop's.
    Manager {
        task: Option<&'a TaskView>,
        pod: &'a str,
    },
}

/// What the verdict is about.
#[derive(Debug, Clone, Copy)]
pub struct ListenerView<'a> {
    /// The AutoscalingListener, read from the API server (its status is the listener's report).
    pub listener: &'a AutoscalingListener,
    /// Where the listener runs, as this process sees it.
    pub host: ListenerHost<'a>,
    /// The scale set id, for messages.
    pub scale_set_id: i64,
    /// `namespace/name` of the credentials Secret, for messages.
    pub credentials: &'a str,
    /// How often the controller re-checks a scale set that went missing, for messages.
    pub scale_set_check_interval: Duration,
}

/// The verdict on the listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerVerdict {
    /// `Ok` with a message while the set is served, else why not.
    pub outcome: Result<String, Finding>,
    /// When the verdict changes by the passing of time alone (a report going stale, a start taking too long):
    /// the set must be looked at again by then.
    pub recheck_in: Option<Duration>,
}

impl ListenerVerdict {
    fn now(outcome: Result<String, Finding>) -> Self {
        Self {
            outcome,
            recheck_in: None,
        }
    }

    fn until(outcome: Result<String, Finding>, deadline: Timestamp, now: Timestamp) -> Self {
        Self {
            outcome,
            recheck_in: Some(until(deadline, now)),
        }
    }
}

fn until(deadline: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(deadline.duration_since(now)).unwrap_or(Duration::ZERO)
}

fn plus(at: Timestamp, by: Duration) -> Timestamp {
    at.checked_add(SignedDuration::try_from(by).unwrap_or(SignedDuration::MAX))
        .unwrap_or(at)
}

fn minus(at: Timestamp, by: Duration) -> Timestamp {
    at.checked_sub(SignedDuration::try_from(by).unwrap_or(SignedDuration::MAX))
        .unwrap_or(at)
}

/// Reasons that describe progress rather than a problem (no Warning Event).
pub const LISTENER_PROGRESS_REASONS: [&str; 3] = ["ListenerStarting", "SessionLost", TAKING_OVER];

/// Condition and Event reason while the set takes over what an earlier controller left (its listener, its runner
/// sets): progress, not a problem.
pub const TAKING_OVER: &str = "TakingOver";

/// Whether the set is served by its listener, at `now`.
pub fn judge_listener(view: &ListenerView<'_>, now: Timestamp) -> ListenerVerdict {
    let listener = view.listener;
    let namespace = listener.metadata.namespace.as_deref().unwrap_or_default();
    let name = listener.metadata.name.as_deref().unwrap_or_default();
    let status = listener.status.clone().unwrap_or_default();
    let (subject, logs) = match view.host {
        ListenerHost::Pod(_) => (
            "the listener pod",
            format!("kubectl -n {namespace} logs {name}"),
        ),
        ListenerHost::Manager { pod, .. } => (
            "the listener's loop in the manager",
            format!("kubectl -n {namespace} logs {pod}, lines with listener={namespace}/{name}"),
        ),
    };
    if let Some(failures) = &status.pod_failures {
        let next = failures
            .next_attempt_time
            .as_ref()
            .map(|t| format!("; next attempt at {}", t.0))
            .unwrap_or_default();
        let what = match view.host {
            ListenerHost::Pod(_) => format!("{subject} {}", failures.last),
            ListenerHost::Manager { .. } => format!("{subject} failed: {}", failures.last),
        };
        return ListenerVerdict::now(Err(Finding::new(
            "ListenerFailing",
            format!(
                "{what} ({} failure(s) in a row){next}. Read its log: {logs}",
                failures.count
            ),
        )));
    }
    let state = match view.host {
        ListenerHost::Pod(pod) => pod.map(pod_state),
        ListenerHost::Manager { task, .. } => task.map(|task| match &task.ended {
            Some(Ended::Failed(why)) => PodState::Failed(format!("ended: {why}")),
            _ => PodState::Running(Some(task.started)),
        }),
    };
    let started = match state {
        None | Some(PodState::Starting) => {
            return ListenerVerdict::now(Err(Finding::new(
                "ListenerStarting",
                format!("{subject} is starting"),
            )));
        }
        Some(PodState::Failed(what)) => {
            return ListenerVerdict::now(Err(Finding::new(
                "ListenerFailing",
                format!("{subject} {what}. Read its log: {logs}"),
            )));
        }
        Some(PodState::Running(since)) => since,
    };
    let stale_after = status
        .poll_stale_after_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(DEFAULT_POLL_STALE_AFTER, Duration::from_secs)
        + REPORT_MARGIN;
    // A report counts when the running process wrote it: its session time is never earlier than its start.
    let current = status.session_held.is_some()
        && match (started, status.session_since.as_ref()) {
            (Some(started), Some(since)) => since.0 >= minus(started, EARLIER_PROCESS_SLACK),
            _ => true,
        };
    // Without a start time, the start is taken as long past: a listener silent since then is not reporting.
    let started = started.unwrap_or_else(|| minus(now, stale_after));
    let start_deadline = plus(started, stale_after);
    if !current {
        let outcome = Err(if now >= start_deadline {
            Finding::new(
                "ListenerNotReporting",
                format!(
                    "{subject} has run since {started} without reporting its state in the status of \
                     AutoscalingListener {namespace}/{name}. Read its log ({logs}): \"writing the listener status \
                     failed\" with 403 means the manager could not grant it the right (a controller chart older \
                     than the manager)"
                ),
            )
        } else {
            Finding::new("ListenerStarting", "the listener is starting")
        });
        return ListenerVerdict::until(outcome, start_deadline, now);
    }
    let last_poll = status.last_poll_time.as_ref().map(|t| t.0);
    let failing =
        status
            .last_error
            .as_ref()
            .filter(|error| match (error.time.as_ref(), last_poll) {
                (Some(at), Some(poll)) => at.0 > poll,
                _ => last_poll.is_none(),
            });
    let since = status
        .session_since
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(started);
    if let Some(error) = failing {
        return ListenerVerdict::now(Err(failing_finding(
            view,
            &error.category,
            status.session_held == Some(true),
            last_poll.unwrap_or(since),
            &format!(
                "kubectl -n {namespace} get autoscalinglistener {name} -o jsonpath='{{.status.lastError}}'"
            ),
        )));
    }
    if status.session_held != Some(true) {
        let outcome = Err(if now >= start_deadline {
            Finding::new(
                "ListenerNotStarted",
                format!(
                    "the listener runs but has held no message session since {since} and reports no error, so no \
                     job reaches the set. Read its log: {logs}"
                ),
            )
        } else {
            Finding::new(
                "ListenerStarting",
                "the listener is opening its message session",
            )
        });
        return ListenerVerdict::until(outcome, start_deadline, now);
    }
    let last_poll = last_poll.unwrap_or(since);
    let poll_deadline = plus(last_poll, stale_after);
    if now >= poll_deadline {
        return ListenerVerdict::now(Err(Finding::new(
            "ListenerNotReporting",
            format!(
                "the listener's last successful poll was at {last_poll}, longer ago than it polls: it is hung, or \
                 cannot write its status. Read its log: {logs}; the pod's liveness probe restarts a hung listener"
            ),
        )));
    }
    ListenerVerdict::until(
        Ok(format!(
            "the listener holds the message session of scale set {} (since {since})",
            view.scale_set_id
        )),
        poll_deadline,
        now,
    )
}

/// The finding for a listener whose last error is current, by the error's category.
fn failing_finding(
    view: &ListenerView<'_>,
    category: &str,
    held: bool,
    since: Timestamp,
    details: &str,
) -> Finding {
    let id = view.scale_set_id;
    let no_session = if held {
        format!("no successful poll since {since}")
    } else {
        format!("no message session since {since}")
    };
    let (reason, what_to_do) = match category {
        "SessionConflict" => (
            "SessionConflict",
            format!(
                "scale set {id} is claimed by another listener: the Actions Service gives its message session to \
                 one listener at a time and another one holds it ({no_session}). Another installation (ARC, a \
                 second controller, a copy of this AutoscalingRunnerSet) serves the same scale set: remove it, or \
                 give this set a runnerScaleSetName of its own"
            ),
        ),
        "CredentialsRejected" => (
            "CredentialsRejected",
            format!(
                "the Actions Service rejected the listener's credentials (401; {no_session}): rotate the \
                 credentials in Secret {}; the listener is restarted with them by itself",
                view.credentials
            ),
        ),
        "PermissionDenied" => (
            "PermissionDenied",
            format!(
                "the Actions Service refused the listener (403; {no_session}): the credentials in Secret {} lack a \
                 permission (a PAT needs admin:org or repo; an App needs the self-hosted runners permission)",
                view.credentials
            ),
        ),
        "ScaleSetNotFound" => (
            "ScaleSetMissing",
            format!(
                "the Actions Service no longer knows scale set {id} ({no_session}); the controller re-creates it \
                 within {}s. If it keeps disappearing, something else deletes it",
                view.scale_set_check_interval.as_secs()
            ),
        ),
        "ServiceUnreachable" => (
            "ServiceUnreachable",
            format!(
                "the listener cannot reach the Actions Service ({no_session}): check network policies, the proxy \
                 and GitHub's status; it retries by itself"
            ),
        ),
        "SessionLost" => (
            "SessionLost",
            format!(
                "the Actions Service dropped the listener's message session ({no_session}); it opens a new one"
            ),
        ),
        "TlsCertificateRejected" => (
            "TlsCertificateInvalid",
            format!(
                "the listener does not trust the Actions Service's certificate ({no_session}): set \
                 githubServerTLS to the CA of your GitHub Enterprise Server"
            ),
        ),
        "RunnerSetNotFound" | "KubernetesForbidden" | "KubernetesError" => (
            "ListenerCannotScale",
            format!(
                "the listener cannot write the EphemeralRunnerSet's replicas ({category}), so runners do not \
                 follow the jobs"
            ),
        ),
        _ => (
            "ListenerError",
            format!("the listener's message loop is failing ({category}; {no_session})"),
        ),
    };
    Finding::new(reason, format!("{what_to_do}. Details: {details}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::{AutoscalingListenerStatus, ListenerError, ListenerPodFailures};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    fn time(seconds: i64) -> Option<Time> {
        Some(Time(at(seconds)))
    }

    fn running_since(seconds: i64) -> Pod {
        serde_json::from_value(json!({
            "status": {"containerStatuses": [{
                "name": "listener", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": at(seconds).to_string()}},
            }]}
        }))
        .unwrap()
    }

    fn listener(status: AutoscalingListenerStatus) -> AutoscalingListener {
        let mut listener = AutoscalingListener::new("set-listener", Default::default());
        listener.metadata.namespace = Some("arc".into());
        listener.status = Some(status);
        listener
    }

    fn held(since: i64, poll: i64) -> AutoscalingListenerStatus {
        AutoscalingListenerStatus {
            session_held: Some(true),
            session_since: time(since),
            last_poll_time: time(poll),
            poll_stale_after_seconds: Some(60),
            ..Default::default()
        }
    }

    fn judge(listener: &AutoscalingListener, pod: Option<&Pod>, now: i64) -> ListenerVerdict {
        judge_listener(
            &ListenerView {
                listener,
                host: ListenerHost::Pod(pod),
                scale_set_id: 7,
                credentials: "runners/github",
                scale_set_check_interval: Duration::from_secs(600),
            },
            at(now),
        )
    }

    fn reason(verdict: &ListenerVerdict) -> &'static str {
        match &verdict.outcome {
            Ok(_) => "served",
            Err(finding) => finding.reason,
        }
    }

    #[test]
    fn served_while_the_session_is_held_and_polls_are_fresh() {
        let pod = running_since(0);
        let listener = listener(held(1, 50));
        let verdict = judge(&listener, Some(&pod), 60);
        assert_eq!(reason(&verdict), "served");
        // Stale at the last poll + 60 s + the margin: looked at again then.
        assert_eq!(verdict.recheck_in, Some(Duration::from_secs(65)));
        let verdict = judge(&listener, Some(&pod), 50 + 75);
        assert_eq!(reason(&verdict), "ListenerNotReporting");
        let message = verdict.outcome.unwrap_err().message;
        assert!(
            message.contains("kubectl -n arc logs set-listener"),
            "{message}"
        );
    }

    #[test]
    fn each_current_error_has_its_reason() {
        let pod = running_since(0);
        for (category, held_session, expected) in [
            ("SessionConflict", false, "SessionConflict"),
            ("CredentialsRejected", false, "CredentialsRejected"),
            ("PermissionDenied", false, "PermissionDenied"),
            ("ScaleSetNotFound", false, "ScaleSetMissing"),
            ("ServiceUnreachable", true, "ServiceUnreachable"),
            ("ServiceUnreachable", false, "ServiceUnreachable"),
            ("SessionLost", false, "SessionLost"),
            ("TlsCertificateRejected", false, "TlsCertificateInvalid"),
            ("RunnerSetNotFound", true, "ListenerCannotScale"),
            ("Whatever", false, "ListenerError"),
        ] {
            let mut status = held(1, 10);
            status.session_held = Some(held_session);
            status.session_since = time(if held_session { 1 } else { 12 });
            status.last_error = Some(ListenerError {
                category: category.into(),
                message: "boom".into(),
                time: time(20),
            });
            let verdict = judge(&listener(status.clone()), Some(&pod), 21);
            assert_eq!(reason(&verdict), expected, "{category}");
            let message = verdict.outcome.unwrap_err().message;
            assert!(message.contains(".status.lastError"), "{message}");
            // The message does not change while the cause persists: a later retry only moves the error's time.
            status.last_error.as_mut().unwrap().time = time(40);
            let again = judge(&listener(status.clone()), Some(&pod), 41);
            assert_eq!(again.outcome.unwrap_err().message, message, "{category}");
            // A later success makes the error history.
            status.session_held = Some(true);
            status.last_poll_time = time(45);
            assert_eq!(reason(&judge(&listener(status), Some(&pod), 46)), "served");
        }
        let conflict = {
            let mut status = held(1, 10);
            status.session_held = Some(false);
            status.last_error = Some(ListenerError {
                category: "SessionConflict".into(),
                message: String::new(),
                time: time(20),
            });
            judge(&listener(status), Some(&pod), 21)
        };
        let message = conflict.outcome.unwrap_err().message;
        assert!(message.contains("claimed by another listener"), "{message}");
        assert!(message.contains("scale set 7"), "{message}");
    }

    #[test]
    fn a_listener_without_a_session_or_a_report_gets_a_grace_period() {
        let pod = running_since(100);
        // No report at all yet.
        let silent = listener(AutoscalingListenerStatus::default());
        let verdict = judge(&silent, Some(&pod), 101);
        assert_eq!(reason(&verdict), "ListenerStarting");
        assert_eq!(verdict.recheck_in, Some(Duration::from_secs(134)));
        assert_eq!(
            reason(&judge(&silent, Some(&pod), 240)),
            "ListenerNotReporting"
        );
        // Reporting, no session, no error.
        let mut opening = held(100, 100);
        opening.session_held = Some(false);
        opening.last_poll_time = None;
        let opening = listener(opening);
        assert_eq!(
            reason(&judge(&opening, Some(&pod), 110)),
            "ListenerStarting"
        );
        assert_eq!(
            reason(&judge(&opening, Some(&pod), 180)),
            "ListenerNotStarted"
        );
    }

    #[test]
    fn a_report_of_an_earlier_process_does_not_count() {
        // The old process held the session until 50; the new pod started at 90.
        let pod = running_since(90);
        let old = listener(held(10, 50));
        assert_eq!(reason(&judge(&old, Some(&pod), 91)), "ListenerStarting");
        // The running process's own report counts, even 2 s "before" its container started (second-granular
        // times, clock differences).
        let new = listener(held(50, 51));
        let pod = running_since(52);
        assert_eq!(reason(&judge(&new, Some(&pod), 53)), "served");
    }

    #[test]
    fn pod_failures_and_pod_states() {
        let failing = listener(AutoscalingListenerStatus {
            pod_failures: Some(ListenerPodFailures {
                count: 3,
                last: "exited with code 1 (Error)".into(),
                time: time(5),
                next_attempt_time: time(45),
            }),
            ..held(1, 4)
        });
        let verdict = judge(&failing, Some(&running_since(0)), 10);
        assert_eq!(reason(&verdict), "ListenerFailing");
        let message = verdict.outcome.unwrap_err().message;
        assert!(
            message.contains("exited with code 1") && message.contains("3 failure"),
            "{message}"
        );
        let fresh = listener(held(1, 4));
        assert_eq!(reason(&judge(&fresh, None, 10)), "ListenerStarting");
        let starting: Pod = serde_json::from_value(json!({"status": {}})).unwrap();
        assert_eq!(
            reason(&judge(&fresh, Some(&starting), 10)),
            "ListenerStarting"
        );
        let evicted: Pod =
            serde_json::from_value(json!({"status": {"phase": "Failed", "reason": "Evicted"}}))
                .unwrap();
        assert_eq!(
            reason(&judge(&fresh, Some(&evicted), 10)),
            "ListenerFailing"
        );
    }
}
