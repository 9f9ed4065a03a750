//! The objects an AutoscalingListener runs on, as pure functions: the listener's ServiceAccount, Role and
//! RoleBinding, its `config.json`, and its pod with the user's template merged in
//! (docs/reference/controllers.md, "AutoscalingListener controller").
//!
//! Beyond ARC: a template field that is unset keeps the controller's default (ARC replaces, for example,
//! `terminationGracePeriodSeconds` even when the template leaves it unset, so any template, such as the chart's
//! liveness probe, silently drops the 60 s grace period and the `linux` node selector).
//!
//! Also beyond ARC: the listener container runs hardened by default ([`listener_security_context`]: non-root,
//! read-only root filesystem, no privilege escalation, no capabilities, the runtime's seccomp profile). A
//! `securityContext` in the template, on the pod or on the `listener` container, replaces that default as a
//! whole, so configurations written for ARC keep exactly the settings they chose.

use std::collections::BTreeMap;

use crds::AutoscalingListener;
use crds::appconfig::GitHubCredentials;
use crds::common::{MetricsConfig, ResourceMeta, VAULT_TYPE_AZURE_KEY_VAULT};
use crds::constants::{
    INTEGRITY_HASH_ANNOTATION, LISTENER_CONTAINER_NAME, LISTENER_NAME_ENV, LISTENER_NAME_LABEL,
    LISTENER_NAMESPACE_ENV, LISTENER_NAMESPACE_LABEL, SCALE_SET_NAME_LABEL,
    SCALE_SET_NAMESPACE_LABEL,
};
use crds::schedule::MinRunnersSchedule;
use k8s_openapi::api::core::v1::{Pod, PodSpec, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::hash::integrity_hash;
use crate::labels::{merge_annotations, merge_labels};
use crate::proxy::{HTTP_PROXY_KEY, HTTPS_PROXY_KEY, NO_PROXY_KEY};

/// Key of the listener configuration in the config Secret.
pub const CONFIG_KEY: &str = "config.json";
/// Name of the config Secret volume (the listener-pod executor of the tests looks for it too).
pub const CONFIG_VOLUME: &str = "listener-config";
/// Where the config Secret is mounted.
pub const CONFIG_MOUNT_PATH: &str = "/etc/gha-listener";
/// Environment variable pointing the listener at its configuration.
pub const CONFIG_PATH_ENV: &str = "LISTENER_CONFIG_PATH";
/// Grace period of the listener pod: time to delete its message session on shutdown.
pub const TERMINATION_GRACE_PERIOD_SECONDS: i64 = 60;
/// User and group the listener runs as by default: the image's own numeric `USER` (distroless `nonroot`,
/// see the Dockerfile), so the kubelet can check `runAsNonRoot` without reading `/etc/passwd`.
pub const LISTENER_UID: i64 = 65532;

/// The listener container's default `securityContext`. The listener only reads its config Secret and talks to
/// the network, so it needs no writable path, no capability and no privilege; this passes the `restricted`
/// Pod Security Standard. Set at container level so the user's sidecars are not constrained by it.
pub fn listener_security_context() -> Value {
    json!({
        "runAsNonRoot": true,
        "runAsUser": LISTENER_UID,
        "runAsGroup": LISTENER_UID,
        "readOnlyRootFilesystem": true,
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

/// The controller-owned identity of a listener, shared by every object built here.
#[derive(Debug, Clone)]
pub struct ListenerIdentity<'a> {
    /// The AutoscalingListener.
    pub listener: &'a AutoscalingListener,
    /// Its owner reference (pod, ServiceAccount, Secrets).
    pub owner: OwnerReference,
    /// Label key prefixes never propagated.
    pub excluded_prefixes: &'a [String],
}

impl ListenerIdentity<'_> {
    fn name(&self) -> String {
        self.listener.name_any()
    }

    fn namespace(&self) -> String {
        self.listener.namespace().unwrap_or_default()
    }

    fn scale_set_labels(&self) -> BTreeMap<String, String> {
        let spec = &self.listener.spec;
        BTreeMap::from([
            (
                SCALE_SET_NAMESPACE_LABEL.to_owned(),
                spec.autoscaling_runner_set_namespace.clone(),
            ),
            (
                SCALE_SET_NAME_LABEL.to_owned(),
                spec.autoscaling_runner_set_name.clone(),
            ),
        ])
    }

    /// Labels of an object built from the listener's labels plus `own`, then the user's metadata.
    fn labels(
        &self,
        own: &BTreeMap<String, String>,
        meta: Option<&ResourceMeta>,
    ) -> BTreeMap<String, String> {
        let base = merge_labels(
            Some(self.listener.labels()),
            Some(own),
            self.excluded_prefixes,
        );
        merge_labels(meta.map(|m| &m.labels), Some(&base), self.excluded_prefixes)
    }
}

fn with_hash(mut annotations: BTreeMap<String, String>, hash: String) -> BTreeMap<String, String> {
    annotations.insert(INTEGRITY_HASH_ANNOTATION.to_owned(), hash);
    annotations
}

/// The listener's ServiceAccount.
pub fn service_account(id: &ListenerIdentity<'_>) -> Result<ServiceAccount> {
    let meta = id.listener.spec.service_account_metadata.as_ref();
    // Nothing of the account's content is generated, so its hash only covers its (constant) shape.
    let hash = integrity_hash(&json!({"kind": ServiceAccount::kind(&())}))?;
    Ok(ServiceAccount {
        metadata: ObjectMeta {
            name: Some(id.name()),
            namespace: Some(id.namespace()),
            labels: Some(id.labels(&id.scale_set_labels(), meta)),
            annotations: Some(with_hash(
                merge_annotations(meta.map(|m| &m.annotations), None),
                hash,
            )),
            owner_references: Some(vec![id.owner.clone()]),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    })
}

fn rbac_labels(id: &ListenerIdentity<'_>, meta: Option<&ResourceMeta>) -> BTreeMap<String, String> {
    let mut own = id.scale_set_labels();
    own.insert(LISTENER_NAMESPACE_LABEL.to_owned(), id.namespace());
    own.insert(LISTENER_NAME_LABEL.to_owned(), id.name());
    id.labels(&own, meta)
}

/// The rules of the listener's Role, exactly: patch its own EphemeralRunnerSet, and patch
/// EphemeralRunners and their status (job information) in that namespace.
pub fn role_rules(ephemeral_runner_set: &str) -> Vec<PolicyRule> {
    vec![
        PolicyRule {
            api_groups: Some(vec![crds::constants::GROUP.to_owned()]),
            resources: Some(vec!["ephemeralrunnersets".to_owned()]),
            resource_names: Some(vec![ephemeral_runner_set.to_owned()]),
            verbs: vec!["patch".to_owned()],
            ..PolicyRule::default()
        },
        PolicyRule {
            api_groups: Some(vec![crds::constants::GROUP.to_owned()]),
            // Beyond ARC, which also grants `ephemeralrunners`: the listener writes only the status subresource
            // (job identity). Patching a runner's spec would let a compromised listener choose the pod the
            // controller runs in the runners' namespace.
            resources: Some(vec!["ephemeralrunners/status".to_owned()]),
            verbs: vec!["patch".to_owned()],
            ..PolicyRule::default()
        },
    ]
}

/// Not in ARC: the rule of the listener's second Role, in the controller namespace: patch the status of its own
/// AutoscalingListener, where it reports whether it holds its message session (`resourceNames` keeps it from
/// touching any other listener's report; the listener cannot read, create or delete listeners).
pub fn status_role_rules(listener: &str) -> Vec<PolicyRule> {
    vec![PolicyRule {
        api_groups: Some(vec![crds::constants::GROUP.to_owned()]),
        resources: Some(vec!["autoscalinglisteners/status".to_owned()]),
        resource_names: Some(vec![listener.to_owned()]),
        verbs: vec!["patch".to_owned()],
        ..PolicyRule::default()
    }]
}

/// The listener's status Role, next to its AutoscalingListener (owned by it, so it goes with it).
pub fn status_role(id: &ListenerIdentity<'_>) -> Result<Role> {
    let rules = status_role_rules(&id.name());
    let meta = id.listener.spec.role_metadata.as_ref();
    Ok(Role {
        metadata: ObjectMeta {
            name: Some(crds::names::listener_status_role_name(&id.name())),
            namespace: Some(id.namespace()),
            labels: Some(rbac_labels(id, meta)),
            annotations: Some(with_hash(
                merge_annotations(meta.map(|m| &m.annotations), None),
                integrity_hash(&rules)?,
            )),
            owner_references: Some(vec![id.owner.clone()]),
            ..ObjectMeta::default()
        },
        rules: Some(rules),
    })
}

/// The binding of the status Role to the listener's ServiceAccount.
pub fn status_role_binding(id: &ListenerIdentity<'_>) -> Result<RoleBinding> {
    let name = crds::names::listener_status_role_name(&id.name());
    let role_ref = RoleRef {
        api_group: Some("rbac.authorization.k8s.io".to_owned()),
        kind: Role::kind(&()).into_owned(),
        name: name.clone(),
    };
    let subjects = vec![Subject {
        kind: ServiceAccount::kind(&()).into_owned(),
        name: id.name(),
        namespace: Some(id.namespace()),
        ..Subject::default()
    }];
    let meta = id.listener.spec.role_binding_metadata.as_ref();
    Ok(RoleBinding {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(id.namespace()),
            labels: Some(rbac_labels(id, meta)),
            annotations: Some(with_hash(
                merge_annotations(meta.map(|m| &m.annotations), None),
                integrity_hash(&(&role_ref, &subjects))?,
            )),
            owner_references: Some(vec![id.owner.clone()]),
            ..ObjectMeta::default()
        },
        role_ref,
        subjects: Some(subjects),
    })
}

/// The listener's Role, in the AutoscalingRunnerSet's namespace (no owner: another namespace).
pub fn role(id: &ListenerIdentity<'_>) -> Result<Role> {
    let rules = role_rules(&id.listener.spec.ephemeral_runner_set_name);
    let meta = id.listener.spec.role_metadata.as_ref();
    Ok(Role {
        metadata: ObjectMeta {
            name: Some(id.name()),
            namespace: Some(id.listener.spec.autoscaling_runner_set_namespace.clone()),
            labels: Some(rbac_labels(id, meta)),
            annotations: Some(with_hash(
                merge_annotations(meta.map(|m| &m.annotations), None),
                integrity_hash(&rules)?,
            )),
            ..ObjectMeta::default()
        },
        rules: Some(rules),
    })
}

/// The listener's RoleBinding: the Role to the listener's ServiceAccount.
pub fn role_binding(id: &ListenerIdentity<'_>) -> Result<RoleBinding> {
    let role_ref = RoleRef {
        api_group: Some("rbac.authorization.k8s.io".to_owned()),
        kind: Role::kind(&()).into_owned(),
        name: id.name(),
    };
    let subjects = vec![Subject {
        kind: ServiceAccount::kind(&()).into_owned(),
        name: id.name(),
        namespace: Some(id.namespace()),
        ..Subject::default()
    }];
    let meta = id.listener.spec.role_binding_metadata.as_ref();
    Ok(RoleBinding {
        metadata: ObjectMeta {
            name: Some(id.name()),
            namespace: Some(id.listener.spec.autoscaling_runner_set_namespace.clone()),
            labels: Some(rbac_labels(id, meta)),
            annotations: Some(with_hash(
                merge_annotations(meta.map(|m| &m.annotations), None),
                integrity_hash(&(&role_ref, &subjects))?,
            )),
            ..ObjectMeta::default()
        },
        role_ref,
        subjects: Some(subjects),
    })
}

/// Labels and annotations of the listener config Secret.
pub fn config_secret_metadata(
    listener: &AutoscalingListener,
    excluded_prefixes: &[String],
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let meta = listener.spec.config_secret_metadata.as_ref();
    (
        merge_labels(meta.map(|m| &m.labels), None, excluded_prefixes),
        merge_annotations(meta.map(|m| &m.annotations), None),
    )
}

/// Labels of the listener proxy Secret: exactly the scale set's name and namespace.
pub fn proxy_secret_labels(listener: &AutoscalingListener) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            SCALE_SET_NAMESPACE_LABEL.to_owned(),
            listener.spec.autoscaling_runner_set_namespace.clone(),
        ),
        (
            SCALE_SET_NAME_LABEL.to_owned(),
            listener.spec.autoscaling_runner_set_name.clone(),
        ),
    ])
}

/// Listener-wide settings that come from the manager, not from the AutoscalingListener.
#[derive(Debug, Clone, Default)]
pub struct ConfigSettings<'a> {
    /// `log_level`.
    pub log_level: &'a str,
    /// `log_format`.
    pub log_format: &'a str,
    /// `metrics_addr` (empty: none).
    pub metrics_addr: &'a str,
    /// `metrics_endpoint` (empty: none).
    pub metrics_endpoint: &'a str,
    /// `health_addr` (not in ARC): where `/healthz` is served, whatever `metrics_addr` says.
    pub health_addr: &'a str,
}

/// `config.json` of the listener, keys in ARC's order (docs/reference/controllers.md, "Listener config file").
#[derive(Debug, Serialize)]
struct ListenerConfigJson<'a> {
    configure_url: &'a str,
    vault_type: &'a str,
    vault_lookup_key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    azure_key_vault: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    github_app_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    github_app_installation_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    github_app_private_key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    github_token: Option<&'a str>,
    ephemeral_runner_set_namespace: &'a str,
    ephemeral_runner_set_name: &'a str,
    max_runners: i64,
    min_runners: i64,
    runner_scale_set_id: i64,
    runner_scale_set_name: &'a str,
    server_root_ca: &'a str,
    log_level: &'a str,
    log_format: &'a str,
    metrics_addr: &'a str,
    metrics_endpoint: &'a str,
    metrics: Option<&'a MetricsConfig>,
    /// Not in ARC: `/healthz` at the address the chart's liveness probe asks, whatever `metrics_addr` says.
    health_addr: &'a str,
    // Not in ARC (whose listener ignores unknown keys); left out when unset, so ARC's file is unchanged.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    min_runners_schedules: &'a [MinRunnersSchedule],
    #[serde(skip_serializing_if = "is_zero")]
    scale_down_delay_seconds: i64,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde passes a reference
fn is_zero(value: &i64) -> bool {
    *value == 0
}

/// The listener's `config.json` (with a trailing newline, as ARC writes it). `credentials` is `None` only when
/// the listener reads them from a vault itself.
pub fn listener_config(
    listener: &AutoscalingListener,
    credentials: Option<&GitHubCredentials>,
    server_root_ca: &str,
    settings: &ConfigSettings<'_>,
) -> Result<String> {
    let spec = &listener.spec;
    let invalid = |reason: &str| Error::InvalidListenerConfig {
        listener: listener.name_any(),
        reason: reason.to_owned(),
    };
    if spec.github_config_url.is_empty() {
        return Err(invalid("githubConfigUrl is empty"));
    }
    if spec.autoscaling_runner_set_namespace.is_empty() || spec.ephemeral_runner_set_name.is_empty()
    {
        return Err(invalid("the EphemeralRunnerSet namespace or name is empty"));
    }
    if spec.runner_scale_set_id == 0 {
        return Err(invalid("runnerScaleSetId is 0"));
    }
    if spec.max_runners < spec.min_runners {
        return Err(invalid("maxRunners is less than minRunners"));
    }
    crds::schedule::check(&spec.min_runners_schedules, spec.max_runners)
        .map_err(|e| invalid(&e.to_string()))?;
    let mut config = ListenerConfigJson {
        configure_url: &spec.github_config_url,
        vault_type: "",
        vault_lookup_key: "",
        azure_key_vault: None,
        github_app_id: None,
        github_app_installation_id: None,
        github_app_private_key: None,
        github_token: None,
        ephemeral_runner_set_namespace: &spec.autoscaling_runner_set_namespace,
        ephemeral_runner_set_name: &spec.ephemeral_runner_set_name,
        max_runners: spec.max_runners,
        min_runners: spec.min_runners,
        runner_scale_set_id: spec.runner_scale_set_id,
        runner_scale_set_name: &spec.autoscaling_runner_set_name,
        server_root_ca,
        log_level: settings.log_level,
        log_format: settings.log_format,
        metrics_addr: settings.metrics_addr,
        metrics_endpoint: settings.metrics_endpoint,
        metrics: spec.metrics.as_ref(),
        health_addr: settings.health_addr,
        min_runners_schedules: &spec.min_runners_schedules,
        scale_down_delay_seconds: spec.scale_down_delay_seconds,
    };
    match (&spec.vault_config, credentials) {
        (Some(vault), _) => {
            if vault.type_ != VAULT_TYPE_AZURE_KEY_VAULT {
                return Err(invalid(&format!("unknown vault type {:?}", vault.type_)));
            }
            if spec.github_config_secret.is_empty() {
                return Err(invalid("githubConfigSecret (the vault key) is empty"));
            }
            let azure = vault
                .azure_key_vault
                .as_ref()
                .ok_or_else(|| invalid("vaultConfig.azureKeyVault is missing"))?;
            config.vault_type = &vault.type_;
            config.vault_lookup_key = &spec.github_config_secret;
            config.azure_key_vault = Some(json!({
                "tenant_id": azure.tenant_id,
                "client_id": azure.client_id,
                "url": azure.url,
                "certificate_path": azure.certificate_path,
            }));
        }
        (None, Some(GitHubCredentials::Token(token))) => {
            config.github_app_id = Some("");
            config.github_app_installation_id = Some(0);
            config.github_app_private_key = Some("");
            config.github_token = Some(token);
        }
        (
            None,
            Some(GitHubCredentials::App {
                app_id,
                installation_id,
                private_key,
            }),
        ) => {
            config.github_app_id = Some(app_id);
            config.github_app_installation_id = Some(*installation_id);
            config.github_app_private_key = Some(private_key);
            config.github_token = Some("");
        }
        (None, None) => return Err(invalid("no GitHub credentials")),
    }
    let mut text = serde_json::to_string(&config).map_err(|source| Error::Serialize {
        what: "listener config",
        source,
    })?;
    text.push('\n');
    Ok(text)
}

/// The port of a Go-style listen address (`:8080`, `0.0.0.0:8080`, `[::]:8080`).
pub fn metrics_port(addr: &str) -> Option<i32> {
    let (_, port) = addr.rsplit_once(':')?;
    port.parse::<u16>().ok().map(i32::from)
}

/// What the listener pod is built from besides the AutoscalingListener.
#[derive(Debug, Clone)]
pub struct PodInputs<'a> {
    /// Container command.
    pub entrypoint: &'a str,
    /// Container port of the metrics endpoint, when metrics are on.
    pub metrics_port: Option<i32>,
    /// Hash of everything the pod depends on (listener spec, config data, RBAC, metrics settings): a change
    /// recreates the pod.
    pub dependencies_hash: String,
}

/// The listener pod, the template merged in.
pub fn listener_pod(id: &ListenerIdentity<'_>, inputs: &PodInputs<'_>) -> Result<Pod> {
    let listener = id.listener;
    let name = id.name();
    let proxy_secret = crds::names::listener_proxy_secret_name(&name);
    let mut env = vec![
        json!({
            "name": CONFIG_PATH_ENV,
            "value": format!("{CONFIG_MOUNT_PATH}/{CONFIG_KEY}"),
        }),
        // Not in ARC: where the listener reports its state (plain values, no downward API: the listener must
        // not depend on the pod's own name matching the AutoscalingListener's).
        json!({"name": LISTENER_NAME_ENV, "value": name}),
        json!({"name": LISTENER_NAMESPACE_ENV, "value": id.namespace()}),
    ];
    if let Some(proxy) = &listener.spec.proxy {
        let from_secret = |key: &str| json!({"name": key, "valueFrom": {"secretKeyRef": {"name": proxy_secret, "key": key}}});
        if proxy.http.is_some() {
            env.push(from_secret(HTTP_PROXY_KEY));
        }
        if proxy.https.is_some() {
            env.push(from_secret(HTTPS_PROXY_KEY));
        }
        if !proxy.no_proxy.is_empty() {
            env.push(from_secret(NO_PROXY_KEY));
        }
    }
    let mut container = json!({
        "name": LISTENER_CONTAINER_NAME,
        "image": listener.spec.image,
        "command": [inputs.entrypoint],
        "env": env,
        "volumeMounts": [{"name": CONFIG_VOLUME, "mountPath": CONFIG_MOUNT_PATH, "readOnly": true}],
    });
    if let Some(port) = inputs.metrics_port {
        container["ports"] = json!([{"name": "metrics", "containerPort": port, "protocol": "TCP"}]);
    }
    let mut spec = json!({
        "serviceAccountName": name,
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_PERIOD_SECONDS,
        "containers": [container],
        "volumes": [{"name": CONFIG_VOLUME, "secret": {"secretName": crds::names::listener_config_secret_name(&name)}}],
    });
    if !listener.spec.image_pull_secrets.is_empty() {
        spec["imagePullSecrets"] = json!(listener.spec.image_pull_secrets);
    }
    let mut labels = listener.labels().clone();
    let mut annotations = BTreeMap::from([(
        INTEGRITY_HASH_ANNOTATION.to_owned(),
        inputs.dependencies_hash.clone(),
    )]);
    if let Some(template) = &listener.spec.template {
        let template_spec = template.spec.as_ref().map(to_value).transpose()?;
        if let Some(template_spec) = template_spec {
            merge_pod_spec(&mut spec, &template_spec);
        }
        if let Some(meta) = &template.metadata {
            // The controller's own labels and annotations win.
            for (key, value) in meta.labels.iter().flatten() {
                labels.entry(key.clone()).or_insert_with(|| value.clone());
            }
            for (key, value) in meta.annotations.iter().flatten() {
                annotations
                    .entry(key.clone())
                    .or_insert_with(|| value.clone());
            }
        }
    }
    harden_unless_configured(&mut spec);
    let spec: PodSpec = serde_json::from_value(spec).map_err(|source| Error::Serialize {
        what: "listener pod spec",
        source,
    })?;
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(id.namespace()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![id.owner.clone()]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// Gives the listener container [`listener_security_context`] unless the merged spec already has a security
/// context for it: one on the listener container, or a pod-level one (whose `runAsUser` and the like a
/// container-level default would otherwise silently override).
fn harden_unless_configured(spec: &mut Value) {
    let configured = |value: Option<&Value>| value.is_some_and(|v| !v.is_null());
    if configured(spec.get("securityContext")) {
        return;
    }
    let Some(listener) = spec["containers"]
        .as_array_mut()
        .and_then(|containers| containers.first_mut())
    else {
        return;
    };
    if !configured(listener.get("securityContext")) {
        listener["securityContext"] = listener_security_context();
    }
}

fn to_value<T: Serialize>(value: &T) -> Result<Value> {
    serde_json::to_value(value).map_err(|source| Error::Serialize {
        what: "listener template",
        source,
    })
}

/// Pod fields never taken from the template: the controller decides the identity of the listener.
const IGNORED_POD_FIELDS: [&str; 6] = [
    "serviceAccountName",
    "serviceAccount",
    "automountServiceAccountToken",
    "resources",
    "hostnameOverride",
    "schedulingGroup",
];
/// Container list fields the template appends to.
const APPENDED_CONTAINER_FIELDS: [&str; 6] = [
    "env",
    "args",
    "ports",
    "envFrom",
    "volumeMounts",
    "volumeDevices",
];

/// Merges a template pod spec into the desired one: listener container merged, other containers and volumes
/// appended, every other field the template sets replaces the default; fields it leaves unset keep it.
fn merge_pod_spec(spec: &mut Value, template: &Value) {
    let Some(template) = template.as_object() else {
        return;
    };
    for (key, value) in template {
        if IGNORED_POD_FIELDS.contains(&key.as_str()) || value.is_null() {
            continue;
        }
        match key.as_str() {
            "containers" => {
                for container in value.as_array().into_iter().flatten() {
                    let is_listener = container.get("name").and_then(Value::as_str)
                        == Some(LISTENER_CONTAINER_NAME);
                    let containers = &mut spec["containers"];
                    if is_listener {
                        if let Some(own) =
                            containers.as_array_mut().and_then(|list| list.first_mut())
                        {
                            merge_container(own, container);
                        }
                    } else if let Some(list) = containers.as_array_mut() {
                        list.push(container.clone());
                    }
                }
            }
            "volumes" => append(&mut spec["volumes"], value),
            _ => spec[key.as_str()] = value.clone(),
        }
    }
}

fn merge_container(own: &mut Value, template: &Value) {
    let Some(template) = template.as_object() else {
        return;
    };
    for (key, value) in template {
        match key.as_str() {
            "name" | "restartPolicyRules" => {}
            "image" | "command" => {
                let empty = value.is_null()
                    || value.as_str() == Some("")
                    || value.as_array().is_some_and(Vec::is_empty);
                if !empty {
                    own[key.as_str()] = value.clone();
                }
            }
            field if APPENDED_CONTAINER_FIELDS.contains(&field) => append(&mut own[field], value),
            _ if value.is_null() => {}
            _ => own[key.as_str()] = value.clone(),
        }
    }
}

fn append(target: &mut Value, items: &Value) {
    let Some(items) = items.as_array() else {
        return;
    };
    match target.as_array_mut() {
        Some(list) => list.extend(items.iter().cloned()),
        None => *target = Value::Array(items.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::AutoscalingListenerSpec;
    use crds::common::ProxyConfig;
    use k8s_openapi::api::core::v1::PodTemplateSpec;
    use pretty_assertions::assert_eq;

    fn listener() -> AutoscalingListener {
        let mut listener = AutoscalingListener::new(
            "set-7f984dc6-listener",
            AutoscalingListenerSpec {
                github_config_url: "https://github.com/org/repo".to_owned(),
                github_config_secret: "creds".to_owned(),
                runner_scale_set_id: 7,
                autoscaling_runner_set_namespace: "runners".to_owned(),
                autoscaling_runner_set_name: "set".to_owned(),
                ephemeral_runner_set_name: "set".to_owned(),
                max_runners: 5,
                min_runners: 1,
                image: "ghcr.io/example/arc:1".to_owned(),
                ..AutoscalingListenerSpec::default()
            },
        );
        listener.metadata.namespace = Some("arc-system".to_owned());
        listener.metadata.labels = Some(BTreeMap::from([
            (
                "app.kubernetes.io/component".to_owned(),
                "runner-scale-set-listener".to_owned(),
            ),
            ("internal.example/x".to_owned(), "1".to_owned()),
        ]));
        listener
    }

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "actions.github.com/v1alpha1".to_owned(),
            kind: "AutoscalingListener".to_owned(),
            name: "set-7f984dc6-listener".to_owned(),
            uid: "uid-1".to_owned(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn identity<'a>(
        listener: &'a AutoscalingListener,
        excluded: &'a [String],
    ) -> ListenerIdentity<'a> {
        ListenerIdentity {
            listener,
            owner: owner(),
            excluded_prefixes: excluded,
        }
    }

    fn inputs() -> PodInputs<'static> {
        PodInputs {
            entrypoint: "/ghalistener",
            metrics_port: Some(8080),
            dependencies_hash: "hash".to_owned(),
        }
    }

    #[test]
    fn role_is_least_privilege() {
        let listener = listener();
        let role = role(&identity(&listener, &[])).unwrap();
        let rules = serde_json::to_value(role.rules.unwrap()).unwrap();
        assert_eq!(
            rules,
            json!([
                {"apiGroups": ["actions.github.com"], "resources": ["ephemeralrunnersets"], "resourceNames": ["set"], "verbs": ["patch"]},
                {"apiGroups": ["actions.github.com"], "resources": ["ephemeralrunners/status"], "verbs": ["patch"]},
            ])
        );
        assert_eq!(role.metadata.namespace.as_deref(), Some("runners"));
        let labels = role.metadata.labels.unwrap();
        assert_eq!(labels[LISTENER_NAME_LABEL], "set-7f984dc6-listener");
        assert_eq!(labels[LISTENER_NAMESPACE_LABEL], "arc-system");
        assert_eq!(labels[SCALE_SET_NAME_LABEL], "set");
    }

    #[test]
    fn the_status_role_lets_the_listener_patch_only_its_own_status() {
        let listener = listener();
        let id = identity(&listener, &[]);
        let role = status_role(&id).unwrap();
        assert_eq!(
            serde_json::to_value(role.rules.unwrap()).unwrap(),
            json!([{
                "apiGroups": ["actions.github.com"],
                "resources": ["autoscalinglisteners/status"],
                "resourceNames": ["set-7f984dc6-listener"],
                "verbs": ["patch"],
            }])
        );
        // Next to the listener, owned by it, under a name that cannot collide with the scale-set Role.
        assert_eq!(role.metadata.namespace.as_deref(), Some("arc-system"));
        assert_eq!(
            role.metadata.name.as_deref(),
            Some("set-7f984dc6-listener-status")
        );
        assert_eq!(
            role.metadata.owner_references.unwrap()[0].kind,
            "AutoscalingListener"
        );
        let labels = role.metadata.labels.unwrap();
        assert_eq!(labels[LISTENER_NAME_LABEL], "set-7f984dc6-listener");
        let binding = status_role_binding(&id).unwrap();
        assert_eq!(binding.role_ref.name, "set-7f984dc6-listener-status");
        assert_eq!(binding.metadata.namespace.as_deref(), Some("arc-system"));
        let subject = &binding.subjects.unwrap()[0];
        assert_eq!(subject.name, "set-7f984dc6-listener");
        assert_eq!(subject.namespace.as_deref(), Some("arc-system"));
    }

    #[test]
    fn role_binding_binds_the_service_account() {
        let listener = listener();
        let binding = role_binding(&identity(&listener, &[])).unwrap();
        assert_eq!(binding.role_ref.name, "set-7f984dc6-listener");
        assert_eq!(
            binding.role_ref.api_group.as_deref(),
            Some("rbac.authorization.k8s.io")
        );
        let subject = &binding.subjects.unwrap()[0];
        assert_eq!(subject.kind, "ServiceAccount");
        assert_eq!(subject.namespace.as_deref(), Some("arc-system"));
        assert!(binding.metadata.owner_references.is_none());
    }

    #[test]
    fn excluded_label_prefixes_do_not_reach_the_service_account() {
        let listener = listener();
        let excluded = ["internal.example/".to_owned()];
        let account = service_account(&identity(&listener, &excluded)).unwrap();
        let labels = account.metadata.labels.unwrap();
        assert!(!labels.contains_key("internal.example/x"));
        assert_eq!(labels[SCALE_SET_NAMESPACE_LABEL], "runners");
        assert!(
            account
                .metadata
                .annotations
                .unwrap()
                .contains_key(INTEGRITY_HASH_ANNOTATION)
        );
    }

    #[test]
    fn config_json_has_arc_keys_in_order() {
        let listener = listener();
        let settings = ConfigSettings {
            log_level: "info",
            log_format: "json",
            metrics_addr: ":8080",
            metrics_endpoint: "/metrics",
            health_addr: ":8080",
        };
        let text = listener_config(
            &listener,
            Some(&GitHubCredentials::Token("ghp_x".to_owned())),
            "",
            &settings,
        )
        .unwrap();
        assert!(text.ends_with("}\n"));
        assert_eq!(
            text.trim_end(),
            r#"{"configure_url":"https://github.com/org/repo","vault_type":"","vault_lookup_key":"","github_app_id":"","github_app_installation_id":0,"github_app_private_key":"","github_token":"ghp_x","ephemeral_runner_set_namespace":"runners","ephemeral_runner_set_name":"set","max_runners":5,"min_runners":1,"runner_scale_set_id":7,"runner_scale_set_name":"set","server_root_ca":"","log_level":"info","log_format":"json","metrics_addr":":8080","metrics_endpoint":"/metrics","metrics":null,"health_addr":":8080"}"#
        );
    }

    #[test]
    fn the_health_endpoint_stays_where_the_probe_asks_whatever_the_metrics_address() {
        let settings = ConfigSettings {
            metrics_addr: ":9090",
            metrics_endpoint: "/metrics",
            health_addr: crds::constants::LISTENER_HEALTH_ADDR,
            ..ConfigSettings::default()
        };
        let text = listener_config(
            &listener(),
            Some(&GitHubCredentials::Token("t".to_owned())),
            "",
            &settings,
        )
        .unwrap();
        let config: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(config["metrics_addr"], ":9090");
        assert_eq!(config["health_addr"], crds::constants::LISTENER_HEALTH_ADDR);
    }

    #[test]
    fn config_validation() {
        let settings = ConfigSettings::default();
        let token = GitHubCredentials::Token("t".to_owned());
        let mut bad = listener();
        bad.spec.runner_scale_set_id = 0;
        assert!(listener_config(&bad, Some(&token), "", &settings).is_err());
        let mut bad = listener();
        bad.spec.min_runners = 9;
        assert!(listener_config(&bad, Some(&token), "", &settings).is_err());
        assert!(listener_config(&listener(), None, "", &settings).is_err());
        let app = GitHubCredentials::App {
            app_id: "12".to_owned(),
            installation_id: 34,
            private_key: "pem".to_owned(),
        };
        let text = listener_config(&listener(), Some(&app), "", &settings).unwrap();
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["github_app_installation_id"], 34);
        assert_eq!(value["github_token"], "");
    }

    #[test]
    fn schedules_and_delay_reach_the_config_and_are_checked() {
        let settings = ConfigSettings::default();
        let token = GitHubCredentials::Token("t".to_owned());
        let mut scheduled = listener();
        scheduled.spec.min_runners_schedules = vec![MinRunnersSchedule {
            name: "office".to_owned(),
            min_runners: 3,
            start: "09:00".to_owned(),
            end: "17:00".to_owned(),
            time_zone: "Europe/Berlin".to_owned(),
            ..MinRunnersSchedule::default()
        }];
        scheduled.spec.scale_down_delay_seconds = 120;
        let text = listener_config(&scheduled, Some(&token), "", &settings).unwrap();
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            value["min_runners_schedules"],
            json!([{"name": "office", "minRunners": 3, "start": "09:00", "end": "17:00", "timeZone": "Europe/Berlin"}])
        );
        assert_eq!(value["scale_down_delay_seconds"], 120);
        // A window above maxRunners (5), or an unknown zone, is refused with the schedule named.
        let mut bad = scheduled.clone();
        bad.spec.min_runners_schedules[0].min_runners = 6;
        let error = listener_config(&bad, Some(&token), "", &settings).unwrap_err();
        assert!(
            error.to_string().contains("\"office\": minRunners (6)"),
            "{error}"
        );
        let mut bad = scheduled;
        bad.spec.min_runners_schedules[0].time_zone = "Nowhere/Else".to_owned();
        let error = listener_config(&bad, Some(&token), "", &settings).unwrap_err();
        assert!(error.to_string().contains("Nowhere/Else"), "{error}");
    }

    #[test]
    fn metrics_ports() {
        assert_eq!(metrics_port(":8080"), Some(8080));
        assert_eq!(metrics_port("0.0.0.0:9090"), Some(9090));
        assert_eq!(metrics_port("[::]:1"), Some(1));
        assert_eq!(metrics_port("nope"), None);
    }

    #[test]
    fn default_pod() {
        let mut listener = listener();
        listener.spec.proxy = Some(ProxyConfig {
            http: Some(crds::common::ProxyServerConfig {
                url: "http://proxy:3128".to_owned(),
                ..Default::default()
            }),
            https: None,
            no_proxy: vec!["example.com".to_owned()],
        });
        let pod = listener_pod(&identity(&listener, &[]), &inputs()).unwrap();
        let spec = pod.spec.unwrap();
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some("set-7f984dc6-listener")
        );
        assert_eq!(spec.termination_grace_period_seconds, Some(60));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let container = &spec.containers[0];
        assert_eq!(container.command, Some(vec!["/ghalistener".to_owned()]));
        let env: Vec<_> = container
            .env
            .iter()
            .flatten()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(
            env,
            [
                "LISTENER_CONFIG_PATH",
                "AUTOSCALING_LISTENER_NAME",
                "AUTOSCALING_LISTENER_NAMESPACE",
                "http_proxy",
                "no_proxy"
            ]
        );
        let value = |name: &str| {
            container
                .env
                .iter()
                .flatten()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(
            value("AUTOSCALING_LISTENER_NAME").as_deref(),
            Some("set-7f984dc6-listener")
        );
        assert_eq!(
            value("AUTOSCALING_LISTENER_NAMESPACE").as_deref(),
            Some("arc-system")
        );
        assert_eq!(container.ports.as_ref().unwrap()[0].container_port, 8080);
        assert_eq!(
            spec.volumes.unwrap()[0]
                .secret
                .as_ref()
                .unwrap()
                .secret_name
                .as_deref(),
            Some("set-7f984dc6-listener-config")
        );
        assert_eq!(
            pod.metadata.annotations.unwrap()[INTEGRITY_HASH_ANNOTATION],
            "hash"
        );
        assert_eq!(
            pod.metadata.labels.unwrap()["app.kubernetes.io/component"],
            "runner-scale-set-listener"
        );
    }

    #[test]
    fn a_template_with_only_a_probe_keeps_every_default() {
        let mut listener = listener();
        listener.spec.template = Some(
            serde_json::from_value::<PodTemplateSpec>(json!({
                "metadata": {"labels": {"team": "ci", "app.kubernetes.io/component": "mine"}},
                "spec": {"containers": [{
                    "name": "listener",
                    "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
                }]},
            }))
            .unwrap(),
        );
        let pod = listener_pod(&identity(&listener, &[]), &inputs()).unwrap();
        let labels = pod.metadata.labels.unwrap();
        assert_eq!(labels["team"], "ci");
        assert_eq!(
            labels["app.kubernetes.io/component"],
            "runner-scale-set-listener"
        );
        let spec = pod.spec.unwrap();
        assert_eq!(spec.termination_grace_period_seconds, Some(60));
        assert_eq!(spec.node_selector.unwrap()["kubernetes.io/os"], "linux");
        let container = &spec.containers[0];
        assert_eq!(container.image.as_deref(), Some("ghcr.io/example/arc:1"));
        assert_eq!(container.command, Some(vec!["/ghalistener".to_owned()]));
        assert_eq!(
            container
                .liveness_probe
                .as_ref()
                .and_then(|p| p.http_get.as_ref())
                .and_then(|h| h.path.as_deref()),
            Some("/healthz")
        );
    }

    #[test]
    fn template_fields_replace_append_or_are_ignored() {
        let mut listener = listener();
        listener.spec.template = Some(
            serde_json::from_value::<PodTemplateSpec>(json!({
                "spec": {
                    "serviceAccountName": "someone-else",
                    "terminationGracePeriodSeconds": 5,
                    "nodeSelector": {},
                    "containers": [
                        {"name": "listener", "image": "custom:1", "command": [], "env": [{"name": "EXTRA", "value": "1"}]},
                        {"name": "sidecar", "image": "busybox"},
                    ],
                    "volumes": [{"name": "extra", "emptyDir": {}}],
                },
            }))
            .unwrap(),
        );
        let spec = listener_pod(&identity(&listener, &[]), &inputs())
            .unwrap()
            .spec
            .unwrap();
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some("set-7f984dc6-listener")
        );
        assert_eq!(spec.termination_grace_period_seconds, Some(5));
        assert_eq!(spec.node_selector, Some(BTreeMap::new()));
        assert_eq!(spec.containers.len(), 2);
        let container = &spec.containers[0];
        assert_eq!(container.image.as_deref(), Some("custom:1"));
        assert_eq!(container.command, Some(vec!["/ghalistener".to_owned()]));
        let env: Vec<_> = container
            .env
            .iter()
            .flatten()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(
            env,
            [
                "LISTENER_CONFIG_PATH",
                "AUTOSCALING_LISTENER_NAME",
                "AUTOSCALING_LISTENER_NAMESPACE",
                "EXTRA"
            ]
        );
        assert_eq!(spec.volumes.unwrap().len(), 2);
    }

    fn listener_container(listener: &AutoscalingListener) -> Value {
        let pod = listener_pod(&identity(listener, &[]), &inputs()).unwrap();
        serde_json::to_value(&pod.spec.unwrap().containers[0]).unwrap()
    }

    #[test]
    fn the_listener_runs_hardened_by_default() {
        let pod = listener_pod(&identity(&listener(), &[]), &inputs()).unwrap();
        let spec = serde_json::to_value(pod.spec.unwrap()).unwrap();
        assert_eq!(
            spec["containers"][0]["securityContext"],
            json!({
                "runAsNonRoot": true,
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "readOnlyRootFilesystem": true,
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            })
        );
        // Container level only: nothing is imposed on sidecars through the pod.
        assert_eq!(spec.get("securityContext"), None);
        // A template that sets something else (the chart's liveness probe) keeps the default.
        let mut with_probe = listener();
        with_probe.spec.template = Some(
            serde_json::from_value::<PodTemplateSpec>(json!({
                "spec": {"containers": [
                    {"name": "listener", "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}}},
                    {"name": "sidecar", "image": "busybox"},
                ]},
            }))
            .unwrap(),
        );
        let pod = listener_pod(&identity(&with_probe, &[]), &inputs()).unwrap();
        let containers = pod.spec.unwrap().containers;
        assert_eq!(
            serde_json::to_value(&containers[0].security_context).unwrap(),
            listener_security_context()
        );
        assert_eq!(containers[1].name, "sidecar");
        assert!(
            containers[1].security_context.is_none(),
            "sidecars are left alone"
        );
    }

    #[test]
    fn a_listener_security_context_in_the_template_replaces_the_default() {
        let mut custom = listener();
        custom.spec.template = Some(
            serde_json::from_value::<PodTemplateSpec>(json!({
                "spec": {"containers": [{"name": "listener", "securityContext": {"runAsUser": 1000}}]},
            }))
            .unwrap(),
        );
        assert_eq!(
            listener_container(&custom)["securityContext"],
            json!({"runAsUser": 1000}),
            "replaced as a whole, as ARC merges the listener container"
        );
        // An empty one is how a template opts out of the default entirely.
        let mut empty = listener();
        empty.spec.template = Some(
            serde_json::from_value::<PodTemplateSpec>(json!({
                "spec": {"containers": [{"name": "listener", "securityContext": {}}]},
            }))
            .unwrap(),
        );
        assert_eq!(listener_container(&empty)["securityContext"], json!({}));
    }

    #[test]
    fn a_pod_security_context_in_the_template_replaces_the_default() {
        let mut custom = listener();
        custom.spec.template = Some(
            serde_json::from_value::<PodTemplateSpec>(json!({
                "spec": {"securityContext": {"runAsUser": 1000, "fsGroup": 1000}},
            }))
            .unwrap(),
        );
        let pod = listener_pod(&identity(&custom, &[]), &inputs()).unwrap();
        let spec = pod.spec.unwrap();
        assert_eq!(
            serde_json::to_value(&spec.security_context).unwrap(),
            json!({"runAsUser": 1000, "fsGroup": 1000})
        );
        // A container-level runAsUser would silently win over the user's pod-level one.
        assert!(spec.containers[0].security_context.is_none());
    }
}
