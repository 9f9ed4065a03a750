//! The EphemeralRunner controller (docs/reference/controllers.md, "EphemeralRunner controller"): one runner pod per EphemeralRunner, its JIT config Secret, and
//! the runner's registration in the Actions Service.
//!
//! Wiring: primary EphemeralRunners from the manager's shared runner watch; owned runner pods from the shared
//! pod watch; pod deletions (which shared watches do not forward) through `reconcile_on`.

mod cache;
pub mod lifecycle;
pub mod pod;
pub mod policy;
mod reconcile;

use std::future::Future;
use std::sync::Arc;

use crds::EphemeralRunner;
use futures::{Stream, StreamExt};
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::ObjectRef;

pub use cache::{prune_cached_pod, prune_cached_runner};
pub use reconcile::{
    POD_CREATION_FAILED_EVENT, POD_DELETED_EVENT, POD_DELETED_REASON, in_teardown,
};

use crate::context::{Context, ErrorRequeue};
use crate::error::Error;
use crate::pods::CachedPod;

/// Controller name in metrics and logs (ARC's).
pub const CONTROLLER: &str = "ephemeralrunner";

async fn reconcile(runner: Arc<EphemeralRunner>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.instrumented(
        CONTROLLER,
        runner.as_ref(),
        reconcile::reconcile(Arc::clone(&runner), Arc::clone(&ctx)),
    )
    .await
}

fn error_policy(runner: Arc<EphemeralRunner>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.requeue_after_error(CONTROLLER, runner.as_ref(), error, ErrorRequeue::Backoff)
}

/// Controller name of the teardown lane in metrics and logs.
pub const TEARDOWN_CONTROLLER: &str = "ephemeralrunner-teardown";

async fn teardown(runner: Arc<EphemeralRunner>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.instrumented(
        TEARDOWN_CONTROLLER,
        runner.as_ref(),
        reconcile::teardown(Arc::clone(&runner), Arc::clone(&ctx)),
    )
    .await
}

fn teardown_error_policy(runner: Arc<EphemeralRunner>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.requeue_after_error(
        TEARDOWN_CONTROLLER,
        runner.as_ref(),
        error,
        ErrorRequeue::Backoff,
    )
}

/// Runs the teardown lane until `shutdown` resolves: runners being deleted, and runners whose pod succeeded, are
/// deregistered, their pod and Secret deleted and their finalizers dropped here, with a queue, a concurrency
/// and (in the binary) a client rate limit of their own. In one queue with the runners being created, a finished
/// runner waited behind the whole burst (p99 of 21 s from job finished to runner gone in a 500-job burst).
/// [`reconcile::reconcile`] leaves exactly these runners alone, so each effect has one owner.
pub async fn run_teardown(
    ctx: Arc<Context>,
    runners: impl Stream<Item = Arc<EphemeralRunner>> + Send + 'static,
    pods: impl Stream<Item = Arc<CachedPod>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let config = Config::default().concurrency(ctx.options.runner_teardown_concurrency);
    Controller::for_shared_stream(runners, ctx.stores.runners.clone())
        .owns_shared_stream(pods)
        .with_config(config)
        .graceful_shutdown_on(shutdown)
        .run(teardown, teardown_error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "ephemeral runner teardown event");
            }
        })
        .await;
}

/// Runs the controller until `shutdown` resolves and in-flight reconciles finish.
pub async fn run(
    ctx: Arc<Context>,
    runners: impl Stream<Item = Arc<EphemeralRunner>> + Send + 'static,
    pods: impl Stream<Item = Arc<CachedPod>> + Send + 'static,
    pod_deletions: impl Stream<Item = ObjectRef<EphemeralRunner>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let config = Config::default().concurrency(ctx.options.runner_concurrency);
    Controller::for_shared_stream(runners, ctx.stores.runners.clone())
        .owns_shared_stream(pods)
        .reconcile_on(pod_deletions)
        .with_config(config)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "ephemeral runner controller event");
            }
        })
        .await;
}
