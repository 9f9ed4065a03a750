//! The teardown lane's pass: a runner being deleted, or whose pod succeeded, is deregistered, its pod and Secret
//! deleted and its finalizers dropped ([`super::lifecycle::plan_teardown`] decides the steps).

mod rerun;

use std::sync::Arc;
use std::time::Instant;

use crds::EphemeralRunner;
use crds::constants::{
    EPHEMERAL_RUNNER_FINALIZER, EPHEMERAL_RUNNER_REGISTRATION_FINALIZER, JOB_RERUN_FINALIZER,
};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::facts::{in_teardown, known_identity, may_have_left_with_job};
use super::lifecycle::{
    Teardown, TeardownEnd, TeardownFacts, after_deregistration, deregistration, plan_teardown,
    released_with_job,
};
use super::step::{RUNNER_FINALIZERS, Step};
use super::{RunnerContext, observe};
use crate::actions::{Removal, credentials_gone};
use crate::completions::{listing, owner_set_key};
use crate::error::{Error, Result};
use crate::kubeutil::has_finalizer;
use crate::metrics::teardown_stage;

/// The teardown lane's pass ([`super::run_teardown`]): a runner whose pod succeeded deletes itself, and a runner
/// being deleted is deregistered, its pod and Secret deleted and its finalizers dropped, in this one pass. Other
/// runners are the main lane's (`super::reconcile`).
#[tracing::instrument(skip(runner, lane), fields(runner = %runner.name_any(), namespace = runner.namespace().unwrap_or_default()))]
pub async fn teardown(runner: Arc<EphemeralRunner>, lane: Arc<RunnerContext>) -> Result<Action> {
    let (ctx, memory) = (lane.base.as_ref(), lane.memory.as_ref());
    let step = Step::new(&runner, ctx, memory, ctx.teardown_client.clone())?;
    let pod = step.cached_pod();
    if !in_teardown(&runner, pod.as_deref()) {
        return Ok(Action::await_change());
    }
    memory.tearing_down(&step.objects.uid);
    if let Some(waited) = memory.teardown_started(&step.objects.uid) {
        ctx.metrics.teardown(teardown_stage::WAITED, waited);
    }
    // A runner whose pod succeeded is deleted and finalized in this pass, rather than on the deletion's watch
    // event, which would only bring it back here.
    let delete = runner.meta().deletion_timestamp.is_none();
    if delete && let Some(set) = owner_set_key(&runner) {
        // It ran its job: its set keeps its place until the listener's target leaves the job out, also when the
        // listener's record of the job never reached the runner (a job shorter than that write).
        let registration = known_identity(memory, &runner, pod.as_deref())
            .map_or(0, |identity| identity.runner_id);
        if may_have_left_with_job(memory, &step.objects.uid, registration) {
            ctx.completions.left(&set, &step.objects.name, registration);
        }
    }
    step.finalize(delete).await
}

impl Step<'_> {
    /// `request`, its time recorded as teardown `stage` when it succeeds (docs/metrics.md,
    /// `gha_controller_runner_teardown_seconds`).
    async fn timed<T>(
        &self,
        stage: &'static str,
        request: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let started = Instant::now();
        let outcome = request.await?;
        self.ctx.metrics.teardown(stage, started.elapsed());
        Ok(outcome)
    }

    /// The teardown ([`super::lifecycle::plan_teardown`]): the requests that depend on nothing at once (the deletion
    /// request, the deregistration and then the Secret's deletion, a terminated pod's deletion), then what
    /// waited for the service's answer, then both finalizers, last, once everything they stand for is done.
    pub(super) async fn finalize(&self, delete: bool) -> Result<Action> {
        let pass = Instant::now();
        // The pod as the cache shows it now, read once for the plan and for its deletion.
        let terminated = self.terminated_pod();
        let gone = self.memory.was_finalized(&self.objects.uid);
        let facts = TeardownFacts {
            deleting: !delete,
            // A pass on a cached copy from before this runner's finalization: deleting its children or patching
            // it again would only cost the API server requests answered with 404.
            finalized: !has_finalizer(self.runner, EPHEMERAL_RUNNER_FINALIZER) || gone,
            gone,
            registration_finalizer: has_finalizer(
                self.runner,
                EPHEMERAL_RUNNER_REGISTRATION_FINALIZER,
            ),
            pod_terminated: terminated.is_some(),
            container_hooks: self.runner.has_container_hooks(),
            rerun_owed: has_finalizer(self.runner, JOB_RERUN_FINALIZER)
                && !has_finalizer(self.runner, EPHEMERAL_RUNNER_FINALIZER)
                && !has_finalizer(self.runner, EPHEMERAL_RUNNER_REGISTRATION_FINALIZER),
        };
        let start = match plan_teardown(&facts) {
            Teardown::Rerun => return self.settle_rerun().await,
            Teardown::Gone { delete_self } => {
                if delete_self {
                    self.objects.delete_self().await?;
                }
                return Ok(Action::await_change());
            }
            Teardown::Start(start) => start,
        };
        let deregister = async {
            if start.deregister {
                self.timed(teardown_stage::DEREGISTER, self.deregister())
                    .await
            } else {
                Ok(Removal::Removed)
            }
        };
        let terminated_pod = async {
            if start.delete_terminated_pod && terminated.is_some() {
                self.timed(
                    teardown_stage::DELETE_CHILDREN,
                    self.objects.delete_pod(terminated.as_deref()),
                )
                .await?;
            }
            Ok::<_, Error>(())
        };
        let (removal, ()) = futures::try_join!(deregister, terminated_pod)?;
        match after_deregistration(&facts, removal == Removal::Removed) {
            TeardownEnd::AwaitJob => {
                tracing::info!("the runner is still running a job; deregistration retried later");
                Ok(Action::requeue(
                    self.ctx.options.runner.job_still_running_requeue,
                ))
            }
            TeardownEnd::Finish {
                delete_self,
                delete_pod,
                delete_hook_objects,
            } => {
                // Objects the runner does not own (its container hooks' pods and Secrets) go before the
                // finalizers, as nothing else would delete them later.
                if delete_hook_objects {
                    self.objects.delete_hook_objects().await?;
                }
                // Its deletion is sent first; both it and the finalizers' removal are needed for the runner to
                // go, whichever the API server takes first ([`TeardownEnd::Finish`]). Sent one after the other,
                // they would save the API server one write of the runner but double the pass, and the teardown
                // workers fall behind a wave of finished runners (docs/benchmarks.md, "Teardown").
                let metrics = &self.ctx.metrics;
                let runner = async {
                    if delete_self {
                        metrics.runner_watch.sent(&self.objects.uid);
                        self.timed(teardown_stage::DELETE_RUNNER, self.objects.delete_self())
                            .await?;
                    }
                    Ok::<_, Error>(())
                };
                // The pod and the Secret are the runner's own (owner references): their deletes go out beside the
                // finalizers' removal, one round trip less on a finished runner's way out, and should one fail,
                // the garbage collector deletes it with the runner.
                let pod = async {
                    if delete_pod {
                        if let Some(pod) = terminated.as_deref() {
                            metrics.pod_watch.sent(pod);
                        }
                        let delete = self.objects.delete_pod(terminated.as_deref());
                        self.timed(teardown_stage::DELETE_CHILDREN, delete).await?;
                    }
                    Ok::<_, Error>(())
                };
                // The runner's memory goes with its deletion event: a pass on a cache a moment behind may still
                // finalize it once more, and then need not ask the service again.
                let finalizers = self.timed(
                    teardown_stage::FINALIZERS,
                    self.objects
                        .remove_finalizers(self.runner, &RUNNER_FINALIZERS),
                );
                let secret = self.timed(
                    teardown_stage::DELETE_CHILDREN,
                    self.objects.delete_secret(),
                );
                futures::try_join!(runner, pod, secret, finalizers)?;
                // Finalized after a deletion request (the cached copy's or this pass's own): it is gone now.
                self.memory.finalized(&self.objects.uid);
                self.ctx
                    .metrics
                    .teardown(teardown_stage::PASS, pass.elapsed());
                Ok(Action::await_change())
            }
        }
    }

    /// Removes the runner's registrations ([`super::lifecycle::deregistration`]): the status's and the JIT
    /// Secret's (read whatever the status says: it is the only record of a registration the status does not
    /// show), else one found by name. The Secret stays until they are gone: its record may be the only one.
    ///
    /// The status's registration is removed while the Secret is read, one round trip less on a finished runner's
    /// way out (docs/metrics.md, the `deregister` stage); a registration only the Secret records goes after.
    pub(super) async fn deregister(&self) -> Result<Removal> {
        let (uid, recorded) = (&self.objects.uid, self.status().runner_id);
        if recorded == 0 || self.removed_already(recorded) {
            return self.deregister_in_turn(recorded).await;
        }
        let Ok(registrations) = self.registrations().await else {
            return self.deregister_in_turn(recorded).await;
        };
        let (in_secret, removal) = futures::try_join!(
            self.secret_registration(recorded),
            registrations.remove(recorded)
        )?;
        if removal == Removal::JobStillRunning {
            return Ok(removal);
        }
        let plan = deregistration(recorded, in_secret, |id| {
            self.memory.was_deregistered(uid, id)
        });
        registrations.remove_all(plan.remove).await
    }

    /// Whether registration `id` is gone without asking: this process removed it, or the service did as the job
    /// that ran on it completed ([`released_with_job`]): one call to GitHub fewer per finished runner, and one
    /// round trip fewer between its exit and its deletion.
    fn removed_already(&self, id: i64) -> bool {
        if self.memory.was_deregistered(&self.objects.uid, id) {
            return true;
        }
        let Some(status) = self.runner.status.as_ref().filter(|s| s.runner_id == id) else {
            return false;
        };
        observe::owner_set(self.runner, &self.ctx.stores).is_some_and(|set| {
            released_with_job(
                &self.objects.name,
                id,
                status.has_job(),
                &listing(set.annotations()),
            )
        })
    }

    /// [`Step::deregister`] one step after the other: the Secret read, then the registrations removed. For a
    /// runner whose status records no registration (or one removed already), or whose service client cannot be
    /// made.
    async fn deregister_in_turn(&self, recorded: i64) -> Result<Removal> {
        let in_secret = self.secret_registration(recorded).await?;
        let plan = deregistration(recorded, in_secret, |id| self.removed_already(id));
        if plan.remove.is_empty() && !plan.look_up_by_name {
            return Ok(Removal::Removed);
        }
        let registrations = match self.registrations().await {
            Ok(registrations) => registrations,
            // Nothing can deregister without credentials; a runner that never registered needs nothing. Holding
            // the finalizer would only block the deletion of everything above (docs/reference/beyond-arc.md, item 13).
            Err(error)
                if credentials_gone(&error)
                    || (plan.look_up_by_name && error.is_configuration_problem()) =>
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
        let mut remove = plan.remove;
        if plan.look_up_by_name {
            remove.extend(registrations.by_name().await?);
        }
        registrations.remove_all(remove).await
    }

    /// The registration the JIT Secret records (0: no Secret, or none readable in it): `recorded`, the status's,
    /// without a request when this process stored that very registration's config in the Secret last (every Secret
    /// of a runner is made by this controller; after a restart it reads), else from the API server. One request
    /// fewer on nearly every finished runner's way out.
    async fn secret_registration(&self, recorded: i64) -> Result<i64> {
        if recorded != 0 && self.memory.stored_config_of(&self.objects.uid) == Some(recorded) {
            return Ok(recorded);
        }
        self.objects.secret_registration().await
    }
}
