//! Runners of a set that cannot start, as pure functions of the cached EphemeralRunners and their pods, and the
//! trigger that brings the set's controller back when a runner becomes blocked or stops being blocked.
//!
//! A job assigned to the set waits for a runner; a runner whose pod is refused, cannot be built, cannot pull
//! its image or keeps failing never takes it. Each such runner says so on its own object or pod; the set
//! gathers them into one condition, so `Ready` is not True while jobs cannot start.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use crds::constants::{phase, reason};
use crds::{AutoscalingRunnerSet, EphemeralRunner};
use futures::{Stream, StreamExt, future, stream};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use super::conditions::Finding;
use crate::ephemeral_runner::POD_REJECTED_REASON;

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
    if status.reason == POD_REJECTED_REASON {
        return Some(Blockage::new(POD_REJECTED_REASON, status.message.clone()));
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

/// What the runner's pod says: a container the kubelet cannot start.
pub fn pod_blockage(pod: &Pod) -> Option<Blockage> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref().is_some_and(|p| p != "Pending") {
        return None;
    }
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for container in containers {
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
    None
}

/// Why a runner cannot start, from the runner and its pod.
pub fn blockage(runner: &EphemeralRunner, pod: Option<&Pod>) -> Option<Blockage> {
    runner_blockage(runner).or_else(|| pod.and_then(pod_blockage))
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
    let owner = runner
        .owner_references()
        .iter()
        .find(|owner| owner.controller == Some(true) && owner.kind == "EphemeralRunnerSet")?;
    Some(ObjectRef::new(&owner.name).within(&runner.namespace()?))
}

/// Sets to look at again because one of their runners (or its pod) became blocked or stopped being blocked.
/// Only those changes pass; the blocked objects are remembered (a bounded number: entries of runners gone from
/// the cache are dropped once the memory grows).
pub fn blockage_changes(
    runners: impl Stream<Item = Arc<EphemeralRunner>> + Send + 'static,
    pods: impl Stream<Item = Arc<Pod>> + Send + 'static,
    runner_store: Store<EphemeralRunner>,
) -> impl Stream<Item = ObjectRef<AutoscalingRunnerSet>> + Send + 'static {
    enum Seen {
        Runner(Arc<EphemeralRunner>),
        Pod(Arc<Pod>),
    }
    const PRUNE_ABOVE: usize = 1024;
    let blocked: Arc<Mutex<HashSet<(bool, String, String)>>> = Arc::default();
    stream::select(runners.map(Seen::Runner), pods.map(Seen::Pod)).filter_map(move |seen| {
        let (is_pod, namespace, name, now_blocked) = match &seen {
            Seen::Runner(runner) => (
                false,
                runner.namespace().unwrap_or_default(),
                runner.name_any(),
                runner_blockage(runner).is_some(),
            ),
            // A runner's pod has the runner's name.
            Seen::Pod(pod) => (
                true,
                pod.namespace().unwrap_or_default(),
                pod.name_any(),
                pod_blockage(pod).is_some(),
            ),
        };
        let key = (is_pod, namespace.clone(), name.clone());
        let changed = {
            let mut blocked = blocked.lock().unwrap_or_else(PoisonError::into_inner);
            let changed = if now_blocked {
                blocked.insert(key)
            } else {
                blocked.remove(&key)
            };
            if blocked.len() > PRUNE_ABOVE {
                blocked.retain(|(_, ns, name)| {
                    runner_store.get(&ObjectRef::new(name).within(ns)).is_some()
                });
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

    fn pod(name: &str, status: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "ns"}, "status": status}),
        )
        .unwrap()
    }

    fn waiting_pod(name: &str, reason: &str, message: &str) -> Pod {
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
                reason: POD_REJECTED_REASON.into(),
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
        let pull = pod_blockage(&waiting_pod(
            "a",
            "ImagePullBackOff",
            "Back-off pulling image",
        ))
        .unwrap();
        assert_eq!(pull.reason, "ImagePullFailed");
        let err = pod_blockage(&waiting_pod("a", "ErrImagePull", "rpc error: not found")).unwrap();
        assert_eq!(pull, err, "the alternating kubelet reasons say the same");
        assert!(
            pull.message.contains("ghcr.io/x/runner:nope"),
            "{}",
            pull.message
        );
        let config = pod_blockage(&waiting_pod(
            "a",
            "CreateContainerConfigError",
            "secret \"s\" not found",
        ))
        .unwrap();
        assert_eq!(config.reason, "ContainerConfigInvalid");
        assert!(config.message.contains("secret \"s\" not found"));
        assert_eq!(
            pod_blockage(&waiting_pod("a", "ContainerCreating", "")),
            None
        );
        let init = pod(
            "a",
            json!({"phase": "Pending", "initContainerStatuses": [{
                "name": "init", "image": "busybox:nope", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ErrImageNeverPull"}},
            }]}),
        );
        assert_eq!(pod_blockage(&init).unwrap().reason, "ImagePullFailed");
        assert_eq!(pod_blockage(&pod("a", json!({"phase": "Running"}))), None);
        // The runner's own status comes first.
        let rejected = runner(
            "a",
            EphemeralRunnerStatus {
                reason: POD_REJECTED_REASON.into(),
                ..Default::default()
            },
        );
        let pulled = waiting_pod("a", "ErrImagePull", "");
        assert_eq!(
            blockage(&rejected, Some(&pulled)).unwrap().reason,
            "PodCreationRejected"
        );
        let fine = runner("a", EphemeralRunnerStatus::default());
        assert_eq!(
            blockage(&fine, Some(&pulled)).unwrap().reason,
            "ImagePullFailed"
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
                reason: POD_REJECTED_REASON.into(),
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
        let sets: Vec<_> = blockage_changes(runners, pods, store).collect().await;
        let set = ObjectRef::new("set").within("ns");
        // Runner blocked, runner unblocked, pod blocked, pod unblocked; repeats and an unknown runner's pod do
        // not count.
        assert_eq!(sets, vec![set.clone(), set.clone(), set.clone(), set]);
    }
}
