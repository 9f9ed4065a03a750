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
use prometheus_client::registry::Registry;
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
fn session_gauge(registry: &Registry, env: &Env, set: &str) -> Option<i64> {
    let series = format!(
        "gha_controller_listener_session_held{{name=\"{set}\",namespace=\"{}\"}} ",
        env.ctx.namespace
    );
    controller::metrics::encode(registry)
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
    assert_eq!(session_gauge(&manager.registry, env, set), Some(1));
}

/// The set is not served for `reason`: on `ListenerReady` and on `Ready`, in the `Served` column, in the gauge,
/// and as one Warning Event; and while the cause lasts, the set's status is not written again and the
/// listener's report at most at its heartbeat.
async fn assert_not_served(env: &Env, manager: &Running, set: &str, reason: &str) -> Condition {
    let listener = condition(env, set, "ListenerReady", "False", reason).await;
    let ready = condition(env, set, "Ready", "False", reason).await;
    assert_eq!(ready.message, listener.message);
    assert_eq!(served_column(env, set).await, "False");
    assert_eq!(session_gauge(&manager.registry, env, set), Some(0));
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

    // Nothing runs the listener pod yet: the listener has not started (after the EphemeralRunnerSet and the
    // listener are created, also reported as ListenerStarting).
    env.eventually("ListenerStarting for the listener pod", || async {
        env.condition("claimed", "ListenerReady").await.filter(|c| {
            c.status == "False"
                && c.reason == "ListenerStarting"
                && c.message == "the listener pod is starting"
        })
    })
    .await;
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
    let executor = env.listener_executor();
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
    let executor = env.listener_executor();
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
    let executor = env.listener_executor();
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
    let executor = env.listener_executor();
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
    let executor = env.listener_executor();
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
    let executor = env.listener_executor();
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

/// The one rule that goes by the clock: a runner pod `Pending` past the limit with no cause reported (here no
/// scheduler serves the control plane, so no verdict ever comes) counts, with the same message on every pass, and
/// stops counting once the pod runs. The manager's limit is shortened from ten minutes to four seconds.
///
/// No event marks the moment the limit passes, and the periodic pass is set far beyond the test: the set must
/// be looked at again at the pod's own deadline.
#[tokio::test]
async fn runner_pods_pending_too_long_keep_the_set_from_being_ready() {
    let env = Env::with_fake("served-pending", fake_config()).await;
    let mut options = options(&env, Duration::from_secs(600));
    options.pending_pod_limit = Duration::from_secs(4);
    options.resync_interval = Duration::from_secs(600);
    let manager = env.start(options);
    env.create_runner_set("pending", one_runner_spec(&env))
        .await;
    let executor = env.listener_executor();
    condition(&env, "pending", "ListenerReady", "True", "SessionHeld").await;
    let pod = runner_pod(&env).await.name_any();
    let blocked = assert_runners_blocked(&env, "pending", "PodPendingTooLong").await;
    assert!(
        blocked.message.contains("no scheduler has looked at it"),
        "{}",
        blocked.message
    );
    assert_eq!(
        writes_during(env.runner_sets(), "pending", QUIET).await,
        0,
        "the same finding on every pass writes nothing"
    );

    kubelet_reports(&env, &pod, "runner:latest", None).await;
    condition(
        &env,
        "pending",
        "RunnersCanStart",
        "True",
        "RunnersStartable",
    )
    .await;
    condition(&env, "pending", "Ready", "True", "Ready").await;
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
    let executor = env.listener_executor();
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
    let executor = env.listener_executor();
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

/// The label the test nodes carry, and the runner templates select on.
const POOL_LABEL: &str = "arc-rs.test/pool";

/// Held by a test that creates Node objects or counts on their number: the scheduler's message counts every node
/// of the control plane, so another test's node would change it (and the set's condition) mid-test.
static NODES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The scheduler's message on the set's unschedulable runner pod.
async fn scheduler_message(env: &Env) -> String {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = env.ctx.api();
    env.eventually("the scheduler's verdict on a runner pod", || async {
        pods.list(&kube::api::ListParams::default().labels("actions-ephemeral-runner=True"))
            .await
            .expect("list pods")
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .find_map(|p| {
                p.status?
                    .conditions?
                    .into_iter()
                    .find(|c| {
                        c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable")
                    })?
                    .message
            })
    })
    .await
}

/// A set whose runner pods are served by the test scheduler and want a node of `pool`. They tolerate every
/// taint: the test's Node objects have no kubelet, and the node controller's taints are not what is tested.
fn pool_spec(env: &Env, scheduler: &str, pool: &str) -> crds::AutoscalingRunnerSetSpec {
    let mut spec = one_runner_spec(env);
    let pod = spec.template.spec.as_mut().expect("pod spec");
    pod.scheduler_name = Some(scheduler.to_owned());
    pod.node_selector = Some([(POOL_LABEL.to_owned(), pool.to_owned())].into());
    pod.tolerations = Some(vec![k8s_openapi::api::core::v1::Toleration {
        operator: Some("Exists".to_owned()),
        ..Default::default()
    }]);
    spec
}

/// A Node object of `pool` with room for pods (no kubelet behind it: the scheduler binds pods to it, nothing
/// runs them). Its pool is the test's own, so other tests' pods never fit it.
struct TestNode {
    api: Api<k8s_openapi::api::core::v1::Node>,
    name: String,
}

impl TestNode {
    async fn create(env: &Env, pool: &str) -> Self {
        let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client());
        let name = format!("node-{}", env.ctx.namespace);
        let node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {POOL_LABEL: pool}},
        }))
        .expect("node");
        api.create(&kube::api::PostParams::default(), &node)
            .await
            .expect("create the node");
        let capacity = serde_json::json!({"cpu": "8", "memory": "16Gi", "pods": "110"});
        api.patch_status(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"status": {
                "capacity": capacity, "allocatable": capacity,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "lastHeartbeatTime": jiff_now(), "lastTransitionTime": jiff_now()}],
            }})),
        )
        .await
        .expect("node status");
        Self { api, name }
    }
}

impl TestNode {
    async fn delete(self) {
        self.api
            .delete(&self.name, &Default::default())
            .await
            .expect("delete the node");
    }
}

fn jiff_now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// The node a runner pod is bound to, once it is.
async fn bound_node(env: &Env) -> String {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = env.ctx.api();
    env.eventually("a runner pod bound to a node", || async {
        pods.list(&kube::api::ListParams::default().labels("actions-ephemeral-runner=True"))
            .await
            .expect("list pods")
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .find_map(|p| p.spec?.node_name)
    })
    .await
}

#[tokio::test]
async fn runner_pods_no_node_fits_keep_the_set_from_being_ready_until_a_node_fits() {
    let env = Env::with_fake("served-no-node", fake_config()).await;
    let _nodes = NODES.lock().await;
    let scheduler = test_harness::start_scheduler(env.ctx.control_plane)
        .await
        .expect("the test scheduler");
    let pool = format!("pool-{}", env.ctx.namespace);
    let manager = env.start(options(&env, Duration::from_secs(600)));
    env.create_runner_set("no-node", pool_spec(&env, scheduler, &pool))
        .await;
    let executor = env.listener_executor();
    condition(&env, "no-node", "ListenerReady", "True", "SessionHeld").await;
    // No node has the pool's label: the scheduler says so on the pod (PodScheduled=False, Unschedulable).
    let blocked = assert_runners_blocked(&env, "no-node", "PodUnschedulable").await;
    let verdict = scheduler_message(&env).await;
    assert!(
        blocked.message.contains(&format!(
            "PodUnschedulable: the scheduler finds no node for its pod: {verdict}"
        )),
        "the scheduler's own words ({verdict:?}): {}",
        blocked.message
    );
    // The scheduler retries; the set's status stays as it is.
    assert_eq!(writes_during(env.runner_sets(), "no-node", QUIET).await, 0);

    // Capacity arrives (a node of the pool joins, as a cluster autoscaler would add one): the pod is bound.
    let node = TestNode::create(&env, &pool).await;
    assert_eq!(bound_node(&env).await, node.name);
    condition(
        &env,
        "no-node",
        "RunnersCanStart",
        "True",
        "RunnersStartable",
    )
    .await;
    condition(&env, "no-node", "Ready", "True", "Ready").await;
    assert_eq!(served_column(&env, "no-node").await, "True");
    manager.stop().await;
    executor.stop();
    node.delete().await;
}

#[tokio::test]
async fn runner_pods_no_node_fits_keep_the_set_from_being_ready_until_the_template_is_fixed() {
    let env = Env::with_fake("served-bad-selector", fake_config()).await;
    let _nodes = NODES.lock().await;
    let scheduler = test_harness::start_scheduler(env.ctx.control_plane)
        .await
        .expect("the test scheduler");
    let pool = format!("pool-{}", env.ctx.namespace);
    let node = TestNode::create(&env, &pool).await;
    let manager = env.start(options(&env, Duration::from_secs(600)));
    // A nodeSelector no node matches (a typo in the pool's name).
    env.create_runner_set(
        "selector",
        pool_spec(&env, scheduler, &format!("{pool}-typo")),
    )
    .await;
    let executor = env.listener_executor();
    condition(&env, "selector", "ListenerReady", "True", "SessionHeld").await;
    let blocked = assert_runners_blocked(&env, "selector", "PodUnschedulable").await;
    assert!(
        blocked
            .message
            .contains("didn't match Pod's node affinity/selector"),
        "{}",
        blocked.message
    );
    assert!(
        blocked.message.contains("fix the nodeSelector"),
        "{}",
        blocked.message
    );

    // The template is fixed: the runner made from the old one is replaced, and its successor is scheduled.
    env.runner_sets()
        .patch(
            "selector",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"template": {"spec": {
                "nodeSelector": {POOL_LABEL: pool},
            }}}})),
        )
        .await
        .expect("fix the template");
    assert_eq!(bound_node(&env).await, node.name);
    condition(
        &env,
        "selector",
        "RunnersCanStart",
        "True",
        "RunnersStartable",
    )
    .await;
    condition(&env, "selector", "Ready", "True", "Ready").await;
    manager.stop().await;
    executor.stop();
    node.delete().await;
}

/// How long after its last successful poll the real listener's report counts as stale: its own bound (the
/// long-poll timeout plus its status heartbeat, which its report states) plus the controller's margin.
const STALE: Duration = Duration::from_secs(
    controller::autoscaling_runner_set::served::DEFAULT_POLL_STALE_AFTER.as_secs()
        + controller::autoscaling_runner_set::served::REPORT_MARGIN.as_secs(),
);
/// What the controller may take beyond that to notice: its recheck and status write, and the second
/// granularity of Kubernetes times.
const NOTICE: Duration = Duration::from_secs(15);

/// Waits up to `within` until condition `type_` of `set` has `status` and `reason`.
async fn condition_within(
    env: &Env,
    set: &str,
    type_: &str,
    status: &str,
    reason: &str,
    within: Duration,
) -> Condition {
    test_harness::eventually(
        &format!("{type_}={status}/{reason} on {set}"),
        within,
        || async {
            env.condition(set, type_)
                .await
                .filter(|c| c.status == status && c.reason == reason)
        },
    )
    .await
}

/// Sends `signal` (`STOP`, `CONT`) to a process.
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal} {pid}: {status}");
}

/// The listener process of `set`, while it runs.
async fn listener_pid(env: &Env, executor: &ListenerExecutor, set: &str) -> (String, u32) {
    let name = listener_name(env, set).await;
    let pid = env
        .eventually("the listener process", || async {
            executor.pid(&env.controller_namespace, &name)
        })
        .await;
    (name, pid)
}

#[tokio::test]
async fn a_listener_that_hangs_is_reported_until_it_polls_again() {
    let env = Env::with_fake("served-hung", fake_config()).await;
    let manager = env.start(options(&env, Duration::from_secs(600)));
    env.create_runner_set("hung", env.runner_set_spec()).await;
    scale_set_id(&env, "hung").await;
    let executor = env.listener_executor();
    assert_served(&env, &manager, "hung").await;
    let (_, pid) = listener_pid(&env, &executor, "hung").await;

    // The listener hangs (frozen with SIGSTOP): its pod stays Running, and it neither polls nor reports.
    signal(pid, "STOP");
    let frozen = tokio::time::Instant::now();
    let hung = condition_within(
        &env,
        "hung",
        "ListenerReady",
        "False",
        "ListenerNotReporting",
        STALE + NOTICE,
    )
    .await;
    // Its last published poll was at most one heartbeat before the freeze, so the verdict came within the stale
    // bound (and not before the report could have gone stale).
    let took = frozen.elapsed();
    assert!(
        took <= STALE + NOTICE && took >= STALE - Duration::from_secs(45),
        "ListenerNotReporting after {took:?}"
    );
    assert!(
        hung.message
            .contains("longer ago than it polls: it is hung"),
        "{}",
        hung.message
    );
    assert_not_served(&env, &manager, "hung", "ListenerNotReporting").await;

    signal(pid, "CONT");
    assert_served(&env, &manager, "hung").await;
    manager.stop().await;
    executor.stop();
}

#[tokio::test]
async fn a_listener_that_never_opens_its_session_is_reported_until_it_does() {
    let env = Env::with_fake("served-not-started", fake_config()).await;
    let manager = env.start(options(&env, Duration::from_secs(600)));
    env.create_runner_set("stuck", env.runner_set_spec()).await;
    scale_set_id(&env, "stuck").await;
    // The service holds the listener's session request, and the listener hangs while it waits (frozen with
    // SIGSTOP once it has reported that it holds no session): it runs, holds no session, reports no error.
    env.fake
        .state()
        .set_faults(Faults {
            latency: vec![fake_actions_service::LatencyFault {
                endpoint: Some("create_session".into()),
                millis: 600_000,
            }],
            ..Faults::default()
        })
        .expect("faults");
    let executor = env.listener_executor();
    let (name, pid) = listener_pid(&env, &executor, "stuck").await;
    env.eventually("the listener's first report", || async {
        let report = env.listeners().get(&name).await.ok()?.status?;
        (report.session_held == Some(false) && report.last_error.is_none()).then_some(())
    })
    .await;
    signal(pid, "STOP");
    let frozen = tokio::time::Instant::now();
    let starting = env
        .condition("stuck", "ListenerReady")
        .await
        .expect("condition");
    assert_eq!(
        starting.reason, "ListenerStarting",
        "within its grace period"
    );

    let stuck = condition_within(
        &env,
        "stuck",
        "ListenerReady",
        "False",
        "ListenerNotStarted",
        STALE + NOTICE,
    )
    .await;
    let took = frozen.elapsed();
    assert!(took <= STALE + NOTICE, "ListenerNotStarted after {took:?}");
    assert!(
        stuck.message.contains("has held no message session since")
            && stuck.message.contains("reports no error"),
        "{}",
        stuck.message
    );
    assert_not_served(&env, &manager, "stuck", "ListenerNotStarted").await;

    env.fake.state().clear_faults();
    signal(pid, "CONT");
    assert_served(&env, &manager, "stuck").await;
    manager.stop().await;
    executor.stop();
}

/// Whether `user` may `verb` `group`/`resource` in `namespace` (a SubjectAccessReview).
async fn may(
    env: &Env,
    user: &str,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: &str,
) -> bool {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            groups: Some(vec!["system:serviceaccounts".to_owned()]),
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                verb: Some(verb.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    Api::<SubjectAccessReview>::all(env.client())
        .create(&kube::api::PostParams::default(), &review)
        .await
        .expect("SubjectAccessReview")
        .status
        .is_some_and(|status| status.allowed)
}

/// Creates a rendered chart object.
async fn create_rendered(env: &Env, object: &serde_json::Value, namespace: &str) {
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let kind = object["kind"].as_str().expect("kind");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let (resource, capabilities) = kube::discovery::pinned_kind(&env.client(), &gvk)
        .await
        .expect("a served kind");
    let api: Api<kube::api::DynamicObject> =
        if capabilities.scope == kube::discovery::Scope::Namespaced {
            Api::namespaced_with(env.client(), namespace, &resource)
        } else {
            Api::all_with(env.client(), &resource)
        };
    let object: kube::api::DynamicObject =
        serde_json::from_value(object.clone()).expect("a Kubernetes object");
    api.create(&kube::api::PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create {kind} {}: {e}", object.name_any()));
}

/// A client acting as the manager's ServiceAccount with the RBAC of a controller chart from before listeners
/// reported in their AutoscalingListener's status: this chart's objects without the rule that lets the manager
/// manage Roles and RoleBindings in its own namespace (where it grants each listener its `<listener>-status`
/// Role), plus the scale-set chart's manager Role in the scale set namespace, as installing both charts would.
async fn older_chart_manager(env: &Env) -> kube::Client {
    use chart_tests::{Chart, Template};
    let controller_ns = env.controller_namespace.clone();
    // Cluster-scoped names must not collide with other tests': the release name carries the namespace.
    let release = format!("r-{controller_ns}");
    let manifests = Template::new(Chart::Controller)
        .release(&release)
        .namespace(&controller_ns)
        .render()
        .expect("render the controller chart");
    let mut account = None;
    let mut removed = 0;
    for object in manifests.objects() {
        let mut object = object.clone();
        match object["kind"].as_str() {
            Some("ServiceAccount") => {
                account = object["metadata"]["name"].as_str().map(str::to_owned);
            }
            Some("Role") => {
                if let Some(rules) = object["rules"].as_array_mut() {
                    let before = rules.len();
                    rules.retain(|rule| {
                        !rule["apiGroups"].as_array().is_some_and(|groups| {
                            groups.iter().any(|g| g == "rbac.authorization.k8s.io")
                        })
                    });
                    removed += before - rules.len();
                }
            }
            Some("RoleBinding" | "ClusterRole" | "ClusterRoleBinding") => {}
            _ => continue,
        }
        create_rendered(env, &object, &controller_ns).await;
    }
    assert_eq!(
        removed, 1,
        "the chart's one rule on Roles and RoleBindings in its namespace"
    );
    let account = account.expect("the chart renders a ServiceAccount");
    let scale_set_chart = Template::new(Chart::ScaleSet)
        .release("old")
        .namespace(&env.ctx.namespace)
        .values(serde_json::json!({
            "githubConfigUrl": env.config_url,
            "githubConfigSecret": ars_support::CREDENTIALS,
            "controllerServiceAccount": {"name": account, "namespace": controller_ns},
        }))
        .render()
        .expect("render the scale-set chart");
    for object in scale_set_chart.objects() {
        if matches!(object["kind"].as_str(), Some("Role" | "RoleBinding"))
            && object["metadata"]["name"]
                .as_str()
                .is_some_and(|name| name.contains("manager"))
        {
            let mut object = object.clone();
            // Its cleanup finalizer is for the scale-set chart's uninstall, which this test does not do.
            object["metadata"]["finalizers"] = serde_json::Value::Null;
            create_rendered(env, &object, &env.ctx.namespace).await;
        }
    }
    let user = format!("system:serviceaccount:{controller_ns}:{account}");
    // The authorizer reads RBAC from its caches: wait until the bindings are in force.
    env.eventually("the manager's RBAC in force", || async {
        (may(env, &user, "create", "", "pods", &env.ctx.namespace).await
            && may(env, &user, "create", "", "pods", &controller_ns).await
            && may(
                env,
                &user,
                "list",
                "actions.github.com",
                "autoscalingrunnersets",
                &env.ctx.namespace,
            )
            .await)
            .then_some(())
    })
    .await;
    assert!(
        !may(
            env,
            &user,
            "create",
            "rbac.authorization.k8s.io",
            "roles",
            &controller_ns
        )
        .await,
        "the older chart lets the manager create no Role in its namespace"
    );
    let mut config = env.ctx.control_plane.config().clone();
    config.auth_info.impersonate = Some(user);
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".to_owned(),
        format!("system:serviceaccounts:{controller_ns}"),
        "system:authenticated".to_owned(),
    ]);
    kube::Client::try_from(config).expect("the manager's client")
}

#[tokio::test]
async fn under_an_older_charts_rbac_the_listener_scales_without_reporting_and_the_set_says_so() {
    let env = Env::with_fake("served-old-chart", fake_config()).await;
    let client = older_chart_manager(&env).await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let manager = controller::Manager::new(client, options(&env, Duration::from_secs(600)));
    let registry = manager.registry();
    let task = tokio::spawn(manager.run(shutdown.clone()));
    env.create_runner_set("old", env.runner_set_spec()).await;
    let id = scale_set_id(&env, "old").await;
    let executor = env.listener_executor();
    let (name, _) = listener_pid(&env, &executor, "old").await;

    // The listener holds its session and scales, though it may not report: jobs raise the replicas it writes.
    env.eventually("the listener's session", || async {
        env.fake
            .state()
            .snapshot()
            .scale_sets
            .iter()
            .any(|s| s.id == id && s.session_id.is_some())
            .then_some(())
    })
    .await;
    env.fake
        .state()
        .enqueue_jobs(&fake_actions_service::EnqueueJobs {
            scale_set_name: Some("old".to_owned()),
            count: 2,
            ..Default::default()
        })
        .expect("enqueue");
    env.eventually("replicas raised by the listener", || async {
        let ers = env.ephemeral_runner_sets().get_opt("old").await.ok()??;
        (ers.spec.replicas == 2).then_some(())
    })
    .await;
    let log = executor
        .log(&env.controller_namespace, &name)
        .expect("the listener's log");
    assert!(
        log.contains("writing the listener status failed") && log.contains("403"),
        "the listener warns that it may not report:\n{log}"
    );
    let listener = env.listeners().get(&name).await.expect("listener");
    assert!(
        listener
            .status
            .as_ref()
            .and_then(|s| s.session_held)
            .is_none(),
        "no report reached the status: {:?}",
        listener.status
    );

    // The set does not claim it is served: it says the listener does not report, and why that may be.
    let silent = condition_within(
        &env,
        "old",
        "ListenerReady",
        "False",
        "ListenerNotReporting",
        STALE + NOTICE,
    )
    .await;
    assert!(
        silent.message.contains("403") && silent.message.contains("controller chart older"),
        "{}",
        silent.message
    );
    condition(&env, "old", "Ready", "False", "ListenerNotReporting").await;
    assert_eq!(session_gauge(&registry, &env, "old"), Some(0));
    assert_eq!(
        writes_during(env.runner_sets(), "old", QUIET).await,
        0,
        "no status write while the cause lasts"
    );
    // No crash loop: the same listener process runs on, its pod never failed.
    assert_eq!(
        executor.running(),
        vec![format!("{}/{name}", env.controller_namespace)]
    );
    let listener = env.listeners().get(&name).await.expect("listener");
    assert!(
        listener
            .status
            .as_ref()
            .and_then(|s| s.pod_failures.as_ref())
            .is_none(),
        "{:?}",
        listener.status
    );
    assert_eq!(env.events("old", "ListenerNotReporting").await.len(), 1);
    shutdown.cancel();
    task.await.expect("manager task").expect("manager result");
    executor.stop();
}
