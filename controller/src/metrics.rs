//! The manager's Prometheus metrics.
//!
//! ARC's names are kept so existing dashboards work: the `gha_controller_*` runner gauges (labels `name`,
//! `namespace`, `repository`, `organization`, `enterprise`) and controller-runtime's
//! `controller_runtime_reconcile_*` series (label `controller`). The runner lifecycle counters are new; every
//! label has a bounded set of values (scale sets, fixed reason words), never a runner or a run.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// Labels of the ARC runner gauges: the scale set and the parts of its GitHub config URL.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet, Default)]
pub struct ScaleSetLabels {
    /// Scale set (AutoscalingRunnerSet) name.
    pub name: String,
    /// Scale set namespace.
    pub namespace: String,
    /// Repository part of the config URL, or empty.
    pub repository: String,
    /// Organization part of the config URL, or empty.
    pub organization: String,
    /// Enterprise part of the config URL, or empty.
    pub enterprise: String,
}

/// A scale set, for the runner lifecycle counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunnerLabels {
    /// Scale set name.
    pub name: String,
    /// Scale set namespace.
    pub namespace: String,
}

/// A scale set and a reason word.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunnerReasonLabels {
    /// Scale set name.
    pub name: String,
    /// Scale set namespace.
    pub namespace: String,
    /// One of a fixed set of words, documented on the metric.
    pub reason: &'static str,
}

/// Which reconciler.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `ephemeralrunnerset`, `ephemeralrunner`, ...
    pub controller: &'static str,
}

/// A reconciler and an outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// Reconciler.
    pub controller: &'static str,
    /// `success` or `error`.
    pub result: &'static str,
}

/// A reconciler and an error variant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileErrorLabels {
    /// Reconciler.
    pub controller: &'static str,
    /// [`crate::Error::metric_label`].
    pub error: &'static str,
}

/// An Actions Service operation and its outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionsCallLabels {
    /// Operation, e.g. `generate_jit_config`.
    pub operation: &'static str,
    /// `ok`, `error` or `timeout`.
    pub result: &'static str,
}

/// A stage of a finished runner's teardown ([`Metrics::teardown_time`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TeardownStageLabels {
    /// One of [`teardown_stage`].
    pub stage: &'static str,
}

/// The stages of `gha_controller_runner_teardown_seconds` (docs/metrics.md): where a finished runner's time goes
/// between the manager seeing its end and its finalizers removed, and the watch hops on either side of that.
pub mod teardown_stage {
    /// From the manager's watch showing the runner's end (its pod succeeded, or the runner being deleted) to the
    /// start of its teardown pass: the watch event's way to the teardown lane, and the lane's queue.
    pub const WAITED: &str = "waited";
    /// Of each teardown pass's start, the wait for the runner's turn: a pass of the main lane on the same runner
    /// still running (one pass at a time per runner, across both lanes).
    pub const TURN: &str = "turn";
    /// The runner's own `DELETE` (a runner whose pod succeeded deletes itself).
    pub const DELETE_RUNNER: &str = "delete_runner";
    /// Removing its registration from the Actions Service, the JIT Secret read beside it.
    pub const DEREGISTER: &str = "deregister";
    /// The pod's and the JIT Secret's deletes.
    pub const DELETE_CHILDREN: &str = "delete_children";
    /// The finalizers' removal, which lets the API server delete the runner.
    pub const FINALIZERS: &str = "finalizers";
    /// The whole pass, from its start to the finalizers removed.
    pub const PASS: &str = "pass";
    /// From a finished runner's pod's `DELETE` sent to the manager's pod watch showing it: how far behind the pod
    /// watch runs during teardowns. The watch event of a pod's exit, which starts `waited`, comes down the same
    /// stream, and its writer's clock is not the manager's: this is its measurable stand-in.
    pub const POD_WATCH: &str = "pod_watch";
    /// From a finished runner's own `DELETE` sent to the manager's runner watch showing it.
    pub const RUNNER_WATCH: &str = "runner_watch";
    /// Every stage, in order.
    pub const ALL: [&str; 9] = [
        POD_WATCH,
        WAITED,
        TURN,
        DELETE_RUNNER,
        DEREGISTER,
        DELETE_CHILDREN,
        FINALIZERS,
        PASS,
        RUNNER_WATCH,
    ];
}

/// How many awaited events a [`WatchLag`] keeps before it drops those older than [`WatchLag::GIVE_UP`].
const WATCH_LAG_KEPT: usize = 4096;

/// Deletions this process sent whose watch event it still awaits, by object uid: how far behind a watch runs,
/// measured on the manager's own writes. An event that never comes (the object was already gone) leaves an entry
/// that is dropped once it is [`WatchLag::GIVE_UP`] old and the map is full.
#[derive(Debug, Default)]
pub struct WatchLag {
    sent: Mutex<HashMap<String, Instant>>,
}

impl WatchLag {
    /// Past this, an awaited event is taken as never coming.
    pub const GIVE_UP: Duration = Duration::from_secs(300);

    /// Notes that the deletion of object `uid` is about to be sent: before the request, so an event that outruns
    /// the response is still matched.
    pub fn sent(&self, uid: &str) {
        let mut sent = crate::context::lock(&self.sent);
        if sent.len() >= WATCH_LAG_KEPT {
            sent.retain(|_, at| at.elapsed() < Self::GIVE_UP);
        }
        sent.entry(uid.to_owned()).or_insert_with(Instant::now);
    }

    /// How long ago the deletion of object `uid` was sent, once: the first watch event that shows it asks.
    pub fn shown(&self, uid: &str) -> Option<Duration> {
        crate::context::lock(&self.sent)
            .remove(uid)
            .map(|at| at.elapsed())
    }
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Buckets 1.5 times apart from 5 ms to about 25 s: fine enough that a p99 read from them (as `e2e-bench` does)
/// is within a third of the truth.
fn teardown_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 1.5, 22))
}

/// Every metric handle of the manager. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Metrics {
    /// `gha_controller_pending_ephemeral_runners`.
    pub pending_runners: Family<ScaleSetLabels, Gauge>,
    /// `gha_controller_running_ephemeral_runners`.
    pub running_runners: Family<ScaleSetLabels, Gauge>,
    /// `gha_controller_failed_ephemeral_runners`.
    pub failed_runners: Family<ScaleSetLabels, Gauge>,
    /// `gha_controller_running_listeners` (set by the AutoscalingListener controller).
    pub running_listeners: Family<ScaleSetLabels, Gauge>,
    /// `gha_controller_listener_session_held`: 1 while the scale set's listener holds its message session and
    /// its polls succeed (the `ListenerReady` condition), else 0; set by the AutoscalingRunnerSet controller.
    pub listener_session_held: Family<RunnerLabels, Gauge>,
    /// `gha_controller_runner_pod_failures_total`: counted pod failures; reason `runner_exit`,
    /// `init_container` or `pod_failed`.
    pub pod_failures: Family<RunnerReasonLabels, Counter>,
    /// `gha_controller_runner_pod_disruptions_total`: pods lost without being counted as failures; reason
    /// `evicted`, `preempted`, `node_lost`, `node_rejected` or `disrupted` (the cluster's), `pod_deleted` (an idle
    /// runner's pod deleted) or `pod_deleted_with_job` (a busy runner's).
    pub pod_disruptions: Family<RunnerReasonLabels, Counter>,
    /// `gha_controller_runner_pod_rejections_total`: pod creations the API server refused; reason `quota`,
    /// `forbidden` or `invalid`, or `error` for a creation that failed and whose registration was discarded.
    pub pod_rejections: Family<RunnerReasonLabels, Counter>,
    /// `gha_controller_runner_retries_exhausted_total`: runners given up after too many pod failures.
    pub retries_exhausted: Family<RunnerLabels, Counter>,
    /// `gha_controller_zombie_runners_total`: running runners whose registration the service had forgotten.
    pub zombie_runners: Family<RunnerLabels, Counter>,
    /// `gha_controller_job_reruns_total`: jobs the cluster interrupted that GitHub was asked to run again; reason
    /// `oom_killed`, `evicted`, `deleted` or `node_lost`.
    pub job_reruns: Family<RunnerReasonLabels, Counter>,
    /// `gha_controller_runners_created_total`: EphemeralRunners created by scale-ups.
    pub runners_created: Family<RunnerLabels, Counter>,
    /// `gha_controller_runners_scaled_down_total`: idle runners removed by scale-downs.
    pub runners_scaled_down: Family<RunnerLabels, Counter>,
    /// `gha_controller_actions_requests_total`.
    pub actions_requests: Family<ActionsCallLabels, Counter>,
    /// `controller_runtime_reconcile_total`.
    pub reconciles: Family<ReconcileLabels, Counter>,
    /// `controller_runtime_reconcile_errors_total`.
    pub reconcile_errors: Family<ReconcileErrorLabels, Counter>,
    /// `controller_runtime_reconcile_time_seconds`.
    pub reconcile_time: HistogramFamily<ControllerLabels>,
    /// `gha_controller_runner_teardown_seconds`, by [`teardown_stage`].
    pub teardown_time: HistogramFamily<TeardownStageLabels>,
    /// Finished runners' pods whose deletion the pod watch has not shown yet ([`teardown_stage::POD_WATCH`]).
    pub pod_watch: WatchLag,
    /// Finished runners whose deletion the runner watch has not shown yet ([`teardown_stage::RUNNER_WATCH`]).
    pub runner_watch: WatchLag,
}

impl Metrics {
    /// Records `took` for teardown `stage` (one of [`teardown_stage`]).
    pub fn teardown(&self, stage: &'static str, took: std::time::Duration) {
        self.teardown_time
            .get_or_create(&TeardownStageLabels { stage })
            .observe(took.as_secs_f64());
    }

    /// The watch of `stage` ([`teardown_stage::POD_WATCH`] or [`teardown_stage::RUNNER_WATCH`]) shows the deletion
    /// of object `uid`: records how long after its request, if this process sent one.
    pub fn deletion_shown(&self, stage: &'static str, uid: &str) {
        let lag = if stage == teardown_stage::POD_WATCH {
            &self.pod_watch
        } else {
            &self.runner_watch
        };
        if let Some(took) = lag.shown(uid) {
            self.teardown(stage, took);
        }
    }

    /// Creates the handles and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            pending_runners: Family::default(),
            running_runners: Family::default(),
            failed_runners: Family::default(),
            running_listeners: Family::default(),
            listener_session_held: Family::default(),
            pod_failures: Family::default(),
            pod_disruptions: Family::default(),
            pod_rejections: Family::default(),
            retries_exhausted: Family::default(),
            zombie_runners: Family::default(),
            job_reruns: Family::default(),
            runners_created: Family::default(),
            runners_scaled_down: Family::default(),
            actions_requests: Family::default(),
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_time: Family::new_with_constructor(reconcile_histogram),
            teardown_time: Family::new_with_constructor(teardown_histogram),
            pod_watch: WatchLag::default(),
            runner_watch: WatchLag::default(),
        };
        let gha = registry.sub_registry_with_prefix("gha_controller");
        gha.register(
            "pending_ephemeral_runners",
            "Number of ephemeral runners in a pending state.",
            metrics.pending_runners.clone(),
        );
        gha.register(
            "running_ephemeral_runners",
            "Number of ephemeral runners in a running state.",
            metrics.running_runners.clone(),
        );
        gha.register(
            "failed_ephemeral_runners",
            "Number of ephemeral runners in a failed state.",
            metrics.failed_runners.clone(),
        );
        gha.register(
            "running_listeners",
            "Number of listeners in a running state.",
            metrics.running_listeners.clone(),
        );
        gha.register(
            "listener_session_held",
            "Whether the scale set's listener holds its message session and polls (1) or not (0).",
            metrics.listener_session_held.clone(),
        );
        gha.register(
            "runner_pod_failures",
            "Runner pod failures counted against the runner's retry budget, by reason.",
            metrics.pod_failures.clone(),
        );
        gha.register(
            "runner_pod_disruptions",
            "Runner pods lost to evictions, preemption or node loss (not counted as failures), by reason.",
            metrics.pod_disruptions.clone(),
        );
        gha.register(
            "runner_pod_rejections",
            "Runner pod creations refused by the API server (or failed, reason error), by reason.",
            metrics.pod_rejections.clone(),
        );
        gha.register(
            "runner_retries_exhausted",
            "Runners given up after too many pod failures (they are replaced).",
            metrics.retries_exhausted.clone(),
        );
        gha.register(
            "zombie_runners",
            "Running runners whose registration the Actions Service no longer knew (they are replaced).",
            metrics.zombie_runners.clone(),
        );
        gha.register(
            "job_reruns",
            "Jobs interrupted by the cluster (OOM kill, eviction, deletion, node loss) that GitHub was asked to run \
             again, by reason.",
            metrics.job_reruns.clone(),
        );
        gha.register(
            "runners_created",
            "EphemeralRunners created to scale up.",
            metrics.runners_created.clone(),
        );
        gha.register(
            "runners_scaled_down",
            "Idle runners removed to scale down.",
            metrics.runners_scaled_down.clone(),
        );
        gha.register(
            "actions_requests",
            "Actions Service calls made by the controllers, by operation and result.",
            metrics.actions_requests.clone(),
        );
        gha.register_with_unit(
            "runner_teardown",
            "Time finished runners spent in each stage of their teardown.",
            Unit::Seconds,
            metrics.teardown_time.clone(),
        );
        let runtime = registry.sub_registry_with_prefix("controller_runtime");
        runtime.register(
            "reconcile",
            "Total number of reconciliations per controller.",
            metrics.reconciles.clone(),
        );
        runtime.register(
            "reconcile_errors",
            "Total number of reconciliation errors per controller.",
            metrics.reconcile_errors.clone(),
        );
        runtime.register_with_unit(
            "reconcile_time",
            "Length of time per reconciliation per controller.",
            Unit::Seconds,
            metrics.reconcile_time.clone(),
        );
        metrics
    }

    /// Records one finished reconcile.
    pub fn record_reconcile(
        &self,
        controller: &'static str,
        started: Instant,
        error: Option<&crate::Error>,
    ) {
        self.reconcile_time
            .get_or_create(&ControllerLabels { controller })
            .observe(started.elapsed().as_secs_f64());
        let result = if error.is_some() { "error" } else { "success" };
        self.reconciles
            .get_or_create(&ReconcileLabels { controller, result })
            .inc();
        if let Some(error) = error {
            self.reconcile_errors
                .get_or_create(&ReconcileErrorLabels {
                    controller,
                    error: error.metric_label(),
                })
                .inc();
        }
    }
}

/// The registry as Prometheus text (OpenMetrics).
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// Several texts of the text exposition format as one: each family's metadata once, followed by its samples from
/// every text in order, one `# EOF` at the end. The manager's own metrics and each listener's, in the manager's
/// listener mode, are separate registries whose families share names (one series set per scale set).
pub fn merge_texts<'a>(texts: impl IntoIterator<Item = &'a str>) -> String {
    let mut order: Vec<&str> = Vec::new();
    let mut families: HashMap<&str, (Vec<&str>, Vec<&str>)> = HashMap::new();
    for text in texts {
        // The family the next samples belong to, and whether this text introduced it (its metadata is kept).
        let mut current: Option<(&str, bool)> = None;
        for line in text
            .lines()
            .filter(|line| !line.is_empty() && *line != "# EOF")
        {
            if let Some(rest) = line.strip_prefix("# ") {
                let name = rest.split(' ').nth(1).unwrap_or_default();
                if current.map(|(family, _)| family) != Some(name) {
                    let fresh = !families.contains_key(name);
                    if fresh {
                        order.push(name);
                        families.insert(name, (Vec::new(), Vec::new()));
                    }
                    current = Some((name, fresh));
                }
                if let Some((name, true)) = current
                    && let Some(family) = families.get_mut(name)
                {
                    family.0.push(line);
                }
            } else {
                // A sample before any metadata is a family of its own, named by the sample.
                let name = current.map_or_else(
                    || line.split(['{', ' ']).next().unwrap_or_default(),
                    |(family, _)| family,
                );
                let family = families.entry(name).or_insert_with(|| {
                    order.push(name);
                    (Vec::new(), Vec::new())
                });
                family.1.push(line);
            }
        }
    }
    let mut out = String::new();
    for name in order {
        if let Some((metadata, samples)) = families.get(name) {
            for line in metadata.iter().chain(samples) {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deletion_shown_is_timed_once_and_only_when_sent() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let count = |stage: &str| {
            let line =
                format!("gha_controller_runner_teardown_seconds_count{{stage=\"{stage}\"}} ");
            encode(&registry)
                .lines()
                .find_map(|sample| sample.strip_prefix(line.as_str())?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        metrics.deletion_shown(teardown_stage::POD_WATCH, "never-sent");
        assert_eq!(
            count(teardown_stage::POD_WATCH),
            0,
            "nothing sent: no sample"
        );
        metrics.pod_watch.sent("pod");
        metrics.runner_watch.sent("runner");
        // Sent twice before the event (a retried pass): timed from the first.
        metrics.pod_watch.sent("pod");
        metrics.deletion_shown(teardown_stage::POD_WATCH, "pod");
        metrics.deletion_shown(teardown_stage::POD_WATCH, "pod");
        assert_eq!(
            count(teardown_stage::POD_WATCH),
            1,
            "one sample per deletion"
        );
        assert_eq!(count(teardown_stage::RUNNER_WATCH), 0, "each watch its own");
        metrics.deletion_shown(teardown_stage::RUNNER_WATCH, "runner");
        assert_eq!(count(teardown_stage::RUNNER_WATCH), 1);
    }

    #[test]
    fn awaited_events_that_never_come_are_dropped_once_old() {
        let lag = WatchLag::default();
        let old = Instant::now()
            .checked_sub(WatchLag::GIVE_UP + Duration::from_secs(1))
            .expect("the clock is past the give-up age");
        {
            let mut sent = crate::context::lock(&lag.sent);
            for n in 0..WATCH_LAG_KEPT {
                sent.insert(format!("old-{n}"), old);
            }
        }
        lag.sent("new");
        assert_eq!(crate::context::lock(&lag.sent).len(), 1, "only the new one");
        assert!(lag.shown("new").is_some());
    }

    #[test]
    fn merged_texts_list_each_family_once_with_every_texts_samples() {
        let manager = "# HELP gha_controller_x X.\n# TYPE gha_controller_x gauge\ngha_controller_x 1\n# EOF\n";
        let one = "# HELP gha_assigned_jobs Jobs.\n# TYPE gha_assigned_jobs gauge\n\
                   gha_assigned_jobs{name=\"a\"} 2\n# HELP gha_started_jobs Started.\n# TYPE gha_started_jobs counter\n\
                   gha_started_jobs_total{name=\"a\"} 3\n# EOF\n";
        let two = "# HELP gha_assigned_jobs Jobs.\n# TYPE gha_assigned_jobs gauge\n\
                   gha_assigned_jobs{name=\"b\"} 5\n# EOF\n";
        let merged = merge_texts([manager, one, two]);
        assert_eq!(
            merged,
            "# HELP gha_controller_x X.\n# TYPE gha_controller_x gauge\ngha_controller_x 1\n\
             # HELP gha_assigned_jobs Jobs.\n# TYPE gha_assigned_jobs gauge\n\
             gha_assigned_jobs{name=\"a\"} 2\ngha_assigned_jobs{name=\"b\"} 5\n\
             # HELP gha_started_jobs Started.\n# TYPE gha_started_jobs counter\n\
             gha_started_jobs_total{name=\"a\"} 3\n# EOF\n"
        );
        assert_eq!(merge_texts([manager]), manager, "one text is unchanged");
        assert_eq!(
            merge_texts(["x 1\n"]),
            "x 1\n# EOF\n",
            "samples without metadata are kept"
        );
    }

    #[test]
    fn names_match_arc_and_counters_get_total() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let labels = ScaleSetLabels {
            name: "set".into(),
            namespace: "ns".into(),
            ..ScaleSetLabels::default()
        };
        metrics.pending_runners.get_or_create(&labels).set(3);
        metrics.record_reconcile("ephemeralrunner", Instant::now(), None);
        metrics
            .pod_failures
            .get_or_create(&RunnerReasonLabels {
                name: "set".into(),
                namespace: "ns".into(),
                reason: "runner_exit",
            })
            .inc();
        let text = encode(&registry);
        assert!(
            text.contains(
                r#"gha_controller_pending_ephemeral_runners{name="set",namespace="ns",repository="",organization="",enterprise=""} 3"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"controller_runtime_reconcile_total{controller="ephemeralrunner",result="success"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("controller_runtime_reconcile_time_seconds_bucket"),
            "{text}"
        );
        assert!(
            text.contains("gha_controller_runner_pod_failures_total"),
            "{text}"
        );
    }
}
