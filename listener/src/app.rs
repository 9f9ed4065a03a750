//! Wiring: from a validated config to a running listener (Actions client, Kubernetes target, metrics, HTTP
//! servers, message loop) and back down again.

use std::net::SocketAddr;
use std::sync::Arc;

use actions_client::{
    ClientOptions, Credentials, GitHubAppCredentials, ProxyConfig, ProxyServer, ProxySettings,
    SecretString, SessionId, SystemInfo, TlsRoots,
};
use crds::appconfig::GitHubCredentials;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::{AZURE_KEY_VAULT, AzureProxy, Config, ConfigProblem};
use crate::error::{Error, Result};
use crate::health::Health;
use crate::listener::{MessageLoop, ScaleSet, Settings};
use crate::metrics::{Metrics, ScaleSetIdentity};
use crate::policy::Policy;
use crate::server::{BoundServer, Routes};
use crate::status::{Publisher, Timing};
use crate::target::KubeTarget;

/// Where a listener runs.
enum Hosting {
    /// In a process of its own: it serves its metrics and `/healthz`.
    Process,
    /// Inside the manager, which serves its metrics; `predecessor` is the session to delete before creating one.
    Embedded { predecessor: Option<SessionId> },
}

/// Subsystem name in the User-Agent, as ARC's listener sends it.
const SUBSYSTEM: &str = "ghalistener";

/// A listener whose servers are bound and whose clients are built, ready to run.
pub struct Listener {
    message_loop: MessageLoop<KubeTarget>,
    /// Its metrics, for a host that serves them (the manager's listener mode).
    metrics: Option<MetricsSource>,
    /// Writes the loop's reports into the AutoscalingListener's status, when the environment names it.
    publisher: Option<Publisher>,
    servers: Vec<BoundServer>,
    metrics_addr: Option<SocketAddr>,
    health_addr: Option<SocketAddr>,
}

/// One listener's metrics as a host serves them: its registry, and its progress for the poll-age gauge.
#[derive(Clone)]
pub struct MetricsSource {
    metrics: Arc<Metrics>,
    health: Health,
}

impl MetricsSource {
    /// The OpenMetrics text of this listener's metrics, with the poll age as of now.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        self.metrics
            .encode(self.health.last_poll_age().as_secs_f64())
    }
}

impl Listener {
    /// Prepares everything that can fail on configuration alone, so such failures end the process before any
    /// session exists, and binds the metrics and health servers. `config` must have passed [`Config::validate`].
    pub async fn start(config: &Config, kube: kube::Client, settings: Settings) -> Result<Self> {
        Self::build(config, kube, settings, Hosting::Process).await
    }

    /// A listener inside another process, the manager's listener mode: it binds no server (the host serves
    /// [`Listener::metrics`], and the AutoscalingListener's status is its health), and deletes `predecessor`, the
    /// session a listener before it recorded there, before it creates its own.
    pub async fn embedded(
        config: &Config,
        kube: kube::Client,
        settings: Settings,
        predecessor: Option<SessionId>,
    ) -> Result<Self> {
        Self::build(config, kube, settings, Hosting::Embedded { predecessor }).await
    }

    async fn build(
        config: &Config,
        kube: kube::Client,
        settings: Settings,
        hosting: Hosting,
    ) -> Result<Self> {
        let github = config.github_config()?;
        let credentials = resolve_credentials(config, vault::Options::from_env()).await?;
        let max_runners = u32::try_from(config.max_runners).map_err(|_| {
            Error::ValidateConfig(crate::config::ConfigProblem::MaxRunnersOutOfRange(
                config.max_runners,
            ))
        })?;
        let health = Health::new(settings.health_limit);
        let metrics = if config.metrics_enabled() {
            let identity = ScaleSetIdentity::new(
                &github,
                &config.ephemeral_runner_set_namespace,
                &config.ephemeral_runner_set_name,
            );
            let metrics =
                Metrics::new(identity, config.metrics.as_ref()).map_err(Error::ValidateConfig)?;
            metrics.record_bounds(config.min_runners, config.max_runners);
            Some(Arc::new(metrics))
        } else {
            None
        };

        let mut servers = Vec::new();
        let (mut metrics_addr, mut health_addr) = (None, None);
        let (serve, predecessor) = match hosting {
            Hosting::Process => (true, None),
            Hosting::Embedded { predecessor } => (false, predecessor),
        };
        let health_address = config.health_address().filter(|_| serve);
        if let Some(metrics) = metrics.as_ref().filter(|_| serve) {
            let shared = config.health_shares_metrics_server();
            let routes = Routes {
                metrics: Some((Arc::clone(metrics), config.metrics_path().to_owned())),
                health: shared,
                progress: health.clone(),
            };
            let server = BoundServer::bind("metrics", &config.metrics_addr, routes).await?;
            metrics_addr = server.local_addr();
            if shared {
                health_addr = metrics_addr;
            }
            servers.push(server);
        }
        if let Some(addr) = health_address
            && health_addr.is_none()
        {
            let routes = Routes {
                metrics: None,
                health: true,
                progress: health.clone(),
            };
            match BoundServer::bind("health", addr, routes).await {
                Ok(server) => {
                    health_addr = server.local_addr();
                    servers.push(server);
                }
                // Only an address someone asked for is worth dying over; the implicit default may be taken when
                // several listeners share a host (local runs), and then the probe reports the problem instead.
                Err(error) if config.health_addr.is_none() => tracing::error!(
                    error = %crate::listener::error_chain(&error),
                    "the default health address is unavailable; serving no /healthz (set health_addr)"
                ),
                Err(error) => return Err(error),
            }
        }

        let mut http = settings.http.clone();
        http.proxy = ProxyConfig::Environment;
        if !config.server_root_ca.is_empty() {
            http.tls_roots = TlsRoots::SystemAnd(config.server_root_ca.clone());
        }
        let scale_set = ScaleSet {
            github,
            credentials,
            client_options: ClientOptions {
                system_info: system_info(config.runner_scale_set_id),
                http,
            },
            id: config.runner_scale_set_id,
            owner_name: owner_name(),
            min_runners: config.min_runners,
            max_runners,
        };
        let publisher = config.status_target.as_ref().map(|target| {
            Publisher::new(
                kube.clone(),
                target,
                Timing::with_heartbeat(settings.status_heartbeat),
                settings.poll_stale_after(),
                settings.close_timeout,
            )
        });
        let target = KubeTarget::new(
            kube,
            &config.ephemeral_runner_set_namespace,
            &config.ephemeral_runner_set_name,
        );
        let policy = Policy::new(
            config.schedules()?,
            config.min_runners,
            config.max_runners,
            config.scale_down_delay(),
        );
        if policy.is_active() {
            tracing::info!(
                schedules = config.min_runners_schedules.len(),
                scale_down_delay_secs = config.scale_down_delay().as_secs(),
                "scheduled minimums or a scale-down delay configured"
            );
        }
        let source = metrics.as_ref().map(|metrics| MetricsSource {
            metrics: Arc::clone(metrics),
            health: health.clone(),
        });
        let message_loop = MessageLoop::new(scale_set, settings, target, metrics, health)?
            .with_policy(policy)
            .with_predecessor(predecessor);
        Ok(Self {
            message_loop,
            metrics: source,
            publisher,
            servers,
            metrics_addr,
            health_addr,
        })
    }

    /// The loop's reports (what it writes into the AutoscalingListener's status).
    pub fn status(&self) -> tokio::sync::watch::Receiver<crate::status::Report> {
        self.message_loop.status()
    }

    /// Asks for the AutoscalingListener's status to be written again at once (see [`Publisher::rewriter`]); `None`
    /// when the listener reports to none.
    pub fn status_rewriter(&self) -> Option<Arc<tokio::sync::Notify>> {
        self.publisher.as_ref().map(Publisher::rewriter)
    }

    /// Its metrics, when the config enables them.
    pub fn metrics(&self) -> Option<MetricsSource> {
        self.metrics.clone()
    }

    /// Where metrics are served, once bound.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Where `/healthz` is served, once bound.
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health_addr
    }

    /// Runs the loop and the servers until `shutdown` is cancelled or something unrecoverable happens. The
    /// servers outlive the loop, so health and metrics stay visible while the session is being deleted.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let loop_token = shutdown.child_token();
        let server_token = CancellationToken::new();
        let mut servers = JoinSet::new();
        for server in self.servers {
            servers.spawn(server.serve(server_token.clone()));
        }
        // The publisher stops by itself once the loop has ended and its last report is written.
        let publisher = self.publisher.map(|publisher| {
            tokio::spawn(publisher.run(self.message_loop.status()).in_current_span())
        });
        let message_loop = self.message_loop.run(loop_token.clone());
        tokio::pin!(message_loop);
        let mut server_error = None;
        let outcome = loop {
            tokio::select! {
                outcome = &mut message_loop => break outcome,
                Some(joined) = servers.join_next(), if !servers.is_empty() => {
                    // A server only stops early by failing; ARC stops the listener then too.
                    if let Ok(Err(error)) = joined {
                        tracing::error!(error = %crate::listener::error_chain(&error), "HTTP server failed; stopping");
                        server_error = Some(error);
                        loop_token.cancel();
                    }
                }
            }
        };
        if let Some(publisher) = publisher {
            // A panic in it is already logged by tokio; it has nothing else to report.
            let _ = publisher.await;
        }
        server_token.cancel();
        while let Some(joined) = servers.join_next().await {
            if let Ok(Err(error)) = joined {
                server_error.get_or_insert(error);
            }
        }
        outcome?;
        server_error.map_or(Ok(()), Err)
    }
}

fn system_info(scale_set_id: i64) -> SystemInfo {
    SystemInfo {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        commit_sha: option_env!("ARC_RS_COMMIT").unwrap_or("NA").to_owned(),
        scale_set_id,
        subsystem: SUBSYSTEM.to_owned(),
        ..SystemInfo::default()
    }
}

/// The session owner: the host name (the pod name in a cluster), else a random UUID, as in ARC.
pub fn owner_name() -> String {
    let from_kernel = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned());
    let from_env = std::env::var("HOSTNAME").ok();
    if let Some(name) = from_kernel
        .into_iter()
        .chain(from_env)
        .find(|name| !name.is_empty())
    {
        return name;
    }
    let uuid = random_uuid();
    tracing::info!(uuid = %uuid, "host name unavailable; using a random session owner name");
    uuid
}

/// A random version-4 UUID string.
fn random_uuid() -> String {
    use std::hash::{BuildHasher, RandomState};
    let state = RandomState::new();
    let high = state.hash_one(1u8);
    let low = state.hash_one(2u8);
    let high = (high & 0xffff_ffff_ffff_0fff) | 0x4000;
    let low = (low & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        high >> 32,
        (high >> 16) & 0xffff,
        high & 0xffff,
        low >> 48,
        low & 0xffff_ffff_ffff
    )
}

/// The GitHub credentials: the config file's, or with `vault_type` `azure_key_vault` the JSON value of the vault
/// secret `vault_lookup_key`, validated as the manager validates it (the same `vault` crate). `options` says how
/// Entra ID and the vault are reached; the config's `azure_key_vault.proxy`, when set, replaces its proxy.
pub async fn resolve_credentials(config: &Config, options: vault::Options) -> Result<Credentials> {
    if config.vault_type != AZURE_KEY_VAULT {
        return config.credentials();
    }
    let azure = config
        .azure_key_vault
        .as_ref()
        .ok_or(Error::ValidateConfig(ConfigProblem::MissingAzureKeyVault))?;
    let mut options = options;
    if let Some(proxy) = &azure.proxy {
        options.proxy = ProxyConfig::Explicit(vault_proxy(proxy));
    }
    let settings = vault::KeyVaultSettings {
        url: azure.url.clone(),
        tenant_id: azure.tenant_id.clone(),
        client_id: azure.client_id.clone(),
        certificate_path: azure.certificate_path.clone().into(),
    };
    let vault_error = |error| Error::ReadVaultCredentials(Box::new(error));
    let client = vault::KeyVaultClient::new(settings, options).map_err(vault_error)?;
    let credentials = client
        .github_credentials(&config.vault_lookup_key)
        .await
        .map_err(vault_error)?;
    Ok(match credentials {
        GitHubCredentials::Token(token) => Credentials::Pat(SecretString::new(token)),
        GitHubCredentials::App {
            app_id,
            installation_id,
            private_key,
        } => Credentials::App(GitHubAppCredentials {
            client_id: app_id,
            installation_id,
            private_key: SecretString::new(private_key),
        }),
    })
}

/// The vault proxy of the listener config (Go's `httpproxy.Config` field names) as proxy settings.
fn vault_proxy(proxy: &AzureProxy) -> ProxySettings {
    let server = |url: &str| (!url.trim().is_empty()).then(|| ProxyServer::new(url.trim()));
    ProxySettings {
        http: server(&proxy.http_proxy),
        https: server(&proxy.https_proxy),
        no_proxy: proxy
            .no_proxy
            .split(',')
            .map(|entry| entry.trim().to_ascii_lowercase())
            .filter(|entry| !entry.is_empty())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_uuid_has_the_v4_shape() {
        let uuid = random_uuid();
        let parts: Vec<&str> = uuid.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12],
            "{uuid}"
        );
        assert!(parts[2].starts_with('4'), "{uuid}");
        assert!(matches!(&parts[3][..1], "8" | "9" | "a" | "b"), "{uuid}");
        assert_ne!(random_uuid(), uuid);
    }

    #[test]
    fn owner_name_is_never_empty() {
        assert!(!owner_name().is_empty());
    }

    #[test]
    fn the_vault_proxy_of_the_config_becomes_proxy_settings() {
        let settings = super::vault_proxy(&crate::config::AzureProxy {
            http_proxy: String::new(),
            https_proxy: " http://proxy:3128 ".to_owned(),
            no_proxy: "Example.com, .internal,,".to_owned(),
            cgi: false,
        });
        assert!(settings.http.is_none());
        assert_eq!(
            settings.https.map(|server| server.url),
            Some("http://proxy:3128".to_owned())
        );
        assert_eq!(settings.no_proxy, ["example.com", ".internal"]);
    }
}
