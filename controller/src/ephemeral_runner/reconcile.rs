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

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crds::constants::{
    EPHEMERAL_RUNNER_FINALIZER, EPHEMERAL_RUNNER_REGISTRATION_FINALIZER, INTEGRITY_HASH_ANNOTATION,
    RUNNER_CONTAINER_NAME, RUNNER_POD_LABEL, SCALE_SET_NAME_LABEL, SCALE_SET_NAMESPACE_LABEL,
    phase, reason,
};
use crds::{EphemeralRunner, EphemeralRunnerSet};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};

use super::lifecycle::{Facts, Next, PodFact, RunnerFact, SecretFact, decide};
use super::pod::{JitIdentity, desired_pod, jit_secret, job_metadata, read_jit_identity};
use super::policy::{
    CreateRejection, PodFailure, PodVerdict, classify_create_error, disruption_delay,
    failure_delay, judge_pod, remaining_failure_backoff, starting_normally,
};
use crate::actions::{
    Actions, ClientSource, Removal, credentials_gone, is_runner_exists, read_secret,
};
use crate::context::{Context, RunnerMemory};
use crate::ephemeral_runner_set::completions::owner_set_key;
use crate::error::{Error, Result, is_status};
use crate::hash::runner_spec_hash;
use crate::kubeutil::{
    add_finalizers, controller_ref, delete_if_present, delete_terminated_pod, has_finalizer,
    name_and_namespace, remove_finalizers,
};
use crate::metrics::{RunnerLabels, RunnerReasonLabels};
use crate::options::{ER_FIELD_MANAGER, ER_JOB_METADATA_FIELD_MANAGER};
use crate::pods::CachedPod;

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
/// How long past its deletion deadline a pod may stay before its runner gives up the place: the kubelet stops the
/// containers by the deadline and then reports; a pod still there this long after has no kubelet looking after it
/// (a lost node), and the set needs the capacity elsewhere.
const STUCK_TERMINATING_SLACK: Duration = Duration::from_secs(30);
/// Retry after the service said a runner name exists and then that it does not (its own eventual consistency).
const SERVICE_RETRY: Duration = Duration::from_secs(1);
/// How long a pass waits for the watch to bring a pod this process created before reading from the API server
/// instead ([`crate::context::RunnerMemory::awaiting_pod`]): far longer than the watch takes in a burst.
const POD_CREATED_EXPECTATION: Duration = Duration::from_secs(10);
/// Upper bound of decision steps in one pass ([`super::lifecycle`]'s property tests show passes end sooner).
const MAX_STEPS: usize = 16;

/// Whether a runner's end has come, which the teardown lane carries out ([`teardown`]): it is being deleted, or
/// its pod succeeded (the runner ran its one job and exited 0) while it is not already done. A pod being deleted
/// whose idle runner exited 0 on the way is the main lane's: a pod taken away (`decide`).
pub fn in_teardown(runner: &EphemeralRunner, pod: Option<&CachedPod>) -> bool {
    runner.meta().deletion_timestamp.is_some()
        || (!runner.is_done()
            && pod.is_some_and(|pod| {
                judge_pod(pod) == PodVerdict::Succeeded
                    && (pod.meta().deletion_timestamp.is_none() || runner.has_job())
            }))
}

/// The teardown lane's pass ([`super::run_teardown`]): a runner whose pod succeeded deletes itself, and a runner
/// being deleted is deregistered, its pod and Secret deleted and its finalizers dropped, in this one pass. Other
/// runners are the main lane's ([`reconcile`]).
#[tracing::instrument(skip(runner, ctx), fields(runner = %runner.name_any(), namespace = runner.namespace().unwrap_or_default()))]
pub async fn teardown(runner: Arc<EphemeralRunner>, ctx: Arc<Context>) -> Result<Action> {
    let step = Step::new(&runner, &ctx, ctx.teardown_client.clone())?;
    let pod = step.cached_pod();
    if !in_teardown(&runner, pod.as_deref()) {
        return Ok(Action::await_change());
    }
    ctx.runner_memory.tearing_down(&step.uid);
    // A runner whose pod succeeded is deleted and finalized in this pass, rather than on the deletion's watch
    // event, which would only bring it back here.
    let delete = runner.meta().deletion_timestamp.is_none();
    if delete && let Some(set) = owner_set_key(&runner) {
        // It ran its job: its set keeps its place until the listener's target leaves the job out, also when the
        // listener's record of the job never reached the runner (a job shorter than that write).
        let registration = known_identity(&ctx.runner_memory, &runner, pod.as_deref())
            .map_or(0, |identity| identity.runner_id);
        ctx.completions.left(&set, &step.name, registration);
    }
    step.finalize(delete).await
}

/// Reconciles one EphemeralRunner.
#[tracing::instrument(skip(runner, ctx), fields(runner = %runner.name_any(), namespace = runner.namespace().unwrap_or_default()))]
pub async fn reconcile(runner: Arc<EphemeralRunner>, ctx: Arc<Context>) -> Result<Action> {
    // This manager's own last status write, while the cache has not caught up with it.
    let runner = ctx
        .runner_memory
        .fresher(&runner.uid().unwrap_or_default())
        .unwrap_or(runner);
    let step = Step::new(&runner, &ctx, ctx.client.clone())?;
    let mut pod = step.cached_pod();
    if in_teardown(&runner, pod.as_deref()) || ctx.runner_memory.is_tearing_down(&step.uid) {
        // The teardown lane's ([`teardown`]), also once its deletion of the pod reached the cache before the
        // runner's own deletion did: a busy runner without a pod would otherwise look interrupted.
        return Ok(Action::await_change());
    }
    if let Some(wait) =
        ctx.runner_memory
            .awaiting_pod(&step.uid, pod.is_some(), POD_CREATED_EXPECTATION)
    {
        // The pod this process just created is on its way to the cache; its event brings the runner back.
        return Ok(Action::requeue(wait));
    }
    let mut facts = step.initial_facts(pod.as_deref());
    let mut identity = known_identity(&ctx.runner_memory, &runner, pod.as_deref());
    if facts.registered {
        ctx.runner_memory.identity_recorded(&step.uid);
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
                facts.pod = pod_fact(pod.as_deref(), Timestamp::now());
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
            Next::GiveUp => return step.give_up().await,
            Next::Wait(wait) => return Ok(Action::requeue(wait)),
            Next::FinishInterrupted => return step.finish_interrupted().await,
            Next::AwaitPodGone => return Ok(step.await_pod_gone(pod.as_deref())),
            Next::GiveUpPlace => return step.give_up_place().await,
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

/// The registration `runner` runs under as far as this process knows: the one its status records, or, until the
/// status records one, the one this process created its pod `pod` under (the identity goes into the status with
/// the pod's first state worth showing, see `Step::create_pod`).
pub(crate) fn known_identity(
    memory: &RunnerMemory,
    runner: &EphemeralRunner,
    pod: Option<&CachedPod>,
) -> Option<JitIdentity> {
    let status = runner.status.as_ref();
    if let Some(status) = status.filter(|status| status.runner_id != 0) {
        return Some(JitIdentity {
            runner_id: status.runner_id,
            runner_name: status.runner_name.clone(),
        });
    }
    let pod = pod?;
    memory
        .identity_of_pod(
            &runner.uid().unwrap_or_default(),
            &pod.uid().unwrap_or_default(),
        )
        .map(|(runner_id, runner_name)| JitIdentity {
            runner_id,
            runner_name,
        })
}

/// What the pod in hand says, for [`decide`].
fn pod_fact(pod: Option<&CachedPod>, now: Timestamp) -> PodFact {
    let Some(pod) = pod else {
        return PodFact::Gone;
    };
    let verdict = judge_pod(pod);
    match &pod.meta().deletion_timestamp {
        None => PodFact::Live(verdict),
        Some(deadline) => PodFact::Terminating {
            verdict,
            past_deadline: Duration::try_from(now.duration_since(deadline.0))
                .is_ok_and(|past| past > STUCK_TERMINATING_SLACK),
        },
    }
}

/// Outcome of a registration.
enum Registration {
    Registered(JitIdentity),
    /// Registering without having read the Secret met a sign of one (its creation refused, or the name known to
    /// the service): nothing was left registered; read the Secret first.
    ReadSecretFirst,
    Wait(Action),
}

/// An EphemeralRunner phase, serialised as ARC's strings; the controller mirrors the pod's phase (Pending,
/// Running, and Unknown when the node stops reporting) and sets the terminal ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum RunnerPhase {
    Pending,
    Running,
    Failed,
    Outdated,
    Unknown,
}

impl RunnerPhase {
    fn of_pod(pod_phase: &str) -> Self {
        match pod_phase {
            phase::RUNNING => Self::Running,
            phase::FAILED => Self::Failed,
            "Unknown" => Self::Unknown,
            _ => Self::Pending,
        }
    }
}

/// A patch of the EphemeralRunner status fields this controller owns. `None` leaves a field alone; `Some(None)`
/// removes it. Sent as a merge patch, unless it moves the runner off a registration (see
/// [`StatusPatch::leave_registration`]).
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusPatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    phase: Option<RunnerPhase>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ready: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runner_id: Option<Option<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runner_name: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    failures: Option<BTreeMap<String, Time>>,
    /// The registration the status records now, which this write moves the runner off, taking its job fields
    /// (the listener's; this controller only removes them) with it.
    #[serde(skip)]
    leaves: Option<i64>,
    /// The resource version the write holds at: set when it records an identity the pass's view shows none of.
    /// The listener may have recorded one with a job meanwhile (see `Step::create_pod`), maybe a registration's
    /// this runner has left; a plain merge patch would put the new identity over that job.
    #[serde(skip)]
    holds_at: Option<String>,
}

impl StatusPatch {
    fn is_empty(&self) -> bool {
        self.phase.is_none()
            && self.ready.is_none()
            && self.reason.is_none()
            && self.message.is_none()
            && self.runner_id.is_none()
            && self.runner_name.is_none()
            && self.failures.is_none()
            && self.leaves.is_none()
    }

    /// Sets `reason` and `message`, removing each when empty.
    fn explain(&mut self, reason: String, message: String) {
        let or_none = |text: String| (!text.is_empty()).then_some(text);
        self.reason = Some(or_none(reason));
        self.message = Some(or_none(message));
    }

    /// Removes registration `recorded`, the one the status records (0: none).
    fn forget_identity(&mut self, recorded: i64) {
        self.runner_id = Some(None);
        self.runner_name = Some(None);
        self.leave_registration(recorded);
    }

    /// Moves the runner off registration `recorded` (0: none): the job fields go with it, and the write holds only
    /// while the status still records it. The listener writes a job's fields only while the status records the
    /// registration the job started on, and may do so between this pass's read and its write (a JobStarted
    /// reported late, of a runner whose pod was taken away mid-job): a plain merge patch would carry that job
    /// over to the next registration, whose runner never runs it, and a runner with a job is never scaled down.
    fn leave_registration(&mut self, recorded: i64) {
        if recorded != 0 {
            self.leaves = Some(recorded);
        }
    }

    /// The request: a merge patch, or the registration-guarded JSON patch when the write leaves one.
    /// `recorded_failures`: the failures the status holds, as the write's view shows them. A JSON patch replaces
    /// the map where a merge patch adds to it, so the new entries go in with these. The view cannot miss one: a
    /// failure is only ever written together with forgetting the registration, so a view that still shows the
    /// registration this write's `test` checks shows every failure written before.
    fn to_patch(&self, recorded_failures: &BTreeMap<String, Time>) -> Result<Patch<Value>> {
        let serialize = |source| Error::Serialize {
            what: "the EphemeralRunner status patch",
            source,
        };
        let body = serde_json::to_value(self).map_err(serialize)?;
        Ok(match (self.leaves, body) {
            (Some(recorded), Value::Object(mut fields)) => {
                for job_field in crds::EphemeralRunnerStatus::JOB_FIELDS {
                    fields.insert(job_field.to_owned(), Value::Null);
                }
                if let Some(new) = &self.failures {
                    let mut all = recorded_failures.clone();
                    all.extend(new.iter().map(|(uid, at)| (uid.clone(), at.clone())));
                    fields.insert(
                        "failures".to_owned(),
                        serde_json::to_value(all).map_err(serialize)?,
                    );
                }
                Patch::Json(crds::registration_guarded_status_patch(recorded, &fields))
            }
            (_, body) => match &self.holds_at {
                Some(version) => Patch::Merge(json!({
                    "metadata": { "resourceVersion": version },
                    "status": body,
                })),
                None => Patch::Merge(json!({ "status": body })),
            },
        })
    }
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
    /// The resource version this pass's last status write left (the copy in hand predates it).
    written_at: std::sync::Mutex<Option<String>>,
}

impl<'a> Step<'a> {
    /// A pass over `runner` whose writes go through `client` (the main lane's or the teardown lane's).
    fn new(runner: &'a EphemeralRunner, ctx: &'a Context, client: kube::Client) -> Result<Self> {
        let (name, namespace) = name_and_namespace(runner)?;
        Ok(Self {
            runner,
            ctx,
            uid: runner.uid().unwrap_or_default(),
            api: Api::namespaced(client.clone(), &namespace),
            pods: Api::namespaced(client.clone(), &namespace),
            secrets: Api::namespaced(client, &namespace),
            name,
            namespace,
            written_at: std::sync::Mutex::default(),
        })
    }

    /// What the cached runner and pod say, before anything is read from the API server.
    fn initial_facts(&self, pod: Option<&CachedPod>) -> Facts {
        let status = self.status();
        let finalizers = self.runner.finalizers();
        let has = |finalizer: &str| finalizers.iter().any(|have| have == finalizer);
        Facts {
            deleting: self.runner.meta().deletion_timestamp.is_some(),
            done: self.runner.is_done(),
            finalizers_missing: !has(EPHEMERAL_RUNNER_FINALIZER)
                || !has(EPHEMERAL_RUNNER_REGISTRATION_FINALIZER),
            failures: status.failures.len(),
            max_failures: self.ctx.options.runner.max_pod_failures,
            has_job: status.has_job(),
            service_busy: false,
            registered: status.runner_id != 0,
            backoff: self.pod_backoff(),
            // A refusal recorded in the status, or a creation that failed in this process: either way the next
            // registration waits for a dry run the cluster admits.
            rejected: status.reason == reason::POD_CREATION_REJECTED
                || self.ctx.runner_memory.pod_creation_failed(&self.uid),
            dry_run_passed: false,
            pod: match pod {
                None => PodFact::NotCached,
                Some(pod) => pod_fact(Some(pod), Timestamp::now()),
            },
            secret: SecretFact::Unread,
            fresh_runner: RunnerFact::Unread,
            // Only a runner about to register needs it (hashing the template is not free).
            outdated_template: pod.is_none() && self.template_outdated(),
            first_attempt: status.phase.is_empty()
                && status.reason.is_empty()
                && status.runner_id == 0
                && status.failures.is_empty()
                && self.ctx.runner_memory.last_disruption(&self.uid).is_none()
                && !self.ctx.runner_memory.knows_pod_identity(&self.uid)
                && !self.ctx.runner_memory.pod_creation_failed(&self.uid),
        }
    }

    /// Whether the runner's set, as cached, has a newer template than the one the runner was made from (each
    /// runner records it in `actions.github.com/integrity-hash`; one without the record is taken as current).
    fn template_outdated(&self) -> bool {
        let Some(made_from) = self.runner.annotations().get(INTEGRITY_HASH_ANNOTATION) else {
            return false;
        };
        let Some(owner) = self.runner.owner_references().iter().find(|owner| {
            owner.controller == Some(true) && owner.kind == EphemeralRunnerSet::kind(&())
        }) else {
            return false;
        };
        self.ctx
            .stores
            .runner_sets
            .get(&ObjectRef::new(&owner.name).within(&self.namespace))
            .filter(|set| set.uid().as_deref() == Some(owner.uid.as_str()))
            .and_then(|set| runner_spec_hash(&set.spec.ephemeral_runner_spec).ok())
            .is_some_and(|current| current != *made_from)
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

    /// Whether the runner's end came while this pass ran: the teardown lane finalized it, or the caches now show it
    /// deleted or its pod finished. A pass whose writes waited behind a burst's creations (the main lane's client
    /// rate limit) then has nothing left to mirror: its write would reach a runner on its way out, or one already
    /// gone (answered 404; 0.43 status writes per job in a 500-job burst, docs/benchmarks.md).
    fn ended_meanwhile(&self) -> bool {
        if self.ctx.runner_memory.is_tearing_down(&self.uid) {
            return true;
        }
        let runner_going = self
            .ctx
            .stores
            .runners
            .get(&ObjectRef::new(&self.name).within(&self.namespace))
            .is_none_or(|cached| {
                cached.uid().as_deref() != Some(self.uid.as_str())
                    || cached.meta().deletion_timestamp.is_some()
            });
        let pod_ended = self.cached_pod().is_some_and(|pod| {
            pod.meta().deletion_timestamp.is_some() || judge_pod(&pod) == PodVerdict::Succeeded
        });
        runner_going || pod_ended
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

    /// Merge-patches the named status fields under this controller's field manager.
    async fn patch_status(&self, patch: &StatusPatch) -> Result<()> {
        if patch.is_empty() {
            return Ok(());
        }
        let params = PatchParams {
            field_manager: Some(ER_FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        self.api
            .patch_status(
                &self.name,
                &params,
                &patch.to_patch(&self.status().failures)?,
            )
            .await
            .map(|mut written| {
                *crate::context::lock(&self.written_at) = written.resource_version();
                // Cached the way the watch caches it.
                written.managed_fields_mut().clear();
                super::prune_cached_runner(&mut written);
                self.ctx.runner_memory.wrote(&self.uid, written);
            })
            .map_err(|source| Error::PatchObject {
                kind: EphemeralRunner::kind(&()),
                what: "status",
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            })
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
            match read_secret(&self.ctx.client, &self.namespace, &self.name).await? {
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

    /// The runner read from the API server in this pass; the lifecycle reads it before every step that needs it.
    fn fresh<'f>(&self, fresh: Option<&'f EphemeralRunner>) -> Result<&'f EphemeralRunner> {
        fresh.ok_or_else(|| self.corrupt("no fresh copy of the runner before registering"))
    }

    /// Registers the runner and stores its JIT config in a new Secret; `fresh` is the runner as just read, and
    /// `secret_absent` says whether the API server said there is no Secret (else this is a first attempt, which
    /// learns of one from the refusal to create it).
    async fn register(&self, fresh: &EphemeralRunner, secret_absent: bool) -> Result<Registration> {
        let actions = self.actions().await?;
        let work_folder = fresh
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
            // The name's registration may be the one of a Secret not read yet, whose pod may run.
            Err(error) if is_runner_exists(&error) && !secret_absent => {
                return Ok(Registration::ReadSecretFirst);
            }
            Err(error) if is_runner_exists(&error) => {
                return self.resolve_name_clash(&actions).await;
            }
            Err(error) => return Err(error),
        };
        let owner = controller_ref(self.runner)?;
        let secret = jit_secret(
            fresh,
            owner,
            &jit,
            &self.ctx.options.exclude_label_propagation_prefixes,
        );
        match self.secrets.create(&PostParams::default(), &secret).await {
            Ok(created) => {
                let registered =
                    read_jit_identity(&created).map_err(|reason| self.corrupt(&reason))?;
                // The runner may have been deleted while the service registered it (a template change, the set's
                // cleanup, `kubectl delete`); its teardown then found no Secret and no registration by name, and
                // may have finalized it. From now on its teardown finds the Secret; before, only this pass can
                // know: ask the API server again, and take the registration back if the runner is going.
                if self.read_self().await?.0 == RunnerFact::Going {
                    tracing::info!(
                        runner_id = registered.runner_id,
                        "the runner went while it registered; its registration is removed"
                    );
                    actions.remove_runner(registered.runner_id).await?;
                    delete_if_present(&self.secrets, &self.name, &self.namespace).await?;
                    return Ok(Registration::Wait(Action::await_change()));
                }
                Ok(Registration::Registered(registered))
            }
            Err(source) => {
                // The config just issued is stored nowhere: remove it rather than leave a registration behind.
                if let Some(runner) = &jit.runner
                    && let Err(error) = actions.remove_runner(runner.id).await
                {
                    tracing::warn!(%error, "removing an unstored registration failed");
                }
                if !secret_absent
                    && classify_create_error(&source) == CreateRejection::AlreadyExists
                {
                    return Ok(Registration::ReadSecretFirst);
                }
                Err(Error::CreateObject {
                    kind: Secret::kind(&()),
                    namespace: self.namespace.clone(),
                    name: self.name.clone(),
                    source: Box::new(source),
                })
            }
        }
    }

    /// The service already has a runner with this name (a crash between registering and storing the config).
    async fn resolve_name_clash(&self, actions: &Actions) -> Result<Registration> {
        let Some(existing) = actions.get_runner_by_name(&self.name).await? else {
            return Ok(Registration::Wait(Action::requeue(SERVICE_RETRY)));
        };
        if existing.runner_scale_set_id == self.runner.spec.runner_scale_set_id {
            tracing::info!(
                runner_id = existing.id,
                "removing a registration left by an earlier attempt"
            );
            return match actions.remove_runner(existing.id).await? {
                Removal::Removed => Ok(Registration::Wait(Action::requeue(Duration::ZERO))),
                Removal::JobStillRunning => Ok(Registration::Wait(Action::requeue(
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
        Ok(Registration::Wait(Action::await_change()))
    }

    /// The registration to remove: `identity`, else a lookup by name (a crash between registering and recording).
    async fn registration_id(
        &self,
        actions: &Actions,
        identity: Option<&JitIdentity>,
    ) -> Result<i64> {
        if let Some(identity) = identity {
            return Ok(identity.runner_id);
        }
        Ok(actions
            .get_runner_by_name(&self.name)
            .await?
            .filter(|found| found.runner_scale_set_id == self.runner.spec.runner_scale_set_id)
            .map_or(0, |found| found.id))
    }

    /// Removes the runner's registration now (`identity`, else found by name) unless the service says the runner
    /// holds a job; returns what happened and the registration's id.
    async fn deregister_idle(&self, identity: Option<&JitIdentity>) -> Result<(Removal, i64)> {
        let actions = self.actions().await?;
        let runner_id = self.registration_id(&actions, identity).await?;
        if runner_id != 0 && actions.remove_runner(runner_id).await? == Removal::JobStillRunning {
            return Ok((Removal::JobStillRunning, runner_id));
        }
        Ok((Removal::Removed, runner_id))
    }

    /// An idle runner's pod was taken away and its registration removed: a Normal Event and the disruption metric
    /// (not a failure).
    async fn report_pod_taken(&self, runner_id: i64, how: &str) {
        self.event(
            EventType::Normal,
            POD_DELETED_EVENT,
            "RecreatePod",
            format!(
                "the pod of idle runner {runner_id} {how}; its registration was removed and a new pod follows with \
                 a fresh one"
            ),
        )
        .await;
        self.ctx
            .metrics
            .pod_disruptions
            .get_or_create(&self.reason_labels("pod_deleted"))
            .inc();
    }

    /// The pod of the config in the Secret is gone (the API server says so): that config may have been used, so
    /// it goes with its registration, unless the service says the runner holds a job.
    /// `secret_registration`: the registration the Secret records (0: not read), removed too when it is not
    /// `identity`'s, or it would be left on the service with nothing to point at it.
    async fn discard_config(
        &self,
        identity: Option<&JitIdentity>,
        secret_registration: i64,
    ) -> Result<Removal> {
        let (removal, runner_id) = self.deregister_idle(identity).await?;
        if removal == Removal::JobStillRunning {
            return Ok(removal);
        }
        if secret_registration != 0
            && secret_registration != runner_id
            && self
                .actions()
                .await?
                .remove_runner(secret_registration)
                .await?
                == Removal::JobStillRunning
        {
            return Ok(Removal::JobStillRunning);
        }
        delete_if_present(&self.secrets, &self.name, &self.namespace).await?;
        if let Some(error) = self
            .ctx
            .runner_memory
            .report_not_created(&self.uid, runner_id)
        {
            self.count_rejection("error");
            self.event(
                EventType::Warning,
                POD_CREATION_FAILED_EVENT,
                "CreatePod",
                format!(
                    "the pod of runner {runner_id} could not be created ({error}); its registration was removed, \
                     and a new one follows once a dry run of the pod passes"
                ),
            )
            .await;
        } else if self.status().runner_id != 0 {
            self.report_pod_taken(runner_id, "is gone").await;
        }
        Ok(Removal::Removed)
    }

    /// Someone else is deleting the pod of an idle runner (a drain, an eviction, `kubectl delete pod`): its
    /// registration goes now, so the service gives it no job in its last seconds; a new pod follows once this one
    /// is gone. Not counted as a failure.
    async fn release_idle(&self, identity: Option<&JitIdentity>) -> Result<Removal> {
        let (removal, runner_id) = self.deregister_idle(identity).await?;
        if removal == Removal::JobStillRunning {
            return Ok(removal);
        }
        let mut patch = StatusPatch {
            ready: Some(false),
            ..StatusPatch::default()
        };
        patch.forget_identity(self.status().runner_id);
        patch.explain(
            POD_DELETED_REASON.to_owned(),
            "the runner pod is being deleted; a new pod follows once it is gone".to_owned(),
        );
        self.patch_status(&patch).await?;
        self.report_pod_taken(runner_id, "is being deleted").await;
        Ok(Removal::Removed)
    }

    /// Waits for a deleted pod to go: its deletion event brings the runner back; so does its deadline, after which
    /// the runner gives up its place.
    fn await_pod_gone(&self, pod: Option<&CachedPod>) -> Action {
        let deadline = pod
            .and_then(|pod| pod.meta().deletion_timestamp.as_ref())
            .map(|deadline| deadline.0);
        let until = deadline
            .and_then(|deadline| Duration::try_from(deadline.duration_since(Timestamp::now())).ok())
            .unwrap_or(Duration::ZERO);
        Action::requeue(
            (until + STUCK_TERMINATING_SLACK + Duration::from_secs(1))
                .min(self.ctx.options.resync_interval),
        )
    }

    /// The runner had a job and lost its pod: deleting the runner finishes it (its finalizer deregisters it once
    /// the service lets go of the job, which it fails or retries).
    async fn finish_interrupted(&self) -> Result<Action> {
        let job = self.status().job_id;
        self.event(
            EventType::Warning,
            POD_DELETED_EVENT,
            "DeleteRunner",
            format!(
                "the runner pod was deleted or evicted while the runner held job {job:?}; the runner is finished \
                 and the job is left to GitHub to fail or retry"
            ),
        )
        .await;
        self.ctx
            .metrics
            .pod_disruptions
            .get_or_create(&self.reason_labels("pod_deleted_with_job"))
            .inc();
        self.delete_self().await?;
        Ok(Action::await_change())
    }

    /// The pod stays past its deletion deadline (no kubelet is stopping it): the runner gives up its place so the
    /// set creates one that can start elsewhere.
    async fn give_up_place(&self) -> Result<Action> {
        self.event(
            EventType::Warning,
            "RunnerPodStuckTerminating",
            "DeleteRunner",
            "the runner pod is still terminating long after its grace period (is its node lost?); deleting the \
             runner so the set replaces it"
                .to_owned(),
        )
        .await;
        self.delete_self().await?;
        Ok(Action::await_change())
    }

    /// Records `identity` in `patch` when the status does not hold it yet.
    fn record_identity(&self, identity: &JitIdentity, patch: &mut StatusPatch) {
        let status = self.status();
        if status.runner_id != identity.runner_id || status.runner_name != identity.runner_name {
            patch.runner_id = Some(Some(identity.runner_id));
            patch.runner_name = Some(Some(identity.runner_name.clone()));
            if status.runner_id == 0 {
                patch.holds_at = crate::context::lock(&self.written_at)
                    .clone()
                    .or_else(|| self.runner.resource_version());
            } else if status.runner_id != identity.runner_id {
                patch.leave_registration(status.runner_id);
            }
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

    /// Too many counted failures: report and delete; the set creates a replacement.
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

    /// The runner pod made from `fresh` (the runner as just read), or why it cannot be built (the runner is then
    /// marked Failed).
    fn build_pod(&self, fresh: &EphemeralRunner) -> Result<std::result::Result<Pod, String>> {
        let owner = controller_ref(self.runner)?;
        Ok(desired_pod(fresh, owner, &self.ctx.options.build_version)
            .map_err(|problem| format!("Failed to create the pod: {problem}")))
    }

    /// After a refusal, the next pod is created in dry-run mode first: nothing is registered until the cluster
    /// would admit it. `Some` ends the pass.
    async fn dry_run_pod(&self, fresh: &EphemeralRunner) -> Result<Option<Action>> {
        let pod = match self.build_pod(fresh)? {
            Ok(pod) => pod,
            Err(message) => {
                return self
                    .mark_failed(reason::INVALID_POD, message, None)
                    .await
                    .map(Some);
            }
        };
        let params = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        match self.pods.create(&params, &pod).await {
            Ok(_) => Ok(None),
            Err(error) => self.creation_refused(error, None, false).await.map(Some),
        }
    }

    async fn create_pod(&self, fresh: &EphemeralRunner, identity: &JitIdentity) -> Result<Action> {
        let pod = match self.build_pod(fresh)? {
            Ok(pod) => pod,
            Err(message) => {
                return self
                    .mark_failed(reason::INVALID_POD, message, Some(identity))
                    .await;
            }
        };
        // A first attempt writes no status before its pod: the identity goes into the status with the first state
        // worth showing (the pod running, or waiting on something, see `follow`), one write fewer per runner. The
        // listener may report the runner's job before that write: it records the identity with the job then (a
        // server-side apply, refused when the status records another registration). A later attempt clears what
        // the earlier ones left (a failure, a quota or admission message) before its pod, with the identity and
        // phase Pending (the API server makes every new pod Pending), as one write.
        let status = self.status();
        let recorded_before_pod = !status.phase.is_empty()
            || status.ready
            || !status.reason.is_empty()
            || !status.message.is_empty()
            || status.runner_id != 0;
        if recorded_before_pod {
            let mut patch = StatusPatch::default();
            self.record_identity(identity, &mut patch);
            if status.phase != phase::PENDING || status.ready || !status.reason.is_empty() {
                patch.phase = Some(RunnerPhase::Pending);
                patch.ready = Some(false);
                patch.explain(String::new(), String::new());
            }
            self.patch_status(&patch).await?;
        }
        match self.pods.create(&PostParams::default(), &pod).await {
            Ok(created) => {
                self.ctx.runner_memory.created_pod(&self.uid);
                self.ctx.runner_memory.pod_runs_under(
                    &self.uid,
                    &created.uid().unwrap_or_default(),
                    identity.runner_id,
                    &identity.runner_name,
                );
                Ok(Action::requeue(self.ctx.options.resync_interval))
            }
            Err(error) if classify_create_error(&error) == CreateRejection::AlreadyExists => {
                // A pod of that name exists after all (made from an earlier config, which the Secret just created
                // replaced): follow it; once it is gone, the new config is discarded as any other.
                match self.read_pod().await? {
                    Some(pod) => self.handle_pod(&pod, Some(identity)).await,
                    None => Err(Error::CreateObject {
                        kind: Pod::kind(&()),
                        namespace: self.namespace.clone(),
                        name: self.name.clone(),
                        source: Box::new(error),
                    }),
                }
            }
            Err(error) => {
                self.creation_refused(error, Some(identity), recorded_before_pod)
                    .await
            }
        }
    }

    /// The API server refused the pod. With `identity` (a real creation) the fresh config is discarded with its
    /// registration, so no Secret outlives its chance of a pod. `recorded`: the pass recorded the identity in the
    /// status before the creation (a later attempt, see `create_pod`).
    async fn creation_refused(
        &self,
        error: kube::Error,
        identity: Option<&JitIdentity>,
        recorded: bool,
    ) -> Result<Action> {
        let (class, message) = match classify_create_error(&error) {
            CreateRejection::Invalid(message) => {
                self.count_rejection("invalid");
                return self
                    .mark_failed(
                        reason::INVALID_POD,
                        format!("Failed to create the pod: {message}"),
                        identity,
                    )
                    .await;
            }
            CreateRejection::Quota(message) => ("quota", message),
            CreateRejection::Forbidden(message) => ("forbidden", message),
            CreateRejection::AlreadyExists | CreateRejection::Other => {
                if let Some(identity) = identity {
                    self.ctx.runner_memory.pod_not_created(
                        &self.uid,
                        identity.runner_id,
                        error.to_string(),
                    );
                }
                return Err(Error::CreateObject {
                    kind: Pod::kind(&()),
                    namespace: self.namespace.clone(),
                    name: self.name.clone(),
                    source: Box::new(error),
                });
            }
        };
        if let Some(identity) = identity {
            self.actions()
                .await?
                .remove_runner(identity.runner_id)
                .await?;
            delete_if_present(&self.secrets, &self.name, &self.namespace).await?;
        }
        let recorded_now = identity
            .filter(|_| recorded)
            .map(|identity| identity.runner_id);
        self.pod_rejected(class, message, recorded_now).await
    }

    fn count_rejection(&self, reason: &'static str) {
        self.ctx
            .metrics
            .pod_rejections
            .get_or_create(&self.reason_labels(reason))
            .inc();
    }

    /// A quota or admission check refused the pod: not the runner's fault, so not counted; retried (dry first)
    /// until the cluster admits it (ARC deleted the runner after 10 minutes of quota, which lost its place).
    /// `recorded_now`: the registration this pass recorded before the refused creation (the copy in hand
    /// predates it).
    async fn pod_rejected(
        &self,
        class: &'static str,
        message: String,
        recorded_now: Option<i64>,
    ) -> Result<Action> {
        self.count_rejection(class);
        let status = self.status();
        let message = format!("Failed to create the pod: {message}");
        let mut patch = StatusPatch::default();
        let recorded = recorded_now.unwrap_or(status.runner_id);
        if recorded != 0 {
            patch.forget_identity(recorded);
        }
        if status.reason != reason::POD_CREATION_REJECTED || status.message != message {
            self.event(
                EventType::Warning,
                reason::POD_CREATION_REJECTED,
                "CreatePod",
                message.clone(),
            )
            .await;
            patch.explain(reason::POD_CREATION_REJECTED.to_owned(), message);
        }
        self.patch_status(&patch).await?;
        Ok(Action::requeue(self.ctx.options.runner.pod_rejection_retry))
    }

    /// Marks the runner Failed and deregisters it; it keeps its place in the set for inspection, until the set's
    /// template changes.
    async fn mark_failed(
        &self,
        reason: &str,
        message: String,
        identity: Option<&JitIdentity>,
    ) -> Result<Action> {
        self.event(EventType::Warning, reason, "CreatePod", message.clone())
            .await;
        let mut patch = StatusPatch {
            phase: Some(RunnerPhase::Failed),
            ..StatusPatch::default()
        };
        if let Some(identity) = identity {
            self.record_identity(identity, &mut patch);
        }
        patch.explain(reason.to_owned(), message);
        self.patch_status(&patch).await?;
        if let Some(identity) = identity {
            self.actions()
                .await?
                .remove_runner(identity.runner_id)
                .await?;
        }
        Ok(Action::await_change())
    }

    async fn mark_outdated(&self, identity: Option<&JitIdentity>) -> Result<Action> {
        self.event(
            EventType::Warning,
            reason::OUTDATED,
            "UpdateStatus",
            "the runner version is deprecated; update the runner image".to_owned(),
        )
        .await;
        let mut patch = StatusPatch {
            phase: Some(RunnerPhase::Outdated),
            ..StatusPatch::default()
        };
        patch.explain(
            reason::OUTDATED.to_owned(),
            "Runner is deprecated".to_owned(),
        );
        self.patch_status(&patch).await?;
        if let Some(identity) = identity {
            self.actions()
                .await?
                .remove_runner(identity.runner_id)
                .await?;
        }
        Ok(Action::await_change())
    }

    async fn handle_pod(&self, pod: &CachedPod, identity: Option<&JitIdentity>) -> Result<Action> {
        let pod_uid = pod.uid().unwrap_or_default();
        let status = self.status();
        if status.failures.contains_key(&pod_uid) {
            // Already handled; its deletion event brings the runner back.
            delete_if_present(&self.pods, &self.name, &self.namespace).await?;
            return Ok(Action::requeue(self.ctx.options.resync_interval));
        }
        if let Some(metadata) = job_metadata(&status)
            && self.ctx.runner_memory.job_metadata_due(
                &self.uid,
                &pod_uid,
                metadata.digest(),
                metadata.is_on(pod),
            )
            && !self.ended_meanwhile()
        {
            self.apply_job_metadata(&metadata, &pod_uid).await?;
        }
        match judge_pod(pod) {
            // Nothing to show yet: the identity waits for the first state worth a write (see `create_pod`).
            PodVerdict::Wait if starting_normally(pod) => {
                Ok(Action::requeue(self.ctx.options.resync_interval))
            }
            // No node for it: shown as Pending, with the identity.
            PodVerdict::Wait => {
                self.follow(
                    phase::PENDING,
                    false,
                    String::new(),
                    String::new(),
                    false,
                    identity,
                )
                .await
            }
            PodVerdict::Progress {
                phase,
                ready,
                reason,
                message,
            } => {
                let starting = starting_normally(pod);
                self.follow(&phase, ready, reason, message, starting, identity)
                    .await
            }
            // A pod read from the API server in this pass: its watch event brings the runner to the teardown lane.
            PodVerdict::Succeeded => Ok(Action::await_change()),
            PodVerdict::Outdated => self.mark_outdated(identity).await,
            PodVerdict::Failed(failure) => self.pod_failed(pod, failure, identity).await,
        }
    }

    /// Applies the job's labels and annotations to pod `uid`. The uid in the body makes the apply fail instead of
    /// creating a pod when that one is already gone (an apply creates what does not exist): a pass working from
    /// a cache a moment behind must not bring a finished runner's pod back. Repeating it while the cache has not
    /// caught up changes nothing (same content, same field manager).
    async fn apply_job_metadata(
        &self,
        metadata: &super::pod::JobMetadata,
        uid: &str,
    ) -> Result<()> {
        let patch = json!({
            "apiVersion": Pod::api_version(&()),
            "kind": Pod::kind(&()),
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
            Ok(_) => {
                self.ctx
                    .runner_memory
                    .applied_job_metadata(&self.uid, uid, metadata.digest());
                Ok(())
            }
            // Gone (404), or the name now belongs to another pod (409): its own pass labels that one.
            Err(error) if is_status(&error, 404) || is_status(&error, 409) => Ok(()),
            Err(source) => Err(Error::PatchObject {
                kind: Pod::kind(&()),
                what: "job metadata",
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            }),
        }
    }

    /// The runner is starting or running: mirror the pod, and now and then make sure the service still knows
    /// the runner (a zombie is replaced; docs/reference/beyond-arc.md, item 7). `starting_normally`: the pod has
    /// not run yet and waits on nothing ([`starting_normally`]).
    async fn follow(
        &self,
        pod_phase: &str,
        ready: bool,
        reason: String,
        message: String,
        starting_normally: bool,
        identity: Option<&JitIdentity>,
    ) -> Result<Action> {
        let status = self.status();
        // A pod starting as it should shows nothing an empty status does not: the first write waits for it to run
        // or to wait on something, and carries the identity (see `create_pod`).
        let starting = starting_normally
            && status.phase.is_empty()
            && pod_phase == phase::PENDING
            && !ready
            && reason.is_empty()
            && message.is_empty();
        if (status.phase != pod_phase || status.ready != ready)
            && !starting
            && !self.ended_meanwhile()
        {
            let mut patch = StatusPatch {
                phase: Some(RunnerPhase::of_pod(pod_phase)),
                ready: Some(ready),
                ..StatusPatch::default()
            };
            patch.explain(reason, message);
            if let Some(identity) = identity {
                self.record_identity(identity, &mut patch);
            }
            self.patch_status(&patch).await?;
        }
        let interval = self.ctx.options.runner.registration_check_interval;
        let idle_and_running = pod_phase == phase::RUNNING && ready && !status.has_job();
        if idle_and_running
            && let Some(identity) = identity
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

    /// The pod failed: a runner with a job is deleted; otherwise the JIT config is discarded (the runner may have
    /// consumed it), the failure recorded (counted or not) and the pod deleted, to be recreated after the backoff.
    async fn pod_failed(
        &self,
        pod: &CachedPod,
        failure: PodFailure,
        identity: Option<&JitIdentity>,
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
        if let Some(identity) = identity
            && self
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
        delete_if_present(&self.secrets, &self.name, &self.namespace).await?;
        let pod_uid = pod.uid().unwrap_or_default();
        let mut patch = StatusPatch {
            ready: Some(false),
            ..StatusPatch::default()
        };
        patch.explain(failure.reason.clone(), failure.message.clone());
        patch.forget_identity(self.status().runner_id);
        let delay = if failure.counted {
            patch.failures = Some([(pod_uid, Time(Timestamp::now()))].into());
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
        self.patch_status(&patch).await?;
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
        delete_if_present(&self.pods, &self.name, &self.namespace).await?;
        // The pod's deletion event brings the runner back; the backoff is read from the status then.
        Ok(Action::requeue(delay.max(Duration::from_secs(1))))
    }

    /// The uid of the runner's pod when the cache shows it terminated (`Succeeded` or `Failed`): nothing runs in
    /// it any more.
    fn terminated_pod(&self) -> Option<String> {
        self.cached_pod()
            .filter(|pod| matches!(super::policy::pod_phase(pod), "Succeeded" | "Failed"))
            .and_then(|pod| pod.uid())
    }

    /// Deletes the pod and the JIT Secret (done runners keep only the EphemeralRunner, for the set to count),
    /// both at once.
    async fn delete_children(&self) -> Result<()> {
        let terminated = self.terminated_pod();
        let pod = async {
            match &terminated {
                Some(uid) => {
                    delete_terminated_pod(&self.pods, &self.name, &self.namespace, uid).await
                }
                None => delete_if_present(&self.pods, &self.name, &self.namespace).await,
            }
        };
        let secret = delete_if_present(&self.secrets, &self.name, &self.namespace);
        futures::try_join!(pod, secret)?;
        Ok(())
    }

    /// Deletion (asked for here first when `delete`): deregister, delete the children, then drop both
    /// finalizers, which come off last, once everything they stand for is done.
    ///
    /// The steps that do not depend on each other run at once, so a finished runner's teardown waits for two
    /// round trips to the API server instead of four: the deletion request (the finalizers hold the object),
    /// the deregistration (which reads the Secret, then removes the Secret once the service let go), and, when
    /// the pod has terminated, its deletion. A pod that may still run is deleted only after the service agreed to
    /// the deregistration, which is the check that no job runs.
    async fn finalize(&self, delete: bool) -> Result<Action> {
        // A pass on a cached copy from before this runner's finalization: it is gone, and deleting its children
        // or patching it again would only cost the API server requests answered with 404.
        if !has_finalizer(self.runner, EPHEMERAL_RUNNER_FINALIZER)
            || self.ctx.runner_memory.was_finalized(&self.uid)
        {
            if delete {
                self.delete_self().await?;
            }
            return Ok(Action::await_change());
        }
        let terminated = self.terminated_pod();
        let delete_self = async {
            if delete {
                self.delete_self().await?;
            }
            Ok::<_, Error>(())
        };
        let deregister = async {
            let removal = if has_finalizer(self.runner, EPHEMERAL_RUNNER_REGISTRATION_FINALIZER) {
                self.deregister().await?
            } else {
                Removal::Removed
            };
            if removal == Removal::Removed {
                delete_if_present(&self.secrets, &self.name, &self.namespace).await?;
            }
            Ok::<_, Error>(removal)
        };
        let terminated_pod = async {
            if let Some(uid) = &terminated {
                delete_terminated_pod(&self.pods, &self.name, &self.namespace, uid).await?;
            }
            Ok::<_, Error>(())
        };
        let ((), removal, ()) = futures::try_join!(delete_self, deregister, terminated_pod)?;
        if removal == Removal::JobStillRunning {
            tracing::info!("the runner is still running a job; deregistration retried later");
            return Ok(Action::requeue(
                self.ctx.options.runner.job_still_running_requeue,
            ));
        }
        if terminated.is_none() {
            delete_if_present(&self.pods, &self.name, &self.namespace).await?;
        }
        if self.runner.has_container_hooks() {
            self.delete_hook_objects().await?;
        }
        // The runner's memory goes with its deletion event: a pass on a cache a moment behind may still finalize
        // it once more, and then need not ask the service again.
        remove_finalizers(&self.api, self.runner, &RUNNER_FINALIZERS).await?;
        // Finalizing follows a deletion request (the cached copy's or this pass's own): the object is gone now.
        self.ctx.runner_memory.finalized(&self.uid);
        Ok(Action::await_change())
    }

    /// Removes the runner's registrations: the one the status records and the one its JIT Secret records, when
    /// they differ (a later attempt's Secret made, then its status write failed: the status still names the
    /// earlier one), else one found by name (a crash between registering and recording). The Secret is read
    /// whatever the status says: it is the only record of a registration the status does not show.
    async fn deregister(&self) -> Result<Removal> {
        let recorded = self.status().runner_id;
        let in_secret = read_secret(&self.ctx.client, &self.namespace, &self.name)
            .await?
            .and_then(|secret| read_jit_identity(&secret).ok())
            .map_or(0, |identity| identity.runner_id);
        let mut ids: Vec<i64> = [recorded, in_secret]
            .into_iter()
            .filter(|&id| id != 0)
            .collect();
        ids.dedup();
        let pending: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|&id| !self.ctx.runner_memory.was_deregistered(&self.uid, id))
            .collect();
        if !ids.is_empty() && pending.is_empty() {
            return Ok(Removal::Removed);
        }
        let actions = match self.actions().await {
            Ok(actions) => actions,
            // Nothing can deregister without credentials; a runner that never registered needs nothing. Holding
            // the finalizer would only block the deletion of everything above (docs/reference/beyond-arc.md, item 13).
            Err(error)
                if credentials_gone(&error)
                    || (ids.is_empty() && error.is_configuration_problem()) =>
            {
                self.event(
                    EventType::Warning,
                    "DeregistrationSkipped",
                    "RemoveRunner",
                    format!("runner {recorded} cannot be removed from GitHub: {error}"),
                )
                .await;
                return Ok(Removal::Removed);
            }
            Err(error) => return Err(error),
        };
        let mut pending = pending;
        if ids.is_empty()
            && let Some(found) = actions.get_runner_by_name(&self.name).await?
            && found.runner_scale_set_id == self.runner.spec.runner_scale_set_id
        {
            pending.push(found.id);
        }
        for runner_id in pending {
            if actions.remove_runner(runner_id).await? == Removal::JobStillRunning {
                return Ok(Removal::JobStillRunning);
            }
            self.ctx.runner_memory.deregistered(&self.uid, runner_id);
        }
        Ok(Removal::Removed)
    }

    /// Pods and Secrets the runner's container hooks created (label `runner-pod=<runner name>`).
    async fn delete_hook_objects(&self) -> Result<()> {
        let selector = ListParams::default().labels(&format!("{RUNNER_POD_LABEL}={}", self.name));
        let read_error = |kind: Cow<'static, str>| {
            let namespace = self.namespace.clone();
            move |source| Error::ReadObjects {
                kind,
                namespace,
                source: Box::new(source),
            }
        };
        let pods = self
            .pods
            .list(&selector)
            .await
            .map_err(read_error(Pod::kind(&())))?;
        for pod in pods
            .items
            .iter()
            .filter(|pod| pod.meta().deletion_timestamp.is_none())
        {
            delete_if_present(&self.pods, &pod.name_any(), &self.namespace).await?;
        }
        let secrets = self
            .secrets
            .list(&selector)
            .await
            .map_err(read_error(Secret::kind(&())))?;
        for secret in secrets
            .items
            .iter()
            .filter(|secret| secret.meta().deletion_timestamp.is_none())
        {
            delete_if_present(&self.secrets, &secret.name_any(), &self.namespace).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_serialise_to_arcs_strings() {
        for (ours, arcs) in [
            (RunnerPhase::Pending, phase::PENDING),
            (RunnerPhase::Running, phase::RUNNING),
            (RunnerPhase::Failed, phase::FAILED),
            (RunnerPhase::Outdated, phase::OUTDATED),
            (RunnerPhase::Unknown, "Unknown"),
        ] {
            assert_eq!(serde_json::to_value(ours).unwrap(), json!(arcs));
        }
        assert_eq!(RunnerPhase::of_pod("Running"), RunnerPhase::Running);
        assert_eq!(RunnerPhase::of_pod(""), RunnerPhase::Pending);
    }

    #[test]
    fn the_teardown_lane_takes_deleted_runners_and_runners_whose_pod_succeeded() {
        let runner = |deleting: bool, phase: &str| -> EphemeralRunner {
            serde_json::from_value(json!({
                "metadata": {
                    "name": "r", "namespace": "ns",
                    "deletionTimestamp": deleting.then_some("2026-01-01T00:00:00Z"),
                },
                "spec": {
                    "githubConfigUrl": "https://github.com/org", "githubConfigSecret": "creds",
                    "runnerScaleSetId": 1, "metadata": {}, "spec": { "containers": [] },
                },
                "status": { "phase": phase },
            }))
            .unwrap()
        };
        let pod = |phase: &str, exit_code: i32| -> CachedPod {
            serde_json::from_value(json!({
                "metadata": { "name": "r", "namespace": "ns" },
                "status": {
                    "phase": phase,
                    "containerStatuses": [{
                        "name": RUNNER_CONTAINER_NAME, "image": "i", "imageID": "", "ready": false,
                        "restartCount": 0,
                        "state": { "terminated": { "exitCode": exit_code } },
                    }],
                },
            }))
            .unwrap()
        };
        let succeeded = pod("Succeeded", 0);
        let failed = pod("Failed", 1);
        assert!(in_teardown(&runner(true, phase::RUNNING), None));
        assert!(in_teardown(&runner(true, phase::FAILED), Some(&failed)));
        assert!(in_teardown(
            &runner(false, phase::RUNNING),
            Some(&succeeded)
        ));
        // Following, restarting and keeping done runners' places is the main lane's.
        assert!(!in_teardown(&runner(false, phase::RUNNING), None));
        assert!(!in_teardown(&runner(false, phase::RUNNING), Some(&failed)));
        assert!(!in_teardown(
            &runner(false, phase::FAILED),
            Some(&succeeded)
        ));
        // An idle runner that exited 0 as its pod was deleted or evicted: a pod taken away, the main lane's.
        let mut evicted = succeeded.clone();
        evicted.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1).unwrap()));
        assert!(!in_teardown(&runner(false, phase::RUNNING), Some(&evicted)));
        let mut busy = runner(false, phase::RUNNING);
        busy.status.as_mut().unwrap().job_id = "job".into();
        assert!(
            in_teardown(&busy, Some(&evicted)),
            "with a job, exit 0 finished it"
        );
    }

    #[test]
    fn status_patches_name_only_what_changes() {
        assert_eq!(
            serde_json::to_value(StatusPatch::default()).unwrap(),
            json!({})
        );
        let mut patch = StatusPatch {
            ready: Some(false),
            ..StatusPatch::default()
        };
        patch.forget_identity(0);
        patch.explain("PodDeleted".to_owned(), String::new());
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            json!({ "ready": false, "runnerId": null, "runnerName": null, "reason": "PodDeleted", "message": null })
        );
        assert!(matches!(
            patch.to_patch(&BTreeMap::new()).unwrap(),
            Patch::Merge(_)
        ));
    }

    #[test]
    fn leaving_a_registration_takes_its_job_and_holds_only_while_it_is_recorded() {
        let mut patch = StatusPatch {
            runner_id: Some(Some(8)),
            runner_name: Some(Some("arc-runner".to_owned())),
            ..StatusPatch::default()
        };
        patch.leave_registration(7);
        assert!(!patch.is_empty());
        let Patch::Json(ops) = patch.to_patch(&BTreeMap::new()).unwrap() else {
            panic!("a registration-guarded JSON patch");
        };
        let busy_under_7 = json!({"status": {"runnerId": 7, "runnerName": "arc-runner", "jobId": "j",
            "jobRequestId": 3, "jobRepositoryName": "o/r", "jobWorkflowRef": "o/r/w@main", "workflowRunId": 9,
            "jobDisplayName": "build"}});
        let mut doc = busy_under_7.clone();
        json_patch::patch(&mut doc, &ops).expect("the status records 7");
        assert_eq!(
            doc,
            json!({"status": {"runnerId": 8, "runnerName": "arc-runner"}})
        );
        let mut already_moved = json!({"status": {"runnerId": 8, "jobId": "k"}});
        assert!(
            json_patch::patch(&mut already_moved, &ops).is_err(),
            "a job of the next registration is not taken"
        );
        // A failure recorded with the leave joins those the status holds (a JSON patch replaces the map).
        let at = Time(Timestamp::now());
        let mut failed = StatusPatch {
            failures: Some([("pod-2".to_owned(), at.clone())].into()),
            ..StatusPatch::default()
        };
        failed.forget_identity(7);
        let held: BTreeMap<String, Time> = [("pod-1".to_owned(), at.clone())].into();
        let Patch::Json(ops) = failed.to_patch(&held).unwrap() else {
            panic!("a registration-guarded JSON patch");
        };
        let mut doc = json!({"status": {"runnerId": 7, "failures": held, "jobId": "j"}});
        json_patch::patch(&mut doc, &ops).expect("the status records 7");
        let failures = doc["status"]["failures"].as_object().expect("failures");
        assert_eq!(failures.len(), 2, "{doc}");
        assert!(doc["status"].get("jobId").is_none() && doc["status"].get("runnerId").is_none());
        // Nothing recorded: nothing to guard, and no job could have been written under a registration.
        let mut first = StatusPatch {
            runner_id: Some(Some(8)),
            ..StatusPatch::default()
        };
        first.leave_registration(0);
        assert!(matches!(
            first.to_patch(&BTreeMap::new()).unwrap(),
            Patch::Merge(_)
        ));
    }
}
