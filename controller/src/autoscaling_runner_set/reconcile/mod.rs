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
//!
//! # Layout
//! This module holds the entry ([`reconcile`]), the gates before the scale set (version, finalizer, integrity
//! hash, runner bounds) and `Step`'s core (API handles, Events, patches); each step lives in a submodule of its
//! own: [`scale_set`], [`children`] (the EphemeralRunnerSet, also paused while the set is `Outdated`),
//! [`listener`], [`status`] and [`cleanup`] (deletion).

mod budget;
mod children;
mod cleanup;
mod listener;
mod scale_set;
mod status;
mod takeover;

use std::sync::Arc;
use std::time::Duration;

use crds::constants::{
    AUTOSCALING_RUNNER_SET_FINALIZER, INTEGRITY_HASH_ANNOTATION, VERSION_LABEL, phase,
};
use crds::version::{ARC_COMPATIBLE_VERSIONS, is_version_accepted};
use crds::{AutoscalingListener, AutoscalingRunnerSet, EphemeralRunnerSet};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::RunnerSetContext;
use super::conditions::{self, Finding};
use super::desired::runner_set_hash;
use crate::error::{Error, Result};
use crate::kubeutil::{add_finalizers, name_and_namespace, still_finalizing};
use crate::metrics::RunnerLabels;

/// Come back soon: waiting for a child to go away or appear.
const SHORT_WAIT: Duration = Duration::from_secs(1);
/// Condition reason and Event reason for a set whose version label this controller does not take care of.
pub const VERSION_NOT_ACCEPTED: &str = "VersionNotAccepted";

/// Reconciles one AutoscalingRunnerSet.
#[tracing::instrument(skip(runner_set, ctx), fields(runner_set = %runner_set.name_any(), namespace = runner_set.namespace().unwrap_or_default()))]
pub async fn reconcile(
    runner_set: Arc<AutoscalingRunnerSet>,
    ctx: Arc<RunnerSetContext>,
) -> Result<Action> {
    let step = Step::new(&runner_set, &ctx)?;
    if runner_set.meta().deletion_timestamp.is_some() {
        // The deletion works on the set as it is now, never on a cached one its last pass already finalized.
        let fresh =
            still_finalizing(&step.api, &*runner_set, &[AUTOSCALING_RUNNER_SET_FINALIZER]).await?;
        return match fresh {
            Some(fresh) => Step::new(&fresh, &ctx)?.finalize().await,
            None => Ok(Action::await_change()),
        };
    }
    let version = runner_set
        .labels()
        .get(VERSION_LABEL)
        .map_or("", String::as_str);
    if !is_version_accepted(version, &ctx.base.options.build_version) {
        return step.reject_version(version).await;
    }
    if add_finalizers(&step.api, &runner_set, &[AUTOSCALING_RUNNER_SET_FINALIZER]).await? {
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
        Ok(Converged {
            action,
            listener,
            runner_set_status,
        }) => {
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

/// Outcome of the children step (EphemeralRunnerSet, then listener).
struct Converged {
    /// When to look at the set again.
    action: Action,
    /// What the listener does, for the `ListenerReady` condition.
    listener: Result<String, Finding>,
    /// The EphemeralRunnerSet's status (its counters), when it has one.
    runner_set_status: Option<crds::EphemeralRunnerSetStatus>,
}

impl Converged {
    /// Come back soon: a child is still on its way; `listener` says what the listener waits for.
    fn soon(listener: Finding, runner_set_status: Option<crds::EphemeralRunnerSetStatus>) -> Self {
        Self {
            action: Action::requeue(SHORT_WAIT),
            listener: Err(listener),
            runner_set_status,
        }
    }
}

/// One pass over one set: what every step needs.
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
        let (name, namespace) = name_and_namespace(runner_set)?;
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

    async fn event(&self, type_: EventType, reason: &str, action: &str, note: String) {
        self.ctx
            .base
            .publish(&self.reference(), type_, reason, action, note)
            .await;
    }

    fn patch_error(&self, what: &'static str) -> impl FnOnce(kube::Error) -> Error + '_ {
        move |source| Error::PatchObject {
            kind: AutoscalingRunnerSet::kind(&()),
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

    /// A set labelled for a version this controller does not take care of is left as it is, with a condition and
    /// an Event that say why (docs/reference/controllers.md, "The version gate"). ARC deletes such a set, which
    /// uninstalls the scale set (its runners and its registration on GitHub): a chart one minor ahead of the
    /// controller, or a controller upgraded one minor too far, must never cost a user their scale sets.
    async fn reject_version(&self, version: &str) -> Result<Action> {
        let build = &self.ctx.base.options.build_version;
        let arc_lines = ARC_COMPATIBLE_VERSIONS.join(", ");
        let message = format!(
            "label app.kubernetes.io/version {version:?} is not compatible with controller version {build:?} (its \
             own minor or the one before, or ARC {arc_lines}): nothing of this scale set is changed \
             or deleted; install a scale-set chart of the controller's version, or a controller of the set's"
        );
        let already = self.runner_set.status.as_ref().is_some_and(|status| {
            status.conditions.iter().any(|condition| {
                condition.reason == VERSION_NOT_ACCEPTED && condition.message == message
            })
        });
        if !already {
            tracing::warn!(
                version,
                build,
                "incompatible app.kubernetes.io/version; left alone"
            );
            self.event(
                EventType::Warning,
                VERSION_NOT_ACCEPTED,
                "Reconcile",
                message.clone(),
            )
            .await;
            self.write_status(Err(Finding::new(VERSION_NOT_ACCEPTED, message)), None, None)
                .await?;
        }
        // A change of its labels brings the set back.
        Ok(Action::await_change())
    }

    /// A changed spec or label set makes the phase `Pending` until the next full pass
    /// (docs/reference/controllers.md, "ARS reconcile", step 4).
    ///
    /// The status goes first, the hash second: the watch brings one object's versions in order, so any copy that
    /// shows the hash also shows the phase this write left. The other order let the next pass (started by the
    /// hash's event) see the new hash beside the old phase, and a phase `Outdated` from ARC 0.14 then parked the
    /// set for good, as the phase's own event is a status change this controller does not wake for (the CI run
    /// of `a_set_arc_0_14_parked_as_outdated_is_served_again_with_a_new_scale_set` under load).
    async fn stamp_hash(&self, hash: &str) -> Result<()> {
        let mut status = self.runner_set.status.clone().unwrap_or_default();
        status.phase = phase::PENDING.to_owned();
        self.apply_status(&status).await?;
        self.merge_patch(
            "integrity hash",
            json!({"metadata": {"annotations": {INTEGRITY_HASH_ANNOTATION: hash}}}),
        )
        .await
    }
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
}
