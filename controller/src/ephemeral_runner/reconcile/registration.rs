//! Registering a runner (a JIT config stored in its Secret), and removing a registration whose config a
//! vanished pod may have consumed or whose pod is being taken away.

use super::*;

/// Outcome of a registration.
pub(super) enum Registration {
    Registered(JitIdentity),
    /// Registering without having read the Secret met a sign of one (its creation refused, or the name known to
    /// the service): nothing was left registered; read the Secret first.
    ReadSecretFirst,
    Wait(Action),
}

impl Step<'_> {
    /// The runner read from the API server in this pass; the lifecycle reads it before every step that needs it.
    pub(super) fn fresh<'f>(
        &self,
        fresh: Option<&'f EphemeralRunner>,
    ) -> Result<&'f EphemeralRunner> {
        fresh.ok_or_else(|| self.corrupt("no fresh copy of the runner before registering"))
    }

    /// Registers the runner and stores its JIT config in a new Secret; `fresh` is the runner as just read, and
    /// `secret_absent` says whether the API server said there is no Secret (else this is a first attempt, which
    /// learns of one from the refusal to create it).
    pub(super) async fn register(
        &self,
        fresh: &EphemeralRunner,
        secret_absent: bool,
    ) -> Result<Registration> {
        let actions = self.registrations().await?;
        let work_folder = fresh
            .spec
            .spec
            .containers
            .iter()
            .find(|container| container.name == RUNNER_CONTAINER_NAME)
            .and_then(|container| container.working_dir.clone())
            .unwrap_or_default();
        let jit = match actions
            .actions
            .generate_jit_config(
                self.runner.spec.runner_scale_set_id,
                &self.objects.name,
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
        let uid = &self.objects.uid;
        // Until the API server answers, what the Secret holds is not known here: a teardown then reads it.
        self.memory.forget_stored_config(uid);
        match self.objects.create_secret(&secret).await {
            Ok(created) => {
                let registered =
                    read_jit_identity(&created).map_err(|reason| self.corrupt(&reason))?;
                self.memory.stored_config(uid, registered.runner_id);
                // The runner may have been deleted while the service registered it (a template change, the set's
                // cleanup, `kubectl delete`); its teardown then found no Secret and no registration by name, and
                // may have finalized it. From now on its teardown finds the Secret; before, only this pass can
                // know: ask the API server again, and take the registration back if the runner is going.
                if self.objects.still_live().await? == RunnerFact::Going {
                    tracing::info!(
                        runner_id = registered.runner_id,
                        "the runner went while it registered; its registration is removed"
                    );
                    actions.remove(registered.runner_id).await?;
                    self.objects.delete_secret().await?;
                    return Ok(Registration::Wait(Action::await_change()));
                }
                Ok(Registration::Registered(registered))
            }
            Err(source) => {
                // The config just issued is stored nowhere: remove it rather than leave a registration behind.
                if let Some(runner) = &jit.runner
                    && let Err(error) = actions.remove(runner.id).await
                {
                    tracing::warn!(%error, "removing an unstored registration failed");
                }
                if !secret_absent
                    && classify_create_error(&source) == CreateRejection::AlreadyExists
                {
                    return Ok(Registration::ReadSecretFirst);
                }
                Err(self.objects.create_failed(Secret::kind(&()), source))
            }
        }
    }

    /// The service already has a runner with this name (a crash between registering and storing the config).
    pub(super) async fn resolve_name_clash(
        &self,
        actions: &Registrations<'_>,
    ) -> Result<Registration> {
        let name = &self.objects.name;
        let existing = actions
            .actions
            .get_runner_by_name(name)
            .await?
            .map(|existing| (existing.id, existing.runner_scale_set_id));
        Ok(Registration::Wait(
            match pod_steps::name_clash(name, self.runner.spec.runner_scale_set_id, existing) {
                NameClash::Retry => Action::requeue(SERVICE_RETRY),
                NameClash::RemoveEarlier(runner_id) => {
                    tracing::info!(
                        runner_id,
                        "removing a registration left by an earlier attempt"
                    );
                    match actions.remove(runner_id).await? {
                        Removal::Removed => Action::requeue(Duration::ZERO),
                        Removal::JobStillRunning => {
                            Action::requeue(self.ctx.options.runner.job_still_running_requeue)
                        }
                    }
                }
                NameClash::Taken(report) => self.leave(report).await?,
            },
        ))
    }

    /// Removes the runner's registration now (`identity`, else found by name) unless the service says the runner
    /// holds a job; returns what happened and the registration's id.
    pub(super) async fn deregister_idle(
        &self,
        identity: Option<&JitIdentity>,
    ) -> Result<(Removal, i64)> {
        self.registrations().await?.remove_idle(identity).await
    }

    /// An idle runner's pod was taken away and its registration removed: a Normal Event and the disruption metric
    /// (not a failure).
    pub(super) async fn report_pod_taken(&self, runner_id: i64, how: &str) {
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
    pub(super) async fn discard_config(
        &self,
        identity: Option<&JitIdentity>,
        secret_registration: i64,
    ) -> Result<Removal> {
        let registrations = self.registrations().await?;
        let (removal, runner_id) = registrations.remove_idle(identity).await?;
        if removal == Removal::JobStillRunning {
            return Ok(removal);
        }
        if secret_registration != 0
            && secret_registration != runner_id
            && registrations.remove(secret_registration).await? == Removal::JobStillRunning
        {
            return Ok(Removal::JobStillRunning);
        }
        self.objects.delete_secret().await?;
        let uid = &self.objects.uid;
        self.memory.forget_pod_identity(uid);
        if let Some(error) = self.memory.report_not_created(uid, runner_id) {
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
    pub(super) async fn release_idle(&self, identity: Option<&JitIdentity>) -> Result<Removal> {
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
}
