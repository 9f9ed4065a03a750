//! Types shared by several kinds: extra metadata for child objects, proxy, TLS, vault and listener metrics.
//!
//! Every optional field follows Go's `omitempty`: it is left out of the JSON when empty, so merge patches computed
//! from these types touch the same fields as ARC's.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMapKeySelector;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Extra labels and annotations for an object the controllers create.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ResourceMeta {
    /// Labels to add to the object.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations to add to the object.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// HTTP(S) proxy settings for connections to GitHub (and, inside `vaultConfig`, to the vault).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyConfig {
    /// Proxy for `http://` URLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<ProxyServerConfig>,
    /// Proxy for `https://` URLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https: Option<ProxyServerConfig>,
    /// Hosts, domains or CIDRs that bypass the proxy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_proxy: Vec<String>,
}

/// One proxy server.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyServerConfig {
    // Documented as required; the schema does not enforce it (as in ARC).
    /// Proxy URL.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub url: String,
    /// Name of a Secret with keys `username` and `password` (or a vault key when a vault is configured).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub credential_secret_ref: String,
}

/// TLS settings for connections to a GitHub Enterprise Server (`githubServerTLS`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsConfig {
    /// Where the extra root CA certificate comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_from: Option<TlsCertificateSource>,
}

/// Source of a PEM root certificate.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsCertificateSource {
    /// Key of a ConfigMap in the namespace of the resource being reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<ConfigMapKeySelector>,
}

/// Where GitHub credentials (and proxy credentials) are read from instead of Kubernetes Secrets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VaultConfig {
    /// Vault kind; the only supported value is `azure_key_vault`.
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub type_: String,
    /// Azure Key Vault client settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure_key_vault: Option<AzureKeyVaultConfig>,
    /// Proxy for the controller's own connection to the vault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyConfig>,
}

/// The only vault type ARC supports.
pub const VAULT_TYPE_AZURE_KEY_VAULT: &str = "azure_key_vault";

/// Azure Key Vault client settings (all four fields are required).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AzureKeyVaultConfig {
    /// Vault URL.
    pub url: String,
    /// Azure tenant ID.
    pub tenant_id: String,
    /// Client (application) ID.
    pub client_id: String,
    /// Path of the client certificate on the controller's file system.
    pub certificate_path: String,
}

/// Which metrics the listener exposes, and with which labels.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsConfig {
    /// Counters by metric name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, CounterMetric>,
    /// Gauges by metric name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gauges: BTreeMap<String, GaugeMetric>,
    /// Histograms by metric name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub histograms: BTreeMap<String, HistogramMetric>,
}

/// A counter's label selection.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct CounterMetric {
    /// Label names to attach (required, may be empty).
    pub labels: Vec<String>,
}

/// A gauge's label selection.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct GaugeMetric {
    /// Label names to attach (required, may be empty).
    pub labels: Vec<String>,
}

/// A histogram's label selection and buckets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct HistogramMetric {
    /// Label names to attach (required, may be empty).
    pub labels: Vec<String>,
    /// Upper bounds of the buckets; empty means the listener's defaults.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buckets: Vec<f64>,
}
