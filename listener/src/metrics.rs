//! Metrics: ARC's twelve `gha_*` metrics with the same names, types, help texts, default labels and buckets, the
//! `metrics` config selection, and the listener's own health metrics. Exposed in the OpenMetrics text format.
//!
//! Default label sets carry no per-runner or per-run values, so the number of series stays bounded by the number
//! of repositories, job names and events.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use actions_client::{GitHubConfig, JobCompleted, JobStarted, Scope, Statistics};
use jiff::Timestamp;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::config::{ConfigProblem, MetricSelection, MetricsSelection};
use crate::error::Severity;
use crate::workflow;

/// Content type of the metrics endpoint.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// ARC's default histogram buckets, in seconds.
pub const DEFAULT_BUCKETS: [f64; 45] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 12.0, 15.0, 18.0,
    20.0, 25.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0, 120.0, 150.0, 180.0, 210.0,
    240.0, 300.0, 360.0, 420.0, 480.0, 540.0, 600.0, 900.0, 1200.0, 1800.0, 2400.0, 3000.0, 3600.0,
];

const SCALE_SET_LABELS: &[&str] = &[
    "enterprise",
    "organization",
    "repository",
    "name",
    "namespace",
];
const JOB_LABELS: &[&str] = &[
    "enterprise",
    "organization",
    "repository",
    "job_name",
    "event_name",
];
const JOB_RESULT_LABELS: &[&str] = &[
    "enterprise",
    "organization",
    "repository",
    "job_name",
    "event_name",
    "job_result",
];

/// Metric type, named as in the `metrics` config sections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `counters`.
    Counter,
    /// `gauges`.
    Gauge,
    /// `histograms`.
    Histogram,
}

impl Kind {
    /// The config section name.
    pub fn section(self) -> &'static str {
        match self {
            Self::Counter => "counters",
            Self::Gauge => "gauges",
            Self::Histogram => "histograms",
        }
    }
}

/// ARC's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ArcMetric {
    /// `gha_assigned_jobs`.
    AssignedJobs,
    /// `gha_running_jobs`.
    RunningJobs,
    /// `gha_registered_runners`.
    RegisteredRunners,
    /// `gha_busy_runners`.
    BusyRunners,
    /// `gha_idle_runners`.
    IdleRunners,
    /// `gha_min_runners`.
    MinRunners,
    /// `gha_max_runners`.
    MaxRunners,
    /// `gha_desired_runners`.
    DesiredRunners,
    /// `gha_started_jobs_total`.
    StartedJobs,
    /// `gha_completed_jobs_total`.
    CompletedJobs,
    /// `gha_job_startup_duration_seconds`.
    JobStartupDuration,
    /// `gha_job_execution_duration_seconds`.
    JobExecutionDuration,
}

impl ArcMetric {
    /// All twelve.
    pub const ALL: [Self; 12] = [
        Self::AssignedJobs,
        Self::RunningJobs,
        Self::RegisteredRunners,
        Self::BusyRunners,
        Self::IdleRunners,
        Self::MinRunners,
        Self::MaxRunners,
        Self::DesiredRunners,
        Self::StartedJobs,
        Self::CompletedJobs,
        Self::JobStartupDuration,
        Self::JobExecutionDuration,
    ];

    /// The exposed name, which is also the name used in the `metrics` config.
    pub fn name(self) -> &'static str {
        match self {
            Self::AssignedJobs => "gha_assigned_jobs",
            Self::RunningJobs => "gha_running_jobs",
            Self::RegisteredRunners => "gha_registered_runners",
            Self::BusyRunners => "gha_busy_runners",
            Self::IdleRunners => "gha_idle_runners",
            Self::MinRunners => "gha_min_runners",
            Self::MaxRunners => "gha_max_runners",
            Self::DesiredRunners => "gha_desired_runners",
            Self::StartedJobs => "gha_started_jobs_total",
            Self::CompletedJobs => "gha_completed_jobs_total",
            Self::JobStartupDuration => "gha_job_startup_duration_seconds",
            Self::JobExecutionDuration => "gha_job_execution_duration_seconds",
        }
    }

    /// ARC's help text.
    pub fn help(self) -> &'static str {
        match self {
            Self::AssignedJobs => "Number of jobs assigned to this scale set.",
            Self::RunningJobs => "Number of jobs running (or about to be run).",
            Self::RegisteredRunners => "Number of runners registered by the scale set.",
            Self::BusyRunners => "Number of registered runners running a job.",
            Self::IdleRunners => "Number of registered runners not running a job.",
            Self::MinRunners => "Minimum number of runners.",
            Self::MaxRunners => "Maximum number of runners.",
            Self::DesiredRunners => "Number of runners desired by the scale set.",
            Self::StartedJobs => "Total number of jobs started.",
            Self::CompletedJobs => "Total number of jobs completed.",
            Self::JobStartupDuration => {
                "Time spent waiting for workflow job to get started on the runner owned by the scale set (in seconds)."
            }
            Self::JobExecutionDuration => {
                "Time spent executing workflow jobs by the scale set (in seconds)."
            }
        }
    }

    /// The metric type.
    pub fn kind(self) -> Kind {
        match self {
            Self::StartedJobs | Self::CompletedJobs => Kind::Counter,
            Self::JobStartupDuration | Self::JobExecutionDuration => Kind::Histogram,
            _ => Kind::Gauge,
        }
    }

    /// ARC's default label names, in order.
    pub fn default_labels(self) -> &'static [&'static str] {
        match self {
            Self::StartedJobs | Self::JobStartupDuration => JOB_LABELS,
            Self::CompletedJobs | Self::JobExecutionDuration => JOB_RESULT_LABELS,
            _ => SCALE_SET_LABELS,
        }
    }

    /// The metric of `kind` named `name`, if there is one.
    pub fn find(kind: Kind, name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|m| m.kind() == kind && m.name() == name)
    }
}

/// The `metrics` entries that name no metric of their section; they are skipped (and logged), as in ARC.
pub fn unknown_entries(selection: Option<&MetricsSelection>) -> Vec<(Kind, String)> {
    sections(selection)
        .into_iter()
        .flat_map(|(kind, entries)| {
            entries
                .keys()
                .filter(move |name| ArcMetric::find(kind, name).is_none())
                .map(move |name| (kind, name.clone()))
        })
        .collect()
}

fn sections(
    selection: Option<&MetricsSelection>,
) -> Vec<(Kind, &BTreeMap<String, Option<MetricSelection>>)> {
    let Some(selection) = selection else {
        return Vec::new();
    };
    [
        (Kind::Counter, selection.counters.as_ref()),
        (Kind::Gauge, selection.gauges.as_ref()),
        (Kind::Histogram, selection.histograms.as_ref()),
    ]
    .into_iter()
    .filter_map(|(kind, entries)| entries.map(|e| (kind, e)))
    .collect()
}

/// Checks the known entries of a `metrics` selection: where ARC panics (a `null` entry, invalid or duplicate
/// label names, `le` on a histogram, unordered buckets), this is a config error instead.
pub fn check_selection(selection: Option<&MetricsSelection>) -> Result<(), ConfigProblem> {
    for (kind, entries) in sections(selection) {
        for (name, entry) in entries {
            if ArcMetric::find(kind, name).is_none() {
                continue;
            }
            let problem = |problem: String| ConfigProblem::InvalidMetricSelection {
                kind: kind.section(),
                name: name.clone(),
                problem,
            };
            let Some(entry) = entry else {
                return Err(problem(
                    "the entry is null; use {\"labels\": [...]} (an empty list for no labels)"
                        .to_owned(),
                ));
            };
            let labels = entry.labels.as_deref().unwrap_or_default();
            for (i, label) in labels.iter().enumerate() {
                if !is_label_name(label) {
                    return Err(problem(format!("{label:?} is not a valid label name")));
                }
                if labels[..i].contains(label) {
                    return Err(problem(format!("label {label:?} is listed twice")));
                }
                if kind == Kind::Histogram && label == "le" {
                    return Err(problem(
                        "\"le\" is reserved for histogram buckets".to_owned(),
                    ));
                }
            }
            if kind != Kind::Histogram {
                if entry.buckets.is_some() {
                    return Err(problem("buckets only apply to histograms".to_owned()));
                }
                continue;
            }
            let buckets = entry.buckets.as_deref().unwrap_or_default();
            if let Some(bad) = buckets.iter().find(|b| !b.is_finite()) {
                return Err(problem(format!("bucket {bad} is not a finite number")));
            }
            if buckets.windows(2).any(|w| w[0] >= w[1]) {
                return Err(problem("buckets must be strictly increasing".to_owned()));
            }
        }
    }
    Ok(())
}

/// Prometheus label name syntax; names starting with `__` are reserved.
fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__")
}

type Labels = Vec<(String, String)>;

/// Builds histograms with the configured buckets.
#[derive(Debug, Clone)]
struct Buckets(Arc<[f64]>);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

#[derive(Debug, Clone)]
struct Selected<F> {
    family: F,
    labels: Vec<String>,
}

/// The fixed identity of this listener, for scale-set labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScaleSetIdentity {
    /// Enterprise from the config URL, else empty.
    pub enterprise: String,
    /// Organization (or repository owner) from the config URL, else empty.
    pub organization: String,
    /// Repository from the config URL, else empty.
    pub repository: String,
    /// EphemeralRunnerSet name.
    pub name: String,
    /// EphemeralRunnerSet namespace.
    pub namespace: String,
}

impl ScaleSetIdentity {
    /// The identity of the scale set at `github` whose runners are EphemeralRunnerSet `namespace/name`.
    pub fn new(github: &GitHubConfig, namespace: &str, name: &str) -> Self {
        let (enterprise, organization, repository) = match github.scope() {
            Scope::Enterprise { enterprise } => (enterprise.clone(), String::new(), String::new()),
            Scope::Organization { organization } => {
                (String::new(), organization.clone(), String::new())
            }
            Scope::Repository { owner, repository } => {
                (String::new(), owner.clone(), repository.clone())
            }
        };
        Self {
            enterprise,
            organization,
            repository,
            name: name.to_owned(),
            namespace: namespace.to_owned(),
        }
    }
}

/// Where label values come from; labels not applicable to a metric's kind are empty, as in ARC.
#[derive(Default)]
struct LabelSource<'a> {
    enterprise: &'a str,
    organization: &'a str,
    repository: &'a str,
    name: &'a str,
    namespace: &'a str,
    job_name: &'a str,
    event_name: &'a str,
    job_workflow_ref: &'a str,
    job_workflow_name: &'a str,
    job_workflow_target: &'a str,
    job_result: &'a str,
}

impl LabelSource<'_> {
    fn value(&self, label: &str) -> &str {
        match label {
            "enterprise" => self.enterprise,
            "organization" => self.organization,
            "repository" => self.repository,
            "name" => self.name,
            "namespace" => self.namespace,
            "job_name" => self.job_name,
            "event_name" => self.event_name,
            "job_workflow_ref" => self.job_workflow_ref,
            "job_workflow_name" => self.job_workflow_name,
            "job_workflow_target" => self.job_workflow_target,
            "job_result" => self.job_result,
            _ => "",
        }
    }

    fn labels(&self, names: &[String]) -> Labels {
        names
            .iter()
            .map(|n| (n.clone(), self.value(n).to_owned()))
            .collect()
    }
}

/// The listener's own metrics, always registered whatever the `metrics` selection says, since they report on the
/// listener rather than on the scale set.
#[derive(Debug, Clone, Default)]
struct ListenerMetrics {
    last_poll_age: Family<Labels, Gauge<f64, AtomicU64>>,
    last_job_queue_duration: Family<Labels, Gauge<f64, AtomicU64>>,
    errors: Family<Labels, Counter>,
    fatal: Family<Labels, Gauge>,
    effective_min: Family<Labels, Gauge>,
    held: Family<Labels, Gauge>,
}

/// The registry and handles of every metric.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    identity: ScaleSetIdentity,
    gauges: BTreeMap<ArcMetric, Selected<Family<Labels, Gauge>>>,
    counters: BTreeMap<ArcMetric, Selected<Family<Labels, Counter>>>,
    histograms: BTreeMap<ArcMetric, Selected<Family<Labels, Histogram, Buckets>>>,
    listener: ListenerMetrics,
}

impl Metrics {
    /// Registers the selected ARC metrics (all twelve with their defaults when `selection` is `None`) and the
    /// listener's own metrics. Unknown entries are logged and skipped.
    pub fn new(
        identity: ScaleSetIdentity,
        selection: Option<&MetricsSelection>,
    ) -> Result<Self, ConfigProblem> {
        check_selection(selection)?;
        for (kind, name) in unknown_entries(selection) {
            tracing::error!(
                name = %name,
                kind = kind.section(),
                "metrics config names an unknown metric for this kind; skipping it"
            );
        }
        let mut metrics = Self {
            registry: Registry::default(),
            identity,
            gauges: BTreeMap::new(),
            counters: BTreeMap::new(),
            histograms: BTreeMap::new(),
            listener: ListenerMetrics::default(),
        };
        for metric in ArcMetric::ALL {
            let chosen: Option<(Vec<String>, Vec<f64>)> = match selection {
                None => Some((
                    metric
                        .default_labels()
                        .iter()
                        .map(|s| (*s).to_owned())
                        .collect(),
                    Vec::new(),
                )),
                Some(_) => sections(selection)
                    .into_iter()
                    .filter(|(kind, _)| *kind == metric.kind())
                    .find_map(|(_, entries)| entries.get(metric.name()))
                    .and_then(Option::as_ref)
                    .map(|entry| {
                        (
                            entry.labels.clone().unwrap_or_default(),
                            entry.buckets.clone().unwrap_or_default(),
                        )
                    }),
            };
            if let Some((labels, buckets)) = chosen {
                metrics.register_arc(metric, labels, buckets);
            }
        }
        metrics.register_listener_metrics();
        tracing::info!(
            gauges = ?metrics.gauges.iter().map(|(m, s)| (m.name(), &s.labels)).collect::<Vec<_>>(),
            counters = ?metrics.counters.iter().map(|(m, s)| (m.name(), &s.labels)).collect::<Vec<_>>(),
            histograms = ?metrics.histograms.iter().map(|(m, s)| (m.name(), &s.labels)).collect::<Vec<_>>(),
            "registered metrics"
        );
        Ok(metrics)
    }

    fn register_arc(&mut self, metric: ArcMetric, labels: Vec<String>, buckets: Vec<f64>) {
        // prometheus-client appends the period to help texts, `_total` to counters and the unit to names.
        let help = metric.help().trim_end_matches('.');
        match metric.kind() {
            Kind::Gauge => {
                let family = Family::<Labels, Gauge>::default();
                self.registry.register(metric.name(), help, family.clone());
                self.gauges.insert(metric, Selected { family, labels });
            }
            Kind::Counter => {
                let family = Family::<Labels, Counter>::default();
                let name = metric.name().trim_end_matches("_total");
                self.registry.register(name, help, family.clone());
                self.counters.insert(metric, Selected { family, labels });
            }
            Kind::Histogram => {
                let buckets: Arc<[f64]> = if buckets.is_empty() {
                    DEFAULT_BUCKETS.into()
                } else {
                    buckets.into()
                };
                let family = Family::new_with_constructor(Buckets(buckets));
                let name = metric.name().trim_end_matches("_seconds");
                self.registry
                    .register_with_unit(name, help, Unit::Seconds, family.clone());
                self.histograms.insert(metric, Selected { family, labels });
            }
        }
    }

    fn register_listener_metrics(&mut self) {
        let l = &self.listener;
        self.registry.register_with_unit(
            "gha_listener_last_poll_age",
            "Time since the listener last completed a poll of the message queue (in seconds)",
            Unit::Seconds,
            l.last_poll_age.clone(),
        );
        self.registry.register_with_unit(
            "gha_last_job_queue_duration",
            "Time the most recently started job waited from being queued until a runner got it (in seconds)",
            Unit::Seconds,
            l.last_job_queue_duration.clone(),
        );
        self.registry.register(
            "gha_listener_errors",
            "Errors the listener recovered from, by severity and failed operation",
            l.errors.clone(),
        );
        self.registry.register(
            "gha_listener_fatal_error",
            "1 while the listener backs off after an error that needs attention (credentials, permissions, scale set or EphemeralRunnerSet missing), else 0",
            l.fatal.clone(),
        );
        self.registry.register(
            "gha_effective_min_runners",
            "Minimum number of idle runners in effect: minRunners, or the highest minimum of the scheduled windows open now",
            l.effective_min.clone(),
        );
        self.registry.register(
            "gha_scale_down_held_runners",
            "Runners kept above demand by the scale-down delay",
            l.held.clone(),
        );
        self.listener
            .fatal
            .get_or_create(&self.listener_labels())
            .set(0);
        self.listener
            .last_poll_age
            .get_or_create(&self.listener_labels())
            .set(0.0);
    }

    fn listener_labels(&self) -> Labels {
        vec![
            ("name".to_owned(), self.identity.name.clone()),
            ("namespace".to_owned(), self.identity.namespace.clone()),
        ]
    }

    fn scale_set_source(&self) -> LabelSource<'_> {
        LabelSource {
            enterprise: &self.identity.enterprise,
            organization: &self.identity.organization,
            repository: &self.identity.repository,
            name: &self.identity.name,
            namespace: &self.identity.namespace,
            ..LabelSource::default()
        }
    }

    fn set_gauge(&self, metric: ArcMetric, value: i64) {
        if let Some(selected) = self.gauges.get(&metric) {
            let labels = self.scale_set_source().labels(&selected.labels);
            selected.family.get_or_create(&labels).set(value);
        }
    }

    /// `gha_min_runners` and `gha_max_runners`, once at start-up.
    pub fn record_bounds(&self, min: i64, max: i64) {
        self.set_gauge(ArcMetric::MinRunners, min);
        self.set_gauge(ArcMetric::MaxRunners, max);
    }

    /// The policy's figures at a scaling step: the minimum in effect and the runners held by the delay.
    pub fn record_policy(&self, effective_min: i64, held_runners: i64) {
        let labels = self.listener_labels();
        self.listener
            .effective_min
            .get_or_create(&labels)
            .set(effective_min);
        self.listener.held.get_or_create(&labels).set(held_runners);
    }

    /// The statistics gauges, on the session's and every message's statistics.
    pub fn record_statistics(&self, stats: &Statistics) {
        self.set_gauge(ArcMetric::AssignedJobs, stats.total_assigned_jobs);
        self.set_gauge(ArcMetric::RunningJobs, stats.total_running_jobs);
        self.set_gauge(ArcMetric::RegisteredRunners, stats.total_registered_runners);
        self.set_gauge(ArcMetric::BusyRunners, stats.total_busy_runners);
        self.set_gauge(ArcMetric::IdleRunners, stats.total_idle_runners);
    }

    /// `gha_desired_runners`.
    pub fn record_desired(&self, desired: i64) {
        self.set_gauge(ArcMetric::DesiredRunners, desired);
    }

    /// A `JobStarted`: the started counter, the start-up duration (when both timestamps are known; ARC observes
    /// garbage for missing ones) and the queue-time gauge.
    pub fn record_job_started(&self, job: &JobStarted) {
        let info = &job.job;
        let parsed = workflow::parse(&info.job_workflow_ref);
        let source = LabelSource {
            enterprise: &self.identity.enterprise,
            organization: &info.owner_name,
            repository: &info.repository_name,
            job_name: &info.job_display_name,
            event_name: &info.event_name,
            job_workflow_ref: &info.job_workflow_ref,
            job_workflow_name: &parsed.name,
            job_workflow_target: &parsed.target,
            ..LabelSource::default()
        };
        if let Some(selected) = self.counters.get(&ArcMetric::StartedJobs) {
            selected
                .family
                .get_or_create(&source.labels(&selected.labels))
                .inc();
        }
        if let (Some(selected), Some(duration)) = (
            self.histograms.get(&ArcMetric::JobStartupDuration),
            whole_seconds_between(info.scale_set_assign_time, info.runner_assign_time),
        ) {
            selected
                .family
                .get_or_create(&source.labels(&selected.labels))
                .observe(duration);
        }
        if let Some(queued) = whole_seconds_between(info.queue_time, info.runner_assign_time) {
            self.listener
                .last_job_queue_duration
                .get_or_create(&self.listener_labels())
                .set(queued);
        }
    }

    /// A `JobCompleted` that a runner had picked up (jobs cancelled before that are not counted, as in ARC).
    pub fn record_job_completed(&self, job: &JobCompleted) {
        let info = &job.job;
        if info.runner_assign_time.is_none() {
            return;
        }
        let parsed = workflow::parse(&info.job_workflow_ref);
        let source = LabelSource {
            enterprise: &self.identity.enterprise,
            organization: &info.owner_name,
            repository: &info.repository_name,
            job_name: &info.job_display_name,
            event_name: &info.event_name,
            job_workflow_ref: &info.job_workflow_ref,
            job_workflow_name: &parsed.name,
            job_workflow_target: &parsed.target,
            job_result: &job.result,
            ..LabelSource::default()
        };
        if let Some(selected) = self.counters.get(&ArcMetric::CompletedJobs) {
            selected
                .family
                .get_or_create(&source.labels(&selected.labels))
                .inc();
        }
        if let (Some(selected), Some(duration)) = (
            self.histograms.get(&ArcMetric::JobExecutionDuration),
            whole_seconds_between(info.runner_assign_time, info.finish_time),
        ) {
            selected
                .family
                .get_or_create(&source.labels(&selected.labels))
                .observe(duration);
        }
    }

    /// An error the loop handled.
    pub fn record_error(&self, severity: Severity, operation: &'static str) {
        let mut labels = self.listener_labels();
        labels.push(("severity".to_owned(), severity.as_str().to_owned()));
        labels.push(("operation".to_owned(), operation.to_owned()));
        self.listener.errors.get_or_create(&labels).inc();
    }

    /// Whether the loop is backing off after a fatal error.
    pub fn set_fatal(&self, fatal: bool) {
        self.listener
            .fatal
            .get_or_create(&self.listener_labels())
            .set(i64::from(fatal));
    }

    /// The OpenMetrics text, with the poll age as of now.
    pub fn encode(&self, last_poll_age_seconds: f64) -> Result<String, std::fmt::Error> {
        self.listener
            .last_poll_age
            .get_or_create(&self.listener_labels())
            .set(last_poll_age_seconds);
        let mut text = String::new();
        encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// `floor(to) - floor(from)` in seconds, as ARC computes durations; `None` when either time is unknown.
fn whole_seconds_between(from: Option<Timestamp>, to: Option<Timestamp>) -> Option<f64> {
    let (from, to) = (from?, to?);
    // Whole seconds since the epoch are far below 2^53, so the conversion is exact.
    #[allow(clippy::cast_precision_loss)]
    Some((to.as_second() - from.as_second()) as f64)
}

#[cfg(test)]
mod tests;
