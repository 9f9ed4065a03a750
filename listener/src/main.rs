//! `listener`: reads the config named by `LISTENER_CONFIG_PATH`, then polls and scales until SIGTERM/SIGINT.
//!
//! Exit status: 0 after a signal (the session is deleted first), 1 on a configuration error or another
//! unrecoverable failure. Service and Kubernetes errors never end the process; the listener backs off instead.

use std::process::ExitCode;

use listener::{Config, Listener, Settings};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    // One thread: the listener waits on the network nearly all the time (one long poll, a few patches at
    // once), and every worker thread of a multi-threaded runtime costs resident memory (stacks, allocator
    // arenas) in a pod that should stay small.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("listener: starting the async runtime failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Before logging exists (config errors) stderr is the only channel; afterwards it repeats the last log.
            eprintln!("listener: {}", listener::listener::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

async fn run() -> listener::Result<()> {
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    let config = Config::from_env()?;
    listener::telemetry::init(config.log_level()?, config.log_format()?)?;
    tracing::info!(config = ?config, "configuration loaded");
    // In a pod this is the in-cluster configuration; elsewhere KUBECONFIG or ~/.kube/config (ARC refuses to run
    // outside a cluster; a kubeconfig makes local runs and tests possible).
    let kube_config = kube::Config::infer()
        .await
        .map_err(listener::Error::InferKubeConfig)?;
    let kube = kube::Client::try_from(kube_config).map_err(listener::Error::BuildKubeClient)?;
    let listener = Listener::start(&config, kube, Settings::default()).await?;
    listener.run(shutdown).await
}

/// The first SIGTERM or SIGINT starts the shutdown; later ones are ignored so the session is always deleted.
fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(e) => {
                    eprintln!("listener: installing the SIGTERM handler failed: {e}");
                    return;
                }
            };
        loop {
            tokio::select! {
                _ = terminate.recv() => {}
                result = tokio::signal::ctrl_c() => {
                    if result.is_err() {
                        return;
                    }
                }
            }
            if !shutdown.is_cancelled() {
                tracing::info!("signal received; shutting down");
                shutdown.cancel();
            }
        }
    });
}
