//! Fault injection over HTTP: error rates, 429 with Retry-After, latency, counters.

mod common;

use std::time::{Duration, Instant};

use common::{connect, control, fast_config, json_body, start};
use fake_actions_service::{ErrorFault, Faults, LatencyFault};
use pretty_assertions::assert_eq;
use reqwest::{Method, StatusCode};
use serde_json::json;

#[tokio::test]
async fn error_rate_is_reproducible_and_counted() {
    let fake = start(fast_config()).await;
    let tenant = connect(&fake.base_url(), "my-org").await;
    let rule = Faults {
        seed: 11,
        errors: vec![ErrorFault {
            endpoint: Some("get_scale_set_by_name".into()),
            status: 503,
            rate: 0.5,
            count: None,
            retry_after_secs: None,
        }],
        ..Faults::default()
    };
    let mut runs = Vec::new();
    for _ in 0..2 {
        fake.state().set_faults(rule.clone()).unwrap();
        let mut statuses = Vec::new();
        for _ in 0..40 {
            statuses.push(
                tenant
                    .call(Method::GET, "_apis/runtime/runnerscalesets?name=x", None)
                    .await
                    .status(),
            );
        }
        runs.push(statuses);
    }
    assert_eq!(runs[0], runs[1], "same seed, same faults");
    let failures = runs[0]
        .iter()
        .filter(|status| **status == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert!((8..=32).contains(&failures), "{failures} of 40");
    assert!(
        runs[0]
            .iter()
            .all(|status| *status == StatusCode::OK || *status == StatusCode::SERVICE_UNAVAILABLE)
    );
    // Other endpoints are untouched; faulted requests are counted.
    assert_eq!(
        tenant
            .call(Method::GET, "_apis/runtime/runnergroups/", None)
            .await
            .status(),
        StatusCode::OK
    );
    let counters = fake.state().counters();
    assert_eq!(counters["get_scale_set_by_name"], 80);
    assert_eq!(counters["get_runner_group_by_name"], 1);
}

#[tokio::test]
async fn next_n_failures_and_429_retry_after_over_the_control_api() {
    let fake = start(fast_config()).await;
    let base = fake.base_url();
    let tenant = connect(&base, "my-org").await;
    let response = control(
        &base,
        Method::PUT,
        "faults",
        Some(json!({"errors": [
            {"endpoint": "actions", "status": 429, "count": 1, "retryAfterSecs": 3},
            {"endpoint": "create_scale_set", "status": 500, "count": 2},
        ]})),
    )
    .await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);

    let response = tenant
        .call(Method::GET, "_apis/runtime/runnerscalesets", None)
        .await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "3");
    assert!(json_body(response).await["typeName"].is_string());

    let body = json!({"name": "s", "runnerGroupId": 1, "RunnerSetting": {}, "createdOn": "0001-01-01T00:00:00Z"});
    let statuses = [
        tenant
            .call(
                Method::POST,
                "_apis/runtime/runnerscalesets",
                Some(body.clone()),
            )
            .await
            .status(),
        tenant
            .call(
                Method::POST,
                "_apis/runtime/runnerscalesets",
                Some(body.clone()),
            )
            .await
            .status(),
        tenant
            .call(Method::POST, "_apis/runtime/runnerscalesets", Some(body))
            .await
            .status(),
    ];
    assert_eq!(
        statuses,
        [
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::OK
        ]
    );

    let faults = json_body(control(&base, Method::GET, "faults", None).await).await;
    assert_eq!(faults["errors"][1]["count"], 0);
    assert_eq!(
        control(&base, Method::DELETE, "faults", None)
            .await
            .status(),
        StatusCode::NO_CONTENT
    );

    let counters = json_body(control(&base, Method::GET, "counters", None).await).await;
    assert_eq!(counters["create_scale_set"], 3);
    assert_eq!(counters["registration_token"], 1);
    assert_eq!(
        control(&base, Method::DELETE, "counters", None)
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        json_body(control(&base, Method::GET, "counters", None).await).await,
        json!({})
    );

    let bad = control(
        &base,
        Method::PUT,
        "faults",
        Some(json!({"errors": [{"endpoint": "nope", "status": 500}]})),
    )
    .await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn latency_is_added_and_github_errors_use_github_bodies() {
    let fake = start(fast_config()).await;
    let base = fake.base_url();
    fake.state()
        .set_faults(Faults {
            latency: vec![LatencyFault {
                endpoint: Some("registration_token".into()),
                millis: 300,
            }],
            errors: vec![ErrorFault {
                endpoint: Some("runner_registration".into()),
                status: 502,
                rate: 1.0,
                count: Some(1),
                retry_after_secs: None,
            }],
            ..Faults::default()
        })
        .unwrap();
    let started = Instant::now();
    let response = reqwest::Client::new()
        .post(format!(
            "{base}/api/v3/orgs/o/actions/runners/registration-token"
        ))
        .header("Authorization", "Bearer pat")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(started.elapsed() >= Duration::from_millis(290));

    let response = reqwest::Client::new()
        .post(format!("{base}/api/v3/actions/runner-registration"))
        .header("Authorization", "RemoteAuth t")
        .body(r#"{"url":"http://h/o","runner_event":"register"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    let body = json_body(response).await;
    assert!(body["message"].is_string() && body.get("typeName").is_none());
}

#[tokio::test]
async fn scale_set_deleted_server_side() {
    let fake = start(fast_config()).await;
    let base = fake.base_url();
    let tenant = connect(&base, "my-org").await;
    let set_id = tenant.create_scale_set("s").await["id"].as_i64().unwrap();
    let session = tenant.session(set_id).await;
    let response = control(
        &base,
        Method::DELETE,
        &format!("scalesets/{set_id}?force=true"),
        None,
    )
    .await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        session.get_message(0).await.status(),
        StatusCode::UNAUTHORIZED
    );
    let response = tenant.create_session(set_id).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert!(
        json_body(response).await["typeName"]
            .as_str()
            .unwrap()
            .contains("RunnerScaleSetNotFoundException")
    );
    let response = tenant
        .call(
            Method::GET,
            "_apis/runtime/runnerscalesets?runnerGroupId=1&name=s",
            None,
        )
        .await;
    assert_eq!(json_body(response).await["count"], 0);
}
