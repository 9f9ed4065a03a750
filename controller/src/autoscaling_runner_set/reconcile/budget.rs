//! The set's PodDisruptionBudget for busy runners ([`desired_busy_runners_budget`]): created, kept as wanted, or
//! deleted when protection is turned off. Never a reason to hold the set's pass: a drain that cannot wait for a
//! job is a loss this budget avoids, a listener that does not start is a larger one.

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Step;
use crate::autoscaling_runner_set::desired::{
    BudgetStep, budget_step, busy_runners_budget_name, desired_busy_runners_budget,
};
use crate::error::{Error, Result, is_status};
use crate::kubeutil::{controller_ref, delete_if_present, get_if_present};

/// Event and log reason when the budget cannot be written.
pub const BUDGET_NOT_WRITTEN: &str = "BusyRunnerBudgetNotWritten";

impl Step<'_> {
    /// Brings the budget to what the manager's flag asks; a failure is logged and, when it is not a missing
    /// permission (ARC's scale-set chart grants none on budgets), told as an Event on the set. Retried on the
    /// set's next pass.
    pub(super) async fn converge_busy_runners_budget(&self) {
        match self.busy_runners_budget().await {
            Ok(()) => {}
            Err(error) if error.is_forbidden() => {
                tracing::warn!(
                    %error,
                    "may not manage PodDisruptionBudgets here: busy runners are not protected from drains (the \
                     scale-set chart of arc-rs grants it)"
                );
            }
            Err(error) => {
                tracing::warn!(%error, "the busy runners' disruption budget could not be written");
                self.event(
                    EventType::Warning,
                    BUDGET_NOT_WRITTEN,
                    "ReconcilePodDisruptionBudget",
                    format!("busy runners are not protected from drains: {error}"),
                )
                .await;
            }
        }
    }

    async fn busy_runners_budget(&self) -> Result<()> {
        let api: Api<PodDisruptionBudget> =
            Api::namespaced(self.ctx.base.client.clone(), &self.namespace);
        let name = busy_runners_budget_name(self.runner_set);
        let desired = desired_busy_runners_budget(
            self.runner_set,
            controller_ref(self.runner_set)?,
            &self.ctx.base.options.exclude_label_propagation_prefixes,
        );
        let existing = get_if_present(&api, &name, &self.namespace).await?;
        let step = budget_step(
            self.ctx.base.options.protect_busy_runners,
            existing.as_ref(),
            &desired,
            &self.runner_set.uid().unwrap_or_default(),
        );
        let write_error = |source: kube::Error| Error::PatchObject {
            kind: PodDisruptionBudget::kind(&()),
            what: "busy runners",
            namespace: self.namespace.clone(),
            name: name.clone(),
            source: Box::new(source),
        };
        match step {
            BudgetStep::Nothing => {}
            BudgetStep::Create => match api.create(&PostParams::default(), &desired).await {
                Ok(_) => tracing::info!(budget = %name, "protecting busy runners from drains"),
                // Made by a pass a moment ago whose copy the read above did not see yet.
                Err(error) if is_status(&error, 409) => {}
                Err(source) => {
                    return Err(Error::CreateObject {
                        kind: PodDisruptionBudget::kind(&()),
                        namespace: self.namespace.clone(),
                        name: name.clone(),
                        source: Box::new(source),
                    });
                }
            },
            BudgetStep::Update => {
                // The whole spec replaced (a merge would keep selector labels the new one drops), on the
                // version read: an edit since then is looked at again on the next pass.
                let patch: json_patch::Patch = serde_json::from_value(json!([
                    {"op": "test", "path": "/metadata/resourceVersion",
                     "value": existing.as_ref().and_then(|b| b.resource_version())},
                    {"op": "replace", "path": "/spec", "value": desired.spec},
                ]))
                .map_err(|source| Error::Serialize {
                    what: "PodDisruptionBudget patch",
                    source,
                })?;
                api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
                    .await
                    .map_err(write_error)?;
            }
            BudgetStep::Delete => {
                delete_if_present(&api, &name, &self.namespace).await?;
                tracing::info!(budget = %name, "busy runners no longer protected from drains");
            }
            BudgetStep::Foreign => {
                tracing::warn!(
                    budget = %name,
                    "a PodDisruptionBudget of this name belongs to something else; busy runners are not protected"
                );
            }
        }
        Ok(())
    }
}
