//! The scale set in the Actions Service (docs/reference/controllers.md, "The scale set"): found or created and
//! recorded on the set, kept in step with the set's runner group, name and labels, re-created when it was deleted
//! on GitHub's side, and deleted with the set.

use actions_client::RunnerScaleSet;
use crds::constants::{
    RUNNER_GROUP_NAME_ANNOTATION, RUNNER_SCALE_SET_ID_ANNOTATION, RUNNER_SCALE_SET_NAME_ANNOTATION,
    SCALE_SET_LABELS_ANNOTATION,
};
use kube::ResourceExt;
use kube::runtime::events::EventType;
use serde_json::json;

use super::{ScaleSetStep, Step};
use crate::actions::{Actions, ClientSource, credentials_gone};
use crate::autoscaling_runner_set::desired::{recorded_scale_set_id, scale_set_labels, url_labels};
// The module keeping the service's labels in step (its own name is `desired::scale_set_labels`'s here).
use crate::autoscaling_runner_set::scale_set_labels as label_sync;
use crate::error::Result;

impl Step<'_> {
    async fn actions(&self) -> Result<Actions> {
        let spec = &self.runner_set.spec;
        self.ctx
            .base
            .actions
            .get(&ClientSource {
                namespace: &self.namespace,
                github_config_url: &spec.github_config_url,
                github_config_secret: &spec.github_config_secret,
                proxy: spec.proxy.as_ref(),
                tls: spec.github_server_tls.as_ref(),
                vault: spec.vault_config.as_ref(),
            })
            .await
    }

    fn scale_set_name(&self) -> &str {
        self.runner_set.spec.scale_set_name(&self.name)
    }

    /// The scale set (docs/reference/controllers.md, "The scale set"), with (beyond ARC) a periodic check that it
    /// still exists.
    pub(super) async fn ensure_scale_set(&self) -> Result<ScaleSetStep> {
        let annotations = self.runner_set.annotations();
        let Some(id) = recorded_scale_set_id(self.runner_set) else {
            let actions = self.actions().await?;
            return self.create_or_adopt(&actions, None).await;
        };
        if self.ctx.scale_set_check_due(&self.key) {
            let actions = self.actions().await?;
            if actions.get_scale_set_by_id(id).await?.is_none() {
                self.ctx.scale_set_checked(&self.key, false);
                return self.create_or_adopt(&actions, Some(id)).await;
            }
            self.ctx.scale_set_checked(&self.key, true);
        }
        let spec = &self.runner_set.spec;
        let group_annotation = annotations.get(RUNNER_GROUP_NAME_ANNOTATION);
        let group_changed = group_annotation.is_none()
            || (!spec.runner_group.is_empty()
                && !group_annotation.is_some_and(|g| g.eq_ignore_ascii_case(&spec.runner_group)));
        if group_changed {
            let actions = self.actions().await?;
            let group_id = actions.runner_group_id(&spec.runner_group).await?;
            let updated = actions
                .update_scale_set(
                    id,
                    &RunnerScaleSet {
                        runner_group_id: group_id,
                        ..RunnerScaleSet::default()
                    },
                )
                .await?;
            self.merge_patch(
                "runner group",
                json!({"metadata": {"annotations": {
                    RUNNER_GROUP_NAME_ANNOTATION: updated.runner_group_name,
                    RUNNER_SCALE_SET_NAME_ANNOTATION: updated.name,
                }}}),
            )
            .await?;
            return Ok(ScaleSetStep::Recorded);
        }
        let name_annotation = annotations.get(RUNNER_SCALE_SET_NAME_ANNOTATION);
        let name_changed = !spec.runner_scale_set_name.is_empty()
            && !name_annotation
                .is_some_and(|n| n.eq_ignore_ascii_case(&spec.runner_scale_set_name));
        if name_changed || name_annotation.is_none() {
            let actions = self.actions().await?;
            let updated = actions
                .update_scale_set(
                    id,
                    &RunnerScaleSet {
                        name: self.scale_set_name().to_owned(),
                        ..RunnerScaleSet::default()
                    },
                )
                .await?;
            self.merge_patch(
                "scale set name",
                json!({"metadata": {"annotations": {RUNNER_SCALE_SET_NAME_ANNOTATION: updated.name}}}),
            )
            .await?;
            return Ok(ScaleSetStep::Recorded);
        }
        if let Some(wanted) = label_sync::pending(self.runner_set, self.scale_set_name()) {
            let pushed = label_sync::push(&self.actions().await?, id, wanted).await?;
            if let Some(note) = pushed.note(id) {
                self.event(
                    EventType::Normal,
                    "ScaleSetLabelsUpdated",
                    "UpdateScaleSet",
                    note,
                )
                .await;
            }
            self.merge_patch("scale set labels", pushed.record())
                .await?;
            return Ok(ScaleSetStep::Recorded);
        }
        Ok(ScaleSetStep::Ready(id))
    }

    /// Finds the scale set by group and name, or creates it, and records it on the ARS. `lost` is the id of a
    /// scale set that was deleted on GitHub's side.
    async fn create_or_adopt(&self, actions: &Actions, lost: Option<i64>) -> Result<ScaleSetStep> {
        let spec = &self.runner_set.spec;
        let name = self.scale_set_name();
        let group_id = actions.runner_group_id(&spec.runner_group).await?;
        let scale_set = match actions.get_scale_set(group_id, name).await? {
            Some(existing) => existing,
            None => {
                let created = actions
                    .create_scale_set(&RunnerScaleSet {
                        name: name.to_owned(),
                        runner_group_id: group_id,
                        labels: scale_set_labels(name, &spec.runner_scale_set_labels),
                        runner_setting: actions_client::RunnerSetting {
                            disable_update: true,
                            ..actions_client::RunnerSetting::default()
                        },
                        ..RunnerScaleSet::default()
                    })
                    .await?;
                let note = match lost {
                    Some(old) => format!(
                        "scale set {old} no longer exists in the Actions Service; re-created it as {} \
                         (name {:?}, runner group {:?})",
                        created.id, created.name, created.runner_group_name
                    ),
                    None => format!(
                        "created runner scale set {} (name {:?}, runner group {:?})",
                        created.id, created.name, created.runner_group_name
                    ),
                };
                let reason = if lost.is_some() {
                    "ScaleSetRecreated"
                } else {
                    "ScaleSetCreated"
                };
                self.event(EventType::Normal, reason, "CreateScaleSet", note)
                    .await;
                created
            }
        };
        let mut patch = json!({
            "metadata": {
                "annotations": {
                    RUNNER_SCALE_SET_NAME_ANNOTATION: scale_set.name,
                    RUNNER_SCALE_SET_ID_ANNOTATION: scale_set.id.to_string(),
                    RUNNER_GROUP_NAME_ANNOTATION: scale_set.runner_group_name,
                    SCALE_SET_LABELS_ANNOTATION: label_sync::record_text(&scale_set.labels),
                },
                "labels": url_labels(&spec.github_config_url),
            }
        });
        if spec.runner_scale_set_name.is_empty() {
            patch["spec"] = json!({"runnerScaleSetName": self.name});
        }
        self.merge_patch("scale set", patch).await?;
        self.ctx.scale_set_checked(&self.key, true);
        Ok(ScaleSetStep::Recorded)
    }

    pub(super) async fn delete_scale_set(&self) -> Result<()> {
        let Some(id) = recorded_scale_set_id(self.runner_set) else {
            return Ok(());
        };
        match self.actions().await {
            Ok(actions) => actions.delete_scale_set(id).await?,
            Err(error) if credentials_gone(&error) => {
                // Nothing can talk to GitHub for this set any more (its Secret went first, e.g. with the
                // namespace); waiting would block the deletion forever.
                tracing::warn!(%error, id, "cannot delete the scale set from GitHub: credentials are gone");
                self.event(
                    EventType::Warning,
                    "ScaleSetNotDeleted",
                    "DeleteScaleSet",
                    format!(
                        "runner scale set {id} was left in GitHub because the credentials Secret is gone; \
                         remove it from the repository or organization settings"
                    ),
                )
                .await;
            }
            Err(error) => return Err(error),
        }
        self.merge_patch(
            "scale set id",
            json!({"metadata": {"annotations": {RUNNER_SCALE_SET_ID_ANNOTATION: null}}}),
        )
        .await
    }
}
