//! The state shared by every reconciler: clients, stores, metrics, options, and small in-memory books
//! (error backoff, scale expectations). What the runner controller remembers of each runner is its own
//! (`ephemeral_runner::memory`).

use std::collections::{HashMap, HashSet};
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
    /// Runners that left with a job, per EphemeralRunnerSet, until the listener's target leaves their jobs out
    /// (fed by the runner watch).
    pub completions: Arc<Completions>,
    /// The listener loops this manager runs, in the manager's listener mode (`None` in the pod mode).
    pub listener_tasks: Option<Arc<crate::listener_tasks::ListenerTasks>>,
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
/// double deletions. Past [`EXPECTATION_TIMEOUT`] the set asks the API server instead of its cache (a quorum list):
/// what the list shows settles every expectation, and only what the cache has truly not caught up with is waited for
/// again ([`Expectations::rebase`]). Nothing is assumed from the clock alone.
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

/// Whether the cache shows what a set expects of it ([`Expectations::satisfied`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheView {
    /// Everything expected was seen (or nothing was expected).
    CaughtUp,
    /// Something is still expected.
    Behind,
    /// Something has been expected for [`EXPECTATION_TIMEOUT`]: ask the API server ([`Expectations::rebase`]).
    Overdue,
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
    /// being deleted) and says whether everything expected was seen, or has been waited for too long.
    pub fn satisfied(
        &self,
        key: &str,
        seen: impl Fn(&str) -> bool,
        alive: impl Fn(&str) -> bool,
    ) -> CacheView {
        let mut sets = lock(&self.sets);
        let Some(expected) = sets.get_mut(key) else {
            return CacheView::CaughtUp;
        };
        expected.created.retain(|name| !seen(name));
        expected.deleted.retain(|name| alive(name));
        if expected.created.is_empty() && expected.deleted.is_empty() {
            sets.remove(key);
            return CacheView::CaughtUp;
        }
        if expected
            .since
            .is_some_and(|since| since.elapsed() >= EXPECTATION_TIMEOUT)
        {
            return CacheView::Overdue;
        }
        CacheView::Behind
    }

    /// Settles set `key`'s overdue expectations by what a quorum list of its runners shows (`listed`: the runner
    /// exists; `listed_alive`: it exists and is not being deleted), and waits anew, from now, only for what the
    /// cache still shows otherwise (`seen`, `alive`, as in [`Expectations::satisfied`]). Returns the names the
    /// cache is still behind on (empty: caught up as of the list).
    pub fn rebase(
        &self,
        key: &str,
        listed: impl Fn(&str) -> bool,
        listed_alive: impl Fn(&str) -> bool,
        seen: impl Fn(&str) -> bool,
        alive: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let mut sets = lock(&self.sets);
        let Some(expected) = sets.get_mut(key) else {
            return Vec::new();
        };
        // A creation the list shows and the cache does not; a deletion the list shows (gone, or going) while the
        // cache shows the runner alive. Anything else is settled: the list is the API server's word.
        expected.created.retain(|name| listed(name) && !seen(name));
        expected
            .deleted
            .retain(|name| !listed_alive(name) && alive(name));
        let mut behind: Vec<String> = expected
            .created
            .iter()
            .chain(&expected.deleted)
            .cloned()
            .collect();
        if behind.is_empty() {
            sets.remove(key);
        } else {
            behind.sort();
            expected.since = Some(Instant::now());
        }
        behind
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

#[cfg(test)]
mod tests {
    use super::*;
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
        assert_eq!(
            expectations.satisfied("set", |_| false, |_| false),
            CacheView::CaughtUp
        );
        expectations.created("set", ["r1".to_owned(), "r2".to_owned()]);
        expectations.deleted("set", ["old".to_owned()]);
        // r1 seen, r2 not yet, old still alive.
        let cached = |name: &str| name == "r1" || name == "old";
        assert_eq!(
            expectations.satisfied("set", cached, cached),
            CacheView::Behind
        );
        // r2 seen; old is still cached but being deleted, which is enough.
        assert_eq!(
            expectations.satisfied("set", |name| name == "r2" || name == "old", |_| false),
            CacheView::CaughtUp
        );
        assert_eq!(
            expectations.satisfied("set", |_| false, |_| false),
            CacheView::CaughtUp
        );
    }

    #[test]
    fn expectations_say_how_long_they_are_still_waited_for() {
        let expectations = Expectations::default();
        assert_eq!(expectations.left("set"), None);
        expectations.created("set", ["r1".to_owned()]);
        let left = expectations.left("set").expect("waiting for r1");
        assert!(left <= EXPECTATION_TIMEOUT && left > EXPECTATION_TIMEOUT / 2);
        assert_eq!(
            expectations.satisfied("set", |_| true, |_| true),
            CacheView::CaughtUp
        );
        assert_eq!(expectations.left("set"), None);
    }

    #[test]
    fn a_runner_deleted_before_the_cache_saw_it_settles_its_expectation() {
        let expectations = Expectations::default();
        expectations.created("set", ["r1".to_owned()]);
        assert_eq!(
            expectations.satisfied("set", |_| false, |_| false),
            CacheView::Behind
        );
        expectations.gone("set", "r1");
        assert_eq!(
            expectations.satisfied("set", |_| false, |_| false),
            CacheView::CaughtUp
        );
    }

    #[test]
    fn a_runner_gone_before_its_creation_is_recorded_is_not_waited_for() {
        let expectations = Expectations::default();
        // The first runner of a batch ran its job and was deleted before the batch's last creation returned.
        expectations.creating("set");
        expectations.gone("set", "r1");
        expectations.created("set", ["r1".to_owned(), "r2".to_owned()]);
        assert_eq!(
            expectations.satisfied("set", |_| false, |_| false),
            CacheView::Behind,
            "r2 not seen yet"
        );
        assert_eq!(
            expectations.satisfied("set", |name| name == "r2", |_| false),
            CacheView::CaughtUp
        );
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
        assert_eq!(
            expectations.satisfied("set", |_| false, |_| false),
            CacheView::CaughtUp
        );
        assert!(lock(&expectations.sets).is_empty());
    }

    #[test]
    fn overdue_expectations_are_settled_by_a_quorum_list_and_only_a_lagging_cache_is_waited_for_again()
     {
        let expectations = Expectations::default();
        expectations.created("set", ["made".to_owned(), "made-and-gone".to_owned()]);
        expectations.deleted("set", ["removed".to_owned(), "still-cached".to_owned()]);
        lock(&expectations.sets).get_mut("set").unwrap().since =
            Some(Instant::now() - EXPECTATION_TIMEOUT);
        // The cache has seen none of the creations and still shows both deleted runners alive. The API server:
        // "made" exists, "made-and-gone" is gone, "removed" is gone, "still-cached" is going.
        let cached_alive = |name: &str| matches!(name, "removed" | "still-cached");
        assert_eq!(
            expectations.satisfied("set", cached_alive, cached_alive),
            CacheView::Overdue,
            "the clock alone settles nothing"
        );
        let listed = |name: &str| matches!(name, "made" | "still-cached");
        let listed_alive = |name: &str| name == "made";
        let behind = expectations.rebase("set", listed, listed_alive, cached_alive, cached_alive);
        assert_eq!(behind, ["made", "removed", "still-cached"]);
        assert_eq!(
            expectations.satisfied("set", cached_alive, cached_alive),
            CacheView::Behind,
            "waited for anew, from now"
        );
        // A cache that shows what the list shows: caught up.
        let behind = expectations.rebase("set", listed, listed_alive, listed, listed_alive);
        assert!(behind.is_empty());
        assert_eq!(expectations.left("set"), None);
    }
}
