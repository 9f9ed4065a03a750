//! Render tests of the scale-set chart: one test per case of the upstream chart's own test suite
//! (spec §10.2, same names in snake case), the upstream values fixtures, and the places where
//! arc-rs goes further.

use std::path::PathBuf;

use base64::Engine as _;
use chart_tests::{Chart, Manifests, Template};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

const RELEASE: &str = "test-runners";
const NAMESPACE: &str = "test-ns";
const FULLNAME: &str = "test-runners-gha-rs";

/// Upstream's reference values files; our chart must render every one of them.
fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/reference/arc-0.14.2/scale-set-chart-test-values")
        .join(name)
}

/// The chart with what nearly every upstream case sets: a URL, a token and the controller's
/// ServiceAccount (discovery needs a cluster).
fn chart() -> Template {
    bare().values(json!({
        "githubConfigUrl": "https://github.com/actions",
        "githubConfigSecret": {"github_token": "gh_token12345"},
        "controllerServiceAccount": {"name": "arc", "namespace": "arc-system"},
    }))
}

fn bare() -> Template {
    Template::new(Chart::ScaleSet)
        .release(RELEASE)
        .namespace(NAMESPACE)
}

/// A fixture with the controller ServiceAccount upstream's tests pass alongside it.
fn with_fixture(name: &str) -> Template {
    bare()
        .values_file(fixture(name))
        .set("controllerServiceAccount.name", "arc")
        .set("controllerServiceAccount.namespace", "arc-system")
}

fn render(template: Template) -> Manifests {
    template
        .render()
        .unwrap_or_else(|e| panic!("render failed: {e}"))
}

fn render_error(template: Template) -> String {
    template
        .render_error()
        .unwrap_or_else(|e| panic!("expected a helm failure: {e}"))
}

fn assert_fails(template: Template, message: &str) {
    let stderr = render_error(template);
    assert!(
        stderr.contains(message),
        "expected {message:?} in:\n{stderr}"
    );
}

fn ars(m: &Manifests) -> &Value {
    m.single("AutoscalingRunnerSet")
        .expect("one AutoscalingRunnerSet")
}

fn pod_spec(m: &Manifests) -> &Value {
    &ars(m)["spec"]["template"]["spec"]
}

fn containers(m: &Manifests) -> &Vec<Value> {
    pod_spec(m)["containers"].as_array().expect("containers")
}

fn runner(m: &Manifests) -> &Value {
    containers(m)
        .iter()
        .find(|c| c["name"] == "runner")
        .expect("runner container")
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .expect("list")
        .iter()
        .map(|item| item["name"].as_str().expect("name"))
        .collect()
}

fn resources(role: &Value) -> Vec<&str> {
    role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| r["resources"][0].as_str().expect("resource"))
        .collect()
}

fn annotation<'a>(object: &'a Value, key: &str) -> &'a Value {
    &object["metadata"]["annotations"][key]
}

const FINALIZER: &str = "actions.github.com/cleanup-protection";

fn assert_protected(object: &Value) {
    assert_eq!(object["metadata"]["finalizers"], json!([FINALIZER]));
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

// ---- Lint and the reference values files ----

#[test]
fn lint_passes_with_ci_values() {
    chart_tests::lint(
        Chart::ScaleSet,
        &[Chart::ScaleSet.path().join("ci/ci-values.yaml")],
    )
    .expect("lint");
}

#[test]
fn renders_every_reference_values_file() {
    let dir = fixture("");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("dir entry").path())
        .collect();
    files.sort();
    assert!(files.len() >= 14, "reference files missing: {files:?}");
    for file in files {
        for kube in ["1.36.0", "1.28.0"] {
            let m = bare()
                .values_file(&file)
                .set("controllerServiceAccount.name", "arc")
                .set("controllerServiceAccount.namespace", "arc-system")
                .kube_version(kube)
                .render()
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let spec = pod_spec(&m);
            assert_eq!(
                spec["containers"]
                    .as_array()
                    .expect("containers")
                    .iter()
                    .filter(|c| c["name"] == "runner" && c["image"].is_string())
                    .count(),
                1,
                "{}: exactly one runner container with an image",
                file.display()
            );
        }
    }
}

// ---- §10.2 ----

#[test]
fn github_secret_with_github_token() {
    let m = render(chart());
    let secret = m
        .get("Secret", &format!("{FULLNAME}-github-secret"))
        .expect("secret");
    assert_eq!(secret["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        secret["data"],
        json!({"github_token": b64("gh_token12345")})
    );
    assert_protected(secret);
}

#[test]
fn github_secret_with_github_app() {
    let m = render(
        bare()
            .set("githubConfigUrl", "https://github.com/actions")
            .set("githubConfigSecret.github_app_id", "10")
            .set("githubConfigSecret.github_app_installation_id", "100")
            .set("githubConfigSecret.github_app_private_key", "private_key")
            .set("controllerServiceAccount.name", "arc")
            .set("controllerServiceAccount.namespace", "arc-system"),
    );
    let secret = m.single("Secret").expect("secret");
    assert_eq!(secret["data"]["github_app_id"], b64("10"));
    assert_eq!(secret["data"]["github_app_installation_id"], b64("100"));
    assert_eq!(secret["data"]["github_app_private_key"], b64("private_key"));
    assert!(secret["data"].get("github_token").is_none());
}

#[test]
fn github_secret_app_ids_from_yaml_numbers_stay_integers() {
    // A values file gives floats; 1234567 must not become "1.234567e+06".
    let m = render(bare().values(json!({
        "githubConfigUrl": "https://github.com/actions",
        "githubConfigSecret": {"github_app_id": 1234567, "github_app_installation_id": 7654321,
                               "github_app_private_key": "key"},
        "controllerServiceAccount": {"name": "arc", "namespace": "arc-system"},
    })));
    let secret = m.single("Secret").expect("secret");
    assert_eq!(secret["data"]["github_app_id"], b64("1234567"));
    assert_eq!(secret["data"]["github_app_installation_id"], b64("7654321"));
}

#[test]
fn github_secret_error_with_missing_auth_input() {
    assert_fails(
        bare()
            .set("githubConfigUrl", "https://github.com/actions")
            .set("githubConfigSecret.github_app_id", "")
            .set("githubConfigSecret.github_token", "")
            .set("controllerServiceAccount.name", "arc")
            .set("controllerServiceAccount.namespace", "arc-system"),
        "provide .Values.githubConfigSecret.github_token or .Values.githubConfigSecret.github_app_id",
    );
}

#[test]
fn github_secret_error_with_missing_app_input() {
    assert_fails(
        bare()
            .set("githubConfigUrl", "https://github.com/actions")
            .set("githubConfigSecret.github_app_id", "10")
            .set("controllerServiceAccount.name", "arc")
            .set("controllerServiceAccount.namespace", "arc-system"),
        "provide .Values.githubConfigSecret.github_app_installation_id and .Values.githubConfigSecret.github_app_private_key",
    );
}

#[test]
fn github_secret_not_rendered_with_predefined_secret() {
    let m = render(chart().set("githubConfigSecret", "pre-defined-secret"));
    assert_eq!(m.of_kind("Secret").count(), 0);
}

#[test]
fn set_service_account_to_no_permission() {
    let m = render(chart());
    let name = format!("{FULLNAME}-no-permission");
    let sa = m.get("ServiceAccount", &name).expect("sa");
    assert_eq!(sa["metadata"]["namespace"], NAMESPACE);
    assert_protected(sa);
    let ars = ars(&m);
    assert_eq!(
        ars["spec"]["template"]["spec"]["serviceAccountName"],
        name.as_str()
    );
    assert_eq!(
        annotation(
            ars,
            "actions.github.com/cleanup-no-permission-service-account-name"
        ),
        name.as_str()
    );
    assert!(
        annotation(
            ars,
            "actions.github.com/cleanup-kubernetes-mode-service-account-name"
        )
        .is_null()
    );
}

fn assert_kube_mode_objects(mode: &str, rules: &[&str]) {
    let m = render(chart().set("containerMode.type", mode));
    let name = format!("{FULLNAME}-kube-mode");
    let sa = m.get("ServiceAccount", &name).expect("sa");
    assert_protected(sa);
    let role = m.get("Role", &name).expect("role");
    assert_protected(role);
    assert_eq!(resources(role), rules);
    let binding = m.get("RoleBinding", &name).expect("binding");
    assert_protected(binding);
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name})
    );
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}])
    );
    let ars = ars(&m);
    assert_eq!(
        ars["spec"]["template"]["spec"]["serviceAccountName"],
        name.as_str()
    );
    assert_eq!(
        annotation(
            ars,
            "actions.github.com/cleanup-kubernetes-mode-service-account-name"
        ),
        name.as_str()
    );
    assert!(
        m.find("ServiceAccount", &format!("{FULLNAME}-no-permission"))
            .is_none()
    );
}

#[test]
fn set_service_account_to_kube_mode() {
    assert_kube_mode_objects(
        "kubernetes",
        &["pods", "pods/exec", "pods/log", "jobs", "secrets"],
    );
}

#[test]
fn set_service_account_to_kube_no_volume_mode() {
    assert_kube_mode_objects(
        "kubernetes-novolume",
        &["pods", "pods/exec", "pods/log", "secrets"],
    );
}

#[test]
fn no_permission_service_account_not_rendered_in_kubernetes_modes() {
    for mode in ["kubernetes", "kubernetes-novolume"] {
        let m = render(chart().set("containerMode.type", mode));
        assert!(
            m.find("ServiceAccount", &format!("{FULLNAME}-no-permission"))
                .is_none()
        );
    }
}

#[test]
fn user_provide_set_service_account() {
    for mode in ["", "dind", "kubernetes", "kubernetes-novolume"] {
        let m = render(
            chart()
                .set("containerMode.type", mode)
                .set("template.spec.serviceAccountName", "test-service-account"),
        );
        assert_eq!(m.of_kind("ServiceAccount").count(), 0, "mode {mode:?}");
        assert_eq!(m.of_kind("Role").count(), 1, "only the manager Role");
        let ars = ars(&m);
        assert_eq!(
            ars["spec"]["template"]["spec"]["serviceAccountName"],
            "test-service-account"
        );
        for key in [
            "actions.github.com/cleanup-kubernetes-mode-service-account-name",
            "actions.github.com/cleanup-no-permission-service-account-name",
        ] {
            assert!(annotation(ars, key).is_null(), "{key}");
        }
    }
}

#[test]
fn autoscaling_runner_set() {
    let m = render(chart());
    let ars = ars(&m);
    assert_eq!(ars["apiVersion"], "actions.github.com/v1alpha1");
    assert_eq!(ars["metadata"]["name"], RELEASE);
    assert_eq!(ars["metadata"]["namespace"], NAMESPACE);
    let labels = &ars["metadata"]["labels"];
    assert_eq!(labels["app.kubernetes.io/name"], RELEASE);
    assert_eq!(labels["app.kubernetes.io/instance"], RELEASE);
    assert_eq!(labels["app.kubernetes.io/part-of"], "gha-rs");
    assert_eq!(
        labels["app.kubernetes.io/component"],
        "autoscaling-runner-set"
    );
    assert_eq!(labels["app.kubernetes.io/version"], "0.1.0");
    assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm");
    assert_eq!(labels["helm.sh/chart"], "gha-rs-0.1.0");
    assert_eq!(labels["actions.github.com/scale-set-name"], RELEASE);
    assert_eq!(labels["actions.github.com/scale-set-namespace"], NAMESPACE);
    let spec = &ars["spec"];
    assert_eq!(spec["githubConfigUrl"], "https://github.com/actions");
    assert_eq!(
        spec["githubConfigSecret"],
        format!("{FULLNAME}-github-secret")
    );
    for absent in [
        "runnerGroup",
        "runnerScaleSetName",
        "maxRunners",
        "minRunners",
        "proxy",
        "githubServerTLS",
        "vaultConfig",
        "listenerMetrics",
    ] {
        assert!(spec.get(absent).is_none(), "{absent} should be absent");
    }
    assert_eq!(
        spec["template"]["spec"],
        json!({
            "restartPolicy": "Never",
            "serviceAccountName": format!("{FULLNAME}-no-permission"),
            "containers": [{"name": "runner", "image": "ghcr.io/actions/actions-runner:latest",
                            "command": ["/home/runner/run.sh"]}],
        })
    );
}

#[test]
fn autoscaling_runner_set_runner_scale_set_name() {
    let name = "test-runner-scale-set-name";
    let m = render(chart().set("runnerScaleSetName", name));
    let ars = ars(&m);
    assert_eq!(ars["metadata"]["name"], name);
    let labels = &ars["metadata"]["labels"];
    assert_eq!(labels["app.kubernetes.io/name"], name);
    assert_eq!(labels["app.kubernetes.io/instance"], name);
    assert_eq!(labels["actions.github.com/scale-set-name"], name);
    assert_eq!(labels["actions.github.com/scale-set-namespace"], NAMESPACE);
    assert_eq!(ars["spec"]["runnerScaleSetName"], name);
    assert_eq!(
        ars["spec"]["githubConfigSecret"],
        format!("{name}-gha-rs-github-secret")
    );
    assert!(
        m.find("Secret", &format!("{name}-gha-rs-github-secret"))
            .is_some()
    );
}

#[test]
fn runner_scale_set_name_with_underscores() {
    let m = render(chart().set("runnerScaleSetName", "my_runners"));
    let ars = ars(&m);
    assert_eq!(ars["metadata"]["name"], "my-runners");
    assert_eq!(ars["spec"]["runnerScaleSetName"], "my_runners");
    assert_eq!(
        ars["spec"]["githubConfigSecret"],
        "my-runners-gha-rs-github-secret"
    );
    assert!(m.find("Role", "my_runners-gha-rs-manager").is_some());
}

#[test]
fn autoscaling_runner_set_scale_set_labels() {
    let m = render(
        chart()
            .set("scaleSetLabels[0]", "linux")
            .set("scaleSetLabels[1]", "x64"),
    );
    assert_eq!(
        ars(&m)["spec"]["runnerScaleSetLabels"],
        json!(["linux", "x64"])
    );
}

#[test]
fn scale_set_label_validation() {
    assert_fails(
        chart().values(json!({"scaleSetLabels": ["linux", ""]})),
        "scaleSetLabels contains an empty string, each label must be a non-empty string of less than 256 characters",
    );
    assert_fails(
        chart().values(json!({"scaleSetLabels": ["a".repeat(256)]})),
        "scaleSetLabels contains a label that is 256 characters or more, each label must be a non-empty string of less than 256 characters",
    );
    let m = render(chart().values(json!({"scaleSetLabels": ["a".repeat(255)]})));
    assert_eq!(ars(&m)["spec"]["runnerScaleSetLabels"][0], "a".repeat(255));
}

#[test]
fn autoscaling_runner_set_provide_metadata() {
    let m = render(
        chart()
            .set("template.metadata.labels.test1", "test1")
            .set("template.metadata.labels.test2", "test2")
            .set("template.metadata.annotations.test3", "test3")
            .set("template.metadata.annotations.test4", "test4"),
    );
    assert_eq!(
        ars(&m)["spec"]["template"]["metadata"],
        json!({"labels": {"test1": "test1", "test2": "test2"},
               "annotations": {"test3": "test3", "test4": "test4"}})
    );
}

#[test]
fn autoscaling_runner_set_max_runners_validation_error() {
    assert_fails(
        chart().set("maxRunners", "-1"),
        "maxRunners has to be greater or equal to 0",
    );
}

#[test]
fn autoscaling_runner_set_min_runners_validation_error() {
    assert_fails(
        chart().set("maxRunners", "1").set("minRunners", "-1"),
        "minRunners has to be greater or equal to 0",
    );
}

#[test]
fn autoscaling_runner_set_min_max_runners_validation_error() {
    assert_fails(
        chart().set("maxRunners", "0").set("minRunners", "1"),
        "maxRunners has to be greater or equal to minRunners",
    );
}

#[test]
fn autoscaling_runner_set_min_max_runners_validation_same_value() {
    let m = render(chart().set("maxRunners", "0").set("minRunners", "0"));
    assert_eq!(ars(&m)["spec"]["maxRunners"], 0);
    assert_eq!(ars(&m)["spec"]["minRunners"], 0);
}

#[test]
fn autoscaling_runner_set_min_max_runners_validation_only_min() {
    let m = render(chart().set("minRunners", "5"));
    assert_eq!(ars(&m)["spec"]["minRunners"], 5);
    assert!(ars(&m)["spec"].get("maxRunners").is_none());
}

#[test]
fn autoscaling_runner_set_min_max_runners_validation_only_max() {
    let m = render(chart().set("maxRunners", "5"));
    assert_eq!(ars(&m)["spec"]["maxRunners"], 5);
    assert!(ars(&m)["spec"].get("minRunners").is_none());
}

#[test]
fn autoscaling_runner_set_min_max_runners_from_values_file() {
    let m = render(bare().values_file(fixture("values.yaml")));
    assert_eq!(ars(&m)["spec"]["minRunners"], 5);
    assert_eq!(ars(&m)["spec"]["maxRunners"], 10);
}

#[test]
fn quoted_runner_bounds_fail_instead_of_being_ignored() {
    let stderr = render_error(chart().set_string("maxRunners", "5"));
    assert!(stderr.contains("/maxRunners"), "{stderr}");
}

#[test]
fn autoscaling_runner_set_extra_volumes() {
    let m = render(with_fixture("values_extra_volumes.yaml"));
    assert_eq!(
        pod_spec(&m)["volumes"],
        json!([
            {"name": "foo", "emptyDir": {}},
            {"name": "bar", "emptyDir": {}},
            {"name": "work", "hostPath": {"path": "/data", "type": "Directory"}},
        ])
    );
}

#[test]
fn autoscaling_runner_set_dind_extra_init_containers() {
    let m = render(with_fixture("values_dind_extra_init_containers.yaml"));
    let init = pod_spec(&m)["initContainers"].as_array().expect("init");
    assert_eq!(init.len(), 4);
    assert_eq!(init[2]["name"], "kube-init");
    assert_eq!(init[2]["image"], "runner-image:latest");
    assert_eq!(
        init[2]["command"],
        json!(["sudo", "chown", "-R", "1001:123", "/home/runner/_work"])
    );
    assert_eq!(
        init[2]["volumeMounts"],
        json!([{"name": "work", "mountPath": "/home/runner/_work"}])
    );
    assert_eq!(init[3]["name"], "ls");
    assert_eq!(init[3]["image"], "ubuntu:latest");
    assert_eq!(init[3]["command"], json!(["ls"]));
}

#[test]
fn autoscaling_runner_set_dind_extra_volumes() {
    let m = render(with_fixture("values_dind_extra_volumes.yaml"));
    let volumes = &pod_spec(&m)["volumes"];
    assert_eq!(
        names(volumes),
        ["dind-sock", "dind-externals", "work", "foo", "bar"]
    );
    assert_eq!(volumes[2]["hostPath"]["path"], "/data");
}

#[test]
fn autoscaling_runner_set_k8s_extra_volumes() {
    let m = render(with_fixture("values_k8s_extra_volumes.yaml"));
    let volumes = &pod_spec(&m)["volumes"];
    assert_eq!(names(volumes), ["work", "foo", "bar"]);
    assert_eq!(volumes[0]["hostPath"]["path"], "/data");
}

#[test]
fn autoscaling_runner_set_enable_dind() {
    let m = render(chart().set("containerMode.type", "dind"));
    let spec = pod_spec(&m);
    let init = spec["initContainers"].as_array().expect("init");
    assert_eq!(init.len(), 2);
    assert_eq!(
        init[0],
        json!({
            "name": "init-dind-externals",
            "image": "ghcr.io/actions/actions-runner:latest",
            "command": ["cp"],
            "args": ["-r", "/home/runner/externals/.", "/home/runner/tmpDir/"],
            "volumeMounts": [{"name": "dind-externals", "mountPath": "/home/runner/tmpDir"}],
        })
    );
    assert_eq!(
        init[1],
        json!({
            "name": "dind",
            "image": "docker:dind",
            "args": ["dockerd", "--host=unix:///var/run/docker.sock", "--group=$(DOCKER_GROUP_GID)"],
            "env": [{"name": "DOCKER_GROUP_GID", "value": "123"}],
            "securityContext": {"privileged": true},
            "restartPolicy": "Always",
            "startupProbe": {"exec": {"command": ["docker", "info"]}, "initialDelaySeconds": 0,
                             "failureThreshold": 24, "periodSeconds": 5},
            "volumeMounts": [
                {"name": "work", "mountPath": "/home/runner/_work"},
                {"name": "dind-sock", "mountPath": "/var/run"},
                {"name": "dind-externals", "mountPath": "/home/runner/externals"},
            ],
        })
    );
    assert_eq!(containers(&m).len(), 1);
    let runner = runner(&m);
    assert_eq!(
        runner["env"],
        json!([
            {"name": "DOCKER_HOST", "value": "unix:///var/run/docker.sock"},
            {"name": "RUNNER_WAIT_FOR_DOCKER_IN_SECONDS", "value": "120"},
        ])
    );
    assert_eq!(
        runner["volumeMounts"],
        json!([
            {"name": "work", "mountPath": "/home/runner/_work"},
            {"name": "dind-sock", "mountPath": "/var/run"},
        ])
    );
    assert_eq!(
        spec["volumes"],
        json!([
            {"name": "dind-sock", "emptyDir": {}},
            {"name": "dind-externals", "emptyDir": {}},
            {"name": "work", "emptyDir": {}},
        ])
    );
}

#[test]
fn dind_before_native_sidecars_is_a_regular_container() {
    for version in ["1.28.0", "1.28.9-eks-0123456"] {
        let m = render(
            chart()
                .set("containerMode.type", "dind")
                .kube_version(version),
        );
        let spec = pod_spec(&m);
        assert_eq!(
            names(&spec["initContainers"]),
            ["init-dind-externals"],
            "{version}"
        );
        assert_eq!(names(&spec["containers"]), ["runner", "dind"], "{version}");
        let dind = &spec["containers"][1];
        assert!(dind.get("restartPolicy").is_none());
        assert!(dind.get("startupProbe").is_none());
        assert_eq!(dind["securityContext"]["privileged"], true);
    }
    // Managed clusters report minors such as "29+"; the version still says 1.29.
    let m = render(
        chart()
            .set("containerMode.type", "dind")
            .kube_version("1.29.3-gke.1"),
    );
    assert_eq!(
        names(&pod_spec(&m)["initContainers"]),
        ["init-dind-externals", "dind"]
    );
}

#[test]
fn autoscaling_runner_set_enable_kubernetes_mode() {
    let m = render(chart().set("containerMode.type", "kubernetes"));
    let runner = runner(&m);
    assert_eq!(
        runner["env"],
        json!([
            {"name": "ACTIONS_RUNNER_CONTAINER_HOOKS", "value": "/home/runner/k8s/index.js"},
            {"name": "ACTIONS_RUNNER_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "ACTIONS_RUNNER_REQUIRE_JOB_CONTAINER", "value": "true"},
        ])
    );
    assert_eq!(
        runner["volumeMounts"],
        json!([{"name": "work", "mountPath": "/home/runner/_work"}])
    );
    let volumes = &pod_spec(&m)["volumes"];
    assert_eq!(names(volumes), ["work"]);
    assert!(volumes[0]["ephemeral"]["volumeClaimTemplate"]["spec"].is_object());
}

#[test]
fn kubernetes_mode_work_volume_claim() {
    let claim = json!({"accessModes": ["ReadWriteOnce"], "storageClassName": "dynamic-blob-storage",
                       "resources": {"requests": {"storage": "1Gi"}}});
    let m = render(chart().values(json!({"containerMode": {
        "type": "kubernetes", "kubernetesModeWorkVolumeClaim": claim}})));
    assert_eq!(
        pod_spec(&m)["volumes"][0]["ephemeral"]["volumeClaimTemplate"]["spec"],
        claim
    );
    // Upstream renders "spec: null" without a claim; we render a claim the API server accepts.
    let m = render(chart().set("containerMode.type", "kubernetes"));
    assert_eq!(
        pod_spec(&m)["volumes"][0]["ephemeral"]["volumeClaimTemplate"]["spec"],
        json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}})
    );
}

#[test]
fn kubernetes_mode_additional_role_rules() {
    let rule =
        json!({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list"]});
    let m = render(chart().values(json!({"containerMode": {
        "type": "kubernetes", "kubernetesModeAdditionalRoleRules": [rule]}})));
    let role = m
        .get("Role", &format!("{FULLNAME}-kube-mode"))
        .expect("role");
    assert_eq!(role["rules"].as_array().map(Vec::len), Some(6));
    assert_eq!(role["rules"][5], rule);
}

#[test]
fn autoscaling_runner_set_enable_kubernetes_mode_no_volume() {
    let m = render(chart().set("containerMode.type", "kubernetes-novolume"));
    let runner = runner(&m);
    assert_eq!(
        runner["env"],
        json!([
            {"name": "ACTIONS_RUNNER_CONTAINER_HOOKS", "value": "/home/runner/k8s-novolume/index.js"},
            {"name": "ACTIONS_RUNNER_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "ACTIONS_RUNNER_REQUIRE_JOB_CONTAINER", "value": "true"},
            {"name": "ACTIONS_RUNNER_IMAGE", "value": "ghcr.io/actions/actions-runner:latest"},
        ])
    );
    assert_eq!(runner["volumeMounts"], json!([]));
    assert_eq!(pod_spec(&m)["volumes"], json!([]));
}

#[test]
fn autoscaling_runner_set_enable_kubernetes_mode_no_volume_with_custom_volumes() {
    let m = render(with_fixture("values_k8s_novolume_custom_volumes.yaml"));
    assert_eq!(
        pod_spec(&m)["volumes"],
        json!([{"name": "custom-volume", "emptyDir": {}}])
    );
}

#[test]
fn autoscaling_runner_set_enable_kubernetes_mode_no_volume_with_custom_volume_mounts() {
    let m = render(with_fixture(
        "values_k8s_novolume_custom_volume_mounts.yaml",
    ));
    assert_eq!(
        runner(&m)["volumeMounts"],
        json!([{"name": "custom-volume", "mountPath": "/mnt/custom"}])
    );
}

#[test]
fn autoscaling_runner_set_listener_pod_template() {
    let m = render(with_fixture("values_listener_template.yaml"));
    let template = &ars(&m)["spec"]["listenerTemplate"];
    assert_eq!(template["spec"]["hostname"], "example");
    let containers = template["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 2);
    assert_eq!(containers[0]["name"], "listener");
    assert_eq!(containers[0]["image"], "listener:latest");
    assert_eq!(containers[0]["command"], json!(["/path/to/entrypoint"]));
    assert_eq!(
        containers[0]["volumeMounts"],
        json!([{"name": "work", "mountPath": "/home/example"}])
    );
    assert_eq!(
        containers[1],
        json!({"name": "side-car", "image": "nginx:latest"})
    );
}

#[test]
fn autoscaling_runner_set_use_predefined_secret() {
    let m = render(chart().set("githubConfigSecret", "pre-defined-secrets"));
    let ars = ars(&m);
    assert_eq!(ars["spec"]["githubConfigSecret"], "pre-defined-secrets");
    assert!(annotation(ars, "actions.github.com/cleanup-github-secret-name").is_null());
}

#[test]
fn autoscaling_runner_set_error_on_empty_predefined_secret() {
    assert_fails(
        chart().set("githubConfigSecret", ""),
        "Values.githubConfigSecret is required for setting auth with GitHub server",
    );
}

#[test]
fn with_proxy() {
    let m = render(chart().values(json!({"proxy": {
        "http": {"url": "http://proxy.example.com", "credentialSecretRef": "http-secret"},
        "https": {"url": "https://proxy.example.com", "credentialSecretRef": "https-secret"},
        "noProxy": ["example.com", "example.org"],
    }})));
    assert_eq!(
        ars(&m)["spec"]["proxy"],
        json!({
            "http": {"url": "http://proxy.example.com", "credentialSecretRef": "http-secret"},
            "https": {"url": "https://proxy.example.com", "credentialSecretRef": "https-secret"},
            "noProxy": ["example.com", "example.org"],
        })
    );
    let m =
        render(chart().values(json!({"proxy": {"https": {"url": "https://p"}, "noProxy": []}})));
    assert_eq!(
        ars(&m)["spec"]["proxy"],
        json!({"https": {"url": "https://p"}})
    );
    let m = render(chart().values(json!({"proxy": {}})));
    assert!(ars(&m)["spec"].get("proxy").is_none());
}

fn tls_values(mode: &str, mount_path: Option<&str>) -> Value {
    let mut tls = json!({"certificateFrom": {"configMapKeyRef": {"name": "certs-configmap", "key": "cert.pem"}}});
    if let Some(path) = mount_path {
        tls["runnerMountPath"] = json!(path);
    }
    json!({"githubServerTLS": tls, "containerMode": {"type": mode}})
}

#[test]
fn with_tls() {
    for mode in ["", "dind", "kubernetes", "kubernetes-novolume"] {
        for mount_path in ["/runner/mount/path", "/runner/mount/path/"] {
            let m = render(chart().values(tls_values(mode, Some(mount_path))));
            assert_eq!(
                ars(&m)["spec"]["githubServerTLS"],
                json!({"certificateFrom": {"configMapKeyRef": {"name": "certs-configmap", "key": "cert.pem"}}})
            );
            let volumes = pod_spec(&m)["volumes"].as_array().expect("volumes");
            assert_eq!(
                volumes[0],
                json!({"name": "github-server-tls-cert", "configMap": {"name": "certs-configmap",
                       "items": [{"key": "cert.pem", "path": "cert.pem"}]}}),
                "mode {mode:?}"
            );
            let runner = runner(&m);
            let mount = runner["volumeMounts"]
                .as_array()
                .expect("mounts")
                .iter()
                .find(|v| v["name"] == "github-server-tls-cert")
                .expect("tls mount");
            assert_eq!(
                *mount,
                json!({"name": "github-server-tls-cert", "mountPath": "/runner/mount/path/cert.pem",
                       "subPath": "cert.pem"})
            );
            let env = runner["env"].as_array().expect("env");
            assert!(env.contains(
                &json!({"name": "NODE_EXTRA_CA_CERTS", "value": "/runner/mount/path/cert.pem"})
            ));
            assert!(env.contains(&json!({"name": "RUNNER_UPDATE_CA_CERTS", "value": "1"})));
        }
        let m = render(chart().values(tls_values(mode, None)));
        assert!(ars(&m)["spec"]["githubServerTLS"].is_object());
        let rendered = serde_json::to_string(&ars(&m)["spec"]["template"]).expect("json");
        assert!(
            !rendered.contains("github-server-tls-cert"),
            "mode {mode:?}"
        );
        assert!(!rendered.contains("NODE_EXTRA_CA_CERTS"), "mode {mode:?}");
    }
}

#[test]
fn tls_mount_path_without_certificate_fails_clearly() {
    assert_fails(
        chart().set("githubServerTLS.runnerMountPath", "/certs"),
        "githubServerTLS.certificateFrom.configMapKeyRef.name is required when githubServerTLS.runnerMountPath is set",
    );
    assert_fails(
        chart()
            .set("githubServerTLS.runnerMountPath", "/certs")
            .set("githubServerTLS.certificateFrom.configMapKeyRef.name", "ca"),
        "githubServerTLS.certificateFrom.configMapKeyRef.key is required when githubServerTLS.runnerMountPath is set",
    );
}

#[test]
fn naming_constraints() {
    assert_fails(
        bare().release(&"a".repeat(46)).values(
            json!({"githubConfigUrl": "https://github.com/actions",
                           "githubConfigSecret": {"github_token": "t"},
                           "controllerServiceAccount": {"name": "arc", "namespace": "arc-system"}}),
        ),
        "Name must have up to 45 characters",
    );
    assert_fails(
        chart().namespace(&"a".repeat(64)),
        "Namespace must have up to 63 characters",
    );
    render(chart().release(&"a".repeat(45)).namespace(&"a".repeat(63)));
}

#[test]
fn github_config_url_ends_with_slash() {
    let m = render(chart().set("githubConfigUrl", "https://github.com/actions/"));
    assert_eq!(
        ars(&m)["spec"]["githubConfigUrl"],
        "https://github.com/actions"
    );
}

#[test]
fn github_config_url_is_required() {
    assert_fails(
        bare()
            .set("githubConfigSecret.github_token", "t")
            .set("controllerServiceAccount.name", "arc")
            .set("controllerServiceAccount.namespace", "arc-system"),
        ".Values.githubConfigUrl is required",
    );
}

#[test]
fn create_manager_role() {
    let m = render(chart());
    let role = m.get("Role", &format!("{FULLNAME}-manager")).expect("role");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    assert_protected(role);
    assert_eq!(
        resources(role),
        [
            "pods",
            "pods/status",
            "secrets",
            "serviceaccounts",
            "rolebindings",
            "roles"
        ]
    );
    assert_eq!(
        role["metadata"]["labels"]["app.kubernetes.io/component"],
        "manager-role"
    );
}

#[test]
fn create_manager_role_use_config_maps() {
    let m = render(chart().set(
        "githubServerTLS.certificateFrom.configMapKeyRef.name",
        "test",
    ));
    let role = m.get("Role", &format!("{FULLNAME}-manager")).expect("role");
    assert_eq!(role["rules"].as_array().map(Vec::len), Some(7));
    assert_eq!(
        role["rules"][6],
        json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]})
    );
}

#[test]
fn create_manager_role_binding() {
    let m = render(chart());
    let name = format!("{FULLNAME}-manager");
    let binding = m.get("RoleBinding", &name).expect("binding");
    assert_eq!(binding["metadata"]["namespace"], NAMESPACE);
    assert_protected(binding);
    assert_eq!(binding["roleRef"]["name"], name.as_str());
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "arc", "namespace": "arc-system"}])
    );
}

#[test]
fn controller_service_account_discovery_needs_a_cluster() {
    assert_fails(
        bare().values_file(fixture("ci-values.yaml")),
        "No gha-rs-controller deployment found using label (app.kubernetes.io/part-of=gha-rs-controller). \
         Consider setting controllerServiceAccount.name in values.yaml to be explicit if you think the discovery is wrong.",
    );
    assert_fails(
        bare()
            .values_file(fixture("ci-values.yaml"))
            .set("controllerServiceAccount.name", "arc"),
        "Consider setting controllerServiceAccount.namespace in values.yaml",
    );
}

#[test]
fn autoscaling_runner_set_extra_containers() {
    let m = render(with_fixture("values_extra_containers.yaml"));
    let containers = containers(&m);
    assert_eq!(containers.len(), 2);
    assert_eq!(containers[0]["name"], "runner");
    assert_eq!(containers[1]["name"], "other");
    for c in containers {
        assert_eq!(
            c["resources"]["limits"],
            json!({"cpu": "250m", "memory": "64Mi"})
        );
    }
    let runner = &containers[0];
    assert_eq!(
        runner["env"],
        json!([
            {"name": "SOME_ENV", "value": "SOME_VALUE"},
            {"name": "MY_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ])
    );
    assert_eq!(
        runner["volumeMounts"],
        json!([{"name": "work", "mountPath": "/work"}, {"name": "others", "mountPath": "/others"}])
    );
    let spec = pod_spec(&m);
    assert_eq!(spec["volumes"][0]["name"], "work");
    assert_eq!(spec["dnsPolicy"], "None");
    assert_eq!(spec["dnsConfig"]["nameservers"], json!(["192.0.2.1"]));
}

#[test]
fn autoscaling_runner_set_restart_policy() {
    let m = render(chart());
    assert_eq!(pod_spec(&m)["restartPolicy"], "Never");
    let m = render(chart().set("template.spec.restartPolicy", "Always"));
    assert_eq!(pod_spec(&m)["restartPolicy"], "Always");
}

#[test]
fn autoscaling_runner_set_extra_pod_spec() {
    let m = render(with_fixture("values_extra_pod_spec.yaml"));
    assert_eq!(containers(&m).len(), 1);
    assert_eq!(pod_spec(&m)["dnsPolicy"], "None");
    assert_eq!(
        pod_spec(&m)["dnsConfig"]["nameservers"],
        json!(["192.0.2.1"])
    );
}

#[test]
fn autoscaling_runner_set_dind_merge_pod_spec() {
    let m = render(with_fixture("values_dind_merge_spec.yaml"));
    assert_eq!(containers(&m).len(), 1, "dind is an init container");
    let runner = runner(&m);
    let env = runner["env"].as_array().expect("env");
    assert_eq!(
        env[0],
        json!({"name": "DOCKER_HOST", "value": "tcp://localhost:9999"})
    );
    assert_eq!(env[1]["name"], "MY_NODE_NAME");
    assert_eq!(env.iter().filter(|e| e["name"] == "DOCKER_HOST").count(), 1);
    let mounts = runner["volumeMounts"].as_array().expect("mounts");
    assert_eq!(mounts[0], json!({"name": "work", "mountPath": "/work"}));
    assert_eq!(mounts[1], json!({"name": "others", "mountPath": "/others"}));
    assert_eq!(
        runner["resources"]["limits"],
        json!({"cpu": "250m", "memory": "64Mi"})
    );
}

#[test]
fn autoscaling_runner_set_kube_mode_merge_pod_spec() {
    let m = render(with_fixture("values_k8s_merge_spec.yaml"));
    let runner = runner(&m);
    assert_eq!(
        names(&runner["env"]),
        [
            "ACTIONS_RUNNER_CONTAINER_HOOKS",
            "MY_NODE_NAME",
            "ACTIONS_RUNNER_POD_NAME",
            "ACTIONS_RUNNER_REQUIRE_JOB_CONTAINER"
        ]
    );
    assert_eq!(runner["env"][0]["value"], "/k8s/index.js");
    assert_eq!(names(&runner["volumeMounts"]), ["work", "others"]);
    assert_eq!(
        runner["resources"]["limits"],
        json!({"cpu": "250m", "memory": "64Mi"})
    );
}

#[test]
fn autoscaling_runner_set_annotation_github_secret() {
    let name = format!("{FULLNAME}-github-secret");
    let m = render(chart());
    assert_eq!(
        annotation(ars(&m), "actions.github.com/cleanup-github-secret-name"),
        name.as_str()
    );
    let m = render(bare().values(json!({
        "githubConfigUrl": "https://github.com/actions",
        "githubConfigSecret": {"github_app_id": "10", "github_app_installation_id": "100",
                               "github_app_private_key": "key"},
        "controllerServiceAccount": {"name": "arc", "namespace": "arc-system"},
    })));
    assert_eq!(
        annotation(ars(&m), "actions.github.com/cleanup-github-secret-name"),
        name.as_str()
    );
    let m = render(chart().set("githubConfigSecret", "pre-defined"));
    assert!(annotation(ars(&m), "actions.github.com/cleanup-github-secret-name").is_null());
}

#[test]
fn autoscaling_runner_set_annotation_kubernetes_mode_cleanup() {
    for mode in ["kubernetes", "kubernetes-novolume"] {
        let m = render(chart().set("containerMode.type", mode));
        let ars = ars(&m);
        for (key, value) in [
            (
                "actions.github.com/cleanup-github-secret-name",
                format!("{FULLNAME}-github-secret"),
            ),
            (
                "actions.github.com/cleanup-manager-role-binding",
                format!("{FULLNAME}-manager"),
            ),
            (
                "actions.github.com/cleanup-manager-role-name",
                format!("{FULLNAME}-manager"),
            ),
            (
                "actions.github.com/cleanup-kubernetes-mode-role-binding-name",
                format!("{FULLNAME}-kube-mode"),
            ),
            (
                "actions.github.com/cleanup-kubernetes-mode-role-name",
                format!("{FULLNAME}-kube-mode"),
            ),
            (
                "actions.github.com/cleanup-kubernetes-mode-service-account-name",
                format!("{FULLNAME}-kube-mode"),
            ),
        ] {
            assert_eq!(annotation(ars, key), value.as_str(), "{mode}: {key}");
        }
    }
}

#[test]
fn runner_container_env_not_empty_map() {
    let m = render(chart().values(json!({"template": {"spec": {"containers": [
        {"name": "runner", "image": "runner-image:latest"}]}}})));
    assert!(runner(&m).get("env").is_none());
}

#[test]
fn runner_container_volume_not_empty_map() {
    let m = render(chart().values(json!({"template": {"spec": {"containers": [
        {"name": "runner", "image": "runner-image:latest"}]}}})));
    assert!(runner(&m).get("volumeMounts").is_none());
}

#[test]
fn autoscaling_runner_set_annotation_values_hash() {
    let hash = |token: &str| {
        let m = render(chart().set("githubConfigSecret.github_token", token));
        annotation(ars(&m), "actions.github.com/values-hash")
            .as_str()
            .expect("values hash")
            .to_owned()
    };
    let first = hash("token-1");
    assert!(!first.is_empty() && first.len() <= 63, "{first}");
    assert_ne!(first, hash("token-2"));
    assert_eq!(first, hash("token-1"));
}

const RESOURCE_META_KEYS: [&str; 16] = [
    "autoscalingRunnerSet",
    "githubConfigSecret",
    "kubernetesModeRole",
    "kubernetesModeRoleBinding",
    "kubernetesModeServiceAccount",
    "managerRole",
    "managerRoleBinding",
    "noPermissionServiceAccount",
    "autoscalingListener",
    "listenerServiceAccount",
    "listenerRole",
    "listenerRoleBinding",
    "listenerConfigSecret",
    "ephemeralRunnerSet",
    "ephemeralRunner",
    "ephemeralRunnerConfigSecret",
];

const INTERNAL_SPEC_FIELDS: [(&str, &str); 8] = [
    ("autoscalingListener", "autoscalingListener"),
    ("listenerServiceAccount", "listenerServiceAccountMetadata"),
    ("listenerRole", "listenerRoleMetadata"),
    ("listenerRoleBinding", "listenerRoleBindingMetadata"),
    ("listenerConfigSecret", "listenerConfigSecretMetadata"),
    ("ephemeralRunnerSet", "ephemeralRunnerSetMetadata"),
    ("ephemeralRunner", "ephemeralRunnerMetadata"),
    (
        "ephemeralRunnerConfigSecret",
        "ephemeralRunnerConfigSecretMetadata",
    ),
];

/// Custom labels (`field` = "labels") or annotations under the global key and every resourceMeta
/// key, in kubernetes mode, then checks each rendered object and internal spec field.
fn assert_custom_metadata(field: &str) {
    let mut resource_meta = serde_json::Map::new();
    for key in RESOURCE_META_KEYS {
        resource_meta.insert(
            key.to_owned(),
            json!({field: {format!("{key}-custom"): format!("{key}-value")}}),
        );
    }
    let mut values = json!({
        field: {"argocd.argoproj.io/sync-wave": "\"1\""},
        "resourceMeta": resource_meta,
        "containerMode": {"type": "kubernetes"},
    });
    if field == "labels" {
        values["labels"]["app.kubernetes.io/part-of"] = json!("no-override");
    }
    let m = render(chart().values(values));
    let objects = [
        (
            "Secret",
            format!("{FULLNAME}-github-secret"),
            "githubConfigSecret",
        ),
        (
            "Role",
            format!("{FULLNAME}-kube-mode"),
            "kubernetesModeRole",
        ),
        (
            "RoleBinding",
            format!("{FULLNAME}-kube-mode"),
            "kubernetesModeRoleBinding",
        ),
        (
            "ServiceAccount",
            format!("{FULLNAME}-kube-mode"),
            "kubernetesModeServiceAccount",
        ),
        ("Role", format!("{FULLNAME}-manager"), "managerRole"),
        (
            "RoleBinding",
            format!("{FULLNAME}-manager"),
            "managerRoleBinding",
        ),
        (
            "AutoscalingRunnerSet",
            RELEASE.to_owned(),
            "autoscalingRunnerSet",
        ),
    ];
    for (kind, name, key) in objects {
        let object = m.get(kind, &name).expect("object");
        let meta = &object["metadata"][field];
        assert_eq!(
            meta["argocd.argoproj.io/sync-wave"], "\"1\"",
            "{kind}/{name}"
        );
        assert_eq!(
            meta[format!("{key}-custom")],
            format!("{key}-value"),
            "{kind}/{name}"
        );
        if field == "labels" {
            assert_eq!(meta["app.kubernetes.io/part-of"], "gha-rs", "{kind}/{name}");
        }
    }
    let spec = &ars(&m)["spec"];
    for (key, spec_field) in INTERNAL_SPEC_FIELDS {
        assert_eq!(
            spec[spec_field][field],
            json!({format!("{key}-custom"): format!("{key}-value")}),
            "{spec_field}"
        );
    }
    let m = render(
        chart().values(json!({"resourceMeta": {"noPermissionServiceAccount": {
        field: {"custom": "value"}}}})),
    );
    let sa = m
        .get("ServiceAccount", &format!("{FULLNAME}-no-permission"))
        .expect("sa");
    assert_eq!(sa["metadata"][field]["custom"], "value");
}

#[test]
fn custom_labels() {
    assert_custom_metadata("labels");
}

#[test]
fn custom_annotations() {
    assert_custom_metadata("annotations");
}

#[test]
fn resource_meta_labels_cannot_override_reserved_labels() {
    let m = render(chart().values(json!({"resourceMeta": {"managerRole": {"labels": {
        "actions.github.com/scale-set-name": "evil", "app.kubernetes.io/component": "evil", "ok": "yes"}}}})));
    let labels =
        &m.get("Role", &format!("{FULLNAME}-manager")).expect("role")["metadata"]["labels"];
    assert_eq!(labels["actions.github.com/scale-set-name"], RELEASE);
    assert_eq!(labels["app.kubernetes.io/component"], "manager-role");
    assert_eq!(labels["ok"], "yes");
}

#[test]
fn internal_resource_metadata_is_omitted_when_unset() {
    let m = render(
        chart().values(json!({"resourceMeta": {"autoscalingListener": {"labels": {"a": "b"}}}})),
    );
    let spec = &ars(&m)["spec"];
    assert_eq!(spec["autoscalingListener"], json!({"labels": {"a": "b"}}));
    for (_, field) in &INTERNAL_SPEC_FIELDS[1..] {
        assert!(spec.get(*field).is_none(), "{field}");
    }
}

#[test]
fn namespace_override() {
    let override_ns = "namespace-override";
    for mode in ["", "kubernetes", "kubernetes-novolume"] {
        let m = render(
            Template::new(Chart::ScaleSet)
                .release("test")
                .namespace(NAMESPACE)
                .values(json!({
                    "githubConfigUrl": "https://github.com",
                    "githubConfigSecret": {"github_token": "gh_token12345"},
                    "controllerServiceAccount": {"name": "foo", "namespace": "bar"},
                    "namespaceOverride": override_ns,
                    "containerMode": {"type": mode},
                })),
        );
        assert!(m.objects().len() >= 5);
        for object in m.objects() {
            assert_eq!(
                object["metadata"]["namespace"], override_ns,
                "{} in mode {mode:?}",
                object["kind"]
            );
        }
        assert_eq!(
            ars(&m)["metadata"]["labels"]["actions.github.com/scale-set-namespace"],
            override_ns
        );
    }
}

#[test]
fn autoscaling_runner_set_custom_annotations_and_labels_applied() {
    let m = render(chart().values(json!({
        "annotations": {"actions.github.com/vault": "azure_key_vault",
                        "actions.github.com/cleanup-manager-role-name": "not-propagated"},
        "labels": {"custom": "value", "app.kubernetes.io/component": "not-propagated"},
    })));
    let ars = ars(&m);
    assert_eq!(
        annotation(ars, "actions.github.com/vault"),
        "azure_key_vault"
    );
    assert_eq!(
        annotation(ars, "actions.github.com/cleanup-manager-role-name"),
        format!("{FULLNAME}-manager").as_str()
    );
    assert_eq!(ars["metadata"]["labels"]["custom"], "value");
    assert_eq!(
        ars["metadata"]["labels"]["app.kubernetes.io/component"],
        "autoscaling-runner-set"
    );
}

// ---- Other upstream behaviours ----

#[test]
fn runner_group_and_numeric_names_are_strings() {
    let m = render(chart().values(json!({"runnerGroup": 1234, "runnerScaleSetName": "runners"})));
    assert_eq!(ars(&m)["spec"]["runnerGroup"], "1234");
    let m = render(chart().set("runnerGroup", "my-group"));
    assert_eq!(ars(&m)["spec"]["runnerGroup"], "my-group");
}

#[test]
fn listener_metrics_are_copied() {
    let metrics = json!({"counters": {"gha_started_jobs_total": {"labels": ["repository"]}},
                         "histograms": {"gha_job_startup_duration_seconds": {"labels": ["repository"], "buckets": [0.5, 1, 2]}}});
    let m = render(chart().values(json!({"listenerMetrics": metrics})));
    assert_eq!(ars(&m)["spec"]["listenerMetrics"], metrics);
}

#[test]
fn key_vault() {
    let m = render(chart().values(json!({"keyVault": {
        "type": "azure_key_vault",
        "proxy": {"https": {"url": "http://proxy:1234"}},
        "azureKeyVault": {"url": "https://v", "tenantId": "t", "clientId": "c", "certificatePath": "/p"},
    }})));
    assert_eq!(
        ars(&m)["spec"]["vaultConfig"],
        json!({"type": "azure_key_vault", "proxy": {"https": {"url": "http://proxy:1234"}},
               "azureKeyVault": {"url": "https://v", "tenantId": "t", "clientId": "c", "certificatePath": "/p"}})
    );
    assert!(ars(&m)["spec"].get("proxy").is_none());
    // The block upstream's values.yaml documented (and never read) works here.
    let m = render(chart().values(json!({"keyVault": {
        "type": "azure_key_vault",
        "azure_key_vault": {"url": "https://v", "tenant_id": "t", "client_id": "c", "certificate_path": "/p"},
    }})));
    assert_eq!(
        ars(&m)["spec"]["vaultConfig"]["azureKeyVault"],
        json!({"url": "https://v", "tenantId": "t", "clientId": "c", "certificatePath": "/p"})
    );
    assert_fails(
        chart().set("keyVault.type", "hashicorp_vault"),
        "Unsupported keyVault type: hashicorp_vault",
    );
}

#[test]
fn unknown_container_mode_is_the_default_mode() {
    let m = render(chart().set("containerMode.type", "none"));
    assert_eq!(containers(&m).len(), 1);
    assert!(runner(&m).get("env").is_none());
    assert!(pod_spec(&m).get("initContainers").is_none());
}

// ---- Beyond upstream ----

#[test]
fn runner_partial_override_keeps_image_and_command() {
    for mode in ["", "dind", "kubernetes", "kubernetes-novolume"] {
        let m = render(
            chart()
                .set("containerMode.type", mode)
                .values(json!({"template": {"spec": {
            "containers": [{"name": "runner", "resources": {"limits": {"cpu": "2"}}}]}}})),
        );
        let runner = runner(&m);
        assert_eq!(
            runner["image"], "ghcr.io/actions/actions-runner:latest",
            "mode {mode:?}"
        );
        assert_eq!(
            runner["command"],
            json!(["/home/runner/run.sh"]),
            "mode {mode:?}"
        );
        assert_eq!(runner["resources"]["limits"]["cpu"], "2", "mode {mode:?}");
    }
}

#[test]
fn runner_with_own_image_keeps_its_entrypoint() {
    let m = render(chart().values(json!({"template": {"spec": {"containers": [
        {"name": "runner", "image": "my/runner:1"}]}}})));
    assert_eq!(runner(&m)["image"], "my/runner:1");
    assert!(runner(&m).get("command").is_none());
}

#[test]
fn missing_runner_container_is_added() {
    let m = render(with_fixture("values_extra_volumes.yaml"));
    assert_eq!(names(&pod_spec(&m)["containers"]), ["runner", "other"]);
    assert_eq!(runner(&m)["image"], "ghcr.io/actions/actions-runner:latest");
}

#[test]
fn two_runner_containers_fail() {
    assert_fails(
        chart().values(json!({"template": {"spec": {"containers": [
            {"name": "runner"}, {"name": "runner"}]}}})),
        "more than one container named runner",
    );
}

#[test]
fn dind_container_overrides_merge_by_name() {
    for (field, version) in [
        ("containers", "1.36.0"),
        ("initContainers", "1.36.0"),
        ("containers", "1.28.0"),
    ] {
        let m = render(chart().kube_version(version).values(
            json!({"containerMode": {"type": "dind"}, "template": {"spec": {field: [
                    {"name": "dind", "image": "mirror.example/docker:dind",
                     "resources": {"limits": {"memory": "4Gi"}},
                     "env": [{"name": "DOCKER_TLS_CERTDIR", "value": ""}]}]}}}),
        ));
        let spec = pod_spec(&m);
        let all: Vec<&Value> = spec["initContainers"]
            .as_array()
            .into_iter()
            .chain(spec["containers"].as_array())
            .flatten()
            .filter(|c| c["name"] == "dind")
            .collect();
        assert_eq!(all.len(), 1, "{field} on {version}: one dind container");
        let dind = all[0];
        assert_eq!(dind["image"], "mirror.example/docker:dind");
        assert_eq!(dind["resources"]["limits"]["memory"], "4Gi");
        assert_eq!(
            dind["securityContext"]["privileged"], true,
            "chart fields kept"
        );
        assert_eq!(
            names(&dind["env"]),
            ["DOCKER_TLS_CERTDIR", "DOCKER_GROUP_GID"]
        );
        assert_eq!(
            names(&dind["volumeMounts"]),
            ["work", "dind-sock", "dind-externals"]
        );
    }
}

#[test]
fn listener_liveness_probe() {
    let probe = json!({"httpGet": {"path": "/healthz", "port": 8080}, "initialDelaySeconds": 10,
                       "periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3});
    let m = render(chart());
    assert_eq!(
        ars(&m)["spec"]["listenerTemplate"],
        json!({"spec": {"containers": [{"name": "listener", "livenessProbe": probe}]}})
    );
    // Merged into a user listener container, after the user's sidecars are kept.
    let m = render(with_fixture("values_listener_template.yaml"));
    let containers = &ars(&m)["spec"]["listenerTemplate"]["spec"]["containers"];
    assert_eq!(containers[0]["livenessProbe"], probe);
    assert!(containers[1].get("livenessProbe").is_none());
    // A user probe wins; the port follows the value.
    let own = json!({"tcpSocket": {"port": 9090}});
    let m = render(
        chart().values(json!({"listenerTemplate": {"spec": {"containers": [
        {"name": "listener", "livenessProbe": own}]}}})),
    );
    assert_eq!(
        ars(&m)["spec"]["listenerTemplate"]["spec"]["containers"][0]["livenessProbe"],
        own
    );
    let m = render(chart().set("listenerLivenessProbe.probe.httpGet.port", "9090"));
    assert_eq!(
        ars(&m)["spec"]["listenerTemplate"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["port"],
        9090
    );
    // Disabled: no template at all, as upstream.
    let m = render(chart().set("listenerLivenessProbe.enabled", "false"));
    assert!(ars(&m)["spec"].get("listenerTemplate").is_none());
}

#[test]
fn label_values_are_strings() {
    let m = render(chart().values(json!({"labels": {"wave": 1, "flag": true},
                                         "template": {"metadata": {"labels": {"n": 2}}}})));
    let ars = ars(&m);
    assert_eq!(ars["metadata"]["labels"]["wave"], "1");
    assert_eq!(ars["metadata"]["labels"]["flag"], "true");
    assert_eq!(ars["spec"]["template"]["metadata"]["labels"]["n"], "2");
}

#[test]
fn schema_requires_container_names() {
    let stderr = render_error(chart().set("template.spec.containers[0].image", "x"));
    assert!(stderr.contains("missing property 'name'"), "{stderr}");
}
