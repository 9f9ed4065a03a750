//! The AutoscalingRunnerSet controller (docs/reference/controllers.md, "AutoscalingRunnerSet controller"): the
//! scale set in the Actions Service, the EphemeralRunnerSet and the AutoscalingListener of each
//! AutoscalingRunnerSet, its status, and ordered cleanup.
//!
//! Wiring: primary sets from the manager's shared watch, with status-only changes filtered out (the controller
//! writes status itself, and a failing pass must not trigger the next one at once); owned EphemeralRunnerSets;
//! AutoscalingListeners (when their spec or the listener's report changes in a way the `ListenerReady` condition
//! depends on, not at every report) and listener pods mapped back by their `actions.github.com/scale-set-*`
//! labels; runners and runner pods when one becomes blocked from starting or stops being so
//! ([`runners::blockage_changes`]).
//!
//! Beyond ARC: conditions and Events for every reason no runner is created; a scale set deleted on GitHub's
//! side is re-created with the same name, group and labels (checked every `scale_set_check_interval`); errors
//! that need someone to fix the configuration are retried after `configuration_error_backoff` at the earliest.

pub mod conditions;
pub mod desired;
mod reconcile;
pub mod runners;
pub mod scale_set_labels;
pub mod schedule_status;
pub mod served;
pub mod takeover;

use std::collections::HashMap;
use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use crate::kubeutil::{changed_only, deletion_mark};
use crds::constants::{SCALE_SET_NAME_LABEL, SCALE_SET_NAMESPACE_LABEL};
use crds::{AutoscalingListener, AutoscalingRunnerSet, EphemeralRunnerSet};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, Predicate, predicates};
use kube::{Resource, ResourceExt};

use crate::context::{Context, ErrorRequeue};
use crate::error::Error;

/// Controller name in metrics and logs (ARC's).
pub const CONTROLLER: &str = "autoscalingrunnerset";

/// The AutoscalingRunnerSet controller's context: the shared one plus its own views and memory.
pub struct RunnerSetContext {
    /// Shared manager context.
    pub base: Arc<Context>,
    /// Controller namespace (listeners live there).
    pub namespace: String,
    /// AutoscalingListeners (controller namespace).
    pub listeners: Store<AutoscalingListener>,
    /// Listener pods (controller namespace).
    pub listener_pods: Store<Pod>,
    /// When each set's scale set was last found in the Actions Service.
    checked: Mutex<HashMap<String, Instant>>,
}

impl RunnerSetContext {
    /// A context for the controller.
    pub fn new(
        base: Arc<Context>,
        namespace: String,
        listeners: Store<AutoscalingListener>,
        listener_pods: Store<Pod>,
    ) -> Self {
        Self {
            base,
            namespace,
            listeners,
            listener_pods,
            checked: Mutex::new(HashMap::new()),
        }
    }

    fn checked(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.checked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether set `key`'s scale set should be looked up again (never looked up by this process, or longer
    /// ago than the check interval).
    fn scale_set_check_due(&self, key: &str) -> bool {
        self.scale_set_check_in(key)
            .is_none_or(|left| left.is_zero())
    }

    /// How long until set `key`'s next lookup falls due; `None` when none is recorded (the next pass looks up).
    fn scale_set_check_in(&self, key: &str) -> Option<std::time::Duration> {
        let interval = self.base.options.scale_set_check_interval;
        self.checked()
            .get(key)
            .map(|last| interval.saturating_sub(last.elapsed()))
    }

    /// Records the outcome of a lookup: found (check again after the interval) or not (check every pass).
    fn scale_set_checked(&self, key: &str, found: bool) {
        if found {
            self.checked().insert(key.to_owned(), Instant::now());
        } else {
            self.checked().remove(key);
        }
    }

    fn forget(&self, key: &str) {
        self.checked().remove(key);
    }

    fn listener_pod(&self, name: &str) -> Option<Arc<Pod>> {
        self.listener_pods
            .get(&ObjectRef::new(name).within(&self.namespace))
    }

    /// The listener's loop in this manager, in the manager's listener mode.
    fn listener_task(&self, name: &str) -> Option<crate::listener_tasks::TaskView> {
        let tasks = self.base.listener_tasks.as_ref()?;
        tasks.view(&ObjectRef::new(name).within(&self.namespace))
    }
}

async fn reconcile_one(
    runner_set: Arc<AutoscalingRunnerSet>,
    ctx: Arc<RunnerSetContext>,
) -> Result<Action, Error> {
    ctx.base
        .instrumented(
            CONTROLLER,
            runner_set.as_ref(),
            reconcile::reconcile(Arc::clone(&runner_set), Arc::clone(&ctx)),
        )
        .await
}

fn error_policy(
    runner_set: Arc<AutoscalingRunnerSet>,
    error: &Error,
    ctx: Arc<RunnerSetContext>,
) -> Action {
    ctx.base.requeue_after_error(
        CONTROLLER,
        runner_set.as_ref(),
        error,
        ErrorRequeue::SlowForConfiguration,
    )
}

/// What the controller reacts to: the spec (its generation), labels, annotations, finalizers and the deletion
/// mark; everything but the status.
fn reacts_to(set: &AutoscalingRunnerSet) -> Option<u64> {
    predicates::generation
        .combine(predicates::labels)
        .combine(predicates::annotations)
        .combine(predicates::finalizers)
        .combine(deletion_mark)
        .hash_property(set)
}

/// Drops events that only changed an object's status (ARC filters on `resourceVersion`; status writes of this
/// controller must not trigger the next pass, or a failing pass would loop).
///
/// kube-runtime's `predicate_filter` remembers each object by namespace, name and uid and forgets what it has
/// not seen for an hour. It takes a stream of owned objects, while the manager's shared watch hands out `Arc`s:
/// this controller is that watch's only subscriber, so taking each object out of its `Arc` and back normally
/// copies nothing.
fn without_status_changes(
    sets: impl Stream<Item = Arc<AutoscalingRunnerSet>> + Send + 'static,
) -> impl Stream<Item = Arc<AutoscalingRunnerSet>> + Send + 'static {
    changed_only(sets, reacts_to)
}

/// What the set's conditions read from an AutoscalingListener: its metadata (a new spec replaces it) and the
/// verdict-bearing part of the listener's report (session held, whether the last error is current and its
/// category, pod failures). Reports that only move the last poll time or the figures do not start a pass; a
/// report going stale is caught by the pass's own requeue.
fn listener_reacts_to(listener: &AutoscalingListener) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    let meta = listener.meta();
    meta.generation.hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.deletion_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
        .hash(&mut hasher);
    if let Some(status) = &listener.status {
        status.session_held.hash(&mut hasher);
        status
            .session_since
            .as_ref()
            .map(|t| t.0.as_second())
            .hash(&mut hasher);
        let last_poll = status.last_poll_time.as_ref().map(|t| t.0);
        let failing = status.last_error.as_ref().filter(|error| {
            match (error.time.as_ref().map(|t| t.0), last_poll) {
                (Some(at), Some(poll)) => at > poll,
                _ => last_poll.is_none(),
            }
        });
        failing.map(|error| &error.category).hash(&mut hasher);
        status
            .pod_failures
            .as_ref()
            .map(|f| (f.count, &f.last))
            .hash(&mut hasher);
    }
    Some(hasher.finish())
}

/// Listener events that matter to the set (see [`listener_reacts_to`]).
fn listener_changes(
    listeners: impl Stream<Item = Arc<AutoscalingListener>> + Send + 'static,
) -> impl Stream<Item = Arc<AutoscalingListener>> + Send + 'static {
    changed_only(listeners, listener_reacts_to)
}

/// The AutoscalingRunnerSet an object derived from it belongs to, by its scale-set labels.
fn runner_set_of<K: Resource>(obj: &K) -> Option<ObjectRef<AutoscalingRunnerSet>> {
    let labels = obj.labels();
    let name = labels.get(SCALE_SET_NAME_LABEL)?;
    let namespace = labels.get(SCALE_SET_NAMESPACE_LABEL)?;
    Some(ObjectRef::new(name).within(namespace))
}

/// Runs the controller until `shutdown` resolves and in-flight reconciles finish.
#[allow(clippy::too_many_arguments)] // each stream is one watch of the wiring described in the module docs
pub async fn run(
    ctx: Arc<RunnerSetContext>,
    sets: impl Stream<Item = Arc<AutoscalingRunnerSet>> + Send + 'static,
    set_store: Store<AutoscalingRunnerSet>,
    runner_sets: impl Stream<Item = Arc<EphemeralRunnerSet>> + Send + 'static,
    listeners: impl Stream<Item = Arc<AutoscalingListener>> + Send + 'static,
    listener_pods: impl Stream<Item = Arc<Pod>> + Send + 'static,
    blockages: impl Stream<Item = ObjectRef<AutoscalingRunnerSet>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let config = Config::default().concurrency(ctx.base.options.autoscaling_runner_set_concurrency);
    Controller::for_shared_stream(without_status_changes(sets), set_store)
        .owns_shared_stream(runner_sets)
        .watches_shared_stream(listener_changes(listeners), |listener| {
            let spec = &listener.spec;
            Some(
                ObjectRef::new(&spec.autoscaling_runner_set_name)
                    .within(&spec.autoscaling_runner_set_namespace),
            )
        })
        .watches_shared_stream(listener_pods, |pod| runner_set_of(&*pod))
        .reconcile_on(blockages)
        .with_config(config)
        .graceful_shutdown_on(shutdown)
        .run(reconcile_one, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "autoscaling runner set controller event");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::AutoscalingRunnerSetSpec;

    type Step = (&'static str, fn(&mut AutoscalingRunnerSet), bool);

    /// Each step of a set's life, and whether the controller must hear of it. Every step is a write, so it
    /// carries a new resourceVersion (which also tells the steps apart in the output).
    #[tokio::test]
    async fn status_only_changes_are_filtered() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let steps: [Step; 12] = [
            ("created", |_| {}, true),
            ("status", |s| s.status = Some(Default::default()), false),
            (
                "status again",
                |s| s.status.as_mut().unwrap().current_runners = 3,
                false,
            ),
            (
                "label",
                |s| drop(s.labels_mut().insert("a".into(), "b".into())),
                true,
            ),
            (
                "annotation",
                |s| drop(s.annotations_mut().insert("a".into(), "b".into())),
                true,
            ),
            ("finalizer", |s| s.finalizers_mut().push("f".into()), true),
            ("spec", |s| s.metadata.generation = Some(2), true),
            (
                "status after spec",
                |s| s.status.as_mut().unwrap().phase = "Running".into(),
                false,
            ),
            (
                "deletion mark",
                |s| {
                    let at = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap();
                    s.metadata.deletion_timestamp = Some(Time(at));
                },
                true,
            ),
            ("finalizer removed", |s| s.finalizers_mut().clear(), true),
            (
                "re-created: same name, generation, labels and annotations",
                |s| {
                    s.metadata.uid = Some("uid-2".into());
                    s.metadata.deletion_timestamp = None;
                    s.status = None;
                },
                true,
            ),
            (
                "re-created again after a deletion the watch saw no mark of",
                |s| s.metadata.uid = Some("uid-3".into()),
                true,
            ),
        ];
        let mut set = AutoscalingRunnerSet::new("s", AutoscalingRunnerSetSpec::default());
        set.metadata.namespace = Some("ns".into());
        set.metadata.uid = Some("uid-1".into());
        set.metadata.generation = Some(1);
        let mut events = Vec::new();
        for (version, (_, change, _)) in steps.iter().enumerate() {
            change(&mut set);
            set.metadata.resource_version = Some(version.to_string());
            events.push(Arc::new(set.clone()));
        }
        let passed: Vec<_> = without_status_changes(futures::stream::iter(events))
            .map(|set| {
                let version: usize = set.resource_version().unwrap().parse().unwrap();
                steps[version].0
            })
            .collect()
            .await;
        let expected: Vec<_> = steps
            .iter()
            .filter(|(_, _, passes)| *passes)
            .map(|(name, _, _)| *name)
            .collect();
        assert_eq!(passed, expected);
    }

    /// The listener's heartbeat (a newer poll time, new figures, a retried error's time) does not start a pass
    /// of the set; a change of the verdict does.
    #[tokio::test]
    async fn only_verdict_changes_of_the_listeners_report_start_a_pass() {
        use crds::{AutoscalingListenerStatus, ListenerError};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use k8s_openapi::jiff::Timestamp;
        let at = |s: i64| Some(Time(Timestamp::from_second(1_700_000_000 + s).unwrap()));
        let report = |poll: i64, error: Option<(&str, i64)>, desired: i64| {
            let mut listener = AutoscalingListener::new("l", Default::default());
            listener.metadata.namespace = Some("arc".into());
            listener.metadata.uid = Some("u".into());
            listener.status = Some(AutoscalingListenerStatus {
                session_held: Some(true),
                session_since: at(0),
                last_poll_time: at(poll),
                desired_runners: Some(desired),
                last_error: error.map(|(category, time)| ListenerError {
                    category: category.into(),
                    message: format!("{category} at {time}"),
                    time: at(time),
                }),
                ..Default::default()
            });
            listener
        };
        let events = [
            (report(10, None, 1), true),
            (report(40, None, 2), false),
            (report(70, Some(("ServiceUnreachable", 75)), 2), true),
            (report(70, Some(("ServiceUnreachable", 90)), 2), false),
            (report(70, Some(("CredentialsRejected", 95)), 2), true),
            (report(100, Some(("CredentialsRejected", 95)), 2), true),
            (report(130, Some(("CredentialsRejected", 95)), 3), false),
        ];
        let expected: Vec<bool> = events.iter().map(|(_, passes)| *passes).collect();
        let stream = futures::stream::iter(events.into_iter().map(|(l, _)| Arc::new(l)));
        let passed: Vec<_> = listener_changes(stream)
            .map(|l| l.status.as_ref().unwrap().last_poll_time.clone())
            .collect()
            .await;
        assert_eq!(
            passed.len(),
            expected.iter().filter(|p| **p).count(),
            "{passed:?}"
        );
        assert_eq!(passed, vec![at(10), at(70), at(70), at(100)]);
    }

    #[test]
    fn derived_objects_map_back_by_label() {
        let mut pod = Pod::default();
        assert!(runner_set_of(&pod).is_none());
        pod.metadata.labels = Some(
            [
                (SCALE_SET_NAME_LABEL.to_owned(), "set".to_owned()),
                (SCALE_SET_NAMESPACE_LABEL.to_owned(), "ns".to_owned()),
            ]
            .into(),
        );
        assert_eq!(
            runner_set_of(&pod),
            Some(ObjectRef::new("set").within("ns"))
        );
    }
}
