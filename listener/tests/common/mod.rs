//! Helpers shared by the listener's integration tests: a fake Actions Service with a scale set, fast loop
//! settings, an in-memory Kubernetes target, and polling waits.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actions_client::{
    ActionsClient, ClientOptions, Credentials, GitHubConfig, HttpOptions, JitSetting, RetryPolicy,
    RunnerScaleSet, SecretString, Timeouts,
};
use fake_actions_service::{FakeActionsService, RunnerSelector};
use listener::target::{RunnerPatched, RunnerSetPatched, RunnerSetTarget};
use listener::{Error, ScaleSet, Settings};
use serde_json::Value;

pub const ORG: &str = "my-org";

/// A fake with short long polls and a short session idle timeout, so stale sessions expire within a test.
pub fn fake_config() -> fake_actions_service::Config {
    fake_actions_service::Config {
        long_poll_timeout: Duration::from_millis(500),
        session_idle_timeout: Some(Duration::from_secs(4)),
        seed: Some(7),
        ..fake_actions_service::Config::default()
    }
}

/// Transport settings with fast retries and test-sized timeouts.
pub fn fast_http() -> HttpOptions {
    HttpOptions {
        retry: RetryPolicy {
            max_retries: 2,
            min_wait: Duration::from_millis(20),
            max_wait: Duration::from_millis(100),
            jitter: true,
        },
        timeouts: Timeouts {
            connect: Duration::from_secs(2),
            request: Duration::from_secs(5),
            call: Duration::from_secs(10),
            long_poll_request: Duration::from_secs(10),
            long_poll_call: Duration::from_secs(20),
        },
        ..HttpOptions::default()
    }
}

/// Loop settings with millisecond backoffs.
pub fn fast_settings() -> Settings {
    Settings {
        transient_backoff: RetryPolicy {
            min_wait: Duration::from_millis(50),
            max_wait: Duration::from_millis(400),
            ..listener::backoff::TRANSIENT
        },
        fatal_backoff: RetryPolicy {
            min_wait: Duration::from_millis(200),
            max_wait: Duration::from_secs(1),
            ..listener::backoff::FATAL
        },
        step_retry_budget: Duration::from_secs(2),
        health_limit: Duration::from_secs(20),
        http: fast_http(),
        close_timeout: Duration::from_secs(5),
        runner_patch_attempts: 5,
        status_heartbeat: Duration::from_secs(2),
        // Every message patches, as in ARC: these tests follow the protocol patch by patch.
        patch_coalesce_window: Duration::ZERO,
    }
}

pub fn config_url(fake: &FakeActionsService) -> String {
    format!("{}/{ORG}", fake.base_url())
}

/// A PAT client for the fake.
pub fn client(fake: &FakeActionsService) -> ActionsClient {
    let github = GitHubConfig::parse_with(&config_url(fake), false).expect("config URL");
    ActionsClient::new(
        github,
        &Credentials::Pat(SecretString::new("ghp_test")),
        ClientOptions {
            http: fast_http(),
            ..ClientOptions::default()
        },
    )
    .expect("client")
}

/// Creates scale set `name` in the default group; returns its id.
pub async fn create_scale_set(fake: &FakeActionsService, name: &str) -> i64 {
    client(fake)
        .create_runner_scale_set(&RunnerScaleSet {
            name: name.to_owned(),
            runner_group_id: 1,
            ..RunnerScaleSet::default()
        })
        .await
        .expect("scale set created")
        .id
}

/// Registers runner `name` in the scale set and marks it online; returns its id.
pub async fn online_runner(fake: &FakeActionsService, scale_set_id: i64, name: &str) -> i64 {
    let jit = client(fake)
        .generate_jit_runner_config(
            scale_set_id,
            &JitSetting {
                name: name.to_owned(),
                work_folder: "_work".to_owned(),
            },
        )
        .await
        .expect("JIT config");
    let id = jit.runner.expect("runner").id;
    fake.state()
        .mark_runner_online(&RunnerSelector {
            runner_id: Some(id),
            jit_config: None,
        })
        .expect("online");
    id
}

/// The loop's view of a scale set on the fake.
pub fn scale_set(
    fake: &FakeActionsService,
    id: i64,
    min_runners: i64,
    max_runners: u32,
) -> ScaleSet {
    ScaleSet {
        github: GitHubConfig::parse_with(&config_url(fake), false).expect("config URL"),
        credentials: Credentials::Pat(SecretString::new("ghp_test")),
        client_options: ClientOptions {
            http: fast_http(),
            ..ClientOptions::default()
        },
        id,
        owner_name: "listener-test".to_owned(),
        min_runners,
        max_runners,
    }
}

/// Polls `condition` every 50 ms until it holds or `timeout` passes; returns whether it held.
pub async fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Like [`eventually`] for async conditions.
pub async fn eventually_async<F, Fut>(timeout: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if condition().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What an in-memory EphemeralRunnerSet saw.
#[derive(Debug, Default)]
pub struct Recorded {
    /// Every EphemeralRunnerSet patch that succeeded, in order.
    pub set_patches: Vec<Value>,
    /// Every EphemeralRunner status patch that succeeded.
    pub runner_patches: Vec<(String, Value)>,
    /// Fail this many EphemeralRunnerSet patches (with a 500) before accepting again.
    pub fail_set_patches: u32,
    /// Fail this many EphemeralRunner patches (with a 503).
    pub fail_runner_patches: u32,
    /// Current `spec.replicas`.
    pub replicas: i64,
    /// Every successful patch in order: `set` for the EphemeralRunnerSet, `runner:NAME` for a runner's status.
    pub calls: Vec<String>,
    /// The set's `metadata.generation`: one more with every patch.
    pub generation: i64,
    /// The generation the set's controller recorded as acted upon (`None`: it records none, as ARC's).
    pub applied_generation: Option<i64>,
}

/// A [`RunnerSetTarget`] that applies merge patches to an in-memory replica count.
#[derive(Clone, Default)]
pub struct RecordingTarget {
    pub recorded: Arc<Mutex<Recorded>>,
}

fn api_error(code: u16) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure("injected by the test", "InternalError")
            .with_code(code)
            .boxed(),
    )
}

impl RecordingTarget {
    pub fn with<R>(&self, f: impl FnOnce(&mut Recorded) -> R) -> R {
        let mut guard = self
            .recorded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard)
    }

    pub fn replicas(&self) -> i64 {
        self.with(|r| r.replicas)
    }

    pub fn set_patches(&self) -> Vec<Value> {
        self.with(|r| r.set_patches.clone())
    }

    pub fn runner_patches(&self) -> Vec<(String, Value)> {
        self.with(|r| r.runner_patches.clone())
    }
}

impl RunnerSetTarget for RecordingTarget {
    async fn patch_runner_set(&self, patch: &Value) -> Result<RunnerSetPatched, Error> {
        self.with(|r| {
            if r.fail_set_patches > 0 {
                r.fail_set_patches -= 1;
                return Err(Error::PatchEphemeralRunnerSet {
                    namespace: "ns".into(),
                    name: "set".into(),
                    source: api_error(500),
                });
            }
            r.set_patches.push(patch.clone());
            r.calls.push("set".to_owned());
            match &patch["spec"]["replicas"] {
                Value::Null if patch["spec"].get("replicas").is_some() => r.replicas = 0,
                Value::Number(n) => r.replicas = n.as_i64().unwrap_or_default(),
                _ => {}
            }
            // Every patch changes the spec (a new patch id), so it makes a new generation; the test says which
            // generation the set's controller has acted upon.
            r.generation += 1;
            Ok(RunnerSetPatched {
                replicas: r.replicas,
                generation: Some(r.generation),
                applied_generation: r.applied_generation,
            })
        })
    }

    async fn patch_runner_status(
        &self,
        name: &str,
        _runner_id: i64,
        patch: &Value,
    ) -> Result<RunnerPatched, Error> {
        self.with(|r| {
            if r.fail_runner_patches > 0 {
                r.fail_runner_patches -= 1;
                return Err(Error::PatchEphemeralRunner {
                    namespace: "ns".into(),
                    name: name.to_owned(),
                    source: api_error(503),
                });
            }
            r.runner_patches.push((name.to_owned(), patch.clone()));
            r.calls.push(format!("runner:{name}"));
            Ok(RunnerPatched::Patched)
        })
    }
}
