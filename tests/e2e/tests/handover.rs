//! Two manager replicas with leader election, as the controller chart runs them with `replicaCount: 2` and a rolling
//! update stops them: the leader gets SIGTERM in the middle of a burst and hands over to the other. The leader keeps
//! its Lease until its controllers have stopped and then releases it, so the two never reconcile at once, and the
//! other carries on at once instead of waiting for the Lease to expire (docs/manager-configuration.md,
//! `--enable-leader-election`).
//!
//! A binary of its own: it counts the API server's requests, which a test sharing the control plane would disturb.

use std::time::Duration;

use e2e::checks;
use e2e::simulator::SimulatorConfig;
use e2e::world::{World, WorldConfig};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::json;
use test_harness::requests;

const JOBS: u32 = 40;
const LEASE: &str = "arc-e2e-handover";
/// How long a suite waits for any one condition.
const WAIT: Duration = Duration::from_secs(300);
/// The Lease's duration at the manager's defaults: a hand-over slower than this waited for the Lease to expire
/// instead of taking the one the old leader released.
const LEASE_DURATION: Duration = Duration::from_secs(15);

/// Waits until the Lease is held by the manager process `pid` (its identity is `<host>_<pid>_<start>`).
async fn wait_holder(world: &World, pid: u32) -> Duration {
    let leases: Api<Lease> = Api::namespaced(world.client(), &world.controller_namespace);
    let started = tokio::time::Instant::now();
    let holder = || async {
        let lease = leases.get_opt(LEASE).await?;
        let holder = lease
            .and_then(|lease| lease.spec?.holder_identity)
            .unwrap_or_default();
        Ok((holder.contains(&format!("_{pid}_")), holder))
    };
    if let Err(error) = world
        .eventually(&format!("the Lease held by {pid}"), WAIT, holder)
        .await
    {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_stopped_mid_burst_hands_over_at_once_and_every_job_gets_one_runner() {
    e2e::init_test_tracing();
    let world = World::start(
        "e2e-handover",
        WorldConfig {
            manager_process: true,
            manager_args: vec![
                "--enable-leader-election".to_owned(),
                format!("--leader-election-id={LEASE}"),
            ],
            // Two replicas: the chart then runs them with leader election and grants the Lease.
            controller_values: json!({"replicaCount": 2}),
            simulator: SimulatorConfig {
                job_duration: Duration::from_secs(3),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("starting the world: {e:?}"));
    if let Err(error) = world.wait_listening(WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    // The world's manager leads; the replica, started after it, waits.
    let leader = world.manager_pid().expect("the manager runs as a process");
    wait_holder(&world, leader).await;
    let mut replica = world.start_replica("replica").expect("start the replica");
    let standby = replica.pid().expect("the replica's pid");

    let before = requests::count(&world.client())
        .await
        .expect("the API server's request counts");
    world.enqueue(JOBS).expect("enqueue");
    // The burst under way.
    if let Err(error) = world.wait_jobs_running(5, WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    // SIGTERM, as a rolling update sends it; returns once the process has ended.
    world
        .stop_manager(false)
        .await
        .expect("the leader stops on SIGTERM");
    let handed_over = wait_holder(&world, standby).await;
    eprintln!("hand-over: the replica led {handed_over:?} after the leader ended");
    assert!(
        handed_over < LEASE_DURATION,
        "the replica waited {handed_over:?} for the Lease: the leader did not release it"
    );
    if let Some(exit) = replica.exited() {
        panic!("{exit}");
    }

    if let Err(error) = checks::settle_and_verify(&world, 0, &[], WAIT).await {
        panic!(
            "{error}\n{}\nreplica log:\n{}",
            world.diagnostics().await,
            replica.log_tail(8000)
        );
    }
    let after = requests::count(&world.client())
        .await
        .expect("the API server's request counts");
    let delta = |key: &str| {
        after.get(key).copied().unwrap_or_default() - before.get(key).copied().unwrap_or_default()
    };
    // One runner per job: neither manager made a runner the other had made (both would have, reconciling at once,
    // from caches that had not seen each other's runners), and no create met a name already taken.
    assert_eq!(
        delta("ephemeralrunners POST"),
        u64::from(JOBS),
        "runners created for {JOBS} jobs; counts: {after:?}"
    );
    assert_eq!(
        delta("ephemeralrunners POST (409)"),
        0,
        "runner creates that met a name already taken"
    );
    replica.stop().await.expect("stop the replica");
    world.shutdown().await.expect("shutdown");
}
