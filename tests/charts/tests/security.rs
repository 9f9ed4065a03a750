//! Pod hardening of both charts (docs/security.md): the manager runs as the image's non-root user with a
//! read-only root filesystem and no privileges by default, values can still change or remove every part of
//! that, and only the dind container of a runner pod is privileged. The rendered pods are also handed to the
//! real API server's Pod Security admission (server-side dry run), so the claims are the API server's verdict,
//! not only ours.

use std::collections::BTreeMap;
use std::path::PathBuf;

use chart_tests::{Chart, Manifests, Template};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use test_harness::TestContext;

const RELEASE: &str = "test-arc";
const NAMESPACE: &str = "test-ns";
const FULLNAME: &str = "test-arc-gha-rs-controller";

/// Every container mode of the scale-set chart; `""` is the default mode.
const MODES: [&str; 4] = ["", "dind", "kubernetes", "kubernetes-novolume"];

fn render(template: Template) -> Manifests {
    template
        .render()
        .unwrap_or_else(|e| panic!("render failed: {e}"))
}

fn controller() -> Template {
    Template::new(Chart::Controller)
        .release(RELEASE)
        .namespace(NAMESPACE)
}

/// The scale-set chart in `mode`, with what it needs to render without a cluster.
fn scale_set(mode: &str) -> Template {
    let mut values = json!({
        "githubConfigUrl": "https://github.com/actions",
        "githubConfigSecret": {"github_token": "gh_token12345"},
        "controllerServiceAccount": {"name": "arc", "namespace": "arc-system"},
    });
    if !mode.is_empty() {
        values["containerMode"] = json!({"type": mode});
    }
    Template::new(Chart::ScaleSet)
        .release("test-runners")
        .namespace(NAMESPACE)
        .values(values)
}

/// The manager Deployment's pod template.
fn manager_pod(m: &Manifests) -> &Value {
    &m.get("Deployment", FULLNAME)
        .expect("the manager Deployment")["spec"]["template"]
}

fn manager_container(m: &Manifests) -> &Value {
    let container = &manager_pod(m)["spec"]["containers"][0];
    assert_eq!(container["name"], "manager");
    container
}

/// The runner pod template of the AutoscalingRunnerSet.
fn runner_pod(m: &Manifests) -> &Value {
    &m.single("AutoscalingRunnerSet")
        .expect("one AutoscalingRunnerSet")["spec"]["template"]
}

/// Every container of a pod spec, init containers (and native sidecars) included.
fn all_containers(spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|key| spec[*key].as_array().into_iter().flatten())
        .collect()
}

fn privileged(container: &Value) -> bool {
    container["securityContext"]["privileged"] == true
}

/// The user and group of the image's `USER` line (the final stage's, the last one in the file).
fn dockerfile_user() -> (i64, i64) {
    let path = chart_tests::repo_root().join("Dockerfile");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let user = text
        .lines()
        .rev()
        .find_map(|line| line.trim().strip_prefix("USER "))
        .expect("the Dockerfile sets a USER");
    let (uid, gid) = user
        .trim()
        .split_once(':')
        .unwrap_or((user.trim(), user.trim()));
    let number = |s: &str| {
        s.parse::<i64>()
            .unwrap_or_else(|_| panic!("the Dockerfile's USER {user:?} is not numeric"))
    };
    (number(uid), number(gid))
}

#[test]
fn the_manager_runs_hardened_by_default() {
    let m = render(controller());
    let pod = &manager_pod(&m)["spec"];
    let (uid, gid) = dockerfile_user();
    assert_ne!(uid, 0, "the image runs as root");
    assert_eq!(
        pod["securityContext"],
        json!({
            "runAsNonRoot": true,
            "runAsUser": uid,
            "runAsGroup": gid,
            "seccompProfile": {"type": "RuntimeDefault"},
        })
    );
    let manager = manager_container(&m);
    assert_eq!(
        manager["securityContext"],
        json!({
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
        })
    );
    // The one writable path: /tmp, an emptyDir (the manager itself writes nothing to disk).
    assert_eq!(
        manager["volumeMounts"],
        json!([{"mountPath": "/tmp", "name": "tmp"}])
    );
    assert_eq!(pod["volumes"], json!([{"name": "tmp", "emptyDir": {}}]));
    for absent in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(pod.get(absent).is_none(), "{absent} is set");
    }
}

#[test]
fn no_container_but_dind_is_privileged() {
    for container in all_containers(&manager_pod(&render(controller()))["spec"]) {
        assert!(!privileged(container), "{container}");
    }
    for mode in MODES {
        let m = render(scale_set(mode));
        let containers = all_containers(&runner_pod(&m)["spec"]);
        let privileged: Vec<&str> = containers
            .iter()
            .filter(|c| privileged(c))
            .map(|c| c["name"].as_str().expect("a name"))
            .collect();
        let expected: &[&str] = if mode == "dind" { &["dind"] } else { &[] };
        assert_eq!(privileged, expected, "mode {mode:?}");
        // Runner pods get no securityContext from the chart: the runner image needs a writable root
        // filesystem (docs/security.md), so nothing is forced on them either way.
        let runner = containers
            .iter()
            .find(|c| c["name"] == "runner")
            .expect("a runner container");
        assert!(runner.get("securityContext").is_none(), "mode {mode:?}");
        assert!(
            runner_pod(&m)["spec"].get("securityContext").is_none(),
            "mode {mode:?}"
        );
    }
}

#[test]
fn security_context_values_are_merged_into_the_defaults() {
    let m = render(controller().values(json!({
        "podSecurityContext": {"runAsUser": 1000, "fsGroup": 2000},
        "securityContext": {"readOnlyRootFilesystem": false, "runAsUser": 1001},
    })));
    assert_eq!(
        manager_pod(&m)["spec"]["securityContext"],
        json!({
            "runAsNonRoot": true,
            "runAsUser": 1000,
            "runAsGroup": 65532,
            "fsGroup": 2000,
            "seccompProfile": {"type": "RuntimeDefault"},
        })
    );
    assert_eq!(
        manager_container(&m)["securityContext"],
        json!({
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": false,
            "runAsUser": 1001,
            "capabilities": {"drop": ["ALL"]},
        })
    );
}

#[test]
fn null_removes_a_default_or_all_of_them() {
    // One key.
    let m = render(controller().values(json!({
        "podSecurityContext": {"seccompProfile": null},
        "securityContext": {"capabilities": null},
    })));
    assert!(
        manager_pod(&m)["spec"]["securityContext"]
            .get("seccompProfile")
            .is_none()
    );
    assert_eq!(
        manager_container(&m)["securityContext"],
        json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true})
    );
    // Everything, as ARC renders by default.
    let m =
        render(controller().values(json!({"podSecurityContext": null, "securityContext": null})));
    assert!(manager_pod(&m)["spec"].get("securityContext").is_none());
    assert!(manager_container(&m).get("securityContext").is_none());
    // The same with --set.
    let m = render(
        controller()
            .set("securityContext", "null")
            .set("podSecurityContext.runAsUser", "null"),
    );
    assert!(manager_container(&m).get("securityContext").is_none());
    assert!(
        manager_pod(&m)["spec"]["securityContext"]
            .get("runAsUser")
            .is_none()
    );
    // An empty map is not a way to remove them: Helm merges it into the defaults.
    let m = render(controller().values(json!({"securityContext": {}})));
    assert_eq!(
        manager_container(&m)["securityContext"]["readOnlyRootFilesystem"],
        true
    );
}

#[test]
fn lint_passes_with_default_and_overridden_security_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, values: Value| {
        let path = dir.path().join(name);
        std::fs::write(&path, values.to_string()).expect("write values");
        path
    };
    let overridden = write(
        "controller.json",
        json!({
            "podSecurityContext": {"runAsUser": 1000, "fsGroup": 2000, "seccompProfile": null},
            "securityContext": {"readOnlyRootFilesystem": false},
        }),
    );
    let removed = write(
        "removed.json",
        json!({"podSecurityContext": null, "securityContext": null}),
    );
    chart_tests::lint(Chart::Controller, &[]).expect("lint with defaults");
    chart_tests::lint(Chart::Controller, &[overridden]).expect("lint with overrides");
    chart_tests::lint(Chart::Controller, &[removed]).expect("lint without securityContext");
    let ci: PathBuf = Chart::ScaleSet.path().join("ci/ci-values.yaml");
    for mode in MODES {
        let mut files = vec![ci.clone()];
        if !mode.is_empty() {
            files.push(write(
                &format!("mode-{mode}.json"),
                json!({"containerMode": {"type": mode}}),
            ));
        }
        chart_tests::lint(Chart::ScaleSet, &files)
            .unwrap_or_else(|e| panic!("lint in mode {mode:?}: {e}"));
    }
}

/// A namespace enforcing the Pod Security Standard `level`.
async fn namespace_enforcing(ctx: &TestContext, level: &str) -> String {
    let name = test_harness::create_namespace(&ctx.client, &format!("pss-{level}"))
        .await
        .expect("namespace");
    Api::<Namespace>::all(ctx.client.clone())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": level,
                "pod-security.kubernetes.io/enforce-version": "latest",
            }}})),
        )
        .await
        .expect("label the namespace");
    name
}

/// Creates a pod from a rendered pod template with a server-side dry run; returns the API server's refusal.
async fn admit(ctx: &TestContext, namespace: &str, template: &Value) -> Result<(), String> {
    let mut spec = template["spec"].clone();
    // Pod Security ignores the account; the ServiceAccount admission plugin would want it to exist.
    if let Some(spec) = spec.as_object_mut() {
        spec.remove("serviceAccountName");
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "admission-check"},
        "spec": spec,
    }))
    .expect("a pod");
    Api::<Pod>::namespaced(ctx.client.clone(), namespace)
        .create(
            &PostParams {
                dry_run: true,
                ..PostParams::default()
            },
            &pod,
        )
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The API server's Pod Security admission agrees: the default manager pod meets `restricted` and stops
/// meeting it without the chart's defaults; default-mode and Kubernetes-mode runner pods meet `baseline`, and
/// dind needs `privileged`.
#[tokio::test]
async fn pod_security_admission_accepts_what_the_docs_say() {
    let ctx = TestContext::new("chart-pss").await;
    let mut levels = BTreeMap::new();
    for level in ["restricted", "baseline", "privileged"] {
        levels.insert(level, namespace_enforcing(&ctx, level).await);
    }
    let restricted = &levels["restricted"];

    let hardened = render(controller());
    admit(&ctx, restricted, manager_pod(&hardened))
        .await
        .expect("the default manager pod is admitted under restricted");
    let relaxed =
        render(controller().values(json!({"podSecurityContext": null, "securityContext": null})));
    let refusal = admit(&ctx, restricted, manager_pod(&relaxed))
        .await
        .expect_err("without the defaults the manager pod is not restricted");
    assert!(refusal.contains("PodSecurity"), "{refusal}");

    for mode in MODES {
        let m = render(scale_set(mode));
        let pod = runner_pod(&m);
        let lowest = if mode == "dind" {
            "privileged"
        } else {
            "baseline"
        };
        admit(&ctx, &levels[lowest], pod)
            .await
            .unwrap_or_else(|e| panic!("mode {mode:?} under {lowest}: {e}"));
        let stricter = if mode == "dind" {
            "baseline"
        } else {
            "restricted"
        };
        let refusal = admit(&ctx, &levels[stricter], pod)
            .await
            .expect_err("a stricter level refuses it");
        assert!(refusal.contains("PodSecurity"), "mode {mode:?}: {refusal}");
    }

    // A runner pod can be made restricted through the template when the workflows allow it (docs/security.md).
    let m = render(scale_set("").values(json!({"template": {"spec": {
        "securityContext": {"runAsNonRoot": true, "runAsUser": 1001, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "runner", "securityContext": {
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}],
    }}})));
    admit(&ctx, restricted, runner_pod(&m))
        .await
        .expect("a hardened runner template is admitted under restricted");
}
