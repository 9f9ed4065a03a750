//! `e2e-bench`: the end-to-end benchmark (see `docs/benchmarks.md`).
//!
//! `cargo run --release -p e2e --bin e2e-bench -- --jobs 500 --json` starts the local control plane, the fake
//! Actions Service, the manager binary, the listener and simulated runners, runs one queued burst of `--jobs`
//! jobs through them and reports latencies, throughput, memory and calls per job, then the API server's raw write
//! rate as the physical baseline. `--json` prints the report as one JSON line at the end. The exit status is
//! non-zero when a job was lost or served twice.
//!
//! `--scale-sets S --jobs-per-set J` measures S scale sets instead, each with its own listener: setup, an idle
//! window (`--idle-secs`), then J jobs for every set at once (see `e2e::many_sets`).

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use e2e::bench::{BenchConfig, BenchReport, FlagDifference, Percentiles};
use e2e::many_sets::{ManySetsConfig, ManySetsReport};

#[derive(Debug, Parser)]
#[command(about = "Measures one scale set, or many, end to end on this machine")]
struct Args {
    /// Jobs in the burst.
    #[arg(long, default_value_t = 500)]
    jobs: u32,
    /// How long each job runs, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    job_duration_ms: u64,
    /// Objects of each kind the raw API-server baseline writes (default: as many as jobs).
    #[arg(long, default_value_t = 0)]
    baseline_objects: usize,
    /// Jobs per workflow run of the burst: job names repeat from run to run (the listener keeps a metric
    /// series per job name).
    #[arg(long, default_value_t = 10)]
    jobs_per_run: u32,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 900)]
    timeout_secs: u64,
    /// Print the report as one JSON line at the end.
    #[arg(long)]
    json: bool,
    /// Many scale sets instead of one: this many, each with its own AutoscalingRunnerSet and listener.
    #[arg(long)]
    scale_sets: Option<u32>,
    /// With --scale-sets: jobs each set gets in the burst.
    #[arg(long, default_value_t = 3)]
    jobs_per_set: u32,
    /// With --scale-sets: jobs the first set gets instead of --jobs-per-set (one large burst beside small ones).
    #[arg(long)]
    first_set_jobs: Option<u32>,
    /// With --scale-sets: the other sets get their jobs this many milliseconds after the first set (a burst under
    /// way when they scale up); their times count from their own jobs.
    #[arg(long, default_value_t = 0)]
    others_after_ms: u64,
    /// With --scale-sets: the fake answers each JIT configuration request of the burst after this many
    /// milliseconds (the service takes a fraction of a second).
    #[arg(long, default_value_t = 0)]
    jit_latency_ms: u64,
    /// With --scale-sets: the idle window between setup and the burst, in seconds (300: the manager's resync,
    /// so each set's periodic passes fall in it once).
    #[arg(long, default_value_t = 300)]
    idle_secs: u64,
    /// With --scale-sets: the wait between every listener holding its session and the idle window (65: past
    /// the pass each listener gets when it has run a minute).
    #[arg(long, default_value_t = 65)]
    settle_secs: u64,
    /// With --scale-sets: where the listeners run, `pod` (a listener process per set, as pods) or `manager`
    /// (every set's loop in the manager; docs/listener-modes.md).
    #[arg(long, default_value = "pod", value_parser = ["pod", "manager"])]
    listener_mode: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    e2e::cli::init_tracing();
    if cfg!(debug_assertions) {
        eprintln!(
            "e2e-bench: this is a debug build; figures are only meaningful from `cargo run --release`"
        );
    }
    if let Some(sets) = args.scale_sets {
        let config = ManySetsConfig {
            sets,
            jobs_per_set: args.jobs_per_set,
            first_set_jobs: args.first_set_jobs,
            others_after: Duration::from_millis(args.others_after_ms),
            jit_latency: Duration::from_millis(args.jit_latency_ms),
            job_duration: Duration::from_millis(args.job_duration_ms),
            idle: Duration::from_secs(args.idle_secs),
            settle: Duration::from_secs(args.settle_secs),
            timeout: Duration::from_secs(args.timeout_secs),
            in_manager: args.listener_mode == "manager",
        };
        eprintln!(
            "e2e-bench: {sets} scale sets, {} jobs each of {} ms, idle window {} s; starting...",
            args.jobs_per_set, args.job_duration_ms, args.idle_secs
        );
        return e2e::cli::run(
            "e2e-bench",
            args.json,
            e2e::many_sets::run(&config),
            print_many_sets,
            |report| report.problems.is_empty(),
        );
    }
    let config = BenchConfig {
        jobs: args.jobs,
        job_duration: Duration::from_millis(args.job_duration_ms),
        timeout: Duration::from_secs(args.timeout_secs),
        baseline_objects: args.baseline_objects,
        jobs_per_run: args.jobs_per_run,
    };
    eprintln!(
        "e2e-bench: {} jobs of {} ms; starting the control plane, the fake, the manager and the listener...",
        args.jobs, args.job_duration_ms
    );
    e2e::cli::run(
        "e2e-bench",
        args.json,
        e2e::bench::run(&config),
        print_report,
        |report| report.problems.is_empty(),
    )
}

fn print_report(r: &BenchReport) {
    let secs = |v: Option<f64>| v.map_or_else(|| "never".to_owned(), |s| format!("{s:.2} s"));
    println!(
        "== e2e-bench: {} jobs of {:.1} s ==",
        r.jobs, r.job_duration_secs
    );
    println!("completed                  {} of {}", r.completed, r.jobs);
    println!(
        "burst -> {} pods           {}",
        r.jobs,
        secs(r.burst_to_pods_secs)
    );
    println!(
        "job finished -> runner gone p50 {:.2} s, p95 {:.2} s, p99 {:.2} s, max {:.2} s ({} runners)",
        r.finish_to_gone.p50,
        r.finish_to_gone.p95,
        r.finish_to_gone.p99,
        r.finish_to_gone.max,
        r.finish_to_gone.samples
    );
    for (stage, p) in [
        (
            "  finished -> exit written",
            &r.teardown_stages.exit_written,
        ),
        ("  (exit -> its watch event)", &r.teardown_stages.exit_event),
        (
            "  exit -> deletion seen",
            &r.teardown_stages.deletion_requested,
        ),
        ("  deletion -> gone", &r.teardown_stages.gone),
    ] {
        println!(
            "{stage:<27}p50 {:.2} s, p95 {:.2} s, p99 {:.2} s, max {:.2} s ({} runners)",
            p.p50, p.p95, p.p99, p.max, p.samples
        );
    }
    // The manager's own clock, in the order a finished runner meets the stages.
    let manager: Vec<String> = controller::metrics::teardown_stage::ALL
        .iter()
        .filter_map(|stage| {
            let q = r.teardown_stages.manager.get(*stage)?;
            Some(format!("{stage} {:.2}/{:.2}", q.p50, q.p99))
        })
        .collect();
    if !manager.is_empty() {
        println!("  manager p50/p99 (s)      {}", manager.join(", "));
    }
    println!("manager passes             {:?}", r.manager_passes);
    println!(
        "throughput                 {:.1} jobs/s over the run ({:.2} s to the last completion), {:.1} jobs/s sustained (10th-90th percentile)",
        r.jobs_per_sec, r.burst_to_last_completion_secs, r.sustained_jobs_per_sec
    );
    println!(
        "settled (0 runners)        {:.2} s; peak {} EphemeralRunners",
        r.burst_to_settled_secs, r.peak_runners
    );
    println!(
        "peak RSS                   manager {:.1} MiB (anon {:.1}, file {:.1}), listener {:.1} MiB (anon {:.1}, file {:.1})",
        r.manager_peak_rss_mib,
        r.manager_rss_parts.anon_mib,
        r.manager_rss_parts.file_mib,
        r.listener_peak_rss_mib,
        r.listener_rss_parts.anon_mib,
        r.listener_rss_parts.file_mib
    );
    println!(
        "Actions calls per job      {:.2} (long-polls excluded); {:?}",
        r.actions_calls_per_job, r.actions_calls
    );
    println!(
        "Kubernetes writes per job  {:.2} ({:.0} writes/s)",
        r.kubernetes_writes_per_job, r.kubernetes_writes_per_sec
    );
    for (key, n) in &r.kubernetes_writes {
        println!("    {key:<40} {n}");
    }
    println!(
        "runners per job            {:.2}; pod creations per runner {:.2}; peak finished-but-not-gone runners {}",
        r.runners_per_job, r.pod_creations_per_runner, r.peak_finished_not_gone
    );
    println!(
        "Kubernetes reads per job   {:.2} (GET and LIST)",
        r.kubernetes_reads_per_job
    );
    for (key, n) in &r.kubernetes_reads {
        println!("    {key:<40} {n}");
    }
    print_others(&r.other_requests);
    if r.terminated_watchers.is_empty() {
        println!("watches the API server closed for falling behind: none");
    } else {
        println!("watches the API server closed for falling behind (an overloaded run):");
        for (resource, n) in &r.terminated_watchers {
            println!("    {resource:<40} {n}");
        }
        println!(
            "  whose, from the API server's log (held up sending to the client, or converting inside the server):"
        );
        for (watch, n) in &r.closed_watches {
            println!("    {watch} {n}");
        }
    }
    print_flags(&r.manager_flags, &r.flags_differing_from_chart);
    println!(
        "CPU over the run           {:.0} % of all cores",
        r.cpu_utilization * 100.0
    );
    for (name, secs) in &r.cpu_secs {
        println!(
            "    {name:<40} {secs:.1} s ({:.1} ms per job)",
            secs * 1000.0 / f64::from(r.jobs.max(1))
        );
    }
    println!(
        "raw API-server baseline    {:.0} writes/s ({} writes of {} objects per kind, {} writers, {:.2} s)",
        r.baseline.writes_per_sec,
        r.baseline.writes,
        r.baseline.objects_per_kind,
        r.baseline.writers,
        r.baseline.secs
    );
    println!(
        "write bound                {:.1} jobs/s at {:.2} writes per job; measured/bound = {:.2}",
        r.write_bound_jobs_per_sec, r.kubernetes_writes_per_job, r.ratio_to_write_bound
    );
    let life = &r.lifecycle_baseline;
    println!(
        "lifecycle baseline         {:.1} runners/s ({} runners, {} writes each, {} at once, {:.2} s; all pods in {:.2} s)",
        life.runners_per_sec,
        life.runners,
        e2e::lifecycle_baseline::WRITES_PER_RUNNER,
        life.concurrency,
        life.secs,
        life.all_pods_secs
    );
    println!(
        "  tried                    {}",
        life.tried
            .iter()
            .map(|t| format!(
                "{} at once: {:.1} runners/s, all pods in {:.2} s",
                t.concurrency, t.runners_per_sec, t.all_pods_secs
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
    println!(
        "  its objects              {} (runner {} B, Secret {} B, pod {} B)",
        if life.objects_from_run {
            "copies of the run's first runner, Secret and pod"
        } else {
            "minimal (the run gave none to copy)"
        },
        life.object_bytes[0],
        life.object_bytes[1],
        life.object_bytes[2]
    );
    println!(
        "against the lifecycle      throughput {:.2} of it; burst -> pods {:.2}x its time to all pods",
        r.ratio_to_lifecycle, r.pods_time_over_lifecycle
    );
    if r.problems.is_empty() {
        println!("checks                     every job completed exactly once");
    } else {
        println!("PROBLEMS:");
        for problem in &r.problems {
            println!("  - {problem}");
        }
    }
}

/// The requests left out of the per-job counts, on one line.
fn print_others(others: &std::collections::BTreeMap<String, u64>) {
    let total: u64 = others.values().sum();
    println!(
        "other clients' requests    {total} (kubelet, control plane, discovery; not counted above): {others:?}"
    );
}

fn print_flags(flags: &[String], differing: &[FlagDifference]) {
    println!("manager flags              {}", flags.join(" "));
    for d in differing {
        println!(
            "    differs from the chart's defaults: {} = {:?} here, {:?} in the chart",
            d.flag, d.here, d.chart
        );
    }
}

fn p50_max(p: &Percentiles) -> String {
    format!(
        "p50 {:.2} s, max {:.2} s ({} sets)",
        p.p50, p.max, p.samples
    )
}

fn print_many_sets(r: &ManySetsReport) {
    let mut first = r
        .first_set_jobs
        .map_or_else(String::new, |jobs| format!(", the first set {jobs}"));
    if r.others_after_secs > 0.0 {
        first.push_str(&format!(", the others {:.1} s later", r.others_after_secs));
    }
    if r.jit_latency_secs > 0.0 {
        first.push_str(&format!(", JIT configs in {:.1} s", r.jit_latency_secs));
    }
    println!(
        "== e2e-bench: {} scale sets x {} jobs{first} of {:.1} s ({} jobs), listeners in {} mode ==",
        r.sets, r.jobs_per_set, r.job_duration_secs, r.jobs, r.listener_mode
    );
    println!(
        "listener objects           {} (pods, ServiceAccounts, Roles, RoleBindings, Secrets)",
        r.listener_objects
    );
    println!(
        "setup                      install -> listening {}; all up after {:.1} s",
        p50_max(&r.install_to_listening),
        r.setup_secs
    );
    println!(
        "manager at idle            RSS {:.1} MiB; {:.1} CPU s for setup",
        r.manager_idle_rss_mib, r.manager_setup_cpu_secs
    );
    println!(
        "listeners                  {} processes, {:.1} MiB together at idle ({:.1} MiB private), peak together {:.1} MiB; each peak p50 {:.1} MiB, max {:.1} MiB",
        r.listeners,
        r.listeners_idle_rss_mib,
        r.listeners_idle_anon_mib,
        r.listeners_total_peak_rss_mib,
        r.listener_peak_rss_mib.p50,
        r.listener_peak_rss_mib.max
    );
    println!(
        "idle window {:.0} s         Actions calls {:.2} per set per minute (long polls held {:.0} s); Kubernetes requests {:.2} per set per minute",
        r.idle.window_secs,
        r.idle.actions_calls_per_set_per_min,
        r.long_poll_hold_secs,
        r.idle.kubernetes_requests_per_set_per_min
    );
    for (endpoint, rate) in &r.idle.actions_calls_per_set_per_min_by_endpoint {
        println!("    {endpoint:<40} {rate:.3}");
    }
    for (key, rate) in &r.idle.kubernetes_requests_per_set_per_min_by_key {
        println!("    {key:<40} {rate:.3}");
    }
    for (name, secs) in &r.idle.cpu_secs {
        println!("    CPU {name:<36} {secs:.1} s");
    }
    println!("completed                  {} of {}", r.completed, r.jobs);
    println!(
        "burst -> first pod         {}",
        p50_max(&r.burst_to_first_pod)
    );
    println!(
        "burst -> all pods          {}",
        p50_max(&r.burst_to_all_pods)
    );
    println!(
        "job finished -> runner gone p50 {:.2} s, p95 {:.2} s, p99 {:.2} s, max {:.2} s ({} runners)",
        r.finish_to_gone.p50,
        r.finish_to_gone.p95,
        r.finish_to_gone.p99,
        r.finish_to_gone.max,
        r.finish_to_gone.samples
    );
    println!(
        "last completion / settled  {:.2} s / {:.2} s; peak {} EphemeralRunners, {} finished but not gone",
        r.burst_to_last_completion_secs,
        r.burst_to_settled_secs,
        r.peak_runners,
        r.peak_finished_not_gone
    );
    println!(
        "manager peak RSS           {:.1} MiB (burst: anon {:.1}, file {:.1})",
        r.manager_peak_rss_mib, r.manager_rss_parts.anon_mib, r.manager_rss_parts.file_mib
    );
    println!(
        "Actions calls per job      {:.2} (long-polls excluded); {:?}",
        r.actions_calls_per_job, r.actions_calls
    );
    println!(
        "Kubernetes writes per job  {:.2}; reads per job {:.2}",
        r.kubernetes_writes_per_job, r.kubernetes_reads_per_job
    );
    for (key, n) in &r.kubernetes_writes {
        println!("    {key:<40} {n}");
    }
    for (key, n) in &r.kubernetes_reads {
        println!("    {key:<40} {n}");
    }
    print_others(&r.other_requests);
    println!(
        "runners per job            {:.2}; pod creations per runner {:.2}",
        r.runners_per_job, r.pod_creations_per_runner
    );
    print_flags(&r.manager_flags, &r.flags_differing_from_chart);
    println!(
        "CPU over the burst         {:.0} % of all cores",
        r.cpu_utilization * 100.0
    );
    for (name, secs) in &r.cpu_secs {
        println!(
            "    {name:<40} {secs:.1} s ({:.1} ms per job)",
            secs * 1000.0 / f64::from(r.jobs.max(1))
        );
    }
    if r.problems.is_empty() {
        println!("checks                     every job completed exactly once");
    } else {
        println!("PROBLEMS:");
        for problem in &r.problems {
            println!("  - {problem}");
        }
    }
}
