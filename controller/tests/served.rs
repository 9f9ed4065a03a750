//! Whether a set is served, against a real API server, the fake Actions Service over HTTP and the real listener
//! binary (run by the listener-pod executor as its pod's ServiceAccount, so it reports through exactly the RBAC
//! the controller grants): each cause that keeps jobs from reaching a listener is made to happen, the
//! AutoscalingRunnerSet says so (condition status, reason, message) within a bounded time, neither the set nor
//! the listener's report is rewritten over and over while the cause lasts, and the set is served again once the
//! cause is gone.

mod ars_support;

use std::net::SocketAddr;
use std::time::Duration;

use actions_client::{ActionsClient, ClientOptions, Credentials, GitHubConfig, SecretString};
use ars_support::{Env, Running};
use crds::constants::RUNNER_SCALE_SET_ID_ANNOTATION;
use fake_actions_service::{ErrorFault, Faults};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde::de::DeserializeOwned;
use test_harness::ListenerExecutor;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// How long the set and the listener's report are watched for writes while a cause lasts. The listener's
/// heartbeat is 30 s, so its report may be written once in this window; the set's status never.
const QUIET: Duration = Duration::from_secs(15);

/// A fake whose long polls end after 2 s, so the listener notices a change of the service within seconds.
fn fake_config() -> fake_actions_service::Config {
    fake_actions_service::Config {
        long_poll_timeout: Duration::from_secs(2),
        ..fake_actions_service::Config::default()
    }
}

/// The test options, with the scale set looked up again only after `check`: a long interval keeps the
/// manager's own calls out of the way, so the condition shows what the listener sees.
fn options(env: &Env, check: Duration) -> controller::Options {
    let mut options = env.options();
    options.scale_set_check_interval = check;
    options
}

fn executor(env: &Env) -> ListenerExecutor {
    let binary = test_harness::workspace_binary("listener", "listener").expect("listener binary");
    ListenerExecutor::start(
        env.ctx.control_plane,
        env.client(),
        Some(&env.controller_namespace),
        binary,
    )
    .expect("listener executor")
}

/// A PAT client of the fake, standing for another installation.
fn another_client(url: &str) -> ActionsClient {
    ActionsClient::new(
        GitHubConfig::parse_with(url, false).expect("config URL"),
        &Credentials::Pat(SecretString::new("ghp_other")),
        ClientOptions::default(),
    )
    .expect("client")
}

async fn scale_set_id(env: &Env, set: &str) -> i64 {
    env.eventually("the scale set id annotation", || async {
        env.runner_set(set)
            .await?
            .annotations()
            .get(RUNNER_SCALE_SET_ID_ANNOTATION)?
            .parse()
            .ok()
    })
    .await
}

async fn listener_name(env: &Env, set: &str) -> String {
    env.eventually("the AutoscalingListener", || async {
        env.listeners()
            .list(&Default::default())
            .await
            .expect("list listeners")
            .items
            .into_iter()
            .find(|l| {
                l.spec.autoscaling_runner_set_name == set && l.metadata.deletion_timestamp.is_none()
            })
            .map(|l| l.name_any())
    })
    .await
}

/// Waits until condition `type_` of `set` has `status` and `reason`.
async fn condition(env: &Env, set: &str, type_: &str, status: &str, reason: &str) -> Condition {
    env.eventually(&format!("{type_}={status}/{reason} on {set}"), || async {
        env.condition(set, type_)
            .await
            .filter(|c| c.status == status && c.reason == reason)
    })
    .await
}

/// Writes of object `name` during `window`: each write gives it a new resourceVersion, which its watch reports
/// as one event.
async fn writes_during<K>(api: Api<K>, name: &str, window: Duration) -> usize
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api, config).boxed();
    let mut listed = false;
    let mut writes = 0;
    let deadline = tokio::time::Instant::now() + window;
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline, events.next()).await {
        match event {
            Ok(watcher::Event::InitDone) => listed = true,
            Ok(watcher::Event::Apply(_)) if listed => writes += 1,
            _ => {}
        }
    }
    writes
}

/// The `Served` column `kubectl get autoscalingrunnersets` prints, from the API server's table.
async fn served_column(env: &Env, set: &str) -> String {
    let request = http::Request::get(format!(
        "/apis/actions.github.com/v1alpha1/namespaces/{}/autoscalingrunnersets/{set}",
        env.ctx.namespace
    ))
    .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(Vec::new())
    .expect("request");
    let table: serde_json::Value = env.client().request(request).await.expect("table");
    let columns = table["columnDefinitions"].as_array().expect("columns");
    let served = columns
        .iter()
        .position(|c| c["name"] == "Served")
        .expect("a Served column");
    assert!(
        columns.iter().any(|c| c["name"] == "Maximum Runners"),
        "ARC's columns stay: {columns:?}"
    );
    table["rows"][0]["cells"][served]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The manager's `gha_controller_listener_session_held` for `set`.
fn session_gauge(manager: &Running, env: &Env, set: &str) -> Option<i64> {
    let series = format!(
        "gha_controller_listener_session_held{{name=\"{set}\",namespace=\"{}\"}} ",
        env.ctx.namespace
    );
    controller::metrics::encode(&manager.registry)
        .lines()
        .find_map(|line| line.strip_prefix(&series)?.parse().ok())
}

async fn assert_served(env: &Env, manager: &Running, set: &str) {
    let listener = condition(env, set, "ListenerReady", "True", "SessionHeld").await;
    assert!(
        listener.message.contains("holds the message session"),
        "{}",
        listener.message
    );
    condition(env, set, "Ready", "True", "Ready").await;
    assert_eq!(served_column(env, set).await, "True");
    assert_eq!(session_gauge(manager, env, set), Some(1));
}

/// The set is not served for `reason`: on `ListenerReady` and on `Ready`, in the `Served` column, in the gauge,
/// and as one Warning Event; and while the cause lasts, the set's status is not written again and the
/// listener's report at most at its heartbeat.
async fn assert_not_served(env: &Env, manager: &Running, set: &str, reason: &str) -> Condition {
    let listener = condition(env, set, "ListenerReady", "False", reason).await;
    let ready = condition(env, set, "Ready", "False", reason).await;
    assert_eq!(ready.message, listener.message);
    assert_eq!(served_column(env, set).await, "False");
    assert_eq!(session_gauge(manager, env, set), Some(0));
    let name = listener_name(env, set).await;
    let (set_writes, report_writes) = tokio::join!(
        writes_during(env.runner_sets(), set, QUIET),
        writes_during(env.listeners(), &name, QUIET),
    );
    assert_eq!(
        set_writes, 0,
        "the set's status was rewritten while {reason} lasted"
    );
    assert!(
        report_writes <= 2,
        "the listener wrote its report {report_writes} times in {QUIET:?} while {reason} lasted"
    );
    let events = env.events(set, reason).await;
    assert_eq!(events.len(), 1, "one Event for the transition: {events:?}");
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    listener
}

#[tokio::test]
async fn a_scale_set_claimed_by_another_listener_is_not_served_until_it_is_released() {
    let env = Env::with_fake("served-claimed", fake_config()).await;
    let manager = env.start(options(&env, Duration::from_secs(600)));
    env.create_runner_set("claimed", env.runner_set_spec())
        .await;
    let id = scale_set_id(&env, "claimed").await;

    // Nothing runs the listener pod yet: the listener has not started.
    let starting = condition(
        &env,
        "claimed",
        "ListenerReady",
        "False",
        "ListenerStarting",
    )
    .await;
    assert_eq!(starting.message, "the listener pod is starting");
    assert_eq!(served_column(&env, "claimed").await, "False");
    assert!(
        env.events("claimed", "ListenerStarting").await.is_empty(),
        "progress is no Warning"
    );

    // Another installation holds the scale set's message session (ARC in another cluster, a copy of this set).
    let other = another_client(&env.config_url)
        .message_session(id, "another-installation")
        .await
        .expect("the other installation's session");
    let executor = executor(&env);
    let claimed = assert_not_served(&env, &manager, "claimed", "SessionConflict").await;
    assert!(
        claimed
            .message
            .contains(&format!("scale set {id} is claimed by another listener")),
        "{}",
        claimed.message
    );
    assert!(
        claimed.message.contains("runnerScaleSetName"),
        "{}",
        claimed.message
    );
    let listener = env
        .listeners()
        .get(&listener_name(&env, "claimed").await)
        .await
        .expect("listener");
    let report = listener.status.expect("the listener's report");
    assert_eq!(report.session_held, Some(false));
    assert_eq!(
        report.last_error.expect("an error").category,
        "SessionConflict"
    );
    assert!(
        listener
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .any(|f| f.manager.as_deref() == Some("arc-rs/listener")
                && f.subresource.as_deref() == Some("status")),
        "written by the listener itself"
    );

    other.close().await.expect("the other installation lets go");
    assert_served(&env, &manager, "claimed").await;
    assert!(!env.events("claimed", "Ready").await.is_empty());
    assert!(executor.errors().is_empty(), "{:?}", executor.errors());
    manager.stop().await;
    executor.stop();
}

#[tokio::test]
async fn credentials_the_service_rejects_are_reported_until_it_accepts_them_again() {
    let env = Env::with_fake("served-creds", fake_config()).await;
    let manager = env.start(options(&env, Duration::from_secs(600)));
    env.create_runner_set("creds", env.runner_set_spec()).await;
    scale_set_id(&env, "creds").await;
    // From now on GitHub answers the listener's token requests with 401 (revoked token, uninstalled App).
    env.fake
        .state()
        .set_faults(Faults {
            errors: vec![ErrorFault {
                endpoint: Some("registration_token".into()),
                status: 401,
                rate: 1.0,
                count: None,
                retry_after_secs: None,
            }],
            ..Faults::default()
        })
        .expect("faults");
    let executor = executor(&env);
    let rejected = assert_not_served(&env, &manager, "creds", "CredentialsRejected").await;
    assert!(
        rejected.message.contains(&format!(
            "rotate the credentials in Secret {}/github-credentials",
            env.ctx.namespace
        )),
        "{}",
        rejected.message
    );
    // The manager's own view is unaffected: it is the listener that is refused.
    let scale_set = env
        .condition("creds", "ScaleSetReady")
        .await
        .expect("condition");
    assert_eq!(scale_set.status, "True");

    env.fake.state().clear_faults();
    assert_served(&env, &manager, "creds").await;
    manager.stop().await;
    executor.stop();
}

#[tokio::test]
async fn a_scale_set_deleted_in_the_service_is_reported_until_it_is_recreated() {
    let env = Env::with_fake("served-missing", fake_config()).await;
    let manager = env.start(options(&env, Duration::from_secs(600)));
    env.create_runner_set("missing", env.runner_set_spec())
        .await;
    let id = scale_set_id(&env, "missing").await;
    let executor = executor(&env);
    assert_served(&env, &manager, "missing").await;

    // Someone deletes the scale set in GitHub; the manager only looks again after its check interval.
    env.fake
        .state()
        .delete_scale_set(id, true)
        .expect("delete the scale set");
    let gone = assert_not_served(&env, &manager, "missing", "ScaleSetMissing").await;
    assert!(
        gone.message
            .contains(&format!("no longer knows scale set {id}")),
        "{}",
        gone.message
    );

    // A manager whose check is due (a restart checks at once) re-creates it, and the new listener serves it.
    manager.stop().await;
    let manager = env.start(options(&env, Duration::from_secs(1)));
    let recreated = env
        .eventually("a new scale set id", || async {
            let new: i64 = env
                .runner_set("missing")
                .await?
                .annotations()
                .get(RUNNER_SCALE_SET_ID_ANNOTATION)?
                .parse()
                .ok()?;
            (new != id).then_some(new)
        })
        .await;
    assert_served(&env, &manager, "missing").await;
    let listener = env
        .listeners()
        .get(&listener_name(&env, "missing").await)
        .await
        .expect("listener");
    assert_eq!(listener.spec.runner_scale_set_id, recreated);
    manager.stop().await;
    executor.stop();
}

/// A TCP relay between the clients and the fake that can go away and come back on the same port: a service
/// that is down for real (connections refused, open ones cut).
struct Relay {
    addr: SocketAddr,
    target: SocketAddr,
    task: Option<JoinHandle<()>>,
}

impl Relay {
    async fn start(target: SocketAddr) -> Self {
        let socket = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = socket.local_addr().expect("addr");
        Self {
            addr,
            target,
            task: Some(tokio::spawn(relay(socket, target))),
        }
    }

    fn url(&self) -> String {
        format!("http://{}/org/repo", self.addr)
    }

    /// Stops listening and cuts every open connection.
    async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Listens on the same port again.
    async fn resume(&mut self) {
        let socket = test_harness::eventually(
            "the relay's port again",
            Duration::from_secs(10),
            || async { TcpListener::bind(self.addr).await.ok() },
        )
        .await;
        self.task = Some(tokio::spawn(relay(socket, self.target)));
    }
}

async fn relay(socket: TcpListener, target: SocketAddr) {
    // Dropped with the task, which aborts every connection.
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let Ok((mut inbound, _)) = socket.accept().await else {
            continue;
        };
        connections.spawn(async move {
            if let Ok(mut outbound) = TcpStream::connect(target).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

#[tokio::test]
async fn an_unreachable_service_is_reported_until_it_is_back() {
    let env = Env::with_fake("served-down", fake_config()).await;
    let mut relay = Relay::start(env.fake.addr()).await;
    let manager = env.start(options(&env, Duration::from_secs(600)));
    let mut spec = env.runner_set_spec();
    spec.github_config_url = relay.url();
    env.create_runner_set("down", spec).await;
    scale_set_id(&env, "down").await;
    let executor = executor(&env);
    assert_served(&env, &manager, "down").await;

    relay.stop().await;
    let down = assert_not_served(&env, &manager, "down", "ServiceUnreachable").await;
    assert!(
        down.message.contains("cannot reach the Actions Service"),
        "{}",
        down.message
    );
    let scale_set = env
        .condition("down", "ScaleSetReady")
        .await
        .expect("condition");
    assert_eq!(
        scale_set.status, "True",
        "the manager did not need the service meanwhile"
    );

    relay.resume().await;
    assert_served(&env, &manager, "down").await;
    manager.stop().await;
    executor.stop();
}

/// A set whose runners start: the listener serves it and its runner pods are admitted.
fn one_runner_spec(env: &Env) -> crds::AutoscalingRunnerSetSpec {
    let mut spec = env.runner_set_spec();
    spec.min_runners = Some(1);
    spec
}

/// The set's runner pod, once it exists.
async fn runner_pod(env: &Env) -> k8s_openapi::api::core::v1::Pod {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = env.ctx.api();
    env.eventually("a runner pod", || async {
        pods.list(&kube::api::ListParams::default().labels("actions-ephemeral-runner=True"))
            .await
            .expect("list pods")
            .items
            .into_iter()
            .next()
    })
    .await
}

/// What the kubelet reports for a runner pod whose container waits for `reason` (or runs, with `None`).
async fn kubelet_reports(env: &Env, pod: &str, image: &str, waiting: Option<&str>) {
    let state = match waiting {
        Some(reason) => {
            serde_json::json!({"waiting": {"reason": reason, "message": format!("{reason} for {image}")}})
        }
        None => serde_json::json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}}),
    };
    let running = waiting.is_none();
    let status = serde_json::json!({"status": {
        "phase": if running { "Running" } else { "Pending" },
        "conditions": [{"type": "Ready", "status": if running { "True" } else { "False" },
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "containerStatuses": [{
            "name": "runner", "image": image, "imageID": "", "ready": running, "restartCount": 0,
            "state": state,
        }],
    }});
    let pods: Api<k8s_openapi::api::core::v1::Pod> = env.ctx.api();
    pods.patch_status(
        pod,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(status),
    )
    .await
    .expect("pod status");
}

/// The runners cannot start for `reason`: on `RunnersCanStart` and `Ready`, with one Warning Event, while the
/// listener serves the set.
async fn assert_runners_blocked(env: &Env, set: &str, reason: &str) -> Condition {
    let blocked = condition(env, set, "RunnersCanStart", "False", reason).await;
    assert!(
        blocked
            .message
            .starts_with("1 of 1 runner(s) cannot start; the first, "),
        "{}",
        blocked.message
    );
    let ready = condition(env, set, "Ready", "False", reason).await;
    assert_eq!(ready.message, blocked.message);
    assert_eq!(served_column(env, set).await, "False");
    let listener = env
        .condition(set, "ListenerReady")
        .await
        .expect("condition");
    assert_eq!(listener.status, "True", "the listener is not the problem");
    assert_eq!(env.events(set, reason).await.len(), 1);
    blocked
}

#[tokio::test]
async fn runner_pods_refused_by_a_quota_keep_the_set_from_being_ready() {
    let env = Env::with_fake("served-quota", fake_config()).await;
    let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> = env.ctx.api();
    let quota: k8s_openapi::api::core::v1::ResourceQuota =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "no-pods"},
            "spec": {"hard": {"pods": "0"}},
        }))
        .expect("quota");
    quotas
        .create(&kube::api::PostParams::default(), &quota)
        .await
        .expect("create the quota");
    let mut options = options(&env, Duration::from_secs(600));
    options.runner.pod_rejection_retry = Duration::from_secs(2);
    let manager = env.start(options);
    env.create_runner_set("quota", one_runner_spec(&env)).await;
    let executor = executor(&env);
    condition(&env, "quota", "ListenerReady", "True", "SessionHeld").await;
    let blocked = assert_runners_blocked(&env, "quota", "PodCreationRejected").await;
    assert!(blocked.message.contains("quota"), "{}", blocked.message);
    // The runner is retried every 2 s; the set's status stays as it is.
    assert_eq!(writes_during(env.runner_sets(), "quota", QUIET).await, 0);

    quotas
        .delete("no-pods", &Default::default())
        .await
        .expect("delete the quota");
    condition(&env, "quota", "RunnersCanStart", "True", "RunnersStartable").await;
    condition(&env, "quota", "Ready", "True", "Ready").await;
    runner_pod(&env).await;
    manager.stop().await;
    executor.stop();
}

#[tokio::test]
async fn runner_images_that_cannot_be_pulled_keep_the_set_from_being_ready() {
    let env = Env::with_fake("served-image", fake_config()).await;
    let manager = env.start(options(&env, Duration::from_secs(600)));
    env.create_runner_set("image", one_runner_spec(&env)).await;
    let executor = executor(&env);
    condition(&env, "image", "ListenerReady", "True", "SessionHeld").await;
    let pod = runner_pod(&env).await.name_any();
    let image = "registry.example/runner:missing";
    // The test plays the kubelet: the image cannot be pulled, and the kubelet alternates between the pull
    // error and its back-off for as long as that lasts.
    kubelet_reports(&env, &pod, image, Some("ErrImagePull")).await;
    let blocked = assert_runners_blocked(&env, "image", "ImagePullFailed").await;
    assert!(blocked.message.contains(image), "{}", blocked.message);
    let flapping = async {
        for reason in [
            "ImagePullBackOff",
            "ErrImagePull",
            "ImagePullBackOff",
            "ErrImagePull",
        ] {
            tokio::time::sleep(Duration::from_secs(2)).await;
            kubelet_reports(&env, &pod, image, Some(reason)).await;
        }
    };
    let (writes, ()) = tokio::join!(writes_during(env.runner_sets(), "image", QUIET), flapping);
    assert_eq!(writes, 0, "the kubelet's alternating reasons are one cause");

    kubelet_reports(&env, &pod, image, None).await;
    condition(&env, "image", "RunnersCanStart", "True", "RunnersStartable").await;
    condition(&env, "image", "Ready", "True", "Ready").await;
    manager.stop().await;
    executor.stop();
}

#[tokio::test]
async fn runners_whose_pod_cannot_be_built_keep_the_set_from_being_ready_until_the_template_is_fixed()
 {
    let env = Env::with_fake("served-invalid", fake_config()).await;
    let manager = env.start(options(&env, Duration::from_secs(600)));
    let mut spec = one_runner_spec(&env);
    // No container named `runner`: the runner's pod cannot be built.
    if let Some(pod) = spec.template.spec.as_mut() {
        pod.containers[0].name = "main".to_owned();
    }
    env.create_runner_set("invalid", spec).await;
    let executor = executor(&env);
    condition(&env, "invalid", "ListenerReady", "True", "SessionHeld").await;
    let blocked = assert_runners_blocked(&env, "invalid", "InvalidPod").await;
    assert!(blocked.message.contains("runner"), "{}", blocked.message);

    env.runner_sets()
        .patch(
            "invalid",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"template": {"spec": {
                "containers": [{"name": "runner", "image": "ghcr.io/actions/actions-runner:latest"}],
            }}}})),
        )
        .await
        .expect("fix the template");
    condition(
        &env,
        "invalid",
        "RunnersCanStart",
        "True",
        "RunnersStartable",
    )
    .await;
    condition(&env, "invalid", "Ready", "True", "Ready").await;
    manager.stop().await;
    executor.stop();
}

#[tokio::test]
async fn runner_pods_that_fail_again_and_again_keep_the_set_from_being_ready() {
    let env = Env::with_fake("served-failing", fake_config()).await;
    let manager = env.start(options(&env, Duration::from_secs(600)));
    env.create_runner_set("failing", one_runner_spec(&env))
        .await;
    let executor = executor(&env);
    condition(&env, "failing", "ListenerReady", "True", "SessionHeld").await;
    // The test plays the kubelet: every pod of the runner exits 1 before the runner comes up.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = env.ctx.api();
    let mut failed = std::collections::BTreeSet::new();
    while failed.len() < 2 {
        let pod = env
            .eventually("a new runner pod", || async {
                pods.list(&kube::api::ListParams::default().labels("actions-ephemeral-runner=True"))
                    .await
                    .expect("list pods")
                    .items
                    .into_iter()
                    .find(|p| {
                        p.metadata.deletion_timestamp.is_none()
                            && !failed.contains(&p.uid().unwrap_or_default())
                    })
            })
            .await;
        let status = serde_json::json!({"status": {
            "phase": "Failed",
            "containerStatuses": [{
                "name": "runner", "image": "runner", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 1, "reason": "Error"}},
            }],
        }});
        pods.patch_status(
            &pod.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(status),
        )
        .await
        .expect("pod status");
        failed.insert(pod.uid().unwrap_or_default());
    }
    let blocked = assert_runners_blocked(&env, "failing", "RunnerPodsFailing").await;
    assert!(
        blocked.message.contains("failed 2 times"),
        "{}",
        blocked.message
    );
    manager.stop().await;
    executor.stop();
}
