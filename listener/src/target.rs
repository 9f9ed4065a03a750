//! What the listener writes to Kubernetes: the EphemeralRunnerSet's `replicas`/`patchID` and an
//! EphemeralRunner's job fields. Only these two merge patches are ever sent (the listener's RBAC allows nothing
//! else).

use std::future::Future;

use crds::{EphemeralRunner, EphemeralRunnerSet};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;

use crate::error::{Error, Result};

/// Field manager of the listener's patches; never shared with the controller.
pub const FIELD_MANAGER: &str = "arc-rs/listener";

/// Outcome of an EphemeralRunner status patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerPatched {
    /// The status was updated.
    Patched,
    /// The runner no longer exists (it finished and was deleted): nothing to do.
    NotFound,
}

/// The Kubernetes side of the listener; a seam so the loop can be tested without an API server.
pub trait RunnerSetTarget: Send + Sync {
    /// Merge-patches the EphemeralRunnerSet; returns its `spec.replicas` afterwards.
    fn patch_runner_set(&self, patch: &Value) -> impl Future<Output = Result<i64>> + Send;

    /// Merge-patches the status of EphemeralRunner `name`.
    fn patch_runner_status(
        &self,
        name: &str,
        patch: &Value,
    ) -> impl Future<Output = Result<RunnerPatched>> + Send;
}

/// The real target: one EphemeralRunnerSet and its namespace's EphemeralRunners.
#[derive(Clone)]
pub struct KubeTarget {
    namespace: String,
    name: String,
    runner_sets: Api<EphemeralRunnerSet>,
    runners: Api<EphemeralRunner>,
}

impl KubeTarget {
    /// Targets EphemeralRunnerSet `namespace/name`.
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            runner_sets: Api::namespaced(client.clone(), namespace),
            runners: Api::namespaced(client, namespace),
        }
    }

    fn params() -> PatchParams {
        PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        }
    }
}

impl RunnerSetTarget for KubeTarget {
    async fn patch_runner_set(&self, patch: &Value) -> Result<i64> {
        let patched = self
            .runner_sets
            .patch(&self.name, &Self::params(), &Patch::Merge(patch))
            .await
            .map_err(|source| Error::PatchEphemeralRunnerSet {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source,
            })?;
        Ok(patched.spec.replicas)
    }

    async fn patch_runner_status(&self, name: &str, patch: &Value) -> Result<RunnerPatched> {
        match self
            .runners
            .patch_status(name, &Self::params(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => Ok(RunnerPatched::Patched),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(RunnerPatched::NotFound),
            Err(source) => Err(Error::PatchEphemeralRunner {
                namespace: self.namespace.clone(),
                name: name.to_owned(),
                source,
            }),
        }
    }
}
