//! The real-node tier's harness: a node (containerd, kubelet, kube-scheduler) joins the test control plane,
//! runs real pods from the runner image, and leaves nothing on the host when it goes, even when the test that
//! started it panics.
//!
//! Needs root, containerd, runc and the CNI plugins (`tests/env/provision-node.sh`); without them the tests
//! print a loud SKIPPED message, and with `CI=true` they fail.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use actions_client::{
    ActionsClient, ClientOptions, Credentials, GitHubConfig, JitSetting, RunnerScaleSet,
    SecretString,
};
use fake_actions_service::{EnqueueJobs, FakeActionsService, JobState};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use node_images::constants::{PAUSE_IMAGE, RUNNER_IMAGE, env};
use node_images::images::{Archives, Binaries, write_images};
use serde_json::json;
use test_harness::node::NodeParts;
use test_harness::{NodeConfig, RealNode, TestContext, eventually, node_tier};

const POD_TIMEOUT: Duration = Duration::from_secs(90);

/// A workspace binary: the real one, not a test harness cargo may name under `deps/`.
fn binary(package: &str, bin: &str) -> PathBuf {
    let path = test_harness::workspace_binary(package, bin).expect("build the binary");
    if path.file_name().is_some_and(|name| name == bin) {
        return path;
    }
    path.parent()
        .and_then(Path::parent)
        .map(|dir| dir.join(bin))
        .filter(|p| p.is_file())
        .unwrap_or(path)
}

fn images(out: &Path) -> Archives {
    let pause = binary("node-images", "arc-rs-pause");
    let runner = binary("node-images", "arc-rs-runner");
    write_images(
        Binaries {
            pause: &pause,
            runner: &runner,
            project: None,
        },
        out,
    )
    .expect("build the images")
}

async fn start_node(ctx: &TestContext, parts: &NodeParts, archives: &Archives) -> RealNode {
    ctx.control_plane
        .start_node(
            parts,
            NodeConfig {
                pause_image: (archives.pause.clone(), PAUSE_IMAGE.to_owned()),
                images: vec![archives.runner.clone()],
            },
        )
        .await
        .expect("start the node")
}

/// A runner pod as the EphemeralRunner controller makes it (the JIT config from a Secret), on host networking
/// so it reaches the fake on 127.0.0.1.
fn runner_pod(node: &str, name: &str, secret: &str, extra_env: serde_json::Value) -> Pod {
    let mut env = vec![json!({
        "name": "ACTIONS_RUNNER_INPUT_JITCONFIG",
        "valueFrom": {"secretKeyRef": {"name": secret, "key": "jitToken"}},
    })];
    env.extend(extra_env.as_array().cloned().unwrap_or_default());
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 5,
            // The scheduler places the pod; the selector keeps it off other tests' nodes.
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{
                "name": "runner",
                "image": RUNNER_IMAGE,
                "imagePullPolicy": "Never",
                "env": env,
            }],
        },
    }))
    .expect("pod")
}

fn jit_secret(name: &str, jit: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some([("jitToken".to_owned(), ByteString(jit.as_bytes().to_vec()))].into()),
        ..Secret::default()
    }
}

fn phase(pod: &Pod) -> Option<String> {
    pod.status.as_ref().and_then(|s| s.phase.clone())
}

fn exit_code(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_pods_run_to_succeeded_and_failed_and_the_node_leaves_nothing_behind() {
    let Some(parts) = node_tier("harness: real node runs pods") else {
        return;
    };
    let ctx = TestContext::new("real-node").await;
    let out = tempfile::tempdir().expect("image dir");
    let archives = images(out.path());
    let node = start_node(&ctx, &parts, &archives).await;
    eprintln!("node {} Ready in {:?}", node.name(), node.started_in);
    let identity = node.identity();

    // A scale set, a registered runner and a job for it, through the fake's protocol.
    let fake = FakeActionsService::start(fake_actions_service::Config::default())
        .await
        .expect("start the fake");
    let actions = ActionsClient::new(
        GitHubConfig::parse(&format!("{}/node-org", fake.base_url())).expect("config URL"),
        &Credentials::Pat(SecretString::new("ghp_node")),
        ClientOptions::default(),
    )
    .expect("Actions client");
    let scale_set = actions
        .create_runner_scale_set(&RunnerScaleSet {
            name: "real-node".to_owned(),
            runner_group_id: 1,
            ..RunnerScaleSet::default()
        })
        .await
        .expect("scale set");
    let jit = actions
        .generate_jit_runner_config(
            scale_set.id,
            &JitSetting {
                name: "runner-ok".to_owned(),
                work_folder: String::new(),
            },
        )
        .await
        .expect("JIT config");
    let jobs = fake
        .state()
        .enqueue_jobs(&EnqueueJobs {
            scale_set_id: Some(scale_set.id),
            count: 1,
            ..EnqueueJobs::default()
        })
        .expect("enqueue");
    let session = actions
        .message_session(scale_set.id, "real-node-test")
        .await
        .expect("session");
    assert_eq!(session.acquire_jobs(&jobs).await.expect("acquire"), jobs);
    session.close().await.expect("close the session");

    let secrets: Api<Secret> = ctx.api();
    let pods: Api<Pod> = ctx.api();
    let pp = PostParams::default();
    secrets
        .create(
            &pp,
            &jit_secret("runner-ok", jit.encoded_jit_config.expose_secret()),
        )
        .await
        .expect("JIT Secret");
    secrets
        .create(&pp, &jit_secret("runner-bad", "not-a-jit-config"))
        .await
        .expect("bad JIT Secret");

    let created = Instant::now();
    pods.create(
        &pp,
        &runner_pod(
            node.name(),
            "runner-ok",
            "runner-ok",
            json!([{"name": env::JOB_MS, "value": "1500"}]),
        ),
    )
    .await
    .expect("create the runner pod");
    pods.create(
        &pp,
        &runner_pod(node.name(), "runner-bad", "runner-bad", json!([])),
    )
    .await
    .expect("create the failing pod");

    let running_after = eventually("runner-ok Running", POD_TIMEOUT, || async {
        let pod = pods.get("runner-ok").await.ok()?;
        matches!(phase(&pod).as_deref(), Some("Running" | "Succeeded")).then(|| created.elapsed())
    })
    .await;
    eprintln!("pod create -> Running: {running_after:?}");

    let ok = eventually("runner-ok Succeeded", POD_TIMEOUT, || async {
        let pod = pods.get("runner-ok").await.ok()?;
        matches!(phase(&pod).as_deref(), Some("Succeeded" | "Failed")).then_some(pod)
    })
    .await;
    let log = node.container_log(&ctx.namespace, "runner-ok", "runner");
    assert_eq!(phase(&ok).as_deref(), Some("Succeeded"), "log: {log:?}");
    assert_eq!(exit_code(&ok), Some(0));
    assert_eq!(
        ok.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node.name())
    );
    let job = fake.state().job(jobs[0]).expect("the job");
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert!(
        log.as_deref().is_some_and(|l| l.contains("Started")),
        "the runner's log, read from the kubelet's files: {log:?}"
    );

    let bad = eventually("runner-bad Failed", POD_TIMEOUT, || async {
        let pod = pods.get("runner-bad").await.ok()?;
        matches!(phase(&pod).as_deref(), Some("Succeeded" | "Failed")).then_some(pod)
    })
    .await;
    assert_eq!(phase(&bad).as_deref(), Some("Failed"), "{:?}", bad.status);
    assert_eq!(exit_code(&bad), Some(1));
    let log = node
        .container_log(&ctx.namespace, "runner-bad", "runner")
        .unwrap_or_default();
    assert!(log.contains("JIT config"), "{log}");

    let left = node.teardown().await;
    assert!(left.is_empty(), "left behind after teardown: {left:#?}");
    assert!(identity.settled_leftovers().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_that_panics_with_a_running_pod_still_tears_the_node_down() {
    let Some(parts) = node_tier("harness: teardown after a panic") else {
        return;
    };
    let ctx = TestContext::new("real-node-panic").await;
    let namespace = ctx.namespace.clone();
    let client = ctx.client.clone();
    let out = tempfile::tempdir().expect("image dir");
    let archives = images(out.path());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let test = tokio::spawn(async move {
        let node = start_node(&ctx, &parts, &archives).await;
        tx.send((node.identity(), node.name().to_owned()))
            .expect("send the identity");
        // A pod that never ends by itself: its processes, mounts and cgroups exist when the panic comes.
        let pods: Api<Pod> = ctx.api();
        let pod = serde_json::from_value(json!({
            "metadata": {"name": "hangs"},
            "spec": {
                "restartPolicy": "Never",
                "hostNetwork": true,
                "nodeSelector": {"kubernetes.io/hostname": node.name()},
                "containers": [{
                    "name": "runner",
                    "image": RUNNER_IMAGE,
                    "imagePullPolicy": "Never",
                    "env": [
                        {"name": env::HANG, "value": "1"},
                        {"name": env::IGNORE_SIGTERM, "value": "1"},
                    ],
                }],
            },
        }))
        .expect("pod");
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("pod");
        eventually("the hanging pod Running", POD_TIMEOUT, || async {
            let pod = pods.get("hangs").await.ok()?;
            (phase(&pod).as_deref() == Some("Running")).then_some(())
        })
        .await;
        assert!(
            !node.identity().leftovers().is_empty(),
            "a running node is visible to the leftovers check"
        );
        panic!("the test fails with its node running");
    });
    let (identity, node_name) = rx.await.expect("the node started");
    let joined = test.await;
    assert!(
        joined.is_err_and(|e| e.is_panic()),
        "the test task panicked"
    );
    let left = tokio::task::spawn_blocking(move || identity.settled_leftovers())
        .await
        .expect("check");
    assert!(left.is_empty(), "left behind after a panic: {left:#?}");

    // The Node object went with it, so no later pod is scheduled onto a node that is gone.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    assert!(nodes.get_opt(&node_name).await.expect("get").is_none());
    // The pod object stays in the API (nothing deletes it with its node gone): the control plane's state,
    // not the host's.
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    assert!(
        pods.get_opt("hangs")
            .await
            .expect("get")
            .is_some_and(|p| p.name_any() == "hangs")
    );
}
