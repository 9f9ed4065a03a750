//! The real `listener` binary, at `RUST_LOG=trace`, through a whole job against a strict fake Actions Service
//! and a real API server: once with a PAT and once with GitHub App credentials. No log line may contain the
//! PAT, a line of the App's private key, the App JWT, a token the fake issued (installation, registration,
//! admin, message queue) or the runner's JIT config.
//!
//! The fake keeps the tokens it issues to itself, so the listener reaches it through a small TCP relay that
//! records every response: the tokens are read from the bytes the listener actually received. Each scan also
//! checks that the logs hold the lines of the run (the session id, the acquired job, the patches), so an empty
//! or truncated log cannot pass.

mod common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actions_client::JitSetting;
use common::{ORG, client, create_scale_set, fake_config};
use crds::{EphemeralRunner, EphemeralRunnerSet, EphemeralRunnerSetSpec, EphemeralRunnerSpec};
use fake_actions_service::{
    EnqueueJobs, FakeActionsService, GitHubApp, JobState, RunnerSelector, StrictAuth,
};
use k8s_openapi::api::core::v1::{Container, PodSpec};
use kube::api::{ObjectMeta, PostParams};
use serde_json::json;
use test_harness::TestContext;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const WAIT: Duration = Duration::from_secs(60);
const ERS: &str = "scan-set";
const RUNNER: &str = "scan-runner";
/// The PAT the test itself uses to set up the fake (scale set, JIT config); the listener never sees it.
const SETUP_PAT: &str = "ghp_test";
const APP_ID: &str = "Iv1.logscan";
const INSTALLATION_ID: i64 = 4242;

/// The credentials the listener gets, and what must not leak from them.
enum Credentials {
    Pat(String),
    App {
        private_key: String,
        public_key: String,
    },
}

/// Bytes the fake sent back to the listener, through the relay.
#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<Vec<u8>>>);

impl Recorded {
    fn text(&self) -> String {
        String::from_utf8_lossy(
            &self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_owned()
    }

    /// Every string value of `"field":"..."` in the recorded responses.
    fn values_of(&self, field: &str) -> Vec<String> {
        let text = self.text();
        let needle = format!("\"{field}\":\"");
        text.match_indices(&needle)
            .filter_map(|(at, _)| {
                let rest = &text[at + needle.len()..];
                rest.find('"').map(|end| rest[..end].to_owned())
            })
            .collect()
    }
}

/// A TCP relay to `upstream` on a free local port; returns its address. The fake builds the URLs it hands out
/// (Actions Service, message queue) from the Host header, so everything the listener does goes through here.
async fn relay(upstream: std::net::SocketAddr, recorded: Recorded) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("relay port");
    let addr = listener.local_addr().expect("relay address");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let recorded = recorded.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let requests = tokio::spawn(async move {
                    tokio::io::copy(&mut client_read, &mut server_write)
                        .await
                        .ok();
                    server_write.shutdown().await.ok();
                });
                let mut buffer = vec![0_u8; 16 * 1024];
                while let Ok(n) = server_read.read(&mut buffer).await {
                    if n == 0 {
                        break;
                    }
                    recorded
                        .0
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .extend_from_slice(&buffer[..n]);
                    if client_write.write_all(&buffer[..n]).await.is_err() {
                        break;
                    }
                }
                client_write.shutdown().await.ok();
                requests.abort();
            });
        }
    });
    addr
}

/// The listener's output (stdout and stderr, line by line) as it is written.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<String>>);

impl Logs {
    fn collect(
        &self,
        stream: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let logs = self.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stream).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut text = logs
                    .0
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                text.push_str(&line);
                text.push('\n');
            }
        })
    }

    fn text(&self) -> String {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The last lines, for failure messages.
    fn tail(&self) -> String {
        let text = self.text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Polls `check` until it returns `Some`; on timeout fails with the end of the listener's output.
    async fn wait<T, F, Fut>(&self, what: &str, timeout: Duration, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(value) = check().await {
                return value;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}; the listener's last lines:\n{}",
                self.tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn runner_spec(config_url: &str, scale_set_id: i64) -> EphemeralRunnerSpec {
    EphemeralRunnerSpec {
        github_config_url: config_url.to_owned(),
        github_config_secret: "github-secret".to_owned(),
        runner_scale_set_id: scale_set_id,
        spec: PodSpec {
            containers: vec![Container {
                name: "runner".to_owned(),
                image: Some("ghcr.io/actions/actions-runner:latest".to_owned()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }
        .into(),
        ..EphemeralRunnerSpec::default()
    }
}

async fn create_objects(ctx: &TestContext, config_url: &str, scale_set_id: i64) {
    test_harness::apply_crds(&ctx.client, &crds::all_crds())
        .await
        .expect("CRDs installed");
    let set = EphemeralRunnerSet {
        metadata: ObjectMeta {
            name: Some(ERS.to_owned()),
            ..ObjectMeta::default()
        },
        spec: EphemeralRunnerSetSpec {
            replicas: 0,
            patch_id: 0,
            ephemeral_runner_spec: runner_spec(config_url, scale_set_id),
            ephemeral_runner_metadata: None,
        },
        status: None,
    };
    ctx.api::<EphemeralRunnerSet>()
        .create(&PostParams::default(), &set)
        .await
        .expect("EphemeralRunnerSet created");
    let runner = EphemeralRunner {
        metadata: ObjectMeta {
            name: Some(RUNNER.to_owned()),
            ..ObjectMeta::default()
        },
        spec: runner_spec(config_url, scale_set_id),
        status: None,
    };
    ctx.api::<EphemeralRunner>()
        .create(&PostParams::default(), &runner)
        .await
        .expect("EphemeralRunner created");
}

async fn replicas(ctx: &TestContext) -> Option<i64> {
    ctx.api::<EphemeralRunnerSet>()
        .get_opt(ERS)
        .await
        .ok()
        .flatten()
        .map(|set| set.spec.replicas)
}

/// What one run left behind: the listener's output, and the secrets that must not be in it.
struct Run {
    logs: String,
    session_id: String,
    secrets: Vec<(String, String)>,
}

/// Runs the binary through a session, a job (acquired, assigned, started, completed) and a SIGTERM.
async fn run(prefix: &str, credentials: &Credentials, log_format: &str) -> Run {
    let ctx = TestContext::new(prefix).await;
    let mut strict = StrictAuth {
        pats: vec![SETUP_PAT.to_owned()],
        apps: Vec::new(),
    };
    match credentials {
        Credentials::Pat(pat) => strict.pats.push(pat.clone()),
        Credentials::App { public_key, .. } => strict.apps.push(GitHubApp {
            app_id: APP_ID.to_owned(),
            installation_ids: vec![INSTALLATION_ID],
            public_key_pem: public_key.clone(),
        }),
    }
    let fake = FakeActionsService::start(fake_actions_service::Config {
        strict: Some(strict),
        ..fake_config()
    })
    .await
    .expect("fake starts");
    let scale_set_id = create_scale_set(&fake, "scan").await;
    let recorded = Recorded::default();
    let relay_addr = relay(fake.addr(), recorded.clone()).await;
    let config_url = format!("http://{relay_addr}/{ORG}");
    create_objects(&ctx, &config_url, scale_set_id).await;

    let mut config = json!({
        "configure_url": config_url,
        "ephemeral_runner_set_namespace": ctx.namespace,
        "ephemeral_runner_set_name": ERS,
        "max_runners": 5,
        "min_runners": 0,
        "runner_scale_set_id": scale_set_id,
        "runner_scale_set_name": "scan",
        "log_level": "debug",
        "log_format": log_format,
        "metrics_addr": "",
        "health_addr": "",
    });
    match credentials {
        Credentials::Pat(pat) => config["github_token"] = json!(pat),
        Credentials::App { private_key, .. } => {
            config["github_app_id"] = json!(APP_ID);
            config["github_app_installation_id"] = json!(INSTALLATION_ID);
            config["github_app_private_key"] = json!(private_key);
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("config.json");
    std::fs::write(&path, config.to_string()).expect("write the config");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_listener"))
        .env("LISTENER_CONFIG_PATH", &path)
        .env("KUBECONFIG", ctx.control_plane.kubeconfig_path())
        .env("RUST_LOG", "trace")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the listener binary starts");
    let logs = Logs::default();
    let readers = [
        logs.collect(child.stdout.take().expect("stdout")),
        logs.collect(child.stderr.take().expect("stderr")),
    ];

    let state = fake.state();
    let session_id = logs
        .wait("a message session", WAIT, || async {
            state.snapshot().sessions.first().map(|s| s.id.clone())
        })
        .await;
    let job = state
        .enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(scale_set_id),
            count: 1,
            ..EnqueueJobs::default()
        })
        .expect("job enqueued")[0];
    logs.wait("the job to be acquired and scaled for", WAIT, || async {
        (replicas(&ctx).await == Some(1)).then_some(())
    })
    .await;
    // The runner the controller would create: a JIT config, reported in by the runner process.
    let jit = client(&fake)
        .generate_jit_runner_config(
            scale_set_id,
            &JitSetting {
                name: RUNNER.to_owned(),
                work_folder: "_work".to_owned(),
            },
        )
        .await
        .expect("JIT config");
    let jit_config = jit.encoded_jit_config.expose_secret().to_owned();
    // What the controller records once the runner's pod exists: the registration its job will start on.
    let registration = jit.runner.as_ref().expect("runner").id;
    ctx.api::<EphemeralRunner>()
        .patch_status(
            RUNNER,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"status": {"runnerId": registration}})),
        )
        .await
        .expect("registration recorded");
    state
        .mark_runner_online(&RunnerSelector {
            runner_id: None,
            jit_config: Some(jit_config.clone()),
        })
        .expect("runner online");
    logs.wait("the job to reach the runner", WAIT, || async {
        (state.job(job).expect("job").state == JobState::Assigned).then_some(())
    })
    .await;
    state.start_job(job).expect("job started");
    logs.wait("the EphemeralRunner status patch", WAIT, || async {
        ctx.api::<EphemeralRunner>()
            .get(RUNNER)
            .await
            .ok()
            .and_then(|runner| runner.status)
            .is_some_and(|status| status.job_request_id == job)
            .then_some(())
    })
    .await;
    state.finish_job(job, "succeeded").expect("job finished");
    logs.wait("scaled back to zero", WAIT, || async {
        (replicas(&ctx).await == Some(0)).then_some(())
    })
    .await;

    let pid = child.id().expect("still running").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the listener exits after SIGTERM")
        .expect("exit status");
    for reader in readers {
        reader.await.expect("log reader");
    }
    assert_eq!(status.code(), Some(0), "{}", logs.tail());

    let mut secrets: Vec<(String, String)> = Vec::new();
    match credentials {
        Credentials::Pat(pat) => secrets.push(("the PAT".to_owned(), pat.clone())),
        Credentials::App { private_key, .. } => {
            for line in private_key
                .lines()
                .filter(|line| !line.starts_with("-----") && !line.trim().is_empty())
            {
                secrets.push(("a line of the private key".to_owned(), line.to_owned()));
            }
        }
    }
    // What the listener received: installation and registration tokens, the admin token ("token" of each
    // GitHub answer) and the message-queue tokens of the session (created, and refreshed if it was).
    let tokens = recorded.values_of("token");
    let queue_tokens = recorded.values_of("messageQueueAccessToken");
    assert!(
        !queue_tokens.is_empty(),
        "no session token seen by the relay"
    );
    let admin_tokens: Vec<&String> = tokens.iter().filter(|t| t.starts_with("eyJ")).collect();
    assert!(!admin_tokens.is_empty(), "no admin token seen: {tokens:?}");
    if matches!(credentials, Credentials::App { .. }) {
        assert!(
            tokens.iter().any(|t| t.starts_with("ghs_")),
            "no installation token seen: {tokens:?}"
        );
    }
    for token in tokens {
        secrets.push(("a token the fake issued".to_owned(), token));
    }
    for token in queue_tokens {
        secrets.push(("a message-queue token".to_owned(), token));
    }
    // The JIT config is base64 of JSON; any 40 characters of it are as telling as the whole.
    let middle = jit_config.len() / 2;
    secrets.push((
        "the JIT config".to_owned(),
        jit_config[middle..middle + 40].to_owned(),
    ));
    Run {
        logs: logs.text(),
        session_id,
        secrets,
    }
}

/// The run's logs are complete, and none of its secrets is in them; nor is anything shaped like a token or a JWT.
fn assert_clean(run: &Run) {
    let lines: Vec<&str> = run.logs.lines().collect();
    assert!(lines.len() > 100, "trace logs were captured: {}", run.logs);
    assert!(
        run.logs.contains("TRACE"),
        "RUST_LOG=trace reached the subscriber"
    );
    for expected in [
        run.session_id.as_str(),
        "obtained Actions Service admin token",
        "acquired jobs",
        "EphemeralRunnerSet patched",
        "EphemeralRunner status updated",
        "job completed",
        "message session deleted",
    ] {
        assert!(
            run.logs.contains(expected),
            "no log line contains {expected:?}"
        );
    }
    for (what, secret) in &run.secrets {
        assert!(secret.len() >= 16, "{what} is too short to scan for");
        let leaks: Vec<&&str> = lines.iter().filter(|line| line.contains(secret)).collect();
        assert!(
            leaks.is_empty(),
            "{what} appears in {} log line(s), e.g. {:?}",
            leaks.len(),
            leaks.first()
        );
    }
    // Tokens the relay could not see (the App JWT the listener signs) have recognisable shapes.
    for line in &lines {
        for marker in ["ghs_", "mq_", "eyJ", "PRIVATE KEY"] {
            assert!(
                !line.contains(marker),
                "a log line holds something shaped like a secret ({marker}): {line}"
            );
        }
    }
}

#[tokio::test]
async fn a_pat_never_reaches_the_listener_logs() {
    let run = run(
        "listener-scan-pat",
        &Credentials::Pat("ghp_log_scan_listener_6c1e0b9d".to_owned()),
        "text",
    )
    .await;
    assert_clean(&run);
}

#[tokio::test]
async fn github_app_credentials_never_reach_the_listener_logs() {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("an RSA key");
    let run = run(
        "listener-scan-app",
        &Credentials::App {
            private_key: key.serialize_pem(),
            public_key: key.public_key_pem(),
        },
        "json",
    )
    .await;
    assert_clean(&run);
}

/// Guards the scan itself: the relay's token extraction reads what a GitHub answer looks like.
#[test]
fn recorded_values_are_read_from_json_bodies() {
    let recorded = Recorded::default();
    recorded.0.lock().unwrap().extend_from_slice(
        br#"HTTP/1.1 201 Created\r\n\r\n{"token":"ghs_abc","expires_at":"x"}{"token":"eyJ1"}"#,
    );
    assert_eq!(recorded.values_of("token"), ["ghs_abc", "eyJ1"]);
    assert!(recorded.values_of("messageQueueAccessToken").is_empty());
}
