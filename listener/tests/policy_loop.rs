//! Scheduled minimums and the scale-down delay in the message loop, against the fake Actions Service over HTTP
//! with an in-memory EphemeralRunnerSet. The fake holds each long poll for 8 s, so a change seen well before a
//! poll ends can only come from the loop waking at the policy's own times (a window boundary, the end of a hold).
//! The same flows with a real API server and runner pods are in the controller's `scaling_policy.rs`.

mod common;

use std::time::Duration;

use common::{RecordingTarget, create_scale_set, eventually, fast_settings, scale_set};
use crds::schedule::MinRunnersSchedule;
use fake_actions_service::{EnqueueJobs, FakeActionsService};
use jiff::{SignedDuration, Timestamp, tz::TimeZone};
use listener::health::Health;
use listener::policy::Policy;
use listener::{MessageLoop, Settings};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Long enough that no poll ends inside the intervals the tests look at.
const LONG_POLL: Duration = Duration::from_secs(8);

async fn fake() -> FakeActionsService {
    FakeActionsService::start(fake_actions_service::Config {
        long_poll_timeout: LONG_POLL,
        seed: Some(11),
        ..fake_actions_service::Config::default()
    })
    .await
    .expect("fake starts")
}

fn settings() -> Settings {
    let mut settings = fast_settings();
    settings.health_limit = Duration::from_secs(60);
    settings
}

/// `HH:MM:SS` in UTC of `now + offset` (whole seconds, rounded up so the time is still ahead).
fn utc_time_in(offset: Duration) -> (String, Timestamp) {
    let at = Timestamp::now()
        .checked_add(SignedDuration::try_from(offset).unwrap() + SignedDuration::from_secs(1))
        .unwrap();
    let at = Timestamp::from_second(at.as_second()).unwrap();
    let zoned = at.to_zoned(TimeZone::UTC);
    (
        format!(
            "{:02}:{:02}:{:02}",
            zoned.hour(),
            zoned.minute(),
            zoned.second()
        ),
        at,
    )
}

async fn wait_until(at: Timestamp) {
    let wait = at.duration_since(Timestamp::now());
    if wait.is_positive() {
        tokio::time::sleep(wait.unsigned_abs()).await;
    }
}

#[tokio::test]
async fn a_window_opens_and_closes_on_time_without_a_message() {
    let fake = fake().await;
    let id = create_scale_set(&fake, "linux").await;
    let (start, opens) = utc_time_in(Duration::from_secs(2));
    let (end, closes) = utc_time_in(Duration::from_secs(5));
    let schedule = MinRunnersSchedule {
        name: "warm".into(),
        min_runners: 2,
        start,
        end,
        ..MinRunnersSchedule::default()
    };
    let policy = Policy::new(vec![schedule.parse(0).unwrap()], 0, 10, Duration::ZERO);
    let target = RecordingTarget::default();
    let loop_ = MessageLoop::new(
        scale_set(&fake, id, 0, 10),
        settings(),
        target.clone(),
        None,
        Health::new(Duration::from_secs(60)),
    )
    .unwrap()
    .with_policy(policy);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(loop_.run(shutdown.clone()));

    assert!(eventually(Duration::from_secs(5), || !target.set_patches().is_empty()).await);
    assert_eq!(target.replicas(), 0, "before the window: minRunners 0");
    wait_until(opens).await;
    let opened = Instant::now();
    assert!(
        eventually(Duration::from_millis(1500), || target.replicas() == 2).await,
        "the warm pool is asked for when the window opens, not at the end of the poll: {:?}",
        target.set_patches()
    );
    assert!(opened.elapsed() < Duration::from_millis(1500));
    assert_eq!(
        fake.state().snapshot().sessions[0].polls,
        1,
        "still inside the first long poll: the change came from the loop's own wake-up, and the poll went on"
    );
    wait_until(closes).await;
    assert!(
        eventually(Duration::from_millis(1500), || {
            target.set_patches().last() == Some(&json!({"spec": {"patchID": 0, "replicas": null}}))
        })
        .await,
        "when the window closes the set is asked to converge to 0 at once (idle runners leave): {:?}",
        target.set_patches()
    );
    assert_eq!(fake.state().snapshot().sessions[0].polls, 1);
    let patches = target.set_patches();
    let up = patches
        .iter()
        .position(|p| p["spec"]["replicas"] == json!(2))
        .unwrap();
    assert_ne!(
        patches[up]["spec"]["patchID"],
        json!(0),
        "opening only scales up"
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_burst_is_kept_for_the_delay_then_the_set_converges_to_the_minimum() {
    let fake = fake().await;
    let id = create_scale_set(&fake, "linux").await;
    let delay = Duration::from_secs(3);
    let policy = Policy::new(Vec::new(), 1, 10, delay);
    let target = RecordingTarget::default();
    let loop_ = MessageLoop::new(
        scale_set(&fake, id, 1, 10),
        settings(),
        target.clone(),
        None,
        Health::new(Duration::from_secs(60)),
    )
    .unwrap()
    .with_policy(policy);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(loop_.run(shutdown.clone()));
    assert!(eventually(Duration::from_secs(5), || target.replicas() == 1).await);

    let jobs = fake
        .state()
        .enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(id),
            count: 3,
            ..EnqueueJobs::default()
        })
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || target.replicas() == 4).await,
        "{:?}",
        target.set_patches()
    );
    let patches_before = target.set_patches().len();
    for job in &jobs {
        fake.state().cancel_job(*job).unwrap();
    }
    // The completion is a message: the step after it keeps the peak.
    assert!(
        eventually(Duration::from_secs(10), || target.set_patches().len()
            > patches_before)
        .await
    );
    let quiet = Instant::now();
    assert_eq!(
        target.replicas(),
        4,
        "held at the peak: {:?}",
        target.set_patches()
    );
    assert!(
        eventually(Duration::from_secs(6), || {
            target.set_patches().last() == Some(&json!({"spec": {"patchID": 0, "replicas": 1}}))
        })
        .await,
        "after the delay the set converges to minRunners: {:?}",
        target.set_patches()
    );
    let held_for = quiet.elapsed();
    assert!(
        held_for >= delay - Duration::from_millis(300),
        "held for {held_for:?}, delay {delay:?}"
    );
    // Nothing in between asked the set to converge (which would have removed idle runners early).
    let patches = target.set_patches();
    let converges_during_hold = patches[patches_before..patches.len() - 1]
        .iter()
        .filter(|p| p["spec"]["patchID"] == json!(0))
        .count();
    assert_eq!(converges_during_hold, 0, "{patches:?}");
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_window_closing_with_a_job_assigned_converges_above_the_minimum() {
    let fake = fake().await;
    let id = create_scale_set(&fake, "linux").await;
    let (start, opens) = utc_time_in(Duration::from_secs(2));
    let (end, closes) = utc_time_in(Duration::from_secs(6));
    let schedule = MinRunnersSchedule {
        min_runners: 2,
        start,
        end,
        ..MinRunnersSchedule::default()
    };
    let policy = Policy::new(vec![schedule.parse(0).unwrap()], 0, 10, Duration::ZERO);
    let target = RecordingTarget::default();
    let loop_ = MessageLoop::new(
        scale_set(&fake, id, 0, 10),
        settings(),
        target.clone(),
        None,
        Health::new(Duration::from_secs(60)),
    )
    .unwrap()
    .with_policy(policy);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(loop_.run(shutdown.clone()));
    wait_until(opens).await;
    assert!(eventually(Duration::from_millis(1500), || target.replicas() == 2).await);
    // A job is assigned (and never started: no runner takes it here).
    fake.state()
        .enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(id),
            count: 1,
            ..EnqueueJobs::default()
        })
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || target.replicas() == 3).await);
    wait_until(closes).await;
    assert!(
        eventually(Duration::from_millis(1500), || {
            target.set_patches().last() == Some(&json!({"spec": {"patchID": 0, "replicas": 1}}))
        })
        .await,
        "the idle runners above minimum + assigned are released at once: {:?}",
        target.set_patches()
    );
    let patches = target.set_patches();
    assert_ne!(
        patches[patches.len() - 2],
        json!({"spec": {"patchID": 0, "replicas": 1}}),
        "the lowered target is announced before the converge"
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
}
