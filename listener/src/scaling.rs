//! The scaling rule and the `patchID` protocol, as pure functions (docs/reference/controllers.md, "Scaling rule"
//! and "The patch-ID protocol").
//!
//! The EphemeralRunnerSet controller reads `patchID` as follows: 0 means "converge exactly to `replicas`" (it may
//! delete idle runners), any other value allows scaling up only and is acted upon once. So the listener sends a
//! fresh sequence number while jobs come and go, and 0 once things are quiet at `min_runners`.

use actions_client::JobStarted;
use serde_json::{Map, Value, json};

/// Desired replicas: `min_runners` idle runners on top of the assigned jobs, capped at `max_runners`. There is
/// deliberately no lower clamp (ARC has none either).
pub fn desired_replicas(assigned_jobs: i64, min_runners: i64, max_runners: i64) -> i64 {
    min_runners.saturating_add(assigned_jobs).min(max_runners)
}

/// Whether the patch of a step after job events may wait up to `window` to be joined by the next steps' (not in
/// ARC, which patches after every message): one that does not raise the target last sent (`last_sent`; -1 before
/// the first), after a message of starts, assignments or completions. Such a patch asks the EphemeralRunnerSet for
/// nothing new: its ID is never 0, so it scales nothing down. A patch that raises the target goes at once, with
/// whatever waited. A lower target sent late once left the set counting on runners that had finished (16 spare
/// runners in a 500-job burst); now the set keeps the place of a runner that left with a job until the listener
/// lists it ([`crate::completions`]), so a late patch costs no runner. In a burst of 500 one-second jobs, waiting
/// patches cut the writes per job from 11.2 to 10.7 (docs/benchmarks.md).
pub fn may_defer(target: i64, last_sent: i64, eventful: bool, window: std::time::Duration) -> bool {
    !window.is_zero() && eventful && last_sent >= 0 && target <= last_sent
}

/// The sequence value after `seq`: 0 from the initial -1, then 1, 2, …, `i32::MAX`, then 1 again (0 is never
/// reused by the sequence, it is reserved for "converge").
pub fn next_patch_seq(seq: i32) -> i32 {
    if seq == i32::MAX { 1 } else { seq + 1 }
}

/// One scaling decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Desired replicas.
    pub target: i64,
    /// The patch ID to send with it.
    pub patch_id: i32,
}

/// The scaler's memory between steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scaler {
    target: i64,
    patch_seq: i32,
    dirty: bool,
}

impl Default for Scaler {
    fn default() -> Self {
        Self {
            target: -1,
            patch_seq: -1,
            dirty: false,
        }
    }
}

impl Scaler {
    /// Records that a job started or completed since the last step.
    pub fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    /// Whether a job event happened since the last step.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// The last target decided (-1 before the first step).
    pub fn target(&self) -> i64 {
        self.target
    }

    /// The next decision for `assigned_jobs`. The patch ID is the next sequence value, except 0 ("converge")
    /// when nothing happened since the last step and the target stays at `min_runners`.
    pub fn decide(&mut self, assigned_jobs: i64, min_runners: i64, max_runners: i64) -> Decision {
        let was_dirty = std::mem::take(&mut self.dirty);
        self.patch_seq = next_patch_seq(self.patch_seq);
        let target = desired_replicas(assigned_jobs, min_runners, max_runners);
        let previous = std::mem::replace(&mut self.target, target);
        let converge = !was_dirty && target == previous && target == min_runners;
        Decision {
            target,
            patch_id: if converge { 0 } else { self.patch_seq },
        }
    }

    /// Not in ARC: like [`Scaler::decide`], but a step with no job event since the last one and an unchanged
    /// target converges (patch ID 0) even above `min_runners`. The listener uses it right after a step in which its
    /// scaling policy (a window closing, a scale-down delay ending) lowered the target, so idle runners above the
    /// new target leave at once; ARC's rule would keep them until the assigned jobs drain.
    pub fn settle(&mut self, assigned_jobs: i64, min_runners: i64, max_runners: i64) -> Decision {
        let quiet = !self.dirty;
        let previous = self.target;
        let mut decision = self.decide(assigned_jobs, min_runners, max_runners);
        if quiet && decision.target == previous {
            decision.patch_id = 0;
        }
        decision
    }

    /// The patch of a decision did not reach the API server. The next patch must not ask to converge on a state
    /// the EphemeralRunnerSet never saw, so the step counts as eventful.
    pub fn patch_failed(&mut self) {
        self.dirty = true;
    }
}

/// The merge patch for the EphemeralRunnerSet: the diff between `{replicas: -1, patchID: -1}` and the decision,
/// where a target of 0 is an absent field. So 0 becomes `replicas: null` (removing the field, which reads as 0)
/// and -1 leaves `replicas` out.
pub fn runner_set_patch(decision: Decision) -> Value {
    let mut spec = Map::new();
    spec.insert("patchID".to_owned(), json!(decision.patch_id));
    match decision.target {
        -1 => {}
        0 => {
            spec.insert("replicas".to_owned(), Value::Null);
        }
        n => {
            spec.insert("replicas".to_owned(), json!(n));
        }
    }
    json!({ "spec": spec })
}

/// The merge patch for an EphemeralRunner's status when its job started: only the non-empty fields, and the
/// repository always (`owner/repo`, `/` when both are unknown).
pub fn runner_job_status_patch(job: &JobStarted) -> Value {
    let info = &job.job;
    let mut status = Map::new();
    if info.runner_request_id != 0 {
        status.insert("jobRequestId".to_owned(), json!(info.runner_request_id));
    }
    status.insert(
        "jobRepositoryName".to_owned(),
        json!(format!("{}/{}", info.owner_name, info.repository_name)),
    );
    if !info.job_id.is_empty() {
        status.insert("jobId".to_owned(), json!(info.job_id));
    }
    if info.workflow_run_id != 0 {
        status.insert("workflowRunId".to_owned(), json!(info.workflow_run_id));
    }
    if !info.job_workflow_ref.is_empty() {
        status.insert("jobWorkflowRef".to_owned(), json!(info.job_workflow_ref));
    }
    if !info.job_display_name.is_empty() {
        status.insert("jobDisplayName".to_owned(), json!(info.job_display_name));
    }
    json!({ "status": status })
}

#[cfg(test)]
mod tests;
