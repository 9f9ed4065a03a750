//! `fake-actions-service`: run the fake standalone. Prints its base URL as the first line on stdout, then serves
//! until SIGTERM or SIGINT. Logs go to stderr (`RUST_LOG`, default `info`).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use fake_actions_service::{Config, FakeActionsService, GitHubApp, JobDelivery, StrictAuth};

/// A stateful fake of GitHub's Actions Service (runner scale-set protocol).
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    addr: SocketAddr,
    /// Base URL to hand out instead of the request's Host header.
    #[arg(long)]
    advertised_url: Option<String>,
    /// How long an empty long poll is held before 202, in milliseconds.
    #[arg(long, default_value_t = 50_000)]
    long_poll_timeout_ms: u64,
    /// Admin token lifetime in seconds.
    #[arg(long, default_value_t = 3600)]
    admin_token_lifetime_secs: u64,
    /// Message-queue token lifetime in seconds.
    #[arg(long, default_value_t = 3600)]
    message_queue_token_lifetime_secs: u64,
    /// Forget sessions not polled for this many seconds; 0 never forgets.
    #[arg(long, default_value_t = 120)]
    session_idle_timeout_secs: u64,
    /// Extra runner group every tenant starts with (repeatable).
    #[arg(long = "runner-group")]
    runner_groups: Vec<String>,
    /// Strict mode: accept only these PATs (repeatable) and the App below.
    #[arg(long = "pat")]
    pats: Vec<String>,
    /// Strict mode: GitHub App id or client id (the JWT `iss`).
    #[arg(long, requires = "app_public_key_file")]
    app_id: Option<String>,
    /// Strict mode: installation id of the App (repeatable).
    #[arg(long = "app-installation-id")]
    app_installation_ids: Vec<i64>,
    /// Strict mode: PEM file with the App's RSA public key.
    #[arg(long, requires = "app_id")]
    app_public_key_file: Option<PathBuf>,
    /// Runners are online as soon as their JIT config exists.
    #[arg(long)]
    auto_online_runners: bool,
    /// Jobs start as soon as a runner holds them.
    #[arg(long)]
    auto_start_jobs: bool,
    /// Running jobs succeed after this many milliseconds.
    #[arg(long)]
    auto_complete_after_ms: Option<u64>,
    /// A running job not renewed by its runner for this many milliseconds fails, and its runner is gone.
    #[arg(long)]
    runner_lost_timeout_ms: Option<u64>,
    /// Prefix Actions Service bodies with a UTF-8 byte order mark, as the real service does.
    #[arg(long)]
    byte_order_mark: bool,
    /// Seed for ids and tokens.
    #[arg(long)]
    seed: Option<u64>,
    /// How jobs reach a listener: `acquire` (GHES: offered, then acquired) or `direct` (github.com: assigned).
    #[arg(long, value_enum, default_value_t = JobDelivery::Acquire)]
    job_delivery: JobDelivery,
}

impl Args {
    fn into_config(self) -> anyhow::Result<Config> {
        let apps = match (&self.app_id, &self.app_public_key_file) {
            (Some(app_id), Some(path)) => vec![GitHubApp {
                app_id: app_id.clone(),
                installation_ids: self.app_installation_ids.clone(),
                public_key_pem: std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?,
            }],
            _ => Vec::new(),
        };
        let strict = (!self.pats.is_empty() || !apps.is_empty()).then(|| StrictAuth {
            pats: self.pats.clone(),
            apps,
        });
        Ok(Config {
            addr: self.addr,
            advertised_url: self.advertised_url,
            long_poll_timeout: Duration::from_millis(self.long_poll_timeout_ms),
            admin_token_lifetime: Duration::from_secs(self.admin_token_lifetime_secs),
            message_queue_token_lifetime: Duration::from_secs(
                self.message_queue_token_lifetime_secs,
            ),
            session_idle_timeout: (self.session_idle_timeout_secs > 0)
                .then(|| Duration::from_secs(self.session_idle_timeout_secs)),
            runner_groups: self.runner_groups,
            strict,
            auto_online_runners: self.auto_online_runners,
            auto_start_jobs: self.auto_start_jobs,
            auto_complete_after: self.auto_complete_after_ms.map(Duration::from_millis),
            runner_lost_timeout: self.runner_lost_timeout_ms.map(Duration::from_millis),
            byte_order_mark: self.byte_order_mark,
            seed: self.seed,
            job_delivery: self.job_delivery,
            ..Config::default()
        })
    }
}

async fn terminated() -> anyhow::Result<()> {
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("waiting for SIGINT"),
        _ = sigterm.recv() => Ok(()),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let config = Args::parse().into_config()?;
    let fake = FakeActionsService::start(config)
        .await
        .context("starting the fake")?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", fake.base_url()).context("printing the base URL")?;
    stdout.flush().context("flushing stdout")?;
    drop(stdout);
    terminated().await?;
    tracing::info!("shutting down");
    fake.shutdown().await.context("stopping the fake")
}
