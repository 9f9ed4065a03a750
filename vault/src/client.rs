//! The Key Vault client: an Entra ID token from client credentials with a certificate, cached until shortly
//! before it expires, and the secret read by name with it. Every call has a deadline; the proxy settings apply
//! to both endpoints.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use actions_client::proxy::{no_proxy_list, parse_proxy_url, redact_url};
use actions_client::{ProxyConfig, ProxySettings, SecretString};
use crds::appconfig::{AppConfig, GitHubCredentials};
use crds::common::AzureKeyVaultConfig;
use serde::Deserialize;
use url::Url;

use crate::certificate::{ClientCertificate, new_jti};
use crate::constants::{
    AUTHORITY_HOST_ENV, CLIENT_ASSERTION_TYPE, DEFAULT_AUTHORITY_HOST, DEFAULT_CALL_TIMEOUT,
    KEY_VAULT_API_VERSION, KEY_VAULT_CHALLENGE_PROBE, KEY_VAULT_RESOURCES, TOKEN_REFRESH_MARGIN,
};
use crate::error::{Error, Result, TokenRejection, rejection_hint};

/// Which vault, as which client: `vaultConfig.azureKeyVault` (or the listener config's `azure_key_vault`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyVaultSettings {
    /// The vault URL, `https://<name>.vault.azure.net`.
    pub url: String,
    /// Entra ID tenant (directory) ID.
    pub tenant_id: String,
    /// The app registration's client ID.
    pub client_id: String,
    /// PEM file with the client certificate and its private key.
    pub certificate_path: PathBuf,
}

impl From<&AzureKeyVaultConfig> for KeyVaultSettings {
    fn from(config: &AzureKeyVaultConfig) -> Self {
        Self {
            url: config.url.clone(),
            tenant_id: config.tenant_id.clone(),
            client_id: config.client_id.clone(),
            certificate_path: PathBuf::from(&config.certificate_path),
        }
    }
}

/// How the client connects.
#[derive(Debug, Clone)]
pub struct Options {
    /// Entra ID authority host (`https://login.microsoftonline.com/` in Azure's public cloud).
    pub authority_host: String,
    /// OAuth scope of the token. `None` (the default): the one the vault's authentication challenge names, as
    /// Azure's SDKs do, so a vault in any cloud works; `Some`: this one, without asking.
    pub scope: Option<String>,
    /// Deadline of each call, connecting included.
    pub call_timeout: Duration,
    /// Proxy for both the token endpoint and the vault (`vaultConfig.proxy`, credentials already resolved).
    pub proxy: ProxyConfig,
    /// Extra trusted root certificates (PEM), added to the system's.
    pub extra_root_certificates: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            authority_host: DEFAULT_AUTHORITY_HOST.to_owned(),
            scope: None,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            proxy: ProxyConfig::Environment,
            extra_root_certificates: None,
        }
    }
}

impl Options {
    /// The defaults, with the authority host from `AZURE_AUTHORITY_HOST` when set (the variable Azure's SDKs
    /// read for sovereign clouds and Azure Stack).
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`Options::from_env`] through an environment getter (testable without touching the process
    /// environment).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let mut options = Self::default();
        if let Some(host) = lookup(AUTHORITY_HOST_ENV).filter(|h| !h.trim().is_empty()) {
            options.authority_host = host.trim().to_owned();
        }
        options
    }
}

struct CachedToken {
    token: SecretString,
    refresh_at: Instant,
}

/// Reads secrets from one vault as one client. Cheap to share behind an `Arc`; the token is fetched by one
/// caller at a time and reused by all.
pub struct KeyVaultClient {
    settings: KeyVaultSettings,
    vault: String,
    token_endpoint: String,
    /// The token's scope, once known (from the options, or the vault's challenge).
    scope: std::sync::Mutex<Option<String>>,
    call_timeout: Duration,
    http: reqwest::Client,
    token: tokio::sync::Mutex<Option<CachedToken>>,
}

impl std::fmt::Debug for KeyVaultClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyVaultClient")
            .field("settings", &self.settings)
            .field("token_endpoint", &self.token_endpoint)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: Option<String>,
    expires_in: Option<serde_json::Value>,
}

#[derive(Deserialize, Default)]
struct OAuthError {
    #[serde(default)]
    error: String,
    #[serde(default)]
    error_description: String,
    #[serde(default)]
    error_codes: Vec<u64>,
}

#[derive(Deserialize)]
struct SecretBundle {
    value: Option<String>,
}

#[derive(Deserialize, Default)]
struct VaultErrorBody {
    #[serde(default)]
    error: VaultError,
}

#[derive(Deserialize, Default)]
struct VaultError {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

impl KeyVaultClient {
    /// A client for `settings`; checks the settings (no call is made and the certificate is not read yet).
    pub fn new(settings: KeyVaultSettings, options: Options) -> Result<Self> {
        let vault = check_vault_url(&settings.url)?;
        check_id("tenantId", &settings.tenant_id)?;
        check_id("clientId", &settings.client_id)?;
        if settings.certificate_path.as_os_str().is_empty() {
            return Err(Error::CheckSettings {
                field: "certificatePath",
                reason: "empty; set the path of the PEM file with the certificate and its key"
                    .to_owned(),
            });
        }
        let authority = Url::parse(&options.authority_host)
            .ok()
            .filter(|url| url.scheme() == "https" && url.has_host())
            .ok_or_else(|| Error::CheckSettings {
                field: "authorityHost",
                reason: format!("{:?} is not an https URL", options.authority_host),
            })?;
        let token_endpoint = format!(
            "{}/{}/oauth2/v2.0/token",
            authority.as_str().trim_end_matches('/'),
            settings.tenant_id
        );
        let http = build_http_client(&options)?;
        Ok(Self {
            settings,
            vault,
            token_endpoint,
            scope: std::sync::Mutex::new(options.scope),
            call_timeout: options.call_timeout,
            http,
            token: tokio::sync::Mutex::new(None),
        })
    }

    /// The settings the client was built from.
    pub fn settings(&self) -> &KeyVaultSettings {
        &self.settings
    }

    /// The token endpoint (also the client assertion's audience).
    pub fn token_endpoint(&self) -> &str {
        &self.token_endpoint
    }

    /// The GitHub credentials in the secret `name`: its JSON value parsed and validated as a Kubernetes Secret's
    /// keys are.
    pub async fn github_credentials(&self, name: &str) -> Result<GitHubCredentials> {
        let value = self.secret(name).await?;
        parse_app_config(name, &value)
    }

    /// The proxy credentials in the secret `name` (JSON `{"username", "password"}`), for a `credentialSecretRef`
    /// when a vault is configured.
    pub async fn proxy_credentials(&self, name: &str) -> Result<(String, SecretString)> {
        let value = self.secret(name).await?;
        parse_proxy_credentials(name, &value)
    }

    /// The current value of the secret `name` (its latest version, so a rotation is seen on the next read).
    pub async fn secret(&self, name: &str) -> Result<SecretString> {
        check_secret_name(name)?;
        let (token, cached) = self.token().await?;
        match self.read_secret(name, &token).await {
            // A cached token the vault no longer accepts (revoked, clock skew): fetch a fresh one, once.
            Err(Error::SecretAccessDenied { status: 401, .. }) if cached => {
                self.forget_token().await;
                let (token, _) = self.token().await?;
                self.read_secret(name, &token).await
            }
            other => other,
        }
    }

    async fn read_secret(&self, name: &str, token: &SecretString) -> Result<SecretString> {
        let url = format!(
            "{}/secrets/{name}?api-version={KEY_VAULT_API_VERSION}",
            self.vault
        );
        let fail = |reason: String| Error::ReadSecret {
            vault: self.vault.clone(),
            name: name.to_owned(),
            reason,
        };
        let request = self
            .http
            .get(&url)
            .bearer_auth(token.expose_secret())
            .header(reqwest::header::ACCEPT, "application/json");
        let (status, _, body) = self.call(request).await.map_err(fail)?;
        if status.is_success() {
            let bundle: SecretBundle = serde_json::from_slice(&body).map_err(|_| {
                fail(format!(
                    "status {status} with a body that is not a secret bundle"
                ))
            })?;
            return bundle.value.map(SecretString::new).ok_or_else(|| {
                fail(format!(
                    "status {status} with a secret bundle that has no value"
                ))
            });
        }
        let error = serde_json::from_slice::<VaultErrorBody>(&body)
            .unwrap_or_default()
            .error;
        match status.as_u16() {
            404 => Err(Error::SecretNotFound {
                vault: self.vault.clone(),
                name: name.to_owned(),
                code: if error.code.is_empty() {
                    "404".to_owned()
                } else {
                    error.code
                },
            }),
            code @ (401 | 403) => Err(Error::SecretAccessDenied {
                vault: self.vault.clone(),
                name: name.to_owned(),
                client_id: self.settings.client_id.clone(),
                status: code,
                detail: format!("{} {}", error.code, one_line(&error.message)),
            }),
            _ => Err(fail(format!(
                "status {status}: {} {}",
                error.code,
                one_line(&error.message)
            ))),
        }
    }

    /// A token for the vault, and whether it came from the cache.
    async fn token(&self) -> Result<(SecretString, bool)> {
        let mut cached = self.token.lock().await;
        if let Some(token) = cached.as_ref().filter(|t| Instant::now() < t.refresh_at) {
            return Ok((token.token.clone(), true));
        }
        let requested_at = Instant::now();
        let (token, lifetime) = self.request_token().await?;
        tracing::debug!(
            tenant_id = %self.settings.tenant_id,
            client_id = %self.settings.client_id,
            lifetime_s = lifetime.as_secs(),
            "obtained an Entra ID token for Azure Key Vault"
        );
        *cached = Some(CachedToken {
            token: token.clone(),
            refresh_at: refresh_at(requested_at, lifetime),
        });
        Ok((token, false))
    }

    async fn forget_token(&self) {
        *self.token.lock().await = None;
    }

    /// The scope to ask tokens for: the one known, else the one the vault's authentication challenge names (a
    /// request without a token, answered 401 with `WWW-Authenticate: Bearer ... resource="..."` or `scope="..."`),
    /// checked by [`challenge_scope`].
    async fn scope(&self) -> Result<String> {
        if let Some(scope) = self
            .scope
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
        {
            return Ok(scope);
        }
        let url = format!(
            "{}/secrets/{KEY_VAULT_CHALLENGE_PROBE}?api-version={KEY_VAULT_API_VERSION}",
            self.vault
        );
        let request = self
            .http
            .get(&url)
            .header(reqwest::header::ACCEPT, "application/json");
        let (status, headers, _) =
            self.call(request)
                .await
                .map_err(|reason| Error::ReadSecret {
                    vault: self.vault.clone(),
                    name: format!("{KEY_VAULT_CHALLENGE_PROBE} (the authentication challenge)"),
                    reason,
                })?;
        let challenge = headers
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|value| value.to_str().ok())
            .filter(|_| status.as_u16() == 401)
            .ok_or_else(|| {
            Error::ReadChallenge {
                vault: self.vault.clone(),
                reason: format!(
                    "a request without a token was answered {status} without an authentication challenge; \
                     is the URL a Key Vault's?"
                ),
            }
        })?;
        let scope =
            challenge_scope(&self.vault, challenge).map_err(|reason| Error::ReadChallenge {
                vault: self.vault.clone(),
                reason,
            })?;
        tracing::debug!(vault = %self.vault, %scope, "the vault's challenge names the token scope");
        *self
            .scope
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(scope.clone());
        Ok(scope)
    }

    async fn request_token(&self) -> Result<(SecretString, Duration)> {
        let scope = self.scope().await?;
        let certificate = ClientCertificate::load(&self.settings.certificate_path).await?;
        let assertion = certificate.assertion(
            &self.settings.client_id,
            &self.token_endpoint,
            SystemTime::now(),
            &new_jti(),
        )?;
        let form = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("client_id", &self.settings.client_id)
            .append_pair("scope", &scope)
            .append_pair("grant_type", "client_credentials")
            .append_pair("client_assertion_type", CLIENT_ASSERTION_TYPE)
            .append_pair("client_assertion", &assertion)
            .finish();
        let fail = |reason: String| Error::RequestToken {
            endpoint: self.token_endpoint.clone(),
            reason,
        };
        let request = self
            .http
            .post(&self.token_endpoint)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(reqwest::header::ACCEPT, "application/json")
            .body(form);
        let (status, _, body) = self.call(request).await.map_err(fail)?;
        if status.is_success() {
            let response: TokenResponse = serde_json::from_slice(&body)
                .map_err(|_| fail(format!("status {status} with a body that is not JSON")))?;
            let token = response
                .access_token
                .filter(|t| !t.is_empty())
                .ok_or_else(|| fail(format!("status {status} without an access_token")))?;
            let lifetime = response
                .expires_in
                .as_ref()
                .and_then(seconds)
                .ok_or_else(|| fail(format!("status {status} without a valid expires_in")))?;
            return Ok((SecretString::new(token), lifetime));
        }
        let error = serde_json::from_slice::<OAuthError>(&body).unwrap_or_default();
        // 400 and 401 with an OAuth error are Entra ID's verdict on the credentials; anything else (throttling,
        // server errors, a proxy's error page) is trouble on the way.
        if matches!(status.as_u16(), 400 | 401) && !error.error.is_empty() {
            return Err(Error::TokenRejected(Box::new(TokenRejection {
                tenant_id: self.settings.tenant_id.clone(),
                client_id: self.settings.client_id.clone(),
                hint: rejection_hint(&error.error_codes),
                error: error.error,
                codes: error.error_codes,
                description: one_line(&error.error_description),
            })));
        }
        Err(fail(format!(
            "status {status}{}",
            if error.error.is_empty() {
                String::new()
            } else {
                format!(": {} {}", error.error, one_line(&error.error_description))
            }
        )))
    }

    /// Sends `request` and reads the whole answer within the call deadline.
    async fn call(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(reqwest::StatusCode, reqwest::header::HeaderMap, Vec<u8>), String> {
        let exchange = async {
            let response = request.send().await.map_err(|e| describe(&e))?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = response.bytes().await.map_err(|e| describe(&e))?;
            Ok((status, headers, body.to_vec()))
        };
        tokio::time::timeout(self.call_timeout, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no answer within {} s",
                    self.call_timeout.as_secs_f64()
                ))
            })
    }
}

/// The token scope a Key Vault authentication challenge (`WWW-Authenticate` of a 401) names for `vault`: its
/// `scope` parameter, else its `resource` with `/.default`. Refused unless the resource is one of Azure's Key Vault
/// resources ([`KEY_VAULT_RESOURCES`]) or the vault's host lies within it: a vault URL must not get the client
/// to ask for a token to another service.
pub fn challenge_scope(vault: &str, challenge: &str) -> Result<String, String> {
    let params = challenge
        .trim()
        .strip_prefix("Bearer")
        .or_else(|| challenge.trim().strip_prefix("bearer"))
        .ok_or_else(|| format!("the challenge is not a Bearer one: {challenge:?}"))?;
    let param = |key: &str| {
        params.split(',').find_map(|pair| {
            let (name, value) = pair.split_once('=')?;
            name.trim()
                .eq_ignore_ascii_case(key)
                .then(|| value.trim().trim_matches('"').to_owned())
        })
    };
    let scope = match (param("scope"), param("resource")) {
        (Some(scope), _) if !scope.is_empty() => scope,
        (_, Some(resource)) if !resource.is_empty() => {
            format!("{}/.default", resource.trim_end_matches('/'))
        }
        _ => {
            return Err(format!(
                "the challenge names no resource or scope: {challenge:?}"
            ));
        }
    };
    let resource_host = Url::parse(&scope)
        .ok()
        .and_then(|url| url.host_str().map(str::to_ascii_lowercase))
        .ok_or_else(|| format!("the challenge's scope {scope:?} is not a URL"))?;
    let vault_host = Url::parse(vault)
        .ok()
        .and_then(|url| url.host_str().map(str::to_ascii_lowercase))
        .unwrap_or_default();
    let known = KEY_VAULT_RESOURCES.contains(&resource_host.as_str());
    let within = vault_host == resource_host || vault_host.ends_with(&format!(".{resource_host}"));
    if known || within {
        Ok(scope)
    } else {
        Err(format!(
            "the challenge asks for a token to {resource_host}, which is neither a Key Vault resource of Azure's \
             clouds nor the vault's own domain; no token is requested"
        ))
    }
}

/// The app config in a secret's value, parsed and validated as a Kubernetes Secret's keys are. Errors say where
/// and what kind of problem, never any part of the value.
pub fn parse_app_config(name: &str, value: &SecretString) -> Result<GitHubCredentials> {
    // serde reads a struct from a JSON array as well; only an object is an app config.
    json_object(value.expose_secret()).map_err(|reason| Error::ParseAppConfig {
        name: name.to_owned(),
        reason,
    })?;
    let parsed = AppConfig::from_json(value.expose_secret()).map_err(|error| {
        let reason = match &error {
            crds::Error::ParseJsonCredentials(json) => match json.classify() {
                serde_json::error::Category::Data => format!(
                    "a value has the wrong type at line {} column {} (github_app_installation_id is a number, the other keys strings)",
                    json.line(),
                    json.column()
                ),
                _ => format!(
                    "not a JSON object (invalid JSON at line {} column {})",
                    json.line(),
                    json.column()
                ),
            },
            _ => "not a JSON object".to_owned(),
        };
        Error::ParseAppConfig {
            name: name.to_owned(),
            reason,
        }
    })?;
    parsed.credentials().map_err(|error| match error {
        crds::Error::ValidateCredentials(problem) => Error::ValidateAppConfig {
            name: name.to_owned(),
            problem,
        },
        _ => Error::ParseAppConfig {
            name: name.to_owned(),
            reason: "not a usable app config".to_owned(),
        },
    })
}

/// Proxy credentials in a secret's value: a JSON object with string `username` and `password` (either may be
/// absent, meaning empty). Errors never quote the value.
pub fn parse_proxy_credentials(name: &str, value: &SecretString) -> Result<(String, SecretString)> {
    #[derive(Deserialize)]
    struct ProxyCredentials {
        #[serde(default)]
        username: String,
        #[serde(default)]
        password: String,
    }
    let fail = |reason: String| Error::ParseProxyCredentials {
        name: name.to_owned(),
        reason,
    };
    let json = json_object(value.expose_secret()).map_err(fail)?;
    // serde's messages can quote the value; say only which kind of problem it is.
    let parsed: ProxyCredentials = serde_json::from_value(json)
        .map_err(|_| fail("username and password must be strings".to_owned()))?;
    Ok((parsed.username, SecretString::new(parsed.password)))
}

/// The text parsed as JSON, if it is an object; otherwise where and what the problem is (never the text).
fn json_object(text: &str) -> Result<serde_json::Value, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|json| {
        format!(
            "not a JSON object (invalid JSON at line {} column {})",
            json.line(),
            json.column()
        )
    })?;
    if value.is_object() {
        Ok(value)
    } else {
        Err("not a JSON object".to_owned())
    }
}

/// When a token obtained at `obtained` and valid for `lifetime` is replaced: [`TOKEN_REFRESH_MARGIN`] before it
/// expires, or halfway through its life if that is sooner.
pub fn refresh_at(obtained: Instant, lifetime: Duration) -> Instant {
    obtained + lifetime - TOKEN_REFRESH_MARGIN.min(lifetime / 2)
}

fn seconds(value: &serde_json::Value) -> Option<Duration> {
    // Entra ID's v2 endpoint sends a number; older endpoints sent a string.
    let secs = match value {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }?;
    (secs > 0).then(|| Duration::from_secs(secs))
}

fn check_vault_url(raw: &str) -> Result<String> {
    let fail = |reason: String| Error::CheckSettings {
        field: "url",
        reason,
    };
    let url = Url::parse(raw.trim()).map_err(|e| fail(format!("{raw:?} is not a URL: {e}")))?;
    if url.scheme() != "https" || !url.has_host() {
        return Err(fail(format!(
            "{raw:?} is not an https URL with a host (https://<name>.vault.azure.net)"
        )));
    }
    if url.query().is_some() || url.fragment().is_some() || url.password().is_some() {
        return Err(fail(format!(
            "{} has a query, fragment or credentials; give the bare vault URL",
            redact_url(raw)
        )));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// A tenant or client ID: a GUID or a domain name, so it can go into a URL path as is.
fn check_id(field: &'static str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::CheckSettings {
            field,
            reason: "empty".to_owned(),
        });
    }
    if !value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        return Err(Error::CheckSettings {
            field,
            reason: format!("{value:?} is not a GUID or domain name"),
        });
    }
    Ok(())
}

/// Key Vault secret names: 1 to 127 letters, digits and dashes.
fn check_secret_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 127
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(Error::CheckSettings {
            field: "githubConfigSecret",
            reason: format!(
                "{name:?} is not a Key Vault secret name (1 to 127 letters, digits and dashes)"
            ),
        });
    }
    Ok(())
}

fn build_http_client(options: &Options) -> Result<reqwest::Client> {
    let fail = |reason: String| Error::BuildHttpClient { reason };
    let mut builder = reqwest::Client::builder()
        .connect_timeout(options.call_timeout)
        .timeout(options.call_timeout)
        // A bearer token is never sent anywhere but the vault itself.
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy();
    for proxy in proxies(&options.proxy).map_err(fail)? {
        builder = builder.proxy(proxy);
    }
    if let Some(pem) = &options.extra_root_certificates {
        let certificates = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
            .map_err(|e| fail(format!("the extra root certificates do not parse: {e}")))?;
        builder = builder.tls_certs_merge(certificates);
    }
    builder.build().map_err(|e| fail(describe(&e)))
}

/// reqwest proxies for the settings, by the same rules as the Actions client's (loopback never proxied, an
/// `https://` URL uses only the https proxy).
fn proxies(config: &ProxyConfig) -> Result<Vec<reqwest::Proxy>, String> {
    let settings = match config {
        ProxyConfig::Disabled => return Ok(Vec::new()),
        ProxyConfig::Environment => ProxySettings::from_env(),
        ProxyConfig::Explicit(settings) => settings.clone(),
    };
    let no_proxy = reqwest::NoProxy::from_string(&no_proxy_list(&settings.no_proxy));
    let mut out = Vec::new();
    for (server, for_https) in [(&settings.http, false), (&settings.https, true)] {
        let Some(server) = server else { continue };
        let url = parse_proxy_url(&server.url).map_err(|e| e.to_string())?;
        let proxy = if for_https {
            reqwest::Proxy::https(url)
        } else {
            reqwest::Proxy::http(url)
        };
        let mut proxy = proxy.map_err(|e| format!("proxy {}: {e}", redact_url(&server.url)))?;
        if let Some(username) = &server.username {
            let password = server
                .password
                .as_ref()
                .map(SecretString::expose_secret)
                .unwrap_or_default();
            proxy = proxy.basic_auth(username, password);
        }
        out.push(proxy.no_proxy(no_proxy.clone()));
    }
    Ok(out)
}

/// An error and its causes on one line (reqwest's top-level message alone hides the cause).
fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn one_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default().trim();
    match line.char_indices().nth(300) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}

#[cfg(test)]
mod tests;
