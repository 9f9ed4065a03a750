//! End-to-end suites: one scale set installed from the objects a default `helm template` of the scale-set chart
//! renders, the manager in-process, the real listener run by the listener-pod executor, and simulated runners,
//! against the local control plane and the fake Actions Service. Every suite ends with
//! [`checks::settle_and_verify`]: every job completed exactly once, back to `minRunners`, no orphan, no runner left
//! in the fake after an uninstall.

use std::time::Duration;

use e2e::checks;
use e2e::simulator::SimulatorConfig;
use e2e::world::{World, WorldConfig};

/// Jobs in the burst suite. 200 fits the CI budget on two cores; `E2E_BURST_JOBS` overrides it.
const BURST_JOBS: u32 = 200;
/// How long a suite waits for any one condition.
const WAIT: Duration = Duration::from_secs(300);

fn burst_jobs() -> u32 {
    std::env::var("E2E_BURST_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(BURST_JOBS)
}

async fn world(prefix: &str, config: WorldConfig) -> World {
    e2e::init_test_tracing();
    let world = World::start(prefix, config)
        .await
        .unwrap_or_else(|e| panic!("starting the world: {e:?}"));
    if let Err(error) = world.wait_listening(WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    world
}

async fn verify(world: World, min_runners: usize, cancelled: &[i64]) {
    if let Err(error) = checks::settle_and_verify(&world, min_runners, cancelled, WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    world.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_jobs_completes_and_the_set_returns_to_min_runners() {
    let world = world(
        "e2e-burst",
        WorldConfig {
            simulator: SimulatorConfig {
                job_duration: Duration::from_secs(2),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        },
    )
    .await;
    let jobs = burst_jobs();
    world.enqueue(jobs).expect("enqueue");
    verify(world, 0, &[]).await;
}
