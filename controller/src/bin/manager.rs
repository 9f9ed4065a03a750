//! The controller manager binary: flags, logging, HTTP endpoints, signals; the work is in the library.

use anyhow::Context as _;
use clap::Parser;
use controller::cli::{Args, kube_client};
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
    let manager = Manager::new(client, options);

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
    let result = manager.run(shutdown.clone()).await;
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
