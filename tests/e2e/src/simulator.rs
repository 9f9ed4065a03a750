//! The runner simulator: the kubelet and the runner binary for runner pods, since the test control plane has
//! neither.
//!
//! It watches pods labelled `actions-ephemeral-runner=True` and plays each one out:
//!
//! 1. **Scheduling.** With a [`SimulatorConfig::scheduling_delay`], the pod first waits `Pending` with
//!    `PodScheduled=False/Unschedulable`, as it would while a cluster autoscaler adds a node.
//! 2. **Start failure.** A [`SimulatorConfig::start_failure_rate`] fraction of pods never run: the `runner`
//!    container terminates with `StartError` (exit 128) and the pod is `Failed`.
//! 3. **Running.** The pod turns `Running` and Ready with a running `runner` container; the JIT config comes from
//!    the container's `ACTIONS_RUNNER_INPUT_JITCONFIG` (a `secretKeyRef` to the JIT Secret, as the EphemeralRunner
//!    controller wires it) and the runner reports online to the fake by that config.
//! 4. **Job.** When the fake assigns the runner a job, the runner starts it, "runs" it for
//!    [`SimulatorConfig::job_duration`], finishes it with [`SimulatorConfig::job_result`] and the container
//!    terminates with [`SimulatorConfig::exit_code`] (the fake deregisters the runner when its job completes, as
//!    the service does with JIT runners).
//! 5. **Gone.** A runner whose registration disappears (its job was cancelled, or it was removed) exits 0. A pod
//!    deleted under a runner takes the runner offline; if it was running a job, that job fails and is counted as
//!    interrupted, which no correct controller ever causes.
//!
//! Fates (start failure or not) are drawn from a generator seeded with [`SimulatorConfig::seed`] in the order
//! pods are first seen, so the n-th pod of a run always gets the same draw.
//!
//! The simulator talks to the fake in-process through its [`StateHandle`]: polling a runner is then a lock, not
//! an HTTP request, which matters with hundreds of runners on two cores.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use controller::relist::with_relist_deletions;
use crds::EphemeralRunner;
use crds::constants::{
    EPHEMERAL_RUNNER_LABEL, EPHEMERAL_RUNNER_LABEL_VALUE, RUNNER_CONTAINER_NAME,
};
use fake_actions_service::{RunnerSelector, StateHandle};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use node_images::runner::{Event, JobBehaviour, Poll, RunnerService, Session, Termination};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The environment variable of the runner container that holds the encoded JIT config.
pub use node_images::constants::JIT_CONFIG_ENV;

/// Exit code and reason of a container that could not start (what the kubelet reports for, e.g., a bad
/// entrypoint).
const START_FAILURE_EXIT_CODE: i32 = 128;
const START_FAILURE_REASON: &str = "StartError";
/// How long the runner keeps trying to read its JIT config (the Secret is created before the pod, so only a
/// lagging read makes this wait at all).
const JIT_CONFIG_WAIT: Duration = Duration::from_secs(30);
/// How long a failed status patch is retried. A kubelet never gives up on a pod's status while the pod exists;
/// the simulator gives up only after far longer than an API server restart or a burst's overload lasts (a chaos
/// run restarts kube-apiserver once, and five attempts over two seconds once left a finished pod `Running` for
/// good), and then reports the pod broken.
const STATUS_PATCH_DEADLINE: Duration = Duration::from_secs(120);
/// The longest wait between two attempts of a status patch.
const STATUS_PATCH_BACKOFF_CAP: Duration = Duration::from_secs(2);
/// How long a runner refused its JIT config waits for its EphemeralRunner's deletion before it is taken for a
/// broken one: a scale-down deregisters a runner and then deletes it, and a manager killed between the two leaves
/// the deletion to its successor, which starts and acts within seconds.
const RUNNER_DELETION_WAIT: Duration = Duration::from_secs(15);

/// How simulated runner pods behave. Read when a pod is first seen, so a change applies to new pods only.
#[derive(Debug, Clone)]
pub struct SimulatorConfig {
    /// How long a pod stays `Pending` (unschedulable) before it runs.
    pub scheduling_delay: Duration,
    /// Fraction (0 to 1) of pods whose runner container fails to start.
    pub start_failure_rate: f64,
    /// How long a runner runs its job.
    pub job_duration: Duration,
    /// Result the runner reports for its job.
    pub job_result: String,
    /// Exit code of the runner container after its job.
    pub exit_code: i32,
    /// How often a runner asks the fake whether it got a job.
    pub poll_interval: Duration,
    /// Seed of the fate generator.
    pub seed: u64,
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        Self {
            scheduling_delay: Duration::ZERO,
            start_failure_rate: 0.0,
            job_duration: Duration::from_secs(1),
            job_result: "succeeded".to_owned(),
            exit_code: 0,
            poll_interval: Duration::from_millis(200),
            seed: 42,
        }
    }
}

impl SimulatorConfig {
    /// The part of the behaviour the simulated runner shares with the runner image.
    pub fn job_behaviour(&self) -> JobBehaviour {
        JobBehaviour {
            job_duration: self.job_duration,
            job_result: self.job_result.clone(),
            exit_code: self.exit_code,
            poll_interval: self.poll_interval,
            ..JobBehaviour::default()
        }
    }
}

/// The fake, reached in-process, as the runner logic sees the Actions Service.
struct InProcess<'a>(&'a StateHandle);

impl RunnerService for InProcess<'_> {
    async fn online(&self, jit_config: &str) -> Result<i64, String> {
        self.0
            .mark_runner_online(&RunnerSelector {
                runner_id: None,
                jit_config: Some(jit_config.to_owned()),
            })
            .map(|view| view.id)
            .map_err(|rejection| rejection.to_string())
    }

    async fn poll(&self, runner_id: i64) -> Poll {
        match self.0.runner(runner_id) {
            Err(_) => Poll::Gone,
            Ok(view) => view.job_request_id.map_or(Poll::Waiting, Poll::Job),
        }
    }

    async fn start_job(&self, job: i64) -> bool {
        self.0.start_job(job).is_ok()
    }

    async fn renew_job(&self, job: i64) -> Option<bool> {
        Some(self.0.renew_job(job).is_ok())
    }

    async fn finish_job(&self, job: i64, result: &str) -> bool {
        self.0.finish_job(job, result).is_ok()
    }

    async fn offline(&self, runner_id: i64) {
        let _ = self.0.mark_runner_offline(runner_id);
    }
}

/// Where a simulated pod is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub enum PodStage {
    /// Waiting for a node.
    Pending,
    /// Runner running, idle or with a job.
    Running,
    /// Runner exited after its job (or after losing its registration).
    Finished,
    /// The container failed to start.
    FailedToStart,
    /// The runner could not work (no JIT config, or the fake refused it).
    Broken,
    /// The pod was deleted while the runner still ran.
    Deleted,
}

/// One pod the simulator has seen.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    pub stage: PodStage,
    /// Runner id in the fake, once online.
    pub runner_id: Option<i64>,
    /// Job request id, once the runner started a job.
    pub job: Option<i64>,
    /// When the simulator first saw the pod.
    #[serde(skip)]
    pub seen_at: Option<Instant>,
    /// When the runner reported its job finished to the fake.
    #[serde(skip)]
    pub job_finished_at: Option<Instant>,
    /// When the runner container's exit was written to the pod's status (the kubelet's part of a finished
    /// runner's teardown).
    #[serde(skip)]
    pub exited_at: Option<Instant>,
    /// When the exit's write came back to the simulator on its own pod watch: one watch hop under the run's load.
    #[serde(skip)]
    pub exit_seen_at: Option<Instant>,
    /// When the simulator saw the pod deleted.
    #[serde(skip)]
    pub deleted_at: Option<Instant>,
    /// When the API server created the pod.
    #[serde(skip)]
    pub created: Option<Timestamp>,
    /// The `runner` container's environment, by name (values given inline only): which template the pod ran.
    #[serde(skip)]
    pub runner_env: BTreeMap<String, String>,
}

/// Counts over everything the simulator has seen, for assertions and the demo.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimulatorStats {
    /// Pods seen.
    pub pods: usize,
    /// Pods per stage now.
    pub stages: BTreeMap<PodStage, usize>,
    /// Jobs started by a simulated runner.
    pub jobs_started: usize,
    /// Jobs finished by a simulated runner.
    pub jobs_finished: usize,
    /// Jobs a runner was running when its pod was deleted: a controller bug.
    pub jobs_interrupted: usize,
}

impl SimulatorStats {
    /// Pods in `stage` now.
    pub fn in_stage(&self, stage: PodStage) -> usize {
        self.stages.get(&stage).copied().unwrap_or(0)
    }
}

#[derive(Default)]
struct Book {
    pods: HashMap<String, PodRecord>,
    /// Job request id → pods that started it.
    served: BTreeMap<i64, Vec<String>>,
    jobs_finished: usize,
    jobs_interrupted: usize,
    /// Pods a test deletes on purpose (a drain, an eviction): a job their runner was running is expected to fail.
    deletions_expected: HashSet<String>,
    /// Jobs failed because a test deleted their runner's pod on purpose.
    jobs_interrupted_on_purpose: BTreeSet<i64>,
    problems: Vec<String>,
    /// Pod uid → the task's cancellation, while it runs.
    running: HashMap<String, CancellationToken>,
    /// The first runner pod seen and the first JIT Secret read, as the API server gave them: what the lifecycle
    /// baseline writes copies of ([`crate::lifecycle_baseline`]).
    sample_pod: Option<Pod>,
    sample_secret: Option<Secret>,
}

struct Shared {
    client: Client,
    fake: StateHandle,
    config: RwLock<SimulatorConfig>,
    book: Mutex<Book>,
    rng: Mutex<SplitMix64>,
}

impl Shared {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn config(&self) -> SimulatorConfig {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn problem(&self, problem: String) {
        tracing::warn!(%problem, "runner simulator");
        self.book().problems.push(problem);
    }

    fn set_stage(&self, uid: &str, stage: PodStage) {
        if let Some(record) = self.book().pods.get_mut(uid) {
            record.stage = stage;
        }
    }
}

/// Runs runner pods until dropped or [`Simulator::stop`]ped.
pub struct Simulator {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Simulator {
    /// Starts simulating the runner pods of `namespace` (all namespaces when `None`).
    pub fn start(
        client: Client,
        namespace: Option<&str>,
        fake: StateHandle,
        config: SimulatorConfig,
    ) -> Self {
        let shared = Arc::new(Shared {
            client: client.clone(),
            fake,
            rng: Mutex::new(SplitMix64(config.seed)),
            config: RwLock::new(config),
            book: Mutex::default(),
        });
        let pods: Api<Pod> = match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        };
        let task = tokio::spawn(watch(Arc::clone(&shared), pods));
        Self { shared, task }
    }

    /// Replaces the behaviour of pods seen from now on.
    pub fn set_config(&self, config: SimulatorConfig) {
        *self
            .shared
            .config
            .write()
            .unwrap_or_else(|p| p.into_inner()) = config;
    }

    /// The behaviour of new pods.
    pub fn config(&self) -> SimulatorConfig {
        self.shared.config()
    }

    /// Counts now.
    pub fn stats(&self) -> SimulatorStats {
        let book = self.shared.book();
        let mut stages = BTreeMap::new();
        for record in book.pods.values() {
            *stages.entry(record.stage).or_insert(0) += 1;
        }
        SimulatorStats {
            pods: book.pods.len(),
            stages,
            jobs_started: book.served.values().map(Vec::len).sum(),
            jobs_finished: book.jobs_finished,
            jobs_interrupted: book.jobs_interrupted,
        }
    }

    /// Every pod seen, by name.
    pub fn pods(&self) -> Vec<PodRecord> {
        let mut pods: Vec<PodRecord> = self.shared.book().pods.values().cloned().collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        pods
    }

    /// Jobs started by more than one simulated runner, with the pods that started them. Empty when every job
    /// was served at most once.
    pub fn jobs_served_twice(&self) -> BTreeMap<i64, Vec<String>> {
        self.shared
            .book()
            .served
            .iter()
            .filter(|(_, pods)| pods.len() > 1)
            .map(|(job, pods)| (*job, pods.clone()))
            .collect()
    }

    /// Job request ids started by simulated runners.
    pub fn jobs_served(&self) -> Vec<i64> {
        self.shared.book().served.keys().copied().collect()
    }

    /// Things that went wrong that a test should look at (an unreadable JIT config, a refused runner, a status
    /// the API server would not take).
    /// Says that a test is about to delete pod `uid` on purpose (as a drain or an eviction would): a job its
    /// runner is running then fails without it being counted as a controller's interruption.
    pub fn expect_deletion(&self, uid: &str) {
        self.shared.book().deletions_expected.insert(uid.to_owned());
    }

    /// Takes back [`Simulator::expect_deletion`]: the deletion did not happen (an eviction refused).
    pub fn deletion_refused(&self, uid: &str) {
        self.shared.book().deletions_expected.remove(uid);
    }

    /// Jobs that failed because a test deleted their runner's pod on purpose.
    pub fn jobs_interrupted_on_purpose(&self) -> BTreeSet<i64> {
        self.shared.book().jobs_interrupted_on_purpose.clone()
    }

    pub fn problems(&self) -> Vec<String> {
        self.shared.book().problems.clone()
    }

    /// The first runner pod this simulator saw and the first JIT Secret it read.
    pub fn samples(&self) -> (Option<Pod>, Option<Secret>) {
        let book = self.shared.book();
        (book.sample_pod.clone(), book.sample_secret.clone())
    }

    /// Stops watching and abandons every simulated runner where it is.
    pub fn stop(self) {
        self.task.abort();
        for token in self.shared.book().running.values() {
            token.cancel();
        }
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn watch(shared: Arc<Shared>, pods: Api<Pod>) {
    let config = watcher::Config::default().labels(&format!(
        "{EPHEMERAL_RUNNER_LABEL}={EPHEMERAL_RUNNER_LABEL_VALUE}"
    ));
    // Through a cache of its own so that a re-list's implied deletions come as events: a kubelet whose watch had
    // to list again stops the pods the list no longer holds, deleted while it was not following.
    let (cache, writer) = reflector::store();
    let mut events = with_relist_deletions(watcher(pods, config).reflect(writer), cache).boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                if pod.metadata.deletion_timestamp.is_some() {
                    on_delete(&shared, &pod);
                } else {
                    if runner_exited(&pod) {
                        on_exit_seen(&shared, &pod);
                    }
                    on_pod(&shared, pod);
                }
            }
            Ok(watcher::Event::Delete(pod)) => on_delete(&shared, &pod),
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            // The watcher re-lists by itself; slow down a little on errors.
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

fn on_pod(shared: &Arc<Shared>, pod: Pod) {
    let uid = pod.uid().unwrap_or_default();
    {
        let mut book = shared.book();
        if book.pods.contains_key(&uid) {
            return;
        }
        if book.sample_pod.is_none() {
            book.sample_pod = Some(pod.clone());
        }
        // A pod some earlier simulator (or a test) already played is not ours to run.
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Running" | "Succeeded" | "Failed")) {
            return;
        }
        book.pods.insert(
            uid.clone(),
            PodRecord {
                namespace: pod.namespace().unwrap_or_default(),
                name: pod.name_any(),
                stage: PodStage::Pending,
                runner_id: None,
                job: None,
                seen_at: Some(Instant::now()),
                job_finished_at: None,
                exited_at: None,
                exit_seen_at: None,
                deleted_at: None,
                created: pod.metadata.creation_timestamp.as_ref().map(|time| time.0),
                runner_env: runner_env(&pod),
            },
        );
    }
    let config = shared.config();
    let draw = shared
        .rng
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .next_f64();
    let fails_to_start = draw < config.start_failure_rate;
    let token = CancellationToken::new();
    shared.book().running.insert(uid.clone(), token.clone());
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let runner = PodRunner {
            shared: Arc::clone(&shared),
            pods: Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default()),
            uid: uid.clone(),
            name: pod.name_any(),
            config,
            session: Session::default(),
        };
        runner.run(pod, fails_to_start, token).await;
        shared.book().running.remove(&uid);
    });
}

/// The inline environment of a pod's `runner` container.
fn runner_env(pod: &Pod) -> BTreeMap<String, String> {
    pod.spec
        .iter()
        .flat_map(|spec| &spec.containers)
        .filter(|container| container.name == RUNNER_CONTAINER_NAME)
        .flat_map(|container| container.env.iter().flatten())
        .filter_map(|var| Some((var.name.clone(), var.value.clone()?)))
        .collect()
}

/// Whether the pod's status shows its runner container terminated.
fn runner_exited(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.container_statuses.as_ref())
        .is_some_and(|statuses| {
            statuses.iter().any(|c| {
                c.name == RUNNER_CONTAINER_NAME
                    && c.state.as_ref().is_some_and(|s| s.terminated.is_some())
            })
        })
}

fn on_exit_seen(shared: &Shared, pod: &Pod) {
    let uid = pod.uid().unwrap_or_default();
    if let Some(record) = shared.book().pods.get_mut(&uid) {
        record.exit_seen_at.get_or_insert_with(Instant::now);
    }
}

fn on_delete(shared: &Shared, pod: &Pod) {
    let uid = pod.uid().unwrap_or_default();
    let mut book = shared.book();
    if let Some(record) = book.pods.get_mut(&uid) {
        record.deleted_at.get_or_insert_with(Instant::now);
    }
    if let Some(token) = book.running.get(&uid) {
        token.cancel();
    }
}

/// One simulated runner pod.
struct PodRunner {
    shared: Arc<Shared>,
    pods: Api<Pod>,
    uid: String,
    name: String,
    config: SimulatorConfig,
    /// The runner's life as the Actions Service sees it: the logic the runner image runs too.
    session: Session,
}

/// Why a runner stopped before the end of its life.
enum Stop {
    /// Its pod was deleted.
    Deleted,
    /// It could not go on; the message says why.
    Broken(String),
}

impl PodRunner {
    async fn run(mut self, pod: Pod, fails_to_start: bool, token: CancellationToken) {
        let outcome = tokio::select! {
            () = token.cancelled() => Err(Stop::Deleted),
            outcome = self.live(&pod, fails_to_start) => outcome,
        };
        match outcome {
            Ok(stage) => self.shared.set_stage(&self.uid, stage),
            Err(Stop::Deleted) => {
                self.shared.set_stage(&self.uid, PodStage::Deleted);
                self.on_deleted().await;
            }
            Err(Stop::Broken(problem)) => {
                self.shared.set_stage(&self.uid, PodStage::Broken);
                self.shared.problem(format!("pod {}: {problem}", self.name));
            }
        }
    }

    async fn live(&mut self, pod: &Pod, fails_to_start: bool) -> Result<PodStage, Stop> {
        if !self.config.scheduling_delay.is_zero() {
            self.patch_status(unschedulable_status()).await?;
            tokio::time::sleep(self.config.scheduling_delay).await;
        }
        if fails_to_start {
            self.patch_status(terminated_status(
                START_FAILURE_EXIT_CODE,
                START_FAILURE_REASON,
                "the runner container could not start (simulated)",
            ))
            .await?;
            return Ok(PodStage::FailedToStart);
        }
        let jit_config = self.jit_config(pod).await?;
        self.patch_status(running_status()).await?;
        self.shared.set_stage(&self.uid, PodStage::Running);
        let fake = InProcess(&self.shared.fake);
        let runner_id = match fake.online(&jit_config).await {
            Ok(id) => id,
            Err(rejection) => {
                // A real runner with a consumed or revoked config fails to connect and exits non-zero.
                self.patch_status(terminated_status(1, "Error", "runner could not connect"))
                    .await?;
                // A runner (or pod) being taken away is deregistered before its pod goes: a container that
                // started in between finds its config revoked, as it would on a kubelet, and its pod goes all
                // the same. A scale-down deletes the runner right after its deregistration (a manager killed in
                // between leaves that to its successor), so the runner's deletion is given a moment to show; the
                // pod's is not, as the manager deletes a failed pod itself. A config used twice is counted by the
                // fake itself, whatever happens here.
                if self.taken_away(pod).await || self.runner_taken_away_soon(pod).await {
                    return Err(Stop::Deleted);
                }
                return Err(Stop::Broken(format!(
                    "the fake refused the runner's JIT config: {rejection}"
                )));
            }
        };
        self.session.runner_id = Some(runner_id);
        self.record(|record| record.runner_id = Some(runner_id));
        let exit_code = self.serve(runner_id).await;
        let reason = if exit_code == 0 { "Completed" } else { "Error" };
        self.patch_status(terminated_status(exit_code, reason, "runner exited"))
            .await?;
        self.record(|record| record.exited_at = Some(Instant::now()));
        Ok(PodStage::Finished)
    }

    /// Waits for a job, runs it and returns the container's exit code.
    async fn serve(&mut self, runner_id: i64) -> i32 {
        let shared = Arc::clone(&self.shared);
        let (uid, pod) = (self.uid.clone(), self.name.clone());
        let behaviour = self.config.job_behaviour();
        let mut on_event = |event: Event| match event {
            Event::Online(_) => {}
            Event::Started(job) => {
                let mut book = shared.book();
                book.served.entry(job).or_default().push(pod.clone());
                if let Some(record) = book.pods.get_mut(&uid) {
                    record.job = Some(job);
                }
            }
            // A cancelled job has completed already; the runner exits all the same.
            Event::Finished { reported, .. } => {
                if reported {
                    let mut book = shared.book();
                    book.jobs_finished += 1;
                    if let Some(record) = book.pods.get_mut(&uid) {
                        record.job_finished_at = Some(Instant::now());
                    }
                }
            }
        };
        self.session
            .serve(
                &InProcess(&self.shared.fake),
                runner_id,
                &behaviour,
                &mut on_event,
            )
            .await
    }

    /// The runner process dies with its pod: the service sees it go offline; a job it was running fails
    /// (what [`Session::terminate`] does, as the runner image does on SIGTERM).
    async fn on_deleted(&self) {
        if let Termination::Interrupted(job) =
            self.session.terminate(&InProcess(&self.shared.fake)).await
        {
            let mut book = self.shared.book();
            if book.deletions_expected.contains(&self.uid) {
                book.jobs_interrupted_on_purpose.insert(job);
                return;
            }
            book.jobs_interrupted += 1;
            drop(book);
            self.shared.problem(format!(
                "pod {} was deleted while its runner ran job {job}",
                self.name
            ));
        }
    }

    fn record(&self, update: impl FnOnce(&mut PodRecord)) {
        if let Some(record) = self.shared.book().pods.get_mut(&self.uid) {
            update(record);
        }
    }

    /// Whether the API server says the pod or the runner owning it is gone or being deleted (an answer it cannot
    /// give counts as no).
    async fn taken_away(&self, pod: &Pod) -> bool {
        match self.pods.get_opt(&self.name).await {
            Ok(None) => return true,
            Ok(Some(current)) if current.metadata.deletion_timestamp.is_some() => return true,
            Ok(Some(_)) => {}
            Err(_) => return false,
        }
        self.runner_taken_away(pod).await
    }

    /// Whether the runner owning `pod` is gone or being deleted within [`RUNNER_DELETION_WAIT`], asked every 200 ms.
    async fn runner_taken_away_soon(&self, pod: &Pod) -> bool {
        let deadline = Instant::now() + RUNNER_DELETION_WAIT;
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if self.runner_taken_away(pod).await {
                return true;
            }
        }
        false
    }

    /// Whether the API server says the runner owning `pod` is gone or being deleted (an answer it cannot give
    /// counts as no).
    async fn runner_taken_away(&self, pod: &Pod) -> bool {
        let namespace = pod.namespace().unwrap_or_default();
        let going = |meta: &kube::api::ObjectMeta| meta.deletion_timestamp.is_some();
        let Some(owner) = pod
            .owner_references()
            .iter()
            .find(|owner| owner.kind == "EphemeralRunner")
        else {
            return false;
        };
        let runners: Api<EphemeralRunner> = Api::namespaced(self.shared.client.clone(), &namespace);
        match runners.get_opt(&owner.name).await {
            Ok(None) => true,
            Ok(Some(runner)) => going(&runner.metadata) || runner.uid() != Some(owner.uid.clone()),
            Err(_) => false,
        }
    }

    /// The encoded JIT config the runner container would get in its environment.
    async fn jit_config(&self, pod: &Pod) -> Result<String, Stop> {
        let var = pod
            .spec
            .iter()
            .flat_map(|spec| &spec.containers)
            .filter(|c| c.name == RUNNER_CONTAINER_NAME)
            .flat_map(|c| c.env.iter().flatten())
            .find(|var| var.name == JIT_CONFIG_ENV)
            .ok_or_else(|| {
                Stop::Broken(format!(
                    "no {JIT_CONFIG_ENV} in the `{RUNNER_CONTAINER_NAME}` container"
                ))
            })?;
        if let Some(value) = &var.value {
            return Ok(value.clone());
        }
        let key_ref = var
            .value_from
            .as_ref()
            .and_then(|from| from.secret_key_ref.as_ref())
            .ok_or_else(|| {
                Stop::Broken(format!(
                    "{JIT_CONFIG_ENV} is neither a value nor a Secret key"
                ))
            })?;
        let secrets: Api<Secret> = Api::namespaced(
            self.shared.client.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        let deadline = tokio::time::Instant::now() + JIT_CONFIG_WAIT;
        loop {
            let value = secrets
                .get_opt(&key_ref.name)
                .await
                .ok()
                .flatten()
                .inspect(|secret| {
                    let mut book = self.shared.book();
                    if book.sample_secret.is_none() {
                        book.sample_secret = Some(secret.clone());
                    }
                })
                .and_then(|secret| secret.data)
                .and_then(|mut data| data.remove(&key_ref.key))
                .and_then(|bytes| String::from_utf8(bytes.0).ok());
            if let Some(value) = value {
                return Ok(value);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Stop::Broken(format!(
                    "Secret {} has no key {} (the kubelet would keep the pod in CreateContainerConfigError)",
                    key_ref.name, key_ref.key
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn patch_status(&self, status: Value) -> Result<(), Stop> {
        let deadline = tokio::time::Instant::now() + STATUS_PATCH_DEADLINE;
        let mut attempt: u32 = 0;
        loop {
            attempt = attempt.saturating_add(1);
            match self
                .pods
                .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&status))
                .await
            {
                Ok(_) => return Ok(()),
                // The pod is gone: the watch will cancel this runner, if it has not already.
                Err(kube::Error::Api(response)) if response.code == 404 => {
                    return Err(Stop::Deleted);
                }
                Err(error) if tokio::time::Instant::now() >= deadline => {
                    return Err(Stop::Broken(format!(
                        "patching the pod status ({attempt} attempts): {error}"
                    )));
                }
                Err(_) => {
                    let backoff = Duration::from_millis(200 * u64::from(attempt));
                    tokio::time::sleep(backoff.min(STATUS_PATCH_BACKOFF_CAP)).await;
                }
            }
        }
    }
}

fn now() -> String {
    Timestamp::now().to_string()
}

fn unschedulable_status() -> Value {
    json!({"status": {
        "phase": "Pending",
        "conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/0 nodes are available (simulated: waiting for a node)",
            "lastTransitionTime": now(),
        }],
    }})
}

fn container_status(ready: bool, state: Value) -> Value {
    json!({
        "name": RUNNER_CONTAINER_NAME,
        "image": "ghcr.io/actions/actions-runner:latest",
        "imageID": "",
        "ready": ready,
        "restartCount": 0,
        "started": ready,
        "state": state,
    })
}

pub(crate) fn running_status() -> Value {
    let now = now();
    json!({"status": {
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
        ],
        "containerStatuses": [container_status(true, json!({"running": {"startedAt": now}}))],
    }})
}

pub(crate) fn terminated_status(exit_code: i32, reason: &str, message: &str) -> Value {
    let now = now();
    let phase = if exit_code == 0 {
        "Succeeded"
    } else {
        "Failed"
    };
    json!({"status": {
        "phase": phase,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "False", "lastTransitionTime": now},
        ],
        "containerStatuses": [container_status(false, json!({"terminated": {
            "exitCode": exit_code,
            "reason": reason,
            "message": message,
            "finishedAt": now,
        }}))],
    }})
}

/// A small, seedable generator (SplitMix64): fates must be reproducible, and nothing here needs more.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        // The top 53 bits fill an f64 mantissa exactly.
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_reproducible_and_in_range() {
        let mut a = SplitMix64(7);
        let mut b = SplitMix64(7);
        let draws: Vec<f64> = (0..1000).map(|_| a.next_f64()).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        assert_eq!(draws, (0..1000).map(|_| b.next_f64()).collect::<Vec<_>>());
        // Roughly uniform: a rate of 0.3 selects about 300 of 1000.
        let selected = draws.iter().filter(|d| **d < 0.3).count();
        assert!((250..350).contains(&selected), "{selected}");
        assert_ne!(SplitMix64(8).next_u64(), SplitMix64(7).next_u64());
    }

    #[test]
    fn terminated_status_reflects_the_exit_code() {
        let ok = terminated_status(0, "Completed", "done");
        assert_eq!(ok["status"]["phase"], "Succeeded");
        assert_eq!(
            ok["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            0
        );
        let failed = terminated_status(START_FAILURE_EXIT_CODE, START_FAILURE_REASON, "x");
        assert_eq!(failed["status"]["phase"], "Failed");
        assert_eq!(
            failed["status"]["containerStatuses"][0]["name"],
            RUNNER_CONTAINER_NAME
        );
    }
}
