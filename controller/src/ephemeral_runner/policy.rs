//! Pure decisions about a runner's pod (docs/reference/controllers.md, "Following the pod";
//! docs/reference/beyond-arc.md, item 6): what a pod's state means, which failures count against the retry budget,
//! how long to wait before the next pod, and what a pod creation error means.
//!
//! Counted failures are the runner's own: its container exited non-zero, an init container failed, or the pod
//! failed for a reason of its own. Disruptions are the cluster's doing and are never counted: evictions,
//! preemption, node loss, and the kubelet refusing the pod (`OutOfcpu`, `UnexpectedAdmissionError`, ...).

use std::collections::BTreeMap;
use std::time::Duration;

use crds::constants::{RUNNER_CONTAINER_NAME, phase};
use k8s_openapi::api::core::v1::ContainerStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::pods::CachedPod;
use crate::pods::{conditions, is_ready};

/// Exit code the runner uses when its version is deprecated (requested through the environment).
pub const DEPRECATED_EXIT_CODE: i32 = 7;

/// What a runner pod's state means for its EphemeralRunner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodVerdict {
    /// The runner container has not reported a status yet.
    Wait,
    /// Starting or running: copy the pod's phase and readiness onto the runner.
    Progress {
        /// Pod phase.
        phase: String,
        /// Pod readiness.
        ready: bool,
        /// Pod `status.reason`.
        reason: String,
        /// Pod `status.message`.
        message: String,
    },
    /// The runner exited 0: its job (if any) is done.
    Succeeded,
    /// The runner exited with [`DEPRECATED_EXIT_CODE`].
    Outdated,
    /// The pod failed.
    Failed(PodFailure),
}

/// How a pod failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFailure {
    /// Whether it counts against the runner's retry budget (disruptions do not).
    pub counted: bool,
    /// Bounded metric reason: `runner_exit`, `init_container`, `pod_failed` (counted) or `evicted`,
    /// `preempted`, `node_lost`, `node_rejected`, `disrupted` (not counted).
    pub class: &'static str,
    /// Reason to record on the runner.
    pub reason: String,
    /// Message to record on the runner.
    pub message: String,
}

fn runner_status(pod: &CachedPod) -> Option<&ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|status| status.name == RUNNER_CONTAINER_NAME)
}

/// Whether a pod that has not run yet is starting as pods do (its runner container not reported yet, or being
/// created, or waiting for its init containers), rather than waiting on something (an image that cannot be
/// pulled, a spec the kubelet cannot run, a node that does not come).
pub fn starting_normally(pod: &CachedPod) -> bool {
    let Some(runner) = runner_status(pod) else {
        return !crate::pods::is_waiting_for_node(pod);
    };
    runner
        .state
        .as_ref()
        .and_then(|state| state.waiting.as_ref())
        .and_then(|waiting| waiting.reason.as_deref())
        .is_none_or(|reason| matches!(reason, "ContainerCreating" | "PodInitializing"))
}

/// Whether `pod` is Pending and its runner container has not started (not reported yet, or waiting): no job can
/// be running in it.
pub fn runner_not_started(pod: &CachedPod) -> bool {
    matches!(pod_phase(pod), "" | phase::PENDING)
        && runner_status(pod)
            .and_then(|status| status.state.as_ref())
            .is_none_or(|state| state.running.is_none() && state.terminated.is_none())
}

fn exit_code(status: &ContainerStatus) -> Option<i32> {
    status
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|terminated| terminated.exit_code)
}

/// Why the cluster took the pod away, if it did.
pub fn disruption_class(pod: &CachedPod) -> Option<&'static str> {
    let reason = pod
        .status
        .as_ref()
        .and_then(|status| status.reason.as_deref())
        .unwrap_or_default();
    let by_reason = match reason {
        "Evicted" => Some("evicted"),
        "Preempting" => Some("preempted"),
        "NodeLost" | "NodeShutdown" | "Shutdown" | "Terminated" => Some("node_lost"),
        "UnexpectedAdmissionError" | "NodeAffinity" | "NodeAffinityMismatch" => {
            Some("node_rejected")
        }
        other if other.starts_with("OutOf") => Some("node_rejected"),
        _ => None,
    };
    by_reason.or_else(|| {
        conditions(pod)
            .iter()
            .find(|condition| condition.type_ == "DisruptionTarget" && condition.status == "True")
            .map(
                |condition| match condition.reason.as_deref().unwrap_or_default() {
                    "PreemptionByScheduler" | "PreemptionByKubeScheduler" => "preempted",
                    "EvictionByEvictionAPI" => "evicted",
                    "DeletionByTaintManager" | "DeletionByPodGC" | "TerminationByKubelet" => {
                        "node_lost"
                    }
                    _ => "disrupted",
                },
            )
    })
}

pub(crate) fn pod_phase(pod: &CachedPod) -> &str {
    pod.status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        .unwrap_or_default()
}

fn failure(
    pod: &CachedPod,
    counted_class: &'static str,
    default_reason: &str,
    default_message: String,
) -> PodFailure {
    let status = pod.status.as_ref();
    let reason = status
        .and_then(|status| status.reason.clone())
        .filter(|reason| !reason.is_empty());
    let message = status
        .and_then(|status| status.message.clone())
        .filter(|message| !message.is_empty());
    let disruption = disruption_class(pod);
    PodFailure {
        counted: disruption.is_none(),
        class: disruption.unwrap_or(counted_class),
        reason: reason.unwrap_or_else(|| default_reason.to_owned()),
        message: message.unwrap_or(default_message),
    }
}

/// What the state of a runner pod means, with disruptions told apart (docs/reference/controllers.md, "Following the
/// pod").
pub fn judge_pod(pod: &CachedPod) -> PodVerdict {
    let runner = runner_status(pod);
    let runner_exit = runner.and_then(exit_code);
    let phase = pod_phase(pod);
    if phase == "Failed" {
        return match runner_exit {
            Some(0) => PodVerdict::Succeeded,
            Some(DEPRECATED_EXIT_CODE) => PodVerdict::Outdated,
            Some(code) => PodVerdict::Failed(failure(
                pod,
                "runner_exit",
                "RunnerExited",
                format!("the runner container exited with code {code}"),
            )),
            None => PodVerdict::Failed(failure(
                pod,
                "pod_failed",
                "PodFailed",
                "the pod failed before the runner container finished".to_owned(),
            )),
        };
    }
    let failed_init = pod
        .status
        .as_ref()
        .and_then(|status| status.init_container_statuses.as_deref())
        .unwrap_or_default()
        .iter()
        .find_map(|status| {
            exit_code(status)
                .filter(|code| *code != 0)
                .map(|code| (status, code))
        });
    if let Some((status, code)) = failed_init {
        return PodVerdict::Failed(failure(
            pod,
            "init_container",
            "InitContainerFailed",
            format!("init container {} exited with code {code}", status.name),
        ));
    }
    let Some(runner) = runner else {
        return PodVerdict::Wait;
    };
    match exit_code(runner) {
        None => {
            let status = pod.status.as_ref();
            PodVerdict::Progress {
                phase: phase.to_owned(),
                ready: is_ready(pod),
                reason: status.and_then(|s| s.reason.clone()).unwrap_or_default(),
                message: status.and_then(|s| s.message.clone()).unwrap_or_default(),
            }
        }
        Some(0) => PodVerdict::Succeeded,
        Some(DEPRECATED_EXIT_CODE) => PodVerdict::Outdated,
        Some(code) => PodVerdict::Failed(failure(
            pod,
            "runner_exit",
            "RunnerExited",
            format!("the runner container exited with code {code}"),
        )),
    }
}

/// Delay before the next pod after `failures` counted failures: none for the first pod, then `base`, doubling
/// (ARC: 5 s, 10 s, 20 s, 40 s, 80 s).
pub fn failure_delay(failures: usize, base: Duration) -> Duration {
    match failures {
        0 => Duration::ZERO,
        n => {
            let shift = u32::try_from(n - 1).unwrap_or(u32::MAX).min(16);
            base.saturating_mul(1 << shift)
        }
    }
}

/// How much longer to wait before the next pod, given the recorded failures, or `None` to go ahead now.
pub fn remaining_failure_backoff(
    failures: &BTreeMap<String, Time>,
    base: Duration,
    now: Timestamp,
) -> Option<Duration> {
    let last = failures.values().map(|time| time.0).max()?;
    let delay = failure_delay(failures.len(), base);
    let elapsed = now.duration_since(last);
    let elapsed = Duration::try_from(elapsed).unwrap_or(Duration::ZERO);
    delay.checked_sub(elapsed).filter(|left| !left.is_zero())
}

/// Whether a runner with `failures` counted failures has used up its budget of `max` (ARC: more than 5).
pub fn retries_exhausted(failures: usize, max: usize) -> bool {
    failures > max
}

/// Delay before the next pod after the `count`-th disruption: 1 s doubling, capped at `max`. Disruptions are
/// not the runner's fault, so they never exhaust the runner, but a node that keeps refusing pods must not cause
/// a hot loop.
pub fn disruption_delay(count: u32, max: Duration) -> Duration {
    let shift = count.saturating_sub(1).min(16);
    Duration::from_secs(1).saturating_mul(1 << shift).min(max)
}

/// What a failed pod creation means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateRejection {
    /// A pod of that name exists (the cache had not seen it).
    AlreadyExists,
    /// The pod is invalid (422): the template is wrong; retrying cannot help.
    Invalid(String),
    /// A ResourceQuota is exhausted (403 "exceeded quota"): retry later, not a runner failure.
    Quota(String),
    /// Another 403 (admission webhook, pod security): retry later, not a runner failure.
    Forbidden(String),
    /// Anything else: an ordinary error.
    Other,
}

/// Classifies a pod creation error.
pub fn classify_create_error(error: &kube::Error) -> CreateRejection {
    let kube::Error::Api(status) = error else {
        return CreateRejection::Other;
    };
    match status.code {
        409 if status.reason == "AlreadyExists" => CreateRejection::AlreadyExists,
        422 => CreateRejection::Invalid(status.message.clone()),
        403 if status.message.contains("exceeded quota") => {
            CreateRejection::Quota(status.message.clone())
        }
        403 => CreateRejection::Forbidden(status.message.clone()),
        _ => CreateRejection::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::tests::condition;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        PodStatus,
    };
    use proptest::prelude::*;

    fn container(name: &str, exit: Option<i32>) -> ContainerStatus {
        ContainerStatus {
            name: name.to_owned(),
            state: Some(match exit {
                Some(code) => ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: code,
                        ..ContainerStateTerminated::default()
                    }),
                    ..ContainerState::default()
                },
                None => ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..ContainerState::default()
                },
            }),
            ..ContainerStatus::default()
        }
    }

    fn pod(phase: &str, runner: Option<Option<i32>>) -> CachedPod {
        CachedPod {
            status: Some(PodStatus {
                phase: Some(phase.to_owned()),
                container_statuses: runner.map(|exit| vec![container("runner", exit)]),
                ..PodStatus::default()
            }),
            ..CachedPod::default()
        }
    }

    fn waiting_pod(reason: &str) -> CachedPod {
        let mut runner = container("runner", None);
        runner.state = Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.to_owned()),
                ..ContainerStateWaiting::default()
            }),
            ..ContainerState::default()
        });
        CachedPod {
            status: Some(PodStatus {
                phase: Some("Pending".to_owned()),
                container_statuses: Some(vec![runner]),
                ..PodStatus::default()
            }),
            ..CachedPod::default()
        }
    }

    #[test]
    fn a_pod_starts_normally_until_it_waits_on_something() {
        assert!(starting_normally(&pod("Pending", None)));
        assert!(starting_normally(&waiting_pod("ContainerCreating")));
        assert!(starting_normally(&waiting_pod("PodInitializing")));
        assert!(!starting_normally(&waiting_pod("ImagePullBackOff")));
        assert!(!starting_normally(&waiting_pod(
            "CreateContainerConfigError"
        )));
        let mut unschedulable = pod("Pending", None);
        unschedulable.status.as_mut().unwrap().conditions = Some(vec![condition(
            "PodScheduled",
            "False",
            Some("Unschedulable"),
            1,
        )]);
        assert!(!starting_normally(&unschedulable));
    }

    #[test]
    fn a_runner_has_not_started_while_its_pod_is_pending_and_its_container_waits() {
        assert!(runner_not_started(&pod("Pending", None)));
        assert!(runner_not_started(&waiting_pod("ContainerCreating")));
        assert!(!runner_not_started(&pod("Pending", Some(None))), "running");
        assert!(!runner_not_started(&pod("Running", None)));
        assert!(!runner_not_started(&pod("Running", Some(Some(0)))));
    }

    #[test]
    fn the_state_table() {
        assert_eq!(judge_pod(&pod("Pending", None)), PodVerdict::Wait);
        assert!(matches!(
            judge_pod(&pod("Running", Some(None))),
            PodVerdict::Progress { ref phase, ready: false, .. } if phase == "Running"
        ));
        assert_eq!(
            judge_pod(&pod("Running", Some(Some(0)))),
            PodVerdict::Succeeded
        );
        assert_eq!(
            judge_pod(&pod("Succeeded", Some(Some(0)))),
            PodVerdict::Succeeded
        );
        // A failed sidecar fails the pod, but the runner itself succeeded.
        assert_eq!(
            judge_pod(&pod("Failed", Some(Some(0)))),
            PodVerdict::Succeeded
        );
        assert_eq!(
            judge_pod(&pod("Failed", Some(Some(7)))),
            PodVerdict::Outdated
        );
        assert_eq!(
            judge_pod(&pod("Running", Some(Some(7)))),
            PodVerdict::Outdated
        );
        let PodVerdict::Failed(failure) = judge_pod(&pod("Running", Some(Some(2)))) else {
            panic!("expected a failure");
        };
        assert!(failure.counted);
        assert_eq!(failure.class, "runner_exit");
        assert!(failure.message.contains("code 2"), "{}", failure.message);
        let PodVerdict::Failed(failure) = judge_pod(&pod("Failed", None)) else {
            panic!("expected a failure");
        };
        assert_eq!((failure.counted, failure.class), (true, "pod_failed"));
    }

    #[test]
    fn failed_init_containers_count() {
        let mut pod = pod("Pending", None);
        pod.status.as_mut().unwrap().init_container_statuses =
            Some(vec![container("setup", Some(1))]);
        let PodVerdict::Failed(failure) = judge_pod(&pod) else {
            panic!("expected a failure");
        };
        assert_eq!((failure.counted, failure.class), (true, "init_container"));
        assert!(failure.message.contains("setup"));
    }

    #[test]
    fn disruptions_are_not_counted() {
        for (reason, class) in [
            ("Evicted", "evicted"),
            ("Preempting", "preempted"),
            ("NodeLost", "node_lost"),
            ("OutOfcpu", "node_rejected"),
            ("UnexpectedAdmissionError", "node_rejected"),
        ] {
            let mut pod = pod("Failed", Some(Some(137)));
            pod.status.as_mut().unwrap().reason = Some(reason.to_owned());
            pod.status.as_mut().unwrap().message = Some("node pressure".to_owned());
            let PodVerdict::Failed(failure) = judge_pod(&pod) else {
                panic!("expected a failure for {reason}");
            };
            assert!(!failure.counted, "{reason}");
            assert_eq!(failure.class, class);
            assert_eq!(failure.reason, reason);
            assert_eq!(failure.message, "node pressure");
        }
        let mut pod = pod("Failed", None);
        pod.status.as_mut().unwrap().conditions = Some(vec![condition(
            "DisruptionTarget",
            "True",
            Some("PreemptionByScheduler"),
            1,
        )]);
        assert_eq!(disruption_class(&pod), Some("preempted"));
        let PodVerdict::Failed(failure) = judge_pod(&pod) else {
            panic!("expected a failure");
        };
        assert!(!failure.counted);
    }

    #[test]
    fn arc_backoff_schedule() {
        let base = Duration::from_secs(5);
        let delays: Vec<u64> = (0..=5).map(|n| failure_delay(n, base).as_secs()).collect();
        assert_eq!(delays, [0, 5, 10, 20, 40, 80]);
        assert!(!retries_exhausted(5, 5));
        assert!(retries_exhausted(6, 5));
    }

    #[test]
    fn remaining_backoff_counts_from_the_latest_failure() {
        let base = Duration::from_secs(5);
        let at = |s| Time(Timestamp::from_second(s).unwrap());
        let failures: BTreeMap<String, Time> =
            [("a".to_owned(), at(100)), ("b".to_owned(), at(110))].into();
        // Two failures: 10 s from the latest (110).
        let now = Timestamp::from_second(113).unwrap();
        assert_eq!(
            remaining_failure_backoff(&failures, base, now),
            Some(Duration::from_secs(7))
        );
        let now = Timestamp::from_second(120).unwrap();
        assert_eq!(remaining_failure_backoff(&failures, base, now), None);
        assert_eq!(remaining_failure_backoff(&BTreeMap::new(), base, now), None);
    }

    #[test]
    fn create_errors() {
        let api = |code: u16, reason: &str, message: &str| {
            kube::Error::Api(
                kube::core::Status::failure(message, reason)
                    .with_code(code)
                    .boxed(),
            )
        };
        assert_eq!(
            classify_create_error(&api(409, "AlreadyExists", "x")),
            CreateRejection::AlreadyExists
        );
        assert_eq!(
            classify_create_error(&api(422, "Invalid", "bad")),
            CreateRejection::Invalid("bad".into())
        );
        assert!(matches!(
            classify_create_error(&api(
                403,
                "Forbidden",
                "pods \"x\" is forbidden: exceeded quota: q"
            )),
            CreateRejection::Quota(_)
        ));
        assert!(matches!(
            classify_create_error(&api(403, "Forbidden", "denied by webhook")),
            CreateRejection::Forbidden(_)
        ));
        assert_eq!(
            classify_create_error(&api(500, "InternalError", "x")),
            CreateRejection::Other
        );
    }

    proptest! {
        #[test]
        fn backoff_is_monotonic_and_never_panics(n in 0usize..10_000, base_ms in 0u64..100_000) {
            let base = Duration::from_millis(base_ms);
            prop_assert!(failure_delay(n, base) <= failure_delay(n + 1, base));
            prop_assert!(disruption_delay(u32::try_from(n).unwrap_or(u32::MAX), Duration::from_secs(60)) <= Duration::from_secs(60));
        }

        #[test]
        fn exit_codes_decide(code in any::<i32>(), phase in prop_oneof!["Running", "Failed", "Succeeded"]) {
            let verdict = judge_pod(&pod(&phase, Some(Some(code))));
            match code {
                0 => prop_assert_eq!(verdict, PodVerdict::Succeeded),
                7 => prop_assert_eq!(verdict, PodVerdict::Outdated),
                _ => {
                    let counted = matches!(verdict, PodVerdict::Failed(PodFailure { counted: true, .. }));
                    prop_assert!(counted);
                }
            }
        }
    }
}
