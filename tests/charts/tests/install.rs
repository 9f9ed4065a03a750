//! `helm install` of both charts into the real local control plane: every rendered object must be accepted by
//! the API server, and the AutoscalingRunnerSet a default install renders must be valid for our CRDs and types.
//!
//! Every object the scale-set chart renders for each of the project's values fixtures passes a server-side dry
//! run too.
//!
//! One test function on purpose: the scale-set chart discovers the controller by listing Deployments across the
//! cluster, so a second controller release installed concurrently would make that discovery ambiguous.

use std::path::Path;
use std::time::Duration;

use chart_tests::{Chart, Template, run_helm};
use crds::AutoscalingRunnerSet;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::{DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use test_harness::TestContext;

fn install(kubeconfig: &Path, release: &str, chart: Chart, namespace: &str, sets: &[&str]) {
    let mut args: Vec<String> = vec![
        "install".into(),
        release.into(),
        chart.path().display().to_string(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--namespace".into(),
        namespace.into(),
    ];
    for set in sets {
        args.push("--set".into());
        args.push((*set).into());
    }
    if let Err(e) = run_helm(&args) {
        panic!("helm install {release} ({}) failed: {e}", sets.join(" "));
    }
}

async fn namespace(ctx: &TestContext, prefix: &str) -> String {
    test_harness::create_namespace(&ctx.client, prefix)
        .await
        .expect("namespace")
}

/// Creates every object the scale-set chart renders for each of the project's values fixtures with a
/// server-side dry run, so the API server (with the CRDs the controller chart installed) judges them all.
/// PodMonitors are left out: the Prometheus Operator's CRD is not part of this control plane; the render tests
/// check their shape.
async fn every_fixture_is_accepted(ctx: &TestContext) {
    let dir = chart_tests::repo_root().join("tests/charts/fixtures/scale-set");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures dir")
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {}", dir.display());
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for file in files {
        let ns = namespace(ctx, "helm-fixture").await;
        // The fixture's own namespaceOverride would name a namespace that does not exist here.
        let manifests = Template::new(Chart::ScaleSet)
            .release("fixture")
            .namespace(&ns)
            .values_file(&file)
            .set("namespaceOverride", &ns)
            .render()
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for object in manifests.objects() {
            let kind = object["kind"].as_str().expect("kind");
            if kind == "PodMonitor" {
                continue;
            }
            let api_version = object["apiVersion"].as_str().expect("apiVersion");
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            let gvk = GroupVersionKind::gvk(group, version, kind);
            let (resource, _) = kube::discovery::pinned_kind(&ctx.client, &gvk)
                .await
                .unwrap_or_else(|e| panic!("{api_version} {kind} is not served: {e}"));
            let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &resource);
            let dynamic: DynamicObject =
                serde_json::from_value(object.clone()).expect("a Kubernetes object");
            if let Err(e) = api.create(&dry_run, &dynamic).await {
                panic!(
                    "{}: the API server refuses {kind} {}: {e}",
                    file.display(),
                    object["metadata"]["name"]
                );
            }
        }
    }
}

#[tokio::test]
async fn both_charts_install_into_a_real_api_server() {
    let ctx = TestContext::new("helm-controller").await;
    let kubeconfig = ctx.control_plane.kubeconfig_path();

    // The controller chart, with its CRDs: what `helm install arc charts/gha-runner-scale-set-controller` does,
    // into a namespace that enforces the `restricted` Pod Security Standard (docs/security.md).
    Api::<Namespace>::all(ctx.client.clone())
        .patch(
            &ctx.namespace,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
            }}})),
        )
        .await
        .expect("label the controller namespace");
    install(kubeconfig, "arc", Chart::Controller, &ctx.namespace, &[]);
    let deployments: Api<Deployment> = ctx.api();
    let manager = deployments
        .get("arc-gha-rs-controller")
        .await
        .expect("the manager Deployment exists");
    let sa = manager
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.service_account_name)
        .expect("the manager runs under a ServiceAccount");
    ctx.api::<ServiceAccount>()
        .get(&sa)
        .await
        .expect("the manager ServiceAccount exists");
    // The ReplicaSet controller could create the manager pod: Pod Security admission let it in.
    let pods: Api<Pod> = ctx.api();
    test_harness::eventually(
        "the manager pod, admitted under the restricted Pod Security Standard",
        Duration::from_secs(60),
        || async {
            let listed = pods
                .list(
                    &ListParams::default().labels("app.kubernetes.io/component=controller-manager"),
                )
                .await
                .expect("list pods");
            (!listed.items.is_empty()).then_some(())
        },
    )
    .await;

    // A default scale set, discovering the controller through the cluster.
    let runners = namespace(&ctx, "helm-runners").await;
    install(
        kubeconfig,
        "arc-runner-set",
        Chart::ScaleSet,
        &runners,
        &[
            "githubConfigUrl=https://github.com/octo-org/octo-repo",
            "githubConfigSecret.github_token=ghp_not_a_real_token",
        ],
    );
    let ars_api: Api<AutoscalingRunnerSet> = Api::namespaced(ctx.client.clone(), &runners);
    let ars = ars_api
        .get("arc-runner-set")
        .await
        .expect("the AutoscalingRunnerSet is stored and reads back as our type");
    assert_eq!(
        ars.spec.github_config_url,
        "https://github.com/octo-org/octo-repo"
    );
    assert!(
        ars.spec
            .template
            .spec
            .as_ref()
            .is_some_and(|s| s.containers.iter().any(|c| c.name == "runner")),
        "the runner container is in the template"
    );
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &runners);
    secrets
        .get(&ars.spec.github_config_secret)
        .await
        .expect("the GitHub Secret the ARS names exists");
    let manager_role = Api::<Role>::namespaced(ctx.client.clone(), &runners)
        .list(&Default::default())
        .await
        .expect("roles");
    assert!(
        !manager_role.items.is_empty(),
        "the manager Role is installed"
    );

    // Each container mode installs too; controllerServiceAccount is explicit from here on.
    let controller_sa_ns = format!("controllerServiceAccount.namespace={}", ctx.namespace);
    let controller_sa_name = format!("controllerServiceAccount.name={sa}");
    for mode in ["dind", "kubernetes", "kubernetes-novolume"] {
        let ns = namespace(&ctx, &format!("helm-{mode}")).await;
        let mode_set = format!("containerMode.type={mode}");
        let mut sets = vec![
            "githubConfigUrl=https://github.com/octo-org",
            "githubConfigSecret.github_token=ghp_not_a_real_token",
            mode_set.as_str(),
            controller_sa_ns.as_str(),
            controller_sa_name.as_str(),
        ];
        if mode == "kubernetes" {
            sets.push("containerMode.kubernetesModeWorkVolumeClaim.accessModes={ReadWriteOnce}");
            sets.push("containerMode.kubernetesModeWorkVolumeClaim.storageClassName=standard");
            sets.push("containerMode.kubernetesModeWorkVolumeClaim.resources.requests.storage=1Gi");
        }
        install(
            kubeconfig,
            &format!("rs-{mode}"),
            Chart::ScaleSet,
            &ns,
            &sets,
        );
        let api: Api<AutoscalingRunnerSet> = Api::namespaced(ctx.client.clone(), &ns);
        let list = api.list(&Default::default()).await.expect("list ARS");
        assert_eq!(list.items.len(), 1, "{mode}: one AutoscalingRunnerSet");
        if mode.starts_with("kubernetes") {
            let bindings = Api::<RoleBinding>::namespaced(ctx.client.clone(), &ns)
                .list(&Default::default())
                .await
                .expect("role bindings");
            assert!(
                bindings.items.len() >= 2,
                "{mode}: manager and kubernetes-mode RoleBindings, got {}",
                bindings.items.len()
            );
        }
    }

    every_fixture_is_accepted(&ctx).await;

    // Single-namespace mode of the controller chart (last: it adds a second controller Deployment).
    let single = namespace(&ctx, "helm-single").await;
    let watched = namespace(&ctx, "helm-watched").await;
    install(
        kubeconfig,
        "arc-single",
        Chart::Controller,
        &single,
        &[&format!("flags.watchSingleNamespace={watched}")],
    );
    let roles = Api::<Role>::namespaced(ctx.client.clone(), &watched)
        .list(&Default::default())
        .await
        .expect("roles in the watched namespace");
    assert!(
        !roles.items.is_empty(),
        "single-namespace mode installs the manager's Role into the watched namespace"
    );
}
