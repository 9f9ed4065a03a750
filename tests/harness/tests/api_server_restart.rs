//! Restarting kube-apiserver alone keeps etcd's data and the clients: objects created before are still there,
//! a client and a watch opened before work after, and the controller-manager carries on. A test binary of its
//! own, since the restart disturbs every test sharing the control plane.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use test_harness::TestContext;

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some([("key".to_owned(), name.to_owned())].into()),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_api_server_keeps_its_data_and_its_clients_recover() {
    let ctx = TestContext::new("apiserver-restart").await;
    let config_maps: Api<ConfigMap> = ctx.api();
    let before = config_maps
        .create(&PostParams::default(), &config_map("before"))
        .await
        .expect("create before the restart");

    // A watch opened before the restart, collecting the names it sees.
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let watch = tokio::spawn({
        let config_maps = config_maps.clone();
        async move {
            let mut events = watcher(config_maps, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                        let _ = seen_tx.send(cm.name_any());
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
    });
    let first = tokio::time::timeout(Duration::from_secs(30), seen_rx.recv())
        .await
        .expect("the watch sees the first ConfigMap");
    assert_eq!(first.as_deref(), Some("before"));

    let restart = ctx
        .control_plane
        .restart_api_server()
        .await
        .expect("restart kube-apiserver");
    eprintln!("kube-apiserver restart: {restart:?}");
    assert!(
        restart.down() < Duration::from_secs(180),
        "restart took {restart:?}"
    );
    assert!(
        ctx.control_plane.exited_components().is_empty(),
        "etcd and the controller-manager kept running: {:?}",
        ctx.control_plane.exited_components()
    );

    // The client built before the restart reads the object created before it, unchanged.
    let after = config_maps
        .get("before")
        .await
        .expect("the old client works after the restart");
    assert_eq!(after.uid(), before.uid());
    assert_eq!(after.data, before.data);

    // The watch opened before the restart sees an object created after it.
    config_maps
        .create(&PostParams::default(), &config_map("after"))
        .await
        .expect("create after the restart");
    let seen = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(name) = seen_rx.recv().await {
            if name == "after" {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(seen, Ok(true), "the watch recovered and saw `after`");
    watch.abort();

    // The controller-manager recovered too: its service-account controller serves a new namespace.
    let ns = test_harness::create_namespace(&ctx.client, "apiserver-restart-after")
        .await
        .expect("a new namespace gets its default service account");
    assert!(!ns.is_empty());

    // A second restart works the same way (same port, same certificates).
    ctx.control_plane
        .restart_api_server()
        .await
        .expect("restart kube-apiserver again");
    config_maps
        .get("after")
        .await
        .expect("the object created between the restarts is there");
}
