//! The end-to-end benchmark behind `e2e-bench`: one scale set on this machine, the real `manager` binary as its
//! own process (so its memory is its own), the real listener, simulated runners and the fake Actions Service.
//!
//! One run measures, for a queued burst of `jobs` jobs:
//!
//! * **burst → pods**: from enqueueing the burst until that many runner pods exist;
//! * **finish → gone**: for every job, from the runner reporting it finished to its runner being gone (pod and
//!   EphemeralRunner deleted; the service drops a JIT runner when its job completes), as p50/p95/p99;
//! * **throughput**: jobs completed per second, over the whole run and over its steady middle (10th to 90th
//!   percentile of completion times);
//! * **peak RSS** (`VmHWM`) of the manager process and of the listener process;
//! * **calls per job**: Actions Service and GitHub API requests from the fake's counters, and Kubernetes writes
//!   from the API server's own `apiserver_request_total`;
//! * **CPU time** of every process over the run (manager, listener, etcd, kube-apiserver,
//!   kube-controller-manager, and this process: the fake and the simulated runners), to tell which one a run on a
//!   small machine waits for;
//! * **the physical baseline**: the same API server's raw write rate for the same kinds of objects
//!   (EphemeralRunners, Secrets, Pods: create, then delete) from this process with 64 writers (the manager's
//!   default runner concurrency), and the ratio of the measured throughput to the bound that rate sets.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use controller::relist::with_relist_deletions;
use crds::EphemeralRunner;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use test_harness::requests::{
    diff, is_write_verb, parse_closed_watches, parse_requests, parse_terminated_watchers,
    sum_by_label,
};

use crate::checks;
use crate::simulator::SimulatorConfig;
use crate::world::{World, WorldConfig};
use crate::{Error, Result};

/// Writers of the raw baseline: the manager's default EphemeralRunner concurrency.
const BASELINE_WRITERS: usize = 64;
/// How often the driver looks at the world.
pub(crate) const TICK: Duration = Duration::from_millis(50);

/// How long the simulated kubelet may trail the bench's runner watch at the end of a run (see [`run`]).
const SIMULATOR_CATCH_UP: Duration = Duration::from_secs(30);

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Jobs in the burst.
    pub jobs: u32,
    /// How long each job runs.
    pub job_duration: Duration,
    /// Give up after this long.
    pub timeout: Duration,
    /// Objects of each kind the raw baseline writes (0: as many as there are jobs).
    pub baseline_objects: usize,
    /// Jobs per workflow run of the burst (the last run may be smaller). The listener keeps a metric series per
    /// job name (ARC's labels), and names repeat from run to run in a real organization; one run of N jobs
    /// gives N names.
    pub jobs_per_run: u32,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            jobs: 500,
            job_duration: Duration::from_secs(1),
            timeout: Duration::from_secs(900),
            baseline_objects: 0,
            jobs_per_run: 10,
        }
    }
}

/// Latency percentiles, in seconds.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Percentiles {
    pub samples: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples` (seconds).
    pub fn of(mut samples: Vec<f64>) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let index = ((p / 100.0) * samples.len() as f64).ceil() as usize;
            samples[index.clamp(1, samples.len()) - 1]
        };
        Self {
            samples: samples.len(),
            p50: rank(50.0),
            p95: rank(95.0),
            p99: rank(99.0),
            max: samples[samples.len() - 1],
        }
    }
}

/// The raw write rate of the API server.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Baseline {
    /// Objects of each kind (EphemeralRunner, Secret, Pod) created and deleted.
    pub objects_per_kind: usize,
    pub writers: usize,
    pub writes: usize,
    pub secs: f64,
    pub writes_per_sec: f64,
}

/// Peaks of the two parts of a resident set, in MiB.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RssParts {
    pub anon_mib: f64,
    pub file_mib: f64,
}

impl RssParts {
    /// Keeps the larger of each part of this and of process `pid` now.
    pub(crate) fn sample(&mut self, pid: Option<u32>) {
        let Some(status) =
            pid.and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        else {
            return;
        };
        let mib = |key| status_kib(&status, key).map_or(0.0, |kib| kib as f64 / 1024.0);
        self.anon_mib = self.anon_mib.max(mib("RssAnon:"));
        self.file_mib = self.file_mib.max(mib("RssFile:"));
    }
}

/// Everything one run measured.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BenchReport {
    pub jobs: u32,
    pub job_duration_secs: f64,
    pub completed: usize,
    /// From enqueueing the burst until `jobs` runner pods existed.
    pub burst_to_pods_secs: Option<f64>,
    /// From a runner reporting its job finished until its pod and EphemeralRunner were deleted.
    pub finish_to_gone: Percentiles,
    /// Where [`Self::finish_to_gone`] goes, stage by stage.
    pub teardown_stages: TeardownStages,
    /// From enqueueing the burst until the last job completed.
    pub burst_to_last_completion_secs: f64,
    /// From enqueueing until every runner was gone (the set back at zero).
    pub burst_to_settled_secs: f64,
    /// `jobs` over the burst-to-last-completion time.
    pub jobs_per_sec: f64,
    /// Jobs per second between the 10th and the 90th percentile of completion times.
    pub sustained_jobs_per_sec: f64,
    /// Most EphemeralRunners that existed at once.
    pub peak_runners: usize,
    pub manager_peak_rss_mib: f64,
    pub listener_peak_rss_mib: f64,
    /// The largest heap and other private memory (`RssAnon`) and program pages (`RssFile`, the code and read-only
    /// data of the binary, shared and reclaimable) seen in the manager during the run, sampled every tick.
    pub manager_rss_parts: RssParts,
    pub listener_rss_parts: RssParts,
    /// The most runners at once whose job had finished but which still existed (pod or EphemeralRunner not yet
    /// deleted): the backlog of teardown.
    pub peak_finished_not_gone: usize,
    /// Actions Service and GitHub API requests per job, message long-polls excluded.
    pub actions_calls_per_job: f64,
    /// Requests by endpoint over the run (long-polls included).
    pub actions_calls: BTreeMap<String, u64>,
    /// Kubernetes writes per job by the manager and the listener ([`is_product_request`]: not the kubelet's pod
    /// status writes, not the control plane's own requests).
    pub kubernetes_writes_per_job: f64,
    /// The manager's and the listener's writes over the run, by `resource[/subresource] VERB`.
    pub kubernetes_writes: BTreeMap<String, u64>,
    /// Pods created (requests answered 2xx, dry runs aside) per EphemeralRunner created: 1 when no pass ever
    /// creates a runner's pod twice. Refused and dry-run creations are in `kubernetes_writes` under their own
    /// keys (`pods POST (409)`, `pods POST (dry run)`).
    pub pod_creations_per_runner: f64,
    /// EphemeralRunners created (answered 2xx) per job.
    pub runners_per_job: f64,
    /// GET and LIST requests per job on the manager's and the listener's resources (the simulated kubelet's
    /// read of each runner's JIT Secret and the benchmark's own few looks included).
    pub kubernetes_reads_per_job: f64,
    /// Those reads over the run, by `resource[/subresource] VERB`.
    pub kubernetes_reads: BTreeMap<String, u64>,
    /// Every other request over the run, left out of the per-job figures: the simulated kubelet's pod status
    /// writes, the control plane's own requests (leases, endpoints, limit ranges...), discovery.
    pub other_requests: BTreeMap<String, u64>,
    /// Watches the API server closed during the run because they fell behind (anyone's: the manager's, the
    /// simulated kubelet's, the control plane's), by resource. Each one is an API server past what it can deliver:
    /// its watchers' events arrive late, whoever makes them, so a run with any is an overloaded run
    /// (docs/benchmarks.md, "Teardown").
    pub terminated_watchers: BTreeMap<String, u64>,
    /// The same closed watches from the API server's log line for each: whose watch (its resource, scope and
    /// selectors) and where its events were held up, sending to the client or converting inside the server
    /// ([`parse_closed_watches`]).
    pub closed_watches: BTreeMap<String, u64>,
    /// The manager's passes over the run, by controller (`controller_runtime_reconcile_total`): what its own CPU
    /// goes to, as a pass of a set or a scale set looks at every runner of it.
    pub manager_passes: BTreeMap<String, u64>,
    /// Manager and listener writes per second over the run.
    pub kubernetes_writes_per_sec: f64,
    pub baseline: Baseline,
    /// Jobs per second the raw write rate allows at the measured writes per job.
    pub write_bound_jobs_per_sec: f64,
    /// Measured throughput over that bound.
    pub ratio_to_write_bound: f64,
    /// The same API server taking as many runners through the writes of their life with no controller logic
    /// ([`crate::lifecycle_baseline`]).
    pub lifecycle_baseline: crate::lifecycle_baseline::LifecycleBaseline,
    /// Measured throughput over the lifecycle baseline's runners per second.
    pub ratio_to_lifecycle: f64,
    /// Burst → all pods over the lifecycle baseline's time to all pods.
    pub pods_time_over_lifecycle: f64,
    /// The manager's command-line flags in this run.
    pub manager_flags: Vec<String>,
    /// The flags the controller chart gives the manager with its default values.
    pub chart_default_flags: Vec<String>,
    /// Flags whose value here (defaults applied) is not the one the chart's defaults give.
    pub flags_differing_from_chart: Vec<FlagDifference>,
    /// CPU seconds (user + system) each process used from the burst until every runner was gone, by name.
    pub cpu_secs: BTreeMap<String, f64>,
    /// The sum of `cpu_secs` over the cores' capacity in that time (1.0: every core busy all along).
    pub cpu_utilization: f64,
    /// Anything wrong: lost or twice-served jobs, simulator problems, timeouts.
    pub problems: Vec<String>,
}

/// Runs the benchmark.
pub async fn run(config: &BenchConfig) -> Result<BenchReport> {
    let world = World::start(
        "bench",
        WorldConfig {
            release: "bench".to_owned(),
            simulator: SimulatorConfig {
                job_duration: config.job_duration,
                ..SimulatorConfig::default()
            },
            manager_process: true,
            // Its own control plane: the API server's counts are this run's alone, not also the garbage
            // collection of a test that ran before it in the same binary.
            own_control_plane: true,
            ..WorldConfig::default()
        },
    )
    .await?;
    world.wait_listening(Duration::from_secs(120)).await?;
    let runners = RunnerWatch::start(world.client(), world.namespace());
    // Let the watch list before the burst.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The log's part starts before the counters are read, so that it holds every closed watch they count.
    let apiserver_log = world.ctx.control_plane.dir().join("kube-apiserver.log");
    let log_before = test_harness::process::file_len(&apiserver_log);
    let metrics_before = test_harness::requests::metrics(&world.client()).await?;
    let requests_before = parse_requests(&metrics_before, true);
    let closed_before = parse_terminated_watchers(&metrics_before);
    world.fake.state().reset_counters();
    let processes = measured_processes(&world).await?;
    let cpu_before = cpu_ticks_of(&processes);

    let jobs = config.jobs as usize;
    let started = Instant::now();
    let ids = world.enqueue_in_runs(config.jobs, config.jobs_per_run)?;
    let mut report = BenchReport {
        jobs: config.jobs,
        job_duration_secs: config.job_duration.as_secs_f64(),
        ..BenchReport::default()
    };
    let mut completion_times: Vec<f64> = Vec::with_capacity(jobs);
    let mut completed_seen = 0;
    let pid_of = |wanted: &str| {
        processes
            .iter()
            .find(|(name, _)| name == wanted)
            .map(|(_, pid)| *pid)
    };
    let (manager_pid, listener_pid) = (pid_of("manager"), pid_of("listener"));
    let deadline = started + config.timeout;
    loop {
        let elapsed = started.elapsed().as_secs_f64();
        if report.burst_to_pods_secs.is_none() && world.simulator.stats().pods >= jobs {
            report.burst_to_pods_secs = Some(elapsed);
        }
        let completed = world.fake.state().completed_among(&ids);
        // Completions between two looks share the later time: the tick bounds the error.
        completion_times.extend(std::iter::repeat_n(
            elapsed,
            completed.saturating_sub(completed_seen),
        ));
        completed_seen = completed_seen.max(completed);
        report.manager_rss_parts.sample(manager_pid);
        report.listener_rss_parts.sample(listener_pid);
        if completed == jobs && runners.live() == 0 {
            report.burst_to_settled_secs = elapsed;
            break;
        }
        if let Some(exit) = world.manager_exit() {
            report.problems.push(exit);
            break;
        }
        if Instant::now() >= deadline {
            report.problems.push(format!(
                "timed out after {:?}: {completed} of {jobs} jobs completed, {} runners left; they are: {}",
                config.timeout,
                runners.live(),
                describe_runners(&world).await
            ));
            break;
        }
        tokio::time::sleep(TICK).await;
    }
    let metrics_after = test_harness::requests::metrics(&world.client()).await?;
    let requests_after = parse_requests(&metrics_after, true);
    report.terminated_watchers = diff(&closed_before, &parse_terminated_watchers(&metrics_after));
    report.closed_watches = parse_closed_watches(
        &test_harness::process::read_from(&apiserver_log, log_before).unwrap_or_default(),
    );
    let cpu_after = cpu_ticks_of(&processes);
    report.cpu_secs = cpu_secs_between(&cpu_before, &cpu_after);
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    report.cpu_utilization =
        report.cpu_secs.values().sum::<f64>() / (report.burst_to_settled_secs.max(1e-3) * cores);
    report.completed = completed_seen;
    report.burst_to_last_completion_secs = completion_times.last().copied().unwrap_or_default();
    report.jobs_per_sec = completed_seen as f64 / report.burst_to_last_completion_secs.max(1e-3);
    report.sustained_jobs_per_sec = sustained_rate(&completion_times);
    report.peak_runners = runners.peak();
    // Every runner is gone, so every pod was deleted before it; but the simulated kubelet's pod watch can trail the
    // bench's runner watch (a busy API server closes watchers it finds slow, and listing 2000 pods again takes a
    // while). Until it has seen the last deletions, those runners would count as never gone: give it a moment.
    let catch_up = Instant::now() + SIMULATOR_CATCH_UP;
    while report.problems.is_empty()
        && Instant::now() < catch_up
        && world
            .simulator
            .pods()
            .iter()
            .any(|pod| pod.job_finished_at.is_some() && pod.deleted_at.is_none())
    {
        tokio::time::sleep(TICK).await;
    }
    let (latencies, unseen, lingering) = finish_to_gone(&world, &runners, started);
    report.finish_to_gone = latencies;
    report.teardown_stages = teardown_stages(&world, &runners);
    match world.manager_metrics_url() {
        Some(url) => match http_get(&url).await {
            Ok(text) => {
                report.teardown_stages.manager = manager_teardown_stages(&text);
                report.manager_passes =
                    sum_by_label(&text, "controller_runtime_reconcile_total", "controller");
            }
            Err(error) => report
                .problems
                .push(format!("reading the manager's metrics at {url}: {error}")),
        },
        None => report
            .problems
            .push("the manager runs in this process: no metrics endpoint to read".to_owned()),
    }
    if let Some(path) = std::env::var_os(TIMELINE_ENV) {
        let csv = timeline_csv(
            &world.simulator.pods(),
            &runners.deletion_requested(),
            &runners.deleted(),
            started,
        );
        if let Err(error) = std::fs::write(&path, csv) {
            eprintln!("e2e-bench: writing the timeline to {path:?} failed: {error}");
        }
    }
    report.peak_finished_not_gone = peak_overlap(&lingering, report.burst_to_settled_secs);
    report.problems.extend(unseen);

    report.manager_peak_rss_mib = world.manager_pid().map_or(0.0, peak_rss_mib);
    report.listener_peak_rss_mib = world
        .listener_pids()
        .await?
        .into_iter()
        .map(peak_rss_mib)
        .fold(0.0, f64::max);

    let counters = world.fake.state().counters();
    let per_job = |n: u64| n as f64 / f64::from(config.jobs.max(1));
    report.actions_calls_per_job = per_job(
        counters
            .iter()
            .filter(|(endpoint, _)| endpoint.as_str() != "get_message")
            .map(|(_, n)| n)
            .sum(),
    );
    report.actions_calls = counters;
    let requests = split_requests(diff(&requests_before, &requests_after));
    report.kubernetes_reads_per_job = per_job(requests.reads.values().sum());
    let created = |key: &str| requests.writes.get(key).copied().unwrap_or_default();
    // The listener's pod was created before the counters were read: every pod POST of the run is a runner's.
    report.pod_creations_per_runner =
        created("pods POST") as f64 / created("ephemeralrunners POST").max(1) as f64;
    report.runners_per_job = per_job(created("ephemeralrunners POST"));
    let product_writes: u64 = requests.writes.values().sum();
    report.kubernetes_writes_per_job = per_job(product_writes);
    report.kubernetes_writes_per_sec =
        product_writes as f64 / report.burst_to_settled_secs.max(1e-3);
    report.kubernetes_writes = requests.writes;
    report.kubernetes_reads = requests.reads;
    report.other_requests = requests.others;
    report.manager_flags = world.manager_flags().unwrap_or_default();
    match chart_default_flags() {
        Ok(chart) => {
            report.flags_differing_from_chart = flag_differences(&report.manager_flags, &chart)?;
            report.chart_default_flags = chart;
        }
        Err(error) => report.problems.push(format!(
            "rendering the controller chart's defaults: {error}"
        )),
    }

    report
        .problems
        .extend(checks::jobs_completed_exactly_once(&world, &ids, &[]));
    report
        .problems
        .extend(checks::no_false_interruptions(&world).await?);
    report.problems.extend(world.simulator.problems());
    let sample = match (runners.sample(), world.simulator.samples()) {
        (Some(runner), (Some(pod), Some(secret))) => {
            crate::lifecycle_baseline::Sample::from_run(&runner, &pod, &secret)
        }
        _ => crate::lifecycle_baseline::Sample::minimal(),
    }
    .map_err(|e| Error::Invariant(format!("a baseline object: {e}")))?;
    runners.stop();

    // The baseline runs alone: the manager and the listener stop first.
    world.stop_manager(false).await?;
    let objects = if config.baseline_objects == 0 {
        jobs
    } else {
        config.baseline_objects
    };
    let namespace = test_harness::create_namespace(&world.client(), "bench-baseline").await?;
    report.baseline = raw_write_rate(&world.client(), &namespace, objects).await?;
    if report.kubernetes_writes_per_job > 0.0 {
        report.write_bound_jobs_per_sec =
            report.baseline.writes_per_sec / report.kubernetes_writes_per_job;
        report.ratio_to_write_bound = report.jobs_per_sec / report.write_bound_jobs_per_sec;
    }
    let namespace = test_harness::create_namespace(&world.client(), "bench-lifecycle").await?;
    report.lifecycle_baseline =
        crate::lifecycle_baseline::fastest(&world.client(), &namespace, objects, &sample).await?;
    if report.lifecycle_baseline.runners_per_sec > 0.0 {
        report.ratio_to_lifecycle = report.jobs_per_sec / report.lifecycle_baseline.runners_per_sec;
    }
    if let Some(pods) = report.burst_to_pods_secs
        && report.lifecycle_baseline.all_pods_secs > 0.0
    {
        report.pods_time_over_lifecycle = pods / report.lifecycle_baseline.all_pods_secs;
    }
    world.shutdown().await?;
    Ok(report)
}

/// The runners still there, counted by what each looks like to the controller, the pod and the service, for a
/// run that did not finish.
async fn describe_runners(world: &World) -> String {
    let (Ok(runners), Ok(pods)) = (world.ephemeral_runners().await, world.runner_pods().await)
    else {
        return "(could not list them)".to_owned();
    };
    let snapshot = world.fake.state().snapshot();
    let simulated: HashMap<String, String> = world
        .simulator
        .pods()
        .into_iter()
        .map(|pod| (pod.name, format!("{:?}", pod.stage)))
        .collect();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for runner in &runners {
        let name = runner.name_any();
        let status = runner.status.clone().unwrap_or_default();
        let pod = pods.iter().find(|p| p.name_any() == name);
        let registered = snapshot.runners.iter().find(|r| r.id == status.runner_id);
        let key = format!(
            "er(phase={:?} deleting={} runnerId={} job={}) pod({}) simulator({}) service({})",
            status.phase,
            runner.metadata.deletion_timestamp.is_some(),
            status.runner_id != 0,
            status.job_request_id != 0,
            pod.and_then(|p| p.status.as_ref()?.phase.clone())
                .unwrap_or_else(|| "none".to_owned()),
            simulated.get(&name).map_or("unseen", String::as_str),
            registered.map_or_else(
                || "unregistered".to_owned(),
                |r| format!("online={} job={}", r.online, r.job_request_id.is_some())
            ),
        );
        *kinds.entry(key).or_default() += 1;
    }
    format!("{kinds:?}")
}

/// Jobs per second between the 10th and the 90th percentile of `times` (sorted completion times, seconds).
pub fn sustained_rate(times: &[f64]) -> f64 {
    if times.len() < 10 {
        return 0.0;
    }
    let low = times.len() / 10;
    let high = times.len() * 9 / 10;
    let window = times[high - 1] - times[low];
    if window <= 0.0 {
        // Every completion in the window fell into one tick: the rate is at least what one tick shows.
        return (high - low) as f64 / TICK.as_secs_f64();
    }
    (high - 1 - low) as f64 / window
}

/// When a runner's job finished and when the runner was gone (`None`: never seen gone), in seconds after the
/// burst.
pub type Lingering = (f64, Option<f64>);

/// Per finished job: from the runner finishing it to its pod and EphemeralRunner both deleted.
/// The finish-to-gone latencies; a problem for runners that finished a job but were never seen gone; and for
/// every such runner, when (seconds after `started`) its job finished and when it was gone (`None`: never seen
/// gone), for [`peak_overlap`].
pub(crate) fn finish_to_gone(
    world: &World,
    runners: &RunnerWatch,
    started: Instant,
) -> (Percentiles, Option<String>, Vec<Lingering>) {
    let deleted = runners.deleted();
    let mut samples = Vec::new();
    let mut lingering = Vec::new();
    let (mut pod_not_seen_gone, mut runner_not_seen_gone) = (Vec::new(), Vec::new());
    let since = |at: Instant| at.saturating_duration_since(started).as_secs_f64();
    for pod in world.simulator.pods() {
        let Some(finished) = pod.job_finished_at else {
            continue;
        };
        let runner_gone = deleted.get(&pod.name).copied();
        if pod.deleted_at.is_none() {
            pod_not_seen_gone.push(pod.name.clone());
        }
        if runner_gone.is_none() {
            runner_not_seen_gone.push(pod.name.clone());
        }
        let gone = pod
            .deleted_at
            .zip(runner_gone)
            .map(|(pod_gone, runner_gone)| pod_gone.max(runner_gone));
        if let Some(gone) = gone {
            samples.push(gone.saturating_duration_since(finished).as_secs_f64());
        }
        lingering.push((since(finished), gone.map(since)));
    }
    let problem = (!pod_not_seen_gone.is_empty() || !runner_not_seen_gone.is_empty()).then(|| {
        format!(
            "runners that finished a job but were not seen gone: pods {pod_not_seen_gone:?}, \
             EphemeralRunners {runner_not_seen_gone:?}"
        )
    });
    (Percentiles::of(samples), problem, lingering)
}

/// With this variable set to a path, the bench writes there, as CSV, when each runner's pod was first seen, its
/// job finished, its exit was written, its EphemeralRunner's deletion was seen, and its pod and its
/// EphemeralRunner were gone (seconds after the burst): to see whether slow teardowns come together.
pub const TIMELINE_ENV: &str = "ARC_RS_BENCH_TIMELINE";

/// The per-runner timeline of [`TIMELINE_ENV`], sorted by when each job finished; an empty field was not seen.
pub(crate) fn timeline_csv(
    pods: &[crate::simulator::PodRecord],
    requested: &HashMap<String, Instant>,
    deleted: &HashMap<String, Instant>,
    started: Instant,
) -> String {
    let at = |instant: Option<Instant>| {
        instant.map_or_else(String::new, |instant| {
            format!(
                "{:.3}",
                instant.saturating_duration_since(started).as_secs_f64()
            )
        })
    };
    let mut rows: Vec<_> = pods
        .iter()
        .map(|pod| {
            let row = [
                pod.name.clone(),
                at(pod.seen_at),
                at(pod.job_finished_at),
                at(pod.exited_at),
                at(requested.get(&pod.name).copied()),
                at(pod.deleted_at),
                at(deleted.get(&pod.name).copied()),
            ]
            .join(",");
            (pod.job_finished_at.is_none(), pod.job_finished_at, row)
        })
        .collect();
    rows.sort();
    let mut csv =
        "runner,pod_seen,job_finished,exit_written,deletion_seen,pod_gone,runner_gone\n".to_owned();
    for (_, _, row) in rows {
        csv.push_str(&row);
        csv.push('\n');
    }
    csv
}

/// A finished runner's teardown in three stages, each from the end of the one before; a runner counts in a stage
/// when both of its ends were seen. Which stage is long says whose turn it is: the node's, the manager's, or the
/// API server's and the garbage collector's.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TeardownStages {
    /// Job finished → the runner container's exit written to the pod's status (the simulated kubelet, part of
    /// the benchmark: its status writes queue behind the burst's like a real kubelet's).
    pub exit_written: Percentiles,
    /// Exit written → that write's watch event on the simulated kubelet's own pod watch: what one watch hop takes
    /// under the run's load. `deletion_requested` holds two such hops (the pod's event on its way to the manager,
    /// the runner's deletion on its way back to the benchmark) beside the manager's own time.
    pub exit_event: Percentiles,
    /// Exit written → the EphemeralRunner seen with a deletion timestamp on the benchmark's own watch: the pod's
    /// watch event reaching the manager, the teardown lane's queue, its `DELETE`, and that change's watch event.
    pub deletion_requested: Percentiles,
    /// Deletion seen → pod and EphemeralRunner both gone: deregistration, the pod's and the Secret's deletes,
    /// the finalizers' removal, and their watch events.
    pub gone: Percentiles,
    /// What the two stages above are made of, from the manager's own clock
    /// (`gha_controller_runner_teardown_seconds`, read from its metrics endpoint at the end of the run): by stage
    /// (`waited`: the runner's end seen → its teardown pass starting; `delete_runner`, `deregister`,
    /// `delete_children`, `finalizers`: each request's time; `pass`: the whole pass). What the stages above take
    /// beyond these is the watch events' way and the garbage collector.
    pub manager: BTreeMap<String, HistogramQuantiles>,
}

/// Quantiles read from a Prometheus histogram's cumulative buckets, interpolated linearly within the bucket that
/// holds the rank (as `histogram_quantile` does): within a bucket's width of the truth.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistogramQuantiles {
    pub count: u64,
    pub p50: f64,
    pub p99: f64,
}

impl HistogramQuantiles {
    /// From `(upper bound, cumulative count)` pairs, ascending, `+Inf` last.
    pub fn of(buckets: &[(f64, u64)]) -> Self {
        let count = buckets.last().map_or(0, |&(_, count)| count);
        let quantile = |q: f64| {
            let rank = q * count as f64;
            let mut lower = (0.0, 0u64);
            for &(bound, cumulative) in buckets {
                if cumulative as f64 >= rank {
                    if bound.is_infinite() {
                        return lower.0;
                    }
                    let within = (cumulative - lower.1) as f64;
                    let fraction = if within > 0.0 {
                        (rank - lower.1 as f64) / within
                    } else {
                        0.0
                    };
                    return lower.0 + (bound - lower.0) * fraction;
                }
                lower = (bound, cumulative);
            }
            lower.0
        };
        if count == 0 {
            return Self::default();
        }
        Self {
            count,
            p50: quantile(0.5),
            p99: quantile(0.99),
        }
    }
}

/// The manager's teardown stages from its metrics text (`gha_controller_runner_teardown_seconds_bucket`).
pub fn manager_teardown_stages(metrics: &str) -> BTreeMap<String, HistogramQuantiles> {
    let mut buckets: BTreeMap<String, Vec<(f64, u64)>> = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("gha_controller_runner_teardown_seconds_bucket{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels.split(',').find_map(|pair| {
                let (key, value) = pair.split_once('=')?;
                (key.trim() == name).then(|| value.trim_matches('"').to_owned())
            })
        };
        let (Some(stage), Some(bound), Ok(count)) =
            (label("stage"), label("le"), value.trim().parse::<f64>())
        else {
            continue;
        };
        let bound = if bound == "+Inf" {
            f64::INFINITY
        } else {
            bound.parse().unwrap_or(f64::INFINITY)
        };
        buckets
            .entry(stage)
            .or_default()
            .push((bound, count as u64));
    }
    buckets
        .into_iter()
        .map(|(stage, mut pairs)| {
            pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
            (stage, HistogramQuantiles::of(&pairs))
        })
        .collect()
}

/// The [`TeardownStages`] of every runner that finished a job.
pub(crate) fn teardown_stages(world: &World, runners: &RunnerWatch) -> TeardownStages {
    let requested = runners.deletion_requested();
    let deleted = runners.deleted();
    let (mut exit_written, mut exit_event, mut deletion_requested, mut gone) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let between = |from: Option<Instant>, to: Option<Instant>| {
        from.zip(to)
            .map(|(from, to)| to.saturating_duration_since(from).as_secs_f64())
    };
    for pod in world.simulator.pods() {
        if pod.job_finished_at.is_none() {
            continue;
        }
        let asked = requested.get(&pod.name).copied();
        let all_gone = pod
            .deleted_at
            .zip(deleted.get(&pod.name).copied())
            .map(|(pod_gone, runner_gone)| pod_gone.max(runner_gone));
        exit_written.extend(between(pod.job_finished_at, pod.exited_at));
        exit_event.extend(between(pod.exited_at, pod.exit_seen_at));
        deletion_requested.extend(between(pod.exited_at, asked));
        gone.extend(between(asked, all_gone));
    }
    TeardownStages {
        exit_written: Percentiles::of(exit_written),
        exit_event: Percentiles::of(exit_event),
        deletion_requested: Percentiles::of(deletion_requested),
        gone: Percentiles::of(gone),
        manager: BTreeMap::new(),
    }
}

/// The most intervals `[start, end)` that overlap at one moment; an interval without an end lasts until
/// `until`. An interval that ends at the moment another starts does not overlap it.
pub fn peak_overlap(intervals: &[Lingering], until: f64) -> usize {
    // (time, +1 for a start / -1 for an end); at equal times ends sort first.
    let mut events: Vec<(f64, i32)> = intervals
        .iter()
        .flat_map(|&(start, end)| {
            let end = end.unwrap_or(until.max(start));
            [(start, 1), (end, -1)]
        })
        .collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut peak) = (0i64, 0i64);
    for (_, delta) in events {
        now += i64::from(delta);
        peak = peak.max(now);
    }
    usize::try_from(peak).unwrap_or(0)
}

/// The resources the manager and the listener work with (the chart's RBAC for them). Every other resource in
/// the API server's count is some other client's: the control plane's own (kube-controller-manager's leases,
/// endpoints and endpoint slices, the limit ranges and resource quotas admission looks up, namespaces), and
/// discovery and other non-resource paths (`/api`, `/apis`, `/openapi`). Leases are
/// not in it: the benchmark runs the manager without leader election, as the chart does with one replica, so
/// every lease request is the control plane's.
const PRODUCT_RESOURCES: [&str; 11] = [
    "ephemeralrunners",
    "ephemeralrunnersets",
    "autoscalingrunnersets",
    "autoscalinglisteners",
    "pods",
    "secrets",
    "serviceaccounts",
    "roles",
    "rolebindings",
    "configmaps",
    "events",
];

/// Whether a request counted by the API server (`resource[/subresource] VERB`) is the manager's or the
/// listener's: one of [`PRODUCT_RESOURCES`], but not the pod status writes of the simulated kubelet and of the
/// listener executor, nor the executor's token requests (the kubelet's part for listener pods).
pub fn is_product_request(key: &str) -> bool {
    let resource = key.split(' ').next().unwrap_or_default();
    let (base, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    PRODUCT_RESOURCES.contains(&base)
        && !matches!(
            (base, subresource),
            ("pods", "status") | ("serviceaccounts", "token")
        )
}

/// EphemeralRunners seen: when each was deleted, how many exist, and the most that existed at once.
pub(crate) struct RunnerWatch {
    state: Arc<Mutex<RunnerState>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct RunnerState {
    live: HashSet<String>,
    peak: usize,
    /// When the watch first showed each runner with a deletion timestamp.
    deletion_requested: HashMap<String, Instant>,
    deleted: HashMap<String, Instant>,
    /// The first runner seen, as the API server gave it (see [`crate::lifecycle_baseline::Sample`]).
    sample: Option<EphemeralRunner>,
}

impl RunnerWatch {
    pub(crate) fn start(client: Client, namespace: &str) -> Self {
        let state: Arc<Mutex<RunnerState>> = Arc::default();
        let api: Api<EphemeralRunner> = Api::namespaced(client, namespace);
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            // A re-list's implied deletions come as events too (the runners it no longer holds were deleted while
            // the watch was not following).
            let (cache, writer) = reflector::store();
            let mut events = with_relist_deletions(
                watcher(api, watcher::Config::default()).reflect(writer),
                cache,
            )
            .boxed();
            while let Some(event) = events.next().await {
                let mut state = shared.lock().unwrap_or_else(|p| p.into_inner());
                match event {
                    Ok(watcher::Event::Apply(er) | watcher::Event::InitApply(er)) => {
                        if state.sample.is_none() {
                            state.sample = Some(er.clone());
                        }
                        let name = er.name_any();
                        if er.metadata.deletion_timestamp.is_some() {
                            state
                                .deletion_requested
                                .entry(name.clone())
                                .or_insert_with(Instant::now);
                        }
                        state.live.insert(name);
                        state.peak = state.peak.max(state.live.len());
                    }
                    Ok(watcher::Event::Delete(er)) => {
                        let name = er.name_any();
                        state.live.remove(&name);
                        let now = Instant::now();
                        // A runner whose finalizers came off before its deletion arrived is gone at once, never
                        // seen with a deletion timestamp: requested and gone at the same moment.
                        state.deletion_requested.entry(name.clone()).or_insert(now);
                        state.deleted.entry(name).or_insert(now);
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitDone) | Err(_) => {}
                }
            }
        });
        Self { state, task }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RunnerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn live(&self) -> usize {
        self.lock().live.len()
    }

    pub(crate) fn peak(&self) -> usize {
        self.lock().peak
    }

    pub(crate) fn deleted(&self) -> HashMap<String, Instant> {
        self.lock().deleted.clone()
    }

    pub(crate) fn sample(&self) -> Option<EphemeralRunner> {
        self.lock().sample.clone()
    }

    pub(crate) fn deletion_requested(&self) -> HashMap<String, Instant> {
        self.lock().deletion_requested.clone()
    }

    pub(crate) fn stop(self) {
        self.task.abort();
    }
}

/// Linux reports CPU times in clock ticks of `USER_HZ`, which is 100 on every architecture Linux supports
/// (`sysconf(_SC_CLK_TCK)` returns it; the kernel's internal HZ does not show through).
pub(crate) const TICKS_PER_SEC: f64 = 100.0;

/// The processes whose CPU time a run reports, by name: the manager, the listener, the control plane's
/// components and this process (the fake Actions Service and the simulated runners live here).
pub(crate) async fn measured_processes(world: &World) -> Result<Vec<(String, u32)>> {
    let mut processes = world.ctx.control_plane.component_pids();
    processes.extend(world.manager_pid().map(|pid| ("manager".to_owned(), pid)));
    processes.extend(
        world
            .listener_pids()
            .await?
            .into_iter()
            .map(|pid| ("listener".to_owned(), pid)),
    );
    processes.push(("bench (fake + simulator)".to_owned(), std::process::id()));
    Ok(processes)
}

/// User + system CPU ticks of each process that is still there, summed by name (every listener is
/// `listener`).
pub(crate) fn cpu_ticks_of(processes: &[(String, u32)]) -> BTreeMap<String, u64> {
    let mut ticks: BTreeMap<String, u64> = BTreeMap::new();
    for (name, pid) in processes {
        if let Some(n) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| parse_cpu_ticks(&stat))
        {
            *ticks.entry(name.clone()).or_default() += n;
        }
    }
    ticks
}

/// CPU seconds of each process between two [`cpu_ticks_of`] readings (processes in both).
pub(crate) fn cpu_secs_between(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(name, after)| {
            let before = before.get(name)?;
            Some((
                name.clone(),
                after.saturating_sub(*before) as f64 / TICKS_PER_SEC,
            ))
        })
        .collect()
}

/// `utime + stime` from a `/proc/PID/stat` line (fields 14 and 15; the command name in field 2 may hold spaces
/// and parentheses, so fields are counted from its closing parenthesis).
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// Peak resident set size (`VmHWM`) of a process, in MiB; 0 when unreadable.
pub fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| parse_vm_hwm_kib(&status))
        .map_or(0.0, |kib| kib as f64 / 1024.0)
}

/// The `VmHWM` line of `/proc/PID/status`, in KiB.
pub fn parse_vm_hwm_kib(status: &str) -> Option<u64> {
    status_kib(status, "VmHWM:")
}

/// The value of line `key` (with its colon) of `/proc/PID/status`, in KiB.
pub(crate) fn status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// The API server's count of requests (watches aside), by `resource[/subresource] VERB`.
pub(crate) async fn apiserver_requests(client: &Client) -> Result<BTreeMap<String, u64>> {
    Ok(test_harness::requests::count(client).await?)
}

/// Sums `apiserver_request_total` samples of write verbs by `resource[/subresource] VERB`.
pub fn parse_writes(metrics: &str) -> BTreeMap<String, u64> {
    parse_requests(metrics, false)
}

/// The API server's requests over part of a run, split by [`is_product_request`] into the manager's and the
/// listener's writes and reads, and everybody else's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestSplit {
    pub writes: BTreeMap<String, u64>,
    pub reads: BTreeMap<String, u64>,
    pub others: BTreeMap<String, u64>,
}

/// Splits counts by `resource[/subresource] VERB[ (qualifier)]` (as [`parse_requests`] gives them). Requests
/// the API server refused or only dry-ran count where the others do: they cost it as much.
pub fn split_requests(requests: BTreeMap<String, u64>) -> RequestSplit {
    let mut split = RequestSplit::default();
    for (key, n) in requests {
        let verb = key.split(' ').nth(1).unwrap_or_default();
        let bucket = if !is_product_request(&key) {
            &mut split.others
        } else if is_write_verb(verb) {
            &mut split.writes
        } else {
            &mut split.reads
        };
        bucket.insert(key, n);
    }
    split
}

/// A manager flag whose effective value (the manager's default when not given) differs between two command
/// lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FlagDifference {
    /// `--name`.
    pub flag: String,
    /// The value in this run.
    pub here: String,
    /// The value the chart's defaults give.
    pub chart: String,
}

/// The manager flags the controller chart renders with its default values.
pub fn chart_default_flags() -> Result<Vec<String>> {
    let objects = chart_tests::Template::new(chart_tests::Chart::Controller)
        .release("arc")
        .namespace("arc-systems")
        .render()?
        .into_objects();
    deployment_args(&objects).ok_or_else(|| {
        Error::Invariant("the controller chart rendered no manager container args".to_owned())
    })
}

/// The `args` of the `manager` container of the Deployment among `objects`.
pub fn deployment_args(objects: &[serde_json::Value]) -> Option<Vec<String>> {
    objects
        .iter()
        .filter(|o| o["kind"] == "Deployment")
        .flat_map(|o| {
            o["spec"]["template"]["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .find(|c| c["name"] == "manager")?["args"]
        .as_array()
        .map(|args| {
            args.iter()
                .filter_map(|a| a.as_str().map(str::to_owned))
                .collect()
        })
}

/// The flags whose effective value differs between command lines `here` and `chart`, both parsed by the
/// manager's own command-line parser (so a flag left out counts with its default, and aliases are one flag).
pub fn flag_differences(here: &[String], chart: &[String]) -> Result<Vec<FlagDifference>> {
    use clap::CommandFactory;
    let command = controller::cli::Args::command();
    let parse = |args: &[String]| {
        command
            .clone()
            .try_get_matches_from(std::iter::once("manager".to_owned()).chain(args.iter().cloned()))
            .map_err(|e| Error::Invariant(format!("manager flags {args:?}: {e}")))
    };
    let (ours, theirs) = (parse(here)?, parse(chart)?);
    let value = |matches: &clap::ArgMatches, id: &str| {
        matches
            .try_get_raw(id)
            .ok()
            .flatten()
            .map(|values| {
                values
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default()
    };
    Ok(command
        .get_arguments()
        .filter_map(|arg| {
            let id = arg.get_id().as_str();
            let (here, chart) = (value(&ours, id), value(&theirs, id));
            (here != chart).then(|| FlagDifference {
                flag: format!("--{}", arg.get_long().unwrap_or(id)),
                here,
                chart,
            })
        })
        .collect())
}

/// Creates `objects` EphemeralRunners, Secrets and Pods in `namespace`, then deletes them, with
/// [`BASELINE_WRITERS`] concurrent writers; the rate is writes over the wall time.
async fn raw_write_rate(client: &Client, namespace: &str, objects: usize) -> Result<Baseline> {
    let runners: Api<EphemeralRunner> = Api::namespaced(client.clone(), namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let (runner, secret, pod) = crate::lifecycle_baseline::sample_objects("x")
        .map_err(|e| Error::Invariant(format!("a baseline object: {e}")))?;

    let started = Instant::now();
    let creates: Vec<Write> = (0..objects)
        .flat_map(|i| {
            let name = format!("bench-{i}");
            [
                Write::Create(Kind::Runner, name.clone()),
                Write::Create(Kind::Secret, name.clone()),
                Write::Create(Kind::Pod, name),
            ]
        })
        .collect();
    let deletes: Vec<Write> = creates
        .iter()
        .map(|write| match write {
            Write::Create(kind, name) | Write::Delete(kind, name) => {
                Write::Delete(*kind, name.clone())
            }
        })
        .collect();
    let mut writes = 0;
    for batch in [creates, deletes] {
        let results: Vec<Result<()>> = stream::iter(batch)
            .map(|write| {
                let (runners, secrets, pods) = (&runners, &secrets, &pods);
                let (runner, secret, pod) = (&runner, &secret, &pod);
                async move {
                    let post = PostParams::default();
                    let delete = DeleteParams::default();
                    match write {
                        Write::Create(Kind::Runner, name) => {
                            let mut object = runner.clone();
                            object.metadata.name = Some(name);
                            runners.create(&post, &object).await.map(drop)
                        }
                        Write::Create(Kind::Secret, name) => {
                            let mut object = secret.clone();
                            object.metadata.name = Some(name);
                            secrets.create(&post, &object).await.map(drop)
                        }
                        Write::Create(Kind::Pod, name) => {
                            let mut object = pod.clone();
                            object.metadata.name = Some(name);
                            pods.create(&post, &object).await.map(drop)
                        }
                        Write::Delete(Kind::Runner, name) => {
                            runners.delete(&name, &delete).await.map(drop)
                        }
                        Write::Delete(Kind::Secret, name) => {
                            secrets.delete(&name, &delete).await.map(drop)
                        }
                        Write::Delete(Kind::Pod, name) => {
                            pods.delete(&name, &delete).await.map(drop)
                        }
                    }
                    .map_err(Error::from)
                }
            })
            .buffer_unordered(BASELINE_WRITERS)
            .collect()
            .await;
        for result in results {
            result?;
            writes += 1;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    Ok(Baseline {
        objects_per_kind: objects,
        writers: BASELINE_WRITERS,
        writes,
        secs,
        writes_per_sec: writes as f64 / secs.max(1e-3),
    })
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Runner,
    Secret,
    Pod,
}

enum Write {
    Create(Kind, String),
    Delete(Kind, String),
}

/// The body of a plain `GET` of `url` (`http://host:port/path`, as the manager's metrics endpoint), over HTTP/1.0
/// so the answer ends with the connection.
pub async fn http_get(url: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let invalid = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not an http URL: {url}"),
        )
    };
    let rest = url.strip_prefix("http://").ok_or_else(invalid)?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let mut stream = tokio::net::TcpStream::connect(authority).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no HTTP header"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(std::io::Error::other(format!(
            "answered {}",
            head.lines().next().unwrap_or_default()
        )));
    }
    Ok(body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantiles_come_from_the_bucket_that_holds_the_rank_interpolated() {
        // 100 observations: 50 up to 0.1 s, 40 more up to 0.2 s, the last 10 up to 0.4 s.
        let buckets = [(0.1, 50), (0.2, 90), (0.4, 100), (f64::INFINITY, 100)];
        let q = HistogramQuantiles::of(&buckets);
        assert_eq!(q.count, 100);
        assert!((q.p50 - 0.1).abs() < 1e-9, "{q:?}");
        assert!((q.p99 - 0.38).abs() < 1e-9, "{q:?}");
        assert_eq!(HistogramQuantiles::of(&[]), HistogramQuantiles::default());
        // Past the last finite bound, the last finite bound.
        let q = HistogramQuantiles::of(&[(0.1, 1), (f64::INFINITY, 100)]);
        assert!((q.p99 - 0.1).abs() < 1e-9, "{q:?}");
    }

    #[test]
    fn the_managers_teardown_stages_are_read_from_its_metrics() {
        let text = "# HELP gha_controller_runner_teardown_seconds x\n\
            gha_controller_runner_teardown_seconds_bucket{stage=\"waited\",le=\"0.005\"} 0\n\
            gha_controller_runner_teardown_seconds_bucket{stage=\"waited\",le=\"0.01\"} 4\n\
            gha_controller_runner_teardown_seconds_bucket{stage=\"waited\",le=\"+Inf\"} 4\n\
            gha_controller_runner_teardown_seconds_count{stage=\"waited\"} 4\n\
            gha_controller_runner_teardown_seconds_bucket{stage=\"pass\",le=\"1.0\"} 2\n\
            gha_controller_runner_teardown_seconds_bucket{stage=\"pass\",le=\"+Inf\"} 2\n\
            controller_runtime_reconcile_time_seconds_bucket{controller=\"x\",le=\"0.01\"} 9\n";
        let stages = manager_teardown_stages(text);
        assert_eq!(stages.keys().collect::<Vec<_>>(), ["pass", "waited"]);
        assert_eq!(stages["waited"].count, 4);
        assert!(stages["waited"].p99 > 0.005 && stages["waited"].p99 <= 0.01);
        assert_eq!(stages["pass"].count, 2);
    }

    #[test]
    fn the_timeline_lists_each_runner_by_when_its_job_finished() {
        let started = Instant::now();
        let after = |ms: u64| Some(started + Duration::from_millis(ms));
        let pod = |name: &str, finished: Option<Instant>| crate::simulator::PodRecord {
            namespace: "ns".into(),
            name: name.into(),
            stage: crate::simulator::PodStage::Pending,
            runner_id: None,
            job: None,
            seen_at: after(100),
            job_finished_at: finished,
            exited_at: finished.map(|at| at + Duration::from_millis(50)),
            exit_seen_at: None,
            deleted_at: None,
            created: None,
            runner_env: BTreeMap::new(),
        };
        let pods = [
            pod("idle", None),
            pod("late", after(3000)),
            pod("early", after(2000)),
        ];
        let requested =
            HashMap::from([("early".to_owned(), started + Duration::from_millis(2500))]);
        let deleted = HashMap::from([("early".to_owned(), started + Duration::from_millis(2600))]);
        let csv = timeline_csv(&pods, &requested, &deleted, started);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines,
            [
                "runner,pod_seen,job_finished,exit_written,deletion_seen,pod_gone,runner_gone",
                "early,0.100,2.000,2.050,2.500,,2.600",
                "late,0.100,3.000,3.050,,,",
                "idle,0.100,,,,,",
            ]
        );
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let p = Percentiles::of((1..=100).map(f64::from).collect());
        assert_eq!(
            (p.samples, p.p50, p.p95, p.p99, p.max),
            (100, 50.0, 95.0, 99.0, 100.0)
        );
        let one = Percentiles::of(vec![2.5]);
        assert_eq!((one.p50, one.p99), (2.5, 2.5));
        assert_eq!(Percentiles::of(Vec::new()), Percentiles::default());
    }

    #[test]
    fn the_sustained_rate_ignores_the_first_and_last_tenth() {
        // 100 completions, one every 0.1 s after a 5 s ramp, and a straggler at 60 s.
        let mut times: Vec<f64> = (0..99).map(|i| 5.0 + f64::from(i) * 0.1).collect();
        times.push(60.0);
        let rate = sustained_rate(&times);
        assert!((rate - 10.0).abs() < 0.01, "{rate}");
        assert_eq!(sustained_rate(&[1.0; 5]), 0.0);
    }

    #[test]
    fn writes_are_summed_by_resource_and_verb() {
        let metrics = r#"
# HELP apiserver_request_total Counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="actions.github.com",resource="ephemeralrunners",scope="resource",subresource="",verb="POST",version="v1alpha1"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="actions.github.com",resource="ephemeralrunners",scope="resource",subresource="",verb="POST",version="v1alpha1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="actions.github.com",resource="ephemeralrunners",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 9
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 4
apiserver_request_total{code="201",component="apiserver",dry_run="All",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 2
apiserver_request_total{code="504",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 1
"#;
        let writes = parse_writes(metrics);
        assert_eq!(
            writes,
            BTreeMap::from([
                ("ephemeralrunners POST".to_owned(), 7),
                ("ephemeralrunners POST (409)".to_owned(), 1),
                ("ephemeralrunners/status PATCH".to_owned(), 3),
                ("pods POST (dry run)".to_owned(), 2),
                ("pods POST (504)".to_owned(), 1),
                ("pods/status PATCH".to_owned(), 4),
            ])
        );
        // Refused and dry-run writes are the product's writes all the same.
        let split = split_requests(writes.clone());
        assert_eq!(split.writes.values().sum::<u64>(), 14, "{split:?}");
        let product: u64 = writes
            .iter()
            .filter(|(k, _)| is_product_request(k))
            .map(|(_, n)| n)
            .sum();
        assert_eq!(product, 14);
    }

    #[test]
    fn only_the_products_own_requests_count() {
        for key in [
            "ephemeralrunners POST",
            "ephemeralrunners/status PATCH",
            "ephemeralrunnersets/status PATCH",
            "autoscalinglisteners/status PATCH",
            "pods POST",
            "pods DELETE",
            "secrets GET",
            "serviceaccounts POST",
            "rolebindings POST",
            "events POST",
        ] {
            assert!(is_product_request(key), "{key}");
        }
        for key in [
            // The simulated kubelet, the listener executor.
            "pods/status PATCH",
            "serviceaccounts/token POST",
            // The control plane's own.
            "leases PUT",
            "leases GET",
            "endpoints GET",
            "endpointslices LIST",
            "limitranges LIST",
            "resourcequotas LIST",
            "namespaces GET",
            // Discovery and other non-resource paths.
            "//apis GET",
            "//metrics GET",
            " GET",
        ] {
            assert!(!is_product_request(key), "{key}");
        }
        let split = split_requests(BTreeMap::from([
            ("pods POST".to_owned(), 3),
            ("pods LIST".to_owned(), 2),
            ("pods/status PATCH".to_owned(), 7),
            ("limitranges LIST".to_owned(), 5),
        ]));
        assert_eq!(
            split,
            RequestSplit {
                writes: BTreeMap::from([("pods POST".to_owned(), 3)]),
                reads: BTreeMap::from([("pods LIST".to_owned(), 2)]),
                others: BTreeMap::from([
                    ("limitranges LIST".to_owned(), 5),
                    ("pods/status PATCH".to_owned(), 7),
                ]),
            }
        );
    }

    #[test]
    fn the_peak_of_overlapping_intervals_counts_open_ones_until_the_end() {
        assert_eq!(peak_overlap(&[], 10.0), 0);
        // [1, 4), [2, 3), [3, 5): at 2.5 two, at 3 the second ends as the third starts.
        let closed = [(1.0, Some(4.0)), (2.0, Some(3.0)), (3.0, Some(5.0))];
        assert_eq!(peak_overlap(&closed, 10.0), 2);
        // Back to back: never two at once.
        assert_eq!(peak_overlap(&[(1.0, Some(2.0)), (2.0, Some(3.0))], 10.0), 1);
        // Never seen gone: lasts until the end and overlaps everything after its start.
        let open = [(1.0, None), (5.0, Some(6.0)), (8.0, Some(9.0)), (8.5, None)];
        assert_eq!(peak_overlap(&open, 10.0), 3);
        // An empty interval is no runner lingering.
        assert_eq!(peak_overlap(&[(2.0, Some(2.0))], 10.0), 0);
    }

    #[test]
    fn flag_differences_compare_effective_values() {
        let strings = |args: &[&str]| args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
        let here = strings(&[
            "--log-level=info",
            "--watch-namespace=bench",
            // The manager's default, given explicitly: no difference.
            "--runner-max-concurrent-reconciles=64",
            // An alias of --k8s-client-rate-limiter-qps.
            "--kube-api-qps=400",
        ]);
        let chart = strings(&["--auto-scaling-runner-set-only", "--log-level=debug"]);
        let differences = flag_differences(&here, &chart).expect("both parse");
        let named = |flag: &str| differences.iter().find(|d| d.flag == flag).cloned();
        assert_eq!(
            named("--log-level"),
            Some(FlagDifference {
                flag: "--log-level".to_owned(),
                here: "info".to_owned(),
                chart: "debug".to_owned(),
            })
        );
        assert_eq!(
            named("--k8s-client-rate-limiter-qps").map(|d| (d.here, d.chart)),
            Some(("400".to_owned(), "500".to_owned()))
        );
        assert_eq!(
            named("--auto-scaling-runner-set-only").map(|d| (d.here, d.chart)),
            Some(("false".to_owned(), "true".to_owned()))
        );
        assert!(named("--watch-namespace").is_some(), "{differences:?}");
        assert!(
            named("--runner-max-concurrent-reconciles").is_none(),
            "{differences:?}"
        );
        assert_eq!(differences.len(), 4, "{differences:?}");
        assert!(flag_differences(&strings(&["--no-such-flag"]), &chart).is_err());
    }

    #[test]
    fn the_manager_args_are_read_from_the_deployment() {
        let objects = [
            json!({"kind": "ServiceAccount"}),
            json!({"kind": "Deployment", "spec": {"template": {"spec": {"containers": [
                {"name": "sidecar", "args": ["--x"]},
                {"name": "manager", "args": ["--auto-scaling-runner-set-only", "--log-level=debug"]},
            ]}}}}),
        ];
        assert_eq!(
            deployment_args(&objects),
            Some(vec![
                "--auto-scaling-runner-set-only".to_owned(),
                "--log-level=debug".to_owned()
            ])
        );
        assert_eq!(deployment_args(&objects[..1]), None);
    }

    #[test]
    fn cpu_ticks_are_read_after_the_command_name() {
        let stat = "4242 (kube (api) server) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 12 0 99";
        assert_eq!(parse_cpu_ticks(stat), Some(1234 + 567));
        assert_eq!(parse_cpu_ticks("4242 (x) S 1 2"), None);
        let own = std::fs::read_to_string(format!("/proc/{}/stat", std::process::id()))
            .expect("this process's stat");
        assert!(parse_cpu_ticks(&own).is_some(), "{own}");
    }

    #[test]
    fn the_peak_rss_is_read_from_vm_hwm() {
        let status = "Name:\tmanager\nVmPeak:\t  100 kB\nVmHWM:\t   20480 kB\nVmRSS:\t 1 kB\n";
        assert_eq!(parse_vm_hwm_kib(status), Some(20480));
        assert_eq!(parse_vm_hwm_kib("Name: x\n"), None);
        let mut parts = RssParts::default();
        parts.sample(Some(std::process::id()));
        assert!(parts.anon_mib > 0.0 && parts.file_mib > 0.0, "{parts:?}");
        let own = peak_rss_mib(std::process::id());
        assert!(own > 0.0, "this process has a resident set: {own}");
    }
}
