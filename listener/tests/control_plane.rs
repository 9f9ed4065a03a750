//! The listener against a real kube-apiserver (test harness) and the fake Actions Service over HTTP: the
//! EphemeralRunnerSet and EphemeralRunner patches as the API server stores them, the metrics and health
//! endpoints, recovery from a missing EphemeralRunnerSet, and the real binary's configuration errors and
//! SIGTERM handling.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{
    ORG, create_scale_set, eventually, eventually_async, fake_config, fast_settings, online_runner,
};
use crds::{EphemeralRunner, EphemeralRunnerSet, EphemeralRunnerSetSpec, EphemeralRunnerSpec};
use fake_actions_service::{EnqueueJobs, FakeActionsService};
use k8s_openapi::api::core::v1::{Container, PodSpec};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use listener::{Config, Listener};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use test_harness::TestContext;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);
const ERS: &str = "linux-abc12";

async fn context(prefix: &str) -> TestContext {
    let ctx = TestContext::new(prefix).await;
    test_harness::apply_crds(&ctx.client, &crds::all_crds())
        .await
        .expect("CRDs installed");
    ctx
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

async fn create_runner_set(ctx: &TestContext, config_url: &str, scale_set_id: i64) {
    let ers = EphemeralRunnerSet {
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
        .create(&PostParams::default(), &ers)
        .await
        .expect("EphemeralRunnerSet created");
}

async fn create_runner(ctx: &TestContext, name: &str, config_url: &str, scale_set_id: i64) {
    let er = EphemeralRunner {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: runner_spec(config_url, scale_set_id),
        status: None,
    };
    ctx.api::<EphemeralRunner>()
        .create(&PostParams::default(), &er)
        .await
        .expect("EphemeralRunner created");
}

fn config_json(
    fake: &FakeActionsService,
    namespace: &str,
    scale_set_id: i64,
    min: i64,
    max: i64,
) -> Value {
    json!({
        "configure_url": format!("{}/{ORG}", fake.base_url()),
        "github_token": "ghp_test",
        "ephemeral_runner_set_namespace": namespace,
        "ephemeral_runner_set_name": ERS,
        "max_runners": max,
        "min_runners": min,
        "runner_scale_set_id": scale_set_id,
        "runner_scale_set_name": "linux",
        "log_level": "debug",
        "log_format": "text",
        "metrics_addr": "127.0.0.1:0",
        "metrics_endpoint": "/metrics",
        "metrics": null
    })
}

struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<listener::Result<()>>,
    metrics_url: String,
    health_url: String,
}

impl Running {
    async fn start(ctx: &TestContext, config: &Value) -> Self {
        let config = Config::decode(config.to_string().as_bytes()).expect("config decodes");
        config.validate().expect("config is valid");
        let listener = Listener::start(&config, ctx.client.clone(), fast_settings())
            .await
            .expect("listener starts");
        let addr = listener.metrics_addr().expect("metrics bound");
        assert_eq!(
            listener.health_addr(),
            Some(addr),
            "health shares the metrics address"
        );
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(listener.run(shutdown.clone()));
        Self {
            shutdown,
            task,
            metrics_url: format!("http://{addr}/metrics"),
            health_url: format!("http://{addr}/healthz"),
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let outcome = tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("stops promptly")
            .expect("no panic");
        assert!(outcome.is_ok(), "{:?}", outcome.err());
    }
}

async fn runner_set(ctx: &TestContext) -> Option<EphemeralRunnerSet> {
    ctx.api::<EphemeralRunnerSet>()
        .get_opt(ERS)
        .await
        .ok()
        .flatten()
}

/// Waits until the stored EphemeralRunnerSet satisfies `check`; returns the last object seen.
async fn wait_runner_set(
    ctx: &TestContext,
    why: &str,
    check: impl Fn(&EphemeralRunnerSetSpec) -> bool,
) -> EphemeralRunnerSet {
    let mut last = None;
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        last = runner_set(ctx).await;
        if last.as_ref().is_some_and(|ers| check(&ers.spec)) {
            return last.unwrap_or_default();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{why}: EphemeralRunnerSet is {:?}", last.map(|e| e.spec));
}

fn enqueue(fake: &FakeActionsService, scale_set_id: i64, count: u32) -> Vec<i64> {
    fake.state()
        .enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(scale_set_id),
            count,
            ..EnqueueJobs::default()
        })
        .expect("enqueued")
}

#[tokio::test]
async fn scales_the_ephemeral_runner_set_with_assigned_jobs() {
    let ctx = context("listener-scale").await;
    let fake = FakeActionsService::start(fake_config()).await.unwrap();
    let id = create_scale_set(&fake, "linux").await;
    let config_url = format!("{}/{ORG}", fake.base_url());
    create_runner_set(&ctx, &config_url, id).await;
    let running = Running::start(&ctx, &config_json(&fake, &ctx.namespace, id, 1, 10)).await;

    let ers = wait_runner_set(&ctx, "initial min", |s| s.replicas == 1).await;
    assert_eq!(ers.spec.patch_id, 0, "the first patch converges");
    let managers: Vec<String> = ers
        .managed_fields()
        .iter()
        .filter_map(|f| f.manager.clone())
        .collect();
    assert!(
        managers.iter().any(|m| m == "arc-rs/listener"),
        "{managers:?}"
    );

    let jobs = enqueue(&fake, id, 3);
    let ers = wait_runner_set(&ctx, "min + 3", |s| s.replicas == 4).await;
    assert_ne!(ers.spec.patch_id, 0, "scale-up carries a sequence value");

    for job in jobs {
        fake.state().cancel_job(job).unwrap();
    }
    wait_runner_set(&ctx, "back to min and quiet", |s| {
        s.replicas == 1 && s.patch_id == 0
    })
    .await;
    running.stop().await;
}

#[tokio::test]
async fn zero_replicas_removes_the_field() {
    let ctx = context("listener-zero").await;
    let fake = FakeActionsService::start(fake_config()).await.unwrap();
    let id = create_scale_set(&fake, "linux").await;
    let config_url = format!("{}/{ORG}", fake.base_url());
    create_runner_set(&ctx, &config_url, id).await;
    let running = Running::start(&ctx, &config_json(&fake, &ctx.namespace, id, 0, 10)).await;
    let jobs = enqueue(&fake, id, 2);
    wait_runner_set(&ctx, "two jobs", |s| s.replicas == 2).await;
    for job in jobs {
        fake.state().cancel_job(job).unwrap();
    }
    wait_runner_set(&ctx, "zero", |s| s.replicas == 0).await;
    let raw: Value = serde_json::to_value(
        Api::<kube::core::DynamicObject>::namespaced_with(
            ctx.client.clone(),
            &ctx.namespace,
            &kube::discovery::ApiResource::erase::<EphemeralRunnerSet>(&()),
        )
        .get(ERS)
        .await
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        raw["spec"].get("replicas"),
        None,
        "replicas: null removed the field: {}",
        raw["spec"]
    );
    running.stop().await;
}

#[tokio::test]
async fn job_started_patches_the_ephemeral_runner_status() {
    let ctx = context("listener-started").await;
    let fake = FakeActionsService::start(fake_config()).await.unwrap();
    let id = create_scale_set(&fake, "linux").await;
    let config_url = format!("{}/{ORG}", fake.base_url());
    create_runner_set(&ctx, &config_url, id).await;
    create_runner(&ctx, "runner-a", &config_url, id).await;
    let running = Running::start(&ctx, &config_json(&fake, &ctx.namespace, id, 0, 10)).await;

    // A runner without an EphemeralRunner first: its 404 is skipped, the loop goes on.
    online_runner(&fake, id, "ghost").await;
    let ghost_job = enqueue(&fake, id, 1)[0];
    let assigned = eventually(WAIT, || {
        fake.state().job(ghost_job).unwrap().runner_name.is_some()
    })
    .await;
    assert!(assigned);
    fake.state().start_job(ghost_job).unwrap();

    // The manager records the registration once the pod runs, before the runner takes a job here.
    let registration = online_runner(&fake, id, "runner-a").await;
    record_registration(&ctx, "runner-a", registration).await;
    let job = start_job_on(&fake, id, "runner-a").await;
    let view = fake.state().job(job).unwrap();

    let runners = ctx.api::<EphemeralRunner>();
    let patched = eventually_async(WAIT, || async {
        runners
            .get("runner-a")
            .await
            .ok()
            .and_then(|er| er.status)
            .is_some_and(|s| s.job_request_id == job)
    })
    .await;
    assert!(patched, "EphemeralRunner status not patched");
    let status = runners.get("runner-a").await.unwrap().status.unwrap();
    assert_eq!(status.job_id, view.job_id);
    assert_eq!(
        status.job_repository_name,
        format!("{}/{}", view.owner, view.repository)
    );
    assert_eq!(status.job_workflow_ref, view.workflow_ref);
    assert_eq!(status.workflow_run_id, view.workflow_run_id);
    assert_eq!(status.job_display_name, "job-1");
    wait_runner_set(&ctx, "both jobs running", |s| s.replicas == 2).await;
    running.stop().await;
}

/// Records registration `runner_id` (and phase Running) on EphemeralRunner `name`, as the manager does.
async fn record_registration(ctx: &TestContext, name: &str, runner_id: i64) {
    ctx.api::<EphemeralRunner>()
        .patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"status": {"runnerId": runner_id, "runnerName": name, "phase": "Running"}}),
            ),
        )
        .await
        .expect("status recorded");
}

/// Starts a job on the fake runner `name` (already online) and returns its request id.
async fn start_job_on(fake: &FakeActionsService, scale_set_id: i64, name: &str) -> i64 {
    let job = enqueue(fake, scale_set_id, 1)[0];
    let assigned = eventually(WAIT, || {
        fake.state().job(job).unwrap().runner_name.as_deref() == Some(name)
    })
    .await;
    assert!(assigned, "{:?}", fake.state().job(job));
    fake.state().start_job(job).unwrap();
    job
}

#[tokio::test]
async fn a_job_that_started_on_an_earlier_registration_is_not_written() {
    let ctx = context("listener-registration").await;
    let fake = FakeActionsService::start(fake_config()).await.unwrap();
    let id = create_scale_set(&fake, "linux").await;
    let config_url = format!("{}/{ORG}", fake.base_url());
    create_runner_set(&ctx, &config_url, id).await;
    for name in ["runner-a", "runner-b", "runner-c"] {
        create_runner(&ctx, name, &config_url, id).await;
    }
    let running = Running::start(&ctx, &config_json(&fake, &ctx.namespace, id, 0, 10)).await;
    let runners = ctx.api::<EphemeralRunner>();
    let job_of = |name: &'static str| {
        let runners = runners.clone();
        async move {
            runners
                .get(name)
                .await
                .ok()
                .and_then(|runner| runner.status)
                .map_or(0, |status| status.job_request_id)
        }
    };

    // runner-a's job started on a registration it no longer has (its pod was taken away and it registered
    // again before the listener heard of the job): not written, or the idle runner would look busy for good.
    let old = online_runner(&fake, id, "runner-a").await;
    record_registration(&ctx, "runner-a", old + 1000).await;
    start_job_on(&fake, id, "runner-a").await;
    // runner-b's job started on the registration it records: written.
    let current = online_runner(&fake, id, "runner-b").await;
    record_registration(&ctx, "runner-b", current).await;
    let job_b = start_job_on(&fake, id, "runner-b").await;
    // runner-c's job started before the manager recorded its registration (it records the identity with the pod's
    // first state worth showing, which a short job can beat): the job records it.
    ctx.api::<EphemeralRunner>()
        .patch_status(
            "runner-c",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": {"phase": "Pending"}})),
        )
        .await
        .expect("status");
    let late = online_runner(&fake, id, "runner-c").await;
    let job_c = start_job_on(&fake, id, "runner-c").await;

    let written = eventually_async(WAIT, || async {
        job_of("runner-b").await == job_b && job_of("runner-c").await == job_c
    })
    .await;
    assert!(written, "runner-b's and runner-c's jobs are written");
    let c = runners.get("runner-c").await.unwrap().status.unwrap();
    assert_eq!(
        (c.runner_id, c.phase.as_str()),
        (late, "Pending"),
        "the job records its registration and keeps the manager's fields"
    );
    // Messages are handled in order: runner-a's came first.
    assert_eq!(
        job_of("runner-a").await,
        0,
        "runner-a's stale job is not written"
    );
    let a = runners.get("runner-a").await.unwrap().status.unwrap();
    assert_eq!(
        (a.runner_id, a.phase.as_str()),
        (old + 1000, "Running"),
        "the manager's fields are untouched"
    );
    running.stop().await;
}

#[tokio::test]
async fn metrics_and_health_endpoints() {
    let ctx = context("listener-metrics").await;
    let fake = FakeActionsService::start(fake_config()).await.unwrap();
    let id = create_scale_set(&fake, "linux").await;
    let config_url = format!("{}/{ORG}", fake.base_url());
    create_runner_set(&ctx, &config_url, id).await;
    let running = Running::start(&ctx, &config_json(&fake, &ctx.namespace, id, 1, 7)).await;
    online_runner(&fake, id, "runner-m").await;
    let job = enqueue(&fake, id, 1)[0];
    let assigned = eventually(WAIT, || {
        fake.state().job(job).unwrap().runner_name.is_some()
    })
    .await;
    assert!(assigned);
    fake.state().start_job(job).unwrap();
    fake.state().finish_job(job, "failed").unwrap();

    let http = reqwest::Client::new();
    let scrape = || async {
        let response = http.get(&running.metrics_url).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        (content_type, response.text().await.unwrap())
    };
    let done = eventually_async(WAIT, || async {
        scrape().await.1.contains("gha_completed_jobs_total{")
    })
    .await;
    assert!(done, "{}", scrape().await.1);
    let (content_type, text) = scrape().await;
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let gauge_labels = format!(
        r#"{{enterprise="",organization="{ORG}",repository="",name="{ERS}",namespace="{}"}}"#,
        ctx.namespace
    );
    for (name, kind) in [
        ("gha_assigned_jobs", "gauge"),
        ("gha_running_jobs", "gauge"),
        ("gha_registered_runners", "gauge"),
        ("gha_busy_runners", "gauge"),
        ("gha_idle_runners", "gauge"),
        ("gha_min_runners", "gauge"),
        ("gha_max_runners", "gauge"),
        ("gha_desired_runners", "gauge"),
        ("gha_started_jobs", "counter"),
        ("gha_completed_jobs", "counter"),
        ("gha_job_startup_duration_seconds", "histogram"),
        ("gha_job_execution_duration_seconds", "histogram"),
        ("gha_listener_last_poll_age_seconds", "gauge"),
        ("gha_listener_fatal_error", "gauge"),
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} {kind}\n")),
            "{name} {kind}:\n{text}"
        );
    }
    assert!(
        text.contains(&format!("gha_min_runners{gauge_labels} 1\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!("gha_max_runners{gauge_labels} 7\n")),
        "{text}"
    );
    let job_labels = format!(
        r#"{{enterprise="",organization="{ORG}",repository="repo",job_name="job-1",event_name="push"}}"#
    );
    assert!(
        text.contains(&format!("gha_started_jobs_total{job_labels} 1\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            r#"gha_completed_jobs_total{{enterprise="",organization="{ORG}",repository="repo",job_name="job-1",event_name="push",job_result="failed"}} 1"#
        )),
        "{text}"
    );
    // No per-runner or per-run label by default.
    assert!(
        !text.contains("runner-m") && !text.contains("job_workflow_ref"),
        "{text}"
    );

    let health = http.get(&running.health_url).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "ok\n");
    let missing = http
        .get(running.metrics_url.replace("/metrics", "/other"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    running.stop().await;
}

#[tokio::test]
async fn a_missing_ephemeral_runner_set_is_waited_for() {
    let ctx = context("listener-missing").await;
    let fake = FakeActionsService::start(fake_config()).await.unwrap();
    let id = create_scale_set(&fake, "linux").await;
    let running = Running::start(&ctx, &config_json(&fake, &ctx.namespace, id, 2, 10)).await;
    let http = reqwest::Client::new();
    let flagged = eventually_async(WAIT, || async {
        let text = http
            .get(&running.metrics_url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.contains(r#"severity="fatal",operation="patch_ephemeral_runner_set"}"#)
    })
    .await;
    assert!(flagged, "the 404 is reported as a fatal error");
    assert!(!running.task.is_finished(), "the listener keeps running");
    let health = http.get(&running.health_url).send().await.unwrap();
    assert_eq!(health.status(), 200, "backing off is healthy");

    create_runner_set(&ctx, &format!("{}/{ORG}", fake.base_url()), id).await;
    wait_runner_set(&ctx, "patched once it exists", |s| s.replicas == 2).await;
    running.stop().await;
}

fn write_config(dir: &tempfile::TempDir, config: &Value) -> std::path::PathBuf {
    let path = dir.path().join("config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn binary_rejects_bad_configuration_with_exit_1() {
    let binary = env!("CARGO_BIN_EXE_listener");
    let unset = tokio::process::Command::new(binary)
        .env_remove("LISTENER_CONFIG_PATH")
        .output()
        .await
        .unwrap();
    assert_eq!(unset.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&unset.stderr).contains("LISTENER_CONFIG_PATH is not set"),
        "{}",
        String::from_utf8_lossy(&unset.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        &dir,
        &json!({"configure_url": "https://github.com/acme", "ephemeral_runner_set_namespace": "ns",
                "ephemeral_runner_set_name": "n", "runner_scale_set_id": 1, "min_runners": 3, "max_runners": 2}),
    );
    let invalid = tokio::process::Command::new(binary)
        .env("LISTENER_CONFIG_PATH", &path)
        .output()
        .await
        .unwrap();
    assert_eq!(invalid.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&invalid.stderr);
    assert!(
        stderr.contains("max_runners (2) must be greater than or equal to min_runners (3)"),
        "{stderr}"
    );
}

#[tokio::test]
async fn binary_deletes_the_session_on_sigterm_and_exits_0() {
    let ctx = context("listener-sigterm").await;
    let fake = FakeActionsService::start(fake_config()).await.unwrap();
    let id = create_scale_set(&fake, "linux").await;
    let config_url = format!("{}/{ORG}", fake.base_url());
    create_runner_set(&ctx, &config_url, id).await;
    let port = free_port();
    let mut config = config_json(&fake, &ctx.namespace, id, 1, 10);
    config["metrics_addr"] = json!(format!("127.0.0.1:{port}"));
    config["log_format"] = json!("json");
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(&dir, &config);
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_listener"))
        .env("LISTENER_CONFIG_PATH", &path)
        .env("KUBECONFIG", ctx.control_plane.kubeconfig_path())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("listener binary starts");

    wait_runner_set(&ctx, "the binary patched the set", |s| s.replicas == 1).await;
    enqueue(&fake, id, 2);
    wait_runner_set(&ctx, "and follows jobs", |s| s.replicas == 3).await;
    assert_eq!(fake.state().snapshot().sessions.len(), 1);
    let health = reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);

    let pid = child.id().expect("running").to_string();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(kill.success());
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        fake.state().snapshot().sessions.is_empty(),
        "session deleted"
    );
    assert_eq!(fake.state().count("delete_session"), 1);
    // JSON logs, one object per line, with the source location.
    let first: Value =
        serde_json::from_str(stdout.lines().next().expect("logged")).expect("JSON log line");
    assert!(
        first.get("filename").is_some() && first.get("line_number").is_some(),
        "{first}"
    );
    assert!(stdout.contains("message session deleted"), "{stdout}");
    assert!(!stdout.contains("ghp_test"), "no secret in the logs");
}

/// Beyond ARC: the listener reports its session, polls, errors and figures in its AutoscalingListener's status,
/// at once when the verdict changes and otherwise at its heartbeat (not at every poll), and says at shutdown that
/// it no longer holds the session.
#[tokio::test]
async fn reports_its_state_in_its_autoscaling_listener_status() {
    use crds::{AutoscalingListener, AutoscalingListenerSpec};
    use fake_actions_service::{ErrorFault, Faults};
    use futures::StreamExt;
    use kube::runtime::watcher;
    use listener::config::StatusTarget;

    let ctx = context("listener-status").await;
    let fake = FakeActionsService::start(fake_config()).await.unwrap();
    let id = create_scale_set(&fake, "linux").await;
    let config_url = format!("{}/{ORG}", fake.base_url());
    create_runner_set(&ctx, &config_url, id).await;
    let listeners = ctx.api::<AutoscalingListener>();
    listeners
        .create(
            &PostParams::default(),
            &AutoscalingListener::new("linux-listener", AutoscalingListenerSpec::default()),
        )
        .await
        .expect("AutoscalingListener created");
    let mut config = Config::decode(
        config_json(&fake, &ctx.namespace, id, 1, 10)
            .to_string()
            .as_bytes(),
    )
    .expect("config decodes");
    config.validate().expect("config is valid");
    config.status_target = Some(StatusTarget {
        namespace: ctx.namespace.clone(),
        name: "linux-listener".to_owned(),
    });
    let settings = fast_settings();
    let heartbeat = settings.status_heartbeat;
    let listener = Listener::start(&config, ctx.client.clone(), settings)
        .await
        .expect("listener starts");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(listener.run(shutdown.clone()));
    let status = || async {
        listeners
            .get("linux-listener")
            .await
            .ok()
            .and_then(|l| l.status)
            .unwrap_or_default()
    };

    let held = eventually_async(WAIT, || async {
        let s = status().await;
        s.session_held == Some(true) && s.desired_runners == Some(1)
    })
    .await;
    assert!(held, "{:?}", status().await);
    let report = status().await;
    assert!(report.last_poll_time.is_some() && report.session_since.is_some());
    assert!(report.statistics.is_some());
    // The fast settings' long-poll attempt timeout (10 s) plus their heartbeat (2 s).
    assert_eq!(report.poll_stale_after_seconds, Some(12));
    assert!(report.pod_failures.is_none(), "the controller's field");
    let object = listeners.get("linux-listener").await.unwrap();
    assert!(
        object.managed_fields().iter().any(|f| {
            f.manager.as_deref() == Some("arc-rs/listener")
                && f.operation.as_deref() == Some("Apply")
                && f.subresource.as_deref() == Some("status")
        }),
        "{:?}",
        object.managed_fields()
    );

    // Polls every 0.5 s, but the report is written at the heartbeat: count the writes over five heartbeats.
    let window = heartbeat * 5;
    let mut events = watcher(
        listeners.clone(),
        watcher::Config::default().fields("metadata.name=linux-listener"),
    )
    .boxed();
    let deadline = tokio::time::Instant::now() + window;
    let (mut listed, mut writes) = (false, 0);
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline, events.next()).await {
        match event {
            Ok(watcher::Event::InitDone) => listed = true,
            Ok(watcher::Event::Apply(_)) if listed => writes += 1,
            _ => {}
        }
    }
    assert!((2..=6).contains(&writes), "{writes} writes in {window:?}");

    // The service fails every poll: the error is reported at once, while the session is still held.
    fake.state()
        .set_faults(Faults {
            errors: vec![ErrorFault {
                endpoint: Some("get_message".into()),
                status: 503,
                rate: 1.0,
                count: None,
                retry_after_secs: None,
            }],
            ..Faults::default()
        })
        .unwrap();
    let failing = eventually_async(WAIT, || async {
        let s = status().await;
        s.last_error.as_ref().is_some_and(|e| {
            e.category == "ServiceUnreachable"
                && e.time.as_ref().map(|t| t.0) > s.last_poll_time.as_ref().map(|t| t.0)
        })
    })
    .await;
    assert!(failing, "{:?}", status().await);
    let report = status().await;
    assert_eq!(report.session_held, Some(true));
    assert!(
        report.last_error.unwrap().message.contains("503"),
        "the logged error"
    );
    fake.state().clear_faults();
    let recovered = eventually_async(WAIT, || async {
        let s = status().await;
        s.last_error
            .as_ref()
            .and_then(|e| e.time.as_ref().map(|t| t.0))
            < s.last_poll_time.as_ref().map(|t| t.0)
    })
    .await;
    assert!(recovered, "{:?}", status().await);

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("stops promptly")
        .expect("no panic")
        .expect("clean stop");
    let last = status().await;
    assert_eq!(
        last.session_held,
        Some(false),
        "released at shutdown: {last:?}"
    );
}
