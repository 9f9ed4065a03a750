//! The state shared by every reconciler: clients, stores, metrics, options, and small in-memory books
//! (error backoff, scale expectations, runner disruption history).

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crds::{EphemeralRunner, EphemeralRunnerSet};
use futures::FutureExt as _;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};

use crate::actions::ActionsClients;
use crate::completions::Completions;
use crate::metrics::Metrics;
use crate::options::Options;
use crate::pods::CachedPod;

/// The API server refuses Events whose note exceeds 1 kB; a cut note is better than a lost Event.
fn truncate_note(mut note: String) -> String {
    const MAX: usize = 1024;
    const ELLIPSIS: &str = "…";
    if note.len() > MAX {
        let mut end = MAX - ELLIPSIS.len();
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str(ELLIPSIS);
    }
    note
}

/// An object's key in [`ErrorBackoff`]: controller, namespace and name.
fn backoff_key<K: ResourceExt>(controller: &str, object: &K) -> String {
    format!(
        "{controller}/{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// Read-only caches fed by the manager's watches.
#[derive(Clone)]
pub struct Stores {
    /// EphemeralRunnerSets.
    pub runner_sets: Store<EphemeralRunnerSet>,
    /// EphemeralRunners.
    pub runners: Store<EphemeralRunner>,
    /// Runner pods (label `actions-ephemeral-runner=True`).
    pub pods: Store<CachedPod>,
}

/// Shared by all reconcilers, behind an `Arc`.
pub struct Context {
    /// Kubernetes client (rate limited by the manager's flags).
    pub client: Client,
    /// The runner teardown lane's client: a rate limit of its own in the binary, so that teardown never waits
    /// for request budget behind creation (docs/runner-lifecycle.md, "Teardown first").
    pub teardown_client: Client,
    /// Options.
    pub options: Options,
    /// Metric handles.
    pub metrics: Arc<Metrics>,
    /// Publishes Kubernetes Events.
    pub recorder: Recorder,
    /// Actions Service clients.
    pub actions: ActionsClients,
    /// Watched objects.
    pub stores: Stores,
    /// Per-object backoff of failed reconciles.
    pub backoff: ErrorBackoff,
    /// Runner creations and deletions not yet seen by the runner watch, per EphemeralRunnerSet (shared with the
    /// watch, which settles them on deletions).
    pub expectations: Arc<Expectations>,
    /// Per-runner memory that need not survive a restart (shared with the watch, which clears it on deletions).
    pub runner_memory: Arc<RunnerMemory>,
    /// Runners that left with a job, per EphemeralRunnerSet, until the listener's target leaves their jobs out
    /// (fed by the runner watch).
    pub completions: Arc<Completions>,
}

/// How a failed reconcile is requeued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorRequeue {
    /// Per-object exponential backoff.
    Backoff,
    /// The same, but at least `Options::configuration_error_backoff` for errors a person has to fix (a Secret,
    /// a spec): retrying those quickly only burns API calls.
    SlowForConfiguration,
}

impl Context {
    /// Runs one reconcile of `object` with the bookkeeping every controller shares: its duration and outcome
    /// in the metrics, and the object's error backoff reset once it succeeds.
    ///
    /// A combinator rather than an `async fn`: an `async fn` keeps the future it is given twice in its own state
    /// (the argument and the value being awaited), and a reconcile's future is most of the task kube-runtime
    /// spawns for it (18 KiB for a runner's; 64 of them in flight in a burst).
    pub fn instrumented<'a, K: ResourceExt>(
        &'a self,
        controller: &'static str,
        object: &'a K,
        reconcile: impl Future<Output = crate::Result<Action>> + 'a,
    ) -> impl Future<Output = crate::Result<Action>> + 'a {
        let started = Instant::now();
        reconcile.map(move |result| {
            self.metrics
                .record_reconcile(controller, started, result.as_ref().err());
            if result.is_ok() {
                self.backoff.reset(&backoff_key(controller, object));
            }
            result
        })
    }

    /// The requeue after a failed reconcile of `object` (the controllers' `error_policy`).
    pub fn requeue_after_error<K: ResourceExt + Resource<DynamicType = ()>>(
        &self,
        controller: &'static str,
        object: &K,
        error: &crate::Error,
        policy: ErrorRequeue,
    ) -> Action {
        let namespace = object.namespace().unwrap_or_default();
        let (kind, name) = (K::kind(&()), object.name_any());
        let settled = if error.is_gone(&kind, &namespace, &name) {
            Some("the object was deleted during its reconcile; nothing left to do")
        } else if error.is_overtaken(&kind, &namespace, &name) {
            Some("the object changed since the pass's view; its watch event brings it back")
        } else {
            None
        };
        if let Some(why) = settled {
            tracing::debug!(controller, name, namespace, %error, "{why}");
            return Action::await_change();
        }
        let mut delay = self.backoff.next_delay(&backoff_key(controller, object));
        if policy == ErrorRequeue::SlowForConfiguration && error.is_configuration_problem() {
            delay = delay.max(self.options.configuration_error_backoff);
        }
        tracing::warn!(
            controller,
            name = %object.name_any(),
            namespace = object.namespace().unwrap_or_default(),
            %error,
            ?delay,
            "reconcile failed"
        );
        Action::requeue(delay)
    }

    /// Publishes an Event about `regarding`; failures are only logged, since an Event is never worth failing a
    /// reconcile for.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate_note(note)),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, regarding).await {
            tracing::warn!(%error, reason, "publishing an Event failed");
        }
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Exponential backoff per object for failed reconciles, reset by a success (kube-runtime has none built in).
#[derive(Debug)]
pub struct ErrorBackoff {
    min: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl ErrorBackoff {
    /// Delays from `min`, doubling, capped at `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Records a failure of `key` and returns the delay before the next attempt.
    pub fn next_delay(&self, key: &str) -> Duration {
        let mut failures = lock(&self.failures);
        let count = failures.entry(key.to_owned()).or_insert(0);
        let delay = self
            .min
            .saturating_mul(1u32.checked_shl(*count).unwrap_or(u32::MAX))
            .min(self.max);
        *count = count.saturating_add(1);
        delay
    }

    /// Forgets the failures of `key`.
    pub fn reset(&self, key: &str) {
        lock(&self.failures).remove(key);
    }
}

/// Runner creations and deletions an EphemeralRunnerSet made that its runner watch has not reported yet. While
/// any are outstanding the set does not scale again, so a stale cache never causes duplicate runners or
/// double deletions. Entries expire, in case an event is lost (the watch relists eventually).
#[derive(Debug, Default)]
pub struct Expectations {
    sets: Mutex<HashMap<String, Expected>>,
}

#[derive(Debug, Default)]
struct Expected {
    created: HashSet<String>,
    deleted: HashSet<String>,
    /// Runners whose deletion the watch reported while nothing was expected of them. A set records its
    /// creations when the whole batch has been answered, and a runner made early in a large batch can run its
    /// job and be gone before then: its creation is settled as it is recorded, or it would be waited for until
    /// [`EXPECTATION_TIMEOUT`]. Kept until the set's expectations are next settled.
    departed: HashSet<String>,
    since: Option<Instant>,
}

/// How long an expectation is waited for before it is assumed lost.
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(60);

impl Expectations {
    /// Records runners just created by set `key`.
    pub fn created(&self, key: &str, names: impl IntoIterator<Item = String>) {
        self.expect(key, names, |expected| &mut expected.created);
    }

    /// Records runners just deleted by set `key`.
    pub fn deleted(&self, key: &str, names: impl IntoIterator<Item = String>) {
        self.expect(key, names, |expected| &mut expected.deleted);
    }

    /// Adds `names` to the expectations `list` picks, except runners already reported gone.
    fn expect(
        &self,
        key: &str,
        names: impl IntoIterator<Item = String>,
        list: impl Fn(&mut Expected) -> &mut HashSet<String>,
    ) {
        let mut sets = lock(&self.sets);
        let expected = sets.entry(key.to_owned()).or_default();
        let mut added = false;
        for name in names {
            if !expected.departed.remove(&name) {
                added |= list(expected).insert(name);
            }
        }
        if added {
            expected.since.get_or_insert_with(Instant::now);
        }
    }

    /// Drops what the cache now shows (`seen`: the runner is in the cache at all; `alive`: it is there and not
    /// being deleted) and says whether everything expected was seen.
    pub fn satisfied(
        &self,
        key: &str,
        seen: impl Fn(&str) -> bool,
        alive: impl Fn(&str) -> bool,
    ) -> bool {
        let mut sets = lock(&self.sets);
        let Some(expected) = sets.get_mut(key) else {
            return true;
        };
        expected.created.retain(|name| !seen(name));
        expected.deleted.retain(|name| alive(name));
        let done = expected.created.is_empty() && expected.deleted.is_empty();
        let expired = expected
            .since
            .is_some_and(|since| since.elapsed() >= EXPECTATION_TIMEOUT);
        if done || expired {
            if expired && !done {
                tracing::warn!(
                    set = key,
                    "runner watch did not report expected changes in time; rescaling anyway"
                );
            }
            sets.remove(key);
            return true;
        }
        false
    }

    /// How long set `key`'s expectations are still waited for; `None` when nothing is expected.
    pub fn left(&self, key: &str) -> Option<Duration> {
        let sets = lock(&self.sets);
        let since = sets.get(key)?.since?;
        Some(EXPECTATION_TIMEOUT.saturating_sub(since.elapsed()))
    }

    /// Runner `name` of set `key` was deleted (its watch event): nothing more can be seen of it, so whatever was
    /// expected of it is settled, even a creation the cache never showed (created and deleted in between).
    pub fn gone(&self, key: &str, name: &str) {
        let mut sets = lock(&self.sets);
        if let Some(expected) = sets.get_mut(key) {
            let was_expected = expected.created.remove(name) | expected.deleted.remove(name);
            if !was_expected {
                expected.departed.insert(name.to_owned());
            }
        }
    }

    /// Set `key` is about to create runners: from now on, deletions the watch reports are remembered until the
    /// creations are recorded ([`Expectations::created`]).
    pub fn creating(&self, key: &str) {
        lock(&self.sets).entry(key.to_owned()).or_default();
    }

    /// Forgets set `key` (deleted).
    pub fn forget(&self, key: &str) {
        lock(&self.sets).remove(key);
    }
}

/// Per-runner facts kept in memory: disruptions (not counted as failures, but backed off), when the registration
/// was last checked, registrations already removed and runners already finalized. Losing them on restart only
/// resets a backoff, triggers an early check or repeats a removal or a finalization the API server and the
/// service answer as done; none of them is a guess about the cache. Disruptions and checks go when the runner's
/// deletion reaches the watch ([`RunnerMemory::forget`]), whoever finalized it.
#[derive(Debug, Default)]
pub struct RunnerMemory {
    disruptions: Mutex<HashMap<String, (u32, Instant)>>,
    checked: Mutex<HashMap<String, Instant>>,
    /// The runner as this manager's last status write left it, by uid, until the watch brings an event that shows
    /// the write (see [`RunnerMemory::wrote`]).
    written: Mutex<HashMap<String, Written>>,
    /// When this manager created the runner's pod, by runner uid, until the pod cache shows one (see
    /// [`RunnerMemory::created_pod`]).
    pods_created: Mutex<HashMap<String, Instant>>,
    /// Registrations whose pod this manager failed to create (an error, not a refusal), by runner uid: the
    /// registration's id and the error, until a pod is created or the cache shows one (see
    /// [`RunnerMemory::pod_not_created`]).
    pods_not_created: Mutex<HashMap<String, NotCreated>>,
    /// Job metadata this manager applied to a pod, by runner uid: the pod's uid and a digest of the metadata,
    /// until the pod cache shows it (see [`RunnerMemory::applied_job_metadata`]).
    job_metadata_applied: Mutex<HashMap<String, (String, u64)>>,
    /// The registration each pod this manager created runs under, by runner uid: the pod's uid and the runner id
    /// and name, until the status records an identity (see [`RunnerMemory::pod_runs_under`]).
    pod_identities: Mutex<HashMap<String, (String, i64, String)>>,
    /// What was done for a runner that cannot need doing again, by runner uid. Kept past the runner's deletion
    /// event (a pass that began just before it may still run once more on the cached copy), for the last
    /// [`ENDINGS_KEPT`] runners: forgetting one only repeats a call whose answer is "already done".
    endings: Mutex<Endings>,
    /// When the watch first showed runner `uid`'s end (its pod succeeded, or its deletion), until its teardown
    /// pass starts: the `waited` stage of the teardown metric (see [`RunnerMemory::teardown_due`]).
    teardown_due: Mutex<HashMap<String, Instant>>,
}

/// The copy a runner's last status write returned, while the cache has not caught up with it, and what the last
/// watch event showed of the status fields this controller writes.
#[derive(Debug, Default)]
struct Written {
    /// [`owned_status_digest`] of the last event (kept for every runner, so a digest and not the fields).
    seen: Option<u64>,
    copy: Option<Arc<EphemeralRunner>>,
}

/// A pod creation that failed with an error (see [`RunnerMemory::pod_not_created`]).
#[derive(Debug, Clone)]
struct NotCreated {
    runner_id: i64,
    error: String,
    reported: bool,
}

/// A digest of the status fields only the EphemeralRunner controller writes (phase, ready, reason, message,
/// identity, failures; the listener writes the job fields, nobody else writes status): an event whose digest is
/// the one a write left holds that write, or something after it.
fn owned_status_digest(runner: &EphemeralRunner) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let none = crds::EphemeralRunnerStatus::default();
    let status = runner.status.as_ref().unwrap_or(&none);
    (&status.phase, status.ready, &status.reason, &status.message).hash(&mut hasher);
    (status.runner_id, &status.runner_name).hash(&mut hasher);
    for (uid, at) in &status.failures {
        (uid, at.0).hash(&mut hasher);
    }
    hasher.finish()
}

/// Whether `event` is of an earlier version of the object than `copy`, by their resource versions: the API server
/// gives each write a larger one (etcd's revision). `None` when either cannot be read as a number: then the event
/// is taken as caught up, which costs at most a repeated read, where a copy kept too long costs refused writes.
fn is_older(event: &EphemeralRunner, copy: &EphemeralRunner) -> Option<bool> {
    let version = |runner: &EphemeralRunner| {
        runner
            .metadata
            .resource_version
            .as_deref()
            .and_then(|version| version.parse::<u64>().ok())
    };
    Some(version(event)? < version(copy)?)
}

/// What was done for a runner that cannot need doing again.
#[derive(Debug, Default)]
struct Ending {
    /// Registrations removed from the service: the set controller's scale-down removes one before it deletes the
    /// runner, whose finalizer then need not ask the service again.
    deregistered: HashSet<i64>,
    /// The API server accepted the removal of the runner's finalizers while it was being deleted: the object is
    /// gone, and a pass on a cached copy that still shows them has nothing to delete or patch.
    finalized: bool,
    /// The teardown lane took the runner's end in hand (it is being deleted, or its pod succeeded): its pod and
    /// Secret go with it, and the main lane, whose cache may show the pod gone before the runner's deletion, must
    /// not take that for a pod lost under a job.
    tearing_down: bool,
}

/// Endings by runner uid, and the uids in the order they came (the oldest go first).
#[derive(Debug, Default)]
struct Endings {
    by_uid: HashMap<String, Ending>,
    order: VecDeque<String>,
}

impl Endings {
    fn entry(&mut self, uid: &str) -> &mut Ending {
        if !self.by_uid.contains_key(uid) {
            self.order.push_back(uid.to_owned());
            if self.order.len() > ENDINGS_KEPT
                && let Some(oldest) = self.order.pop_front()
            {
                self.by_uid.remove(&oldest);
            }
        }
        self.by_uid.entry(uid.to_owned()).or_default()
    }
}

/// How many runners' endings [`RunnerMemory`] keeps (a few hundred KiB at most).
const ENDINGS_KEPT: usize = 4096;

impl RunnerMemory {
    /// Records a disruption of runner `uid`; returns how many it had.
    pub fn disrupted(&self, uid: &str) -> u32 {
        let mut disruptions = lock(&self.disruptions);
        let entry = disruptions
            .entry(uid.to_owned())
            .or_insert((0, Instant::now()));
        entry.0 = entry.0.saturating_add(1);
        entry.1 = Instant::now();
        entry.0
    }

    /// Disruption count and time of the last one.
    pub fn last_disruption(&self, uid: &str) -> Option<(u32, Instant)> {
        lock(&self.disruptions).get(uid).copied()
    }

    /// Whether the registration of `uid` is due for a check every `interval`; marks it checked when it is. The
    /// first call only starts the clock: a runner that just came up has just registered.
    pub fn registration_check_due(&self, uid: &str, interval: Duration) -> bool {
        if interval.is_zero() {
            return false;
        }
        let mut checked = lock(&self.checked);
        match checked.get(uid) {
            Some(last) if last.elapsed() >= interval => {
                checked.insert(uid.to_owned(), Instant::now());
                true
            }
            Some(_) => false,
            None => {
                checked.insert(uid.to_owned(), Instant::now());
                false
            }
        }
    }

    /// Records that registration `runner_id` of runner `uid` was removed from the service.
    pub fn deregistered(&self, uid: &str, runner_id: i64) {
        lock(&self.endings)
            .entry(uid)
            .deregistered
            .insert(runner_id);
    }

    /// Whether registration `runner_id` of runner `uid` was removed (by either controller).
    pub fn was_deregistered(&self, uid: &str, runner_id: i64) -> bool {
        lock(&self.endings)
            .by_uid
            .get(uid)
            .is_some_and(|ending| ending.deregistered.contains(&runner_id))
    }

    /// Records that the teardown lane took the end of runner `uid` in hand.
    pub fn tearing_down(&self, uid: &str) {
        lock(&self.endings).entry(uid).tearing_down = true;
    }

    /// Whether the teardown lane took the end of runner `uid` in hand (see [`RunnerMemory::tearing_down`]).
    pub fn is_tearing_down(&self, uid: &str) -> bool {
        lock(&self.endings)
            .by_uid
            .get(uid)
            .is_some_and(|ending| ending.tearing_down || ending.finalized)
    }

    /// Records that the API server accepted the removal of the finalizers of runner `uid`, which was being
    /// deleted: it is gone.
    pub fn finalized(&self, uid: &str) {
        lock(&self.endings).entry(uid).finalized = true;
    }

    /// Whether runner `uid` was finalized (see [`RunnerMemory::finalized`]).
    pub fn was_finalized(&self, uid: &str) -> bool {
        lock(&self.endings)
            .by_uid
            .get(uid)
            .is_some_and(|ending| ending.finalized)
    }

    /// The watch brought an event for `runner` (the store holds it now): a copy kept from a status write goes
    /// once the event shows the status fields as that write left them, or once the event is of the write's
    /// version or a later one (the cache holds the write, or something after it). Only an event of an earlier
    /// version that shows the fields otherwise leaves the copy: it came from before the write. Without the
    /// version check, a copy whose fields another writer changed since (the listener records an identity with
    /// its job) outlived every event after a re-list, and each precondition write from it was refused.
    pub fn seen(&self, runner: &EphemeralRunner) {
        let Some(uid) = runner.uid() else {
            return;
        };
        let owned = owned_status_digest(runner);
        let mut written = lock(&self.written);
        let entry = written.entry(uid).or_default();
        entry.copy = entry.copy.take().filter(|copy| {
            owned_status_digest(copy) != owned && is_older(runner, copy) == Some(true)
        });
        entry.seen = Some(owned);
    }

    /// Keeps `copy`, what a status write of runner `uid` returned, unless the last watch event already showed
    /// the status fields as the write left them. An event that came while the write was in flight may be an
    /// older version of the runner (one from before the write), and a pass the runner's pod starts a moment
    /// later would run on it: with the identity not yet there it read the Secret and wrote the identity again
    /// (up to 190 times per 500 runners in a burst, docs/benchmarks.md). The next event that shows the write
    /// drops the copy.
    pub fn wrote(&self, uid: &str, copy: EphemeralRunner) {
        // The name may belong to a new runner by now.
        if copy.uid().as_deref() != Some(uid) {
            return;
        }
        let owned = owned_status_digest(&copy);
        let mut written = lock(&self.written);
        let entry = written.entry(uid.to_owned()).or_default();
        if entry.seen != Some(owned) {
            entry.copy = Some(Arc::new(copy));
        }
    }

    /// The copy of runner `uid` its last status write returned, while it is newer than the cache's.
    pub fn fresher(&self, uid: &str) -> Option<Arc<EphemeralRunner>> {
        lock(&self.written)
            .get(uid)
            .and_then(|entry| entry.copy.clone())
    }

    /// Records that this manager created a pod for runner `uid` (the API server answered 201).
    pub fn created_pod(&self, uid: &str) {
        lock(&self.pods_created).insert(uid.to_owned(), Instant::now());
        lock(&self.pods_not_created).remove(uid);
    }

    /// Records that pod `pod_uid` of runner `uid` runs under registration `runner_id`, named `runner_name`. The
    /// status records the identity only with the first state worth showing (the pod running, or waiting on
    /// something), so until then a pass of this process takes it from here instead of reading the Secret; a pass
    /// after a restart reads the Secret. Tied to the pod: a new pod means a new registration.
    pub fn pod_runs_under(&self, uid: &str, pod_uid: &str, runner_id: i64, runner_name: &str) {
        lock(&self.pod_identities).insert(
            uid.to_owned(),
            (pod_uid.to_owned(), runner_id, runner_name.to_owned()),
        );
    }

    /// The registration pod `pod_uid` of runner `uid` runs under, if this process created that pod and the status
    /// has not recorded an identity since (see [`RunnerMemory::pod_runs_under`]).
    pub fn identity_of_pod(&self, uid: &str, pod_uid: &str) -> Option<(i64, String)> {
        lock(&self.pod_identities)
            .get(uid)
            .filter(|(pod, _, _)| pod == pod_uid)
            .map(|(_, runner_id, runner_name)| (*runner_id, runner_name.clone()))
    }

    /// The registration the latest pod this process created for runner `uid` ran under, once that pod is gone: the
    /// JIT config of that registration may have been used, so whoever discards it must know it, even when the pod
    /// vanished before a pass saw it leave (its identity never reached the status). Forgotten when discarded
    /// ([`RunnerMemory::forget_pod_identity`]).
    pub fn identity_of_gone_pod(&self, uid: &str) -> Option<(i64, String)> {
        lock(&self.pod_identities)
            .get(uid)
            .map(|(_, runner_id, runner_name)| (*runner_id, runner_name.clone()))
    }

    /// Whether this process created a pod for runner `uid` whose identity the status does not show yet.
    pub fn knows_pod_identity(&self, uid: &str) -> bool {
        lock(&self.pod_identities).contains_key(uid)
    }

    /// The identity kept for runner `uid`'s pod is no longer needed: the status records an identity, or the
    /// registration was discarded with its pod gone.
    pub fn forget_pod_identity(&self, uid: &str) {
        lock(&self.pod_identities).remove(uid);
    }

    /// Records that creating the pod of registration `runner_id` of runner `uid` failed with `error`, which was
    /// not a refusal (the API server or the network failed the request). The registration is still discarded
    /// as one whose pod is gone (a request that failed may still have made the pod), but the report can say what
    /// happened, and the next attempt tries the pod in dry-run mode before registering again.
    pub fn pod_not_created(&self, uid: &str, runner_id: i64, error: String) {
        lock(&self.pods_not_created).insert(
            uid.to_owned(),
            NotCreated {
                runner_id,
                error,
                reported: false,
            },
        );
    }

    /// The error that kept registration `runner_id` of runner `uid` from its pod, once: the first call reports it.
    pub fn report_not_created(&self, uid: &str, runner_id: i64) -> Option<String> {
        lock(&self.pods_not_created)
            .get_mut(uid)
            .filter(|failed| failed.runner_id == runner_id && !failed.reported)
            .map(|failed| {
                failed.reported = true;
                failed.error.clone()
            })
    }

    /// Records that the API server accepted job metadata (digest `digest`) on pod `pod_uid` of runner `uid`.
    pub fn applied_job_metadata(&self, uid: &str, pod_uid: &str, digest: u64) {
        lock(&self.job_metadata_applied).insert(uid.to_owned(), (pod_uid.to_owned(), digest));
    }

    /// Whether job metadata `digest` must go onto pod `pod_uid` of runner `uid`, whose cached copy shows it
    /// (`on_in_cache`) or not. An expectation cleared by the watch: once this manager's apply was accepted, a pass
    /// on a pod cache that has not caught up yet does not apply it again (0.2–0.45 applies per job in a 500-job
    /// burst); the cache showing it clears the record.
    pub fn job_metadata_due(
        &self,
        uid: &str,
        pod_uid: &str,
        digest: u64,
        on_in_cache: bool,
    ) -> bool {
        let mut applied = lock(&self.job_metadata_applied);
        if on_in_cache {
            applied.remove(uid);
            return false;
        }
        applied
            .get(uid)
            .is_none_or(|(pod, done)| pod != pod_uid || *done != digest)
    }

    /// Whether the last pod creation for runner `uid` failed (no pod was created since).
    pub fn pod_creation_failed(&self, uid: &str) -> bool {
        lock(&self.pods_not_created).contains_key(uid)
    }

    /// How long a pass that finds no pod in the cache should wait for the watch to bring the one this manager
    /// created for runner `uid`, if it created one less than `expect_for` ago; `pod_cached` clears the record.
    /// An expectation cleared by the watch: a pass the runner's own events start before the pod's (a later
    /// attempt records the identity before its pod, and that write's event comes first) would otherwise read the
    /// Secret and the pod from the API server to learn what this process already knows (1.2 reads per job in a
    /// 500-job burst when every attempt did). The clock only bounds the wait: past it, the pass reads as before.
    pub fn awaiting_pod(
        &self,
        uid: &str,
        pod_cached: bool,
        expect_for: Duration,
    ) -> Option<Duration> {
        let mut created = lock(&self.pods_created);
        if pod_cached {
            created.remove(uid);
            // A request that failed had made the pod after all: nothing failed to report.
            lock(&self.pods_not_created).remove(uid);
            return None;
        }
        let left = created
            .get(uid)
            .and_then(|at| expect_for.checked_sub(at.elapsed()))
            .filter(|left| !left.is_zero());
        if left.is_none() {
            created.remove(uid);
        }
        left
    }

    /// Notes, the first time only, that the watch shows the end of runner `uid` (its pod succeeded, or the
    /// runner is being deleted): its teardown is due.
    pub fn teardown_due(&self, uid: &str) {
        lock(&self.teardown_due)
            .entry(uid.to_owned())
            .or_insert_with(Instant::now);
    }

    /// How long runner `uid`'s teardown waited since it was due, once: the first teardown pass asks.
    pub fn teardown_started(&self, uid: &str) -> Option<Duration> {
        lock(&self.teardown_due)
            .remove(uid)
            .map(|due| due.elapsed())
    }

    /// Forgets runner `uid` (deleted), but for its endings (see [`RunnerMemory::deregistered`]).
    pub fn forget(&self, uid: &str) {
        lock(&self.teardown_due).remove(uid);
        lock(&self.pods_created).remove(uid);
        lock(&self.pods_not_created).remove(uid);
        lock(&self.job_metadata_applied).remove(uid);
        lock(&self.pod_identities).remove(uid);
        lock(&self.disruptions).remove(uid);
        lock(&self.checked).remove(uid);
        lock(&self.written).remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_teardown_waits_from_when_it_first_became_due_and_is_reported_once() {
        let memory = RunnerMemory::default();
        assert_eq!(memory.teardown_started("a"), None, "never due");
        memory.teardown_due("a");
        std::thread::sleep(Duration::from_millis(20));
        memory.teardown_due("a");
        let waited = memory.teardown_started("a").expect("due");
        assert!(
            waited >= Duration::from_millis(20),
            "from the first: {waited:?}"
        );
        assert_eq!(memory.teardown_started("a"), None, "reported once");
        memory.teardown_due("b");
        memory.forget("b");
        assert_eq!(
            memory.teardown_started("b"),
            None,
            "forgotten with the runner"
        );
    }

    #[test]
    fn a_pod_that_was_not_created_is_reported_once_for_its_registration_until_a_pod_is() {
        let memory = RunnerMemory::default();
        memory.pod_not_created("a", 7, "boom".to_owned());
        assert!(memory.pod_creation_failed("a"));
        assert_eq!(
            memory.report_not_created("a", 8),
            None,
            "another registration"
        );
        assert_eq!(memory.report_not_created("a", 7).as_deref(), Some("boom"));
        assert_eq!(memory.report_not_created("a", 7), None, "reported once");
        assert!(
            memory.pod_creation_failed("a"),
            "dry runs until a pod is made"
        );
        memory.created_pod("a");
        assert!(!memory.pod_creation_failed("a"));
        memory.pod_not_created("a", 9, "timed out".to_owned());
        memory.awaiting_pod("a", true, Duration::from_secs(10));
        assert!(
            !memory.pod_creation_failed("a"),
            "the cache shows a pod: the failed request made it after all"
        );
    }

    #[test]
    fn job_metadata_accepted_is_not_applied_again_until_the_cache_shows_it_or_it_changes() {
        let memory = RunnerMemory::default();
        assert!(
            memory.job_metadata_due("r", "p1", 1, false),
            "never applied"
        );
        memory.applied_job_metadata("r", "p1", 1);
        assert!(
            !memory.job_metadata_due("r", "p1", 1, false),
            "the cache lags"
        );
        assert!(
            memory.job_metadata_due("r", "p1", 2, false),
            "other metadata"
        );
        assert!(memory.job_metadata_due("r", "p2", 1, false), "another pod");
        assert!(
            !memory.job_metadata_due("r", "p1", 1, true),
            "the cache shows it"
        );
        assert!(
            memory.job_metadata_due("r", "p1", 1, false),
            "once the cache showed it, a pod without it (labels removed since) gets it again"
        );
    }

    #[test]
    fn a_pods_identity_is_kept_for_that_pod_until_the_status_records_one() {
        let memory = RunnerMemory::default();
        assert!(!memory.knows_pod_identity("a"));
        memory.pod_runs_under("a", "pod-1", 7, "runner-a");
        assert!(memory.knows_pod_identity("a"));
        assert_eq!(
            memory.identity_of_pod("a", "pod-1"),
            Some((7, "runner-a".to_owned()))
        );
        assert_eq!(
            memory.identity_of_pod("a", "pod-2"),
            None,
            "another pod: another registration, or one this process did not make"
        );
        memory.pod_runs_under("a", "pod-2", 8, "runner-a");
        assert_eq!(memory.identity_of_pod("a", "pod-1"), None);
        assert_eq!(
            memory.identity_of_pod("a", "pod-2"),
            Some((8, "runner-a".to_owned()))
        );
        assert_eq!(
            memory.identity_of_gone_pod("a"),
            Some((8, "runner-a".to_owned())),
            "the pod gone before the status recorded its registration: it must still be discarded"
        );
        memory.forget_pod_identity("a");
        assert_eq!(memory.identity_of_pod("a", "pod-2"), None);
        assert_eq!(memory.identity_of_gone_pod("a"), None);
        memory.pod_runs_under("b", "pod-3", 9, "runner-b");
        memory.forget("b");
        assert!(!memory.knows_pod_identity("b"));
    }

    #[test]
    fn a_created_pod_is_awaited_until_the_cache_shows_it_or_the_wait_is_over() {
        let memory = RunnerMemory::default();
        let long = Duration::from_secs(10);
        assert_eq!(
            memory.awaiting_pod("a", false, long),
            None,
            "nothing created"
        );
        memory.created_pod("a");
        assert!(
            memory
                .awaiting_pod("a", false, long)
                .is_some_and(|left| left <= long)
        );
        // The cache shows it: the record goes.
        assert_eq!(memory.awaiting_pod("a", true, long), None);
        assert_eq!(memory.awaiting_pod("a", false, long), None);
        // Never shown: past the wait the pass reads as before.
        memory.created_pod("b");
        assert_eq!(memory.awaiting_pod("b", false, Duration::ZERO), None);
        assert_eq!(
            memory.awaiting_pod("b", false, long),
            None,
            "the record went"
        );
        memory.created_pod("c");
        memory.forget("c");
        assert_eq!(memory.awaiting_pod("c", false, long), None);
    }

    #[test]
    fn event_notes_fit_the_api_servers_limit() {
        assert_eq!(truncate_note("short".to_owned()), "short");
        let long = "é".repeat(700); // 1400 bytes, two per character
        let cut = truncate_note(long);
        assert!(cut.len() <= 1024, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert!(cut.starts_with("éé"));
    }

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let backoff = ErrorBackoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let delays: Vec<_> = (0..4).map(|_| backoff.next_delay("a")).collect();
        assert_eq!(
            delays,
            [100, 200, 350, 350].map(Duration::from_millis).to_vec()
        );
        assert_eq!(backoff.next_delay("b"), Duration::from_millis(100));
        backoff.reset("a");
        assert_eq!(backoff.next_delay("a"), Duration::from_millis(100));
    }

    #[test]
    fn expectations_wait_for_the_cache() {
        let expectations = Expectations::default();
        assert!(expectations.satisfied("set", |_| false, |_| false));
        expectations.created("set", ["r1".to_owned(), "r2".to_owned()]);
        expectations.deleted("set", ["old".to_owned()]);
        // r1 seen, r2 not yet, old still alive.
        let cached = |name: &str| name == "r1" || name == "old";
        assert!(!expectations.satisfied("set", cached, cached));
        // r2 seen; old is still cached but being deleted, which is enough.
        assert!(expectations.satisfied("set", |name| name == "r2" || name == "old", |_| false));
        assert!(expectations.satisfied("set", |_| false, |_| false));
    }

    #[test]
    fn expectations_say_how_long_they_are_still_waited_for() {
        let expectations = Expectations::default();
        assert_eq!(expectations.left("set"), None);
        expectations.created("set", ["r1".to_owned()]);
        let left = expectations.left("set").expect("waiting for r1");
        assert!(left <= EXPECTATION_TIMEOUT && left > EXPECTATION_TIMEOUT / 2);
        assert!(expectations.satisfied("set", |_| true, |_| true));
        assert_eq!(expectations.left("set"), None);
    }

    #[test]
    fn a_runner_deleted_before_the_cache_saw_it_settles_its_expectation() {
        let expectations = Expectations::default();
        expectations.created("set", ["r1".to_owned()]);
        assert!(!expectations.satisfied("set", |_| false, |_| false));
        expectations.gone("set", "r1");
        assert!(expectations.satisfied("set", |_| false, |_| false));
    }

    #[test]
    fn a_runner_gone_before_its_creation_is_recorded_is_not_waited_for() {
        let expectations = Expectations::default();
        // The first runner of a batch ran its job and was deleted before the batch's last creation returned.
        expectations.creating("set");
        expectations.gone("set", "r1");
        expectations.created("set", ["r1".to_owned(), "r2".to_owned()]);
        assert!(
            !expectations.satisfied("set", |_| false, |_| false),
            "r2 not seen yet"
        );
        assert!(expectations.satisfied("set", |name| name == "r2", |_| false));
        // Nothing left: not even the tombstone, which went with the settled expectations.
        assert_eq!(expectations.left("set"), None);
        assert!(lock(&expectations.sets).is_empty());
    }

    #[test]
    fn deletions_outside_a_batch_of_creations_are_not_remembered() {
        let expectations = Expectations::default();
        expectations.gone("set", "made-by-someone-else");
        assert!(lock(&expectations.sets).is_empty());
        // During a batch they are, until the set's expectations are next settled.
        expectations.creating("set");
        expectations.gone("set", "made-by-someone-else");
        assert_eq!(expectations.left("set"), None, "nothing is waited for");
        assert!(expectations.satisfied("set", |_| false, |_| false));
        assert!(lock(&expectations.sets).is_empty());
    }

    #[test]
    fn registration_checks_are_spaced() {
        let memory = RunnerMemory::default();
        assert!(!memory.registration_check_due("u", Duration::from_millis(30)));
        assert!(!memory.registration_check_due("u", Duration::from_millis(30)));
        std::thread::sleep(Duration::from_millis(40));
        assert!(memory.registration_check_due("u", Duration::from_millis(30)));
        assert!(!memory.registration_check_due("u", Duration::from_millis(30)));
        assert!(!memory.registration_check_due("v", Duration::ZERO));
        assert_eq!(memory.disrupted("u"), 1);
        assert_eq!(memory.disrupted("u"), 2);
        memory.forget("u");
        assert!(memory.last_disruption("u").is_none());
    }

    #[test]
    fn deregistrations_are_remembered_per_registration_for_the_last_runners() {
        let memory = RunnerMemory::default();
        assert!(!memory.was_deregistered("u", 7));
        memory.deregistered("u", 7);
        assert!(memory.was_deregistered("u", 7));
        // A new pod of the same runner registers anew: that registration is not covered.
        assert!(!memory.was_deregistered("u", 8));
        assert!(!memory.was_deregistered("v", 7));
        // A pass that began before the deletion event may still finalize: the removal is kept.
        memory.forget("u");
        assert!(memory.was_deregistered("u", 7));
        // Bounded: the oldest runners go first.
        for i in 0..ENDINGS_KEPT {
            memory.deregistered(&format!("r{i}"), 1);
        }
        assert!(!memory.was_deregistered("u", 7));
        assert!(memory.was_deregistered("r1", 1));
    }

    #[test]
    fn a_runner_in_teardown_stays_the_teardown_lanes() {
        let memory = RunnerMemory::default();
        assert!(!memory.is_tearing_down("u"));
        memory.tearing_down("u");
        assert!(memory.is_tearing_down("u"));
        assert!(!memory.is_tearing_down("v"));
        memory.finalized("v");
        assert!(
            memory.is_tearing_down("v"),
            "a finalized runner is past its teardown"
        );
        // Kept past the deletion event, as every ending is.
        memory.forget("u");
        assert!(memory.is_tearing_down("u"));
    }

    /// A runner `uid` at resource version `version` whose status records registration `runner_id` (phase Pending
    /// with one, none without).
    fn versioned_runner(uid: &str, version: &str, runner_id: i64) -> EphemeralRunner {
        let mut runner = EphemeralRunner::new(
            "r",
            serde_json::from_value(serde_json::json!({
                "githubConfigUrl": "u", "githubConfigSecret": "s", "runnerScaleSetId": 1,
                "metadata": {}, "spec": { "containers": [] },
            }))
            .unwrap(),
        );
        runner.metadata.uid = Some(uid.to_owned());
        runner.metadata.resource_version = Some(version.to_owned());
        runner.status = Some(crds::EphemeralRunnerStatus {
            runner_id,
            phase: if runner_id == 0 { "" } else { "Pending" }.to_owned(),
            ..crds::EphemeralRunnerStatus::default()
        });
        runner
    }

    #[test]
    fn a_written_copy_serves_until_an_event_shows_the_write() {
        let memory = RunnerMemory::default();
        // The write's version is later than the one before it.
        let runner = |uid: &str, runner_id: i64| {
            versioned_runner(uid, if runner_id == 0 { "1" } else { "5" }, runner_id)
        };
        let (before, written) = (|| runner("u", 0), || runner("u", 7));
        // A copy of another runner of the same name is not this one's.
        memory.wrote("u", runner("w", 7));
        assert!(memory.fresher("u").is_none());
        memory.seen(&before());
        memory.wrote("u", written());
        assert!(memory.fresher("u").is_some());
        assert!(memory.fresher("v").is_none());
        // An event from before the write, late: the copy is still newer.
        memory.seen(&before());
        assert!(memory.fresher("u").is_some());
        // The write's own event, or one after it (the listener's job fields leave these fields alone).
        let mut later = written();
        later.status.as_mut().unwrap().job_request_id = 3;
        later.metadata.resource_version = Some("6".to_owned());
        memory.seen(&later);
        assert!(memory.fresher("u").is_none());
        // The write's event came before its response: the cache holds it already.
        memory.wrote("u", written());
        assert!(memory.fresher("u").is_none());
        // An older event came while the next write was in flight: the copy is kept.
        memory.seen(&before());
        memory.wrote("u", written());
        assert!(memory.fresher("u").is_some());
        memory.forget("u");
        assert!(memory.fresher("u").is_none());
    }

    #[test]
    fn a_written_copy_goes_with_any_event_of_its_version_or_later() {
        let memory = RunnerMemory::default();
        let runner = |version: &str, runner_id: i64| versioned_runner("u", version, runner_id);
        memory.seen(&runner("9", 0));
        memory.wrote("u", runner("10", 7));
        // An earlier version, shown otherwise: from before the write.
        memory.seen(&runner("8", 0));
        assert!(memory.fresher("u").is_some());
        // A later version whose fields another writer changed since (say, after a re-list): the write is in the
        // cache, overtaken; the copy must not outlive it.
        memory.seen(&runner("12", 8));
        assert!(memory.fresher("u").is_none());
        // Versions that are not numbers: the event is taken as caught up.
        memory.wrote("u", runner("x", 7));
        memory.seen(&runner("y", 0));
        assert!(memory.fresher("u").is_none());
    }

    #[test]
    fn finalized_runners_are_remembered_with_their_removals() {
        let memory = RunnerMemory::default();
        assert!(!memory.was_finalized("u"));
        memory.deregistered("u", 7);
        assert!(!memory.was_finalized("u"));
        memory.finalized("u");
        memory.forget("u");
        assert!(memory.was_finalized("u") && memory.was_deregistered("u", 7));
        assert!(!memory.was_finalized("v"));
        for i in 0..ENDINGS_KEPT {
            memory.finalized(&format!("r{i}"));
        }
        assert!(!memory.was_finalized("u") && !memory.was_deregistered("u", 7));
    }
}
