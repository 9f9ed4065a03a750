//! A watch that has to list again reports what the new list no longer holds as deleted
//! (`controller::relist::with_relist_deletions`, which the manager's watches go through). A test binary of its own:
//! it restarts the API server every test of the binary shares.

use std::pin::pin;
use std::time::Duration;

use controller::relist::with_relist_deletions;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use test_harness::TestContext;
use tokio::sync::mpsc;

/// The label of the test's objects (the namespace's own ConfigMap, the cluster's CA, is not the test's).
const LABEL: (&str, &str) = ("arc-rs.test/relist", "yes");

/// Follows `api` into a cache of its own, sending the name of every object a `Delete` event reports; with
/// `relist_deletions`, through [`with_relist_deletions`].
fn follow(
    api: Api<ConfigMap>,
    relist_deletions: bool,
) -> (Store<ConfigMap>, mpsc::UnboundedReceiver<String>) {
    let (cache, writer) = reflector::store();
    let (deleted_tx, deleted_rx) = mpsc::unbounded_channel();
    let reader = cache.clone();
    tokio::spawn(async move {
        let config = watcher::Config::default().labels(&format!("{}={}", LABEL.0, LABEL.1));
        let events = watcher(api, config).default_backoff().reflect(writer);
        let events = if relist_deletions {
            with_relist_deletions(events, reader).boxed()
        } else {
            events.boxed()
        };
        let mut events = pin!(events);
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Delete(cm)) = event {
                let _ = deleted_tx.send(cm.name_any());
            }
        }
    });
    (cache, deleted_rx)
}

fn names(cache: &Store<ConfigMap>) -> Vec<String> {
    let mut names: Vec<String> = cache.state().iter().map(|cm| cm.name_any()).collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn an_object_deleted_while_a_watch_could_not_follow_is_reported_deleted() {
    let ctx = TestContext::new("relist").await;
    let config_maps: Api<ConfigMap> = ctx.api();
    for name in ["kept", "vanishes"] {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some([(LABEL.0.to_owned(), LABEL.1.to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        config_maps
            .create(&PostParams::default(), &cm)
            .await
            .expect("create");
    }
    let (cache, mut deleted) = follow(config_maps.clone(), true);
    // The same watch without the adapter: it shows what the API server reports by itself.
    let (plain_cache, mut plain_deleted) = follow(config_maps.clone(), false);
    for cache in [&cache, &plain_cache] {
        tokio::time::timeout(Duration::from_secs(30), cache.wait_until_ready())
            .await
            .expect("the watch lists")
            .expect("the watch lists");
        assert_eq!(names(cache), ["kept", "vanishes"]);
    }

    // Deleted behind the API server's back while it is down: the new API server's watch cache starts past both
    // watches, which list again.
    let key = format!("/registry/configmaps/{}/vanishes", ctx.namespace);
    ctx.control_plane
        .restart_api_server_with(async {
            ctx.control_plane
                .etcd_delete(&key)
                .await
                .expect("delete the key in etcd");
        })
        .await
        .expect("restart kube-apiserver");

    let reported = tokio::time::timeout(Duration::from_secs(60), deleted.recv())
        .await
        .expect("the deletion is reported within a minute of the restart");
    assert_eq!(reported.as_deref(), Some("vanishes"));
    assert_eq!(
        names(&cache),
        ["kept"],
        "the cache no longer holds it either"
    );

    // Once the plain watch has listed again too, it has dropped the object from its cache without any event:
    // what the manager's deletion hooks would have missed.
    tokio::time::timeout(Duration::from_secs(60), async {
        while names(&plain_cache) != ["kept"] {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the plain watch lists again");
    assert!(
        plain_deleted.try_recv().is_err(),
        "the API server reported the deletion itself: this test no longer shows a re-list"
    );
    assert!(deleted.try_recv().is_err(), "one deletion is reported once");
}
