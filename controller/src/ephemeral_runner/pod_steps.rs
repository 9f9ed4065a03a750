//! What a pass does with the pod it follows, as pure functions of what it observed (docs/runner-lifecycle.md):
//! [`follow`] mirrors a starting or running pod onto the runner and says when to ask the service whether it still
//! knows the runner; [`pod_failed`] says how a failed pod is recorded, reported and replaced. The executor
//! (`reconcile/following.rs`) carries the answers out and decides nothing.

use std::time::Duration;

use crds::EphemeralRunnerStatus;
use crds::constants::{phase, reason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::pod::JitIdentity;
use super::policy::{
    PodFailure, PodVerdict, disruption_delay, failure_delay, judge_pod, starting_normally,
};
use super::status_patch::{RunnerPhase, StatusPatch};
use crate::options::RunnerPolicy;
use crate::pods::CachedPod;
use kube::ResourceExt;

/// A Kubernetes Event a step publishes about its runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Reason (one word, CamelCase).
    pub reason: &'static str,
    /// What the manager does about it.
    pub action: &'static str,
    /// The Event's note.
    pub note: String,
}

/// What a pass saw of a pod it follows (its runner container reported a state other than an end).
#[derive(Debug, Clone)]
pub struct Following<'a> {
    /// The runner's status as the pass sees it.
    pub status: &'a EphemeralRunnerStatus,
    /// The pod's phase.
    pub pod_phase: &'a str,
    /// Whether the runner container is ready.
    pub ready: bool,
    /// Why the pod is where it is (a waiting container's reason, say); empty when nothing is worth saying.
    pub reason: String,
    /// The message that goes with `reason`.
    pub message: String,
    /// The pod has not run yet and waits on nothing ([`super::policy::starting_normally`]).
    pub starting_normally: bool,
    /// The registration the pod runs under, when known.
    pub identity: Option<&'a JitIdentity>,
}

/// What a pass does with the pod of its runner, whose status is `status` ([`on_pod`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnPod {
    /// Its failure is recorded already: delete it (again); its deletion event brings the runner back.
    AlreadyFailed,
    /// Starting as it should, with nothing to show yet: the identity waits for the first state worth a write.
    Wait,
    /// Starting (or waiting for a node, shown as Pending) or running: mirror it ([`follow`]).
    Follow {
        /// The phase to show.
        phase: String,
        /// Whether the runner container is ready.
        ready: bool,
        /// Why the pod is where it is.
        reason: String,
        /// The message that goes with `reason`.
        message: String,
        /// It has not run yet and waits on nothing.
        starting_normally: bool,
    },
    /// The runner exited 0: the teardown lane's, which its watch event brings it to.
    Succeeded,
    /// The runner exited as a deprecated version does: marked Outdated.
    Outdated,
    /// It failed ([`pod_failed`]).
    Failed(PodFailure),
}

/// [`OnPod`] for pod `pod` of a runner whose status is `status`.
pub fn on_pod(status: &EphemeralRunnerStatus, pod: &CachedPod) -> OnPod {
    if pod
        .uid()
        .is_some_and(|uid| status.failures.contains_key(&uid))
    {
        return OnPod::AlreadyFailed;
    }
    match judge_pod(pod) {
        PodVerdict::Wait if starting_normally(pod) => OnPod::Wait,
        PodVerdict::Wait => OnPod::Follow {
            phase: phase::PENDING.to_owned(),
            ready: false,
            reason: String::new(),
            message: String::new(),
            starting_normally: false,
        },
        PodVerdict::Progress {
            phase,
            ready,
            reason,
            message,
        } => OnPod::Follow {
            phase,
            ready,
            reason,
            message,
            starting_normally: starting_normally(pod),
        },
        PodVerdict::Succeeded => OnPod::Succeeded,
        PodVerdict::Outdated => OnPod::Outdated,
        PodVerdict::Failed(failure) => OnPod::Failed(failure),
    }
}

/// What [`follow`] asks for.
#[derive(Debug, Default)]
pub struct Follow {
    /// The status write that mirrors the pod, if the status shows it otherwise. The executor skips it when the
    /// runner's end came meanwhile (nothing left to mirror).
    pub mirror: Option<StatusPatch>,
    /// Check with the service that it still knows registration `Some(id)`, if the check is due (an idle runner
    /// whose pod runs: a zombie is replaced).
    pub check_registration: Option<i64>,
    /// When to come back.
    pub requeue: Duration,
}

/// Mirrors the pod onto the runner. A pod starting as it should shows nothing an empty status does not: the first
/// write waits for it to run or to wait on something, and carries the identity (the executor's pod creation). An
/// idle running runner comes back at the registration check's interval, when it is shorter than the resync.
/// `holds_at`: the resource version of the pass's view, asked only when a first identity is written.
pub fn follow(
    seen: &Following<'_>,
    holds_at: impl FnOnce() -> Option<String>,
    check_interval: Duration,
    resync: Duration,
) -> Follow {
    let status = seen.status;
    let quiet_start = seen.starting_normally
        && status.phase.is_empty()
        && seen.pod_phase == phase::PENDING
        && !seen.ready
        && seen.reason.is_empty()
        && seen.message.is_empty();
    let mirror = ((status.phase != seen.pod_phase || status.ready != seen.ready) && !quiet_start)
        .then(|| {
            let mut patch = StatusPatch {
                phase: Some(RunnerPhase::of_pod(seen.pod_phase)),
                ready: Some(seen.ready),
                ..StatusPatch::default()
            };
            patch.explain(seen.reason.clone(), seen.message.clone());
            if let Some(identity) = seen.identity {
                patch.record_identity(status, identity, holds_at);
            }
            patch
        });
    let idle_and_running = seen.pod_phase == phase::RUNNING && seen.ready && !status.has_job();
    let checking = idle_and_running && !check_interval.is_zero();
    Follow {
        mirror,
        check_registration: seen
            .identity
            .filter(|_| checking)
            .map(|identity| identity.runner_id),
        requeue: if checking {
            check_interval.min(resync)
        } else {
            resync
        },
    }
}

/// How long the service must go on saying it does not know an idle running runner before the runner is taken for a
/// zombie (at most the check interval, so a short interval confirms as quickly). A runner whose job was too short
/// for the listener's report to reach it looks idle, and the service forgets it as the job ends; its pod exits
/// within seconds, and its end is then a finished runner's, not a zombie's (no Warning Event, no metric).
pub const ZOMBIE_CONFIRMATION: Duration = Duration::from_secs(15);

/// What follows a registration check of an idle running runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterCheck {
    /// The service knows it: nothing to do (a suspicion, if any, goes).
    Known,
    /// The service does not know it, for less than the confirmation: suspect it, check again in this long.
    Suspect(Duration),
    /// The service has not known it for the confirmation: a zombie, replaced.
    Zombie,
}

/// The confirmation for checks every `interval` ([`ZOMBIE_CONFIRMATION`] at most).
pub fn zombie_confirmation(interval: Duration) -> Duration {
    interval.min(ZOMBIE_CONFIRMATION)
}

/// Whether a registration check is due now for a runner suspected for `suspected_for` (if it is), or, when it is
/// not suspected, by the periodic schedule (`periodic_due`); `Err(wait)` when a suspicion is to be confirmed in
/// `wait`.
pub fn registration_check_due(
    suspected_for: Option<Duration>,
    periodic_due: impl FnOnce() -> bool,
    confirmation: Duration,
) -> Result<bool, Duration> {
    match suspected_for {
        Some(since) if since >= confirmation => Ok(true),
        Some(since) => Err(confirmation - since),
        None => Ok(periodic_due()),
    }
}

/// What a registration check that found the runner `known` (or not) means, for a runner suspected for
/// `suspected_for`.
pub fn after_registration_check(
    known: bool,
    suspected_for: Option<Duration>,
    confirmation: Duration,
) -> AfterCheck {
    match suspected_for {
        _ if known => AfterCheck::Known,
        Some(since) if since >= confirmation => AfterCheck::Zombie,
        Some(since) => AfterCheck::Suspect(confirmation - since),
        None => AfterCheck::Suspect(confirmation),
    }
}

/// The status write before a pod is created, if any. A first attempt writes none: the identity goes into the
/// status with the first state worth showing ([`follow`]), one write fewer per runner; the listener may report the
/// runner's job before that and records the identity with it. A later attempt clears what earlier ones left (a
/// failure, a quota or admission message) before its pod, with the identity and phase Pending (the API server makes
/// every new pod Pending), as one write.
pub fn before_pod(
    status: &EphemeralRunnerStatus,
    identity: &JitIdentity,
    holds_at: impl FnOnce() -> Option<String>,
) -> Option<StatusPatch> {
    let recorded_before = !status.phase.is_empty()
        || status.ready
        || !status.reason.is_empty()
        || !status.message.is_empty()
        || status.runner_id != 0;
    if !recorded_before {
        return None;
    }
    let mut patch = StatusPatch::default();
    patch.record_identity(status, identity, holds_at);
    if status.phase != phase::PENDING || status.ready || !status.reason.is_empty() {
        patch.phase = Some(RunnerPhase::Pending);
        patch.ready = Some(false);
        patch.explain(String::new(), String::new());
    }
    Some(patch)
}

/// The status write, and the Event when the status does not say so already, for a pod a quota or an admission
/// check refused (`refusal`, the API server's message): not the runner's fault, so not counted, and retried (dry
/// first) until the cluster admits it. `recorded_now`: the registration the pass recorded before the refused
/// creation (the status in hand predates it); whatever registration is recorded is forgotten, its config discarded.
pub fn pod_rejected(
    status: &EphemeralRunnerStatus,
    refusal: &str,
    recorded_now: Option<i64>,
) -> (StatusPatch, Option<Report>) {
    let message = format!("Failed to create the pod: {refusal}");
    let mut patch = StatusPatch::default();
    let recorded = recorded_now.unwrap_or(status.runner_id);
    if recorded != 0 {
        patch.forget_identity(recorded);
    }
    let report = (status.reason != reason::POD_CREATION_REJECTED || status.message != message)
        .then(|| {
            patch.explain(reason::POD_CREATION_REJECTED.to_owned(), message.clone());
            Report {
                reason: reason::POD_CREATION_REJECTED,
                action: "CreatePod",
                note: message,
            }
        });
    (patch, report)
}

/// The Event of a runner that deletes itself so its set replaces it: its pod failed `failures` times.
pub fn retries_exhausted(failures: usize) -> Report {
    Report {
        reason: "RetriesExhausted",
        action: "DeleteRunner",
        note: format!(
            "the runner pod failed {failures} times; deleting the runner so the set replaces it"
        ),
    }
}

/// The Event of a runner that deletes itself so its set replaces it: its pod stays past its deletion deadline (no
/// kubelet is stopping it), and a new runner can start elsewhere.
pub fn stuck_terminating() -> Report {
    Report {
        reason: "RunnerPodStuckTerminating",
        action: "DeleteRunner",
        note: "the runner pod is still terminating long after its grace period (is its node lost?); deleting the \
               runner so the set replaces it"
            .to_owned(),
    }
}

/// The Event of a runner that deletes itself so its set replaces it: the service no longer knows registration
/// `runner_id` while its pod runs (a zombie; docs/reference/beyond-arc.md, item 7).
pub fn zombie(runner_id: i64) -> Report {
    Report {
        reason: "ZombieRunner",
        action: "DeleteRunner",
        note: format!(
            "the Actions Service no longer knows runner {runner_id} while its pod runs; deleting the runner so the \
             set replaces it"
        ),
    }
}

/// What a registration that met the runner's name already registered (a crash between registering and storing
/// the config, or another runner's name) leads to ([`name_clash`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameClash {
    /// The service no longer finds the name it just refused (its own eventual consistency): try again shortly.
    Retry,
    /// A registration an earlier attempt of this runner left, in its own scale set: remove it, then register.
    RemoveEarlier(i64),
    /// The name belongs to a runner of another scale set: this runner deletes itself so a new name is made.
    Taken(Report),
}

/// [`NameClash`] for runner `name` of scale set `own_scale_set`, given what the service found under that name
/// (`existing`: its registration id and scale set).
pub fn name_clash(name: &str, own_scale_set: i64, existing: Option<(i64, i64)>) -> NameClash {
    match existing {
        None => NameClash::Retry,
        Some((runner_id, scale_set)) if scale_set == own_scale_set => {
            NameClash::RemoveEarlier(runner_id)
        }
        Some((_, scale_set)) => NameClash::Taken(Report {
            reason: "RunnerNameTaken",
            action: "GenerateJitConfig",
            note: format!(
                "a runner named {name} already exists in scale set {scale_set}; deleting this runner so a new one is \
                 created"
            ),
        }),
    }
}

/// What [`pod_failed`] asks for.
#[derive(Debug)]
pub enum PodFailed {
    /// The runner held a job: it is finished (deleted), never given a new pod; the job is the service's.
    FinishWithJob(Report),
    /// A runner without a job gets a new pod.
    Restart(Box<Restart>),
}

/// A new pod for a runner without a job: remove `deregister` (its config may have been used; a service that says
/// the registration's job still runs finishes the runner instead), delete the Secret, write `patch`, count it (a
/// failure if `counted`, else a disruption), report, delete the pod, and come back after `delay`.
#[derive(Debug)]
pub struct Restart {
    /// The registration to remove first, when one is known.
    pub deregister: Option<i64>,
    /// The status write: not ready, why, the identity forgotten, and the failure when counted.
    pub patch: StatusPatch,
    /// Whether it counts against the retry budget.
    pub counted: bool,
    /// How long until the next pod (at least a second: the pod's deletion event brings the runner back).
    pub delay: Duration,
    /// The Event.
    pub report: Report,
}

/// How a failed pod (`pod_uid`, at `now`) of a runner whose status is `status` is handled: a runner with a job is
/// finished; otherwise the failure is recorded, counted or not ([`PodFailure::counted`]), and a new pod follows
/// after the backoff (`failures` doubling from `policy.failure_backoff_base`, or `disruptions_before + 1`
/// disruptions capped at `policy.disruption_backoff_max`).
pub fn pod_failed(
    status: &EphemeralRunnerStatus,
    failure: &PodFailure,
    identity: Option<&JitIdentity>,
    pod_uid: &str,
    now: Timestamp,
    disruptions_before: u32,
    policy: &RunnerPolicy,
) -> PodFailed {
    if status.has_job() {
        return PodFailed::FinishWithJob(Report {
            reason: "RunnerFailedWithJob",
            action: "DeleteRunner",
            note: format!(
                "the runner pod failed while running a job: {}",
                failure.message
            ),
        });
    }
    let mut patch = StatusPatch {
        ready: Some(false),
        ..StatusPatch::default()
    };
    patch.explain(failure.reason.clone(), failure.message.clone());
    patch.forget_identity(status.runner_id);
    let (delay, reason, what) = if failure.counted {
        patch.failures = Some([(pod_uid.to_owned(), Time(now))].into());
        (
            failure_delay(status.failures.len() + 1, policy.failure_backoff_base),
            "RunnerPodFailed",
            "counted as a failure",
        )
    } else {
        (
            disruption_delay(
                disruptions_before.saturating_add(1),
                policy.disruption_backoff_max,
            ),
            "RunnerPodDisrupted",
            "not counted as a failure",
        )
    };
    PodFailed::Restart(Box::new(Restart {
        deregister: identity.map(|identity| identity.runner_id),
        patch,
        counted: failure.counted,
        delay: delay.max(Duration::from_secs(1)),
        report: Report {
            reason,
            action: "RecreatePod",
            note: format!(
                "{}: {} ({what}); a new pod follows",
                failure.reason, failure.message
            ),
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> RunnerPolicy {
        RunnerPolicy {
            failure_backoff_base: Duration::from_secs(5),
            disruption_backoff_max: Duration::from_secs(60),
            ..crate::options::Options::default().runner
        }
    }

    fn identity(runner_id: i64) -> JitIdentity {
        JitIdentity {
            runner_id,
            runner_name: "r".to_owned(),
        }
    }

    fn failure(counted: bool) -> PodFailure {
        PodFailure {
            counted,
            class: if counted { "runner_exit" } else { "evicted" },
            reason: "Error".to_owned(),
            message: "exit 1".to_owned(),
        }
    }

    fn seen<'a>(
        status: &'a EphemeralRunnerStatus,
        pod_phase: &'a str,
        ready: bool,
        identity: Option<&'a JitIdentity>,
    ) -> Following<'a> {
        Following {
            status,
            pod_phase,
            ready,
            reason: String::new(),
            message: String::new(),
            starting_normally: false,
            identity,
        }
    }

    const MINUTE: Duration = Duration::from_secs(60);

    fn pod(uid: &str, status: serde_json::Value) -> CachedPod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "r", "uid": uid },
            "spec": { "nodeName": "node" },
            "status": status,
        }))
        .expect("pod")
    }

    fn runner_container(state: serde_json::Value, ready: bool) -> serde_json::Value {
        serde_json::json!([{
            "name": crds::constants::RUNNER_CONTAINER_NAME, "image": "i", "imageID": "", "ready": ready,
            "restartCount": 0, "state": state,
        }])
    }

    #[test]
    fn a_followed_pod_is_mirrored_finished_or_failed_and_a_recorded_failure_only_deleted() {
        let status = EphemeralRunnerStatus::default();
        let creating = pod(
            "p",
            serde_json::json!({"phase": "Pending", "containerStatuses": runner_container(
                serde_json::json!({"waiting": {"reason": "ContainerCreating"}}), false)}),
        );
        assert!(matches!(
            on_pod(&status, &creating),
            OnPod::Follow {
                starting_normally: true,
                ..
            }
        ));
        // No status of the runner container yet: nothing to show.
        assert_eq!(
            on_pod(&status, &pod("p", serde_json::json!({"phase": "Pending"}))),
            OnPod::Wait
        );
        let running = pod(
            "p",
            serde_json::json!({"phase": "Running", "containerStatuses": runner_container(
                serde_json::json!({"running": {}}), true),
                "conditions": [{"type": "Ready", "status": "True"}]}),
        );
        assert!(
            matches!(on_pod(&status, &running), OnPod::Follow { ref phase, ready: true, .. } if phase == "Running")
        );
        let pulling = pod(
            "p",
            serde_json::json!({"phase": "Pending", "containerStatuses": runner_container(
                serde_json::json!({"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}), false)}),
        );
        assert!(
            matches!(
                on_pod(&status, &pulling),
                OnPod::Follow {
                    starting_normally: false,
                    ..
                }
            ),
            "{:?}",
            on_pod(&status, &pulling)
        );
        let exited = |code: i32| {
            pod(
                "p",
                serde_json::json!({"phase": "Failed", "containerStatuses": runner_container(
                    serde_json::json!({"terminated": {"exitCode": code}}), false)}),
            )
        };
        assert_eq!(on_pod(&status, &exited(0)), OnPod::Succeeded);
        assert!(matches!(on_pod(&status, &exited(1)), OnPod::Failed(_)));
        let recorded = EphemeralRunnerStatus {
            failures: [("p".to_owned(), Time(Timestamp::from_second(1).unwrap()))].into(),
            ..EphemeralRunnerStatus::default()
        };
        assert_eq!(on_pod(&recorded, &exited(1)), OnPod::AlreadyFailed);
        assert!(matches!(
            on_pod(&recorded, &pod("q", serde_json::json!({"phase": "Failed"}))),
            OnPod::Failed(_)
        ));
    }

    fn restarted(plan: PodFailed) -> Restart {
        match plan {
            PodFailed::Restart(restart) => *restart,
            PodFailed::FinishWithJob(report) => panic!("restarted, not finished: {report:?}"),
        }
    }

    #[test]
    fn a_pod_starting_as_it_should_writes_nothing_until_it_runs_then_the_identity_goes_with_it() {
        let empty = EphemeralRunnerStatus::default();
        let id = identity(7);
        let mut starting = seen(&empty, phase::PENDING, false, Some(&id));
        starting.starting_normally = true;
        let plan = follow(&starting, || unreachable!(), MINUTE, MINUTE);
        assert!(plan.mirror.is_none());
        let running = seen(&empty, phase::RUNNING, true, Some(&id));
        let plan = follow(&running, || Some("41".to_owned()), MINUTE, MINUTE);
        let patch = plan.mirror.expect("mirrored");
        assert_eq!(patch.phase, Some(RunnerPhase::Running));
        assert_eq!(patch.runner_id, Some(Some(7)));
        assert_eq!(
            patch.holds_at.as_deref(),
            Some("41"),
            "a first identity holds at the view"
        );
    }

    #[test]
    fn a_pod_that_waits_on_something_is_shown_with_why() {
        let empty = EphemeralRunnerStatus::default();
        let mut waiting = seen(&empty, phase::PENDING, false, None);
        waiting.starting_normally = true;
        waiting.reason = "ImagePullBackOff".to_owned();
        let patch = follow(&waiting, || None, MINUTE, MINUTE)
            .mirror
            .expect("shown");
        assert_eq!(patch.reason, Some(Some("ImagePullBackOff".to_owned())));
    }

    #[test]
    fn only_an_idle_running_runner_with_a_known_registration_is_checked() {
        let idle = EphemeralRunnerStatus {
            phase: phase::RUNNING.to_owned(),
            ready: true,
            runner_id: 7,
            runner_name: "r".to_owned(),
            ..EphemeralRunnerStatus::default()
        };
        let id = identity(7);
        let interval = Duration::from_secs(10);
        let plan = follow(
            &seen(&idle, phase::RUNNING, true, Some(&id)),
            || None,
            interval,
            MINUTE,
        );
        assert!(plan.mirror.is_none(), "nothing changed");
        assert_eq!(plan.check_registration, Some(7));
        assert_eq!(plan.requeue, interval);
        let busy = EphemeralRunnerStatus {
            job_id: "j".to_owned(),
            ..idle.clone()
        };
        let plan = follow(
            &seen(&busy, phase::RUNNING, true, Some(&id)),
            || None,
            interval,
            MINUTE,
        );
        assert_eq!(
            plan.check_registration, None,
            "a busy runner is the service's"
        );
        assert_eq!(plan.requeue, MINUTE);
        let off = follow(
            &seen(&idle, phase::RUNNING, true, Some(&id)),
            || None,
            Duration::ZERO,
            MINUTE,
        );
        assert_eq!((off.check_registration, off.requeue), (None, MINUTE));
        let unknown = follow(
            &seen(&idle, phase::RUNNING, true, None),
            || None,
            interval,
            MINUTE,
        );
        assert_eq!(unknown.check_registration, None);
    }

    #[test]
    fn a_runner_the_service_forgot_is_a_zombie_only_once_it_stays_forgotten_for_the_confirmation() {
        let confirmation = zombie_confirmation(Duration::from_secs(120));
        assert_eq!(confirmation, ZOMBIE_CONFIRMATION);
        assert_eq!(
            zombie_confirmation(Duration::from_millis(500)),
            Duration::from_millis(500)
        );
        // First time: suspected, not replaced (its job may just have ended, its pod about to exit).
        assert_eq!(
            after_registration_check(false, None, confirmation),
            AfterCheck::Suspect(confirmation)
        );
        let early = Duration::from_secs(5);
        assert_eq!(
            registration_check_due(Some(early), || unreachable!(), confirmation),
            Err(confirmation - early),
            "a suspicion is confirmed on its own schedule"
        );
        assert_eq!(
            registration_check_due(Some(confirmation), || false, confirmation),
            Ok(true)
        );
        assert_eq!(
            after_registration_check(false, Some(confirmation), confirmation),
            AfterCheck::Zombie
        );
        assert_eq!(
            after_registration_check(true, Some(confirmation), confirmation),
            AfterCheck::Known
        );
        assert_eq!(
            registration_check_due(None, || true, confirmation),
            Ok(true)
        );
        assert_eq!(
            registration_check_due(None, || false, confirmation),
            Ok(false)
        );
    }

    #[test]
    fn a_first_attempt_writes_nothing_before_its_pod_and_a_later_one_clears_what_the_last_left() {
        let id = identity(8);
        assert!(before_pod(&EphemeralRunnerStatus::default(), &id, || unreachable!()).is_none());
        let refused = EphemeralRunnerStatus {
            reason: reason::POD_CREATION_REJECTED.to_owned(),
            message: "quota".to_owned(),
            ..EphemeralRunnerStatus::default()
        };
        let patch = before_pod(&refused, &id, || Some("3".to_owned())).expect("a write");
        assert_eq!(patch.phase, Some(RunnerPhase::Pending));
        assert_eq!(patch.reason, Some(None), "the refusal's reason goes");
        assert_eq!(
            (patch.runner_id, patch.holds_at.as_deref()),
            (Some(Some(8)), Some("3"))
        );
        let failed_before = EphemeralRunnerStatus {
            phase: phase::PENDING.to_owned(),
            runner_id: 7,
            runner_name: "r".to_owned(),
            ..EphemeralRunnerStatus::default()
        };
        let patch = before_pod(&failed_before, &id, || unreachable!()).expect("a write");
        assert_eq!(patch.leaves, Some(7), "the earlier registration is left");
        assert_eq!(patch.phase, None, "already Pending");
    }

    #[test]
    fn a_refused_pod_is_reported_once_per_message_and_forgets_the_registration() {
        let (patch, report) =
            pod_rejected(&EphemeralRunnerStatus::default(), "exceeded quota", Some(9));
        assert_eq!(
            patch.leaves,
            Some(9),
            "the registration this pass recorded, which the status in hand predates"
        );
        assert_eq!(patch.runner_id, Some(None));
        let report = report.expect("reported");
        assert_eq!(report.note, "Failed to create the pod: exceeded quota");
        let shown = EphemeralRunnerStatus {
            reason: reason::POD_CREATION_REJECTED.to_owned(),
            message: report.note.clone(),
            ..EphemeralRunnerStatus::default()
        };
        let (patch, again) = pod_rejected(&shown, "exceeded quota", None);
        assert!(
            again.is_none() && patch.is_empty(),
            "said already: nothing to write"
        );
    }

    #[test]
    fn a_name_clash_removes_only_this_scale_sets_earlier_registration() {
        assert_eq!(name_clash("r", 1, None), NameClash::Retry);
        assert_eq!(
            name_clash("r", 1, Some((7, 1))),
            NameClash::RemoveEarlier(7)
        );
        let NameClash::Taken(report) = name_clash("r", 1, Some((7, 2))) else {
            panic!("taken");
        };
        assert_eq!(report.reason, "RunnerNameTaken");
        assert!(report.note.contains("scale set 2"), "{}", report.note);
    }

    #[test]
    fn a_failed_pod_of_a_runner_with_a_job_finishes_it() {
        let busy = EphemeralRunnerStatus {
            runner_id: 7,
            job_id: "j".to_owned(),
            ..EphemeralRunnerStatus::default()
        };
        let plan = pod_failed(
            &busy,
            &failure(true),
            Some(&identity(7)),
            "p",
            Timestamp::now(),
            0,
            &policy(),
        );
        assert!(
            matches!(plan, PodFailed::FinishWithJob(report) if report.reason == "RunnerFailedWithJob")
        );
    }

    #[test]
    fn a_counted_failure_is_recorded_under_its_pod_and_backs_off_by_the_count() {
        let status = EphemeralRunnerStatus {
            runner_id: 7,
            failures: [("p0".to_owned(), Time(Timestamp::now()))].into(),
            ..EphemeralRunnerStatus::default()
        };
        let Restart {
            deregister,
            patch,
            counted,
            delay,
            report,
        } = restarted(pod_failed(
            &status,
            &failure(true),
            Some(&identity(7)),
            "p1",
            Timestamp::now(),
            3,
            &policy(),
        ));
        assert_eq!(deregister, Some(7));
        assert!(counted);
        assert!(
            patch
                .failures
                .as_ref()
                .is_some_and(|new| new.contains_key("p1"))
        );
        assert_eq!(
            patch.leaves,
            Some(7),
            "the registration goes, with any job written under it"
        );
        assert_eq!(delay, failure_delay(2, Duration::from_secs(5)));
        assert_eq!(report.reason, "RunnerPodFailed");
    }

    #[test]
    fn a_disruption_is_not_counted_and_backs_off_by_the_disruptions() {
        let status = EphemeralRunnerStatus::default();
        let Restart {
            deregister,
            patch,
            counted,
            delay,
            report,
        } = restarted(pod_failed(
            &status,
            &failure(false),
            None,
            "p1",
            Timestamp::now(),
            2,
            &policy(),
        ));
        assert_eq!(deregister, None);
        assert!(!counted && patch.failures.is_none());
        assert_eq!(delay, disruption_delay(3, MINUTE));
        assert_eq!(report.reason, "RunnerPodDisrupted");
    }

    proptest! {
        /// Whatever the history, a failed pod never gets its runner a new pod while it holds a job, a restart always
        /// forgets the registration (its config may have been used) and waits at least a second, and only a counted
        /// failure adds to the retry budget.
        #[test]
        fn a_failed_pod_is_never_restarted_under_a_job_and_never_reuses_its_registration(
            has_job in any::<bool>(),
            runner_id in 0i64..3,
            earlier in 0usize..8,
            disruptions in 0u32..40,
            counted in any::<bool>(),
            known in any::<bool>(),
        ) {
            let status = EphemeralRunnerStatus {
                runner_id,
                job_id: if has_job { "j".to_owned() } else { String::new() },
                failures: (0..earlier).map(|i| (format!("p{i}"), Time(Timestamp::now()))).collect(),
                ..EphemeralRunnerStatus::default()
            };
            let id = identity(runner_id.max(1));
            let plan = pod_failed(&status, &failure(counted), known.then_some(&id), "new", Timestamp::now(), disruptions, &policy());
            match plan {
                PodFailed::FinishWithJob(_) => prop_assert!(has_job),
                PodFailed::Restart(restart) => {
                    let Restart { deregister, patch, counted: was_counted, delay, .. } = *restart;
                    prop_assert!(!has_job);
                    prop_assert_eq!(deregister, known.then_some(id.runner_id));
                    prop_assert_eq!(patch.runner_id, Some(None));
                    prop_assert_eq!(patch.leaves, (runner_id != 0).then_some(runner_id));
                    prop_assert!(delay >= Duration::from_secs(1));
                    prop_assert_eq!(was_counted, counted);
                    prop_assert_eq!(patch.failures.is_some(), counted);
                }
            }
        }
    }
}
