//! One scale set on one machine, the way a user installs it: the local control plane, the fake Actions Service,
//! the manager (in-process), the listener-pod executor running the real listener binary, the runner simulator,
//! and the objects a default `helm template` of the scale-set chart renders, created as Helm would create them.
//! More scale sets can be installed beside the first ([`World::install_scale_set`]), each its own release with
//! its own listener process.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use chart_tests::{Chart, Template};
use controller::{Manager, Options};
use crds::{AutoscalingListener, AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet};
use fake_actions_service::{EnqueueJobs, FakeActionsService, JobState, StateSnapshot};
use k8s_openapi::api::core::v1::{Event, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};
use test_harness::process::Supervised;
use test_harness::{ListenerExecutor, TestContext};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::manager_rbac::{self, ManagerCredentials};
use crate::simulator::{PodStage, Simulator, SimulatorConfig};
use crate::{Error, Result};

/// The token the rendered credentials Secret carries (the fake accepts any in lenient mode).
pub const GITHUB_TOKEN: &str = "ghp_e2e";
/// The organization in the config URL.
pub const ORGANIZATION: &str = "e2e-org";
/// The controller chart's ServiceAccount, which the manager runs as (`manager_rbac`), named in the scale-set chart's
/// manager RoleBinding.
pub const CONTROLLER_SERVICE_ACCOUNT: &str = "arc-rs-controller";
/// Label selector of runner pods.
pub const RUNNER_POD_SELECTOR: &str = "actions-ephemeral-runner=True";

/// What to build.
#[derive(Debug, Clone)]
pub struct WorldConfig {
    /// Helm release name, which is also the AutoscalingRunnerSet's and the scale set's name.
    pub release: String,
    /// Chart values on top of the required ones (URL, token, controller ServiceAccount), e.g.
    /// `{"minRunners": 2, "maxRunners": 10}`.
    pub values: Value,
    /// Runner behaviour.
    pub simulator: SimulatorConfig,
    /// The fake's configuration.
    pub fake: fake_actions_service::Config,
    /// Adjusts the manager's options after the world's defaults (short delays, this world's namespaces).
    /// In-process only: the manager binary gets its flags (see [`World::manager_args`]).
    pub tune: fn(&mut Options),
    /// Run the real `manager` binary as a child process, with the flags a Deployment would pass and its
    /// production timings, instead of the manager in this process with short test delays. The benchmark uses
    /// it to measure the manager's memory on its own.
    pub manager_process: bool,
    /// Extra flags for the manager binary (with `manager_process`), after the world's own.
    pub manager_args: Vec<String>,
    /// Controller chart values whose RBAC the manager gets (`manager_rbac`), e.g. `{"replicaCount": 2}`, whose
    /// leader-election Role a manager with `--enable-leader-election` needs.
    pub controller_values: Value,
    /// A control plane of this world's own ([`test_harness::own_control_plane`]), stopped at
    /// [`World::shutdown`], for a world that counts the API server's requests while other tests of its binary
    /// run or have just run.
    pub own_control_plane: bool,
}

impl Default for WorldConfig {
    fn default() -> Self {
        Self {
            release: "arc-e2e".to_owned(),
            values: json!({}),
            simulator: SimulatorConfig::default(),
            // Sessions of a killed listener must expire quickly enough for its successor to take over.
            fake: fake_actions_service::Config {
                session_idle_timeout: Some(Duration::from_secs(20)),
                long_poll_timeout: Duration::from_secs(10),
                job_delivery: default_job_delivery(),
                ..fake_actions_service::Config::default()
            },
            tune: |_| {},
            manager_process: false,
            manager_args: Vec::new(),
            controller_values: json!({}),
            own_control_plane: false,
        }
    }
}

/// How the fake hands jobs over unless a test says otherwise: GHES's acquire flow, or github.com's direct assignment
/// with `E2E_JOB_DELIVERY=direct` (tests/run.sh runs the scale-set suite both ways).
///
/// # Panics
/// On any other value of `E2E_JOB_DELIVERY`: a typo must not run the suite in the mode it did not ask for.
pub fn default_job_delivery() -> fake_actions_service::JobDelivery {
    use fake_actions_service::JobDelivery;
    match std::env::var("E2E_JOB_DELIVERY").as_deref() {
        Err(_) | Ok("acquire") => JobDelivery::Acquire,
        Ok("direct") => JobDelivery::Direct,
        Ok(other) => panic!("E2E_JOB_DELIVERY={other}: expected acquire or direct"),
    }
}

/// The running manager.
enum RunningManager {
    /// In this process.
    Task {
        shutdown: CancellationToken,
        task: JoinHandle<controller::Result<()>>,
    },
    /// The `manager` binary as a child process.
    Process {
        process: Supervised,
        metrics_url: String,
        /// The command line's flags.
        flags: Vec<String>,
    },
}

/// A manager process started beside the world's ([`World::start_replica`]).
pub struct Replica {
    process: Supervised,
}

impl Replica {
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// How it ended, if it did (a replica should not end by itself), with the end of its log.
    pub fn exited(&mut self) -> Option<String> {
        let status = self.process.exited()?;
        Some(format!(
            "the replica exited ({status}); its log ends with:\n{}",
            self.process.log_tail(4000)
        ))
    }

    /// The end of its log.
    pub fn log_tail(&self, max: u64) -> String {
        self.process.log_tail(max)
    }

    /// SIGKILL, as if its node died, then waits for it to end (off the async threads).
    pub async fn kill(mut self) -> Result<()> {
        self.process
            .kill()
            .map_err(|e| Error::Manager(format!("killing the replica: {e}")))?;
        self.stop().await
    }

    /// SIGTERM, then waits for it to end (off the async threads).
    pub async fn stop(mut self) -> Result<()> {
        tokio::task::spawn_blocking(move || self.process.stop())
            .await
            .map_err(|e| Error::Manager(e.to_string()))
    }
}

/// Everything one scale set needs, running.
pub struct World {
    pub ctx: TestContext,
    /// Where the listener lives (the controller's namespace).
    pub controller_namespace: String,
    pub fake: FakeActionsService,
    pub config_url: String,
    pub release: String,
    /// The objects the chart rendered, as created.
    pub rendered: Vec<Value>,
    pub simulator: Simulator,
    executor: Option<ListenerExecutor>,
    manager: Mutex<Option<RunningManager>>,
    /// Why the last [`World::start_manager`] failed.
    manager_start_error: Mutex<Option<String>>,
    /// The manager binary, when it runs as a process.
    manager_binary: Option<PathBuf>,
    /// [`WorldConfig::manager_args`].
    extra_manager_args: Vec<String>,
    /// Where the manager process keeps its kubeconfig and log.
    manager_dir: tempfile::TempDir,
    /// The controller chart's ServiceAccount, as the manager acts.
    manager_credentials: ManagerCredentials,
    tune: fn(&mut Options),
    enqueued: Mutex<Vec<i64>>,
    /// [`WorldConfig::own_control_plane`]: stopped at [`World::shutdown`].
    own_control_plane: bool,
}

/// Counts at one moment, for assertions and the demo's live view.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    /// Jobs enqueued through this world, not running yet.
    pub jobs_queued: usize,
    pub jobs_running: usize,
    pub jobs_done: usize,
    /// The listener's desired replicas (EphemeralRunnerSet `spec.replicas`).
    pub desired_replicas: i64,
    /// EphemeralRunners by phase (`Pending`, `Running`, ...; empty phase as `New`).
    pub runners: BTreeMap<String, usize>,
    pub runner_pods_pending: usize,
    pub runner_pods_running: usize,
    /// Simulated runners that exited after their job.
    pub runners_finished: usize,
    /// Simulated pods that failed to start.
    pub start_failures: usize,
    /// Runners registered in the fake for this scale set.
    pub registered_runners: usize,
}

impl World {
    /// Builds and starts everything; the manager runs and the scale set is installed when this returns.
    pub async fn start(prefix: &str, config: WorldConfig) -> Result<Self> {
        let ctx = if config.own_control_plane {
            let control_plane = test_harness::own_control_plane()
                .await
                .map_err(Error::ControlPlane)?;
            TestContext::try_new_on(control_plane, prefix).await
        } else {
            TestContext::try_new(prefix).await
        }
        .map_err(Error::ControlPlane)?;
        test_harness::apply_crds(&ctx.client, &crds::all_crds()).await?;
        let controller_namespace =
            test_harness::create_namespace(&ctx.client, &format!("{prefix}-system")).await?;
        let fake = FakeActionsService::start(config.fake.clone()).await?;
        let config_url = format!("{}/{ORGANIZATION}", fake.base_url());

        let binary = listener_binary()?;
        let manager_binary = if config.manager_process {
            Some(uplifted_binary("controller", "manager")?)
        } else {
            None
        };
        let manager_dir = tempfile::Builder::new()
            .prefix("arc-rs-e2e-manager-")
            .tempdir()
            .map_err(|e| Error::ControlPlane(format!("creating the manager's directory: {e}")))?;
        let mut manager_dir = manager_dir;
        if config.manager_process && test_harness::keep_logs() {
            manager_dir.disable_cleanup(true);
            eprintln!("manager log kept in {}", manager_dir.path().display());
        }
        // The controller chart's default (cluster-wide) RBAC; the real-node tier runs its single-namespace mode.
        let manager_credentials =
            manager_rbac::install(&ctx, &controller_namespace, None, &config.controller_values)
                .await?;
        let executor = ListenerExecutor::start(
            ctx.control_plane,
            ctx.client.clone(),
            Some(&controller_namespace),
            binary,
        )?;
        let simulator = Simulator::start(
            ctx.client.clone(),
            Some(&ctx.namespace),
            fake.state(),
            config.simulator.clone(),
        );
        let rendered = render_scale_set(
            &config.release,
            &ctx.namespace,
            &config_url,
            &controller_namespace,
            &config.values,
        )?;
        let world = Self {
            ctx,
            controller_namespace,
            fake,
            config_url,
            release: config.release,
            rendered,
            simulator,
            executor: Some(executor),
            manager: Mutex::new(None),
            manager_start_error: Mutex::default(),
            manager_binary,
            extra_manager_args: config.manager_args,
            manager_dir,
            manager_credentials,
            tune: config.tune,
            enqueued: Mutex::default(),
            own_control_plane: config.own_control_plane,
        };
        world.try_start_manager()?;
        world.install().await?;
        Ok(world)
    }

    pub fn client(&self) -> Client {
        self.ctx.client.clone()
    }

    /// The namespace of the scale set and its runners.
    pub fn namespace(&self) -> &str {
        &self.ctx.namespace
    }

    /// The manager's options: this world's namespaces and short delays, then the world's `tune`.
    pub fn options(&self) -> Options {
        let mut options = Options {
            watch_namespace: Some(self.ctx.namespace.clone()),
            // The AutoscalingRunnerSet controller deletes sets whose `app.kubernetes.io/version` label differs
            // from its build (ARC's rule), so the build version is the one the chart rendered.
            build_version: self.chart_version(),
            actions_call_timeout: Duration::from_secs(10),
            // The production resync: a short one would hide a missed watch event (a lost trigger then only
            // costs a few seconds), which is exactly what these suites must catch.
            resync_interval: Options::default().resync_interval,
            error_backoff_min: Duration::from_millis(200),
            error_backoff_max: Duration::from_secs(2),
            scale_set_check_interval: Duration::from_secs(5),
            configuration_error_backoff: Duration::from_secs(5),
            ..Options::default()
        };
        options.listener.namespace = Some(self.controller_namespace.clone());
        options.listener.image = "ghcr.io/arc-rs/arc-rs:e2e".to_owned();
        options.listener.log_level = "info".to_owned();
        options.runner.failure_backoff_base = Duration::from_millis(200);
        options.runner.job_still_running_requeue = Duration::from_millis(500);
        options.runner.pod_rejection_retry = Duration::from_secs(1);
        options.runner.disruption_backoff_max = Duration::from_secs(1);
        options.scale_down.ready_grace_period = Duration::ZERO;
        (self.tune)(&mut options);
        options
    }

    /// The `app.kubernetes.io/version` the chart put on the AutoscalingRunnerSet.
    pub fn chart_version(&self) -> String {
        self.rendered
            .iter()
            .find(|o| o["kind"] == "AutoscalingRunnerSet")
            .and_then(|o| o["metadata"]["labels"]["app.kubernetes.io/version"].as_str())
            .unwrap_or(env!("CARGO_PKG_VERSION"))
            .to_owned()
    }

    /// Starts the manager, in-process or as a process (a no-op when it runs). A process that cannot be
    /// started is reported by [`World::manager_exit`].
    pub fn start_manager(&self) {
        if let Err(error) = self.try_start_manager() {
            *self
                .manager_start_error
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(error.to_string());
        }
    }

    /// Starts the manager, in-process or as a process (a no-op when it runs).
    pub fn try_start_manager(&self) -> Result<()> {
        self.try_start_manager_with(|_| {})
    }

    /// [`World::try_start_manager`] with `adjust` applied to the in-process manager's options after the world's
    /// (e.g. another build version, as an upgraded manager has).
    pub fn try_start_manager_with(&self, adjust: impl FnOnce(&mut Options)) -> Result<()> {
        let mut slot = self.manager.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return Ok(());
        }
        *slot = Some(match &self.manager_binary {
            None => {
                let shutdown = CancellationToken::new();
                let mut options = self.options();
                adjust(&mut options);
                let manager = Manager::new(self.manager_credentials.client.clone(), options);
                let task = tokio::spawn(manager.run(shutdown.clone()));
                RunningManager::Task { shutdown, task }
            }
            Some(binary) => self.spawn_manager(binary)?,
        });
        Ok(())
    }

    /// The flags the manager binary gets: what the controller chart renders for this world (namespaces, log
    /// settings, listener metrics), with every timing left at its production default.
    pub fn manager_args(&self, metrics_port: u16) -> Vec<String> {
        let extra: Vec<String> = self
            .extra_manager_args
            .iter()
            .cloned()
            .chain(
                std::env::var("ARC_RS_MANAGER_ARGS")
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(str::to_owned),
            )
            .collect();
        // A flag given again replaces the world's (clap refuses a flag given twice).
        let overridden = |arg: &String| {
            let flag = arg.split('=').next().unwrap_or_default();
            extra.iter().any(|e| e.split('=').next() == Some(flag))
        };
        [
            "--auto-scaling-runner-set-only".to_owned(),
            "--log-level=info".to_owned(),
            "--log-format=text".to_owned(),
            format!("--watch-namespace={}", self.ctx.namespace),
            format!("--metrics-addr=127.0.0.1:{metrics_port}"),
            "--listener-metrics-addr=:8080".to_owned(),
            "--listener-metrics-endpoint=/metrics".to_owned(),
        ]
        .into_iter()
        .filter(|arg| !overridden(arg))
        .chain(extra.iter().cloned())
        .collect()
    }

    fn spawn_manager(&self, binary: &Path) -> Result<RunningManager> {
        self.spawn_manager_logging_to(binary, "manager.log")
    }

    /// Starts one more manager process beside the world's, with the same flags (a second replica of the
    /// Deployment: give the world `--enable-leader-election` in `manager_args`), its log in `<name>.log` and a
    /// metrics port of its own. Only with [`WorldConfig::manager_process`].
    pub fn start_replica(&self, name: &str) -> Result<Replica> {
        let binary = self.manager_binary.as_deref().ok_or_else(|| {
            Error::Manager("a replica needs the manager to run as a process".to_owned())
        })?;
        match self.spawn_manager_logging_to(binary, &format!("{name}.log"))? {
            RunningManager::Process { process, .. } => Ok(Replica { process }),
            RunningManager::Task { .. } => unreachable!("spawned as a process"),
        }
    }

    fn spawn_manager_logging_to(&self, binary: &Path, log: &str) -> Result<RunningManager> {
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            Error::Manager(format!("starting the manager process: {what}: {e}"))
        };
        let port = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| failed("a free port", &e))?
            .port();
        let kubeconfig = self
            .manager_credentials
            .write_kubeconfig(&self.ctx, self.manager_dir.path())?;
        let mut args: Vec<String> = vec!["-i".to_owned()];
        // MALLOC_ARENA_MAX lets a measurement try glibc's allocator settings on the real process; RUST_LOG turns
        // on one module's debug logs without the noise of `--log-level=debug`.
        for inherited in [
            "PATH",
            "HOME",
            "RUST_BACKTRACE",
            "MALLOC_ARENA_MAX",
            "RUST_LOG",
        ] {
            if let Ok(value) = std::env::var(inherited) {
                args.push(format!("{inherited}={value}"));
            }
        }
        args.extend([
            format!("KUBECONFIG={}", kubeconfig.display()),
            format!(
                "CONTROLLER_MANAGER_POD_NAMESPACE={}",
                self.controller_namespace
            ),
            "CONTROLLER_MANAGER_CONTAINER_IMAGE=ghcr.io/arc-rs/arc-rs:e2e".to_owned(),
            binary.display().to_string(),
        ]);
        let flags = self.manager_args(port);
        args.extend(flags.iter().cloned());
        let process = Supervised::spawn(
            "manager",
            Path::new("env"),
            &args,
            &self.manager_dir.path().join(log),
        )
        .map_err(|e| failed("spawn", &e))?;
        Ok(RunningManager::Process {
            process,
            metrics_url: format!("http://127.0.0.1:{port}/metrics"),
            flags,
        })
    }

    /// `f` of the manager process (`None` when the manager runs in this process, or not at all).
    fn with_manager_process<T>(
        &self,
        f: impl FnOnce(&Supervised, &str, &[String]) -> T,
    ) -> Option<T> {
        match self
            .manager
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()?
        {
            RunningManager::Process {
                process,
                metrics_url,
                flags,
            } => Some(f(process, metrics_url, flags)),
            RunningManager::Task { .. } => None,
        }
    }

    /// The manager process's id.
    pub fn manager_pid(&self) -> Option<u32> {
        self.with_manager_process(|process, _, _| process.pid())
            .flatten()
    }

    /// The manager process's metrics URL.
    pub fn manager_metrics_url(&self) -> Option<String> {
        self.with_manager_process(|_, url, _| url.to_owned())
    }

    /// The end of the manager process's log.
    pub fn manager_log(&self, max: u64) -> Option<String> {
        self.with_manager_process(|process, _, _| process.log_tail(max))
    }

    /// The flags the manager process was started with (`None` when it runs in this process, or not at all).
    pub fn manager_flags(&self) -> Option<Vec<String>> {
        self.with_manager_process(|_, _, flags| flags.to_vec())
    }

    /// Stops the manager: gracefully (in-flight reconciles finish), or `kill`ed as if the process died.
    pub async fn stop_manager(&self, kill: bool) -> Result<()> {
        let running = self
            .manager
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match running {
            None => Ok(()),
            Some(RunningManager::Task { task, .. }) if kill => {
                task.abort();
                let _ = task.await;
                Ok(())
            }
            Some(RunningManager::Task { shutdown, task }) => {
                shutdown.cancel();
                match task.await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(error)) => Err(Error::Manager(error.to_string())),
                    Err(join) => Err(Error::Manager(join.to_string())),
                }
            }
            Some(RunningManager::Process { mut process, .. }) => {
                if kill {
                    process
                        .kill()
                        .map_err(|e| Error::Manager(format!("killing the manager: {e}")))?;
                }
                // SIGTERM (a no-op after the kill), then wait, off the async threads.
                tokio::task::spawn_blocking(move || process.stop())
                    .await
                    .map_err(|e| Error::Manager(e.to_string()))
            }
        }
    }

    /// Whether the manager ended by itself (it should not), and how.
    pub fn manager_exit(&self) -> Option<String> {
        if let Some(error) = self
            .manager_start_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Some(error);
        }
        let mut slot = self.manager.lock().unwrap_or_else(|p| p.into_inner());
        match slot.as_mut()? {
            RunningManager::Task { task, .. } => task
                .is_finished()
                .then(|| "the manager task ended".to_owned()),
            RunningManager::Process { process, .. } => process.exited().map(|status| {
                format!(
                    "the manager process exited ({status}); its log ends with:\n{}",
                    process.log_tail(4000)
                )
            }),
        }
    }

    /// Creates the rendered objects, as `helm install` would.
    pub async fn install(&self) -> Result<()> {
        self.create_objects(&self.rendered).await
    }

    /// Installs one more scale set beside the world's own, as a second `helm install` of the scale-set chart
    /// (release `release`, which is also the scale set's name, with `values` on top of the required ones) in
    /// the same namespace: its listener runs under the same executor and its runners under the same simulator.
    /// Returns the objects created.
    pub async fn install_scale_set(&self, release: &str, values: &Value) -> Result<Vec<Value>> {
        let rendered = render_scale_set(
            release,
            &self.ctx.namespace,
            &self.config_url,
            &self.controller_namespace,
            values,
        )?;
        self.create_objects(&rendered).await?;
        Ok(rendered)
    }

    async fn create_objects(&self, objects: &[Value]) -> Result<()> {
        for object in objects {
            let (api, _) = self.dynamic_api(object).await?;
            let object: DynamicObject =
                serde_json::from_value(object.clone()).map_err(|e| Error::InvalidObject {
                    what: describe(object),
                    reason: e.to_string(),
                })?;
            api.create(&PostParams::default(), &object).await?;
        }
        Ok(())
    }

    /// Deletes the rendered objects, as `helm uninstall` would (the AutoscalingRunnerSet first; the others carry
    /// the cleanup-protection finalizer its controller removes).
    pub async fn uninstall(&self) -> Result<()> {
        let mut objects: Vec<&Value> = self.rendered.iter().collect();
        objects.sort_by_key(|o| o["kind"] != "AutoscalingRunnerSet");
        for object in objects {
            let (api, name) = self.dynamic_api(object).await?;
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(response)) if response.code == 404 => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    /// Whether any rendered object still exists, as `kind/name` of those that do.
    pub async fn rendered_left(&self) -> Result<Vec<String>> {
        let mut left = Vec::new();
        for object in &self.rendered {
            if self.rendered_now(object).await?.is_some() {
                left.push(describe(object));
            }
        }
        Ok(left)
    }

    /// Rendered `object` as the API server has it now; `None` once it is gone.
    async fn rendered_now(&self, object: &Value) -> Result<Option<DynamicObject>> {
        let (api, name) = self.dynamic_api(object).await?;
        Ok(api.get_opt(&name).await?)
    }

    async fn dynamic_api(&self, object: &Value) -> Result<(Api<DynamicObject>, String)> {
        let invalid = |reason: &str| Error::InvalidObject {
            what: describe(object),
            reason: reason.to_owned(),
        };
        let api_version = object["apiVersion"]
            .as_str()
            .ok_or_else(|| invalid("no apiVersion"))?;
        let kind = object["kind"].as_str().ok_or_else(|| invalid("no kind"))?;
        let name = object["metadata"]["name"]
            .as_str()
            .ok_or_else(|| invalid("no name"))?;
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, _) = kube::discovery::pinned_kind(&self.client(), &gvk).await?;
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or(&self.ctx.namespace);
        Ok((
            Api::namespaced_with(self.client(), namespace, &resource),
            name.to_owned(),
        ))
    }

    /// The scale set's id in the fake, once the controller created it.
    pub fn scale_set_id(&self) -> Option<i64> {
        self.fake
            .state()
            .snapshot()
            .scale_sets
            .into_iter()
            .find(|set| set.name.eq_ignore_ascii_case(&self.release))
            .map(|set| set.id)
    }

    /// Waits until the listener holds a session for the scale set: from then on, enqueued jobs reach it.
    pub async fn wait_listening(&self, timeout: Duration) -> Result<()> {
        let release = self.release.clone();
        self.fake
            .state()
            .wait_for(timeout, |snapshot| {
                snapshot
                    .scale_sets
                    .iter()
                    .any(|set| set.name.eq_ignore_ascii_case(&release) && set.session_id.is_some())
            })
            .await
            .map(|_| ())
            .map_err(|snapshot| Error::Timeout {
                what: "a listener session for the scale set".to_owned(),
                timeout,
                detail: format!("fake scale sets {:?}", snapshot.scale_sets),
            })?;
        Ok(())
    }

    /// What the scale set looks like now, for failure messages: the AutoscalingRunnerSet's status, listeners and
    /// their pods, the executor's errors and the end of each listener's log.
    pub async fn diagnostics(&self) -> String {
        let mut out = String::new();
        match self.runner_set().await {
            Ok(Some(ars)) => out.push_str(&format!(
                "AutoscalingRunnerSet status: {}\n",
                serde_json::to_string(&ars.status).unwrap_or_default()
            )),
            Ok(None) => out.push_str("no AutoscalingRunnerSet\n"),
            Err(e) => out.push_str(&format!("reading the AutoscalingRunnerSet: {e}\n")),
        }
        if let Ok(listeners) = self.listeners().await {
            for listener in listeners {
                let meta = &listener.metadata;
                out.push_str(&format!(
                    "listener {}: deleting {:?}, finalizers {:?}, status {}\n",
                    listener.name_any(),
                    meta.deletion_timestamp.as_ref().map(|t| t.0.to_string()),
                    meta.finalizers,
                    serde_json::to_string(&listener.status).unwrap_or_default()
                ));
            }
        }
        out.push_str(&self.rendered_diagnostics().await);
        out.push_str(&self.warning_events().await);
        if let Ok(pods) = self.listener_pods().await {
            for pod in pods {
                let name = pod.name_any();
                let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
                out.push_str(&format!("listener pod {name}: {phase}\n"));
                if let Some(log) = self.listener_log(&name) {
                    let tail: String = log
                        .lines()
                        .rev()
                        .take(15)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect::<Vec<_>>()
                        .join("\n");
                    out.push_str(&format!("  log tail:\n{tail}\n"));
                }
            }
        }
        out.push_str(&format!("executor errors: {:?}\n", self.executor_errors()));
        out.push_str(&format!("simulator: {:?}\n", self.simulator.stats()));
        out.push_str(&self.runner_diagnostics().await);
        out
    }

    /// Each rendered object still there, with what holds it: an uninstall that does not finish shows here which
    /// cleanup-protection finalizer was (or was not) released.
    async fn rendered_diagnostics(&self) -> String {
        let mut out = String::new();
        for object in &self.rendered {
            match self.rendered_now(object).await {
                Ok(Some(found)) => out.push_str(&format!(
                    "{}: deleting {:?}, finalizers {:?}\n",
                    describe(object),
                    found
                        .metadata
                        .deletion_timestamp
                        .as_ref()
                        .map(|t| t.0.to_string()),
                    found.metadata.finalizers
                )),
                Ok(None) => out.push_str(&format!("{}: gone\n", describe(object))),
                Err(error) => out.push_str(&format!("{}: {error}\n", describe(object))),
            }
        }
        out
    }

    /// The last Warning Events of the scale set's and the controller's namespaces (the controllers report there why
    /// a step cannot go on).
    async fn warning_events(&self) -> String {
        const LAST: usize = 20;
        let mut out = String::new();
        for namespace in [self.namespace(), self.controller_namespace.as_str()] {
            let events = Api::<Event>::namespaced(self.client(), namespace)
                .list(&ListParams::default().fields("type=Warning"))
                .await;
            match events {
                Ok(list) => {
                    let skip = list.items.len().saturating_sub(LAST);
                    for event in &list.items[skip..] {
                        out.push_str(&format!(
                            "Warning Event in {namespace} on {}/{}: {} x{}: {}\n",
                            event.involved_object.kind.as_deref().unwrap_or("?"),
                            event.involved_object.name.as_deref().unwrap_or("?"),
                            event.reason.as_deref().unwrap_or("?"),
                            event.count.unwrap_or(1),
                            event.message.as_deref().unwrap_or_default()
                        ));
                    }
                }
                Err(error) => out.push_str(&format!("listing Events in {namespace}: {error}\n")),
            }
        }
        out
    }

    /// What a run that did not settle needs to say why a runner was left: every EphemeralRunnerSet's replicas,
    /// annotations and status; every EphemeralRunner's metadata and status, the fake's view of its registration,
    /// and the lines of the manager's and listeners' logs that name it (the run's logs are gone once it ends).
    async fn runner_diagnostics(&self) -> String {
        const LOG_LINES_PER_RUNNER: usize = 40;
        let mut out = String::new();
        match self.ephemeral_runner_sets().await {
            Ok(sets) => {
                for set in sets {
                    out.push_str(&format!(
                        "EphemeralRunnerSet {}: replicas {}, annotations {}, status {}\n",
                        set.name_any(),
                        set.spec.replicas,
                        serde_json::to_string(&set.metadata.annotations).unwrap_or_default(),
                        serde_json::to_string(&set.status).unwrap_or_default()
                    ));
                }
            }
            Err(e) => out.push_str(&format!("listing EphemeralRunnerSets: {e}\n")),
        }
        let runners = match self.ephemeral_runners().await {
            Ok(runners) => runners,
            Err(e) => {
                out.push_str(&format!("listing EphemeralRunners: {e}\n"));
                return out;
            }
        };
        let registered = self.fake.state().snapshot().runners;
        let manager_log = self.manager_log(64 << 20).unwrap_or_default();
        let listener_logs: Vec<(String, String)> = match self.listener_pods().await {
            Ok(pods) => pods
                .iter()
                .filter_map(|pod| {
                    let name = pod.name_any();
                    self.listener_log(&name).map(|log| (name, log))
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        for runner in &runners {
            let name = runner.name_any();
            let meta = &runner.metadata;
            out.push_str(&format!(
                "EphemeralRunner {name}: created {:?}, deleting {:?}, finalizers {:?}, annotations {}, status {}\n",
                meta.creation_timestamp.as_ref().map(|t| t.0.to_string()),
                meta.deletion_timestamp.as_ref().map(|t| t.0.to_string()),
                meta.finalizers,
                serde_json::to_string(&meta.annotations).unwrap_or_default(),
                serde_json::to_string(&runner.status).unwrap_or_default()
            ));
            for view in registered.iter().filter(|view| view.name == name) {
                out.push_str(&format!("  the fake: {view:?}\n"));
            }
            let mut named = |source: &str, log: &str| {
                let lines: Vec<&str> = log.lines().filter(|line| line.contains(&name)).collect();
                let skip = lines.len().saturating_sub(LOG_LINES_PER_RUNNER);
                out.push_str(&format!(
                    "  {source} log, lines naming it ({} of {}):\n",
                    lines.len() - skip,
                    lines.len()
                ));
                for line in &lines[skip..] {
                    out.push_str(&format!("    {line}\n"));
                }
            };
            named("manager", &manager_log);
            for (pod, log) in &listener_logs {
                named(&format!("listener {pod}"), log);
            }
        }
        out
    }

    /// Enqueues `count` jobs for the scale set; returns their request ids.
    pub fn enqueue(&self, count: u32) -> Result<Vec<i64>> {
        self.enqueue_to(&self.release, count)
    }

    /// Enqueues `count` jobs (one workflow run) for scale set `scale_set`, the world's own or one added with
    /// [`World::install_scale_set`]; returns their request ids.
    pub fn enqueue_to(&self, scale_set: &str, count: u32) -> Result<Vec<i64>> {
        let ids = self.fake.state().enqueue_jobs(&EnqueueJobs {
            scale_set_name: Some(scale_set.to_owned()),
            count,
            ..EnqueueJobs::default()
        })?;
        self.enqueued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(&ids);
        Ok(ids)
    }

    /// Enqueues `count` jobs as workflow runs of `run_size` jobs each (the last run may be smaller): job names
    /// (`job-1` to `job-<run_size>`) repeat from run to run, as in an organization whose workflows run again and
    /// again, rather than one run with `count` distinct names.
    pub fn enqueue_in_runs(&self, count: u32, run_size: u32) -> Result<Vec<i64>> {
        let run_size = run_size.max(1);
        let mut ids = Vec::with_capacity(count as usize);
        let mut left = count;
        while left > 0 {
            let this_run = left.min(run_size);
            ids.extend(self.enqueue(this_run)?);
            left -= this_run;
        }
        Ok(ids)
    }

    /// Whether the world's scale set asks for the re-run of jobs the cluster interrupted (`rerunInterruptedJobs`).
    pub fn asks_for_reruns(&self) -> bool {
        self.rendered.iter().any(|object| {
            object["kind"] == "AutoscalingRunnerSet"
                && object["spec"]["rerunInterruptedJobs"]["enabled"] == true
        })
    }

    /// Request ids of every job enqueued through [`World::enqueue`].
    pub fn enqueued(&self) -> Vec<i64> {
        self.enqueued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until every job in `ids` has completed.
    pub async fn wait_jobs_completed(
        &self,
        ids: &[i64],
        timeout: Duration,
    ) -> Result<StateSnapshot> {
        self.fake
            .state()
            .wait_completed(ids, timeout)
            .await
            .map_err(|snapshot| {
                let mut states: BTreeMap<String, usize> = BTreeMap::new();
                for job in snapshot.jobs.iter().filter(|j| ids.contains(&j.request_id)) {
                    *states.entry(format!("{:?}", job.state)).or_default() += 1;
                }
                Error::Timeout {
                    what: format!("{} jobs to complete", ids.len()),
                    timeout,
                    detail: format!(
                        "jobs by state {states:?}; simulator {:?}",
                        self.simulator.stats()
                    ),
                }
            })
    }

    /// Waits until the scale set is at rest with exactly `runners` idle runners: that many EphemeralRunners,
    /// all Running with a Running pod, that many runners registered in the fake and none busy.
    pub async fn wait_idle(&self, runners: usize, timeout: Duration) -> Result<()> {
        self.eventually(&format!("{runners} idle runners"), timeout, || async {
            let observation = self.observe().await?;
            let ers = self.ephemeral_runners().await?;
            let all_running = ers.iter().all(|er| {
                er.status
                    .as_ref()
                    .is_some_and(|s| s.phase == "Running" && s.job_id.is_empty())
            });
            let done = ers.len() == runners
                && all_running
                && observation.runner_pods_running == runners
                && observation.runner_pods_pending == 0
                && observation.registered_runners == runners
                && observation.desired_replicas == runners as i64;
            Ok((done, format!("{observation:?}")))
        })
        .await
    }

    /// Polls `check` (which says whether it holds, and what it saw) until it holds or `timeout` passes.
    pub async fn eventually<F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(bool, String)>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (done, detail) = check().await?;
            if done {
                return Ok(());
            }
            if let Some(exit) = self.manager_exit() {
                return Err(Error::Manager(exit));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: what.to_owned(),
                    timeout,
                    detail,
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The world's jobs as the fake has them now: queued (or acquired, assigned), running, completed.
    fn job_counts(&self, snapshot: &StateSnapshot) -> (usize, usize, usize) {
        let ids = self.enqueued();
        let (mut queued, mut running, mut done) = (0, 0, 0);
        for job in snapshot.jobs.iter().filter(|j| ids.contains(&j.request_id)) {
            match job.state {
                JobState::Completed => done += 1,
                JobState::Running => running += 1,
                _ => queued += 1,
            }
        }
        (queued, running, done)
    }

    /// Waits until at least `n` of the world's jobs run at the same time. Each look reads only the fake's state (in
    /// this process, no request): a look that also lists objects from a loaded API server can take seconds, and
    /// ten 5 s jobs once started and finished between two such looks in CI.
    pub async fn wait_jobs_running(&self, n: usize, timeout: Duration) -> Result<()> {
        self.eventually(&format!("{n} running jobs"), timeout, || async {
            let (queued, running, done) = self.job_counts(&self.fake.state().snapshot());
            Ok((
                running >= n,
                format!("{queued} queued, {running} running, {done} done"),
            ))
        })
        .await
    }

    /// Counts now.
    pub async fn observe(&self) -> Result<Observation> {
        let snapshot = self.fake.state().snapshot();
        let mut observation = Observation::default();
        (
            observation.jobs_queued,
            observation.jobs_running,
            observation.jobs_done,
        ) = self.job_counts(&snapshot);
        let scale_set = self.scale_set_id();
        observation.registered_runners = snapshot
            .runners
            .iter()
            .filter(|r| Some(r.scale_set_id) == scale_set)
            .count();
        observation.desired_replicas = self
            .ctx
            .api::<EphemeralRunnerSet>()
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|set| set.spec.replicas)
            .sum();
        for er in self.ephemeral_runners().await? {
            // A runner on its way out (job done, deregistering) is no capacity any more, whatever its phase says.
            let phase = if er.metadata.deletion_timestamp.is_some() {
                "Deleting".to_owned()
            } else {
                er.status
                    .map(|s| s.phase)
                    .filter(|p| !p.is_empty())
                    .unwrap_or_else(|| "New".to_owned())
            };
            *observation.runners.entry(phase).or_default() += 1;
        }
        for pod in self.runner_pods().await? {
            match pod.status.and_then(|s| s.phase).as_deref() {
                Some("Running") => observation.runner_pods_running += 1,
                Some("Succeeded" | "Failed") => {}
                _ => observation.runner_pods_pending += 1,
            }
        }
        let stats = self.simulator.stats();
        observation.runners_finished = stats.in_stage(PodStage::Finished);
        observation.start_failures = stats.in_stage(PodStage::FailedToStart);
        Ok(observation)
    }

    pub async fn ephemeral_runners(&self) -> Result<Vec<EphemeralRunner>> {
        Ok(self
            .ctx
            .api::<EphemeralRunner>()
            .list(&ListParams::default())
            .await?
            .items)
    }

    pub async fn ephemeral_runner_sets(&self) -> Result<Vec<EphemeralRunnerSet>> {
        Ok(self
            .ctx
            .api::<EphemeralRunnerSet>()
            .list(&ListParams::default())
            .await?
            .items)
    }

    pub async fn runner_pods(&self) -> Result<Vec<Pod>> {
        Ok(self
            .ctx
            .api::<Pod>()
            .list(&ListParams::default().labels(RUNNER_POD_SELECTOR))
            .await?
            .items)
    }

    /// Secrets holding a JIT config (`jitToken`) in the runner namespace.
    pub async fn jit_secrets(&self) -> Result<Vec<Secret>> {
        Ok(self
            .ctx
            .api::<Secret>()
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|s| s.data.as_ref().is_some_and(|d| d.contains_key("jitToken")))
            .collect())
    }

    pub async fn runner_set(&self) -> Result<Option<AutoscalingRunnerSet>> {
        Ok(self
            .ctx
            .api::<AutoscalingRunnerSet>()
            .get_opt(&self.release)
            .await?)
    }

    pub async fn listeners(&self) -> Result<Vec<AutoscalingListener>> {
        Ok(
            Api::<AutoscalingListener>::namespaced(self.client(), &self.controller_namespace)
                .list(&ListParams::default())
                .await?
                .items,
        )
    }

    pub async fn listener_pods(&self) -> Result<Vec<Pod>> {
        Ok(
            Api::<Pod>::namespaced(self.client(), &self.controller_namespace)
                .list(&ListParams::default().labels(test_harness::LISTENER_POD_SELECTOR))
                .await?
                .items,
        )
    }

    /// The objects made for listeners in their pod mode: the pods, ServiceAccounts, Secrets, Roles and
    /// RoleBindings an AutoscalingListener owns in the controller namespace, and the listeners' Roles and
    /// RoleBindings in the scale sets' namespace (labelled, as no owner reference crosses namespaces). None in the
    /// manager's listener mode.
    pub async fn listener_objects(&self) -> Result<usize> {
        fn owned<K: kube::Resource>(objects: &[K]) -> usize {
            objects
                .iter()
                .filter(|object| {
                    object
                        .meta()
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|owner| owner.kind == "AutoscalingListener")
                })
                .count()
        }
        let client = self.client();
        let all = ListParams::default();
        let labelled = ListParams::default().labels(crds::constants::LISTENER_NAME_LABEL);
        let controller = self.controller_namespace.as_str();
        Ok([
            owned(
                &Api::<Pod>::namespaced(client.clone(), controller)
                    .list(&all)
                    .await?
                    .items,
            ),
            owned(
                &Api::<ServiceAccount>::namespaced(client.clone(), controller)
                    .list(&all)
                    .await?
                    .items,
            ),
            owned(
                &Api::<Secret>::namespaced(client.clone(), controller)
                    .list(&all)
                    .await?
                    .items,
            ),
            owned(
                &Api::<Role>::namespaced(client.clone(), controller)
                    .list(&all)
                    .await?
                    .items,
            ),
            owned(
                &Api::<RoleBinding>::namespaced(client.clone(), controller)
                    .list(&all)
                    .await?
                    .items,
            ),
            Api::<Role>::namespaced(client.clone(), self.namespace())
                .list(&labelled)
                .await?
                .items
                .len(),
            Api::<RoleBinding>::namespaced(client, self.namespace())
                .list(&labelled)
                .await?
                .items
                .len(),
        ]
        .iter()
        .sum())
    }

    /// Listener processes running now (`namespace/pod`).
    pub fn running_listeners(&self) -> Vec<String> {
        self.executor
            .as_ref()
            .map(ListenerExecutor::running)
            .unwrap_or_default()
    }

    /// Process ids of the listener processes running now.
    pub async fn listener_pids(&self) -> Result<Vec<u32>> {
        let Some(executor) = self.executor.as_ref() else {
            return Ok(Vec::new());
        };
        Ok(self
            .listener_pods()
            .await?
            .iter()
            .filter_map(|pod| executor.pid(&self.controller_namespace, &pod.name_any()))
            .collect())
    }

    /// Problems the listener executor met.
    pub fn executor_errors(&self) -> Vec<String> {
        self.executor
            .as_ref()
            .map(ListenerExecutor::errors)
            .unwrap_or_default()
    }

    /// The end of the log of the listener process of `pod`.
    pub fn listener_log(&self, pod: &str) -> Option<String> {
        self.executor
            .as_ref()
            .and_then(|e| e.log(&self.controller_namespace, pod))
    }

    /// Kills the running listener process with SIGKILL, as an OOM kill or a node crash would; the executor then
    /// reports its pod Failed (exit 137) and the AutoscalingListener controller must recreate it. Returns the
    /// pod's name.
    pub async fn kill_listener(&self) -> Result<String> {
        let pod = self
            .listener_pods()
            .await?
            .into_iter()
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .ok_or_else(|| Error::KillListener {
                pod: "(none)".to_owned(),
                reason: "no running listener pod".to_owned(),
            })?;
        let name = pod.name_any();
        let executor = self.executor.as_ref().ok_or_else(|| Error::KillListener {
            pod: name.clone(),
            reason: "the executor is stopped".to_owned(),
        })?;
        executor
            .kill(&self.controller_namespace, &name)
            .map_err(|e| Error::KillListener {
                pod: name.clone(),
                reason: e.to_string(),
            })?;
        Ok(name)
    }

    /// Stops the executor (every listener process) and the simulator, and the manager gracefully.
    pub async fn shutdown(mut self) -> Result<()> {
        let stopped = self.stop_manager(false).await;
        if let Some(executor) = self.executor.take() {
            tokio::task::spawn_blocking(move || executor.stop())
                .await
                .map_err(|e| Error::Manager(e.to_string()))?;
        }
        if self.own_control_plane {
            // Each component is given seconds to exit: off the async threads.
            let control_plane = self.ctx.control_plane;
            tokio::task::spawn_blocking(move || control_plane.stop())
                .await
                .map_err(|e| Error::ControlPlane(e.to_string()))?;
        }
        stopped
    }
}

/// The listener binary.
fn listener_binary() -> Result<PathBuf> {
    uplifted_binary("listener", "listener")
}

/// A workspace binary. `workspace_binary` builds the whole workspace, tests included, and may name the test
/// build of a binary (`deps/NAME-HASH`, a libtest harness that exits 0 at once); the real binary is then the
/// uplifted one beside `deps/`.
fn uplifted_binary(package: &str, bin: &str) -> Result<PathBuf> {
    let path = test_harness::workspace_binary(package, bin)?;
    if path.file_name().is_some_and(|name| name == bin) {
        return Ok(path);
    }
    let uplifted = path
        .parent()
        .filter(|dir| dir.file_name().is_some_and(|name| name == "deps"))
        .and_then(Path::parent)
        .map(|dir| dir.join(bin))
        .filter(|candidate| candidate.is_file());
    uplifted.ok_or_else(|| {
        Error::ControlPlane(format!(
            "the {bin} binary: workspace_binary returned {}, which is not it",
            path.display()
        ))
    })
}

/// How many of `ids` have completed.
pub fn completed(snapshot: &StateSnapshot, ids: &[i64]) -> usize {
    let ids: std::collections::HashSet<i64> = ids.iter().copied().collect();
    snapshot
        .jobs
        .iter()
        .filter(|j| ids.contains(&j.request_id) && j.state == JobState::Completed)
        .count()
}

/// The scale-set chart rendered as release `release` in `namespace`, pointing at `config_url`, with the
/// controller ServiceAccount in `controller_namespace` and `values` on top.
pub fn render_scale_set(
    release: &str,
    namespace: &str,
    config_url: &str,
    controller_namespace: &str,
    values: &Value,
) -> Result<Vec<Value>> {
    Ok(Template::new(Chart::ScaleSet)
        .release(release)
        .namespace(namespace)
        .values(json!({
            "githubConfigUrl": config_url,
            "githubConfigSecret": {"github_token": GITHUB_TOKEN},
            "controllerServiceAccount": {
                "name": CONTROLLER_SERVICE_ACCOUNT,
                "namespace": controller_namespace,
            },
        }))
        .values(values.clone())
        .render()?
        .into_objects())
}

fn describe(object: &Value) -> String {
    format!(
        "{}/{}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}
