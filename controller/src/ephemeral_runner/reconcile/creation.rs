//! Creating a runner's pod from the config made in the same pass, and what a refusal or an invalid pod leads to.

use super::*;

impl Step<'_> {
    /// The runner pod made from `fresh` (the runner as just read), or why it cannot be built (the runner is then
    /// marked Failed).
    pub(super) fn build_pod(
        &self,
        fresh: &EphemeralRunner,
    ) -> Result<std::result::Result<Pod, String>> {
        let owner = controller_ref(self.runner)?;
        Ok(desired_pod(fresh, owner, &self.ctx.options.build_version)
            .map_err(|problem| format!("Failed to create the pod: {problem}")))
    }

    /// After a refusal, the next pod is created in dry-run mode first: nothing is registered until the cluster
    /// would admit it. `Some` ends the pass.
    pub(super) async fn dry_run_pod(&self, fresh: &EphemeralRunner) -> Result<Option<Action>> {
        let pod = match self.build_pod(fresh)? {
            Ok(pod) => pod,
            Err(message) => {
                return self
                    .mark_failed(reason::INVALID_POD, message, None)
                    .await
                    .map(Some);
            }
        };
        match self.objects.create_pod(&pod, true).await {
            Ok(_) => Ok(None),
            Err(error) => self.creation_refused(error, None, false).await.map(Some),
        }
    }

    pub(super) async fn create_pod(
        &self,
        fresh: &EphemeralRunner,
        identity: &JitIdentity,
    ) -> Result<Action> {
        let pod = match self.build_pod(fresh)? {
            Ok(pod) => pod,
            Err(message) => {
                return self
                    .mark_failed(reason::INVALID_POD, message, Some(identity))
                    .await;
            }
        };
        let before = pod_steps::before_pod(&self.status(), identity, || self.view_version());
        let recorded_before_pod = before.is_some();
        if let Some(patch) = &before {
            self.patch_status(patch).await?;
        }
        match self.objects.create_pod(&pod, false).await {
            Ok(created) => {
                let uid = &self.objects.uid;
                self.memory.created_pod(uid);
                self.memory.pod_runs_under(
                    uid,
                    &created.uid().unwrap_or_default(),
                    identity.runner_id,
                    &identity.runner_name,
                );
                Ok(Action::requeue(self.ctx.options.resync_interval))
            }
            Err(error) if classify_create_error(&error) == CreateRejection::AlreadyExists => {
                // A pod of that name exists after all (made from an earlier config, which the Secret just created
                // replaced): follow it; once it is gone, the new config is discarded as any other.
                match self.objects.read_pod().await? {
                    Some(pod) => self.handle_pod(&pod, Some(identity)).await,
                    None => Err(self.objects.create_failed(Pod::kind(&()), error)),
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
    pub(super) async fn creation_refused(
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
                    let uid = &self.objects.uid;
                    self.memory
                        .pod_not_created(uid, identity.runner_id, error.to_string());
                }
                return Err(self.objects.create_failed(Pod::kind(&()), error));
            }
        };
        if let Some(identity) = identity {
            self.registrations()
                .await?
                .remove(identity.runner_id)
                .await?;
            self.objects.delete_secret().await?;
        }
        let recorded_now = identity
            .filter(|_| recorded)
            .map(|identity| identity.runner_id);
        self.pod_rejected(class, message, recorded_now).await
    }

    pub(super) fn count_rejection(&self, reason: &'static str) {
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
    pub(super) async fn pod_rejected(
        &self,
        class: &'static str,
        message: String,
        recorded_now: Option<i64>,
    ) -> Result<Action> {
        self.count_rejection(class);
        let (patch, report) = pod_steps::pod_rejected(&self.status(), &message, recorded_now);
        if let Some(report) = report {
            self.report(report).await;
        }
        self.patch_status(&patch).await?;
        Ok(Action::requeue(self.ctx.options.runner.pod_rejection_retry))
    }

    /// Marks the runner Failed and deregisters it; it keeps its place in the set for inspection, until the set's
    /// template changes.
    pub(super) async fn mark_failed(
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
        self.settle(&patch, identity).await
    }

    /// Writes a terminal status (`Failed`, `Outdated`) and deregisters the runner: it keeps its place until the
    /// set removes it, and nothing brings it back before.
    pub(super) async fn settle(
        &self,
        patch: &StatusPatch,
        identity: Option<&JitIdentity>,
    ) -> Result<Action> {
        self.patch_status(patch).await?;
        if let Some(identity) = identity {
            self.registrations()
                .await?
                .remove(identity.runner_id)
                .await?;
        }
        Ok(Action::await_change())
    }
}
