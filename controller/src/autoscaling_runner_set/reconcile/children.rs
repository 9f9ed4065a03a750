//! The set's EphemeralRunnerSet (docs/reference/controllers.md, "The EphemeralRunnerSet"): created, its template
//! and metadata kept up to date, replaced when its runners are outdated, scaled to zero while the set itself is
//! `Outdated`.

use crds::EphemeralRunnerSet;
use crds::constants::{RERUN_INTERRUPTED_JOBS_ANNOTATION, phase};
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{Converged, SHORT_WAIT, Step};
use crate::autoscaling_runner_set::conditions::Finding;
use crate::autoscaling_runner_set::desired::{
    contains_all, desired_listener_name, desired_runner_set,
};
use crate::autoscaling_runner_set::served::TAKING_OVER;
use crate::error::{Error, Result};
use crate::kubeutil::{controller_ref, delete_if_present, get_if_present};

impl Step<'_> {
    /// A set whose status says `Outdated` stops its listener and scales its runners to zero until its spec changes
    /// (docs/reference/controllers.md, "ARS reconcile", step 5).
    pub(super) async fn pause_outdated(&self) -> Result<Action> {
        if self
            .delete_listener(&desired_listener_name(self.runner_set))
            .await?
        {
            return Ok(Action::requeue(SHORT_WAIT));
        }
        match self.get_runner_set().await? {
            Some(set) if set.meta().deletion_timestamp.is_none() => {
                self.runner_sets
                    .patch(
                        &self.name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"replicas": null, "patchID": 0}})),
                    )
                    .await
                    .map_err(|source| Error::PatchObject {
                        kind: EphemeralRunnerSet::kind(&()),
                        what: "replicas",
                        namespace: self.namespace.clone(),
                        name: self.name.clone(),
                        source: Box::new(source),
                    })?;
            }
            _ => {}
        }
        Ok(Action::await_change())
    }

    pub(super) async fn get_runner_set(&self) -> Result<Option<EphemeralRunnerSet>> {
        get_if_present(&self.runner_sets, &self.name, &self.namespace).await
    }

    /// EphemeralRunnerSet, then listener.
    pub(super) async fn converge_children(&self, scale_set_id: i64) -> Result<Converged> {
        let options = &self.ctx.base.options;
        let owner = controller_ref(self.runner_set)?;
        let desired = desired_runner_set(
            self.runner_set,
            owner,
            scale_set_id,
            &options.exclude_label_propagation_prefixes,
        )?;
        let Some(existing) = self.get_runner_set().await? else {
            self.runner_sets
                .create(&PostParams::default(), &desired)
                .await
                .map_err(|source| Error::CreateObject {
                    kind: EphemeralRunnerSet::kind(&()),
                    namespace: self.namespace.clone(),
                    name: self.name.clone(),
                    source: Box::new(source),
                })?;
            return Ok(Converged::soon(
                Finding::new("ListenerStarting", "creating the EphemeralRunnerSet"),
                None,
            ));
        };
        if existing.meta().deletion_timestamp.is_some() {
            return Ok(Converged::soon(
                Finding::new(
                    "EphemeralRunnerSetDeleting",
                    "waiting for the old EphemeralRunnerSet to go away",
                ),
                None,
            ));
        }
        let status = existing.status.clone();
        if existing
            .status
            .as_ref()
            .is_some_and(|s| s.phase == phase::OUTDATED)
        {
            // A set whose runners report an outdated version is replaced, listener first
            // (docs/reference/controllers.md, "The EphemeralRunnerSet").
            if self
                .delete_listener(&desired_listener_name(self.runner_set))
                .await?
            {
                return Ok(Converged::soon(
                    Finding::new("RunnerImageOutdated", "replacing the outdated runners"),
                    status,
                ));
            }
            delete_if_present(&self.runner_sets, &self.name, &self.namespace).await?;
            self.event(
                EventType::Warning,
                "RunnerImageOutdated",
                "ReplaceEphemeralRunnerSet",
                "runners reported that their version is no longer accepted by GitHub; update the runner image"
                    .to_owned(),
            )
            .await;
            return Ok(Converged::soon(
                Finding::new("RunnerImageOutdated", "replacing the outdated runners"),
                status,
            ));
        }
        let take_over = self.take_over(&existing).await?;
        if !take_over.adopt.is_empty() {
            // The listener starts (or goes on) only once the set's own runner set counts the moved runners: a
            // pass that finds none left to move reads the same cache as that runner set's controller.
            return Ok(Converged::soon(
                Finding::new(TAKING_OVER, take_over.adoption_note()),
                status,
            ));
        }
        self.update_runner_set(&existing, &desired).await?;
        self.converge_busy_runners_budget().await;
        let (mut action, listener) = self.converge_listener(scale_set_id).await?;
        if !take_over.is_done() {
            // Superseded runner sets on their way out: their deletion is not an event of this set.
            action = Action::requeue(SHORT_WAIT);
        }
        Ok(Converged {
            action,
            listener,
            runner_set_status: status,
        })
    }

    /// Brings the set's template and metadata up to date. Unlike ARC, the template is updated at once even
    /// while runners are busy: the EphemeralRunnerSet controller replaces idle runners and lets busy ones
    /// finish, and ARC's wait could last forever while `minRunners` keeps idle runners around
    /// (docs/reference/controllers.md, "Template changes while runners are busy").
    async fn update_runner_set(
        &self,
        existing: &EphemeralRunnerSet,
        desired: &EphemeralRunnerSet,
    ) -> Result<()> {
        // The one annotation this controller removes as well as adds: a re-run setting turned off.
        let withdrawn = !desired
            .annotations()
            .contains_key(RERUN_INTERRUPTED_JOBS_ANNOTATION)
            && existing
                .annotations()
                .contains_key(RERUN_INTERRUPTED_JOBS_ANNOTATION);
        let labels_ok = contains_all(existing.labels(), desired.labels());
        let annotations_ok =
            contains_all(existing.annotations(), desired.annotations()) && !withdrawn;
        let metadata_ok =
            existing.spec.ephemeral_runner_metadata == desired.spec.ephemeral_runner_metadata;
        if labels_ok && annotations_ok && metadata_ok {
            return Ok(());
        }
        let mut labels = existing.labels().clone();
        labels.extend(desired.labels().clone());
        let mut annotations = existing.annotations().clone();
        if withdrawn {
            annotations.remove(RERUN_INTERRUPTED_JOBS_ANNOTATION);
        }
        annotations.extend(desired.annotations().clone());
        let add = |path: &str, value: serde_json::Value| {
            PatchOperation::Add(AddOperation {
                path: path.parse::<PointerBuf>().unwrap_or_default(),
                value,
            })
        };
        let template =
            serde_json::to_value(&desired.spec.ephemeral_runner_spec).map_err(|source| {
                Error::Serialize {
                    what: "EphemeralRunnerSet template",
                    source,
                }
            })?;
        let mut operations = vec![
            add("/metadata/labels", json!(labels)),
            add("/metadata/annotations", json!(annotations)),
            add("/spec/ephemeralRunnerSpec", template),
        ];
        match &desired.spec.ephemeral_runner_metadata {
            Some(meta) => operations.push(add("/spec/ephemeralRunnerMetadata", json!(meta))),
            None if existing.spec.ephemeral_runner_metadata.is_some() => {
                operations.push(PatchOperation::Remove(json_patch::RemoveOperation {
                    path: "/spec/ephemeralRunnerMetadata"
                        .parse::<PointerBuf>()
                        .unwrap_or_default(),
                }));
            }
            None => {}
        }
        // A JSON patch replaces the template as a whole (a merge patch would keep fields the new one drops)
        // and leaves `replicas`/`patchID`, which the listener owns, alone.
        self.runner_sets
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Json::<()>(json_patch::Patch(operations)),
            )
            .await
            .map_err(|source| Error::PatchObject {
                kind: EphemeralRunnerSet::kind(&()),
                what: "template",
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            })?;
        tracing::info!("updated the EphemeralRunnerSet");
        Ok(())
    }
}
