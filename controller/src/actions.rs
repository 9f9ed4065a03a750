//! Actions Service clients for the reconcilers: credentials from the Secret a resource names, its proxy and CA
//! settings, a cache keyed by what the client was built from, and a deadline plus a metric on every call
//! (docs/reference/controllers.md, "Credentials Secret" and "Actions Service calls by controller").
//!
//! The credentials Secret is read directly (Secrets are not watched, as in ARC) when a client is needed, reusing a
//! read for at most two seconds, so a rotated Secret takes effect within seconds without restarting anything
//! (docs/reference/beyond-arc.md, item 14).
//!
//! With `vaultConfig` type `azure_key_vault`, the credentials are the JSON value of the vault secret named by
//! `githubConfigSecret`, read through the `vault` crate (Entra ID certificate credentials, token cached); the
//! value is reused for the same two seconds. Failures carry the vault crate's reason (`VaultSecretNotFound`, ...).

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actions_client::{
    ActionsClient, ClientOptions, Credentials, ErrorKind, GitHubAppCredentials, GitHubConfig,
    HttpOptions, JitRunnerConfig, JitSetting, ProxySettings, RerunOutcome, RunnerReference,
    SecretString, SystemInfo, Timeouts, TlsRoots, WorkflowJob,
};
use crds::appconfig::{AppConfig, GitHubCredentials};
use crds::common::{ProxyConfig, TlsConfig, VAULT_TYPE_AZURE_KEY_VAULT, VaultConfig};
use crds::{EphemeralRunner, EphemeralRunnerSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};

use crate::error::{Error, Result};
use crate::metrics::{ActionsCallLabels, Metrics};

/// Subsystem reported to GitHub in the user agent, as ARC's controller does.
const SUBSYSTEM: &str = "gha-scale-set-controller";

/// What an Actions client is built from: the fields of an ARS, ERS or ER that name credentials, proxy and CA,
/// and the namespace they are read from.
#[derive(Debug, Clone, Copy)]
pub struct ClientSource<'a> {
    /// Namespace of the resource; Secrets and ConfigMaps are read there.
    pub namespace: &'a str,
    /// `githubConfigUrl`.
    pub github_config_url: &'a str,
    /// `githubConfigSecret`.
    pub github_config_secret: &'a str,
    /// `proxy`.
    pub proxy: Option<&'a ProxyConfig>,
    /// `githubServerTLS`.
    pub tls: Option<&'a TlsConfig>,
    /// `vaultConfig`.
    pub vault: Option<&'a VaultConfig>,
}

impl<'a> ClientSource<'a> {
    /// The settings of a runner spec (ERS template or ER) in `namespace`.
    pub fn for_spec(namespace: &'a str, spec: &'a EphemeralRunnerSpec) -> Self {
        Self {
            namespace,
            github_config_url: &spec.github_config_url,
            github_config_secret: &spec.github_config_secret,
            proxy: spec.proxy.as_ref(),
            tls: spec.github_server_tls.as_ref(),
            vault: spec.vault_config.as_ref(),
        }
    }

    /// The settings of an EphemeralRunner.
    pub fn for_runner(runner: &'a EphemeralRunner) -> Self {
        Self::for_spec(
            runner.metadata.namespace.as_deref().unwrap_or_default(),
            &runner.spec,
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    namespace: String,
    url: String,
    secret: String,
}

/// Builds and caches Actions clients. One cached client per (namespace, config URL, Secret name); it is
/// replaced when anything it was built from changes (credentials, proxy, CA).
pub struct ActionsClients {
    kube: Client,
    timeout: Duration,
    version: String,
    metrics: Arc<Metrics>,
    cache: Mutex<HashMap<CacheKey, (u64, ActionsClient)>>,
    /// Credentials Secrets read in the last [`CREDENTIALS_FRESHNESS`], by namespace and name.
    secrets: Mutex<HashMap<(String, String), (std::time::Instant, Secret)>>,
    /// One credentials read at a time: when the cached copy goes stale, every runner reconciling at that moment
    /// would otherwise read the same Secret at once (up to the runner concurrency, every two seconds).
    secret_reads: tokio::sync::Mutex<()>,
    /// How Azure Key Vault is reached (authority host, deadline, extra roots).
    vault_options: vault::Options,
    /// Key Vault clients (each caching its Entra ID token) by vault settings, with the fingerprint of the proxy
    /// they were built with.
    vaults: Mutex<HashMap<vault::KeyVaultSettings, (u64, Arc<vault::KeyVaultClient>)>>,
    /// Vault secrets read in the last [`CREDENTIALS_FRESHNESS`], by vault settings and secret name: the same
    /// reuse as for Secrets, so a burst of runners does not hit the vault's throttling.
    vault_values:
        Mutex<HashMap<(vault::KeyVaultSettings, String), (std::time::Instant, SecretString)>>,
}

/// How long a credentials Secret read is reused. Every runner needs a client twice (registration and removal),
/// so a burst of 500 runners read the same Secret about a thousand times in a few seconds; a rotation still
/// takes effect within this long.
const CREDENTIALS_FRESHNESS: Duration = Duration::from_secs(2);

/// Everything a client is built from, read from the cluster.
struct Materials {
    credentials: GitHubCredentials,
    proxy: Option<ProxySettings>,
    ca: Option<String>,
}

impl Materials {
    /// A fingerprint of the materials, to notice a change; kept in memory only.
    fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        match &self.credentials {
            GitHubCredentials::Token(token) => ("token", token).hash(&mut hasher),
            GitHubCredentials::App {
                app_id,
                installation_id,
                private_key,
            } => ("app", app_id, installation_id, private_key).hash(&mut hasher),
        }
        hash_proxy(self.proxy.as_ref(), &mut hasher);
        self.ca.hash(&mut hasher);
        hasher.finish()
    }
}

/// A vault failure of the resource `source`.
fn vault_error(source: &ClientSource<'_>, error: vault::Error) -> Error {
    Error::ReadVaultCredentials {
        namespace: source.namespace.to_owned(),
        source: Box::new(error),
    }
}

/// Feeds proxy settings (credentials included, to notice a rotation) into a fingerprint.
fn hash_proxy(proxy: Option<&ProxySettings>, hasher: &mut DefaultHasher) {
    if let Some(proxy) = proxy {
        for server in [&proxy.http, &proxy.https].into_iter().flatten() {
            server.url.hash(hasher);
            server.username.hash(hasher);
            server
                .password
                .as_ref()
                .map(SecretString::expose_secret)
                .hash(hasher);
        }
        proxy.no_proxy.hash(hasher);
    }
}

impl ActionsClients {
    /// Clients whose every call ends within `timeout`.
    pub fn new(kube: Client, timeout: Duration, version: String, metrics: Arc<Metrics>) -> Self {
        Self {
            kube,
            timeout,
            version,
            metrics,
            cache: Mutex::new(HashMap::new()),
            secrets: Mutex::new(HashMap::new()),
            secret_reads: tokio::sync::Mutex::new(()),
            vault_options: vault::Options::default(),
            vaults: Mutex::new(HashMap::new()),
            vault_values: Mutex::new(HashMap::new()),
        }
    }

    /// The credentials in `source`'s Azure Key Vault secret, or `None` when it has no such vault. The
    /// AutoscalingListener controller folds them into the listener config's hash, so a new version in the vault
    /// restarts the listener with it, as a changed credentials Secret does.
    pub async fn vault_app_config(&self, source: &ClientSource<'_>) -> Result<Option<AppConfig>> {
        match source
            .vault
            .filter(|vault| vault.type_ == VAULT_TYPE_AZURE_KEY_VAULT)
        {
            Some(vault) => Ok(Some(self.vault_credentials(source, vault).await?.into())),
            None => Ok(None),
        }
    }

    /// Reach Azure Key Vault with `options` (the proxy is still each resource's `vaultConfig.proxy` when set).
    pub fn with_vault_options(mut self, options: vault::Options) -> Self {
        self.vault_options = options;
        self
    }

    /// A client for `source`, reading its credentials, proxy credentials and CA now.
    pub async fn get(&self, source: &ClientSource<'_>) -> Result<Actions> {
        let materials = self.read_materials(source).await?;
        let fingerprint = materials.fingerprint();
        let key = CacheKey {
            namespace: source.namespace.to_owned(),
            url: source.github_config_url.to_owned(),
            secret: source.github_config_secret.to_owned(),
        };
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&key)
            .filter(|(print, _)| *print == fingerprint)
            .map(|(_, client)| client.clone());
        let client = match cached {
            Some(client) => client,
            None => {
                let client = self.build(source.github_config_url, materials)?;
                self.cache
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(key, (fingerprint, client.clone()));
                client
            }
        };
        Ok(Actions {
            client,
            timeout: self.timeout,
            metrics: Arc::clone(&self.metrics),
        })
    }

    fn build(&self, url: &str, materials: Materials) -> Result<ActionsClient> {
        let build_error = |source| Error::BuildActionsClient {
            url: url.to_owned(),
            source,
        };
        let config = GitHubConfig::parse(url).map_err(build_error)?;
        let credentials = match materials.credentials {
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
        };
        let options = ClientOptions {
            system_info: SystemInfo {
                version: self.version.clone(),
                commit_sha: self.version.clone(),
                subsystem: SUBSYSTEM.to_owned(),
                ..SystemInfo::default()
            },
            http: HttpOptions {
                timeouts: Timeouts {
                    request: self.timeout.min(Duration::from_secs(15)),
                    call: self.timeout,
                    ..Timeouts::default()
                },
                proxy: match materials.proxy {
                    Some(settings) => actions_client::ProxyConfig::Explicit(settings),
                    None => actions_client::ProxyConfig::Environment,
                },
                tls_roots: match materials.ca {
                    Some(pem) => TlsRoots::SystemAnd(pem),
                    None => TlsRoots::System,
                },
                ..HttpOptions::default()
            },
        };
        ActionsClient::new(config, &credentials, options).map_err(build_error)
    }

    /// The credentials Secret, read at most every [`CREDENTIALS_FRESHNESS`]; a missing one is never remembered.
    async fn credentials_secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>> {
        let key = (namespace.to_owned(), name.to_owned());
        let fresh = || {
            self.secrets
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&key)
                .filter(|(read_at, _)| read_at.elapsed() < CREDENTIALS_FRESHNESS)
                .map(|(_, secret)| secret.clone())
        };
        if let Some(secret) = fresh() {
            return Ok(Some(secret));
        }
        let _reading = self.secret_reads.lock().await;
        // Whoever held the lock before may have just read it.
        if let Some(secret) = fresh() {
            return Ok(Some(secret));
        }
        let secret = read_secret(&self.kube, namespace, name).await?;
        let mut secrets = self
            .secrets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        secrets.retain(|_, (read_at, _)| read_at.elapsed() < CREDENTIALS_FRESHNESS);
        match &secret {
            Some(found) => {
                secrets.insert(key, (std::time::Instant::now(), found.clone()));
            }
            None => {
                secrets.remove(&key);
            }
        }
        Ok(secret)
    }

    async fn read_materials(&self, source: &ClientSource<'_>) -> Result<Materials> {
        let credentials = match source.vault.filter(|vault| !vault.type_.is_empty()) {
            Some(vault) if vault.type_ == VAULT_TYPE_AZURE_KEY_VAULT => {
                self.vault_credentials(source, vault).await?
            }
            Some(vault) => {
                return Err(Error::UnsupportedVault {
                    vault_type: vault.type_.clone(),
                });
            }
            None => self.secret_credentials(source).await?,
        };
        let azure_vault = source
            .vault
            .filter(|vault| vault.type_ == VAULT_TYPE_AZURE_KEY_VAULT);
        let proxy = match (source.proxy, azure_vault) {
            // With a vault, `credentialSecretRef` names a vault secret, as in ARC.
            (Some(proxy), Some(vault)) => {
                Some(self.vault_proxy_settings(source, vault, proxy).await?)
            }
            (Some(proxy), None) => {
                Some(crate::proxy::client_settings(&self.kube, source.namespace, proxy).await?)
            }
            (None, _) => None,
        };
        let ca = match source.tls {
            Some(tls) => Some(read_ca(&self.kube, source.namespace, tls).await?),
            None => None,
        };
        Ok(Materials {
            credentials,
            proxy,
            ca,
        })
    }

    /// The credentials in the Kubernetes Secret `githubConfigSecret`.
    async fn secret_credentials(&self, source: &ClientSource<'_>) -> Result<GitHubCredentials> {
        let secret = self
            .credentials_secret(source.namespace, source.github_config_secret)
            .await?
            .ok_or_else(|| Error::CredentialsSecretMissing {
                namespace: source.namespace.to_owned(),
                name: source.github_config_secret.to_owned(),
            })?;
        let read_error = |source_error| Error::ReadCredentials {
            namespace: source.namespace.to_owned(),
            name: source.github_config_secret.to_owned(),
            source: source_error,
        };
        AppConfig::from_secret_data(&secret.data.unwrap_or_default())
            .and_then(|config| config.credentials())
            .map_err(read_error)
    }

    /// The credentials in the Azure Key Vault secret `githubConfigSecret` (docs/reference/controllers.md,
    /// "Azure Key Vault"), validated like a Secret's.
    async fn vault_credentials(
        &self,
        source: &ClientSource<'_>,
        vault_config: &VaultConfig,
    ) -> Result<GitHubCredentials> {
        let name = source.github_config_secret;
        let value = self.vault_secret(source, vault_config, name).await?;
        vault::parse_app_config(name, &value).map_err(|error| vault_error(source, error))
    }

    /// The Actions client's proxy settings when a vault is configured: each `credentialSecretRef` is a vault
    /// secret holding JSON `{"username", "password"}`.
    async fn vault_proxy_settings(
        &self,
        source: &ClientSource<'_>,
        vault_config: &VaultConfig,
        proxy: &ProxyConfig,
    ) -> Result<ProxySettings> {
        crate::proxy::settings_with(proxy, |config| async move {
            if config.credential_secret_ref.is_empty() {
                return Ok(None);
            }
            let name = &config.credential_secret_ref;
            let value = self.vault_secret(source, vault_config, name).await?;
            vault::parse_proxy_credentials(name, &value)
                .map(Some)
                .map_err(|error| vault_error(source, error))
        })
        .await
    }

    /// The value of the vault secret `name`, read through a cached client (its Entra ID token reused until
    /// shortly before expiry) and reused for at most [`CREDENTIALS_FRESHNESS`] like a Secret, so a new version
    /// takes effect within seconds and a burst of runners does not hit the vault's throttling.
    async fn vault_secret(
        &self,
        source: &ClientSource<'_>,
        vault_config: &VaultConfig,
        name: &str,
    ) -> Result<SecretString> {
        let azure = vault_config.azure_key_vault.as_ref().ok_or_else(|| {
            vault_error(
                source,
                vault::Error::CheckSettings {
                    field: "vaultConfig.azureKeyVault",
                    reason: "missing; set url, tenantId, clientId and certificatePath".to_owned(),
                },
            )
        })?;
        let settings = vault::KeyVaultSettings::from(azure);
        let key = (settings.clone(), name.to_owned());
        let fresh = || {
            self.vault_values
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&key)
                .filter(|(read_at, _)| read_at.elapsed() < CREDENTIALS_FRESHNESS)
                .map(|(_, value)| value.clone())
        };
        if let Some(value) = fresh() {
            return Ok(value);
        }
        let _reading = self.secret_reads.lock().await;
        if let Some(value) = fresh() {
            return Ok(value);
        }
        let proxy = match &vault_config.proxy {
            Some(proxy) => {
                Some(crate::proxy::client_settings(&self.kube, source.namespace, proxy).await?)
            }
            None => None,
        };
        let client = self
            .vault_client(settings, proxy)
            .map_err(|error| vault_error(source, error))?;
        let result = client
            .secret(name)
            .await
            .map_err(|error| vault_error(source, error));
        let mut values = self
            .vault_values
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        values.retain(|_, (read_at, _)| read_at.elapsed() < CREDENTIALS_FRESHNESS);
        match &result {
            Ok(value) => {
                values.insert(key, (std::time::Instant::now(), value.clone()));
            }
            Err(_) => {
                values.remove(&key);
            }
        }
        result
    }

    /// The cached client for `settings`, rebuilt when its proxy settings change.
    fn vault_client(
        &self,
        settings: vault::KeyVaultSettings,
        proxy: Option<ProxySettings>,
    ) -> std::result::Result<Arc<vault::KeyVaultClient>, vault::Error> {
        let fingerprint = {
            let mut hasher = DefaultHasher::new();
            hash_proxy(proxy.as_ref(), &mut hasher);
            hasher.finish()
        };
        let mut vaults = self
            .vaults
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((print, client)) = vaults.get(&settings)
            && *print == fingerprint
        {
            return Ok(Arc::clone(client));
        }
        let mut options = self.vault_options.clone();
        if let Some(proxy) = proxy {
            options.proxy = actions_client::ProxyConfig::Explicit(proxy);
        }
        let client = Arc::new(vault::KeyVaultClient::new(settings.clone(), options)?);
        vaults.insert(settings, (fingerprint, Arc::clone(&client)));
        Ok(client)
    }
}

/// Reads a Secret directly from the API server; `None` when it does not exist.
pub async fn read_secret(client: &Client, namespace: &str, name: &str) -> Result<Option<Secret>> {
    Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|source| Error::GetSecret {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source: Box::new(source),
        })
}

async fn read_ca(client: &Client, namespace: &str, tls: &TlsConfig) -> Result<String> {
    let fail = |reason: String| Error::ReadTlsCertificate { reason };
    let selector = tls
        .certificate_from
        .as_ref()
        .ok_or_else(|| fail("githubServerTLS.certificateFrom is missing".to_owned()))?
        .config_map_key_ref
        .as_ref()
        .ok_or_else(|| {
            fail("githubServerTLS.certificateFrom.configMapKeyRef is missing".to_owned())
        })?;
    let config_map = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(&selector.name)
        .await
        .map_err(|e| fail(format!("get ConfigMap {namespace}/{}: {e}", selector.name)))?
        .ok_or_else(|| {
            fail(format!(
                "ConfigMap {namespace}/{} does not exist",
                selector.name
            ))
        })?;
    config_map
        .data
        .and_then(|mut data| data.remove(&selector.key))
        .ok_or_else(|| {
            fail(format!(
                "ConfigMap {namespace}/{} has no key {:?}",
                selector.name, selector.key
            ))
        })
}

/// What removing a runner registration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The registration is gone (or never existed).
    Removed,
    /// The service refused: the runner is running a job.
    JobStillRunning,
}

/// An Actions client with a deadline and a metric on every call.
#[derive(Debug, Clone)]
pub struct Actions {
    client: ActionsClient,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Actions {
    /// Runs `call` with the deadline; the client has its own deadline too, this one also bounds token refreshes.
    async fn call<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = actions_client::Result<T>>,
    ) -> Result<actions_client::Result<T>> {
        // A little slack so the client's own deadline (with its better error) usually fires first.
        let deadline = self.timeout + Duration::from_secs(2);
        let outcome = tokio::time::timeout(deadline, call).await;
        let result = match &outcome {
            Ok(Ok(_)) => "ok",
            Ok(Err(_)) => "error",
            Err(_) => "timeout",
        };
        self.metrics
            .actions_requests
            .get_or_create(&ActionsCallLabels { operation, result })
            .inc();
        outcome.map_err(|_| Error::ActionsDeadline {
            operation,
            after: deadline,
        })
    }

    /// Registers runner `name` in scale set `scale_set_id` and returns its JIT configuration.
    pub async fn generate_jit_config(
        &self,
        scale_set_id: i64,
        name: &str,
        work_folder: &str,
    ) -> Result<JitRunnerConfig> {
        let setting = JitSetting {
            name: name.to_owned(),
            work_folder: work_folder.to_owned(),
        };
        self.call(
            "generate_jit_config",
            self.client
                .generate_jit_runner_config(scale_set_id, &setting),
        )
        .await?
        .map_err(|source| Error::GenerateJitConfig {
            runner: name.to_owned(),
            source,
        })
    }

    /// Removes a runner registration. An unknown runner counts as removed.
    pub async fn remove_runner(&self, runner_id: i64) -> Result<Removal> {
        match self
            .call("remove_runner", self.client.remove_runner(runner_id))
            .await?
        {
            Ok(()) => Ok(Removal::Removed),
            Err(error) if error.is(ErrorKind::JobStillRunning) => Ok(Removal::JobStillRunning),
            // The service answers 204 for unknown runners; an explicit "not found" means the same: it is gone.
            Err(error) if error.is(ErrorKind::RunnerNotFound) => Ok(Removal::Removed),
            Err(source) => Err(Error::RemoveRunner { runner_id, source }),
        }
    }

    /// The runner with `runner_id`, or `None` when the service does not know it.
    pub async fn get_runner(&self, runner_id: i64) -> Result<Option<RunnerReference>> {
        match self
            .call("get_runner", self.client.get_runner(runner_id))
            .await?
        {
            Ok(runner) => Ok(Some(runner)),
            Err(error) if error.is(ErrorKind::RunnerNotFound) => Ok(None),
            Err(source) => Err(Error::GetRunner {
                runner: runner_id.to_string(),
                source,
            }),
        }
    }

    /// The runner named `name`, or `None`.
    pub async fn get_runner_by_name(&self, name: &str) -> Result<Option<RunnerReference>> {
        self.call("get_runner_by_name", self.client.get_runner_by_name(name))
            .await?
            .map_err(|source| Error::GetRunner {
                runner: name.to_owned(),
                source,
            })
    }
}

/// GitHub's REST API, for the re-run of jobs the cluster interrupted.
impl Actions {
    /// Every attempt of every job of workflow run `run_id` of `repository` (`owner/repo`).
    pub async fn list_workflow_run_jobs(
        &self,
        repository: &str,
        run_id: i64,
    ) -> Result<Vec<WorkflowJob>> {
        self.call(
            "list_workflow_run_jobs",
            self.client.list_workflow_run_jobs(repository, run_id),
        )
        .await?
        .map_err(|source| Error::ListWorkflowRunJobs {
            repository: repository.to_owned(),
            run_id,
            source,
        })
    }

    /// Asks GitHub to re-run job `job_id` (a REST id) of `repository`.
    pub async fn rerun_workflow_job(&self, repository: &str, job_id: i64) -> Result<RerunOutcome> {
        self.call(
            "rerun_workflow_job",
            self.client.rerun_workflow_job(repository, job_id),
        )
        .await?
        .map_err(|source| Error::RerunWorkflowJob {
            repository: repository.to_owned(),
            job_id,
            source,
        })
    }
}

/// Scale-set operations of the AutoscalingRunnerSet controller.
impl Actions {
    /// The id of runner group `name`; an empty name is the default group (id 1) without a call.
    pub async fn runner_group_id(&self, name: &str) -> Result<i64> {
        if name.is_empty() {
            return Ok(actions_client::DEFAULT_RUNNER_GROUP_ID);
        }
        self.call(
            "get_runner_group_by_name",
            self.client.get_runner_group_by_name(name),
        )
        .await?
        .map(|group| group.id)
        .map_err(|source| Error::GetRunnerGroup {
            group: name.to_owned(),
            source,
        })
    }

    /// The scale set named `name` in runner group `group_id`, or `None`.
    pub async fn get_scale_set(
        &self,
        group_id: i64,
        name: &str,
    ) -> Result<Option<actions_client::RunnerScaleSet>> {
        self.call(
            "get_runner_scale_set",
            self.client.get_runner_scale_set(group_id, name),
        )
        .await?
        .map_err(|source| Error::GetScaleSet {
            scale_set: name.to_owned(),
            source,
        })
    }

    /// The scale set with `id`, or `None` when the service no longer knows it.
    pub async fn get_scale_set_by_id(
        &self,
        id: i64,
    ) -> Result<Option<actions_client::RunnerScaleSet>> {
        match self
            .call(
                "get_runner_scale_set_by_id",
                self.client.get_runner_scale_set_by_id(id),
            )
            .await?
        {
            Ok(found) => Ok(found),
            Err(error) if error.is(ErrorKind::ScaleSetNotFound) => Ok(None),
            Err(source) => Err(Error::GetScaleSet {
                scale_set: id.to_string(),
                source,
            }),
        }
    }

    /// Creates a scale set.
    pub async fn create_scale_set(
        &self,
        scale_set: &actions_client::RunnerScaleSet,
    ) -> Result<actions_client::RunnerScaleSet> {
        let created = self
            .call(
                "create_runner_scale_set",
                self.client.create_runner_scale_set(scale_set),
            )
            .await?
            .map_err(|source| Error::CreateScaleSet {
                scale_set: scale_set.name.clone(),
                source,
            })?;
        // Later calls of this (cached) client identify the scale set in their User-Agent, as ARC's do.
        self.client.set_scale_set_id(created.id);
        Ok(created)
    }

    /// Updates the fields set in `change` of scale set `id`.
    pub async fn update_scale_set(
        &self,
        id: i64,
        change: &actions_client::RunnerScaleSet,
    ) -> Result<actions_client::RunnerScaleSet> {
        self.call(
            "update_runner_scale_set",
            self.client.update_runner_scale_set(id, change),
        )
        .await?
        .map_err(|source| Error::UpdateScaleSet { id, source })
    }

    /// Deletes scale set `id`; one the service no longer knows counts as deleted.
    pub async fn delete_scale_set(&self, id: i64) -> Result<()> {
        match self
            .call(
                "delete_runner_scale_set",
                self.client.delete_runner_scale_set(id),
            )
            .await?
        {
            Ok(()) => Ok(()),
            Err(error) if error.is(ErrorKind::ScaleSetNotFound) => Ok(()),
            Err(source) => Err(Error::DeleteScaleSet { id, source }),
        }
    }
}

/// Whether `error` is the service saying a runner of that name already exists.
pub fn is_runner_exists(error: &Error) -> bool {
    matches!(error, Error::GenerateJitConfig { source, .. } if source.is(ErrorKind::RunnerExists))
}

/// Whether the credentials Secret is gone, or may no longer be read (Helm removed the permission first): nothing
/// can talk to GitHub for this resource any more (docs/reference/beyond-arc.md, item 13).
pub fn credentials_gone(error: &Error) -> bool {
    match error {
        Error::CredentialsSecretMissing { .. } => true,
        // The vault secret is gone: as with a deleted Secret, nothing can talk to GitHub for this set.
        Error::ReadVaultCredentials { source, .. } => {
            matches!(**source, vault::Error::SecretNotFound { .. })
        }
        Error::GetSecret { source, .. } => crate::error::is_status(source, 403),
        _ => false,
    }
}
