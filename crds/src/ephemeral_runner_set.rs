//! `EphemeralRunnerSet`: the set of runners of one scale set; its `replicas` is written by the listener.

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::ResourceMeta;
use crate::ephemeral_runner::EphemeralRunnerSpec;
use crate::is_zero;

// The schema requires `patchID` only.
/// Desired runners.
// Every `printcolumn(...)` repeats the same keys, which clippy mistakes for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "actions.github.com",
    version = "v1alpha1",
    kind = "EphemeralRunnerSet",
    doc = "The EphemeralRunners of one AutoscalingRunnerSet; the listener sets how many there should be.",
    namespaced,
    status = "EphemeralRunnerSetStatus",
    derive = "PartialEq",
    derive = "Default",
    crates(kube_core = "::kube_core"),
    printcolumn(name = "DesiredReplicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "CurrentReplicas", type_ = "integer", json_path = ".status.currentReplicas"),
    printcolumn(name = "Pending Runners", type_ = "integer", json_path = ".status.pendingEphemeralRunners"),
    printcolumn(name = "Running Runners", type_ = "integer", json_path = ".status.runningEphemeralRunners"),
    // The next two point at status fields that do not exist (ARC's CRD has the same columns); kept so `kubectl
    // get` prints the same table as with ARC.
    printcolumn(name = "Finished Runners", type_ = "integer", json_path = ".status.finishedEphemeralRunners"),
    printcolumn(name = "Deleting Runners", type_ = "integer", json_path = ".status.deletingEphemeralRunners"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase")
)]
#[serde(rename_all = "camelCase")]
pub struct EphemeralRunnerSetSpec {
    /// Desired number of runners, written by the listener. Omitted when 0, so absent means 0 (the listener's
    /// merge patch sends `null` to scale to zero).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(transform = crate::schema::go_int)]
    pub replicas: i64,
    // Always serialised, and required by the schema.
    /// Written by the listener together with `replicas`, so the controller can tell which scaling request a
    /// runner was created for.
    #[serde(rename = "patchID")]
    #[schemars(transform = crate::schema::go_int)]
    pub patch_id: i64,
    /// Template of new EphemeralRunners.
    #[serde(default)]
    #[schemars(transform = crate::schema::no_default)]
    pub ephemeral_runner_spec: EphemeralRunnerSpec,
    /// Labels and annotations of new EphemeralRunners (changes apply to runners created afterwards).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_runner_metadata: Option<ResourceMeta>,
}

// Fields are always serialised, zero values included; the schema requires `currentReplicas`.
/// Observed runners.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EphemeralRunnerSetStatus {
    /// Pending + running + failed runners.
    #[schemars(transform = crate::schema::go_int)]
    pub current_replicas: i64,
    /// Runners whose pod is not running yet.
    #[serde(default)]
    #[schemars(transform = crate::schema::go_int, transform = crate::schema::no_default)]
    pub pending_ephemeral_runners: i64,
    /// Runners whose pod is running.
    #[serde(default)]
    #[schemars(transform = crate::schema::go_int, transform = crate::schema::no_default)]
    pub running_ephemeral_runners: i64,
    /// Runners that failed.
    #[serde(default)]
    #[schemars(transform = crate::schema::go_int, transform = crate::schema::no_default)]
    pub failed_ephemeral_runners: i64,
    /// `Running` or `Outdated`.
    #[serde(default)]
    #[schemars(transform = crate::schema::no_default)]
    pub phase: String,
}
