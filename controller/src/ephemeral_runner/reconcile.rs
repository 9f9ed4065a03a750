//! One EphemeralRunner reconcile (spec §3.4.1), as a list of idempotent steps.
//!
//! # Expected flow
//! finalizers → JIT config Secret (registers the runner) → runner id on the status → pod → follow the pod until
//! the runner exits 0 → the runner deletes itself → deletion: deregister, delete pod and Secret, drop finalizers.
//!
//! # Guarantees
//! * A runner is deregistered from the Actions Service before its finalizers go, except when its credentials
//!   Secret is gone (then nothing could deregister it; an Event says so).
//! * A JIT config goes into at most one pod: when a pod fails, its registration is removed and its Secret
//!   deleted before the next pod, which gets a fresh config.
//! * A runner holding a job is never restarted and never deregistered while the service says the job runs.
//! * Only the runner's own failures count against its retry budget; disruptions (evictions, preemption, node
//!   loss, kubelet rejections) and API rejections (quota, admission) are retried without limit, with backoff.
//!
//! # Writes
//! Status edits are merge patches of the changed fields only: the listener writes the job fields of the same
//! status, and a merge patch never touches fields it does not name, even when computed from a stale cache.

use std::sync::Arc;
use std::time::Duration;

use crds::EphemeralRunner;
use crds::constants::{
    EPHEMERAL_RUNNER_FINALIZER, EPHEMERAL_RUNNER_REGISTRATION_FINALIZER, RUNNER_CONTAINER_NAME,
    RUNNER_POD_LABEL, SCALE_SET_NAME_LABEL, SCALE_SET_NAMESPACE_LABEL, phase, reason,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

use super::pod::{JitIdentity, desired_pod, jit_secret, job_metadata, read_jit_identity};
use super::policy::{
    CreateRejection, PodFailure, PodVerdict, classify_create_error, disruption_delay,
    failure_delay, judge_pod, remaining_failure_backoff, retries_exhausted,
};
use crate::actions::{
    Actions, ClientSource, Removal, credentials_gone, is_runner_exists, read_secret,
};
use crate::context::Context;
use crate::error::{Error, Result, is_status};
use crate::kubeutil::{
    controller_ref, delete_if_present, delete_terminated_pod, name_and_namespace, set_finalizers,
};
use crate::metrics::{RunnerLabels, RunnerReasonLabels};
use crate::options::ER_JOB_METADATA_FIELD_MANAGER;

/// Kind name used in errors.
const KIND: &str = "EphemeralRunner";
/// Status reason while pod creation is refused by a quota or an admission check.
pub const POD_REJECTED_REASON: &str = "PodCreationRejected";
/// Short delay while waiting for the cache to catch up with a write of ours.
const CACHE_WAIT: Duration = Duration::from_secs(1);
/// How long a write this process made is trusted to be on its way into the cache (watch events normally take
/// milliseconds; seconds under a burst), so the next pass does not repeat it.
const STALE_CACHE_WINDOW: Duration = Duration::from_secs(5);
/// [`RunnerMemory::wrote`] keys.
const WROTE_POD: &str = "create-pod";
const WROTE_DELETE: &str = "delete-self";
const WROTE_JOB_METADATA: &str = "job-metadata";
/// [`RunnerMemory::wrote`] key of the last look at the JIT Secret of a runner whose pod has not started.
const CHECKED_JIT_SECRET: &str = "checked-jit-secret";
/// How often the JIT Secret of a runner whose pod has not started is checked.
const JIT_SECRET_RECHECK: Duration = Duration::from_secs(10);
/// How long a runner whose finalizers this process removed is left alone: its cache entry may still show them.
const STALE_FINALIZE_WINDOW: Duration = Duration::from_secs(30);

/// Reconciles one EphemeralRunner.
#[tracing::instrument(skip(runner, ctx), fields(runner = %runner.name_any(), namespace = runner.namespace().unwrap_or_default()))]
pub async fn reconcile(runner: Arc<EphemeralRunner>, ctx: Arc<Context>) -> Result<Action> {
    let step = Step::new(&runner, &ctx)?;
    // A runner this process finalized, or asked to delete, a moment ago can still be in the cache without its
    // deletion. Acting on that copy would register a new runner and create a pod (and Secret) for an object
    // that is gone: under load such orphan pods took jobs with no EphemeralRunner to account for them. If the
    // object somehow still holds the finalizers after the window, the pass runs again.
    if ctx
        .runner_memory
        .was_finalized(&step.uid, STALE_FINALIZE_WINDOW)
    {
        return Ok(Action::requeue(STALE_FINALIZE_WINDOW));
    }
    if runner.meta().deletion_timestamp.is_some() {
        return step.finalize().await;
    }
    if ctx
        .runner_memory
        .wrote_within(&step.uid, WROTE_DELETE, STALE_CACHE_WINDOW)
    {
        return Ok(Action::requeue(CACHE_WAIT));
    }
    if runner.is_done() {
        step.delete_children().await?;
        return Ok(Action::await_change());
    }
    step.ensure_finalizers().await?;
    if retries_exhausted(step.failures(), ctx.options.runner.max_pod_failures) {
        return step.give_up().await;
    }
    let cached = ctx
        .stores
        .pods
        .get(&ObjectRef::new(&step.name).within(&step.namespace));
    // Once its pod has started, the runner has consumed the Secret and the identity the status recorded is the
    // Secret's (both change only together, the Secret first): no need to read the Secret again. A pod not
    // started yet still has it checked, so a corrupt one is replaced before the runner chokes on it, but at
    // most every few seconds: reading it on every pass of every pending pod was most of the manager's API reads
    // in a burst.
    let trust_recorded = cached.as_ref().is_some_and(|pod| {
        matches!(
            super::policy::pod_phase(pod),
            "Running" | "Succeeded" | "Failed"
        ) || ctx
            .runner_memory
            .wrote_within(&step.uid, CHECKED_JIT_SECRET, JIT_SECRET_RECHECK)
    });
    let recorded = trust_recorded.then(|| step.recorded_identity()).flatten();
    let identity = match recorded {
        Some(identity) => identity,
        None => match step.ensure_jit_secret().await? {
            Jit::Ready(identity) => {
                ctx.runner_memory.wrote(&step.uid, CHECKED_JIT_SECRET);
                identity
            }
            Jit::Wait(action) => return Ok(action),
        },
    };
    if let Some(wait) = step.pod_backoff() {
        step.record_identity(&identity).await?;
        return Ok(Action::requeue(wait));
    }
    match cached {
        // Created a moment ago; its watch event (which brings us back) has not reached the cache yet.
        None if ctx
            .runner_memory
            .wrote_within(&step.uid, WROTE_POD, STALE_CACHE_WINDOW) =>
        {
            Ok(Action::requeue(CACHE_WAIT))
        }
        // The identity goes into the status together with the new pod's phase, one write instead of two.
        None => step.create_pod(&identity).await,
        Some(pod) => {
            step.record_identity(&identity).await?;
            step.handle_pod(&pod, &identity).await
        }
    }
}

/// Outcome of the JIT step.
enum Jit {
    Ready(JitIdentity),
    Wait(Action),
}

/// One reconcile's view of a runner.
struct Step<'a> {
    runner: &'a EphemeralRunner,
    ctx: &'a Context,
    name: String,
    namespace: String,
    uid: String,
    api: Api<EphemeralRunner>,
    pods: Api<Pod>,
    secrets: Api<Secret>,
}

impl<'a> Step<'a> {
    fn new(runner: &'a EphemeralRunner, ctx: &'a Context) -> Result<Self> {
        let (name, namespace) = name_and_namespace(runner, KIND)?;
        let client = ctx.client.clone();
        Ok(Self {
            runner,
            ctx,
            uid: runner.uid().unwrap_or_default(),
            api: Api::namespaced(client.clone(), &namespace),
            pods: Api::namespaced(client.clone(), &namespace),
            secrets: Api::namespaced(client, &namespace),
            name,
            namespace,
        })
    }

    fn status(&self) -> crds::EphemeralRunnerStatus {
        self.runner.status.clone().unwrap_or_default()
    }

    fn failures(&self) -> usize {
        self.runner
            .status
            .as_ref()
            .map_or(0, |status| status.failures.len())
    }

    /// The scale set this runner belongs to, for metric labels.
    fn scale_set(&self) -> RunnerLabels {
        let labels = self.runner.labels();
        RunnerLabels {
            name: labels
                .get(SCALE_SET_NAME_LABEL)
                .cloned()
                .unwrap_or_default(),
            namespace: labels
                .get(SCALE_SET_NAMESPACE_LABEL)
                .cloned()
                .unwrap_or_else(|| self.namespace.clone()),
        }
    }

    fn reason_labels(&self, reason: &'static str) -> RunnerReasonLabels {
        let RunnerLabels { name, namespace } = self.scale_set();
        RunnerReasonLabels {
            name,
            namespace,
            reason,
        }
    }

    async fn event(&self, type_: EventType, reason: &str, action: &str, note: String) {
        let regarding = self.runner.object_ref(&());
        self.ctx
            .publish(&regarding, type_, reason, action, note)
            .await;
    }

    async fn actions(&self) -> Result<Actions> {
        self.ctx
            .actions
            .get(&ClientSource::for_runner(self.runner))
            .await
    }

    /// Merge-patches the named status fields (`null` removes one).
    async fn patch_status(&self, status: Value) -> Result<()> {
        self.api
            .patch_status(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .map(drop)
            .map_err(|source| Error::PatchObject {
                kind: KIND,
                what: "status",
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            })
    }

    /// Asks for this runner's deletion. A pass never runs while an earlier one's request may not be in the cache
    /// yet (see [`reconcile`]), so it is asked once.
    async fn delete_self(&self) -> Result<()> {
        delete_if_present(&self.api, &self.name, &self.namespace, KIND).await?;
        self.ctx.runner_memory.wrote(&self.uid, WROTE_DELETE);
        Ok(())
    }

    /// Adds whichever of the two finalizers is missing (both in one patch, unlike ARC).
    async fn ensure_finalizers(&self) -> Result<()> {
        let current = self.runner.finalizers();
        let missing: Vec<&str> = [
            EPHEMERAL_RUNNER_FINALIZER,
            EPHEMERAL_RUNNER_REGISTRATION_FINALIZER,
        ]
        .into_iter()
        .filter(|finalizer| !current.iter().any(|have| have == finalizer))
        .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let mut wanted = current.to_vec();
        wanted.extend(missing.into_iter().map(str::to_owned));
        set_finalizers(&self.api, self.runner, wanted, KIND).await
    }

    /// Makes sure the runner is registered and its JIT config stored (§3.4.2, §3.4.3).
    async fn ensure_jit_secret(&self) -> Result<Jit> {
        if let Some(secret) = read_secret(&self.ctx.client, &self.namespace, &self.name).await? {
            return match read_jit_identity(&secret) {
                Ok(identity) => Ok(Jit::Ready(identity)),
                Err(reason) => {
                    // Regenerated on the next pass (§6 item 9).
                    delete_if_present(&self.secrets, &self.name, &self.namespace, "Secret").await?;
                    Err(Error::CorruptJitSecret {
                        namespace: self.namespace.clone(),
                        name: self.name.clone(),
                        reason,
                    })
                }
            };
        }
        let actions = self.actions().await?;
        let work_folder = self
            .runner
            .spec
            .spec
            .containers
            .iter()
            .find(|container| container.name == RUNNER_CONTAINER_NAME)
            .and_then(|container| container.working_dir.clone())
            .unwrap_or_default();
        let jit = match actions
            .generate_jit_config(
                self.runner.spec.runner_scale_set_id,
                &self.name,
                &work_folder,
            )
            .await
        {
            Ok(jit) => jit,
            Err(error) if is_runner_exists(&error) => {
                return self.resolve_name_clash(&actions).await;
            }
            Err(error) => return Err(error),
        };
        let owner = controller_ref(self.runner, KIND)?;
        let secret = jit_secret(
            self.runner,
            owner,
            &jit,
            &self.ctx.options.exclude_label_propagation_prefixes,
        );
        match self.secrets.create(&PostParams::default(), &secret).await {
            Ok(created) => read_jit_identity(&created)
                .map(Jit::Ready)
                .map_err(|reason| Error::CorruptJitSecret {
                    namespace: self.namespace.clone(),
                    name: self.name.clone(),
                    reason,
                }),
            // Another pass created it meanwhile; the registration just made is then a duplicate name, which the
            // next generation attempt resolves. Re-read instead.
            Err(error) if is_status(&error, 409) => Ok(Jit::Wait(Action::requeue(CACHE_WAIT))),
            Err(source) => Err(Error::CreateObject {
                kind: "Secret",
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            }),
        }
    }

    /// The service already has a runner with this name (a crash between registering and storing the config).
    async fn resolve_name_clash(&self, actions: &Actions) -> Result<Jit> {
        let Some(existing) = actions.get_runner_by_name(&self.name).await? else {
            return Ok(Jit::Wait(Action::requeue(CACHE_WAIT)));
        };
        if existing.runner_scale_set_id == self.runner.spec.runner_scale_set_id {
            tracing::info!(
                runner_id = existing.id,
                "removing a registration left by an earlier attempt"
            );
            return match actions.remove_runner(existing.id).await? {
                Removal::Removed => Ok(Jit::Wait(Action::requeue(Duration::ZERO))),
                Removal::JobStillRunning => Ok(Jit::Wait(Action::requeue(
                    self.ctx.options.runner.job_still_running_requeue,
                ))),
            };
        }
        self.event(
            EventType::Warning,
            "RunnerNameTaken",
            "GenerateJitConfig",
            format!(
                "a runner named {} already exists in scale set {}; deleting this runner so a new one is created",
                self.name, existing.runner_scale_set_id
            ),
        )
        .await;
        self.delete_self().await?;
        Ok(Jit::Wait(Action::await_change()))
    }

    /// The identity recorded in the status, once there is one.
    fn recorded_identity(&self) -> Option<JitIdentity> {
        let status = self.status();
        (status.runner_id != 0 && !status.runner_name.is_empty()).then_some(JitIdentity {
            runner_id: status.runner_id,
            runner_name: status.runner_name,
        })
    }

    async fn record_identity(&self, identity: &JitIdentity) -> Result<()> {
        let mut patch = serde_json::Map::new();
        self.identity_fields(identity, &mut patch);
        if patch.is_empty() {
            return Ok(());
        }
        self.patch_status(Value::Object(patch)).await
    }

    /// The status fields that record `identity`, when the status does not hold it yet.
    fn identity_fields(&self, identity: &JitIdentity, patch: &mut serde_json::Map<String, Value>) {
        let status = self.status();
        if status.runner_id != identity.runner_id || status.runner_name != identity.runner_name {
            patch.insert("runnerId".to_owned(), identity.runner_id.into());
            patch.insert("runnerName".to_owned(), identity.runner_name.clone().into());
        }
    }

    /// How long to wait before creating the next pod, after counted failures or disruptions.
    fn pod_backoff(&self) -> Option<Duration> {
        let policy = &self.ctx.options.runner;
        let status = self.status();
        let after_failures = remaining_failure_backoff(
            &status.failures,
            policy.failure_backoff_base,
            Timestamp::now(),
        );
        let after_disruptions = self
            .ctx
            .runner_memory
            .last_disruption(&self.uid)
            .and_then(|(count, at)| {
                disruption_delay(count, policy.disruption_backoff_max).checked_sub(at.elapsed())
            })
            .filter(|left| !left.is_zero());
        after_failures.max(after_disruptions)
    }

    /// Too many counted failures: report and delete; the set creates a replacement (§3.4.6, item 6).
    async fn give_up(&self) -> Result<Action> {
        self.ctx
            .metrics
            .retries_exhausted
            .get_or_create(&self.scale_set())
            .inc();
        self.event(
            EventType::Warning,
            "RetriesExhausted",
            "DeleteRunner",
            format!(
                "the runner pod failed {} times; deleting the runner so the set replaces it",
                self.failures()
            ),
        )
        .await;
        self.delete_self().await?;
        Ok(Action::await_change())
    }

    async fn create_pod(&self, identity: &JitIdentity) -> Result<Action> {
        let owner = controller_ref(self.runner, KIND)?;
        let pod = match desired_pod(self.runner, owner, &self.ctx.options.build_version) {
            Ok(pod) => pod,
            Err(problem) => {
                return self
                    .mark_failed(
                        reason::INVALID_POD,
                        format!("Failed to create the pod: {problem}"),
                        identity,
                    )
                    .await;
            }
        };
        match self.pods.create(&PostParams::default(), &pod).await {
            Ok(created) => {
                self.ctx.runner_memory.wrote(&self.uid, WROTE_POD);
                // One status write: the identity (the deregistration falls back to the Secret until it is
                // there) and the new pod's phase, which the next pass would otherwise write on its own; a
                // quota or admission message from earlier attempts is cleared with it.
                let mut patch = serde_json::Map::new();
                self.identity_fields(identity, &mut patch);
                let status = self.status();
                // The API server sets every new pod Pending.
                let pod_phase = match super::policy::pod_phase(&created) {
                    "" => phase::PENDING,
                    other => other,
                };
                if status.phase != pod_phase || status.ready || !status.reason.is_empty() {
                    patch.insert("phase".to_owned(), pod_phase.into());
                    patch.insert("ready".to_owned(), false.into());
                    patch.insert("reason".to_owned(), Value::Null);
                    patch.insert("message".to_owned(), Value::Null);
                }
                if !patch.is_empty() {
                    self.patch_status(Value::Object(patch)).await?;
                }
                Ok(Action::requeue(self.ctx.options.resync_interval))
            }
            Err(error) => match classify_create_error(&error) {
                CreateRejection::AlreadyExists => match self.pods.get_opt(&self.name).await {
                    Ok(Some(pod)) => {
                        self.record_identity(identity).await?;
                        self.handle_pod(&pod, identity).await
                    }
                    _ => Ok(Action::requeue(CACHE_WAIT)),
                },
                CreateRejection::Invalid(message) => {
                    self.count_rejection("invalid");
                    self.mark_failed(
                        reason::INVALID_POD,
                        format!("Failed to create the pod: {message}"),
                        identity,
                    )
                    .await
                }
                CreateRejection::Quota(message) => {
                    self.pod_rejected("quota", message, identity).await
                }
                CreateRejection::Forbidden(message) => {
                    self.pod_rejected("forbidden", message, identity).await
                }
                CreateRejection::Other => Err(Error::CreateObject {
                    kind: "Pod",
                    namespace: self.namespace.clone(),
                    name: self.name.clone(),
                    source: Box::new(error),
                }),
            },
        }
    }

    fn count_rejection(&self, reason: &'static str) {
        self.ctx
            .metrics
            .pod_rejections
            .get_or_create(&self.reason_labels(reason))
            .inc();
    }

    /// A quota or admission check refused the pod: not the runner's fault, so not counted; retried until the
    /// cluster admits it (ARC deleted the runner after 10 minutes of quota, which lost its place).
    /// The identity is recorded with the reason: a registered runner without a pod may still be scaled down.
    async fn pod_rejected(
        &self,
        class: &'static str,
        message: String,
        identity: &JitIdentity,
    ) -> Result<Action> {
        self.count_rejection(class);
        let status = self.status();
        let message = format!("Failed to create the pod: {message}");
        let mut patch = serde_json::Map::new();
        self.identity_fields(identity, &mut patch);
        if status.reason != POD_REJECTED_REASON || status.message != message {
            self.event(
                EventType::Warning,
                POD_REJECTED_REASON,
                "CreatePod",
                message.clone(),
            )
            .await;
            patch.insert("reason".to_owned(), POD_REJECTED_REASON.into());
            patch.insert("message".to_owned(), message.into());
        }
        if !patch.is_empty() {
            self.patch_status(Value::Object(patch)).await?;
        }
        Ok(Action::requeue(self.ctx.options.runner.pod_rejection_retry))
    }

    /// Marks the runner Failed (§3.4.7) and deregisters it; it keeps its place in the set for inspection.
    async fn mark_failed(
        &self,
        reason: &str,
        message: String,
        identity: &JitIdentity,
    ) -> Result<Action> {
        self.event(EventType::Warning, reason, "CreatePod", message.clone())
            .await;
        let mut patch = serde_json::Map::new();
        self.identity_fields(identity, &mut patch);
        patch.insert("phase".to_owned(), phase::FAILED.into());
        patch.insert("reason".to_owned(), reason.into());
        patch.insert("message".to_owned(), message.into());
        self.patch_status(Value::Object(patch)).await?;
        self.actions()
            .await?
            .remove_runner(identity.runner_id)
            .await?;
        Ok(Action::await_change())
    }

    async fn mark_outdated(&self, identity: &JitIdentity) -> Result<Action> {
        self.event(
            EventType::Warning,
            reason::OUTDATED,
            "UpdateStatus",
            "the runner version is deprecated; update the runner image".to_owned(),
        )
        .await;
        self.patch_status(json!({
            "phase": phase::OUTDATED,
            "reason": reason::OUTDATED,
            "message": "Runner is deprecated",
        }))
        .await?;
        self.actions()
            .await?
            .remove_runner(identity.runner_id)
            .await?;
        Ok(Action::await_change())
    }

    async fn handle_pod(&self, pod: &Pod, identity: &JitIdentity) -> Result<Action> {
        if pod.meta().deletion_timestamp.is_some() {
            // Its deletion event brings us back.
            return Ok(Action::requeue(self.ctx.options.resync_interval));
        }
        let pod_uid = pod.uid().unwrap_or_default();
        let status = self.status();
        if status.failures.contains_key(&pod_uid) {
            // Already handled (the cache has not seen the delete yet).
            delete_if_present(&self.pods, &self.name, &self.namespace, "Pod").await?;
            return Ok(Action::requeue(CACHE_WAIT));
        }
        if let Some(metadata) = job_metadata(&status)
            && !metadata.is_on(pod)
            && !self.ctx.runner_memory.wrote_within(
                &pod_uid,
                WROTE_JOB_METADATA,
                STALE_CACHE_WINDOW,
            )
        {
            self.apply_job_metadata(&metadata, &pod_uid).await?;
            self.ctx.runner_memory.wrote(&pod_uid, WROTE_JOB_METADATA);
        }
        match judge_pod(pod) {
            PodVerdict::Wait => Ok(Action::requeue(self.ctx.options.resync_interval)),
            PodVerdict::Progress {
                phase,
                ready,
                reason,
                message,
            } => self.follow(&phase, ready, reason, message, identity).await,
            PodVerdict::Succeeded => {
                self.delete_self().await?;
                // Finalize now rather than on the deletion's watch event: under load that event waits its turn
                // in the queue behind every other runner, and the finished runner holds its place meanwhile.
                self.finalize().await
            }
            PodVerdict::Outdated => self.mark_outdated(identity).await,
            PodVerdict::Failed(failure) => self.pod_failed(pod, failure, identity).await,
        }
    }

    /// Applies the job's labels and annotations to pod `uid`. The uid in the body makes the apply fail instead of
    /// creating a pod when that one is already gone (an apply creates what does not exist): a pass working from
    /// a cache a moment behind must not bring a finished runner's pod back.
    async fn apply_job_metadata(
        &self,
        metadata: &super::pod::JobMetadata,
        uid: &str,
    ) -> Result<()> {
        let patch = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "uid": uid,
                "labels": metadata.labels,
                "annotations": metadata.annotations,
            },
        });
        match self
            .pods
            .patch(
                &self.name,
                &PatchParams::apply(ER_JOB_METADATA_FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            // Gone (404), or the name now belongs to another pod (409): its own pass labels that one.
            Err(error) if is_status(&error, 404) || is_status(&error, 409) => Ok(()),
            Err(source) => Err(Error::PatchObject {
                kind: "Pod",
                what: "job metadata",
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            }),
        }
    }

    /// The runner is starting or running: mirror the pod, and now and then make sure the service still knows
    /// the runner (a zombie is replaced, beyond-ARC item 7).
    async fn follow(
        &self,
        pod_phase: &str,
        ready: bool,
        reason: String,
        message: String,
        identity: &JitIdentity,
    ) -> Result<Action> {
        let status = self.status();
        if status.phase != pod_phase || status.ready != ready {
            let or_null = |text: String| {
                if text.is_empty() {
                    Value::Null
                } else {
                    Value::String(text)
                }
            };
            self.patch_status(json!({
                "phase": pod_phase,
                "ready": ready,
                "reason": or_null(reason),
                "message": or_null(message),
            }))
            .await?;
        }
        let interval = self.ctx.options.runner.registration_check_interval;
        let idle_and_running = pod_phase == phase::RUNNING && ready && !status.has_job();
        if idle_and_running
            && self
                .ctx
                .runner_memory
                .registration_check_due(&self.uid, interval)
        {
            match self.actions().await?.get_runner(identity.runner_id).await {
                Ok(Some(_)) => {}
                Ok(None) => return self.replace_zombie(identity).await,
                Err(error) => tracing::warn!(%error, "checking the runner registration failed"),
            }
        }
        let next = if idle_and_running && !interval.is_zero() {
            interval.min(self.ctx.options.resync_interval)
        } else {
            self.ctx.options.resync_interval
        };
        Ok(Action::requeue(next))
    }

    async fn replace_zombie(&self, identity: &JitIdentity) -> Result<Action> {
        self.ctx
            .metrics
            .zombie_runners
            .get_or_create(&self.scale_set())
            .inc();
        self.event(
            EventType::Warning,
            "ZombieRunner",
            "DeleteRunner",
            format!(
                "the Actions Service no longer knows runner {} while its pod runs; deleting the runner so the set \
                 replaces it",
                identity.runner_id
            ),
        )
        .await;
        self.delete_self().await?;
        Ok(Action::await_change())
    }

    /// The pod failed (§3.4.6): a runner with a job is deleted; otherwise the JIT config is discarded (the runner
    /// may have consumed it), the failure recorded (counted or not) and the pod deleted, to be recreated after
    /// the backoff.
    async fn pod_failed(
        &self,
        pod: &Pod,
        failure: PodFailure,
        identity: &JitIdentity,
    ) -> Result<Action> {
        if self.runner.has_job() {
            self.event(
                EventType::Warning,
                "RunnerFailedWithJob",
                "DeleteRunner",
                format!(
                    "the runner pod failed while running a job: {}",
                    failure.message
                ),
            )
            .await;
            self.delete_self().await?;
            return Ok(Action::await_change());
        }
        if self
            .actions()
            .await?
            .remove_runner(identity.runner_id)
            .await?
            == Removal::JobStillRunning
        {
            // The service gave it a job the listener has not reported yet: never restart such a runner.
            self.delete_self().await?;
            return Ok(Action::await_change());
        }
        delete_if_present(&self.secrets, &self.name, &self.namespace, "Secret").await?;
        let pod_uid = pod.uid().unwrap_or_default();
        let mut status = json!({
            "ready": false,
            "reason": failure.reason,
            "message": failure.message,
            "runnerId": null,
            "runnerName": null,
        });
        let delay = if failure.counted {
            let now = serde_json::to_value(Time(Timestamp::now())).map_err(|source| {
                Error::Serialize {
                    what: "failure time",
                    source,
                }
            })?;
            let mut failures = serde_json::Map::new();
            failures.insert(pod_uid, now);
            status["failures"] = Value::Object(failures);
            self.ctx
                .metrics
                .pod_failures
                .get_or_create(&self.reason_labels(failure.class))
                .inc();
            failure_delay(
                self.failures() + 1,
                self.ctx.options.runner.failure_backoff_base,
            )
        } else {
            let count = self.ctx.runner_memory.disrupted(&self.uid);
            self.ctx
                .metrics
                .pod_disruptions
                .get_or_create(&self.reason_labels(failure.class))
                .inc();
            disruption_delay(count, self.ctx.options.runner.disruption_backoff_max)
        };
        self.patch_status(status).await?;
        let (reason, what) = if failure.counted {
            ("RunnerPodFailed", "counted as a failure")
        } else {
            ("RunnerPodDisrupted", "not counted as a failure")
        };
        self.event(
            EventType::Warning,
            reason,
            "RecreatePod",
            format!(
                "{}: {} ({what}); a new pod follows",
                failure.reason, failure.message
            ),
        )
        .await;
        delete_if_present(&self.pods, &self.name, &self.namespace, "Pod").await?;
        Ok(Action::requeue(delay.max(CACHE_WAIT)))
    }

    /// Deletes the pod and the JIT Secret (done runners keep only the EphemeralRunner, for the set to count),
    /// both at once.
    async fn delete_children(&self) -> Result<()> {
        let terminated = self
            .ctx
            .stores
            .pods
            .get(&ObjectRef::new(&self.name).within(&self.namespace))
            .filter(|pod| matches!(super::policy::pod_phase(pod), "Succeeded" | "Failed"))
            .and_then(|pod| pod.uid());
        let pod = async {
            match &terminated {
                Some(uid) => {
                    delete_terminated_pod(&self.pods, &self.name, &self.namespace, uid).await
                }
                None => delete_if_present(&self.pods, &self.name, &self.namespace, "Pod").await,
            }
        };
        let secret = delete_if_present(&self.secrets, &self.name, &self.namespace, "Secret");
        futures::try_join!(pod, secret)?;
        Ok(())
    }

    /// Deletion (§3.4.8): deregister, delete children, then drop both finalizers.
    async fn finalize(&self) -> Result<Action> {
        let finalizers = self.runner.finalizers();
        if !finalizers.iter().any(|f| f == EPHEMERAL_RUNNER_FINALIZER) {
            return Ok(Action::await_change());
        }
        if finalizers
            .iter()
            .any(|f| f == EPHEMERAL_RUNNER_REGISTRATION_FINALIZER)
            && self.deregister().await? == Removal::JobStillRunning
        {
            tracing::info!("the runner is still running a job; deregistration retried later");
            return Ok(Action::requeue(
                self.ctx.options.runner.job_still_running_requeue,
            ));
        }
        self.delete_children().await?;
        if self.runner.has_container_hooks() {
            self.delete_hook_objects().await?;
        }
        let wanted: Vec<String> = finalizers
            .iter()
            .filter(|f| {
                *f != EPHEMERAL_RUNNER_FINALIZER && *f != EPHEMERAL_RUNNER_REGISTRATION_FINALIZER
            })
            .cloned()
            .collect();
        set_finalizers(&self.api, self.runner, wanted, KIND).await?;
        self.ctx.runner_memory.forget(&self.uid);
        self.ctx.runner_memory.finalized(&self.uid);
        Ok(Action::await_change())
    }

    /// Removes the runner's registration. The id comes from the status, else from the JIT Secret, else from a
    /// lookup by name (a crash between registering and recording).
    async fn deregister(&self) -> Result<Removal> {
        let mut runner_id = self.status().runner_id;
        if runner_id != 0
            && self
                .ctx
                .runner_memory
                .was_deregistered(&self.uid, runner_id)
        {
            return Ok(Removal::Removed);
        }
        if runner_id == 0
            && let Some(secret) = read_secret(&self.ctx.client, &self.namespace, &self.name).await?
        {
            runner_id = read_jit_identity(&secret).map_or(0, |identity| identity.runner_id);
        }
        let actions = match self.actions().await {
            Ok(actions) => actions,
            // Nothing can deregister without credentials; a runner that never registered needs nothing. Holding
            // the finalizer would only block the deletion of everything above (beyond-ARC item 13).
            Err(error)
                if credentials_gone(&error)
                    || (runner_id == 0 && error.is_configuration_problem()) =>
            {
                self.event(
                    EventType::Warning,
                    "DeregistrationSkipped",
                    "RemoveRunner",
                    format!("runner {runner_id} cannot be removed from GitHub: {error}"),
                )
                .await;
                return Ok(Removal::Removed);
            }
            Err(error) => return Err(error),
        };
        if runner_id == 0
            && let Some(found) = actions.get_runner_by_name(&self.name).await?
            && found.runner_scale_set_id == self.runner.spec.runner_scale_set_id
        {
            runner_id = found.id;
        }
        if runner_id == 0 {
            return Ok(Removal::Removed);
        }
        let removal = actions.remove_runner(runner_id).await?;
        if removal == Removal::Removed {
            self.ctx.runner_memory.deregistered(&self.uid, runner_id);
        }
        Ok(removal)
    }

    /// Pods and Secrets the runner's container hooks created (label `runner-pod=<runner name>`).
    async fn delete_hook_objects(&self) -> Result<()> {
        let selector = ListParams::default().labels(&format!("{RUNNER_POD_LABEL}={}", self.name));
        let read_error = |kind: &'static str| {
            let namespace = self.namespace.clone();
            move |source| Error::ReadObjects {
                kind,
                namespace,
                source: Box::new(source),
            }
        };
        let pods = self.pods.list(&selector).await.map_err(read_error("Pod"))?;
        for pod in pods
            .items
            .iter()
            .filter(|pod| pod.meta().deletion_timestamp.is_none())
        {
            delete_if_present(&self.pods, &pod.name_any(), &self.namespace, "Pod").await?;
        }
        let secrets = self
            .secrets
            .list(&selector)
            .await
            .map_err(read_error("Secret"))?;
        for secret in secrets
            .items
            .iter()
            .filter(|secret| secret.meta().deletion_timestamp.is_none())
        {
            delete_if_present(&self.secrets, &secret.name_any(), &self.namespace, "Secret").await?;
        }
        Ok(())
    }
}
