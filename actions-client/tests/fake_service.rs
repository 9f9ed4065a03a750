//! End-to-end tests against the fake Actions Service (`tests/fake-actions-service`): every endpoint's happy path
//! and error mapping, App authentication, the admin-token cache, sessions, injected faults, and the GitHub REST
//! calls for a workflow run's jobs and their re-runs (with one scripted server for the wire details the fake does
//! not show).

mod common;

use std::time::{Duration, Instant};

use actions_client::{
    ActionsClient, ClientOptions, Credentials, ErrorKind, GitHubAppCredentials, GitHubConfig,
    JitSetting, JobMessage, Label, MessageSessionClient, RerunOutcome, RunnerScaleSet,
    RunnerScaleSetMessage, RunnerSetting, SecretString, Timeouts,
};
use common::{MockServer, Reply, pat_client, test_options};
use fake_actions_service::{
    Config, DropSessions, EnqueueJobs, ErrorFault, ExpireTokens, FakeActionsService, Faults,
    GitHubApp, LatencyFault, RunnerSelector, StrictAuth, TokenKind,
};
use pretty_assertions::assert_eq;

fn quick_config() -> Config {
    Config {
        long_poll_timeout: Duration::from_millis(300),
        byte_order_mark: true,
        seed: Some(7),
        ..Config::default()
    }
}

async fn start(config: Config) -> (FakeActionsService, ActionsClient) {
    let fake = FakeActionsService::start(config)
        .await
        .expect("fake starts");
    let client = pat_client(&format!("{}/my-org", fake.base_url()), test_options(3));
    (fake, client)
}

fn new_set(name: &str) -> RunnerScaleSet {
    RunnerScaleSet {
        name: name.into(),
        runner_group_id: 1,
        runner_setting: RunnerSetting {
            disable_update: true,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Polls (acknowledging everything) until `want` has seen what it needs or a few seconds pass.
async fn poll_until(
    session: &MessageSessionClient,
    last_id: &mut i64,
    mut want: impl FnMut(&RunnerScaleSetMessage) -> bool,
) -> Vec<RunnerScaleSetMessage> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        if let Some(message) = session.get_message(*last_id, 10).await.expect("poll") {
            *last_id = message.message_id;
            session
                .delete_message(message.message_id)
                .await
                .expect("ack");
            let done = want(&message);
            seen.push(message);
            if done {
                return seen;
            }
        }
    }
    panic!("condition not met; messages seen: {seen:#?}");
}

#[tokio::test]
async fn scale_set_endpoints_round_trip() {
    let (fake, client) = start(quick_config()).await;
    assert_eq!(
        client.get_runner_scale_set(1, "arc").await.expect("lookup"),
        None
    );

    let created = client
        .create_runner_scale_set(&new_set("arc"))
        .await
        .expect("create");
    assert!(created.id > 0);
    assert_eq!(
        created.labels,
        vec![Label::system("arc")],
        "the name becomes the default label"
    );
    assert!(created.runner_setting.disable_update);
    assert!(!created.runner_group_name.is_empty());

    let by_name = client
        .get_runner_scale_set(1, "arc")
        .await
        .expect("lookup")
        .expect("found");
    assert_eq!(by_name.id, created.id);
    let by_id = client
        .get_runner_scale_set_by_id(created.id)
        .await
        .expect("by id")
        .expect("found");
    assert_eq!(by_id.name, "arc");

    let err = client
        .create_runner_scale_set(&new_set("arc"))
        .await
        .expect_err("duplicate");
    assert!(err.is(ErrorKind::ScaleSetExists), "{err}");

    let renamed = client
        .update_runner_scale_set(
            created.id,
            &RunnerScaleSet {
                name: "arc-2".into(),
                ..Default::default()
            },
        )
        .await
        .expect("rename");
    assert_eq!(renamed.name, "arc-2");
    assert_eq!(renamed.id, created.id);

    let default_group = client
        .get_runner_group_by_name("Default")
        .await
        .expect("default group");
    assert_eq!(default_group.id, 1);
    let err = client
        .get_runner_group_by_name("nope")
        .await
        .expect_err("unknown group");
    assert!(err.is(ErrorKind::RunnerGroupNotFound), "{err}");
    fake.state()
        .add_runner_group("my-org", "gpu")
        .expect("group added");
    let gpu = client
        .get_runner_group_by_name("gpu")
        .await
        .expect("gpu group");
    let moved = client
        .update_runner_scale_set(
            created.id,
            &RunnerScaleSet {
                runner_group_id: gpu.id,
                ..Default::default()
            },
        )
        .await
        .expect("move group");
    assert_eq!(moved.runner_group_id, gpu.id);

    assert_eq!(
        client
            .get_acquirable_jobs(created.id)
            .await
            .expect("acquirable"),
        Vec::new()
    );

    client
        .delete_runner_scale_set(created.id)
        .await
        .expect("delete");
    let err = client
        .get_runner_scale_set_by_id(created.id)
        .await
        .expect_err("gone");
    assert!(err.is(ErrorKind::ScaleSetNotFound), "{err}");
    let err = client
        .delete_runner_scale_set(created.id)
        .await
        .expect_err("gone");
    assert!(err.is(ErrorKind::ScaleSetNotFound), "{err}");
    assert!(
        err.activity_id().is_some() || err.status().is_some(),
        "{err}"
    );

    let err = client
        .create_runner_scale_set(&RunnerScaleSet::default())
        .await
        .expect_err("no name");
    assert!(
        matches!(err, actions_client::Error::InvalidRequest { .. }),
        "{err}"
    );
    assert_eq!(
        fake.state().count("create_scale_set"),
        2,
        "the invalid create was never sent"
    );
}

#[tokio::test]
async fn a_job_flows_through_session_jit_and_runner_endpoints() {
    let (fake, client) = start(quick_config()).await;
    let set = client
        .create_runner_scale_set(&new_set("flow"))
        .await
        .expect("create");
    let session = client
        .message_session(set.id, "listener-1")
        .await
        .expect("session");
    assert!(session.statistics().await.is_some());
    let mut last_id = 0;

    let jobs = fake
        .state()
        .enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(set.id),
            count: 2,
            ..Default::default()
        })
        .expect("enqueue");
    let mut available = Vec::new();
    poll_until(&session, &mut last_id, |m| {
        available.extend(m.available().map(|a| a.job.runner_request_id));
        available.len() >= 2
    })
    .await;
    assert_eq!(available, jobs);
    let acquired = session.acquire_jobs(&available).await.expect("acquire");
    assert_eq!(acquired, jobs);

    let config = client
        .generate_jit_runner_config(
            set.id,
            &JitSetting {
                name: "runner-1".into(),
                work_folder: "_work".into(),
            },
        )
        .await
        .expect("jit");
    let runner = config.runner.clone().expect("runner in response");
    assert_eq!(runner.name, "runner-1");
    assert!(!config.encoded_jit_config.is_empty());
    assert!(!format!("{config:?}").contains(config.encoded_jit_config.expose_secret()));
    let err = client
        .generate_jit_runner_config(
            set.id,
            &JitSetting {
                name: "runner-1".into(),
                work_folder: String::new(),
            },
        )
        .await
        .expect_err("duplicate name");
    assert!(err.is(ErrorKind::RunnerExists), "{err}");

    assert_eq!(
        client.get_runner(runner.id).await.expect("by id").name,
        "runner-1"
    );
    let by_name = client
        .get_runner_by_name("runner-1")
        .await
        .expect("by name")
        .expect("found");
    assert_eq!(
        (by_name.id, by_name.runner_scale_set_id),
        (runner.id, set.id)
    );
    assert_eq!(
        client.get_runner_by_name("nobody").await.expect("by name"),
        None
    );
    let err = client
        .get_runner(runner.id + 1000)
        .await
        .expect_err("unknown runner");
    assert!(err.is(ErrorKind::RunnerNotFound), "{err}");

    fake.state()
        .mark_runner_online(&RunnerSelector {
            jit_config: Some(config.encoded_jit_config.expose_secret().to_owned()),
            ..Default::default()
        })
        .expect("online");
    let held = fake
        .state()
        .snapshot()
        .runners
        .iter()
        .find(|r| r.id == runner.id)
        .and_then(|r| r.job_request_id)
        .expect("the online runner got a job");
    fake.state().start_job(held).expect("start");
    poll_until(&session, &mut last_id, |m| {
        m.started().any(|s| s.runner_id == runner.id)
    })
    .await;

    let err = client.remove_runner(runner.id).await.expect_err("busy");
    assert!(err.is(ErrorKind::JobStillRunning), "{err}");

    fake.state().finish_job(held, "succeeded").expect("finish");
    let seen = poll_until(&session, &mut last_id, |m| {
        m.completed().any(|c| c.job.runner_request_id == held)
    })
    .await;
    let completed = seen
        .iter()
        .flat_map(|m| m.jobs.iter())
        .find_map(|j| match j {
            JobMessage::Completed(c) if c.job.runner_request_id == held => Some(c.clone()),
            _ => None,
        })
        .expect("completed message");
    assert_eq!(completed.result, "succeeded");
    assert_eq!(completed.runner_name, "runner-1");
    assert!(seen.iter().all(|m| m.statistics.is_some()));

    client
        .remove_runner(runner.id)
        .await
        .expect("unknown runners are removed with 204 too");

    session.close().await.expect("delete session");
    assert!(fake.state().snapshot().sessions.is_empty());
    let err = session.close().await.expect_err("already deleted");
    assert!(err.is(ErrorKind::SessionNotFound), "{err}");
}

#[tokio::test]
async fn a_second_session_conflicts() {
    let (_fake, client) = start(quick_config()).await;
    let set = client
        .create_runner_scale_set(&new_set("conflict"))
        .await
        .expect("create");
    let first = client
        .message_session(set.id, "a")
        .await
        .expect("first session");
    let err = client
        .message_session(set.id, "b")
        .await
        .expect_err("second session");
    assert!(err.is(ErrorKind::SessionConflict), "{err}");
    assert_eq!(err.status().map(|s| s.as_u16()), Some(409));
    assert!(
        err.is_retryable(),
        "the conflict clears when the old session goes"
    );
    assert!(
        err.exception()
            .is_some_and(|e| e.type_name.contains("SessionConflictException")),
        "{err}"
    );
    first.close().await.expect("close");
    client
        .message_session(set.id, "b")
        .await
        .expect("free again");
}

#[tokio::test]
async fn an_expired_queue_token_is_refreshed_once() {
    let (fake, client) = start(quick_config()).await;
    let set = client
        .create_runner_scale_set(&new_set("expiry"))
        .await
        .expect("create");
    let session = client.message_session(set.id, "l").await.expect("session");
    let before = session.session().await.message_queue_access_token;
    fake.state().expire_tokens(&ExpireTokens {
        kind: TokenKind::MessageQueue,
        session_id: None,
        scale_set_id: Some(set.id),
        tenant_id: None,
    });
    assert_eq!(
        session
            .get_message(0, 1)
            .await
            .expect("refreshed, then polled"),
        None
    );
    assert_eq!(fake.state().count("refresh_session"), 1);
    assert_ne!(session.session().await.message_queue_access_token, before);

    // A dropped session: the poll gets 401, the one refresh gets 404, and that is the answer.
    fake.state().drop_sessions(&DropSessions {
        scale_set_id: Some(set.id),
        ..Default::default()
    });
    let err = session.get_message(0, 1).await.expect_err("session gone");
    assert!(err.is(ErrorKind::SessionNotFound), "{err}");
    assert_eq!(fake.state().count("refresh_session"), 2);
}

#[tokio::test]
async fn github_app_authentication_end_to_end() {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("rsa key");
    let config = Config {
        strict: Some(StrictAuth {
            pats: Vec::new(),
            apps: vec![GitHubApp {
                app_id: "Iv1.test".into(),
                installation_ids: vec![42],
                public_key_pem: key.public_key_pem(),
            }],
        }),
        ..quick_config()
    };
    let fake = FakeActionsService::start(config)
        .await
        .expect("fake starts");
    let github = GitHubConfig::parse_with(&format!("{}/my-org/my-repo", fake.base_url()), false)
        .expect("config");
    let app = |installation_id| {
        Credentials::App(GitHubAppCredentials {
            client_id: "Iv1.test".into(),
            installation_id,
            private_key: SecretString::new(key.serialize_pem()),
        })
    };
    let client = ActionsClient::new(github.clone(), &app(42), test_options(0)).expect("client");
    assert_eq!(
        client
            .get_runner_scale_set(1, "x")
            .await
            .expect("authenticated"),
        None
    );
    assert_eq!(fake.state().count("installation_token"), 1);
    assert_eq!(fake.state().count("registration_token"), 1);

    let stranger = ActionsClient::new(github.clone(), &app(43), test_options(0)).expect("client");
    let err = stranger
        .get_runner_scale_set(1, "x")
        .await
        .expect_err("wrong installation");
    assert!(err.status().is_some_and(|s| s.is_client_error()), "{err}");
    assert!(!err.is_retryable());

    let pat = ActionsClient::new(
        github,
        &Credentials::Pat(SecretString::new("ghp_unknown")),
        test_options(0),
    )
    .expect("client");
    let err = pat
        .get_runner_scale_set(1, "x")
        .await
        .expect_err("unknown PAT");
    assert!(err.is(ErrorKind::Unauthorized), "{err}");
}

#[tokio::test]
async fn every_scope_authenticates() {
    let fake = FakeActionsService::start(quick_config())
        .await
        .expect("fake starts");
    for path in ["my-org", "my-org/my-repo", "enterprises/my-ent"] {
        let client = pat_client(&format!("{}/{path}", fake.base_url()), test_options(0));
        let created = client
            .create_runner_scale_set(&new_set("scoped"))
            .await
            .expect(path);
        assert!(created.id > 0, "{path}");
    }
    assert_eq!(fake.state().snapshot().tenants.len(), 3);
}

#[tokio::test]
async fn admin_token_refreshes_before_expiry_and_once_for_fifty_callers() {
    // Tokens living 59 s are within the one-minute margin: every call refreshes first.
    let (fake, client) = start(Config {
        admin_token_lifetime: Duration::from_secs(59),
        ..quick_config()
    })
    .await;
    for _ in 0..3 {
        client.get_runner_scale_set(1, "x").await.expect("lookup");
    }
    assert_eq!(fake.state().count("runner_registration"), 3);

    let (fake, client) = start(quick_config()).await;
    fake.state()
        .set_faults(Faults {
            latency: vec![LatencyFault {
                endpoint: Some("runner_registration".into()),
                millis: 300,
            }],
            ..Default::default()
        })
        .expect("faults");
    let calls: Vec<_> = (0..50)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.get_runner_scale_set(1, &format!("s{i}")).await })
        })
        .collect();
    for call in calls {
        call.await.expect("task").expect("lookup");
    }
    assert_eq!(fake.state().count("runner_registration"), 1);
    assert_eq!(fake.state().count("registration_token"), 1);
    assert_eq!(fake.state().count("get_scale_set_by_name"), 50);
}

#[tokio::test]
async fn injected_5xx_are_retried_and_4xx_are_not() {
    let (fake, client) = start(quick_config()).await;
    client.admin_connection().await.expect("token");
    fake.state()
        .set_faults(Faults {
            errors: vec![ErrorFault {
                endpoint: Some("get_scale_set_by_name".into()),
                status: 503,
                rate: 1.0,
                count: Some(2),
                retry_after_secs: None,
            }],
            ..Default::default()
        })
        .expect("faults");
    assert_eq!(
        client
            .get_runner_scale_set(1, "x")
            .await
            .expect("third attempt"),
        None
    );
    assert_eq!(fake.state().count("get_scale_set_by_name"), 3);

    fake.state().reset_counters();
    fake.state()
        .set_faults(Faults {
            errors: vec![ErrorFault {
                endpoint: Some("actions".into()),
                status: 400,
                rate: 1.0,
                count: None,
                retry_after_secs: None,
            }],
            ..Default::default()
        })
        .expect("faults");
    let err = client.get_runner_scale_set(1, "x").await.expect_err("400");
    assert_eq!(err.status().map(|s| s.as_u16()), Some(400));
    assert_eq!(fake.state().count("get_scale_set_by_name"), 1);

    fake.state().reset_counters();
    fake.state()
        .set_faults(Faults {
            errors: vec![ErrorFault {
                endpoint: Some("get_scale_set_by_name".into()),
                status: 429,
                rate: 1.0,
                count: Some(1),
                retry_after_secs: Some(1),
            }],
            ..Default::default()
        })
        .expect("faults");
    let started = Instant::now();
    client
        .get_runner_scale_set(1, "x")
        .await
        .expect("after Retry-After");
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(fake.state().count("get_scale_set_by_name"), 2);
}

#[tokio::test]
async fn deadlines_hold_under_injected_latency() {
    let fake = FakeActionsService::start(quick_config())
        .await
        .expect("fake starts");
    let mut options: ClientOptions = test_options(5);
    options.http.timeouts = Timeouts {
        connect: Duration::from_secs(1),
        request: Duration::from_millis(300),
        call: Duration::from_secs(1),
        long_poll_request: Duration::from_secs(3),
        long_poll_call: Duration::from_secs(4),
    };
    let client = pat_client(&format!("{}/my-org", fake.base_url()), options);
    let set = client
        .create_runner_scale_set(&new_set("slow"))
        .await
        .expect("create");
    let session = client.message_session(set.id, "l").await.expect("session");
    fake.state()
        .set_faults(Faults {
            latency: vec![LatencyFault {
                endpoint: Some("get_scale_set_by_id".into()),
                millis: 5000,
            }],
            ..Default::default()
        })
        .expect("faults");
    let started = Instant::now();
    let err = client
        .get_runner_scale_set_by_id(set.id)
        .await
        .expect_err("too slow");
    // A 1 s deadline; the margin absorbs a loaded machine (without it the call would take over 5 s).
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(
        err.is(ErrorKind::Timeout) || err.is(ErrorKind::DeadlineExceeded),
        "{err}"
    );

    // The long poll (held 300 ms by the fake, plus 500 ms of latency) fits its own, longer limit.
    fake.state()
        .set_faults(Faults {
            latency: vec![LatencyFault {
                endpoint: Some("get_message".into()),
                millis: 500,
            }],
            ..Default::default()
        })
        .expect("faults");
    assert_eq!(
        session.get_message(0, 1).await.expect("slow but in time"),
        None
    );
}

// ----- GitHub REST: a workflow run's jobs and re-runs -----

/// A job of repository `my-org/app` in a new scale set named `set_name`, cancelled so that its run has finished;
/// its request id and the fake's view of it.
async fn a_finished_job(
    fake: &FakeActionsService,
    client: &ActionsClient,
    set_name: &str,
) -> (i64, fake_actions_service::JobView) {
    let set = client
        .create_runner_scale_set(&new_set(set_name))
        .await
        .expect("create");
    let job = fake
        .state()
        .enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(set.id),
            repository: Some("app".into()),
            ..Default::default()
        })
        .expect("enqueue")[0];
    (job, fake.state().cancel_job(job).expect("cancel"))
}

/// The fake's message when a job's run is not completed (docs/fake-actions-service.md).
const RUN_STILL_RUNNING: &str = "The workflow run containing this job is already running";

#[tokio::test]
async fn a_runs_jobs_are_listed_over_two_pages() {
    let (fake, client) = start(quick_config()).await;
    let set = client
        .create_runner_scale_set(&new_set("many"))
        .await
        .expect("create");
    let ids = fake
        .state()
        .enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(set.id),
            count: 150,
            repository: Some("app".into()),
            display_name: Some("matrix".into()),
            ..Default::default()
        })
        .expect("enqueue");
    let first = fake.state().job(ids[0]).expect("job");

    let jobs = client
        .list_workflow_run_jobs("my-org/app", first.workflow_run_id)
        .await
        .expect("list");
    assert_eq!(
        fake.state().count("list_run_jobs"),
        2,
        "100 jobs, then the last 50"
    );
    let rest_ids: Vec<i64> = ids
        .iter()
        .map(|id| fake.state().job(*id).expect("job").rest_id)
        .collect();
    assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), rest_ids);
    assert_eq!(jobs[0].name, "matrix-1");
    assert_eq!(jobs[149].name, "matrix-150");
    assert!(
        jobs.iter().all(|j| j.run_id == first.workflow_run_id
            && j.run_attempt == 1
            && j.status == "queued"
            && j.conclusion.is_none()
            && j.runner_name.is_none()),
        "{:?}",
        jobs[0]
    );

    // Repository names are case-insensitive on GitHub; another repository's run is GitHub's 404, an error here.
    assert_eq!(
        client
            .list_workflow_run_jobs("My-Org/App", first.workflow_run_id)
            .await
            .expect("list")
            .len(),
        150
    );
    let err = client
        .list_workflow_run_jobs("my-org/other", first.workflow_run_id)
        .await
        .expect_err("another repository");
    assert_eq!(err.status().map(|s| s.as_u16()), Some(404), "{err}");
    assert!(err.github_request_id().is_some(), "{err}");
}

#[tokio::test]
async fn a_completed_job_found_by_its_runner_is_rerun_as_a_second_attempt() {
    let (fake, client) = start(quick_config()).await;
    let set = client
        .create_runner_scale_set(&new_set("rerun"))
        .await
        .expect("create");
    let session = client.message_session(set.id, "l").await.expect("session");
    let mut last_id = 0;
    let jobs = fake
        .state()
        .enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(set.id),
            repository: Some("app".into()),
            display_name: Some("test".into()),
            ..Default::default()
        })
        .expect("enqueue");
    poll_until(&session, &mut last_id, |m| m.available().next().is_some()).await;
    session.acquire_jobs(&jobs).await.expect("acquire");
    let config = client
        .generate_jit_runner_config(
            set.id,
            &JitSetting {
                name: "runner-1".into(),
                work_folder: String::new(),
            },
        )
        .await
        .expect("jit");
    fake.state()
        .mark_runner_online(&RunnerSelector {
            jit_config: Some(config.encoded_jit_config.expose_secret().to_owned()),
            ..Default::default()
        })
        .expect("online");
    let view = fake.state().start_job(jobs[0]).expect("start");
    let (run, repository) = (view.workflow_run_id, "my-org/app");

    // While the job runs, GitHub refuses, and says why.
    let running = client
        .list_workflow_run_jobs(repository, run)
        .await
        .expect("list");
    assert_eq!(
        (
            running[0].status.as_str(),
            running[0].runner_name.as_deref()
        ),
        ("in_progress", Some("runner-1"))
    );
    assert_eq!(
        client
            .rerun_workflow_job(repository, view.rest_id)
            .await
            .expect("answered"),
        RerunOutcome::Refused(RUN_STILL_RUNNING.into())
    );

    fake.state().finish_job(jobs[0], "failed").expect("finish");
    let listed = client
        .list_workflow_run_jobs(repository, run)
        .await
        .expect("list");
    let failed = listed
        .iter()
        .find(|j| j.runner_name.as_deref() == Some("runner-1"))
        .expect("the job that ran on runner-1")
        .clone();
    assert_eq!(
        (
            failed.id,
            failed.status.as_str(),
            failed.conclusion.as_deref()
        ),
        (view.rest_id, "completed", Some("failure"))
    );
    assert_eq!(
        client
            .rerun_workflow_job(repository, failed.id)
            .await
            .expect("re-run"),
        RerunOutcome::Requested
    );

    let attempts = client
        .list_workflow_run_jobs(repository, run)
        .await
        .expect("list");
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[0], failed, "the first attempt is unchanged");
    let second = &attempts[1];
    assert_ne!(second.id, failed.id);
    assert_eq!(
        (
            second.run_id,
            second.run_attempt,
            second.name.as_str(),
            second.status.as_str(),
            second.runner_name.as_deref()
        ),
        (run, 2, "test-1", "queued", None)
    );
    assert_eq!(fake.state().snapshot().job_reruns, 1);

    // The attempt that was re-run is refused; the new one is not completed yet.
    match client
        .rerun_workflow_job(repository, failed.id)
        .await
        .expect("answered")
    {
        RerunOutcome::Refused(message) => assert!(message.contains("re-run already"), "{message}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        client
            .rerun_workflow_job(repository, second.id)
            .await
            .expect("answered"),
        RerunOutcome::Refused(RUN_STILL_RUNNING.into())
    );
    assert_eq!(fake.state().snapshot().job_reruns, 1);
}

#[tokio::test]
async fn unknown_jobs_are_not_found_and_bad_repositories_are_not_sent() {
    let (fake, client) = start(quick_config()).await;
    let (job, view) = a_finished_job(&fake, &client, "unknown").await;

    // An unknown REST id, a request id mistaken for one, a job of another repository.
    for (repository, id) in [
        ("my-org/app", view.rest_id + 1000),
        ("my-org/app", job),
        ("my-org/other", view.rest_id),
    ] {
        assert_eq!(
            client
                .rerun_workflow_job(repository, id)
                .await
                .expect("answered"),
            RerunOutcome::NotFound,
            "{repository} {id}"
        );
    }
    assert_eq!(fake.state().count("rerun_job"), 3);

    fake.state().reset_counters();
    for bad in [
        "",
        "my-org",
        "my-org/",
        "/app",
        "my-org/app/extra",
        "my-org/app?filter=latest",
        "my-org/app#x",
        "my-org/..",
        "../app",
        "my org/app",
        "my-org/app%2Fx",
    ] {
        let err = client
            .list_workflow_run_jobs(bad, view.workflow_run_id)
            .await
            .expect_err(bad);
        assert!(
            matches!(err, actions_client::Error::InvalidRequest { .. }),
            "{bad:?}: {err}"
        );
        let err = client
            .rerun_workflow_job(bad, view.rest_id)
            .await
            .expect_err(bad);
        assert!(
            matches!(err, actions_client::Error::InvalidRequest { .. }),
            "{bad:?}: {err}"
        );
    }
    assert!(
        fake.state().counters().is_empty(),
        "nothing was sent: {:?}",
        fake.state().counters()
    );
}

#[tokio::test]
async fn rest_job_calls_map_rate_limits_and_retry_server_errors() {
    let (fake, client) = start(quick_config()).await;
    let (_, view) = a_finished_job(&fake, &client, "faults").await;
    let fault = |endpoint: &str, status, retry_after_secs| ErrorFault {
        endpoint: Some(endpoint.into()),
        status,
        rate: 1.0,
        count: Some(1),
        retry_after_secs,
    };
    fake.state()
        .set_faults(Faults {
            errors: vec![
                fault("list_run_jobs", 502, None),
                fault("rerun_job", 403, Some(60)),
            ],
            ..Default::default()
        })
        .expect("faults");
    let jobs = client
        .list_workflow_run_jobs("my-org/app", view.workflow_run_id)
        .await
        .expect("the second attempt");
    assert_eq!(jobs.len(), 1);
    assert_eq!(fake.state().count("list_run_jobs"), 2);
    // A 403 with Retry-After is GitHub's secondary rate limit, not a refusal of this re-run.
    let err = client
        .rerun_workflow_job("my-org/app", view.rest_id)
        .await
        .expect_err("rate limited");
    assert!(err.is(ErrorKind::RateLimited), "{err}");
    assert!(err.is_retryable());

    fake.state()
        .set_faults(Faults {
            errors: vec![fault("list_run_jobs", 403, None)],
            ..Default::default()
        })
        .expect("faults");
    let err = client
        .list_workflow_run_jobs("my-org/app", view.workflow_run_id)
        .await
        .expect_err("forbidden");
    assert!(err.is(ErrorKind::Forbidden), "{err}");
    assert_eq!(
        client
            .rerun_workflow_job("my-org/app", view.rest_id)
            .await
            .expect("re-run"),
        RerunOutcome::Requested
    );
}

#[tokio::test]
async fn rest_job_calls_work_with_github_app_credentials() {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("rsa key");
    let fake = FakeActionsService::start(Config {
        strict: Some(StrictAuth {
            pats: Vec::new(),
            apps: vec![GitHubApp {
                app_id: "Iv1.test".into(),
                installation_ids: vec![42],
                public_key_pem: key.public_key_pem(),
            }],
        }),
        ..quick_config()
    })
    .await
    .expect("fake starts");
    let github =
        GitHubConfig::parse_with(&format!("{}/octo/app", fake.base_url()), false).expect("config");
    let app = Credentials::App(GitHubAppCredentials {
        client_id: "Iv1.test".into(),
        installation_id: 42,
        private_key: SecretString::new(key.serialize_pem()),
    });
    let client = ActionsClient::new(github.clone(), &app, test_options(0)).expect("client");
    let set = client
        .create_runner_scale_set(&new_set("app-set"))
        .await
        .expect("create");
    let ids = fake
        .state()
        .enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(set.id),
            count: 3,
            ..Default::default()
        })
        .expect("enqueue");
    for id in &ids {
        fake.state().cancel_job(*id).expect("cancel");
    }
    let view = fake.state().job(ids[0]).expect("job");
    assert_eq!(fake.state().count("installation_token"), 1);

    let jobs = client
        .list_workflow_run_jobs("octo/app", view.workflow_run_id)
        .await
        .expect("list");
    assert_eq!(jobs.len(), 3);
    assert_eq!(jobs[0].conclusion.as_deref(), Some("cancelled"), "{jobs:?}");
    assert_eq!(
        client
            .rerun_workflow_job("octo/app", view.rest_id)
            .await
            .expect("re-run"),
        RerunOutcome::Requested
    );
    assert_eq!(
        fake.state().count("installation_token"),
        3,
        "each REST call uses a new installation token"
    );

    let stranger = ActionsClient::new(
        github,
        &Credentials::Pat(SecretString::new("ghp_unknown")),
        test_options(0),
    )
    .expect("client");
    let err = stranger
        .rerun_workflow_job("octo/app", view.rest_id)
        .await
        .expect_err("unknown PAT");
    assert!(err.is(ErrorKind::Unauthorized), "{err}");
}

/// `count` jobs of run 9 starting at REST id `first`, as a page body; `total_count` left out when `None`.
fn jobs_page(first: i64, count: i64, total_count: Option<i64>) -> String {
    let jobs: Vec<String> = (first..first + count)
        .map(|id| {
            format!(r#"{{"id":{id},"run_id":9,"run_attempt":1,"name":"j","status":"queued"}}"#)
        })
        .collect();
    let total = total_count.map_or(String::new(), |n| format!(r#""total_count":{n},"#));
    format!(r#"{{{total}"jobs":[{}]}}"#, jobs.join(","))
}

#[tokio::test]
async fn rest_job_requests_have_githubs_shape() {
    let server = MockServer::start(|r, earlier| {
        let page = |n: i64| {
            r.uri
                .query()
                .is_some_and(|q| q.ends_with(&format!("&page={n}")))
        };
        match r.path() {
            // No total_count: full pages are followed until a short one.
            "/api/v3/repos/octo/app/actions/runs/9/jobs" => Some(if page(3) {
                Reply::json(200, jobs_page(201, 5, None))
            } else {
                let first = if page(1) { 1 } else { 101 };
                Reply::json(200, jobs_page(first, 100, None))
            }),
            // A run that never ends: the listing stops after ten pages.
            "/api/v3/repos/octo/app/actions/runs/10/jobs" => {
                Some(Reply::json(200, jobs_page(1, 100, Some(5000))))
            }
            "/api/v3/repos/octo/app/actions/jobs/5/rerun" => Some(match earlier {
                0 => Reply::json(201, "{}"),
                1 => Reply::json(403, "proxy says no").with_header("content-type", "text/plain"),
                2 => Reply::empty(403),
                _ => Reply::json(403, "{}").with_header("x-ratelimit-remaining", "0"),
            }),
            _ => None,
        }
    })
    .await;
    let client = pat_client(&server.org_url(), test_options(0));

    let jobs = client
        .list_workflow_run_jobs("octo/app", 9)
        .await
        .expect("list");
    assert_eq!(jobs.len(), 205);
    assert_eq!(
        jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        (1..=205).collect::<Vec<i64>>()
    );
    let requests = server.requests_to("/runs/9/jobs");
    let queries: Vec<&str> = requests.iter().filter_map(|r| r.uri.query()).collect();
    assert_eq!(
        queries,
        [
            "filter=all&per_page=100&page=1",
            "filter=all&per_page=100&page=2",
            "filter=all&per_page=100&page=3"
        ]
    );
    let get = &requests[0];
    assert_eq!(get.method, "GET");
    assert_eq!(get.header("authorization"), Some("Bearer ghp_test"));
    assert_eq!(get.header("accept"), Some("application/vnd.github+json"));
    assert_eq!(get.header("x-github-api-version"), Some("2022-11-28"));

    assert_eq!(
        client
            .list_workflow_run_jobs("octo/app", 10)
            .await
            .expect("list")
            .len(),
        1000
    );
    assert_eq!(server.requests_to("/runs/10/jobs").len(), 10);

    let mut outcomes = Vec::new();
    for _ in 0..3 {
        outcomes.push(
            client
                .rerun_workflow_job("octo/app", 5)
                .await
                .expect("answered"),
        );
    }
    assert_eq!(
        outcomes,
        [
            RerunOutcome::Requested,
            RerunOutcome::Refused("proxy says no".into()),
            RerunOutcome::Refused("forbidden".into()),
        ]
    );
    let err = client
        .rerun_workflow_job("octo/app", 5)
        .await
        .expect_err("primary rate limit");
    assert!(err.is(ErrorKind::RateLimited), "{err}");
    let post = &server.requests_to("/jobs/5/rerun")[0];
    assert_eq!(post.method, "POST");
    assert_eq!(post.body_text(), "{}");
    assert_eq!(
        post.header("content-type"),
        Some("application/vnd.github+json")
    );
    assert_eq!(post.header("x-github-api-version"), Some("2022-11-28"));
}
