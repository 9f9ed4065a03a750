//! The generated CRDs against the real API server: they install by server-side apply, realistic objects of each
//! kind round-trip unchanged, the status subresource is separate, wrong types are rejected, the printer columns
//! reach the Table API, and owner references between the kinds drive garbage collection.

use std::time::Duration;

use crds::{AutoscalingListener, AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::discovery::ApiResource;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use test_harness::TestContext;

async fn context(prefix: &str) -> TestContext {
    let ctx = TestContext::new(prefix).await;
    test_harness::apply_crds(&ctx.client, &crds::all_crds())
        .await
        .expect("apply the generated CRDs");
    ctx
}

fn pod_template() -> Value {
    json!({
        "metadata": {"labels": {"app": "runner"}, "annotations": {"team": "platform"}},
        "spec": {
            "serviceAccountName": "runner",
            "restartPolicy": "Never",
            "securityContext": {"fsGroup": 1001},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "ci", "operator": "Exists", "effect": "NoSchedule"}],
            "initContainers": [{
                "name": "init-dind-externals",
                "image": "ghcr.io/actions/actions-runner:latest",
                "command": ["cp", "-r", "/home/runner/externals/.", "/home/runner/tmpDir/"],
                "volumeMounts": [{"name": "dind-externals", "mountPath": "/home/runner/tmpDir"}]
            }],
            "containers": [{
                "name": "runner",
                "image": "ghcr.io/actions/actions-runner:latest",
                "command": ["/home/runner/run.sh"],
                "env": [
                    {"name": "DOCKER_HOST", "value": "unix:///var/run/docker.sock"},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                ],
                "resources": {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "500m", "memory": "1Gi"}},
                "volumeMounts": [{"name": "work", "mountPath": "/home/runner/_work"}],
                "securityContext": {"runAsUser": 1001, "allowPrivilegeEscalation": false}
            }, {
                "name": "dind",
                "image": "docker:dind",
                "args": ["dockerd", "--host=unix:///var/run/docker.sock"],
                "securityContext": {"privileged": true},
                "ports": [{"containerPort": 2375, "protocol": "TCP"}]
            }],
            "volumes": [
                {"name": "work", "emptyDir": {}},
                {"name": "dind-externals", "emptyDir": {"sizeLimit": "1Gi"}},
                {"name": "cache", "ephemeral": {"volumeClaimTemplate": {"spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "10Gi"}}
                }}}}
            ]
        }
    })
}

fn proxy() -> Value {
    json!({
        "http": {"url": "http://proxy.example.com:3128", "credentialSecretRef": "proxy-auth"},
        "https": {"url": "http://proxy.example.com:3129"},
        "noProxy": ["example.internal", "10.0.0.0/8"]
    })
}

fn tls() -> Value {
    json!({"certificateFrom": {"configMapKeyRef": {"name": "ghes-ca", "key": "ca.crt"}}})
}

fn autoscaling_runner_set() -> Value {
    json!({
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "AutoscalingRunnerSet",
        "metadata": {"name": "arc-runner-set", "labels": {"app.kubernetes.io/version": "0.14.2"}},
        "spec": {
            "githubConfigUrl": "https://github.com/octo-org/octo-repo",
            "githubConfigSecret": "github-auth",
            "runnerGroup": "linux",
            "runnerScaleSetName": "arc-linux",
            "runnerScaleSetLabels": ["gpu", "large"],
            "minRunners": 1,
            "maxRunners": 20,
            "proxy": proxy(),
            "githubServerTLS": tls(),
            "vaultConfig": {
                "type": "azure_key_vault",
                "azureKeyVault": {"url": "https://vault.example", "tenantId": "t", "clientId": "c", "certificatePath": "/etc/cert.pem"},
                "proxy": {"https": {"url": "http://proxy.example.com:3129"}}
            },
            "template": pod_template(),
            "listenerTemplate": {"spec": {"containers": [{"name": "listener", "resources": {"limits": {"memory": "64Mi"}}}]}},
            "listenerMetrics": {
                "counters": {"gha_started_jobs_total": {"labels": ["repository", "organization"]}},
                "gauges": {"gha_assigned_jobs": {"labels": ["name", "namespace"]}},
                "histograms": {"gha_job_startup_duration_seconds": {"labels": ["repository"], "buckets": [1.0, 2.5, 10.0]}}
            },
            "autoscalingListener": {"labels": {"tier": "ci"}, "annotations": {"owner": "platform"}},
            "listenerServiceAccountMetadata": {"annotations": {"iam": "role"}},
            "listenerRoleMetadata": {"labels": {"a": "b"}},
            "listenerRoleBindingMetadata": {"labels": {"a": "b"}},
            "listenerConfigSecretMetadata": {"annotations": {"x": "y"}},
            "ephemeralRunnerSetMetadata": {"labels": {"ers": "yes"}},
            "ephemeralRunnerMetadata": {"annotations": {"er": "yes"}},
            "ephemeralRunnerConfigSecretMetadata": {"labels": {"jit": "yes"}}
        }
    })
}

fn ephemeral_runner_spec() -> Value {
    let mut spec = json!({
        "githubConfigUrl": "https://github.com/octo-org/octo-repo",
        "githubConfigSecret": "github-auth",
        "runnerScaleSetId": 42,
        "proxy": proxy(),
        "proxySecretRef": "arc-runner-set-754b578d-runner-proxy",
        "githubServerTLS": tls(),
        "ephemeralRunnerConfigSecretMetadata": {"labels": {"jit": "yes"}}
    });
    let template = pod_template();
    spec["metadata"] = template["metadata"].clone();
    spec["spec"] = template["spec"].clone();
    spec
}

fn ephemeral_runner_set() -> Value {
    json!({
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "EphemeralRunnerSet",
        "metadata": {"name": "arc-runner-set"},
        "spec": {
            "replicas": 3,
            "patchID": 7,
            "ephemeralRunnerSpec": ephemeral_runner_spec(),
            "ephemeralRunnerMetadata": {"labels": {"er": "yes"}}
        }
    })
}

fn ephemeral_runner() -> Value {
    json!({
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "EphemeralRunner",
        "metadata": {"name": "arc-runner-set-runner-abcde"},
        "spec": ephemeral_runner_spec()
    })
}

fn autoscaling_listener() -> Value {
    json!({
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "AutoscalingListener",
        "metadata": {"name": "arc-runner-set-7f984dc6-listener"},
        "spec": {
            "githubConfigUrl": "https://github.com/octo-org/octo-repo",
            "githubConfigSecret": "github-auth",
            "runnerScaleSetId": 42,
            "autoscalingRunnerSetNamespace": "arc-runners",
            "autoscalingRunnerSetName": "arc-runner-set",
            "ephemeralRunnerSetName": "arc-runner-set",
            "minRunners": 1,
            "maxRunners": 20,
            "image": "ghcr.io/arc-rs/arc-rs:0.1.0",
            "imagePullSecrets": [{"name": "regcred"}],
            "proxy": proxy(),
            "githubServerTLS": tls(),
            "metrics": {"counters": {"gha_started_jobs_total": {"labels": ["repository"]}}},
            "template": {"spec": {"containers": [{"name": "listener", "image": "custom"}]}},
            "configSecretMetadata": {"labels": {"a": "b"}},
            "serviceAccountMetadata": {"annotations": {"c": "d"}},
            "roleMetadata": {"labels": {"e": "f"}},
            "roleBindingMetadata": {"labels": {"g": "h"}}
        }
    })
}

/// Creates `object` through the typed API and checks that the spec comes back exactly as written, and that the
/// Rust type itself loses nothing of the JSON (every field of the realistic object is modelled).
async fn assert_round_trip<K>(ctx: &TestContext, object: Value)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + Serialize
        + DeserializeOwned,
{
    let typed: K = serde_json::from_value(object.clone()).expect("the object deserializes");
    let as_json = serde_json::to_value(&typed).expect("serialize");
    assert_eq!(
        as_json["spec"],
        object["spec"],
        "{}: the Rust type changed the spec",
        K::kind(&())
    );

    let api: Api<K> = ctx.api();
    let created = api
        .create(&PostParams::default(), &typed)
        .await
        .unwrap_or_else(|e| panic!("{} rejected: {e}", K::kind(&())));
    let read = api.get(&created.name_any()).await.expect("get");
    let read_json = serde_json::to_value(&read).expect("serialize");
    assert_eq!(
        read_json["spec"],
        object["spec"],
        "{}: the API server changed or pruned the spec",
        K::kind(&())
    );
}

#[tokio::test]
async fn crds_install_by_server_side_apply_and_reapply_cleanly() {
    let ctx = context("crd-install").await;
    // A second apply of the same objects is a no-op, not a conflict.
    test_harness::apply_crds(&ctx.client, &crds::all_crds())
        .await
        .expect("re-apply");
    let api: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(ctx.client.clone());
    for name in [
        "autoscalingrunnersets.actions.github.com",
        "autoscalinglisteners.actions.github.com",
        "ephemeralrunnersets.actions.github.com",
        "ephemeralrunners.actions.github.com",
    ] {
        let crd = api.get(name).await.expect("installed");
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        for wanted in ["Established", "NamesAccepted"] {
            assert!(
                conditions
                    .iter()
                    .any(|c| c.type_ == wanted && c.status == "True"),
                "{name} not {wanted}: {conditions:?}"
            );
        }
        // A non-structural schema would surface as this condition.
        assert!(
            !conditions
                .iter()
                .any(|c| c.type_ == "NonStructuralSchema" && c.status == "True"),
            "{name} has a non-structural schema: {conditions:?}"
        );
    }
}

#[tokio::test]
async fn realistic_objects_round_trip_unchanged() {
    let ctx = context("crd-roundtrip").await;
    assert_round_trip::<AutoscalingRunnerSet>(&ctx, autoscaling_runner_set()).await;
    assert_round_trip::<EphemeralRunnerSet>(&ctx, ephemeral_runner_set()).await;
    assert_round_trip::<EphemeralRunner>(&ctx, ephemeral_runner()).await;
    assert_round_trip::<AutoscalingListener>(&ctx, autoscaling_listener()).await;
}

#[tokio::test]
async fn status_is_a_separate_subresource() {
    let ctx = context("crd-status").await;
    let api: Api<EphemeralRunner> = ctx.api();
    let er: EphemeralRunner = serde_json::from_value(ephemeral_runner()).expect("deserialize");
    api.create(&PostParams::default(), &er)
        .await
        .expect("create");
    let name = er.name_any();

    // Status written through the main resource is ignored...
    let mut with_status = serde_json::to_value(&er).expect("serialize");
    with_status["status"] = json!({"phase": "Running"});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&with_status))
        .await
        .expect("merge patch");
    let read = api.get(&name).await.expect("get");
    assert!(
        read.status.as_ref().is_none_or(|s| s.phase.is_empty()),
        "status changed through the main resource: {:?}",
        read.status
    );

    // ...and written through /status on its own, without touching the spec.
    let status = json!({"status": {
        "phase": "Running",
        "ready": true,
        "runnerId": 1234,
        "runnerName": "arc-runner-set-runner-abcde",
        "failures": {"0b9b9a3c-5b8a-4c8c-8a43-4e8f2d1a7b6c": "2026-11-21T16:00:00Z"},
        "jobRequestId": 9_007_199_254_740_000_i64,
        "jobId": "job-1",
        "jobRepositoryName": "octo-org/octo-repo",
        "jobWorkflowRef": "octo-org/octo-repo/.github/workflows/ci.yaml@refs/heads/main",
        "workflowRunId": 77,
        "jobDisplayName": "build (linux)"
    }});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("patch status");
    let read = api.get(&name).await.expect("get");
    let got = serde_json::to_value(read.status.as_ref().expect("status set")).expect("serialize");
    assert_eq!(got, status["status"]);
    assert_eq!(
        serde_json::to_value(&read.spec).expect("serialize"),
        ephemeral_runner()["spec"]
    );
}

/// Sends raw JSON (bypassing the Rust types) and expects a 422 mentioning `field`.
async fn assert_rejected(ctx: &TestContext, kind: &str, plural: &str, object: Value, field: &str) {
    let resource = ApiResource {
        group: "actions.github.com".into(),
        version: "v1alpha1".into(),
        api_version: "actions.github.com/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ctx.namespace, &resource);
    let obj: DynamicObject = serde_json::from_value(object).expect("dynamic object");
    match api.create(&PostParams::default(), &obj).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{kind}: {status:?}");
            assert!(status.message.contains(field), "{kind}: {}", status.message);
        }
        other => panic!("{kind} with a bad `{field}` was not rejected: {other:?}"),
    }
}

#[tokio::test]
async fn objects_with_wrong_field_types_are_rejected() {
    let ctx = context("crd-reject").await;

    let mut ars = autoscaling_runner_set();
    ars["spec"]["minRunners"] = json!("two");
    assert_rejected(
        &ctx,
        "AutoscalingRunnerSet",
        "autoscalingrunnersets",
        ars,
        "minRunners",
    )
    .await;

    let mut ars = autoscaling_runner_set();
    ars["spec"]["maxRunners"] = json!(-1);
    assert_rejected(
        &ctx,
        "AutoscalingRunnerSet",
        "autoscalingrunnersets",
        ars,
        "maxRunners",
    )
    .await;

    let mut ars = autoscaling_runner_set();
    ars["spec"]["runnerScaleSetLabels"] = json!("gpu");
    assert_rejected(
        &ctx,
        "AutoscalingRunnerSet",
        "autoscalingrunnersets",
        ars,
        "runnerScaleSetLabels",
    )
    .await;

    let mut ers = ephemeral_runner_set();
    ers["spec"]
        .as_object_mut()
        .expect("object")
        .remove("patchID");
    assert_rejected(
        &ctx,
        "EphemeralRunnerSet",
        "ephemeralrunnersets",
        ers,
        "patchID",
    )
    .await;

    let mut er = ephemeral_runner();
    er["spec"]["runnerScaleSetId"] = json!("42");
    assert_rejected(
        &ctx,
        "EphemeralRunner",
        "ephemeralrunners",
        er,
        "runnerScaleSetId",
    )
    .await;

    let mut er = ephemeral_runner();
    er["spec"]["spec"]["containers"] = json!({"name": "runner"});
    assert_rejected(
        &ctx,
        "EphemeralRunner",
        "ephemeralrunners",
        er,
        "containers",
    )
    .await;

    let mut al = autoscaling_listener();
    al["spec"]["proxy"]["noProxy"] = json!({"a": 1});
    assert_rejected(
        &ctx,
        "AutoscalingListener",
        "autoscalinglisteners",
        al,
        "noProxy",
    )
    .await;
}

/// `kubectl get` output: the Table API with the printer columns of ARC's CRDs, in order.
async fn table(ctx: &TestContext, plural: &str) -> Value {
    let path = format!(
        "/apis/actions.github.com/v1alpha1/namespaces/{}/{plural}",
        ctx.namespace
    );
    let req = http::Request::get(path)
        .header(
            "Accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Vec::new())
        .expect("request");
    let text = ctx.client.request_text(req).await.expect("table request");
    serde_json::from_str(&text).expect("table JSON")
}

fn column_names(table: &Value) -> Vec<String> {
    table["columnDefinitions"]
        .as_array()
        .expect("columnDefinitions")
        .iter()
        .map(|c| c["name"].as_str().expect("name").to_owned())
        .collect()
}

#[tokio::test]
async fn printer_columns_appear_in_the_table_api() {
    let ctx = context("crd-columns").await;
    let ars: AutoscalingRunnerSet = serde_json::from_value(autoscaling_runner_set()).expect("ars");
    ctx.api::<AutoscalingRunnerSet>()
        .create(&PostParams::default(), &ars)
        .await
        .expect("create ars");
    let ers: EphemeralRunnerSet = serde_json::from_value(ephemeral_runner_set()).expect("ers");
    ctx.api::<EphemeralRunnerSet>()
        .create(&PostParams::default(), &ers)
        .await
        .expect("create ers");
    let er: EphemeralRunner = serde_json::from_value(ephemeral_runner()).expect("er");
    ctx.api::<EphemeralRunner>()
        .create(&PostParams::default(), &er)
        .await
        .expect("create er");
    let al: AutoscalingListener = serde_json::from_value(autoscaling_listener()).expect("al");
    ctx.api::<AutoscalingListener>()
        .create(&PostParams::default(), &al)
        .await
        .expect("create al");

    let t = table(&ctx, "autoscalingrunnersets").await;
    assert_eq!(
        column_names(&t),
        [
            "Name",
            "Minimum Runners",
            "Maximum Runners",
            "Current Runners",
            "Phase",
            "Pending Runners",
            "Running Runners",
            "Finished Runners",
            "Deleting Runners",
            // Not in ARC: whether the set is served (its Ready condition).
            "Served",
        ]
    );
    let cells = &t["rows"][0]["cells"];
    assert_eq!(cells[0], "arc-runner-set");
    assert_eq!(cells[1], 1);
    assert_eq!(cells[2], 20);

    let t = table(&ctx, "ephemeralrunnersets").await;
    assert_eq!(
        column_names(&t),
        [
            "Name",
            "DesiredReplicas",
            "CurrentReplicas",
            "Pending Runners",
            "Running Runners",
            "Finished Runners",
            "Deleting Runners",
            "Phase"
        ]
    );
    assert_eq!(t["rows"][0]["cells"][1], 3);

    let t = table(&ctx, "ephemeralrunners").await;
    assert_eq!(
        column_names(&t),
        [
            "Name",
            "GitHub Config URL",
            "RunnerId",
            "Phase",
            "JobRepository",
            "JobWorkflowRef",
            "WorkflowRunId",
            "JobDisplayName",
            "JobId",
            "Message",
            "Age"
        ]
    );
    assert_eq!(
        t["rows"][0]["cells"][1],
        "https://github.com/octo-org/octo-repo"
    );

    let t = table(&ctx, "autoscalinglisteners").await;
    assert_eq!(
        column_names(&t),
        [
            "Name",
            "GitHub Configure URL",
            "AutoscalingRunnerSet Namespace",
            "AutoscalingRunnerSet Name"
        ]
    );
    assert_eq!(t["rows"][0]["cells"][2], "arc-runners");
}

#[tokio::test]
async fn deleting_a_runner_set_garbage_collects_its_runners() {
    let ctx = context("crd-gc").await;
    let sets: Api<EphemeralRunnerSet> = ctx.api();
    let runners: Api<EphemeralRunner> = ctx.api();
    let ers: EphemeralRunnerSet = serde_json::from_value(ephemeral_runner_set()).expect("ers");
    let ers = sets
        .create(&PostParams::default(), &ers)
        .await
        .expect("create ers");
    let mut er: EphemeralRunner = serde_json::from_value(ephemeral_runner()).expect("er");
    er.metadata.owner_references = Some(vec![ers.controller_owner_ref(&()).expect("uid")]);
    runners
        .create(&PostParams::default(), &er)
        .await
        .expect("create er");

    sets.delete(&ers.name_any(), &DeleteParams::background())
        .await
        .expect("delete ers");
    for _ in 0..300 {
        if runners
            .get_opt(&er.name_any())
            .await
            .expect("get")
            .is_none()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the EphemeralRunner owned by the deleted EphemeralRunnerSet still exists after 30s");
}
