//! The real-node tier's end-to-end suite: the chart-installed scale set with the manager in-process, the
//! listener as a real pod from the project image and the runners as real pods from the runner image, on a real
//! kubelet and containerd (tests/harness `node`), against the fake Actions Service. Nothing is simulated: the
//! kubelet reports every pod phase, the runner image reports to the fake over HTTP.
//!
//! Needs root, containerd, runc and the CNI plugins (`tests/env/provision-node.sh`); without them every test
//! prints a loud SKIPPED message and returns, and with `CI=true` it fails. The tests take turns: each has a
//! node of its own, and two cores run one node's pods at a time well.

use std::collections::BTreeSet;
use std::time::Duration;

use crds::AutoscalingRunnerSet;
use e2e::node_world::{NodeWorld, RELEASE, percentile};
use fake_actions_service::JobState;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, EvictParams, ListParams};
use kube::{Api, ResourceExt};
use node_images::constants::env;
use serde_json::json;
use test_harness::node_tier;

/// One test at a time (see the module's doc).
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The end-to-end run: 50 jobs through the chart-installed scale set, the listener a real pod from the
/// project image (its ServiceAccount token, Role and RoleBinding enforced by the API server, its liveness probe
/// wired to the kubelet), the runners real pods from the runner image, at most 10 at a time: every job
/// completed exactly once, each on a runner pod of its own; nothing left after uninstall. Prints the pods'
/// start latency (created → runner container started, as the kubelet reports it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_jobs_run_on_real_runner_pods_each_exactly_once_and_nothing_is_left() {
    let Some(parts) = node_tier("e2e: fifty jobs on a real node") else {
        return;
    };
    let _turn = TURN.lock().await;
    let world = NodeWorld::start(
        "node-jobs",
        &parts,
        0,
        10,
        json!({"env": [{"name": env::JOB_MS, "value": "1000"}]}),
    )
    .await;
    world.wait_listening().await;

    let started = std::time::Instant::now();
    let ids = world.enqueue(50);
    let snapshot = world.wait_jobs_completed(&ids).await;
    let took = started.elapsed();
    let mut problems = Vec::new();
    for id in &ids {
        let job = snapshot
            .jobs
            .iter()
            .find(|j| j.request_id == *id)
            .expect("job");
        if job.times_started != 1 || job.result.as_deref() != Some("succeeded") {
            problems.push(format!(
                "job {id}: started {} times, result {:?}",
                job.times_started, job.result
            ));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
    // Every job ran on a runner pod of its own, which exited 0 and was removed with its EphemeralRunner.
    let runners: std::collections::BTreeSet<_> = snapshot
        .jobs
        .iter()
        .filter_map(|j| j.runner_name.clone())
        .collect();
    assert_eq!(runners.len(), ids.len(), "one runner per job: {runners:?}");
    world.wait_idle(0).await;
    let latencies = world.start_latencies();
    eprintln!(
        "{} jobs in {:.1} s; runner pods: {}; create -> container started: p50 {:.2} s, p90 {:.2} s, max {:.2} s",
        ids.len(),
        took.as_secs_f64(),
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.9),
        percentile(&latencies, 1.0)
    );
    assert_eq!(snapshot.jit_config_reuses, 0);
    assert!(latencies.len() >= ids.len(), "{latencies:?}");

    world.uninstall_leaves_nothing().await;
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_runners_pod_deleted_gets_a_fresh_registration_and_pod_not_a_failure() {
    let Some(parts) = node_tier("e2e: idle runner pod deleted") else {
        return;
    };
    let _turn = TURN.lock().await;
    let world = NodeWorld::start("node-idle-del", &parts, 1, 2, json!({})).await;
    world.wait_listening().await;
    let before = world.wait_idle(1).await.remove(0);
    let er_name = before.name_any();
    let old_pod = world.runner_pods().await.remove(0);
    let old_runner_id = before
        .status
        .as_ref()
        .map(|s| s.runner_id)
        .unwrap_or_default();

    world
        .ctx
        .api::<Pod>()
        .delete(&old_pod.name_any(), &DeleteParams::default())
        .await
        .expect("delete the idle runner's pod");

    // A fresh registration and a new pod take the idle runner's place, and nothing counts as a failure.
    // The same EphemeralRunner gets them (docs/runner-lifecycle.md, "A pod deleted, evicted or stuck
    // terminating"), also when the runner saw its registration removed and exited 0 on the way: an idle runner's
    // exit 0 in a pod being deleted is a pod taken away, not a finished runner. A new EphemeralRunner in its
    // place (a finished one replaced by the set) would be correct too.
    let after = world.wait_idle(1).await.remove(0);
    let status = after.status.clone().unwrap_or_default();
    assert_ne!(status.runner_id, old_runner_id, "a fresh registration");
    assert!(status.failures.is_empty(), "no failure counted: {status:?}");
    let pod = world.runner_pods().await.remove(0);
    assert_ne!(pod.uid(), old_pod.uid(), "a new pod");
    let snapshot = world.fake.state().snapshot();
    assert!(
        !snapshot.runners.iter().any(|r| r.id == old_runner_id),
        "the old registration is gone"
    );
    if after.name_any() == er_name {
        let events: Vec<String> = world
            .ctx
            .api::<Event>()
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.name.as_deref() == Some(er_name.as_str())
                    && e.involved_object.kind.as_deref() == Some("EphemeralRunner")
            })
            .map(|e| format!("{:?}/{:?}", e.type_, e.reason))
            .collect();
        eprintln!("the same EphemeralRunner {er_name} got a new pod; its events: {events:?}");
        assert!(
            events.iter().all(|e| !e.starts_with("Some(\"Warning\")")),
            "an idle pod deleted is no warning: {events:?}"
        );
    } else {
        eprintln!(
            "the runner exited 0 when its registration went; EphemeralRunner {} replaced {er_name}",
            after.name_any()
        );
    }
    // And the runner serves a job.
    let ids = world.enqueue(1);
    world.wait_jobs_completed(&ids).await;
    world.wait_idle(1).await;
    world.uninstall_leaves_nothing().await;
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_runners_pod_deleted_is_deregistered_and_deleted_with_an_event() {
    let Some(parts) = node_tier("e2e: busy runner pod deleted") else {
        return;
    };
    let _turn = TURN.lock().await;
    let world = NodeWorld::start("node-busy-del", &parts, 0, 2, json!({})).await;
    world.wait_listening().await;
    let ids = world.enqueue(1);
    // The job runs for JOB_MS: find its runner while it does.
    let (er_name, runner_id, pod_name) = world
        .eventually("the job running on a runner pod", || async {
            let snapshot = world.fake.state().snapshot();
            let job = snapshot.jobs.iter().find(|j| j.request_id == ids[0])?;
            if job.state != JobState::Running {
                return None;
            }
            let name = job.runner_name.clone()?;
            let pod = world
                .runner_pods()
                .await
                .into_iter()
                .find(|p| p.name_any() == name)?;
            Some((name, job.runner_id?, pod.name_any()))
        })
        .await;
    world
        .ctx
        .api::<Pod>()
        .delete(&pod_name, &DeleteParams::default())
        .await
        .expect("delete the busy runner's pod");

    // The runner is deregistered and its EphemeralRunner deleted, not restarted with the job lost silently.
    world
        .eventually("the busy runner deregistered and deleted", || async {
            let gone = !world
                .ephemeral_runners()
                .await
                .iter()
                .any(|er| er.name_any() == er_name);
            let deregistered = !world
                .fake
                .state()
                .snapshot()
                .runners
                .iter()
                .any(|r| r.id == runner_id);
            (gone && deregistered).then_some(())
        })
        .await;
    let events: Vec<Event> = world
        .ctx
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        // The pod has the runner's name too; the runner's own Events are the controller's word.
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(er_name.as_str())
                && e.involved_object.kind.as_deref() == Some("EphemeralRunner")
        })
        .collect();
    let reasons: Vec<String> = events
        .iter()
        .map(|e| format!("{:?}/{:?}: {:?}", e.type_, e.reason, e.message))
        .collect();
    eprintln!("EphemeralRunner {er_name}'s events: {reasons:#?}");
    assert!(
        events.iter().any(|e| e.type_.as_deref() == Some("Warning")),
        "a Warning Event tells why the busy runner went: {reasons:#?}"
    );
    // The job ended when its runner died (the runner image fails it on SIGTERM), not run twice.
    let snapshot = world.wait_jobs_completed(&ids).await;
    let job = snapshot
        .jobs
        .iter()
        .find(|j| j.request_id == ids[0])
        .expect("job");
    assert_eq!(job.times_started, 1, "{job:?}");
    world.wait_idle(0).await;
    assert_eq!(
        world.fake.state().snapshot().job_reruns,
        0,
        "a scale set that does not ask for re-runs gets none"
    );
    world.uninstall_leaves_nothing().await;
    world.finish().await;
}

/// A runner OOM-killed mid-job, in a scale set that asks for the re-run of interrupted jobs: the kubelet reports
/// `OOMKilled`/137 and the pod fails. The service still counts the runner busy until it stops hearing from it (the
/// fake's lost-runner timeout, as the service fails the job of a runner that lost communication), so the controller
/// cannot deregister it at once; it must not restart it either (the job is gone). The runner is deleted with a
/// Warning Event that names the OOM kill, the job fails once, and once it has, GitHub is asked to run it again:
/// exactly one new attempt, which is OOM-killed in its turn and, the set's limit being one re-run, not re-run again.
/// Nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_runner_oom_killed_is_finished_with_an_event_and_its_job_runs_again_once() {
    let Some(parts) = node_tier("e2e: busy runner OOM-killed") else {
        return;
    };
    let _turn = TURN.lock().await;
    // The runner grows its memory once its job starts, within a 64 MiB limit the kernel enforces.
    let world = NodeWorld::start_with_values(
        "node-oom",
        &parts,
        0,
        1,
        json!({
            "env": [
                {"name": env::GROW_MEMORY, "value": "1"},
                {"name": env::JOB_MS, "value": "60000"},
            ],
            "resources": {"limits": {"memory": "64Mi"}, "requests": {"memory": "64Mi"}},
        }),
        json!({"rerunInterruptedJobs": {"enabled": true}}),
    )
    .await;
    world.wait_listening().await;
    let ids = world.enqueue(1);
    let (er_name, runner_id) = world
        .eventually("the job started on a runner", || async {
            let snapshot = world.fake.state().snapshot();
            let job = snapshot.jobs.iter().find(|j| j.request_id == ids[0])?;
            (job.state == JobState::Running).then(|| (job.runner_name.clone(), job.runner_id))
        })
        .await;
    let (er_name, runner_id) = (er_name.expect("runner name"), runner_id.expect("runner id"));
    // The kubelet reports the kill: the container terminated with reason OOMKilled.
    let reason = world
        .eventually("the runner container OOM-killed", || async {
            let pod = world
                .runner_pods()
                .await
                .into_iter()
                .find(|p| p.name_any() == er_name)?;
            let terminated = pod
                .status?
                .container_statuses?
                .first()?
                .state
                .clone()?
                .terminated?;
            Some((terminated.reason, terminated.exit_code))
        })
        .await;
    assert_eq!(reason, (Some("OOMKilled".to_owned()), 137));
    // A runner that held a job is not restarted: deregistered and deleted, with a Warning Event.
    world
        .eventually("the OOM-killed runner deregistered and deleted", || async {
            let gone = !world
                .ephemeral_runners()
                .await
                .iter()
                .any(|er| er.name_any() == er_name);
            let deregistered = !world
                .fake
                .state()
                .snapshot()
                .runners
                .iter()
                .any(|r| r.id == runner_id);
            (gone && deregistered).then_some(())
        })
        .await;
    let events = || async {
        world
            .ctx
            .api::<Event>()
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
    };
    let warnings: Vec<String> = events()
        .await
        .into_iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(er_name.as_str())
                && e.involved_object.kind.as_deref() == Some("EphemeralRunner")
                && e.type_.as_deref() == Some("Warning")
        })
        .filter_map(|e| e.message)
        .collect();
    eprintln!("EphemeralRunner {er_name}'s warnings: {warnings:#?}");
    assert!(
        warnings.iter().any(|note| note.contains("was OOM-killed")),
        "a Warning Event says the runner's pod was OOM-killed: {warnings:#?}"
    );
    let job = world.fake.state().job(ids[0]).expect("job");
    assert_eq!(
        job.times_started, 1,
        "the job was not run again in place: {job:?}"
    );
    assert_eq!(
        (job.state, job.result.as_deref(), job.runner_lost),
        (JobState::Completed, Some("failed"), true),
        "the service failed the job of its lost runner: {job:?}"
    );
    // GitHub runs it again as a new attempt, which the set serves; OOM-killed again, it is not re-run a second time.
    let attempt = world
        .eventually("the re-run attempt ended", || async {
            let snapshot = world.fake.state().snapshot();
            snapshot
                .jobs
                .into_iter()
                .find(|j| j.rerun_of == Some(ids[0]) && j.state == JobState::Completed)
        })
        .await;
    assert_eq!(
        (
            attempt.run_attempt,
            attempt.times_started,
            attempt.result.as_deref()
        ),
        (2, 1, Some("failed")),
        "{attempt:?}"
    );
    world
        .eventually("the re-run's limit reported", || async {
            events()
                .await
                .iter()
                .any(|e| e.reason.as_deref() == Some("JobRerunLimitReached"))
                .then_some(())
        })
        .await;
    world.wait_idle(0).await;
    let snapshot = world.fake.state().snapshot();
    assert_eq!(snapshot.job_reruns, 1, "one re-run in all");
    assert!(
        events().await.iter().any(|e| {
            e.reason.as_deref() == Some("JobRerun")
                && e.involved_object.kind.as_deref() == Some("EphemeralRunnerSet")
                && e.message
                    .as_deref()
                    .is_some_and(|note| note.contains("was OOM-killed"))
        }),
        "a JobRerun Event on the runner set names the OOM kill"
    );
    world.uninstall_leaves_nothing().await;
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_runner_ignoring_sigterm_stays_terminating_for_its_grace_period_then_gets_a_fresh_pod()
 {
    let Some(parts) = node_tier("e2e: idle runner stuck Terminating") else {
        return;
    };
    let _turn = TURN.lock().await;
    // The template's grace period is 10 s. The runner ignores SIGTERM and hangs (it never reports online, so
    // losing its registration does not end it either): only the kubelet's SIGKILL ends it.
    let world = NodeWorld::start(
        "node-stuck",
        &parts,
        1,
        1,
        json!({"env": [
            {"name": env::IGNORE_SIGTERM, "value": "1"},
            {"name": env::HANG, "value": "1"},
        ]}),
    )
    .await;
    world.wait_listening().await;
    let (before, old_pod) = world.running_runner_and_pod(None).await;
    let er_name = before.name_any();
    let old_runner_id = before
        .status
        .as_ref()
        .map(|s| s.runner_id)
        .unwrap_or_default();
    let pods = world.ctx.api::<Pod>();
    let deleted_at = std::time::Instant::now();
    pods.delete(&old_pod.name_any(), &DeleteParams::default())
        .await
        .expect("delete the idle runner's pod");

    // While the pod is Terminating the idle runner is released: the service must give it no job.
    world
        .eventually(
            "the old registration released while the pod terminates",
            || async {
                let released = !world
                    .fake
                    .state()
                    .snapshot()
                    .runners
                    .iter()
                    .any(|r| r.id == old_runner_id);
                released.then_some(())
            },
        )
        .await;
    let still_there = pods
        .get_opt(&old_pod.name_any())
        .await
        .expect("get")
        .is_some_and(|p| p.uid() == old_pod.uid());
    assert!(
        still_there,
        "the runner ignores SIGTERM, so its pod is still Terminating ({:?} after the delete)",
        deleted_at.elapsed()
    );
    world
        .eventually("the old pod gone", || async {
            let current = pods.get_opt(&old_pod.name_any()).await.ok()?;
            current
                .is_none_or(|p| p.uid() != old_pod.uid())
                .then_some(())
        })
        .await;
    let terminating_for = deleted_at.elapsed();
    eprintln!(
        "the pod of a runner ignoring SIGTERM was gone {terminating_for:?} after its deletion"
    );
    assert!(
        terminating_for >= Duration::from_secs(8),
        "the kubelet waits the grace period (10 s) before SIGKILL: {terminating_for:?}"
    );
    // Then the same runner comes back with a fresh registration and pod, no failure counted.
    let (after, _) = world.running_runner_and_pod(Some(&old_pod)).await;
    assert_eq!(after.name_any(), er_name);
    let status = after.status.clone().unwrap_or_default();
    assert_ne!(status.runner_id, old_runner_id, "a fresh registration");
    assert!(status.failures.is_empty(), "no failure counted: {status:?}");
    world.uninstall_leaves_nothing().await;
    world.finish().await;
}

/// An image that is not on the node, with `imagePullPolicy: Never`: the kubelet leaves the runner container
/// waiting with `ErrImageNeverPull`. The set says its runners cannot start (`RunnersCanStart=False`,
/// `ImagePullFailed`, with what to fix); the runner is registered once and never comes online, no failure is
/// counted and no registration is churned (one JIT config issued, none used); uninstalling leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_image_missing_on_the_node_makes_the_set_say_runners_cannot_start() {
    let Some(parts) = node_tier("e2e: runner image missing") else {
        return;
    };
    let _turn = TURN.lock().await;
    let world = NodeWorld::start(
        "node-noimage",
        &parts,
        1,
        1,
        json!({"image": "docker.io/arc-rs/no-such-runner:test"}),
    )
    .await;
    world.wait_listening().await;
    let (er_name, message) = world
        .eventually(
            "the runner container waiting with ErrImageNeverPull",
            || async {
                let pod = world.runner_pods().await.into_iter().next()?;
                let waiting = pod
                    .status?
                    .container_statuses?
                    .first()?
                    .state
                    .clone()?
                    .waiting?;
                (waiting.reason.as_deref() == Some("ErrImageNeverPull"))
                    .then(|| (pod.metadata.name.unwrap_or_default(), waiting.message))
            },
        )
        .await;
    eprintln!("the kubelet: ErrImageNeverPull: {message:?}");
    let condition = world
        .wait_set_condition("RunnersCanStart", "False", "ImagePullFailed")
        .await;
    eprintln!("RunnersCanStart=False: {condition}");
    assert!(
        condition.contains(&er_name) && condition.contains("fix the image name"),
        "the condition names the runner and what to fix: {condition}"
    );
    // It stays so: one registration, never online, no failure counted, the same pod.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let snapshot = world.fake.state().snapshot();
    let runners: Vec<_> = snapshot
        .runners
        .iter()
        .filter(|r| Some(r.scale_set_id) == world.scale_set_id())
        .collect();
    assert_eq!(runners.len(), 1, "{runners:?}");
    assert!(!runners[0].online, "the runner never ran: {runners:?}");
    assert_eq!(world.fake.state().count("generate_jit_config"), 1);
    let ers = world.ephemeral_runners().await;
    assert_eq!(ers.len(), 1);
    let status = ers[0].status.clone().unwrap_or_default();
    assert!(status.failures.is_empty(), "no failure counted: {status:?}");
    assert_eq!(world.runner_pods().await.len(), 1);
    world.uninstall_leaves_nothing().await;
    world.finish().await;
}

/// A runner container that exits 1 at once, every time. Each exit is a counted failure
/// (`status.failures`), and each next pod gets a fresh JIT config after a backoff. Past the budget
/// (`--runner-max-pod-failures`, 5: the sixth failure) the runner is given up: Warning `RetriesExhausted`,
/// deregistered and deleted, and the set makes a replacement (docs/runner-lifecycle.md, "Given up"); ARC instead
/// leaves a `Failed` EphemeralRunner in the set. Meanwhile the set says `RunnersCanStart=False`
/// (`RunnerPodsFailing`). No JIT config is used twice; uninstalling leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_exiting_1_five_times_is_given_up_and_replaced() {
    let Some(parts) = node_tier("e2e: runner exits 1 again and again") else {
        return;
    };
    let _turn = TURN.lock().await;
    let world = NodeWorld::start(
        "node-exit1",
        &parts,
        1,
        1,
        json!({"env": [{"name": env::EXIT_AT_START, "value": "1"}]}),
    )
    .await;
    world.wait_listening().await;
    let first = world
        .eventually("the first EphemeralRunner", || async {
            world.ephemeral_runners().await.into_iter().next()
        })
        .await
        .name_any();
    let message = world
        .wait_set_condition("RunnersCanStart", "False", "RunnerPodsFailing")
        .await;
    eprintln!("RunnersCanStart=False: {message}");
    let warnings = world
        .eventually("the first runner given up and gone", || async {
            let gone = !world
                .ephemeral_runners()
                .await
                .iter()
                .any(|er| er.name_any() == first);
            let events = world.events_about("EphemeralRunner", &first).await;
            (gone && events.iter().any(|e| e.contains("RetriesExhausted"))).then_some(events)
        })
        .await;
    eprintln!("{first}: {warnings:#?}");
    // Its six pods each exited 1 (as the kubelet reported), each with a JIT config of its own.
    let exits: Vec<Option<i32>> = world
        .pods_seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .filter(|t| t.name == first)
        .map(|t| t.exit_code)
        .collect();
    eprintln!("pods of {first} seen: exit codes {exits:?}");
    assert!(
        exits.iter().all(|code| code.is_none_or(|c| c == 1)) && exits.contains(&Some(1)),
        "{exits:?}"
    );
    let issued = world.fake.state().count("generate_jit_config");
    assert!(issued >= 6, "a fresh JIT config per pod: {issued}");
    let snapshot = world.fake.state().snapshot();
    assert_eq!(snapshot.jit_config_reuses, 0);
    // The replacement follows the same path; the set keeps at most one registration.
    let registered = world.registered_runner_ids();
    assert!(registered.len() <= 1, "{registered:?}");
    world
        .eventually("a replacement runner", || async {
            world
                .ephemeral_runners()
                .await
                .iter()
                .any(|er| er.name_any() != first)
                .then_some(())
        })
        .await;
    world.uninstall_leaves_nothing().await;
    world.finish().await;
}

/// `kubectl drain` of the node with one busy and two idle runners: cordon, then every pod of the scale set
/// evicted through the Eviction API (the listener's too), then uncordon. What an ARC user expects, and what
/// happens:
/// - **idle runners**: their registrations are removed at once (the service can give them no job in their
///   last seconds) and they get fresh JIT configs and new pods (also when the runner process saw its
///   registration go and exited 0: an idle runner's exit in a pod being deleted is not a finished runner),
///   whose pods wait `Unschedulable` while the node is cordoned and run once it is uncordoned; no failure is
///   counted;
/// - **the busy runner**: evicting its pod stops the runner (SIGTERM), so its job fails, as GitHub reports a
///   job whose runner was shut down; nothing can move a running job to another runner. The runner is not
///   restarted (a new pod could never see that job again): Warning Event, deregistered and deleted, and the job
///   is not run again. Protecting busy runners from a drain is the job of a PodDisruptionBudget, not of the
///   controller;
/// - **the listener** pod is re-created by its controller, holds the session again once the node takes pods,
///   and a new job runs on a fresh runner.
///
/// No JIT config is used twice; uninstalling leaves nothing. Prints the drain's figures.
/// A drain as `kubectl drain` does it (cordon, then the Eviction API, retried while refused) with one busy and two
/// idle runners on the node: the idle ones are evicted at once and their registrations removed, the busy one's
/// eviction is refused while its job runs (the set's budget for busy runners, docs/runner-lifecycle.md), and the
/// drain completes once the job has ended, successfully. Idle runners wait for the cordoned node, and come back
/// when it is uncordoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_evicts_idle_runners_at_once_and_waits_for_the_busy_ones_job_to_succeed() {
    let Some(parts) = node_tier("e2e: node drained") else {
        return;
    };
    let _turn = TURN.lock().await;
    // Jobs long enough to be running during the drain's first evictions.
    let world = NodeWorld::start(
        "node-drain",
        &parts,
        2,
        4,
        json!({"env": [{"name": env::JOB_MS, "value": "30000"}]}),
    )
    .await;
    world.wait_listening().await;
    world.wait_idle(2).await;
    let ids = world.enqueue(1);
    let (busy_er, busy_runner, _) = world.wait_jobs_running(&ids).await.remove(0);
    // The set scales to its minimum plus the job: two idle runners beside the busy one.
    let idle_before = world
        .eventually("two idle runners beside the busy one", || async {
            let snapshot = world.fake.state().snapshot();
            let idle: BTreeSet<i64> = snapshot
                .runners
                .iter()
                .filter(|r| {
                    Some(r.scale_set_id) == world.scale_set_id()
                        && r.online
                        && r.job_request_id.is_none()
                })
                .map(|r| r.id)
                .collect();
            let running = world
                .runner_pods()
                .await
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            (idle.len() == 2 && running == 3).then_some(idle)
        })
        .await;
    // The busy pod is protected once the manager labelled it and the disruption controller counted it.
    let budgets = Api::<PodDisruptionBudget>::namespaced(world.client(), &world.ctx.namespace);
    world
        .eventually("the busy runner counted by its set's budget", || async {
            let budget = budgets
                .get_opt(&format!("{RELEASE}-busy-runners"))
                .await
                .ok()??;
            let status = budget.status?;
            (status.current_healthy == Some(1) && status.disruptions_allowed == Some(0))
                .then_some(())
        })
        .await;

    world.set_node_unschedulable(true).await;
    let drained = world.pods_on_node().await;
    let drained_uids: BTreeSet<String> = drained.iter().filter_map(|p| p.uid()).collect();
    let evicted_at = std::time::Instant::now();
    // As `kubectl drain` sees them: a refused eviction answered (429), not retried by the client.
    let evictor = world
        .ctx
        .control_plane
        .client_without_retries()
        .expect("a client");
    let mut refused = Vec::new();
    for pod in &drained {
        match Api::<Pod>::namespaced(evictor.clone(), &self_namespace(pod))
            .evict(&pod.name_any(), &EvictParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 429 => refused.push(pod.clone()),
            Err(error) => panic!("evicting {}: {error}", pod.name_any()),
        }
    }
    let refused_names: Vec<String> = refused.iter().map(ResourceExt::name_any).collect();
    assert_eq!(
        refused_names,
        std::slice::from_ref(&busy_er),
        "only the busy runner's eviction is refused"
    );
    eprintln!(
        "cordoned and evicted {} pods (2 idle runners, 1 listener); the busy runner's eviction refused",
        drained.len() - 1
    );
    world
        .eventually("the idle runners' registrations removed", || async {
            let registered = world.registered_runner_ids();
            idle_before
                .iter()
                .all(|id| !registered.contains(id))
                .then_some(())
        })
        .await;
    let idle_released = evicted_at.elapsed();

    // As `kubectl drain` does: the refused eviction is tried again until it is allowed or the pod is gone.
    let busy_pods = Api::<Pod>::namespaced(evictor.clone(), &self_namespace(&refused[0]));
    let job_ended_before_eviction = world
        .eventually(
            "the busy runner's eviction allowed once its job ended",
            || async {
                match busy_pods.evict(&busy_er, &EvictParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(kube::Error::Api(status)) if status.code == 429 => return None,
                    Err(error) => panic!("evicting {busy_er}: {error}"),
                }
                // Read after the eviction was allowed: a job still running then would be one the eviction stops.
                Some(
                    world
                        .fake
                        .state()
                        .job(ids[0])
                        .is_ok_and(|job| job.state == JobState::Completed),
                )
            },
        )
        .await;
    let drain_done = evicted_at.elapsed();
    let job = world.fake.state().job(ids[0]).expect("job");
    assert_eq!(
        (job.state, job.result.as_deref(), job.times_started),
        (JobState::Completed, Some("succeeded"), 1),
        "the busy runner's job ran to its end once: {job:?}"
    );
    assert!(
        job_ended_before_eviction,
        "the busy runner was evicted only after its job ended"
    );
    world
        .eventually("the busy runner deregistered and gone", || async {
            let gone = !world
                .ephemeral_runners()
                .await
                .iter()
                .any(|er| er.name_any() == busy_er);
            (gone && !world.registered_runner_ids().contains(&busy_runner)).then_some(())
        })
        .await;
    world
        .eventually("every drained pod gone", || async {
            let mut left = world.runner_pods().await;
            left.extend(world.listener_pods().await);
            (!left
                .iter()
                .any(|p| p.uid().is_some_and(|u| drained_uids.contains(&u))))
            .then_some(())
        })
        .await;
    let pods_gone = evicted_at.elapsed();
    // While the node is cordoned a runner that got a new pod waits for the node: the scheduler says so.
    let unschedulable = world
        .eventually("a runner pod waiting for the cordoned node", || async {
            world.runner_pods().await.into_iter().find(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| {
                        c.iter().any(|c| {
                            c.type_ == "PodScheduled"
                                && c.status == "False"
                                && c.reason.as_deref() == Some("Unschedulable")
                        })
                    })
            })
        })
        .await;
    // The set says so: its runners cannot start, in the scheduler's words.
    let blocked = world
        .wait_set_condition("RunnersCanStart", "False", "PodUnschedulable")
        .await;
    eprintln!(
        "while cordoned: pod {} Unschedulable; the set's RunnersCanStart: {blocked}",
        unschedulable.name_any()
    );
    assert!(blocked.contains("unschedulable"), "{blocked}");

    let uncordoned_at = std::time::Instant::now();
    world.set_node_unschedulable(false).await;
    world.wait_listening().await;
    let after = world.wait_idle(2).await;
    let recovered = uncordoned_at.elapsed();
    for er in &after {
        let status = er.status.clone().unwrap_or_default();
        assert!(
            !idle_before.contains(&status.runner_id) && status.runner_id != busy_runner,
            "a fresh registration: {status:?}"
        );
        assert!(status.failures.is_empty(), "no failure counted: {status:?}");
    }
    assert_eq!(world.fake.state().snapshot().jit_config_reuses, 0);
    world
        .wait_set_condition("RunnersCanStart", "True", "RunnersStartable")
        .await;
    eprintln!(
        "drain of 3 runners + listener: idle registrations removed {:.1} s after the evictions, the busy runner's \
         eviction allowed {:.1} s (its job over), all drained pods gone {:.1} s; after uncordon 2 idle runners \
         online in {:.1} s",
        idle_released.as_secs_f64(),
        drain_done.as_secs_f64(),
        pods_gone.as_secs_f64(),
        recovered.as_secs_f64()
    );
    world.uninstall_leaves_nothing().await;
    world.finish().await;
}

fn self_namespace(pod: &Pod) -> String {
    pod.namespace().unwrap_or_default()
}

/// The listener's container as the kubelet reports it: (pod uid, pod name, container id), once Running.
async fn running_listener(world: &NodeWorld) -> (String, String, String) {
    world
        .eventually("a Running listener container", || async {
            world.listener_pods().await.into_iter().find_map(|pod| {
                let status = pod.status.as_ref()?;
                let container = status.container_statuses.as_ref()?.first()?;
                container.state.as_ref()?.running.as_ref()?;
                Some((pod.uid()?, pod.name_any(), container.container_id.clone()?))
            })
        })
        .await
}

/// A hung listener: the process is alive but makes no progress (stopped with SIGSTOP through containerd, so it
/// neither polls nor answers). The kubelet's liveness probe (the chart's `listenerLivenessProbe` on the
/// listener's `/healthz`) fails and the kubelet kills the container; the listener pod has `restartPolicy:
/// Never`, so it fails and the listener's controller creates a new pod, whose listener takes the session over
/// (the fake forgets the hung one's session after its idle timeout) and scales again: a job enqueued after the
/// hang runs exactly once. A listener whose loop hangs while its process still serves HTTP fails `/healthz` by
/// itself (listener/src/health.rs, its unit test); a stopped process is the hang a kubelet sees from outside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_listener_is_restarted_by_its_liveness_probe_and_scaling_resumes() {
    let Some(parts) = node_tier("e2e: hung listener") else {
        return;
    };
    let _turn = TURN.lock().await;
    let world = NodeWorld::start("node-hung", &parts, 0, 2, json!({})).await;
    world.wait_listening().await;
    let (old_uid, old_pod, container) = running_listener(&world).await;
    let polls = || {
        world
            .fake
            .state()
            .snapshot()
            .sessions
            .iter()
            .map(|s| s.polls)
            .sum::<u64>()
    };
    world
        .node
        .signal_container(&container, "SIGSTOP")
        .await
        .expect("stop the listener process");
    let hung_at = std::time::Instant::now();
    // A long poll in flight when it stopped is still answered (and counted) within the fake's 10 s hold; after
    // that, nothing. The kubelet cannot end a stopped process before its grace period (30 s) has passed.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let polls_then = polls();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(polls(), polls_then, "a hung listener does not poll");
    let listener_pods = world.listener_pods().await;
    assert!(
        listener_pods
            .iter()
            .any(|p| p.uid().as_deref() == Some(old_uid.as_str())
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")),
        "the hung listener's pod still counts as Running: its process is alive"
    );

    let (new_uid, _, _) = world
        .eventually("a new listener running", || async {
            let (uid, name, container) = running_listener(&world).await;
            (uid != old_uid).then_some((uid, name, container))
        })
        .await;
    let replaced_after = hung_at.elapsed();
    let kubelet_events = world.events_about("Pod", &old_pod).await;
    eprintln!("the hung listener's pod {old_pod}: {kubelet_events:#?}");
    assert!(
        kubelet_events
            .iter()
            .any(|e| e.contains("Unhealthy") && e.contains("Liveness probe failed")),
        "the kubelet's liveness probe found it: {kubelet_events:#?}"
    );
    assert_ne!(new_uid, old_uid);
    world.wait_listening().await;
    let serving_after = hung_at.elapsed();
    let ids = world.enqueue(1);
    let snapshot = world.wait_jobs_completed(&ids).await;
    let job = snapshot
        .jobs
        .iter()
        .find(|j| j.request_id == ids[0])
        .expect("job");
    assert_eq!(
        (job.times_started, job.result.as_deref()),
        (1, Some("succeeded"))
    );
    eprintln!(
        "hung listener: a new listener pod running {:.1} s after the hang, holding the session {:.1} s after",
        replaced_after.as_secs_f64(),
        serving_after.as_secs_f64()
    );
    world.wait_idle(0).await;
    world.uninstall_leaves_nothing().await;
    world.finish().await;
}

/// The node stopped while a runner runs a job and another waits: the kubelet and every container of the node
/// killed at once, as a power loss does (containerd stays, as on a host that keeps its disk).
///
/// What happens, observed: the service fails the busy runner's job once it stops hearing from the runner (the
/// fake's lost-runner timeout; minutes on GitHub). The API server still shows every pod `Running`: nothing
/// reports otherwise until the node-lifecycle controller marks the Node not ready (its grace period, about
/// 50 s) and evicts its pods only after their 300 s `unreachable` toleration; pods of a node that never comes
/// back stay `Terminating` until someone force-deletes them. The controller, which sees the same pods, does
/// nothing meanwhile: nothing tells it the runners are gone (no Event, no condition change on the set).
///
/// Then the operator's remedy for a dead node, force-deleting its pods: the busy runner is deregistered and
/// deleted with a Warning Event (the service has let it go), the idle runner gets a fresh registration and a
/// pod that waits for a node, and so does the listener. When the node comes back (the kubelet started again)
/// the pending pods run, an idle runner with a fresh registration comes online, a job runs, and nothing of the
/// old pods is left: no registration, no JIT config used twice, nothing after uninstall, nothing on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_node_loses_the_busy_job_once_and_after_force_deletion_and_return_nothing_leaks()
{
    let Some(parts) = node_tier("e2e: node stopped") else {
        return;
    };
    let _turn = TURN.lock().await;
    let mut world = NodeWorld::start(
        "node-stop",
        &parts,
        1,
        3,
        json!({"env": [{"name": env::JOB_MS, "value": "120000"}]}),
    )
    .await;
    world.wait_listening().await;
    world.wait_idle(1).await;
    let ids = world.enqueue(1);
    let (busy_er, busy_runner, _) = world.wait_jobs_running(&ids).await.remove(0);
    let before = world
        .eventually("one idle runner beside the busy one", || async {
            let ers = world.ephemeral_runners().await;
            let registered = world.registered_runner_ids();
            let running = world
                .runner_pods()
                .await
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            (ers.len() == 2 && registered.len() == 2 && running == 2).then_some(registered)
        })
        .await;
    let pods_before: BTreeSet<String> = world
        .pods_on_node()
        .await
        .iter()
        .filter_map(|p| p.uid())
        .collect();

    world.node.kill_kubelet().expect("kill the kubelet");
    let killed = world.node.kill_containers();
    let stopped_at = std::time::Instant::now();
    eprintln!("node stopped: kubelet and {killed} container processes killed");

    let job = world
        .eventually("the service failing the lost runner's job", || async {
            let job = world.fake.state().job(ids[0]).ok()?;
            (job.state == JobState::Completed).then_some(job)
        })
        .await;
    let job_failed_after = stopped_at.elapsed();
    assert_eq!(
        (job.result.as_deref(), job.runner_lost, job.times_started),
        (Some("failed"), true, 1),
        "{job:?}"
    );
    let nodes = Api::<Node>::all(world.client());
    let node_name = world.node.name().to_owned();
    world
        .eventually("the Node marked not ready", || async {
            let node = nodes.get_opt(&node_name).await.ok().flatten()?;
            node.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status != "True")
                .then_some(())
        })
        .await;
    let not_ready_after = stopped_at.elapsed();
    // What the API server and the controller show now: every pod still Running, runners as they were.
    let pods_now = world.pods_on_node().await;
    let phases: Vec<String> = pods_now
        .iter()
        .map(|p| {
            format!(
                "{}: {:?}",
                p.name_any(),
                p.status.as_ref().and_then(|s| s.phase.clone())
            )
        })
        .collect();
    let conditions: Vec<String> = world
        .ctx
        .api::<AutoscalingRunnerSet>()
        .get(RELEASE)
        .await
        .expect("the set")
        .status
        .map(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .map(|c| format!("{}={} ({}): {}", c.type_, c.status, c.reason, c.message))
        .collect();
    eprintln!(
        "{:.0} s after the stop: the service failed the job after {:.1} s, the Node not ready after {:.1} s; \
         pods {phases:#?}; the set's conditions {conditions:#?}",
        stopped_at.elapsed().as_secs_f64(),
        job_failed_after.as_secs_f64(),
        not_ready_after.as_secs_f64()
    );
    assert!(
        pods_now
            .iter()
            .all(|p| p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")),
        "no kubelet: the pods still show Running: {phases:#?}"
    );
    assert!(
        world
            .ephemeral_runners()
            .await
            .iter()
            .any(|er| er.name_any() == busy_er),
        "the controller cannot know the busy runner is gone"
    );

    // The operator's remedy for a dead node.
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for pod in &pods_now {
        Api::<Pod>::namespaced(world.client(), &self_namespace(pod))
            .delete(&pod.name_any(), &force)
            .await
            .unwrap_or_else(|e| panic!("force-deleting {}: {e}", pod.name_any()));
    }
    world
        .eventually("the busy runner deregistered and deleted", || async {
            let gone = !world
                .ephemeral_runners()
                .await
                .iter()
                .any(|er| er.name_any() == busy_er);
            (gone && !world.registered_runner_ids().contains(&busy_runner)).then_some(())
        })
        .await;
    let warnings = world.events_about("EphemeralRunner", &busy_er).await;
    eprintln!("busy runner {busy_er}: {warnings:#?}");
    assert!(
        warnings.iter().any(|e| e.starts_with("Warning/")),
        "{warnings:#?}"
    );
    world
        .eventually("the idle runner's old registration removed", || async {
            let registered = world.registered_runner_ids();
            before
                .iter()
                .all(|id| !registered.contains(id))
                .then_some(())
        })
        .await;

    let back_at = std::time::Instant::now();
    world.node.start_kubelet().expect("start the kubelet again");
    world.wait_listening().await;
    let after = world.wait_idle(1).await;
    let recovered = back_at.elapsed();
    let status = after[0].status.clone().unwrap_or_default();
    assert!(
        !before.contains(&status.runner_id),
        "a fresh registration: {status:?}"
    );
    let left: Vec<String> = world
        .pods_on_node()
        .await
        .iter()
        .filter(|p| p.uid().is_some_and(|u| pods_before.contains(&u)))
        .map(ResourceExt::name_any)
        .collect();
    assert!(left.is_empty(), "old pods came back: {left:?}");
    assert_eq!(world.fake.state().snapshot().jit_config_reuses, 0);
    assert_eq!(world.registered_runner_ids().len(), 1);
    eprintln!(
        "node back: the listener serving and one idle runner online {:.1} s after the kubelet started again",
        recovered.as_secs_f64()
    );
    world.uninstall_leaves_nothing().await;
    world.finish().await;
}

/// A runner pod no node can take (it asks for 64 CPUs): the real scheduler leaves it `Pending` with
/// `PodScheduled=False`, reason `Unschedulable`, and the set must say so: `RunnersCanStart=False`
/// (`PodUnschedulable`, quoting the scheduler). The runner is registered once and never comes online.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_pod_no_node_fits_makes_the_set_say_runners_cannot_start() {
    let Some(parts) = node_tier("e2e: runner pod no node fits") else {
        return;
    };
    let _turn = TURN.lock().await;
    let world = NodeWorld::start(
        "node-nofit",
        &parts,
        1,
        1,
        json!({"resources": {"requests": {"cpu": "64"}}}),
    )
    .await;
    world.wait_listening().await;
    let pod = world
        .eventually("the runner pod Unschedulable", || async {
            world.runner_pods().await.into_iter().find(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| {
                        c.iter().any(|c| {
                            c.type_ == "PodScheduled"
                                && c.status == "False"
                                && c.reason.as_deref() == Some("Unschedulable")
                        })
                    })
            })
        })
        .await;
    eprintln!("the scheduler: pod {} Unschedulable", pod.name_any());
    let message = world
        .wait_set_condition("RunnersCanStart", "False", "PodUnschedulable")
        .await;
    eprintln!("RunnersCanStart=False: {message}");
    assert!(message.contains("Insufficient cpu"), "{message}");
    let registered = world.registered_runner_ids();
    assert_eq!(registered.len(), 1, "{registered:?}");
    world.uninstall_leaves_nothing().await;
    world.finish().await;
}

/// The listener in the project image evaluates a `minRunnersSchedules` window in a named time zone from the
/// image's time zone database (as the Dockerfile's distroless base carries one; docs/configuration.md): a window
/// open all day in Asia/Tokyo keeps one warm runner where `minRunners` is 0, and the set shows it in effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_zone_schedule_keeps_its_warm_runner_on_the_real_image() {
    let Some(parts) = node_tier("e2e: a time-zone schedule on the real image") else {
        return;
    };
    let _turn = TURN.lock().await;
    let world = NodeWorld::start_with_values(
        "node-tz",
        &parts,
        0,
        2,
        json!({}),
        json!({"minRunnersSchedules": [{
            "name": "all-day-tokyo",
            "minRunners": 1,
            "start": "00:00",
            "duration": "24h",
            "recurrence": "daily",
            "timeZone": "Asia/Tokyo",
        }]}),
    )
    .await;
    world.wait_listening().await;
    let idle = world.wait_idle(1).await;
    eprintln!("the schedule's warm runner: {}", idle[0].name_any());
    world.uninstall_leaves_nothing().await;
    world.finish().await;
}
