//! The manager's listener mode, decided (docs/listener-modes.md): what a listener's pass does with the loop the
//! manager runs for it, from what the pass observed. Pure; the executor is `reconcile.rs`.

use std::time::Duration;

use crate::listener_tasks::{Ended, TaskView};

/// What a pass observed of a listener in the manager's listener mode.
#[derive(Debug, Clone, Copy)]
pub struct TaskFacts<'a> {
    /// The loop the manager runs for it, if one was started.
    pub task: Option<&'a TaskView>,
    /// The listener's uid.
    pub uid: &'a str,
    /// The digest of the loop's inputs as they are now (config, a vault's credentials).
    pub inputs: &'a str,
    /// The session recorded on the listener's status (by whichever listener wrote last), and whether the status
    /// says it is held.
    pub recorded_session: Option<&'a str>,
    pub recorded_held: bool,
    /// How long until the next start is allowed, while the backoff after failures runs.
    pub backoff_left: Option<Duration>,
}

/// The pass's next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskStep {
    /// Start the loop: none runs, or the one that ran was stopped.
    Start,
    /// Replace the loop, with a fresh start (no failures' backoff): the listener was recreated under its name, or
    /// the loop's inputs changed (rotated credentials, new settings).
    Restart,
    /// Replace the loop, deleting the session recorded since it started: another listener (a listener pod
    /// stopping during a switch of modes) took the session between this loop's deletion of its predecessor's and
    /// its own creation, and the service refuses a second one.
    Retake,
    /// The loop ended with an error or a panic: record it, and start again after the backoff.
    Failed(String),
    /// Nothing before this long: the backoff after failures.
    Wait(Duration),
    /// The loop holds the set's session: the listener pod's objects go (its pod, ServiceAccount, Roles,
    /// RoleBindings and Secrets), never before.
    DeletePodObjects,
    /// The status does not show the session the loop holds (a stopping listener pod's last write replaced it):
    /// the loop writes it again.
    RewriteStatus,
    /// The loop runs; `holding`: it holds the set's session.
    Running { holding: bool },
}

/// The next step for a listener in the manager's listener mode.
pub fn decide(facts: &TaskFacts<'_>) -> TaskStep {
    let Some(task) = facts.task else {
        return facts.backoff_left.map_or(TaskStep::Start, TaskStep::Wait);
    };
    if task.uid != facts.uid || task.inputs != facts.inputs {
        return TaskStep::Restart;
    }
    match &task.ended {
        Some(Ended::Failed(why)) => TaskStep::Failed(why.clone()),
        Some(Ended::Stopped) => TaskStep::Start,
        None if !task.session_held
            && task.conflict
            && facts
                .recorded_session
                .is_some_and(|recorded| Some(recorded) != task.predecessor.as_deref()) =>
        {
            TaskStep::Retake
        }
        None if task.session_held && !task.pod_objects_deleted => TaskStep::DeletePodObjects,
        None if task.session_held
            && (!facts.recorded_held || facts.recorded_session != task.session.as_deref()) =>
        {
            TaskStep::RewriteStatus
        }
        None if task.session_held => TaskStep::Running { holding: true },
        None => TaskStep::Running { holding: false },
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn task() -> TaskView {
        TaskView {
            uid: "u".to_owned(),
            inputs: "h".to_owned(),
            started: Timestamp::UNIX_EPOCH,
            session_held: true,
            conflict: false,
            session: Some("s".to_owned()),
            predecessor: None,
            ended: None,
            pod_objects_deleted: true,
        }
    }

    fn facts<'a>(task: Option<&'a TaskView>) -> TaskFacts<'a> {
        TaskFacts {
            task,
            uid: "u",
            inputs: "h",
            recorded_session: Some("s"),
            recorded_held: true,
            backoff_left: None,
        }
    }

    #[test]
    fn a_loop_starts_once_its_backoff_is_over() {
        assert_eq!(decide(&facts(None)), TaskStep::Start);
        let waiting = TaskFacts {
            backoff_left: Some(Duration::from_secs(4)),
            ..facts(None)
        };
        assert_eq!(decide(&waiting), TaskStep::Wait(Duration::from_secs(4)));
    }

    #[test]
    fn new_inputs_or_a_recreated_listener_replace_the_loop() {
        let running = task();
        assert_eq!(
            decide(&facts(Some(&running))),
            TaskStep::Running { holding: true }
        );
        let changed = TaskFacts {
            inputs: "other",
            ..facts(Some(&running))
        };
        assert_eq!(decide(&changed), TaskStep::Restart);
        let recreated = TaskFacts {
            uid: "v",
            ..facts(Some(&running))
        };
        assert_eq!(decide(&recreated), TaskStep::Restart);
    }

    #[test]
    fn the_pod_objects_go_once_the_session_is_held_and_a_replaced_status_is_written_again() {
        let taking_over = TaskView {
            session_held: false,
            pod_objects_deleted: false,
            ..task()
        };
        assert_eq!(
            decide(&facts(Some(&taking_over))),
            TaskStep::Running { holding: false },
            "nothing goes before the loop holds the session"
        );
        let holding = TaskView {
            session_held: true,
            ..taking_over
        };
        assert_eq!(decide(&facts(Some(&holding))), TaskStep::DeletePodObjects);
        let cleared = TaskView {
            pod_objects_deleted: true,
            ..holding
        };
        assert_eq!(
            decide(&facts(Some(&cleared))),
            TaskStep::Running { holding: true }
        );
        // The stopping pod's last write: its own (lost) session, not held.
        let replaced = TaskFacts {
            recorded_session: Some("pod's"),
            recorded_held: false,
            ..facts(Some(&cleared))
        };
        assert_eq!(decide(&replaced), TaskStep::RewriteStatus);
        let not_held = TaskFacts {
            recorded_held: false,
            ..facts(Some(&cleared))
        };
        assert_eq!(decide(&not_held), TaskStep::RewriteStatus);
    }

    #[test]
    fn an_ended_loop_is_recorded_as_failed_or_started_again() {
        let failed = TaskView {
            ended: Some(Ended::Failed("panicked".to_owned())),
            ..task()
        };
        assert_eq!(
            decide(&facts(Some(&failed))),
            TaskStep::Failed("panicked".to_owned())
        );
        let stopped = TaskView {
            ended: Some(Ended::Stopped),
            ..task()
        };
        assert_eq!(decide(&facts(Some(&stopped))), TaskStep::Start);
    }

    #[test]
    fn a_conflict_with_a_session_recorded_since_retakes_it_once() {
        let refused = TaskView {
            session_held: false,
            conflict: true,
            predecessor: Some("old".to_owned()),
            ..task()
        };
        let recorded = |id| TaskFacts {
            recorded_session: Some(id),
            ..facts(Some(&refused))
        };
        assert_eq!(decide(&recorded("new")), TaskStep::Retake);
        // The session it already deleted: waiting for the service, not deleting again.
        assert_eq!(
            decide(&recorded("old")),
            TaskStep::Running { holding: false }
        );
        let unrecorded = TaskFacts {
            recorded_session: None,
            ..facts(Some(&refused))
        };
        assert_eq!(decide(&unrecorded), TaskStep::Running { holding: false });
    }
}
