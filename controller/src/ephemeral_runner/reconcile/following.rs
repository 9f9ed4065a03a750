//! Following a runner's pod: mirroring its state, the job's metadata, the registration check, and the ends of a
//! pod other than success (failures, disruptions, a pod lost under a job, a stuck deletion, retries exhausted).

use super::*;

impl Step<'_> {
    pub(super) async fn handle_pod(
        &self,
        pod: &CachedPod,
        identity: Option<&JitIdentity>,
    ) -> Result<Action> {
        let pod_uid = pod.uid().unwrap_or_default();
        let status = self.status();
        let next = pod_steps::on_pod(&status, pod);
        if next == OnPod::AlreadyFailed {
            self.objects.delete_pod(None).await?;
            return Ok(Action::requeue(self.ctx.options.resync_interval));
        }
        if let Some(metadata) = job_metadata(&status)
            && self.memory.job_metadata_due(
                &self.objects.uid,
                &pod_uid,
                metadata.digest(),
                metadata.is_on(pod),
            )
            && !self.ended_meanwhile()
        {
            self.apply_job_metadata(&metadata, &pod_uid).await?;
        }
        match next {
            OnPod::AlreadyFailed | OnPod::Wait => {
                Ok(Action::requeue(self.ctx.options.resync_interval))
            }
            OnPod::Follow {
                phase,
                ready,
                reason,
                message,
                starting_normally,
            } => {
                self.follow(&Following {
                    status: &status,
                    pod_phase: &phase,
                    ready,
                    reason,
                    message,
                    starting_normally,
                    identity,
                })
                .await
            }
            // Its watch event brings the runner to the teardown lane.
            OnPod::Succeeded => Ok(Action::await_change()),
            OnPod::Outdated => self.mark_outdated(identity).await,
            OnPod::Failed(failure) => self.pod_failed(pod, failure, identity).await,
        }
    }

    /// Applies the job's labels and annotations to pod `pod_uid` ([`RunnerObjects::apply_job_metadata`]). A
    /// namespace that grants no pod patch counts as applied, so this pod is not asked again (docs/security.md).
    pub(super) async fn apply_job_metadata(
        &self,
        metadata: &super::super::pod::JobMetadata,
        pod_uid: &str,
    ) -> Result<()> {
        if self.objects.apply_job_metadata(metadata, pod_uid).await? != MetadataApplied::PodGone {
            self.memory
                .applied_job_metadata(&self.objects.uid, pod_uid, metadata.digest());
        }
        Ok(())
    }

    /// The runner is starting or running: mirror the pod, and now and then make sure the service still knows
    /// the runner (a zombie is replaced; docs/reference/beyond-arc.md, item 7). [`pod_steps::follow`] decides.
    pub(super) async fn follow(&self, seen: &Following<'_>) -> Result<Action> {
        let options = &self.ctx.options;
        let plan = pod_steps::follow(
            seen,
            || self.view_version(),
            options.runner.registration_check_interval,
            options.resync_interval,
        );
        if let Some(patch) = &plan.mirror
            && !self.ended_meanwhile()
        {
            self.patch_status(patch).await?;
        }
        if let Some(runner_id) = plan.check_registration
            && let Some(action) = self.check_registration(runner_id, plan.requeue).await?
        {
            return Ok(action);
        }
        Ok(Action::requeue(plan.requeue))
    }

    /// Asks the service whether it still knows registration `runner_id` of this idle running runner, when the check
    /// is due ([`pod_steps::registration_check_due`]); a runner it has forgotten is suspected first and replaced as
    /// a zombie only once the confirmation passed ([`pod_steps::after_registration_check`]). `Some` ends the pass;
    /// `requeue` is the follow's own.
    async fn check_registration(
        &self,
        runner_id: i64,
        requeue: Duration,
    ) -> Result<Option<Action>> {
        let interval = self.ctx.options.runner.registration_check_interval;
        let confirmation = pod_steps::zombie_confirmation(interval);
        let uid = &self.objects.uid;
        let suspected = self.memory.zombie_suspected_for(uid);
        let due = pod_steps::registration_check_due(
            suspected,
            || self.memory.registration_check_due(uid, interval),
            confirmation,
        );
        match due {
            Err(wait) => return Ok(Some(Action::requeue(wait.min(requeue)))),
            Ok(false) => return Ok(None),
            Ok(true) => {}
        }
        let found = match self.actions().await?.get_runner(runner_id).await {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(%error, "checking the runner registration failed");
                return Ok(None);
            }
        };
        match pod_steps::after_registration_check(found.is_some(), suspected, confirmation) {
            AfterCheck::Known => {
                self.memory.clear_zombie_suspicion(uid);
                Ok(None)
            }
            AfterCheck::Suspect(wait) => {
                self.memory.suspect_zombie(uid);
                Ok(Some(Action::requeue(wait.min(requeue))))
            }
            AfterCheck::Zombie => {
                self.ctx
                    .metrics
                    .zombie_runners
                    .get_or_create(&self.scale_set())
                    .inc();
                self.leave(pod_steps::zombie(runner_id)).await.map(Some)
            }
        }
    }

    /// The pod failed: [`pod_steps::pod_failed`] decides; a runner with a job is finished, any other gets a new pod
    /// after its backoff, its JIT config discarded (the runner may have consumed it).
    pub(super) async fn pod_failed(
        &self,
        pod: &CachedPod,
        failure: PodFailure,
        identity: Option<&JitIdentity>,
    ) -> Result<Action> {
        let disruptions = self
            .memory
            .last_disruption(&self.objects.uid)
            .map_or(0, |(count, _)| count);
        let plan = pod_steps::pod_failed(
            &self.status(),
            &failure,
            identity,
            &pod.uid().unwrap_or_default(),
            Timestamp::now(),
            disruptions,
            &self.ctx.options.runner,
        );
        let restart = match plan {
            PodFailed::FinishWithJob(report) => {
                return self
                    .finish_with_job(Some(pod), report.reason, &report.note)
                    .await;
            }
            PodFailed::Restart(restart) => *restart,
        };
        if let Some(runner_id) = restart.deregister
            && self.registrations().await?.remove(runner_id).await? == Removal::JobStillRunning
        {
            // The service gave it a job the listener has not reported yet: never restart such a runner.
            self.objects.delete_self().await?;
            return Ok(Action::await_change());
        }
        self.objects.delete_secret().await?;
        let labels = self.reason_labels(failure.class);
        if restart.counted {
            self.ctx.metrics.pod_failures.get_or_create(&labels).inc();
        } else {
            self.memory.disrupted(&self.objects.uid);
            self.ctx
                .metrics
                .pod_disruptions
                .get_or_create(&labels)
                .inc();
        }
        self.patch_status(&restart.patch).await?;
        self.report(restart.report).await;
        self.objects.delete_pod(None).await?;
        // The pod's deletion event brings the runner back; the backoff is read from the status then.
        Ok(Action::requeue(restart.delay))
    }

    pub(super) async fn mark_outdated(&self, identity: Option<&JitIdentity>) -> Result<Action> {
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
        self.settle(&patch, identity).await
    }

    /// The runner had a job and lost its pod (`pod` as the pass last saw it): deleting the runner finishes it (its
    /// finalizer deregisters it once the service lets go of the job, which it fails or retries).
    pub(super) async fn finish_interrupted(&self, pod: Option<&CachedPod>) -> Result<Action> {
        self.ctx
            .metrics
            .pod_disruptions
            .get_or_create(&self.reason_labels("pod_deleted_with_job"))
            .inc();
        self.finish_with_job(
            pod,
            POD_DELETED_EVENT,
            "the runner pod was deleted or evicted",
        )
        .await
    }
}
