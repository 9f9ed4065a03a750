//! The message loop against the fake Actions Service over HTTP, with an in-memory EphemeralRunnerSet: the
//! scaling protocol, job events, and recovery from every kind of fault. (The same flows against a real API server
//! are in `control_plane.rs`.)

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    RecordingTarget, create_scale_set, eventually, fake_config, fast_settings, online_runner,
    scale_set,
};
use crds::constants::COMPLETED_RUNNERS_ANNOTATION;
use fake_actions_service::{
    DropSessions, EnqueueJobs, ErrorFault, ExpireTokens, FakeActionsService, Faults, JobDelivery,
    TokenKind,
};
use listener::health::Health;
use listener::metrics::{Metrics, ScaleSetIdentity};
use listener::{MessageLoop, Settings};
use pretty_assertions::assert_eq;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

struct Running {
    fake: FakeActionsService,
    scale_set_id: i64,
    target: RecordingTarget,
    metrics: Arc<Metrics>,
    health: Health,
    shutdown: CancellationToken,
    task: JoinHandle<listener::Result<()>>,
}

impl Running {
    async fn start(min: i64, max: u32) -> Self {
        Self::start_with(fake_config(), min, max, fast_settings(), |_, _| {}).await
    }

    /// Starts a fake, creates a scale set, lets `prepare` act on it, then starts the loop.
    async fn start_with(
        config: fake_actions_service::Config,
        min: i64,
        max: u32,
        settings: Settings,
        prepare: impl FnOnce(&FakeActionsService, i64),
    ) -> Self {
        let fake = FakeActionsService::start(config)
            .await
            .expect("fake starts");
        let scale_set_id = create_scale_set(&fake, "linux").await;
        prepare(&fake, scale_set_id);
        Self::start_on(fake, scale_set_id, min, max, settings)
    }

    fn start_on(
        fake: FakeActionsService,
        scale_set_id: i64,
        min: i64,
        max: u32,
        settings: Settings,
    ) -> Self {
        let target = RecordingTarget::default();
        let spec = scale_set(&fake, scale_set_id, min, max);
        let identity = ScaleSetIdentity::new(&spec.github, "ns", "set");
        let metrics = Arc::new(Metrics::new(identity, None).expect("metrics"));
        let health = Health::new(settings.health_limit);
        let message_loop = MessageLoop::new(
            spec,
            settings,
            target.clone(),
            Some(Arc::clone(&metrics)),
            health.clone(),
        )
        .expect("loop builds");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(message_loop.run(shutdown.clone()));
        Self {
            fake,
            scale_set_id,
            target,
            metrics,
            health,
            shutdown,
            task,
        }
    }

    fn enqueue(&self, count: u32) -> Vec<i64> {
        self.fake
            .state()
            .enqueue_jobs(&EnqueueJobs {
                scale_set_id: Some(self.scale_set_id),
                count,
                ..EnqueueJobs::default()
            })
            .expect("enqueued")
    }

    async fn wait_replicas(&self, replicas: i64, why: &str) {
        let reached = eventually(WAIT, || self.target.replicas() == replicas).await;
        assert!(
            reached,
            "{why}: replicas stayed {} instead of {replicas}; patches: {:?}",
            self.target.replicas(),
            self.target.set_patches()
        );
    }

    /// Brings runners `names` online, enqueues as many jobs, and waits until the set is scaled for them and each
    /// job has reached a runner.
    async fn assign_to_online_runners(&self, names: &[&str]) -> Vec<i64> {
        for name in names {
            online_runner(&self.fake, self.scale_set_id, name).await;
        }
        let count = u32::try_from(names.len()).expect("a few runners");
        let jobs = self.enqueue(count);
        self.wait_replicas(i64::from(count), "jobs assigned").await;
        let assigned = eventually(WAIT, || {
            jobs.iter()
                .all(|id| self.fake.state().job(*id).unwrap().runner_name.is_some())
        })
        .await;
        assert!(assigned, "every job reaches a runner");
        jobs
    }

    fn assert_running(&self) {
        assert!(!self.task.is_finished(), "the loop must not end");
    }

    async fn stop(self) -> FakeActionsService {
        self.shutdown.cancel();
        let outcome = tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("the loop stops promptly")
            .expect("the loop task does not panic");
        assert!(
            outcome.is_ok(),
            "shutdown is not an error: {:?}",
            outcome.err()
        );
        self.fake
    }
}

fn patch_ids(patches: &[serde_json::Value]) -> Vec<i64> {
    patches
        .iter()
        .map(|p| {
            p["spec"]["patchID"]
                .as_i64()
                .expect("patchID is always sent")
        })
        .collect()
}

#[tokio::test]
async fn scales_with_assigned_jobs_and_back_to_min() {
    let running = Running::start(1, 10).await;
    running.wait_replicas(1, "initial patch").await;
    assert_eq!(
        running.target.set_patches()[0],
        json!({"spec": {"patchID": 0, "replicas": 1}}),
        "the first patch converges to min"
    );
    let jobs = running.enqueue(3);
    running.wait_replicas(4, "min + 3 assigned").await;
    let session = &running.fake.state().snapshot().sessions[0];
    assert_eq!(session.last_max_capacity, Some(10), "capacity header");
    assert!(
        jobs.iter()
            .all(|id| running.fake.state().job(*id).unwrap().times_acquired == 1),
        "every offered job acquired once"
    );

    for id in &jobs {
        running.fake.state().cancel_job(*id).expect("cancel");
    }
    running.wait_replicas(1, "back to min").await;
    // After the jobs completed (dirty) the patch carries a sequence number; once quiet, the next is 0.
    let converged = eventually(WAIT, || {
        let patches = running.target.set_patches();
        let last = patches.last().cloned().unwrap_or_default();
        last == json!({"spec": {"patchID": 0, "replicas": 1}}) && patches.len() > 3
    })
    .await;
    assert!(converged, "patches: {:?}", running.target.set_patches());
    let patches = running.target.set_patches();
    let ids = patch_ids(&patches);
    let scale_up = patches
        .iter()
        .position(|p| p["spec"]["replicas"] == json!(4))
        .unwrap();
    assert_ne!(ids[scale_up], 0, "scale-up patches carry a sequence value");
    let back_to_min = patches
        .iter()
        .position(|p| p["spec"]["replicas"] == json!(1) && p != &patches[0])
        .unwrap();
    assert!(back_to_min > scale_up);
    assert_ne!(
        ids[patches
            .iter()
            .rposition(|p| p["spec"]["replicas"] != json!(1))
            .unwrap()
            + 1],
        0,
        "the first step after the jobs completed is dirty, so not a converge"
    );
    // Sequence values only grow (0s aside).
    let nonzero: Vec<i64> = ids.into_iter().filter(|id| *id != 0).collect();
    assert!(nonzero.windows(2).all(|w| w[0] < w[1]), "{nonzero:?}");
    running.stop().await;
}

#[tokio::test]
async fn max_runners_caps_and_zero_min_sends_null_replicas() {
    let running = Running::start(0, 2).await;
    let reached = eventually(WAIT, || !running.target.set_patches().is_empty()).await;
    assert!(reached);
    assert_eq!(
        running.target.set_patches()[0],
        json!({"spec": {"patchID": 0, "replicas": null}}),
        "target 0 removes the field"
    );
    running.enqueue(5);
    running.wait_replicas(2, "capped at max").await;
    running.assert_running();
    running.stop().await;
}

#[tokio::test]
async fn a_started_job_is_scaled_for_before_its_runner_is_patched() {
    // The statistics of a message age while it is handled; the ERS patch goes first so that runners finishing
    // meanwhile are not replaced by runners for jobs that are already done.
    let running = Running::start_with(fake_config(), 0, 5, fast_settings(), |_, _| {}).await;
    online_runner(&running.fake, running.scale_set_id, "runner-a").await;
    let job = running.enqueue(1)[0];
    running.wait_replicas(1, "one job assigned").await;
    let assigned = eventually(WAIT, || {
        running
            .fake
            .state()
            .job(job)
            .unwrap()
            .runner_name
            .as_deref()
            == Some("runner-a")
    })
    .await;
    assert!(assigned, "{:?}", running.fake.state().job(job));
    // Let the assignment's own patch land before the start.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let set_patches_before = running
        .target
        .with(|r| r.calls.iter().filter(|c| *c == "set").count());
    running.fake.state().start_job(job).expect("start");
    let patched = eventually(WAIT, || !running.target.runner_patches().is_empty()).await;
    assert!(patched, "no EphemeralRunner patch");
    let calls = running.target.with(|r| r.calls.clone());
    let first_runner = calls
        .iter()
        .position(|c| c == "runner:runner-a")
        .expect("the runner patch is recorded");
    let set_patches_first = calls[..first_runner].iter().filter(|c| *c == "set").count();
    assert!(
        set_patches_first > set_patches_before,
        "the JobStarted message's ERS patch must precede the runner's status patch: {calls:?}"
    );
    running.stop().await;
}

/// What a patch of the EphemeralRunnerSet says about the completed runners: `None` when it leaves the annotation
/// alone, `Some("")` when it removes it, else the names (each entry also carries the registration its job ran
/// under, which must be a real one).
fn listing(patch: &serde_json::Value) -> Option<String> {
    match patch["metadata"]["annotations"].get(COMPLETED_RUNNERS_ANNOTATION)? {
        serde_json::Value::String(value) => {
            let entries = crds::listing::parse(value);
            assert!(
                entries.iter().all(|entry| entry.runner_id != 0),
                "every entry names its registration: {value}"
            );
            let names: Vec<&str> = entries.iter().map(|entry| entry.name.as_str()).collect();
            Some(names.join(","))
        }
        _ => Some(String::new()),
    }
}

#[tokio::test]
async fn completed_runners_are_listed_until_the_set_has_acted_on_a_patch_listing_them() {
    let running = Running::start(0, 5).await;
    let jobs = running
        .assign_to_online_runners(&["runner-a", "runner-b"])
        .await;
    for job in &jobs {
        running.fake.state().start_job(*job).expect("start");
    }
    assert!(
        running
            .target
            .set_patches()
            .iter()
            .all(|p| listing(p).is_none()),
        "ARC's patch, unchanged, while no job has completed"
    );
    running
        .fake
        .state()
        .finish_job(jobs[0], "succeeded")
        .expect("finish");
    running.wait_replicas(1, "one job done").await;
    let lists = |names: &str| {
        let names = names.to_owned();
        move |patch: &serde_json::Value| listing(patch).as_deref() == Some(names.as_str())
    };
    assert!(
        running.target.set_patches().iter().any(lists("runner-a")),
        "the patch after the completion lists its runner: {:?}",
        running.target.set_patches()
    );
    // Without an acknowledgement the name stays in every patch.
    running
        .fake
        .state()
        .finish_job(jobs[1], "succeeded")
        .expect("finish");
    running.wait_replicas(0, "both jobs done").await;
    assert!(
        running
            .target
            .set_patches()
            .iter()
            .any(lists("runner-a,runner-b")),
        "{:?}",
        running.target.set_patches()
    );
    // The set's controller acts on the latest patch (records its generation): the listener learns it from the
    // next patch's answer, and the patch after that lists nothing and removes the annotation, once.
    running
        .target
        .with(|r| r.applied_generation = Some(r.generation));
    let before = running.target.set_patches().len();
    running.enqueue(1);
    let removed = eventually(WAIT, || {
        running.target.set_patches()[before..].iter().any(lists(""))
    })
    .await;
    let patches = running.target.set_patches();
    assert!(removed, "the listing is removed: {patches:?}");
    let first_removal = patches.iter().position(lists("")).unwrap_or_default();
    assert!(
        patches[first_removal + 1..]
            .iter()
            .all(|p| listing(p).is_none()),
        "then left alone: {patches:?}"
    );
    running.stop().await;
}

#[tokio::test]
async fn job_started_patches_the_runner_and_completion_scales_down() {
    let running = Running::start_with(fake_config(), 0, 5, fast_settings(), |_, _| {}).await;
    online_runner(&running.fake, running.scale_set_id, "runner-a").await;
    let job = running.enqueue(1)[0];
    running.wait_replicas(1, "one job assigned").await;
    let assigned = eventually(WAIT, || {
        running
            .fake
            .state()
            .job(job)
            .unwrap()
            .runner_name
            .as_deref()
            == Some("runner-a")
    })
    .await;
    assert!(assigned, "{:?}", running.fake.state().job(job));
    running.fake.state().start_job(job).expect("start");
    let patched = eventually(WAIT, || !running.target.runner_patches().is_empty()).await;
    assert!(patched, "no EphemeralRunner patch");
    let view = running.fake.state().job(job).unwrap();
    let (name, patch) = running.target.runner_patches()[0].clone();
    assert_eq!(name, "runner-a");
    assert_eq!(
        patch,
        json!({"status": {
            "jobRequestId": job,
            "jobRepositoryName": format!("{}/{}", view.owner, view.repository),
            "jobId": view.job_id,
            "workflowRunId": view.workflow_run_id,
            "jobWorkflowRef": view.workflow_ref,
            "jobDisplayName": "job-1",
        }})
    );
    running
        .fake
        .state()
        .finish_job(job, "succeeded")
        .expect("finish");
    running.wait_replicas(0, "job done").await;
    let text = running.metrics.encode(0.0).unwrap();
    assert!(text.contains("gha_started_jobs_total{"), "{text}");
    assert!(text.contains("job_result=\"succeeded\"} 1"), "{text}");
    running.stop().await;
}

#[tokio::test]
async fn dropped_session_is_replaced_within_30s_with_production_backoff() {
    let settings = Settings {
        http: common::fast_http(),
        ..Settings::default()
    };
    let running = Running::start_with(fake_config(), 1, 10, settings, |_, _| {}).await;
    running.wait_replicas(1, "initial").await;
    let first = running.fake.state().snapshot().sessions[0].id.clone();
    let polls_before = running.fake.state().count("get_message");
    assert_eq!(
        running.fake.state().drop_sessions(&DropSessions::default()),
        1
    );
    let dropped_at = Instant::now();
    running.enqueue(2);
    running.wait_replicas(3, "jobs after the drop").await;
    assert!(
        dropped_at.elapsed() < Duration::from_secs(30),
        "resumed after {:?}",
        dropped_at.elapsed()
    );
    let sessions = running.fake.state().snapshot().sessions;
    assert_eq!(sessions.len(), 1);
    assert_ne!(sessions[0].id, first, "a new session");
    assert!(running.fake.state().count("get_message") > polls_before);
    running.assert_running();
    running.stop().await;
}

/// github.com assigns jobs to the scale set directly: the loop scales on `JobAssigned` alone and acquires nothing.
#[tokio::test]
async fn jobs_assigned_directly_scale_the_set_without_an_acquire() {
    let config = fake_actions_service::Config {
        job_delivery: JobDelivery::Direct,
        ..fake_config()
    };
    let running = Running::start_with(config, 0, 10, fast_settings(), |_, _| {}).await;
    let reached = eventually(WAIT, || !running.target.set_patches().is_empty()).await;
    assert!(reached);
    running.enqueue(3);
    running.wait_replicas(3, "three jobs assigned").await;
    assert_eq!(
        running.fake.state().count("acquire_jobs"),
        0,
        "nothing to acquire"
    );
    running.assert_running();
    running.stop().await;
}

/// An acquisition that fails after its offer was acknowledged is made again by the listener itself: the service is
/// not relied on to offer the job again (this fake, set so, never does).
#[tokio::test]
async fn a_failed_acquire_is_made_again_without_the_service_offering_the_job_again() {
    let config = fake_actions_service::Config {
        reoffer_to_new_sessions: false,
        ..fake_config()
    };
    let running = Running::start_with(config, 0, 10, fast_settings(), |_, _| {}).await;
    let reached = eventually(WAIT, || !running.target.set_patches().is_empty()).await;
    assert!(reached);
    running
        .fake
        .state()
        .set_faults(Faults {
            errors: vec![ErrorFault {
                endpoint: Some("acquire_jobs".into()),
                status: 500,
                rate: 1.0,
                count: None,
                retry_after_secs: None,
            }],
            ..Faults::default()
        })
        .unwrap();
    let jobs = running.enqueue(1);
    let failed = eventually(WAIT, || {
        running
            .metrics
            .encode(0.0)
            .unwrap()
            .contains(r#"operation="acquire_jobs"}"#)
    })
    .await;
    assert!(failed, "the acquisition failed beyond its in-place retries");
    running.fake.state().clear_faults();
    running.wait_replicas(1, "the job acquired after all").await;
    assert_eq!(running.fake.state().job(jobs[0]).unwrap().times_acquired, 1);
    running.assert_running();
    running.stop().await;
}

#[tokio::test]
async fn server_error_bursts_and_resets_do_not_end_the_loop() {
    let running = Running::start(0, 10).await;
    let reached = eventually(WAIT, || !running.target.set_patches().is_empty()).await;
    assert!(reached);
    running
        .fake
        .state()
        .set_faults(Faults {
            errors: vec![
                ErrorFault {
                    endpoint: Some("get_message".into()),
                    status: 503,
                    rate: 1.0,
                    count: Some(8),
                    retry_after_secs: None,
                },
                ErrorFault {
                    endpoint: Some("acquire_jobs".into()),
                    status: 500,
                    rate: 1.0,
                    count: Some(4),
                    retry_after_secs: None,
                },
                ErrorFault {
                    endpoint: Some("delete_message".into()),
                    status: 502,
                    rate: 1.0,
                    count: Some(4),
                    retry_after_secs: None,
                },
            ],
            ..Faults::default()
        })
        .unwrap();
    let jobs = running.enqueue(3);
    running
        .wait_replicas(3, "scale-up through the faults")
        .await;
    assert!(
        jobs.iter()
            .all(|id| running.fake.state().job(*id).unwrap().times_acquired == 1)
    );
    assert!(
        running
            .fake
            .state()
            .faults()
            .errors
            .iter()
            .all(|f| f.count == Some(0)),
        "every fault was hit: {:?}",
        running.fake.state().faults()
    );
    let text = running.metrics.encode(0.0).unwrap();
    assert!(
        text.contains(r#"severity="transient",operation="get_message"}"#),
        "{text}"
    );
    running.assert_running();
    running.stop().await;
}

#[tokio::test]
async fn token_expiry_and_refresh_404_are_survived() {
    let running = Running::start(0, 10).await;
    let reached = eventually(WAIT, || !running.target.set_patches().is_empty()).await;
    assert!(reached);
    // Queue token: the client refreshes the session and carries on.
    running.fake.state().expire_tokens(&ExpireTokens {
        kind: TokenKind::MessageQueue,
        session_id: None,
        scale_set_id: None,
        tenant_id: None,
    });
    running.enqueue(1);
    running.wait_replicas(1, "after queue token expiry").await;
    // Admin token revoked: the refresh is refused until a new client fetches a new one.
    running.fake.state().expire_tokens(&ExpireTokens {
        kind: TokenKind::Admin,
        session_id: None,
        scale_set_id: None,
        tenant_id: None,
    });
    running.fake.state().expire_tokens(&ExpireTokens {
        kind: TokenKind::MessageQueue,
        session_id: None,
        scale_set_id: None,
        tenant_id: None,
    });
    running.enqueue(1);
    running.wait_replicas(2, "after admin token expiry").await;
    // 404 on refresh: the session is replaced.
    running
        .fake
        .state()
        .set_faults(Faults {
            errors: vec![ErrorFault {
                endpoint: Some("refresh_session".into()),
                status: 404,
                rate: 1.0,
                count: Some(1),
                retry_after_secs: None,
            }],
            ..Faults::default()
        })
        .unwrap();
    running.fake.state().expire_tokens(&ExpireTokens {
        kind: TokenKind::MessageQueue,
        session_id: None,
        scale_set_id: None,
        tenant_id: None,
    });
    running.enqueue(1);
    running.wait_replicas(3, "after a 404 on refresh").await;
    assert!(running.fake.state().count("create_session") >= 2);
    running.assert_running();
    running.stop().await;
}

#[tokio::test]
async fn kubernetes_errors_are_retried_and_no_scale_up_is_lost() {
    let running = Running::start(0, 10).await;
    let reached = eventually(WAIT, || !running.target.set_patches().is_empty()).await;
    assert!(reached);
    // More failures than the in-place retry budget absorbs, so the loop backs off and re-sends the patch.
    running.target.with(|r| {
        r.fail_set_patches = 30;
        r.fail_runner_patches = 8;
    });
    online_runner(&running.fake, running.scale_set_id, "runner-b").await;
    let job = running.enqueue(2)[0];
    let assigned = eventually(WAIT, || {
        running.fake.state().job(job).unwrap().runner_name.is_some()
    })
    .await;
    assert!(assigned);
    running.fake.state().start_job(job).expect("start");
    running
        .wait_replicas(2, "scale-up after the API server recovered")
        .await;
    let patched = eventually(WAIT, || {
        running
            .target
            .runner_patches()
            .iter()
            .any(|(name, _)| name == "runner-b")
    })
    .await;
    assert!(patched, "the EphemeralRunner patch was retried");
    let patches = running.target.set_patches();
    let first_after_failures = patches
        .iter()
        .position(|p| p["spec"]["replicas"] == json!(2))
        .unwrap();
    assert_ne!(
        patches[first_after_failures]["spec"]["patchID"],
        json!(0),
        "a re-sent patch never converges"
    );
    let text = running.metrics.encode(0.0).unwrap();
    assert!(
        text.contains(r#"severity="transient",operation="patch_ephemeral_runner_set"}"#),
        "{text}"
    );
    running.assert_running();
    running.stop().await;
}

#[tokio::test]
async fn fatal_errors_back_off_and_recover() {
    let running = Running::start_with(fake_config(), 0, 10, fast_settings(), |fake, _| {
        fake.state()
            .set_faults(Faults {
                errors: vec![ErrorFault {
                    endpoint: Some("create_session".into()),
                    status: 403,
                    rate: 1.0,
                    count: Some(3),
                    retry_after_secs: None,
                }],
                ..Faults::default()
            })
            .unwrap();
    })
    .await;
    let flagged = eventually(WAIT, || {
        running
            .metrics
            .encode(0.0)
            .unwrap()
            .contains(r#"gha_listener_fatal_error{name="set",namespace="ns"} 1"#)
    })
    .await;
    assert!(flagged, "the fatal gauge is raised while backing off");
    assert!(running.health.is_healthy(), "backing off is not a hang");
    running.enqueue(1);
    running.wait_replicas(1, "after the 403s stopped").await;
    let cleared = eventually(WAIT, || {
        running
            .metrics
            .encode(0.0)
            .unwrap()
            .contains(r#"gha_listener_fatal_error{name="set",namespace="ns"} 0"#)
    })
    .await;
    assert!(cleared);
    assert_eq!(running.fake.state().count("create_session"), 4);
    let text = running.metrics.encode(0.0).unwrap();
    assert!(
        text.contains(r#"gha_listener_errors_total{name="set",namespace="ns",severity="fatal",operation="create_session"} 3"#),
        "{text}"
    );
    running.stop().await;
}

#[tokio::test]
async fn an_old_session_conflict_is_waited_out() {
    // A previous listener's session is still registered: creation gets 409 until the service forgets it.
    let fake = FakeActionsService::start(fake_config()).await.unwrap();
    let id = create_scale_set(&fake, "linux").await;
    let stale = common::client(&fake)
        .create_message_session(id, "previous-pod")
        .await
        .expect("stale session");
    let started = Instant::now();
    let running = Running::start_on(fake, id, 1, 10, fast_settings());
    running
        .wait_replicas(1, "after the old session expired")
        .await;
    assert!(started.elapsed() < Duration::from_secs(30));
    let sessions = running.fake.state().snapshot().sessions;
    assert_eq!(sessions.len(), 1);
    assert_ne!(sessions[0].id, stale.session_id.to_string());
    assert!(running.fake.state().count("create_session") >= 3);
    running.stop().await;
}

#[tokio::test]
async fn jobs_queued_while_no_listener_ran_are_served() {
    // One job offered and never acquired, two acquired by a listener that then died.
    let fake = FakeActionsService::start(fake_config()).await.unwrap();
    let id = create_scale_set(&fake, "linux").await;
    let client = common::client(&fake);
    let previous = client
        .message_session(id, "previous-pod")
        .await
        .expect("session");
    let acquired = fake
        .state()
        .enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(id),
            count: 2,
            ..EnqueueJobs::default()
        })
        .unwrap();
    previous.acquire_jobs(&acquired).await.expect("acquire");
    previous.close().await.expect("closed");
    fake.state()
        .enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(id),
            count: 1,
            ..EnqueueJobs::default()
        })
        .unwrap();
    let running = Running::start_on(fake, id, 0, 10, fast_settings());
    // The first patch already follows the session statistics.
    let first = eventually(WAIT, || !running.target.set_patches().is_empty()).await;
    assert!(first);
    assert_eq!(
        running.target.set_patches()[0],
        json!({"spec": {"patchID": 0, "replicas": 2}})
    );
    running
        .wait_replicas(3, "the queued job is acquired too")
        .await;
    running.stop().await;
}

#[tokio::test]
async fn shutdown_deletes_the_session() {
    let running = Running::start(0, 10).await;
    let reached = eventually(WAIT, || running.fake.state().snapshot().sessions.len() == 1).await;
    assert!(reached);
    // Cancel while a long poll is in flight.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fake = running.stop().await;
    assert!(fake.state().snapshot().sessions.is_empty());
    assert_eq!(fake.state().count("delete_session"), 1);
}

#[tokio::test]
async fn failing_runner_patches_are_queued_without_stalling_scaling() {
    let settings = Settings {
        runner_patch_attempts: 1000,
        ..fast_settings()
    };
    let running = Running::start_with(fake_config(), 0, 10, settings, |_, _| {}).await;
    let jobs = running
        .assign_to_online_runners(&["r-1", "r-2", "r-3"])
        .await;
    running.target.with(|r| r.fail_runner_patches = u32::MAX);
    for id in &jobs {
        running.fake.state().start_job(*id).unwrap();
    }
    // The loop keeps polling and scaling while every status patch fails.
    let polls = running.fake.state().count("get_message");
    let more_polls = eventually(Duration::from_secs(10), || {
        running.fake.state().count("get_message") >= polls + 3
    })
    .await;
    assert!(
        more_polls,
        "the loop stalled on failing EphemeralRunner patches"
    );
    running.target.with(|r| r.fail_runner_patches = 0);
    let all = eventually(WAIT, || {
        let mut names: Vec<String> = running
            .target
            .runner_patches()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        names.sort();
        names.dedup();
        names == ["r-1", "r-2", "r-3"]
    })
    .await;
    assert!(all, "{:?}", running.target.runner_patches());
    running.assert_running();
    running.stop().await;
}

/// Patches that do not raise the target wait up to the coalescing window and go as one (the listener's default;
/// the other tests patch after every message, as ARC does): jobs that start one message after another cost the
/// API server one patch, not one each, and the set ends right.
#[tokio::test]
async fn patches_after_job_events_are_joined_and_raises_go_at_once() {
    let settings = Settings {
        patch_coalesce_window: Duration::from_secs(1),
        ..fast_settings()
    };
    let running = Running::start_with(fake_config(), 0, 20, settings, |_, _| {}).await;
    running.wait_replicas(0, "initial patch").await;
    let jobs = running
        .assign_to_online_runners(&["r-1", "r-2", "r-3", "r-4", "r-5"])
        .await;
    let messages = |running: &Running| running.fake.state().count("delete_message");
    // Let the assignments' messages be handled and their patch go.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (patches_before, messages_before) =
        (running.target.set_patches().len(), messages(&running));
    for id in &jobs {
        let before = messages(&running);
        running.fake.state().start_job(*id).expect("start");
        // Each its own message: the loop acknowledges one before the next job starts.
        let acked = eventually(WAIT, || messages(&running) > before).await;
        assert!(acked, "the start's message is acknowledged");
    }
    let start_messages = messages(&running) - messages_before;
    let start_patches = running.target.set_patches().len() - patches_before;
    assert!(start_messages >= 5, "{start_messages} messages");
    assert!(
        start_patches < start_messages as usize,
        "{start_patches} patches for {start_messages} messages: {:?}",
        running.target.set_patches()
    );
    // The waiting patch goes within the window, with the same target.
    let flushed = eventually(WAIT, || {
        running.target.set_patches().len() > patches_before + start_patches
    })
    .await;
    assert!(flushed, "{:?}", running.target.set_patches());
    assert_eq!(running.target.replicas(), 5);
    // A job that ends lowers the target: its patch may wait for the window, and then goes.
    running
        .fake
        .state()
        .finish_job(jobs[0], "succeeded")
        .expect("finish");
    running.wait_replicas(4, "one job done").await;
    let ids = patch_ids(&running.target.set_patches());
    let nonzero: Vec<i64> = ids.into_iter().filter(|id| *id != 0).collect();
    assert!(nonzero.windows(2).all(|w| w[0] < w[1]), "{nonzero:?}");
    running.stop().await;
}
