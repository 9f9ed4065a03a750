//! `AutoscalingListener`: created by the AutoscalingRunnerSet controller (never by users) to run one listener pod.

use k8s_openapi::api::core::v1::{LocalObjectReference, PodTemplateSpec};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{MetricsConfig, ProxyConfig, ResourceMeta, TlsConfig, VaultConfig};
use crate::is_zero;

// No field is schema-required; all are omitted from JSON when empty (Go `omitempty`).
/// Desired state of a listener.
// Every `printcolumn(...)` repeats the same keys, which clippy mistakes for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "actions.github.com",
    version = "v1alpha1",
    kind = "AutoscalingListener",
    doc = "Runs the listener of one AutoscalingRunnerSet, which turns GitHub job demand into EphemeralRunnerSet replicas. Created by the controller.",
    namespaced,
    status = "AutoscalingListenerStatus",
    derive = "PartialEq",
    derive = "Default",
    crates(kube_core = "::kube_core"),
    printcolumn(
        name = "GitHub Configure URL",
        type_ = "string",
        json_path = ".spec.githubConfigUrl"
    ),
    printcolumn(
        name = "AutoscalingRunnerSet Namespace",
        type_ = "string",
        json_path = ".spec.autoscalingRunnerSetNamespace"
    ),
    printcolumn(
        name = "AutoscalingRunnerSet Name",
        type_ = "string",
        json_path = ".spec.autoscalingRunnerSetName"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingListenerSpec {
    /// GitHub configuration URL, copied from the AutoscalingRunnerSet.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub github_config_url: String,
    /// Credentials Secret name (or vault key), copied from the AutoscalingRunnerSet.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub github_config_secret: String,
    /// Scale set ID in the Actions Service.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(transform = crate::schema::go_int)]
    pub runner_scale_set_id: i64,
    /// Namespace of the AutoscalingRunnerSet.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub autoscaling_runner_set_namespace: String,
    /// Name of the AutoscalingRunnerSet.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub autoscaling_runner_set_name: String,
    /// Name of the EphemeralRunnerSet the listener scales.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ephemeral_runner_set_name: String,
    /// Upper bound of runners.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0), transform = crate::schema::go_int)]
    pub max_runners: i64,
    /// Idle runners kept ready.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0), transform = crate::schema::go_int)]
    pub min_runners: i64,
    /// Listener container image.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// Pull secrets for the listener image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Proxy for connections to GitHub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyConfig>,
    /// TLS settings for a GitHub Enterprise Server.
    #[serde(
        default,
        rename = "githubServerTLS",
        skip_serializing_if = "Option::is_none"
    )]
    pub github_server_tls: Option<TlsConfig>,
    /// Read credentials from a vault instead of a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vault_config: Option<VaultConfig>,
    /// Metric selection for the listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsConfig>,
    /// Customisation of the listener pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PodTemplateSpec>,
    /// Extra metadata for the listener config Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_secret_metadata: Option<ResourceMeta>,
    /// Extra metadata for the listener ServiceAccount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_metadata: Option<ResourceMeta>,
    /// Extra metadata for the listener Role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_metadata: Option<ResourceMeta>,
    /// Extra metadata for the listener RoleBinding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_binding_metadata: Option<ResourceMeta>,
}

/// The listener has no observed state; the status is an empty object.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct AutoscalingListenerStatus {}
