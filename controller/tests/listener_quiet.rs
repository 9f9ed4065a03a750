//! A running listener's periodic passes cost the API server reads only: its ServiceAccount, Roles, RoleBindings
//! and Secrets are written when they are not as the controller builds them, not on every pass. With hundreds of
//! scale sets, each pass used to apply four objects again and delete a proxy Secret that was never there.
//!
//! A test binary of its own: it reads the API server's request counts, which no other test may disturb.

mod ars_support;

use std::collections::BTreeMap;

use ars_support::Env;
use test_harness::requests::{count, diff};

async fn requests(env: &Env) -> BTreeMap<String, u64> {
    count(&env.client()).await.expect("read /metrics")
}

#[tokio::test]
async fn a_running_listeners_periodic_passes_write_nothing() {
    let env = Env::new("al-quiet").await;
    let executor = env.listener_executor();
    // The test options' resync is 5 s, so a running listener gets a pass every 5 s.
    let manager = env.start(env.options());
    env.create_runner_set("quiet", env.runner_set_spec()).await;
    env.eventually("ListenerReady=True", || async {
        env.condition("quiet", "ListenerReady")
            .await
            .filter(|c| c.status == "True")
    })
    .await;

    let before = requests(&env).await;
    // Every pass reads the listener's RoleBinding and its status RoleBinding: two passes at least.
    let during = env
        .eventually("two periodic passes of the running listener", || async {
            let now = requests(&env).await;
            let grown = diff(&before, &now);
            (grown.get("rolebindings GET").copied().unwrap_or(0) >= 4).then_some(grown)
        })
        .await;
    let writes: Vec<(&String, &u64)> = during
        .iter()
        .filter(|(key, _)| {
            ["serviceaccounts ", "roles ", "rolebindings ", "secrets "]
                .iter()
                .any(|kind| key.starts_with(kind))
                && ["APPLY", "PATCH", "PUT", "POST", "DELETE"]
                    .iter()
                    .any(|verb| key.contains(verb))
        })
        .collect();
    assert!(
        writes.is_empty(),
        "a running listener's periodic passes wrote {writes:?} (all requests: {during:?})"
    );
    assert!(executor.errors().is_empty(), "{:?}", executor.errors());
    manager.stop().await;
    executor.stop();
}
