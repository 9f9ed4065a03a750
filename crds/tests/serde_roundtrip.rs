//! JSON round trips with realistic objects, and the `omitempty` behaviour the listener and the controllers rely
//! on when they exchange merge patches.

// The realistic objects are large `json!` literals.
#![recursion_limit = "256"]

use std::collections::BTreeMap;

use crds::common::{ProxyConfig, ProxyServerConfig, ResourceMeta};
use crds::{
    AutoscalingListener, AutoscalingListenerSpec, AutoscalingRunnerSet, AutoscalingRunnerSetStatus,
    EphemeralRunner, EphemeralRunnerSet, EphemeralRunnerSetSpec, EphemeralRunnerSetStatus,
    EphemeralRunnerSpec, EphemeralRunnerStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

/// Deserialises `value` as `T`, serialises it back and checks nothing was lost or added.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(value: &Value) -> T {
    let typed: T = serde_json::from_value(value.clone()).expect("deserialises");
    assert_eq!(&serde_json::to_value(&typed).expect("serialises"), value);
    typed
}

fn full_autoscaling_runner_set() -> Value {
    json!({
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "AutoscalingRunnerSet",
        "metadata": {
            "name": "arc-runner-set",
            "namespace": "arc-runners",
            "labels": {"app.kubernetes.io/version": "0.14.2"},
            "annotations": {"actions.github.com/cleanup-github-secret-name": "arc-runner-set-gha-rs-github-secret"},
        },
        "spec": {
            "githubConfigUrl": "https://github.com/org/repo",
            "githubConfigSecret": "arc-runner-set-gha-rs-github-secret",
            "runnerGroup": "linux",
            "runnerScaleSetName": "arc",
            "runnerScaleSetLabels": ["linux", "x64"],
            "minRunners": 1,
            "maxRunners": 10,
            "proxy": {
                "http": {"url": "http://proxy:3128", "credentialSecretRef": "proxy-creds"},
                "https": {"url": "http://proxy:3129"},
                "noProxy": ["example.com", "10.0.0.0/8"],
            },
            "githubServerTLS": {
                "certificateFrom": {"configMapKeyRef": {"name": "ca-bundle", "key": "ca.crt"}},
            },
            "vaultConfig": {
                "type": "azure_key_vault",
                "azureKeyVault": {
                    "url": "https://vault.vault.azure.net",
                    "tenantId": "tenant",
                    "clientId": "client",
                    "certificatePath": "/etc/vault/cert.pem",
                },
                "proxy": {"https": {"url": "http://vault-proxy:3128"}},
            },
            "listenerMetrics": {
                "counters": {"gha_started_jobs_total": {"labels": ["repository", "organization"]}},
                "gauges": {"gha_min_runners": {"labels": []}},
                "histograms": {"gha_job_startup_duration_seconds": {"labels": ["job_name"], "buckets": [0.5, 1.0, 30.0]}},
            },
            "autoscalingListener": {"labels": {"team": "ci"}, "annotations": {"note": "listener"}},
            "listenerServiceAccountMetadata": {"labels": {"sa": "x"}},
            "listenerRoleMetadata": {"annotations": {"role": "x"}},
            "listenerRoleBindingMetadata": {"annotations": {"rb": "x"}},
            "listenerConfigSecretMetadata": {"labels": {"secret": "x"}},
            "ephemeralRunnerSetMetadata": {"labels": {"ers": "x"}},
            "ephemeralRunnerMetadata": {"annotations": {"er": "x"}},
            "ephemeralRunnerConfigSecretMetadata": {"labels": {"jit": "x"}},
            "listenerTemplate": {
                "spec": {
                    "containers": [{"name": "listener", "resources": {"limits": {"memory": "128Mi"}}}],
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                },
            },
            "template": {
                "metadata": {"labels": {"app": "runner"}, "annotations": {"team": "ci"}},
                "spec": {
                    "serviceAccountName": "runner",
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "runner",
                        "image": "ghcr.io/actions/actions-runner:latest",
                        "command": ["/home/runner/run.sh"],
                        "env": [
                            {"name": "ACTIONS_RUNNER_CONTAINER_HOOKS", "value": "/home/runner/k8s/index.js"},
                            {"name": "ACTIONS_RUNNER_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        ],
                        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
                        "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                        "volumeMounts": [{"name": "work", "mountPath": "/home/runner/_work"}],
                        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}},
                    }],
                    "volumes": [{
                        "name": "work",
                        "ephemeral": {"volumeClaimTemplate": {"spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "storageClassName": "local-path",
                            "resources": {"requests": {"storage": "1Gi"}},
                        }}},
                    }],
                    "imagePullSecrets": [{"name": "regcred"}],
                },
            },
        },
        "status": {
            "currentRunners": 3,
            "phase": "Running",
            "pendingEphemeralRunners": 1,
            "runningEphemeralRunners": 2,
            "failedEphemeralRunners": 0,
        },
    })
}

#[test]
fn autoscaling_runner_set_round_trips_with_every_field() {
    let ars: AutoscalingRunnerSet = round_trip(&full_autoscaling_runner_set());
    let spec = &ars.spec;
    assert_eq!(spec.effective_min_runners(), 1);
    assert_eq!(spec.effective_max_runners(), 10);
    assert_eq!(spec.scale_set_name("arc-runner-set"), "arc");
    assert_eq!(
        spec.proxy.as_ref().and_then(|p| p.http.clone()),
        Some(ProxyServerConfig {
            url: "http://proxy:3128".to_owned(),
            credential_secret_ref: "proxy-creds".to_owned(),
        })
    );
    let vault = spec.vault_config.as_ref().expect("vault");
    assert_eq!(vault.type_, crds::common::VAULT_TYPE_AZURE_KEY_VAULT);
    let metrics = spec.listener_metrics.as_ref().expect("metrics");
    assert_eq!(
        metrics.histograms["gha_job_startup_duration_seconds"].buckets,
        [0.5, 1.0, 30.0]
    );
    let runner = &spec.template.spec.as_ref().expect("pod spec").containers[0];
    assert_eq!(runner.name, "runner");
    assert_eq!(
        ars.status.as_ref().map(|s| s.phase.as_str()),
        Some("Running")
    );
}

#[test]
fn autoscaling_runner_set_defaults() {
    let ars: AutoscalingRunnerSet = serde_json::from_value(json!({
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "AutoscalingRunnerSet",
        "metadata": {"name": "set"},
        "spec": {"githubConfigUrl": "https://github.com/org", "githubConfigSecret": "s"},
    }))
    .expect("deserialises");
    assert_eq!(ars.spec.effective_min_runners(), 0);
    assert_eq!(ars.spec.effective_max_runners(), 2_147_483_647);
    assert_eq!(ars.spec.scale_set_name("set"), "set");
    assert!(ars.spec.listener_template.is_none());
    // An explicit zero is kept: minRunners and maxRunners are pointers in ARC.
    let spec = serde_json::to_value(crds::AutoscalingRunnerSetSpec {
        min_runners: Some(0),
        max_runners: Some(0),
        ..Default::default()
    })
    .expect("serialises");
    assert_eq!(
        spec,
        json!({"minRunners": 0, "maxRunners": 0, "template": {}})
    );
}

#[test]
fn autoscaling_runner_set_status_serialises_zero_values() {
    let status = serde_json::to_value(AutoscalingRunnerSetStatus::default()).expect("serialises");
    assert_eq!(
        status,
        json!({
            "currentRunners": 0,
            "phase": "",
            "pendingEphemeralRunners": 0,
            "runningEphemeralRunners": 0,
            "failedEphemeralRunners": 0,
        })
    );
}

#[test]
fn autoscaling_listener_omits_zero_min_runners_and_empty_fields() {
    let spec = AutoscalingListenerSpec {
        github_config_url: "https://github.com/org".to_owned(),
        github_config_secret: "secret".to_owned(),
        runner_scale_set_id: 7,
        autoscaling_runner_set_namespace: "arc-runners".to_owned(),
        autoscaling_runner_set_name: "set".to_owned(),
        ephemeral_runner_set_name: "set".to_owned(),
        max_runners: 5,
        min_runners: 0,
        image: "ghcr.io/actions/gha-runner-scale-set-controller:0.14.2".to_owned(),
        ..Default::default()
    };
    let value = serde_json::to_value(&spec).expect("serialises");
    assert_eq!(
        value,
        json!({
            "githubConfigUrl": "https://github.com/org",
            "githubConfigSecret": "secret",
            "runnerScaleSetId": 7,
            "autoscalingRunnerSetNamespace": "arc-runners",
            "autoscalingRunnerSetName": "set",
            "ephemeralRunnerSetName": "set",
            "maxRunners": 5,
            "image": "ghcr.io/actions/gha-runner-scale-set-controller:0.14.2",
        })
    );
    let listener: AutoscalingListener = round_trip(&json!({
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "AutoscalingListener",
        "metadata": {"name": "set-7f984dc6-listener", "namespace": "arc-systems"},
        "spec": {
            "githubConfigUrl": "https://github.com/org",
            "runnerScaleSetId": 7,
            "minRunners": 2,
            "imagePullSecrets": [{"name": "regcred"}],
            "metrics": {"gauges": {"gha_desired_runners": {"labels": ["name"]}}},
            "template": {"spec": {"containers": [{"name": "listener"}]}},
            "configSecretMetadata": {"labels": {"a": "b"}},
            "serviceAccountMetadata": {"annotations": {"c": "d"}},
            "roleMetadata": {"labels": {"e": "f"}},
            "roleBindingMetadata": {"labels": {"g": "h"}},
        },
        "status": {},
    }));
    assert_eq!(listener.spec.min_runners, 2);
    assert_eq!(listener.spec.image_pull_secrets[0].name, "regcred");
}

#[test]
fn ephemeral_runner_set_replicas_absent_means_zero_and_patch_id_is_always_written() {
    let ers: EphemeralRunnerSet = serde_json::from_value(json!({
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "EphemeralRunnerSet",
        "metadata": {"name": "set", "namespace": "arc-runners"},
        "spec": {
            "patchID": 3,
            "ephemeralRunnerSpec": {
                "githubConfigUrl": "https://github.com/org",
                "githubConfigSecret": "secret",
                "runnerScaleSetId": 7,
                "spec": {"containers": [{"name": "runner"}]},
            },
        },
    }))
    .expect("deserialises");
    assert_eq!(ers.spec.replicas, 0);
    assert_eq!(ers.spec.patch_id, 3);

    let spec = EphemeralRunnerSetSpec::default();
    let value = serde_json::to_value(&spec).expect("serialises");
    assert_eq!(value["patchID"], json!(0));
    assert!(
        value.get("replicas").is_none(),
        "replicas 0 is omitted: {value}"
    );
    let value = serde_json::to_value(EphemeralRunnerSetSpec {
        replicas: 4,
        ..spec
    })
    .expect("serialises");
    assert_eq!(value["replicas"], json!(4));

    // Status fields are always written, zeros included.
    let status = serde_json::to_value(EphemeralRunnerSetStatus::default()).expect("serialises");
    assert_eq!(
        status,
        json!({
            "currentReplicas": 0,
            "pendingEphemeralRunners": 0,
            "runningEphemeralRunners": 0,
            "failedEphemeralRunners": 0,
            "phase": "",
        })
    );
    // Without patchID the spec is invalid (the schema requires it), so deserialising fails precisely.
    let err = serde_json::from_value::<EphemeralRunnerSetSpec>(json!({"replicas": 1})).unwrap_err();
    assert!(err.to_string().contains("patchID"), "{err}");
}

fn runner_with_status() -> Value {
    json!({
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "EphemeralRunner",
        "metadata": {"name": "set-runner-x7k2p", "namespace": "arc-runners", "finalizers": [
            "ephemeralrunner.actions.github.com/finalizer",
            "ephemeralrunner.actions.github.com/runner-registration-finalizer",
        ]},
        "spec": {
            "githubConfigUrl": "https://github.com/org/repo",
            "githubConfigSecret": "secret",
            "runnerScaleSetId": 7,
            "proxy": {"https": {"url": "http://proxy:3128", "credentialSecretRef": "creds"}},
            "proxySecretRef": "set-754b578d-runner-proxy",
            "ephemeralRunnerConfigSecretMetadata": {"labels": {"jit": "yes"}},
            "metadata": {"labels": {"app": "runner"}},
            "spec": {"containers": [{"name": "runner", "image": "runner:latest"}], "restartPolicy": "Never"},
        },
        "status": {
            "ready": true,
            "phase": "Running",
            "reason": "Started",
            "message": "pod started",
            "runnerId": 42,
            "runnerName": "set-runner-x7k2p",
            "failures": {
                "5b1e0f0a-0000-4000-8000-000000000001": "2025-01-02T03:04:05Z",
                "5b1e0f0a-0000-4000-8000-000000000002": "2025-01-02T03:09:00Z",
            },
            "jobRequestId": 9_007_199_254_740_000_i64,
            "jobId": "a1b2c3",
            "jobRepositoryName": "org/repo",
            "jobWorkflowRef": "org/repo/.github/workflows/ci.yaml@refs/heads/main",
            "workflowRunId": 123_456_789_012_i64,
            "jobDisplayName": "build (ubuntu)",
        },
    })
}

#[test]
fn ephemeral_runner_round_trips_with_failures_and_job_fields() {
    let runner: EphemeralRunner = round_trip(&runner_with_status());
    let status = runner.status.as_ref().expect("status");
    assert_eq!(status.failures.len(), 2);
    assert_eq!(status.job_request_id, 9_007_199_254_740_000);
    assert!(runner.has_job());
    assert!(!runner.is_done());
    let latest: Timestamp = "2025-01-02T03:09:00Z".parse().expect("timestamp");
    assert_eq!(runner.last_failure(), Some(&Time(latest)));
    assert_eq!(
        runner.spec.pod_template().spec.expect("spec").containers[0].name,
        "runner"
    );
}

#[test]
fn ephemeral_runner_omits_zero_scale_set_id_and_empty_status_fields() {
    let spec = EphemeralRunnerSpec {
        github_config_url: "https://github.com/org".to_owned(),
        github_config_secret: "secret".to_owned(),
        runner_scale_set_id: 0,
        ..Default::default()
    };
    let value = serde_json::to_value(&spec).expect("serialises");
    assert_eq!(
        value,
        json!({
            "githubConfigUrl": "https://github.com/org",
            "githubConfigSecret": "secret",
            "spec": {"containers": []},
        })
    );
    // Only `ready` is written for an empty status (it is not omitempty in ARC).
    assert_eq!(
        serde_json::to_value(EphemeralRunnerStatus::default()).expect("serialises"),
        json!({"ready": false})
    );
    // The listener's job patch is a valid status on its own.
    let patch: EphemeralRunnerStatus = serde_json::from_value(json!({
        "jobRequestId": 1, "jobRepositoryName": "o/r", "jobId": "j", "workflowRunId": 2,
        "jobWorkflowRef": "ref", "jobDisplayName": "job",
    }))
    .expect("deserialises");
    assert!(patch.has_job() && !patch.ready);
}

#[test]
fn failure_times_are_written_with_second_precision() {
    let at: Timestamp = "2025-01-02T03:04:05.678Z".parse().expect("timestamp");
    let status = EphemeralRunnerStatus {
        failures: BTreeMap::from([("uid".to_owned(), Time(at))]),
        ..Default::default()
    };
    let value = serde_json::to_value(&status).expect("serialises");
    assert_eq!(value["failures"]["uid"], json!("2025-01-02T03:04:05Z"));
}

#[test]
fn resource_meta_and_proxy_omit_empty_fields() {
    assert_eq!(
        serde_json::to_value(ResourceMeta::default()).expect("serialises"),
        json!({})
    );
    assert_eq!(
        serde_json::to_value(ProxyConfig::default()).expect("serialises"),
        json!({})
    );
    let meta: ResourceMeta =
        serde_json::from_value(json!({"labels": {"a": "b"}})).expect("deserialises");
    assert!(meta.annotations.is_empty());
}
