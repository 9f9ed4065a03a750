//! Workflow runs as the GitHub REST API shows them: the jobs of a run (every attempt of a job has its own REST
//! id) and the re-run of one completed job as a new attempt of the run.
//!
//! A run is the set of jobs one enqueue call created (they share `workflowRunId`). A re-run adds a job record
//! like any enqueued job, so its scale set hears of it the same way.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::{JobRec, State, rfc3339};
use crate::control::{JobState, JobView};
use crate::error::Rejection;
use crate::rng::SplitMix64;
use crate::routes::GITHUB_API_PREFIX;
use crate::wire::{WorkflowJobJson, WorkflowJobsJson};
use base64::Engine as _;

/// Jobs per page when `per_page` is not given.
pub const DEFAULT_PER_PAGE: usize = 30;
/// Most jobs per page; a larger `per_page` is cut to this.
pub const MAX_PER_PAGE: usize = 100;

/// Message GitHub answers a re-run with while the run (or the job itself) is not completed.
const RUN_STILL_RUNNING: &str = "The workflow run containing this job is already running";

/// Which attempts of a run's jobs to list (`filter`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RunJobsFilter {
    /// The newest attempt of each job.
    #[default]
    Latest,
    /// Every attempt.
    All,
}

/// What to list of a run's jobs: `filter`, `per_page` and `page` of the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunJobsQuery {
    /// Which attempts.
    pub filter: RunJobsFilter,
    /// Jobs per page, 1 to [`MAX_PER_PAGE`] (others are brought into that range).
    pub per_page: usize,
    /// Page number, from 1 (0 counts as 1).
    pub page: usize,
}

impl Default for RunJobsQuery {
    fn default() -> Self {
        Self {
            filter: RunJobsFilter::Latest,
            per_page: DEFAULT_PER_PAGE,
            page: 1,
        }
    }
}

/// One page of a run's jobs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunJobsPage {
    /// The body.
    pub body: WorkflowJobsJson,
    /// Number of the last page (1 when there are no jobs).
    pub last_page: usize,
}

fn not_found() -> Rejection {
    Rejection::new(404, "Not Found")
}

fn in_repository(job: &JobRec, owner: &str, repository: &str) -> bool {
    // Owner and repository names are case-insensitive on GitHub.
    job.owner.eq_ignore_ascii_case(owner) && job.repository.eq_ignore_ascii_case(repository)
}

/// GitHub's `status` of a job in a fake state. A job given to a runner counts as in progress.
pub fn github_status(state: JobState) -> &'static str {
    match state {
        JobState::Queued | JobState::Available | JobState::Acquired => "queued",
        JobState::Assigned | JobState::Running => "in_progress",
        JobState::Completed => "completed",
    }
}

/// GitHub's `conclusion` for a completion result of the Actions Service (`succeeded`, `failed`, `canceled`,
/// ...), compared case-insensitively. Unknown results count as failures.
pub fn github_conclusion(result: &str) -> &'static str {
    match result.to_ascii_lowercase().as_str() {
        "succeeded" | "succeededwithissues" => "success",
        "canceled" | "cancelled" => "cancelled",
        "skipped" => "skipped",
        _ => "failure",
    }
}

/// `{owner}/{repo}/.github/workflows/ci.yml@refs/heads/main` → (`.github/workflows/ci.yml`, `main`).
fn workflow_parts(workflow_ref: &str) -> (Option<String>, Option<String>) {
    let (path, git_ref) = workflow_ref.split_once('@').unwrap_or((workflow_ref, ""));
    let file = path
        .splitn(3, '/')
        .nth(2)
        .filter(|file| !file.is_empty())
        .map(str::to_owned);
    let branch = git_ref
        .strip_prefix("refs/heads/")
        .or_else(|| git_ref.strip_prefix("refs/tags/"))
        .filter(|branch| !branch.is_empty())
        .map(str::to_owned);
    (file, branch)
}

/// A made-up commit id, the same for every job of a run.
fn head_sha(run: i64) -> String {
    SplitMix64::new(run as u64)
        .bytes(20)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

impl State {
    fn rest_job(&self, rest_id: i64) -> Option<&JobRec> {
        self.rest_jobs
            .get(&rest_id)
            .and_then(|request_id| self.jobs.get(request_id))
    }

    fn run_records(&self, run: i64) -> impl Iterator<Item = &JobRec> {
        self.runs
            .get(&run)
            .into_iter()
            .flatten()
            .filter_map(|request_id| self.jobs.get(request_id))
    }

    fn workflow_job_json(&self, job: &JobRec, base_url: &str) -> WorkflowJobJson {
        let (owner, repository) = (&job.owner, &job.repository);
        let (id, run) = (job.rest_id, job.workflow_run_id);
        let api = format!("{base_url}/{GITHUB_API_PREFIX}/repos/{owner}/{repository}");
        let (workflow_name, head_branch) = workflow_parts(&job.workflow_ref);
        let group = job
            .runner
            .as_ref()
            .and(job.scale_set)
            .and_then(|set| self.scale_sets.get(&set))
            .map(|set| (set.group, self.group_name(set.tenant, set.group)));
        let completed = job.state == JobState::Completed;
        WorkflowJobJson {
            id,
            run_id: run,
            run_url: format!("{api}/actions/runs/{run}"),
            run_attempt: job.run_attempt,
            node_id: format!("CR_{}", URL_SAFE_NO_PAD.encode(format!("fake-job:{id}"))),
            head_sha: head_sha(run),
            head_branch,
            url: format!("{api}/actions/jobs/{id}"),
            html_url: format!("{base_url}/{owner}/{repository}/actions/runs/{run}/job/{id}"),
            status: github_status(job.state).to_owned(),
            conclusion: job
                .result
                .as_deref()
                .filter(|_| completed)
                .map(|result| github_conclusion(result).to_owned()),
            created_at: rfc3339(job.queue_ms),
            started_at: rfc3339(
                job.running_since_ms
                    .or(job.runner_assign_ms)
                    .unwrap_or(job.queue_ms),
            ),
            completed_at: job.finish_ms.filter(|_| completed).map(rfc3339),
            name: job.display_name.clone(),
            steps: Vec::new(),
            check_run_url: format!("{api}/check-runs/{id}"),
            labels: job.labels.clone(),
            runner_id: job.runner.as_ref().map(|(id, _)| *id),
            runner_name: job.runner.as_ref().map(|(_, name)| name.clone()),
            runner_group_id: group.as_ref().map(|(id, _)| *id),
            runner_group_name: group.map(|(_, name)| name),
            workflow_name,
        }
    }

    /// `GET /repos/{owner}/{repo}/actions/runs/{run}/jobs`: one page of the run's jobs (see [`RunJobsQuery`]), in
    /// creation order. 404 when the run is unknown or belongs to another repository. `base_url` is the URL the
    /// fake is reached under, for the URLs in the jobs.
    pub fn run_jobs(
        &self,
        owner: &str,
        repository: &str,
        run: i64,
        query: RunJobsQuery,
        base_url: &str,
    ) -> Result<RunJobsPage, Rejection> {
        let RunJobsQuery {
            filter,
            per_page,
            page,
        } = query;
        let mut jobs = self.run_records(run).peekable();
        if jobs
            .peek()
            .is_none_or(|job| !in_repository(job, owner, repository))
        {
            return Err(not_found());
        }
        let selected: Vec<&JobRec> = jobs
            .filter(|job| filter == RunJobsFilter::All || job.next_attempt.is_none())
            .collect();
        let per_page = per_page.clamp(1, MAX_PER_PAGE);
        let page = page.max(1);
        let jobs = selected
            .iter()
            .skip(per_page.saturating_mul(page - 1))
            .take(per_page)
            .map(|job| self.workflow_job_json(job, base_url))
            .collect();
        Ok(RunJobsPage {
            body: WorkflowJobsJson {
                total_count: selected.len(),
                jobs,
            },
            last_page: selected.len().div_ceil(per_page).max(1),
        })
    }

    /// `POST /repos/{owner}/{repo}/actions/jobs/{rest_id}/rerun`: run a completed job again as a new attempt of its
    /// run. The new job (new request and REST ids, the run's next attempt number, the same name, labels,
    /// repository and run) is handed to its scale set as an enqueued job is; with no scale set of its name left in
    /// the tenant it waits, queued, for one. Refused (403) while the job or any other latest job of the run is not
    /// completed, as GitHub does, and for an attempt re-run before (re-run the latest); 404 for an unknown job or
    /// another repository. Returns the new attempt.
    pub fn rerun_job(
        &mut self,
        owner: &str,
        repository: &str,
        rest_id: i64,
        debug_logging: bool,
    ) -> Result<JobView, Rejection> {
        let job = self
            .rest_job(rest_id)
            .filter(|job| in_repository(job, owner, repository))
            .ok_or_else(not_found)?
            .clone();
        if job.next_attempt.is_some() {
            return Err(Rejection::new(
                403,
                format!("Job {rest_id} was re-run already; re-run its latest attempt"),
            ));
        }
        let run_running = self
            .run_records(job.workflow_run_id)
            .any(|other| other.next_attempt.is_none() && other.state != JobState::Completed);
        if run_running {
            return Err(Rejection::new(403, RUN_STILL_RUNNING));
        }
        let attempt = self
            .run_records(job.workflow_run_id)
            .map(|other| other.run_attempt)
            .max()
            .unwrap_or(job.run_attempt)
            + 1;
        // The scale set it ran on, else one of the same name in the tenant (jobs follow labels, not ids).
        let scale_set = job
            .scale_set
            .filter(|set| self.scale_sets.contains_key(set))
            .or_else(|| {
                self.scale_sets
                    .values()
                    .find(|set| {
                        set.tenant == job.tenant && set.name.eq_ignore_ascii_case(&job.target_name)
                    })
                    .map(|set| set.id)
            });
        let request_id = Self::fresh_id(&mut self.next_job);
        let new_rest_id = Self::fresh_id(&mut self.next_rest_job);
        let now = self.now_ms();
        let rerun = JobRec {
            request_id,
            job_id: self.rng.uuid(),
            scale_set,
            state: if scale_set.is_some() {
                JobState::Available
            } else {
                JobState::Queued
            },
            runner: None,
            result: None,
            queue_ms: now,
            scale_set_assign_ms: None,
            runner_assign_ms: None,
            finish_ms: None,
            running_since_ms: None,
            renewed_ms: None,
            runner_lost: false,
            offers_outstanding: 0,
            times_acquired: 0,
            times_started: 0,
            times_requeued: 0,
            rest_id: new_rest_id,
            run_attempt: attempt,
            rerun_of: Some(job.request_id),
            next_attempt: None,
            debug_logging,
            ..job.clone()
        };
        self.jobs.insert(request_id, rerun);
        self.rest_jobs.insert(new_rest_id, request_id);
        self.runs
            .entry(job.workflow_run_id)
            .or_default()
            .push(request_id);
        if let Some(old) = self.jobs.get_mut(&job.request_id) {
            old.next_attempt = Some(request_id);
        }
        self.job_reruns += 1;
        if scale_set.is_some() {
            self.offer(request_id);
        }
        self.job_view(request_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_results_map_to_github_status_and_conclusion() {
        let statuses: Vec<&str> = [
            JobState::Queued,
            JobState::Available,
            JobState::Acquired,
            JobState::Assigned,
            JobState::Running,
            JobState::Completed,
        ]
        .into_iter()
        .map(github_status)
        .collect();
        assert_eq!(
            statuses,
            [
                "queued",
                "queued",
                "queued",
                "in_progress",
                "in_progress",
                "completed"
            ]
        );
        let conclusions: Vec<&str> = [
            "succeeded",
            "Succeeded",
            "SucceededWithIssues",
            "failed",
            "canceled",
            "cancelled",
            "skipped",
            "abandoned",
            "whatever",
        ]
        .into_iter()
        .map(github_conclusion)
        .collect();
        assert_eq!(
            conclusions,
            [
                "success",
                "success",
                "success",
                "failure",
                "cancelled",
                "cancelled",
                "skipped",
                "failure",
                "failure"
            ]
        );
    }

    #[test]
    fn workflow_ref_gives_workflow_file_and_branch() {
        assert_eq!(
            workflow_parts("octo/app/.github/workflows/ci.yml@refs/heads/main"),
            (
                Some(".github/workflows/ci.yml".to_owned()),
                Some("main".to_owned())
            )
        );
        assert_eq!(
            workflow_parts("octo/app/.github/workflows/release.yml@refs/tags/v1"),
            (
                Some(".github/workflows/release.yml".to_owned()),
                Some("v1".to_owned())
            )
        );
        assert_eq!(
            workflow_parts("octo/app/.github/workflows/pr.yml@refs/pull/4/merge"),
            (Some(".github/workflows/pr.yml".to_owned()), None)
        );
        assert_eq!(workflow_parts("nonsense"), (None, None));
    }

    #[test]
    fn head_sha_is_forty_hex_digits_per_run() {
        assert_eq!(head_sha(9_000_001).len(), 40);
        assert_eq!(head_sha(9_000_001), head_sha(9_000_001));
        assert_ne!(head_sha(9_000_001), head_sha(9_000_002));
    }
}
