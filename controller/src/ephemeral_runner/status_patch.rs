//! The status fields the EphemeralRunner controller writes, as values: typed merge patches of the changed fields
//! only, under its field manager (the listener writes the job fields of the same status; a merge patch never
//! touches fields it does not name), or a registration-guarded JSON patch when a write leaves a registration.
//! Pure: the executor sends them (`step.rs`).

use std::collections::BTreeMap;

use crds::constants::phase;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Patch;
use serde::Serialize;
use serde_json::{Value, json};

use super::pod::JitIdentity;
use crate::error::{Error, Result};

/// An EphemeralRunner phase, serialised as ARC's strings; the controller mirrors the pod's phase (Pending,
/// Running, and Unknown when the node stops reporting) and sets the terminal ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RunnerPhase {
    Pending,
    Running,
    Failed,
    Outdated,
    Unknown,
}

impl RunnerPhase {
    pub fn of_pod(pod_phase: &str) -> Self {
        match pod_phase {
            phase::RUNNING => Self::Running,
            phase::FAILED => Self::Failed,
            "Unknown" => Self::Unknown,
            _ => Self::Pending,
        }
    }
}

/// A patch of the EphemeralRunner status fields this controller owns. `None` leaves a field alone; `Some(None)`
/// removes it. Sent as a merge patch, unless it moves the runner off a registration (see
/// [`StatusPatch::leave_registration`]).
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusPatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<RunnerPhase>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<Option<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner_name: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failures: Option<BTreeMap<String, Time>>,
    /// The registration the status records now, which this write moves the runner off, taking its job fields
    /// (the listener's; this controller only removes them) with it.
    #[serde(skip)]
    pub leaves: Option<i64>,
    /// The resource version the write holds at: set when it records an identity the pass's view shows none of.
    /// The listener may have recorded one with a job meanwhile (see `Step::create_pod`), maybe a registration's
    /// this runner has left; a plain merge patch would put the new identity over that job.
    #[serde(skip)]
    pub holds_at: Option<String>,
}

impl StatusPatch {
    pub fn is_empty(&self) -> bool {
        self.phase.is_none()
            && self.ready.is_none()
            && self.reason.is_none()
            && self.message.is_none()
            && self.runner_id.is_none()
            && self.runner_name.is_none()
            && self.failures.is_none()
            && self.leaves.is_none()
    }

    /// Sets `reason` and `message`, removing each when empty.
    pub fn explain(&mut self, reason: String, message: String) {
        let or_none = |text: String| (!text.is_empty()).then_some(text);
        self.reason = Some(or_none(reason));
        self.message = Some(or_none(message));
    }

    /// Removes registration `recorded`, the one the status records (0: none).
    pub fn forget_identity(&mut self, recorded: i64) {
        self.runner_id = Some(None);
        self.runner_name = Some(None);
        self.leave_registration(recorded);
    }

    /// Moves the runner off registration `recorded` (0: none): the job fields go with it, and the write holds only
    /// while the status still records it. The listener writes a job's fields only while the status records the
    /// registration the job started on, and may do so between this pass's read and its write (a JobStarted
    /// reported late, of a runner whose pod was taken away mid-job): a plain merge patch would carry that job
    /// over to the next registration, whose runner never runs it, and a runner with a job is never scaled down.
    pub fn leave_registration(&mut self, recorded: i64) {
        if recorded != 0 {
            self.leaves = Some(recorded);
        }
    }

    /// The request: a merge patch, or the registration-guarded JSON patch when the write leaves one.
    /// `recorded_failures`: the failures the status holds, as the write's view shows them. A JSON patch replaces
    /// the map where a merge patch adds to it, so the new entries go in with these. The view cannot miss one: a
    /// failure is only ever written together with forgetting the registration, so a view that still shows the
    /// registration this write's `test` checks shows every failure written before.
    pub fn to_patch(&self, recorded_failures: &BTreeMap<String, Time>) -> Result<Patch<Value>> {
        let serialize = |source| Error::Serialize {
            what: "the EphemeralRunner status patch",
            source,
        };
        let body = serde_json::to_value(self).map_err(serialize)?;
        Ok(match (self.leaves, body) {
            (Some(recorded), Value::Object(mut fields)) => {
                for job_field in crds::EphemeralRunnerStatus::JOB_FIELDS {
                    fields.insert(job_field.to_owned(), Value::Null);
                }
                if let Some(new) = &self.failures {
                    let mut all = recorded_failures.clone();
                    all.extend(new.iter().map(|(uid, at)| (uid.clone(), at.clone())));
                    fields.insert(
                        "failures".to_owned(),
                        serde_json::to_value(all).map_err(serialize)?,
                    );
                }
                Patch::Json(crds::registration_guarded_status_patch(recorded, &fields))
            }
            (_, body) => match &self.holds_at {
                Some(version) => Patch::Merge(json!({
                    "metadata": { "resourceVersion": version },
                    "status": body,
                })),
                None => Patch::Merge(json!({ "status": body })),
            },
        })
    }

    /// Records `identity` when `status` does not hold it yet. A first identity holds at `holds_at` (the resource
    /// version of the pass's view, asked only then): the listener may have recorded one with a job meanwhile, which
    /// a plain merge patch would overwrite; a different one leaves the recorded registration.
    pub fn record_identity(
        &mut self,
        status: &crds::EphemeralRunnerStatus,
        identity: &JitIdentity,
        holds_at: impl FnOnce() -> Option<String>,
    ) {
        if status.runner_id != identity.runner_id || status.runner_name != identity.runner_name {
            self.runner_id = Some(Some(identity.runner_id));
            self.runner_name = Some(Some(identity.runner_name.clone()));
            if status.runner_id == 0 {
                self.holds_at = holds_at();
            } else if status.runner_id != identity.runner_id {
                self.leave_registration(status.runner_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn phases_serialise_to_arcs_strings() {
        for (ours, arcs) in [
            (RunnerPhase::Pending, phase::PENDING),
            (RunnerPhase::Running, phase::RUNNING),
            (RunnerPhase::Failed, phase::FAILED),
            (RunnerPhase::Outdated, phase::OUTDATED),
            (RunnerPhase::Unknown, "Unknown"),
        ] {
            assert_eq!(serde_json::to_value(ours).unwrap(), json!(arcs));
        }
        assert_eq!(RunnerPhase::of_pod("Running"), RunnerPhase::Running);
        assert_eq!(RunnerPhase::of_pod(""), RunnerPhase::Pending);
    }

    #[test]
    fn status_patches_name_only_what_changes() {
        assert_eq!(
            serde_json::to_value(StatusPatch::default()).unwrap(),
            json!({})
        );
        let mut patch = StatusPatch {
            ready: Some(false),
            ..StatusPatch::default()
        };
        patch.forget_identity(0);
        patch.explain("PodDeleted".to_owned(), String::new());
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            json!({ "ready": false, "runnerId": null, "runnerName": null, "reason": "PodDeleted", "message": null })
        );
        assert!(matches!(
            patch.to_patch(&BTreeMap::new()).unwrap(),
            Patch::Merge(_)
        ));
    }

    #[test]
    fn leaving_a_registration_takes_its_job_and_holds_only_while_it_is_recorded() {
        let mut patch = StatusPatch {
            runner_id: Some(Some(8)),
            runner_name: Some(Some("arc-runner".to_owned())),
            ..StatusPatch::default()
        };
        patch.leave_registration(7);
        assert!(!patch.is_empty());
        let Patch::Json(ops) = patch.to_patch(&BTreeMap::new()).unwrap() else {
            panic!("a registration-guarded JSON patch");
        };
        let busy_under_7 = json!({"status": {"runnerId": 7, "runnerName": "arc-runner", "jobId": "j",
            "jobRequestId": 3, "jobRepositoryName": "o/r", "jobWorkflowRef": "o/r/w@main", "workflowRunId": 9,
            "jobDisplayName": "build"}});
        let mut doc = busy_under_7.clone();
        json_patch::patch(&mut doc, &ops).expect("the status records 7");
        assert_eq!(
            doc,
            json!({"status": {"runnerId": 8, "runnerName": "arc-runner"}})
        );
        let mut already_moved = json!({"status": {"runnerId": 8, "jobId": "k"}});
        assert!(
            json_patch::patch(&mut already_moved, &ops).is_err(),
            "a job of the next registration is not taken"
        );
        // A failure recorded with the leave joins those the status holds (a JSON patch replaces the map).
        let at = Time(Timestamp::now());
        let mut failed = StatusPatch {
            failures: Some([("pod-2".to_owned(), at.clone())].into()),
            ..StatusPatch::default()
        };
        failed.forget_identity(7);
        let held: BTreeMap<String, Time> = [("pod-1".to_owned(), at.clone())].into();
        let Patch::Json(ops) = failed.to_patch(&held).unwrap() else {
            panic!("a registration-guarded JSON patch");
        };
        let mut doc = json!({"status": {"runnerId": 7, "failures": held, "jobId": "j"}});
        json_patch::patch(&mut doc, &ops).expect("the status records 7");
        let failures = doc["status"]["failures"].as_object().expect("failures");
        assert_eq!(failures.len(), 2, "{doc}");
        assert!(doc["status"].get("jobId").is_none() && doc["status"].get("runnerId").is_none());
        // Nothing recorded: nothing to guard, and no job could have been written under a registration.
        let mut first = StatusPatch {
            runner_id: Some(Some(8)),
            ..StatusPatch::default()
        };
        first.leave_registration(0);
        assert!(matches!(
            first.to_patch(&BTreeMap::new()).unwrap(),
            Patch::Merge(_)
        ));
    }
}
