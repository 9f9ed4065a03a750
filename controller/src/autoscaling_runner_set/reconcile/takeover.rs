//! Executes the take-over the pure [`takeover::plan`] decides: runners of superseded runner sets move to the
//! set's own runner set, and superseded runner sets go once an uncached read shows them empty.

use std::sync::Arc;

use crds::constants::INTEGRITY_HASH_ANNOTATION;
use crds::{EphemeralRunner, EphemeralRunnerSet};
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, ReplaceOperation, TestOperation};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::Step;
use crate::autoscaling_runner_set::served::TAKING_OVER;
use crate::autoscaling_runner_set::takeover::{self, TAKEN_OVER_MARK, TakeOver};
use crate::error::{Error, Result, is_status};
use crate::kubeutil::controller_ref;

impl Step<'_> {
    /// One pass of the take-over for the set whose own runner set is `own`; returns what it found.
    pub(super) async fn take_over(&self, own: &EphemeralRunnerSet) -> Result<TakeOver> {
        let runner_sets = self.cached_superseded();
        if runner_sets.is_empty() {
            // Every pass of every set comes here: the runners are looked at only when there is something to take.
            return Ok(TakeOver::default());
        }
        let runners = self.ctx.base.stores.runners.state_filter(|runner| {
            runner.metadata.namespace.as_deref() == Some(self.namespace.as_str())
        });
        let plan = takeover::plan(self.runner_set, &runner_sets, &runners);
        let api: Api<EphemeralRunner> =
            Api::namespaced(self.ctx.base.client.clone(), &self.namespace);
        if !plan.adopt.is_empty() {
            tracing::info!(runners = plan.adopt.len(), busy = plan.busy, superseded = ?plan.superseded, "taking over runners");
            self.event(
                EventType::Normal,
                TAKING_OVER,
                "TakeOver",
                plan.adoption_note(),
            )
            .await;
            let owner = controller_ref(own)?;
            for name in &plan.adopt {
                let cached = runners.iter().find(|runner| runner.name_any() == *name);
                if let Some(runner) = cached {
                    self.adopt(&api, runner, &owner).await?;
                }
            }
        }
        if !plan.delete.is_empty() {
            // A runner set's deletion takes its runners with it: only an uncached read may say it has none.
            let all = api
                .list(&ListParams::default())
                .await
                .map_err(|source| Error::ReadObjects {
                    kind: EphemeralRunner::kind(&()),
                    namespace: self.namespace.clone(),
                    source: Box::new(source),
                })?
                .items;
            for (name, uid) in &plan.delete {
                if takeover::is_empty(name, &all) {
                    self.delete_superseded(name, uid).await?;
                }
            }
        }
        Ok(plan)
    }

    /// Moves `runner` to the runner set `owner` names, as long as it is unchanged since the cache saw it; marks it
    /// made from another template (see [`TAKEN_OVER_MARK`]).
    async fn adopt(
        &self,
        api: &Api<EphemeralRunner>,
        runner: &Arc<EphemeralRunner>,
        owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    ) -> Result<()> {
        let name = runner.name_any();
        let mut references: Vec<_> = runner
            .owner_references()
            .iter()
            .filter(|reference| reference.controller != Some(true))
            .cloned()
            .collect();
        references.push(owner.clone());
        let mut annotations = runner.annotations().clone();
        annotations.insert(
            INTEGRITY_HASH_ANNOTATION.to_owned(),
            TAKEN_OVER_MARK.to_owned(),
        );
        let pointer = |path: &str| path.parse::<PointerBuf>().unwrap_or_default();
        let operations = vec![
            PatchOperation::Test(TestOperation {
                path: pointer("/metadata/resourceVersion"),
                value: json!(runner.resource_version()),
            }),
            PatchOperation::Replace(ReplaceOperation {
                path: pointer("/metadata/ownerReferences"),
                value: json!(references),
            }),
            PatchOperation::Add(AddOperation {
                path: pointer("/metadata/annotations"),
                value: json!(annotations),
            }),
        ];
        match api
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Json::<()>(json_patch::Patch(operations)),
            )
            .await
        {
            Ok(_) => Ok(()),
            // Gone, or changed since the cache saw it: the change's event brings the next pass.
            Err(error)
                if is_status(&error, 404) || is_status(&error, 409) || is_status(&error, 422) =>
            {
                tracing::debug!(runner = %name, %error, "runner changed while being taken over; next pass");
                Ok(())
            }
            Err(source) => Err(Error::PatchObject {
                kind: EphemeralRunner::kind(&()),
                what: "owner",
                namespace: self.namespace.clone(),
                name,
                source: Box::new(source),
            }),
        }
    }

    /// Deletes superseded runner set `name` if it is still the object `uid`. Its dependents are orphaned rather
    /// than collected: a runner moved to it after the read above (nothing should, but a deletion is final) keeps
    /// its pod and job.
    async fn delete_superseded(&self, name: &str, uid: &str) -> Result<()> {
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Orphan),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.runner_sets.delete(name, &params).await {
            Ok(_) => {
                tracing::info!(runner_set = %name, "deleted a superseded runner set");
                self.event(
                    EventType::Normal,
                    TAKING_OVER,
                    "DeleteEphemeralRunnerSet",
                    format!("deleted runner set {name}, left by an earlier controller, now empty"),
                )
                .await;
                Ok(())
            }
            Err(error) if is_status(&error, 404) || is_status(&error, 409) => Ok(()),
            Err(source) => Err(Error::DeleteObject {
                kind: EphemeralRunnerSet::kind(&()),
                namespace: self.namespace.clone(),
                name: name.to_owned(),
                source: Box::new(source),
            }),
        }
    }
}

impl Step<'_> {
    /// This set's superseded runner sets, from the cache.
    fn cached_superseded(&self) -> Vec<Arc<EphemeralRunnerSet>> {
        self.ctx.base.stores.runner_sets.state_filter(|runner_set| {
            runner_set.metadata.namespace.as_deref() == Some(self.namespace.as_str())
                && takeover::superseded_of(self.runner_set, runner_set)
        })
    }

    /// The superseded runner sets of this set in the cache, with whether each is being deleted.
    pub(super) fn superseded_runner_sets(&self) -> Vec<(String, bool)> {
        self.cached_superseded()
            .iter()
            .map(|runner_set| {
                (
                    runner_set.name_any(),
                    runner_set.meta().deletion_timestamp.is_some(),
                )
            })
            .collect()
    }
}
