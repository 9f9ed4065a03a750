//! What this process remembers of each runner between passes: one record per runner uid, under one lock, owned by
//! the runner controller. The set controller reaches it only through [`super::facts`] (the registration of a pod
//! whose identity the status does not show yet, and registrations already removed).
//!
//! Nothing here is a guess about how stale a cache is: each entry is either an expectation the watch clears (a
//! status write, a pod created, job metadata applied), a record of something done that cannot need doing again
//! (a registration removed, finalizers removed), or a backoff. Losing all of it on a restart only resets a
//! backoff, starts a check early, or repeats a removal the API server and the service answer as done.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crds::EphemeralRunner;
use kube::{Resource, ResourceExt};

use crate::context::lock;
use crate::pods::CachedPod;

/// How many runners' endings [`RunnerMemory`] keeps past their deletion (a few hundred KiB at most).
const ENDINGS_KEPT: usize = 4096;

/// Per-runner memory of the runner controller (see the module's documentation). Records of live runners go when
/// the runner's deletion reaches the watch ([`RunnerMemory::forget`]), whoever finalized it; endings stay for the
/// last [`ENDINGS_KEPT`] runners.
#[derive(Debug, Default)]
pub struct RunnerMemory {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Live runners, by uid.
    records: HashMap<String, Record>,
    /// What was done for a runner that cannot need doing again, by uid. Kept past the runner's deletion event (a
    /// pass that began just before it may still run once more on the cached copy): forgetting one only repeats a
    /// call whose answer is "already done".
    endings: Endings,
}

/// What this process remembers of one live runner.
#[derive(Debug, Default)]
struct Record {
    /// Disruptions (not counted as failures, but backed off) and the time of the last.
    disruptions: Option<(u32, Instant)>,
    /// When the registration was last checked with the service.
    checked: Option<Instant>,
    /// When the service first said it no longer knows the runner while its pod ran idle, until it says otherwise
    /// or the runner goes (see [`RunnerMemory::suspect_zombie`]).
    zombie_suspected: Option<Instant>,
    /// The runner as this manager's last status write left it, until the watch brings an event that shows the
    /// write (see [`RunnerMemory::wrote`]).
    written: Written,
    /// When this manager created the runner's pod, until the pod cache shows one (see
    /// [`RunnerMemory::created_pod`]).
    pod_created: Option<Instant>,
    /// A registration whose pod this manager failed to create (an error, not a refusal), until a pod is created or
    /// the cache shows one (see [`RunnerMemory::pod_not_created`]).
    pod_not_created: Option<NotCreated>,
    /// Job metadata this manager applied to a pod: the pod's uid and a digest of the metadata, until the pod cache
    /// shows it (see [`RunnerMemory::applied_job_metadata`]).
    job_metadata_applied: Option<(String, u64)>,
    /// The registration the pod this manager created runs under: the pod's uid and the runner id and name, until
    /// the status records an identity (see [`RunnerMemory::pod_runs_under`]).
    pod_identity: Option<(String, i64, String)>,
    /// When the watch first showed the runner's end (its pod succeeded, or its deletion), until its teardown pass
    /// starts: the `waited` stage of the teardown metric (see [`RunnerMemory::teardown_due`]).
    teardown_due: Option<Instant>,
    /// The registration whose JIT config this process last stored in the runner's Secret (see
    /// [`RunnerMemory::stored_config`]).
    stored_config: Option<i64>,
    /// How the cluster was last seen ending the runner's pod, for the pass that finds the pod gone (see
    /// [`RunnerMemory::observe_pod`]).
    pod_interrupted: Option<super::rerun::Interruption>,
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

/// What was done for a runner that cannot need doing again.
#[derive(Debug, Default)]
struct Ending {
    /// Registrations removed from the service: the set controller's scale-down removes one before it deletes the
    /// runner, whose finalizer then need not ask the service again; the main lane one whose config it discards.
    /// Each was removed while the runner held no job (the service's consent).
    deregistered: HashSet<i64>,
    /// The API server accepted the removal of the runner's finalizers while it was being deleted, or together
    /// with its deletion: the object is gone, and a pass on a cached copy that still shows them has nothing to
    /// delete or patch.
    finalized: bool,
    /// The teardown lane took the runner's end in hand (it is being deleted, or its pod succeeded): its pod and
    /// Secret go with it, and the main lane, whose cache may show the pod gone before the runner's deletion, must
    /// not take that for a pod lost under a job.
    tearing_down: bool,
}

impl Ending {
    /// The teardown lane took the runner's end in hand, or finalized it: nothing of the main lane's is left.
    fn past_main_lane(&self) -> bool {
        self.tearing_down || self.finalized
    }
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

    fn get(&self, uid: &str) -> Option<&Ending> {
        self.by_uid.get(uid)
    }
}

/// What a pass needs of a runner's memory to state its facts, read at once under the one lock
/// ([`RunnerMemory::snapshot`]), so that the facts never mix two moments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// How many disruptions the runner had (none: never disrupted), and when the last was.
    pub last_disruption: Option<(u32, Instant)>,
    /// This process created a pod whose identity the status does not show yet.
    pub knows_pod_identity: bool,
    /// The last pod creation failed with an error, and no pod was created since.
    pub pod_creation_failed: bool,
    /// The teardown lane took the runner's end in hand, or finalized it.
    pub tearing_down: bool,
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

impl RunnerMemory {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Runs `f` on the record of runner `uid`, made empty when there is none.
    fn record<T>(&self, uid: &str, f: impl FnOnce(&mut Record) -> T) -> T {
        f(self.inner().records.entry(uid.to_owned()).or_default())
    }

    /// Reads the record of runner `uid`, if there is one.
    fn read<T>(&self, uid: &str, f: impl FnOnce(&Record) -> Option<T>) -> Option<T> {
        self.inner().records.get(uid).and_then(f)
    }

    /// What a pass of runner `uid` needs to state its facts, read at one moment.
    pub fn snapshot(&self, uid: &str) -> Snapshot {
        let inner = self.inner();
        let record = inner.records.get(uid);
        let ending = inner.endings.get(uid);
        Snapshot {
            last_disruption: record.and_then(|record| record.disruptions),
            knows_pod_identity: record.is_some_and(|record| record.pod_identity.is_some()),
            pod_creation_failed: record.is_some_and(|record| record.pod_not_created.is_some()),
            tearing_down: ending.is_some_and(Ending::past_main_lane),
        }
    }

    /// Records a disruption of runner `uid`; returns how many it had.
    pub fn disrupted(&self, uid: &str) -> u32 {
        self.record(uid, |record| {
            let count = record.disruptions.map_or(0, |(count, _)| count);
            let count = count.saturating_add(1);
            record.disruptions = Some((count, Instant::now()));
            count
        })
    }

    /// Disruption count and time of the last one.
    pub fn last_disruption(&self, uid: &str) -> Option<(u32, Instant)> {
        self.read(uid, |record| record.disruptions)
    }

    /// Whether the registration of `uid` is due for a check every `interval`; marks it checked when it is. The
    /// first call only starts the clock: a runner that just came up has just registered.
    pub fn registration_check_due(&self, uid: &str, interval: Duration) -> bool {
        if interval.is_zero() {
            return false;
        }
        self.record(uid, |record| match record.checked {
            Some(last) if last.elapsed() < interval => false,
            last => {
                record.checked = Some(Instant::now());
                last.is_some()
            }
        })
    }

    /// Records that the service said it no longer knows runner `uid` while its pod ran idle, unless it said so
    /// before: the runner is taken for a zombie only if the service still says so a while later (a runner whose
    /// job was too short for the listener's report is forgotten by the service as the job ends, and exits).
    pub fn suspect_zombie(&self, uid: &str) {
        self.record(uid, |record| {
            record.zombie_suspected.get_or_insert_with(Instant::now);
        });
    }

    /// How long ago the service first said it no longer knows runner `uid`, while it has not said otherwise since.
    pub fn zombie_suspected_for(&self, uid: &str) -> Option<Duration> {
        self.read(uid, |record| record.zombie_suspected.map(|at| at.elapsed()))
    }

    /// The service knows runner `uid` after all.
    pub fn clear_zombie_suspicion(&self, uid: &str) {
        if let Some(record) = self.inner().records.get_mut(uid) {
            record.zombie_suspected = None;
        }
    }

    /// Records that registration `runner_id` of runner `uid` was removed from the service.
    pub fn deregistered(&self, uid: &str, runner_id: i64) {
        self.inner()
            .endings
            .entry(uid)
            .deregistered
            .insert(runner_id);
    }

    /// Whether registration `runner_id` of runner `uid` was removed (by either controller).
    pub fn was_deregistered(&self, uid: &str, runner_id: i64) -> bool {
        self.inner()
            .endings
            .get(uid)
            .is_some_and(|ending| ending.deregistered.contains(&runner_id))
    }

    /// Records that the teardown lane took the end of runner `uid` in hand.
    pub fn tearing_down(&self, uid: &str) {
        self.inner().endings.entry(uid).tearing_down = true;
    }

    /// Whether the teardown lane took the end of runner `uid` in hand (see [`RunnerMemory::tearing_down`]).
    pub fn is_tearing_down(&self, uid: &str) -> bool {
        // Asked for every runner event by both lanes: the ending alone, not a whole snapshot.
        self.inner()
            .endings
            .get(uid)
            .is_some_and(Ending::past_main_lane)
    }

    /// Records that the API server accepted the removal of the finalizers of runner `uid`, which was being
    /// deleted: it is gone.
    pub fn finalized(&self, uid: &str) {
        self.inner().endings.entry(uid).finalized = true;
    }

    /// Whether runner `uid` was finalized (see [`RunnerMemory::finalized`]).
    pub fn was_finalized(&self, uid: &str) -> bool {
        self.inner()
            .endings
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
        self.record(&uid, |record| {
            let written = &mut record.written;
            written.copy = written.copy.take().filter(|copy| {
                owned_status_digest(copy) != owned && is_older(runner, copy) == Some(true)
            });
            written.seen = Some(owned);
        });
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
        self.record(uid, |record| {
            if record.written.seen != Some(owned) {
                record.written.copy = Some(Arc::new(copy));
            }
        });
    }

    /// The copy of runner `uid` its last status write returned, while it is newer than the cache's.
    pub fn fresher(&self, uid: &str) -> Option<Arc<EphemeralRunner>> {
        self.read(uid, |record| record.written.copy.clone())
    }

    /// Records that this process stored the JIT config of registration `runner_id` in runner `uid`'s Secret (the API
    /// server answered 201). Every Secret of a runner is made by a pass of this controller, so until a restart this
    /// names what the Secret holds, or held before it was deleted: either way a teardown that removes the status's
    /// registration need not read the Secret to learn of another one (see [`RunnerMemory::stored_config_of`]).
    pub fn stored_config(&self, uid: &str, runner_id: i64) {
        self.record(uid, |record| record.stored_config = Some(runner_id));
    }

    /// What runner `uid`'s Secret holds is not known (a Secret is about to be made, whose answer may be lost).
    pub fn forget_stored_config(&self, uid: &str) {
        if let Some(record) = self.inner().records.get_mut(uid) {
            record.stored_config = None;
        }
    }

    /// The registration this process last stored in runner `uid`'s Secret, if it stored one since it started.
    pub fn stored_config_of(&self, uid: &str) -> Option<i64> {
        self.read(uid, |record| record.stored_config)
    }

    /// Records that this manager created a pod for runner `uid` (the API server answered 201).
    pub fn created_pod(&self, uid: &str) {
        self.record(uid, |record| {
            record.pod_created = Some(Instant::now());
            record.pod_not_created = None;
        });
    }

    /// Records that pod `pod_uid` of runner `uid` runs under registration `runner_id`, named `runner_name`. The
    /// status records the identity only with the first state worth showing (the pod running, or waiting on
    /// something), so until then a pass of this process takes it from here instead of reading the Secret; a pass
    /// after a restart reads the Secret. Tied to the pod: a new pod means a new registration.
    pub fn pod_runs_under(&self, uid: &str, pod_uid: &str, runner_id: i64, runner_name: &str) {
        self.record(uid, |record| {
            record.pod_identity = Some((pod_uid.to_owned(), runner_id, runner_name.to_owned()));
        });
    }

    /// The registration pod `pod_uid` of runner `uid` runs under, if this process created that pod and the status
    /// has not recorded an identity since (see [`RunnerMemory::pod_runs_under`]).
    pub fn identity_of_pod(&self, uid: &str, pod_uid: &str) -> Option<(i64, String)> {
        self.read(uid, |record| {
            record
                .pod_identity
                .as_ref()
                .filter(|(pod, _, _)| pod == pod_uid)
                .map(|(_, runner_id, runner_name)| (*runner_id, runner_name.clone()))
        })
    }

    /// The registration the latest pod this process created for runner `uid` ran under, once that pod is gone: the
    /// JIT config of that registration may have been used, so whoever discards it must know it, even when the pod
    /// vanished before a pass saw it leave (its identity never reached the status). Forgotten when discarded
    /// ([`RunnerMemory::forget_pod_identity`]).
    pub fn identity_of_gone_pod(&self, uid: &str) -> Option<(i64, String)> {
        self.read(uid, |record| {
            record
                .pod_identity
                .as_ref()
                .map(|(_, runner_id, runner_name)| (*runner_id, runner_name.clone()))
        })
    }

    /// The identity kept for runner `uid`'s pod is no longer needed: the status records an identity, or the
    /// registration was discarded with its pod gone.
    pub fn forget_pod_identity(&self, uid: &str) {
        if let Some(record) = self.inner().records.get_mut(uid) {
            record.pod_identity = None;
        }
    }

    /// Records that creating the pod of registration `runner_id` of runner `uid` failed with `error`, which was
    /// not a refusal (the API server or the network failed the request). The registration is still discarded
    /// as one whose pod is gone (a request that failed may still have made the pod), but the report can say what
    /// happened, and the next attempt tries the pod in dry-run mode before registering again.
    pub fn pod_not_created(&self, uid: &str, runner_id: i64, error: String) {
        self.record(uid, |record| {
            record.pod_not_created = Some(NotCreated {
                runner_id,
                error,
                reported: false,
            });
        });
    }

    /// The error that kept registration `runner_id` of runner `uid` from its pod, once: the first call reports it.
    pub fn report_not_created(&self, uid: &str, runner_id: i64) -> Option<String> {
        self.inner()
            .records
            .get_mut(uid)
            .and_then(|record| record.pod_not_created.as_mut())
            .filter(|failed| failed.runner_id == runner_id && !failed.reported)
            .map(|failed| {
                failed.reported = true;
                failed.error.clone()
            })
    }

    /// Records that the API server accepted job metadata (digest `digest`) on pod `pod_uid` of runner `uid`.
    pub fn applied_job_metadata(&self, uid: &str, pod_uid: &str, digest: u64) {
        self.record(uid, |record| {
            record.job_metadata_applied = Some((pod_uid.to_owned(), digest));
        });
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
        let mut inner = self.inner();
        let applied = inner
            .records
            .get_mut(uid)
            .map(|record| &mut record.job_metadata_applied);
        if on_in_cache {
            if let Some(applied) = applied {
                *applied = None;
            }
            return false;
        }
        applied
            .and_then(|applied| applied.as_ref())
            .is_none_or(|(pod, done)| pod != pod_uid || *done != digest)
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
        let mut inner = self.inner();
        let record = inner.records.get_mut(uid)?;
        if pod_cached {
            record.pod_created = None;
            // A request that failed had made the pod after all: nothing failed to report.
            record.pod_not_created = None;
            return None;
        }
        let left = record
            .pod_created
            .and_then(|at| expect_for.checked_sub(at.elapsed()))
            .filter(|left| !left.is_zero());
        if left.is_none() {
            record.pod_created = None;
        }
        left
    }

    /// Notes, the first time only, that the watch shows the end of runner `uid` (its pod succeeded, or the
    /// runner is being deleted): its teardown is due.
    pub fn teardown_due(&self, uid: &str) {
        self.record(uid, |record| {
            record.teardown_due.get_or_insert_with(Instant::now);
        });
    }

    /// How long runner `uid`'s teardown waited since it was due, once: the first teardown pass asks.
    pub fn teardown_started(&self, uid: &str) -> Option<Duration> {
        self.inner()
            .records
            .get_mut(uid)
            .and_then(|record| record.teardown_due.take())
            .map(|due| due.elapsed())
    }

    /// The runner watch's hook, on every event of `runner` (the store holds it now): a status write the event
    /// shows is no longer kept ([`RunnerMemory::seen`]), and a runner being deleted has its teardown due.
    pub fn observe_runner(&self, runner: &EphemeralRunner) {
        self.seen(runner);
        if runner.meta().deletion_timestamp.is_some()
            && let Some(uid) = runner.uid()
        {
            self.teardown_due(&uid);
        }
    }

    /// The pod watch's hook, on every event of `pod`: a runner's pod that succeeded has its runner's teardown due
    /// from this event on (the teardown metric's `waited` stage). Returns whether it did. Any other pod has how it
    /// ended remembered ([`RunnerMemory::observe_pod_end`]).
    pub fn observe_pod(&self, pod: &CachedPod) -> bool {
        if super::policy::pod_phase(pod) != crds::constants::phase::SUCCEEDED {
            self.observe_pod_end(pod);
            return false;
        }
        let Some(owner) = pod
            .owner_references()
            .iter()
            .find(|owner| owner.controller == Some(true))
        else {
            return false;
        };
        self.teardown_due(&owner.uid);
        true
    }

    /// Remembers how the cluster ended `pod` when it is being deleted, failed, or marked for a disruption: the pass
    /// that finishes its busy runner may find it gone, or its condition dropped (the Eviction API writes it before
    /// the deletion, a kubelet's later status write may replace it, and an unbound pod's eviction deletes it at once,
    /// so only its deletion event shows it), and an evicted job is then still told from a deleted one. The pod
    /// watch's hook for deletions too.
    pub fn observe_pod_end(&self, pod: &CachedPod) {
        let ending = pod.metadata.deletion_timestamp.is_some()
            || super::policy::pod_phase(pod) == crds::constants::phase::FAILED
            || super::policy::disruption_class(pod).is_some();
        if !ending {
            return;
        }
        let Some(owner) = pod
            .owner_references()
            .iter()
            .find(|owner| owner.controller == Some(true))
        else {
            return;
        };
        // Only a runner still remembered: a pod's last events may come after its runner was forgotten, and a record
        // made then would never go.
        if let Some(interruption) = super::rerun::interruption(Some(pod))
            && let Some(record) = self.inner().records.get_mut(owner.uid.as_str())
        {
            record.pod_interrupted =
                super::rerun::more_telling(Some(interruption), record.pod_interrupted);
        }
    }

    /// How the pod watch last saw the cluster end runner `uid`'s pod, if it did.
    pub fn pod_interrupted(&self, uid: &str) -> Option<super::rerun::Interruption> {
        self.read(uid, |record| record.pod_interrupted)
    }

    /// Forgets runner `uid` (deleted), but for its endings (see [`RunnerMemory::deregistered`]).
    pub fn forget(&self, uid: &str) {
        self.inner().records.remove(uid);
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
        assert!(memory.snapshot("a").pod_creation_failed);
        assert_eq!(
            memory.report_not_created("a", 8),
            None,
            "another registration"
        );
        assert_eq!(memory.report_not_created("a", 7).as_deref(), Some("boom"));
        assert_eq!(memory.report_not_created("a", 7), None, "reported once");
        assert!(
            memory.snapshot("a").pod_creation_failed,
            "dry runs until a pod is made"
        );
        memory.created_pod("a");
        assert!(!memory.snapshot("a").pod_creation_failed);
        memory.pod_not_created("a", 9, "timed out".to_owned());
        memory.awaiting_pod("a", true, Duration::from_secs(10));
        assert!(
            !memory.snapshot("a").pod_creation_failed,
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
        assert!(!memory.snapshot("a").knows_pod_identity);
        memory.pod_runs_under("a", "pod-1", 7, "runner-a");
        assert!(memory.snapshot("a").knows_pod_identity);
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
        assert!(!memory.snapshot("b").knows_pod_identity);
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
    fn how_the_cluster_ended_a_pod_is_remembered_for_a_runner_still_remembered_only() {
        let memory = RunnerMemory::default();
        let pod = |owner: &str, status: serde_json::Value| -> CachedPod {
            let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "r", "ownerReferences": [{
                    "apiVersion": "actions.github.com/v1alpha1", "kind": "EphemeralRunner", "name": "r",
                    "uid": owner, "controller": true}]},
                "status": status,
            }))
            .unwrap();
            CachedPod::from(pod)
        };
        let marked = serde_json::json!({"phase": "Running", "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]});
        memory.observe_pod_end(&pod("gone", marked.clone()));
        assert!(memory.pod_interrupted("gone").is_none());
        assert!(
            !memory.inner().records.contains_key("gone"),
            "no record made for a runner forgotten"
        );
        memory.seen(&versioned_runner("u", "1", 0));
        assert!(!memory.observe_pod(&pod("u", serde_json::json!({"phase": "Running"}))));
        assert_eq!(
            memory.pod_interrupted("u"),
            None,
            "a running pod says nothing"
        );
        assert!(!memory.observe_pod(&pod("u", marked)));
        // Its deletion without the condition (a later status write dropped it) does not make it a mere deletion.
        let mut deleted = pod("u", serde_json::json!({"phase": "Running"}));
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1).unwrap(),
            ));
        memory.observe_pod_end(&deleted);
        assert_eq!(
            memory.pod_interrupted("u"),
            Some(super::super::rerun::Interruption::Evicted)
        );
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

    #[test]
    fn a_zombie_suspicion_dates_from_the_first_and_goes_when_cleared_or_forgotten() {
        let memory = RunnerMemory::default();
        assert_eq!(memory.zombie_suspected_for("u"), None);
        memory.suspect_zombie("u");
        std::thread::sleep(Duration::from_millis(20));
        memory.suspect_zombie("u");
        assert!(
            memory
                .zombie_suspected_for("u")
                .is_some_and(|since| since >= Duration::from_millis(20)),
            "from the first time the service said so"
        );
        memory.clear_zombie_suspicion("u");
        assert_eq!(memory.zombie_suspected_for("u"), None);
        memory.suspect_zombie("v");
        memory.forget("v");
        assert_eq!(memory.zombie_suspected_for("v"), None);
    }

    #[test]
    fn the_registration_stored_in_a_secret_is_the_latest_one_until_the_runner_goes() {
        let memory = RunnerMemory::default();
        assert_eq!(memory.stored_config_of("u"), None, "unknown after a start");
        memory.stored_config("u", 7);
        memory.stored_config("u", 8);
        assert_eq!(memory.stored_config_of("u"), Some(8));
        memory.forget_stored_config("u");
        assert_eq!(
            memory.stored_config_of("u"),
            None,
            "a Secret being made: not known"
        );
        memory.stored_config("u", 9);
        memory.forget("u");
        assert_eq!(memory.stored_config_of("u"), None);
    }

    #[test]
    fn a_snapshot_reads_the_record_and_the_ending_at_once() {
        let memory = RunnerMemory::default();
        assert_eq!(memory.snapshot("u"), Snapshot::default());
        memory.disrupted("u");
        memory.pod_runs_under("u", "pod", 7, "r");
        memory.pod_not_created("u", 7, "boom".to_owned());
        memory.finalized("u");
        let snapshot = memory.snapshot("u");
        assert_eq!(
            snapshot,
            Snapshot {
                last_disruption: memory.last_disruption("u"),
                knows_pod_identity: true,
                pod_creation_failed: true,
                tearing_down: true,
            }
        );
        assert_eq!(snapshot.last_disruption.map(|(count, _)| count), Some(1));
        memory.forget("u");
        assert_eq!(
            memory.snapshot("u"),
            Snapshot {
                tearing_down: true,
                ..Snapshot::default()
            },
            "the ending outlives the record"
        );
    }
}
