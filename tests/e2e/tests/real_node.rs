//! The real-node tier's end-to-end suite: the chart-installed scale set with the manager in-process, the
//! listener as a real pod from the project image and the runners as real pods from the runner image, on a real
//! kubelet and containerd (tests/harness `node`), against the fake Actions Service. Nothing is simulated: the
//! kubelet reports every pod phase, the runner image reports to the fake over HTTP.
//!
//! Needs root, containerd, runc and the CNI plugins (`tests/env/provision-node.sh`); without them every test
//! prints a loud SKIPPED message and returns, and with `CI=true` it fails. The tests take turns: each has a
//! node of its own, and two cores run one node's pods at a time well.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chart_tests::{Chart, Template};
use controller::{Manager, Options};
use crds::{AutoscalingListener, AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet};
use fake_actions_service::{EnqueueJobs, FakeActionsService, JobState, StateSnapshot};
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use node_images::constants::{PAUSE_IMAGE, PROJECT_IMAGE, RUNNER_IMAGE, env};
use node_images::images::{Archives, Binaries, write_images};
use serde_json::{Value, json};
use test_harness::node::NodeParts;
use test_harness::{NodeConfig, RealNode, TestContext, node_tier};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long any one condition may take.
const WAIT: Duration = Duration::from_secs(240);
const RELEASE: &str = "arc-node";
const RUNNER_POD_SELECTOR: &str = "actions-ephemeral-runner=True";
/// How long the runner image runs each job.
const JOB_MS: &str = "3000";
/// How long the fake waits for a renewal of a running job before it takes the runner for lost (the service
/// waits minutes; the runner image renews every second).
const RUNNER_LOST_TIMEOUT: Duration = Duration::from_secs(10);

/// One test at a time (see the module's doc).
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A workspace binary: the real one, not a test harness cargo may name under `deps/`.
fn binary(package: &str, bin: &str) -> PathBuf {
    let path = test_harness::workspace_binary(package, bin)
        .unwrap_or_else(|e| panic!("building {package}/{bin}: {e}"));
    if path.file_name().is_some_and(|name| name == bin) {
        return path;
    }
    path.parent()
        .and_then(Path::parent)
        .map(|dir| dir.join(bin))
        .filter(|p| p.is_file())
        .unwrap_or(path)
}

/// The three images, from the binaries of this build; written once per test process.
fn images() -> Archives {
    static IMAGES: std::sync::OnceLock<Archives> = std::sync::OnceLock::new();
    IMAGES.get_or_init(write_all_images).clone()
}

fn write_all_images() -> Archives {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("real-node-images");
    let (pause, runner) = (
        binary("node-images", "arc-rs-pause"),
        binary("node-images", "arc-rs-runner"),
    );
    let (manager, listener) = (
        binary("controller", "manager"),
        binary("listener", "listener"),
    );
    write_images(
        Binaries {
            pause: &pause,
            runner: &runner,
            project: Some((&manager, &listener)),
        },
        &dir,
    )
    .expect("build the images")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The scale set on a real node.
struct NodeWorld {
    ctx: TestContext,
    node: RealNode,
    fake: FakeActionsService,
    controller_namespace: String,
    rendered: Vec<Value>,
    shutdown: CancellationToken,
    manager: JoinHandle<controller::Result<()>>,
    /// Runner pods seen: uid → (name, created, container started).
    pods_seen: Arc<Mutex<BTreeMap<String, PodTimes>>>,
    watcher: JoinHandle<()>,
}

#[derive(Debug, Clone, Default)]
struct PodTimes {
    name: String,
    created: Option<Time>,
    started: Option<Time>,
}

impl NodeWorld {
    /// `runner` adds fields to the runner container (`env` is appended to the world's).
    async fn start(
        prefix: &str,
        parts: &NodeParts,
        min_runners: u32,
        max_runners: u32,
        runner: Value,
    ) -> Self {
        e2e::init_test_tracing();
        let ctx = TestContext::new(prefix).await;
        test_harness::apply_crds(&ctx.client, &crds::all_crds())
            .await
            .expect("CRDs");
        let controller_namespace =
            test_harness::create_namespace(&ctx.client, &format!("{prefix}-system"))
                .await
                .expect("controller namespace");
        let archives = images();
        let node = ctx
            .control_plane
            .start_node(
                parts,
                NodeConfig {
                    pause_image: (archives.pause.clone(), PAUSE_IMAGE.to_owned()),
                    images: vec![
                        archives.runner.clone(),
                        archives.project.clone().expect("the project image"),
                    ],
                },
            )
            .await
            .expect("start the node");
        eprintln!(
            "node {} Ready in {:?} (images imported)",
            node.name(),
            node.started_in
        );
        let fake = FakeActionsService::start(fake_actions_service::Config {
            session_idle_timeout: Some(Duration::from_secs(20)),
            long_poll_timeout: Duration::from_secs(10),
            // The runner image renews its running job every second; one that dies is lost after this.
            runner_lost_timeout: Some(RUNNER_LOST_TIMEOUT),
            ..fake_actions_service::Config::default()
        })
        .await
        .expect("start the fake");
        let config_url = format!("{}/node-org", fake.base_url());
        let metrics_port = free_port();
        let api_env: Vec<Value> = node
            .api_server_env()
            .iter()
            .map(|var| json!({"name": var.name, "value": var.value}))
            .collect();
        let on_this_node = json!({"kubernetes.io/hostname": node.name()});
        let mut runner_container = json!({
            "name": "runner",
            "image": RUNNER_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["/runner"],
            "env": [{"name": env::JOB_MS, "value": JOB_MS}],
        });
        for (key, value) in runner.as_object().into_iter().flatten() {
            match (key.as_str(), runner_container["env"].as_array_mut()) {
                ("env", Some(list)) => list.extend(value.as_array().cloned().unwrap_or_default()),
                _ => runner_container[key.as_str()] = value.clone(),
            }
        }
        let values = json!({
            "githubConfigUrl": config_url,
            "githubConfigSecret": {"github_token": "ghp_node"},
            "controllerServiceAccount": {"name": "arc-rs-controller", "namespace": controller_namespace},
            "minRunners": min_runners,
            "maxRunners": max_runners,
            // Host networking: the fake and the API server listen on 127.0.0.1 (docs/development.md).
            "template": {"spec": {
                "hostNetwork": true,
                "nodeSelector": on_this_node,
                "terminationGracePeriodSeconds": 10,
                "containers": [runner_container],
            }},
            "listenerTemplate": {"spec": {
                "hostNetwork": true,
                "nodeSelector": on_this_node,
                "containers": [{
                    "name": "listener",
                    "imagePullPolicy": "Never",
                    "env": api_env,
                }],
            }},
            // The listener's metrics and health port is a host port here: a free one, not 8080.
            "listenerLivenessProbe": {"enabled": true, "probe": {
                "httpGet": {"path": "/healthz", "port": metrics_port},
                "initialDelaySeconds": 10,
                "periodSeconds": 20,
                "timeoutSeconds": 5,
            }},
        });
        let rendered = Template::new(Chart::ScaleSet)
            .release(RELEASE)
            .namespace(&ctx.namespace)
            .values(values)
            .render()
            .expect("render the chart")
            .into_objects();
        let build_version = rendered
            .iter()
            .find(|o| o["kind"] == "AutoscalingRunnerSet")
            .and_then(|o| o["metadata"]["labels"]["app.kubernetes.io/version"].as_str())
            .unwrap_or(env!("CARGO_PKG_VERSION"))
            .to_owned();
        let mut options = Options {
            watch_namespace: Some(ctx.namespace.clone()),
            build_version,
            actions_call_timeout: Duration::from_secs(10),
            error_backoff_min: Duration::from_millis(200),
            error_backoff_max: Duration::from_secs(2),
            scale_set_check_interval: Duration::from_secs(5),
            configuration_error_backoff: Duration::from_secs(5),
            ..Options::default()
        };
        options.listener.namespace = Some(controller_namespace.clone());
        options.listener.image = PROJECT_IMAGE.to_owned();
        options.listener.log_level = "info".to_owned();
        options.listener.metrics_addr = format!(":{metrics_port}");
        options.runner.failure_backoff_base = Duration::from_millis(200);
        options.runner.job_still_running_requeue = Duration::from_millis(500);
        options.runner.pod_rejection_retry = Duration::from_secs(1);
        options.runner.disruption_backoff_max = Duration::from_secs(1);
        options.scale_down.ready_grace_period = Duration::ZERO;
        let shutdown = CancellationToken::new();
        let manager = tokio::spawn(Manager::new(ctx.client.clone(), options).run(shutdown.clone()));
        let pods_seen = Arc::new(Mutex::new(BTreeMap::new()));
        let watcher = tokio::spawn(record_pod_times(ctx.api::<Pod>(), Arc::clone(&pods_seen)));
        let world = Self {
            ctx,
            node,
            fake,
            controller_namespace,
            rendered,
            shutdown,
            manager,
            pods_seen,
            watcher,
        };
        world.install().await;
        world
    }

    fn client(&self) -> Client {
        self.ctx.client.clone()
    }

    /// Creates the rendered objects, as `helm install` would.
    async fn install(&self) {
        for object in &self.rendered {
            let (api, _) = self.dynamic_api(object).await;
            let object: DynamicObject = serde_json::from_value(object.clone()).expect("object");
            api.create(&PostParams::default(), &object)
                .await
                .unwrap_or_else(|e| panic!("creating {}: {e}", object.name_any()));
        }
    }

    /// Deletes the rendered objects, as `helm uninstall` would (the AutoscalingRunnerSet first).
    async fn uninstall(&self) {
        let mut objects: Vec<&Value> = self.rendered.iter().collect();
        objects.sort_by_key(|o| o["kind"] != "AutoscalingRunnerSet");
        for object in objects {
            let (api, name) = self.dynamic_api(object).await;
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => panic!("deleting {name}: {e}"),
            }
        }
    }

    async fn dynamic_api(&self, object: &Value) -> (Api<DynamicObject>, String) {
        let api_version = object["apiVersion"].as_str().expect("apiVersion");
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, object["kind"].as_str().expect("kind"));
        let (resource, _) = kube::discovery::pinned_kind(&self.client(), &gvk)
            .await
            .expect("discovery");
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or(&self.ctx.namespace);
        (
            Api::namespaced_with(self.client(), namespace, &resource),
            object["metadata"]["name"]
                .as_str()
                .expect("name")
                .to_owned(),
        )
    }

    fn scale_set_id(&self) -> Option<i64> {
        self.fake
            .state()
            .snapshot()
            .scale_sets
            .into_iter()
            .find(|set| set.name.eq_ignore_ascii_case(RELEASE))
            .map(|set| set.id)
    }

    fn enqueue(&self, count: u32) -> Vec<i64> {
        self.fake
            .state()
            .enqueue_jobs(&EnqueueJobs {
                scale_set_name: Some(RELEASE.to_owned()),
                count,
                ..EnqueueJobs::default()
            })
            .expect("enqueue")
    }

    async fn runner_pods(&self) -> Vec<Pod> {
        self.ctx
            .api::<Pod>()
            .list(&ListParams::default().labels(RUNNER_POD_SELECTOR))
            .await
            .expect("list runner pods")
            .items
    }

    async fn ephemeral_runners(&self) -> Vec<EphemeralRunner> {
        self.ctx
            .api::<EphemeralRunner>()
            .list(&ListParams::default())
            .await
            .expect("list EphemeralRunners")
            .items
    }

    async fn listener_pods(&self) -> Vec<Pod> {
        Api::<Pod>::namespaced(self.client(), &self.controller_namespace)
            .list(&ListParams::default().labels(test_harness::LISTENER_POD_SELECTOR))
            .await
            .expect("list listener pods")
            .items
    }

    /// Polls `check` until it returns `Some`; on timeout panics with `what` and the world's state.
    async fn eventually<T, F, Fut>(&self, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(value) = check().await {
                return value;
            }
            assert!(
                !self.manager.is_finished(),
                "the manager stopped while waiting for {what}"
            );
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "timed out after {WAIT:?} waiting for {what}\n{}",
                    self.diagnostics().await
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The state of things, for failure messages.
    async fn diagnostics(&self) -> String {
        let mut out = String::new();
        for pod in self.listener_pods().await {
            let name = pod.name_any();
            out.push_str(&format!(
                "listener pod {name}: {:?}\n  log: {:?}\n",
                pod.status.as_ref().and_then(|s| s.phase.clone()),
                self.node
                    .container_log(&self.controller_namespace, &name, "listener")
                    .map(|l| l
                        .lines()
                        .rev()
                        .take(15)
                        .map(str::to_owned)
                        .collect::<Vec<_>>())
            ));
        }
        for pod in self.runner_pods().await {
            out.push_str(&format!(
                "runner pod {}: {:?}\n",
                pod.name_any(),
                pod.status.as_ref().and_then(|s| s.phase.clone())
            ));
        }
        for er in self.ephemeral_runners().await {
            out.push_str(&format!(
                "EphemeralRunner {}: {}\n",
                er.name_any(),
                serde_json::to_string(&er.status).unwrap_or_default()
            ));
        }
        let snapshot = self.fake.state().snapshot();
        out.push_str(&format!(
            "fake: {} runners, jobs by state {:?}\n",
            snapshot.runners.len(),
            jobs_by_state(&snapshot)
        ));
        out.push_str(&format!(
            "kubelet log tail:\n{}\n",
            self.node.log_tail("kubelet")
        ));
        out
    }

    /// Waits until the listener runs as a real pod and holds a session with the fake.
    async fn wait_listening(&self) {
        self.eventually("a Running listener pod", || async {
            self.listener_pods()
                .await
                .iter()
                .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .then_some(())
        })
        .await;
        self.eventually("a listener session in the fake", || async {
            self.fake
                .state()
                .snapshot()
                .scale_sets
                .iter()
                .any(|s| s.name.eq_ignore_ascii_case(RELEASE) && s.session_id.is_some())
                .then_some(())
        })
        .await;
    }

    /// Waits until `runners` idle runners are up: that many EphemeralRunners Running with no job, each with a
    /// Running pod and a runner online in the fake.
    async fn wait_idle(&self, runners: usize) -> Vec<EphemeralRunner> {
        self.eventually(&format!("{runners} idle runners"), || async {
            let ers = self.ephemeral_runners().await;
            let pods = self.runner_pods().await;
            let snapshot = self.fake.state().snapshot();
            let online = snapshot
                .runners
                .iter()
                .filter(|r| {
                    Some(r.scale_set_id) == self.scale_set_id()
                        && r.online
                        && r.job_request_id.is_none()
                })
                .count();
            let running_pods = pods
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            let idle = ers.len() == runners
                && ers.iter().all(|er| {
                    er.metadata.deletion_timestamp.is_none()
                        && er
                            .status
                            .as_ref()
                            .is_some_and(|s| s.phase == "Running" && s.job_id.is_empty())
                })
                && running_pods == runners
                && pods.len() == runners
                && online == runners;
            idle.then_some(ers)
        })
        .await
    }

    /// Waits for one EphemeralRunner, registered and Running, with a Running pod other than `not`; for runners
    /// that never report online to the fake (the `HANG` switch), where [`NodeWorld::wait_idle`] would not do.
    async fn running_runner_and_pod(&self, not: Option<&Pod>) -> (EphemeralRunner, Pod) {
        self.eventually("a Running runner with a Running pod", || async {
            let ers = self.ephemeral_runners().await;
            let [er] = ers.as_slice() else {
                return None;
            };
            let status = er.status.as_ref()?;
            if status.phase != "Running" || status.runner_id == 0 {
                return None;
            }
            let pod = self.runner_pods().await.into_iter().find(|p| {
                p.name_any() == er.name_any()
                    && p.metadata.deletion_timestamp.is_none()
                    && not.is_none_or(|old| old.uid() != p.uid())
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })?;
            Some((er.clone(), pod))
        })
        .await
    }

    async fn wait_jobs_completed(&self, ids: &[i64]) -> StateSnapshot {
        self.eventually(&format!("{} jobs to complete", ids.len()), || async {
            let snapshot = self.fake.state().snapshot();
            let done = snapshot
                .jobs
                .iter()
                .filter(|j| ids.contains(&j.request_id) && j.state == JobState::Completed)
                .count();
            (done == ids.len()).then_some(snapshot)
        })
        .await
    }

    /// Uninstalls and waits until nothing of the scale set is left, in the API or in the fake.
    async fn uninstall_leaves_nothing(&self) {
        let scale_set = self.scale_set_id();
        self.uninstall().await;
        self.eventually("the uninstalled scale set to disappear", || async {
            let mut left = Vec::new();
            for object in &self.rendered {
                let (api, name) = self.dynamic_api(object).await;
                if api.get_opt(&name).await.ok().flatten().is_some() {
                    left.push(format!("{}/{name}", object["kind"]));
                }
            }
            let ns = &self.ctx.namespace;
            let cns = &self.controller_namespace;
            let lp = ListParams::default();
            let count = |n: usize, what: &str, left: &mut Vec<String>| {
                if n > 0 {
                    left.push(format!("{n} {what}"));
                }
            };
            let client = self.client();
            count(
                Api::<AutoscalingRunnerSet>::namespaced(client.clone(), ns)
                    .list(&lp)
                    .await
                    .ok()?
                    .items
                    .len(),
                "AutoscalingRunnerSets",
                &mut left,
            );
            count(
                Api::<AutoscalingListener>::namespaced(client.clone(), cns)
                    .list(&lp)
                    .await
                    .ok()?
                    .items
                    .len(),
                "AutoscalingListeners",
                &mut left,
            );
            count(
                Api::<EphemeralRunnerSet>::namespaced(client.clone(), ns)
                    .list(&lp)
                    .await
                    .ok()?
                    .items
                    .len(),
                "EphemeralRunnerSets",
                &mut left,
            );
            count(
                self.ephemeral_runners().await.len(),
                "EphemeralRunners",
                &mut left,
            );
            count(self.runner_pods().await.len(), "runner pods", &mut left);
            count(self.listener_pods().await.len(), "listener pods", &mut left);
            let jit_secrets = Api::<Secret>::namespaced(client, ns)
                .list(&lp)
                .await
                .ok()?
                .items
                .into_iter()
                .filter(|s| s.data.as_ref().is_some_and(|d| d.contains_key("jitToken")))
                .count();
            count(jit_secrets, "JIT Secrets", &mut left);
            let snapshot = self.fake.state().snapshot();
            if let Some(id) = scale_set {
                count(
                    snapshot
                        .runners
                        .iter()
                        .filter(|r| r.scale_set_id == id)
                        .count(),
                    "fake runners",
                    &mut left,
                );
                if snapshot.scale_sets.iter().any(|s| s.id == id) {
                    left.push(format!("fake scale set {id}"));
                }
            }
            left.is_empty().then_some(())
        })
        .await;
    }

    /// Stops the manager, tears the node down and checks that the host holds nothing of it.
    async fn finish(self) {
        self.shutdown.cancel();
        self.watcher.abort();
        match self.manager.await {
            Ok(Ok(())) => {}
            other => panic!("the manager ended badly: {other:?}"),
        }
        let left = self.node.teardown().await;
        assert!(left.is_empty(), "the node left behind: {left:#?}");
    }

    /// Create → container started, per runner pod seen, in seconds (sorted).
    fn start_latencies(&self) -> Vec<f64> {
        let seen = self.pods_seen.lock().unwrap_or_else(|p| p.into_inner());
        let mut latencies: Vec<f64> = seen
            .values()
            .filter_map(|t| {
                let (created, started) = (t.created.as_ref()?, t.started.as_ref()?);
                Some(started.0.duration_since(created.0).as_secs_f64())
            })
            .collect();
        latencies.sort_by(f64::total_cmp);
        latencies
    }
}

fn jobs_by_state(snapshot: &StateSnapshot) -> BTreeMap<String, usize> {
    let mut states = BTreeMap::new();
    for job in &snapshot.jobs {
        *states.entry(format!("{:?}", job.state)).or_default() += 1;
    }
    states
}

/// Records each runner pod's creation and its container's start, as the kubelet reports them.
async fn record_pod_times(pods: Api<Pod>, seen: Arc<Mutex<BTreeMap<String, PodTimes>>>) {
    loop {
        if let Ok(list) = pods
            .list(&ListParams::default().labels(RUNNER_POD_SELECTOR))
            .await
        {
            let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
            for pod in list.items {
                let entry = seen.entry(pod.uid().unwrap_or_default()).or_default();
                entry.name = pod.name_any();
                entry.created = pod.metadata.creation_timestamp.clone();
                let state = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .and_then(|c| c.first())
                    .and_then(|c| c.state.as_ref());
                let started = state.and_then(|s| {
                    s.running
                        .as_ref()
                        .and_then(|r| r.started_at.clone())
                        .or_else(|| s.terminated.as_ref().and_then(|t| t.started_at.clone()))
                });
                if entry.started.is_none() {
                    entry.started = started;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_jobs_run_on_real_runner_pods_each_exactly_once_and_nothing_is_left() {
    let Some(parts) = node_tier("e2e: ten jobs on a real node") else {
        return;
    };
    let _turn = TURN.lock().await;
    let world = NodeWorld::start("node-jobs", &parts, 0, 5, json!({})).await;
    world.wait_listening().await;

    let ids = world.enqueue(10);
    let snapshot = world.wait_jobs_completed(&ids).await;
    let mut problems = Vec::new();
    for id in &ids {
        let job = snapshot
            .jobs
            .iter()
            .find(|j| j.request_id == *id)
            .expect("job");
        if job.times_started != 1 || job.result.as_deref() != Some("succeeded") {
            problems.push(format!(
                "job {id}: started {} times, result {:?}",
                job.times_started, job.result
            ));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
    // Every job ran on a runner pod of its own, which exited 0 and was removed with its EphemeralRunner.
    let runners: std::collections::BTreeSet<_> = snapshot
        .jobs
        .iter()
        .filter_map(|j| j.runner_name.clone())
        .collect();
    assert_eq!(runners.len(), ids.len(), "one runner per job: {runners:?}");
    world.wait_idle(0).await;
    let latencies = world.start_latencies();
    eprintln!(
        "runner pods: {}; create -> container started: p50 {:.2} s, max {:.2} s",
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 1.0)
    );
    assert!(latencies.len() >= ids.len(), "{latencies:?}");

    world.uninstall_leaves_nothing().await;
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_runners_pod_deleted_gets_a_fresh_registration_and_pod_not_a_failure() {
    let Some(parts) = node_tier("e2e: idle runner pod deleted") else {
        return;
    };
    let _turn = TURN.lock().await;
    let world = NodeWorld::start("node-idle-del", &parts, 1, 2, json!({})).await;
    world.wait_listening().await;
    let before = world.wait_idle(1).await.remove(0);
    let er_name = before.name_any();
    let old_pod = world.runner_pods().await.remove(0);
    let old_runner_id = before
        .status
        .as_ref()
        .map(|s| s.runner_id)
        .unwrap_or_default();

    world
        .ctx
        .api::<Pod>()
        .delete(&old_pod.name_any(), &DeleteParams::default())
        .await
        .expect("delete the idle runner's pod");

    // A fresh registration and a new pod take the idle runner's place, and nothing counts as a failure.
    // Usually the same EphemeralRunner gets them (docs/runner-lifecycle.md, "A pod deleted, evicted or stuck
    // terminating"); when the runner sees its registration removed before SIGTERM arrives it exits 0, which is
    // a finished runner, and the set replaces it with a new EphemeralRunner: both are correct.
    let after = world.wait_idle(1).await.remove(0);
    let status = after.status.clone().unwrap_or_default();
    assert_ne!(status.runner_id, old_runner_id, "a fresh registration");
    assert!(status.failures.is_empty(), "no failure counted: {status:?}");
    let pod = world.runner_pods().await.remove(0);
    assert_ne!(pod.uid(), old_pod.uid(), "a new pod");
    let snapshot = world.fake.state().snapshot();
    assert!(
        !snapshot.runners.iter().any(|r| r.id == old_runner_id),
        "the old registration is gone"
    );
    if after.name_any() == er_name {
        let events: Vec<String> = world
            .ctx
            .api::<Event>()
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.name.as_deref() == Some(er_name.as_str())
                    && e.involved_object.kind.as_deref() == Some("EphemeralRunner")
            })
            .map(|e| format!("{:?}/{:?}", e.type_, e.reason))
            .collect();
        eprintln!("the same EphemeralRunner {er_name} got a new pod; its events: {events:?}");
        assert!(
            events.iter().all(|e| !e.starts_with("Some(\"Warning\")")),
            "an idle pod deleted is no warning: {events:?}"
        );
    } else {
        eprintln!(
            "the runner exited 0 when its registration went; EphemeralRunner {} replaced {er_name}",
            after.name_any()
        );
    }
    // And the runner serves a job.
    let ids = world.enqueue(1);
    world.wait_jobs_completed(&ids).await;
    world.wait_idle(1).await;
    world.uninstall_leaves_nothing().await;
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_runners_pod_deleted_is_deregistered_and_deleted_with_an_event() {
    let Some(parts) = node_tier("e2e: busy runner pod deleted") else {
        return;
    };
    let _turn = TURN.lock().await;
    let world = NodeWorld::start("node-busy-del", &parts, 0, 2, json!({})).await;
    world.wait_listening().await;
    let ids = world.enqueue(1);
    // The job runs for JOB_MS: find its runner while it does.
    let (er_name, runner_id, pod_name) = world
        .eventually("the job running on a runner pod", || async {
            let snapshot = world.fake.state().snapshot();
            let job = snapshot.jobs.iter().find(|j| j.request_id == ids[0])?;
            if job.state != JobState::Running {
                return None;
            }
            let name = job.runner_name.clone()?;
            let pod = world
                .runner_pods()
                .await
                .into_iter()
                .find(|p| p.name_any() == name)?;
            Some((name, job.runner_id?, pod.name_any()))
        })
        .await;
    world
        .ctx
        .api::<Pod>()
        .delete(&pod_name, &DeleteParams::default())
        .await
        .expect("delete the busy runner's pod");

    // The runner is deregistered and its EphemeralRunner deleted, not restarted with the job lost silently.
    world
        .eventually("the busy runner deregistered and deleted", || async {
            let gone = !world
                .ephemeral_runners()
                .await
                .iter()
                .any(|er| er.name_any() == er_name);
            let deregistered = !world
                .fake
                .state()
                .snapshot()
                .runners
                .iter()
                .any(|r| r.id == runner_id);
            (gone && deregistered).then_some(())
        })
        .await;
    let events: Vec<Event> = world
        .ctx
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        // The pod has the runner's name too; the runner's own Events are the controller's word.
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(er_name.as_str())
                && e.involved_object.kind.as_deref() == Some("EphemeralRunner")
        })
        .collect();
    let reasons: Vec<String> = events
        .iter()
        .map(|e| format!("{:?}/{:?}: {:?}", e.type_, e.reason, e.message))
        .collect();
    eprintln!("EphemeralRunner {er_name}'s events: {reasons:#?}");
    assert!(
        events.iter().any(|e| e.type_.as_deref() == Some("Warning")),
        "a Warning Event tells why the busy runner went: {reasons:#?}"
    );
    // The job ended when its runner died (the runner image fails it on SIGTERM), not run twice.
    let snapshot = world.wait_jobs_completed(&ids).await;
    let job = snapshot
        .jobs
        .iter()
        .find(|j| j.request_id == ids[0])
        .expect("job");
    assert_eq!(job.times_started, 1, "{job:?}");
    world.wait_idle(0).await;
    world.uninstall_leaves_nothing().await;
    world.finish().await;
}

/// A runner OOM-killed mid-job: the kubelet reports `OOMKilled`/137 and the pod fails. The service still
/// counts the runner busy until it stops hearing from it (the fake's lost-runner timeout, as the service fails
/// the job of a runner that lost communication), so the controller cannot deregister it at once; it must not
/// restart it either (the job is gone). What ARC users expect: the runner is deleted with a Warning Event once
/// the service lets it go, the job fails once and is not run again, nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_runner_oom_killed_is_deregistered_and_deleted_with_an_event() {
    let Some(parts) = node_tier("e2e: busy runner OOM-killed") else {
        return;
    };
    let _turn = TURN.lock().await;
    // The runner grows its memory once its job starts, within a 64 MiB limit the kernel enforces.
    let world = NodeWorld::start(
        "node-oom",
        &parts,
        0,
        1,
        json!({
            "env": [
                {"name": env::GROW_MEMORY, "value": "1"},
                {"name": env::JOB_MS, "value": "60000"},
            ],
            "resources": {"limits": {"memory": "64Mi"}, "requests": {"memory": "64Mi"}},
        }),
    )
    .await;
    world.wait_listening().await;
    let ids = world.enqueue(1);
    let (er_name, runner_id) = world
        .eventually("the job started on a runner", || async {
            let snapshot = world.fake.state().snapshot();
            let job = snapshot.jobs.iter().find(|j| j.request_id == ids[0])?;
            (job.state == JobState::Running).then(|| (job.runner_name.clone(), job.runner_id))
        })
        .await;
    let (er_name, runner_id) = (er_name.expect("runner name"), runner_id.expect("runner id"));
    // The kubelet reports the kill: the container terminated with reason OOMKilled.
    let reason = world
        .eventually("the runner container OOM-killed", || async {
            let pod = world
                .runner_pods()
                .await
                .into_iter()
                .find(|p| p.name_any() == er_name)?;
            let terminated = pod
                .status?
                .container_statuses?
                .first()?
                .state
                .clone()?
                .terminated?;
            Some((terminated.reason, terminated.exit_code))
        })
        .await;
    assert_eq!(reason, (Some("OOMKilled".to_owned()), 137));
    // A runner that held a job is not restarted: deregistered and deleted, with a Warning Event.
    world
        .eventually("the OOM-killed runner deregistered and deleted", || async {
            let gone = !world
                .ephemeral_runners()
                .await
                .iter()
                .any(|er| er.name_any() == er_name);
            let deregistered = !world
                .fake
                .state()
                .snapshot()
                .runners
                .iter()
                .any(|r| r.id == runner_id);
            (gone && deregistered).then_some(())
        })
        .await;
    let warnings: Vec<String> = world
        .ctx
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(er_name.as_str())
                && e.involved_object.kind.as_deref() == Some("EphemeralRunner")
                && e.type_.as_deref() == Some("Warning")
        })
        .map(|e| format!("{:?}: {:?}", e.reason, e.message))
        .collect();
    eprintln!("EphemeralRunner {er_name}'s warnings: {warnings:#?}");
    assert!(
        !warnings.is_empty(),
        "a Warning Event says why the runner went"
    );
    let job = world.fake.state().job(ids[0]).expect("job");
    assert_eq!(job.times_started, 1, "the job was not run again: {job:?}");
    assert_eq!(
        (job.state, job.result.as_deref(), job.runner_lost),
        (JobState::Completed, Some("failed"), true),
        "the service failed the job of its lost runner: {job:?}"
    );
    world.wait_idle(0).await;
    world.uninstall_leaves_nothing().await;
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_runner_ignoring_sigterm_stays_terminating_for_its_grace_period_then_gets_a_fresh_pod()
 {
    let Some(parts) = node_tier("e2e: idle runner stuck Terminating") else {
        return;
    };
    let _turn = TURN.lock().await;
    // The template's grace period is 10 s. The runner ignores SIGTERM and hangs (it never reports online, so
    // losing its registration does not end it either): only the kubelet's SIGKILL ends it.
    let world = NodeWorld::start(
        "node-stuck",
        &parts,
        1,
        1,
        json!({"env": [
            {"name": env::IGNORE_SIGTERM, "value": "1"},
            {"name": env::HANG, "value": "1"},
        ]}),
    )
    .await;
    world.wait_listening().await;
    let (before, old_pod) = world.running_runner_and_pod(None).await;
    let er_name = before.name_any();
    let old_runner_id = before
        .status
        .as_ref()
        .map(|s| s.runner_id)
        .unwrap_or_default();
    let pods = world.ctx.api::<Pod>();
    let deleted_at = std::time::Instant::now();
    pods.delete(&old_pod.name_any(), &DeleteParams::default())
        .await
        .expect("delete the idle runner's pod");

    // While the pod is Terminating the idle runner is released: the service must give it no job.
    world
        .eventually(
            "the old registration released while the pod terminates",
            || async {
                let released = !world
                    .fake
                    .state()
                    .snapshot()
                    .runners
                    .iter()
                    .any(|r| r.id == old_runner_id);
                released.then_some(())
            },
        )
        .await;
    let still_there = pods
        .get_opt(&old_pod.name_any())
        .await
        .expect("get")
        .is_some_and(|p| p.uid() == old_pod.uid());
    assert!(
        still_there,
        "the runner ignores SIGTERM, so its pod is still Terminating ({:?} after the delete)",
        deleted_at.elapsed()
    );
    world
        .eventually("the old pod gone", || async {
            let current = pods.get_opt(&old_pod.name_any()).await.ok()?;
            current
                .is_none_or(|p| p.uid() != old_pod.uid())
                .then_some(())
        })
        .await;
    let terminating_for = deleted_at.elapsed();
    eprintln!(
        "the pod of a runner ignoring SIGTERM was gone {terminating_for:?} after its deletion"
    );
    assert!(
        terminating_for >= Duration::from_secs(8),
        "the kubelet waits the grace period (10 s) before SIGKILL: {terminating_for:?}"
    );
    // Then the same runner comes back with a fresh registration and pod, no failure counted.
    let (after, _) = world.running_runner_and_pod(Some(&old_pod)).await;
    assert_eq!(after.name_any(), er_name);
    let status = after.status.clone().unwrap_or_default();
    assert_ne!(status.runner_id, old_runner_id, "a fresh registration");
    assert!(status.failures.is_empty(), "no failure counted: {status:?}");
    world.uninstall_leaves_nothing().await;
    world.finish().await;
}
