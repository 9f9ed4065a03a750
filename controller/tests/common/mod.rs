//! Shared set-up of the controller integration tests: a real control plane (test-harness), the fake Actions
//! Service with one scale set, the manager running in-process, and a stand-in kubelet that drives pod status.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use actions_client::{
    ActionsClient, ClientOptions, Credentials, GitHubConfig, RunnerScaleSet, SecretString,
};
use controller::{Manager, Options};
use crds::{EphemeralRunner, EphemeralRunnerSet, EphemeralRunnerSetSpec, EphemeralRunnerSpec};
use fake_actions_service::{EnqueueJobs, FakeActionsService, Faults, LatencyFault, RunnerSelector};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use test_harness::TestContext;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Name of the GitHub credentials Secret the tests create.
pub const CREDENTIALS: &str = "github-credentials";
/// How long a test waits for a condition before failing.
pub const WAIT: Duration = Duration::from_secs(90);

/// One test's world.
pub struct Env {
    pub ctx: TestContext,
    pub fake: FakeActionsService,
    pub config_url: String,
    pub scale_set_id: i64,
    pub actions: ActionsClient,
}

/// A manager running in this process.
pub struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<controller::Result<()>>,
}

impl Running {
    /// Graceful stop: in-flight reconciles finish.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task
            .await
            .expect("manager task")
            .expect("manager result");
    }

    /// Hard stop, as if the process were killed: everything in flight is dropped.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

impl Env {
    pub async fn new(prefix: &str) -> Self {
        let ctx = TestContext::new(prefix).await;
        test_harness::apply_crds(&ctx.client, &crds::all_crds())
            .await
            .expect("install CRDs");
        let fake = FakeActionsService::start(fake_actions_service::Config::default())
            .await
            .expect("start the fake Actions Service");
        let config_url = format!("{}/org/repo", fake.base_url());
        let secrets: Api<Secret> = ctx.api();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(CREDENTIALS.to_owned()),
                ..ObjectMeta::default()
            },
            data: Some([("github_token".to_owned(), ByteString(b"ghp_test".to_vec()))].into()),
            ..Secret::default()
        };
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("create the credentials Secret");
        let actions = ActionsClient::new(
            GitHubConfig::parse(&config_url).expect("config URL"),
            &Credentials::Pat(SecretString::new("ghp_test")),
            ClientOptions::default(),
        )
        .expect("Actions client");
        let scale_set = actions
            .create_runner_scale_set(&RunnerScaleSet {
                name: format!("set-{prefix}"),
                runner_group_id: 1,
                ..RunnerScaleSet::default()
            })
            .await
            .expect("create the scale set");
        Self {
            ctx,
            fake,
            config_url,
            scale_set_id: scale_set.id,
            actions,
        }
    }

    /// Runs the listener pods of this test's namespace as the real listener binary (each as its pod's
    /// ServiceAccount, with the config its Secret holds), until dropped.
    pub fn listener_executor(&self) -> test_harness::ListenerExecutor {
        let binary =
            test_harness::workspace_binary("listener", "listener").expect("listener binary");
        test_harness::ListenerExecutor::start(
            self.ctx.control_plane,
            self.ctx.client.clone(),
            Some(&self.ctx.namespace),
            binary,
        )
        .expect("listener executor")
    }

    /// Options with short delays, watching this test's namespace only.
    pub fn options(&self) -> Options {
        let mut options = Options {
            watch_namespace: Some(self.ctx.namespace.clone()),
            build_version: "test".to_owned(),
            actions_call_timeout: Duration::from_secs(10),
            // The production value: every step must be brought by a watch event or a timer the controllers set
            // for a reason; a missing event shows as a test timing out, not as a pass the resync happened to make.
            resync_interval: Duration::from_secs(300),
            error_backoff_min: Duration::from_millis(100),
            error_backoff_max: Duration::from_secs(2),
            ..Options::default()
        };
        options.runner.failure_backoff_base = Duration::from_millis(100);
        options.runner.job_still_running_requeue = Duration::from_millis(500);
        options.runner.pod_rejection_retry = Duration::from_secs(1);
        options.runner.disruption_backoff_max = Duration::from_secs(1);
        options.scale_down.ready_grace_period = Duration::ZERO;
        options
    }

    pub fn start(&self, options: Options) -> Running {
        let shutdown = CancellationToken::new();
        let manager = Manager::new(self.ctx.client.clone(), options);
        let task = tokio::spawn(manager.run(shutdown.clone()));
        Running { shutdown, task }
    }

    pub fn sets(&self) -> Api<EphemeralRunnerSet> {
        self.ctx.api()
    }

    pub fn runners_api(&self) -> Api<EphemeralRunner> {
        self.ctx.api()
    }

    pub fn pods_api(&self) -> Api<Pod> {
        self.ctx.api()
    }

    pub fn secrets_api(&self) -> Api<Secret> {
        self.ctx.api()
    }

    /// Creates a set named `name` with a one-container runner template.
    pub async fn create_set(&self, name: &str, replicas: i64, patch_id: i64) -> EphemeralRunnerSet {
        let mut set = EphemeralRunnerSet::new(
            name,
            EphemeralRunnerSetSpec {
                replicas,
                patch_id,
                ephemeral_runner_spec: EphemeralRunnerSpec {
                    github_config_url: self.config_url.clone(),
                    github_config_secret: CREDENTIALS.to_owned(),
                    runner_scale_set_id: self.scale_set_id,
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
        set.metadata.labels = Some(
            [(
                "actions.github.com/scale-set-name".to_owned(),
                name.to_owned(),
            )]
            .into(),
        );
        self.sets()
            .create(&PostParams::default(), &set)
            .await
            .expect("create the EphemeralRunnerSet")
    }

    /// What the listener does: a merge patch of `replicas` and `patchID` (`replicas: 0` is sent as null).
    pub async fn scale(&self, name: &str, replicas: i64, patch_id: i64) {
        let replicas = if replicas == 0 {
            json!(null)
        } else {
            json!(replicas)
        };
        self.sets()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "replicas": replicas, "patchID": patch_id } })),
            )
            .await
            .expect("scale the set");
    }

    pub async fn runners(&self) -> Vec<EphemeralRunner> {
        self.runners_api()
            .list(&ListParams::default())
            .await
            .expect("list runners")
            .items
    }

    pub async fn pods(&self) -> Vec<Pod> {
        self.pods_api()
            .list(&ListParams::default())
            .await
            .expect("list pods")
            .items
    }

    /// The names of the EphemeralRunners.
    pub async fn runner_names(&self) -> Vec<String> {
        self.runners()
            .await
            .iter()
            .map(ResourceExt::name_any)
            .collect()
    }

    /// The names of the pods.
    pub async fn pod_names(&self) -> Vec<String> {
        self.pods()
            .await
            .iter()
            .map(ResourceExt::name_any)
            .collect()
    }

    /// Waits for a runner's pod, runs it (the stand-in kubelet), and waits until the manager records the runner's
    /// identity with its `Running` (a pod that has not run shows none); returns the runner as it is then.
    pub async fn start_a_runner(&self) -> EphemeralRunner {
        let name = self
            .eventually("a runner's pod", || async {
                self.pod_names().await.into_iter().next()
            })
            .await;
        self.run_pod(&name).await;
        self.eventually("the runner's identity recorded", || async {
            let runner = self.runners_api().get(&name).await.ok()?;
            (runner.status.as_ref()?.runner_id != 0).then_some(runner)
        })
        .await
    }

    /// Waits until the status of runner `name` records a registration (once its pod runs) and returns its id.
    pub async fn recorded_runner_id(&self, name: &str) -> i64 {
        self.eventually(&format!("{name}: its identity recorded"), || async {
            let status = self.runners_api().get(name).await.ok()?.status?;
            (status.runner_id != 0).then_some(status.runner_id)
        })
        .await
    }

    /// Has the fake answer every `endpoint` request `millis` late.
    pub fn slow_down(&self, endpoint: &str, millis: u64) {
        self.fake
            .state()
            .set_faults(Faults {
                latency: vec![LatencyFault {
                    endpoint: Some(endpoint.into()),
                    millis,
                }],
                ..Faults::default()
            })
            .expect("faults");
    }

    /// JIT config Secrets (those with a `jitToken`).
    pub async fn jit_secrets(&self) -> Vec<Secret> {
        self.secrets_api()
            .list(&ListParams::default())
            .await
            .expect("list secrets")
            .items
            .into_iter()
            .filter(|secret| {
                secret
                    .data
                    .as_ref()
                    .is_some_and(|data| data.contains_key("jitToken"))
            })
            .collect()
    }

    /// Runner names registered in the fake for this test's scale set.
    pub fn registered(&self) -> BTreeSet<String> {
        self.fake
            .state()
            .snapshot()
            .runners
            .into_iter()
            .filter(|runner| runner.scale_set_id == self.scale_set_id)
            .map(|runner| runner.name)
            .collect()
    }

    /// Waits until `check` returns `Some`, polling; on a timeout, prints what the namespace and the fake hold, so a
    /// failure in CI says where the runners stood.
    pub async fn eventually<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        if let Some(value) = test_harness::poll_until(WAIT, check).await {
            return value;
        }
        eprintln!("{}", self.describe().await);
        panic!("timed out after {WAIT:?} waiting for {what}");
    }

    /// The runners (with their status), pods, JIT Secrets and registrations, one line each.
    pub async fn describe(&self) -> String {
        let mut lines = vec![format!("--- namespace {} ---", self.ctx.namespace)];
        for runner in self
            .runners_api()
            .list(&ListParams::default())
            .await
            .map(|list| list.items)
            .unwrap_or_default()
        {
            let status = runner.status.clone().unwrap_or_default();
            lines.push(format!(
                "runner {} uid={} deleting={} finalizers={:?} phase={:?} ready={} runnerId={} reason={:?} \
                 message={:?} failures={} job={:?}",
                runner.name_any(),
                runner.uid().unwrap_or_default(),
                runner.metadata.deletion_timestamp.is_some(),
                runner.finalizers(),
                status.phase,
                status.ready,
                status.runner_id,
                status.reason,
                status.message,
                status.failures.len(),
                status.job_request_id,
            ));
        }
        for pod in self
            .pods_api()
            .list(&ListParams::default())
            .await
            .map(|list| list.items)
            .unwrap_or_default()
        {
            let phase = pod.status.as_ref().and_then(|status| status.phase.clone());
            lines.push(format!(
                "pod {} deleting={} phase={phase:?}",
                pod.name_any(),
                pod.metadata.deletion_timestamp.is_some(),
            ));
        }
        let secrets: Vec<String> = self
            .jit_secrets()
            .await
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        lines.push(format!("JIT secrets {secrets:?}"));
        let registrations: Vec<String> = self
            .fake
            .state()
            .snapshot()
            .runners
            .into_iter()
            .filter(|runner| runner.scale_set_id == self.scale_set_id)
            .map(|runner| format!("{}#{}", runner.name, runner.id))
            .collect();
        lines.push(format!("registered {registrations:?}"));
        lines.join("\n")
    }

    /// Waits until EphemeralRunner `name` no longer exists (`what` names the wait in a failure).
    pub async fn wait_runner_gone(&self, what: &str, name: &str) {
        self.eventually(what, || async {
            self.runners_api()
                .get_opt(name)
                .await
                .expect("get the runner")
                .is_none()
                .then_some(())
        })
        .await;
    }

    /// The stand-in kubelet: the runner container runs and the pod is Ready.
    pub async fn run_pod(&self, name: &str) {
        self.eventually("the runner's pod", || async {
            self.pods_api().get_opt(name).await.expect("get pod")
        })
        .await;
        let now = serde_json::to_value(Time(Timestamp::now())).expect("time");
        let status = json!({
            "status": {
                "phase": "Running",
                "conditions": [
                    { "type": "PodScheduled", "status": "True", "lastTransitionTime": now },
                    { "type": "Ready", "status": "True", "lastTransitionTime": now },
                ],
                "containerStatuses": [{
                    "name": "runner",
                    "image": "ghcr.io/actions/actions-runner:latest",
                    "imageID": "",
                    "ready": true,
                    "restartCount": 0,
                    "started": true,
                    "state": { "running": { "startedAt": now } },
                }],
            }
        });
        self.pods_api()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .expect("set the pod running");
    }

    /// The stand-in kubelet: the runner container exited with `exit_code` and the pod ended in `phase`, with an
    /// optional pod-level reason (e.g. `Evicted`).
    pub async fn end_pod(
        &self,
        name: &str,
        phase: &str,
        exit_code: Option<i32>,
        reason: Option<&str>,
    ) {
        let now = serde_json::to_value(Time(Timestamp::now())).expect("time");
        let container_statuses = match exit_code {
            Some(code) => json!([{
                "name": "runner",
                "image": "ghcr.io/actions/actions-runner:latest",
                "imageID": "",
                "ready": false,
                "restartCount": 0,
                "state": { "terminated": { "exitCode": code, "startedAt": now, "finishedAt": now } },
            }]),
            None => json!([]),
        };
        let mut status = json!({
            "phase": phase,
            "conditions": [{ "type": "Ready", "status": "False", "lastTransitionTime": now }],
            "containerStatuses": container_statuses,
        });
        if let Some(reason) = reason {
            status["reason"] = json!(reason);
            status["message"] = json!(format!("stand-in kubelet: {reason}"));
        }
        self.pods_api()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .expect("end the pod");
    }

    /// Gives the runner registered as `runner_id` a job in the fake: the runner comes online, a job is enqueued and
    /// acquired by a message session, and the fake assigns it to the idle runner. Returns the job's request id.
    pub async fn assign_job(&self, runner_id: i64) -> i64 {
        let state = self.fake.state();
        state
            .mark_runner_online(&RunnerSelector {
                runner_id: Some(runner_id),
                jit_config: None,
            })
            .expect("runner online");
        let session = self
            .actions
            .create_message_session(self.scale_set_id, "test-listener")
            .await
            .expect("message session");
        let ids = state
            .enqueue_jobs(&EnqueueJobs {
                scale_set_id: Some(self.scale_set_id),
                count: 1,
                ..EnqueueJobs::default()
            })
            .expect("enqueue a job");
        self.actions
            .acquire_jobs(self.scale_set_id, &session.message_queue_access_token, &ids)
            .await
            .expect("acquire the job");
        let job = state.job(ids[0]).expect("job");
        assert_eq!(
            job.runner_id,
            Some(runner_id),
            "the fake gave the job to the runner: {job:?}"
        );
        ids[0]
    }

    /// What the listener writes on the runner when a job starts.
    pub async fn report_job(&self, runner: &str, job_id: &str) {
        self.runners_api()
            .patch_status(
                runner,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": {
                    "jobRequestId": 42,
                    "jobId": job_id,
                    "jobRepositoryName": "org/repo",
                    "jobWorkflowRef": "org/repo/.github/workflows/ci.yml@refs/heads/main",
                    "workflowRunId": 9001,
                    "jobDisplayName": "build",
                } })),
            )
            .await
            .expect("report the job");
    }

    /// The notes of the Events (events.k8s.io) with `reason` in the test namespace.
    pub async fn event_notes(&self, reason: &str) -> Vec<String> {
        let events: Api<k8s_openapi::api::events::v1::Event> = self.ctx.api();
        events
            .list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|event| event.reason.as_deref() == Some(reason))
            .filter_map(|event| event.note)
            .collect()
    }

    /// Runner pods, by name, with their uids.
    pub async fn pod_uids(&self) -> Vec<(String, String)> {
        self.pods()
            .await
            .into_iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_none())
            .map(|pod| (pod.name_any(), pod.uid().unwrap_or_default()))
            .collect()
    }
}

/// Runners of a list that are registered: the status records a runner id, or the service knows the runner's name
/// (`registered`, [`Env::registered`]). The manager records the identity with the pod's first state worth showing
/// (its running, or its waiting on something), so a runner whose pod has not started shows none yet.
pub fn registered_runners(runners: &[EphemeralRunner], registered: &BTreeSet<String>) -> usize {
    runners
        .iter()
        .filter(|runner| {
            runner
                .status
                .as_ref()
                .is_some_and(|status| status.runner_id != 0)
                || registered.contains(&runner.name_any())
        })
        .count()
}
