//! One AutoscalingRunnerSet reconcile (docs/reference/controllers.md, "ARS reconcile").
//!
//! # Expected flow
//! version gate → finalizer → integrity hash (phase `Pending` on change) → scale set (create or reuse; re-create
//! when deleted on GitHub's side; runner group and name updates) → EphemeralRunnerSet (create or update) →
//! AutoscalingListener (create, or delete and recreate when it differs; orphans of an older name go) → status
//! (phase, counters, conditions) and Events on condition changes.
//!
//! # Guarantees
//! * Every failure ends up in a condition with a fixed reason word and, when the reason changes, an Event.
//! * Failures that need someone to act (credentials, Secret, runner group) are retried slowly (see
//!   `error_policy`); the status write they cause does not trigger a new pass (status changes are filtered).
//! * Deletion: listener → EphemeralRunnerSet (its runners are removed from the service) → scale set →
//!   cleanup-protection finalizers → own finalizer. Each step only waits for things that can still happen: a
//!   credentials Secret that is gone (namespace deletion, chart removed first) skips the service call instead
//!   of blocking the deletion forever.

use std::sync::Arc;
use std::time::Duration;

use actions_client::RunnerScaleSet;
use crds::constants::{
    AUTOSCALING_RUNNER_SET_FINALIZER, CLEANUP_GITHUB_SECRET_NAME_ANNOTATION,
    CLEANUP_KUBERNETES_MODE_ROLE_BINDING_NAME_ANNOTATION,
    CLEANUP_KUBERNETES_MODE_ROLE_NAME_ANNOTATION,
    CLEANUP_KUBERNETES_MODE_SERVICE_ACCOUNT_NAME_ANNOTATION,
    CLEANUP_MANAGER_ROLE_BINDING_ANNOTATION, CLEANUP_MANAGER_ROLE_NAME_ANNOTATION,
    CLEANUP_NO_PERMISSION_SERVICE_ACCOUNT_NAME_ANNOTATION, CLEANUP_PROTECTION_FINALIZER,
    INTEGRITY_HASH_ANNOTATION, RUNNER_GROUP_NAME_ANNOTATION, RUNNER_SCALE_SET_ID_ANNOTATION,
    RUNNER_SCALE_SET_NAME_ANNOTATION, SCALE_SET_LABELS_ANNOTATION, SCALE_SET_NAME_LABEL,
    SCALE_SET_NAMESPACE_LABEL, VERSION_LABEL, phase,
};
use crds::version::{ARC_COMPATIBLE_VERSION, is_version_accepted};
use crds::{AutoscalingListener, AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet};
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::RunnerSetContext;
use super::conditions::{self, Finding, Observation};
use super::desired::{
    ListenerInputs, contains_all, desired_listener, desired_listener_name, desired_runner_set,
    listener_up_to_date, recorded_scale_set_id, runner_set_hash, scale_set_labels, url_labels,
};
use super::runners::{blockage, pending_deadline, runner_set_of_runner, runners_finding};
use super::served::{LISTENER_PROGRESS_REASONS, ListenerView, judge_listener};
use crate::actions::{Actions, ClientSource, credentials_gone};
use crate::error::{Error, Result, is_status};
use crate::kubeutil::{
    add_finalizers, controller_ref, delete_if_present, has_finalizer, name_and_namespace,
    remove_finalizers,
};
use crate::metrics::RunnerLabels;
use crate::options::ARS_FIELD_MANAGER;

const KIND: &str = "AutoscalingRunnerSet";
/// Come back soon: waiting for a child to go away or appear.
const SHORT_WAIT: Duration = Duration::from_secs(1);

/// Reconciles one AutoscalingRunnerSet.
#[tracing::instrument(skip(runner_set, ctx), fields(runner_set = %runner_set.name_any(), namespace = runner_set.namespace().unwrap_or_default()))]
pub async fn reconcile(
    runner_set: Arc<AutoscalingRunnerSet>,
    ctx: Arc<RunnerSetContext>,
) -> Result<Action> {
    let step = Step::new(&runner_set, &ctx)?;
    if runner_set.meta().deletion_timestamp.is_some() {
        return step.finalize().await;
    }
    let version = runner_set
        .labels()
        .get(VERSION_LABEL)
        .map_or("", String::as_str);
    if !is_version_accepted(version, &ctx.base.options.build_version) {
        return step.reject_version(version).await;
    }
    if add_finalizers(
        &step.api,
        &runner_set,
        &[AUTOSCALING_RUNNER_SET_FINALIZER],
        KIND,
    )
    .await?
    {
        return Ok(Action::requeue(SHORT_WAIT));
    }
    let hash = runner_set_hash(&runner_set)?;
    if runner_set.annotations().get(INTEGRITY_HASH_ANNOTATION) != Some(&hash) {
        step.stamp_hash(&hash).await?;
        return Ok(Action::requeue(SHORT_WAIT));
    }
    if runner_set
        .status
        .as_ref()
        .is_some_and(|status| status.phase == phase::OUTDATED)
    {
        return step.pause_outdated().await;
    }

    // Checked before anything is created in GitHub: a set that can never run must say so on itself, not only
    // fail later in the listener controller.
    if let Err(reason) = check_runner_bounds(&runner_set.spec) {
        let error = Error::InvalidRunnerSetSpec {
            name: runner_set.name_any(),
            reason,
        };
        let finding = Finding::new(conditions::scale_set_reason(&error), error.to_string());
        step.write_status(Err(finding), None, None).await?;
        return Err(error);
    }

    let scale_set = step.ensure_scale_set().await;
    let (scale_set_id, converged) = match scale_set {
        Ok(ScaleSetStep::Ready(id)) => (id, step.converge_children(id).await),
        Ok(ScaleSetStep::Recorded) => return Ok(Action::requeue(SHORT_WAIT)),
        Err(error) => {
            let finding = Finding::new(conditions::scale_set_reason(&error), error.to_string());
            step.write_status(Err(finding), None, None).await?;
            return Err(error);
        }
    };
    match converged {
        Ok((action, listener, runner_set_status)) => {
            step.write_status(
                Ok(format!("runner scale set id {scale_set_id}")),
                Some(listener),
                runner_set_status.as_ref(),
            )
            .await?;
            Ok(action)
        }
        Err(error) => {
            let finding = Finding::new("ChildrenNotReconciled", error.to_string());
            step.write_status(
                Ok(format!("runner scale set id {scale_set_id}")),
                Some(Err(finding)),
                None,
            )
            .await?;
            Err(error)
        }
    }
}

/// `minRunners` may not exceed `maxRunners` (the CRD schema checks each against 0 only).
pub fn check_runner_bounds(
    spec: &crds::AutoscalingRunnerSetSpec,
) -> std::result::Result<(), String> {
    let (min, max) = (spec.effective_min_runners(), spec.effective_max_runners());
    if min > max {
        return Err(format!(
            "minRunners ({min}) is greater than maxRunners ({max})"
        ));
    }
    crds::schedule::check(&spec.min_runners_schedules, max).map_err(|e| e.to_string())
}

/// Outcome of the scale-set step.
enum ScaleSetStep {
    /// The scale set exists with this id, and the annotations say so.
    Ready(i64),
    /// The ARS was patched (new id, group or name); the patch triggers the next pass.
    Recorded,
}

struct Step<'a> {
    runner_set: &'a AutoscalingRunnerSet,
    ctx: &'a RunnerSetContext,
    name: String,
    namespace: String,
    key: String,
    api: Api<AutoscalingRunnerSet>,
    runner_sets: Api<EphemeralRunnerSet>,
    listeners: Api<AutoscalingListener>,
}

impl<'a> Step<'a> {
    fn new(runner_set: &'a AutoscalingRunnerSet, ctx: &'a RunnerSetContext) -> Result<Self> {
        let (name, namespace) = name_and_namespace(runner_set, KIND)?;
        let client = ctx.base.client.clone();
        Ok(Self {
            runner_set,
            ctx,
            key: format!("{namespace}/{name}"),
            api: Api::namespaced(client.clone(), &namespace),
            runner_sets: Api::namespaced(client.clone(), &namespace),
            listeners: Api::namespaced(client, &ctx.namespace),
            name,
            namespace,
        })
    }

    fn reference(&self) -> ObjectReference {
        self.runner_set.object_ref(&())
    }

    fn metric_labels(&self) -> RunnerLabels {
        RunnerLabels {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
        }
    }

    fn has_finalizer(&self) -> bool {
        has_finalizer(self.runner_set, AUTOSCALING_RUNNER_SET_FINALIZER)
    }

    async fn event(&self, type_: EventType, reason: &str, action: &str, note: String) {
        self.ctx
            .base
            .publish(&self.reference(), type_, reason, action, note)
            .await;
    }

    fn patch_error(&self, what: &'static str) -> impl FnOnce(kube::Error) -> Error + '_ {
        move |source| Error::PatchObject {
            kind: KIND,
            what,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source: Box::new(source),
        }
    }

    async fn merge_patch(&self, what: &'static str, patch: serde_json::Value) -> Result<()> {
        self.api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(drop)
            .map_err(self.patch_error(what))
    }

    /// ARC deletes a set labelled for an incompatible version (docs/reference/controllers.md, "The version gate").
    async fn reject_version(&self, version: &str) -> Result<Action> {
        let build = &self.ctx.base.options.build_version;
        tracing::warn!(
            version,
            build,
            "incompatible app.kubernetes.io/version; deleting"
        );
        self.event(
            EventType::Warning,
            "VersionNotAllowed",
            "Delete",
            format!(
                "label app.kubernetes.io/version {version:?} is not compatible with controller version \
                 {build:?} (nor with ARC {ARC_COMPATIBLE_VERSION}); deleting the AutoscalingRunnerSet (install a \
                 chart of the controller's version)"
            ),
        )
        .await;
        delete_if_present(&self.api, &self.name, &self.namespace, KIND).await?;
        Ok(Action::await_change())
    }

    /// A changed spec or label set makes the phase `Pending` until the next full pass
    /// (docs/reference/controllers.md, "ARS reconcile", step 4).
    async fn stamp_hash(&self, hash: &str) -> Result<()> {
        self.merge_patch(
            "integrity hash",
            json!({"metadata": {"annotations": {INTEGRITY_HASH_ANNOTATION: hash}}}),
        )
        .await?;
        let mut status = self.runner_set.status.clone().unwrap_or_default();
        status.phase = phase::PENDING.to_owned();
        self.apply_status(&status).await
    }

    async fn apply_status(&self, status: &crds::AutoscalingRunnerSetStatus) -> Result<()> {
        let patch = json!({
            "apiVersion": crds::constants::API_VERSION,
            "kind": KIND,
            "status": status,
        });
        self.api
            .patch_status(
                &self.name,
                &PatchParams::apply(ARS_FIELD_MANAGER).force(),
                &Patch::Apply(patch),
            )
            .await
            .map(drop)
            .map_err(self.patch_error("status"))
    }

    /// A set whose status says `Outdated` stops its listener and scales its runners to zero until its spec changes
    /// (docs/reference/controllers.md, "ARS reconcile", step 5).
    async fn pause_outdated(&self) -> Result<Action> {
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
                        kind: "EphemeralRunnerSet",
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
    async fn ensure_scale_set(&self) -> Result<ScaleSetStep> {
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
        if let Some(wanted) =
            super::scale_set_labels::pending(self.runner_set, self.scale_set_name())
        {
            let pushed = super::scale_set_labels::push(&self.actions().await?, id, wanted).await?;
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
                    SCALE_SET_LABELS_ANNOTATION: super::scale_set_labels::record_text(&scale_set.labels),
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

    async fn get_runner_set(&self) -> Result<Option<EphemeralRunnerSet>> {
        self.runner_sets
            .get_opt(&self.name)
            .await
            .map_err(|source| Error::ReadObjects {
                kind: "EphemeralRunnerSet",
                namespace: self.namespace.clone(),
                source: Box::new(source),
            })
    }

    /// EphemeralRunnerSet, listener; returns the action, what the listener does, and the set's status.
    async fn converge_children(
        &self,
        scale_set_id: i64,
    ) -> Result<(
        Action,
        Result<String, Finding>,
        Option<crds::EphemeralRunnerSetStatus>,
    )> {
        let options = &self.ctx.base.options;
        let owner = controller_ref(self.runner_set, KIND)?;
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
                    kind: "EphemeralRunnerSet",
                    namespace: self.namespace.clone(),
                    name: self.name.clone(),
                    source: Box::new(source),
                })?;
            return Ok((
                Action::requeue(SHORT_WAIT),
                Err(Finding::new(
                    "ListenerStarting",
                    "creating the EphemeralRunnerSet",
                )),
                None,
            ));
        };
        if existing.meta().deletion_timestamp.is_some() {
            return Ok((
                Action::requeue(SHORT_WAIT),
                Err(Finding::new(
                    "EphemeralRunnerSetDeleting",
                    "waiting for the old EphemeralRunnerSet to go away",
                )),
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
                return Ok((
                    Action::requeue(SHORT_WAIT),
                    Err(Finding::new(
                        "RunnerImageOutdated",
                        "replacing the outdated runners",
                    )),
                    status,
                ));
            }
            delete_if_present(
                &self.runner_sets,
                &self.name,
                &self.namespace,
                "EphemeralRunnerSet",
            )
            .await?;
            self.event(
                EventType::Warning,
                "RunnerImageOutdated",
                "ReplaceEphemeralRunnerSet",
                "runners reported that their version is no longer accepted by GitHub; update the runner image"
                    .to_owned(),
            )
            .await;
            return Ok((
                Action::requeue(SHORT_WAIT),
                Err(Finding::new(
                    "RunnerImageOutdated",
                    "replacing the outdated runners",
                )),
                status,
            ));
        }
        self.update_runner_set(&existing, &desired).await?;
        let (action, listener) = self.converge_listener(scale_set_id).await?;
        Ok((action, listener, status))
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
        let labels_ok = contains_all(existing.labels(), desired.labels());
        let annotations_ok = contains_all(existing.annotations(), desired.annotations());
        let metadata_ok =
            existing.spec.ephemeral_runner_metadata == desired.spec.ephemeral_runner_metadata;
        if labels_ok && annotations_ok && metadata_ok {
            return Ok(());
        }
        let mut labels = existing.labels().clone();
        labels.extend(desired.labels().clone());
        let mut annotations = existing.annotations().clone();
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
                kind: "EphemeralRunnerSet",
                what: "template",
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            })?;
        tracing::info!("updated the EphemeralRunnerSet");
        Ok(())
    }

    /// Deletes listener `name` if present; returns whether it still exists.
    async fn delete_listener(&self, name: &str) -> Result<bool> {
        let existing = self
            .listeners
            .get_opt(name)
            .await
            .map_err(|source| Error::ReadObjects {
                kind: "AutoscalingListener",
                namespace: self.ctx.namespace.clone(),
                source: Box::new(source),
            })?;
        match existing {
            None => Ok(false),
            Some(listener) if listener.meta().deletion_timestamp.is_some() => Ok(true),
            Some(_) => {
                delete_if_present(
                    &self.listeners,
                    name,
                    &self.ctx.namespace,
                    "AutoscalingListener",
                )
                .await
            }
        }
    }

    /// Listeners of this set under another name, left behind by a runner group or URL change
    /// (docs/reference/controllers.md, "Orphaned listeners").
    fn orphan_listeners(&self, current: &str) -> Vec<String> {
        self.ctx
            .listeners
            .state()
            .iter()
            .filter(|listener| {
                let labels = listener.labels();
                listener.name_any() != current
                    && labels.get(SCALE_SET_NAME_LABEL) == Some(&self.name)
                    && labels.get(SCALE_SET_NAMESPACE_LABEL) == Some(&self.namespace)
            })
            .map(|listener| listener.name_any())
            .collect()
    }

    async fn converge_listener(
        &self,
        scale_set_id: i64,
    ) -> Result<(Action, Result<String, Finding>)> {
        let options = &self.ctx.base.options;
        let desired = desired_listener(
            self.runner_set,
            scale_set_id,
            &ListenerInputs {
                namespace: &self.ctx.namespace,
                image: &options.listener.image,
                image_pull_secrets: &options.listener.image_pull_secrets,
                excluded_prefixes: &options.exclude_label_propagation_prefixes,
            },
        )?;
        let name = desired.name_any();
        for orphan in self.orphan_listeners(&name) {
            tracing::info!(listener = %orphan, "deleting a listener left behind under an older name");
            self.delete_listener(&orphan).await?;
        }
        let existing =
            self.listeners
                .get_opt(&name)
                .await
                .map_err(|source| Error::ReadObjects {
                    kind: "AutoscalingListener",
                    namespace: self.ctx.namespace.clone(),
                    source: Box::new(source),
                })?;
        let Some(existing) = existing else {
            self.listeners
                .create(&PostParams::default(), &desired)
                .await
                .map_err(|source| Error::CreateObject {
                    kind: "AutoscalingListener",
                    namespace: self.ctx.namespace.clone(),
                    name: name.clone(),
                    source: Box::new(source),
                })?;
            return Ok((
                Action::requeue(SHORT_WAIT),
                Err(Finding::new("ListenerStarting", "creating the listener")),
            ));
        };
        if existing.meta().deletion_timestamp.is_some() {
            return Ok((
                Action::requeue(SHORT_WAIT),
                Err(Finding::new(
                    "ListenerRestarting",
                    "the previous listener is shutting down",
                )),
            ));
        }
        if !listener_up_to_date(&existing, &desired) {
            tracing::info!(listener = %name, "listener settings changed; recreating it");
            self.delete_listener(&name).await?;
            return Ok((
                Action::requeue(SHORT_WAIT),
                Err(Finding::new(
                    "ListenerRestarting",
                    "applying new listener settings",
                )),
            ));
        }
        let pod = self.ctx.listener_pod(&name);
        let credentials = format!(
            "{}/{}",
            self.namespace, self.runner_set.spec.github_config_secret
        );
        let verdict = judge_listener(
            &ListenerView {
                listener: &existing,
                pod: pod.as_deref(),
                scale_set_id,
                credentials: &credentials,
                scale_set_check_interval: options.scale_set_check_interval,
            },
            Timestamp::now(),
        );
        // A report going stale changes the verdict without any event: look again by then.
        let wait = verdict
            .recheck_in
            .map_or(options.resync_interval, |recheck| {
                options.resync_interval.min(recheck.max(SHORT_WAIT))
            });
        // The status shows the scheduled minimum: look again when a window opens or closes.
        let wait = super::schedule_status::next_change_in(&self.runner_set.spec, Timestamp::now())
            .map_or(wait, |change| wait.min(change.max(SHORT_WAIT)));
        // A runner pod still Pending counts as blocked once it has been so for the limit, which no event
        // announces: look again at that moment, not at the next periodic pass.
        let wait = self
            .next_pending_deadline()
            .map_or(wait, |deadline| wait.min(deadline.max(SHORT_WAIT)));
        Ok((Action::requeue(wait), verdict.outcome))
    }

    /// The set's runner pods, from the manager's caches (runners being deleted left out).
    fn runner_pods(&self) -> impl Iterator<Item = (Arc<EphemeralRunner>, Option<Arc<Pod>>)> + '_ {
        let stores = &self.ctx.base.stores;
        let set = ObjectRef::<AutoscalingRunnerSet>::new(&self.name).within(&self.namespace);
        stores
            .runners
            .state()
            .into_iter()
            .filter(move |runner| {
                runner.metadata.deletion_timestamp.is_none()
                    && runner_set_of_runner(runner).as_ref() == Some(&set)
            })
            .map(|runner| {
                let pod = stores
                    .pods
                    .get(&ObjectRef::new(&runner.name_any()).within(&self.namespace));
                (runner, pod)
            })
    }

    /// When the first of the set's Pending runner pods would count as blocked by the clock alone.
    fn next_pending_deadline(&self) -> Option<Duration> {
        let now = Timestamp::now();
        let limit = self.ctx.base.options.pending_pod_limit;
        self.runner_pods()
            .filter_map(|(_, pod)| pending_deadline(pod.as_deref()?, now, limit))
            .min()
    }

    /// The set's runners that cannot start, from the manager's caches of runners and their pods.
    fn runners(&self) -> Result<String, Finding> {
        let mut total = 0;
        let mut blocked = Vec::new();
        for (runner, pod) in self.runner_pods() {
            total += 1;
            let name = runner.name_any();
            if let Some(why) = blockage(
                &runner,
                pod.as_deref(),
                self.ctx.base.options.pending_pod_limit,
            ) {
                blocked.push((name, why));
            }
        }
        runners_finding(&blocked, total)
    }

    /// Writes phase, counters and conditions; publishes an Event when the `Ready` reason changes.
    async fn write_status(
        &self,
        scale_set: Result<String, Finding>,
        listener: Option<Result<String, Finding>>,
        runner_set_status: Option<&crds::EphemeralRunnerSetStatus>,
    ) -> Result<()> {
        let previous = self.runner_set.status.clone().unwrap_or_default();
        let mut status = previous.clone();
        let fully_reconciled = scale_set.is_ok() && listener.is_some();
        if let Some(counts) = runner_set_status {
            // All four counters (ARC only copies them when the current count changes;
            // docs/reference/controllers.md, "Status and conditions").
            status.current_runners = counts.current_replicas;
            status.pending_ephemeral_runners = counts.pending_ephemeral_runners;
            status.running_ephemeral_runners = counts.running_ephemeral_runners;
            status.failed_ephemeral_runners = counts.failed_ephemeral_runners;
        }
        if fully_reconciled {
            status.phase = phase::RUNNING.to_owned();
        }
        super::schedule_status::apply(&mut status, &self.runner_set.spec, Timestamp::now());
        self.ctx
            .base
            .metrics
            .listener_session_held
            .get_or_create(&self.metric_labels())
            .set(i64::from(matches!(listener, Some(Ok(_)))));
        let observation = Observation {
            scale_set,
            listener,
            runners: Some(self.runners()),
            capacity: runner_set_status.map(|counts| {
                (
                    counts.current_replicas,
                    self.runner_set.spec.effective_max_runners(),
                )
            }),
        };
        let now = Time(Timestamp::now());
        let mut computed = conditions::compute(
            &previous.conditions,
            &observation,
            self.runner_set.metadata.generation,
            &now,
        );
        if observation.capacity.is_none() {
            // Not observed this pass: keep what was known.
            if let Some(kept) = previous
                .conditions
                .iter()
                .find(|c| c.type_ == conditions::MAX_RUNNERS_REACHED)
            {
                computed.insert(computed.len() - 1, kept.clone());
            }
        }
        status.conditions = computed;
        self.announce(&previous.conditions, &status.conditions)
            .await;
        // Unchanged conditions keep their times, so an unchanged status compares equal: no write.
        if status == previous {
            return Ok(());
        }
        self.apply_status(&status).await
    }

    /// Events for condition changes that matter to users.
    async fn announce(&self, previous: &[Condition], current: &[Condition]) {
        let before = conditions::ready(previous);
        if let Some(now) = conditions::ready(current) {
            let changed = before.is_none_or(|b| b.status != now.status || b.reason != now.reason);
            if changed {
                if now.status == "True" {
                    if before.is_some() {
                        self.event(EventType::Normal, "Ready", "Reconcile", now.message.clone())
                            .await;
                    }
                } else if !is_transient_reason(&now.reason) {
                    self.event(
                        EventType::Warning,
                        &now.reason,
                        "Reconcile",
                        now.message.clone(),
                    )
                    .await;
                }
            }
        }
        let find = |list: &[Condition]| {
            list.iter()
                .find(|c| c.type_ == conditions::MAX_RUNNERS_REACHED)
                .map(|c| c.status.clone())
        };
        if let (Some(before), Some(now)) = (find(previous), find(current))
            && before != now
            && now == "True"
        {
            self.event(
                EventType::Normal,
                "MaxRunnersReached",
                "Scale",
                format!(
                    "maxRunners ({}) reached: jobs wait for a runner to finish",
                    self.runner_set.spec.effective_max_runners()
                ),
            )
            .await;
        }
    }

    /// Deletion (docs/reference/controllers.md, "ARS deletion"), in order; each step waits until its objects are
    /// gone.
    async fn finalize(&self) -> Result<Action> {
        if !self.has_finalizer() {
            return Ok(Action::await_change());
        }
        let current = desired_listener_name(self.runner_set);
        let mut listeners = self.orphan_listeners(&current);
        listeners.push(current);
        let mut waiting = false;
        for listener in &listeners {
            waiting |= self.delete_listener(listener).await?;
        }
        if waiting {
            return Ok(Action::requeue(SHORT_WAIT));
        }
        if let Some(set) = self.get_runner_set().await? {
            if set.meta().deletion_timestamp.is_none() {
                delete_if_present(
                    &self.runner_sets,
                    &self.name,
                    &self.namespace,
                    "EphemeralRunnerSet",
                )
                .await?;
            }
            return Ok(Action::requeue(SHORT_WAIT));
        }
        self.delete_scale_set().await?;
        self.release_protected_objects().await?;
        remove_finalizers(
            &self.api,
            self.runner_set,
            &[AUTOSCALING_RUNNER_SET_FINALIZER],
            KIND,
        )
        .await?;
        self.ctx.forget(&self.key);
        // A deleted set has no session to report, and its series must not linger as 0 either.
        self.ctx
            .base
            .metrics
            .listener_session_held
            .remove(&self.metric_labels());
        Ok(Action::await_change())
    }

    async fn delete_scale_set(&self) -> Result<()> {
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

    /// Lets Helm's protected objects go, in ARC's order (docs/reference/controllers.md, "ARS deletion", step 4).
    async fn release_protected_objects(&self) -> Result<()> {
        let annotations = self.runner_set.annotations();
        let client = &self.ctx.base.client;
        let ns = self.namespace.as_str();
        for (annotation, kind) in [
            (
                CLEANUP_KUBERNETES_MODE_ROLE_BINDING_NAME_ANNOTATION,
                ObjectKind::RoleBinding,
            ),
            (
                CLEANUP_KUBERNETES_MODE_ROLE_NAME_ANNOTATION,
                ObjectKind::Role,
            ),
            (
                CLEANUP_KUBERNETES_MODE_SERVICE_ACCOUNT_NAME_ANNOTATION,
                ObjectKind::ServiceAccount,
            ),
            (
                CLEANUP_NO_PERMISSION_SERVICE_ACCOUNT_NAME_ANNOTATION,
                ObjectKind::ServiceAccount,
            ),
            (CLEANUP_GITHUB_SECRET_NAME_ANNOTATION, ObjectKind::Secret),
            (
                CLEANUP_MANAGER_ROLE_BINDING_ANNOTATION,
                ObjectKind::RoleBinding,
            ),
            (CLEANUP_MANAGER_ROLE_NAME_ANNOTATION, ObjectKind::Role),
        ] {
            let Some(name) = annotations.get(annotation).filter(|n| !n.is_empty()) else {
                continue;
            };
            match kind {
                ObjectKind::RoleBinding => {
                    release::<RoleBinding>(
                        &Api::namespaced(client.clone(), ns),
                        name,
                        ns,
                        "RoleBinding",
                    )
                    .await?
                }
                ObjectKind::Role => {
                    release::<Role>(&Api::namespaced(client.clone(), ns), name, ns, "Role").await?
                }
                ObjectKind::ServiceAccount => {
                    release::<ServiceAccount>(
                        &Api::namespaced(client.clone(), ns),
                        name,
                        ns,
                        "ServiceAccount",
                    )
                    .await?
                }
                ObjectKind::Secret => {
                    release::<Secret>(&Api::namespaced(client.clone(), ns), name, ns, "Secret")
                        .await?
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum ObjectKind {
    RoleBinding,
    Role,
    ServiceAccount,
    Secret,
}

/// Removes the cleanup-protection finalizer from an object; gone (or, for a Secret, no longer readable) counts
/// as done.
async fn release<K>(api: &Api<K>, name: &str, namespace: &str, kind: &'static str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let found = match api.get_opt(name).await {
        Ok(found) => found,
        Err(error) if kind == "Secret" && is_status(&error, 403) => None,
        Err(source) => {
            return Err(Error::ReadObjects {
                kind,
                namespace: namespace.to_owned(),
                source: Box::new(source),
            });
        }
    };
    let Some(obj) = found else {
        return Ok(());
    };
    remove_finalizers(api, &obj, &[CLEANUP_PROTECTION_FINALIZER], kind).await?;
    Ok(())
}

/// Reasons that describe progress rather than a problem: no Warning Event for them.
fn is_transient_reason(reason: &str) -> bool {
    LISTENER_PROGRESS_REASONS.contains(&reason)
        || matches!(
            reason,
            "ListenerRestarting" | "WaitingForScaleSet" | "EphemeralRunnerSetDeleting"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runner_bounds_must_be_ordered() {
        let mut spec = crds::AutoscalingRunnerSetSpec::default();
        assert!(
            check_runner_bounds(&spec).is_ok(),
            "no bounds: 0..=i32::MAX"
        );
        spec.min_runners = Some(3);
        spec.max_runners = Some(3);
        assert!(check_runner_bounds(&spec).is_ok());
        spec.min_runners = Some(5);
        spec.max_runners = Some(2);
        let reason = check_runner_bounds(&spec).unwrap_err();
        assert!(
            reason.contains("minRunners (5)") && reason.contains("maxRunners (2)"),
            "{reason}"
        );
        spec.max_runners = None;
        assert!(
            check_runner_bounds(&spec).is_ok(),
            "absent max is unbounded"
        );
    }
    #[test]
    fn progress_reasons_are_not_warnings() {
        assert!(is_transient_reason("ListenerStarting"));
        assert!(is_transient_reason("SessionLost"));
        assert!(!is_transient_reason("CredentialsInvalid"));
        assert!(!is_transient_reason("SessionConflict"));
    }
}
