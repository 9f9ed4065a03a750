//! What the EphemeralRunnerSet controller may know about a runner, from this controller's point of view: the one
//! module of the runner controller the set imports. It imports nothing from the set.

use crds::EphemeralRunner;
use kube::{Resource, ResourceExt};

use super::pod::JitIdentity;
use super::policy::{PodVerdict, judge_pod};
use crate::pods::CachedPod;

pub use super::memory::RunnerMemory;
pub use super::policy::runner_not_started;

/// Whether a runner's end has come, which the teardown lane carries out ([`super::run_teardown`]): it is being deleted, or
/// its pod succeeded (the runner ran its one job and exited 0) while it is not already done. A pod being deleted
/// whose idle runner exited 0 on the way is the main lane's: a pod taken away (`decide`).
pub fn in_teardown(runner: &EphemeralRunner, pod: Option<&CachedPod>) -> bool {
    runner.meta().deletion_timestamp.is_some()
        || (!runner.is_done()
            && pod.is_some_and(|pod| {
                judge_pod(pod) == PodVerdict::Succeeded
                    && (pod.meta().deletion_timestamp.is_none() || runner.has_job())
            }))
}

/// Whether runner `uid`, ending under registration `registration` (0: not known), may have taken a job with it,
/// so that its set keeps its place until the listener's target leaves the job out (`crate::completions`). Not
/// when this process removed that registration before the end: the service consents to a removal only while the
/// runner holds no job, and gives a removed registration none. A scale-down deregisters an idle runner and then
/// deletes it, and its pod may exit 0 in between; holding its place would delay the set's next runner by the
/// hold (10 s).
pub fn may_have_left_with_job(memory: &RunnerMemory, uid: &str, registration: i64) -> bool {
    registration == 0 || !memory.was_deregistered(uid, registration)
}

/// The registration `runner` runs under as far as this process knows: the one its status records, or, until the
/// status records one, the one this process created its pod `pod` under (the identity goes into the status with
/// the pod's first state worth showing, see the runner controller's pod creation). With no pod, the registration
/// of the latest pod this process created, until its config is discarded: a pod that vanished between two passes
/// leaves a registration that must still be removed.
pub(crate) fn known_identity(
    memory: &RunnerMemory,
    runner: &EphemeralRunner,
    pod: Option<&CachedPod>,
) -> Option<JitIdentity> {
    let status = runner.status.as_ref();
    if let Some(status) = status.filter(|status| status.runner_id != 0) {
        return Some(JitIdentity {
            runner_id: status.runner_id,
            runner_name: status.runner_name.clone(),
        });
    }
    let uid = runner.uid().unwrap_or_default();
    match pod {
        Some(pod) => memory.identity_of_pod(&uid, &pod.uid().unwrap_or_default()),
        None => memory.identity_of_gone_pod(&uid),
    }
    .map(|(runner_id, runner_name)| JitIdentity {
        runner_id,
        runner_name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::constants::{RUNNER_CONTAINER_NAME, phase};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    #[test]
    fn a_runner_deregistered_while_idle_never_holds_a_place_for_a_job() {
        let memory = RunnerMemory::default();
        assert!(
            may_have_left_with_job(&memory, "u", 0),
            "nothing known: held"
        );
        assert!(may_have_left_with_job(&memory, "u", 7));
        memory.deregistered("u", 7);
        assert!(!may_have_left_with_job(&memory, "u", 7));
        // Another registration of the runner, or another runner: still held.
        assert!(may_have_left_with_job(&memory, "u", 8));
        assert!(may_have_left_with_job(&memory, "v", 7));
    }

    #[test]
    fn the_teardown_lane_takes_deleted_runners_and_runners_whose_pod_succeeded() {
        let runner = |deleting: bool, phase: &str| -> EphemeralRunner {
            serde_json::from_value(json!({
                "metadata": {
                    "name": "r", "namespace": "ns",
                    "deletionTimestamp": deleting.then_some("2026-01-01T00:00:00Z"),
                },
                "spec": {
                    "githubConfigUrl": "https://github.com/org", "githubConfigSecret": "creds",
                    "runnerScaleSetId": 1, "metadata": {}, "spec": { "containers": [] },
                },
                "status": { "phase": phase },
            }))
            .unwrap()
        };
        let pod = |phase: &str, exit_code: i32| -> CachedPod {
            serde_json::from_value(json!({
                "metadata": { "name": "r", "namespace": "ns" },
                "status": {
                    "phase": phase,
                    "containerStatuses": [{
                        "name": RUNNER_CONTAINER_NAME, "image": "i", "imageID": "", "ready": false,
                        "restartCount": 0,
                        "state": { "terminated": { "exitCode": exit_code } },
                    }],
                },
            }))
            .unwrap()
        };
        let succeeded = pod("Succeeded", 0);
        let failed = pod("Failed", 1);
        assert!(in_teardown(&runner(true, phase::RUNNING), None));
        assert!(in_teardown(&runner(true, phase::FAILED), Some(&failed)));
        assert!(in_teardown(
            &runner(false, phase::RUNNING),
            Some(&succeeded)
        ));
        // Following, restarting and keeping done runners' places is the main lane's.
        assert!(!in_teardown(&runner(false, phase::RUNNING), None));
        assert!(!in_teardown(&runner(false, phase::RUNNING), Some(&failed)));
        assert!(!in_teardown(
            &runner(false, phase::FAILED),
            Some(&succeeded)
        ));
        // An idle runner that exited 0 as its pod was deleted or evicted: a pod taken away, the main lane's.
        let mut evicted = succeeded.clone();
        evicted.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1).unwrap()));
        assert!(!in_teardown(&runner(false, phase::RUNNING), Some(&evicted)));
        let mut busy = runner(false, phase::RUNNING);
        busy.status.as_mut().unwrap().job_id = "job".into();
        assert!(
            in_teardown(&busy, Some(&evicted)),
            "with a job, exit 0 finished it"
        );
    }
}
