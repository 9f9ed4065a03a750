//! What the listener writes to Kubernetes: the EphemeralRunnerSet's `replicas`/`patchID` (with the runners whose
//! finished jobs the target leaves out, [`crds::constants::COMPLETED_RUNNERS_ANNOTATION`]) and an EphemeralRunner's
//! job fields. Only these two patches are ever sent (the listener's RBAC allows nothing else, not even a read).

use std::future::Future;

use crds::constants::APPLIED_GENERATION_ANNOTATION;
use crds::{EphemeralRunner, EphemeralRunnerSet};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, TestOperation};

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
    /// The runner has registered again since the job started on it (its pod was taken away while the listener
    /// had not yet heard of the job): the job is not on the runner as it is now, so its fields are not written.
    /// Written anyway, they would make an idle runner look busy for good: never scaled down, never replaced.
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
    /// `name`, if the runner still runs under registration `runner_id` (the one the job started on) or records
    /// none yet; 0 writes them whatever the runner records.
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
        let attempts: Vec<Patch<Value>> = if runner_id == 0 {
            // No registration to check the runner against: a merge patch, as ARC writes them.
            vec![Patch::Merge(fields.clone())]
        } else {
            job_fields_guards(runner_id)
                .into_iter()
                .map(|guard| Patch::Json(job_fields_patch(guard, fields)))
                .collect()
        };
        for patch in attempts {
            match self
                .runners
                .patch_status(name, &Self::params(), &patch)
                .await
            {
                Ok(_) => return Ok(RunnerPatched::Patched),
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    return Ok(RunnerPatched::NotFound);
                }
                // The guard did not hold: try the next one.
                Err(kube::Error::Api(status)) if status.code == 422 => {}
                Err(source) => {
                    return Err(Error::PatchEphemeralRunner {
                        namespace: self.namespace.clone(),
                        name: name.to_owned(),
                        source,
                    });
                }
            }
        }
        Ok(RunnerPatched::OtherRegistration)
    }
}

/// What a job-fields write requires of the runner's recorded registration (`status.runnerId`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// This registration (0: one forgotten, no registration recorded).
    Is(i64),
    /// No registration recorded: the field is absent.
    Absent,
    /// No status at all yet.
    NoStatus,
}

/// The guards to try in turn for a job that started on registration `runner_id`: the API server checks each
/// (a JSON patch `test`) in the same request as the write, so no read is needed, and the listener's RBAC has no
/// `get`. The first is the usual case (the manager records a registration before its pod can take a job); the
/// others cover a job that started before the manager's record of it landed.
pub fn job_fields_guards(runner_id: i64) -> Vec<Guard> {
    vec![
        Guard::Is(runner_id),
        Guard::Absent,
        Guard::Is(0),
        Guard::NoStatus,
    ]
}

/// The JSON patch writing the job `fields` (`{"status": {...}}`) under `guard`. A `test` of a missing member
/// against `null` holds on the API server (its JSON patch library's reading), which is how absence is tested.
pub fn job_fields_patch(guard: Guard, fields: &Value) -> json_patch::Patch {
    let status = fields
        .get("status")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let path = |p: &str| p.parse::<PointerBuf>().unwrap_or_default();
    let test = |p: &str, value: Value| {
        PatchOperation::Test(TestOperation {
            path: path(p),
            value,
        })
    };
    let add = |p: &str, value: Value| {
        PatchOperation::Add(AddOperation {
            path: path(p),
            value,
        })
    };
    let operations = match guard {
        // Only here is `/status` itself written: it does not exist.
        Guard::NoStatus => vec![
            test("/status", Value::Null),
            add("/status", Value::Object(status)),
        ],
        Guard::Is(_) | Guard::Absent => {
            let expected = match guard {
                Guard::Is(id) => Value::from(id),
                _ => Value::Null,
            };
            std::iter::once(test("/status/runnerId", expected))
                .chain(
                    status
                        .into_iter()
                        .map(|(key, value)| add(&format!("/status/{key}"), value)),
                )
                .collect()
        }
    };
    json_patch::Patch(operations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_guarded_write_tests_the_registration_then_adds_each_field() {
        let fields = json!({"status": {"jobRequestId": 7, "jobDisplayName": "build"}});
        let patch = serde_json::to_value(job_fields_patch(Guard::Is(42), &fields)).unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/status/runnerId", "value": 42},
                {"op": "add", "path": "/status/jobDisplayName", "value": "build"},
                {"op": "add", "path": "/status/jobRequestId", "value": 7},
            ])
        );
        let absent = serde_json::to_value(job_fields_patch(Guard::Absent, &fields)).unwrap();
        assert_eq!(
            absent[0],
            json!({"op": "test", "path": "/status/runnerId", "value": null})
        );
        // Only a status that does not exist is written whole.
        let none = serde_json::to_value(job_fields_patch(Guard::NoStatus, &fields)).unwrap();
        assert_eq!(
            none,
            json!([
                {"op": "test", "path": "/status", "value": null},
                {"op": "add", "path": "/status", "value": {"jobDisplayName": "build", "jobRequestId": 7}},
            ])
        );
    }

    #[test]
    fn the_registration_the_job_started_on_is_tried_first() {
        assert_eq!(
            job_fields_guards(5),
            [Guard::Is(5), Guard::Absent, Guard::Is(0), Guard::NoStatus]
        );
    }
}
