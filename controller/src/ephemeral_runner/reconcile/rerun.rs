//! A busy runner that lost its pod: why, said on the runner, and when its set asks for it, the re-run of its job,
//! owed from then on by a finalizer and asked of GitHub by the teardown lane once the runner is torn down
//! ([`super::super::rerun`] decides).

use super::super::rerun::{
    self, GiveUp, Interruption, RerunStep, after_listing_failed, after_request, before_asking,
    next_step, repository_of, rerun_limit, rerun_owed,
};
use super::*;
use crate::kubeutil::add_finalizer_with_annotation;
use actions_client::ErrorKind;
use crds::EphemeralRunnerSet;
use crds::constants::{JOB_INTERRUPTED_ANNOTATION, JOB_RERUN_FINALIZER};

impl Step<'_> {
    /// The runner's set as cached, when it is there and not being deleted.
    fn live_set(&self) -> Option<Arc<EphemeralRunnerSet>> {
        observe::owner_set(self.runner, &self.ctx.stores)
            .filter(|set| set.meta().deletion_timestamp.is_none())
    }

    /// A runner holding a job lost its pod (`pod` as last seen, `None` when gone): the Event (`event_reason`) says
    /// why and which job, and when the set asks for re-runs and the cluster is to blame, the re-run is owed before
    /// the runner's deletion (no finalizer can be added after). `otherwise`: what happened to the pod when it was
    /// not the cluster's doing.
    pub(super) async fn finish_with_job(
        &self,
        pod: Option<&CachedPod>,
        event_reason: &'static str,
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
        let limit = self
            .live_set()
            .and_then(|set| rerun_limit(set.annotations()));
        let owed = rerun_owed(limit, &status, cause);
        if let Some(cause) = owed {
            self.owe_rerun(cause).await?;
        }
        let (patch, report) =
            rerun::finished_with_job(&status, event_reason, cause, otherwise, owed.is_some());
        self.patch_status(&patch).await?;
        self.leave(report).await
    }

    /// Adds the re-run finalizer and the interruption's annotation in one patch, failing (the pass is retried) if
    /// the finalizers changed since the runner was read.
    async fn owe_rerun(&self, cause: Interruption) -> Result<()> {
        add_finalizer_with_annotation(
            &self.api,
            self.runner,
            JOB_RERUN_FINALIZER,
            JOB_INTERRUPTED_ANNOTATION,
            cause.label(),
        )
        .await
        .map(drop)
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
        let limit = set.as_ref().and_then(|set| rerun_limit(set.annotations()));
        let repository = repository_of(&status);
        let step = match before_asking(
            set.is_some(),
            limit,
            repository,
            waited,
            policy.job_rerun_wait,
        ) {
            Some(step) => step,
            None => {
                self.ask_github(
                    repository.unwrap_or_default(),
                    status.workflow_run_id,
                    &status.runner_name,
                    limit.unwrap_or(1),
                )
                .await?
            }
        };
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
                let note = rerun::rerun_note(&status, cause, &self.name);
                if let Some(set) = &set {
                    self.ctx
                        .publish(
                            &set.object_ref(&()),
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
                self.event(
                    type_,
                    reason,
                    "RerunJob",
                    format!("{}: {note}", rerun::describe_job(&status)),
                )
                .await;
            }
        }
        remove_finalizers(&self.api, self.runner, &[JOB_RERUN_FINALIZER]).await?;
        Ok(Action::await_change())
    }
    /// Looks up the job that ran on this runner (`runner_name`, the object's name when empty) among every attempt of
    /// run `run_id`, and asks for its re-run when [`next_step`] says so.
    async fn ask_github(
        &self,
        repository: &str,
        run_id: i64,
        runner_name: &str,
        limit: i64,
    ) -> Result<RerunStep> {
        let actions = self.actions().await?;
        let runner_name = if runner_name.is_empty() {
            self.name.as_str()
        } else {
            runner_name
        };
        let jobs = match actions.list_workflow_run_jobs(repository, run_id).await {
            Ok(jobs) => jobs,
            Err(Error::ListWorkflowRunJobs { source, .. })
                if let Some(step) = after_listing_failed(
                    run_id,
                    source.status().map(|code| code.as_u16()),
                    source.is(ErrorKind::RateLimited),
                ) =>
            {
                return Ok(step);
            }
            Err(error) => return Err(error),
        };
        Ok(match next_step(&jobs, runner_name, limit) {
            RerunStep::Request(job_id) => after_request(
                job_id,
                &actions.rerun_workflow_job(repository, job_id).await?,
            ),
            other => other,
        })
    }
}
