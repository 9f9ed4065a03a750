//! The AutoscalingListener controller: runs one listener pod per AutoscalingRunnerSet, with its config Secret,
//! proxy Secret, ServiceAccount and least-privilege Role and RoleBinding
//! (docs/reference/controllers.md, "AutoscalingListener controller").
//!
//! Wiring: primary listeners and listener pods from the manager's shared watches (both in the controller
//! namespace); pod deletions (which shared watches do not forward) through `reconcile_on`; ServiceAccounts as
//! owned objects; Roles and RoleBindings (in the scale set's namespace, so without owner references) mapped back
//! by their `auto-scaling-listener-*` labels.
//!
//! Beyond ARC: the config Secret's data is rewritten on every pass, so rotated credentials reach the listener
//! (its pod is recreated because the config hash is part of the pod's hash); listener pods that fail are
//! recreated with a per-listener exponential backoff, and every failure is reported as an Event on the
//! AutoscalingRunnerSet.

mod reconcile;
pub mod resources;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crds::AutoscalingListener;
use crds::constants::{LISTENER_NAME_LABEL, LISTENER_NAMESPACE_LABEL};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};

pub use reconcile::{PodState, pod_state};

use crate::context::{Context, ErrorRequeue};
use crate::error::Error;

/// Controller name in metrics and logs (ARC's).
pub const CONTROLLER: &str = "autoscalinglistener";

/// How a listener's pod has been failing, shared with the AutoscalingRunnerSet controller, which turns it into
/// a condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerFailure {
    /// Consecutive failed pods.
    pub count: u32,
    /// What the last one said (exit code, reason).
    pub last: String,
    /// Earliest time the next pod may be created.
    pub retry_at: Instant,
}

/// Listener failures by `namespace/name` of the AutoscalingListener. In memory: after a restart a failing
/// listener is simply tried again at once.
#[derive(Debug, Default)]
pub struct ListenerHealth {
    failures: Mutex<HashMap<String, ListenerFailure>>,
}

impl ListenerHealth {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, ListenerFailure>> {
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a failed pod of listener `key`; returns the failure with its retry time.
    pub fn failed(&self, key: &str, what: String, min: Duration, max: Duration) -> ListenerFailure {
        let mut failures = self.lock();
        let count = failures.get(key).map_or(1, |f| f.count.saturating_add(1));
        let delay = min
            .saturating_mul(1u32.checked_shl(count - 1).unwrap_or(u32::MAX))
            .min(max);
        let failure = ListenerFailure {
            count,
            last: what,
            retry_at: Instant::now() + delay,
        };
        failures.insert(key.to_owned(), failure.clone());
        failure
    }

    /// The failure record of listener `key`, if it is failing.
    pub fn get(&self, key: &str) -> Option<ListenerFailure> {
        self.lock().get(key).cloned()
    }

    /// Forgets listener `key` (it runs fine, or is gone).
    pub fn reset(&self, key: &str) {
        self.lock().remove(key);
    }
}

/// A wait for people to read: whole seconds from 10 s on, tenths below (a 0.5 s backoff is not "0s").
pub fn describe_wait(wait: Duration) -> String {
    if wait >= Duration::from_secs(10) {
        format!("{}s", wait.as_secs())
    } else {
        format!("{:.1}s", wait.as_secs_f64())
    }
}

/// The AutoscalingListener controller's context: the shared one plus its own view of listener pods.
pub struct ListenerContext {
    /// Shared manager context.
    pub base: Arc<Context>,
    /// Listener pods (controller namespace).
    pub pods: Store<Pod>,
    /// Listener failures, shared with the AutoscalingRunnerSet controller.
    pub health: Arc<ListenerHealth>,
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

/// Runs the controller until `shutdown` resolves and in-flight reconciles finish. `rbac_namespace` limits the
/// Role and RoleBinding watches (the watched scale set namespace), `None` watches all namespaces.
#[allow(clippy::too_many_arguments)] // each stream is one watch of the wiring described in the module docs
pub async fn run(
    ctx: Arc<ListenerContext>,
    listeners: impl Stream<Item = Arc<AutoscalingListener>> + Send + 'static,
    listener_store: Store<AutoscalingListener>,
    pods: impl Stream<Item = Arc<Pod>> + Send + 'static,
    pod_deletions: impl Stream<Item = ObjectRef<AutoscalingListener>> + Send + 'static,
    rbac_namespace: Option<String>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.base.client.clone();
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
    Controller::for_shared_stream(listeners, listener_store)
        .owns_shared_stream(pods)
        .owns(accounts, watcher::Config::default())
        .watches(roles, labelled.clone(), |role| listener_of(&role))
        .watches(bindings, labelled, |binding| listener_of(&binding))
        .reconcile_on(pod_deletions)
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
    fn failures_back_off_and_reset() {
        let health = ListenerHealth::default();
        let min = Duration::from_secs(1);
        let max = Duration::from_secs(5);
        let first = health.failed("a", "exit 1".into(), min, max);
        assert_eq!(first.count, 1);
        let now = Instant::now();
        assert!(first.retry_at <= now + min);
        let third = {
            health.failed("a", "exit 1".into(), min, max);
            health.failed("a", "exit 2".into(), min, max)
        };
        assert_eq!(third.count, 3);
        assert_eq!(third.last, "exit 2");
        assert!(third.retry_at > now + Duration::from_secs(3));
        for _ in 0..10 {
            health.failed("a", "x".into(), min, max);
        }
        assert!(health.get("a").unwrap().retry_at <= Instant::now() + max);
        health.reset("a");
        assert!(health.get("a").is_none());
        assert_eq!(describe_wait(Duration::from_millis(500)), "0.5s");
        assert_eq!(describe_wait(Duration::from_millis(9_960)), "10.0s");
        assert_eq!(describe_wait(Duration::from_secs(300)), "300s");
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
