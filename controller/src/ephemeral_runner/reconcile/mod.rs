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

use std::sync::Arc;
use std::time::Duration;

use crds::EphemeralRunner;
use crds::constants::{RUNNER_CONTAINER_NAME, reason};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::RunnerContext;
use super::facts::known_identity;
use super::lifecycle::{Facts, Next, RunnerFact, SecretFact, decide};
use super::objects::MetadataApplied;
use super::observe;
use super::pod::{JitIdentity, desired_pod, jit_secret, job_metadata, read_jit_identity};
use super::pod_steps::{self, AfterCheck, Following, NameClash, OnPod, PodFailed};
use super::policy::{CreateRejection, PodFailure, classify_create_error};
use super::registrations::Registrations;
use super::status_patch::{RunnerPhase, StatusPatch};
use super::step::{RUNNER_FINALIZERS, Step};
use crate::actions::{Removal, is_runner_exists};
use crate::error::Result;
use crate::kubeutil::controller_ref;
use crate::pods::CachedPod;
use registration::Registration;

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
    if let Some(wait) =
        memory.awaiting_pod(&step.objects.uid, pod.is_some(), POD_CREATED_EXPECTATION)
    {
        // The pod this process just created is on its way to the cache; its event brings the runner back.
        return Ok(Action::requeue(wait));
    }
    let mut facts = step.initial_facts(pod.as_deref());
    let mut identity = known_identity(memory, &runner, pod.as_deref());
    if facts.registered {
        memory.forget_pod_identity(&step.objects.uid);
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
                let (fact, read) = step.objects.read_jit_secret().await?;
                facts.secret = fact;
                secret_registration = read.as_ref().map_or(0, |read| read.runner_id);
                if identity.is_none() {
                    identity = read;
                }
            }
            Next::ReadPod => {
                pod = step.objects.read_pod().await?.map(Arc::new);
                facts.pod = observe::pod_fact(pod.as_deref(), Timestamp::now());
            }
            Next::ReadRunner => {
                let (fact, current) = step.objects.read_self().await?;
                facts.fresh_runner = fact;
                fresh = current;
            }
            Next::AddFinalizers => {
                step.objects
                    .add_finalizers(&runner, &RUNNER_FINALIZERS)
                    .await?;
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

impl Step<'_> {
    /// What the cached runner and pod say, before anything is read from the API server ([`observe::facts`]).
    fn initial_facts(&self, pod: Option<&CachedPod>) -> Facts {
        observe::facts(
            self.runner,
            pod,
            &self.memory.snapshot(&self.objects.uid),
            &self.ctx.options.runner,
            || observe::template_outdated(self.runner, &self.ctx.stores),
        )
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
}
