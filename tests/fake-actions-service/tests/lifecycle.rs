//! The whole job life cycle over real HTTP: GitHub API, Actions Service, message queue and control API.

mod common;

use common::{connect, control, fast_config, job_messages, json_body, kinds, start};
use fake_actions_service::{JobState, StateSnapshot};
use pretty_assertions::assert_eq;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

#[tokio::test]
async fn job_lifecycle_through_http_endpoints() {
    let fake = start(fast_config()).await;
    let base = fake.base_url();
    let tenant = connect(&base, "my-org").await;
    assert_eq!(tenant.service_url, format!("{base}/tenant/1/"));

    let set = tenant.create_scale_set("arc-set").await;
    let set_id = set["id"].as_i64().unwrap();
    assert_eq!(set["runnerGroupName"], "Default");
    assert_eq!(set["RunnerSetting"], json!({"disableUpdate": true}));

    let session = tenant.session(set_id).await;
    assert_eq!(session.body["statistics"]["totalAssignedJobs"], 0);
    assert_eq!(session.body["runnerScaleSet"]["id"], set_id);

    // Enqueue through the control API.
    let response = control(
        &base,
        Method::POST,
        "jobs",
        Some(json!({"scaleSetName": "arc-set", "count": 2})),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let job_ids: Vec<i64> =
        serde_json::from_value(json_body(response).await["jobIds"].clone()).unwrap();
    assert_eq!(job_ids.len(), 2);

    // JobAvailable x2, then ack and acquire.
    let message = session.next_message(0).await;
    assert_eq!(message["messageType"], "RunnerScaleSetJobMessages");
    let first_id = message["messageId"].as_i64().unwrap();
    let available = job_messages(&message);
    assert_eq!(kinds(&available), vec!["JobAvailable", "JobAvailable"]);
    assert_eq!(message["statistics"]["totalAvailableJobs"], 2);
    assert_eq!(
        session.delete_message(first_id).await.status(),
        StatusCode::NO_CONTENT
    );
    let ids: Vec<i64> = available
        .iter()
        .map(|m| m["runnerRequestId"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, job_ids);
    let response = session.acquire(&tenant, &ids).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(json_body(response).await, json!({"count": 2, "value": ids}));

    // JobAssigned x2 and the scaling signal.
    let message = session.next_message(first_id).await;
    let second_id = message["messageId"].as_i64().unwrap();
    assert!(second_id > first_id);
    assert_eq!(
        kinds(&job_messages(&message)),
        vec!["JobAssigned", "JobAssigned"]
    );
    assert_eq!(message["statistics"]["totalAssignedJobs"], 2);
    session.delete_message(second_id).await;

    // Two runners; the pods report in with their JIT configs.
    let mut runner_ids = Vec::new();
    for name in ["runner-a", "runner-b"] {
        let response = tenant.jit_config(set_id, name).await;
        assert_eq!(response.status(), StatusCode::OK);
        let jit = json_body(response).await;
        assert_eq!(jit["runner"]["name"], name);
        assert_eq!(jit["runner"]["runnerScaleSetId"], set_id);
        runner_ids.push(jit["runner"]["id"].as_i64().unwrap());
        let online = control(
            &base,
            Method::POST,
            "runners/online",
            Some(json!({"jitConfig": jit["encodedJITConfig"]})),
        )
        .await;
        assert_eq!(online.status(), StatusCode::OK);
    }
    let snapshot: StateSnapshot =
        serde_json::from_value(json_body(control(&base, Method::GET, "state", None).await).await)
            .unwrap();
    assert!(
        snapshot
            .jobs
            .iter()
            .all(|job| job.state == JobState::Assigned)
    );

    // Start both, finish both.
    for id in &job_ids {
        let response = control(&base, Method::POST, &format!("jobs/{id}/start"), None).await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let message = session.next_message(second_id).await;
    let third_id = message["messageId"].as_i64().unwrap();
    let started = job_messages(&message);
    assert_eq!(kinds(&started), vec!["JobStarted", "JobStarted"]);
    let started_runners: Vec<i64> = started
        .iter()
        .map(|m| m["runnerId"].as_i64().unwrap())
        .collect();
    assert_eq!(started_runners, runner_ids);
    assert_eq!(message["statistics"]["totalRunningJobs"], 2);
    assert_eq!(message["statistics"]["totalBusyRunners"], 2);
    session.delete_message(third_id).await;

    for (id, result) in job_ids.iter().zip(["succeeded", "failed"]) {
        let response = control(
            &base,
            Method::POST,
            &format!("jobs/{id}/finish"),
            Some(json!({"result": result})),
        )
        .await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let message = session.next_message(third_id).await;
    let completed = job_messages(&message);
    assert_eq!(kinds(&completed), vec!["JobCompleted", "JobCompleted"]);
    let results: Vec<&str> = completed
        .iter()
        .map(|m| m["result"].as_str().unwrap())
        .collect();
    assert_eq!(results, vec!["succeeded", "failed"]);
    let zero = json!({
        "totalAvailableJobs": 0, "totalAcquiredJobs": 0, "totalAssignedJobs": 0, "totalRunningJobs": 0,
        "totalRegisteredRunners": 0, "totalBusyRunners": 0, "totalIdleRunners": 0,
    });
    assert_eq!(message["statistics"], zero);
    session
        .delete_message(message["messageId"].as_i64().unwrap())
        .await;

    // Every job completed exactly once; no runner left.
    let snapshot = fake.state().snapshot();
    assert!(snapshot.runners.is_empty());
    assert!(
        snapshot
            .jobs
            .iter()
            .all(|job| job.state == JobState::Completed && job.times_started == 1)
    );
    assert!(snapshot.scale_sets[0].unacked_message_ids.is_empty());

    // Session delete, then scale set delete.
    let response = tenant
        .call(
            Method::DELETE,
            &format!(
                "_apis/runtime/runnerscalesets/{set_id}/sessions/{}",
                session.id
            ),
            None,
        )
        .await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let response = tenant
        .call(
            Method::DELETE,
            &format!("_apis/runtime/runnerscalesets/{set_id}"),
            None,
        )
        .await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let response = tenant
        .call(
            Method::GET,
            &format!("_apis/runtime/runnerscalesets/{set_id}"),
            None,
        )
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert!(
        json_body(response).await["typeName"]
            .as_str()
            .unwrap()
            .contains("RunnerScaleSetNotFoundException")
    );
    fake.shutdown().await.unwrap();
}

#[tokio::test]
async fn lookups_by_name_follow_the_list_envelope() {
    let fake = start(fast_config()).await;
    fake.state().add_runner_group("my-org", "gpu").unwrap();
    let tenant = connect(&fake.base_url(), "my-org").await;
    let set = tenant.create_scale_set("my set+1").await;

    // Query values are form-decoded: a properly encoded name with a space and a plus finds the set.
    let response = tenant
        .call(
            Method::GET,
            "_apis/runtime/runnerscalesets?runnerGroupId=1&name=my%20set%2B1",
            None,
        )
        .await;
    assert_eq!(
        json_body(response).await,
        json!({"count": 1, "value": [set]})
    );
    let response = tenant
        .call(
            Method::GET,
            "_apis/runtime/runnerscalesets?runnerGroupId=2&name=my%20set%2B1",
            None,
        )
        .await;
    assert_eq!(json_body(response).await, json!({"count": 0, "value": []}));

    // Runner groups: trailing slash kept by clients; case-insensitive name.
    let response = tenant
        .call(
            Method::GET,
            "_apis/runtime/runnergroups/?groupName=GPU",
            None,
        )
        .await;
    assert_eq!(
        json_body(response).await,
        json!({"count": 1, "value": [{"id": 2, "name": "gpu", "size": 0, "isDefaultGroup": false}]})
    );
    let response = tenant
        .call(
            Method::GET,
            "_apis/runtime/runnergroups/?groupName=nope",
            None,
        )
        .await;
    assert_eq!(json_body(response).await["count"], 0);

    // Runners by name and id.
    let set_id = set["id"].as_i64().unwrap();
    let jit = json_body(tenant.jit_config(set_id, "r-1").await).await;
    let runner = jit["runner"].clone();
    let response = tenant
        .call(
            Method::GET,
            "_apis/distributedtask/pools/0/agents?agentName=r-1",
            None,
        )
        .await;
    assert_eq!(
        json_body(response).await,
        json!({"count": 1, "value": [runner]})
    );
    let id = runner["id"].as_i64().unwrap();
    let response = tenant
        .call(
            Method::GET,
            &format!("_apis/distributedtask/pools/0/agents/{id}"),
            None,
        )
        .await;
    assert_eq!(json_body(response).await, runner);

    // Update: only present fields change.
    let response = tenant
        .call(
            Method::PATCH,
            &format!("_apis/runtime/runnerscalesets/{set_id}"),
            Some(json!({"runnerGroupId": 2, "RunnerSetting": {}, "createdOn": "0001-01-01T00:00:00Z"})),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let updated = json_body(response).await;
    assert_eq!(
        (
            updated["runnerGroupId"].clone(),
            updated["runnerGroupName"].clone()
        ),
        (json!(2), json!("gpu"))
    );
    assert_eq!(updated["name"], "my set+1");
    assert_eq!(updated["RunnerSetting"], json!({"disableUpdate": true}));
}

#[tokio::test]
async fn protocol_details_headers_slashes_and_versions() {
    let fake = start(fast_config()).await;
    let base = fake.base_url();
    let tenant = connect(&base, "octo/repo").await;

    // ActivityId on Actions Service responses; X-GitHub-Request-Id on GitHub ones.
    let response = tenant
        .call(Method::GET, "_apis/runtime/runnerscalesets", None)
        .await;
    assert!(response.headers().contains_key("activityid"));
    let response = reqwest::Client::new()
        .post(format!(
            "{base}/api/v3/repos/octo/repo/actions/runners/registration-token"
        ))
        .header("Authorization", "Bearer x")
        .send()
        .await
        .unwrap();
    assert!(response.headers().contains_key("x-github-request-id"));

    // ARC's older client joins with a double slash before _apis.
    let set_id = tenant.create_scale_set("s").await["id"].as_i64().unwrap();
    let response = tenant
        .http
        .get(format!(
            "{}/_apis/runtime/runnerscalesets/{set_id}?api-version=6.0-preview",
            tenant.service_url
        ))
        .header("Authorization", format!("Bearer {}", tenant.admin_token))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    // api-version is required on Actions Service calls.
    let response = tenant
        .http
        .get(format!(
            "{}_apis/runtime/runnerscalesets/{set_id}",
            tenant.service_url
        ))
        .header("Authorization", format!("Bearer {}", tenant.admin_token))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);

    // An admin token of another tenant is refused.
    let other = connect(&base, "other-org").await;
    let response = tenant
        .call_with_token(
            Method::GET,
            &format!("_apis/runtime/runnerscalesets/{set_id}"),
            None,
            &other.admin_token,
        )
        .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    // Unknown paths are 404 with an exception body; wrong methods 405.
    let response = tenant
        .call(Method::GET, "_apis/runtime/nothing", None)
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert!(json_body(response).await["typeName"].is_string());
    let response = tenant
        .call(
            Method::PUT,
            &format!("_apis/runtime/runnerscalesets/{set_id}"),
            None,
        )
        .await;
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn admin_token_is_a_jwt_with_configured_expiry() {
    let fake = start(fake_actions_service::Config {
        admin_token_lifetime: std::time::Duration::from_secs(90),
        ..fast_config()
    })
    .await;
    let tenant = connect(&fake.base_url(), "enterprises/acme").await;
    let parts: Vec<&str> = tenant.admin_token.split('.').collect();
    assert_eq!(parts.len(), 3);
    use base64::Engine as _;
    let claims: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(parts[1])
            .unwrap(),
    )
    .unwrap();
    let now = jiff::Timestamp::now().as_second();
    let exp = claims["exp"].as_i64().unwrap();
    assert!(
        (now + 85..=now + 91).contains(&exp),
        "exp {exp} vs now {now}"
    );
}

#[tokio::test]
async fn byte_order_mark_is_sent_when_configured() {
    let fake = start(fake_actions_service::Config {
        byte_order_mark: true,
        ..fast_config()
    })
    .await;
    let tenant = connect(&fake.base_url(), "my-org").await;
    let response = tenant
        .call(Method::GET, "_apis/runtime/runnerscalesets", None)
        .await;
    let bytes = response.bytes().await.unwrap();
    assert!(bytes.starts_with(b"\xEF\xBB\xBF{"), "{bytes:?}");
}

#[tokio::test]
async fn autopilot_runs_jobs_without_a_runner_process() {
    let fake = start(fake_actions_service::Config {
        auto_online_runners: true,
        auto_start_jobs: true,
        auto_complete_after: Some(std::time::Duration::from_millis(100)),
        ..fast_config()
    })
    .await;
    let tenant = connect(&fake.base_url(), "my-org").await;
    let set_id = tenant.create_scale_set("auto").await["id"]
        .as_i64()
        .unwrap();
    let session = tenant.session(set_id).await;
    let jobs = fake
        .state()
        .enqueue_jobs(&fake_actions_service::EnqueueJobs {
            scale_set_id: Some(set_id),
            ..Default::default()
        })
        .unwrap();
    session.acquire(&tenant, &jobs).await;
    assert_eq!(
        tenant.jit_config(set_id, "auto-1").await.status(),
        StatusCode::OK
    );
    let done = fake
        .state()
        .wait_for(std::time::Duration::from_secs(10), |state| {
            state
                .jobs
                .iter()
                .all(|job| job.state == JobState::Completed)
        })
        .await
        .expect("the job completes by itself");
    assert_eq!(done.jobs[0].result.as_deref(), Some("succeeded"));
    assert!(done.runners.is_empty());

    // The listener hears the whole story, in order.
    let mut seen = Vec::new();
    let mut last = 0;
    while seen.len() < 4 {
        let message = session.next_message(last).await;
        last = message["messageId"].as_i64().unwrap();
        seen.extend(kinds(&job_messages(&message)));
    }
    assert_eq!(
        seen,
        vec!["JobAvailable", "JobAssigned", "JobStarted", "JobCompleted"]
    );
}
