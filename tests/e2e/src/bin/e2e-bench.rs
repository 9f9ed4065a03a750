//! `e2e-bench`: the end-to-end benchmark (see `docs/benchmarks.md`).
//!
//! `cargo run --release -p e2e --bin e2e-bench -- --jobs 500 --json` starts the local control plane, the fake
//! Actions Service, the manager binary, the listener and simulated runners, runs one queued burst of `--jobs`
//! jobs through them and reports latencies, throughput, memory and calls per job, then the API server's raw write
//! rate as the physical baseline. `--json` prints the report as one JSON line at the end. The exit status is
//! non-zero when a job was lost or served twice.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use e2e::bench::{BenchConfig, BenchReport};

#[derive(Debug, Parser)]
#[command(about = "Measures one scale set end to end on this machine")]
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
}

fn main() -> ExitCode {
    let args = Args::parse();
    e2e::cli::init_tracing();
    if cfg!(debug_assertions) {
        eprintln!(
            "e2e-bench: this is a debug build; figures are only meaningful from `cargo run --release`"
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
        "runners per job            {:.2}; pod creations per runner {:.2}",
        r.runners_per_job, r.pod_creations_per_runner
    );
    println!(
        "Kubernetes reads per job   {:.2} (GET and LIST)",
        r.kubernetes_reads_per_job
    );
    for (key, n) in &r.kubernetes_reads {
        println!("    {key:<40} {n}");
    }
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
    if r.problems.is_empty() {
        println!("checks                     every job completed exactly once");
    } else {
        println!("PROBLEMS:");
        for problem in &r.problems {
            println!("  - {problem}");
        }
    }
}
