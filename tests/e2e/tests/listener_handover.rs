//! The manager's listener mode (docs/listener-modes.md) with two manager replicas and ten scale sets, jobs
//! running on every set: when the leader stops (SIGTERM, a rolling update) it closes every set's session before it
//! releases the Lease, so the other replica holds a new session for every set within seconds; when the leader dies
//! (SIGKILL, node loss) the next one deletes the sessions the dead one recorded on each AutoscalingListener's
//! status and opens its own once it holds the Lease, without waiting for the service to expire them. No job is
//! lost or served twice.
//!
//! A binary of its own: two manager processes and ten sets are a load a shared control plane would feel.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::checks;
use e2e::simulator::SimulatorConfig;
use e2e::world::{World, WorldConfig};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::json;
use tokio::time::Instant;

const SETS: u32 = 10;
const JOBS_PER_SET: u32 = 4;
const LEASE: &str = "arc-e2e-listener-handover";
/// How long a suite waits for any one condition.
const WAIT: Duration = Duration::from_secs(300);
/// The Lease's duration at the manager's defaults.
const LEASE_DURATION: Duration = Duration::from_secs(15);
/// The targets (issue 34): every set holds a new session this long after a SIGTERM, and this long past the Lease's
/// duration after a SIGKILL.
const AFTER_SIGTERM: Duration = Duration::from_secs(5);
const PAST_THE_LEASE_AFTER_SIGKILL: Duration = Duration::from_secs(5);

fn set_name(index: u32) -> String {
    format!("lh-{index}")
}

/// Every set's session as the fake holds it now (sets without one left out).
fn sessions(world: &World) -> BTreeMap<String, String> {
    world
        .fake
        .state()
        .snapshot()
        .scale_sets
        .into_iter()
        .filter_map(|set| Some((set.name, set.session_id?)))
        .collect()
}

/// Waits until every set holds a session other than the one it had in `before`.
async fn wait_new_sessions(world: &World, before: &BTreeMap<String, String>) {
    let outcome = world
        .eventually("a new session for every set", WAIT, || async {
            let now = sessions(world);
            let renewed = (0..SETS)
                .map(set_name)
                .filter(|set| now.get(set).is_some_and(|id| before.get(set) != Some(id)))
                .count();
            Ok((
                renewed == SETS as usize,
                format!("{renewed} of {SETS} sets: {now:?}"),
            ))
        })
        .await;
    if let Err(error) = outcome {
        panic!("{error}\n{}", world.diagnostics().await);
    }
}

fn enqueue_everywhere(world: &World) {
    for index in 0..SETS {
        world
            .enqueue_to(&set_name(index), JOBS_PER_SET)
            .expect("enqueue");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_move_to_the_next_leader_within_seconds_and_every_job_runs_once() {
    e2e::init_test_tracing();
    let manager_mode = "--listener-mode=manager".to_owned();
    let world = World::start(
        "e2e-lhandover",
        WorldConfig {
            release: set_name(0),
            manager_process: true,
            manager_args: vec![
                "--enable-leader-election".to_owned(),
                format!("--leader-election-id={LEASE}"),
                manager_mode,
            ],
            controller_values: json!({"replicaCount": 2, "flags": {"listenerMode": "manager"}}),
            simulator: SimulatorConfig {
                job_duration: Duration::from_secs(4),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("starting the world: {e:?}"));
    for index in 1..SETS {
        world
            .install_scale_set(&set_name(index), &json!({}))
            .await
            .unwrap_or_else(|e| panic!("installing set {index}: {e:?}"));
    }
    let listening = world
        .eventually("every set listening", WAIT, || async {
            let held = sessions(&world).len();
            Ok((held == SETS as usize, format!("{held} of {SETS} sets")))
        })
        .await;
    if let Err(error) = listening {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    assert!(
        world
            .listener_pods()
            .await
            .expect("listener pods")
            .is_empty(),
        "no listener pod in the manager's listener mode"
    );
    let mut standby = world.start_replica("replica-1").expect("start a replica");

    // A rolling update: SIGTERM to the leader mid-burst.
    enqueue_everywhere(&world);
    // The burst under way.
    if let Err(error) = world.wait_jobs_running(5, WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    let before = sessions(&world);
    let stopping = Instant::now();
    world
        .stop_manager(false)
        .await
        .expect("the leader stops on SIGTERM");
    let closed = stopping.elapsed();
    wait_new_sessions(&world, &before).await;
    let moved = stopping.elapsed();
    eprintln!(
        "SIGTERM: the leader ended after {closed:?}; every set held a new session {moved:?} after the signal"
    );
    assert!(
        moved <= AFTER_SIGTERM,
        "every set held a new session only {moved:?} after the SIGTERM (target {AFTER_SIGTERM:?})"
    );
    if let Some(exit) = standby.exited() {
        panic!("{exit}");
    }

    // Node loss: SIGKILL to the new leader mid-burst, once its sessions are on record (a session created in the
    // leader's last moment, before its record, waits for the service to expire it: docs/listener-modes.md); a third
    // replica takes over once the Lease expires.
    let successor = world.start_replica("replica-2").expect("start a replica");
    let recorded = world
        .eventually("every new session on record", WAIT, || async {
            let held = sessions(&world);
            let on_record: BTreeMap<String, String> = world
                .listeners()
                .await?
                .into_iter()
                .filter_map(|l| {
                    let set = l.spec.autoscaling_runner_set_name.clone();
                    Some((set, l.status?.session?.id))
                })
                .collect();
            Ok((
                held == on_record,
                format!("held {held:?}, on record {on_record:?}"),
            ))
        })
        .await;
    if let Err(error) = recorded {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    enqueue_everywhere(&world);
    let before = sessions(&world);
    let killed = Instant::now();
    standby.kill().await.expect("kill the leader");
    let successor_pid = successor.pid().expect("the successor's pid");
    let leases: Api<Lease> = Api::namespaced(world.client(), &world.controller_namespace);
    let led = world
        .eventually("the Lease held by the successor", WAIT, || async {
            let holder = leases
                .get_opt(LEASE)
                .await?
                .and_then(|lease| lease.spec?.holder_identity)
                .unwrap_or_default();
            Ok((holder.contains(&format!("_{successor_pid}_")), holder))
        })
        .await;
    if let Err(error) = led {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    let leading = killed.elapsed();
    wait_new_sessions(&world, &before).await;
    let moved = killed.elapsed();
    eprintln!(
        "SIGKILL: the successor led {leading:?} after the kill; every set held a new session {moved:?} after it"
    );
    assert!(
        moved <= LEASE_DURATION + PAST_THE_LEASE_AFTER_SIGKILL,
        "every set held a new session only {moved:?} after the SIGKILL (target: the Lease's {LEASE_DURATION:?} + \
         {PAST_THE_LEASE_AFTER_SIGKILL:?})"
    );

    let ids = world.enqueued();
    if let Err(error) = world.wait_jobs_completed(&ids, WAIT).await {
        panic!(
            "{error}\n{}\nsuccessor log:\n{}",
            world.diagnostics().await,
            successor.log_tail(8000)
        );
    }
    let mut problems = checks::jobs_completed_exactly_once(&world, &ids, &[]);
    problems.extend(world.simulator.problems());
    assert!(problems.is_empty(), "{problems:#?}");
    successor.stop().await.expect("stop the successor");
    world.shutdown().await.expect("shutdown");
}
