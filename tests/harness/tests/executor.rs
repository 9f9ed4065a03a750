//! The listener-pod executor runs a process per listener pod with the pod's configuration, mirrors it in the
//! pod's status, and stops it when the pod goes away. A shell script stands in for the listener binary here; the
//! controller suites run the real one.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use test_harness::{ListenerExecutor, TestContext};

const FAKE_LISTENER: &str = r#"#!/bin/sh
echo "config=$(cat "$LISTENER_CONFIG_PATH")"
echo "env FOO=$FOO https_proxy=$https_proxy"
grep -q '"token"' "$KUBECONFIG" && echo "kubeconfig-has-token"
if [ -n "$EXIT_WITH" ]; then exit "$EXIT_WITH"; fi
trap 'echo got-sigterm; exit 0' TERM
while true; do sleep 0.1; done
"#;

fn fake_listener(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("fake-listener.sh");
    std::fs::write(&path, FAKE_LISTENER).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

async fn create_listener_pod(ctx: &TestContext, name: &str, exit_with: Option<&str>) {
    let secrets: Api<Secret> = ctx.api();
    let config = json!({"configure_url": "https://github.com/o/r", "metrics_addr": ":8080", "metrics_endpoint": "/metrics"});
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-config")},
        "stringData": {"config.json": config.to_string()}
    }))
    .expect("secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("config secret");
    let proxy: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-proxy")},
        "stringData": {"https_proxy": "http://proxy.example:3128"}
    }))
    .expect("secret");
    secrets
        .create(&PostParams::default(), &proxy)
        .await
        .expect("proxy secret");
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("sa");
    ctx.api::<ServiceAccount>()
        .create(&PostParams::default(), &sa)
        .await
        .expect("service account");

    let mut env = vec![
        json!({"name": "LISTENER_CONFIG_PATH", "value": "/etc/gha-listener/config.json"}),
        json!({"name": "FOO", "value": "bar"}),
        json!({"name": "https_proxy", "valueFrom": {"secretKeyRef": {"name": format!("{name}-proxy"), "key": "https_proxy"}}}),
    ];
    if let Some(code) = exit_with {
        env.push(json!({"name": "EXIT_WITH", "value": code}));
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/component": "runner-scale-set-listener"}},
        "spec": {
            "serviceAccountName": name,
            "restartPolicy": "Never",
            "volumes": [{"name": "listener-config", "secret": {"secretName": format!("{name}-config")}}],
            "containers": [{
                "name": "listener",
                "image": "ghcr.io/arc-rs/arc-rs:test",
                "env": env,
                "volumeMounts": [{"name": "listener-config", "mountPath": "/etc/gha-listener", "readOnly": true}]
            }]
        }
    }))
    .expect("pod");
    ctx.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
}

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn runs_listener_pods_and_mirrors_them_in_pod_status() {
    let ctx = TestContext::new("executor").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let executor = ListenerExecutor::start(
        ctx.control_plane,
        ctx.client.clone(),
        Some(&ctx.namespace),
        fake_listener(&dir),
    )
    .expect("start executor");
    let pods: Api<Pod> = ctx.api();

    create_listener_pod(&ctx, "runs", None).await;
    test_harness::eventually("the pod to be Running", WAIT, || async {
        let pod = pods.get("runs").await.ok()?;
        (pod.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let log = test_harness::eventually("the process output", WAIT, || async {
        executor
            .log(&ctx.namespace, "runs")
            .filter(|l| l.contains("kubeconfig-has-token"))
    })
    .await;
    let metrics = executor
        .metrics_url(&ctx.namespace, "runs")
        .expect("metrics url");
    let port = metrics
        .trim_start_matches("http://127.0.0.1:")
        .trim_end_matches("/metrics");
    assert!(
        log.contains(&format!("\"metrics_addr\":\"127.0.0.1:{port}\"")),
        "metrics address rewritten to a free port: {log}"
    );
    assert!(
        log.contains("env FOO=bar https_proxy=http://proxy.example:3128"),
        "{log}"
    );
    assert_eq!(executor.running(), vec![format!("{}/runs", ctx.namespace)]);

    pods.delete("runs", &DeleteParams::default())
        .await
        .expect("delete pod");
    test_harness::eventually("the process to stop", WAIT, || async {
        executor.running().is_empty().then_some(())
    })
    .await;

    create_listener_pod(&ctx, "fails", Some("3")).await;
    let code = test_harness::eventually("the pod to fail", WAIT, || async {
        let status = pods.get("fails").await.ok()?.status?;
        if status.phase.as_deref() != Some("Failed") {
            return None;
        }
        status.container_statuses?[0]
            .state
            .as_ref()?
            .terminated
            .as_ref()
            .map(|t| t.exit_code)
    })
    .await;
    assert_eq!(code, 3);
    assert!(executor.errors().is_empty(), "{:?}", executor.errors());
    executor.stop();
}

#[test]
fn workspace_binaries_are_built_on_demand() {
    let path = test_harness::workspace_binary("fake-actions-service", "fake-actions-service")
        .expect("build the fake's binary");
    assert!(path.is_file(), "{}", path.display());
    // The binary itself, not its unit-test harness (which `--tests` builds under the same name in deps/).
    let help = std::process::Command::new(&path)
        .arg("--help")
        .output()
        .expect("run the binary");
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("--addr"),
        "not the fake's CLI: {}",
        path.display()
    );
    let err = test_harness::workspace_binary("fake-actions-service", "no-such-binary").unwrap_err();
    assert!(err.to_string().contains("no-such-binary"), "{err}");
}
