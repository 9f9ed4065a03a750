//! The manager process: HTTP endpoints, signals, optional leader election and the controllers, on one shutdown
//! token. The binary parses the flags, starts logging and calls [`run`].

use std::net::SocketAddr;

use axum::Router;
use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::cli::{Args, kube_client};
use crate::error::{Error, Result};
use crate::inflight::{InFlightBudget, Lane};
use crate::leader::{LeaderElector, LeaseTiming};
use crate::manager::Manager;
use crate::options::{LEASE_CLIENT_BURST, LEASE_CLIENT_QPS};
use crate::server::{health_routes, metrics_routes, serve};

/// Runs the manager as `args` say until SIGTERM or SIGINT (a second signal exits at once). Under leader
/// election it reconciles only while it holds the Lease; losing it ends the run with [`Error::LeadershipLost`],
/// so the process exits and its restarted pod rejoins the election (controller-runtime does the same).
pub async fn run(args: &Args) -> Result<()> {
    for warning in args.ignored_flags() {
        tracing::warn!("{warning}");
    }
    let invalid = |flag| move |reason| Error::InvalidFlag { flag, reason };
    let metrics_addr = args.metrics_address().map_err(invalid("metrics-addr"))?;
    let health_addr = args
        .health_address()
        .map_err(invalid("health-probe-bind-address"))?;
    // The main client and runner teardown's share one budget of requests in flight; teardown has a client of its
    // own, with a rate bucket of the same size, so deleting a finished runner never waits behind a burst of
    // creations, neither for rate nor for a place in the budget (docs/manager-configuration.md says how this
    // compares with ARC's per-client limits).
    let budget = (args.k8s_client_max_in_flight > 0)
        .then(|| InFlightBudget::new(args.k8s_client_max_in_flight));
    let lane = |lane| budget.as_ref().map(|budget| budget.layer(lane));
    let client = kube_client(
        args.k8s_client_rate_limiter_qps,
        args.k8s_client_rate_limiter_burst,
        lane(Lane::Main),
    )
    .await?;
    let teardown_client = kube_client(
        args.k8s_client_rate_limiter_qps,
        args.k8s_client_rate_limiter_burst,
        lane(Lane::Teardown),
    )
    .await?;
    let mut options = args.options();
    options.build_version = env!("CARGO_PKG_VERSION").to_owned();
    // The listener loops of the manager's listener mode get a client of their own too: a scaling patch never waits
    // behind the creations it asks for.
    let listener_client = kube_client(
        args.k8s_client_rate_limiter_qps,
        args.k8s_client_rate_limiter_burst,
        None,
    )
    .await?;
    // The watches open their streams outside the budget: a watch an overloaded API server closed comes back at
    // once, not behind the controllers' queued requests (`Manager::with_watch_client`).
    let watch_client = kube_client(
        args.k8s_client_rate_limiter_qps,
        args.k8s_client_rate_limiter_burst,
        None,
    )
    .await?;
    let manager = Manager::new(client.clone(), options)
        .with_teardown_client(teardown_client)
        .with_listener_client(listener_client)
        .with_watch_client(watch_client);

    let shutdown = CancellationToken::new();
    tokio::spawn(forward_signals(shutdown.clone()));
    let health = health_routes(manager.readiness());
    let metrics = metrics_routes(manager.exposition());
    let servers: Vec<_> = endpoints(metrics_addr, health_addr)
        .into_iter()
        .map(|endpoint| {
            let mut router = Router::new();
            if endpoint.metrics {
                router = router.merge(metrics.clone());
            }
            if endpoint.health {
                router = router.merge(health.clone());
            }
            tokio::spawn(serve(endpoint.addr, router, shutdown.clone()))
        })
        .collect();
    // The Lease is renewed on a client of its own: behind a burst's requests on the shared client's rate limit
    // and concurrency, a renewal could wait past the renew deadline while the API server answers fine.
    let lease_client = kube_client(LEASE_CLIENT_QPS, LEASE_CLIENT_BURST, None).await?;
    let result = match leader_elector(args, &lease_client) {
        None => manager.run(shutdown.clone()).await,
        Some(elector) => run_as_leader(manager, &elector, &shutdown).await,
    };
    shutdown.cancel();
    for server in servers {
        match server.await {
            Ok(Err(error)) => tracing::error!(%error, "HTTP server failed"),
            Err(error) => tracing::error!(%error, "HTTP server task failed"),
            Ok(Ok(())) => {}
        }
    }
    result
}

/// One HTTP server and what it serves.
#[derive(Debug, PartialEq, Eq)]
struct Endpoint {
    addr: SocketAddr,
    metrics: bool,
    health: bool,
}

/// The HTTP servers for the metrics and health addresses (each disabled when `None`): one server when both
/// name the same address, as the chart may configure it.
fn endpoints(metrics: Option<SocketAddr>, health: Option<SocketAddr>) -> Vec<Endpoint> {
    match (metrics, health) {
        (Some(m), Some(h)) if m == h => vec![Endpoint {
            addr: m,
            metrics: true,
            health: true,
        }],
        (m, h) => m
            .map(|addr| Endpoint {
                addr,
                metrics: true,
                health: false,
            })
            .into_iter()
            .chain(h.map(|addr| Endpoint {
                addr,
                metrics: false,
                health: true,
            }))
            .collect(),
    }
}

/// The election candidate when `--enable-leader-election` is set: the Lease lives in the manager's namespace.
fn leader_elector(args: &Args, client: &Client) -> Option<LeaderElector> {
    if !args.enable_leader_election {
        return None;
    }
    let namespace = std::env::var("CONTROLLER_MANAGER_POD_NAMESPACE")
        .ok()
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| "default".to_owned());
    // The pod name plus the process id and start time: unique even if a pod name is reused at once.
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "manager".to_owned());
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let identity = format!("{host}_{}_{started}", std::process::id());
    Some(LeaderElector::new(
        client.clone(),
        &namespace,
        &args.leader_election_id,
        &identity,
        LeaseTiming::default(),
    ))
}

/// Waits for leadership, then reconciles while holding it ([`LeaderElector::lead`]): the Lease is released only
/// once the controllers have stopped, and losing it ends the run at once with [`Error::LeadershipLost`].
async fn run_as_leader(
    manager: Manager,
    elector: &LeaderElector,
    shutdown: &CancellationToken,
) -> Result<()> {
    tracing::info!(
        identity = elector.identity(),
        "waiting for the leader Lease"
    );
    let result = elector
        .lead(shutdown, |controllers| manager.run(controllers))
        .await;
    if matches!(result, Err(Error::LeadershipLost)) {
        tracing::error!("leadership lost; exiting so a restarted pod rejoins the election");
    }
    result
}

/// Cancels `shutdown` on SIGTERM or SIGINT; a second signal exits at once.
async fn forward_signals(shutdown: CancellationToken) {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                return;
            }
        };
    for round in 0..2 {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        if round == 0 {
            tracing::info!("shutting down; in-flight reconciles finish first");
            shutdown.cancel();
        } else {
            tracing::warn!("second signal; exiting now");
            std::process::exit(130);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from(([0, 0, 0, 0], port)))
    }

    fn endpoint(port: u16, metrics: bool, health: bool) -> Endpoint {
        Endpoint {
            addr: addr(port).unwrap(),
            metrics,
            health,
        }
    }

    #[test]
    fn one_server_per_address() {
        assert_eq!(
            endpoints(addr(8080), addr(8081)),
            [endpoint(8080, true, false), endpoint(8081, false, true)]
        );
        assert_eq!(
            endpoints(addr(8080), addr(8080)),
            [endpoint(8080, true, true)]
        );
        assert_eq!(endpoints(None, addr(8081)), [endpoint(8081, false, true)]);
        assert_eq!(endpoints(addr(8080), None), [endpoint(8080, true, false)]);
        assert_eq!(endpoints(None, None), []);
    }
}
