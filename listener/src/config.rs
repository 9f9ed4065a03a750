//! The listener's JSON config file (the same file and keys as ARC's `ghalistener`), decoded with Go's lenient
//! rules and validated in ARC's order, so the first problem reported is the one ARC would report.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use actions_client::{Credentials, GitHubAppCredentials, GitHubConfig, SecretString};
use crds::constants::{LISTENER_NAME_ENV, LISTENER_NAMESPACE_ENV};
use crds::schedule::{MinRunnersSchedule, Schedule};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The environment variable naming the config file.
pub const CONFIG_PATH_ENV: &str = "LISTENER_CONFIG_PATH";

/// The only supported non-empty `vault_type` value.
pub const AZURE_KEY_VAULT: &str = "azure_key_vault";

/// Largest `max_runners`: the capacity header and the ERS replica count are 32-bit in the reference.
pub const MAX_RUNNERS_LIMIT: i64 = i32::MAX as i64;

/// Longest scale-down delay, in seconds (a day).
pub const MAX_SCALE_DOWN_DELAY_SECONDS: i64 = 86_400;

/// Address `/healthz` is served on when neither `health_addr` nor `metrics_addr` is set (the chart probes it).
pub const DEFAULT_HEALTH_ADDR: &str = crds::constants::LISTENER_HEALTH_ADDR;

/// Path of the liveness endpoint.
pub const HEALTH_PATH: &str = "/healthz";

/// The config file. Field names are the JSON keys; missing keys and `null` give the zero value, as in Go.
#[derive(Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Config {
    /// GitHub config URL (enterprise, organization or repository).
    pub configure_url: String,
    /// `""` (inline credentials) or `azure_key_vault`.
    pub vault_type: String,
    /// Vault secret holding the credentials.
    pub vault_lookup_key: String,
    /// Azure Key Vault client settings.
    pub azure_key_vault: Option<AzureKeyVault>,
    /// Personal access token.
    pub github_token: String,
    /// GitHub App ID or client ID.
    pub github_app_id: String,
    /// GitHub App installation ID.
    pub github_app_installation_id: i64,
    /// GitHub App private key (PEM).
    pub github_app_private_key: String,
    /// Namespace of the EphemeralRunnerSet and its EphemeralRunners.
    pub ephemeral_runner_set_namespace: String,
    /// Name of the EphemeralRunnerSet to scale.
    pub ephemeral_runner_set_name: String,
    /// Upper bound of the desired replicas; also the capacity reported on each poll.
    pub max_runners: i64,
    /// Idle runners kept on top of the assigned jobs.
    pub min_runners: i64,
    /// Scale set ID in the Actions Service.
    pub runner_scale_set_id: i64,
    /// Decoded, not used (as in ARC).
    pub runner_scale_set_name: String,
    /// Extra PEM root certificates for GitHub and the Actions Service.
    pub server_root_ca: String,
    /// `debug`, `info`, `warn` or `error` (any case).
    pub log_level: String,
    /// `json` or `text`.
    pub log_format: String,
    /// Metrics listen address (`host:port`, `:8080`); empty disables metrics.
    pub metrics_addr: String,
    /// Metrics path; empty means `/metrics`.
    pub metrics_endpoint: String,
    /// Which ARC metrics to export with which labels; `None` is the default set.
    pub metrics: Option<MetricsSelection>,
    /// Not in ARC: windows in which another minimum applies (the AutoscalingRunnerSet's `minRunnersSchedules`,
    /// same JSON shape).
    pub min_runners_schedules: Vec<MinRunnersSchedule>,
    /// Not in ARC: how long the desired count keeps its recent peak after demand falls; 0 is off.
    pub scale_down_delay_seconds: i64,
    /// Not in ARC: where `/healthz` is served. Unset: `metrics_addr` when set, else `:8080`. Empty: no
    /// health endpoint.
    pub health_addr: Option<String>,
    /// Whether any of the four inline credential keys was present in the file (ARC tells "no credentials at
    /// all" from "incomplete credentials").
    #[serde(skip)]
    pub credential_keys_present: bool,
    /// Not in the file (nor in ARC): the AutoscalingListener whose status the listener reports to, from the
    /// environment ([`Config::from_env`]). `None`: nothing is reported.
    #[serde(skip)]
    pub status_target: Option<StatusTarget>,
}

/// The AutoscalingListener the listener reports its state to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusTarget {
    /// Its namespace (the controller namespace).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// `azure_key_vault` settings.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct AzureKeyVault {
    /// Entra tenant.
    pub tenant_id: String,
    /// Application (client) ID.
    pub client_id: String,
    /// Vault URL.
    pub url: String,
    /// Client certificate file (PEM).
    pub certificate_path: String,
    /// Proxy for vault traffic.
    pub proxy: Option<AzureProxy>,
}

/// Proxy for vault traffic (Go field names, matched case-insensitively by ARC).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct AzureProxy {
    /// HTTP proxy URL.
    #[serde(alias = "HTTPProxy", alias = "httpproxy", alias = "http_proxy")]
    pub http_proxy: String,
    /// HTTPS proxy URL.
    #[serde(alias = "HTTPSProxy", alias = "httpsproxy", alias = "https_proxy")]
    pub https_proxy: String,
    /// Exclusions.
    #[serde(alias = "NoProxy", alias = "noproxy", alias = "no_proxy")]
    pub no_proxy: String,
    /// CGI mode.
    #[serde(alias = "CGI", alias = "cgi")]
    pub cgi: bool,
}

/// The `metrics` key: the metrics to register, by kind, each with its label list (and buckets for histograms).
/// A present key replaces the whole default set.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct MetricsSelection {
    /// Counters by name.
    pub counters: Option<BTreeMap<String, Option<MetricSelection>>>,
    /// Gauges by name.
    pub gauges: Option<BTreeMap<String, Option<MetricSelection>>>,
    /// Histograms by name.
    pub histograms: Option<BTreeMap<String, Option<MetricSelection>>>,
}

/// One selected metric.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct MetricSelection {
    /// Label names, in order.
    pub labels: Option<Vec<String>>,
    /// Histogram buckets; empty means the defaults.
    pub buckets: Option<Vec<f64>>,
}

/// Log verbosity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// `debug`.
    Debug,
    /// `info`.
    Info,
    /// `warn`.
    Warn,
    /// `error`.
    Error,
}

/// Log record format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// `key=value` text.
    Text,
}

/// Why a config is unusable. Each variant's text is the message shown to the user.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ConfigProblem {
    /// The file holds no JSON value.
    Empty,
    /// The first JSON value is not an object.
    NotAnObject,
    /// `vault_type` is neither empty nor `azure_key_vault`.
    UnsupportedVaultType(String),
    /// `azure_key_vault` is missing while `vault_type` asks for it.
    MissingAzureKeyVault,
    /// An `azure_key_vault` field is empty or invalid.
    InvalidAzureKeyVault(String),
    /// `configure_url` is empty.
    MissingConfigureUrl,
    /// `ephemeral_runner_set_namespace` is empty.
    MissingRunnerSetNamespace,
    /// `ephemeral_runner_set_name` is empty.
    MissingRunnerSetName,
    /// `runner_scale_set_id` is 0.
    MissingScaleSetId,
    /// `max_runners` < `min_runners`.
    MaxBelowMin {
        /// `min_runners`.
        min: i64,
        /// `max_runners`.
        max: i64,
    },
    /// `vault_type` is set but `vault_lookup_key` is empty.
    MissingVaultLookupKey,
    /// None of the credential keys is present.
    MissingCredentials,
    /// A PAT and complete GitHub App credentials are both present.
    BothCredentials,
    /// Neither a PAT nor complete GitHub App credentials.
    NoCompleteCredentials,
    /// `configure_url` does not parse.
    InvalidConfigureUrl(String),
    /// `log_level` is not one of the four levels.
    InvalidLogLevel(String),
    /// `log_format` is not `json` or `text`.
    InvalidLogFormat(String),
    /// `metrics_endpoint` is not an absolute path.
    InvalidMetricsEndpoint(String),
    /// `metrics_endpoint` would shadow the health endpoint on the same address.
    MetricsEndpointIsHealthPath,
    /// A `metrics` entry cannot be registered.
    InvalidMetricSelection {
        /// `counters`, `gauges` or `histograms`.
        kind: &'static str,
        /// Metric name.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// `max_runners` is outside 0..=2147483647.
    MaxRunnersOutOfRange(i64),
    /// Only one of the two environment variables naming the AutoscalingListener is set.
    IncompleteStatusTarget,
    /// A `min_runners_schedules` entry is unusable.
    InvalidSchedule(String),
    /// `scale_down_delay_seconds` is outside 0..=86400.
    ScaleDownDelayOutOfRange(i64),
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("the config file contains no JSON value"),
            Self::NotAnObject => f.write_str("the config file must contain a JSON object"),
            Self::UnsupportedVaultType(t) => write!(
                f,
                "vault_type {t:?} is not supported; use \"\" (credentials in this file) or \"{AZURE_KEY_VAULT}\""
            ),
            Self::MissingAzureKeyVault => write!(
                f,
                "azure_key_vault is required when vault_type is \"{AZURE_KEY_VAULT}\""
            ),
            Self::InvalidAzureKeyVault(problem) => write!(f, "azure_key_vault: {problem}"),
            Self::MissingConfigureUrl => f.write_str("configure_url is required"),
            Self::MissingRunnerSetNamespace => {
                f.write_str("ephemeral_runner_set_namespace is required")
            }
            Self::MissingRunnerSetName => f.write_str("ephemeral_runner_set_name is required"),
            Self::MissingScaleSetId => f.write_str("runner_scale_set_id is required (it is 0)"),
            Self::MaxBelowMin { min, max } => write!(
                f,
                "max_runners ({max}) must be greater than or equal to min_runners ({min})"
            ),
            Self::MissingVaultLookupKey => {
                f.write_str("vault_lookup_key is required when vault_type is set")
            }
            Self::MissingCredentials => f.write_str(
                "no credentials: set github_token, or github_app_id, github_app_installation_id and \
                 github_app_private_key",
            ),
            Self::BothCredentials => f.write_str(
                "both github_token and complete GitHub App credentials are set; set only one kind",
            ),
            Self::NoCompleteCredentials => f.write_str(
                "no usable credentials: github_token is empty and the GitHub App credentials are incomplete \
                 (github_app_id, github_app_installation_id > 0 and github_app_private_key are all required)",
            ),
            Self::InvalidConfigureUrl(problem) => write!(f, "configure_url: {problem}"),
            Self::InvalidLogLevel(level) => write!(
                f,
                "log_level {level:?} is not one of debug, info, warn, error"
            ),
            Self::InvalidLogFormat(format) => {
                write!(f, "log_format {format:?} is not one of json, text")
            }
            Self::InvalidMetricsEndpoint(endpoint) => write!(
                f,
                "metrics_endpoint {endpoint:?} must be a path starting with \"/\""
            ),
            Self::MetricsEndpointIsHealthPath => write!(
                f,
                "metrics_endpoint must not be {HEALTH_PATH:?} when metrics and health share an address"
            ),
            Self::InvalidMetricSelection {
                kind,
                name,
                problem,
            } => write!(f, "metrics.{kind}.{name}: {problem}"),
            Self::MaxRunnersOutOfRange(max) => write!(
                f,
                "max_runners ({max}) must be between 0 and {MAX_RUNNERS_LIMIT}"
            ),
            Self::IncompleteStatusTarget => write!(
                f,
                "{LISTENER_NAME_ENV} and {LISTENER_NAMESPACE_ENV} must be set together (they name the \
                 AutoscalingListener the listener reports to)"
            ),
            Self::InvalidSchedule(problem) => f.write_str(problem),
            Self::ScaleDownDelayOutOfRange(delay) => write!(
                f,
                "scale_down_delay_seconds ({delay}) must be between 0 and {MAX_SCALE_DOWN_DELAY_SECONDS}"
            ),
        }
    }
}

/// Top-level keys, for Go's case-insensitive key matching.
const KEYS: [&str; 23] = [
    "configure_url",
    "vault_type",
    "vault_lookup_key",
    "azure_key_vault",
    "github_token",
    "github_app_id",
    "github_app_installation_id",
    "github_app_private_key",
    "ephemeral_runner_set_namespace",
    "ephemeral_runner_set_name",
    "max_runners",
    "min_runners",
    "runner_scale_set_id",
    "runner_scale_set_name",
    "server_root_ca",
    "log_level",
    "log_format",
    "metrics_addr",
    "metrics_endpoint",
    "metrics",
    "health_addr",
    "min_runners_schedules",
    "scale_down_delay_seconds",
];

const CREDENTIAL_KEYS: [&str; 4] = [
    "github_token",
    "github_app_id",
    "github_app_installation_id",
    "github_app_private_key",
];

fn invalid(problem: ConfigProblem) -> Error {
    Error::ValidateConfig(problem)
}

/// The AutoscalingListener named by the two environment variables: both or neither (ARC's controller sets
/// neither; a listener it runs then reports nothing).
pub fn status_target(
    name: Option<String>,
    namespace: Option<String>,
) -> Result<Option<StatusTarget>> {
    match (name, namespace) {
        (Some(name), Some(namespace)) => Ok(Some(StatusTarget { namespace, name })),
        (None, None) => Ok(None),
        _ => Err(invalid(ConfigProblem::IncompleteStatusTarget)),
    }
}

impl Config {
    /// Reads `LISTENER_CONFIG_PATH`, then the file, then validates it; then the AutoscalingListener to report
    /// to, from `AUTOSCALING_LISTENER_NAME` and `AUTOSCALING_LISTENER_NAMESPACE`.
    pub fn from_env() -> Result<Self> {
        let path = std::env::var_os(CONFIG_PATH_ENV).ok_or(Error::ConfigPathUnset)?;
        let mut config = Self::load(Path::new(&path))?;
        let var = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        config.status_target = status_target(var(LISTENER_NAME_ENV), var(LISTENER_NAMESPACE_ENV))?;
        Ok(config)
    }

    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| Error::ReadConfig {
            path: path.to_owned(),
            source,
        })?;
        let config = Self::decode(&bytes)?;
        config.validate()?;
        Ok(config)
    }

    /// Decodes the file with Go's `encoding/json` leniency: only the first JSON value counts, unknown keys are
    /// ignored, keys match case-insensitively (exact spelling preferred), and `null` means "not set".
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let first = serde_json::Deserializer::from_slice(bytes)
            .into_iter::<Value>()
            .next()
            .ok_or_else(|| invalid(ConfigProblem::Empty))?
            .map_err(|e| Error::DecodeConfig(e.to_string()))?;
        let Value::Object(object) = first else {
            return Err(invalid(ConfigProblem::NotAnObject));
        };
        let object = normalize_keys(object);
        let credential_keys_present = CREDENTIAL_KEYS.iter().any(|k| object.contains_key(*k));
        let object = Value::Object(object);
        let mut config = Self::deserialize(&object)
            .map_err(|e| Error::DecodeConfig(locate_decode_error(&object, &e)))?;
        config.credential_keys_present = credential_keys_present;
        Ok(config)
    }

    /// Checks the config. The order is ARC's (vault type, then its settings, then the required fields, the
    /// runner bounds and the credentials), followed by the checks ARC only makes later during start-up (config
    /// URL, logging, metrics, the `max_runners` range), so everything is reported before any network call.
    pub fn validate(&self) -> Result<()> {
        match self.vault_type.as_str() {
            "" => {}
            AZURE_KEY_VAULT => self.validate_azure_key_vault()?,
            other => {
                return Err(invalid(ConfigProblem::UnsupportedVaultType(
                    other.to_owned(),
                )));
            }
        }
        if self.configure_url.is_empty() {
            return Err(invalid(ConfigProblem::MissingConfigureUrl));
        }
        if self.ephemeral_runner_set_namespace.is_empty() {
            return Err(invalid(ConfigProblem::MissingRunnerSetNamespace));
        }
        if self.ephemeral_runner_set_name.is_empty() {
            return Err(invalid(ConfigProblem::MissingRunnerSetName));
        }
        if self.runner_scale_set_id == 0 {
            return Err(invalid(ConfigProblem::MissingScaleSetId));
        }
        if self.max_runners < self.min_runners {
            return Err(invalid(ConfigProblem::MaxBelowMin {
                min: self.min_runners,
                max: self.max_runners,
            }));
        }
        if !self.vault_type.is_empty() && self.vault_lookup_key.is_empty() {
            return Err(invalid(ConfigProblem::MissingVaultLookupKey));
        }
        if self.vault_type.is_empty() {
            // ARC skips this when only vault_lookup_key is set and then crashes on missing credentials; checking
            // always turns that crash into this message.
            self.credentials()?;
        }
        self.github_config()?;
        self.log_level()?;
        self.log_format()?;
        self.validate_metrics()?;
        if !(0..=MAX_RUNNERS_LIMIT).contains(&self.max_runners) {
            return Err(invalid(ConfigProblem::MaxRunnersOutOfRange(
                self.max_runners,
            )));
        }
        crds::schedule::check(&self.min_runners_schedules, self.max_runners)
            .map_err(|e| invalid(ConfigProblem::InvalidSchedule(e.to_string())))?;
        if !(0..=MAX_SCALE_DOWN_DELAY_SECONDS).contains(&self.scale_down_delay_seconds) {
            return Err(invalid(ConfigProblem::ScaleDownDelayOutOfRange(
                self.scale_down_delay_seconds,
            )));
        }
        Ok(())
    }

    /// The parsed schedules (checked by [`Config::validate`]).
    pub fn schedules(&self) -> Result<Vec<Schedule>> {
        crds::schedule::parse_all(&self.min_runners_schedules)
            .map_err(|e| invalid(ConfigProblem::InvalidSchedule(e.to_string())))
    }

    /// The scale-down delay (0: off).
    pub fn scale_down_delay(&self) -> std::time::Duration {
        std::time::Duration::from_secs(
            self.scale_down_delay_seconds
                .clamp(0, MAX_SCALE_DOWN_DELAY_SECONDS)
                .unsigned_abs(),
        )
    }

    fn validate_azure_key_vault(&self) -> Result<()> {
        let vault = self
            .azure_key_vault
            .as_ref()
            .ok_or_else(|| invalid(ConfigProblem::MissingAzureKeyVault))?;
        let problem = |text: String| Err(invalid(ConfigProblem::InvalidAzureKeyVault(text)));
        if vault.tenant_id.is_empty() {
            return problem("tenant_id is required".to_owned());
        }
        if vault.client_id.is_empty() {
            return problem("client_id is required".to_owned());
        }
        match url::Url::parse(&vault.url) {
            Ok(url) if url.has_host() => {}
            _ => return problem(format!("url {:?} is not an absolute URL", vault.url)),
        }
        if vault.certificate_path.is_empty() {
            return problem("certificate_path is required".to_owned());
        }
        if let Err(e) = std::fs::metadata(&vault.certificate_path) {
            return problem(format!(
                "certificate_path {:?} cannot be read: {e}",
                vault.certificate_path
            ));
        }
        if let Some(proxy) = &vault.proxy
            && proxy == &AzureProxy::default()
        {
            return problem("proxy is set but all of its fields are empty".to_owned());
        }
        // The secret itself is read at start-up (crate::app::resolve_credentials).
        Ok(())
    }

    /// The credential kind in effect (ARC's rules: a PAT next to a partial App triple is a PAT).
    pub fn credentials(&self) -> Result<Credentials> {
        let has_pat = !self.github_token.is_empty();
        let has_app = !self.github_app_id.is_empty()
            && self.github_app_installation_id > 0
            && !self.github_app_private_key.is_empty();
        match (has_pat, has_app) {
            (true, true) => Err(invalid(ConfigProblem::BothCredentials)),
            (true, false) => Ok(Credentials::Pat(SecretString::new(
                self.github_token.clone(),
            ))),
            (false, true) => Ok(Credentials::App(GitHubAppCredentials {
                client_id: self.github_app_id.clone(),
                installation_id: self.github_app_installation_id,
                private_key: SecretString::new(self.github_app_private_key.clone()),
            })),
            (false, false) if !self.credential_keys_present => {
                Err(invalid(ConfigProblem::MissingCredentials))
            }
            (false, false) => Err(invalid(ConfigProblem::NoCompleteCredentials)),
        }
    }

    /// The parsed config URL.
    pub fn github_config(&self) -> Result<GitHubConfig> {
        GitHubConfig::parse(&self.configure_url)
            .map_err(|e| invalid(ConfigProblem::InvalidConfigureUrl(e.to_string())))
    }

    /// The parsed `log_level`.
    pub fn log_level(&self) -> Result<LogLevel> {
        match self.log_level.to_ascii_lowercase().as_str() {
            "debug" => Ok(LogLevel::Debug),
            "info" => Ok(LogLevel::Info),
            "warn" => Ok(LogLevel::Warn),
            "error" => Ok(LogLevel::Error),
            _ => Err(invalid(ConfigProblem::InvalidLogLevel(
                self.log_level.clone(),
            ))),
        }
    }

    /// The parsed `log_format` (case-sensitive, as in ARC).
    pub fn log_format(&self) -> Result<LogFormat> {
        match self.log_format.as_str() {
            "json" => Ok(LogFormat::Json),
            "text" => Ok(LogFormat::Text),
            _ => Err(invalid(ConfigProblem::InvalidLogFormat(
                self.log_format.clone(),
            ))),
        }
    }

    /// The metrics path: `metrics_endpoint`, or `/metrics` when empty.
    pub fn metrics_path(&self) -> &str {
        if self.metrics_endpoint.is_empty() {
            "/metrics"
        } else {
            &self.metrics_endpoint
        }
    }

    /// Whether metrics are served.
    pub fn metrics_enabled(&self) -> bool {
        !self.metrics_addr.is_empty()
    }

    /// Where `/healthz` is served, if anywhere.
    pub fn health_address(&self) -> Option<&str> {
        match self.health_addr.as_deref() {
            Some("") => None,
            Some(addr) => Some(addr),
            None if self.metrics_enabled() => Some(&self.metrics_addr),
            None => Some(DEFAULT_HEALTH_ADDR),
        }
    }

    /// Whether `/healthz` is served by the metrics server: `health_addr` unset, or the same address (but not
    /// port 0, since two binds to port 0 are two servers).
    pub fn health_shares_metrics_server(&self) -> bool {
        self.metrics_enabled()
            && match self.health_addr.as_deref() {
                None => true,
                Some(addr) => addr == self.metrics_addr && !addr.ends_with(":0"),
            }
    }

    fn validate_metrics(&self) -> Result<()> {
        if !self.metrics_enabled() {
            return Ok(());
        }
        let path = self.metrics_path();
        if !path.starts_with('/') {
            return Err(invalid(ConfigProblem::InvalidMetricsEndpoint(
                path.to_owned(),
            )));
        }
        if self.health_shares_metrics_server() && path == HEALTH_PATH {
            return Err(invalid(ConfigProblem::MetricsEndpointIsHealthPath));
        }
        crate::metrics::check_selection(self.metrics.as_ref()).map_err(invalid)
    }
}

/// Keys whose values are never repeated in an error message.
const SECRET_KEYS: [&str; 2] = ["github_token", "github_app_private_key"];

/// One step from a JSON value to one of its children.
#[derive(Clone, Debug)]
enum PathStep<'a> {
    Key(&'a str),
    Index(usize),
}

/// Says which value of the (normalized) config object `error` is about, as Go's decoder does ("cannot unmarshal
/// string into Go struct field Config.max_runners"); serde's own message names the types only.
///
/// Decoding through a `Value` loses serde's position, so the value is found by decoding each child of the
/// failing object or list on its own, inside an otherwise empty document: every struct of the config fills in
/// missing keys, and maps and lists take any subset, so a child decodes alone exactly when it is well typed.
/// The search descends to the deepest value that still fails and reports its path with that value's error. The
/// values of secret keys are described by their JSON type only, so a misplaced token is not printed.
fn locate_decode_error(root: &Value, error: &serde_json::Error) -> String {
    /// `leaf` at `path` inside otherwise empty objects and single-item lists, decoded as a config.
    fn probe(path: &[PathStep<'_>], leaf: Value) -> Option<String> {
        let mut document = leaf;
        for step in path.iter().rev() {
            document = match step {
                PathStep::Key(key) => {
                    Value::Object(Map::from_iter([((*key).to_owned(), document)]))
                }
                PathStep::Index(_) => Value::Array(vec![document]),
            };
        }
        Config::deserialize(&document).err().map(|e| e.to_string())
    }
    let mut path: Vec<PathStep<'_>> = Vec::new();
    let mut message = error.to_string();
    let mut current = root;
    loop {
        let (empty, children): (Value, Vec<(PathStep<'_>, &Value)>) = match current {
            Value::Object(map) => (
                Value::Object(Map::new()),
                map.iter().map(|(k, v)| (PathStep::Key(k), v)).collect(),
            ),
            Value::Array(items) => (
                Value::Array(Vec::new()),
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (PathStep::Index(i), v))
                    .collect(),
            ),
            _ => break,
        };
        // An object or list where something else belongs: the problem is here, not in a child.
        if !path.is_empty() && probe(&path, empty).is_some() {
            break;
        }
        let failing = children.into_iter().find_map(|(step, child)| {
            path.push(step.clone());
            let failed = probe(&path, child.clone());
            path.pop();
            failed.map(|child_message| (step, child, child_message))
        });
        let Some((step, child, child_message)) = failing else {
            break;
        };
        path.push(step);
        current = child;
        message = child_message;
    }
    if let Some(PathStep::Key(top)) = path.first()
        && SECRET_KEYS.contains(top)
    {
        message = format!("invalid type: {}, expected a string", json_kind(current));
    }
    let mut location = String::new();
    for step in &path {
        match step {
            PathStep::Key(key) if location.is_empty() => location.push_str(key),
            PathStep::Key(key) => {
                location.push('.');
                location.push_str(key);
            }
            PathStep::Index(index) => {
                location.push('[');
                location.push_str(&index.to_string());
                location.push(']');
            }
        }
    }
    if location.is_empty() {
        message
    } else {
        format!("{location}: {message}")
    }
}

/// The JSON type of `value` in serde's words.
fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "floating point",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "sequence",
        Value::Object(_) => "map",
    }
}

/// Renames keys that match a known key case-insensitively (when the exact key is absent) and drops `null`s, so
/// serde sees what Go's decoder would have filled in.
fn normalize_keys(object: Map<String, Value>) -> Map<String, Value> {
    let mut exact = Map::new();
    let mut folded = Vec::new();
    for (key, value) in object {
        if KEYS.contains(&key.as_str()) {
            exact.insert(key, value);
        } else if let Some(known) = KEYS.iter().find(|k| k.eq_ignore_ascii_case(&key)) {
            folded.push(((*known).to_owned(), value));
        }
    }
    for (key, value) in folded {
        exact.entry(key).or_insert(value);
    }
    exact.retain(|_, value| !value.is_null());
    exact
}

/// Secrets never appear in logs: Debug shows which credentials are set, not their values.
impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |s: &str| {
            if s.is_empty() {
                "<empty>"
            } else {
                "<redacted>"
            }
        };
        f.debug_struct("Config")
            .field("configure_url", &self.configure_url)
            .field("vault_type", &self.vault_type)
            .field("vault_lookup_key", &self.vault_lookup_key)
            .field("azure_key_vault", &self.azure_key_vault)
            .field("github_token", &set(&self.github_token))
            .field("github_app_id", &self.github_app_id)
            .field(
                "github_app_installation_id",
                &self.github_app_installation_id,
            )
            .field("github_app_private_key", &set(&self.github_app_private_key))
            .field(
                "ephemeral_runner_set_namespace",
                &self.ephemeral_runner_set_namespace,
            )
            .field("ephemeral_runner_set_name", &self.ephemeral_runner_set_name)
            .field("max_runners", &self.max_runners)
            .field("min_runners", &self.min_runners)
            .field("runner_scale_set_id", &self.runner_scale_set_id)
            .field("runner_scale_set_name", &self.runner_scale_set_name)
            .field("server_root_ca", &set(&self.server_root_ca))
            .field("log_level", &self.log_level)
            .field("log_format", &self.log_format)
            .field("metrics_addr", &self.metrics_addr)
            .field("metrics_endpoint", &self.metrics_endpoint)
            .field("metrics", &self.metrics)
            .field("health_addr", &self.health_addr)
            .field("min_runners_schedules", &self.min_runners_schedules)
            .field("scale_down_delay_seconds", &self.scale_down_delay_seconds)
            .field("status_target", &self.status_target)
            .finish()
    }
}

#[cfg(test)]
mod tests;
