//! Leader election against the real API server: one of two candidates leads; a released Lease passes at once; a
//! crashed leader's Lease passes after it expires; a leader that loses its Lease notices.

use std::time::Duration;

use controller::leader::{LeaderElector, LeaseTiming};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use test_harness::TestContext;
use tokio_util::sync::CancellationToken;

fn timing() -> LeaseTiming {
    LeaseTiming {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(200),
    }
}

fn candidate(ctx: &TestContext, identity: &str) -> LeaderElector {
    LeaderElector::new(
        ctx.client.clone(),
        &ctx.namespace,
        "arc-rs-test",
        identity,
        timing(),
    )
}

async fn holder(ctx: &TestContext) -> Option<String> {
    let leases: Api<Lease> = ctx.api();
    leases
        .get("arc-rs-test")
        .await
        .expect("lease")
        .spec
        .and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn one_leader_release_hands_over_at_once() {
    let ctx = TestContext::new("leader-release").await;
    let a = candidate(&ctx, "a");
    let b = candidate(&ctx, "b");
    assert!(a.try_acquire_or_renew().await.expect("a tries"));
    assert!(
        !b.try_acquire_or_renew().await.expect("b tries"),
        "the Lease is a's"
    );
    assert!(a.try_acquire_or_renew().await.expect("a renews"));
    assert_eq!(holder(&ctx).await.as_deref(), Some("a"));

    a.release().await;
    assert!(
        b.try_acquire_or_renew().await.expect("b tries again"),
        "a released Lease is free immediately"
    );
    let leases: Api<Lease> = ctx.api();
    let spec = leases
        .get("arc-rs-test")
        .await
        .expect("lease")
        .spec
        .expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, Some(1));
}

#[tokio::test]
async fn a_crashed_leaders_lease_expires() {
    let ctx = TestContext::new("leader-expiry").await;
    let a = candidate(&ctx, "a");
    let b = candidate(&ctx, "b");
    assert!(a.try_acquire_or_renew().await.expect("a tries"));
    // `a` stops renewing without releasing, as a killed process would.
    let shutdown = CancellationToken::new();
    let acquired = tokio::time::timeout(Duration::from_secs(20), b.acquire(&shutdown))
        .await
        .expect("b leads once a's Lease has expired");
    assert!(acquired);
    assert_eq!(holder(&ctx).await.as_deref(), Some("b"));
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_stops_holding() {
    let ctx = TestContext::new("leader-lost").await;
    let a = candidate(&ctx, "a");
    assert!(a.try_acquire_or_renew().await.expect("a tries"));
    let shutdown = CancellationToken::new();
    let holding = tokio::spawn(async move { a.hold(&shutdown).await });

    // Someone else writes the Lease (an operator, or a candidate that saw it expire during a partition).
    let leases: Api<Lease> = ctx.api();
    leases
        .patch(
            "arc-rs-test",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "intruder"}})),
        )
        .await
        .expect("take the lease");
    let kept = tokio::time::timeout(Duration::from_secs(20), holding)
        .await
        .expect("hold returns")
        .expect("task");
    assert!(!kept, "leadership is reported lost");
}

#[tokio::test]
async fn shutdown_releases_the_lease() {
    let ctx = TestContext::new("leader-shutdown").await;
    let a = candidate(&ctx, "a");
    assert!(a.try_acquire_or_renew().await.expect("a tries"));
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    assert!(a.hold(&shutdown).await, "a clean shutdown is not a loss");
    assert_eq!(holder(&ctx).await, None);
}
