//! Unit tests of the state machine, with a manual clock and no HTTP.

use std::time::Duration;

use pretty_assertions::assert_eq;

use super::*;
use crate::config::Config;
use crate::wire::JobMessage;

const BASE: &str = "http://fake.test";
const T0: i64 = 1_700_000_000_000;

fn state_with(config: Config) -> State {
    State::new(
        &Config {
            seed: Some(1),
            ..config
        },
        Clock::Manual(T0),
    )
    .unwrap()
}

fn state() -> State {
    state_with(Config::default())
}

/// Register `my-org` and return (tenant id, admin authorization header).
fn register(state: &mut State) -> (i64, String) {
    let reg = state
        .registration_token(Some("Bearer pat"), &Scope::Organization("my-org".into()))
        .unwrap();
    let body =
        serde_json::to_vec(&json!({"url": format!("{BASE}/my-org"), "runner_event": "register"}))
            .unwrap();
    let admin = state
        .runner_registration(Some(&format!("RemoteAuth {}", reg.token)), &body, BASE)
        .unwrap();
    let tenant: i64 = admin
        .url
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    (tenant, format!("Bearer {}", admin.token))
}

fn create_set(state: &mut State, tenant: i64, name: &str) -> i64 {
    state
        .create_scale_set(
            tenant,
            ScaleSetInput {
                name: Some(name.into()),
                runner_group_id: Some(1),
                ..ScaleSetInput::default()
            },
        )
        .unwrap()
        .id
}

fn session(state: &mut State, tenant: i64, set: i64) -> SessionJson {
    state
        .create_session(tenant, set, Some("owner"), BASE)
        .unwrap()
}

fn enqueue(state: &mut State, set: i64, count: u32) -> Vec<i64> {
    state
        .enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(set),
            count,
            ..EnqueueJobs::default()
        })
        .unwrap()
}

fn poll(state: &mut State, session: &str, last: i64) -> Option<(i64, Vec<JobMessage>, Statistics)> {
    state
        .poll_message(session, last, Some(10))
        .unwrap()
        .map(|message| {
            let body: Vec<JobMessage> = serde_json::from_str(&message.body).unwrap();
            (message.message_id, body, message.statistics)
        })
}

fn kinds(messages: &[JobMessage]) -> Vec<&str> {
    messages.iter().map(|m| m.message_type.as_str()).collect()
}

fn jit(state: &mut State, tenant: i64, set: i64, name: &str) -> JitResponse {
    state
        .generate_jit_config(tenant, set, Some(name), None, BASE)
        .unwrap()
}

/// A tenant with scale set "set" whose session acquired `count` jobs, and runner "r1" registered (online at once)
/// to take one.
struct Acquired {
    state: State,
    tenant: i64,
    set: i64,
    jobs: Vec<i64>,
    runner: i64,
}

fn acquired(count: u32) -> Acquired {
    let mut state = state_with(Config {
        auto_online_runners: true,
        ..Config::default()
    });
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let sess = session(&mut state, tenant, set).session_id;
    let jobs = enqueue(&mut state, set, count);
    state.acquire_jobs(tenant, set, &sess, &jobs).unwrap();
    let runner = jit(&mut state, tenant, set, "r1").runner.id;
    Acquired {
        state,
        tenant,
        set,
        jobs,
        runner,
    }
}

#[test]
fn full_job_lifecycle_emits_messages_in_order_with_statistics() {
    let mut state = state();
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let sess = session(&mut state, tenant, set);
    let job = enqueue(&mut state, set, 1)[0];

    let (id1, body, stats) = poll(&mut state, &sess.session_id, 0).unwrap();
    assert_eq!(kinds(&body), vec!["JobAvailable"]);
    assert!(
        body[0]
            .acquire_job_url
            .as_deref()
            .unwrap()
            .ends_with("/acquirejobs")
    );
    assert_eq!(stats.total_available_jobs, 1);
    state.ack_message(&sess.session_id, id1).unwrap();

    assert_eq!(
        state
            .acquire_jobs(tenant, set, &sess.session_id, &[job, 999])
            .unwrap(),
        vec![job]
    );
    let (id2, body, stats) = poll(&mut state, &sess.session_id, id1).unwrap();
    assert!(id2 > id1);
    assert_eq!(kinds(&body), vec!["JobAssigned"]);
    assert_eq!(
        (
            stats.total_available_jobs,
            stats.total_acquired_jobs,
            stats.total_assigned_jobs
        ),
        (0, 1, 1)
    );
    assert_ne!(body[0].scale_set_assign_time, ZERO_TIME);

    let runner = jit(&mut state, tenant, set, "runner-1");
    assert_eq!(state.statistics(set).total_idle_runners, 1);
    assert_eq!(
        state.job_view(job).unwrap().state,
        JobState::Acquired,
        "offline runners get no job"
    );
    state
        .mark_runner_online(&RunnerSelector {
            jit_config: Some(runner.encoded_jit_config.clone()),
            ..RunnerSelector::default()
        })
        .unwrap();
    assert_eq!(state.job_view(job).unwrap().state, JobState::Assigned);
    let stats = state.statistics(set);
    assert_eq!((stats.total_busy_runners, stats.total_idle_runners), (1, 0));

    state.start_job(job).unwrap();
    let (id3, body, stats) = poll(&mut state, &sess.session_id, id2).unwrap();
    assert_eq!(kinds(&body), vec!["JobStarted"]);
    assert_eq!(body[0].runner_id, Some(runner.runner.id));
    assert_eq!(body[0].runner_name.as_deref(), Some("runner-1"));
    assert_eq!(
        (
            stats.total_running_jobs,
            stats.total_acquired_jobs,
            stats.total_assigned_jobs
        ),
        (1, 0, 1)
    );

    state.finish_job(job, "failed").unwrap();
    let (_, body, stats) = poll(&mut state, &sess.session_id, id3).unwrap();
    assert_eq!(kinds(&body), vec!["JobCompleted"]);
    assert_eq!(body[0].result.as_deref(), Some("failed"));
    assert_ne!(body[0].finish_time, ZERO_TIME);
    assert_eq!(
        stats,
        Statistics::default(),
        "the ephemeral runner is gone after its job"
    );
    assert!(state.runners.is_empty());
}

#[test]
fn direct_delivery_assigns_jobs_without_an_offer_and_acquiring_takes_nothing() {
    let mut state = state_with(Config {
        job_delivery: JobDelivery::Direct,
        ..Config::default()
    });
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let sess = session(&mut state, tenant, set);
    let job = enqueue(&mut state, set, 1)[0];

    let (id1, body, stats) = poll(&mut state, &sess.session_id, 0).unwrap();
    assert_eq!(kinds(&body), vec!["JobAssigned"], "no JobAvailable first");
    assert_eq!(body[0].acquire_job_url, None);
    assert_ne!(body[0].scale_set_assign_time, ZERO_TIME);
    assert_eq!(
        (
            stats.total_available_jobs,
            stats.total_acquired_jobs,
            stats.total_assigned_jobs
        ),
        (0, 1, 1)
    );
    state.ack_message(&sess.session_id, id1).unwrap();
    assert_eq!(
        state
            .acquire_jobs(tenant, set, &sess.session_id, &[job])
            .unwrap(),
        Vec::<i64>::new(),
        "nothing is left to acquire"
    );
    assert!(
        state.acquirable_jobs(tenant, set).unwrap().is_empty(),
        "nothing is offered"
    );

    let runner = jit(&mut state, tenant, set, "runner-1");
    state
        .mark_runner_online(&RunnerSelector {
            jit_config: Some(runner.encoded_jit_config.clone()),
            ..RunnerSelector::default()
        })
        .unwrap();
    assert_eq!(state.job_view(job).unwrap().state, JobState::Assigned);

    // A job put back in the queue is assigned again, not offered.
    state.requeue_job(job).unwrap();
    let (_, body, _) = poll(&mut state, &sess.session_id, id1).unwrap();
    assert_eq!(kinds(&body), vec!["JobCompleted", "JobAssigned"]);
}

#[test]
fn unacked_messages_are_redelivered_and_last_message_id_skips() {
    let mut state = state();
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let sess = session(&mut state, tenant, set).session_id;
    enqueue(&mut state, set, 2);
    let (first, body, _) = poll(&mut state, &sess, 0).unwrap();
    assert_eq!(body.len(), 2, "pending job messages are batched");
    assert_eq!(
        poll(&mut state, &sess, 0).unwrap().0,
        first,
        "not acked: delivered again"
    );
    assert!(
        poll(&mut state, &sess, first).is_none(),
        "nothing after the last id"
    );
    state.ack_message(&sess, first).unwrap();
    assert!(poll(&mut state, &sess, 0).is_none());
    state.ack_message(&sess, first).unwrap();
    assert_eq!(state.ack_message(&sess, 12345).unwrap_err().status, 404);
}

#[test]
fn batches_are_capped() {
    let mut state = state_with(Config {
        max_job_messages_per_message: 50,
        ..Config::default()
    });
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let sess = session(&mut state, tenant, set).session_id;
    enqueue(&mut state, set, 120);
    let sizes: Vec<usize> = (0..3)
        .map(|_| {
            let (id, body, _) = poll(&mut state, &sess, 0).unwrap();
            state.ack_message(&sess, id).unwrap();
            body.len()
        })
        .collect();
    assert_eq!(sizes, vec![50, 50, 20]);
}

#[test]
fn second_session_conflicts_until_deleted_or_idle() {
    let mut state = state_with(Config {
        session_idle_timeout: Some(Duration::from_secs(120)),
        ..Config::default()
    });
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let first = session(&mut state, tenant, set);
    let conflict = state.create_session(tenant, set, None, BASE).unwrap_err();
    assert_eq!(conflict.status, 409);
    assert!(
        conflict
            .type_name
            .unwrap()
            .contains("SessionConflictException")
    );
    state
        .delete_session(tenant, set, &first.session_id)
        .unwrap();
    let second = session(&mut state, tenant, set);
    state.advance(Duration::from_secs(121));
    let third = session(&mut state, tenant, set);
    assert_ne!(second.session_id, third.session_id);
    let gone = state
        .delete_session(tenant, set, &second.session_id)
        .unwrap_err();
    assert_eq!(gone.status, 400);
}

#[test]
fn queue_token_expiry_and_refresh() {
    let mut state = state_with(Config {
        message_queue_token_lifetime: Duration::from_secs(60),
        session_idle_timeout: None,
        ..Config::default()
    });
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let sess = session(&mut state, tenant, set);
    let header = format!("Bearer {}", sess.message_queue_access_token);
    assert_eq!(
        state.authorize_queue(Some(&header), None).unwrap(),
        sess.session_id
    );
    state.advance(Duration::from_secs(61));
    assert_eq!(
        state
            .authorize_queue(Some(&header), None)
            .unwrap_err()
            .status,
        401
    );
    let refreshed = state
        .refresh_session(tenant, set, &sess.session_id, BASE)
        .unwrap();
    assert_ne!(
        refreshed.message_queue_access_token,
        sess.message_queue_access_token
    );
    assert_eq!(refreshed.session_id, sess.session_id);
    let header = format!("Bearer {}", refreshed.message_queue_access_token);
    assert_eq!(
        state
            .authorize_queue(Some(&header), Some(&sess.session_id))
            .unwrap(),
        sess.session_id
    );
    assert_eq!(
        state
            .authorize_queue(Some(&header), Some("other"))
            .unwrap_err()
            .status,
        401
    );
}

#[test]
fn dropped_session_gets_401_then_refresh_404() {
    let mut state = state();
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let sess = session(&mut state, tenant, set);
    let header = format!("Bearer {}", sess.message_queue_access_token);
    assert_eq!(
        state.drop_sessions(&DropSessions {
            scale_set_id: Some(set),
            ..DropSessions::default()
        }),
        1
    );
    assert_eq!(
        state
            .authorize_queue(Some(&header), None)
            .unwrap_err()
            .status,
        401
    );
    let refresh = state
        .refresh_session(tenant, set, &sess.session_id, BASE)
        .unwrap_err();
    assert_eq!(refresh.status, 404);
    assert!(refresh.type_name.unwrap().contains("RunnerAdminException"));
}

#[test]
fn admin_tokens_expire_and_are_tenant_bound() {
    let mut state = state_with(Config {
        admin_token_lifetime: Duration::from_secs(600),
        ..Config::default()
    });
    let (tenant, header) = register(&mut state);
    state.authorize_admin(tenant, Some(&header)).unwrap();
    assert_eq!(
        state
            .authorize_admin(tenant + 1, Some(&header))
            .unwrap_err()
            .status,
        401
    );
    assert_eq!(
        state
            .authorize_admin(tenant, Some("Bearer nope"))
            .unwrap_err()
            .status,
        401
    );
    assert_eq!(state.authorize_admin(tenant, None).unwrap_err().status, 401);
    let claims: serde_json::Value =
        jsonwebtoken::dangerous::insecure_decode_claims(header.trim_start_matches("Bearer "))
            .unwrap();
    assert_eq!(claims["exp"], (T0 / 1000) + 600);
    state.advance(Duration::from_secs(601));
    assert_eq!(
        state
            .authorize_admin(tenant, Some(&header))
            .unwrap_err()
            .status,
        401
    );
}

#[test]
fn forced_expiry_of_admin_tokens() {
    let mut state = state();
    let (tenant, header) = register(&mut state);
    let expired = state.expire_tokens(&ExpireTokens {
        kind: TokenKind::Admin,
        session_id: None,
        scale_set_id: None,
        tenant_id: Some(tenant),
    });
    assert_eq!(expired, 1);
    assert_eq!(
        state
            .authorize_admin(tenant, Some(&header))
            .unwrap_err()
            .status,
        401
    );
}

#[test]
fn removing_a_busy_runner_is_refused_unknown_is_fine() {
    let Acquired {
        mut state,
        tenant,
        jobs,
        runner,
        ..
    } = acquired(1);
    let job = jobs[0];
    assert_eq!(state.job_view(job).unwrap().runner_id, Some(runner));
    let refused = state.remove_runner(tenant, runner).unwrap_err();
    assert_eq!(refused.status, 400);
    assert!(
        refused
            .type_name
            .unwrap()
            .contains("JobStillRunningException")
    );
    state.remove_runner(tenant, 424_242).unwrap();
    assert_eq!(state.runner(tenant, 424_242).unwrap_err().status, 404);
    state.cancel_job(job).unwrap();
    assert_eq!(
        state.runner(tenant, runner).unwrap_err().status,
        404,
        "ephemeral runner left"
    );
}

#[test]
fn duplicate_runner_name_is_agent_exists() {
    let mut state = state();
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    jit(&mut state, tenant, set, "r1");
    let error = state
        .generate_jit_config(tenant, set, Some("R1"), None, BASE)
        .unwrap_err();
    assert_eq!(error.status, 409);
    assert!(error.type_name.unwrap().contains("AgentExistsException"));
    assert_eq!(state.runners_by_name(tenant, Some("r1")).len(), 1);
}

#[test]
fn jit_config_is_single_use() {
    let mut state = state();
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let jit = jit(&mut state, tenant, set, "r1");
    let selector = RunnerSelector {
        jit_config: Some(jit.encoded_jit_config.clone()),
        ..RunnerSelector::default()
    };
    assert!(state.mark_runner_online(&selector).unwrap().online);
    assert_eq!(state.mark_runner_online(&selector).unwrap_err().status, 409);
    state.mark_runner_offline(jit.runner.id).unwrap();
    // A second runner process with the same config (a pod re-created from the same Secret) is refused and
    // counted, even though the first one went offline.
    assert_eq!(state.jit_config_reuses, 0);
    assert_eq!(state.mark_runner_online(&selector).unwrap_err().status, 409);
    assert_eq!(state.snapshot().jit_config_reuses, 1);
    state.deregister_runner(jit.runner.id).unwrap();
    assert_eq!(state.mark_runner_online(&selector).unwrap_err().status, 410);
    let decoded = BASE64.decode(&jit.encoded_jit_config).unwrap();
    let outer: serde_json::Value = serde_json::from_slice(&decoded).unwrap();
    let runner: serde_json::Value =
        serde_json::from_slice(&BASE64.decode(outer[".runner"].as_str().unwrap()).unwrap())
            .unwrap();
    assert_eq!(runner["agentName"], "r1");
    assert_eq!(runner["fakeControlUrl"], format!("{BASE}/_fake"));
}

#[test]
fn scale_set_names_are_unique_per_group() {
    let mut state = state_with(Config {
        runner_groups: vec!["gpu".into()],
        ..Config::default()
    });
    let (tenant, _) = register(&mut state);
    create_set(&mut state, tenant, "set");
    let duplicate = state
        .create_scale_set(
            tenant,
            ScaleSetInput {
                name: Some("SET".into()),
                ..ScaleSetInput::default()
            },
        )
        .unwrap_err();
    assert_eq!(duplicate.status, 409);
    let other_group = state
        .create_scale_set(
            tenant,
            ScaleSetInput {
                name: Some("set".into()),
                runner_group_id: Some(2),
                ..ScaleSetInput::default()
            },
        )
        .unwrap();
    assert_eq!(other_group.runner_group_name, "gpu");
    assert_eq!(other_group.labels, vec![Label::system("set")]);
    assert_eq!(
        state.scale_sets_by_name(tenant, Some(1), Some("set")).len(),
        1
    );
    assert_eq!(state.scale_sets_by_name(tenant, None, Some("set")).len(), 2);
    assert_eq!(state.runner_groups(tenant, Some("GPU")).len(), 1);
    assert_eq!(state.runner_groups(tenant, Some("default"))[0].id, 1);
    assert!(state.runner_groups(tenant, Some("nope")).is_empty());
}

#[test]
fn update_merges_present_fields_only() {
    let mut state = state();
    let (tenant, _) = register(&mut state);
    let set = state
        .create_scale_set(
            tenant,
            ScaleSetInput {
                name: Some("set".into()),
                labels: Some(vec![Label::system("set"), Label::system("linux")]),
                runner_setting: Some(RunnerSetting {
                    disable_update: true,
                    ..RunnerSetting::default()
                }),
                ..ScaleSetInput::default()
            },
        )
        .unwrap();
    let updated = state
        .update_scale_set(
            tenant,
            set.id,
            ScaleSetInput {
                name: Some("renamed".into()),
                runner_setting: Some(RunnerSetting::default()),
                ..ScaleSetInput::default()
            },
        )
        .unwrap();
    assert_eq!(updated.name, "renamed");
    assert_eq!(updated.labels.len(), 2);
    assert!(updated.runner_setting.disable_update);
    let missing_group = state
        .update_scale_set(
            tenant,
            set.id,
            ScaleSetInput {
                runner_group_id: Some(77),
                ..ScaleSetInput::default()
            },
        )
        .unwrap_err();
    assert_eq!(missing_group.status, 404);
}

#[test]
fn deleting_a_scale_set_requeues_its_jobs_for_a_successor() {
    let Acquired {
        mut state,
        tenant,
        set,
        jobs,
        ..
    } = acquired(2);
    state.start_job(jobs[0]).unwrap();
    let busy = state
        .delete_scale_set(Some(tenant), set, false)
        .unwrap_err();
    assert_eq!(busy.status, 400);
    state.finish_job(jobs[0], "succeeded").unwrap();
    state.delete_scale_set(Some(tenant), set, false).unwrap();
    assert_eq!(state.job_view(jobs[1]).unwrap().state, JobState::Queued);
    assert!(state.sessions.is_empty() && state.runners.is_empty());
    let successor = create_set(&mut state, tenant, "set");
    let view = state.job_view(jobs[1]).unwrap();
    assert_eq!(
        (view.state, view.scale_set_id),
        (JobState::Available, Some(successor))
    );
    assert_eq!(view.times_requeued, 1);
    assert_eq!(state.statistics(successor).total_available_jobs, 1);
}

#[test]
fn completed_among_counts_only_the_given_jobs_that_completed() {
    let Acquired {
        mut state, jobs, ..
    } = acquired(3);
    state.start_job(jobs[0]).unwrap();
    assert_eq!(state.completed_among(&jobs), 0, "started is not completed");
    state.finish_job(jobs[0], "succeeded").unwrap();
    assert_eq!(state.completed_among(&jobs), 1);
    assert_eq!(
        state.completed_among(&jobs[1..]),
        0,
        "only the ids asked about"
    );
    assert_eq!(
        state.completed_among(&[jobs[0], 999_999]),
        1,
        "an unknown id counts as not completed"
    );
}

#[test]
fn requeue_cancels_assignment_and_reoffers() {
    let mut state = state();
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let sess = session(&mut state, tenant, set).session_id;
    let job = enqueue(&mut state, set, 1)[0];
    let (id, _, _) = poll(&mut state, &sess, 0).unwrap();
    state.ack_message(&sess, id).unwrap();
    state.acquire_jobs(tenant, set, &sess, &[job]).unwrap();
    state.requeue_job(job).unwrap();
    let (_, body, stats) = poll(&mut state, &sess, id).unwrap();
    assert_eq!(
        kinds(&body),
        vec!["JobAssigned", "JobCompleted", "JobAvailable"]
    );
    assert_eq!(body[1].result.as_deref(), Some("canceled"));
    assert_eq!(stats.total_available_jobs, 1);
    assert_eq!(
        state.acquire_jobs(tenant, set, &sess, &[job]).unwrap(),
        vec![job]
    );
    assert_eq!(state.job_view(job).unwrap().times_acquired, 2);
}

#[test]
fn new_session_reoffers_acked_but_unacquired_jobs() {
    let mut state = state();
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let first = session(&mut state, tenant, set);
    let job = enqueue(&mut state, set, 1)[0];
    let (id, _, _) = poll(&mut state, &first.session_id, 0).unwrap();
    state.ack_message(&first.session_id, id).unwrap();
    state
        .delete_session(tenant, set, &first.session_id)
        .unwrap();
    let second = session(&mut state, tenant, set);
    let (_, body, _) = poll(&mut state, &second.session_id, 0).unwrap();
    assert_eq!(kinds(&body), vec!["JobAvailable"]);
    assert_eq!(body[0].runner_request_id, job);
}

#[test]
fn cancel_of_unacquired_job_sends_nothing_and_cannot_be_acquired() {
    let mut state = state();
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let sess = session(&mut state, tenant, set).session_id;
    let job = enqueue(&mut state, set, 1)[0];
    state.cancel_job(job).unwrap();
    let (_, body, stats) = poll(&mut state, &sess, 0).unwrap();
    assert_eq!(
        kinds(&body),
        vec!["JobAvailable"],
        "the offer was already queued"
    );
    assert_eq!(stats.total_available_jobs, 0);
    assert!(
        state
            .acquire_jobs(tenant, set, &sess, &[job])
            .unwrap()
            .is_empty()
    );
    assert_eq!(state.cancel_job(job).unwrap_err().status, 409);
}

#[test]
fn enqueue_count_is_bounded() {
    let mut state = state();
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let error = state
        .enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(set),
            count: MAX_JOBS_PER_ENQUEUE + 1,
            ..EnqueueJobs::default()
        })
        .unwrap_err();
    assert_eq!(error.status, 400);
    assert!(state.jobs.is_empty());
}

#[test]
fn a_runner_that_stops_renewing_its_job_is_lost_with_it() {
    let mut state = state_with(Config {
        runner_lost_timeout: Some(Duration::from_secs(10)),
        ..Config::default()
    });
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let sess = session(&mut state, tenant, set).session_id;
    let jobs = enqueue(&mut state, set, 2);
    let r1 = jit(&mut state, tenant, set, "r1").runner.id;
    let r2 = jit(&mut state, tenant, set, "r2").runner.id;
    for runner in [r1, r2] {
        state
            .mark_runner_online(&RunnerSelector {
                runner_id: Some(runner),
                jit_config: None,
            })
            .unwrap();
    }
    state.acquire_jobs(tenant, set, &sess, &jobs).unwrap();
    for job in &jobs {
        state.start_job(*job).unwrap();
    }
    // Both renew within the timeout; then only the first keeps renewing.
    state.advance(Duration::from_secs(8));
    assert!(!state.tick());
    for job in &jobs {
        state.renew_job(*job).unwrap();
    }
    state.advance(Duration::from_secs(8));
    state.renew_job(jobs[0]).unwrap();
    assert!(!state.tick(), "8 s without a renewal is not lost yet");
    state.advance(Duration::from_secs(2));
    assert!(state.tick());
    let lost = state.job_view(jobs[1]).unwrap();
    assert_eq!(
        (lost.state, lost.result.as_deref(), lost.runner_lost),
        (JobState::Completed, Some("failed"), true)
    );
    let runner_of_lost = lost.runner_id.unwrap();
    assert!(
        state.runner_view(runner_of_lost).is_err(),
        "the lost runner is gone from the service"
    );
    assert_eq!(state.remove_runner(tenant, runner_of_lost), Ok(()));
    assert_eq!(
        state.renew_job(jobs[1]).unwrap_err().status,
        409,
        "a late renewal tells the runner its job is over"
    );
    let alive = state.job_view(jobs[0]).unwrap();
    assert_eq!((alive.state, alive.runner_lost), (JobState::Running, false));
    assert_eq!(
        state.finish_job(jobs[0], "succeeded").unwrap().state,
        JobState::Completed
    );
    assert_eq!(state.renew_job(999).unwrap_err().status, 404);
}

#[test]
fn without_a_lost_timeout_a_job_that_is_never_renewed_keeps_running() {
    let mut state = state_with(Config {
        auto_online_runners: true,
        auto_start_jobs: true,
        ..Config::default()
    });
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let sess = session(&mut state, tenant, set).session_id;
    let job = enqueue(&mut state, set, 1)[0];
    jit(&mut state, tenant, set, "r1");
    state.acquire_jobs(tenant, set, &sess, &[job]).unwrap();
    state.advance(Duration::from_secs(86_400));
    assert!(!state.tick());
    assert_eq!(state.job_view(job).unwrap().state, JobState::Running);
}

#[test]
fn lifecycle_transitions_are_guarded() {
    let mut state = state();
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let job = enqueue(&mut state, set, 1)[0];
    assert_eq!(state.start_job(job).unwrap_err().status, 409);
    assert_eq!(state.finish_job(job, "succeeded").unwrap_err().status, 409);
    assert_eq!(state.requeue_job(job).unwrap_err().status, 409);
    assert_eq!(state.start_job(1).unwrap_err().status, 404);
}

#[test]
fn auto_start_and_auto_complete() {
    let mut state = state_with(Config {
        auto_online_runners: true,
        auto_start_jobs: true,
        auto_complete_after: Some(Duration::from_secs(5)),
        ..Config::default()
    });
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let sess = session(&mut state, tenant, set).session_id;
    let job = enqueue(&mut state, set, 1)[0];
    jit(&mut state, tenant, set, "r1");
    state.acquire_jobs(tenant, set, &sess, &[job]).unwrap();
    assert_eq!(state.job_view(job).unwrap().state, JobState::Running);
    assert!(!state.tick());
    state.advance(Duration::from_secs(5));
    assert!(state.tick());
    let view = state.job_view(job).unwrap();
    assert_eq!(
        (view.state, view.result.as_deref()),
        (JobState::Completed, Some("succeeded"))
    );
}

#[test]
fn enqueue_by_name_needs_scope_when_ambiguous() {
    let mut state = state();
    let (org_tenant, _) = register(&mut state);
    create_set(&mut state, org_tenant, "set");
    let repo = Scope::Repository {
        owner: "my-org".into(),
        repository: "repo".into(),
    };
    let repo_tenant = state.tenant_for_scope(&repo);
    create_set(&mut state, repo_tenant, "set");
    let by_name = |scope: Option<&str>| EnqueueJobs {
        scale_set_name: Some("set".into()),
        scope: scope.map(str::to_owned),
        ..EnqueueJobs::default()
    };
    assert_eq!(state.enqueue_jobs(&by_name(None)).unwrap_err().status, 409);
    let ids = state.enqueue_jobs(&by_name(Some("MY-ORG/repo"))).unwrap();
    let view = state.job_view(ids[0]).unwrap();
    assert_eq!(
        (view.owner.as_str(), view.repository.as_str()),
        ("my-org", "repo")
    );
    assert_eq!(
        view.workflow_ref,
        "my-org/repo/.github/workflows/ci.yml@refs/heads/main"
    );
}

mod github {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn registration_needs_a_credential() {
        let mut state = state();
        let scope = Scope::Organization("o".into());
        assert_eq!(
            state.registration_token(None, &scope).unwrap_err().status,
            401
        );
        assert_eq!(
            state
                .registration_token(Some("Basic x"), &scope)
                .unwrap_err()
                .status,
            401
        );
        assert!(state.registration_token(Some("token x"), &scope).is_ok());
    }

    #[test]
    fn strict_mode_accepts_only_configured_pats() {
        let mut state = state_with(Config {
            strict: Some(crate::config::StrictAuth {
                pats: vec!["good".into()],
                apps: Vec::new(),
            }),
            ..Config::default()
        });
        let scope = Scope::Organization("o".into());
        assert_eq!(
            state
                .registration_token(Some("Bearer bad"), &scope)
                .unwrap_err()
                .message,
            "Bad credentials"
        );
        let token = state
            .registration_token(Some("Bearer good"), &scope)
            .unwrap()
            .token;
        let body = br#"{"url":"http://h/o","runner_event":"register"}"#;
        assert_eq!(
            state
                .runner_registration(Some("RemoteAuth unknown"), body, BASE)
                .unwrap_err()
                .status,
            401
        );
        let wrong_scope = br#"{"url":"http://h/other","runner_event":"register"}"#;
        assert_eq!(
            state
                .runner_registration(Some(&format!("RemoteAuth {token}")), wrong_scope, BASE)
                .unwrap_err()
                .status,
            401
        );
        assert!(
            state
                .runner_registration(Some(&format!("RemoteAuth {token}")), body, BASE)
                .is_ok()
        );
        assert_eq!(
            state
                .installation_token(Some("Bearer x"), "1")
                .unwrap_err()
                .status,
            401
        );
    }

    #[test]
    fn runner_registration_validates_body() {
        let mut state = state();
        let auth = Some("RemoteAuth t");
        assert_eq!(
            state
                .runner_registration(auth, b"nope", BASE)
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            state
                .runner_registration(auth, br#"{"url":"http://h/o"}"#, BASE)
                .unwrap_err()
                .status,
            422
        );
        assert_eq!(
            state
                .runner_registration(
                    auth,
                    br#"{"url":"http://h/a/b/c","runner_event":"register"}"#,
                    BASE
                )
                .unwrap_err()
                .status,
            404
        );
        let ok = state
            .runner_registration(
                auth,
                br#"{"url":"http://h/enterprises/e","runner_event":"register"}"#,
                BASE,
            )
            .unwrap();
        assert_eq!(ok.url, format!("{BASE}/tenant/1/"));
        assert_eq!(state.snapshot().tenants[0].scope, "enterprises/e");
    }

    #[test]
    fn expired_registration_token_is_refused_even_without_strict_mode() {
        let mut state = state();
        let token = state
            .registration_token(Some("Bearer p"), &Scope::Organization("o".into()))
            .unwrap()
            .token;
        state.advance(Duration::from_secs(3601));
        let body = br#"{"url":"http://h/o","runner_event":"register"}"#;
        assert_eq!(
            state
                .runner_registration(Some(&format!("RemoteAuth {token}")), body, BASE)
                .unwrap_err()
                .status,
            401
        );
    }
}

// -------------------------------------------------------------------------------------------------------------
// Workflow runs in the GitHub REST API: a run's jobs and job re-runs.

fn run_of(state: &State, job: i64) -> (i64, i64) {
    let view = state.job_view(job).unwrap();
    (view.workflow_run_id, view.rest_id)
}

fn list(state: &State, run: i64, filter: RunJobsFilter) -> Vec<crate::wire::WorkflowJobJson> {
    state
        .run_jobs(
            "my-org",
            "repo",
            run,
            RunJobsQuery {
                filter,
                ..RunJobsQuery::default()
            },
            BASE,
        )
        .unwrap()
        .body
        .jobs
}

/// Online runner `name` in `set`; returns its id.
fn online_runner(state: &mut State, tenant: i64, set: i64, name: &str) -> i64 {
    let runner = jit(state, tenant, set, name).runner.id;
    state
        .mark_runner_online(&RunnerSelector {
            runner_id: Some(runner),
            jit_config: None,
        })
        .unwrap();
    runner
}

#[test]
fn a_failed_job_is_rerun_as_a_new_attempt_offered_like_a_new_job() {
    let mut state = state();
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let sess = session(&mut state, tenant, set).session_id;
    let job = enqueue(&mut state, set, 1)[0];
    let (run, rest_id) = run_of(&state, job);
    assert_ne!(rest_id, job, "REST ids are not request ids");

    let queued = list(&state, run, RunJobsFilter::Latest);
    assert_eq!(queued.len(), 1);
    let first = &queued[0];
    assert_eq!(
        (
            first.id,
            first.run_id,
            first.run_attempt,
            first.status.as_str(),
            first.conclusion.as_deref(),
            first.runner_name.as_deref(),
            first.completed_at.as_deref(),
        ),
        (rest_id, run, 1, "queued", None, None, None)
    );
    assert_eq!(first.name, "job-1");
    assert_eq!(first.labels, vec!["set"]);
    assert_eq!(first.head_branch.as_deref(), Some("main"));
    assert_eq!(
        first.workflow_name.as_deref(),
        Some(".github/workflows/ci.yml")
    );
    assert_eq!(
        first.url,
        format!("{BASE}/api/v3/repos/my-org/repo/actions/jobs/{rest_id}")
    );

    let (id1, _, _) = poll(&mut state, &sess, 0).unwrap();
    state.ack_message(&sess, id1).unwrap();
    state.acquire_jobs(tenant, set, &sess, &[job]).unwrap();
    let runner = online_runner(&mut state, tenant, set, "runner-1");
    let assigned = &list(&state, run, RunJobsFilter::Latest)[0];
    assert_eq!(
        (assigned.status.as_str(), assigned.runner_id),
        ("in_progress", Some(runner))
    );
    assert_eq!(
        (
            assigned.runner_group_id,
            assigned.runner_group_name.as_deref()
        ),
        (Some(1), Some("Default"))
    );
    state.start_job(job).unwrap();
    state.advance(Duration::from_secs(5));
    state.finish_job(job, "failed").unwrap();
    let failed = &list(&state, run, RunJobsFilter::Latest)[0];
    assert_eq!(
        (
            failed.status.as_str(),
            failed.conclusion.as_deref(),
            failed.runner_name.as_deref()
        ),
        ("completed", Some("failure"), Some("runner-1")),
        "the runner stays on the completed job, so it can be found by runner name"
    );
    assert_eq!(
        failed.completed_at.as_deref(),
        Some(rfc3339(T0 + 5_000).as_str())
    );
    let (id2, _, _) = poll(&mut state, &sess, id1).unwrap();
    state.ack_message(&sess, id2).unwrap();

    let rerun = state.rerun_job("My-Org", "REPO", rest_id, true).unwrap();
    assert_ne!(rerun.request_id, job);
    assert_ne!(rerun.rest_id, rest_id);
    assert_eq!(
        (
            rerun.state,
            rerun.run_attempt,
            rerun.rerun_of,
            rerun.workflow_run_id,
            rerun.scale_set_id,
            rerun.debug_logging,
        ),
        (JobState::Available, 2, Some(job), run, Some(set), true)
    );
    assert_eq!(
        (rerun.display_name.as_str(), rerun.labels.clone()),
        ("job-1", vec!["set".to_owned()])
    );
    assert_eq!(
        state.job_view(job).unwrap().next_attempt,
        Some(rerun.request_id)
    );
    assert_eq!(state.snapshot().job_reruns, 1);

    // The scale set hears of it as of any new job, and it runs through the usual life cycle.
    let (id3, body, stats) = poll(&mut state, &sess, id2).unwrap();
    assert_eq!(kinds(&body), vec!["JobAvailable"]);
    assert_eq!(body[0].runner_request_id, rerun.request_id);
    assert_eq!(body[0].workflow_run_id, run);
    assert_eq!(stats.total_available_jobs, 1);
    state.ack_message(&sess, id3).unwrap();
    assert_eq!(
        state
            .acquire_jobs(tenant, set, &sess, &[rerun.request_id])
            .unwrap(),
        vec![rerun.request_id]
    );

    let latest = list(&state, run, RunJobsFilter::Latest);
    assert_eq!(
        latest
            .iter()
            .map(|job| (job.id, job.run_attempt, job.status.as_str()))
            .collect::<Vec<_>>(),
        vec![(rerun.rest_id, 2, "queued")]
    );
    assert_eq!(latest[0].runner_name, None);
    let all = list(&state, run, RunJobsFilter::All);
    assert_eq!(
        all.iter()
            .map(|job| (job.id, job.run_attempt))
            .collect::<Vec<_>>(),
        vec![(rest_id, 1), (rerun.rest_id, 2)]
    );
}

#[test]
fn rerun_is_refused_while_the_run_runs_and_for_replaced_attempts() {
    let mut state = state_with(Config {
        auto_online_runners: true,
        ..Config::default()
    });
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let sess = session(&mut state, tenant, set).session_id;
    let jobs = enqueue(&mut state, set, 2);
    let (run, first) = run_of(&state, jobs[0]);
    let (_, second) = run_of(&state, jobs[1]);
    state.acquire_jobs(tenant, set, &sess, &jobs[..1]).unwrap();
    jit(&mut state, tenant, set, "r1");
    state.start_job(jobs[0]).unwrap();

    let running = state.rerun_job("my-org", "repo", first, false).unwrap_err();
    assert_eq!(running.status, 403);
    state.finish_job(jobs[0], "failed").unwrap();
    let sibling_queued = state.rerun_job("my-org", "repo", first, false).unwrap_err();
    assert_eq!(
        (sibling_queued.status, sibling_queued.message.as_str()),
        (
            403,
            "The workflow run containing this job is already running"
        ),
        "GitHub re-runs jobs only of a run that completed"
    );
    state.cancel_job(jobs[1]).unwrap();

    assert_eq!(
        state
            .rerun_job("other", "repo", first, false)
            .unwrap_err()
            .status,
        404
    );
    assert_eq!(
        state
            .rerun_job("my-org", "repo", jobs[0], false)
            .unwrap_err()
            .status,
        404,
        "a request id is not a REST id"
    );
    let rerun = state.rerun_job("my-org", "repo", first, false).unwrap();
    assert_eq!(rerun.run_attempt, 2);
    assert_eq!(
        state
            .rerun_job("my-org", "repo", second, false)
            .unwrap_err()
            .status,
        403,
        "the run runs again"
    );
    state.cancel_job(rerun.request_id).unwrap();
    assert_eq!(
        state
            .rerun_job("my-org", "repo", first, false)
            .unwrap_err()
            .status,
        403,
        "an attempt that was re-run is not re-run again"
    );
    // A cancelled job that never ran can be re-run; the run's attempt number goes on.
    let again = state.rerun_job("my-org", "repo", second, false).unwrap();
    assert_eq!((again.run_attempt, again.rerun_of), (3, Some(jobs[1])));
    let latest: Vec<(String, u32)> = list(&state, run, RunJobsFilter::Latest)
        .into_iter()
        .map(|job| (job.name, job.run_attempt))
        .collect();
    assert_eq!(
        latest,
        vec![("job-1".to_owned(), 2), ("job-2".to_owned(), 3)]
    );
    assert_eq!(list(&state, run, RunJobsFilter::All).len(), 4);
    assert_eq!(state.snapshot().job_reruns, 2);
}

#[test]
fn run_jobs_pages_and_404s() {
    let mut state = state();
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let jobs = enqueue(&mut state, set, 5);
    let (run, _) = run_of(&state, jobs[0]);
    let page = |state: &State, per_page, page| {
        state
            .run_jobs(
                "my-org",
                "repo",
                run,
                RunJobsQuery {
                    filter: RunJobsFilter::Latest,
                    per_page,
                    page,
                },
                BASE,
            )
            .unwrap()
    };
    let third = page(&state, 2, 3);
    assert_eq!((third.body.total_count, third.last_page), (5, 3));
    assert_eq!(
        third
            .body
            .jobs
            .iter()
            .map(|job| job.name.as_str())
            .collect::<Vec<_>>(),
        vec!["job-5"]
    );
    let beyond = page(&state, 2, 4);
    assert_eq!((beyond.body.total_count, beyond.body.jobs.len()), (5, 0));
    assert_eq!(page(&state, 30, 1).last_page, 1);

    let unknown_run = state
        .run_jobs("my-org", "repo", run + 1, RunJobsQuery::default(), BASE)
        .unwrap_err();
    assert_eq!(unknown_run, Rejection::new(404, "Not Found"));
    let other_repository = state
        .run_jobs("my-org", "other", run, RunJobsQuery::default(), BASE)
        .unwrap_err();
    assert_eq!(other_repository.status, 404);
}

#[test]
fn direct_delivery_assigns_a_rerun_at_once() {
    let mut state = state_with(Config {
        job_delivery: JobDelivery::Direct,
        ..Config::default()
    });
    let (tenant, _) = register(&mut state);
    let set = create_set(&mut state, tenant, "set");
    let sess = session(&mut state, tenant, set).session_id;
    let job = enqueue(&mut state, set, 1)[0];
    online_runner(&mut state, tenant, set, "r1");
    state.start_job(job).unwrap();
    state.finish_job(job, "failed").unwrap();
    let (id, _, _) = poll(&mut state, &sess, 0).unwrap();
    state.ack_message(&sess, id).unwrap();
    let (_, rest_id) = run_of(&state, job);
    let rerun = state.rerun_job("my-org", "repo", rest_id, false).unwrap();
    assert_eq!(rerun.state, JobState::Acquired);
    let (_, body, _) = poll(&mut state, &sess, id).unwrap();
    assert_eq!(kinds(&body), vec!["JobAssigned"]);
    assert_eq!(body[0].runner_request_id, rerun.request_id);
    online_runner(&mut state, tenant, set, "r2");
    assert_eq!(
        state.job_view(rerun.request_id).unwrap().state,
        JobState::Assigned
    );
}

#[test]
fn a_rerun_whose_scale_set_is_gone_waits_for_one_of_its_name() {
    let Acquired {
        mut state,
        tenant,
        set,
        jobs,
        ..
    } = acquired(1);
    let job = jobs[0];
    state.start_job(job).unwrap();
    state.finish_job(job, "failed").unwrap();
    state.delete_scale_set(Some(tenant), set, false).unwrap();
    let (_, rest_id) = run_of(&state, job);
    let rerun = state.rerun_job("my-org", "repo", rest_id, false).unwrap();
    assert_eq!((rerun.state, rerun.scale_set_id), (JobState::Queued, None));
    let successor = create_set(&mut state, tenant, "set");
    let adopted = state.job_view(rerun.request_id).unwrap();
    assert_eq!(
        (adopted.state, adopted.scale_set_id),
        (JobState::Available, Some(successor))
    );
}

#[test]
fn github_calls_need_a_credential_and_strict_mode_a_known_one() {
    let state = state();
    assert_eq!(state.authorize_github(None).unwrap_err().status, 401);
    assert_eq!(
        state.authorize_github(Some("Basic x")).unwrap_err().status,
        401
    );
    assert_eq!(state.authorize_github(Some("token anything")), Ok(()));
    let strict = state_with(Config {
        strict: Some(crate::config::StrictAuth {
            pats: vec!["ghp_known".into()],
            apps: Vec::new(),
        }),
        ..Config::default()
    });
    assert_eq!(strict.authorize_github(Some("Bearer ghp_known")), Ok(()));
    assert_eq!(
        strict.authorize_github(Some("Bearer ghp_other")),
        Err(Rejection::new(401, "Bad credentials"))
    );
}
