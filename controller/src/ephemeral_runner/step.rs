//! One pass over a runner as both lanes' executors see it (the main lane's `reconcile`, the teardown lane's
//! `teardown`): the runner as the pass read it, its objects, its scale set's service client, the controller's memory,
//! and what both lanes do alike (status writes, Events, metric labels, deleting the runner or its children).

use std::sync::Arc;

use crds::constants::{
    EPHEMERAL_RUNNER_FINALIZER, EPHEMERAL_RUNNER_REGISTRATION_FINALIZER, SCALE_SET_NAME_LABEL,
    SCALE_SET_NAMESPACE_LABEL,
};
use crds::{EphemeralRunner, EphemeralRunnerSet};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::memory::RunnerMemory;
use super::objects::RunnerObjects;
use super::observe;
use super::pod::JitIdentity;
use super::pod_steps::Report;
use super::registrations::Registrations;
use super::status_patch::StatusPatch;
use crate::actions::{Actions, ClientSource};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::metrics::{RunnerLabels, RunnerReasonLabels};
use crate::pods::CachedPod;

/// The runner's two finalizers: its children's cleanup and its deregistration.
pub(super) const RUNNER_FINALIZERS: [&str; 2] = [
    EPHEMERAL_RUNNER_FINALIZER,
    EPHEMERAL_RUNNER_REGISTRATION_FINALIZER,
];

/// One reconcile's view of a runner.
pub(super) struct Step<'a> {
    pub(super) runner: &'a EphemeralRunner,
    pub(super) ctx: &'a Context,
    /// The runner controller's memory of its runners.
    pub(super) memory: &'a RunnerMemory,
    /// The runner's objects, through the lane's client, for every request of the pass: the teardown's must never
    /// queue behind the burst's creations in the main client's in-flight limit (a JIT Secret read there made the
    /// deregistration stage's p50 0.55 s in a 500-job burst).
    pub(super) objects: RunnerObjects,
    /// The resource version this pass's last status write left (the copy in hand predates it).
    pub(super) written_at: std::sync::Mutex<Option<String>>,
}

impl<'a> Step<'a> {
    /// A pass over `runner` whose requests go through `client` (the main lane's or the teardown lane's).
    pub(super) fn new(
        runner: &'a EphemeralRunner,
        ctx: &'a Context,
        memory: &'a RunnerMemory,
        client: kube::Client,
    ) -> Result<Self> {
        Ok(Self {
            runner,
            ctx,
            memory,
            objects: RunnerObjects::new(runner, client)?,
            written_at: std::sync::Mutex::default(),
        })
    }

    pub(super) fn status(&self) -> crds::EphemeralRunnerStatus {
        self.runner.status.clone().unwrap_or_default()
    }

    /// The runner's pod as the watch cache shows it now.
    pub(super) fn cached_pod(&self) -> Option<Arc<CachedPod>> {
        let key = ObjectRef::new(&self.objects.name).within(&self.objects.namespace);
        self.ctx.stores.pods.get(&key)
    }

    pub(super) fn corrupt(&self, reason: &str) -> Error {
        Error::CorruptJitSecret {
            namespace: self.objects.namespace.clone(),
            name: self.objects.name.clone(),
            reason: reason.to_owned(),
        }
    }

    /// The scale set this runner belongs to, for metric labels.
    pub(super) fn scale_set(&self) -> RunnerLabels {
        let labels = self.runner.labels();
        let label = |key: &str| labels.get(key).cloned();
        RunnerLabels {
            name: label(SCALE_SET_NAME_LABEL).unwrap_or_default(),
            namespace: label(SCALE_SET_NAMESPACE_LABEL)
                .unwrap_or_else(|| self.objects.namespace.clone()),
        }
    }

    pub(super) fn reason_labels(&self, reason: &'static str) -> RunnerReasonLabels {
        let RunnerLabels { name, namespace } = self.scale_set();
        RunnerReasonLabels {
            name,
            namespace,
            reason,
        }
    }

    /// Publishes a Warning Event a decision asked for.
    pub(super) async fn report(&self, report: Report) {
        self.event(
            EventType::Warning,
            report.reason,
            report.action,
            report.note,
        )
        .await;
    }

    pub(super) async fn event(&self, type_: EventType, reason: &str, action: &str, note: String) {
        let regarding = self.runner.object_ref(&());
        self.ctx
            .publish(&regarding, type_, reason, action, note)
            .await;
    }

    pub(super) async fn actions(&self) -> Result<Actions> {
        self.ctx
            .actions
            .get(&ClientSource::for_runner(self.runner))
            .await
    }

    /// The runner's registrations, through its scale set's service client.
    pub(super) async fn registrations(&self) -> Result<Registrations<'_>> {
        Ok(Registrations::new(
            self.actions().await?,
            self.memory,
            &self.objects.uid,
            &self.objects.name,
            self.runner.spec.runner_scale_set_id,
        ))
    }

    /// The runner deletes itself so its set replaces it, saying why in a Warning Event.
    pub(super) async fn leave(&self, report: Report) -> Result<Action> {
        self.report(report).await;
        self.objects.delete_self().await?;
        Ok(Action::await_change())
    }

    /// The runner's set as cached, when it is there and not being deleted.
    pub(super) fn live_set(&self) -> Option<Arc<EphemeralRunnerSet>> {
        observe::owner_set(self.runner, &self.ctx.stores)
            .filter(|set| set.meta().deletion_timestamp.is_none())
    }

    /// The uid of the runner's pod when the cache shows it terminated (`Succeeded` or `Failed`): nothing runs in
    /// it any more.
    pub(super) fn terminated_pod(&self) -> Option<String> {
        self.cached_pod()
            .filter(|pod| matches!(super::policy::pod_phase(pod), "Succeeded" | "Failed"))
            .and_then(|pod| pod.uid())
    }

    /// Deletes the pod and the JIT Secret (done runners keep only the EphemeralRunner, for the set to count),
    /// both at once.
    pub(super) async fn delete_children(&self) -> Result<()> {
        let terminated = self.terminated_pod();
        let pod = self.objects.delete_pod(terminated.as_deref());
        futures::try_join!(pod, self.objects.delete_secret())?;
        Ok(())
    }

    /// Records `identity` in `patch` when the status does not hold it yet ([`StatusPatch::record_identity`]).
    pub(super) fn record_identity(&self, identity: &JitIdentity, patch: &mut StatusPatch) {
        patch.record_identity(&self.status(), identity, || self.view_version());
    }

    /// The resource version of this pass's view: its last status write's, or the runner's as it read it.
    pub(super) fn view_version(&self) -> Option<String> {
        crate::context::lock(&self.written_at)
            .clone()
            .or_else(|| self.runner.resource_version())
    }

    /// Merge-patches the named status fields under this controller's field manager.
    pub(super) async fn patch_status(&self, patch: &StatusPatch) -> Result<()> {
        if patch.is_empty() {
            return Ok(());
        }
        let body = patch.to_patch(&self.status().failures)?;
        let mut written = self.objects.patch_status(&body).await?;
        *crate::context::lock(&self.written_at) = written.resource_version();
        // Cached the way the watch caches it.
        written.managed_fields_mut().clear();
        super::prune_cached_runner(&mut written);
        self.memory.wrote(&self.objects.uid, written);
        Ok(())
    }
}
