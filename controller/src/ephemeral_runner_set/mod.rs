//! The EphemeralRunnerSet controller (spec §3.3): keeps the number of EphemeralRunners the listener asks for,
//! following the patch-ID protocol, and tears runners down safely on deletion.
//!
//! Wiring: primary sets from the manager's shared set watch; owned runners from the shared runner watch; runner
//! deletions (which shared watches do not forward) through `reconcile_on`.

mod reconcile;
pub mod runner;
pub mod scale;

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crds::{EphemeralRunner, EphemeralRunnerSet};
use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::ObjectRef;

pub use runner::runner_spec_hash;

use crate::context::Context;
use crate::error::Error;

/// Controller name in metrics and logs (ARC's).
pub const CONTROLLER: &str = "ephemeralrunnerset";

fn backoff_key(set: &EphemeralRunnerSet) -> String {
    format!(
        "{CONTROLLER}/{}/{}",
        set.namespace().unwrap_or_default(),
        set.name_any()
    )
}

async fn reconcile(set: Arc<EphemeralRunnerSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let key = backoff_key(&set);
    let result = reconcile::reconcile(set, Arc::clone(&ctx)).await;
    ctx.metrics
        .record_reconcile(CONTROLLER, started, result.as_ref().err());
    if result.is_ok() {
        ctx.backoff.reset(&key);
    }
    result
}

fn error_policy(set: Arc<EphemeralRunnerSet>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.next_delay(&backoff_key(&set));
    tracing::warn!(set = %set.name_any(), namespace = set.namespace().unwrap_or_default(), %error, ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Runs the controller until `shutdown` resolves and in-flight reconciles finish.
pub async fn run(
    ctx: Arc<Context>,
    sets: impl Stream<Item = Arc<EphemeralRunnerSet>> + Send + 'static,
    runners: impl Stream<Item = Arc<EphemeralRunner>> + Send + 'static,
    runner_deletions: impl Stream<Item = ObjectRef<EphemeralRunnerSet>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let config = Config::default().concurrency(ctx.options.runner_set_concurrency);
    Controller::for_shared_stream(sets, ctx.stores.runner_sets.clone())
        .owns_shared_stream(runners)
        .reconcile_on(runner_deletions)
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
