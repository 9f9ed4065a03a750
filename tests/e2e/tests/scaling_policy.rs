//! Scheduled minimums and the scale-down delay (issue 19) end to end: the scale-set chart's objects, the manager
//! in-process, the real listener run by the listener-pod executor and simulated runners, against the local
//! control plane and the fake Actions Service (whose long polls last 10 s here). Each suite ends with
//! [`checks::settle_and_verify`]: every job completed exactly once, back to the minimum, no orphan.

use std::time::Duration;

use crds::AutoscalingRunnerSet;
use e2e::checks;
use e2e::simulator::SimulatorConfig;
use e2e::world::{World, WorldConfig};
use k8s_openapi::jiff::{SignedDuration, Timestamp, tz::TimeZone};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(300);

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

async fn fail(world: &World, what: impl std::fmt::Display) -> ! {
    panic!("{what}\n{}", world.diagnostics().await)
}

/// `HH:MM:SS` in UTC, about `offset` from now (whole seconds, rounded up).
fn utc_time_in(offset: Duration) -> (String, Timestamp) {
    let at = Timestamp::now()
        .checked_add(SignedDuration::try_from(offset).unwrap() + SignedDuration::from_secs(1))
        .unwrap();
    let at = Timestamp::from_second(at.as_second()).unwrap();
    let z = at.to_zoned(TimeZone::UTC);
    (
        format!("{:02}:{:02}:{:02}", z.hour(), z.minute(), z.second()),
        at,
    )
}

async fn sleep_until(at: Timestamp) {
    let wait = at.duration_since(Timestamp::now());
    if wait.is_positive() {
        tokio::time::sleep(wait.unsigned_abs()).await;
    }
}

/// Runners not being deleted, and how many of them have a job (`usize::MAX` runners when the list failed: a
/// loaded API server may drop a request, and the callers poll again).
async fn runners(world: &World) -> (usize, usize) {
    let Ok(ers) = world.ephemeral_runners().await else {
        return (usize::MAX, 0);
    };
    let live: Vec<_> = ers
        .iter()
        .filter(|er| er.metadata.deletion_timestamp.is_none())
        .collect();
    let busy = live
        .iter()
        .filter(|er| er.status.as_ref().is_some_and(|s| !s.job_id.is_empty()))
        .count();
    (live.len(), busy)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_window_warms_the_pool_before_any_job_and_its_end_removes_only_idle_runners() {
    let world = world(
        "e2e-window",
        WorldConfig {
            values: json!({"minRunners": 0, "maxRunners": 6}),
            simulator: SimulatorConfig {
                job_duration: Duration::from_secs(60),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        },
    )
    .await;
    // The window: opens 30 s from now (time for the listener to restart with it), lasts 45 s.
    let (start, opens) = utc_time_in(Duration::from_secs(30));
    let (end, closes) = utc_time_in(Duration::from_secs(75));
    let sets: Api<AutoscalingRunnerSet> = Api::namespaced(world.client(), world.namespace());
    sets.patch(
        &world.release,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minRunnersSchedules": [
            {"name": "warm", "minRunners": 3, "start": start, "end": end}
        ]}})),
    )
    .await
    .expect("add the schedule");

    // Before the window: no runner.
    sleep_until(opens.checked_sub(SignedDuration::from_secs(2)).unwrap()).await;
    let (before, _) = runners(&world).await;
    if before != 0 {
        fail(&world, format!("{before} runners before the window opened")).await;
    }
    // The window opens: three idle runners, with no job anywhere.
    if let Err(error) = world.wait_idle(3, Duration::from_secs(40)).await {
        fail(&world, error).await;
    }
    assert!(Timestamp::now() >= opens);
    assert!(
        world.fake.state().snapshot().jobs.is_empty(),
        "the warm pool came before any job"
    );
    let status = sets.get(&world.release).await.unwrap().status.unwrap();
    assert_eq!(status.effective_min_runners, Some(3));
    assert_eq!(status.active_min_runners_schedule.as_deref(), Some("warm"));

    // One long job inside the window; it is still running when the window closes.
    let jobs = world.enqueue(1).expect("enqueue");
    let busy = world
        .eventually("the job running", WAIT, || async {
            let (_, busy) = runners(&world).await;
            Ok((busy == 1, format!("{:?}", world.observe().await?)))
        })
        .await;
    if let Err(error) = busy {
        fail(&world, error).await;
    }
    eprintln!(
        "job running at {}; the window closes at {closes}",
        Timestamp::now()
    );
    sleep_until(closes).await;
    // The window closed: the idle runners leave, the busy one stays until its job is done.
    let closed = world
        .eventually(
            "only the busy runner left",
            Duration::from_secs(30),
            || async {
                let (live, busy) = runners(&world).await;
                let job = world.fake.state().job(jobs[0]);
                let seen = world.observe().await?;
                Ok((
                    live == 1 && busy == 1,
                    format!("live {live}, busy {busy}, job {job:?}, {seen:?}"),
                ))
            },
        )
        .await;
    if let Err(error) = closed {
        fail(&world, error).await;
    }
    let job = world.fake.state().job(jobs[0]).expect("the job");
    assert_eq!(
        job.state,
        fake_actions_service::JobState::Running,
        "the busy runner's job was not disturbed"
    );
    let status = sets.get(&world.release).await.unwrap().status.unwrap();
    assert_eq!(status.effective_min_runners, Some(0));
    assert_eq!(status.active_min_runners_schedule, None);
    if let Err(error) = checks::settle_and_verify(&world, 0, &[], WAIT).await {
        fail(&world, error).await;
    }
    world.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_keeps_its_runners_for_the_delay_then_the_set_returns_to_the_minimum() {
    let delay = Duration::from_secs(30);
    let world = world(
        "e2e-delay",
        WorldConfig {
            values: json!({"minRunners": 1, "maxRunners": 10, "scaleDownDelaySeconds": delay.as_secs()}),
            simulator: SimulatorConfig {
                job_duration: Duration::from_secs(3),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        },
    )
    .await;
    if let Err(error) = world.wait_idle(1, WAIT).await {
        fail(&world, error).await;
    }
    let jobs = world.enqueue(4).expect("enqueue");
    if let Err(error) = world.wait_jobs_completed(&jobs, WAIT).await {
        fail(&world, error).await;
    }
    let quiet = tokio::time::Instant::now();
    // During the delay the runners that finished are replaced by idle ones: the next burst finds five.
    if let Err(error) = world.wait_idle(5, delay - Duration::from_secs(5)).await {
        fail(
            &world,
            format!("the burst's runners were not kept: {error}"),
        )
        .await;
    }
    // A second, smaller burst inside the delay starts at once on the warm runners.
    let second = world.enqueue(2).expect("enqueue");
    if let Err(error) = world.wait_jobs_completed(&second, WAIT).await {
        fail(&world, error).await;
    }
    // Then the delay passes and the set converges to minRunners.
    if let Err(error) = world.wait_idle(1, WAIT).await {
        fail(&world, error).await;
    }
    let held = quiet.elapsed();
    assert!(
        held >= delay,
        "back to the minimum after {held:?}, before the {delay:?} delay"
    );
    if let Err(error) = checks::settle_and_verify(&world, 1, &[], WAIT).await {
        fail(&world, error).await;
    }
    world.shutdown().await.expect("shutdown");
}
