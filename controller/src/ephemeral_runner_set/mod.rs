//! The EphemeralRunnerSet controller (docs/reference/controllers.md, "EphemeralRunnerSet controller"): keeps the
//! number of EphemeralRunners the listener asks for, following the patch-ID protocol, and tears runners down safely
//! on deletion.
//!
//! Wiring: primary sets from the manager's shared set watch; owned runners from the shared runner watch; runner
//! deletions (which shared watches do not forward), and the pods of runners whose status shows no identity yet
//! (a scale-down may wait for them), through `reconcile_on`.

mod reconcile;
pub mod runner;
pub mod scale;

use std::future::Future;
use std::sync::Arc;

use crds::{EphemeralRunner, EphemeralRunnerSet};
use futures::{Stream, StreamExt};
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::ObjectRef;

use crate::context::{Context, ErrorRequeue};
use crate::ephemeral_runner::facts::RunnerMemory;
use crate::error::Error;

/// Controller name in metrics and logs (ARC's).
pub const CONTROLLER: &str = "ephemeralrunnerset";

/// What the set controller's passes share: the manager's context and what the runner controller remembers of
/// its runners, read through [`crate::ephemeral_runner::facts`] alone.
pub struct SetContext {
    /// The manager's context.
    pub base: Arc<Context>,
    /// The runner controller's memory (registrations of pods whose identity no status shows yet; registrations
    /// already removed).
    pub runners: Arc<RunnerMemory>,
}

async fn reconcile(set: Arc<EphemeralRunnerSet>, ctx: Arc<SetContext>) -> Result<Action, Error> {
    ctx.base
        .instrumented(
            CONTROLLER,
            set.as_ref(),
            reconcile::reconcile(Arc::clone(&set), Arc::clone(&ctx)),
        )
        .await
}

fn error_policy(set: Arc<EphemeralRunnerSet>, error: &Error, ctx: Arc<SetContext>) -> Action {
    ctx.base
        .requeue_after_error(CONTROLLER, set.as_ref(), error, ErrorRequeue::Backoff)
}

/// Runs the controller until `shutdown` resolves and in-flight reconciles finish.
pub async fn run(
    ctx: Arc<SetContext>,
    sets: impl Stream<Item = Arc<EphemeralRunnerSet>> + Send + 'static,
    runners: impl Stream<Item = Arc<EphemeralRunner>> + Send + 'static,
    wakeups: impl Stream<Item = ObjectRef<EphemeralRunnerSet>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let config = Config::default().concurrency(ctx.base.options.runner_set_concurrency);
    Controller::for_shared_stream(sets, ctx.base.stores.runner_sets.clone())
        .owns_shared_stream(runners)
        .reconcile_on(wakeups)
        .with_config(config)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "ephemeral runner set controller event");
            }
        })
        .await;
}
