//! The teardown's last step for a runner owed a re-run of its job: asking GitHub once the job and its run have
//! finished ([`super::super::rerun`] decides), then dropping the finalizer that recorded the debt.

use std::time::Duration;

use actions_client::ErrorKind;
use crds::constants::{JOB_INTERRUPTED_ANNOTATION, JOB_RERUN_FINALIZER};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::super::rerun::{
    self, GiveUp, Interruption, RerunStep, after_listing_failed, after_request, before_asking,
    next_step, repository_of, rerun_limit,
};
use super::super::step::Step;
use crate::error::{Error, Result};

impl Step<'_> {
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
                let note = rerun::rerun_note(&status, cause, &self.objects.name);
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
        self.objects
            .remove_finalizers(self.runner, &[JOB_RERUN_FINALIZER])
            .await?;
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
            self.objects.name.as_str()
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
