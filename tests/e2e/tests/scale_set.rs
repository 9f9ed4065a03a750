//! End-to-end suites: one scale set installed from the objects a default `helm template` of the scale-set chart
//! renders, the manager in-process, the real listener run by the listener-pod executor, and simulated runners,
//! against the local control plane and the fake Actions Service. Every suite ends with
//! [`checks::settle_and_verify`]: every job completed exactly once, back to `minRunners`, no orphan, no runner left
//! in the fake after an uninstall.

use std::time::Duration;

use e2e::checks;
use e2e::simulator::{PodStage, SimulatorConfig};
use e2e::world::{RUNNER_POD_SELECTOR, World, WorldConfig};
use fake_actions_service::{ErrorFault, Faults, JobDelivery, JobState, LatencyFault};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::json;

/// Jobs in the burst suite. 200 fits the CI budget on two cores; `E2E_BURST_JOBS` overrides it.
const BURST_JOBS: u32 = 200;
/// How long a suite waits for any one condition.
const WAIT: Duration = Duration::from_secs(300);

fn burst_jobs() -> u32 {
    std::env::var("E2E_BURST_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(BURST_JOBS)
}

async fn world(prefix: &str, config: WorldConfig) -> World {
    e2e::init_test_tracing();
    let world = World::start(prefix, config)
        .await
        .unwrap_or_else(|e| panic!("starting the world: {e:?}"));
    if let Err(error) = world.wait_listening(WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    world
}

async fn verify(world: World, min_runners: usize, cancelled: &[i64]) {
    if let Err(error) = checks::settle_and_verify(&world, min_runners, cancelled, WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    world.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_jobs_completes_and_the_set_returns_to_min_runners() {
    let world = world(
        "e2e-burst",
        WorldConfig {
            simulator: SimulatorConfig {
                job_duration: Duration::from_secs(2),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        },
    )
    .await;
    let jobs = burst_jobs();
    world.enqueue(jobs).expect("enqueue");
    verify(world, 0, &[]).await;
}

/// `config` with jobs delivered as github.com does: assigned to the scale set directly (`JobAssigned`, no
/// `JobAvailable`, nothing to acquire). The suite's other tests run the world's default, GHES's acquire flow unless
/// `E2E_JOB_DELIVERY=direct` (tests/run.sh runs the suite both ways); the ones about a process that goes away or a
/// scale set deleted always run this way, where the listener has only the assignments and the statistics to go by.
fn assigned_directly(config: WorldConfig) -> WorldConfig {
    WorldConfig {
        fake: fake_actions_service::Config {
            job_delivery: JobDelivery::Direct,
            ..config.fake
        },
        ..config
    }
}

/// github.com assigns jobs to the scale set directly: the listener scales on those messages alone and every job
/// runs once.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_jobs_assigned_directly_as_on_github_com_completes() {
    let world = world(
        "e2e-direct",
        assigned_directly(WorldConfig {
            simulator: SimulatorConfig {
                job_duration: Duration::from_secs(2),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        }),
    )
    .await;
    world.enqueue(burst_jobs() / 2).expect("enqueue");
    verify(world, 0, &[]).await;
}

/// Waits until at least `n` of the world's jobs run.
async fn wait_running(world: &World, n: usize) {
    if let Err(error) = world.wait_jobs_running(n, WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn min_runners_keep_an_idle_pool() {
    let world = world(
        "e2e-min",
        WorldConfig {
            values: json!({"minRunners": 2}),
            ..WorldConfig::default()
        },
    )
    .await;
    if let Err(error) = world.wait_idle(2, WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    world.enqueue(5).expect("enqueue");
    verify(world, 2, &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn max_runners_caps_the_set() {
    let world = world(
        "e2e-max",
        WorldConfig {
            values: json!({"maxRunners": 3}),
            simulator: SimulatorConfig {
                job_duration: Duration::from_millis(1500),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        },
    )
    .await;
    let ids = world.enqueue(12).expect("enqueue");
    let mut peak_desired = 0;
    let mut peak_running = 0;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let o = world.observe().await.expect("observe");
        peak_desired = peak_desired.max(o.desired_replicas);
        peak_running = peak_running.max(o.jobs_running);
        let live_runners: usize = o.runners.values().sum();
        assert!(
            o.desired_replicas <= 3,
            "desired replicas above maxRunners: {o:?}"
        );
        assert!(
            o.jobs_running <= 3,
            "more jobs running than maxRunners: {o:?}"
        );
        assert!(
            o.registered_runners <= 3,
            "more runners registered than maxRunners: {o:?}"
        );
        let leaving = ["Succeeded", "Deleting"]
            .iter()
            .map(|phase| o.runners.get(*phase).copied().unwrap_or(0))
            .sum::<usize>();
        assert!(
            live_runners <= 3 + leaving,
            "more live runners than maxRunners: {o:?}"
        );
        if o.jobs_done == ids.len() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {o:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(peak_desired, 3, "the cap was reached");
    assert!(peak_running >= 2, "jobs ran in parallel: {peak_running}");
    verify(world, 0, &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelled_jobs_complete_as_cancelled_and_free_their_runners() {
    let world = world(
        "e2e-cancel",
        WorldConfig {
            simulator: SimulatorConfig {
                job_duration: Duration::from_secs(5),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        },
    )
    .await;
    let ids = world.enqueue(4).expect("enqueue");
    wait_running(&world, 2).await;
    // One running job, and two jobs the moment they are enqueued (available, not yet acquired or assigned).
    let running = world
        .fake
        .state()
        .snapshot()
        .jobs
        .into_iter()
        .find(|j| ids.contains(&j.request_id) && j.state == JobState::Running)
        .expect("a running job")
        .request_id;
    let fresh = world.enqueue(2).expect("enqueue more");
    let mut cancelled = vec![running];
    cancelled.extend(&fresh);
    for id in &cancelled {
        world.fake.state().cancel_job(*id).expect("cancel");
    }
    verify(world, 0, &cancelled).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_start_failures_are_retried_until_every_job_runs() {
    let world = world(
        "e2e-start-fail",
        WorldConfig {
            simulator: SimulatorConfig {
                start_failure_rate: 0.3,
                job_duration: Duration::from_millis(500),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        },
    )
    .await;
    world.enqueue(15).expect("enqueue");
    let ids = world.enqueued();
    if let Err(error) = world.wait_jobs_completed(&ids, WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    let failed = world.simulator.stats().in_stage(PodStage::FailedToStart);
    assert!(
        failed >= 1,
        "some pods failed to start: {:?}",
        world.simulator.stats()
    );
    verify(world, 0, &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_the_scale_set_mid_flight_loses_no_job() {
    let world = world(
        "e2e-delete",
        assigned_directly(WorldConfig {
            simulator: SimulatorConfig {
                job_duration: Duration::from_secs(3),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        }),
    )
    .await;
    world.enqueue(8).expect("enqueue");
    wait_running(&world, 2).await;
    // Uninstall while jobs run: running jobs finish on their runners, the others wait in the service.
    if let Err(error) = checks::uninstall_leaves_nothing(&world, WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    let snapshot = world.fake.state().snapshot();
    let ids = world.enqueued();
    for job in snapshot.jobs.iter().filter(|j| ids.contains(&j.request_id)) {
        assert!(
            matches!(job.state, JobState::Completed | JobState::Queued),
            "after the uninstall every job completed or waits for a scale set: {job:?}"
        );
        assert!(job.times_started <= 1, "{job:?}");
    }
    // Installing again adopts the waiting jobs (jobs follow the scale set's name).
    world.install().await.expect("install again");
    world.wait_listening(WAIT).await.expect("listening again");
    verify(world, 0, &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_manager_killed_mid_flight_and_restarted_loses_no_job() {
    let world = world(
        "e2e-restart",
        assigned_directly(WorldConfig {
            simulator: SimulatorConfig {
                // Long enough that four jobs run at once between two looks: with 3 s jobs all twenty started
                // and finished in waves the looks never caught four of (seen once in a fresh-clone run), and the
                // manager was then killed with nothing in flight.
                job_duration: Duration::from_secs(10),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        }),
    )
    .await;
    world.enqueue(20).expect("enqueue");
    wait_running(&world, 4).await;
    // The manager, with only the charts' RBAC, puts the job's labels on busy runners' pods.
    let labelled = world
        .eventually(
            "a busy runner's pod labelled with its job",
            WAIT,
            || async {
                let pods = Api::<Pod>::namespaced(world.client(), world.namespace())
                    .list(&ListParams::default().labels(RUNNER_POD_SELECTOR))
                    .await?;
                let labelled = pods
                    .items
                    .iter()
                    .filter(|pod| pod.labels().contains_key("actions.github.com/job-id"))
                    .count();
                Ok((
                    labelled > 0,
                    format!("{labelled} of {} pods", pods.items.len()),
                ))
            },
        )
        .await;
    if let Err(error) = labelled {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    world.stop_manager(true).await.expect("kill the manager");
    // Jobs keep arriving and finishing while no controller runs.
    world.enqueue(5).expect("enqueue while down");
    tokio::time::sleep(Duration::from_secs(3)).await;
    world.start_manager();
    world.enqueue(5).expect("enqueue after the restart");
    verify(world, 0, &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_listener_is_replaced_and_loses_no_job() {
    let world = world(
        "e2e-listener-kill",
        assigned_directly(WorldConfig {
            simulator: SimulatorConfig {
                // Long enough that the listener dies while jobs run: with 2 s jobs, runners that leave within a
                // second of their job let all ten finish between two looks (seen once in CI).
                job_duration: Duration::from_secs(5),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        }),
    )
    .await;
    world.enqueue(10).expect("enqueue");
    wait_running(&world, 2).await;
    let killed = match world.kill_listener().await {
        Ok(pod) => pod,
        Err(error) => panic!("{error}\n{}", world.diagnostics().await),
    };
    world.enqueue(10).expect("enqueue after the kill");
    // A new listener process runs (its session waits for the killed one's to expire in the fake).
    let result = world
        .eventually("a replacement listener", WAIT, || async {
            let running = world.running_listeners();
            Ok((
                !running.is_empty(),
                format!("killed {killed}; running {running:?}"),
            ))
        })
        .await;
    if let Err(error) = result {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    verify(world, 0, &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn injected_service_faults_lose_no_job() {
    let world = world(
        "e2e-faults",
        WorldConfig {
            simulator: SimulatorConfig {
                job_duration: Duration::from_millis(500),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        },
    )
    .await;
    let fault = |endpoint: &str, status: u16, rate: f64| ErrorFault {
        endpoint: Some(endpoint.to_owned()),
        status,
        rate,
        count: None,
        retry_after_secs: None,
    };
    world
        .fake
        .state()
        .set_faults(Faults {
            seed: 7,
            errors: vec![
                // The first three registrations fail for sure, so the test knows faults were met.
                ErrorFault {
                    count: Some(3),
                    ..fault("generate_jit_config", 500, 1.0)
                },
                fault("get_message", 503, 0.1),
                fault("acquire_jobs", 500, 0.2),
                fault("generate_jit_config", 500, 0.2),
                fault("get_runner_by_id", 500, 0.1),
                fault("remove_runner", 503, 0.2),
            ],
            latency: vec![LatencyFault {
                endpoint: Some("actions".to_owned()),
                millis: 50,
            }],
        })
        .expect("faults");
    world.enqueue(15).expect("enqueue");
    let ids = world.enqueued();
    if let Err(error) = world.wait_jobs_completed(&ids, WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    let rules = world.fake.state().faults();
    assert_eq!(
        rules.errors[0].count,
        Some(0),
        "the certain faults fired: {rules:?}"
    );
    verify(world, 0, &[]).await;
}

/// An upgrade of arc-rs itself to its next minor while jobs run, in the documented order (docs/versioning.md): the
/// controller first (its chart's CRDs applied again server-side, the manager replaced by one of the next minor),
/// the scale-set releases later. The sets still carry this release's version label, which the next minor accepts
/// as its previous one: nothing is deleted or re-created (the AutoscalingRunnerSet, its EphemeralRunnerSet and the
/// scale set on the service keep their identities), and every job runs once.
#[tokio::test(flavor = "multi_thread")]
async fn an_upgrade_to_the_next_minor_mid_flight_keeps_every_set_and_job() {
    use crds::{AutoscalingRunnerSet, EphemeralRunnerSet};
    let world = world(
        "e2e-upgrade",
        WorldConfig {
            simulator: SimulatorConfig {
                job_duration: Duration::from_secs(3),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        },
    )
    .await;
    let release = world.release.clone();
    let sets = Api::<AutoscalingRunnerSet>::namespaced(world.client(), world.namespace());
    let runner_sets = Api::<EphemeralRunnerSet>::namespaced(world.client(), world.namespace());
    let identities = || async {
        let set = sets.get(&release).await.expect("the set");
        let runner_set = runner_sets.get(&release).await.expect("its runner set");
        (
            set.uid(),
            runner_set.uid(),
            set.annotations().get("runner-scale-set-id").cloned(),
        )
    };
    let before = identities().await;
    world.enqueue(10).expect("enqueue");
    wait_running(&world, 3).await;

    world.stop_manager(false).await.expect("stop the manager");
    test_harness::apply_crds(&world.client(), &crds::all_crds())
        .await
        .expect("the new CRDs, applied server-side");
    let current = world.chart_version();
    let mut parts = current.split('.');
    let (major, minor) = (
        parts.next().unwrap_or("0").to_owned(),
        parts
            .next()
            .and_then(|m| m.parse::<u32>().ok())
            .unwrap_or(0),
    );
    let next = format!("{major}.{}.0", minor + 1);
    world
        .try_start_manager_with(|options| options.build_version = next.clone())
        .expect("the next minor's manager");
    world.enqueue(5).expect("enqueue after the upgrade");
    let ids = world.enqueued();
    if let Err(error) = world.wait_jobs_completed(&ids, WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    assert_eq!(
        identities().await,
        before,
        "the set, its runner set and the scale set kept their identities across {current} -> {next}"
    );
    let set = sets.get(&release).await.expect("the set");
    let refused = set
        .status
        .as_ref()
        .map(|status| {
            status
                .conditions
                .iter()
                .any(|c| c.reason == "VersionNotAccepted")
        })
        .unwrap_or_default();
    assert!(!refused, "the next minor refused the set: {:?}", set.status);
    verify(world, 0, &[]).await;
}

/// Beyond ARC (docs/runner-lifecycle.md, "Drains wait for busy runners"): the Eviction API, which `kubectl drain`
/// and the cluster autoscaler use, refuses a busy runner's pod while its job runs and lets an idle one go at once;
/// the job completes on the runner that was not evicted.
#[tokio::test(flavor = "multi_thread")]
async fn evictions_wait_for_busy_runners_and_take_idle_ones_at_once() {
    let world = world(
        "e2e-evict",
        WorldConfig {
            values: json!({"minRunners": 2}),
            simulator: SimulatorConfig {
                job_duration: Duration::from_secs(20),
                ..SimulatorConfig::default()
            },
            ..WorldConfig::default()
        },
    )
    .await;
    let pods = Api::<Pod>::namespaced(world.client(), world.namespace());
    world.enqueue(1).expect("enqueue");
    wait_running(&world, 1).await;
    // The budget counts the busy pod once the manager labelled it and the disruption controller saw it.
    let budget = format!("{}-busy-runners", world.release);
    let budgets = Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
        world.client(),
        world.namespace(),
    );
    let protected = world
        .eventually("the busy runner counted by its budget", WAIT, || async {
            let Some(found) = budgets.get_opt(&budget).await? else {
                return Ok((false, "no budget yet".to_owned()));
            };
            let status = found.status.unwrap_or_default();
            Ok((
                status.current_healthy.unwrap_or(0) >= 1 && status.disruptions_allowed == Some(0),
                format!("{status:?}"),
            ))
        })
        .await;
    if let Err(error) = protected {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    let all = pods
        .list(&ListParams::default().labels(RUNNER_POD_SELECTOR))
        .await
        .expect("list runner pods");
    let (busy, idle): (Vec<_>, Vec<_>) = all
        .items
        .into_iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .partition(|pod| pod.labels().contains_key("actions.github.com/job-id"));
    let busy = busy.first().expect("a busy runner pod");
    let idle = idle
        .iter()
        .find(|pod| pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .expect("an idle running runner pod");
    // As `kubectl drain` sees them: a refused eviction answered, not retried by the client.
    let evictions = Api::<Pod>::namespaced(
        world
            .ctx
            .control_plane
            .client_without_retries()
            .expect("a client"),
        world.namespace(),
    );
    match evictions
        .evict(&busy.name_any(), &kube::api::EvictParams::default())
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 429 => {}
        other => panic!(
            "evicting the busy runner's pod: expected 429, got {other:?}\n{}",
            world.diagnostics().await
        ),
    }
    world
        .simulator
        .expect_deletion(&idle.uid().unwrap_or_default());
    if let Err(error) = evictions
        .evict(&idle.name_any(), &kube::api::EvictParams::default())
        .await
    {
        panic!(
            "evicting an idle runner's pod: {error}\n{}",
            world.diagnostics().await
        );
    }
    // The job ends on its runner; the evicted idle runner is replaced; back to minRunners.
    verify(world, 2, &[]).await;
}

/// A scale set that asks for it (`rerunInterruptedJobs`) has GitHub run a job again when the cluster took its
/// runner's pod away (here an eviction, the busy-runner budget turned off so it goes through), and never a job that
/// failed on its own: two jobs that both fail on their own, one of them evicted on the way; exactly one re-run, of
/// the evicted one, which runs once on a new runner (and, failing on its own, is not re-run again although the
/// limit allows it), an Event on the runner set, and no runner held afterwards. Every other suite deletes or
/// evicts pods with the option off, and its checks fail on any re-run.
#[tokio::test(flavor = "multi_thread")]
async fn an_evicted_job_runs_again_when_the_set_asks_for_it_and_one_that_failed_does_not() {
    let world = world(
        "e2e-rerun",
        WorldConfig {
            values: json!({"rerunInterruptedJobs": {"enabled": true, "maxReruns": 3}}),
            simulator: SimulatorConfig {
                job_duration: Duration::from_secs(15),
                job_result: "failed".to_owned(),
                ..SimulatorConfig::default()
            },
            tune: |options| options.protect_busy_runners = false,
            ..WorldConfig::default()
        },
    )
    .await;
    let pods = Api::<Pod>::namespaced(world.client(), world.namespace());
    let evicted = world.enqueue(1).expect("enqueue")[0];
    let failing = world.enqueue(1).expect("enqueue")[0];
    wait_running(&world, 2).await;
    let labelled = world
        .eventually(
            "the busy runners' pods labelled with their jobs",
            WAIT,
            || async {
                let all = pods
                    .list(&ListParams::default().labels(RUNNER_POD_SELECTOR))
                    .await?;
                let busy = all
                    .items
                    .iter()
                    .filter(|pod| pod.labels().contains_key("actions.github.com/job-id"))
                    .count();
                Ok((busy >= 2, format!("{busy} labelled")))
            },
        )
        .await;
    if let Err(error) = labelled {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    let all = pods
        .list(&ListParams::default().labels(RUNNER_POD_SELECTOR))
        .await
        .expect("list runner pods");
    let victim = all
        .items
        .iter()
        .find(|pod| {
            pod.labels()
                .get("actions.github.com/job-id")
                .is_some_and(|job| {
                    world
                        .fake
                        .state()
                        .snapshot()
                        .jobs
                        .iter()
                        .any(|view| view.request_id == evicted && &view.job_id == job)
                })
        })
        .expect("the evicted job's pod");
    world
        .simulator
        .expect_deletion(&victim.uid().unwrap_or_default());
    if let Err(error) = pods
        .evict(&victim.name_any(), &kube::api::EvictParams::default())
        .await
    {
        panic!(
            "evicting a busy runner's pod with its budget off: {error}\n{}",
            world.diagnostics().await
        );
    }

    let attempt = |snapshot: &fake_actions_service::StateSnapshot, of: i64| {
        snapshot
            .jobs
            .iter()
            .find(|job| job.rerun_of == Some(of))
            .cloned()
    };
    let rerun = world
        .eventually("the evicted job re-run and completed", WAIT, || async {
            let snapshot = world.fake.state().snapshot();
            let rerun = attempt(&snapshot, evicted);
            let done = rerun
                .as_ref()
                .is_some_and(|job| job.state == JobState::Completed);
            Ok((done, format!("re-runs {}: {rerun:?}", snapshot.job_reruns)))
        })
        .await;
    if let Err(error) = rerun {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    let snapshot = world.fake.state().snapshot();
    let rerun = attempt(&snapshot, evicted).expect("the new attempt");
    assert_eq!(
        rerun.result.as_deref(),
        Some("failed"),
        "it fails on its own"
    );
    assert_eq!(rerun.times_started, 1);
    assert_eq!(rerun.run_attempt, 2);
    assert!(
        attempt(&snapshot, failing).is_none(),
        "a job that failed on its own is not re-run"
    );
    let events =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(world.client(), world.namespace());
    let reruns: Vec<String> = events
        .list(&ListParams::default())
        .await
        .expect("list Events")
        .items
        .into_iter()
        .filter(|event| {
            event.reason.as_deref() == Some("JobRerun")
                && event.regarding.as_ref().and_then(|r| r.kind.as_deref())
                    == Some("EphemeralRunnerSet")
        })
        .filter_map(|event| event.note)
        .collect();
    assert!(
        reruns.len() == 1 && reruns[0].contains("was evicted"),
        "one JobRerun Event on the runner set, naming the eviction: {reruns:?}"
    );
    verify(world, 0, &[]).await;
    // The re-run attempt failed on its own in the meantime; still one re-run in all.
}
