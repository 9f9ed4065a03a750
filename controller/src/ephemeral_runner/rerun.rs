//! Jobs the cluster interrupted, run again (docs/runner-lifecycle.md, "Jobs the cluster interrupted run again"),
//! as pure functions: why a busy runner's job ended with its pod ([`interruption`]), whether a re-run is owed
//! ([`rerun_owed`]), and what a pass does with what GitHub shows of the job's run ([`next_step`],
//! [`after_request`]). The executors are `reconcile/rerun.rs` (the debt) and `teardown/rerun.rs` (the request).
//!
//! Only the cluster's doing counts: a job that failed on its own leaves its runner to exit, never to lose its pod,
//! and a runner container that crashed may have been killed by its own job; neither is re-run.

use std::collections::BTreeMap;

use actions_client::{RerunOutcome, WorkflowJob};
use crds::EphemeralRunnerStatus;
use crds::constants::{RERUN_INTERRUPTED_JOBS_ANNOTATION, RUNNER_CONTAINER_NAME};

use super::pod_steps::Report;
use super::policy::disruption_class;
use super::status_patch::StatusPatch;
use crate::pods::CachedPod;

/// How the cluster ended a busy runner's pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interruption {
    /// The runner container was killed for exceeding its memory limit.
    OomKilled,
    /// Evicted (node pressure, the Eviction API) or preempted.
    Evicted,
    /// Deleted through the API (`kubectl delete pod`, a controller), or gone without a trace.
    Deleted,
    /// Its node went away (shut down, lost, its pods garbage-collected).
    NodeLost,
}

impl Interruption {
    const ALL: [Self; 4] = [
        Self::OomKilled,
        Self::Evicted,
        Self::Deleted,
        Self::NodeLost,
    ];

    /// The metric reason and the value of [`crds::constants::JOB_INTERRUPTED_ANNOTATION`].
    pub fn label(self) -> &'static str {
        match self {
            Self::OomKilled => "oom_killed",
            Self::Evicted => "evicted",
            Self::Deleted => "deleted",
            Self::NodeLost => "node_lost",
        }
    }

    /// The interruption a [`Interruption::label`] names.
    pub fn parse(label: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|interruption| interruption.label() == label)
    }

    /// What happened to the pod, for Events and the runner's status message.
    pub fn what(self) -> &'static str {
        match self {
            Self::OomKilled => "was OOM-killed",
            Self::Evicted => "was evicted",
            Self::Deleted => "was deleted",
            Self::NodeLost => "lost its node",
        }
    }
}

fn oom_killed(pod: &CachedPod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter(|status| status.name == RUNNER_CONTAINER_NAME)
        .filter_map(|status| status.state.as_ref()?.terminated.as_ref())
        .any(|terminated| terminated.reason.as_deref() == Some("OOMKilled"))
}

/// Why a busy runner's job ended with its pod, `pod` as last seen (`None`: gone before it was seen ending).
/// `None` when the pod ended on its own: its runner container failed, which its job may have caused.
pub fn interruption(pod: Option<&CachedPod>) -> Option<Interruption> {
    let Some(pod) = pod else {
        return Some(Interruption::Deleted);
    };
    if oom_killed(pod) {
        return Some(Interruption::OomKilled);
    }
    match disruption_class(pod) {
        Some("evicted" | "preempted") => Some(Interruption::Evicted),
        Some("node_lost") => Some(Interruption::NodeLost),
        // A pod the node refused never ran a job; the runner's record of one is the listener's, not the pod's.
        Some("node_rejected") => None,
        Some(_) => Some(Interruption::Deleted),
        None if pod.metadata.deletion_timestamp.is_some() => Some(Interruption::Deleted),
        None => None,
    }
}

/// The more telling of how a pass sees a job interrupted (`now`) and how the pod watch saw it before (`before`): a
/// pod seen evicted and then gone was evicted, not deleted; otherwise what the pass sees.
pub fn more_telling(
    now: Option<Interruption>,
    before: Option<Interruption>,
) -> Option<Interruption> {
    match (now, before) {
        (Some(Interruption::Deleted), Some(earlier)) => Some(earlier),
        (now, _) => now,
    }
}

/// The re-run limit the runner's set asks for ([`RERUN_INTERRUPTED_JOBS_ANNOTATION`]); `None`: no re-runs.
pub fn rerun_limit(set_annotations: &BTreeMap<String, String>) -> Option<i64> {
    set_annotations
        .get(RERUN_INTERRUPTED_JOBS_ANNOTATION)?
        .parse::<i64>()
        .ok()
        .filter(|limit| *limit > 0)
}

/// Whether the job of a runner whose status is `status`, interrupted by `cause`, is owed a re-run: its set asks
/// for re-runs (`limit`), the cluster ended it, and the listener recorded its run and repository (without them
/// GitHub cannot be asked).
pub fn rerun_owed(
    limit: Option<i64>,
    status: &EphemeralRunnerStatus,
    cause: Option<Interruption>,
) -> Option<Interruption> {
    let known_run = status.workflow_run_id != 0 && repository_of(status).is_some();
    limit.and(cause).filter(|_| known_run && status.has_job())
}

/// The `owner/repo` of the runner's job, when the listener recorded one of that form.
pub fn repository_of(status: &EphemeralRunnerStatus) -> Option<&str> {
    let name = status.job_repository_name.as_str();
    let (owner, repository) = name.split_once('/')?;
    (!owner.is_empty() && !repository.is_empty() && !repository.contains('/')).then_some(name)
}

/// The status write and the Warning Event (`event_reason`) of a runner that lost its pod while it held the job its
/// status records: what happened to the pod (`cause`, else `otherwise`: not the cluster's doing), which job, and
/// whether GitHub is asked to re-run it (`owed`). The status says it too, where `kubectl describe` shows it for as
/// long as the runner stays (its re-run may hold it a while), and the runner is not ready, as its pod is gone.
pub fn finished_with_job(
    status: &EphemeralRunnerStatus,
    event_reason: &'static str,
    cause: Option<Interruption>,
    otherwise: &str,
    owed: bool,
) -> (StatusPatch, Report) {
    let what = cause.map_or_else(
        || otherwise.to_owned(),
        |cause| format!("the runner pod {}", cause.what()),
    );
    let then = match (owed, cause) {
        (true, _) => "GitHub is asked to re-run it once its run has finished",
        (false, Some(_)) => {
            "the job is left to GitHub (set rerunInterruptedJobs on the scale set to have it re-run)"
        }
        (false, None) => "the job is left to GitHub",
    };
    let note = format!(
        "{what} while the runner ran {}; the runner is finished and {then}",
        describe_job(status)
    );
    let mut patch = StatusPatch {
        ready: Some(false),
        ..StatusPatch::default()
    };
    patch.explain(event_reason.to_owned(), note.clone());
    let report = Report {
        reason: event_reason,
        action: "DeleteRunner",
        note,
    };
    (patch, report)
}

/// The note of the Events that say GitHub runs runner `runner`'s job (as its status records it) again, after its
/// pod ended by `cause`.
pub fn rerun_note(status: &EphemeralRunnerStatus, cause: Interruption, runner: &str) -> String {
    format!(
        "GitHub runs {} again: its runner pod {} (runner {runner})",
        describe_job(status),
        cause.what()
    )
}

/// The runner's job as the listener recorded it, for Events.
pub fn describe_job(status: &EphemeralRunnerStatus) -> String {
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

/// What a re-run pass does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RerunStep {
    /// Ask GitHub to re-run the job with this REST id.
    Request(i64),
    /// The job or its run has not finished: GitHub refuses a re-run until then; look again later.
    Wait,
    /// The re-run was asked for and accepted: report it.
    Done,
    /// Nothing to re-run, or nothing can be: say why and stop owing it.
    GiveUp(GiveUp),
}

/// Why no re-run follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GiveUp {
    /// Whether a person should look (a Warning Event) or this is as it should be (Normal).
    pub warning: bool,
    /// The Event's reason.
    pub reason: &'static str,
    /// The Event's note.
    pub note: String,
}

impl GiveUp {
    fn normal(reason: &'static str, note: String) -> RerunStep {
        RerunStep::GiveUp(Self {
            warning: false,
            reason,
            note,
        })
    }

    fn warning(reason: &'static str, note: String) -> RerunStep {
        RerunStep::GiveUp(Self {
            warning: true,
            reason,
            note,
        })
    }
}

/// What stops a re-run before GitHub is asked, if anything: the runner's set is gone or going (`set_live`), no
/// longer asks for re-runs (`limit`), the runner records no repository, or the re-run has been waited for longer
/// than `wait` (`waited`, since the runner's deletion).
pub fn before_asking(
    set_live: bool,
    limit: Option<i64>,
    repository: Option<&str>,
    waited: std::time::Duration,
    wait: std::time::Duration,
) -> Option<RerunStep> {
    let why = if !set_live {
        "its scale set is being deleted".to_owned()
    } else if limit.is_none() {
        "its scale set no longer asks for re-runs".to_owned()
    } else if repository.is_none() {
        "the runner records no job repository".to_owned()
    } else if waited > wait {
        format!("its run did not finish within {}s", wait.as_secs())
    } else {
        return None;
    };
    Some(GiveUp::warning(
        "JobRerunAbandoned",
        format!("the re-run is given up: {why}"),
    ))
}

/// The next step, given every attempt of every job of the run (`jobs`), the name the runner ran under, and the
/// set's limit: the job that ran on this runner is re-run once it and its run have finished, if it failed, no
/// later attempt of it exists and its run has had at most `limit` attempts.
pub fn next_step(jobs: &[WorkflowJob], runner_name: &str, limit: i64) -> RerunStep {
    let Some(job) = jobs
        .iter()
        .filter(|job| job.runner_name.as_deref() == Some(runner_name))
        .max_by_key(|job| job.run_attempt)
    else {
        return GiveUp::warning(
            "JobRerunNotPossible",
            format!(
                "GitHub shows no job of the run that ran on runner {runner_name}; nothing is re-run"
            ),
        );
    };
    if let Some(later) = jobs
        .iter()
        .filter(|other| other.name == job.name && other.run_attempt > job.run_attempt)
        .max_by_key(|other| other.run_attempt)
    {
        return GiveUp::normal(
            "JobRerunNotNeeded",
            format!(
                "job {:?} runs again already (attempt {} of its run)",
                job.name, later.run_attempt
            ),
        );
    }
    if job.status != "completed" {
        return RerunStep::Wait;
    }
    match job.conclusion.as_deref() {
        Some("failure") | None => {}
        Some(conclusion) => {
            return GiveUp::normal(
                "JobRerunNotNeeded",
                format!("job {:?} ended {conclusion}; it is not re-run", job.name),
            );
        }
    }
    if job.run_attempt > limit {
        return GiveUp::warning(
            "JobRerunLimitReached",
            format!(
                "job {:?} failed in attempt {} of its run; the scale set re-runs a job at most {limit} time(s)",
                job.name, job.run_attempt
            ),
        );
    }
    RerunStep::Request(job.id)
}

/// What GitHub's answer to a re-run request of job `job_id` leads to.
pub fn after_request(job_id: i64, outcome: &RerunOutcome) -> RerunStep {
    match outcome {
        RerunOutcome::Requested => RerunStep::Done,
        // A token without `actions: write` is refused the same way as a run that is still running; only its
        // message tells them apart, and waiting would not help it.
        RerunOutcome::Refused(message) if lacks_permission(message) => GiveUp::warning(
            "JobRerunForbidden",
            format!(
                "GitHub refused to re-run job {job_id}: {message} (the scale set's GitHub App or token needs \
                 the `actions: write` permission)"
            ),
        ),
        RerunOutcome::Refused(_) => RerunStep::Wait,
        RerunOutcome::NotFound => GiveUp::warning(
            "JobRerunNotPossible",
            format!(
                "GitHub does not find job {job_id} (or the token may not see it); nothing is re-run"
            ),
        ),
    }
}

/// What a listing of run `run_id`'s jobs that failed with HTTP `status` leads to: a run GitHub does not show (404)
/// or refuses to show to these credentials (403, not a rate limit) is not re-run; `None`: try again later.
pub fn after_listing_failed(
    run_id: i64,
    status: Option<u16>,
    rate_limited: bool,
) -> Option<RerunStep> {
    match status {
        Some(404) => Some(GiveUp::warning(
            "JobRerunNotPossible",
            format!(
                "GitHub does not find run {run_id} (or the token may not see it); nothing is re-run"
            ),
        )),
        Some(403) if !rate_limited => Some(GiveUp::warning(
            "JobRerunForbidden",
            format!(
                "GitHub refused to list the jobs of run {run_id} (the scale set's GitHub App or token needs the \
                 `actions: read` and `actions: write` permissions)"
            ),
        )),
        _ => None,
    }
}

fn lacks_permission(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    ["not accessible", "permission", "must have admin", "forbids"]
        .iter()
        .any(|sign| message.contains(sign))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use proptest::prelude::*;
    use serde_json::json;

    fn pod(status: serde_json::Value) -> CachedPod {
        let pod: Pod =
            serde_json::from_value(json!({ "metadata": { "name": "r" }, "status": status }))
                .expect("pod");
        CachedPod::from(pod)
    }

    fn job(
        id: i64,
        attempt: i64,
        runner: &str,
        status: &str,
        conclusion: Option<&str>,
    ) -> WorkflowJob {
        WorkflowJob {
            id,
            run_id: 9,
            run_attempt: attempt,
            name: "build".to_owned(),
            status: status.to_owned(),
            conclusion: conclusion.map(str::to_owned),
            runner_name: Some(runner.to_owned()),
        }
    }

    fn busy() -> EphemeralRunnerStatus {
        EphemeralRunnerStatus {
            job_id: "j".to_owned(),
            job_request_id: 3,
            workflow_run_id: 9,
            job_repository_name: "org/repo".to_owned(),
            ..EphemeralRunnerStatus::default()
        }
    }

    #[test]
    fn a_runner_finished_with_its_job_says_what_happened_which_job_and_what_follows() {
        let status = EphemeralRunnerStatus {
            job_display_name: "build (linux)".to_owned(),
            job_workflow_ref: "org/repo/.github/workflows/ci.yml@refs/heads/main".to_owned(),
            ..busy()
        };
        let (patch, report) = finished_with_job(
            &status,
            "RunnerPodDeleted",
            Some(Interruption::OomKilled),
            "unused",
            true,
        );
        assert_eq!(report.reason, "RunnerPodDeleted");
        assert_eq!(patch.ready, Some(false));
        assert_eq!(
            patch.message,
            Some(Some(report.note.clone())),
            "the status says it too"
        );
        assert!(
            report
                .note
                .starts_with("the runner pod was OOM-killed while the runner ran job"),
            "{}",
            report.note
        );
        assert!(
            report.note.contains(
                "\"build (linux)\" of run 9 (org/repo/.github/workflows/ci.yml@refs/heads/main)"
            ),
            "{}",
            report.note
        );
        assert!(
            report
                .note
                .ends_with("GitHub is asked to re-run it once its run has finished"),
            "{}",
            report.note
        );
        let (_, not_asked) = finished_with_job(
            &status,
            "RunnerPodDeleted",
            Some(Interruption::Evicted),
            "",
            false,
        );
        assert!(
            not_asked.note.contains("set rerunInterruptedJobs"),
            "{}",
            not_asked.note
        );
        let (_, own) = finished_with_job(
            &busy(),
            "RunnerFailedWithJob",
            None,
            "the runner pod failed",
            false,
        );
        assert!(
            own.note
                .starts_with("the runner pod failed while the runner ran job \"j\" of run 9"),
            "{}",
            own.note
        );
        assert!(
            own.note.ends_with("the job is left to GitHub"),
            "{}",
            own.note
        );
        assert!(rerun_note(&status, Interruption::Evicted, "r").contains("(runner r)"));
    }

    #[test]
    fn the_cluster_s_doings_are_told_apart_from_a_pod_that_failed_on_its_own() {
        let oom = pod(json!({"phase": "Failed", "containerStatuses": [{
            "name": "runner", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}));
        assert_eq!(interruption(Some(&oom)), Some(Interruption::OomKilled));
        let evicted = pod(json!({"phase": "Failed", "reason": "Evicted"}));
        assert_eq!(interruption(Some(&evicted)), Some(Interruption::Evicted));
        let node = pod(json!({"phase": "Failed", "reason": "NodeLost"}));
        assert_eq!(interruption(Some(&node)), Some(Interruption::NodeLost));
        let by_api = pod(json!({"phase": "Running", "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]}));
        assert_eq!(interruption(Some(&by_api)), Some(Interruption::Evicted));
        let mut deleted = pod(json!({"phase": "Running"}));
        deleted.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1).unwrap()));
        assert_eq!(interruption(Some(&deleted)), Some(Interruption::Deleted));
        assert_eq!(interruption(None), Some(Interruption::Deleted));
        let crashed = pod(json!({"phase": "Failed", "containerStatuses": [{
            "name": "runner", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}));
        assert_eq!(
            interruption(Some(&crashed)),
            None,
            "its job may have caused it"
        );
        let refused = pod(json!({"phase": "Failed", "reason": "OutOfcpu"}));
        assert_eq!(interruption(Some(&refused)), None);
    }

    #[test]
    fn a_pod_seen_evicted_and_then_gone_was_evicted() {
        let evicted = Some(Interruption::Evicted);
        let deleted = Some(Interruption::Deleted);
        assert_eq!(more_telling(deleted, evicted), evicted);
        assert_eq!(more_telling(evicted, deleted), evicted);
        assert_eq!(more_telling(deleted, None), deleted);
        assert_eq!(
            more_telling(None, evicted),
            None,
            "the pod the pass sees ended on its own"
        );
    }

    #[test]
    fn labels_read_back() {
        for interruption in Interruption::ALL {
            assert_eq!(
                Interruption::parse(interruption.label()),
                Some(interruption)
            );
        }
        assert_eq!(Interruption::parse("other"), None);
    }

    #[test]
    fn a_re_run_is_owed_only_when_asked_for_caused_by_the_cluster_and_the_run_is_known() {
        let cause = Some(Interruption::Evicted);
        assert_eq!(rerun_owed(Some(1), &busy(), cause), cause);
        assert_eq!(rerun_owed(None, &busy(), cause), None, "not asked for");
        assert_eq!(
            rerun_owed(Some(1), &busy(), None),
            None,
            "the job's own doing"
        );
        let mut no_run = busy();
        no_run.workflow_run_id = 0;
        assert_eq!(rerun_owed(Some(1), &no_run, cause), None);
        let mut odd_repository = busy();
        odd_repository.job_repository_name = "repo".to_owned();
        assert_eq!(rerun_owed(Some(1), &odd_repository, cause), None);
        assert_eq!(
            rerun_owed(Some(1), &EphemeralRunnerStatus::default(), cause),
            None,
            "no job"
        );
    }

    #[test]
    fn the_set_s_limit_is_read_from_its_annotation() {
        let annotations = |value: &str| {
            BTreeMap::from([(
                RERUN_INTERRUPTED_JOBS_ANNOTATION.to_owned(),
                value.to_owned(),
            )])
        };
        assert_eq!(rerun_limit(&annotations("2")), Some(2));
        assert_eq!(rerun_limit(&annotations("0")), None);
        assert_eq!(rerun_limit(&annotations("yes")), None);
        assert_eq!(rerun_limit(&BTreeMap::new()), None);
    }

    #[test]
    fn a_re_run_is_given_up_before_asking_when_nothing_can_come_of_it() {
        let hour = std::time::Duration::from_secs(3600);
        let abandoned = |step: Option<RerunStep>| {
            matches!(
                step,
                Some(RerunStep::GiveUp(GiveUp {
                    warning: true,
                    reason: "JobRerunAbandoned",
                    ..
                }))
            )
        };
        assert_eq!(
            before_asking(true, Some(1), Some("o/r"), hour / 2, hour),
            None
        );
        assert!(abandoned(before_asking(
            false,
            Some(1),
            Some("o/r"),
            hour / 2,
            hour
        )));
        assert!(abandoned(before_asking(
            true,
            None,
            Some("o/r"),
            hour / 2,
            hour
        )));
        assert!(abandoned(before_asking(
            true,
            Some(1),
            None,
            hour / 2,
            hour
        )));
        assert!(abandoned(before_asking(
            true,
            Some(1),
            Some("o/r"),
            hour * 2,
            hour
        )));
    }

    #[test]
    fn a_failed_job_of_a_finished_run_is_re_run_within_the_limit() {
        let jobs = [
            job(1, 1, "other", "completed", Some("success")),
            job(2, 1, "r", "completed", Some("failure")),
        ];
        assert_eq!(next_step(&jobs, "r", 1), RerunStep::Request(2));
    }

    #[test]
    fn a_job_still_running_is_waited_for() {
        let jobs = [job(2, 1, "r", "in_progress", None)];
        assert_eq!(next_step(&jobs, "r", 1), RerunStep::Wait);
    }

    #[test]
    fn nothing_is_re_run_twice_past_the_limit_or_when_it_did_not_fail() {
        let rerun_already = [
            job(2, 1, "r", "completed", Some("failure")),
            WorkflowJob {
                runner_name: None,
                ..job(3, 2, "", "queued", None)
            },
        ];
        assert!(matches!(
            next_step(&rerun_already, "r", 3),
            RerunStep::GiveUp(GiveUp { warning: false, .. })
        ));
        let second_attempt = [job(3, 2, "r", "completed", Some("failure"))];
        assert!(matches!(
            next_step(&second_attempt, "r", 1),
            RerunStep::GiveUp(GiveUp {
                warning: true,
                reason: "JobRerunLimitReached",
                ..
            })
        ));
        assert_eq!(next_step(&second_attempt, "r", 2), RerunStep::Request(3));
        for conclusion in ["success", "cancelled", "skipped"] {
            let jobs = [job(2, 1, "r", "completed", Some(conclusion))];
            assert!(matches!(
                next_step(&jobs, "r", 1),
                RerunStep::GiveUp(GiveUp { warning: false, .. })
            ));
        }
        assert!(matches!(
            next_step(&[job(2, 1, "other", "completed", Some("failure"))], "r", 1),
            RerunStep::GiveUp(GiveUp { warning: true, .. })
        ));
    }

    #[test]
    fn github_s_answers() {
        assert_eq!(after_request(2, &RerunOutcome::Requested), RerunStep::Done);
        assert_eq!(
            after_request(
                2,
                &RerunOutcome::Refused(
                    "The workflow run containing this job is already running".to_owned()
                )
            ),
            RerunStep::Wait
        );
        assert!(matches!(
            after_request(
                2,
                &RerunOutcome::Refused("Resource not accessible by integration".to_owned())
            ),
            RerunStep::GiveUp(GiveUp {
                warning: true,
                reason: "JobRerunForbidden",
                ..
            })
        ));
        assert!(matches!(
            after_request(2, &RerunOutcome::NotFound),
            RerunStep::GiveUp(GiveUp { warning: true, .. })
        ));
    }

    #[test]
    fn a_run_github_will_not_show_is_given_up_and_anything_else_tried_again() {
        assert!(matches!(
            after_listing_failed(9, Some(404), false),
            Some(RerunStep::GiveUp(GiveUp { warning: true, .. }))
        ));
        assert!(matches!(
            after_listing_failed(9, Some(403), false),
            Some(RerunStep::GiveUp(GiveUp {
                reason: "JobRerunForbidden",
                ..
            }))
        ));
        assert_eq!(
            after_listing_failed(9, Some(403), true),
            None,
            "a rate limit passes"
        );
        assert_eq!(after_listing_failed(9, Some(502), false), None);
        assert_eq!(after_listing_failed(9, None, false), None, "no answer");
    }

    proptest! {
        /// Whatever GitHub shows, a job is asked for only when it ran on this runner, finished failed, has no later
        /// attempt and is within the limit.
        #[test]
        fn a_request_is_only_for_a_failed_latest_attempt_within_the_limit(
            shown in proptest::collection::vec(
                (1i64..4, prop::bool::ANY, 0usize..3, 0usize..4),
                0..6,
            ),
            limit in 1i64..4,
        ) {
            let statuses = ["queued", "in_progress", "completed"];
            let conclusions = [None, Some("failure"), Some("success"), Some("cancelled")];
            let jobs: Vec<WorkflowJob> = shown
                .iter()
                .enumerate()
                .map(|(i, (attempt, mine, status, conclusion))| {
                    let id = i64::try_from(i).unwrap_or_default() + 1;
                    job(id, *attempt, if *mine { "r" } else { "x" }, statuses[*status], conclusions[*conclusion])
                })
                .collect();
            if let RerunStep::Request(id) = next_step(&jobs, "r", limit) {
                let asked = jobs.iter().find(|job| job.id == id).expect("a shown job");
                prop_assert_eq!(asked.runner_name.as_deref(), Some("r"));
                prop_assert_eq!(asked.status.as_str(), "completed");
                prop_assert!(matches!(asked.conclusion.as_deref(), Some("failure") | None));
                prop_assert!(asked.run_attempt <= limit);
                prop_assert!(jobs.iter().all(|other| other.run_attempt <= asked.run_attempt));
            }
        }
    }
}
