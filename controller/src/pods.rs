//! Facts about a pod, read from its status alone: its conditions, readiness, whether it waits for a node, and
//! what the listener container is doing; and [`CachedPod`], what the manager's cache keeps of a runner pod.
//! Shared by the controllers, which draw their own conclusions.

use crds::constants::LISTENER_CONTAINER_NAME;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use serde::Deserialize;

/// A runner pod as the manager's cache keeps it: its metadata, its status, and of its spec the node and scheduler
/// names (which the scale set's blockage check reports). The rest of the spec is the runner's template again, and
/// `Pod`'s spec alone is 1.4 KiB inline even when empty, so the runner pod watch reads pods into this type: the API
/// server's answer is decoded into these fields and the rest is never allocated. Field names are `Pod`'s, so code
/// reads either the same way.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Resource)]
#[resource(inherit = Pod)]
pub struct CachedPod {
    /// The pod's metadata (the manager's cache drops its labels and annotations but the job metadata).
    pub metadata: ObjectMeta,
    /// What decisions read of the pod's spec.
    #[serde(default)]
    pub spec: Option<CachedPodSpec>,
    /// The pod's status, whole.
    #[serde(default)]
    pub status: Option<PodStatus>,
}

/// What [`CachedPod`] keeps of a pod's spec.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodSpec {
    /// The node the pod was bound to.
    #[serde(default)]
    pub node_name: Option<String>,
    /// The scheduler the pod asked for.
    #[serde(default)]
    pub scheduler_name: Option<String>,
}

impl From<Pod> for CachedPod {
    /// What the watch decodes of `pod`, for a pod read from the API server directly (and for tests).
    fn from(pod: Pod) -> Self {
        Self {
            metadata: pod.metadata,
            spec: pod.spec.map(|spec| CachedPodSpec {
                node_name: spec.node_name,
                scheduler_name: spec.scheduler_name,
            }),
            status: pod.status,
        }
    }
}

/// The pod's conditions (none before the kubelet or scheduler reported any).
pub fn conditions(pod: &CachedPod) -> &[PodCondition] {
    pod.status
        .as_ref()
        .and_then(|status| status.conditions.as_deref())
        .unwrap_or_default()
}

/// Whether the pod's Ready condition (the latest one) is True.
pub fn is_ready(pod: &CachedPod) -> bool {
    ready_condition(pod).is_some_and(|condition| condition.status == "True")
}

fn ready_condition(pod: &CachedPod) -> Option<&PodCondition> {
    conditions(pod)
        .iter()
        .filter(|condition| condition.type_ == "Ready")
        .max_by_key(|condition| condition.last_transition_time.as_ref().map(|time| time.0))
}

/// When the pod last became Ready, if it is Ready.
pub fn ready_since(pod: &CachedPod) -> Option<Timestamp> {
    ready_condition(pod)
        .filter(|condition| condition.status == "True")
        .and_then(|condition| condition.last_transition_time.as_ref().map(|time| time.0))
}

/// Whether the scheduler found no node for the pod (so a cluster autoscaler may be adding one).
pub fn is_waiting_for_node(pod: &CachedPod) -> bool {
    conditions(pod).iter().any(|condition| {
        condition.type_ == "PodScheduled"
            && condition.status == "False"
            && condition.reason.as_deref() == Some("Unschedulable")
    })
}

/// What the listener container is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// Not running yet (or waiting to be restarted).
    Starting,
    /// Running since (when known).
    Running(Option<Timestamp>),
    /// Evicted or terminated: the pod must be replaced. The text says how it ended.
    Failed(String),
}

/// The state of the listener container of `pod`.
pub fn pod_state(pod: &Pod) -> PodState {
    let Some(status) = &pod.status else {
        return PodState::Starting;
    };
    if status.reason.as_deref() == Some("Evicted") {
        return PodState::Failed("was evicted".to_owned());
    }
    let container = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == LISTENER_CONTAINER_NAME);
    let Some(state) = container.and_then(|c| c.state.as_ref()) else {
        return match status.phase.as_deref() {
            Some("Failed" | "Succeeded") => PodState::Failed(format!(
                "ended in phase {}",
                status.phase.as_deref().unwrap_or_default()
            )),
            _ => PodState::Starting,
        };
    };
    if let Some(terminated) = &state.terminated {
        let reason = terminated
            .reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        return PodState::Failed(format!("exited with code {}{reason}", terminated.exit_code));
    }
    if let Some(running) = &state.running {
        return PodState::Running(running.started_at.as_ref().map(|t| t.0));
    }
    PodState::Starting
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "status": status})).unwrap()
    }

    fn with_conditions(conditions: Vec<PodCondition>) -> CachedPod {
        CachedPod {
            status: Some(PodStatus {
                conditions: Some(conditions),
                ..PodStatus::default()
            }),
            ..CachedPod::default()
        }
    }

    /// A pod condition that changed at second `at` (shared with other modules' tests).
    pub(crate) fn condition(
        type_: &str,
        status: &str,
        reason: Option<&str>,
        at: i64,
    ) -> PodCondition {
        PodCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.map(str::to_owned),
            last_transition_time: Some(Time(Timestamp::from_second(at).unwrap())),
            ..PodCondition::default()
        }
    }

    #[test]
    fn readiness_uses_the_latest_condition() {
        let pod = with_conditions(vec![
            condition("Ready", "True", None, 100),
            condition("Ready", "False", None, 50),
        ]);
        assert!(is_ready(&pod));
        assert_eq!(
            ready_since(&pod),
            Some(Timestamp::from_second(100).unwrap())
        );
        let pod = with_conditions(vec![condition("Ready", "False", None, 100)]);
        assert!(!is_ready(&pod));
        assert_eq!(ready_since(&pod), None);
        assert!(!is_ready(&CachedPod::default()));
    }

    #[test]
    fn waiting_for_a_node() {
        assert!(!is_waiting_for_node(&CachedPod::default()));
        assert!(!is_waiting_for_node(&with_conditions(vec![])));
        assert!(is_waiting_for_node(&with_conditions(vec![condition(
            "PodScheduled",
            "False",
            Some("Unschedulable"),
            1,
        )])));
    }

    #[test]
    fn pod_states() {
        assert_eq!(pod_state(&pod(json!({}))), PodState::Starting);
        assert_eq!(
            pod_state(&pod(json!({"phase": "Failed", "reason": "Evicted"}))),
            PodState::Failed("was evicted".to_owned())
        );
        assert_eq!(
            pod_state(&pod(json!({"containerStatuses": [{
                "name": "listener", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 1, "reason": "Error"}},
            }]}))),
            PodState::Failed("exited with code 1 (Error)".to_owned())
        );
        assert!(matches!(
            pod_state(&pod(json!({"containerStatuses": [{
                "name": "listener", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": "2024-01-01T00:00:00Z"}},
            }]}))),
            PodState::Running(Some(_))
        ));
        assert_eq!(
            pod_state(&pod(json!({"phase": "Succeeded"}))),
            PodState::Failed("ended in phase Succeeded".to_owned())
        );
    }
}
