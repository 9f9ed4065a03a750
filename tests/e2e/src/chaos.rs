//! The chaos run: one scale set fed a stream of jobs while everything around it fails, then the end-of-run
//! invariants. See `docs/reliability.md`.
//!
//! While jobs flow, at the same time:
//!
//! * **kills**: every [`ChaosConfig::kill_every`] the manager or the listener is killed, picked at random. The
//!   manager is killed ([`World::stop_manager`] with `kill`) and started again after
//!   [`ChaosConfig::manager_down`], as its Deployment would; the listener gets SIGKILL ([`World::kill_listener`])
//!   and nobody restarts it but the AutoscalingListener controller. A kind whose last recovery is still being
//!   measured is not killed again.
//! * **service faults**: [`ChaosConfig::fault_rate`] of the calls to the fake fail, split by
//!   [`ChaosConfig::timeout_share`]: the rest are answered 500, 502, 503 or 504 (equal shares, drawn per call);
//!   the timeouts come from windows: every [`ChaosConfig::timeout_every`] (while timeouts are below their share
//!   of the calls so far) one of the manager's endpoints answers slower than the manager's call deadline for
//!   [`ChaosConfig::timeout_window`] (longer, up to 10 s, until a call comes), so the calls made then time out
//!   (and the fake still carries them out afterwards, as a slow service does).
//! * **tokens**: admin and message-queue tokens live [`ChaosConfig::token_lifetime`] in the fake; every
//!   [`ChaosConfig::token_expiry_every`] all message-queue and registration tokens are expired at once.
//! * **sessions**: every [`ChaosConfig::session_drop_every`] the fake forgets every message session.
//! * **pods**: every [`ChaosConfig::disrupt_every`] a random running runner pod, busy or idle, is taken away as a
//!   drain would: deleted through the API, or (every other one) evicted through the Eviction API. A job
//!   its runner was running fails, once; an idle runner must come back with a fresh JIT config.
//! * **template**: once [`ChaosConfig::template_change_after_jobs`] jobs are enqueued, the runner template of the
//!   AutoscalingRunnerSet changes (an environment variable of the runner container).
//! * **API server**: once [`ChaosConfig::api_restart_after_jobs`] jobs are enqueued, kube-apiserver is restarted
//!   (etcd and its data kept). The run first lets the set come to rest, because the runner simulator, standing
//!   in for the kubelet, gives up a pod status update after about 2 s where a kubelet retries; jobs keep being
//!   enqueued while the API server is down.
//!
//! Recovery times are measured from outside, by what the fake and the API server show: the manager from its
//! restart until it changes an EphemeralRunner (creates one, moves its phase, deletes it); the listener from
//! its kill until the fake holds a new session for the scale set; a dropped session until there is a session
//! again; the API server from the stop until `/readyz`, then until the scale set makes progress (an
//! EphemeralRunner changes).
//!
//! At the end the faults are cleared and [`checks::settle_and_verify`] runs: every job completed exactly once,
//! back to `minRunners`, no orphan pod, Secret or EphemeralRunner, nothing left in the fake after an
//! uninstall; no JIT config used by two runner processes; every runner pod created after the template change (with
//! a margin for a pass already under way) runs the new template; plus "every process recovered by itself": a listener session exists, exactly one listener process
//! runs, the manager still runs, etcd and the controller-manager never exited, the executor met no error.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use controller::Options;
use crds::constants::{
    EPHEMERAL_RUNNER_LABEL, EPHEMERAL_RUNNER_LABEL_VALUE, JOB_ID_KEY, RUNNER_CONTAINER_NAME,
};
use crds::{AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet};
use fake_actions_service::{
    DropSessions, ErrorFault, ExpireTokens, Faults, JobDelivery, JobState, LatencyFault, TokenKind,
};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::{EnvVar, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::ResourceExt;
use kube::api::{DeleteParams, EvictParams, ListParams, Patch, PatchParams};
use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::checks;
use crate::simulator::{SimulatorConfig, SplitMix64};
use crate::world::{World, WorldConfig};
use crate::{Error, Result};

/// The in-process manager's deadline for one Actions Service call in a chaos run (the world's default is 10 s);
/// timeout faults hold a call one second longer.
pub const MANAGER_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The 5xx statuses injected, in equal shares.
const FAULT_STATUSES: [u16; 4] = [500, 502, 503, 504];

/// Calls only the manager makes (the listener never does), which timeout faults slow down: runner registration and
/// removal, and the scale-set check.
const TIMEOUT_ENDPOINTS: [&str; 3] = [
    "generate_jit_config",
    "remove_runner",
    "get_scale_set_by_id",
];

/// A timeout window that caught no call stays open until one comes, up to this long.
const TIMEOUT_WINDOW_MAX: Duration = Duration::from_secs(10);

/// An error rule's budget: large enough never to run out, so that what is left says how often it fired.
const FAULT_BUDGET: u32 = u32::MAX;

/// How often measurements look at the fake and the API server.
const PROBE_INTERVAL: Duration = Duration::from_millis(200);

/// What to run and what to break.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChaosConfig {
    /// Jobs to run.
    pub jobs: u32,
    /// Jobs enqueued per second.
    pub rate: f64,
    /// How long each job runs.
    #[serde(serialize_with = "secs")]
    pub job_duration: Duration,
    /// The chart's `minRunners`.
    pub min_runners: u32,
    /// The chart's `maxRunners`.
    pub max_runners: Option<u32>,
    /// Time between two kills (manager or listener), drawn uniformly from this range.
    #[serde(serialize_with = "secs_range")]
    pub kill_every: (Duration, Duration),
    /// How long a killed manager stays down before it is started again.
    #[serde(serialize_with = "secs_range")]
    pub manager_down: (Duration, Duration),
    /// Fraction of calls to the fake that fail: answered with a 5xx (500, 502, 503, 504 in equal shares) or
    /// timing out.
    pub fault_rate: f64,
    /// The part of `fault_rate` that is timeouts (the rest is 5xx).
    pub timeout_share: f64,
    /// Time between two timeout windows (skipped while timeouts are above their share); `None`: no timeouts.
    #[serde(serialize_with = "opt_secs_range")]
    pub timeout_every: Option<(Duration, Duration)>,
    /// How long one endpoint answers too slowly in a timeout window.
    #[serde(serialize_with = "secs")]
    pub timeout_window: Duration,
    /// Lifetime of admin and message-queue tokens in the fake (clients must renew them by themselves).
    #[serde(serialize_with = "secs")]
    pub token_lifetime: Duration,
    /// Time between two forced expiries of every message-queue and registration token; `None`: never.
    #[serde(serialize_with = "opt_secs_range")]
    pub token_expiry_every: Option<(Duration, Duration)>,
    /// Time between two drops of every session in the fake; `None`: never.
    #[serde(serialize_with = "opt_secs_range")]
    pub session_drop_every: Option<(Duration, Duration)>,
    /// Time between two runner pods taken away (deleted or evicted through the API); `None`: never.
    #[serde(serialize_with = "opt_secs_range")]
    pub disrupt_every: Option<(Duration, Duration)>,
    /// Change the runner template once this many jobs are enqueued; `None`: never.
    pub template_change_after_jobs: Option<u32>,
    /// Restart kube-apiserver once this many jobs are enqueued; `None`: never.
    pub api_restart_after_jobs: Option<u32>,
    /// Seed of every random choice (intervals, kinds, faults).
    pub seed: u64,
    /// How the fake hands jobs to the listener (GHES's acquire, or github.com's direct assignment).
    pub job_delivery: JobDelivery,
    /// Run the real `manager` binary (SIGKILLed) instead of the in-process manager (its task aborted). The
    /// binary runs with production timings (error backoff up to 5 minutes, 30 s call deadline).
    pub manager_process: bool,
    /// A process that has not recovered after this long is a problem.
    #[serde(serialize_with = "secs")]
    pub recovery_timeout: Duration,
    /// Give up on the jobs after this long.
    #[serde(serialize_with = "secs")]
    pub timeout: Duration,
    /// Print a line per event and a status line every this often.
    #[serde(skip)]
    pub progress: Option<Duration>,
}

impl ChaosConfig {
    /// The CI-sized run: about 150 jobs in a few minutes, a kill every 5 to 10 s, the API server restarted once
    /// halfway, token expiries and session drops every 20 to 30 s.
    pub fn ci() -> Self {
        Self {
            jobs: 150,
            rate: 2.0,
            job_duration: Duration::from_secs(2),
            min_runners: 0,
            max_runners: None,
            kill_every: (Duration::from_secs(5), Duration::from_secs(10)),
            manager_down: (Duration::from_millis(500), Duration::from_secs(2)),
            fault_rate: 0.05,
            timeout_share: 0.2,
            timeout_every: Some((Duration::from_secs(10), Duration::from_secs(20))),
            timeout_window: Duration::from_millis(1500),
            token_lifetime: Duration::from_secs(90),
            token_expiry_every: Some((Duration::from_secs(20), Duration::from_secs(30))),
            session_drop_every: Some((Duration::from_secs(20), Duration::from_secs(30))),
            disrupt_every: Some((Duration::from_secs(4), Duration::from_secs(8))),
            template_change_after_jobs: Some(40),
            api_restart_after_jobs: Some(75),
            seed: 42,
            job_delivery: JobDelivery::Acquire,
            manager_process: false,
            recovery_timeout: Duration::from_secs(120),
            timeout: Duration::from_secs(600),
            progress: None,
        }
    }

    /// The long run: 1000 jobs, a kill about every 30 s, token expiries every few minutes.
    pub fn long() -> Self {
        Self {
            jobs: 1000,
            job_duration: Duration::from_secs(3),
            kill_every: (Duration::from_secs(20), Duration::from_secs(40)),
            manager_down: (Duration::from_secs(1), Duration::from_secs(5)),
            timeout_every: Some((Duration::from_secs(30), Duration::from_secs(60))),
            timeout_window: Duration::from_secs(2),
            token_lifetime: Duration::from_secs(300),
            token_expiry_every: Some((Duration::from_secs(120), Duration::from_secs(240))),
            session_drop_every: Some((Duration::from_secs(60), Duration::from_secs(120))),
            disrupt_every: Some((Duration::from_secs(10), Duration::from_secs(20))),
            template_change_after_jobs: Some(300),
            api_restart_after_jobs: Some(500),
            timeout: Duration::from_secs(3600),
            ..Self::ci()
        }
    }

    /// The world this run needs: short token lifetimes in the fake, the chaos call deadline for the manager.
    pub fn world_config(&self) -> WorldConfig {
        let defaults = WorldConfig::default();
        let mut values = json!({"minRunners": self.min_runners});
        if let Some(max) = self.max_runners {
            values["maxRunners"] = json!(max);
        }
        WorldConfig {
            release: "chaos".to_owned(),
            values,
            simulator: SimulatorConfig {
                job_duration: self.job_duration,
                seed: self.seed,
                ..SimulatorConfig::default()
            },
            fake: fake_actions_service::Config {
                admin_token_lifetime: self.token_lifetime,
                message_queue_token_lifetime: self.token_lifetime,
                seed: Some(self.seed),
                job_delivery: self.job_delivery,
                ..defaults.fake
            },
            tune: chaos_tune,
            manager_process: self.manager_process,
            manager_args: Vec::new(),
            controller_values: defaults.controller_values,
            own_control_plane: defaults.own_control_plane,
        }
    }

    /// The manager's deadline for one Actions Service call.
    pub fn manager_call_timeout(&self) -> Duration {
        if self.manager_process {
            Options::default().actions_call_timeout
        } else {
            MANAGER_CALL_TIMEOUT
        }
    }
}

fn chaos_tune(options: &mut Options) {
    options.actions_call_timeout = MANAGER_CALL_TIMEOUT;
}

/// Minimum, median and maximum of some recovery times.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryStats {
    /// Measured recoveries.
    pub count: usize,
    /// Recoveries not observed: the process did not recover within the limit (a problem), or there was no
    /// work left to show it (manager only, not a problem).
    pub unobserved: usize,
    pub min_secs: Option<f64>,
    pub p50_secs: Option<f64>,
    pub max_secs: Option<f64>,
}

/// One disruption and how long its recovery took.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Recovery {
    /// `manager`, `managerWhileListenerDown` (the listener was being replaced at the same time, so nobody asked
    /// for runners: the manager may have recovered long before it had anything to change), `listener`,
    /// `session`, `apiServerReady`, `apiServerProgress`.
    pub kind: String,
    /// When the disruption happened, from the first job.
    pub at_secs: f64,
    /// How long until recovered; `None` when not observed.
    pub secs: Option<f64>,
    /// Why it was not observed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What a chaos run did and found.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChaosReport {
    /// The seed every random choice of the run came from: the same seed, the same disruptions in the same order
    /// (their timing still depends on the machine).
    pub seed: u64,
    /// How the fake handed out jobs.
    pub job_delivery: JobDelivery,
    pub jobs: u32,
    /// Jobs that completed.
    pub completed: usize,
    /// Jobs that completed after exactly one start, served by exactly one runner: as `succeeded`, or as `failed`
    /// when the run took their runner's pod away while they ran.
    pub completed_exactly_once: usize,
    /// Jobs started by more than one runner, or more than once.
    pub served_twice: usize,
    /// Kills by kind (`manager`, `listener`).
    pub kills: BTreeMap<String, u32>,
    /// kube-apiserver restarts.
    pub api_server_restarts: u32,
    /// Requests to the fake's GitHub and Actions Service endpoints during the run, injected faults included.
    pub calls: u64,
    /// The same requests by endpoint.
    pub calls_by_endpoint: BTreeMap<String, u64>,
    /// Faults injected, by kind: `http500`, `http502`, `http503`, `http504` (counted by the fake's rules),
    /// `timeout` (requests that reached a slowed endpoint while its latency exceeded the manager's deadline; a
    /// lower bound).
    pub faults: BTreeMap<String, u64>,
    /// Timeout windows opened, by endpoint.
    pub timeout_windows: BTreeMap<String, u32>,
    /// Forced expiries (each expires every message-queue and registration token).
    pub token_expiries: u32,
    /// Message-queue tokens expired by force.
    pub message_queue_tokens_expired: u64,
    /// Registration tokens expired by force.
    pub registration_tokens_expired: u64,
    /// Admin-token fetches (`runner_registration` requests, failed ones included): renewals by `exp`, plus
    /// one per client start.
    pub admin_token_fetches: u64,
    /// Session drops and how many sessions they removed.
    pub session_drops: u32,
    pub sessions_dropped: u64,
    /// Recovery times by kind.
    pub recovery: BTreeMap<String, RecoveryStats>,
    /// Every disruption with its recovery.
    pub recoveries: Vec<Recovery>,
    /// Runner pods taken away through the API: deleted, evicted, and how many of them held a job then.
    pub pods_deleted: u32,
    pub pods_evicted: u32,
    pub busy_pods_taken: u32,
    /// Evictions the API server refused: busy runners, protected by their set's disruption budget.
    pub evictions_refused: u32,
    /// Turns to take a pod away that took none: no running runner pod to take (or the list failed), or the delete
    /// or eviction failed otherwise than with a refusal (the last such error); a run with fewer takes than its
    /// turns says why.
    pub pod_takes_without_pod: u32,
    pub pod_takes_failed: u32,
    pub pod_take_last_error: Option<String>,
    /// Jobs that failed because their runner's pod was taken away (expected: once each).
    pub jobs_interrupted_on_purpose: usize,
    /// Runner template changes.
    pub template_changes: u32,
    /// Runner pods created after the template change settled, and how many of them ran the old template.
    pub pods_after_template_change: usize,
    pub pods_on_old_template: usize,
    /// Runner processes refused by the fake because their JIT config had been used before.
    pub jit_config_reuses: u64,
    /// Runner pods the simulator ran.
    pub runner_pods: usize,
    /// From the first job enqueued to the last one completed.
    pub run_secs: f64,
    /// Including start-up, verification and the uninstall.
    pub total_secs: f64,
    pub config: Option<ChaosConfig>,
    /// Everything that went wrong; empty when the run passed.
    pub problems: Vec<String>,
    /// The world's diagnostics when there were problems.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<String>,
}

impl ChaosReport {
    /// Kills of `kind`.
    pub fn kills_of(&self, kind: &str) -> u32 {
        self.kills.get(kind).copied().unwrap_or(0)
    }

    /// Faults injected, every kind.
    pub fn faults_injected(&self) -> u64 {
        self.faults.values().sum()
    }

    /// A readable summary.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "== chaos run (seed {}, jobs delivered by {:?}) ==",
            self.seed, self.job_delivery
        );
        let _ = writeln!(
            out,
            "jobs: {} enqueued, {} completed, {} completed exactly once, {} served twice",
            self.jobs, self.completed, self.completed_exactly_once, self.served_twice
        );
        let _ = writeln!(
            out,
            "time: {:.1}s from the first job to the last completion, {:.1}s in all",
            self.run_secs, self.total_secs
        );
        let _ = writeln!(
            out,
            "kills: {} manager, {} listener; kube-apiserver restarts: {}",
            self.kills_of("manager"),
            self.kills_of("listener"),
            self.api_server_restarts
        );
        let share = if self.calls == 0 {
            0.0
        } else {
            100.0 * self.faults_injected() as f64 / self.calls as f64
        };
        let _ = writeln!(
            out,
            "faults: {} of {} calls ({share:.1}%): {}",
            self.faults_injected(),
            self.calls,
            self.faults
                .iter()
                .map(|(kind, n)| format!("{kind} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let _ = writeln!(
            out,
            "tokens: {} forced expiries ({} message-queue, {} registration tokens); {} admin-token fetches",
            self.token_expiries,
            self.message_queue_tokens_expired,
            self.registration_tokens_expired,
            self.admin_token_fetches
        );
        let _ = writeln!(
            out,
            "sessions: {} drops ({} sessions dropped)",
            self.session_drops, self.sessions_dropped
        );
        let _ = writeln!(out, "recovery (seconds):");
        for (kind, stats) in &self.recovery {
            let f = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
            let _ = writeln!(
                out,
                "  {kind:<25} n={:<3} min {:>6} p50 {:>6} max {:>6}{}",
                stats.count,
                f(stats.min_secs),
                f(stats.p50_secs),
                f(stats.max_secs),
                if stats.unobserved > 0 {
                    format!("  ({} not observed)", stats.unobserved)
                } else {
                    String::new()
                }
            );
        }
        let _ = writeln!(
            out,
            "pods taken away: {} deleted, {} evicted ({} busy; {} jobs failed with them; {} evictions of busy \
             runners refused; {} turns found no running pod, {} failed{}); template changes: {} ({} pods after it, \
             {} on the old template); JIT configs used twice: {}",
            self.pods_deleted,
            self.pods_evicted,
            self.busy_pods_taken,
            self.jobs_interrupted_on_purpose,
            self.evictions_refused,
            self.pod_takes_without_pod,
            self.pod_takes_failed,
            self.pod_take_last_error
                .as_deref()
                .map(|error| format!(", the last: {error}"))
                .unwrap_or_default(),
            self.template_changes,
            self.pods_after_template_change,
            self.pods_on_old_template,
            self.jit_config_reuses
        );
        let _ = writeln!(out, "runner pods: {}", self.runner_pods);
        if self.problems.is_empty() {
            let _ = writeln!(
                out,
                "checks: every job completed exactly once; back to minRunners; no orphan; nothing left in the \
                 fake after uninstall; every process recovered by itself"
            );
        } else {
            let _ = writeln!(out, "PROBLEMS:");
            for problem in &self.problems {
                let _ = writeln!(out, "  - {problem}");
            }
        }
        out
    }
}

/// Starts a world for `config`, waits for its listener, runs the chaos, verifies, and shuts the world down.
pub async fn run_in_new_world(prefix: &str, config: &ChaosConfig) -> Result<ChaosReport> {
    let started = Instant::now();
    let world = World::start(prefix, config.world_config()).await?;
    if let Err(error) = world.wait_listening(Duration::from_secs(300)).await {
        return Err(Error::Invariant(format!(
            "{error}\n{}",
            world.diagnostics().await
        )));
    }
    if config.progress.is_some() {
        println!(
            "world ready after {:.1}s (namespace {}, fake at {})",
            started.elapsed().as_secs_f64(),
            world.namespace(),
            world.fake.base_url()
        );
    }
    let mut report = run(&world, config).await?;
    if let Err(error) = world.shutdown().await {
        report
            .problems
            .push(format!("shutting the world down: {error}"));
    }
    report.total_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Counts kept while the run goes.
#[derive(Default)]
struct Tally {
    kills: BTreeMap<String, u32>,
    api_server_restarts: u32,
    timeouts: u64,
    timeout_windows: BTreeMap<String, u32>,
    token_expiries: u32,
    message_queue_tokens: u64,
    registration_tokens: u64,
    session_drops: u32,
    sessions_dropped: u64,
    recoveries: Vec<Recovery>,
    pods_deleted: u32,
    pods_evicted: u32,
    busy_pods_taken: u32,
    evictions_refused: u32,
    pod_takes_without_pod: u32,
    pod_takes_failed: u32,
    pod_take_last_error: Option<String>,
    /// When the set's runner template was seen changed.
    template_changed_at: Option<Timestamp>,
    problems: Vec<String>,
}

/// The state the concurrent parts of a run share.
struct Run<'a> {
    world: &'a World,
    config: &'a ChaosConfig,
    started: Instant,
    tally: Mutex<Tally>,
    /// Disruptions hold off (the API-server restart is under way).
    paused: AtomicBool,
    /// The feed holds off.
    feed_paused: AtomicBool,
    /// Jobs enqueued so far.
    fed: AtomicU32,
    /// The API-server restart is over (or none is planned).
    restart_done: AtomicBool,
    /// Every job is enqueued and completed: disruptions stop.
    done: CancellationToken,
    /// The manager is killed and not started again yet.
    manager_down: AtomicBool,
    /// A listener kill or a session drop is being recovered from.
    listener_busy: AtomicBool,
    /// Serialises changes to the fault rules.
    faults: tokio::sync::Mutex<()>,
}

impl Run<'_> {
    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn problem(&self, problem: String) {
        self.event(&format!("PROBLEM: {problem}"));
        self.tally().problems.push(problem);
    }

    fn event(&self, what: &str) {
        if self.config.progress.is_some() {
            println!("[{:7.1}s] {what}", self.now_secs());
        }
    }

    fn recovered(&self, kind: &str, at: Instant, secs: Option<f64>, note: Option<String>) {
        let at_secs = at.duration_since(self.started).as_secs_f64();
        match secs {
            Some(secs) => self.event(&format!("{kind} recovered after {secs:.1}s")),
            None => self.event(&format!(
                "{kind}: recovery not observed ({})",
                note.as_deref().unwrap_or("")
            )),
        }
        self.tally().recoveries.push(Recovery {
            kind: kind.to_owned(),
            at_secs,
            secs,
            note,
        });
    }

    fn paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Sleeps `duration`; `true` when the run ended meanwhile.
    async fn nap(&self, duration: Duration) -> bool {
        tokio::select! {
            () = self.done.cancelled() => true,
            () = tokio::time::sleep(duration) => false,
        }
    }

    /// The scale set's session in the fake.
    fn session(&self) -> Option<String> {
        self.world
            .fake
            .state()
            .snapshot()
            .scale_sets
            .into_iter()
            .find(|set| set.name.eq_ignore_ascii_case(&self.world.release))
            .and_then(|set| set.session_id)
    }
}

fn between(rng: &mut SplitMix64, (low, high): (Duration, Duration)) -> Duration {
    let span = high.saturating_sub(low).as_secs_f64();
    low + Duration::from_secs_f64(span * rng.next_f64())
}

/// Runs the chaos on a world whose listener is connected, then verifies; see the module documentation.
/// Fails only when the run cannot be carried out; what went wrong in it is in the report's `problems`.
pub async fn run(world: &World, config: &ChaosConfig) -> Result<ChaosReport> {
    let run = Run {
        world,
        config,
        started: Instant::now(),
        tally: Mutex::default(),
        paused: AtomicBool::new(false),
        feed_paused: AtomicBool::new(false),
        fed: AtomicU32::new(0),
        restart_done: AtomicBool::new(config.api_restart_after_jobs.is_none()),
        done: CancellationToken::new(),
        manager_down: AtomicBool::new(false),
        listener_busy: AtomicBool::new(false),
        faults: tokio::sync::Mutex::new(()),
    };
    world.fake.state().reset_counters();
    world.fake.state().set_faults(error_faults(config))?;

    let (fed, (), (), (), (), (), (), ()) = tokio::join!(
        feed(&run),
        kills(&run),
        faults(&run),
        token_expiries(&run),
        session_drops(&run),
        api_restart(&run),
        disruptions(&run),
        template_change(&run),
    );
    fed?;
    let run_secs = run.now_secs();

    // The disruptions are over: count the faults, clear them, and check that everything recovered by itself.
    let rules = world.fake.state().faults();
    world.fake.state().clear_faults();
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    for rule in &rules.errors {
        let fired = u64::from(FAULT_BUDGET - rule.count.unwrap_or(FAULT_BUDGET));
        *faults.entry(format!("http{}", rule.status)).or_default() += fired;
    }
    faults.insert("timeout".to_owned(), run.tally().timeouts);
    let counters = world.fake.state().counters();
    let calls = counters.values().sum();
    let admin_token_fetches = counters.get("runner_registration").copied().unwrap_or(0);

    recovered_by_itself(&run).await;

    let ids = world.enqueued();
    let snapshot = world.fake.state().snapshot();
    let completed = crate::world::completed(&snapshot, &ids);
    let served_twice_by_runners = world.simulator.jobs_served_twice();
    let expected = world.simulator.config().job_result;
    let interrupted_on_purpose = world.simulator.jobs_interrupted_on_purpose();
    let completed_exactly_once = snapshot
        .jobs
        .iter()
        .filter(|j| {
            // A job whose runner's pod the run took away fails, once; every other one succeeds, once.
            let wanted = if interrupted_on_purpose.contains(&j.request_id) {
                "failed"
            } else {
                expected.as_str()
            };
            ids.contains(&j.request_id)
                && j.state == JobState::Completed
                && j.times_started == 1
                && j.result.as_deref() == Some(wanted)
                && !served_twice_by_runners.contains_key(&j.request_id)
        })
        .count();
    let served_twice = snapshot
        .jobs
        .iter()
        .filter(|j| {
            ids.contains(&j.request_id)
                && (j.times_started > 1 || served_twice_by_runners.contains_key(&j.request_id))
        })
        .count();

    if let Err(error) =
        checks::settle_and_verify(world, config.min_runners as usize, &[], config.timeout).await
    {
        run.problem(format!("end-of-run checks: {error}"));
    }

    let template = template_check(&run);
    let jit_config_reuses = world.fake.state().snapshot().jit_config_reuses;
    let mut tally = std::mem::take(&mut *run.tally());
    let mut recovery: BTreeMap<String, RecoveryStats> = BTreeMap::new();
    for sample in &tally.recoveries {
        let stats = recovery.entry(sample.kind.clone()).or_default();
        match sample.secs {
            Some(_) => stats.count += 1,
            None => stats.unobserved += 1,
        }
    }
    for (kind, stats) in &mut recovery {
        let mut times: Vec<f64> = tally
            .recoveries
            .iter()
            .filter(|r| &r.kind == kind)
            .filter_map(|r| r.secs)
            .collect();
        times.sort_by(f64::total_cmp);
        stats.min_secs = times.first().copied();
        stats.max_secs = times.last().copied();
        stats.p50_secs = (!times.is_empty()).then(|| times[(times.len() - 1) / 2]);
    }
    let diagnostics = if tally.problems.is_empty() {
        None
    } else {
        Some(world.diagnostics().await)
    };
    Ok(ChaosReport {
        seed: config.seed,
        job_delivery: config.job_delivery,
        jobs: config.jobs,
        completed,
        completed_exactly_once,
        served_twice,
        kills: tally.kills,
        api_server_restarts: tally.api_server_restarts,
        calls,
        calls_by_endpoint: counters,
        faults,
        timeout_windows: tally.timeout_windows,
        token_expiries: tally.token_expiries,
        message_queue_tokens_expired: tally.message_queue_tokens,
        registration_tokens_expired: tally.registration_tokens,
        admin_token_fetches,
        session_drops: tally.session_drops,
        sessions_dropped: tally.sessions_dropped,
        recovery,
        recoveries: std::mem::take(&mut tally.recoveries),
        pods_deleted: tally.pods_deleted,
        pods_evicted: tally.pods_evicted,
        busy_pods_taken: tally.busy_pods_taken,
        evictions_refused: tally.evictions_refused,
        pod_takes_without_pod: tally.pod_takes_without_pod,
        pod_takes_failed: tally.pod_takes_failed,
        pod_take_last_error: tally.pod_take_last_error.take(),
        jobs_interrupted_on_purpose: world.simulator.jobs_interrupted_on_purpose().len(),
        template_changes: u32::from(tally.template_changed_at.is_some()),
        pods_after_template_change: template.0,
        pods_on_old_template: template.1,
        jit_config_reuses,
        runner_pods: world.simulator.stats().pods,
        run_secs,
        total_secs: run_secs,
        config: Some(config.clone()),
        problems: std::mem::take(&mut tally.problems),
        diagnostics,
    })
}

/// The fraction of calls answered with a 5xx.
fn error_rate(config: &ChaosConfig) -> f64 {
    let timeouts = if config.timeout_every.is_some() {
        config.timeout_share.clamp(0.0, 1.0)
    } else {
        0.0
    };
    config.fault_rate.clamp(0.0, 1.0) * (1.0 - timeouts)
}

/// The 5xx rules: one per status, each at the rate that makes the 5xx rate in all (a rule draws only when the
/// ones before it did not fire).
fn error_faults(config: &ChaosConfig) -> Faults {
    let errors = error_rate(config);
    let per_rule = 1.0 - (1.0 - errors).powf(1.0 / FAULT_STATUSES.len() as f64);
    Faults {
        seed: config.seed,
        errors: FAULT_STATUSES
            .iter()
            .map(|&status| ErrorFault {
                endpoint: None,
                status,
                rate: per_rule,
                count: Some(FAULT_BUDGET),
                retry_after_secs: None,
            })
            .collect(),
        latency: Vec::new(),
    }
}

/// Enqueues the jobs at the configured rate (holding off while the API-server restart asks it to), then waits
/// until every one has completed and ends the run.
async fn feed(run: &Run<'_>) -> Result<()> {
    let config = run.config;
    let world = run.world;
    let deadline = Instant::now() + config.timeout;
    let mut credit = 1.0;
    let mut last = Instant::now();
    let mut last_status = Instant::now();
    let result = loop {
        let fed = run.fed.load(Ordering::SeqCst);
        let now = Instant::now();
        if !run.feed_paused.load(Ordering::SeqCst) {
            credit += config.rate * now.duration_since(last).as_secs_f64();
        }
        last = now;
        let due = (credit.floor() as u32).min(config.jobs - fed);
        if due > 0 {
            if let Err(error) = world.enqueue(due) {
                break Err(error);
            }
            credit -= f64::from(due);
            run.fed.fetch_add(due, Ordering::SeqCst);
        }
        let ids = world.enqueued();
        let completed = world.fake.state().completed_among(&ids);
        if let Some(every) = config.progress
            && last_status.elapsed() >= every
        {
            last_status = Instant::now();
            let tally = run.tally();
            run.event(&format!(
                "status: {} enqueued, {completed} completed; kills {:?}; {} token expiries, {} session drops",
                ids.len(),
                tally.kills,
                tally.token_expiries,
                tally.session_drops
            ));
        }
        if ids.len() == config.jobs as usize
            && completed == ids.len()
            && run.restart_done.load(Ordering::SeqCst)
        {
            run.event(&format!("all {} jobs completed", ids.len()));
            break Ok(());
        }
        if Instant::now() >= deadline {
            let detail = world.diagnostics().await;
            run.problem(format!(
                "only {completed} of {} jobs completed within {:?}",
                config.jobs, config.timeout
            ));
            run.event(&detail);
            break Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    run.done.cancel();
    result
}

type Pending<'a> = Pin<Box<dyn Future<Output = &'static str> + 'a>>;

/// Every `kill_every`, kills the manager or the listener (whichever is not recovering yet), and measures each
/// recovery concurrently.
async fn kills(run: &Run<'_>) {
    let mut rng = SplitMix64(run.config.seed ^ 0x6b69_6c6c);
    let mut pending: FuturesUnordered<Pending<'_>> = FuturesUnordered::new();
    let mut recovering: Vec<&'static str> = Vec::new();
    let mut next = tokio::time::Instant::now() + between(&mut rng, run.config.kill_every);
    loop {
        tokio::select! {
            () = run.done.cancelled() => break,
            Some(kind) = pending.next(), if !pending.is_empty() => {
                recovering.retain(|k| *k != kind);
            }
            () = tokio::time::sleep_until(next) => {
                next = tokio::time::Instant::now() + between(&mut rng, run.config.kill_every);
                if run.paused() {
                    continue;
                }
                let mut kinds: Vec<&'static str> = ["manager", "listener"]
                    .into_iter()
                    .filter(|k| !recovering.contains(k))
                    .collect();
                if run.listener_busy.load(Ordering::SeqCst) {
                    kinds.retain(|k| *k != "listener");
                }
                if kinds.is_empty() {
                    continue;
                }
                let kind = kinds[(rng.next_u64() % kinds.len() as u64) as usize];
                recovering.push(kind);
                if kind == "manager" {
                    let down = between(&mut rng, run.config.manager_down);
                    pending.push(Box::pin(async move {
                        kill_manager(run, down).await;
                        "manager"
                    }));
                } else {
                    run.listener_busy.store(true, Ordering::SeqCst);
                    pending.push(Box::pin(async move {
                        kill_listener(run).await;
                        run.listener_busy.store(false, Ordering::SeqCst);
                        "listener"
                    }));
                }
            }
        }
    }
    // Recoveries under way finish (each has its own limit).
    while pending.next().await.is_some() {}
}

/// Kills the manager, starts it again after `down`, and measures how long until it changes an
/// EphemeralRunner.
async fn kill_manager(run: &Run<'_>, down: Duration) {
    run.manager_down.store(true, Ordering::SeqCst);
    if let Err(error) = run.world.stop_manager(true).await {
        run.problem(format!("killing the manager: {error}"));
    }
    *run.tally().kills.entry("manager".to_owned()).or_default() += 1;
    run.event(&format!(
        "killed the manager; it restarts in {:.1}s",
        down.as_secs_f64()
    ));
    tokio::time::sleep(down).await;
    run.world.start_manager();
    run.manager_down.store(false, Ordering::SeqCst);
    let restarted = Instant::now();
    let listener_was_busy = run.listener_busy.load(Ordering::SeqCst);
    match runner_progress(run, restarted).await {
        Progress::Changed(after) => {
            // While the listener is being replaced nobody asks for runners: the manager may have recovered long
            // before it had anything to change.
            let kind = if listener_was_busy || run.listener_busy.load(Ordering::SeqCst) {
                "managerWhileListenerDown"
            } else {
                "manager"
            };
            run.recovered(kind, restarted, Some(after.as_secs_f64()), None);
        }
        Progress::Idle => run.recovered(
            "manager",
            restarted,
            None,
            Some("no runner work left to show it".to_owned()),
        ),
        Progress::TimedOut => {
            run.recovered(
                "manager",
                restarted,
                None,
                Some("no runner change".to_owned()),
            );
            run.problem(format!(
                "the manager restarted at {:.1}s changed no EphemeralRunner within {:?}",
                restarted.duration_since(run.started).as_secs_f64(),
                run.config.recovery_timeout
            ));
        }
    }
    if let Some(exit) = run.world.manager_exit() {
        run.problem(format!("the restarted manager ended: {exit}"));
    }
}

/// SIGKILLs the listener and measures how long until the fake holds a new session for the scale set.
async fn kill_listener(run: &Run<'_>) {
    let old = run.session();
    let killed = Instant::now();
    match run.world.kill_listener().await {
        Ok(pod) => {
            *run.tally().kills.entry("listener".to_owned()).or_default() += 1;
            run.event(&format!("killed the listener of pod {pod}"));
        }
        Err(error) => {
            // No listener is running (its pod is being replaced): nothing to kill this time.
            run.event(&format!("no listener to kill: {error}"));
            return;
        }
    }
    match wait_session(run, |session| session.is_some() && *session != old).await {
        Some(after) => run.recovered("listener", killed, Some(after.as_secs_f64()), None),
        None => {
            run.recovered("listener", killed, None, Some("no new session".to_owned()));
            run.problem(format!(
                "no new listener session within {:?} of the kill at {:.1}s",
                run.config.recovery_timeout,
                killed.duration_since(run.started).as_secs_f64()
            ));
        }
    }
}

/// Waits until the scale set's session satisfies `condition`; how long that took, `None` after the recovery
/// limit.
async fn wait_session(
    run: &Run<'_>,
    mut condition: impl FnMut(&Option<String>) -> bool,
) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < run.config.recovery_timeout {
        if condition(&run.session()) {
            return Some(start.elapsed());
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
    None
}

enum Progress {
    Changed(Duration),
    /// Nothing changed, and every job is done: no work to show a change.
    Idle,
    TimedOut,
}

/// The EphemeralRunners by uid, with their phase and whether they are being deleted: only the manager changes
/// these (the listener writes job fields only).
async fn runner_fingerprint(world: &World) -> Option<BTreeMap<String, (String, bool)>> {
    let runners = world.ephemeral_runners().await.ok()?;
    Some(
        runners
            .into_iter()
            .map(|er| {
                let deleting = er.metadata.deletion_timestamp.is_some();
                let uid = er.uid().unwrap_or_default();
                let phase = er.status.map(|s| s.phase).unwrap_or_default();
                (uid, (phase, deleting))
            })
            .collect(),
    )
}

/// Waits until the EphemeralRunners change from what they are now (taken as soon as the API server answers).
async fn runner_progress(run: &Run<'_>, since: Instant) -> Progress {
    let limit = run.config.recovery_timeout;
    let mut baseline = None;
    let mut quiet_since_done: Option<Instant> = None;
    while since.elapsed() < limit {
        if let Some(now) = runner_fingerprint(run.world).await {
            match &baseline {
                None => baseline = Some(now),
                Some(before) if *before != now => return Progress::Changed(since.elapsed()),
                Some(_) => {}
            }
        }
        if run.done.is_cancelled() {
            let quiet = *quiet_since_done.get_or_insert_with(Instant::now);
            if quiet.elapsed() >= Duration::from_secs(15) {
                return Progress::Idle;
            }
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
    Progress::TimedOut
}

/// Every `timeout_every`, unless timeouts are above their share of the calls so far, makes one of the manager's
/// endpoints slower than its deadline for `timeout_window`, counting the requests that arrive meanwhile.
async fn faults(run: &Run<'_>) {
    let Some(every) = run.config.timeout_every else {
        return;
    };
    let mut rng = SplitMix64(run.config.seed ^ 0x7469_6d65);
    let latency = run.config.manager_call_timeout() + Duration::from_secs(1);
    loop {
        if run.nap(between(&mut rng, every)).await {
            return;
        }
        if run.paused() {
            continue;
        }
        let calls: u64 = run.world.fake.state().counters().values().sum();
        let budget = calls as f64 * run.config.fault_rate * run.config.timeout_share;
        if run.tally().timeouts as f64 >= budget {
            continue;
        }
        let endpoint =
            TIMEOUT_ENDPOINTS[(rng.next_u64() % TIMEOUT_ENDPOINTS.len() as u64) as usize];
        let seed = rng.next_u64();
        if let Err(error) = set_latency(run, Some((endpoint, latency)), seed).await {
            run.problem(format!("setting a timeout fault: {error}"));
            return;
        }
        let opened = Instant::now();
        let before = run.world.fake.state().count(endpoint);
        tokio::time::sleep(run.config.timeout_window).await;
        // A window no call reached tested nothing: keep it open until one does.
        while run.world.fake.state().count(endpoint) == before
            && opened.elapsed() < TIMEOUT_WINDOW_MAX
            && !run.done.is_cancelled()
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let open = opened.elapsed();
        let during = run.world.fake.state().count(endpoint) - before;
        if let Err(error) = set_latency(run, None, rng.next_u64()).await {
            run.problem(format!("clearing a timeout fault: {error}"));
            return;
        }
        let mut tally = run.tally();
        tally.timeouts += during;
        *tally
            .timeout_windows
            .entry(endpoint.to_owned())
            .or_default() += 1;
        drop(tally);
        run.event(&format!(
            "{endpoint} answered after {:.0}s for {:.1}s: {during} calls timed out",
            latency.as_secs_f64(),
            open.as_secs_f64()
        ));
    }
}

/// Replaces the latency rules, keeping the error rules with what is left of their budgets.
async fn set_latency(
    run: &Run<'_>,
    latency: Option<(&str, Duration)>,
    seed: u64,
) -> std::result::Result<(), fake_actions_service::Rejection> {
    let _one_at_a_time = run.faults.lock().await;
    let state = run.world.fake.state();
    let mut faults = state.faults();
    faults.seed = seed;
    faults.latency = latency
        .map(|(endpoint, delay)| LatencyFault {
            endpoint: Some(endpoint.to_owned()),
            millis: delay.as_millis() as u64,
        })
        .into_iter()
        .collect();
    state.set_faults(faults)
}

/// Every `token_expiry_every`, expires every message-queue and registration token.
async fn token_expiries(run: &Run<'_>) {
    let Some(every) = run.config.token_expiry_every else {
        return;
    };
    let mut rng = SplitMix64(run.config.seed ^ 0x746f_6b65);
    loop {
        if run.nap(between(&mut rng, every)).await {
            return;
        }
        // Held off during the API-server restart, then done at once.
        while run.paused() {
            if run.nap(PROBE_INTERVAL).await {
                return;
            }
        }
        let state = run.world.fake.state();
        let queue = state.expire_tokens(&ExpireTokens {
            kind: TokenKind::MessageQueue,
            session_id: None,
            scale_set_id: None,
            tenant_id: None,
        });
        let registration = state.expire_tokens(&ExpireTokens {
            kind: TokenKind::Registration,
            session_id: None,
            scale_set_id: None,
            tenant_id: None,
        });
        let mut tally = run.tally();
        tally.token_expiries += 1;
        tally.message_queue_tokens += queue as u64;
        tally.registration_tokens += registration as u64;
        drop(tally);
        run.event(&format!(
            "expired {queue} message-queue and {registration} registration tokens"
        ));
    }
}

/// Every `session_drop_every`, drops every session in the fake and measures how long until the listener has
/// one again.
async fn session_drops(run: &Run<'_>) {
    let Some(every) = run.config.session_drop_every else {
        return;
    };
    let mut rng = SplitMix64(run.config.seed ^ 0x7365_7373);
    loop {
        if run.nap(between(&mut rng, every)).await {
            return;
        }
        // A listener being replaced has no session to drop, and measuring both at once would mix them up: wait
        // until it has recovered (and until the API-server restart is over), then drop at once.
        while run.paused() || run.listener_busy.swap(true, Ordering::SeqCst) {
            if run.nap(PROBE_INTERVAL).await {
                return;
            }
        }
        let dropped = run
            .world
            .fake
            .state()
            .drop_sessions(&DropSessions::default());
        let at = Instant::now();
        {
            let mut tally = run.tally();
            tally.session_drops += 1;
            tally.sessions_dropped += dropped as u64;
        }
        run.event(&format!("dropped {dropped} sessions"));
        if dropped > 0 {
            match wait_session(run, Option::is_some).await {
                Some(after) => run.recovered("session", at, Some(after.as_secs_f64()), None),
                None => {
                    run.recovered("session", at, None, Some("no new session".to_owned()));
                    run.problem(format!(
                        "no listener session within {:?} of the drop at {:.1}s",
                        run.config.recovery_timeout,
                        at.duration_since(run.started).as_secs_f64()
                    ));
                }
            }
        }
        run.listener_busy.store(false, Ordering::SeqCst);
    }
}

/// Once `api_restart_after_jobs` jobs are enqueued: holds the disruptions and the feed, lets the set come to
/// rest, restarts kube-apiserver (feeding jobs while it is down when no idle runner could pick them up), and
/// measures how long until it is ready and until the scale set makes progress.
async fn api_restart(run: &Run<'_>) {
    let Some(after_jobs) = run.config.api_restart_after_jobs else {
        return;
    };
    let after_jobs = after_jobs.min(run.config.jobs);
    while run.fed.load(Ordering::SeqCst) < after_jobs {
        if run.nap(PROBE_INTERVAL).await {
            run.restart_done.store(true, Ordering::SeqCst);
            return;
        }
    }
    run.paused.store(true, Ordering::SeqCst);
    run.feed_paused.store(true, Ordering::SeqCst);
    run.event("API-server restart: holding disruptions and jobs until the set is at rest");
    let world = run.world;
    let rest_limit = run.config.recovery_timeout + run.config.recovery_timeout;
    let quiet = async {
        while run.manager_down.load(Ordering::SeqCst) || run.listener_busy.load(Ordering::SeqCst) {
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
        world
            .wait_jobs_completed(&world.enqueued(), rest_limit)
            .await?;
        world
            .wait_idle(run.config.min_runners as usize, rest_limit)
            .await
    };
    if let Err(error) = quiet.await {
        run.problem(format!(
            "the set did not come to rest before the API-server restart: {error}"
        ));
    }
    // Jobs enqueued while the API server is down are acquired by the listener at once; only idle runners could
    // start them meanwhile (and then fail to report it), and at rest there are none when minRunners is 0.
    if run.config.min_runners == 0 {
        run.feed_paused.store(false, Ordering::SeqCst);
    }
    let stopping = Instant::now();
    run.event("restarting kube-apiserver");
    match world.ctx.control_plane.restart_api_server().await {
        Ok(restart) => {
            run.tally().api_server_restarts += 1;
            run.event(&format!(
                "kube-apiserver ready again ({:.1}s to stop, {:.1}s to start)",
                restart.stop.as_secs_f64(),
                restart.start.as_secs_f64()
            ));
            run.recovered(
                "apiServerReady",
                stopping,
                Some(restart.down().as_secs_f64()),
                None,
            );
            run.feed_paused.store(false, Ordering::SeqCst);
            let ready = Instant::now();
            match runner_progress(run, ready).await {
                Progress::Changed(after) => {
                    run.recovered("apiServerProgress", ready, Some(after.as_secs_f64()), None);
                }
                Progress::Idle | Progress::TimedOut => {
                    run.recovered(
                        "apiServerProgress",
                        ready,
                        None,
                        Some("no runner change".to_owned()),
                    );
                    run.problem(format!(
                        "the scale set made no progress within {:?} of the API server's return",
                        run.config.recovery_timeout
                    ));
                }
            }
        }
        Err(error) => run.problem(format!("restarting kube-apiserver: {error}")),
    }
    run.feed_paused.store(false, Ordering::SeqCst);
    run.paused.store(false, Ordering::SeqCst);
    run.restart_done.store(true, Ordering::SeqCst);
}

/// After the disruptions: the listener has a session again, exactly one listener process runs, the manager
/// runs, the rest of the control plane never stopped.
async fn recovered_by_itself(run: &Run<'_>) {
    let world = run.world;
    if let Err(error) = world.wait_listening(run.config.recovery_timeout).await {
        run.problem(format!("the listener did not recover: {error}"));
    }
    let running = world.running_listeners();
    if running.len() != 1 {
        run.problem(format!(
            "expected exactly one listener process, found {running:?}"
        ));
    }
    if let Some(exit) = world.manager_exit() {
        run.problem(format!("the manager is not running: {exit}"));
    }
    let exited = world.ctx.control_plane.exited_components();
    if !exited.is_empty() {
        run.problem(format!("control-plane components exited: {exited:?}"));
    }
}

/// The runner container's environment variable the template change adds.
const TEMPLATE_MARKER: (&str, &str) = ("CHAOS_TEMPLATE", "2");
/// Pods created this long after the template change was seen must run the new template: a pass that started
/// before (its registration call may take the manager's whole call deadline under faults) may still finish.
const TEMPLATE_MARGIN: Duration = Duration::from_secs(10);

/// Every `disrupt_every`, takes a random running runner pod away as a drain would.
async fn disruptions(run: &Run<'_>) {
    let Some(every) = run.config.disrupt_every else {
        return;
    };
    let mut rng = SplitMix64(run.config.seed ^ 0x6472_6169);
    let world = run.world;
    let pods: Api<Pod> = Api::namespaced(world.client(), world.namespace());
    let runners: Api<EphemeralRunner> = Api::namespaced(world.client(), world.namespace());
    // Evictions answered as `kubectl drain` sees them: a refusal (429) comes back instead of being retried.
    let Ok(eviction_client) = world.ctx.control_plane.client_without_retries() else {
        run.event("no client for evictions: no pod is taken away");
        return;
    };
    let evictions: Api<Pod> = Api::namespaced(eviction_client, world.namespace());
    let selector = ListParams::default().labels(&format!(
        "{EPHEMERAL_RUNNER_LABEL}={EPHEMERAL_RUNNER_LABEL_VALUE}"
    ));
    loop {
        if run.nap(between(&mut rng, every)).await {
            return;
        }
        if run.paused() {
            continue;
        }
        let Ok(list) = pods.list(&selector).await else {
            run.tally().pod_takes_without_pod += 1;
            continue;
        };
        let running: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|pod| {
                pod.metadata.deletion_timestamp.is_none()
                    && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
            .collect();
        if running.is_empty() {
            run.tally().pod_takes_without_pod += 1;
            continue;
        }
        // Alternate, counting only the ones that happened: a run with a handful of disruptions (the API-server
        // restart holds them for a while) must still take pods away both ways; a coin flip once gave three
        // evictions and no delete.
        let evict = {
            let tally = run.tally();
            tally.pods_deleted > tally.pods_evicted
        };
        // An eviction goes to a pod without a job label when there is one: the set's disruption budget refuses
        // the others (docs/runner-lifecycle.md), and a run whose evictions all met busy pods took none away.
        let unprotected: Vec<&Pod> = running
            .iter()
            .filter(|pod| !pod.labels().contains_key(JOB_ID_KEY))
            .collect();
        let pool: Vec<&Pod> = if evict && !unprotected.is_empty() {
            unprotected
        } else {
            running.iter().collect()
        };
        let pod = pool[usize::try_from(rng.next_u64() % pool.len() as u64).unwrap_or(0)];
        let name = pod.name_any();
        let busy = runners
            .get_opt(&name)
            .await
            .ok()
            .flatten()
            .is_some_and(|runner| runner.has_job());
        world
            .simulator
            .expect_deletion(&pod.uid().unwrap_or_default());
        let result = if evict {
            evictions
                .evict(&name, &EvictParams::default())
                .await
                .map(drop)
        } else {
            pods.delete(&name, &DeleteParams::default()).await.map(drop)
        };
        match result {
            Ok(()) => {
                let what = if evict { "evicted" } else { "deleted" };
                run.event(&format!(
                    "pod {name} {what} ({})",
                    if busy { "busy" } else { "idle" }
                ));
                let mut tally = run.tally();
                if evict {
                    tally.pods_evicted += 1;
                } else {
                    tally.pods_deleted += 1;
                }
                tally.busy_pods_taken += u32::from(busy);
            }
            // A busy runner's pod is protected by its set's disruption budget (docs/runner-lifecycle.md).
            Err(kube::Error::Api(status)) if evict && status.code == 429 => {
                world
                    .simulator
                    .deletion_refused(&pod.uid().unwrap_or_default());
                run.event(&format!(
                    "eviction of pod {name} refused ({})",
                    if busy { "busy" } else { "idle" }
                ));
                run.tally().evictions_refused += 1;
            }
            Err(error) => {
                run.event(&format!("taking pod {name} away failed: {error}"));
                let mut tally = run.tally();
                tally.pod_takes_failed += 1;
                tally.pod_take_last_error = Some(error.to_string());
            }
        }
    }
}

/// Once `template_change_after_jobs` jobs are enqueued, adds [`TEMPLATE_MARKER`] to the runner container of the
/// AutoscalingRunnerSet, and records when the EphemeralRunnerSet shows it.
async fn template_change(run: &Run<'_>) {
    let Some(after) = run.config.template_change_after_jobs else {
        return;
    };
    while run.fed.load(Ordering::SeqCst) < after {
        if run.nap(Duration::from_millis(250)).await {
            return;
        }
    }
    let world = run.world;
    let sets: Api<AutoscalingRunnerSet> = Api::namespaced(world.client(), world.namespace());
    let (name, value) = TEMPLATE_MARKER;
    let changed = async {
        let set = sets
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .next()
            .ok_or_else(|| Error::Invariant("no AutoscalingRunnerSet to change".to_owned()))?;
        let mut containers = set
            .spec
            .template
            .spec
            .clone()
            .unwrap_or_default()
            .containers;
        for container in containers
            .iter_mut()
            .filter(|container| container.name == RUNNER_CONTAINER_NAME)
        {
            container.env.get_or_insert_with(Vec::new).push(EnvVar {
                name: name.to_owned(),
                value: Some(value.to_owned()),
                ..EnvVar::default()
            });
        }
        sets.patch(
            &set.name_any(),
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "spec": { "template": { "spec": { "containers": containers } } } }),
            ),
        )
        .await?;
        Ok::<_, Error>(())
    };
    if let Err(error) = changed.await {
        run.problem(format!("changing the runner template failed: {error}"));
        return;
    }
    run.event("runner template changed");
    let runner_sets: Api<EphemeralRunnerSet> = Api::namespaced(world.client(), world.namespace());
    let deadline = Instant::now() + run.config.recovery_timeout;
    while Instant::now() < deadline {
        let seen = runner_sets
            .list(&ListParams::default())
            .await
            .is_ok_and(|list| {
                list.items.iter().any(|set| {
                    set.spec
                        .ephemeral_runner_spec
                        .spec
                        .containers
                        .iter()
                        .flat_map(|container| container.env.iter().flatten())
                        .any(|var| var.name == name && var.value.as_deref() == Some(value))
                })
            });
        if seen {
            run.tally().template_changed_at = Some(Timestamp::now());
            return;
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
    run.problem("the runner template change never reached the EphemeralRunnerSet".to_owned());
}

/// Runner pods created after the template change settled, and those of them on the old template (a problem).
fn template_check(run: &Run<'_>) -> (usize, usize) {
    let Some(changed) = run.tally().template_changed_at else {
        return (0, 0);
    };
    let settled = changed + TEMPLATE_MARGIN;
    let (name, value) = TEMPLATE_MARKER;
    let after: Vec<_> = run
        .world
        .simulator
        .pods()
        .into_iter()
        .filter(|pod| pod.created.is_some_and(|created| created > settled))
        .collect();
    let old: Vec<String> = after
        .iter()
        .filter(|pod| pod.runner_env.get(name).map(String::as_str) != Some(value))
        .map(|pod| pod.name.clone())
        .collect();
    if !old.is_empty() {
        run.problem(format!(
            "{} runner pod(s) created after the template change run the old template: {old:?}",
            old.len()
        ));
    }
    (after.len(), old.len())
}

fn secs<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64())
}

fn secs_range<S: serde::Serializer>(
    range: &(Duration, Duration),
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&[range.0.as_secs_f64(), range.1.as_secs_f64()], serializer)
}

fn opt_secs_range<S: serde::Serializer>(
    range: &Option<(Duration, Duration)>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(
        &range.map(|(low, high)| [low.as_secs_f64(), high.as_secs_f64()]),
        serializer,
    )
}
