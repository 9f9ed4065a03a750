//! The harness itself: the control plane starts, namespaces are isolated, and the controller-manager really
//! runs (garbage collection by owner reference, service accounts).

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Resource, ResourceExt};
use test_harness::TestContext;

/// An empty ConfigMap named `name`.
fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn api_server_reports_pinned_version() {
    let ctx = TestContext::new("version").await;
    let info = ctx.client.apiserver_version().await.expect("GET /version");
    assert_eq!(info.git_version, test_harness::K8S_VERSION);
}

#[tokio::test]
async fn garbage_collector_deletes_dependents() {
    let ctx = TestContext::new("gc").await;
    let owners: Api<ConfigMap> = ctx.api();
    let dependents: Api<Secret> = ctx.api();

    let owner = owners
        .create(&PostParams::default(), &config_map("owner"))
        .await
        .expect("create owner");
    let owner_ref = owner.controller_owner_ref(&()).expect("owner has a uid");
    dependents
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("dependent".into()),
                    owner_references: Some(vec![owner_ref]),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("create dependent");

    owners
        .delete(&owner.name_any(), &DeleteParams::background())
        .await
        .expect("delete owner");

    // Only the controller-manager's garbage collector deletes the dependent.
    for _ in 0..300 {
        if dependents
            .get_opt("dependent")
            .await
            .expect("get")
            .is_none()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the garbage collector did not delete the dependent Secret within 30s");
}

#[tokio::test]
async fn each_test_gets_its_own_namespace() {
    let a = TestContext::new("isolation").await;
    let b = TestContext::new("isolation").await;
    assert_ne!(a.namespace, b.namespace);
    let in_a: Api<ConfigMap> = a.api();
    in_a.create(&PostParams::default(), &config_map("only-in-a"))
        .await
        .expect("create");
    let in_b: Api<ConfigMap> = b.api();
    assert!(in_b.get_opt("only-in-a").await.expect("get").is_none());
}

/// A test that counts the API server's requests gets a control plane no other test writes to, and stopping it ends
/// its components without touching the shared one.
#[tokio::test]
async fn an_own_control_plane_is_apart_from_the_shared_one_and_stops() {
    let shared = TestContext::new("shared").await;
    let own = test_harness::own_control_plane()
        .await
        .expect("start a control plane of its own");
    assert_ne!(own.server_url(), shared.control_plane.server_url());
    let ctx = TestContext::try_new_on(own, "own")
        .await
        .expect("a namespace on it");
    let on_own: Api<ConfigMap> = ctx.api();
    on_own
        .create(&PostParams::default(), &config_map("only-on-own"))
        .await
        .expect("create");
    let on_shared: Api<ConfigMap> = Api::namespaced(shared.client.clone(), &ctx.namespace);
    assert!(
        on_shared
            .get_opt("only-on-own")
            .await
            .expect("get")
            .is_none(),
        "the shared control plane has none of the own one's objects"
    );

    tokio::task::spawn_blocking(move || own.stop())
        .await
        .expect("stop");
    let without_retries = own.client_without_retries().expect("a client");
    let after_stop: Api<ConfigMap> = Api::namespaced(without_retries, &ctx.namespace);
    assert!(
        after_stop.get_opt("only-on-own").await.is_err(),
        "a stopped API server answers nothing"
    );
    shared
        .client
        .apiserver_version()
        .await
        .expect("the shared control plane still answers");
}
