//! A minimal protocol client over reqwest for the integration tests, written from
//! docs/reference/actions-service-protocol.md and independent of the `actions-client` crate, plus helpers to start a
//! fake.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::time::Duration;

use fake_actions_service::{Config, FakeActionsService};
use reqwest::{Method, Response, StatusCode};
use serde_json::{Value, json};

/// The scaleset client's User-Agent shape.
pub const USER_AGENT: &str = r#"{"system":"fake-tests","version":"0.1.0","commit_sha":"NA","scale_set_id":0,"subsystem":"tests","build_version":"devel","build_commit_sha":"unknown","kind":"scaleset"}"#;

/// Config for fast tests: short long polls.
pub fn fast_config() -> Config {
    Config {
        long_poll_timeout: Duration::from_millis(300),
        seed: Some(7),
        ..Config::default()
    }
}

pub async fn start(config: Config) -> FakeActionsService {
    FakeActionsService::start(config)
        .await
        .expect("the fake starts")
}

/// Body as JSON after stripping an optional UTF-8 BOM, as clients must.
pub async fn json_body(response: Response) -> Value {
    let bytes = response.bytes().await.expect("body");
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    serde_json::from_slice(bytes)
        .unwrap_or_else(|error| panic!("not JSON ({error}): {}", String::from_utf8_lossy(bytes)))
}

/// What a client holds after the GitHub API steps (registration token, runner registration).
#[derive(Clone, Debug)]
pub struct Tenant {
    pub http: reqwest::Client,
    pub base: String,
    pub service_url: String,
    pub admin_token: String,
}

/// Registration token with a PAT, then runner-registration, for `{base}/{scope}`.
pub async fn connect(base: &str, scope: &str) -> Tenant {
    let http = reqwest::Client::new();
    let scope_path = if scope.starts_with("enterprises/") {
        scope.to_owned()
    } else if scope.contains('/') {
        format!("repos/{scope}")
    } else {
        format!("orgs/{scope}")
    };
    let response = http
        .post(format!(
            "{base}/api/v3/{scope_path}/actions/runners/registration-token"
        ))
        .header("Content-Type", "application/vnd.github.v3+json")
        .header("Authorization", "Bearer ghp_test")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let registration = json_body(response).await;
    let token = registration["token"].as_str().unwrap().to_owned();
    let response = http
        .post(format!("{base}/api/v3/actions/runner-registration"))
        .header("Content-Type", "application/json")
        .header("Authorization", format!("RemoteAuth {token}"))
        .body(format!(
            "{}\n",
            json!({"url": format!("{base}/{scope}"), "runner_event": "register"})
        ))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    let admin = json_body(response).await;
    Tenant {
        http,
        base: base.to_owned(),
        service_url: admin["url"].as_str().unwrap().to_owned(),
        admin_token: admin["token"].as_str().unwrap().to_owned(),
    }
}

impl Tenant {
    /// An Actions Service call with the admin token and `api-version`.
    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Response {
        self.call_with_token(method, path, body, &self.admin_token)
            .await
    }

    pub async fn call_with_token(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        token: &str,
    ) -> Response {
        let separator = if path.contains('?') { '&' } else { '?' };
        let url = format!(
            "{}{}{separator}api-version=6.0-preview",
            self.service_url,
            path.trim_start_matches('/')
        );
        let request = self
            .http
            .request(method, url)
            .header("Content-Type", "application/json")
            .header("User-Agent", USER_AGENT)
            .header("Authorization", format!("Bearer {token}"));
        let request = match body {
            Some(body) => request.body(body.to_string()),
            None => request,
        };
        request.send().await.unwrap()
    }

    pub async fn create_scale_set(&self, name: &str) -> Value {
        let response = self
            .call(
                Method::POST,
                "_apis/runtime/runnerscalesets",
                Some(json!({
                    "name": name,
                    "runnerGroupId": 1,
                    "labels": [{"type": "System", "name": name}],
                    "RunnerSetting": {"disableUpdate": true},
                    "createdOn": "0001-01-01T00:00:00Z",
                })),
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        json_body(response).await
    }

    pub async fn create_session(&self, scale_set: i64) -> Response {
        self.call(
            Method::POST,
            &format!("_apis/runtime/runnerscalesets/{scale_set}/sessions"),
            Some(json!({"sessionId": "00000000-0000-0000-0000-000000000000", "ownerName": "test-host"})),
        )
        .await
    }

    pub async fn session(&self, scale_set: i64) -> Session {
        let response = self.create_session(scale_set).await;
        assert_eq!(response.status(), StatusCode::OK);
        let body = json_body(response).await;
        Session {
            http: self.http.clone(),
            scale_set,
            id: body["sessionId"].as_str().unwrap().to_owned(),
            queue_url: body["messageQueueUrl"].as_str().unwrap().to_owned(),
            token: body["messageQueueAccessToken"].as_str().unwrap().to_owned(),
            body,
        }
    }

    pub async fn jit_config(&self, scale_set: i64, name: &str) -> Response {
        self.call(
            Method::POST,
            &format!("_apis/runtime/runnerscalesets/{scale_set}/generatejitconfig"),
            Some(json!({"name": name, "workFolder": ""})),
        )
        .await
    }
}

/// A message session as a client holds it.
#[derive(Clone, Debug)]
pub struct Session {
    pub http: reqwest::Client,
    pub scale_set: i64,
    pub id: String,
    pub queue_url: String,
    pub token: String,
    pub body: Value,
}

impl Session {
    /// Get a message: `GET {messageQueueUrl}` plus `lastMessageId` when > 0.
    pub async fn get_message(&self, last_message_id: i64) -> Response {
        let mut url = reqwest::Url::parse(&self.queue_url).unwrap();
        if last_message_id > 0 {
            url.query_pairs_mut()
                .append_pair("lastMessageId", &last_message_id.to_string());
        }
        self.http
            .get(url)
            .header("Accept", "application/json; api-version=6.0-preview")
            .header("Authorization", format!("Bearer {}", self.token))
            .header("X-ScaleSetMaxCapacity", "10")
            .send()
            .await
            .unwrap()
    }

    /// Poll until a message arrives (the fake answers 202 after its short timeout).
    pub async fn next_message(&self, last_message_id: i64) -> Value {
        for _ in 0..20 {
            let response = self.get_message(last_message_id).await;
            match response.status() {
                StatusCode::OK => return json_body(response).await,
                StatusCode::ACCEPTED => continue,
                other => panic!(
                    "unexpected poll status {other}: {}",
                    response.text().await.unwrap()
                ),
            }
        }
        panic!("no message arrived");
    }

    /// Acknowledge a message: `DELETE {queue path}/{id}` keeping the query.
    pub async fn delete_message(&self, message_id: i64) -> Response {
        let mut url = reqwest::Url::parse(&self.queue_url).unwrap();
        let path = format!("{}/{message_id}", url.path().trim_end_matches('/'));
        url.set_path(&path);
        self.http
            .delete(url)
            .header("Content-Type", "application/json")
            .header("Authorization", format!("Bearer {}", self.token))
            .send()
            .await
            .unwrap()
    }

    /// Acquire jobs with the queue token.
    pub async fn acquire(&self, tenant: &Tenant, ids: &[i64]) -> Response {
        tenant
            .call_with_token(
                Method::POST,
                &format!(
                    "_apis/runtime/runnerscalesets/{}/acquirejobs",
                    self.scale_set
                ),
                Some(json!(ids)),
                &self.token,
            )
            .await
    }
}

/// The job messages in a message's `body` string.
pub fn job_messages(message: &Value) -> Vec<Value> {
    match message["body"].as_str() {
        Some(body) if !body.is_empty() => serde_json::from_str(body).unwrap(),
        _ => Vec::new(),
    }
}

pub fn kinds(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|message| message["messageType"].as_str().unwrap().to_owned())
        .collect()
}

/// A control API call.
pub async fn control(base: &str, method: Method, path: &str, body: Option<Value>) -> Response {
    let request = reqwest::Client::new().request(method, format!("{base}/_fake/{path}"));
    let request = match body {
        Some(body) => request.json(&body),
        None => request,
    };
    request.send().await.unwrap()
}
