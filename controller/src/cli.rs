//! The manager's command line. Flag names are ARC's wherever ARC has the flag, so the Helm chart and existing
//! values files keep working; flags that do nothing in this implementation are accepted and reported.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use kube::Client;
use kube::client::ClientBuilder;

use crate::error::{Error, Result};
use crate::inflight::InFlightLayer;
use crate::options::{ListenerMode, ListenerSettings, Options, RunnerPolicy, ScaleDownPolicy};
use crate::ratelimit::RateLimitLayer;
use crate::server::parse_bind_address;
use crate::telemetry::LogFormat;

/// Controller manager for GitHub Actions runner scale sets (actions.github.com/v1alpha1).
#[derive(Debug, Clone, Parser)]
#[command(name = "manager", version)]
pub struct Args {
    /// Accepted for compatibility: this manager only runs the runner scale set mode.
    #[arg(long)]
    pub auto_scaling_runner_set_only: bool,

    /// Metrics bind address (`:8080`, `host:port`); `0` disables the server and the runner gauges.
    #[arg(long, default_value = ":8080")]
    pub metrics_addr: String,

    /// Health probe bind address for `/healthz` and `/readyz`; empty disables it.
    #[arg(long, alias = "health-probe-addr", default_value = "")]
    pub health_probe_bind_address: String,

    /// Listener metrics address written into listener configurations (`0`: none).
    #[arg(long, default_value = ":8080")]
    pub listener_metrics_addr: String,

    /// Listener metrics path written into listener configurations.
    #[arg(long, default_value = "/metrics")]
    pub listener_metrics_endpoint: String,

    /// Log level: debug, info, warn, error, or a zap integer level.
    #[arg(long, default_value = "debug", value_parser = crate::telemetry::parse_level)]
    pub log_level: tracing::Level,

    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Watch only this namespace (plus the controller namespace for listeners).
    #[arg(long, default_value = "")]
    pub watch_single_namespace: String,

    /// Legacy ARC flag, applied like `--watch-single-namespace` when that one is not set.
    #[arg(long, default_value = "")]
    pub watch_namespace: String,

    /// Label key prefix never propagated to child objects (repeatable).
    #[arg(long = "exclude-label-propagation-prefix")]
    pub exclude_label_propagation_prefixes: Vec<String>,

    /// Image pull secrets of listener pods (repeatable).
    #[arg(long = "auto-scaler-image-pull-secrets")]
    pub auto_scaler_image_pull_secrets: Vec<String>,

    /// EphemeralRunners reconciled concurrently (ARC's default of 2 caps throughput at a few hundred runners);
    /// passes waiting for a place take turns per EphemeralRunnerSet.
    #[arg(long, default_value_t = Options::default().runner_concurrency)]
    pub runner_max_concurrent_reconciles: u16,

    /// Finished or deleted EphemeralRunners torn down concurrently, apart from the runners being created (not in
    /// ARC). Teardown also has a client rate limit of its own, as large as `--k8s-client-rate-limiter-*`.
    #[arg(long, default_value_t = Options::default().runner_teardown_concurrency)]
    pub runner_teardown_max_concurrent_reconciles: u16,

    /// A PodDisruptionBudget per scale set keeps voluntary evictions (`kubectl drain`, the cluster autoscaler, node
    /// upgrades) away from runners that hold a job, so a drain waits for the job (not in ARC). `false` deletes the
    /// budgets this manager made.
    #[arg(long, default_value_t = Options::default().protect_busy_runners, action = clap::ArgAction::Set)]
    pub protect_busy_runners: bool,

    /// EphemeralRunnerSets reconciled concurrently.
    #[arg(long, default_value_t = Options::default().runner_set_concurrency)]
    pub runner_set_max_concurrent_reconciles: u16,

    /// AutoscalingRunnerSets reconciled concurrently.
    #[arg(long, default_value_t = Options::default().autoscaling_runner_set_concurrency)]
    pub autoscaling_runner_set_max_concurrent_reconciles: u16,

    /// AutoscalingListeners reconciled concurrently.
    #[arg(long, default_value_t = Options::default().autoscaling_listener_concurrency)]
    pub autoscaling_listener_max_concurrent_reconciles: u16,

    /// How often each scale set is looked up in the Actions Service (re-created when deleted on GitHub).
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub scale_set_check_interval: Duration,

    /// Runner creations or deletions one EphemeralRunnerSet runs in parallel.
    #[arg(long, default_value_t = Options::default().runner_set_parallelism)]
    pub runner_set_parallelism: usize,

    /// Kubernetes client rate limit, requests per second (0 disables): one token bucket shared by every controller,
    /// a second bucket of the same size for runner teardown alone and a third for the watches. ARC's flag of the
    /// same name sets a limit per client-go client, and ARC builds several, so ARC at 20 was seen making about 40
    /// requests/s: to copy an ARC setting, double it.
    /// The default (500/s, burst 100) is a ceiling: what keeps a burst from flooding the API server is
    /// `--k8s-client-max-in-flight`, which adapts to how fast it answers (docs/benchmarks.md).
    #[arg(long, alias = "kube-api-qps", default_value_t = 500.0)]
    pub k8s_client_rate_limiter_qps: f64,

    /// Kubernetes client burst (of each bucket, see the QPS flag).
    #[arg(long, alias = "kube-api-burst", default_value_t = 100)]
    pub k8s_client_rate_limiter_burst: u32,

    /// Most requests waiting for the API server's answer at once (0: no limit; the watches are outside it). Not in
    /// ARC. A rate cannot tell a busy API server from an idle one: at 400/s a two-core control
    /// plane queued every request, teardown's included (p99 4.6–8.6 s from a runner's finish to its removal in
    /// 500-job bursts), while 240/s left it idle part of the time. With at most 8 requests waiting, the main client
    /// sends as fast as the server answers and no faster (36–42 jobs/s against 33 at 240/s). Runner teardown never
    /// waits for room, but each of its requests out takes a place the main client waits for (down to a quarter of
    /// the budget), so a finished runner's deletes do not queue behind a burst's creations in the server
    /// (docs/benchmarks.md).
    #[arg(long, default_value_t = 8)]
    pub k8s_client_max_in_flight: usize,

    /// ARC's workqueue limiter choice (`bucket_rate_limiter` or `typed_rate_limiter`); accepted and validated.
    /// Failed reconciles always back off exponentially per object here.
    #[arg(long, default_value = "", value_parser = ["", "bucket_rate_limiter", "typed_rate_limiter"])]
    pub workqueue_rate_limiter: String,

    /// Where listeners run: `pod` (one listener pod per scale set, ARC's way) or `manager` (the leading manager runs
    /// every scale set's message loop itself; docs/listener-modes.md).
    #[arg(long, default_value = "pod", value_parser = ["pod", "manager"])]
    pub listener_mode: String,

    /// Leader election on a Lease in the manager's namespace, so several replicas can run and one reconciles.
    #[arg(long, alias = "leader-elect")]
    pub enable_leader_election: bool,

    /// Lease name for leader election.
    #[arg(long, default_value = "actions-runner-controller")]
    pub leader_election_id: String,

    /// Accepted for compatibility; no profiling endpoint is served.
    #[arg(long, default_value = "")]
    pub pprof_addr: String,

    /// Accepted for compatibility; reconciles requeue on their own timers.
    #[arg(long, default_value = "1m")]
    pub sync_period: String,

    /// Accepted for compatibility; no webhooks are served.
    #[arg(long, default_value_t = 9443)]
    pub port: u16,

    /// Removed from ARC after 0.14.2; accepted so old values files keep working, and ignored.
    #[arg(long, default_value = "")]
    pub update_strategy: String,

    /// Deadline of every Actions Service call, retries included (e.g. `30s`).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub actions_call_timeout: Duration,

    /// A runner Ready for less than this is not removed by a scale-down (GitHub may be assigning it a job).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub runner_scale_down_grace_period: Duration,

    /// How often an idle runner's registration is checked (zombie detection); `0s` disables the check.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub runner_registration_check_interval: Duration,

    /// Counted pod failures a runner survives before it is replaced.
    #[arg(long, default_value_t = 5)]
    pub runner_max_pod_failures: usize,

    /// How long the re-run of a job the cluster interrupted waits for the job's run to finish before it is given
    /// up (scale sets with `rerunInterruptedJobs` only).
    #[arg(long, default_value = "6h", value_parser = parse_duration)]
    pub job_rerun_wait: Duration,

    /// Controller namespace (listeners live there).
    #[arg(long, env = "CONTROLLER_MANAGER_POD_NAMESPACE", default_value = "")]
    pub controller_namespace: String,

    /// Listener image (the manager's own).
    #[arg(long, env = "CONTROLLER_MANAGER_CONTAINER_IMAGE", default_value = "")]
    pub controller_image: String,

    /// Listener container command.
    #[arg(long, env = "LISTENER_ENTRYPOINT", default_value = "/ghalistener")]
    pub listener_entrypoint: String,
}

/// Parses `90s`, `5m`, `1h`, `250ms`, or plain seconds.
pub fn parse_duration(value: &str) -> std::result::Result<Duration, String> {
    let value = value.trim();
    let (number, unit) = value
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((value, "s"), |i| value.split_at(i));
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{value:?} is not a duration (e.g. 30s, 5m, 250ms)"))?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(format!("{value:?} has an unknown unit (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{value:?}: {e}"))
}

impl Args {
    /// The namespace to watch, if restricted.
    pub fn watch_namespace(&self) -> Option<String> {
        [&self.watch_single_namespace, &self.watch_namespace]
            .into_iter()
            .find(|namespace| !namespace.is_empty())
            .cloned()
    }

    /// The metrics server address (`None`: disabled).
    pub fn metrics_address(&self) -> std::result::Result<Option<SocketAddr>, String> {
        parse_bind_address(&self.metrics_addr)
    }

    /// The health server address (`None`: disabled).
    pub fn health_address(&self) -> std::result::Result<Option<SocketAddr>, String> {
        parse_bind_address(&self.health_probe_bind_address)
    }

    /// Reconciler options from the flags.
    pub fn options(&self) -> Options {
        let defaults = Options::default();
        Options {
            watch_namespace: self.watch_namespace(),
            exclude_label_propagation_prefixes: self.exclude_label_propagation_prefixes.clone(),
            runner_concurrency: self.runner_max_concurrent_reconciles,
            runner_teardown_concurrency: self.runner_teardown_max_concurrent_reconciles,
            runner_set_concurrency: self.runner_set_max_concurrent_reconciles,
            protect_busy_runners: self.protect_busy_runners,
            runner_set_parallelism: self.runner_set_parallelism.max(1),
            actions_call_timeout: self.actions_call_timeout,
            runner_gauges: self.metrics_addr.trim() != "0",
            runner: RunnerPolicy {
                max_pod_failures: self.runner_max_pod_failures,
                registration_check_interval: self.runner_registration_check_interval,
                job_rerun_wait: self.job_rerun_wait,
                ..RunnerPolicy::default()
            },
            autoscaling_runner_set_concurrency: self
                .autoscaling_runner_set_max_concurrent_reconciles
                .max(1),
            autoscaling_listener_concurrency: self
                .autoscaling_listener_max_concurrent_reconciles
                .max(1),
            scale_set_check_interval: self.scale_set_check_interval,
            listener: self.listener_settings(),
            scale_down: ScaleDownPolicy {
                ready_grace_period: self.runner_scale_down_grace_period,
            },
            ..defaults
        }
    }

    /// What listeners are built from: the controller namespace and image from the environment, the listener's
    /// log settings and metrics address from the manager's flags (ARC's mapping).
    pub fn listener_settings(&self) -> ListenerSettings {
        let metrics_addr = self.listener_metrics_addr.trim();
        let metrics_on = !metrics_addr.is_empty() && metrics_addr != "0";
        ListenerSettings {
            namespace: Some(self.controller_namespace.trim())
                .filter(|namespace| !namespace.is_empty())
                .map(str::to_owned),
            image: self.controller_image.clone(),
            entrypoint: self.listener_entrypoint.clone(),
            image_pull_secrets: self.auto_scaler_image_pull_secrets.clone(),
            metrics_addr: if metrics_on {
                metrics_addr.to_owned()
            } else {
                String::new()
            },
            metrics_endpoint: if metrics_on {
                self.listener_metrics_endpoint.clone()
            } else {
                String::new()
            },
            log_level: match self.log_level {
                tracing::Level::ERROR => "error",
                tracing::Level::WARN => "warn",
                tracing::Level::INFO => "info",
                _ => "debug",
            }
            .to_owned(),
            log_format: match self.log_format {
                LogFormat::Json => "json",
                LogFormat::Text => "text",
            }
            .to_owned(),
            health_addr: crds::constants::LISTENER_HEALTH_ADDR.to_owned(),
            mode: if self.listener_mode == "manager" {
                ListenerMode::Manager
            } else {
                ListenerMode::Pod
            },
            loop_settings: listener::Settings::default(),
        }
    }

    /// Warnings about flags that are accepted but have no effect here.
    pub fn ignored_flags(&self) -> Vec<&'static str> {
        let mut ignored = Vec::new();
        if !self.pprof_addr.is_empty() {
            ignored.push("--pprof-addr: no profiling endpoint is served");
        }
        if !self.update_strategy.is_empty() {
            ignored.push("--update-strategy: removed from ARC; ignored");
        }
        ignored
    }
}

/// A Kubernetes client from the environment (in-cluster or kubeconfig), rate limited as the flags say, its
/// requests waiting for answers counted in a shared budget when `in_flight` is given ([`crate::inflight`]).
pub async fn kube_client(qps: f64, burst: u32, in_flight: Option<InFlightLayer>) -> Result<Client> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::BuildKubeClient(Box::new(kube::Error::InferConfig(e))))?;
    let builder =
        ClientBuilder::try_from(config).map_err(|e| Error::BuildKubeClient(Box::new(e)))?;
    let builder = builder.with_layer(&RateLimitLayer::new(qps, burst));
    Ok(match in_flight {
        Some(layer) => builder.with_layer(&layer).build(),
        None => builder.build(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_flags_parse() {
        // What the controller chart renders (values from docs/helm-values.md), including flags ARC dropped.
        let args = Args::try_parse_from([
            "manager",
            "--auto-scaling-runner-set-only",
            "--enable-leader-election",
            "--leader-election-id=arc",
            "--auto-scaler-image-pull-secrets=regcred",
            "--log-level=info",
            "--log-format=json",
            "--watch-single-namespace=runners",
            "--runner-max-concurrent-reconciles=2",
            "--update-strategy=eventual",
            "--listener-metrics-addr=:8080",
            "--listener-metrics-endpoint=/metrics",
            "--metrics-addr=0",
            "--pprof-addr=:6060",
            "--exclude-label-propagation-prefix=argocd.argoproj.io/",
            "--exclude-label-propagation-prefix=internal/",
            "--k8s-client-rate-limiter-qps=50",
            "--k8s-client-rate-limiter-burst=100",
            "--workqueue-rate-limiter=typed_rate_limiter",
            "--health-probe-bind-address=:8081",
        ])
        .unwrap();
        assert_eq!(args.log_level, tracing::Level::INFO);
        assert_eq!(args.log_format, LogFormat::Json);
        assert_eq!(args.metrics_address().unwrap(), None);
        assert_eq!(
            args.health_address().unwrap(),
            Some("0.0.0.0:8081".parse().unwrap())
        );
        let options = args.options();
        assert_eq!(options.watch_namespace.as_deref(), Some("runners"));
        assert_eq!(options.runner_concurrency, 2);
        assert!(!options.runner_gauges);
        assert_eq!(options.exclude_label_propagation_prefixes.len(), 2);
        assert_eq!(args.ignored_flags().len(), 2);
    }

    /// Exactly what `helm template` renders for the controller chart's default values.
    const CHART_DEFAULT_ARGS: &[&str] = &[
        "manager",
        "--auto-scaling-runner-set-only",
        "--log-level=debug",
        "--log-format=text",
        "--runner-max-concurrent-reconciles=64",
        "--listener-metrics-addr=0",
        "--listener-metrics-endpoint=",
        "--metrics-addr=0",
    ];

    /// Exactly what `helm template` renders for a values file that sets every flag (replicaCount 2,
    /// imagePullSecrets, every `flags.*`, `metrics.*` and `pprof.addr`).
    const CHART_ALL_FLAGS_ARGS: &[&str] = &[
        "manager",
        "--auto-scaling-runner-set-only",
        "--enable-leader-election",
        "--leader-election-id=t-gha-rs-controller",
        "--auto-scaler-image-pull-secrets=regcred",
        "--log-level=info",
        "--log-format=json",
        "--watch-single-namespace=runners",
        "--runner-max-concurrent-reconciles=8",
        "--update-strategy=eventual",
        "--listener-metrics-addr=:8080",
        "--listener-metrics-endpoint=/metrics",
        "--metrics-addr=:8080",
        "--pprof-addr=:6060",
        "--exclude-label-propagation-prefix=argocd.argoproj.io/",
        "--exclude-label-propagation-prefix=internal.example/",
        "--k8s-client-rate-limiter-qps=50",
        "--k8s-client-rate-limiter-burst=100",
        "--workqueue-rate-limiter=typed_rate_limiter",
        "--health-probe-bind-address=:8081",
    ];

    #[test]
    fn the_chart_default_args_parse() {
        let args = Args::try_parse_from(CHART_DEFAULT_ARGS).unwrap();
        let listener = args.listener_settings();
        // `--listener-metrics-addr=0`: no listener metrics, as in ARC.
        assert_eq!(listener.metrics_addr, "");
        assert_eq!(listener.metrics_endpoint, "");
        assert_eq!(listener.log_level, "debug");
        assert_eq!(listener.log_format, "text");
        assert_eq!(args.metrics_address().unwrap(), None);
        assert_eq!(args.options().runner_concurrency, 64);
        assert_eq!(args.options().runner_teardown_concurrency, 32);
    }

    #[test]
    fn the_chart_args_with_every_flag_parse() {
        let args = Args::try_parse_from(CHART_ALL_FLAGS_ARGS).unwrap();
        let options = args.options();
        assert_eq!(options.watch_namespace.as_deref(), Some("runners"));
        assert_eq!(options.listener.image_pull_secrets, ["regcred"]);
        assert_eq!(options.listener.metrics_addr, ":8080");
        assert_eq!(options.listener.metrics_endpoint, "/metrics");
        assert_eq!(options.listener.log_level, "info");
        assert_eq!(options.listener.log_format, "json");
        assert_eq!(options.exclude_label_propagation_prefixes.len(), 2);
        assert_eq!(args.k8s_client_rate_limiter_burst, 100);
        assert_eq!(
            args.health_address().unwrap(),
            Some("0.0.0.0:8081".parse().unwrap())
        );
        assert!(args.enable_leader_election);
        assert_eq!(args.leader_election_id, "t-gha-rs-controller");
    }

    /// Every flag ARC defines for the scale-set mode is accepted, the ones without effect here included; a flag of
    /// ARC's legacy mode is refused with an error that names it (docs/manager-configuration.md).
    #[test]
    fn arcs_scale_set_flags_are_accepted_and_its_legacy_flags_refused_by_name() {
        Args::try_parse_from([
            "manager",
            "--sync-period=1m",
            "--port=9443",
            "--pprof-addr=",
            "--update-strategy=immediate",
            "--workqueue-rate-limiter=bucket_rate_limiter",
            "--health-probe-bind-address=",
            "--watch-namespace=runners",
        ])
        .expect("ARC's scale-set flags");
        for legacy in [
            "--runner-image=summerwind/actions-runner:latest",
            "--github-token=ghp_x",
        ] {
            let error = Args::try_parse_from(["manager", legacy])
                .expect_err("a legacy-mode flag")
                .to_string();
            let flag = legacy.split('=').next().unwrap_or_default();
            assert!(error.contains(flag), "{legacy}: {error}");
        }
    }

    #[test]
    fn listener_settings_come_from_the_environment_flags() {
        let args = Args::try_parse_from([
            "manager",
            "--controller-namespace=arc-system",
            "--controller-image=ghcr.io/example/arc:1",
            "--listener-entrypoint=/listener",
            "--log-level=2",
        ])
        .unwrap();
        let listener = args.listener_settings();
        assert_eq!(listener.namespace.as_deref(), Some("arc-system"));
        assert_eq!(listener.image, "ghcr.io/example/arc:1");
        assert_eq!(listener.entrypoint, "/listener");
        assert_eq!(listener.log_level, "error");
        let args = Args::try_parse_from(["manager", "--controller-namespace="]).unwrap();
        assert_eq!(args.listener_settings().namespace, None);
    }

    #[test]
    fn defaults_serve_a_burst() {
        let args = Args::try_parse_from(["manager"]).unwrap();
        // The measured defaults (docs/benchmarks.md): a ceiling far above ARC's 20/30, and the in-flight limit
        // that keeps a 500-runner burst from queueing the API server.
        assert_eq!(args.k8s_client_rate_limiter_qps, 500.0);
        assert_eq!(args.k8s_client_rate_limiter_burst, 100);
        assert_eq!(args.k8s_client_max_in_flight, 8);
        assert!(args.runner_max_concurrent_reconciles >= 32);
        assert_eq!(args.log_level, tracing::Level::DEBUG);
        assert!(args.ignored_flags().is_empty());
        // Aliases from the brief.
        let args = Args::try_parse_from(["manager", "--kube-api-qps=5", "--health-probe-addr=:9"])
            .unwrap();
        assert_eq!(args.k8s_client_rate_limiter_qps, 5.0);
        assert!(Args::try_parse_from(["manager", "--workqueue-rate-limiter=bogus"]).is_err());
        assert!(Args::try_parse_from(["manager", "--log-format=xml"]).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("3 weeks").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
