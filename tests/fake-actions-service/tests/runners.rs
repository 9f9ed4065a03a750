//! Runners over HTTP: JIT registration, removal rules, lookups.

mod common;

use common::{connect, control, fast_config, json_body, start};
use fake_actions_service::{EnqueueJobs, RunnerSelector};
use pretty_assertions::assert_eq;
use reqwest::{Method, StatusCode};
use serde_json::json;

#[tokio::test]
async fn removal_is_refused_while_the_runner_holds_a_job() {
    let fake = start(fast_config()).await;
    let base = fake.base_url();
    let tenant = connect(&base, "my-org").await;
    let set_id = tenant.create_scale_set("s").await["id"].as_i64().unwrap();
    let session = tenant.session(set_id).await;
    let handle = fake.state();
    let job = handle
        .enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(set_id),
            ..EnqueueJobs::default()
        })
        .unwrap()[0];
    assert_eq!(
        session.acquire(&tenant, &[job]).await.status(),
        StatusCode::OK
    );
    let jit = json_body(tenant.jit_config(set_id, "busy-runner").await).await;
    let runner = jit["runner"]["id"].as_i64().unwrap();
    handle
        .mark_runner_online(&RunnerSelector {
            runner_id: Some(runner),
            ..RunnerSelector::default()
        })
        .unwrap();
    handle.start_job(job).unwrap();

    let remove = |id: i64| {
        let tenant = tenant.clone();
        async move {
            tenant
                .call(
                    Method::DELETE,
                    &format!("_apis/distributedtask/pools/0/agents/{id}"),
                    None,
                )
                .await
        }
    };
    let response = remove(runner).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(
        json_body(response).await["typeName"]
            .as_str()
            .unwrap()
            .contains("JobStillRunningException")
    );

    // Unknown runners: removal is 204, lookup is 404 AgentNotFoundException.
    assert_eq!(remove(987_654).await.status(), StatusCode::NO_CONTENT);
    let response = tenant
        .call(
            Method::GET,
            "_apis/distributedtask/pools/0/agents/987654",
            None,
        )
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert!(
        json_body(response).await["typeName"]
            .as_str()
            .unwrap()
            .contains("AgentNotFoundException")
    );

    // A stand-in runner watches itself through the control API until its job is over.
    let response = control(&base, Method::GET, &format!("runners/{runner}"), None).await;
    assert_eq!(json_body(response).await["jobRequestId"], job);

    // After the job the ephemeral runner is gone; removing it is a 204 no-op.
    let response = control(&base, Method::POST, &format!("jobs/{job}/finish"), None).await;
    assert_eq!(json_body(response).await["result"], "succeeded");
    assert_eq!(remove(runner).await.status(), StatusCode::NO_CONTENT);
    assert!(handle.snapshot().runners.is_empty());
    let response = control(&base, Method::GET, &format!("runners/{runner}"), None).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn idle_runner_removal_and_duplicate_names() {
    let fake = start(fast_config()).await;
    let tenant = connect(&fake.base_url(), "my-org").await;
    let set_id = tenant.create_scale_set("s").await["id"].as_i64().unwrap();
    let other_set = tenant.create_scale_set("t").await["id"].as_i64().unwrap();
    let jit = json_body(tenant.jit_config(set_id, "r1").await).await;
    assert!(jit["encodedJITConfig"].as_str().unwrap().len() > 40);

    // Names are unique across the tenant, whatever the scale set.
    let response = tenant.jit_config(other_set, "r1").await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert!(
        json_body(response).await["typeName"]
            .as_str()
            .unwrap()
            .contains("AgentExistsException")
    );

    let id = jit["runner"]["id"].as_i64().unwrap();
    let response = tenant
        .call(
            Method::DELETE,
            &format!("_apis/distributedtask/pools/0/agents/{id}"),
            None,
        )
        .await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        tenant.jit_config(other_set, "r1").await.status(),
        StatusCode::OK
    );

    // JIT for an unknown scale set.
    let response = tenant.jit_config(424_242, "r2").await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    // The consumed config of a removed runner cannot come online.
    let response = control(
        &fake.base_url(),
        Method::POST,
        "runners/online",
        Some(json!({"jitConfig": jit["encodedJITConfig"]})),
    )
    .await;
    assert_eq!(response.status(), StatusCode::GONE);
}
