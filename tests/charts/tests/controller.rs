//! Render tests of the controller chart: one test per case of ARC's own chart tests (same names in
//! snake case), plus the places where arc-rs goes further.

use std::collections::BTreeSet;

use chart_tests::{Chart, Manifests, Template};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

const RELEASE: &str = "test-arc";
const NAMESPACE: &str = "test-ns";
const FULLNAME: &str = "test-arc-gha-rs-controller";

fn chart() -> Template {
    Template::new(Chart::Controller)
        .release(RELEASE)
        .namespace(NAMESPACE)
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

fn deployment(manifests: &Manifests) -> &Value {
    manifests.get("Deployment", FULLNAME).expect("deployment")
}

fn manager(deployment: &Value) -> &Value {
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["name"], "manager");
    container
}

fn args(deployment: &Value) -> BTreeSet<String> {
    manager(deployment)["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_owned())
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn resources(role: &Value) -> Vec<&str> {
    role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| r["resources"][0].as_str().expect("resource"))
        .collect()
}

fn default_args() -> BTreeSet<String> {
    set(&[
        "--auto-scaling-runner-set-only",
        "--log-level=debug",
        "--log-format=text",
        "--metrics-addr=0",
        "--listener-metrics-addr=0",
        "--listener-metrics-endpoint=",
        // ARC renders =2 here; ours defaults to the manager's own 64 (docs/helm-values.md).
        "--runner-max-concurrent-reconciles=64",
    ])
}

#[test]
fn lint_passes() {
    chart_tests::lint(Chart::Controller, &[]).expect("lint");
    chart_tests::lint(
        Chart::Controller,
        &[Chart::Controller.path().join("ci/ci-values.yaml")],
    )
    .expect("lint with ci values");
}

#[test]
fn create_service_account() {
    let m = render(
        chart()
            .set("serviceAccount.create", "true")
            .set("serviceAccount.annotations.foo", "bar"),
    );
    let sa = m.get("ServiceAccount", FULLNAME).expect("sa");
    assert_eq!(sa["metadata"]["namespace"], NAMESPACE);
    assert_eq!(sa["metadata"]["annotations"]["foo"], "bar");
}

#[test]
fn create_service_account_overwrite_name() {
    let m = render(
        chart()
            .set("serviceAccount.name", "overwritten-name")
            .set("serviceAccount.annotations.foo", "bar"),
    );
    let sa = m.get("ServiceAccount", "overwritten-name").expect("sa");
    assert_eq!(sa["metadata"]["annotations"]["foo"], "bar");
    assert_eq!(
        deployment(&m)["spec"]["template"]["spec"]["serviceAccountName"],
        "overwritten-name"
    );
    assert_eq!(
        deployment(&m)["metadata"]["labels"]["actions.github.com/controller-service-account-name"],
        "overwritten-name"
    );
}

#[test]
fn create_service_account_cannot_use_default_service_account() {
    let stderr = render_error(chart().set("serviceAccount.name", "default"));
    assert!(
        stderr.contains("serviceAccount.name cannot be set to 'default'"),
        "{stderr}"
    );
}

#[test]
fn not_create_service_account() {
    let m = render(
        chart()
            .set("serviceAccount.create", "false")
            .set("serviceAccount.name", "existing-sa"),
    );
    assert_eq!(m.of_kind("ServiceAccount").count(), 0);
    assert_eq!(
        deployment(&m)["spec"]["template"]["spec"]["serviceAccountName"],
        "existing-sa"
    );
}

#[test]
fn not_create_service_account_service_account_not_set() {
    let stderr = render_error(chart().set("serviceAccount.create", "false"));
    assert!(
        stderr.contains("serviceAccount.name must be set if serviceAccount.create is false"),
        "{stderr}"
    );
}

#[test]
fn create_manager_cluster_role() {
    let m = render(chart());
    let role = m.get("ClusterRole", FULLNAME).expect("cluster role");
    assert!(role["metadata"].get("namespace").is_none());
    let rules = role["rules"].as_array().expect("rules");
    // The 16 upstream rules, then (beyond upstream) Events for the controller's reports.
    assert_eq!(rules.len(), 17);
    assert_eq!(
        resources(role),
        [
            "autoscalingrunnersets",
            "autoscalingrunnersets/finalizers",
            "autoscalingrunnersets/status",
            "autoscalinglisteners",
            "autoscalinglisteners/status",
            "autoscalinglisteners/finalizers",
            "ephemeralrunnersets",
            "ephemeralrunnersets/status",
            "ephemeralrunnersets/finalizers",
            "ephemeralrunners",
            "ephemeralrunners/finalizers",
            "ephemeralrunners/status",
            "pods",
            "serviceaccounts",
            "rolebindings",
            "roles",
            "events",
        ]
    );
    assert_eq!(rules[0]["apiGroups"], json!(["actions.github.com"]));
    assert_eq!(
        rules[0]["verbs"],
        json!([
            "create", "delete", "get", "list", "patch", "update", "watch"
        ])
    );
    assert_eq!(rules[12]["verbs"], json!(["list", "watch"]));
    assert_eq!(rules[15]["verbs"], json!(["list", "watch", "patch"]));
    assert_eq!(m.of_kind("Role").count(), 1, "only the listener Role");
    assert!(
        m.find("Role", &format!("{FULLNAME}-single-namespace"))
            .is_none()
    );
    assert!(
        m.find("Role", &format!("{FULLNAME}-single-namespace-watch"))
            .is_none()
    );
}

#[test]
fn manager_cluster_role_binding() {
    let m = render(chart());
    let binding = m.get("ClusterRoleBinding", FULLNAME).expect("binding");
    assert!(binding["metadata"].get("namespace").is_none());
    assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
    assert_eq!(binding["roleRef"]["name"], FULLNAME);
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}])
    );
    assert_eq!(
        m.of_kind("RoleBinding").count(),
        1,
        "only the listener RoleBinding"
    );
}

#[test]
fn create_manager_listener_role() {
    let m = render(chart());
    let role = m
        .get("Role", &format!("{FULLNAME}-listener"))
        .expect("role");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        resources(role),
        ["pods", "pods/status", "secrets", "serviceaccounts", "roles"]
    );
    let rbac = &role["rules"][4];
    assert_eq!(rbac["resources"], json!(["roles", "rolebindings"]));
    assert_eq!(rbac["apiGroups"], json!(["rbac.authorization.k8s.io"]));
}

#[test]
fn manager_listener_role_binding() {
    let m = render(chart());
    let binding = m
        .get("RoleBinding", &format!("{FULLNAME}-listener"))
        .expect("binding");
    assert_eq!(binding["metadata"]["namespace"], NAMESPACE);
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["roleRef"]["name"], format!("{FULLNAME}-listener"));
    assert_eq!(binding["subjects"][0]["name"], FULLNAME);
    assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
}

#[test]
fn controller_deployment_defaults() {
    let m = render(chart().set("image.tag", "dev"));
    let d = deployment(&m);
    assert_eq!(d["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        d["metadata"]["labels"],
        json!({
            "helm.sh/chart": "gha-rs-controller-0.1.0",
            "app.kubernetes.io/name": "gha-rs-controller",
            "app.kubernetes.io/namespace": NAMESPACE,
            "app.kubernetes.io/instance": RELEASE,
            "app.kubernetes.io/version": "0.1.0",
            "app.kubernetes.io/part-of": "gha-rs-controller",
            "app.kubernetes.io/managed-by": "Helm",
            "actions.github.com/controller-service-account-namespace": NAMESPACE,
            "actions.github.com/controller-service-account-name": FULLNAME,
        })
    );
    assert_eq!(d["spec"]["replicas"], 1);
    let selector = json!({
        "app.kubernetes.io/name": "gha-rs-controller",
        "app.kubernetes.io/namespace": NAMESPACE,
        "app.kubernetes.io/instance": RELEASE,
    });
    assert_eq!(d["spec"]["selector"]["matchLabels"], selector);
    let pod = &d["spec"]["template"];
    assert_eq!(
        pod["metadata"]["labels"],
        json!({
            "app.kubernetes.io/part-of": "gha-rs-controller",
            "app.kubernetes.io/component": "controller-manager",
            "app.kubernetes.io/version": "0.1.0",
            "app.kubernetes.io/name": "gha-rs-controller",
            "app.kubernetes.io/namespace": NAMESPACE,
            "app.kubernetes.io/instance": RELEASE,
        })
    );
    assert_eq!(
        pod["metadata"]["annotations"],
        json!({"kubectl.kubernetes.io/default-container": "manager"})
    );
    let spec = &pod["spec"];
    // securityContext is set by default (a deliberate difference from ARC): see tests/security.rs.
    for absent in [
        "imagePullSecrets",
        "priorityClassName",
        "nodeSelector",
        "affinity",
        "topologySpreadConstraints",
        "tolerations",
    ] {
        assert!(spec.get(absent).is_none(), "{absent} should be absent");
    }
    assert_eq!(spec["serviceAccountName"], FULLNAME);
    assert_eq!(spec["terminationGracePeriodSeconds"], 10);
    assert_eq!(spec["volumes"], json!([{"name": "tmp", "emptyDir": {}}]));
    let c = manager(d);
    assert_eq!(spec["containers"].as_array().map(Vec::len), Some(1));
    assert_eq!(c["image"], "ghcr.io/arc-rs/arc-rs:dev");
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    assert_eq!(c["command"], json!(["/manager"]));
    assert_eq!(args(d), default_args());
    assert_eq!(
        c["env"],
        json!([
            {"name": "CONTROLLER_MANAGER_CONTAINER_IMAGE", "value": "ghcr.io/arc-rs/arc-rs:dev"},
            {"name": "CONTROLLER_MANAGER_POD_NAMESPACE",
             "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            // The reporting instance of the manager's Events.
            {"name": "CONTROLLER_MANAGER_POD_NAME",
             "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ])
    );
    for absent in ["resources", "ports", "livenessProbe", "readinessProbe"] {
        assert!(c.get(absent).is_none(), "{absent} should be absent");
    }
    assert_eq!(
        c["volumeMounts"],
        json!([{"mountPath": "/tmp", "name": "tmp"}])
    );
}

#[test]
fn controller_deployment_default_image_is_the_app_version() {
    let m = render(chart());
    assert_eq!(
        manager(deployment(&m))["image"],
        "ghcr.io/arc-rs/arc-rs:0.1.0"
    );
}

#[test]
fn controller_deployment_customize() {
    let values = json!({
        "labels": {"foo": "bar", "github": "actions", "number": 1, "flag": true},
        "image": {"pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "dockerhub"}],
        "nameOverride": "gha-rs-controller-override",
        "fullnameOverride": "gha-rs-controller-fullname-override",
        "env": [{"name": "ENV_VAR_NAME_1", "value": "ENV_VAR_VALUE_1"}],
        "serviceAccount": {"name": "gha-rs-controller-sa"},
        "podAnnotations": {"foo": "bar"},
        "podSecurityContext": {"fsGroup": 1000},
        "securityContext": {"runAsUser": 1000, "runAsNonRoot": true},
        "resources": {"limits": {"cpu": "1"}},
        "nodeSelector": {"foo": "bar"},
        "tolerations": [{"key": "foo", "operator": "Equal", "value": "bar", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "foo", "operator": "In", "values": ["bar"]}]}]}}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "foo", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"foo": "bar"}}}],
        "priorityClassName": "test-priority-class",
        "flags": {"logLevel": "info", "logFormat": "json"},
        "volumes": [{"name": "customMount", "configMap": {"name": "my-configmap"}}],
        "volumeMounts": [{"name": "customMount", "mountPath": "/my/mount/path"}],
    });
    let m = render(chart().values(values));
    let d = m
        .get("Deployment", "gha-rs-controller-fullname-override")
        .expect("deployment");
    let labels = &d["metadata"]["labels"];
    assert_eq!(
        labels["app.kubernetes.io/name"],
        "gha-rs-controller-override"
    );
    assert_eq!(labels["foo"], "bar");
    assert_eq!(labels["github"], "actions");
    assert_eq!(labels["number"], "1", "label values are strings");
    assert_eq!(labels["flag"], "true");
    assert_eq!(
        labels["actions.github.com/controller-service-account-name"],
        "gha-rs-controller-sa"
    );
    let pod = &d["spec"]["template"];
    assert_eq!(pod["metadata"]["annotations"]["foo"], "bar");
    assert_eq!(
        pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"],
        "manager"
    );
    let spec = &pod["spec"];
    assert_eq!(spec["imagePullSecrets"], json!([{"name": "dockerhub"}]));
    assert_eq!(spec["serviceAccountName"], "gha-rs-controller-sa");
    assert_eq!(spec["securityContext"]["fsGroup"], 1000);
    assert_eq!(spec["priorityClassName"], "test-priority-class");
    assert_eq!(spec["nodeSelector"]["foo"], "bar");
    assert_eq!(spec["tolerations"][0]["key"], "foo");
    assert_eq!(
        spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["key"],
        "foo"
    );
    assert_eq!(spec["topologySpreadConstraints"][0]["topologyKey"], "foo");
    assert_eq!(
        spec["volumes"],
        json!([{"name": "tmp", "emptyDir": {}}, {"name": "customMount", "configMap": {"name": "my-configmap"}}])
    );
    let c = manager(d);
    assert_eq!(c["imagePullPolicy"], "Always");
    assert_eq!(c["securityContext"]["runAsUser"], 1000);
    assert_eq!(c["resources"]["limits"]["cpu"], "1");
    assert_eq!(
        c["volumeMounts"],
        json!([{"mountPath": "/tmp", "name": "tmp"}, {"name": "customMount", "mountPath": "/my/mount/path"}])
    );
    let a = args(d);
    for expected in [
        "--auto-scaler-image-pull-secrets=dockerhub",
        "--log-level=info",
        "--log-format=json",
    ] {
        assert!(a.contains(expected), "{expected} missing from {a:?}");
    }
    let env = c["env"].as_array().expect("env");
    assert_eq!(env.len(), 4);
    assert_eq!(
        env[3],
        json!({"name": "ENV_VAR_NAME_1", "value": "ENV_VAR_VALUE_1"})
    );
}

#[test]
fn enable_leader_election_role() {
    let m = render(chart().set("replicaCount", "2"));
    let role = m
        .get("Role", &format!("{FULLNAME}-leader-election"))
        .expect("role");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    assert_eq!(resources(role), ["leases", "events"]);
}

#[test]
fn enable_leader_election_role_binding() {
    let m = render(chart().set("replicaCount", "2"));
    let name = format!("{FULLNAME}-leader-election");
    let binding = m.get("RoleBinding", &name).expect("binding");
    assert_eq!(binding["roleRef"]["name"], name.as_str());
    assert_eq!(binding["subjects"][0]["name"], FULLNAME);
}

#[test]
fn enable_leader_election() {
    let m = render(chart().set("replicaCount", "2"));
    let d = deployment(&m);
    assert_eq!(d["spec"]["replicas"], 2);
    let a = args(d);
    assert!(a.contains("--enable-leader-election"));
    assert!(a.contains(&format!("--leader-election-id={FULLNAME}")));
}

#[test]
fn leader_election_is_off_for_one_replica_and_zero_means_one() {
    for replicas in ["1", "0"] {
        let m = render(chart().set("replicaCount", replicas));
        assert_eq!(deployment(&m)["spec"]["replicas"], 1);
        assert!(!args(deployment(&m)).contains("--enable-leader-election"));
        assert!(
            m.find("Role", &format!("{FULLNAME}-leader-election"))
                .is_none()
        );
    }
}

#[test]
fn controller_deployment_forward_image_pull_secrets() {
    let m = render(
        chart()
            .set("imagePullSecrets[0].name", "dockerhub")
            .set("imagePullSecrets[1].name", "ghcr"),
    );
    let a = args(deployment(&m));
    assert!(a.contains("--auto-scaler-image-pull-secrets=dockerhub"));
    assert!(a.contains("--auto-scaler-image-pull-secrets=ghcr"));
}

#[test]
fn controller_deployment_watch_single_namespace() {
    let m = render(chart().set("flags.watchSingleNamespace", "demo"));
    let d = deployment(&m);
    assert_eq!(
        d["metadata"]["labels"]["actions.github.com/controller-watch-single-namespace"],
        "demo"
    );
    let mut expected = default_args();
    expected.insert("--watch-single-namespace=demo".to_owned());
    assert_eq!(args(d), expected);
}

#[test]
fn controller_container_environment_variables() {
    let values = json!({"env": [
        {"name": "ENV_VAR_NAME_1", "value": "ENV_VAR_VALUE_1"},
        {"name": "ENV_VAR_NAME_2", "valueFrom": {"secretKeyRef": {"key": "ENV_VAR_NAME_2", "name": "secret-name", "optional": true}}},
        {"name": "ENV_VAR_NAME_3", "value": ""},
        {"name": "ENV_VAR_NAME_4"},
    ]});
    let m = render(chart().values(values.clone()));
    let env = manager(deployment(&m))["env"].as_array().expect("env");
    assert_eq!(env.len(), 7);
    assert_eq!(env[3..], values["env"].as_array().expect("env")[..]);
}

#[test]
fn controller_env_given_as_a_map_is_rejected_by_the_schema() {
    let stderr = render_error(chart().values(json!({"env": {"FOO": "bar"}})));
    assert!(stderr.contains("/env"), "{stderr}");
}

#[test]
fn watch_single_namespace_not_create_manager_cluster_role() {
    let m = render(chart().set("flags.watchSingleNamespace", "demo"));
    assert_eq!(m.of_kind("ClusterRole").count(), 0);
}

#[test]
fn watch_single_namespace_not_manager_cluster_role_binding() {
    let m = render(chart().set("flags.watchSingleNamespace", "demo"));
    assert_eq!(m.of_kind("ClusterRoleBinding").count(), 0);
}

#[test]
fn create_manager_single_namespace_role() {
    let m = render(chart().set("flags.watchSingleNamespace", "demo"));
    let controller = m
        .get("Role", &format!("{FULLNAME}-single-namespace"))
        .expect("controller role");
    assert_eq!(controller["metadata"]["namespace"], NAMESPACE);
    // 10 upstream rules plus Events.
    assert_eq!(
        resources(controller),
        [
            "autoscalinglisteners",
            "autoscalinglisteners/status",
            "autoscalinglisteners/finalizers",
            "pods",
            "serviceaccounts",
            "rolebindings",
            "roles",
            "autoscalingrunnersets",
            "ephemeralrunnersets",
            "ephemeralrunners",
            "events",
        ]
    );
    assert_eq!(controller["rules"][6]["verbs"], json!(["list", "watch"]));
    let watch = m
        .get("Role", &format!("{FULLNAME}-single-namespace-watch"))
        .expect("watch role");
    assert_eq!(watch["metadata"]["namespace"], "demo");
    // 14 upstream rules plus Events.
    assert_eq!(
        resources(watch),
        [
            "autoscalingrunnersets",
            "autoscalingrunnersets/finalizers",
            "autoscalingrunnersets/status",
            "ephemeralrunnersets",
            "ephemeralrunnersets/status",
            "ephemeralrunnersets/finalizers",
            "ephemeralrunners",
            "ephemeralrunners/finalizers",
            "ephemeralrunners/status",
            "autoscalinglisteners",
            "pods",
            "serviceaccounts",
            "rolebindings",
            "roles",
            "events",
        ]
    );
    assert_eq!(
        watch["rules"][13]["verbs"],
        json!(["list", "watch", "patch"])
    );
}

#[test]
fn manager_single_namespace_role_binding() {
    let m = render(chart().set("flags.watchSingleNamespace", "demo"));
    for (name, namespace) in [
        (format!("{FULLNAME}-single-namespace"), NAMESPACE),
        (format!("{FULLNAME}-single-namespace-watch"), "demo"),
    ] {
        let binding = m.get("RoleBinding", &name).expect("binding");
        assert_eq!(binding["metadata"]["namespace"], namespace);
        assert_eq!(binding["roleRef"]["name"], name.as_str());
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}])
        );
    }
}

#[test]
fn controller_deployment_metrics_ports() {
    let m = render(
        chart()
            .set("metrics.controllerManagerAddr", ":8080")
            .set("metrics.listenerAddr", ":8081")
            .set("metrics.listenerEndpoint", "/metrics"),
    );
    let d = deployment(&m);
    assert_eq!(
        manager(d)["ports"],
        json!([{"containerPort": 8080, "protocol": "TCP", "name": "metrics"}])
    );
    let all: Vec<String> = manager(d)["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string").to_owned())
        .collect();
    for expected in [
        "--metrics-addr=:8080",
        "--listener-metrics-addr=:8081",
        "--listener-metrics-endpoint=/metrics",
    ] {
        assert_eq!(
            all.iter().filter(|a| *a == expected).count(),
            1,
            "{expected} in {all:?}"
        );
    }
}

#[test]
fn metrics_address_without_port_fails() {
    let stderr = render_error(chart().set("metrics.controllerManagerAddr", "localhost"));
    assert!(
        stderr.contains("Values.metrics.controllerManagerAddr must end with a numeric port"),
        "{stderr}"
    );
}

#[test]
fn pprof_address() {
    let m = render(chart().set("pprof.addr", ":6060"));
    let d = deployment(&m);
    assert!(args(d).contains("--pprof-addr=:6060"));
    assert_eq!(
        manager(d)["ports"],
        json!([{"containerPort": 6060, "protocol": "TCP", "name": "pprof"}])
    );
    let stderr = render_error(chart().set("pprof.addr", "nowhere"));
    assert!(
        stderr.contains("Values.pprof.addr must end with a numeric port"),
        "{stderr}"
    );
}

#[test]
fn deployment_exclude_label_propagation_prefixes() {
    let m = render(
        chart()
            .set("flags.excludeLabelPropagationPrefixes[0]", "prefix.com/")
            .set(
                "flags.excludeLabelPropagationPrefixes[1]",
                "complete.io/label",
            ),
    );
    let a = args(deployment(&m));
    assert!(a.contains("--exclude-label-propagation-prefix=prefix.com/"));
    assert!(a.contains("--exclude-label-propagation-prefix=complete.io/label"));
}

#[test]
fn optional_flags_become_args() {
    let m = render(chart().values(json!({"flags": {
        "k8sClientRateLimiterQPS": 50,
        "k8sClientRateLimiterBurst": 100,
        "rateLimiter": {"name": "typed_rate_limiter"},
        "updateStrategy": "eventual",
        "runnerMaxConcurrentReconciles": 10,
    }})));
    let a = args(deployment(&m));
    for expected in [
        "--k8s-client-rate-limiter-qps=50",
        "--k8s-client-rate-limiter-burst=100",
        "--workqueue-rate-limiter=typed_rate_limiter",
        "--update-strategy=eventual",
        "--runner-max-concurrent-reconciles=10",
    ] {
        assert!(a.contains(expected), "{expected} missing from {a:?}");
    }
    let m = render(chart().set("flags.runnerMaxConcurrentReconciles", "0"));
    assert!(
        !args(deployment(&m))
            .iter()
            .any(|a| a.starts_with("--runner-max-concurrent-reconciles"))
    );
}

#[test]
fn health_probe_bind_address_adds_probes() {
    let m = render(chart().set("flags.healthProbeBindAddress", ":8081"));
    let c = manager(deployment(&m));
    assert!(args(deployment(&m)).contains("--health-probe-bind-address=:8081"));
    assert_eq!(
        c["livenessProbe"],
        json!({"httpGet": {"path": "/healthz", "port": 8081}, "initialDelaySeconds": 15, "periodSeconds": 20})
    );
    assert_eq!(
        c["readinessProbe"],
        json!({"httpGet": {"path": "/readyz", "port": 8081}, "initialDelaySeconds": 5, "periodSeconds": 10})
    );
    let stderr = render_error(chart().set("flags.healthProbeBindAddress", "localhost"));
    assert!(
        stderr.contains("Values.flags.healthProbeBindAddress must end with a numeric port"),
        "{stderr}"
    );
}

#[test]
fn namespace_override() {
    let override_ns = "namespace-override";
    let base = || {
        Template::new(Chart::Controller)
            .release("test")
            .namespace(NAMESPACE)
            .set("namespaceOverride", override_ns)
    };
    let m = render(base().set("replicaCount", "2"));
    for (kind, name) in [
        ("Deployment", "test-gha-rs-controller"),
        ("ServiceAccount", "test-gha-rs-controller"),
        ("Role", "test-gha-rs-controller-leader-election"),
        ("RoleBinding", "test-gha-rs-controller-leader-election"),
        ("Role", "test-gha-rs-controller-listener"),
        ("RoleBinding", "test-gha-rs-controller-listener"),
    ] {
        let object = m.get(kind, name).expect("object");
        assert_eq!(
            object["metadata"]["namespace"], override_ns,
            "{kind}/{name}"
        );
    }
    assert_eq!(
        m.get("ClusterRoleBinding", "test-gha-rs-controller")
            .expect("binding")["subjects"][0]["namespace"],
        override_ns
    );
    // ARC's case passes `--set flags.watchSingleNamespace=true`, which helm types as a boolean.
    let m = render(base().set("flags.watchSingleNamespace", "true"));
    for kind in ["Role", "RoleBinding"] {
        let object = m
            .get(kind, "test-gha-rs-controller-single-namespace")
            .expect("object");
        assert_eq!(object["metadata"]["namespace"], override_ns);
    }
    let m = render(base().set("flags.watchSingleNamespace", "target-ns"));
    for kind in ["Role", "RoleBinding"] {
        let object = m
            .get(kind, "test-gha-rs-controller-single-namespace-watch")
            .expect("object");
        assert_eq!(object["metadata"]["namespace"], "target-ns");
    }
}

#[test]
fn rbac_objects_carry_no_labels() {
    let m = render(chart().set("labels.team", "ci"));
    for object in m.objects() {
        let kind = object["kind"].as_str().expect("kind");
        if kind.starts_with("Role") || kind.starts_with("ClusterRole") {
            assert!(object["metadata"].get("labels").is_none(), "{kind}");
        } else {
            assert_eq!(object["metadata"]["labels"]["team"], "ci", "{kind}");
        }
    }
}

#[test]
fn fullname_uses_the_release_name_when_it_contains_the_base_name() {
    let m = render(
        Template::new(Chart::Controller)
            .release("my-gha-rs-controller")
            .namespace(NAMESPACE),
    );
    assert!(m.find("Deployment", "my-gha-rs-controller").is_some());
}

#[test]
fn watch_single_namespace_typed_by_set_is_a_namespace_name() {
    // `--set` turns "true" into a boolean and "2024" into a number; ARC's chart takes both as the name.
    for name in ["true", "2024"] {
        let m = render(chart().set("flags.watchSingleNamespace", name));
        let d = deployment(&m);
        assert_eq!(
            d["metadata"]["labels"]["actions.github.com/controller-watch-single-namespace"],
            name
        );
        assert!(args(d).contains(&format!("--watch-single-namespace={name}")));
        for kind in ["Role", "RoleBinding"] {
            let watch = m
                .get(kind, &format!("{FULLNAME}-single-namespace-watch"))
                .expect("watch-namespace object");
            assert_eq!(watch["metadata"]["namespace"], name, "{kind} for {name}");
        }
        assert_eq!(m.of_kind("ClusterRole").count(), 0);
    }
    // false and 0 are unset, as with ARC's `if`.
    for unset in ["false", "0"] {
        let m = render(chart().set("flags.watchSingleNamespace", unset));
        assert_eq!(m.of_kind("ClusterRole").count(), 1, "{unset}");
    }
}

#[test]
fn numeric_namespace_override_is_a_string() {
    let m = render(
        chart()
            .set("namespaceOverride", "2024")
            .set("replicaCount", "2"),
    );
    for object in m.objects() {
        if object["kind"]
            .as_str()
            .is_some_and(|k| k.starts_with("Cluster"))
        {
            continue;
        }
        assert_eq!(
            object["metadata"]["namespace"], "2024",
            "{}/{}",
            object["kind"], object["metadata"]["name"]
        );
    }
    let d = deployment(&m);
    assert_eq!(
        d["metadata"]["labels"]["actions.github.com/controller-service-account-namespace"],
        "2024"
    );
    assert_eq!(
        d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/namespace"],
        "2024"
    );
    assert_eq!(
        m.get("ClusterRoleBinding", FULLNAME).expect("binding")["subjects"][0]["namespace"],
        "2024"
    );
}

#[test]
fn kube_version_below_the_supported_range_is_refused() {
    let stderr = render_error(chart().kube_version("v1.26.15"));
    assert!(
        stderr.contains("chart requires kubeVersion: >=1.27.0-0"),
        "{stderr}"
    );
    render(chart().kube_version(chart_tests::OLDEST_KUBE_VERSION));
    render(chart().kube_version("v1.27.16-eks-2f46c53"));
}

// ---- Opt-in PodMonitor for the manager ----

#[test]
fn pod_monitor_is_off_by_default() {
    let m = render(chart().set("metrics.controllerManagerAddr", ":8080"));
    assert_eq!(m.of_kind("PodMonitor").count(), 0);
}

#[test]
fn pod_monitor_scrapes_the_manager_metrics_port() {
    let m = render(chart().values(json!({
        "labels": {"team": "ci"},
        "metrics": {"controllerManagerAddr": ":8080", "listenerAddr": ":8080", "listenerEndpoint": "/metrics"},
        "podMonitor": {"enabled": true, "labels": {"release": "prometheus", "app.kubernetes.io/name": "mine"},
                       "interval": "15s", "scrapeTimeout": "5s",
                       "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"], "regex": "go_.*"}]},
    })));
    let monitor = m.get("PodMonitor", FULLNAME).expect("PodMonitor");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["metadata"]["namespace"], NAMESPACE);
    let labels = &monitor["metadata"]["labels"];
    assert_eq!(labels["release"], "prometheus");
    assert_eq!(labels["team"], "ci");
    assert_eq!(
        labels["app.kubernetes.io/name"], "gha-rs-controller",
        "the chart's labels cannot be overridden"
    );
    let selector = &monitor["spec"]["selector"]["matchLabels"];
    // The selector matches the manager pod's own labels, and nothing else's.
    let pod_labels = &deployment(&m)["spec"]["template"]["metadata"]["labels"];
    for (key, value) in selector.as_object().expect("matchLabels") {
        assert_eq!(&pod_labels[key], value, "{key}");
    }
    assert_eq!(
        selector["app.kubernetes.io/component"],
        "controller-manager"
    );
    assert_eq!(
        monitor["spec"]["podMetricsEndpoints"],
        json!([{"port": "metrics", "path": "/metrics", "honorLabels": true, "interval": "15s", "scrapeTimeout": "5s",
                "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"], "regex": "go_.*"}]}])
    );
    // The metrics' own name and namespace labels are kept unless the user says otherwise.
    let m = render(chart().values(json!({
        "metrics": {"controllerManagerAddr": ":8080"},
        "podMonitor": {"enabled": true, "honorLabels": false},
    })));
    let monitor = m.get("PodMonitor", FULLNAME).expect("PodMonitor");
    assert_eq!(
        monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"],
        false
    );
    assert_eq!(
        manager(deployment(&m))["ports"][0]["name"],
        "metrics",
        "the port the monitor names exists"
    );
}

#[test]
fn pod_monitor_without_metrics_fails_clearly() {
    let stderr = render_error(chart().set("podMonitor.enabled", "true"));
    assert!(
        stderr.contains("podMonitor.enabled needs metrics.controllerManagerAddr"),
        "{stderr}"
    );
}
