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

impl EphemeralRunnerSet {
    /// Whether this runner set was left by an earlier controller beside the one this project keeps per scale
    /// set: it is controlled by an AutoscalingRunnerSet whose name it does not carry. ARC up to 0.14 names its
    /// runner sets `<set>-xxxxx` (a generated suffix), this project and ARC's 0.15 line exactly `<set>`. Told by
    /// structure, not by a version label (ARC's master builds also say 0.14.2). Such a set is never scaled: its
    /// runners are taken over by the scale set's own runner set, and then it is deleted
    /// (docs/migrating-from-arc.md, "What the manager does with what ARC left").
    pub fn is_superseded(&self) -> bool {
        let name = self.metadata.name.as_deref().unwrap_or_default();
        self.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|owner| {
                owner.controller == Some(true)
                    && owner.kind == "AutoscalingRunnerSet"
                    && owner.api_version == crate::constants::API_VERSION
                    && owner.name != name
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn owned(name: &str, owner_kind: &str, owner_name: &str) -> EphemeralRunnerSet {
        let mut set = EphemeralRunnerSet::new(name, EphemeralRunnerSetSpec::default());
        set.metadata.owner_references = Some(vec![OwnerReference {
            api_version: crate::constants::API_VERSION.to_owned(),
            kind: owner_kind.to_owned(),
            name: owner_name.to_owned(),
            uid: "u".to_owned(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        set
    }

    #[test]
    fn a_runner_set_named_otherwise_than_its_scale_set_is_superseded() {
        assert!(!owned("arc", "AutoscalingRunnerSet", "arc").is_superseded());
        assert!(owned("arc-x7k2p", "AutoscalingRunnerSet", "arc").is_superseded());
        assert!(
            !owned("arc-x7k2p", "Deployment", "arc").is_superseded(),
            "only an AutoscalingRunnerSet's runner sets"
        );
        assert!(
            !EphemeralRunnerSet::new("by-hand", EphemeralRunnerSetSpec::default()).is_superseded(),
            "a set without an owner is nobody's leftover"
        );
    }
}
