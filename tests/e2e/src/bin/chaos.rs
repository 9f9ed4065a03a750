//! The long chaos run (`docs/reliability.md`): `cargo run --release -p e2e --bin chaos -- --jobs 1000`.
//!
//! One scale set on the local control plane runs `--jobs` jobs while the manager and the listener are killed
//! about every `--kill-every-secs`, `--fault-rate` of the fake's calls fail (5xx or timeouts), tokens expire and
//! sessions are dropped every few minutes, and kube-apiserver is restarted once. Then every job must have
//! completed exactly once, the set be back at `minRunners`, nothing be orphaned or left in the fake, and every
//! process have recovered by itself. Prints a line per disruption, a readable report, and with `--json` the
//! report as the last line; the exit status is non-zero on any problem.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use e2e::chaos::{self, ChaosConfig};
use fake_actions_service::JobDelivery;

#[derive(Debug, Parser)]
#[command(
    about = "Runs one runner scale set through kills, service faults, token expiries, session drops and an \
             API-server restart, and checks that no job is lost"
)]
struct Args {
    /// Jobs to run.
    #[arg(long, default_value_t = 1000)]
    jobs: u32,
    /// Jobs enqueued per second.
    #[arg(long, default_value_t = 2.0)]
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
    /// Mean time between two kills (manager or listener); each interval is drawn from ±1/3 of it.
    #[arg(long, default_value_t = 30.0)]
    kill_every_secs: f64,
    /// Longest time a killed manager stays down before it is started again (at least a second).
    #[arg(long, default_value_t = 5.0)]
    manager_down_secs: f64,
    /// Fraction of the fake's calls that fail (5xx or timeout).
    #[arg(long, default_value_t = 0.05)]
    fault_rate: f64,
    /// The part of the failures that are timeouts.
    #[arg(long, default_value_t = 0.2)]
    timeout_share: f64,
    /// Mean time between two timeout windows (0: no timeouts).
    #[arg(long, default_value_t = 45.0)]
    timeout_every_secs: f64,
    /// Lifetime of admin and message-queue tokens in the fake.
    #[arg(long, default_value_t = 300)]
    token_lifetime_secs: u64,
    /// Mean time between two forced expiries of every message-queue and registration token (0: never).
    #[arg(long, default_value_t = 180.0)]
    token_expiry_every_secs: f64,
    /// Mean time between two drops of every session (0: never).
    #[arg(long, default_value_t = 90.0)]
    session_drop_every_secs: f64,
    /// Mean time between two runner pods deleted or evicted through the API (0: never).
    #[arg(long, default_value_t = 15.0)]
    disrupt_every_secs: f64,
    /// Change the runner template once this many jobs are enqueued (default: 30 % of them; 0: never).
    #[arg(long)]
    template_change_after_jobs: Option<u32>,
    /// Restart kube-apiserver once this many jobs are enqueued (default: half of them; 0: never).
    #[arg(long)]
    api_restart_after_jobs: Option<u32>,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// How the fake hands out jobs: `acquire` (GHES) or `direct` (github.com).
    #[arg(long, value_enum, default_value_t = JobDelivery::Acquire)]
    job_delivery: JobDelivery,
    /// Run the real `manager` binary (SIGKILLed) instead of the in-process manager, with production timings.
    #[arg(long)]
    manager_process: bool,
    /// Give up on the jobs after this many seconds.
    #[arg(long, default_value_t = 3600)]
    timeout_secs: u64,
    /// No line per disruption, only the report.
    #[arg(long)]
    quiet: bool,
    /// Print the report as JSON on the last line.
    #[arg(long)]
    json: bool,
}

/// `mean` ± a third, `None` for 0.
fn around(mean: f64) -> Option<(Duration, Duration)> {
    (mean > 0.0).then(|| {
        (
            Duration::from_secs_f64(mean * 2.0 / 3.0),
            Duration::from_secs_f64(mean * 4.0 / 3.0),
        )
    })
}

impl Args {
    fn config(&self) -> ChaosConfig {
        let long = ChaosConfig::long();
        let kill_every = around(self.kill_every_secs).unwrap_or(long.kill_every);
        ChaosConfig {
            jobs: self.jobs,
            rate: self.rate,
            job_duration: Duration::from_millis(self.job_duration_ms),
            min_runners: self.min_runners,
            max_runners: self.max_runners,
            kill_every,
            manager_down: (
                Duration::from_secs(1).min(Duration::from_secs_f64(self.manager_down_secs)),
                Duration::from_secs_f64(self.manager_down_secs.max(1.0)),
            ),
            fault_rate: self.fault_rate,
            timeout_share: self.timeout_share,
            timeout_every: around(self.timeout_every_secs),
            token_lifetime: Duration::from_secs(self.token_lifetime_secs),
            token_expiry_every: around(self.token_expiry_every_secs),
            session_drop_every: around(self.session_drop_every_secs),
            disrupt_every: around(self.disrupt_every_secs),
            template_change_after_jobs: match self.template_change_after_jobs {
                Some(0) => None,
                Some(n) => Some(n),
                None => Some(self.jobs * 3 / 10),
            },
            api_restart_after_jobs: match self.api_restart_after_jobs {
                Some(0) => None,
                Some(n) => Some(n),
                None => Some(self.jobs / 2),
            },
            seed: self.seed,
            job_delivery: self.job_delivery,
            manager_process: self.manager_process,
            timeout: Duration::from_secs(self.timeout_secs),
            progress: (!self.quiet).then_some(Duration::from_secs(30)),
            ..long
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    e2e::cli::init_tracing();
    let config = args.config();
    println!(
        "starting the local control plane, the fake Actions Service, the manager and the listener executor \
         for {} jobs...",
        config.jobs
    );
    e2e::cli::run(
        "chaos",
        args.json,
        chaos::run_in_new_world("chaos", &config),
        |report| {
            println!("\n{}", report.render());
            if let Some(diagnostics) = &report.diagnostics {
                println!("diagnostics:\n{diagnostics}");
            }
        },
        |report| {
            report.problems.is_empty() && report.completed_exactly_once == config.jobs as usize
        },
    )
}
