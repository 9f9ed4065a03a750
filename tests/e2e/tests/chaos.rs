//! The CI-sized chaos run (`docs/reliability.md`): about 150 jobs while the manager and the listener are killed
//! every 5 to 10 s, 5% of the fake's calls fail with a 5xx and some time out, tokens expire and sessions are
//! dropped every 20 to 30 s, runner pods (busy and idle) are deleted or evicted through the API every 4 to 8 s,
//! the runner template changes once, and kube-apiserver is restarted once. A test binary of its own: the restart
//! disturbs everything sharing the control plane.
//!
//! It runs twice, once with GHES's job acquisition and once with github.com's direct assignment.
//! `E2E_CHAOS_JOBS` overrides the number of jobs, `E2E_CHAOS_SEED` the seed of every random choice (42; the report
//! prints it, so a failing run can be repeated), `E2E_CHAOS_JOB_DELIVERY=acquire|direct` runs one mode only, `E2E_CHAOS_VERBOSE=1` prints every disruption (with
//! `--nocapture`); the long form is `cargo run --release -p e2e --bin chaos`.

use e2e::chaos::{self, ChaosConfig};
use fake_actions_service::JobDelivery;

#[tokio::test(flavor = "multi_thread")]
async fn chaos_loses_no_job_and_every_process_recovers_by_itself() {
    e2e::init_test_tracing();
    let mut config = ChaosConfig::ci();
    if let Some(jobs) = std::env::var("E2E_CHAOS_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        config.jobs = jobs;
        config.api_restart_after_jobs = Some(jobs / 2);
    }
    if let Some(seed) = std::env::var("E2E_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        config.seed = seed;
    }
    if std::env::var_os("E2E_CHAOS_VERBOSE").is_some() {
        config.progress = Some(std::time::Duration::from_secs(10));
    }
    // GHES's acquire flow and github.com's direct assignment, one run after the other (two runs at once would
    // share the machine's two cores); `E2E_CHAOS_JOB_DELIVERY=acquire|direct` runs one.
    let deliveries = match std::env::var("E2E_CHAOS_JOB_DELIVERY").as_deref() {
        Ok("acquire") => vec![JobDelivery::Acquire],
        Ok("direct") => vec![JobDelivery::Direct],
        Ok(other) => panic!("E2E_CHAOS_JOB_DELIVERY={other}: expected acquire or direct"),
        Err(_) => vec![JobDelivery::Acquire, JobDelivery::Direct],
    };
    for delivery in deliveries {
        config.job_delivery = delivery;
        run_and_check(&config).await;
    }
}

/// One chaos run with `config`, and what it must show.
async fn run_and_check(config: &ChaosConfig) {
    let prefix = match config.job_delivery {
        JobDelivery::Acquire => "e2e-chaos",
        JobDelivery::Direct => "e2e-chaos-direct",
    };
    let report = match chaos::run_in_new_world(prefix, config).await {
        Ok(report) => report,
        Err(error) => panic!("the chaos run could not be carried out: {error}"),
    };
    println!("{}", report.render());
    println!("{}", serde_json::to_string(&report).unwrap_or_default());
    assert!(
        report.problems.is_empty(),
        "{}\n{}",
        report.render(),
        report.diagnostics.as_deref().unwrap_or("")
    );
    let jobs = config.jobs as usize;
    assert_eq!(report.completed, jobs, "every job completed");
    assert_eq!(
        report.completed_exactly_once, jobs,
        "every job completed exactly once"
    );
    assert_eq!(report.served_twice, 0);
    // The run cannot pass without the disruptions having happened.
    assert!(report.kills_of("manager") >= 1, "{}", report.render());
    assert!(report.kills_of("listener") >= 1, "{}", report.render());
    assert_eq!(report.api_server_restarts, 1, "{}", report.render());
    for kind in ["http500", "http502", "http503", "http504", "timeout"] {
        assert!(
            report.faults.get(kind).copied().unwrap_or(0) >= 1,
            "no {kind} fault was injected: {}",
            report.render()
        );
    }
    assert!(report.token_expiries >= 1, "{}", report.render());
    // Both ways of taking a pod away were tried: a deletion, and the Eviction API (which may answer a busy pod with
    // a refusal, its set's disruption budget).
    assert!(
        report.pods_deleted >= 1 && report.pods_evicted + report.evictions_refused >= 1,
        "{}",
        report.render()
    );
    assert_eq!(report.template_changes, 1, "{}", report.render());
    assert!(
        report.pods_after_template_change >= 1,
        "{}",
        report.render()
    );
    assert_eq!(report.pods_on_old_template, 0, "{}", report.render());
    assert_eq!(report.jit_config_reuses, 0, "{}", report.render());
    assert!(report.session_drops >= 1, "{}", report.render());
    let measured = |kind: &str| report.recovery.get(kind).map_or(0, |s| s.count);
    assert!(
        measured("manager") + measured("managerWhileListenerDown") >= 1,
        "no manager recovery was measured: {}",
        report.render()
    );
    for kind in ["listener", "apiServerReady", "apiServerProgress"] {
        assert!(
            measured(kind) >= 1,
            "no {kind} recovery was measured: {}",
            report.render()
        );
    }
}
