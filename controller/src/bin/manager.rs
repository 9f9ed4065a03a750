//! The controller manager binary: flags, logging, HTTP endpoints, signals; the work is in the library.

use anyhow::Context as _;
use clap::Parser;
use controller::cli::{Args, kube_client};
use controller::leader::{LeaderElector, LeaseTiming};
use controller::server::{health_routes, metrics_routes, serve};
use controller::{Manager, telemetry};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    telemetry::init(args.log_level, args.log_format).map_err(anyhow::Error::msg)?;
    for warning in args.ignored_flags() {
        tracing::warn!("{warning}");
    }
    let metrics_addr = args.metrics_address().map_err(anyhow::Error::msg)?;
    let health_addr = args.health_address().map_err(anyhow::Error::msg)?;
    let client = kube_client(
        args.k8s_client_rate_limiter_qps,
        args.k8s_client_rate_limiter_burst,
    )
    .await
    .context("connecting to Kubernetes")?;
    let mut options = args.options();
    options.build_version = env!("CARGO_PKG_VERSION").to_owned();
    let manager = Manager::new(client.clone(), options);

    let shutdown = CancellationToken::new();
    tokio::spawn(forward_signals(shutdown.clone()));
    let mut servers = Vec::new();
    let health = health_routes(manager.readiness());
    let metrics = metrics_routes(manager.registry());
    match (metrics_addr, health_addr) {
        (Some(m), Some(h)) if m == h => servers.push(tokio::spawn(serve(
            m,
            metrics.merge(health),
            shutdown.clone(),
        ))),
        (m, h) => {
            if let Some(addr) = m {
                servers.push(tokio::spawn(serve(addr, metrics, shutdown.clone())));
            }
            if let Some(addr) = h {
                servers.push(tokio::spawn(serve(addr, health, shutdown.clone())));
            }
        }
    }
    let result = match leader_elector(&args, &client) {
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
    result.context("running the controllers")
}

/// The election candidate when `--enable-leader-election` is set: the Lease lives in the manager's namespace.
fn leader_elector(args: &Args, client: &kube::Client) -> Option<LeaderElector> {
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

/// Waits for leadership, then reconciles while holding it. Losing the Lease stops the controllers and ends the
/// process with an error, so the pod restarts as a candidate (controller-runtime does the same).
async fn run_as_leader(
    manager: Manager,
    elector: &LeaderElector,
    shutdown: &CancellationToken,
) -> controller::Result<()> {
    tracing::info!(
        identity = elector.identity(),
        "waiting for the leader Lease"
    );
    if !elector.acquire(shutdown).await {
        return Ok(());
    }
    let controllers = shutdown.child_token();
    let run = async {
        let result = manager.run(controllers.clone()).await;
        // Whatever ended the controllers, stop renewing and hand the Lease over.
        shutdown.cancel();
        result
    };
    let hold = async {
        let kept = elector.hold(shutdown).await;
        if !kept {
            controllers.cancel();
        }
        kept
    };
    let (result, kept) = tokio::join!(run, hold);
    if !kept {
        tracing::error!("leadership lost; exiting so a restarted pod rejoins the election");
        std::process::exit(1);
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
