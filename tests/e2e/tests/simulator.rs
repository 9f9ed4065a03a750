//! The runner simulator against the real control plane and the fake Actions Service: first with hand-made runner
//! pods wired like the EphemeralRunner controller wires them, then under the real manager's runner controllers.

use std::time::Duration;

use actions_client::{
    ActionsClient, ClientOptions, Credentials, GitHubConfig, JitSetting, RunnerScaleSet,
    SecretString,
};
use controller::{Manager, Options};
use crds::{EphemeralRunner, EphemeralRunnerSet, EphemeralRunnerSetSpec, EphemeralRunnerSpec};
use e2e::simulator::{PodStage, Simulator, SimulatorConfig};
use fake_actions_service::{EnqueueJobs, FakeActionsService, JobState};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Secret};
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use test_harness::TestContext;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(90);

/// The control plane, the fake and one scale set created through the Actions client.
struct Setup {
    ctx: TestContext,
    fake: FakeActionsService,
    actions: ActionsClient,
    config_url: String,
    scale_set_id: i64,
}

impl Setup {
    async fn new(prefix: &str) -> Self {
        let ctx = TestContext::new(prefix).await;
        let fake = FakeActionsService::start(fake_actions_service::Config::default())
            .await
            .expect("start the fake");
        let config_url = format!("{}/sim-org", fake.base_url());
        let actions = ActionsClient::new(
            GitHubConfig::parse(&config_url).expect("config URL"),
            &Credentials::Pat(SecretString::new("ghp_sim")),
            ClientOptions::default(),
        )
        .expect("Actions client");
        let scale_set = actions
            .create_runner_scale_set(&RunnerScaleSet {
                name: prefix.to_owned(),
                runner_group_id: 1,
                ..RunnerScaleSet::default()
            })
            .await
            .expect("create the scale set");
        Self {
            ctx,
            fake,
            actions,
            config_url,
            scale_set_id: scale_set.id,
        }
    }

    /// What the listener does with available jobs: acquire them, so the fake assigns them to idle runners.
    async fn enqueue_and_acquire(&self, count: u32) -> Vec<i64> {
        let ids = self
            .fake
            .state()
            .enqueue_jobs(&EnqueueJobs {
                scale_set_id: Some(self.scale_set_id),
                count,
                ..EnqueueJobs::default()
            })
            .expect("enqueue");
        let session = self
            .actions
            .message_session(self.scale_set_id, "sim-test")
            .await
            .expect("session");
        let acquired = session.acquire_jobs(&ids).await.expect("acquire");
        assert_eq!(acquired, ids);
        session.close().await.expect("close the session");
        ids
    }

    /// A runner pod as the EphemeralRunner controller makes it: the JIT config in a Secret of the same name,
    /// referenced from the `runner` container's environment.
    async fn hand_made_runner_pod(&self, name: &str) -> i64 {
        let jit = self
            .actions
            .generate_jit_runner_config(
                self.scale_set_id,
                &JitSetting {
                    name: name.to_owned(),
                    work_folder: String::new(),
                },
            )
            .await
            .expect("JIT config");
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            data: Some(
                [(
                    "jitToken".to_owned(),
                    ByteString(jit.encoded_jit_config.expose_secret().as_bytes().to_vec()),
                )]
                .into(),
            ),
            ..Secret::default()
        };
        self.ctx
            .api::<Secret>()
            .create(&PostParams::default(), &secret)
            .await
            .expect("JIT Secret");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"actions-ephemeral-runner": "True"}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "runner",
                    "image": "ghcr.io/actions/actions-runner:latest",
                    "env": [{
                        "name": "ACTIONS_RUNNER_INPUT_JITCONFIG",
                        "valueFrom": {"secretKeyRef": {"name": name, "key": "jitToken"}},
                    }],
                }],
            },
        }))
        .expect("pod");
        self.ctx
            .api::<Pod>()
            .create(&PostParams::default(), &pod)
            .await
            .expect("runner pod");
        jit.runner.expect("runner reference").id
    }

    async fn pod(&self, name: &str) -> Option<Pod> {
        self.ctx.api::<Pod>().get_opt(name).await.expect("get pod")
    }
}

async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

fn exit_code(pod: &Pod) -> Option<i32> {
    let status = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    Some(status.state.as_ref()?.terminated.as_ref()?.exit_code)
}

#[tokio::test]
async fn a_hand_made_runner_pod_waits_for_a_node_runs_one_job_and_exits_zero() {
    let setup = Setup::new("sim-job").await;
    let simulator = Simulator::start(
        setup.ctx.client.clone(),
        Some(&setup.ctx.namespace),
        setup.fake.state(),
        SimulatorConfig {
            scheduling_delay: Duration::from_millis(1500),
            job_duration: Duration::from_millis(300),
            ..SimulatorConfig::default()
        },
    );
    let runner_id = setup.hand_made_runner_pod("runner-a").await;

    // Slow scheduling: Pending and unschedulable first, as while a node is being added.
    eventually("an unschedulable pod", || async {
        let pod = setup.pod("runner-a").await?;
        let conditions = pod.status.as_ref()?.conditions.clone()?;
        conditions
            .iter()
            .any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
            .then_some(())
    })
    .await;
    assert!(
        !setup
            .fake
            .state()
            .runner(runner_id)
            .expect("registered")
            .online
    );

    eventually("the runner online", || async {
        setup
            .fake
            .state()
            .runner(runner_id)
            .ok()
            .filter(|r| r.online)
    })
    .await;
    let pod = setup.pod("runner-a").await.expect("pod");
    assert_eq!(phase(&pod), Some("Running"));

    let jobs = setup.enqueue_and_acquire(1).await;
    let done = setup
        .fake
        .state()
        .wait_for(WAIT, |s| {
            s.jobs
                .iter()
                .any(|j| j.request_id == jobs[0] && j.state == JobState::Completed)
        })
        .await
        .expect("the job completes");
    let job = done
        .jobs
        .iter()
        .find(|j| j.request_id == jobs[0])
        .expect("job");
    assert_eq!(job.result.as_deref(), Some("succeeded"));
    assert_eq!(job.runner_id, Some(runner_id));
    assert_eq!(job.times_started, 1);

    let pod = eventually("the pod Succeeded", || async {
        setup
            .pod("runner-a")
            .await
            .filter(|p| phase(p) == Some("Succeeded"))
    })
    .await;
    assert_eq!(exit_code(&pod), Some(0));
    assert!(
        setup.fake.state().runner(runner_id).is_err(),
        "deregistered after its job"
    );
    // The simulator books the pod Finished once its last status patch returned, a moment after the pod shows it.
    let stats = eventually("the pod booked Finished", || async {
        let stats = simulator.stats();
        (stats.in_stage(PodStage::Finished) == 1).then_some(stats)
    })
    .await;
    assert_eq!(stats.jobs_started, 1);
    assert_eq!(stats.jobs_finished, 1);
    assert_eq!(simulator.jobs_served(), jobs);
    assert!(simulator.jobs_served_twice().is_empty());
    assert!(
        simulator.problems().is_empty(),
        "{:?}",
        simulator.problems()
    );
    simulator.stop();
}

#[tokio::test]
async fn start_failures_fail_the_pod_and_a_deleted_pod_takes_its_runner_offline() {
    let setup = Setup::new("sim-fail").await;
    let simulator = Simulator::start(
        setup.ctx.client.clone(),
        Some(&setup.ctx.namespace),
        setup.fake.state(),
        SimulatorConfig {
            start_failure_rate: 1.0,
            ..SimulatorConfig::default()
        },
    );
    let failing = setup.hand_made_runner_pod("runner-fails").await;
    let pod = eventually("the pod Failed", || async {
        setup
            .pod("runner-fails")
            .await
            .filter(|p| phase(p) == Some("Failed"))
    })
    .await;
    assert_eq!(exit_code(&pod), Some(128));
    let terminated = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c[0].state.clone())
        .and_then(|s| s.terminated)
        .expect("terminated");
    assert_eq!(terminated.reason.as_deref(), Some("StartError"));
    assert!(
        !setup
            .fake
            .state()
            .runner(failing)
            .expect("still registered")
            .online
    );

    // New pods run again; deleting an idle runner's pod takes the runner offline.
    simulator.set_config(SimulatorConfig::default());
    let idle = setup.hand_made_runner_pod("runner-idle").await;
    eventually("the runner online", || async {
        setup.fake.state().runner(idle).ok().filter(|r| r.online)
    })
    .await;
    setup
        .ctx
        .api::<Pod>()
        .delete("runner-idle", &DeleteParams::default())
        .await
        .expect("delete the pod");
    eventually("the runner offline", || async {
        setup.fake.state().runner(idle).ok().filter(|r| !r.online)
    })
    .await;
    let stats = simulator.stats();
    assert_eq!(stats.in_stage(PodStage::FailedToStart), 1);
    assert_eq!(stats.in_stage(PodStage::Deleted), 1);
    assert_eq!(stats.jobs_interrupted, 0);
    assert!(
        simulator.problems().is_empty(),
        "{:?}",
        simulator.problems()
    );
    simulator.stop();
}

/// The runner controllers of the real manager with the simulator as kubelet and runner: runners come up, jobs are
/// served once each, failed starts are retried, and scaling to zero leaves nothing behind.
#[tokio::test]
async fn the_manager_runner_controllers_with_simulated_runners_serve_every_job() {
    let setup = Setup::new("sim-manager").await;
    test_harness::apply_crds(&setup.ctx.client, &crds::all_crds())
        .await
        .expect("CRDs");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("github-credentials".to_owned()),
            ..ObjectMeta::default()
        },
        data: Some([("github_token".to_owned(), ByteString(b"ghp_sim".to_vec()))].into()),
        ..Secret::default()
    };
    setup
        .ctx
        .api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("credentials");
    // A third of the pods fail to start at first: the controller must retry them with fresh registrations.
    let simulator = Simulator::start(
        setup.ctx.client.clone(),
        Some(&setup.ctx.namespace),
        setup.fake.state(),
        SimulatorConfig {
            start_failure_rate: 0.34,
            job_duration: Duration::from_millis(300),
            ..SimulatorConfig::default()
        },
    );
    let mut options = Options {
        watch_namespace: Some(setup.ctx.namespace.clone()),
        build_version: "e2e".to_owned(),
        actions_call_timeout: Duration::from_secs(10),
        resync_interval: Duration::from_secs(5),
        error_backoff_min: Duration::from_millis(100),
        error_backoff_max: Duration::from_secs(2),
        ..Options::default()
    };
    options.runner.failure_backoff_base = Duration::from_millis(100);
    options.scale_down.ready_grace_period = Duration::ZERO;
    let shutdown = CancellationToken::new();
    let manager =
        tokio::spawn(Manager::new(setup.ctx.client.clone(), options).run(shutdown.clone()));

    let set = EphemeralRunnerSet::new(
        "sim-set",
        EphemeralRunnerSetSpec {
            replicas: 3,
            patch_id: 0,
            ephemeral_runner_spec: EphemeralRunnerSpec {
                github_config_url: setup.config_url.clone(),
                github_config_secret: "github-credentials".to_owned(),
                runner_scale_set_id: setup.scale_set_id,
                spec: PodSpec {
                    containers: vec![Container {
                        name: "runner".to_owned(),
                        image: Some("ghcr.io/actions/actions-runner:latest".to_owned()),
                        ..Container::default()
                    }],
                    restart_policy: Some("Never".to_owned()),
                    ..PodSpec::default()
                }
                .into(),
                ..EphemeralRunnerSpec::default()
            },
            ephemeral_runner_metadata: None,
        },
    );
    let sets: Api<EphemeralRunnerSet> = setup.ctx.api();
    sets.create(&PostParams::default(), &set)
        .await
        .expect("create the set");
    let runners: Api<EphemeralRunner> = setup.ctx.api();
    let online = |n: usize| {
        let fake = setup.fake.state();
        let id = setup.scale_set_id;
        async move {
            let count = fake
                .snapshot()
                .runners
                .iter()
                .filter(|r| r.scale_set_id == id && r.online)
                .count();
            (count == n).then_some(())
        }
    };
    eventually("three runners online", || online(3)).await;

    let jobs = setup.enqueue_and_acquire(3).await;
    setup
        .fake
        .state()
        .wait_for(WAIT, |s| {
            jobs.iter().all(|id| {
                s.jobs
                    .iter()
                    .any(|j| j.request_id == *id && j.state == JobState::Completed)
            })
        })
        .await
        .expect("every job completes");
    // Runners that finished are replaced: the set asks for three.
    eventually("three fresh runners online", || online(3)).await;
    let stats = simulator.stats();
    assert!(stats.in_stage(PodStage::FailedToStart) >= 1, "{stats:?}");
    assert_eq!(stats.jobs_finished, 3);
    assert!(simulator.jobs_served_twice().is_empty());

    // Authoritative scale to zero: idle runners are removed, nothing is left anywhere.
    sets.patch(
        "sim-set",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": null, "patchID": 0}})),
    )
    .await
    .expect("scale to zero");
    eventually("no runner left", || async {
        let left = runners.list(&ListParams::default()).await.ok()?.items;
        let pods = setup
            .ctx
            .api::<Pod>()
            .list(&ListParams::default().labels("actions-ephemeral-runner=True"))
            .await
            .ok()?
            .items;
        let registered = setup
            .fake
            .state()
            .snapshot()
            .runners
            .iter()
            .filter(|r| r.scale_set_id == setup.scale_set_id)
            .count();
        (left.is_empty() && pods.is_empty() && registered == 0).then_some(())
    })
    .await;
    let jit_secrets: Vec<String> = setup
        .ctx
        .api::<Secret>()
        .list(&ListParams::default())
        .await
        .expect("secrets")
        .items
        .iter()
        .filter(|s| s.data.as_ref().is_some_and(|d| d.contains_key("jitToken")))
        .map(ResourceExt::name_any)
        .collect();
    assert!(jit_secrets.is_empty(), "{jit_secrets:?}");
    assert_eq!(simulator.stats().jobs_interrupted, 0);
    assert!(
        simulator.problems().is_empty(),
        "{:?}",
        simulator.problems()
    );
    shutdown.cancel();
    manager.await.expect("manager task").expect("manager");
    simulator.stop();
}
