//! A runner pass's observation (observe → decide → execute): what the caches and the runner's memory record say,
//! as the [`Facts`] [`super::lifecycle::decide`] takes, and which lane a runner belongs to. Reads only; no request.

use std::sync::Arc;
use std::time::Duration;

use crds::constants::{
    EPHEMERAL_RUNNER_FINALIZER, EPHEMERAL_RUNNER_REGISTRATION_FINALIZER, INTEGRITY_HASH_ANNOTATION,
    reason,
};
use crds::{EphemeralRunner, EphemeralRunnerSet};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::facts::in_teardown;
use super::lifecycle::{Facts, PodFact, RunnerFact, SecretFact};
use super::memory::{RunnerMemory, Snapshot};
use super::policy::{PodVerdict, disruption_delay, judge_pod, remaining_failure_backoff};
use crate::context::Stores;
use crate::hash::runner_spec_hash;
use crate::options::RunnerPolicy;
use crate::pods::CachedPod;

/// How long past its deletion deadline a pod may stay before its runner gives up the place: the kubelet stops the
/// containers by the deadline and then reports; a pod still there this long after has no kubelet looking after it
/// (a lost node), and the set needs the capacity elsewhere.
pub const STUCK_TERMINATING_SLACK: Duration = Duration::from_secs(30);

/// The runner's pod as the watch cache shows it now.
fn cached_pod(runner: &EphemeralRunner, stores: &Stores) -> Option<std::sync::Arc<CachedPod>> {
    let (name, namespace) = (runner.meta().name.as_deref()?, runner.namespace()?);
    stores.pods.get(&ObjectRef::new(name).within(&namespace))
}

/// Which lane's runner this is as the caches show it now: the teardown lane's ([`in_teardown`], or a teardown this
/// process started), else the main lane's. Each lane asks before it waits for the runner's turn
/// ([`super::passes::PassLocks`]): both lanes hear every runner's and pod's events, and a pass that would only
/// find the runner is not its own must not queue behind the other lane's pass (in a burst, the teardown lane's
/// workers then sat waiting for runners still being created while finished runners waited for a worker).
/// Each pass checks again once it holds the turn.
pub fn teardown_lane(runner: &EphemeralRunner, stores: &Stores, memory: &RunnerMemory) -> bool {
    if runner.meta().name.is_none() || runner.namespace().is_none() {
        return false;
    }
    let pod = cached_pod(runner, stores);
    in_teardown(runner, pod.as_deref()) || memory.is_tearing_down(&runner.uid().unwrap_or_default())
}

/// What the pod in hand says, for [`super::lifecycle::decide`].
pub fn pod_fact(pod: Option<&CachedPod>, now: Timestamp) -> PodFact {
    let Some(pod) = pod else {
        return PodFact::Gone;
    };
    let verdict = judge_pod(pod);
    match &pod.meta().deletion_timestamp {
        None => PodFact::Live(verdict),
        Some(deadline) => PodFact::Terminating {
            verdict,
            past_deadline: Duration::try_from(now.duration_since(deadline.0))
                .is_ok_and(|past| past > STUCK_TERMINATING_SLACK),
        },
    }
}

/// How long from `now` until terminating pod `pod` counts as stuck ([`pod_fact`]'s `past_deadline`), and a second
/// more: a runner waiting for its deleted pod to go comes back then, if the pod's deletion event did not bring it
/// back before.
pub fn until_stuck(pod: Option<&CachedPod>, now: Timestamp) -> Duration {
    let until_deadline = pod
        .and_then(|pod| pod.meta().deletion_timestamp.as_ref())
        .and_then(|deadline| Duration::try_from(deadline.0.duration_since(now)).ok())
        .unwrap_or(Duration::ZERO);
    until_deadline + STUCK_TERMINATING_SLACK + Duration::from_secs(1)
}

/// What the cached runner and its cached pod say, with the runner's memory record (`memory`), before anything is
/// read from the API server. `outdated_template` is asked only for a runner about to register (hashing the
/// template is not free).
pub fn facts(
    runner: &EphemeralRunner,
    pod: Option<&CachedPod>,
    memory: &Snapshot,
    policy: &RunnerPolicy,
    outdated_template: impl FnOnce() -> bool,
) -> Facts {
    let none = crds::EphemeralRunnerStatus::default();
    let status = runner.status.as_ref().unwrap_or(&none);
    let finalizers = runner.finalizers();
    let has = |finalizer: &str| finalizers.iter().any(|have| have == finalizer);
    Facts {
        deleting: runner.meta().deletion_timestamp.is_some(),
        done: runner.is_done(),
        finalizers_missing: !has(EPHEMERAL_RUNNER_FINALIZER)
            || !has(EPHEMERAL_RUNNER_REGISTRATION_FINALIZER),
        failures: status.failures.len(),
        max_failures: policy.max_pod_failures,
        has_job: status.has_job(),
        service_busy: false,
        registered: status.runner_id != 0,
        backoff: pod_backoff(status, memory.last_disruption, policy),
        // A refusal recorded in the status, or a creation that failed in this process: either way the next
        // registration waits for a dry run the cluster admits.
        rejected: status.reason == reason::POD_CREATION_REJECTED || memory.pod_creation_failed,
        dry_run_passed: false,
        pod: match pod {
            None => PodFact::NotCached,
            Some(pod) => pod_fact(Some(pod), Timestamp::now()),
        },
        secret: SecretFact::Unread,
        fresh_runner: RunnerFact::Unread,
        outdated_template: pod.is_none() && outdated_template(),
        first_attempt: status.phase.is_empty()
            && status.reason.is_empty()
            && status.runner_id == 0
            && status.failures.is_empty()
            && memory.last_disruption.is_none()
            && !memory.knows_pod_identity
            && !memory.pod_creation_failed,
    }
}

/// How long to wait before creating the next pod, after counted failures (the status's) or disruptions (the
/// count and time of the last, from the runner's memory).
pub fn pod_backoff(
    status: &crds::EphemeralRunnerStatus,
    last_disruption: Option<(u32, std::time::Instant)>,
    policy: &RunnerPolicy,
) -> Option<Duration> {
    let after_failures = remaining_failure_backoff(
        &status.failures,
        policy.failure_backoff_base,
        Timestamp::now(),
    );
    let after_disruptions = last_disruption
        .and_then(|(count, at)| {
            disruption_delay(count, policy.disruption_backoff_max).checked_sub(at.elapsed())
        })
        .filter(|left| !left.is_zero());
    after_failures.max(after_disruptions)
}

/// Whether the runner's set, as cached, has a newer template than the one the runner was made from (each
/// runner records it in `actions.github.com/integrity-hash`; one without the record is taken as current).
pub fn template_outdated(runner: &EphemeralRunner, stores: &Stores) -> bool {
    let Some(made_from) = runner.annotations().get(INTEGRITY_HASH_ANNOTATION) else {
        return false;
    };
    owner_set(runner, stores)
        .and_then(|set| runner_spec_hash(&set.spec.ephemeral_runner_spec).ok())
        .is_some_and(|current| current != *made_from)
}

/// The runner's own set (its controller owner, the same uid) as cached, if it is there.
pub fn owner_set(runner: &EphemeralRunner, stores: &Stores) -> Option<Arc<EphemeralRunnerSet>> {
    let owner = runner.owner_references().iter().find(|owner| {
        owner.controller == Some(true) && owner.kind == EphemeralRunnerSet::kind(&())
    })?;
    stores
        .runner_sets
        .get(&ObjectRef::new(&owner.name).within(&runner.namespace().unwrap_or_default()))
        .filter(|set| set.uid().as_deref() == Some(owner.uid.as_str()))
}

/// Whether the runner's end came while a pass ran: the teardown lane finalized it, or the caches now show it
/// deleted or its pod finished. A pass whose writes waited behind a burst's creations (the main lane's client
/// rate limit) then has nothing left to mirror: its write would reach a runner on its way out, or one already
/// gone (answered 404; 0.43 status writes per job in a 500-job burst, docs/benchmarks.md).
pub fn ended_meanwhile(runner: &EphemeralRunner, stores: &Stores, memory: &RunnerMemory) -> bool {
    let uid = runner.uid().unwrap_or_default();
    if memory.is_tearing_down(&uid) {
        return true;
    }
    let (Some(name), Some(namespace)) = (runner.meta().name.as_deref(), runner.namespace()) else {
        return true;
    };
    let runner_going = stores
        .runners
        .get(&ObjectRef::new(name).within(&namespace))
        .is_none_or(|cached| {
            cached.uid().as_deref() != Some(uid.as_str())
                || cached.meta().deletion_timestamp.is_some()
        });
    let pod_ended = cached_pod(runner, stores).is_some_and(|pod| {
        pod.meta().deletion_timestamp.is_some() || judge_pod(&pod) == PodVerdict::Succeeded
    });
    runner_going || pod_ended
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn a_runner_waiting_for_its_deleted_pod_comes_back_once_the_pod_counts_as_stuck() {
        let now = Timestamp::from_second(1_000).unwrap();
        let terminating = |deadline: i64| -> CachedPod {
            let mut pod = CachedPod::default();
            pod.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(deadline).unwrap()));
            pod
        };
        let slack = STUCK_TERMINATING_SLACK + Duration::from_secs(1);
        assert_eq!(
            until_stuck(Some(&terminating(1_030)), now),
            Duration::from_secs(30) + slack
        );
        // Past its deadline already, or not terminating at all: the slack alone.
        assert_eq!(until_stuck(Some(&terminating(900)), now), slack);
        assert_eq!(until_stuck(None, now), slack);
        // Whatever the deadline, the pod's fact turns past deadline by then.
        let pod = terminating(1_030);
        let then =
            Timestamp::from_second(1_000 + until_stuck(Some(&pod), now).as_secs() as i64).unwrap();
        assert!(matches!(
            pod_fact(Some(&pod), then),
            PodFact::Terminating {
                past_deadline: true,
                ..
            }
        ));
    }
}
