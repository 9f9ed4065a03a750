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

/// The Lease's holder; `None` when it is released or not made yet.
async fn holder(ctx: &TestContext) -> Option<String> {
    let leases: Api<Lease> = ctx.api();
    leases
        .get_opt("arc-rs-test")
        .await
        .expect("read the lease")?
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

/// Defect 4: the Lease was released at SIGTERM while the controllers still finished their in-flight passes, so a
/// successor could reconcile the same objects at the same time (in a rolling update during a burst, both created
/// runners for the same demand). The Lease is kept, and renewed, until the controllers have stopped.
#[tokio::test]
async fn a_leader_keeps_its_lease_until_its_controllers_have_stopped() {
    let ctx = TestContext::new("leader-keeps").await;
    let a = candidate(&ctx, "a");
    let shutdown = CancellationToken::new();
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel();
    let leading = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            a.lead(&shutdown, |stop| async move {
                stop.cancelled().await;
                let _ = stopping_tx.send(());
                // In-flight passes finishing: longer than the Lease's duration.
                tokio::time::sleep(Duration::from_secs(3)).await;
                Ok(())
            })
            .await
        }
    });
    test_harness::eventually("a leads", Duration::from_secs(20), || async {
        (holder(&ctx).await.as_deref() == Some("a")).then_some(())
    })
    .await;
    shutdown.cancel();
    stopping_rx
        .await
        .expect("the controllers were asked to stop");
    let b = candidate(&ctx, "b");
    for _ in 0..8 {
        assert!(
            !b.try_acquire_or_renew().await.expect("b tries"),
            "the Lease stays the leader's while its controllers finish"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    leading
        .await
        .expect("task")
        .expect("a term ended by a signal");
    assert_eq!(holder(&ctx).await, None, "released once they stopped");
}

/// Defect 4: a leader whose Lease was taken let its in-flight passes finish. It stops at once: another replica
/// may already lead.
#[tokio::test]
async fn a_leader_that_loses_its_lease_stops_at_once() {
    let ctx = TestContext::new("leader-lost-at-once").await;
    let a = candidate(&ctx, "a");
    let shutdown = CancellationToken::new();
    let leading = tokio::spawn(async move {
        a.lead(&shutdown, |_stop| async {
            // A pass that would take a minute to finish.
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(())
        })
        .await
    });
    test_harness::eventually("a leads", Duration::from_secs(20), || async {
        (holder(&ctx).await.as_deref() == Some("a")).then_some(())
    })
    .await;
    let leases: Api<Lease> = ctx.api();
    leases
        .patch(
            "arc-rs-test",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "intruder"}})),
        )
        .await
        .expect("take the lease");
    let taken = std::time::Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(20), leading)
        .await
        .expect("the term ends")
        .expect("task");
    assert!(
        matches!(result, Err(controller::Error::LeadershipLost)),
        "{result:?}"
    );
    let bound = timing().renew_deadline + timing().retry_period + Duration::from_secs(1);
    assert!(
        taken.elapsed() <= bound,
        "stopped {:?} after the loss, without waiting for the pass",
        taken.elapsed()
    );
}

/// A TCP proxy to the API server that can be frozen: it then forwards nothing more and holds every connection
/// open, old and new, as an API server that hangs (or a network that drops every packet) would.
struct FreezableProxy {
    addr: std::net::SocketAddr,
    frozen: tokio::sync::watch::Sender<bool>,
}

/// Copies `from` to `to` until either side closes, or forever once `frozen` turns true (nothing more is sent).
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buffer) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            () = async {
                let _ = frozen.wait_for(|frozen| *frozen).await;
            } => std::future::pending().await,
        };
        let now_frozen = *frozen.borrow();
        if now_frozen {
            std::future::pending::<()>().await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

impl FreezableProxy {
    async fn start(upstream: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (frozen, _) = tokio::sync::watch::channel(false);
        let watch = frozen.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (in_read, in_write) = inbound.into_split();
                let (out_read, out_write) = outbound.into_split();
                tokio::spawn(forward(in_read, out_write, watch.subscribe()));
                tokio::spawn(forward(out_read, in_write, watch.subscribe()));
            }
        });
        Self { addr, frozen }
    }

    fn freeze(&self) {
        self.frozen.send_replace(true);
    }
}

/// Defect 4: renewals shared the manager's client (its rate limit and concurrency) and had no deadline of their own,
/// so a leader cut off from a hanging API server kept leading long past its renew deadline. Each attempt gets what
/// is left of the deadline: the term ends within the renew deadline plus one retry period.
#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_gives_up_within_its_renew_deadline() {
    let ctx = TestContext::new("leader-cut-off").await;
    let plane = test_harness::control_plane().await.expect("control plane");
    let upstream = plane.server_url().trim_start_matches("https://").to_owned();
    let proxy = FreezableProxy::start(upstream).await;
    let mut config = plane.config().clone();
    config.cluster_url = format!("https://{}", proxy.addr)
        .parse()
        .expect("proxy URL");
    let client = kube::Client::try_from(config).expect("client through the proxy");
    let a = LeaderElector::new(client, &ctx.namespace, "arc-rs-test", "a", timing());
    let shutdown = CancellationToken::new();
    let leading = tokio::spawn(async move {
        a.lead(&shutdown, |stop| async move {
            stop.cancelled().await;
            Ok(())
        })
        .await
    });
    test_harness::eventually("a leads", Duration::from_secs(20), || async {
        (holder(&ctx).await.as_deref() == Some("a")).then_some(())
    })
    .await;
    proxy.freeze();
    let frozen = std::time::Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(30), leading)
        .await
        .expect("the term ends while the API server hangs")
        .expect("task");
    assert!(
        matches!(result, Err(controller::Error::LeadershipLost)),
        "{result:?}"
    );
    let bound = timing().renew_deadline + timing().retry_period + Duration::from_secs(1);
    assert!(
        frozen.elapsed() <= bound,
        "gave up {:?} after the API server stopped answering (bound {bound:?})",
        frozen.elapsed()
    );
}
