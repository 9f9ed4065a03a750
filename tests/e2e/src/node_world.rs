//! The scale set on a real node, for the real-node test tier (`tests/real_node.rs`) and `demo --real-node`:
//! the local control plane with one real node (kubelet, containerd and runc from `test_harness::node`), the
//! images built by `node-images` from this build's binaries, the fake Actions Service, the manager in-process,
//! and one scale set installed from the objects the scale-set chart renders, its listener a real pod from the
//! project image and its runners real pods from the runner image. Nothing is simulated: the kubelet reports
//! every pod phase, and the runner image reports to the fake over HTTP.
//!
//! A test fixture: setting up panics with what failed, and [`NodeWorld::eventually`] panics with the world's
//! state when a condition does not come.

use chart_tests::{Chart, Template};
use controller::{Manager, Options};
use crds::{AutoscalingListener, AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet};
use fake_actions_service::{EnqueueJobs, FakeActionsService, JobState, StateSnapshot};
use k8s_openapi::api::core::v1::{Event, Node, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{
    DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Api, Client, ResourceExt};
use node_images::constants::{PAUSE_IMAGE, PROJECT_IMAGE, RUNNER_IMAGE, env};
use node_images::images::{Archives, Binaries, write_images};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use test_harness::node::NodeParts;
use test_harness::{NodeConfig, RealNode, TestContext};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long any one condition may take.
pub const WAIT: Duration = Duration::from_secs(240);
pub const RELEASE: &str = "arc-node";
pub const RUNNER_POD_SELECTOR: &str = "actions-ephemeral-runner=True";
/// How long the runner image runs each job.
pub const JOB_MS: &str = "3000";
/// How long the fake waits for a renewal of a running job before it takes the runner for lost (the service
/// waits minutes; the runner image renews every second).
pub const RUNNER_LOST_TIMEOUT: Duration = Duration::from_secs(10);

/// A workspace binary: the real one, not a test harness cargo may name under `deps/`.
pub fn binary(package: &str, bin: &str) -> PathBuf {
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

/// The three images, from the binaries of this build; written once per process.
pub fn images() -> Archives {
    static IMAGES: std::sync::OnceLock<Archives> = std::sync::OnceLock::new();
    IMAGES.get_or_init(write_all_images).clone()
}

/// Writes the images beside the binaries they are made of (the build's target directory).
pub fn write_all_images() -> Archives {
    let (pause, runner) = (
        binary("node-images", "arc-rs-pause"),
        binary("node-images", "arc-rs-runner"),
    );
    let dir = pause
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("real-node-images");
    // The manager and the listener of the build under test, as every other suite runs them. A test run used to
    // build them as the image ships them (the Dockerfile's `dist` profile) for this tier alone: a second build of
    // every dependency plus whole-program optimisation, half of both cores for about ten minutes in the middle of
    // the test lanes, for the same code. The release workflow builds what ships.
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

pub fn free_port() -> u16 {
    std::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The scale set on a real node.
pub struct NodeWorld {
    pub ctx: TestContext,
    pub node: RealNode,
    pub fake: FakeActionsService,
    pub controller_namespace: String,
    pub rendered: Vec<Value>,
    pub shutdown: CancellationToken,
    pub manager: JoinHandle<controller::Result<()>>,
    /// Runner pods seen: uid → (name, created, container started).
    pub pods_seen: Arc<Mutex<BTreeMap<String, PodTimes>>>,
    pub watcher: JoinHandle<()>,
}

#[derive(Debug, Clone, Default)]
pub struct PodTimes {
    pub name: String,
    pub created: Option<Time>,
    pub started: Option<Time>,
    /// The runner container's exit code, once it terminated.
    pub exit_code: Option<i32>,
}

impl NodeWorld {
    /// `runner` adds fields to the runner container (`env` is appended to the world's).
    pub async fn start(
        prefix: &str,
        parts: &NodeParts,
        min_runners: u32,
        max_runners: u32,
        runner: Value,
    ) -> Self {
        Self::start_with_values(prefix, parts, min_runners, max_runners, runner, json!({})).await
    }

    /// [`NodeWorld::start`] with scale-set chart `values` on top of the world's (e.g. `minRunnersSchedules`).
    pub async fn start_with_values(
        prefix: &str,
        parts: &NodeParts,
        min_runners: u32,
        max_runners: u32,
        runner: Value,
        values: Value,
    ) -> Self {
        crate::init_test_tracing();
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
        let world_values = json!({
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
                // The listener ends within a second of SIGTERM; a hung one uses up the whole grace period before
                // the kubelet's SIGKILL (60 s by default), which only the hung-listener test would wait out.
                "terminationGracePeriodSeconds": 10,
                "containers": [{
                    "name": "listener",
                    "imagePullPolicy": "Never",
                    "env": api_env,
                }],
            }},
            // The listener's metrics and health port is a host port here: a free one, not 8080.
            "listenerLivenessProbe": {"enabled": true, "probe": {
                "httpGet": {"path": "/healthz", "port": metrics_port},
                // Fast enough for the hung-listener test (about 15 s from hang to kill), slack enough for two
                // busy cores (three answers missed in a row, 3 s each).
                "initialDelaySeconds": 10,
                "periodSeconds": 5,
                "timeoutSeconds": 3,
                "failureThreshold": 3,
            }},
        });
        let rendered = Template::new(Chart::ScaleSet)
            .release(RELEASE)
            .namespace(&ctx.namespace)
            .values(world_values)
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
        // The probe above asks the metrics port: the listener serves /healthz there too.
        options.listener.health_addr = format!(":{metrics_port}");
        options.runner.failure_backoff_base = Duration::from_millis(200);
        options.runner.job_still_running_requeue = Duration::from_millis(500);
        options.runner.pod_rejection_retry = Duration::from_secs(1);
        options.runner.disruption_backoff_max = Duration::from_secs(1);
        options.scale_down.ready_grace_period = Duration::ZERO;
        let shutdown = CancellationToken::new();
        // The controller chart's single-namespace RBAC (the suites' world runs its cluster-wide default).
        let credentials = crate::manager_rbac::install(
            &ctx,
            &controller_namespace,
            Some(&ctx.namespace),
            &json!({}),
        )
        .await
        .expect("the manager's RBAC from the controller chart");
        let manager = tokio::spawn(Manager::new(credentials.client, options).run(shutdown.clone()));
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

    pub fn client(&self) -> Client {
        self.ctx.client.clone()
    }

    /// Creates the rendered objects, as `helm install` would.
    pub async fn install(&self) {
        for object in &self.rendered {
            let (api, _) = self.dynamic_api(object).await;
            let object: DynamicObject = serde_json::from_value(object.clone()).expect("object");
            api.create(&PostParams::default(), &object)
                .await
                .unwrap_or_else(|e| panic!("creating {}: {e}", object.name_any()));
        }
    }

    /// Deletes the rendered objects, as `helm uninstall` would (the AutoscalingRunnerSet first).
    pub async fn uninstall(&self) {
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

    pub async fn dynamic_api(&self, object: &Value) -> (Api<DynamicObject>, String) {
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

    pub fn scale_set_id(&self) -> Option<i64> {
        self.fake
            .state()
            .snapshot()
            .scale_sets
            .into_iter()
            .find(|set| set.name.eq_ignore_ascii_case(RELEASE))
            .map(|set| set.id)
    }

    pub fn enqueue(&self, count: u32) -> Vec<i64> {
        self.fake
            .state()
            .enqueue_jobs(&EnqueueJobs {
                scale_set_name: Some(RELEASE.to_owned()),
                count,
                ..EnqueueJobs::default()
            })
            .expect("enqueue")
    }

    pub async fn runner_pods(&self) -> Vec<Pod> {
        self.ctx
            .api::<Pod>()
            .list(&ListParams::default().labels(RUNNER_POD_SELECTOR))
            .await
            .expect("list runner pods")
            .items
    }

    pub async fn ephemeral_runners(&self) -> Vec<EphemeralRunner> {
        self.ctx
            .api::<EphemeralRunner>()
            .list(&ListParams::default())
            .await
            .expect("list EphemeralRunners")
            .items
    }

    pub async fn listener_pods(&self) -> Vec<Pod> {
        Api::<Pod>::namespaced(self.client(), &self.controller_namespace)
            .list(&ListParams::default().labels(test_harness::LISTENER_POD_SELECTOR))
            .await
            .expect("list listener pods")
            .items
    }

    /// Polls `check` until it returns `Some`; on timeout panics with `what` and the world's state.
    pub async fn eventually<T, F, Fut>(&self, what: &str, mut check: F) -> T
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
    pub async fn diagnostics(&self) -> String {
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
    pub async fn wait_listening(&self) {
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
    pub async fn wait_idle(&self, runners: usize) -> Vec<EphemeralRunner> {
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
    pub async fn running_runner_and_pod(&self, not: Option<&Pod>) -> (EphemeralRunner, Pod) {
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

    pub async fn wait_jobs_completed(&self, ids: &[i64]) -> StateSnapshot {
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
    pub async fn uninstall_leaves_nothing(&self) {
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
    pub async fn finish(self) {
        self.shutdown.cancel();
        self.watcher.abort();
        match self.manager.await {
            Ok(Ok(())) => {}
            other => panic!("the manager ended badly: {other:?}"),
        }
        let left = self.node.teardown().await;
        assert!(left.is_empty(), "the node left behind: {left:#?}");
    }

    /// The AutoscalingRunnerSet's condition of `type_`.
    pub async fn set_condition(&self, type_: &str) -> Option<Condition> {
        self.ctx
            .api::<AutoscalingRunnerSet>()
            .get_opt(RELEASE)
            .await
            .ok()
            .flatten()?
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == type_)
    }

    /// Waits until the set's condition `type_` has `status` and `reason`; returns its message.
    pub async fn wait_set_condition(&self, type_: &str, status: &str, reason: &str) -> String {
        self.eventually(
            &format!("the set's condition {type_}={status} ({reason})"),
            || async {
                let c = self.set_condition(type_).await?;
                (c.status == status && c.reason == reason).then_some(c.message)
            },
        )
        .await
    }

    /// Events about the object `kind`/`name`, in any namespace of the world, as `type/reason: message`.
    pub async fn events_about(&self, kind: &str, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        for namespace in [&self.ctx.namespace, &self.controller_namespace] {
            let events = Api::<Event>::namespaced(self.client(), namespace)
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            out.extend(
                events
                    .into_iter()
                    .filter(|e| {
                        e.involved_object.name.as_deref() == Some(name)
                            && e.involved_object.kind.as_deref() == Some(kind)
                    })
                    .map(|e| {
                        format!(
                            "{}/{}: {}",
                            e.type_.unwrap_or_default(),
                            e.reason.unwrap_or_default(),
                            e.message.unwrap_or_default()
                        )
                    }),
            );
        }
        out
    }

    /// Every pod of the world on the node (runner and listener pods).
    pub async fn pods_on_node(&self) -> Vec<Pod> {
        let mut pods = self.runner_pods().await;
        pods.extend(self.listener_pods().await);
        pods.retain(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.node.name())
        });
        pods
    }

    pub async fn set_node_unschedulable(&self, unschedulable: bool) {
        Api::<Node>::all(self.client())
            .patch(
                self.node.name(),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": unschedulable}})),
            )
            .await
            .expect("cordon or uncordon the node");
    }

    /// Ids of the runners registered in the fake for the world's scale set.
    pub fn registered_runner_ids(&self) -> BTreeSet<i64> {
        let set = self.scale_set_id();
        self.fake
            .state()
            .snapshot()
            .runners
            .iter()
            .filter(|r| Some(r.scale_set_id) == set)
            .map(|r| r.id)
            .collect()
    }

    /// Waits until `jobs` jobs run on runner pods; returns (EphemeralRunner name, runner id, pod name) each.
    pub async fn wait_jobs_running(&self, ids: &[i64]) -> Vec<(String, i64, String)> {
        self.eventually(
            &format!("{} jobs running on runner pods", ids.len()),
            || async {
                let snapshot = self.fake.state().snapshot();
                let pods = self.runner_pods().await;
                let mut running = Vec::new();
                for id in ids {
                    let job = snapshot.jobs.iter().find(|j| j.request_id == *id)?;
                    if job.state != JobState::Running {
                        return None;
                    }
                    let name = job.runner_name.clone()?;
                    let pod = pods.iter().find(|p| p.name_any() == name)?;
                    running.push((name, job.runner_id?, pod.name_any()));
                }
                Some(running)
            },
        )
        .await
    }

    /// Create → container started, per runner pod seen, in seconds (sorted).
    pub fn start_latencies(&self) -> Vec<f64> {
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

pub fn jobs_by_state(snapshot: &StateSnapshot) -> BTreeMap<String, usize> {
    let mut states = BTreeMap::new();
    for job in &snapshot.jobs {
        *states.entry(format!("{:?}", job.state)).or_default() += 1;
    }
    states
}

/// Records each runner pod's creation and its container's start, as the kubelet reports them. A watch, not a
/// poll: a 1-s job's pod can show its container's start for less time than a poll's interval (the kubelet may
/// report Pending, then Succeeded, and the manager deletes the pod at once), and a poll then never sees it; the
/// watch delivers every version, the deletion's last one included. Should the watch have to list again (its
/// history expired), pods deleted meanwhile are missed, which the run's own report makes visible.
pub async fn record_pod_times(pods: Api<Pod>, seen: Arc<Mutex<BTreeMap<String, PodTimes>>>) {
    use futures::StreamExt as _;
    use kube::runtime::{WatchStreamExt as _, watcher};
    let config = watcher::Config::default().labels(RUNNER_POD_SELECTOR);
    let mut events = std::pin::pin!(watcher(pods, config).default_backoff().touched_objects());
    while let Some(event) = events.next().await {
        let Ok(pod) = event else {
            continue;
        };
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
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
        if let Some(terminated) = state.and_then(|s| s.terminated.as_ref()) {
            entry.exit_code = Some(terminated.exit_code);
        }
    }
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// What `demo --real-node` runs.
#[derive(Debug, Clone)]
pub struct DemoSpec {
    pub jobs: u32,
    /// Jobs enqueued per second.
    pub rate: f64,
    /// How long the runner image runs each job.
    pub job_duration: Duration,
    pub min_runners: u32,
    /// Runner pods at most (two cores run about ten at a time well).
    pub max_runners: u32,
    /// Give up on the jobs after this long.
    pub timeout: Duration,
}

/// `demo --real-node`: the demo's scale set on a real node. Returns whether every job completed exactly once
/// and nothing was left; on a host without the node tier's parts, says what is missing and returns `None`.
pub fn demo_main(spec: DemoSpec) -> Option<bool> {
    let parts = test_harness::node_tier("demo --real-node")?;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("demo --real-node: starting the async runtime: {error}");
            return Some(false);
        }
    };
    // The world is a test fixture that panics with what failed; the demo reports that as its failure.
    let outcome = runtime.block_on(async move { tokio::spawn(run_demo(parts, spec)).await });
    match outcome {
        Ok(problems) if problems.is_empty() => {
            println!(
                "checks: every job completed exactly once; nothing left behind after uninstall"
            );
            Some(true)
        }
        Ok(problems) => {
            println!("checks FAILED:");
            for problem in problems {
                println!("  - {problem}");
            }
            Some(false)
        }
        Err(error) => {
            let message = error
                .try_into_panic()
                .ok()
                .and_then(|p| {
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                })
                .unwrap_or_else(|| "the demo task was cancelled".to_owned());
            println!("demo --real-node failed: {message}");
            Some(false)
        }
    }
}

/// Runs the demo on a real node; returns the problems found (none when every job completed exactly once and
/// nothing was left).
async fn run_demo(parts: NodeParts, spec: DemoSpec) -> Vec<String> {
    let started = std::time::Instant::now();
    println!(
        "starting the local control plane, a real node (kubelet, containerd, runc), the fake Actions Service and \
         the manager; building and importing the images..."
    );
    let job_ms = spec.job_duration.as_millis().to_string();
    let world = NodeWorld::start(
        "demo",
        &parts,
        spec.min_runners,
        spec.max_runners,
        json!({"env": [{"name": env::JOB_MS, "value": job_ms}]}),
    )
    .await;
    println!(
        "node {} Ready in {:.1}s; scale set `{RELEASE}` installed in namespace {} from the gha-runner-scale-set \
         chart (listener pod in {}); fake at {}",
        world.node.name(),
        world.node.started_in.as_secs_f64(),
        world.ctx.namespace,
        world.controller_namespace,
        world.fake.base_url()
    );
    world.wait_listening().await;
    println!(
        "listener pod running and connected after {:.1}s; feeding {} jobs at {}/s (each runs {} ms), at most {} \
         runner pods\n",
        started.elapsed().as_secs_f64(),
        spec.jobs,
        spec.rate,
        job_ms,
        spec.max_runners
    );
    let feed_start = std::time::Instant::now();
    let mut ids = Vec::new();
    let mut last_line = String::new();
    let mut last_print = feed_start;
    let mut finished_at = None;
    loop {
        let due =
            ((feed_start.elapsed().as_secs_f64() * spec.rate).floor() as u32 + 1).min(spec.jobs);
        if due > ids.len() as u32 {
            ids.extend(world.enqueue(due - ids.len() as u32));
        }
        let snapshot = world.fake.state().snapshot();
        let of_ours = |state: JobState| {
            snapshot
                .jobs
                .iter()
                .filter(|j| ids.contains(&j.request_id) && j.state == state)
                .count()
        };
        let (running, done) = (of_ours(JobState::Running), of_ours(JobState::Completed));
        let queued = ids.len() - running - done;
        let pods = world.runner_pods().await;
        let phase = |p: &str| {
            pods.iter()
                .filter(|pod| pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(p))
                .count()
        };
        let line = format!(
            "jobs: {queued:>4} queued {running:>4} running {done:>4} done | runner pods: {:>3} pending {:>3} \
             running | pods seen {:>4}",
            phase("Pending"),
            phase("Running"),
            world
                .pods_seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .len()
        );
        let all_done = ids.len() as u32 == spec.jobs && done == ids.len();
        if all_done && finished_at.is_none() {
            finished_at = Some(feed_start.elapsed());
        }
        if (line != last_line && last_print.elapsed() >= Duration::from_secs(1)) || all_done {
            println!("[{:>5.1}s] {line}", feed_start.elapsed().as_secs_f64());
            last_line = line;
            last_print = std::time::Instant::now();
        }
        if all_done {
            break;
        }
        if feed_start.elapsed() >= spec.timeout {
            println!("timed out after {:?}", spec.timeout);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let run = finished_at.unwrap_or_else(|| feed_start.elapsed());
    println!("\nall jobs done; checking and uninstalling the scale set...");
    let snapshot = world.fake.state().snapshot();
    let mut problems = Vec::new();
    for id in &ids {
        match snapshot.jobs.iter().find(|j| j.request_id == *id) {
            Some(job)
                if job.state == JobState::Completed
                    && job.times_started == 1
                    && job.result.as_deref() == Some("succeeded") => {}
            Some(job) => problems.push(format!(
                "job {id}: {:?}, started {} times, result {:?}",
                job.state, job.times_started, job.result
            )),
            None => problems.push(format!("job {id}: unknown to the fake")),
        }
    }
    if snapshot.jit_config_reuses > 0 {
        problems.push(format!(
            "{} JIT configs used twice",
            snapshot.jit_config_reuses
        ));
    }
    let latencies = world.start_latencies();
    world.wait_idle(spec.min_runners as usize).await;
    world.uninstall_leaves_nothing().await;
    let pods = latencies.len();
    world.finish().await;
    println!("\n== summary ==");
    println!(
        "jobs: {} enqueued, {} completed exactly once",
        ids.len(),
        ids.len() - problems.iter().filter(|p| p.starts_with("job ")).count()
    );
    println!(
        "time: {:.1}s from first job to last completion ({:.0} jobs/min), {:.1}s in all",
        run.as_secs_f64(),
        ids.len() as f64 / run.as_secs_f64().max(0.001) * 60.0,
        started.elapsed().as_secs_f64()
    );
    println!(
        "runner pods: {pods}, create -> runner container started (the kubelet's 1 s timestamps): p50 {:.0} s, \
         p90 {:.0} s, max {:.0} s",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.9),
        percentile(&latencies, 1.0)
    );
    problems
}
