//! One EphemeralRunner reconcile: the executor of [`super::lifecycle::decide`] (docs/runner-lifecycle.md).
//!
//! # Expected flow
//! finalizers → runner re-read from the API server → registration and JIT config Secret → pod (same pass) →
//! follow the pod until the runner exits 0 → the runner deletes itself → deletion: deregister, delete pod and
//! Secret, drop finalizers.
//!
//! # Guarantees
//! * A runner is deregistered from the Actions Service before its finalizers go, except when its credentials
//!   Secret is gone (then nothing could deregister it; an Event says so).
//! * A JIT config goes into at most one pod: a Secret is made in the pass that makes the pod, and a Secret whose
//!   pod the API server says is gone is discarded with its registration before anything new is made.
//! * A runner holding a job is never restarted and never deregistered while the service says the job runs; one
//!   whose pod is deleted or evicted is finished, the job left to the service.
//! * Only the runner's own failures count against its retry budget; disruptions (evictions, preemption, node
//!   loss, pods deleted through the API, kubelet rejections) and API rejections (quota, admission) are retried
//!   without limit, with backoff.
//!
//! # Writes
//! Status edits are typed merge patches of the changed fields only, under this controller's field manager: the
//! listener writes the job fields of the same status, and a merge patch never touches fields it does not name.

mod creation;
mod following;
mod registration;
mod rerun;
mod status;
mod teardown;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use crds::EphemeralRunner;
use crds::constants::{
    EPHEMERAL_RUNNER_FINALIZER, EPHEMERAL_RUNNER_REGISTRATION_FINALIZER, RUNNER_CONTAINER_NAME,
    RUNNER_POD_LABEL, SCALE_SET_NAME_LABEL, SCALE_SET_NAMESPACE_LABEL, reason,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::RunnerContext;
use super::facts::{in_teardown, known_identity};
use super::lifecycle::{
    Facts, Next, RunnerFact, SecretFact, Teardown, TeardownEnd, TeardownFacts,
    after_deregistration, decide, deregistration, plan_teardown,
};
use super::memory::RunnerMemory;
use super::observe;
use super::pod::{JitIdentity, desired_pod, jit_secret, job_metadata, read_jit_identity};
use super::pod_steps::{self, AfterCheck, Following, NameClash, OnPod, PodFailed, Report};
use super::policy::{CreateRejection, PodFailure, classify_create_error};
use super::status_patch::{RunnerPhase, StatusPatch};
use crate::actions::{
    Actions, ClientSource, Removal, credentials_gone, is_runner_exists, read_secret,
};
use crate::completions::owner_set_key;
use crate::context::Context;
use crate::error::{Error, Result, is_status};
use crate::kubeutil::{
    add_finalizers, controller_ref, delete_if_present, delete_terminated_pod, has_finalizer,
    name_and_namespace, remove_finalizers,
};
use crate::metrics::{RunnerLabels, RunnerReasonLabels};
use crate::options::{ER_FIELD_MANAGER, ER_JOB_METADATA_FIELD_MANAGER};
use crate::pods::CachedPod;
use registration::Registration;
pub use teardown::teardown;

/// The runner's two finalizers: its children's cleanup and its deregistration.
const RUNNER_FINALIZERS: [&str; 2] = [
    EPHEMERAL_RUNNER_FINALIZER,
    EPHEMERAL_RUNNER_REGISTRATION_FINALIZER,
];
/// Status reason while an idle runner waits for its deleted pod to go.
pub const POD_DELETED_REASON: &str = "PodDeleted";
/// Event reason when a runner's pod was deleted or evicted by someone else.
pub const POD_DELETED_EVENT: &str = "RunnerPodDeleted";
/// Event reason when creating a runner's pod failed with an error (not a refusal) and its registration went.
pub const POD_CREATION_FAILED_EVENT: &str = "RunnerPodCreationFailed";
/// Retry after the service said a runner name exists and then that it does not (its own eventual consistency).
const SERVICE_RETRY: Duration = Duration::from_secs(1);
/// How long a pass waits for the watch to bring a pod this process created before reading from the API server
/// instead ([`RunnerMemory::awaiting_pod`]): far longer than the watch takes in a burst.
const POD_CREATED_EXPECTATION: Duration = Duration::from_secs(10);
/// Upper bound of decision steps in one pass ([`super::lifecycle`]'s property tests show passes end sooner).
const MAX_STEPS: usize = 16;

/// Reconciles one EphemeralRunner.
#[tracing::instrument(skip(runner, lane), fields(runner = %runner.name_any(), namespace = runner.namespace().unwrap_or_default()))]
pub async fn reconcile(runner: Arc<EphemeralRunner>, lane: Arc<RunnerContext>) -> Result<Action> {
    let (ctx, memory) = (lane.base.as_ref(), lane.memory.as_ref());
    // This manager's own last status write, while the cache has not caught up with it.
    let runner = memory
        .fresher(&runner.uid().unwrap_or_default())
        .unwrap_or(runner);
    let step = Step::new(&runner, ctx, memory, ctx.client.clone())?;
    if observe::teardown_lane(&runner, &ctx.stores, memory) {
        // The teardown lane's ([`teardown`]), also once its deletion of the pod reached the cache before the
        // runner's own deletion did: a busy runner without a pod would otherwise look interrupted.
        return Ok(Action::await_change());
    }
    let mut pod = step.cached_pod();
    if let Some(wait) = memory.awaiting_pod(&step.uid, pod.is_some(), POD_CREATED_EXPECTATION) {
        // The pod this process just created is on its way to the cache; its event brings the runner back.
        return Ok(Action::requeue(wait));
    }
    let mut facts = step.initial_facts(pod.as_deref());
    let mut identity = known_identity(memory, &runner, pod.as_deref());
    if facts.registered {
        memory.forget_pod_identity(&step.uid);
    } else {
        // A pod this process created, whose identity the status does not show yet: it was not written before
        // the pod (see `Step::create_pod`).
        facts.registered = identity.is_some();
    }
    // The runner as the API server gave it before registering: the cache keeps no pod template
    // (`prune_cached_runner`), so the Secret and the pod are made from this copy.
    let mut fresh: Option<EphemeralRunner> = None;
    // The registration the JIT Secret records, when read: it may differ from the status's (a later attempt's
    // Secret made, its status write then failed), and both go when the config is discarded.
    let mut secret_registration = 0;
    for _ in 0..MAX_STEPS {
        let next = decide(&facts);
        tracing::trace!(?next, "runner step");
        match next {
            Next::ReadSecret => {
                let (fact, read) = step.read_jit_secret().await?;
                facts.secret = fact;
                secret_registration = read.as_ref().map_or(0, |read| read.runner_id);
                if identity.is_none() {
                    identity = read;
                }
            }
            Next::ReadPod => {
                pod = step.read_pod().await?.map(Arc::new);
                facts.pod = observe::pod_fact(pod.as_deref(), Timestamp::now());
            }
            Next::ReadRunner => {
                let (fact, current) = step.read_self().await?;
                facts.fresh_runner = fact;
                fresh = current;
            }
            Next::AddFinalizers => {
                step.ensure_finalizers().await?;
                facts.finalizers_missing = false;
            }
            Next::DiscardConfig => match step
                .discard_config(identity.as_ref(), secret_registration)
                .await?
            {
                Removal::JobStillRunning => facts.service_busy = true,
                Removal::Removed => {
                    facts.secret = SecretFact::Absent;
                    facts.registered = false;
                    identity = None;
                    secret_registration = 0;
                }
            },
            Next::ReleaseIdle => match step.release_idle(identity.as_ref()).await? {
                Removal::JobStillRunning => facts.service_busy = true,
                Removal::Removed => {
                    facts.registered = false;
                    identity = None;
                }
            },
            Next::DryRunPod => match step.dry_run_pod(step.fresh(fresh.as_ref())?).await? {
                Some(action) => return Ok(action),
                None => facts.dry_run_passed = true,
            },
            Next::Register => match step
                .register(
                    step.fresh(fresh.as_ref())?,
                    facts.secret == SecretFact::Absent,
                )
                .await?
            {
                Registration::Registered(registered) => {
                    identity = Some(registered);
                    facts.secret = SecretFact::Fresh;
                    facts.registered = true;
                }
                // A first attempt's Secret exists after all, or may: read it, as any other attempt does.
                Registration::ReadSecretFirst => facts.first_attempt = false,
                Registration::Wait(action) => return Ok(action),
            },
            // The teardown lane's; `in_teardown` above already left such a runner to it.
            Next::Finalize => return Ok(Action::await_change()),
            Next::DeleteChildren => {
                step.delete_children().await?;
                return Ok(Action::await_change());
            }
            Next::GiveUp => {
                ctx.metrics
                    .retries_exhausted
                    .get_or_create(&step.scale_set())
                    .inc();
                return step
                    .leave(pod_steps::retries_exhausted(step.failures()))
                    .await;
            }
            Next::Wait(wait) => return Ok(Action::requeue(wait)),
            Next::FinishInterrupted => return step.finish_interrupted(pod.as_deref()).await,
            // Its deletion event brings the runner back; so does its deadline, after which the runner gives up
            // its place.
            Next::AwaitPodGone => {
                let wait = observe::until_stuck(pod.as_deref(), Timestamp::now());
                return Ok(Action::requeue(wait.min(ctx.options.resync_interval)));
            }
            Next::GiveUpPlace => return step.leave(pod_steps::stuck_terminating()).await,
            Next::CreatePod => {
                let Some(identity) = identity else {
                    return Err(step.corrupt("no identity after registering"));
                };
                return step
                    .create_pod(step.fresh(fresh.as_ref())?, &identity)
                    .await;
            }
            Next::Follow => {
                let Some(pod) = pod else {
                    return Err(step.corrupt("no pod to follow"));
                };
                return step.handle_pod(&pod, identity.as_ref()).await;
            }
            Next::Stop => return Ok(Action::await_change()),
        }
    }
    tracing::warn!("a runner pass did not settle; it runs again");
    Ok(Action::requeue(ctx.options.resync_interval))
}

/// One reconcile's view of a runner.
struct Step<'a> {
    runner: &'a EphemeralRunner,
    ctx: &'a Context,
    /// The runner controller's memory of its runners.
    memory: &'a RunnerMemory,
    name: String,
    namespace: String,
    uid: String,
    api: Api<EphemeralRunner>,
    pods: Api<Pod>,
    secrets: Api<Secret>,
    /// The lane's client, for every request of the pass: the teardown's must never queue behind the burst's
    /// creations in the main client's in-flight limit (a JIT Secret read there made the deregistration stage's
    /// p50 0.55 s in a 500-job burst).
    client: kube::Client,
    /// The resource version this pass's last status write left (the copy in hand predates it).
    written_at: std::sync::Mutex<Option<String>>,
}

impl<'a> Step<'a> {
    /// A pass over `runner` whose writes go through `client` (the main lane's or the teardown lane's).
    fn new(
        runner: &'a EphemeralRunner,
        ctx: &'a Context,
        memory: &'a RunnerMemory,
        client: kube::Client,
    ) -> Result<Self> {
        let (name, namespace) = name_and_namespace(runner)?;
        Ok(Self {
            runner,
            ctx,
            memory,
            uid: runner.uid().unwrap_or_default(),
            api: Api::namespaced(client.clone(), &namespace),
            pods: Api::namespaced(client.clone(), &namespace),
            secrets: Api::namespaced(client.clone(), &namespace),
            client,
            name,
            namespace,
            written_at: std::sync::Mutex::default(),
        })
    }

    /// What the cached runner and pod say, before anything is read from the API server ([`observe::facts`]).
    fn initial_facts(&self, pod: Option<&CachedPod>) -> Facts {
        observe::facts(
            self.runner,
            pod,
            &self.memory.snapshot(&self.uid),
            &self.ctx.options.runner,
            || observe::template_outdated(self.runner, &self.ctx.stores),
        )
    }

    fn status(&self) -> crds::EphemeralRunnerStatus {
        self.runner.status.clone().unwrap_or_default()
    }

    /// The runner's pod as the watch cache shows it now.
    fn cached_pod(&self) -> Option<Arc<CachedPod>> {
        self.ctx
            .stores
            .pods
            .get(&ObjectRef::new(&self.name).within(&self.namespace))
    }

    /// Whether the runner's end came while this pass ran ([`observe::ended_meanwhile`]).
    fn ended_meanwhile(&self) -> bool {
        observe::ended_meanwhile(self.runner, &self.ctx.stores, self.memory)
    }

    fn failures(&self) -> usize {
        self.runner
            .status
            .as_ref()
            .map_or(0, |status| status.failures.len())
    }

    fn corrupt(&self, reason: &str) -> Error {
        Error::CorruptJitSecret {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            reason: reason.to_owned(),
        }
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

    /// Publishes a Warning Event a decision asked for.
    async fn report(&self, report: Report) {
        self.event(
            EventType::Warning,
            report.reason,
            report.action,
            report.note,
        )
        .await;
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

    /// The runner deletes itself so its set replaces it, saying why in a Warning Event.
    async fn leave(&self, report: Report) -> Result<Action> {
        self.report(report).await;
        self.delete_self().await?;
        Ok(Action::await_change())
    }

    /// Asks for this runner's deletion (idempotent: the object is gone or going either way).
    async fn delete_self(&self) -> Result<()> {
        delete_if_present(&self.api, &self.name, &self.namespace).await?;
        Ok(())
    }

    /// Adds whichever of the two finalizers is missing (both in one patch, unlike ARC).
    async fn ensure_finalizers(&self) -> Result<()> {
        add_finalizers(&self.api, self.runner, &RUNNER_FINALIZERS).await?;
        Ok(())
    }

    /// The JIT Secret, from the API server, and the identity it records.
    async fn read_jit_secret(&self) -> Result<(SecretFact, Option<JitIdentity>)> {
        Ok(
            match read_secret(&self.client, &self.namespace, &self.name).await? {
                None => (SecretFact::Absent, None),
                Some(secret) => match read_jit_identity(&secret) {
                    Ok(identity) => (SecretFact::Valid, Some(identity)),
                    Err(reason) => {
                        tracing::warn!(%reason, "the JIT Secret is corrupt; it is discarded");
                        (SecretFact::Corrupt, None)
                    }
                },
            },
        )
    }

    /// The pod, from the API server.
    async fn read_pod(&self) -> Result<Option<CachedPod>> {
        self.pods
            .get_opt(&self.name)
            .await
            .map(|pod| pod.map(CachedPod::from))
            .map_err(|source| Error::ReadObjects {
                kind: Pod::kind(&()),
                namespace: self.namespace.clone(),
                source: Box::new(source),
            })
    }

    /// Whether this very runner (same uid) still exists and is not being deleted, from the API server: the
    /// fence in front of a registration, which a cache a moment behind must never cause for a runner that is gone.
    /// A live runner comes back too: its pod template is what the Secret and the pod are made from.
    async fn read_self(&self) -> Result<(RunnerFact, Option<EphemeralRunner>)> {
        let current = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|source| Error::ReadObjects {
                kind: EphemeralRunner::kind(&()),
                namespace: self.namespace.clone(),
                source: Box::new(source),
            })?;
        Ok(match current {
            Some(runner)
                if runner.uid().as_deref() == Some(self.uid.as_str())
                    && runner.meta().deletion_timestamp.is_none() =>
            {
                (RunnerFact::Live, Some(runner))
            }
            _ => (RunnerFact::Going, None),
        })
    }
}
