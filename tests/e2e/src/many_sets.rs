//! The many-scale-sets benchmark behind `e2e-bench --scale-sets S`: S scale sets in one namespace, each its own
//! `helm install` of the scale-set chart with its own AutoscalingRunnerSet and listener process, one manager
//! process for all of them (the real binary, as in [`crate::bench`]), simulated runners and the fake Actions
//! Service holding long polls as long as the service does.
//!
//! One run has three parts:
//!
//! 1. **Setup**: the S sets are installed (a few at a time) and the run waits until each set's listener holds a
//!    session: install → listening, p50/max over the sets; the manager's memory and CPU once all are up.
//! 2. **Idle**: a window with no jobs (300 s by default, the manager's resync: every periodic pass of every set
//!    falls in it once; it starts 65 s after the last listener came up, past the pass each listener gets after
//!    its first minute): Actions Service calls per set per minute by endpoint (long polls, session and token
//!    refreshes, scale-set checks), Kubernetes requests per set per minute, CPU of the manager and of the
//!    listeners.
//! 3. **Burst**: every set gets its jobs (`jobs_per_set`; the first set `first_set_jobs` if given) at the same
//!    moment (or the others `others_after` later than the first): from its jobs → each set's first runner pod and → all of its pods (p50/max over the sets), finish → gone,
//!    Kubernetes writes per job, runners per job, pod creations per runner, the most finished-but-not-gone
//!    runners, the manager's peak memory and every process's CPU, and every job completed exactly once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use serde::Serialize;
use serde_json::json;

use crate::Result;
use crate::bench::{
    self, FlagDifference, Percentiles, RssParts, RunnerWatch, TICK, TICKS_PER_SEC,
    apiserver_requests, cpu_secs_between, cpu_ticks_of, measured_processes, peak_rss_mib,
    split_requests,
};
use crate::checks;
use crate::simulator::SimulatorConfig;
use crate::world::{World, WorldConfig};

/// Scale sets installed at once during setup.
const INSTALL_CONCURRENCY: usize = 4;
/// How often the listeners' resident sets are sampled (each sample reads one `/proc` file per listener).
const LISTENER_SAMPLE_EVERY: u32 = 20;

/// What to run.
#[derive(Debug, Clone)]
pub struct ManySetsConfig {
    /// Scale sets, each with its own listener.
    pub sets: u32,
    /// Jobs each set gets in the burst (one workflow run per set).
    pub jobs_per_set: u32,
    /// Jobs the first set gets instead, if set: one large burst beside the small ones, to see whether the
    /// other sets' runners wait for it.
    pub first_set_jobs: Option<u32>,
    /// The other sets get their jobs this long after the first set: a burst under way when they scale up.
    pub others_after: Duration,
    /// How long the fake takes to answer each JIT configuration request in the burst (the service takes a
    /// fraction of a second; the fake answers at once unless told).
    pub jit_latency: Duration,
    /// How long each job runs.
    pub job_duration: Duration,
    /// The idle window between setup and the burst.
    pub idle: Duration,
    /// After every listener holds its session, wait this long before the idle window: the setup's own writes
    /// die down, and each listener gets the pass that comes when it has run a minute.
    pub settle: Duration,
    /// Give up on setup, and on the burst, after this long each.
    pub timeout: Duration,
    /// Where the listeners run: a pod (process) per set, or tasks of the manager (`--listener-mode=manager`).
    pub in_manager: bool,
}

impl ManySetsConfig {
    /// The jobs the set at `index` gets in the burst.
    pub fn jobs_of(&self, index: usize) -> u32 {
        match self.first_set_jobs {
            Some(jobs) if index == 0 => jobs,
            _ => self.jobs_per_set,
        }
    }

    /// Every set's jobs together.
    pub fn jobs(&self) -> u32 {
        (0..self.sets.max(1) as usize)
            .map(|i| self.jobs_of(i))
            .sum()
    }
}

impl Default for ManySetsConfig {
    fn default() -> Self {
        Self {
            sets: 10,
            jobs_per_set: 3,
            first_set_jobs: None,
            others_after: Duration::ZERO,
            jit_latency: Duration::ZERO,
            job_duration: Duration::from_secs(1),
            idle: Duration::from_secs(300),
            settle: Duration::from_secs(65),
            timeout: Duration::from_secs(900),
            in_manager: false,
        }
    }
}

/// The idle window's figures.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IdleReport {
    pub window_secs: f64,
    /// Actions Service and GitHub API requests per set per minute, long polls included.
    pub actions_calls_per_set_per_min: f64,
    /// The same by endpoint.
    pub actions_calls_per_set_per_min_by_endpoint: BTreeMap<String, f64>,
    /// The manager's and the listeners' Kubernetes requests (watches aside) per set per minute.
    pub kubernetes_requests_per_set_per_min: f64,
    /// The same by `resource[/subresource] VERB`.
    pub kubernetes_requests_per_set_per_min_by_key: BTreeMap<String, f64>,
    /// CPU seconds of each process in the window (`listener`: all listeners together).
    pub cpu_secs: BTreeMap<String, f64>,
}

/// Everything one many-sets run measured.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ManySetsReport {
    pub sets: u32,
    /// `pod` or `manager` (docs/listener-modes.md).
    pub listener_mode: String,
    /// Listener pods, ServiceAccounts, Roles, RoleBindings and Secrets (credentials aside) that exist once every
    /// set is up: 7 per set with listener pods, none in the manager's listener mode.
    pub listener_objects: usize,
    pub jobs_per_set: u32,
    /// The first set's jobs, when it gets its own number.
    pub first_set_jobs: Option<u32>,
    /// How long after the first set's jobs the others' were enqueued.
    pub others_after_secs: f64,
    /// The fake's answer time for each JIT configuration in the burst.
    pub jit_latency_secs: f64,
    pub jobs: u32,
    pub job_duration_secs: f64,
    /// How long the fake holds an empty long poll (the service's figure).
    pub long_poll_hold_secs: f64,
    /// From a set's install to its listener holding a session, over the sets.
    pub install_to_listening: Percentiles,
    /// From the first install until every listener held a session.
    pub setup_secs: f64,
    /// The manager's resident set (`VmRSS`) with every set up, before the burst.
    pub manager_idle_rss_mib: f64,
    /// The manager's CPU seconds from its start until every set was up.
    pub manager_setup_cpu_secs: f64,
    pub idle: IdleReport,
    pub completed: usize,
    /// From enqueueing a set's jobs until its first runner pod existed, over the sets.
    pub burst_to_first_pod: Percentiles,
    /// From enqueueing a set's jobs until it had as many runner pods as it got jobs, over the sets.
    pub burst_to_all_pods: Percentiles,
    /// From enqueueing until the last job completed.
    pub burst_to_last_completion_secs: f64,
    /// From enqueueing until every runner was gone.
    pub burst_to_settled_secs: f64,
    pub finish_to_gone: Percentiles,
    pub peak_runners: usize,
    /// The most runners at once whose job had finished but which still existed.
    pub peak_finished_not_gone: usize,
    /// The manager's peak resident set over the whole run (`VmHWM`), and its parts sampled in the burst.
    pub manager_peak_rss_mib: f64,
    pub manager_rss_parts: RssParts,
    pub listeners: usize,
    /// The sum of every listener's resident set (`VmRSS`) with every set up, before the burst. The listeners'
    /// program pages (`RssFile`) are counted once per listener, as each pod's own memory accounting would on
    /// nodes of their own; on this machine they share one copy.
    pub listeners_idle_rss_mib: f64,
    /// The sum of the listeners' private memory (`RssAnon`: heap and stacks), before the burst: what each
    /// further listener costs on a node that already runs one.
    pub listeners_idle_anon_mib: f64,
    /// The largest sum of the listeners' resident sets seen (sampled about every second).
    pub listeners_total_peak_rss_mib: f64,
    /// Each listener's own peak (`VmHWM`), over the listeners.
    pub listener_peak_rss_mib: Percentiles,
    /// Actions Service and GitHub API requests per job in the burst, long polls excluded.
    pub actions_calls_per_job: f64,
    pub actions_calls: BTreeMap<String, u64>,
    /// The manager's and the listeners' writes per job in the burst.
    pub kubernetes_writes_per_job: f64,
    pub kubernetes_writes: BTreeMap<String, u64>,
    pub kubernetes_reads_per_job: f64,
    pub kubernetes_reads: BTreeMap<String, u64>,
    /// The other clients' requests in the burst (kubelet, control plane, discovery).
    pub other_requests: BTreeMap<String, u64>,
    pub runners_per_job: f64,
    pub pod_creations_per_runner: f64,
    /// CPU seconds of each process from the burst until every runner was gone.
    pub cpu_secs: BTreeMap<String, f64>,
    /// The sum of `cpu_secs` over the cores' capacity in that time.
    pub cpu_utilization: f64,
    pub manager_flags: Vec<String>,
    pub flags_differing_from_chart: Vec<FlagDifference>,
    pub problems: Vec<String>,
}

/// The name of scale set `index` (0-based) of `sets`: fixed width, so no name is the start of another's
/// runner names.
pub fn set_name(index: u32, sets: u32) -> String {
    let width = sets.max(1).to_string().len();
    format!("ms-{:0width$}", index + 1)
}

/// The scale set a runner pod belongs to, from its name: runners are `<set>-runner-<suffix>` (the
/// EphemeralRunnerSet is named after its AutoscalingRunnerSet, which is named after its set).
pub fn set_of_runner(pod: &str) -> Option<&str> {
    pod.rsplit_once("-runner-").map(|(set, _)| set)
}

/// For each set, when its first runner pod was seen and when its `jobs_of(set)`-th was (seconds after the
/// burst), from `(pod name, seconds)` of every runner pod seen.
pub fn pod_times_by_set<'a>(
    pods: impl IntoIterator<Item = (&'a str, f64)>,
    jobs_of: impl Fn(&str) -> u32,
) -> BTreeMap<String, (f64, Option<f64>)> {
    let mut seen: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (pod, at) in pods {
        if let Some(set) = set_of_runner(pod) {
            seen.entry(set.to_owned()).or_default().push(at);
        }
    }
    seen.into_iter()
        .map(|(set, mut times)| {
            times.sort_by(f64::total_cmp);
            let all = times.get((jobs_of(&set) as usize).max(1) - 1).copied();
            (set, (times[0], all))
        })
        .collect()
}

/// Percentiles over `sets` of each set's time in `times`, and the sets that have none.
pub fn over_sets(sets: &[String], times: &BTreeMap<String, f64>) -> (Percentiles, Vec<String>) {
    let mut samples = Vec::with_capacity(sets.len());
    let mut missing = Vec::new();
    for set in sets {
        match times.get(set) {
            Some(&t) => samples.push(t),
            None => missing.push(set.clone()),
        }
    }
    (Percentiles::of(samples), missing)
}

/// `counts` over a window of `window` as requests per set per minute.
pub fn per_set_per_minute(
    counts: &BTreeMap<String, u64>,
    sets: u32,
    window: Duration,
) -> BTreeMap<String, f64> {
    let scale = 60.0 / (window.as_secs_f64().max(1e-3) * f64::from(sets.max(1)));
    counts
        .iter()
        .map(|(key, n)| (key.clone(), *n as f64 * scale))
        .collect()
}

/// The sum of the rates (0, not the `-0.0` an empty `f64` sum gives).
fn total(rates: &BTreeMap<String, f64>) -> f64 {
    rates.values().fold(0.0, |sum, rate| sum + rate)
}

/// Runs the many-scale-sets benchmark.
pub async fn run(config: &ManySetsConfig) -> Result<ManySetsReport> {
    let sets: Vec<String> = (0..config.sets.max(1))
        .map(|i| set_name(i, config.sets))
        .collect();
    let mut report = ManySetsReport {
        sets: config.sets.max(1),
        listener_mode: if config.in_manager { "manager" } else { "pod" }.to_owned(),
        jobs_per_set: config.jobs_per_set,
        first_set_jobs: config.first_set_jobs,
        others_after_secs: config.others_after.as_secs_f64(),
        jit_latency_secs: config.jit_latency.as_secs_f64(),
        jobs: config.jobs(),
        job_duration_secs: config.job_duration.as_secs_f64(),
        ..ManySetsReport::default()
    };
    // The service's own long-poll hold and session lifetime: idle calls per minute depend on them.
    let fake = fake_actions_service::Config::default();
    report.long_poll_hold_secs = fake.long_poll_timeout.as_secs_f64();
    let world = World::start(
        "many-sets",
        WorldConfig {
            release: sets[0].clone(),
            simulator: SimulatorConfig {
                job_duration: config.job_duration,
                ..SimulatorConfig::default()
            },
            fake,
            manager_process: true,
            manager_args: if config.in_manager {
                vec!["--listener-mode=manager".to_owned()]
            } else {
                Vec::new()
            },
            controller_values: if config.in_manager {
                json!({"flags": {"listenerMode": "manager"}})
            } else {
                json!({})
            },
            // Its own control plane: the API server's counts are this run's alone, not also the garbage
            // collection of a test that ran before it in the same binary.
            own_control_plane: true,
            ..WorldConfig::default()
        },
    )
    .await?;
    // The first set was installed as the world started, the control plane (seconds) before it.
    let setup_started = Instant::now();
    let mut installed: BTreeMap<String, Instant> = BTreeMap::new();
    installed.insert(sets[0].clone(), setup_started);
    let results: Vec<Result<(String, Instant)>> = stream::iter(&sets[1..])
        .map(|set| {
            let world = &world;
            async move {
                world.install_scale_set(set, &json!({})).await?;
                Ok((set.clone(), Instant::now()))
            }
        })
        .buffer_unordered(INSTALL_CONCURRENCY)
        .collect()
        .await;
    for result in results {
        let (set, at) = result?;
        installed.insert(set, at);
    }
    let listening = wait_all_listening(&world, &sets, setup_started + config.timeout).await;
    let install_to_listening: BTreeMap<String, f64> = listening
        .iter()
        .filter_map(|(set, at)| {
            let from = installed.get(set)?;
            Some((
                set.clone(),
                at.saturating_duration_since(*from).as_secs_f64(),
            ))
        })
        .collect();
    let (latencies, never) = over_sets(&sets, &install_to_listening);
    report.install_to_listening = latencies;
    report.setup_secs = setup_started.elapsed().as_secs_f64();
    if !never.is_empty() {
        report.problems.push(format!(
            "{} sets never had a listening listener within {:?}: {never:?}\n{}",
            never.len(),
            config.timeout,
            world.diagnostics().await
        ));
        world.shutdown().await?;
        return Ok(report);
    }
    if let Some(exit) = world.manager_exit() {
        report.problems.push(exit);
        world.shutdown().await?;
        return Ok(report);
    }
    let runners = RunnerWatch::start(world.client(), world.namespace());
    tokio::time::sleep(config.settle).await;
    report.listener_objects = world.listener_objects().await?;

    // The idle window.
    let processes = measured_processes(&world).await?;
    let manager_pid = world.manager_pid();
    let listener_pids = world.listener_pids().await?;
    report.listeners = listener_pids.len();
    let cpu_idle_start = cpu_ticks_of(&processes);
    report.manager_setup_cpu_secs =
        cpu_idle_start.get("manager").copied().unwrap_or_default() as f64 / TICKS_PER_SEC;
    let requests_idle_start = apiserver_requests(&world.client()).await?;
    world.fake.state().reset_counters();
    let idle_started = Instant::now();
    tokio::time::sleep(config.idle).await;
    let window = idle_started.elapsed();
    let idle_calls = world.fake.state().counters();
    let requests_idle_end = apiserver_requests(&world.client()).await?;
    let cpu_idle_end = cpu_ticks_of(&processes);
    let idle_requests = split_requests(test_harness::requests::diff(
        &requests_idle_start,
        &requests_idle_end,
    ));
    let product_idle: BTreeMap<String, u64> = idle_requests
        .writes
        .into_iter()
        .chain(idle_requests.reads)
        .collect();
    let calls_by_endpoint = per_set_per_minute(&idle_calls, report.sets, window);
    let requests_by_key = per_set_per_minute(&product_idle, report.sets, window);
    report.idle = IdleReport {
        window_secs: window.as_secs_f64(),
        actions_calls_per_set_per_min: total(&calls_by_endpoint),
        actions_calls_per_set_per_min_by_endpoint: calls_by_endpoint,
        kubernetes_requests_per_set_per_min: total(&requests_by_key),
        kubernetes_requests_per_set_per_min_by_key: requests_by_key,
        cpu_secs: cpu_secs_between(&cpu_idle_start, &cpu_idle_end),
    };
    report.manager_idle_rss_mib = manager_pid.map_or(0.0, rss_mib);
    report.listeners_idle_rss_mib = listener_pids.iter().map(|pid| rss_mib(*pid)).sum();
    report.listeners_idle_anon_mib = listener_pids
        .iter()
        .map(|pid| status_mib(*pid, "RssAnon:"))
        .sum();
    report.listeners_total_peak_rss_mib = report.listeners_idle_rss_mib;

    // The burst: every set's jobs at once.
    if !config.jit_latency.is_zero() {
        world
            .fake
            .state()
            .set_faults(fake_actions_service::Faults {
                latency: vec![fake_actions_service::LatencyFault {
                    endpoint: Some("generate_jit_config".into()),
                    millis: u64::try_from(config.jit_latency.as_millis()).unwrap_or(u64::MAX),
                }],
                ..fake_actions_service::Faults::default()
            })?;
    }
    let requests_before = apiserver_requests(&world.client()).await?;
    world.fake.state().reset_counters();
    let cpu_before = cpu_ticks_of(&processes);
    let started = Instant::now();
    let mut ids = Vec::with_capacity(report.jobs as usize);
    for (index, set) in sets.iter().enumerate() {
        if index == 1 && !config.others_after.is_zero() {
            tokio::time::sleep(config.others_after).await;
        }
        ids.extend(world.enqueue_to(set, config.jobs_of(index))?);
    }
    let jobs = ids.len();
    let mut last_completion = 0.0;
    let mut completed_seen = 0;
    let deadline = started + config.timeout;
    let mut ticks = 0u32;
    loop {
        let elapsed = started.elapsed().as_secs_f64();
        let completed = world.fake.state().completed_among(&ids);
        if completed > completed_seen {
            completed_seen = completed;
            last_completion = elapsed;
        }
        report.manager_rss_parts.sample(manager_pid);
        if ticks.is_multiple_of(LISTENER_SAMPLE_EVERY) {
            let total: f64 = listener_pids.iter().map(|pid| rss_mib(*pid)).sum();
            report.listeners_total_peak_rss_mib = report.listeners_total_peak_rss_mib.max(total);
        }
        ticks += 1;
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
                "timed out after {:?}: {completed} of {jobs} jobs completed, {} runners left",
                config.timeout,
                runners.live(),
            ));
            break;
        }
        tokio::time::sleep(TICK).await;
    }
    let requests_after = apiserver_requests(&world.client()).await?;
    let cpu_after = cpu_ticks_of(&processes);
    report.cpu_secs = cpu_secs_between(&cpu_before, &cpu_after);
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    report.cpu_utilization =
        report.cpu_secs.values().sum::<f64>() / (report.burst_to_settled_secs.max(1e-3) * cores);
    report.completed = completed_seen;
    report.burst_to_last_completion_secs = last_completion;
    report.peak_runners = runners.peak();

    let pods = world.simulator.pods();
    // Each set's times count from its own jobs' enqueueing.
    let others_started = started + config.others_after;
    let seen = pods.iter().filter_map(|pod| {
        let set = set_of_runner(&pod.name)?;
        let from = if set == sets[0] {
            started
        } else {
            others_started
        };
        let at = pod.seen_at?.checked_duration_since(from)?;
        Some((pod.name.as_str(), at.as_secs_f64()))
    });
    let jobs_of_set: BTreeMap<&str, u32> = sets
        .iter()
        .enumerate()
        .map(|(index, set)| (set.as_str(), config.jobs_of(index)))
        .collect();
    let times = pod_times_by_set(seen, |set| {
        jobs_of_set.get(set).copied().unwrap_or(config.jobs_per_set)
    });
    let first: BTreeMap<String, f64> = times.iter().map(|(s, (f, _))| (s.clone(), *f)).collect();
    let all: BTreeMap<String, f64> = times
        .iter()
        .filter_map(|(s, (_, a))| Some((s.clone(), (*a)?)))
        .collect();
    let (first, no_pod) = over_sets(&sets, &first);
    let (all, not_all) = over_sets(&sets, &all);
    report.burst_to_first_pod = first;
    report.burst_to_all_pods = all;
    if !no_pod.is_empty() || !not_all.is_empty() {
        report.problems.push(format!(
            "sets without a runner pod: {no_pod:?}; sets with fewer pods than jobs: {not_all:?}"
        ));
    }
    let (latencies, unseen, lingering) = bench::finish_to_gone(&world, &runners, started);
    report.finish_to_gone = latencies;
    report.peak_finished_not_gone = bench::peak_overlap(&lingering, report.burst_to_settled_secs);
    report.problems.extend(unseen);

    report.manager_peak_rss_mib = manager_pid.map_or(0.0, peak_rss_mib);
    let listener_peaks: Vec<f64> = listener_pids.iter().map(|pid| peak_rss_mib(*pid)).collect();
    report.listener_peak_rss_mib = Percentiles::of(listener_peaks);

    let per_job = |n: u64| n as f64 / (jobs.max(1) as f64);
    let counters = world.fake.state().counters();
    report.actions_calls_per_job = per_job(
        counters
            .iter()
            .filter(|(endpoint, _)| endpoint.as_str() != "get_message")
            .map(|(_, n)| n)
            .sum(),
    );
    report.actions_calls = counters;
    let requests = split_requests(test_harness::requests::diff(
        &requests_before,
        &requests_after,
    ));
    let created = |key: &str| requests.writes.get(key).copied().unwrap_or_default();
    report.pod_creations_per_runner =
        created("pods POST") as f64 / created("ephemeralrunners POST").max(1) as f64;
    report.runners_per_job = per_job(created("ephemeralrunners POST"));
    report.kubernetes_writes_per_job = per_job(requests.writes.values().sum());
    report.kubernetes_reads_per_job = per_job(requests.reads.values().sum());
    report.kubernetes_writes = requests.writes;
    report.kubernetes_reads = requests.reads;
    report.other_requests = requests.others;
    report.manager_flags = world.manager_flags().unwrap_or_default();
    match bench::chart_default_flags() {
        Ok(chart) => {
            report.flags_differing_from_chart =
                bench::flag_differences(&report.manager_flags, &chart)?;
        }
        Err(error) => report.problems.push(format!(
            "rendering the controller chart's defaults: {error}"
        )),
    }
    report
        .problems
        .extend(checks::jobs_completed_exactly_once(&world, &ids, &[]));
    report.problems.extend(world.simulator.problems());
    runners.stop();
    world.shutdown().await?;
    Ok(report)
}

/// Waits until every set's listener holds a session (or `deadline`); when each was first seen doing so.
async fn wait_all_listening(
    world: &World,
    sets: &[String],
    deadline: Instant,
) -> BTreeMap<String, Instant> {
    let mut listening: BTreeMap<String, Instant> = BTreeMap::new();
    while listening.len() < sets.len() && Instant::now() < deadline {
        let snapshot = world.fake.state().snapshot();
        let now = Instant::now();
        for set in &snapshot.scale_sets {
            if set.session_id.is_some()
                && let Some(name) = sets.iter().find(|s| s.eq_ignore_ascii_case(&set.name))
            {
                listening.entry(name.clone()).or_insert(now);
            }
        }
        if world.manager_exit().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    listening
}

/// The resident set (`VmRSS`) of a process now, in MiB; 0 when unreadable.
fn rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmRSS:")
}

/// Line `key` (with its colon) of a process's `/proc/PID/status`, in MiB; 0 when unreadable.
fn status_mib(pid: u32, key: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| bench::status_kib(&status, key))
        .map_or(0.0, |kib| kib as f64 / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_names_have_a_fixed_width_and_runners_name_their_set() {
        assert_eq!(set_name(0, 100), "ms-001");
        assert_eq!(set_name(99, 100), "ms-100");
        assert_eq!(set_name(4, 9), "ms-5");
        assert_eq!(set_of_runner("ms-007-runner-x2k9p"), Some("ms-007"));
        assert_eq!(set_of_runner("ms-007-listener"), None);
    }

    #[test]
    fn pod_times_are_the_first_and_the_nth_per_set() {
        let pods = [
            ("ms-1-runner-a", 3.0),
            ("ms-1-runner-b", 1.0),
            ("ms-1-runner-c", 2.0),
            // A spare runner beyond the set's jobs does not delay "all pods".
            ("ms-1-runner-d", 9.0),
            ("ms-2-runner-a", 4.0),
            ("not-a-runner", 0.5),
        ];
        let times = pod_times_by_set(pods, |_| 3);
        assert_eq!(
            times,
            BTreeMap::from([
                ("ms-1".to_owned(), (1.0, Some(3.0))),
                // One pod of three: never all.
                ("ms-2".to_owned(), (4.0, None)),
            ])
        );
    }

    #[test]
    fn percentiles_over_sets_name_the_sets_without_a_time() {
        let sets: Vec<String> = (1..=4).map(|i| format!("ms-{i}")).collect();
        let times = BTreeMap::from([
            ("ms-1".to_owned(), 2.0),
            ("ms-2".to_owned(), 1.0),
            ("ms-4".to_owned(), 8.0),
            ("elsewhere".to_owned(), 100.0),
        ]);
        let (p, missing) = over_sets(&sets, &times);
        assert_eq!((p.samples, p.p50, p.max), (3, 2.0, 8.0));
        assert_eq!(missing, vec!["ms-3".to_owned()]);
    }

    #[test]
    fn idle_calls_are_rated_per_set_and_minute() {
        let counts = BTreeMap::from([
            ("get_message".to_owned(), 240),
            ("refresh_session".to_owned(), 10),
        ]);
        // 100 sets over two minutes: 240 polls are 1.2 per set per minute.
        let rates = per_set_per_minute(&counts, 100, Duration::from_secs(120));
        assert!((rates["get_message"] - 1.2).abs() < 1e-9, "{rates:?}");
        assert!((rates["refresh_session"] - 0.05).abs() < 1e-9, "{rates:?}");
        assert!(per_set_per_minute(&BTreeMap::new(), 0, Duration::ZERO).is_empty());
    }
}
