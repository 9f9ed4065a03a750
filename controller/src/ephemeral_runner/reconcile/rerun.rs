//! A busy runner that lost its pod: why, said on the runner, and when its set asks for it, the re-run of its job,
//! owed from then on by a finalizer and asked of GitHub by the teardown lane once the runner is torn down
//! ([`super::super::rerun`] decides).

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, ReplaceOperation, TestOperation};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::super::rerun::{
    self, GiveUp, Interruption, RerunStep, after_listing_failed, after_request, next_step,
    repository_of, rerun_limit, rerun_owed,
};
use super::*;
use actions_client::ErrorKind;
use crds::EphemeralRunnerSet;
use crds::constants::{JOB_INTERRUPTED_ANNOTATION, JOB_RERUN_FINALIZER};

impl Step<'_> {
    /// The runner's set as cached, when it is there and not being deleted.
    fn live_set(&self) -> Option<(OwnerReference, Arc<EphemeralRunnerSet>)> {
        let owner = self
            .runner
            .owner_references()
            .iter()
            .find(|owner| {
                owner.controller == Some(true) && owner.kind == EphemeralRunnerSet::kind(&())
            })?
            .clone();
        let set = self
            .ctx
            .stores
            .runner_sets
            .get(&ObjectRef::new(&owner.name).within(&self.namespace))
            .filter(|set| set.uid().as_deref() == Some(owner.uid.as_str()))
            .filter(|set| set.meta().deletion_timestamp.is_none())?;
        Some((owner, set))
    }

    /// The re-run limit the runner's set asks for, if it does.
    fn set_rerun_limit(&self) -> Option<i64> {
        self.live_set()
            .and_then(|(_, set)| rerun_limit(set.annotations()))
    }

    /// A runner holding a job lost its pod (`pod` as last seen, `None` when gone): the Event (`event_reason`) says
    /// why and which job, and when the set asks for re-runs and the cluster is to blame, the re-run is owed before
    /// the runner's deletion (no finalizer can be added after). `otherwise`: what happened to the pod when it was
    /// not the cluster's doing.
    pub(super) async fn finish_with_job(
        &self,
        pod: Option<&CachedPod>,
        event_reason: &str,
        otherwise: &str,
    ) -> Result<Action> {
        let status = self.status();
        let (seen, remembered) = (
            rerun::interruption(pod),
            self.memory.pod_interrupted(&self.uid),
        );
        let cause = rerun::more_telling(seen, remembered);
        tracing::info!(
            pod = pod.is_some(),
            ?seen,
            ?remembered,
            "a runner holding a job lost its pod"
        );
        let what = cause.map_or_else(
            || otherwise.to_owned(),
            |cause| format!("the runner pod {}", cause.what()),
        );
        let owed = rerun_owed(self.set_rerun_limit(), &status, cause);
        if let Some(cause) = owed {
            self.owe_rerun(cause).await?;
        }
        let job = describe_job(&status);
        let then = match (owed, cause) {
            (Some(_), _) => "GitHub is asked to re-run it once its run has finished",
            (None, Some(_)) => {
                "the job is left to GitHub (set rerunInterruptedJobs on the scale set to have it re-run)"
            }
            (None, None) => "the job is left to GitHub",
        };
        let note = format!("{what} while the runner ran {job}; the runner is finished and {then}");
        // Said on the runner too, where `kubectl describe` shows it for as long as the runner stays (its re-run
        // may hold it a while); not ready, as its pod is gone.
        let mut patch = StatusPatch {
            ready: Some(false),
            ..StatusPatch::default()
        };
        patch.explain(event_reason.to_owned(), note.clone());
        self.patch_status(&patch).await?;
        self.event(EventType::Warning, event_reason, "DeleteRunner", note)
            .await;
        self.delete_self().await?;
        Ok(Action::await_change())
    }

    /// Adds the re-run finalizer and the interruption's annotation in one patch, failing (the pass is retried) if
    /// the finalizers changed since the runner was read.
    async fn owe_rerun(&self, cause: Interruption) -> Result<()> {
        if has_finalizer(self.runner, JOB_RERUN_FINALIZER) {
            return Ok(());
        }
        let current = self.runner.finalizers().to_vec();
        let mut wanted = current.clone();
        wanted.push(JOB_RERUN_FINALIZER.to_owned());
        let path = |p: &str| p.parse::<PointerBuf>().unwrap_or_default();
        let finalizers = if current.is_empty() {
            PatchOperation::Add(AddOperation {
                path: path("/metadata/finalizers"),
                value: wanted.into(),
            })
        } else {
            PatchOperation::Replace(ReplaceOperation {
                path: path("/metadata/finalizers"),
                value: wanted.into(),
            })
        };
        let annotation = match self.runner.meta().annotations {
            Some(_) => AddOperation {
                path: PointerBuf::from_tokens([
                    "metadata",
                    "annotations",
                    JOB_INTERRUPTED_ANNOTATION,
                ]),
                value: cause.label().into(),
            },
            None => AddOperation {
                path: path("/metadata/annotations"),
                value: json!({ JOB_INTERRUPTED_ANNOTATION: cause.label() }),
            },
        };
        let operations = vec![
            PatchOperation::Test(TestOperation {
                path: path("/metadata/finalizers"),
                value: if current.is_empty() {
                    serde_json::Value::Null
                } else {
                    current.into()
                },
            }),
            finalizers,
            PatchOperation::Add(annotation),
        ];
        self.api
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Json::<()>(json_patch::Patch(operations)),
            )
            .await
            .map_err(|source| Error::PatchObject {
                kind: EphemeralRunner::kind(&()),
                what: "job re-run finalizer",
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            })?;
        Ok(())
    }

    /// The teardown's last step for a runner owed a re-run: asks GitHub once the job and its run have finished,
    /// and drops the finalizer once GitHub accepted, or the re-run is not needed or not possible, or the set is
    /// going, or it was waited for too long.
    pub(super) async fn settle_rerun(&self) -> Result<Action> {
        let policy = &self.ctx.options.runner;
        let status = self.status();
        let cause = self
            .runner
            .annotations()
            .get(JOB_INTERRUPTED_ANNOTATION)
            .and_then(|label| Interruption::parse(label))
            .unwrap_or(Interruption::Deleted);
        let waited = self
            .runner
            .meta()
            .deletion_timestamp
            .as_ref()
            .and_then(|since| Duration::try_from(Timestamp::now().duration_since(since.0)).ok())
            .unwrap_or_default();
        let set = self.live_set();
        let limit = set
            .as_ref()
            .and_then(|(_, set)| rerun_limit(set.annotations()));
        let step = match (&set, limit, repository_of(&status)) {
            (None, _, _) => abandoned("its scale set is being deleted".to_owned()),
            (Some(_), None, _) => abandoned("its scale set no longer asks for re-runs".to_owned()),
            (Some(_), Some(_), None) => {
                abandoned("the runner records no job repository".to_owned())
            }
            _ if waited > policy.job_rerun_wait => abandoned(format!(
                "its run did not finish within {}s",
                policy.job_rerun_wait.as_secs()
            )),
            (Some(_), Some(limit), Some(repository)) => {
                let actions = self.actions().await?;
                let runner_name = if status.runner_name.is_empty() {
                    self.name.as_str()
                } else {
                    status.runner_name.as_str()
                };
                match actions
                    .list_workflow_run_jobs(repository, status.workflow_run_id)
                    .await
                {
                    Ok(jobs) => match next_step(&jobs, runner_name, limit) {
                        RerunStep::Request(job_id) => after_request(
                            job_id,
                            &actions.rerun_workflow_job(repository, job_id).await?,
                        ),
                        other => other,
                    },
                    Err(Error::ListWorkflowRunJobs { source, .. })
                        if let Some(step) = after_listing_failed(
                            status.workflow_run_id,
                            source.status().map(|code| code.as_u16()),
                            source.is(ErrorKind::RateLimited),
                        ) =>
                    {
                        step
                    }
                    Err(error) => return Err(error),
                }
            }
        };
        let job = describe_job(&status);
        match step {
            RerunStep::Wait | RerunStep::Request(_) => {
                return Ok(Action::requeue(policy.job_rerun_retry));
            }
            RerunStep::Done => {
                self.ctx
                    .metrics
                    .job_reruns
                    .get_or_create(&self.reason_labels(cause.label()))
                    .inc();
                let note = format!(
                    "GitHub runs {job} again: its runner pod {} (runner {})",
                    cause.what(),
                    self.name
                );
                if let Some((owner, _)) = &set {
                    self.ctx
                        .publish(
                            &set_reference(owner, &self.namespace),
                            EventType::Normal,
                            "JobRerun",
                            "RerunJob",
                            note.clone(),
                        )
                        .await;
                }
                self.event(EventType::Normal, "JobRerun", "RerunJob", note)
                    .await;
            }
            RerunStep::GiveUp(GiveUp {
                warning,
                reason,
                note,
            }) => {
                let type_ = if warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                };
                self.event(type_, reason, "RerunJob", format!("{job}: {note}"))
                    .await;
            }
        }
        remove_finalizers(&self.api, self.runner, &[JOB_RERUN_FINALIZER]).await?;
        Ok(Action::await_change())
    }
}

fn abandoned(why: String) -> RerunStep {
    RerunStep::GiveUp(GiveUp {
        warning: true,
        reason: "JobRerunAbandoned",
        note: format!("the re-run is given up: {why}"),
    })
}

/// The runner's job as the listener recorded it, for Events.
fn describe_job(status: &crds::EphemeralRunnerStatus) -> String {
    let name = if status.job_display_name.is_empty() {
        status.job_id.as_str()
    } else {
        status.job_display_name.as_str()
    };
    let mut text = format!("job {name:?}");
    if status.workflow_run_id != 0 {
        text.push_str(&format!(" of run {}", status.workflow_run_id));
    }
    if !status.job_workflow_ref.is_empty() {
        text.push_str(&format!(" ({})", status.job_workflow_ref));
    }
    text
}

/// A reference to the runner's set for an Event, from its owner reference.
fn set_reference(owner: &OwnerReference, namespace: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(owner.api_version.clone()),
        kind: Some(owner.kind.clone()),
        name: Some(owner.name.clone()),
        namespace: Some(namespace.to_owned()),
        uid: Some(owner.uid.clone()),
        ..ObjectReference::default()
    }
}
