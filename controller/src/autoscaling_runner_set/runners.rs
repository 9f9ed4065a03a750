//! Runners of a set that cannot start, as pure functions of the cached EphemeralRunners and their pods, and the
//! trigger that brings the set's controller back when a runner becomes blocked or stops being blocked.
//!
//! A job assigned to the set waits for a runner; a runner whose pod is refused, cannot be built, cannot be
//! scheduled, cannot pull its image or keeps failing never takes it. Each such runner says so on its own object
//! or pod; the set gathers them into one condition, so `Ready` is not True while jobs cannot start.
//!
//! Facts come first: what the API server, the scheduler (`PodScheduled=False`, reason `Unschedulable`) or the
//! kubelet wrote. One rule goes by the clock, for a pod that stays `Pending` with no such fact (no scheduler
//! serves its `schedulerName`, a volume that never mounts, an init container that never ends):
//! [`PENDING_TOO_LONG`] after its creation it counts too.
//!
//! [`PENDING_TOO_LONG`]: crate::options::PENDING_TOO_LONG

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crds::constants::{phase, reason};
use crds::{AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet};
use futures::{Stream, StreamExt, future, stream};
use k8s_openapi::api::core::v1::{ContainerStatus, PodCondition};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use super::conditions::Finding;
use crate::pods::CachedPod;

/// Container waiting reasons of an image that cannot be pulled.
const IMAGE_PULL_REASONS: [&str; 4] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
];
/// Container waiting reasons of a container the kubelet cannot create from its spec (a missing Secret or
/// ConfigMap key, a bad command).
const CONTAINER_CONFIG_REASONS: [&str; 2] = ["CreateContainerConfigError", "CreateContainerError"];
/// Counted pod failures from which a runner that is not running counts as unable to start: one failure can be a
/// fluke, a second in a row is a pattern (the runner is replaced after `--runner-max-pod-failures`, and its
/// replacement starts counting again, so a set whose pods always fail keeps showing runners here).
pub const REPEATED_FAILURES: usize = 2;
/// The scheduler's reason for a pod that no node fits (`PodScheduled=False`).
const UNSCHEDULABLE: &str = "Unschedulable";

/// Why one runner cannot start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blockage {
    /// Reason word, the condition's reason when this runner is the first.
    pub reason: &'static str,
    /// What the runner or its pod says.
    pub message: String,
}

impl Blockage {
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// What the runner's own status says (without its pod).
pub fn runner_blockage(runner: &EphemeralRunner) -> Option<Blockage> {
    let status = runner.status.as_ref()?;
    if status.reason == reason::POD_CREATION_REJECTED {
        return Some(Blockage::new(
            reason::POD_CREATION_REJECTED,
            status.message.clone(),
        ));
    }
    if status.phase == phase::FAILED && status.reason == reason::INVALID_POD {
        return Some(Blockage::new(reason::INVALID_POD, status.message.clone()));
    }
    if status.failures.len() >= REPEATED_FAILURES && !status.ready {
        let last = [status.reason.as_str(), status.message.as_str()]
            .into_iter()
            .filter(|part| !part.is_empty())
            .collect::<Vec<_>>()
            .join(": ");
        let last = if last.is_empty() {
            String::new()
        } else {
            format!(" (last: {last})")
        };
        return Some(Blockage::new(
            "RunnerPodsFailing",
            format!("its pod failed {} times{last}", status.failures.len()),
        ));
    }
    None
}

fn waiting(status: &ContainerStatus) -> Option<(&str, &str)> {
    let waiting = status.state.as_ref()?.waiting.as_ref()?;
    Some((
        waiting.reason.as_deref().unwrap_or_default(),
        waiting.message.as_deref().unwrap_or_default(),
    ))
}

fn is_pending(pod: &CachedPod) -> bool {
    pod.status
        .as_ref()
        .is_some_and(|status| status.phase.as_deref().is_none_or(|p| p == "Pending"))
}

fn pod_scheduled(pod: &CachedPod) -> Option<&PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|condition| condition.type_ == "PodScheduled")
}

/// What the runner's pod says at `now`: the scheduler finds no node for it, the kubelet cannot start a
/// container, or (by the clock) it has stayed `Pending` for longer than `limit`
/// ([`crate::options::PENDING_TOO_LONG`] by default).
pub fn pod_blockage(pod: &CachedPod, now: Timestamp, limit: Duration) -> Option<Blockage> {
    let status = pod.status.as_ref()?;
    if !is_pending(pod) {
        return None;
    }
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for container in containers.clone() {
        let Some((reason, message)) = waiting(container) else {
            continue;
        };
        if IMAGE_PULL_REASONS.contains(&reason) {
            // The image, not the kubelet's message: that alternates between the pull error and the back-off,
            // and the set's condition should not change with it.
            return Some(Blockage::new(
                "ImagePullFailed",
                format!(
                    "container {} cannot pull its image {:?}",
                    container.name, container.image
                ),
            ));
        }
        if CONTAINER_CONFIG_REASONS.contains(&reason) {
            return Some(Blockage::new(
                "ContainerConfigInvalid",
                format!("container {}: {reason}: {message}", container.name),
            ));
        }
    }
    let scheduled = pod_scheduled(pod);
    let node = pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref());
    if node.is_none()
        && let Some(verdict) =
            scheduled.filter(|c| c.status == "False" && c.reason.as_deref() == Some(UNSCHEDULABLE))
    {
        // The scheduler's own words (which nodes it tried and why none fits). They change only when the
        // cluster does (nodes come or go), not on each of its retries.
        return Some(Blockage::new(
            "PodUnschedulable",
            format!(
                "the scheduler finds no node for its pod: {}",
                verdict.message.as_deref().unwrap_or("no reason given")
            ),
        ));
    }
    let created = pod.metadata.creation_timestamp.as_ref()?.0;
    let overdue = created
        .checked_add(SignedDuration::try_from(limit).ok()?)
        .is_ok_and(|deadline| now >= deadline);
    if !overdue {
        return None;
    }
    let detail = match node {
        None => match scheduled {
            Some(condition) => format!(
                "not scheduled ({}{})",
                condition
                    .reason
                    .as_deref()
                    .unwrap_or(condition.status.as_str()),
                condition
                    .message
                    .as_deref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            ),
            None => format!(
                "no scheduler has looked at it (schedulerName {})",
                pod.spec
                    .as_ref()
                    .and_then(|spec| spec.scheduler_name.as_deref())
                    .unwrap_or("default-scheduler")
            ),
        },
        Some(node) => match containers.filter_map(|c| Some((c, waiting(c)?))).next() {
            Some((container, (reason, _))) => {
                format!(
                    "on node {node}, container {} waits ({reason})",
                    container.name
                )
            }
            None => format!("on node {node}, its containers have not started"),
        },
    };
    Some(Blockage::new(
        "PodPendingTooLong",
        format!("its pod has been Pending since {created}: {detail}"),
    ))
}

/// How long until `pod`, `Pending` and not blocked by anything else, counts as blocked by the clock alone
/// ([`pod_blockage`]'s `limit`). Nothing announces that moment, so the set's next pass is due then; `None` when
/// the pod is not pending, is already blocked, or has no creation time.
pub fn pending_deadline(pod: &CachedPod, now: Timestamp, limit: Duration) -> Option<Duration> {
    if !is_pending(pod) || pod_blockage(pod, now, limit).is_some() {
        return None;
    }
    let deadline = pod
        .metadata
        .creation_timestamp
        .as_ref()?
        .0
        .checked_add(SignedDuration::try_from(limit).ok()?)
        .ok()?;
    Duration::try_from(deadline.duration_since(now)).ok()
}

/// Why a runner cannot start, from the runner and its pod, now (`limit`: see [`pod_blockage`]).
pub fn blockage(
    runner: &EphemeralRunner,
    pod: Option<&CachedPod>,
    limit: Duration,
) -> Option<Blockage> {
    blockage_at(runner, pod, Timestamp::now(), limit)
}

/// Why a runner cannot start, from the runner and its pod, at `now`.
pub fn blockage_at(
    runner: &EphemeralRunner,
    pod: Option<&CachedPod>,
    now: Timestamp,
    limit: Duration,
) -> Option<Blockage> {
    runner_blockage(runner).or_else(|| pod.and_then(|pod| pod_blockage(pod, now, limit)))
}

/// What to do about the first blocked runner's reason.
fn hint(reason: &str) -> &'static str {
    match reason {
        "PodCreationRejected" => {
            "a quota or an admission policy refuses the runner pods; the controller retries every 30 s"
        }
        "InvalidPod" => "fix the runner pod template (spec.template) of the AutoscalingRunnerSet",
        "ImagePullFailed" => {
            "fix the image name, the registry credentials (imagePullSecrets in spec.template) or the registry access"
        }
        "ContainerConfigInvalid" => {
            "create the Secret or ConfigMap the runner container refers to, or fix spec.template"
        }
        "PodUnschedulable" => {
            "fix the nodeSelector, affinity, tolerations or resource requests in spec.template, or add nodes that \
             fit (with a cluster autoscaler, this clears once its new node is up)"
        }
        "PodPendingTooLong" => {
            "kubectl describe pod: check that the scheduler named by schedulerName runs, and the pod's Events \
             (volumes that cannot be mounted, init containers that do not finish)"
        }
        _ => {
            "read the runner pod's log (kubectl logs); a runner is replaced after --runner-max-pod-failures failures"
        }
    }
}

/// The set's verdict on its runners: `blocked` holds each runner that cannot start (name and why), `total` the
/// runners looked at.
pub fn runners_finding(blocked: &[(String, Blockage)], total: usize) -> Result<String, Finding> {
    let Some((first, why)) = blocked.iter().min_by(|a, b| a.0.cmp(&b.0)) else {
        // The same text whatever the count: runners coming and going must not rewrite the set's status.
        return Ok("no runner is blocked from starting".to_owned());
    };
    Err(Finding::new(
        why.reason,
        format!(
            "{} of {total} runner(s) cannot start; the first, {first}: {}: {}. {}",
            blocked.len(),
            why.reason,
            why.message,
            hint(why.reason)
        ),
    ))
}

/// The AutoscalingRunnerSet a runner belongs to: its EphemeralRunnerSet has the set's name.
pub fn runner_set_of_runner(runner: &EphemeralRunner) -> Option<ObjectRef<AutoscalingRunnerSet>> {
    let owner = runner.owner_references().iter().find(|owner| {
        owner.controller == Some(true) && owner.kind == EphemeralRunnerSet::kind(&())
    })?;
    Some(ObjectRef::new(&owner.name).within(&runner.namespace()?))
}

/// Sets to look at again because one of their runners (or its pod) became blocked or stopped being blocked.
/// Only those changes pass; the blocked objects are remembered (a bounded number: entries of runners gone from
/// the cache are dropped once the memory grows).
///
/// A pod that becomes blocked by the clock alone ([`crate::options::PENDING_TOO_LONG`]) brings no event: the set's pass
/// requeues itself for that moment ([`pending_deadline`]), so a pod first seen `Pending` brings its set back once,
/// for a pass that sees it. Pods still `Pending` are remembered too, so that one leaving `Pending` after that time
/// brings its set back at once (it may show the pod as blocked).
pub fn blockage_changes(
    runners: impl Stream<Item = Arc<EphemeralRunner>> + Send + 'static,
    pods: impl Stream<Item = Arc<CachedPod>> + Send + 'static,
    runner_store: Store<EphemeralRunner>,
    limit: Duration,
) -> impl Stream<Item = ObjectRef<AutoscalingRunnerSet>> + Send + 'static {
    blockage_changes_by(runners, pods, runner_store, Timestamp::now, limit)
}

/// [`blockage_changes`] with the time from `clock`.
fn blockage_changes_by(
    runners: impl Stream<Item = Arc<EphemeralRunner>> + Send + 'static,
    pods: impl Stream<Item = Arc<CachedPod>> + Send + 'static,
    runner_store: Store<EphemeralRunner>,
    clock: impl Fn() -> Timestamp + Send + 'static,
    limit: Duration,
) -> impl Stream<Item = ObjectRef<AutoscalingRunnerSet>> + Send + 'static {
    enum Seen {
        Runner(Arc<EphemeralRunner>),
        Pod(Arc<CachedPod>),
    }
    #[derive(Default)]
    struct Memory {
        /// Runners (`false`) and pods (`true`) that are blocked.
        blocked: HashSet<(bool, String, String)>,
        /// Pods `Pending` without a known cause.
        pending: HashSet<(String, String)>,
    }
    const PRUNE_ABOVE: usize = 1024;
    let memory: Arc<Mutex<Memory>> = Arc::default();
    stream::select(runners.map(Seen::Runner), pods.map(Seen::Pod)).filter_map(move |seen| {
        let now = clock();
        let (namespace, name, now_blocked) = match &seen {
            Seen::Runner(runner) => (
                runner.namespace().unwrap_or_default(),
                runner.name_any(),
                runner_blockage(runner).is_some(),
            ),
            // A runner's pod has the runner's name.
            Seen::Pod(pod) => (
                pod.namespace().unwrap_or_default(),
                pod.name_any(),
                pod_blockage(pod, now, limit).is_some(),
            ),
        };
        let changed = {
            let mut memory = memory.lock().unwrap_or_else(PoisonError::into_inner);
            let key = (
                matches!(seen, Seen::Pod(_)),
                namespace.clone(),
                name.clone(),
            );
            let mut changed = if now_blocked {
                memory.blocked.insert(key)
            } else {
                memory.blocked.remove(&key)
            };
            if let Seen::Pod(pod) = &seen {
                let key = (namespace.clone(), name.clone());
                if is_pending(pod) && !now_blocked {
                    // A pod first seen `Pending`: the set's pass schedules its look at the pod's deadline, which
                    // only a pass that sees the pod can (the pass the runner's creation brought may have come
                    // before the pod reached the cache).
                    changed |= memory.pending.insert(key);
                } else if memory.pending.remove(&key) && !now_blocked {
                    // It left `Pending`; past the limit, the set may have counted it by the clock.
                    changed |= pod
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .and_then(|created| {
                            created
                                .0
                                .checked_add(SignedDuration::try_from(limit).ok()?)
                                .ok()
                        })
                        .is_some_and(|deadline| now >= deadline);
                }
            }
            if memory.blocked.len() + memory.pending.len() > PRUNE_ABOVE {
                let known = |ns: &str, name: &str| {
                    runner_store.get(&ObjectRef::new(name).within(ns)).is_some()
                };
                memory.blocked.retain(|(_, ns, name)| known(ns, name));
                memory.pending.retain(|(ns, name)| known(ns, name));
            }
            changed
        };
        let set = match &seen {
            Seen::Runner(runner) if changed => runner_set_of_runner(runner),
            Seen::Pod(_) if changed => runner_store
                .get(&ObjectRef::new(&name).within(&namespace))
                .and_then(|runner| runner_set_of_runner(&runner)),
            _ => None,
        };
        future::ready(set)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::PENDING_TOO_LONG;
    use crds::{EphemeralRunnerSpec, EphemeralRunnerStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use k8s_openapi::jiff::Timestamp;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn runner(name: &str, status: EphemeralRunnerStatus) -> EphemeralRunner {
        let mut runner = EphemeralRunner::new(name, EphemeralRunnerSpec::default());
        runner.metadata.namespace = Some("ns".into());
        runner.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "actions.github.com/v1alpha1".into(),
            kind: "EphemeralRunnerSet".into(),
            name: "set".into(),
            uid: "u".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        runner.status = Some(status);
        runner
    }

    fn pod(name: &str, status: serde_json::Value) -> CachedPod {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "ns"}, "status": status}),
        )
        .unwrap()
    }

    /// Pods of these tests are created at 0; "now" is a minute later.
    fn created(mut pod: CachedPod) -> CachedPod {
        pod.metadata.creation_timestamp = Some(Time(Timestamp::from_second(0).unwrap()));
        pod
    }

    fn minutes(m: i64) -> Timestamp {
        Timestamp::from_second(m * 60).unwrap()
    }

    fn pod_blockage_now(pod: &CachedPod) -> Option<Blockage> {
        pod_blockage(&created(pod.clone()), minutes(1), PENDING_TOO_LONG)
    }

    fn waiting_pod(name: &str, reason: &str, message: &str) -> CachedPod {
        pod(
            name,
            json!({"phase": "Pending", "containerStatuses": [{
                "name": "runner", "image": "ghcr.io/x/runner:nope", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}},
            }]}),
        )
    }

    #[test]
    fn runner_states_that_block() {
        let rejected = runner(
            "a",
            EphemeralRunnerStatus {
                reason: reason::POD_CREATION_REJECTED.into(),
                message: "Failed to create the pod: exceeded quota".into(),
                ..Default::default()
            },
        );
        assert_eq!(
            runner_blockage(&rejected).unwrap().reason,
            "PodCreationRejected"
        );
        let invalid = runner(
            "b",
            EphemeralRunnerStatus {
                phase: "Failed".into(),
                reason: "InvalidPod".into(),
                message: "no container named runner".into(),
                ..Default::default()
            },
        );
        assert_eq!(runner_blockage(&invalid).unwrap().reason, "InvalidPod");
        let failures = |n: usize, ready: bool| EphemeralRunnerStatus {
            ready,
            reason: "RunnerExited".into(),
            message: "exit 1".into(),
            failures: (0..n)
                .map(|i| (format!("pod-{i}"), Time(Timestamp::now())))
                .collect(),
            ..Default::default()
        };
        assert_eq!(runner_blockage(&runner("c", failures(1, false))), None);
        let failing = runner_blockage(&runner("c", failures(2, false))).unwrap();
        assert_eq!(failing.reason, "RunnerPodsFailing");
        assert!(
            failing
                .message
                .contains("failed 2 times (last: RunnerExited: exit 1)"),
            "{}",
            failing.message
        );
        assert_eq!(
            runner_blockage(&runner("c", failures(3, true))),
            None,
            "running now"
        );
        assert_eq!(
            runner_blockage(&runner("d", EphemeralRunnerStatus::default())),
            None
        );
    }

    #[test]
    fn pods_that_cannot_start_their_containers() {
        let pull = pod_blockage_now(&waiting_pod(
            "a",
            "ImagePullBackOff",
            "Back-off pulling image",
        ))
        .unwrap();
        assert_eq!(pull.reason, "ImagePullFailed");
        let err =
            pod_blockage_now(&waiting_pod("a", "ErrImagePull", "rpc error: not found")).unwrap();
        assert_eq!(pull, err, "the alternating kubelet reasons say the same");
        assert!(
            pull.message.contains("ghcr.io/x/runner:nope"),
            "{}",
            pull.message
        );
        let config = pod_blockage_now(&waiting_pod(
            "a",
            "CreateContainerConfigError",
            "secret \"s\" not found",
        ))
        .unwrap();
        assert_eq!(config.reason, "ContainerConfigInvalid");
        assert!(config.message.contains("secret \"s\" not found"));
        assert_eq!(
            pod_blockage_now(&waiting_pod("a", "ContainerCreating", "")),
            None
        );
        let init = pod(
            "a",
            json!({"phase": "Pending", "initContainerStatuses": [{
                "name": "init", "image": "busybox:nope", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ErrImageNeverPull"}},
            }]}),
        );
        assert_eq!(pod_blockage_now(&init).unwrap().reason, "ImagePullFailed");
        assert_eq!(
            pod_blockage_now(&pod("a", json!({"phase": "Running"}))),
            None
        );
        // The runner's own status comes first.
        let rejected = runner(
            "a",
            EphemeralRunnerStatus {
                reason: reason::POD_CREATION_REJECTED.into(),
                ..Default::default()
            },
        );
        let pulled = waiting_pod("a", "ErrImagePull", "");
        assert_eq!(
            blockage_at(&rejected, Some(&pulled), minutes(1), PENDING_TOO_LONG)
                .unwrap()
                .reason,
            "PodCreationRejected"
        );
        let fine = runner("a", EphemeralRunnerStatus::default());
        assert_eq!(
            blockage_at(&fine, Some(&pulled), minutes(1), PENDING_TOO_LONG)
                .unwrap()
                .reason,
            "ImagePullFailed"
        );
    }

    fn unscheduled(reason: &str, message: &str) -> CachedPod {
        created(pod(
            "a",
            json!({"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": reason, "message": message,
            }]}),
        ))
    }

    #[test]
    fn the_schedulers_verdict_counts_at_once() {
        let message =
            "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.";
        let blocked = pod_blockage(
            &unscheduled("Unschedulable", message),
            minutes(0),
            PENDING_TOO_LONG,
        )
        .unwrap();
        assert_eq!(blocked.reason, "PodUnschedulable");
        assert!(blocked.message.ends_with(message), "{}", blocked.message);
        // Scheduled now: the old verdict is history.
        let mut bound = unscheduled("Unschedulable", message);
        bound.spec =
            Some(serde_json::from_value(json!({"containers": [], "nodeName": "n1"})).unwrap());
        assert_eq!(pod_blockage(&bound, minutes(1), PENDING_TOO_LONG), None);
        let mut scheduled = unscheduled("", "");
        scheduled
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[0]
            .status = "True".into();
        assert_eq!(pod_blockage(&scheduled, minutes(1), PENDING_TOO_LONG), None);
        // A scheduling gate is someone's deliberate hold: only the clock rule applies to it.
        assert_eq!(
            pod_blockage(
                &unscheduled("SchedulingGated", "gated"),
                minutes(9),
                PENDING_TOO_LONG
            ),
            None
        );
    }

    #[test]
    fn a_pending_pod_is_looked_at_again_when_it_would_count_by_the_clock() {
        let limit = i64::try_from(PENDING_TOO_LONG.as_secs() / 60).unwrap();
        let fresh = created(pod("a", json!({"phase": "Pending"})));
        assert_eq!(
            pending_deadline(&fresh, minutes(1), PENDING_TOO_LONG),
            Some(Duration::from_secs(60 * u64::try_from(limit - 1).unwrap()))
        );
        // At the deadline it counts (by pod_blockage), so there is nothing left to wait for.
        assert_eq!(
            pending_deadline(&fresh, minutes(limit), PENDING_TOO_LONG),
            None
        );
        assert!(pod_blockage(&fresh, minutes(limit), PENDING_TOO_LONG).is_some());
        // Blocked for a known cause already, or running: no clock to watch.
        assert_eq!(
            pending_deadline(
                &unscheduled(UNSCHEDULABLE, "0/1 nodes are available"),
                minutes(1),
                PENDING_TOO_LONG
            ),
            None
        );
        let running = created(pod("a", json!({"phase": "Running"})));
        assert_eq!(
            pending_deadline(&running, minutes(1), PENDING_TOO_LONG),
            None
        );
    }

    #[test]
    fn a_pod_pending_without_a_known_cause_counts_after_the_limit() {
        let limit = i64::try_from(PENDING_TOO_LONG.as_secs() / 60).unwrap();
        let fresh = created(pod("a", json!({"phase": "Pending"})));
        assert_eq!(
            pod_blockage(
                &fresh,
                minutes(limit) - SignedDuration::from_secs(1),
                PENDING_TOO_LONG
            ),
            None
        );
        let late = pod_blockage(&fresh, minutes(limit), PENDING_TOO_LONG).unwrap();
        assert_eq!(late.reason, "PodPendingTooLong");
        assert!(
            late.message
                .contains("no scheduler has looked at it (schedulerName default-scheduler)"),
            "{}",
            late.message
        );
        assert_eq!(
            pod_blockage(&fresh, minutes(limit + 30), PENDING_TOO_LONG),
            Some(late),
            "the message does not change with the clock"
        );
        let gated = pod_blockage(
            &unscheduled("SchedulingGated", "gated"),
            minutes(limit),
            PENDING_TOO_LONG,
        )
        .unwrap();
        assert!(
            gated
                .message
                .contains("not scheduled (SchedulingGated: gated)"),
            "{}",
            gated.message
        );
        let mut mounting = created(pod(
            "a",
            json!({"phase": "Pending", "containerStatuses": [{
                "name": "runner", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}},
            }]}),
        ));
        mounting.spec =
            Some(serde_json::from_value(json!({"containers": [], "nodeName": "n1"})).unwrap());
        let stuck = pod_blockage(&mounting, minutes(limit), PENDING_TOO_LONG).unwrap();
        assert!(
            stuck
                .message
                .contains("on node n1, container runner waits (ContainerCreating)"),
            "{}",
            stuck.message
        );
        // Running or finished pods are not Pending, however old.
        let running = created(pod("a", json!({"phase": "Running"})));
        assert_eq!(
            pod_blockage(&running, minutes(limit * 10), PENDING_TOO_LONG),
            None
        );
    }

    #[test]
    fn the_finding_counts_and_names_the_first_runner() {
        assert_eq!(runners_finding(&[], 0), runners_finding(&[], 3));
        assert_eq!(
            runners_finding(&[], 3).unwrap(),
            "no runner is blocked from starting"
        );
        let blocked = vec![
            (
                "set-runner-b".to_owned(),
                Blockage::new("ImagePullFailed", "container runner cannot pull"),
            ),
            (
                "set-runner-a".to_owned(),
                Blockage::new("PodCreationRejected", "quota"),
            ),
        ];
        let finding = runners_finding(&blocked, 5).unwrap_err();
        assert_eq!(finding.reason, "PodCreationRejected");
        assert!(
            finding.message.starts_with("2 of 5 runner(s) cannot start; the first, set-runner-a: PodCreationRejected: quota."),
            "{}",
            finding.message
        );
    }

    #[tokio::test]
    async fn only_changes_of_blockage_bring_the_set_back() {
        let (store, mut writer) = reflector::store::<EphemeralRunner>();
        let blocked = runner(
            "set-runner-a",
            EphemeralRunnerStatus {
                reason: reason::POD_CREATION_REJECTED.into(),
                ..Default::default()
            },
        );
        let fine = runner("set-runner-a", EphemeralRunnerStatus::default());
        writer.apply_watcher_event(&Event::Apply(fine.clone()));
        let runners = stream::iter([blocked.clone(), blocked, fine.clone(), fine].map(Arc::new));
        let pods = stream::iter(
            [
                waiting_pod("set-runner-a", "ErrImagePull", ""),
                waiting_pod("set-runner-a", "ImagePullBackOff", ""),
                pod("set-runner-a", json!({"phase": "Running"})),
                waiting_pod("unknown-runner", "ErrImagePull", ""),
            ]
            .map(Arc::new),
        );
        let sets: Vec<_> = blockage_changes(runners, pods, store, PENDING_TOO_LONG)
            .collect()
            .await;
        let set = ObjectRef::new("set").within("ns");
        // Runner blocked, runner unblocked, pod blocked, pod unblocked; repeats and an unknown runner's pod do
        // not count.
        assert_eq!(sets, vec![set.clone(), set.clone(), set.clone(), set]);
    }

    #[tokio::test]
    async fn a_pod_leaving_pending_after_the_limit_brings_the_set_back() {
        let (store, mut writer) = reflector::store::<EphemeralRunner>();
        for name in ["set-runner-a", "set-runner-b"] {
            writer.apply_watcher_event(&Event::Apply(runner(
                name,
                EphemeralRunnerStatus::default(),
            )));
        }
        let pod = |name: &str, phase: &str| {
            let mut pod = pod(name, json!({"phase": phase}));
            pod.metadata.creation_timestamp = Some(Time(minutes(0)));
            Arc::new(pod)
        };
        let limit = i64::try_from(PENDING_TOO_LONG.as_secs() / 60).unwrap();
        // Each event at its minute.
        let events = [
            // Pending from minute 0 (young: the set looks once, to schedule its look at the deadline), counted by
            // the clock past the limit (no event then), Running at limit + 5: the set looks again.
            (pod("set-runner-a", "Pending"), 0),
            (pod("set-runner-a", "Pending"), 1),
            (pod("set-runner-a", "Running"), limit + 5),
            (pod("set-runner-a", "Running"), limit + 6),
            // A pod that starts before the limit was never counted: no need to look again.
            (pod("set-runner-b", "Pending"), 0),
            (pod("set-runner-b", "Running"), 1),
        ];
        let times: Vec<Timestamp> = events.iter().map(|(_, m)| minutes(*m)).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let clock = move || times[next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)];
        let pods = stream::iter(events.map(|(pod, _)| pod));
        let sets: Vec<_> =
            blockage_changes_by(stream::empty(), pods, store, clock, PENDING_TOO_LONG)
                .collect()
                .await;
        let set = ObjectRef::new("set").within("ns");
        assert_eq!(sets, vec![set.clone(), set.clone(), set]);
    }
}
