//! The AutoscalingRunnerSet controller (spec §3.1): the scale set in the Actions Service, the
//! EphemeralRunnerSet and the AutoscalingListener of each AutoscalingRunnerSet, its status, and ordered cleanup.
//!
//! Wiring: primary sets from the manager's shared watch, with status-only changes filtered out (the controller
//! writes status itself, and a failing pass must not trigger the next one at once); owned EphemeralRunnerSets;
//! AutoscalingListeners and listener pods mapped back by their `actions.github.com/scale-set-*` labels, so the
//! `ListenerReady` condition follows the listener.
//!
//! Beyond ARC: conditions and Events for every reason no runner is created; a scale set deleted on GitHub's
//! side is re-created with the same name, group and labels (checked every `scale_set_check_interval`); errors
//! that need someone to fix the configuration are retried after `configuration_error_backoff` at the earliest.

pub mod conditions;
pub mod desired;
mod reconcile;

use std::collections::HashMap;
use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use crds::constants::{SCALE_SET_NAME_LABEL, SCALE_SET_NAMESPACE_LABEL};
use crds::{AutoscalingListener, AutoscalingRunnerSet, EphemeralRunnerSet};
use futures::{Stream, StreamExt, future};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

pub use reconcile::listener_state;

use crate::autoscaling_listener::ListenerHealth;
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
    /// Listener failures recorded by the AutoscalingListener controller.
    pub health: Arc<ListenerHealth>,
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
        health: Arc<ListenerHealth>,
    ) -> Self {
        Self {
            base,
            namespace,
            listeners,
            listener_pods,
            health,
            checked: Mutex::new(HashMap::new()),
        }
    }

    fn checked(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.checked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether set `key`'s scale set should be looked up again (never looked up by this process, or longer
    /// ago than the check interval).
    fn scale_set_check_due(&self, key: &str) -> bool {
        let interval = self.base.options.scale_set_check_interval;
        self.checked()
            .get(key)
            .is_none_or(|last| last.elapsed() >= interval)
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

/// A fingerprint of everything but the status: what the controller reacts to.
fn spec_fingerprint(runner_set: &AutoscalingRunnerSet) -> u64 {
    let meta = runner_set.meta();
    let mut hasher = DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.finalizers.hash(&mut hasher);
    meta.deletion_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
        .hash(&mut hasher);
    hasher.finish()
}

/// Drops events that only changed an object's status (ARC filters on `resourceVersion`; status writes of this
/// controller must not trigger the next pass, or a failing pass would loop).
fn without_status_changes(
    sets: impl Stream<Item = Arc<AutoscalingRunnerSet>> + Send + 'static,
) -> impl Stream<Item = Arc<AutoscalingRunnerSet>> + Send + 'static {
    let seen: Mutex<HashMap<(String, String), u64>> = Mutex::new(HashMap::new());
    sets.filter(move |set| {
        let key = (set.namespace().unwrap_or_default(), set.name_any());
        let print = spec_fingerprint(set);
        let changed = seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, print)
            != Some(print);
        future::ready(changed)
    })
}

/// The AutoscalingRunnerSet an object derived from it belongs to, by its scale-set labels.
fn runner_set_of<K: Resource>(obj: &K) -> Option<ObjectRef<AutoscalingRunnerSet>> {
    let labels = obj.labels();
    let name = labels.get(SCALE_SET_NAME_LABEL)?;
    let namespace = labels.get(SCALE_SET_NAMESPACE_LABEL)?;
    Some(ObjectRef::new(name).within(namespace))
}

/// Runs the controller until `shutdown` resolves and in-flight reconciles finish.
pub async fn run(
    ctx: Arc<RunnerSetContext>,
    sets: impl Stream<Item = Arc<AutoscalingRunnerSet>> + Send + 'static,
    set_store: Store<AutoscalingRunnerSet>,
    runner_sets: impl Stream<Item = Arc<EphemeralRunnerSet>> + Send + 'static,
    listeners: impl Stream<Item = Arc<AutoscalingListener>> + Send + 'static,
    listener_pods: impl Stream<Item = Arc<Pod>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let config = Config::default().concurrency(ctx.base.options.autoscaling_runner_set_concurrency);
    Controller::for_shared_stream(without_status_changes(sets), set_store)
        .owns_shared_stream(runner_sets)
        .watches_shared_stream(listeners, |listener| {
            let spec = &listener.spec;
            Some(
                ObjectRef::new(&spec.autoscaling_runner_set_name)
                    .within(&spec.autoscaling_runner_set_namespace),
            )
        })
        .watches_shared_stream(listener_pods, |pod| runner_set_of(&*pod))
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

    #[tokio::test]
    async fn status_only_changes_are_filtered() {
        let mut set = AutoscalingRunnerSet::new("s", AutoscalingRunnerSetSpec::default());
        set.metadata.namespace = Some("ns".into());
        set.metadata.generation = Some(1);
        let mut status_changed = set.clone();
        status_changed.status = Some(crds::AutoscalingRunnerSetStatus {
            phase: "Running".into(),
            ..Default::default()
        });
        let mut relabelled = status_changed.clone();
        relabelled.labels_mut().insert("a".into(), "b".into());
        let mut spec_changed = relabelled.clone();
        spec_changed.metadata.generation = Some(2);
        let events =
            futures::stream::iter([set, status_changed, relabelled, spec_changed].map(Arc::new));
        let passed: Vec<_> = without_status_changes(events).collect().await;
        assert_eq!(passed.len(), 3);
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
