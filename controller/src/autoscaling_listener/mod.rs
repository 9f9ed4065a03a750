//! The AutoscalingListener controller: runs one listener pod per AutoscalingRunnerSet, with its config Secret,
//! proxy Secret, ServiceAccount and least-privilege Role and RoleBinding
//! (docs/reference/controllers.md, "AutoscalingListener controller").
//!
//! Wiring: primary listeners and listener pods from the manager's shared watches (both in the controller
//! namespace), listener events that only changed the status filtered out (the listener reports there);
//! pod deletions (which shared watches do not forward) through `reconcile_on`; ServiceAccounts as owned objects;
//! Roles and RoleBindings (in the scale set's namespace, so without owner references) mapped back by their
//! `auto-scaling-listener-*` labels.
//!
//! Beyond ARC: the config Secret's data is rewritten on every pass, so rotated credentials reach the listener
//! (its pod is recreated because the config hash is part of the pod's hash); listener pods that fail are
//! recreated with a per-listener exponential backoff kept in the listener's `status.podFailures` (so it survives
//! a manager restart, and the AutoscalingRunnerSet controller reads it from there), and every failure is reported
//! as an Event on the AutoscalingRunnerSet. A second Role and RoleBinding, next to the listener, let the listener
//! write its own status (its message session, polls and errors).

pub mod in_manager;
mod reconcile;
pub mod resources;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::kubeutil::{changed_only, deletion_mark};
use crds::AutoscalingListener;
use crds::constants::{LISTENER_NAME_LABEL, LISTENER_NAMESPACE_LABEL};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, Predicate, predicates, watcher};
use kube::{Api, Resource, ResourceExt};

use crate::context::{Context, ErrorRequeue};
use crate::error::Error;

/// Controller name in metrics and logs (ARC's).
pub const CONTROLLER: &str = "autoscalinglistener";

/// The wait before the pod after the `count`-th failure in a row: `min` doubling, capped at `max`.
pub fn pod_failure_delay(count: i64, min: Duration, max: Duration) -> Duration {
    let exponent = u32::try_from(count.saturating_sub(1).clamp(0, 31)).unwrap_or(31);
    min.saturating_mul(1u32 << exponent).min(max)
}

/// The AutoscalingListener controller's context: the shared one plus its own view of listener pods.
pub struct ListenerContext {
    /// Shared manager context.
    pub base: Arc<Context>,
    /// The client of this controller's own requests: in the manager's listener mode the loops' client, so a new
    /// leader's passes that start every set's loop never queue behind a burst of runner creations for the main
    /// client's requests in flight (they did: a set's loop started seconds after the others in a hand-over);
    /// the main client otherwise.
    pub client: kube::Client,
    /// Listener pods (controller namespace).
    pub pods: Store<Pod>,
    /// Controller namespace.
    pub namespace: String,
}

async fn reconcile_one(
    listener: Arc<AutoscalingListener>,
    ctx: Arc<ListenerContext>,
) -> Result<Action, Error> {
    ctx.base
        .instrumented(
            CONTROLLER,
            listener.as_ref(),
            reconcile::reconcile(Arc::clone(&listener), Arc::clone(&ctx)),
        )
        .await
}

fn error_policy(
    listener: Arc<AutoscalingListener>,
    error: &Error,
    ctx: Arc<ListenerContext>,
) -> Action {
    ctx.base.requeue_after_error(
        CONTROLLER,
        listener.as_ref(),
        error,
        ErrorRequeue::SlowForConfiguration,
    )
}

/// The listener a Role or RoleBinding belongs to, from its labels (nothing if either is missing).
fn listener_of<K: Resource>(obj: &K) -> Option<ObjectRef<AutoscalingListener>> {
    let labels = obj.labels();
    let name = labels.get(LISTENER_NAME_LABEL)?;
    let namespace = labels.get(LISTENER_NAMESPACE_LABEL)?;
    Some(ObjectRef::new(name).within(namespace))
}

/// What the controller reacts to on an AutoscalingListener: everything but the status, which the listener
/// rewrites on its own schedule and this controller writes itself (a pass per report would re-apply every
/// object of the listener for nothing), except the session it records and whether it holds it: in the manager's
/// listener mode a stopping listener pod's last report can replace the loop's, which the pass then writes again.
fn reacts_to(listener: &AutoscalingListener) -> Option<u64> {
    predicates::generation
        .combine(predicates::labels)
        .combine(predicates::annotations)
        .combine(predicates::finalizers)
        .combine(deletion_mark)
        .combine(recorded_session)
        .hash_property(listener)
}

/// The session the status records and whether it says it is held, as a predicate value.
fn recorded_session(listener: &AutoscalingListener) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let status = listener.status.as_ref();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (
        status
            .and_then(|status| status.session.as_ref())
            .map(|session| &session.id),
        status.and_then(|status| status.session_held),
    )
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// Drops listener events that only changed the status (see [`reacts_to`]).
fn without_status_changes(
    listeners: impl Stream<Item = Arc<AutoscalingListener>> + Send + 'static,
) -> impl Stream<Item = Arc<AutoscalingListener>> + Send + 'static {
    changed_only(listeners, reacts_to)
}

/// Runs the controller until `shutdown` resolves and in-flight reconciles finish. `rbac_namespace` limits the
/// Role and RoleBinding watches (the watched scale set namespace), `None` watches all namespaces.
#[allow(clippy::too_many_arguments)] // each stream is one watch of the wiring described in the module docs
pub async fn run(
    ctx: Arc<ListenerContext>,
    listeners: impl Stream<Item = Arc<AutoscalingListener>> + Send + 'static,
    listener_store: Store<AutoscalingListener>,
    pods: impl Stream<Item = Arc<Pod>> + Send + 'static,
    pod_deletions: impl Stream<Item = ObjectRef<AutoscalingListener>> + Send + 'static,
    loop_endings: Option<impl Stream<Item = ObjectRef<AutoscalingListener>> + Send + 'static>,
    rbac_namespace: Option<String>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let (roles, bindings): (Api<Role>, Api<RoleBinding>) = match &rbac_namespace {
        Some(namespace) => (
            Api::namespaced(client.clone(), namespace),
            Api::namespaced(client.clone(), namespace),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(client, &ctx.namespace);
    let labelled = watcher::Config::default().labels(LISTENER_NAME_LABEL);
    let config = Config::default().concurrency(ctx.base.options.autoscaling_listener_concurrency);
    Controller::for_shared_stream(without_status_changes(listeners), listener_store)
        .owns_shared_stream(pods)
        .owns(accounts, watcher::Config::default())
        .watches(roles, labelled.clone(), |role| listener_of(&role))
        .watches(bindings, labelled, |binding| listener_of(&binding))
        .reconcile_on(futures::stream::select(
            pod_deletions,
            futures::stream::iter(loop_endings).flatten(),
        ))
        .with_config(config)
        .graceful_shutdown_on(shutdown)
        .run(reconcile_one, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "autoscaling listener controller event");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_failures_back_off_doubling_to_a_cap() {
        let min = Duration::from_secs(1);
        let max = Duration::from_secs(5);
        let delays: Vec<_> = [0, 1, 2, 3, 4, 100, i64::MAX]
            .into_iter()
            .map(|count| pod_failure_delay(count, min, max).as_secs())
            .collect();
        assert_eq!(delays, [1, 1, 2, 4, 5, 5, 5]);
    }

    #[tokio::test]
    async fn status_only_changes_do_not_trigger_a_pass() {
        let mut listener = AutoscalingListener::new("l", Default::default());
        listener.metadata.namespace = Some("arc".into());
        listener.metadata.uid = Some("u".into());
        listener.metadata.generation = Some(1);
        let mut reported = listener.clone();
        reported.status = Some(crds::AutoscalingListenerStatus {
            desired_runners: Some(3),
            ..Default::default()
        });
        let mut relabelled = reported.clone();
        relabelled.labels_mut().insert("a".into(), "b".into());
        let mut held = relabelled.clone();
        held.status = Some(crds::AutoscalingListenerStatus {
            session_held: Some(true),
            session: Some(crds::ListenerSession {
                id: "s".into(),
                owner: "o".into(),
            }),
            ..Default::default()
        });
        let mut polled = held.clone();
        if let Some(status) = polled.status.as_mut() {
            status.desired_runners = Some(4);
        }
        let events =
            futures::stream::iter([listener, reported, relabelled, held, polled].map(Arc::new));
        let passed: Vec<_> = without_status_changes(events).collect().await;
        assert_eq!(
            passed.len(),
            3,
            "the status report is filtered, but for a change of the session it records"
        );
    }

    #[test]
    fn rbac_objects_map_back_by_label() {
        let mut role = Role::default();
        assert!(listener_of(&role).is_none());
        role.metadata.labels = Some(
            [
                (LISTENER_NAME_LABEL.to_owned(), "l".to_owned()),
                (LISTENER_NAMESPACE_LABEL.to_owned(), "arc".to_owned()),
            ]
            .into(),
        );
        assert_eq!(listener_of(&role), Some(ObjectRef::new("l").within("arc")));
    }
}
