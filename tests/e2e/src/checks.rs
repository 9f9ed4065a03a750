//! The invariants every end-to-end suite ends with. Each check returns every violation it finds, so a failing
//! suite says everything that went wrong at once.

use std::collections::BTreeSet;
use std::time::Duration;

use fake_actions_service::JobState;
use kube::ResourceExt;

use crate::world::World;
use crate::{Error, Result};

/// Every job in `ids` completed; none was started twice (by the fake's count and by the simulator's); none was
/// interrupted by a pod deleted under it. Jobs in `cancelled` must have completed as `canceled`, the others as
/// `succeeded` after exactly one start.
pub fn jobs_completed_exactly_once(world: &World, ids: &[i64], cancelled: &[i64]) -> Vec<String> {
    let snapshot = world.fake.state().snapshot();
    let interrupted_on_purpose = world.simulator.jobs_interrupted_on_purpose();
    let mut problems = Vec::new();
    for &id in ids {
        let Some(job) = snapshot.jobs.iter().find(|j| j.request_id == id) else {
            problems.push(format!("job {id} is unknown to the fake"));
            continue;
        };
        if job.state != JobState::Completed {
            problems.push(format!("job {id} is {:?}, not completed", job.state));
            continue;
        }
        if job.times_started > 1 {
            problems.push(format!("job {id} was started {} times", job.times_started));
        }
        let result = job.result.as_deref().unwrap_or("");
        if interrupted_on_purpose.contains(&id) {
            // Its runner's pod was deleted on purpose while the job ran: the job fails, once.
            if result != "failed" || job.times_started != 1 {
                problems.push(format!(
                    "job {id} interrupted by a pod deletion completed as {result:?} after {} starts",
                    job.times_started
                ));
            }
        } else if cancelled.contains(&id) {
            if result != "canceled" {
                problems.push(format!("cancelled job {id} completed as {result:?}"));
            }
        } else {
            let expected = world.simulator.config().job_result;
            if result != expected || job.times_started != 1 {
                problems.push(format!(
                    "job {id} completed as {result:?} after {} starts (expected {expected:?} after 1)",
                    job.times_started
                ));
            }
        }
    }
    // A re-run is asked for only by a scale set that wants it, and only for a job the cluster interrupted.
    let reruns_asked = world.asks_for_reruns();
    for attempt in snapshot.jobs.iter().filter(|job| job.rerun_of.is_some()) {
        let original = attempt.rerun_of.unwrap_or_default();
        if !reruns_asked {
            problems.push(format!(
                "job {original} was re-run (as {}) although the scale set does not ask for re-runs",
                attempt.request_id
            ));
        } else if !interrupted_on_purpose.contains(&original) {
            problems.push(format!(
                "job {original} was re-run (as {}) although nothing interrupted it",
                attempt.request_id
            ));
        }
    }
    for (job, pods) in world.simulator.jobs_served_twice() {
        problems.push(format!("job {job} was served by several runners: {pods:?}"));
    }
    if snapshot.jit_config_reuses > 0 {
        problems.push(format!(
            "{} runner(s) started with a JIT config another runner had used",
            snapshot.jit_config_reuses
        ));
    }
    let interrupted = world.simulator.stats().jobs_interrupted;
    if interrupted > 0 {
        problems.push(format!(
            "{interrupted} jobs were interrupted by a runner pod deletion"
        ));
    }
    problems
}

/// No runner was reported as having lost its pod under a job (Warning Event `RunnerPodDeleted`), for a run in
/// which nothing deleted or evicted a pod: a finished runner's own teardown is no interruption.
pub async fn no_false_interruptions(world: &World) -> Result<Vec<String>> {
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(world.client(), world.namespace());
    let reported: Vec<String> = events
        .list(&kube::api::ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|event| {
            event.reason.as_deref() == Some(controller::ephemeral_runner::POD_DELETED_EVENT)
        })
        .filter_map(|event| event.regarding.and_then(|regarding| regarding.name))
        .collect();
    Ok(if reported.is_empty() {
        Vec::new()
    } else {
        vec![format!(
            "{} runner(s) reported a pod lost under a job while no pod was deleted by anyone else: {:?}",
            reported.len(),
            reported.iter().take(5).collect::<Vec<_>>()
        )]
    })
}

/// Every runner pod belongs to an existing EphemeralRunner, every JIT Secret too, every EphemeralRunner to an
/// existing EphemeralRunnerSet, and every runner registered in the fake for this scale set to an
/// EphemeralRunner.
pub async fn no_orphans(world: &World) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let runners = world.ephemeral_runners().await?;
    let runner_uids: BTreeSet<String> = runners.iter().filter_map(|r| r.uid()).collect();
    let set_uids: BTreeSet<String> = world
        .ephemeral_runner_sets()
        .await?
        .iter()
        .filter_map(|s| s.uid())
        .collect();
    let owned_by = |refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
                    kind: &str,
                    uids: &BTreeSet<String>| {
        refs.iter()
            .any(|o| o.kind == kind && o.controller == Some(true) && uids.contains(&o.uid))
    };
    for pod in world.runner_pods().await? {
        // A pod being deleted has been let go by its owner already.
        if pod.metadata.deletion_timestamp.is_none()
            && !owned_by(pod.owner_references(), "EphemeralRunner", &runner_uids)
        {
            problems.push(format!(
                "runner pod {} has no EphemeralRunner",
                pod.name_any()
            ));
        }
    }
    for secret in world.jit_secrets().await? {
        if secret.metadata.deletion_timestamp.is_none()
            && !owned_by(secret.owner_references(), "EphemeralRunner", &runner_uids)
        {
            problems.push(format!(
                "JIT Secret {} has no EphemeralRunner",
                secret.name_any()
            ));
        }
    }
    for runner in &runners {
        if !owned_by(runner.owner_references(), "EphemeralRunnerSet", &set_uids) {
            problems.push(format!(
                "EphemeralRunner {} has no EphemeralRunnerSet",
                runner.name_any()
            ));
        }
    }
    let names: BTreeSet<String> = runners.iter().map(ResourceExt::name_any).collect();
    let scale_set = world.scale_set_id();
    for registered in world.fake.state().snapshot().runners {
        if Some(registered.scale_set_id) == scale_set && !names.contains(&registered.name) {
            problems.push(format!(
                "runner {} ({}) is registered in the fake without an EphemeralRunner",
                registered.name, registered.id
            ));
        }
    }
    Ok(problems)
}

/// Uninstalls the scale set and waits until nothing of it is left: no AutoscalingRunnerSet, listener,
/// EphemeralRunnerSet, EphemeralRunner, runner pod or JIT Secret, no rendered object (their cleanup-protection
/// finalizers removed), no runner registered in the fake and no scale set in the fake.
pub async fn uninstall_leaves_nothing(world: &World, timeout: Duration) -> Result<()> {
    let scale_set = world.scale_set_id();
    world.uninstall().await?;
    world
        .eventually(
            "the uninstalled scale set to disappear",
            timeout,
            || async {
                let mut left = world.rendered_left().await?;
                left.extend(
                    world
                        .listeners()
                        .await?
                        .iter()
                        .map(|l| format!("AutoscalingListener/{}", l.name_any())),
                );
                left.extend(
                    world
                        .listener_pods()
                        .await?
                        .iter()
                        .map(|p| format!("listener Pod/{}", p.name_any())),
                );
                left.extend(
                    world
                        .ephemeral_runner_sets()
                        .await?
                        .iter()
                        .map(|s| format!("EphemeralRunnerSet/{}", s.name_any())),
                );
                left.extend(
                    world
                        .ephemeral_runners()
                        .await?
                        .iter()
                        .map(|r| format!("EphemeralRunner/{}", r.name_any())),
                );
                left.extend(
                    world
                        .runner_pods()
                        .await?
                        .iter()
                        .map(|p| format!("runner Pod/{}", p.name_any())),
                );
                left.extend(
                    world
                        .jit_secrets()
                        .await?
                        .iter()
                        .map(|s| format!("JIT Secret/{}", s.name_any())),
                );
                let snapshot = world.fake.state().snapshot();
                if let Some(id) = scale_set {
                    left.extend(
                        snapshot
                            .runners
                            .iter()
                            .filter(|r| r.scale_set_id == id)
                            .map(|r| format!("fake runner {}", r.name)),
                    );
                    if snapshot.scale_sets.iter().any(|s| s.id == id) {
                        left.push(format!("fake scale set {id}"));
                    }
                }
                Ok((left.is_empty(), format!("{left:?}")))
            },
        )
        .await
}

/// Turns a list of problems into an error naming them all.
pub fn ensure(problems: Vec<String>) -> Result<()> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Invariant(problems.join("; ")))
    }
}

/// The end of every suite: every job enqueued through the world completes, the set comes back to
/// `min_runners` idle runners, then every invariant is checked and an uninstall must leave nothing behind.
/// `cancelled` jobs must have completed as `canceled`.
pub async fn settle_and_verify(
    world: &World,
    min_runners: usize,
    cancelled: &[i64],
    timeout: Duration,
) -> Result<()> {
    let ids = world.enqueued();
    world.wait_jobs_completed(&ids, timeout).await?;
    world.wait_idle(min_runners, timeout).await?;
    let mut problems = jobs_completed_exactly_once(world, &ids, cancelled);
    problems.extend(no_orphans(world).await?);
    problems.extend(world.simulator.problems());
    problems.extend(world.executor_errors());
    ensure(problems)?;
    uninstall_leaves_nothing(world, timeout).await
}
