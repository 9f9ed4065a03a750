//! What the listener writes to Kubernetes: the EphemeralRunnerSet's `replicas`/`patchID` (with the runners whose
//! finished jobs the target leaves out, [`crds::constants::COMPLETED_RUNNERS_ANNOTATION`]) and an EphemeralRunner's
//! job fields. Only these two writes are ever sent (the listener's RBAC allows nothing else, not even a read).

use std::future::Future;

use crds::constants::APPLIED_GENERATION_ANNOTATION;
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
    /// The runner records another registration than the one the job started on: it registered again since (its
    /// pod was taken away before the listener heard of the job), or the status still shows the registration
    /// before (tried again later). Written anyway, another registration's job would make an idle runner look busy
    /// for good: never scaled down, never replaced.
    OtherRegistration,
}

/// What a patch of the EphemeralRunnerSet left on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunnerSetPatched {
    /// `spec.replicas`.
    pub replicas: i64,
    /// `metadata.generation`, the generation of the patched spec.
    pub generation: Option<i64>,
    /// The generation whose scaling step the set's controller recorded as done
    /// ([`APPLIED_GENERATION_ANNOTATION`]); `None` when it records none.
    pub applied_generation: Option<i64>,
}

impl RunnerSetPatched {
    /// What `set` says.
    pub fn of(set: &EphemeralRunnerSet) -> Self {
        Self {
            replicas: set.spec.replicas,
            generation: set.metadata.generation,
            applied_generation: set
                .metadata
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(APPLIED_GENERATION_ANNOTATION))
                .and_then(|value| value.parse().ok()),
        }
    }
}

/// The Kubernetes side of the listener; a seam so the loop can be tested without an API server.
pub trait RunnerSetTarget: Send + Sync {
    /// Merge-patches the EphemeralRunnerSet; returns what the API server answered.
    fn patch_runner_set(
        &self,
        patch: &Value,
    ) -> impl Future<Output = Result<RunnerSetPatched>> + Send;

    /// Writes `fields` (a job's, [`crate::scaling::runner_job_status_patch`]) into the status of EphemeralRunner
    /// `name` if it records registration `runner_id` (the one the job started on) or none yet, recording it then
    /// ([`crds::job_fields_apply`]); 0 writes them whatever the runner records.
    fn patch_runner_status(
        &self,
        name: &str,
        runner_id: i64,
        fields: &Value,
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
    async fn patch_runner_set(&self, patch: &Value) -> Result<RunnerSetPatched> {
        let patched = self
            .runner_sets
            .patch(&self.name, &Self::params(), &Patch::Merge(patch))
            .await
            .map_err(|source| Error::PatchEphemeralRunnerSet {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source,
            })?;
        Ok(RunnerSetPatched::of(&patched))
    }

    async fn patch_runner_status(
        &self,
        name: &str,
        runner_id: i64,
        fields: &Value,
    ) -> Result<RunnerPatched> {
        let (patch, params): (Patch<Value>, PatchParams) = if runner_id == 0 {
            // No registration to check the runner against: a merge patch, as ARC writes them.
            (Patch::Merge(fields.clone()), Self::params())
        } else {
            (
                Patch::Apply(crds::job_fields_apply(
                    name,
                    runner_id,
                    fields
                        .get("status")
                        .and_then(Value::as_object)
                        .cloned()
                        .unwrap_or_default(),
                )),
                PatchParams::apply(FIELD_MANAGER),
            )
        };
        match self.runners.patch_status(name, &params, &patch).await {
            Ok(_) => Ok(RunnerPatched::Patched),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(RunnerPatched::NotFound),
            // The apply's conflict: the status records another registration.
            Err(kube::Error::Api(status)) if status.code == 409 => {
                Ok(RunnerPatched::OtherRegistration)
            }
            Err(source) => Err(Error::PatchEphemeralRunner {
                namespace: self.namespace.clone(),
                name: name.to_owned(),
                source,
            }),
        }
    }
}
