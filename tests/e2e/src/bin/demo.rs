//! The local demo: one scale set on this machine, fed a stream of jobs, with a live view.
//!
//! `cargo run -p e2e --bin demo -- --jobs 50` starts the local control plane, the fake Actions Service, the
//! manager (in-process), the listener-pod executor (the real listener binary) and the runner simulator, installs
//! one scale set from the objects the scale-set chart renders, feeds jobs at `--rate` per second, prints a line per
//! second, then uninstalls the scale set and prints a summary. `--json` adds a machine-readable summary as the
//! last line. The exit status is non-zero when a job was lost or served twice, or something was left behind.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use crds::AutoscalingRunnerSet;
use e2e::checks;
use e2e::simulator::SimulatorConfig;
use e2e::world::{Observation, World, WorldConfig};
use k8s_openapi::jiff::{SignedDuration, Timestamp, tz::TimeZone};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::Serialize;
use serde_json::json;

#[derive(Debug, Parser)]
#[command(
    about = "Runs one runner scale set locally against the fake Actions Service and shows it working"
)]
struct Args {
    /// Run on a real node (kubelet, containerd and runc, from the real-node test tier): the listener and the
    /// runners real pods from the project's images instead of the executor and the simulator. Needs root and
    /// the tier's parts (tests/env/provision-node.sh); `--max-runners` defaults to 10 there.
    #[arg(long, conflicts_with_all = ["start_failure_rate", "scheduling_delay_ms", "json"])]
    real_node: bool,
    /// Jobs to run.
    #[arg(long, default_value_t = 50)]
    jobs: u32,
    /// Jobs enqueued per second.
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// How long each job runs, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    job_duration_ms: u64,
    /// The chart's `minRunners`.
    #[arg(long, default_value_t = 0)]
    min_runners: u32,
    /// The chart's `maxRunners` (none by default).
    #[arg(long)]
    max_runners: Option<u32>,
    /// Fraction of runner pods whose container fails to start (retried by the controller).
    #[arg(long, default_value_t = 0.0)]
    start_failure_rate: f64,
    /// How long each runner pod waits for a node, in milliseconds.
    #[arg(long, default_value_t = 0)]
    scheduling_delay_ms: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// Print a JSON summary as the last line.
    #[arg(long)]
    json: bool,
    /// Not in ARC: add a scheduled minimum whose window opens this many seconds after the listener connects
    /// (e.g. 20), so the warm pool appears before any job of the window needs it.
    #[arg(long)]
    window_opens_after_secs: Option<u64>,
    /// How long that window stays open, in seconds.
    #[arg(long, default_value_t = 30)]
    window_secs: u64,
    /// The window's `minRunners`.
    #[arg(long, default_value_t = 3)]
    window_min_runners: u32,
    /// Not in ARC: the chart's `scaleDownDelaySeconds` (keep a burst's runners this long after demand falls).
    #[arg(long)]
    scale_down_delay_secs: Option<u64>,
}

/// What the demo reports at the end.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Summary {
    jobs: u32,
    completed: usize,
    /// Jobs that did not complete, or completed without running.
    lost: usize,
    served_twice: usize,
    elapsed_secs: f64,
    /// From the first job enqueued to the last one completed.
    run_secs: f64,
    throughput_jobs_per_minute: f64,
    peak_desired_replicas: i64,
    runner_pods: usize,
    start_failures: usize,
    /// Actions Service and GitHub API requests per job, by endpoint (docs/reference/beyond-arc.md, item 11).
    api_calls_per_job: BTreeMap<String, f64>,
    /// Problems found by the end-of-run checks.
    problems: Vec<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    e2e::cli::init_tracing();
    if args.real_node {
        return real_node(&args);
    }
    e2e::cli::run("demo", args.json, run(&args), print_summary, |summary| {
        summary.lost == 0 && summary.served_twice == 0 && summary.problems.is_empty()
    })
}

async fn run(args: &Args) -> e2e::Result<Summary> {
    let started = Instant::now();
    let timeout = Duration::from_secs(args.timeout_secs);
    let mut values = json!({"minRunners": args.min_runners});
    if let Some(max) = args.max_runners {
        values["maxRunners"] = json!(max);
    }
    if let Some(delay) = args.scale_down_delay_secs {
        values["scaleDownDelaySeconds"] = json!(delay);
    }
    println!(
        "starting the local control plane, the fake Actions Service, the manager and the listener executor..."
    );
    let world = World::start(
        "demo",
        WorldConfig {
            release: "demo".to_owned(),
            values,
            simulator: SimulatorConfig {
                job_duration: Duration::from_millis(args.job_duration_ms),
                start_failure_rate: args.start_failure_rate,
                scheduling_delay: Duration::from_millis(args.scheduling_delay_ms),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        },
    )
    .await?;
    println!(
        "installed scale set `demo` in namespace {} from the gha-runner-scale-set chart (listener in {}); fake at {}",
        world.namespace(),
        world.controller_namespace,
        world.fake.base_url()
    );
    world.wait_listening(timeout).await?;
    println!(
        "listener connected after {:.1}s; feeding {} jobs at {}/s (each runs {} ms)\n",
        started.elapsed().as_secs_f64(),
        args.jobs,
        args.rate,
        args.job_duration_ms
    );
    world.fake.state().reset_counters();
    let window_closes = match args.window_opens_after_secs {
        Some(after) => Some(add_window(&world, args, after).await?),
        None => None,
    };

    let feed_start = Instant::now();
    let mut fed = 0u32;
    let mut peak = 0i64;
    let mut last_print = Instant::now() - Duration::from_secs(1);
    let mut last_line = String::new();
    let deadline = Instant::now() + timeout;
    let mut finished_at = None;
    loop {
        let due =
            ((feed_start.elapsed().as_secs_f64() * args.rate).floor() as u32 + 1).min(args.jobs);
        if due > fed {
            world.enqueue(due - fed)?;
            fed = due;
        }
        let observation = world.observe().await?;
        peak = peak.max(observation.desired_replicas);
        let all_done = fed == args.jobs && observation.jobs_done == args.jobs as usize;
        if all_done && finished_at.is_none() {
            finished_at = Some(feed_start.elapsed());
        }
        let min_now = match window_closes {
            Some(_) => scheduled_min(&world).await,
            None => None,
        };
        let settled = all_done
            && window_closes.is_none_or(|closes| Timestamp::now() > closes)
            && observation.desired_replicas == i64::from(args.min_runners)
            && observation.runner_pods_running == args.min_runners as usize
            && observation.runner_pods_pending == 0;
        if last_print.elapsed() >= Duration::from_secs(1) || settled {
            let mut line = live_line(feed_start.elapsed(), &observation);
            if let Some((min, active)) = &min_now {
                line.push_str(&format!(
                    " | min {min}{}",
                    active
                        .as_deref()
                        .map(|name| format!(" (window {name})"))
                        .unwrap_or_default()
                ));
            }
            if line != last_line || last_print.elapsed() >= Duration::from_secs(5) {
                println!("{line}");
                last_line = line;
                last_print = Instant::now();
            }
        }
        if settled {
            break;
        }
        if Instant::now() >= deadline {
            println!("timed out after {}s", args.timeout_secs);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let run_secs = finished_at.unwrap_or(feed_start.elapsed()).as_secs_f64();
    let counters = world.fake.state().counters();

    println!("\nall jobs done; checking invariants and uninstalling the scale set...");
    let ids = world.enqueued();
    let mut problems = checks::jobs_completed_exactly_once(&world, &ids, &[]);
    problems.extend(checks::no_orphans(&world).await?);
    problems.extend(world.simulator.problems());
    if let Err(error) = checks::uninstall_leaves_nothing(&world, Duration::from_secs(120)).await {
        problems.push(error.to_string());
    }
    let snapshot = world.fake.state().snapshot();
    let completed = e2e::world::completed(&snapshot, &ids);
    let stats = world.simulator.stats();
    let served_twice = world.simulator.jobs_served_twice().len();
    let jobs = f64::from(args.jobs.max(1));
    let summary = Summary {
        jobs: args.jobs,
        completed,
        lost: args.jobs as usize - completed.min(args.jobs as usize),
        served_twice,
        elapsed_secs: started.elapsed().as_secs_f64(),
        run_secs,
        throughput_jobs_per_minute: completed as f64 / run_secs.max(0.001) * 60.0,
        peak_desired_replicas: peak,
        runner_pods: stats.pods,
        start_failures: stats.in_stage(e2e::simulator::PodStage::FailedToStart),
        api_calls_per_job: counters
            .into_iter()
            .filter(|(endpoint, _)| !matches!(endpoint.as_str(), "get_message" | "delete_message"))
            .map(|(endpoint, count)| (endpoint, (count as f64 / jobs * 100.0).round() / 100.0))
            .collect(),
        problems,
    };
    world.shutdown().await?;
    Ok(summary)
}

/// Adds a scheduled minimum to the installed set: a window named `demo-window` opening `after` seconds from now
/// (UTC, to the second) and open for `--window-secs`. Returns when it closes.
async fn add_window(world: &World, args: &Args, after: u64) -> e2e::Result<Timestamp> {
    let time = |offset: u64| {
        let at = Timestamp::now()
            .checked_add(SignedDuration::from_secs(
                offset.try_into().unwrap_or(i64::MAX),
            ))
            .unwrap_or(Timestamp::MAX);
        let at = Timestamp::from_second(at.as_second()).unwrap_or(at);
        let z = at.to_zoned(TimeZone::UTC);
        (
            format!("{:02}:{:02}:{:02}", z.hour(), z.minute(), z.second()),
            at,
        )
    };
    let (start, _) = time(after);
    let (end, closes) = time(after + args.window_secs);
    let sets: Api<AutoscalingRunnerSet> = Api::namespaced(world.client(), world.namespace());
    sets.patch(
        &world.release,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minRunnersSchedules": [{
            "name": "demo-window", "minRunners": args.window_min_runners, "start": start, "end": end
        }]}})),
    )
    .await?;
    println!(
        "scheduled minimum: window `demo-window` with minRunners {} from {start} to {end} UTC (opens in {after}s)",
        args.window_min_runners
    );
    Ok(closes)
}

/// The set's `status.effectiveMinRunners` and `activeMinRunnersSchedule`.
async fn scheduled_min(world: &World) -> Option<(i64, Option<String>)> {
    let status = world.runner_set().await.ok()??.status?;
    Some((
        status.effective_min_runners?,
        status.active_min_runners_schedule,
    ))
}

fn live_line(elapsed: Duration, o: &Observation) -> String {
    let pending =
        o.runners.get("Pending").copied().unwrap_or(0) + o.runners.get("New").copied().unwrap_or(0);
    format!(
        "[{:>5.1}s] jobs: {:>4} queued {:>4} running {:>4} done | runners: {:>4} pending {:>4} running {:>4} finished{} | desired replicas {:>4}",
        elapsed.as_secs_f64(),
        o.jobs_queued,
        o.jobs_running,
        o.jobs_done,
        pending,
        o.runners.get("Running").copied().unwrap_or(0),
        o.runners_finished,
        if o.start_failures > 0 {
            format!(" {:>3} failed starts", o.start_failures)
        } else {
            String::new()
        },
        o.desired_replicas,
    )
}

fn print_summary(s: &Summary) {
    println!("\n== summary ==");
    println!(
        "jobs: {} enqueued, {} completed, {} lost, {} served twice",
        s.jobs, s.completed, s.lost, s.served_twice
    );
    println!(
        "time: {:.1}s from first job to last completion ({:.0} jobs/min), {:.1}s in all",
        s.run_secs, s.throughput_jobs_per_minute, s.elapsed_secs
    );
    println!(
        "runners: peak desired replicas {}, {} runner pods, {} failed to start",
        s.peak_desired_replicas, s.runner_pods, s.start_failures
    );
    let calls: Vec<String> = s
        .api_calls_per_job
        .iter()
        .map(|(endpoint, per_job)| format!("{endpoint} {per_job}"))
        .collect();
    println!(
        "GitHub/Actions calls per job (polling excluded): {}",
        calls.join(", ")
    );
    if s.problems.is_empty() {
        println!("checks: every job completed exactly once; nothing left behind after uninstall");
    } else {
        println!("checks FAILED:");
        for problem in &s.problems {
            println!("  - {problem}");
        }
    }
}

/// `--real-node`: the same demo on a real node (`e2e::node_world`); exit status 2 when this host cannot run one.
fn real_node(args: &Args) -> ExitCode {
    let spec = e2e::node_world::DemoSpec {
        jobs: args.jobs,
        rate: args.rate,
        job_duration: Duration::from_millis(args.job_duration_ms),
        min_runners: args.min_runners,
        max_runners: args.max_runners.unwrap_or(10),
        timeout: Duration::from_secs(args.timeout_secs),
    };
    match e2e::node_world::demo_main(spec) {
        Some(true) => ExitCode::SUCCESS,
        Some(false) => ExitCode::FAILURE,
        None => {
            eprintln!("demo --real-node: this host cannot run a real node (see above)");
            ExitCode::from(2)
        }
    }
}
