//! The EphemeralRunner controller (docs/reference/controllers.md, "EphemeralRunner controller"): one runner pod per EphemeralRunner, its JIT config Secret, and
//! the runner's registration in the Actions Service.
//!
//! Wiring: primary EphemeralRunners from the manager's shared runner watch; owned runner pods from the shared
//! pod watch; pod deletions (which shared watches do not forward) through `reconcile_on`.

mod cache;
pub mod facts;
pub mod lifecycle;
pub mod memory;
pub mod objects;
pub mod observe;
pub mod passes;
pub mod pod;
pub mod pod_steps;
pub mod policy;
mod reconcile;
pub mod registrations;
pub mod rerun;
pub mod status_patch;
mod step;
mod teardown;

use std::future::Future;
use std::sync::Arc;

use crds::EphemeralRunner;
use std::pin::pin;

use futures::channel::mpsc;
use futures::{FutureExt, Stream, StreamExt, stream};
use kube::ResourceExt;
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::ObjectRef;

pub use cache::{prune_cached_pod, prune_cached_runner};
pub use reconcile::{POD_CREATION_FAILED_EVENT, POD_DELETED_EVENT, POD_DELETED_REASON};

use crate::context::{Context, ErrorRequeue};
use crate::error::Error;
use crate::fair::FairLane;
use crate::pods::CachedPod;
use memory::RunnerMemory;
use passes::PassLocks;

/// Controller name in metrics and logs (ARC's).
pub const CONTROLLER: &str = "ephemeralrunner";

/// What both lanes' passes share: the manager's context, the runners' turns ([`PassLocks`]) and this
/// controller's memory of its runners.
pub struct RunnerContext {
    /// The manager's context.
    pub base: Arc<Context>,
    /// One pass at a time per runner, across both lanes.
    pub passes: PassLocks,
    /// What this process remembers of each runner between passes (its one owner; the watches' hooks and the
    /// set controller reach it through [`facts`]).
    pub memory: Arc<RunnerMemory>,
}

impl RunnerContext {
    /// The context both lanes of the runner controller run with.
    pub fn new(base: Arc<Context>, memory: Arc<RunnerMemory>) -> Self {
        Self {
            base,
            passes: PassLocks::default(),
            memory,
        }
    }
}

async fn reconcile(runner: Arc<EphemeralRunner>, ctx: Arc<RunnerContext>) -> Result<Action, Error> {
    if observe::teardown_lane(&runner, &ctx.base.stores, &ctx.memory) {
        // The teardown lane's runner (its pass would find so too): not worth waiting for its turn.
        return Ok(Action::await_change());
    }
    let _turn = ctx.passes.turn(&runner.uid().unwrap_or_default()).await;
    ctx.base
        .instrumented(
            CONTROLLER,
            runner.as_ref(),
            reconcile::reconcile(Arc::clone(&runner), Arc::clone(&ctx)),
        )
        .await
}

fn error_policy(runner: Arc<EphemeralRunner>, error: &Error, ctx: Arc<RunnerContext>) -> Action {
    ctx.base
        .requeue_after_error(CONTROLLER, runner.as_ref(), error, ErrorRequeue::Backoff)
}

/// Controller name of the teardown lane in metrics and logs.
pub const TEARDOWN_CONTROLLER: &str = "ephemeralrunner-teardown";

async fn teardown(runner: Arc<EphemeralRunner>, ctx: Arc<RunnerContext>) -> Result<Action, Error> {
    if !observe::teardown_lane(&runner, &ctx.base.stores, &ctx.memory) {
        // The main lane's runner: its pass would return at once, after waiting for the main lane's turn.
        return Ok(Action::await_change());
    }
    // A runner being deleted waits for its turn: a main-lane pass may be registering it (the race the turns are
    // for). One whose pod succeeded does not: no main-lane pass registers a runner with a pod, one that follows
    // the pod writes nothing once the teardown began (`observe::ended_meanwhile`), and waiting for such a pass's
    // status write was most of a finished runner's wait in a burst (the `turn` stage, 0.4 s at p99 of 500).
    let asked = std::time::Instant::now();
    let _turn = match runner.metadata.deletion_timestamp {
        Some(_) => Some(ctx.passes.turn(&runner.uid().unwrap_or_default()).await),
        None => None,
    };
    ctx.base
        .metrics
        .teardown(crate::metrics::teardown_stage::TURN, asked.elapsed());
    ctx.base
        .instrumented(
            TEARDOWN_CONTROLLER,
            runner.as_ref(),
            teardown::teardown(Arc::clone(&runner), Arc::clone(&ctx)),
        )
        .await
}

fn teardown_error_policy(
    runner: Arc<EphemeralRunner>,
    error: &Error,
    ctx: Arc<RunnerContext>,
) -> Action {
    ctx.base.requeue_after_error(
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
    ctx: Arc<RunnerContext>,
    runners: impl Stream<Item = Arc<EphemeralRunner>> + Send + 'static,
    pods: impl Stream<Item = Arc<CachedPod>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let config = Config::default().concurrency(ctx.base.options.runner_teardown_concurrency);
    let store = ctx.base.stores.runners.clone();
    Controller::for_shared_stream(runners, store)
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

/// The group a runner's passes take turns in: its EphemeralRunnerSet (by uid), or for a runner no set owns, its
/// namespace.
fn turn_group(runner: &EphemeralRunner) -> String {
    runner
        .owner_references()
        .iter()
        .find(|owner| owner.controller == Some(true))
        .map_or_else(
            || runner.namespace().unwrap_or_default(),
            |owner| owner.uid.clone(),
        )
}

/// The runner of a pass the framework reports as over, whatever its outcome.
fn finished_runner<E, Q>(
    result: &Result<(ObjectRef<EphemeralRunner>, Action), kube::runtime::controller::Error<E, Q>>,
) -> Option<ObjectRef<EphemeralRunner>> {
    use kube::runtime::controller::Error as Failed;
    let erased = match result {
        Ok((runner, _)) => return Some(runner.clone()),
        Err(Failed::ReconcilerFailed(_, runner) | Failed::ObjectNotFound(runner)) => runner,
        Err(_) => return None,
    };
    let runner = ObjectRef::new(&erased.name);
    Some(match &erased.namespace {
        Some(namespace) => runner.within(namespace),
        None => runner,
    })
}

/// Hands the controller framework the passes asked for by watch events, in turns per EphemeralRunnerSet and no
/// faster than its workers take them ([`crate::fair::FairLane`]), until the events end or `shutdown`.
async fn take_turns(
    ctx: Arc<Context>,
    runners: impl Stream<Item = Arc<EphemeralRunner>>,
    pods: impl Stream<Item = Arc<CachedPod>>,
    pod_deletions: impl Stream<Item = ObjectRef<EphemeralRunner>>,
    mut finished: mpsc::UnboundedReceiver<ObjectRef<EphemeralRunner>>,
    passes: mpsc::UnboundedSender<ObjectRef<EphemeralRunner>>,
    shutdown: impl Future<Output = ()>,
) {
    let group_of = |runner: &ObjectRef<EphemeralRunner>| {
        ctx.stores
            .runners
            .get(runner)
            .map(|runner| turn_group(&runner))
    };
    let mut lane = FairLane::new(usize::from(ctx.options.runner_concurrency));
    let (runners, pods, pod_deletions) = (pin!(runners), pin!(pods), pin!(pod_deletions));
    let (mut runners, mut pods, mut pod_deletions) =
        (runners.fuse(), pods.fuse(), pod_deletions.fuse());
    let mut shutdown = pin!(shutdown.fuse());
    loop {
        tokio::select! {
            Some(runner) = runners.next() => lane.ask(turn_group(&runner), ObjectRef::from_obj(runner.as_ref())),
            Some(pod) = pods.next() => {
                // Pods of runners the cache no longer has need no pass (the framework would find nothing).
                let namespace = pod.namespace();
                let owners = pod.owner_references().iter().filter_map(|owner| {
                    ObjectRef::from_owner_ref(namespace.as_deref(), owner, ())
                });
                for runner in owners {
                    if let Some(group) = group_of(&runner) {
                        lane.ask(group, runner);
                    }
                }
            }
            Some(runner) = pod_deletions.next() => {
                if let Some(group) = group_of(&runner) {
                    lane.ask(group, runner);
                }
            }
            Some(runner) = finished.next() => lane.done(&runner),
            () = &mut shutdown => return,
            else => return,
        }
        while let Some(runner) = lane.hand_on() {
            if passes.unbounded_send(runner).is_err() {
                return;
            }
        }
    }
}

/// Runs the controller until `shutdown` resolves and in-flight reconciles finish. At most
/// `--runner-max-concurrent-reconciles` passes run; the passes watch events ask for wait in turns per
/// EphemeralRunnerSet, so that one set's burst does not hold up another set's runners (docs/runner-lifecycle.md,
/// "Scale sets take turns").
pub async fn run(
    ctx: Arc<RunnerContext>,
    runners: impl Stream<Item = Arc<EphemeralRunner>> + Send + 'static,
    pods: impl Stream<Item = Arc<CachedPod>> + Send + 'static,
    pod_deletions: impl Stream<Item = ObjectRef<EphemeralRunner>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let shutdown = shutdown.shared();
    let (passes_tx, passes_rx) = mpsc::unbounded();
    let (finished_tx, finished_rx) = mpsc::unbounded();
    let turns = take_turns(
        Arc::clone(&ctx.base),
        runners,
        pods,
        pod_deletions,
        finished_rx,
        passes_tx,
        shutdown.clone(),
    );
    let config = Config::default().concurrency(ctx.base.options.runner_concurrency);
    let store = ctx.base.stores.runners.clone();
    // The framework's own triggers are only its requeues; every watch event comes through the turns.
    let controller = Controller::for_shared_stream(stream::pending(), store)
        .reconcile_on(passes_rx)
        .with_config(config)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(move |result| {
            if let Some(runner) = finished_runner(&result) {
                // The turns end only at shutdown, when nothing is waiting for this any more.
                let _ = finished_tx.unbounded_send(runner);
            }
            async move {
                if let Err(error) = result {
                    tracing::debug!(%error, "ephemeral runner controller event");
                }
            }
        });
    futures::join!(turns, controller);
}
