//! The manager: shared watches, the controllers, readiness, one shutdown signal.
//!
//! Every watch is started by the manager and shared: runner pods and EphemeralRunners feed the EphemeralRunner
//! controller, EphemeralRunners also feed the EphemeralRunnerSet controller. Each watch hands every object it
//! sees to each of its subscribers itself ([`Fanout`]), and maps deletions to the owner's reconcile. Controllers start only after every
//! watch has listed once, so no reconcile acts on a partial cache (which could duplicate runners after a
//! restart); readiness turns true at that point and false again on shutdown.

use std::fmt::Debug;
use std::hash::Hash;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crds::constants::{
    COMPONENT_LABEL, COMPONENT_LISTENER, EPHEMERAL_RUNNER_LABEL, EPHEMERAL_RUNNER_LABEL_VALUE,
};
use crds::{AutoscalingListener, AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet};
use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use prometheus_client::registry::Registry;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::actions::ActionsClients;
use crate::autoscaling_listener::ListenerContext;
use crate::autoscaling_runner_set::RunnerSetContext;
use crate::completions::{Completions, leaving_with_job, owner_set_key, recorded_registration};
use crate::context::{Context, ErrorBackoff, Expectations, Stores};
use crate::ephemeral_runner::RunnerContext;
use crate::ephemeral_runner::memory::RunnerMemory;
use crate::ephemeral_runner_set::SetContext;
use crate::error::{Error, Result};
use crate::listener_tasks::ListenerTasks;
use crate::metrics::{Metrics, teardown_stage};
use crate::options::{ListenerMode, Options};
use crate::pods::CachedPod;
use crate::relist::with_relist_deletions;
use crate::server::Exposition;
use crate::{autoscaling_listener, autoscaling_runner_set, ephemeral_runner, ephemeral_runner_set};

/// Reporting controller name on Events.
const EVENT_REPORTER: &str = "gha-runner-scale-set-controller";

/// Whether the manager is ready (watches listed, controllers running). Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Whether ready now.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub(crate) fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }
}

/// The controller manager. Build it, hand its registry and readiness to the HTTP servers, then [`Manager::run`].
pub struct Manager {
    client: Client,
    /// The client of the runner teardown lane (its own rate limit); `client` unless set.
    teardown_client: Option<Client>,
    /// The client the watches open their streams on; `client` unless set.
    watch_client: Option<Client>,
    options: Options,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    /// The listener loops, in the manager's listener mode, and the stream of those that ended.
    listener_tasks: Option<(
        Arc<ListenerTasks>,
        mpsc::UnboundedReceiver<ObjectRef<AutoscalingListener>>,
    )>,
}

impl Manager {
    /// A manager using `client` for everything.
    pub fn new(client: Client, options: Options) -> Self {
        let mut registry = Registry::default();
        let metrics = Arc::new(Metrics::register(&mut registry));
        let listener_tasks = (options.listener.mode == ListenerMode::Manager).then(|| {
            let (tasks, endings) = ListenerTasks::new(client.clone());
            (Arc::new(tasks), endings)
        });
        Self {
            client,
            teardown_client: None,
            watch_client: None,
            options,
            registry: Arc::new(registry),
            metrics,
            readiness: Readiness::default(),
            listener_tasks,
        }
    }

    /// Gives the runner teardown lane a client of its own (the binary's has its own rate limit), so that
    /// finished runners never wait for request budget behind runners being created.
    #[must_use]
    pub fn with_teardown_client(mut self, client: Client) -> Self {
        self.teardown_client = Some(client);
        self
    }

    /// Gives the watches a client of their own, outside the budget of requests in flight
    /// ([`crate::inflight`]): a watch the API server closed is opened again at once, not after the controllers'
    /// requests queued before it. An overloaded API server closes the watches that fall behind (the benchmark's
    /// 2000-runner runs, docs/benchmarks.md), and until its watch is back a finished runner's pod exit reaches no one.
    /// A watch holds a place in no budget once open, so leaving it out costs the budget's purpose nothing.
    #[must_use]
    pub fn with_watch_client(mut self, client: Client) -> Self {
        self.watch_client = Some(client);
        self
    }

    /// Gives the listener loops of the manager's listener mode a client of their own (the binary's has its own rate
    /// limit), so that scaling patches never wait for request budget behind the runners being created.
    #[must_use]
    pub fn with_listener_client(mut self, client: Client) -> Self {
        if self.listener_tasks.is_some() {
            let (tasks, endings) = ListenerTasks::new(client);
            self.listener_tasks = Some((Arc::new(tasks), endings));
        }
        self
    }

    /// The metrics registry, for `/metrics`.
    pub fn registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry)
    }

    /// What `/metrics` shows: the registry, and in the manager's listener mode every listener's metrics.
    pub fn exposition(&self) -> Exposition {
        Exposition {
            registry: Arc::clone(&self.registry),
            listeners: self
                .listener_tasks
                .as_ref()
                .map(|(tasks, _)| Arc::clone(tasks)),
        }
    }

    /// The readiness flag, for `/readyz`.
    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        self.api_on(self.client.clone())
    }

    /// [`Manager::api`] on the watches' client.
    fn watched<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        self.api_on(self.watch_client())
    }

    fn api_on<K>(&self, client: Client) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.options.watch_namespace {
            Some(namespace) => Api::namespaced(client, namespace),
            None => Api::all(client),
        }
    }

    fn watch_client(&self) -> Client {
        self.watch_client
            .clone()
            .unwrap_or_else(|| self.client.clone())
    }

    /// Checks that the CRDs are served, so a missing installation fails fast with a hint.
    async fn preflight(&self) -> Result<()> {
        self.probe::<EphemeralRunnerSet>().await?;
        self.probe::<EphemeralRunner>().await
    }

    /// Lists at most one `K`: fails when its CRD is not served.
    async fn probe<K>(&self) -> Result<()>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Debug,
    {
        self.api::<K>()
            .list(&ListParams::default().limit(1))
            .await
            .map(drop)
            .map_err(|source| Error::CrdMissing {
                kind: K::kind(&()),
                source: Box::new(source),
            })
    }

    /// Runs every controller until `shutdown` is cancelled, then lets in-flight reconciles finish.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<()> {
        self.preflight().await?;
        let (listener_tasks, listener_endings) = self.listener_tasks.take().unzip();
        // Watches outlive the controllers by a little: they stop once the controllers have drained.
        let stop_watches = CancellationToken::new();
        let _stop_on_exit = stop_watches.clone().drop_guard();

        let (set_store, set_writer) = reflector::store::<EphemeralRunnerSet>();
        let mut set_fanout = Fanout::default();
        let sets_for_set_controller = set_fanout.subscribe();
        let (runner_store, runner_writer) = reflector::store::<EphemeralRunner>();
        let mut runner_fanout = Fanout::default();
        let runners_for_runner_controller = runner_fanout.subscribe();
        let runners_for_set_controller = runner_fanout.subscribe();
        let runners_for_teardown = runner_fanout.subscribe();
        let (pod_store, pod_writer) = reflector::store::<CachedPod>();
        let mut pod_fanout = Fanout::default();
        let pods_for_runner_controller = pod_fanout.subscribe();
        let pods_for_teardown = pod_fanout.subscribe();

        // The AutoscalingRunnerSet and AutoscalingListener controllers need the controller namespace (where
        // listeners live); without it only the runner controllers run.
        let scale_set_watches = match &self.options.listener.namespace {
            Some(namespace) => Some(ScaleSetWatches::new(
                namespace,
                &mut set_fanout,
                &mut runner_fanout,
                &mut pod_fanout,
            )),
            None => {
                tracing::warn!(
                    "no controller namespace (CONTROLLER_MANAGER_POD_NAMESPACE): the AutoscalingRunnerSet and \
                     AutoscalingListener controllers do not run"
                );
                None
            }
        };

        // Sets to reconcile beyond their own and their runners' changes: a runner of theirs deleted (the shared
        // watches forward no deletions), or a pod made for a runner whose status shows no identity yet.
        let (set_wakeup_tx, set_wakeup_rx) = mpsc::unbounded::<ObjectRef<EphemeralRunnerSet>>();
        let expectations = Arc::new(Expectations::default());
        let runner_memory = Arc::new(RunnerMemory::default());
        let (deleted_expectations, deleted_memory) =
            (Arc::clone(&expectations), Arc::clone(&runner_memory));
        let applied_memory = Arc::clone(&runner_memory);
        let completions = Arc::new(Completions::default());
        let (applied_completions, deleted_completions) =
            (Arc::clone(&completions), Arc::clone(&completions));
        let (runner_metrics, deleted_runner_metrics) =
            (Arc::clone(&self.metrics), Arc::clone(&self.metrics));
        let (pod_metrics, deleted_pod_metrics) =
            (Arc::clone(&self.metrics), Arc::clone(&self.metrics));
        runner_fanout.observe(move |runner: &EphemeralRunner| {
            applied_memory.observe_runner(runner);
            if runner.meta().deletion_timestamp.is_some() {
                runner_metrics.deletion_shown(teardown_stage::RUNNER_WATCH, uid_of(runner));
            }
            if leaving_with_job(runner, false)
                && let Some(key) = owner_set_key(runner)
            {
                applied_completions.left(&key, &runner.name_any(), recorded_registration(runner));
            }
        });
        // A runner's pod that has not started, of a runner whose status records no identity yet: its set's scale-down
        // keeps a runner without a known registration until its pod exists (docs/runner-lifecycle.md, "Scale-down:
        // which runners may go"), and the runner's own status shows nothing of the pod, so the pod's event is the
        // set's to hear.
        let (pod_runners, pod_set_tx) = (runner_store.clone(), set_wakeup_tx.clone());
        let succeeded_memory = Arc::clone(&runner_memory);
        let ending_pod_memory = Arc::clone(&runner_memory);
        pod_fanout.observe(move |pod: &CachedPod| {
            if pod.meta().deletion_timestamp.is_some() {
                pod_metrics.deletion_shown(teardown_stage::POD_WATCH, uid_of(pod));
            }
            if succeeded_memory.observe_pod(pod) {
                // Its runner's end: the teardown lane's, nothing of the set's.
                return;
            }
            if !crate::ephemeral_runner::policy::runner_not_started(pod) {
                return;
            }
            let Some(runner) = controller_owner::<_, EphemeralRunner>(pod)
                .and_then(|runner| pod_runners.get(&runner))
            else {
                return;
            };
            if runner
                .status
                .as_ref()
                .is_some_and(|status| status.runner_id != 0)
            {
                return;
            }
            if let Some(set) = controller_owner::<_, EphemeralRunnerSet>(runner.as_ref()) {
                let _ = pod_set_tx.unbounded_send(set);
            }
        });
        let (pod_deleted_tx, pod_deleted_rx) = mpsc::unbounded::<ObjectRef<EphemeralRunner>>();

        let watches = [
            spawn_watch(
                self.watched::<EphemeralRunnerSet>(),
                watcher::Config::default(),
                set_writer,
                set_fanout,
                |_| {},
                stop_watches.clone(),
            ),
            spawn_pruned_watch(
                self.watched::<EphemeralRunner>(),
                watcher::Config::default(),
                runner_writer,
                runner_fanout,
                move |runner: &EphemeralRunner| {
                    let uid = uid_of(runner);
                    deleted_runner_metrics.deletion_shown(teardown_stage::RUNNER_WATCH, uid);
                    deleted_memory.forget(uid);
                    if let Some(owner) = controller_owner::<_, EphemeralRunnerSet>(runner) {
                        let key = crate::completions::set_key(
                            owner.namespace.as_deref().unwrap_or_default(),
                            &owner.name,
                        );
                        if leaving_with_job(runner, true) {
                            deleted_completions.left(
                                &key,
                                &runner.name_any(),
                                recorded_registration(runner),
                            );
                        }
                        deleted_expectations.gone(&key, &runner.name_any());
                        let _ = set_wakeup_tx.unbounded_send(owner);
                    }
                },
                crate::ephemeral_runner::prune_cached_runner,
                stop_watches.clone(),
            ),
            spawn_pruned_watch(
                self.watched::<CachedPod>(),
                watcher::Config::default().labels(&format!(
                    "{EPHEMERAL_RUNNER_LABEL}={EPHEMERAL_RUNNER_LABEL_VALUE}"
                )),
                pod_writer,
                pod_fanout,
                move |pod: &CachedPod| {
                    deleted_pod_metrics.deletion_shown(teardown_stage::POD_WATCH, uid_of(pod));
                    // The pod's last state (an unbound pod's eviction deletes it at once: this event is the only
                    // one that shows how), remembered before its runner's pass runs.
                    ending_pod_memory.observe_pod_end(pod);
                    if let Some(owner) = controller_owner::<_, EphemeralRunner>(pod) {
                        let _ = pod_deleted_tx.unbounded_send(owner);
                    }
                },
                crate::ephemeral_runner::prune_cached_pod,
                stop_watches.clone(),
            ),
        ];

        let (scale_set_parts, extra_watches) = match scale_set_watches {
            Some(watches) => {
                let (parts, handles) = watches.spawn(&self, &stop_watches);
                (Some(parts), handles)
            }
            None => (None, Vec::new()),
        };
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            ready = wait_ready(&set_store, &runner_store, &pod_store) => ready?,
        }
        if let Some(parts) = &scale_set_parts {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                ready = parts.wait_ready() => ready?,
            }
        }
        tracing::info!("watches listed; starting controllers");

        let ctx = Arc::new(Context {
            teardown_client: self
                .teardown_client
                .clone()
                .unwrap_or_else(|| self.client.clone()),
            recorder: Recorder::new(
                self.client.clone(),
                Reporter {
                    controller: EVENT_REPORTER.to_owned(),
                    instance: std::env::var("CONTROLLER_MANAGER_POD_NAME").ok(),
                },
            ),
            actions: ActionsClients::new(
                self.client.clone(),
                self.options.actions_call_timeout,
                self.options.build_version.clone(),
                Arc::clone(&self.metrics),
            )
            .with_vault_options(self.options.vault.clone()),
            stores: Stores {
                runner_sets: set_store,
                runners: runner_store,
                pods: pod_store,
            },
            backoff: ErrorBackoff::new(
                self.options.error_backoff_min,
                self.options.error_backoff_max,
            ),
            expectations,
            completions,
            listener_tasks: listener_tasks.clone(),
            metrics: Arc::clone(&self.metrics),
            client: self.client.clone(),
            options: self.options.clone(),
        });
        self.readiness.set(true);
        let stopped = |token: &CancellationToken| token.clone().cancelled_owned();
        let scale_set_controllers = async {
            if let Some(parts) = scale_set_parts {
                parts
                    .run(Arc::clone(&ctx), listener_endings, &shutdown)
                    .await;
            }
        };
        // Both lanes of the runner controller share its memory and take turns per runner.
        let runner_ctx = Arc::new(RunnerContext::new(
            Arc::clone(&ctx),
            Arc::clone(&runner_memory),
        ));
        let set_ctx = Arc::new(SetContext {
            base: Arc::clone(&ctx),
            runners: runner_memory,
        });
        futures::join!(
            scale_set_controllers,
            ephemeral_runner::run(
                Arc::clone(&runner_ctx),
                runners_for_runner_controller,
                pods_for_runner_controller,
                pod_deleted_rx,
                stopped(&shutdown),
            ),
            ephemeral_runner::run_teardown(
                runner_ctx,
                runners_for_teardown,
                pods_for_teardown,
                stopped(&shutdown),
            ),
            ephemeral_runner_set::run(
                set_ctx,
                sets_for_set_controller,
                runners_for_set_controller,
                set_wakeup_rx,
                stopped(&shutdown),
            ),
        );
        self.readiness.set(false);
        if let Some(tasks) = &listener_tasks {
            // After the controllers, so no pass starts a loop again; before the Lease goes, so the next leader's
            // loops find the sessions closed.
            tasks.stop_all().await;
        }
        stop_watches.cancel();
        for watch in watches.into_iter().chain(extra_watches) {
            // A watch task only ends by being told to; a panic inside it is already logged by tokio.
            let _ = watch.await;
        }
        tracing::info!("controllers stopped");
        Ok(())
    }
}

/// The shared watches of the AutoscalingRunnerSet and AutoscalingListener controllers, before they run.
struct ScaleSetWatches {
    runner_set_writer: reflector::store::Writer<AutoscalingRunnerSet>,
    runner_set_fanout: Fanout<AutoscalingRunnerSet>,
    listener_writer: reflector::store::Writer<AutoscalingListener>,
    listener_fanout: Fanout<AutoscalingListener>,
    pod_writer: reflector::store::Writer<Pod>,
    pod_fanout: Fanout<Pod>,
    parts: ScaleSetParts,
    pod_deleted: mpsc::UnboundedSender<ObjectRef<AutoscalingListener>>,
}

type SharedStream<K> = mpsc::UnboundedReceiver<Arc<K>>;

/// What the two controllers consume once the watches run.
struct ScaleSetParts {
    namespace: String,
    runner_set_store: Store<AutoscalingRunnerSet>,
    runner_sets: SharedStream<AutoscalingRunnerSet>,
    ephemeral_runner_sets: SharedStream<EphemeralRunnerSet>,
    listener_store: Store<AutoscalingListener>,
    listeners_for_runner_sets: SharedStream<AutoscalingListener>,
    listeners: SharedStream<AutoscalingListener>,
    pod_store: Store<Pod>,
    pods_for_runner_sets: SharedStream<Pod>,
    pods_for_listeners: SharedStream<Pod>,
    pod_deletions: mpsc::UnboundedReceiver<ObjectRef<AutoscalingListener>>,
    /// Runners and runner pods, for the `RunnersCanStart` condition.
    runners_for_runner_sets: SharedStream<EphemeralRunner>,
    runner_pods_for_runner_sets: SharedStream<CachedPod>,
}

/// Where a watch's objects go: every applied object to every subscriber, unbounded.
///
/// The project fans out itself because kube-runtime's shared reflector (`reflect_shared`, 5.0) does not serve
/// these controllers. It hands no deletions to subscribers (https://github.com/kube-rs/kube/issues/1590, open);
/// the watches here map each deletion to its owner's reconcile instead (`on_delete` of [`spawn_watch`]). Its
/// subscription (`ReflectHandle`) looks each event's object up in the store and, when it is already gone from
/// there (deleted a moment later, as finished runners and their pods are), returns `Pending` without registering
/// a waker. Inside a controller's trigger streams that subscriber is then never polled again, and the controller
/// stops hearing about that kind for good: in a 500-job burst, runners whose pods had finished waited for the
/// five-minute resync, and jobs for the runner set's next scale-up waited with them. Handing out the event's own
/// object avoids the lookup. Its buffer is bounded, so a full one holds up the watch; an unbounded channel keeps
/// a slow controller from doing that (its items are consumed as fast as triggers are scheduled).
struct Fanout<K> {
    subscribers: Vec<mpsc::UnboundedSender<Arc<K>>>,
    /// Told of every applied object first, once the store holds it.
    observer: Option<Observer<K>>,
}

/// A callback told of every applied object.
type Observer<K> = Box<dyn Fn(&K) + Send + Sync>;

impl<K> Default for Fanout<K> {
    fn default() -> Self {
        Self {
            subscribers: Vec::new(),
            observer: None,
        }
    }
}

impl<K> Fanout<K> {
    /// A new subscriber: every object applied from now on.
    fn subscribe(&mut self) -> SharedStream<K> {
        let (tx, rx) = mpsc::unbounded();
        self.subscribers.push(tx);
        rx
    }

    /// Calls `observer` with every applied object, after the store has it and before any subscriber. One observer
    /// per fanout: a second call replaces the first.
    fn observe(&mut self, observer: impl Fn(&K) + Send + Sync + 'static) {
        self.observer = Some(Box::new(observer));
    }

    fn send(&self, obj: K) {
        if let Some(observer) = &self.observer {
            observer(&obj);
        }
        if self.subscribers.is_empty() {
            return;
        }
        let obj = Arc::new(obj);
        for subscriber in &self.subscribers {
            // A subscriber gone (its controller stopped) is no reason to stop the others.
            let _ = subscriber.unbounded_send(Arc::clone(&obj));
        }
    }
}

impl ScaleSetWatches {
    fn new(
        namespace: &str,
        ephemeral_runner_sets: &mut Fanout<EphemeralRunnerSet>,
        runners: &mut Fanout<EphemeralRunner>,
        runner_pods: &mut Fanout<CachedPod>,
    ) -> Self {
        let (runner_set_store, runner_set_writer) = reflector::store();
        let (listener_store, listener_writer) = reflector::store();
        let (pod_store, pod_writer) = reflector::store();
        let mut runner_set_fanout = Fanout::default();
        let mut listener_fanout = Fanout::default();
        let mut pod_fanout = Fanout::default();
        let (pod_deleted, pod_deletions) = mpsc::unbounded();
        let parts = ScaleSetParts {
            namespace: namespace.to_owned(),
            runner_sets: runner_set_fanout.subscribe(),
            runner_set_store,
            ephemeral_runner_sets: ephemeral_runner_sets.subscribe(),
            listeners_for_runner_sets: listener_fanout.subscribe(),
            listeners: listener_fanout.subscribe(),
            listener_store,
            pods_for_runner_sets: pod_fanout.subscribe(),
            pods_for_listeners: pod_fanout.subscribe(),
            pod_store,
            pod_deletions,
            runners_for_runner_sets: runners.subscribe(),
            runner_pods_for_runner_sets: runner_pods.subscribe(),
        };
        Self {
            runner_set_writer,
            runner_set_fanout,
            listener_writer,
            listener_fanout,
            pod_writer,
            pod_fanout,
            parts,
            pod_deleted,
        }
    }

    fn spawn(
        self,
        manager: &Manager,
        stop: &CancellationToken,
    ) -> (ScaleSetParts, Vec<JoinHandle<()>>) {
        let client = manager.watch_client();
        let namespace = self.parts.namespace.clone();
        let pod_deleted = self.pod_deleted;
        let handles = vec![
            spawn_watch(
                manager.watched::<AutoscalingRunnerSet>(),
                watcher::Config::default(),
                self.runner_set_writer,
                self.runner_set_fanout,
                |_| {},
                stop.clone(),
            ),
            spawn_watch(
                Api::<AutoscalingListener>::namespaced(client.clone(), &namespace),
                watcher::Config::default(),
                self.listener_writer,
                self.listener_fanout,
                |_| {},
                stop.clone(),
            ),
            spawn_watch(
                Api::<Pod>::namespaced(client, &namespace),
                watcher::Config::default()
                    .labels(&format!("{COMPONENT_LABEL}={COMPONENT_LISTENER}")),
                self.pod_writer,
                self.pod_fanout,
                move |pod: &Pod| {
                    if let Some(owner) = controller_owner::<_, AutoscalingListener>(pod) {
                        let _ = pod_deleted.unbounded_send(owner);
                    }
                },
                stop.clone(),
            ),
        ];
        (self.parts, handles)
    }
}

impl ScaleSetParts {
    async fn wait_ready(&self) -> Result<()> {
        listed(&self.runner_set_store).await?;
        listed(&self.listener_store).await?;
        listed(&self.pod_store).await
    }

    async fn run(
        self,
        ctx: Arc<Context>,
        listener_endings: Option<mpsc::UnboundedReceiver<ObjectRef<AutoscalingListener>>>,
        shutdown: &CancellationToken,
    ) {
        let runner_set_ctx = Arc::new(RunnerSetContext::new(
            Arc::clone(&ctx),
            self.namespace.clone(),
            self.listener_store.clone(),
            self.pod_store.clone(),
        ));
        let listener_ctx = Arc::new(ListenerContext {
            client: ctx
                .listener_tasks
                .as_ref()
                .map_or_else(|| ctx.client.clone(), |tasks| tasks.client()),
            base: Arc::clone(&ctx),
            pods: self.pod_store,
            namespace: self.namespace,
        });
        let blockages = autoscaling_runner_set::runners::blockage_changes(
            self.runners_for_runner_sets,
            self.runner_pods_for_runner_sets,
            ctx.stores.runners.clone(),
            ctx.options.pending_pod_limit,
        );
        let rbac_namespace = ctx.options.watch_namespace.clone();
        futures::join!(
            autoscaling_runner_set::run(
                runner_set_ctx,
                self.runner_sets,
                self.runner_set_store,
                self.ephemeral_runner_sets,
                self.listeners_for_runner_sets,
                self.pods_for_runner_sets,
                blockages,
                shutdown.clone().cancelled_owned(),
            ),
            autoscaling_listener::run(
                listener_ctx,
                self.listeners,
                self.listener_store,
                self.pods_for_listeners,
                self.pod_deletions,
                listener_endings,
                rbac_namespace,
                shutdown.clone().cancelled_owned(),
            ),
        );
    }
}

async fn wait_ready(
    sets: &Store<EphemeralRunnerSet>,
    runners: &Store<EphemeralRunner>,
    pods: &Store<CachedPod>,
) -> Result<()> {
    listed(sets).await?;
    listed(runners).await?;
    listed(pods).await
}

/// Waits until `store`'s watch has delivered its initial list.
async fn listed<K>(store: &Store<K>) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .wait_until_ready()
        .await
        .map_err(|_| Error::WatchNotReady { kind: K::kind(&()) })
}

/// The owner of kind `O` that controls `obj`.
fn controller_owner<K: Resource, O: Resource<DynamicType = ()>>(obj: &K) -> Option<ObjectRef<O>> {
    let kind = O::kind(&());
    let owner = obj
        .owner_references()
        .iter()
        .find(|owner| owner.controller == Some(true) && owner.kind == kind)?;
    Some(ObjectRef::new(&owner.name).within(&obj.namespace()?))
}

/// Drives a watch into its store until `stop`, handing every applied object to the subscribers and calling
/// `on_delete` for every deleted one, also those a re-list shows only by leaving them out.
fn spawn_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    fanout: Fanout<K>,
    on_delete: impl Fn(&K) + Send + 'static,
    stop: CancellationToken,
) -> JoinHandle<()>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    spawn_pruned_watch(api, config, writer, fanout, on_delete, |_| {}, stop)
}

/// [`spawn_watch`] with `prune` applied to every object before it is cached or handed out: the cache holds
/// every runner and pod for as long as they live, so what the controllers never read is dropped on arrival.
/// `managedFields` always go (server-side apply bookkeeping; often the largest part of an object).
fn spawn_pruned_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    fanout: Fanout<K>,
    on_delete: impl Fn(&K) + Send + 'static,
    prune: impl Fn(&mut K) + Send + 'static,
    stop: CancellationToken,
) -> JoinHandle<()>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let cache = writer.as_reader();
    tokio::spawn(async move {
        let mut events = pin!(with_relist_deletions(
            watcher(api, config)
                .default_backoff()
                .modify(move |obj| {
                    obj.managed_fields_mut().clear();
                    prune(obj);
                })
                .reflect(writer),
            cache,
        ));
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                event = events.next() => match event {
                    Some(Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj))) => fanout.send(obj),
                    Some(Ok(watcher::Event::Delete(obj))) => on_delete(&obj),
                    Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
                    Some(Err(error)) => tracing::warn!(%error, kind = %K::kind(&K::DynamicType::default()), "watch error; retrying"),
                    None => return,
                },
            }
        }
    })
}

/// An object's uid, empty for one the API server has not stored.
fn uid_of<K: Resource>(object: &K) -> &str {
    object.meta().uid.as_deref().unwrap_or_default()
}
