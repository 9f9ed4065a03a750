//! Message sessions over HTTP: conflict, long-poll timing, token expiry and refresh, dropped sessions.

mod common;

use std::time::{Duration, Instant};

use common::{connect, fast_config, job_messages, json_body, kinds, start};
use fake_actions_service::{Config, DropSessions, EnqueueJobs, ExpireTokens, TokenKind};
use pretty_assertions::assert_eq;
use reqwest::{Method, StatusCode};

#[tokio::test]
async fn second_session_gets_409_conflict() {
    let fake = start(fast_config()).await;
    let tenant = connect(&fake.base_url(), "my-org").await;
    let set_id = tenant.create_scale_set("dev").await["id"].as_i64().unwrap();
    let _first = tenant.session(set_id).await;
    let response = tenant.create_session(set_id).await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let body = json_body(response).await;
    assert!(
        body["typeName"]
            .as_str()
            .unwrap()
            .contains("RunnerScaleSetSessionConflictException")
    );
    assert_eq!(
        body["message"],
        "The actions runner scaleset dev already has an active session."
    );
}

#[tokio::test]
async fn empty_long_poll_waits_for_the_timeout_then_202() {
    let fake = start(Config {
        long_poll_timeout: Duration::from_millis(400),
        ..fast_config()
    })
    .await;
    let tenant = connect(&fake.base_url(), "my-org").await;
    let set_id = tenant.create_scale_set("s").await["id"].as_i64().unwrap();
    let session = tenant.session(set_id).await;
    let started = Instant::now();
    let response = session.get_message(0).await;
    let waited = started.elapsed();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    assert!(
        waited >= Duration::from_millis(390),
        "answered after {waited:?}"
    );
    assert!(waited < Duration::from_secs(5), "answered after {waited:?}");
    let snapshot = fake.state().snapshot();
    assert_eq!(snapshot.sessions[0].last_max_capacity, Some(10));
}

#[tokio::test]
async fn waiting_long_poll_returns_as_soon_as_a_job_arrives() {
    let fake = start(Config {
        long_poll_timeout: Duration::from_secs(20),
        ..fast_config()
    })
    .await;
    let tenant = connect(&fake.base_url(), "my-org").await;
    let set_id = tenant.create_scale_set("s").await["id"].as_i64().unwrap();
    let session = tenant.session(set_id).await;
    let handle = fake.state();
    let enqueue = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        handle.enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(set_id),
            ..EnqueueJobs::default()
        })
    });
    let started = Instant::now();
    let response = session.get_message(0).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        kinds(&job_messages(&json_body(response).await)),
        vec!["JobAvailable"]
    );
    enqueue.await.unwrap().unwrap();
}

#[tokio::test]
async fn expired_queue_token_gets_401_and_refresh_issues_a_new_one() {
    let fake = start(Config {
        message_queue_token_lifetime: Duration::from_millis(800),
        long_poll_timeout: Duration::from_millis(100),
        ..fast_config()
    })
    .await;
    let tenant = connect(&fake.base_url(), "my-org").await;
    let set_id = tenant.create_scale_set("s").await["id"].as_i64().unwrap();
    let mut session = tenant.session(set_id).await;
    tokio::time::sleep(Duration::from_millis(900)).await;

    for response in [
        session.get_message(0).await,
        session.delete_message(1).await,
        session.acquire(&tenant, &[]).await,
    ] {
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }

    // PATCH with no body, admin token.
    let response = tenant
        .http
        .patch(format!(
            "{}_apis/runtime/runnerscalesets/{set_id}/sessions/{}?api-version=6.0-preview",
            tenant.service_url, session.id
        ))
        .header("Content-Type", "application/json")
        .header("Authorization", format!("Bearer {}", tenant.admin_token))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let refreshed = json_body(response).await;
    assert_eq!(refreshed["sessionId"], session.id.as_str());
    assert!(refreshed["statistics"].is_object());
    let new_token = refreshed["messageQueueAccessToken"].as_str().unwrap();
    assert_ne!(new_token, session.token);
    session.token = new_token.to_owned();
    assert_eq!(session.get_message(0).await.status(), StatusCode::ACCEPTED);
    let response = session.acquire(&tenant, &[]).await;
    assert_eq!(
        json_body(response).await,
        serde_json::json!({"count": 0, "value": []})
    );
}

#[tokio::test]
async fn forced_token_expiry_through_the_handle() {
    let fake = start(fast_config()).await;
    let tenant = connect(&fake.base_url(), "my-org").await;
    let set_id = tenant.create_scale_set("s").await["id"].as_i64().unwrap();
    let session = tenant.session(set_id).await;
    let expired = fake.state().expire_tokens(&ExpireTokens {
        kind: TokenKind::MessageQueue,
        session_id: None,
        scale_set_id: Some(set_id),
        tenant_id: None,
    });
    assert_eq!(expired, 1);
    assert_eq!(
        session.get_message(0).await.status(),
        StatusCode::UNAUTHORIZED
    );
    fake.state().expire_tokens(&ExpireTokens {
        kind: TokenKind::Admin,
        session_id: None,
        scale_set_id: None,
        tenant_id: None,
    });
    let response = tenant
        .call(Method::GET, "_apis/runtime/runnerscalesets", None)
        .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn dropped_session_poll_gets_401_and_refresh_gets_404() {
    let fake = start(fast_config()).await;
    let tenant = connect(&fake.base_url(), "my-org").await;
    let set_id = tenant.create_scale_set("s").await["id"].as_i64().unwrap();
    let session = tenant.session(set_id).await;
    let dropped = fake.state().drop_sessions(&DropSessions {
        session_id: Some(session.id.clone()),
        ..DropSessions::default()
    });
    assert_eq!(dropped, 1);
    assert_eq!(
        session.get_message(0).await.status(),
        StatusCode::UNAUTHORIZED
    );
    let response = tenant
        .call(
            Method::PATCH,
            &format!(
                "_apis/runtime/runnerscalesets/{set_id}/sessions/{}",
                session.id
            ),
            None,
        )
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert!(
        json_body(response).await["typeName"]
            .as_str()
            .unwrap()
            .contains("RunnerAdminException")
    );
    // A new session can be created at once.
    assert_eq!(tenant.create_session(set_id).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn session_dropped_during_a_long_poll_ends_it_with_401() {
    let fake = start(Config {
        long_poll_timeout: Duration::from_secs(20),
        ..fast_config()
    })
    .await;
    let tenant = connect(&fake.base_url(), "my-org").await;
    let set_id = tenant.create_scale_set("s").await["id"].as_i64().unwrap();
    let session = tenant.session(set_id).await;
    let handle = fake.state();
    let dropper = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        handle.drop_sessions(&DropSessions::default())
    });
    let started = Instant::now();
    assert_eq!(
        session.get_message(0).await.status(),
        StatusCode::UNAUTHORIZED
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(dropper.await.unwrap(), 1);
}

#[tokio::test]
async fn shutdown_ends_pending_long_polls() {
    let fake = start(Config {
        long_poll_timeout: Duration::from_secs(30),
        ..fast_config()
    })
    .await;
    let tenant = connect(&fake.base_url(), "my-org").await;
    let set_id = tenant.create_scale_set("s").await["id"].as_i64().unwrap();
    let session = tenant.session(set_id).await;
    let poll = tokio::spawn(async move { session.get_message(0).await.status() });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    fake.shutdown().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(poll.await.unwrap(), StatusCode::ACCEPTED);
}
