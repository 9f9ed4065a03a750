//! The control API routes over HTTP (the in-process handle is exercised by the other tests).

mod common;

use common::{connect, control, fast_config, json_body, start};
use fake_actions_service::{JobState, JobView, RunnerView, StateSnapshot};
use pretty_assertions::assert_eq;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn ok_json(response: reqwest::Response) -> Value {
    assert_eq!(response.status(), StatusCode::OK);
    json_body(response).await
}

#[tokio::test]
async fn every_control_route_works_over_http() {
    let fake = start(fast_config()).await;
    let base = fake.base_url();
    assert_eq!(
        control(&base, Method::GET, "healthz", None)
            .await
            .text()
            .await
            .unwrap(),
        "ok"
    );

    let group = ok_json(
        control(
            &base,
            Method::POST,
            "runner-groups",
            Some(json!({"scope": "my-org", "name": "gpu"})),
        )
        .await,
    )
    .await;
    assert_eq!(group, json!({"id": 2, "name": "gpu", "isDefault": false}));

    let tenant = connect(&base, "my-org").await;
    let set_id = tenant.create_scale_set("s").await["id"].as_i64().unwrap();
    let session = tenant.session(set_id).await;

    let jobs = ok_json(
        control(
            &base,
            Method::POST,
            "jobs",
            Some(json!({"scaleSetId": set_id, "count": 3, "repository": "app", "labels": ["s", "linux"], "eventName": "workflow_dispatch"})),
        )
        .await,
    )
    .await;
    let ids: Vec<i64> = serde_json::from_value(jobs["jobIds"].clone()).unwrap();
    let view: JobView = serde_json::from_value(
        ok_json(control(&base, Method::GET, &format!("jobs/{}", ids[0]), None).await).await,
    )
    .unwrap();
    assert_eq!(
        (view.repository.as_str(), view.owner.as_str(), view.state),
        ("app", "my-org", JobState::Available)
    );
    assert_eq!(view.labels, vec!["s", "linux"]);

    // Cancel one while available; requeue one after acquiring; run the third on a runner taken offline first.
    let cancelled: JobView = serde_json::from_value(
        ok_json(
            control(
                &base,
                Method::POST,
                &format!("jobs/{}/cancel", ids[0]),
                None,
            )
            .await,
        )
        .await,
    )
    .unwrap();
    assert_eq!(cancelled.result.as_deref(), Some("canceled"));
    let response = session.acquire(&tenant, &ids).await;
    assert_eq!(json_body(response).await["value"], json!([ids[1], ids[2]]));
    let requeued: JobView = serde_json::from_value(
        ok_json(
            control(
                &base,
                Method::POST,
                &format!("jobs/{}/requeue", ids[1]),
                None,
            )
            .await,
        )
        .await,
    )
    .unwrap();
    assert_eq!(
        (requeued.state, requeued.times_requeued),
        (JobState::Available, 1)
    );

    let jit = json_body(tenant.jit_config(set_id, "r1").await).await;
    let runner_id = jit["runner"]["id"].as_i64().unwrap();
    let online: RunnerView = serde_json::from_value(
        ok_json(
            control(
                &base,
                Method::POST,
                "runners/online",
                Some(json!({"runnerId": runner_id})),
            )
            .await,
        )
        .await,
    )
    .unwrap();
    assert_eq!(online.job_request_id, Some(ids[2]));
    let offline: RunnerView = serde_json::from_value(
        ok_json(
            control(
                &base,
                Method::POST,
                &format!("runners/{runner_id}/offline"),
                None,
            )
            .await,
        )
        .await,
    )
    .unwrap();
    assert_eq!((offline.online, offline.job_request_id), (false, None));
    let response = control(&base, Method::POST, &format!("jobs/{}/start", ids[2]), None).await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert!(json_body(response).await["message"].is_string());
    assert_eq!(
        control(&base, Method::DELETE, &format!("runners/{runner_id}"), None)
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        control(&base, Method::DELETE, &format!("runners/{runner_id}"), None)
            .await
            .status(),
        StatusCode::NOT_FOUND
    );

    // Tokens and sessions.
    let expired = ok_json(
        control(
            &base,
            Method::POST,
            "tokens/expire",
            Some(json!({"kind": "messageQueue"})),
        )
        .await,
    )
    .await;
    assert_eq!(expired, json!({"count": 1}));
    assert_eq!(
        session.get_message(0).await.status(),
        StatusCode::UNAUTHORIZED
    );
    let dropped = ok_json(
        control(
            &base,
            Method::POST,
            "sessions/drop",
            Some(json!({"scaleSetId": set_id})),
        )
        .await,
    )
    .await;
    assert_eq!(dropped, json!({"count": 1}));

    // Bad inputs.
    assert_eq!(
        control(
            &base,
            Method::POST,
            "tokens/expire",
            Some(json!({"kind": "nope"}))
        )
        .await
        .status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        control(&base, Method::POST, "jobs", Some(json!({})))
            .await
            .status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        control(&base, Method::GET, "jobs/1", None).await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        control(
            &base,
            Method::POST,
            "runners/online",
            Some(json!({"jitConfig": "x"}))
        )
        .await
        .status(),
        StatusCode::NOT_FOUND
    );

    // State snapshot and user agents.
    let snapshot: StateSnapshot =
        serde_json::from_value(ok_json(control(&base, Method::GET, "state", None).await).await)
            .unwrap();
    assert_eq!(snapshot.tenants[0].runner_groups.len(), 2);
    assert!(snapshot.sessions.is_empty());
    assert_eq!(
        snapshot.scale_sets[0].statistics.total_acquired_jobs, 1,
        "the third job waits for a runner"
    );
    let agents = ok_json(control(&base, Method::GET, "user-agents", None).await).await;
    assert_eq!(agents["create_scale_set"], common::USER_AGENT);

    // Deleting the scale set queues the jobs it had not run.
    assert_eq!(
        control(&base, Method::DELETE, &format!("scalesets/{set_id}"), None)
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    let snapshot = fake.state().snapshot();
    assert!(snapshot.scale_sets.is_empty());
    let states: Vec<JobState> = snapshot.jobs.iter().map(|job| job.state).collect();
    assert_eq!(
        states,
        vec![JobState::Completed, JobState::Queued, JobState::Queued]
    );
}

#[tokio::test]
async fn acquirable_jobs_for_the_older_arc_client() {
    let fake = start(fast_config()).await;
    let tenant = connect(&fake.base_url(), "my-org").await;
    let set_id = tenant.create_scale_set("s").await["id"].as_i64().unwrap();
    let path = format!("_apis/runtime/runnerscalesets/{set_id}/acquirablejobs");
    assert_eq!(
        tenant.call(Method::GET, &path, None).await.status(),
        StatusCode::NO_CONTENT
    );
    let ids = fake
        .state()
        .enqueue_jobs(&fake_actions_service::EnqueueJobs {
            scale_set_id: Some(set_id),
            count: 2,
            ..Default::default()
        })
        .unwrap();
    let body = ok_json(tenant.call(Method::GET, &path, None).await).await;
    assert_eq!(body["count"], 2);
    assert_eq!(body["value"][0]["runnerRequestId"], ids[0]);
    assert_eq!(body["value"][0]["messageType"], "JobAvailable");
    assert!(
        body["value"][0]["acquireJobUrl"]
            .as_str()
            .unwrap()
            .ends_with("/acquirejobs")
    );
}
