//! Run-time options of the manager and its reconcilers. The binary fills them from flags ([`crate::cli`]); tests
//! build them directly, usually with shorter delays.

use std::time::Duration;

/// Field manager of the EphemeralRunnerSet controller's server-side applies.
pub const ERS_FIELD_MANAGER: &str = "arc-rs/ephemeralrunnerset";
/// Field manager of the EphemeralRunner controller's server-side applies.
pub const ER_FIELD_MANAGER: &str = "arc-rs/ephemeralrunner";
/// Field manager of the job labels and annotations the EphemeralRunner controller puts on runner pods. Separate
/// from [`ER_FIELD_MANAGER`] so this apply never removes fields another apply set.
pub const ER_JOB_METADATA_FIELD_MANAGER: &str = "arc-rs/ephemeralrunner-job-metadata";

/// A runner pod still `Pending` this long after its creation, with no cause anyone reported, counts as unable to
/// start (the default of [`Options::pending_pod_limit`]). The scheduler decides within seconds and the kubelet starts containers within a minute or two; ten
/// minutes leaves room for a cluster autoscaler's new node and a large image's pull, and is still far below
/// the hours a job waits for a runner before GitHub gives up on it.
pub const PENDING_TOO_LONG: Duration = Duration::from_secs(600);

/// Everything the reconcilers need to know besides the cluster itself.
#[derive(Debug, Clone)]
pub struct Options {
    /// Watch only this namespace (ARC's `--watch-single-namespace`); `None` watches all namespaces.
    pub watch_namespace: Option<String>,
    /// Label key prefixes never copied onto child objects.
    pub exclude_label_propagation_prefixes: Vec<String>,
    /// How many EphemeralRunners are reconciled at the same time.
    pub runner_concurrency: u16,
    /// How many finished or deleted EphemeralRunners are torn down at the same time, apart from
    /// [`Options::runner_concurrency`]: teardown never queues behind creation.
    pub runner_teardown_concurrency: u16,
    /// How many EphemeralRunnerSets are reconciled at the same time.
    pub runner_set_concurrency: u16,
    /// Whether each scale set gets a PodDisruptionBudget that keeps voluntary evictions away from its busy
    /// runners (beyond ARC; docs/runner-lifecycle.md, "Drains wait for busy runners").
    pub protect_busy_runners: bool,
    /// How many runner creations or deletions one EphemeralRunnerSet reconcile runs at the same time.
    pub runner_set_parallelism: usize,
    /// Version reported to GitHub (user agent) and put in the runner's extra user agent.
    pub build_version: String,
    /// Deadline of every Actions Service call, retries included.
    pub actions_call_timeout: Duration,
    /// Whether the `gha_controller_*` runner gauges are updated (ARC: `--metrics-addr` is not `0`).
    pub runner_gauges: bool,
    /// Runner (EphemeralRunner) policy.
    pub runner: RunnerPolicy,
    /// Scale-down policy of EphemeralRunnerSets.
    pub scale_down: ScaleDownPolicy,
    /// A successful reconcile is repeated after this long even without a change, in case a watch event was
    /// missed (GitHub state cannot be watched).
    pub resync_interval: Duration,
    /// Backoff of failed reconciles: first delay.
    pub error_backoff_min: Duration,
    /// Backoff of failed reconciles: cap.
    pub error_backoff_max: Duration,
    /// Listener settings (AutoscalingRunnerSet and AutoscalingListener controllers).
    pub listener: ListenerSettings,
    /// How many AutoscalingRunnerSets are reconciled at the same time.
    pub autoscaling_runner_set_concurrency: u16,
    /// How many AutoscalingListeners are reconciled at the same time.
    pub autoscaling_listener_concurrency: u16,
    /// How often an AutoscalingRunnerSet checks that its scale set still exists in the Actions Service (it is
    /// re-created when deleted on GitHub's side).
    pub scale_set_check_interval: Duration,
    /// Least delay before retrying a failure that needs someone to fix the configuration (bad credentials, a
    /// missing Secret, an unknown runner group), so such failures never loop hot.
    pub configuration_error_backoff: Duration,
    /// How Azure Key Vault is reached for sets with `vaultConfig` (authority host, deadline, extra roots); the
    /// proxy is each set's `vaultConfig.proxy`, or the environment's.
    pub vault: vault::Options,
    /// A runner pod `Pending` this long with no reported cause counts as unable to start
    /// ([`PENDING_TOO_LONG`]; tests shorten it).
    pub pending_pod_limit: Duration,
    /// How long at most a set keeps counting a runner that left with a job, waiting for the listener to list it
    /// as completed ([`COMPLETION_HOLD`]; tests shorten it).
    pub completion_hold: Duration,
}

/// The leader-election Lease client's rate limit (a client of its own, `app::run`): a renewal every two seconds,
/// a read and a write each.
pub const LEASE_CLIENT_QPS: f64 = 5.0;
/// The leader-election Lease client's burst.
pub const LEASE_CLIENT_BURST: u32 = 10;

/// The default of [`Options::completion_hold`]. The listener lists a completed runner in the patch that follows
/// the job's completion message, within a second even when it joins patches; a hold ten times as long only
/// matters when the listing never comes (a listener restarted between the two), and then delays one runner.
pub const COMPLETION_HOLD: Duration = Duration::from_secs(10);

/// Field manager of the AutoscalingRunnerSet controller's server-side applies (status).
pub const ARS_FIELD_MANAGER: &str = "arc-rs/autoscalingrunnerset";
/// Field manager of the AutoscalingListener controller's server-side applies (listener Secrets and RBAC).
pub const AL_FIELD_MANAGER: &str = "arc-rs/autoscalinglistener";

/// What the AutoscalingRunnerSet and AutoscalingListener controllers need to build listeners.
#[derive(Debug, Clone)]
pub struct ListenerSettings {
    /// Controller namespace (`CONTROLLER_MANAGER_POD_NAMESPACE`), where listeners, their pods, ServiceAccounts
    /// and Secrets live. `None`: the two controllers do not run (the runner controllers still do).
    pub namespace: Option<String>,
    /// Listener image (`CONTROLLER_MANAGER_CONTAINER_IMAGE`, the manager's own).
    pub image: String,
    /// Listener container command (`LISTENER_ENTRYPOINT`).
    pub entrypoint: String,
    /// `imagePullSecrets` of listener pods (`--auto-scaler-image-pull-secrets`).
    pub image_pull_secrets: Vec<String>,
    /// Listener metrics address written into `config.json`; empty: no metrics.
    pub metrics_addr: String,
    /// Listener metrics path written into `config.json`.
    pub metrics_endpoint: String,
    /// Where the listener serves `/healthz` (`health_addr` in `config.json`, not in ARC): where the scale-set
    /// chart's liveness probe asks, whatever the metrics address.
    pub health_addr: String,
    /// Listener `log_level`.
    pub log_level: String,
    /// Listener `log_format`.
    pub log_format: String,
    /// Where listeners run: a pod per scale set (ARC's way, the default) or tasks of the manager.
    pub mode: ListenerMode,
    /// The timings of the listener loops the manager runs itself (the listener binary's defaults; tests shorten
    /// them).
    pub loop_settings: listener::Settings,
}

/// Where the listeners run (`--listener-mode`, docs/listener-modes.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ListenerMode {
    /// One pod per scale set, with its ServiceAccount, Roles, RoleBindings and config Secret (ARC's way).
    #[default]
    Pod,
    /// The leading manager runs every scale set's message loop as a task of its own: no listener pods.
    Manager,
}

impl Default for ListenerSettings {
    fn default() -> Self {
        Self {
            namespace: None,
            image: String::new(),
            entrypoint: "/ghalistener".to_owned(),
            image_pull_secrets: Vec::new(),
            metrics_addr: ":8080".to_owned(),
            metrics_endpoint: "/metrics".to_owned(),
            health_addr: crds::constants::LISTENER_HEALTH_ADDR.to_owned(),
            log_level: "debug".to_owned(),
            log_format: "text".to_owned(),
            mode: ListenerMode::Pod,
            loop_settings: listener::Settings::default(),
        }
    }
}

/// How the EphemeralRunner controller treats failing runner pods.
#[derive(Debug, Clone)]
pub struct RunnerPolicy {
    /// Counted pod failures a runner survives; one more and the runner is given up (deleted, then replaced).
    pub max_pod_failures: usize,
    /// Delay before the pod after the first counted failure; doubles with each further failure.
    pub failure_backoff_base: Duration,
    /// Cap of the delay between pods after disruptions (evictions, preemption, node loss), which are not
    /// counted as failures.
    pub disruption_backoff_max: Duration,
    /// How often deregistration is retried while the service reports the runner's job still running.
    pub job_still_running_requeue: Duration,
    /// How often pod creation is retried after a quota or admission rejection.
    pub pod_rejection_retry: Duration,
    /// How often an idle running runner's registration is checked (zombie detection); zero disables the check.
    pub registration_check_interval: Duration,
    /// How long an interrupted job's re-run is waited for (its run must finish first) before it is given up.
    pub job_rerun_wait: Duration,
    /// How often GitHub is asked again while an interrupted job or its run has not finished.
    pub job_rerun_retry: Duration,
}

/// Which idle runners an EphemeralRunnerSet may remove when it scales down.
#[derive(Debug, Clone)]
pub struct ScaleDownPolicy {
    /// A runner whose pod became Ready less than this long ago is not removed: GitHub may be assigning it a
    /// job that the listener has not reported yet.
    pub ready_grace_period: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            watch_namespace: None,
            exclude_label_propagation_prefixes: Vec::new(),
            // ARC's default of 2 workers is the ceiling its users hit at a few hundred runners; reconciles are
            // I/O bound, so many run well on two cores.
            runner_concurrency: 64,
            runner_teardown_concurrency: 32,
            runner_set_concurrency: 8,
            protect_busy_runners: true,
            runner_set_parallelism: 32,
            build_version: env!("CARGO_PKG_VERSION").to_owned(),
            actions_call_timeout: Duration::from_secs(30),
            runner_gauges: true,
            runner: RunnerPolicy::default(),
            scale_down: ScaleDownPolicy::default(),
            resync_interval: Duration::from_secs(300),
            error_backoff_min: Duration::from_millis(500),
            error_backoff_max: Duration::from_secs(300),
            listener: ListenerSettings::default(),
            autoscaling_runner_set_concurrency: 4,
            autoscaling_listener_concurrency: 4,
            scale_set_check_interval: Duration::from_secs(120),
            configuration_error_backoff: Duration::from_secs(60),
            vault: vault::Options::from_env(),
            pending_pod_limit: PENDING_TOO_LONG,
            completion_hold: COMPLETION_HOLD,
        }
    }
}

impl Default for RunnerPolicy {
    fn default() -> Self {
        Self {
            max_pod_failures: 5,
            failure_backoff_base: Duration::from_secs(5),
            disruption_backoff_max: Duration::from_secs(60),
            job_still_running_requeue: Duration::from_secs(30),
            pod_rejection_retry: Duration::from_secs(30),
            registration_check_interval: Duration::from_secs(120),
            // A run goes on until its longest job ends (GitHub's default job timeout is 6 h); the re-run of a job
            // that was interrupted early in a long run is worth waiting for, a finalizer held for days is not.
            job_rerun_wait: Duration::from_secs(6 * 3600),
            job_rerun_retry: Duration::from_secs(30),
        }
    }
}

impl Default for ScaleDownPolicy {
    fn default() -> Self {
        Self {
            ready_grace_period: Duration::from_secs(30),
        }
    }
}
