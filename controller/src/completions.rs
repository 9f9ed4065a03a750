//! Runners that left with a job, counted until the listener's target leaves their jobs out
//! (docs/reference/controllers.md, "Finished runners and the target"; not in ARC). A shared book: the runner
//! watch and the runner controller's teardown write to it, the EphemeralRunnerSet controller's scaling step reads
//! it, and neither controller imports the other for it.
//!
//! A target is computed from statistics fetched at one moment. A runner whose job completes after that moment can
//! finish and leave before the patch lands; counting only the runners still there, the set would make a spare
//! runner for a job that is over. So a runner that leaves with a job keeps its place until the listener lists it
//! in [`COMPLETED_RUNNERS_ANNOTATION`], which it does in every patch computed after the job's completion reached
//! it. A listing can be missed (the listener restarted and never heard of the completion; the job ended before the
//! listener recorded it on the runner), so a place is kept at most [`Options::completion_hold`]: a spare is waste,
//! a job without a runner is worse, and the hold only ever delays a creation by that long.
//!
//! [`COMPLETED_RUNNERS_ANNOTATION`]: crds::constants::COMPLETED_RUNNERS_ANNOTATION
//! [`Options::completion_hold`]: crate::options::Options::completion_hold

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crds::constants::COMPLETED_RUNNERS_ANNOTATION;
use crds::listing::{CompletedRunner, same_registration};
use crds::{EphemeralRunner, EphemeralRunnerSet};
use kube::{Resource, ResourceExt};

use crate::context::lock;

/// The key a set's in-memory books (its expectations and completions) go by: `namespace/name`.
pub fn set_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// What a set knows of its runners beyond their buckets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Places {
    /// Places kept for runners that left with a job the target may still count: not filled.
    pub held: usize,
    /// Runners the set counts whose job is over (the listener listed it, or the pod succeeded) but that have not
    /// gone yet: they serve no job the target counts, so they fill none of its places. The target drops a job
    /// the moment its completion reaches the listener, while the runner's own teardown may take seconds more in
    /// a burst; counted as serving, they would leave queued jobs without runners until they are gone.
    pub finishing: usize,
}

/// What a set knows about one runner's finished job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// The listener listed it; the runner has not left yet.
    Listed,
    /// It left with a job the target may still count: its place is kept, since this instant.
    Held(Instant),
    /// Both: its place is no longer kept.
    Settled,
}

/// One finished job of a runner: the registration it ran under (0: not known), what is known of it, and when it
/// last mattered (listed, or the runner there).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    registration: i64,
    known: Known,
    mattered: Instant,
}

/// One set's runners that left with a job, and the listener's listing.
///
/// Records are per registration, not per runner name: a runner object outlives its registrations (an idle
/// runner whose pod was taken away registers again under the same name), and a job listed for an earlier
/// registration says nothing about the runner's current life. Keyed by name alone, such a runner stayed counted
/// as finishing, so a scale-down to zero never removed it and it idled forever.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ledger {
    runners: HashMap<String, Vec<Record>>,
}

impl Ledger {
    /// The record of runner `name` under `registration`, if one may be about it: the same registration first,
    /// else one where either side is not known.
    fn find(&mut self, name: &str, registration: i64) -> Option<&mut Record> {
        let records = self.runners.get_mut(name)?;
        let at = records
            .iter()
            .position(|record| record.registration == registration)
            .or_else(|| {
                records
                    .iter()
                    .position(|record| same_registration(record.registration, registration))
            })?;
        let record = &mut records[at];
        if record.registration == 0 {
            record.registration = registration;
        }
        Some(record)
    }

    fn add(&mut self, name: &str, registration: i64, known: Known, now: Instant) {
        self.runners
            .entry(name.to_owned())
            .or_default()
            .push(Record {
                registration,
                known,
                mattered: now,
            });
    }

    /// The set's current listing names these runners' jobs, at `now`.
    pub fn listed<'a>(
        &mut self,
        entries: impl IntoIterator<Item = &'a CompletedRunner>,
        now: Instant,
    ) {
        for entry in entries {
            match self.find(&entry.name, entry.runner_id) {
                Some(record) => {
                    record.mattered = now;
                    if matches!(record.known, Known::Held(_)) {
                        record.known = Known::Settled;
                    }
                }
                None => self.add(&entry.name, entry.runner_id, Known::Listed, now),
            }
        }
    }

    /// Runner `name` left with a job (being deleted, or gone) at `now`, registered as `registration` (0: not
    /// known).
    pub fn left(&mut self, name: &str, registration: i64, now: Instant) {
        match self.find(name, registration) {
            Some(record) if record.known == Known::Listed => record.known = Known::Settled,
            Some(_) => {}
            None => self.add(name, registration, Known::Held(now), now),
        }
    }

    /// How many places are kept at `now`, and how long until the first of them is released by the clock.
    /// Places kept for `hold` are released (settled).
    pub fn held(&mut self, now: Instant, hold: Duration) -> (usize, Option<Duration>) {
        let mut count = 0;
        let mut next: Option<Duration> = None;
        for record in self.runners.values_mut().flatten() {
            if let Known::Held(since) = record.known {
                let kept = now.saturating_duration_since(since);
                if kept >= hold {
                    record.known = Known::Settled;
                } else {
                    count += 1;
                    let left = hold - kept;
                    next = Some(next.map_or(left, |next| next.min(left)));
                }
            }
        }
        (count, next)
    }

    /// Forgets what no longer matters at `now`: records of names neither listed nor of a runner still there
    /// (`keep` says which) for `linger`, except places still kept. The linger is for the runner's last events: its
    /// deletion reaches the cache a moment before the watch reports it as left, and a step that forgot the name in
    /// between would have that report hold its place again.
    pub fn prune(&mut self, now: Instant, linger: Duration, keep: impl Fn(&str) -> bool) {
        self.runners.retain(|name, records| {
            let kept = keep(name);
            records.retain_mut(|record| {
                if kept {
                    record.mattered = now;
                    return true;
                }
                matches!(record.known, Known::Held(_))
                    || now.saturating_duration_since(record.mattered) < linger
            });
            !records.is_empty()
        });
    }

    /// Whether a job of runner `name` under `registration` (0: not known) is known to be over (listed, or seen
    /// leaving with it).
    pub fn knows(&self, name: &str, registration: i64) -> bool {
        self.runners.get(name).is_some_and(|records| {
            records
                .iter()
                .any(|record| same_registration(record.registration, registration))
        })
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.runners.is_empty()
    }
}

/// The entries an EphemeralRunnerSet's listing carries.
pub fn listing(annotations: &std::collections::BTreeMap<String, String>) -> Vec<CompletedRunner> {
    annotations
        .get(COMPLETED_RUNNERS_ANNOTATION)
        .map(|value| crds::listing::parse(value))
        .unwrap_or_default()
}

/// Whether `runner`, seen changed or `deleted`, is leaving with a job: being deleted (or gone) after the listener
/// recorded one. A runner whose pod succeeded deletes itself (the teardown lane), so this is how a finished runner
/// looks to its set.
pub fn leaving_with_job(runner: &EphemeralRunner, deleted: bool) -> bool {
    (deleted || runner.metadata.deletion_timestamp.is_some()) && runner.has_job()
}

/// The registration `runner`'s status records (0: none), the one a job the listener recorded ran under.
pub fn recorded_registration(runner: &EphemeralRunner) -> i64 {
    runner.status.as_ref().map_or(0, |status| status.runner_id)
}

/// The key the EphemeralRunnerSet controller knows the set that owns `runner` by (`namespace/name`), if one does.
pub fn owner_set_key(runner: &EphemeralRunner) -> Option<String> {
    let owner = runner.owner_references().iter().find(|owner| {
        owner.controller == Some(true) && owner.kind == EphemeralRunnerSet::kind(&())
    })?;
    Some(set_key(&runner.namespace()?, &owner.name))
}

/// A runner the set's census counts as holding a place, as [`Completions::standing`] weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted<'a> {
    /// Its name.
    pub name: &'a str,
    /// The registration it holds as far as the set knows (0: not known).
    pub registration: i64,
    /// Its pod succeeded: it left with its job as far as the target goes (its teardown may lag).
    pub succeeded: bool,
}

/// Every set's [`Ledger`], fed by the runner watch and read by the set's scaling step.
#[derive(Debug, Default)]
pub struct Completions {
    sets: Mutex<HashMap<String, Ledger>>,
}

impl Completions {
    /// Runner `name` of set `key`, registered as `registration` (0: not known), is leaving with a job
    /// ([`leaving_with_job`]): it starts being held, unless it was listed or seen leaving before.
    pub fn left(&self, key: &str, name: &str, registration: i64) {
        lock(&self.sets).entry(key.to_owned()).or_default().left(
            name,
            registration,
            Instant::now(),
        );
    }

    /// Set `key`'s scaling step: records its `listed` runners and, of the runners its census `counted` as holding
    /// a place, those whose pod succeeded; forgets what is neither listed nor `exists`; and says how many places
    /// are held, how long until the clock releases the first, and how many of the `counted` runners are finishing
    /// ([`Places`]).
    pub fn standing(
        &self,
        key: &str,
        listed: &[CompletedRunner],
        counted: &[Counted<'_>],
        exists: impl Fn(&str) -> bool,
        hold: Duration,
    ) -> (Places, Option<Duration>) {
        let mut sets = lock(&self.sets);
        let succeeded = counted.iter().any(|runner| runner.succeeded);
        if listed.is_empty() && !succeeded && !sets.contains_key(key) {
            return (Places::default(), None);
        }
        let ledger = sets.entry(key.to_owned()).or_default();
        let now = Instant::now();
        ledger.listed(listed, now);
        for runner in counted.iter().filter(|runner| runner.succeeded) {
            ledger.left(runner.name, runner.registration, now);
        }
        let (held, released_in) = ledger.held(now, hold);
        let finishing = counted
            .iter()
            .filter(|runner| ledger.knows(runner.name, runner.registration))
            .count();
        ledger.prune(now, hold, |name| {
            listed.iter().any(|entry| entry.name == name) || exists(name)
        });
        if ledger.is_empty() {
            sets.remove(key);
        }
        (Places { held, finishing }, released_in)
    }

    /// Forgets set `key` (deleted).
    pub fn forget(&self, key: &str) {
        lock(&self.sets).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HOLD: Duration = Duration::from_secs(10);

    /// A listing entry of runner `name` with no registration (as an earlier listener wrote it).
    fn named(name: &str) -> CompletedRunner {
        CompletedRunner::new(name, 0)
    }

    /// A counted runner of no known registration.
    fn counted(name: &str, succeeded: bool) -> Counted<'_> {
        Counted {
            name,
            registration: 0,
            succeeded,
        }
    }

    #[test]
    fn a_runner_that_left_is_held_until_listed() {
        let start = Instant::now();
        let mut ledger = Ledger::default();
        ledger.left("a", 0, start);
        assert_eq!(ledger.held(start, HOLD), (1, Some(HOLD)));
        ledger.listed(&[named("a")], start);
        assert_eq!(ledger.held(start, HOLD), (0, None));
        ledger.prune(start + HOLD, HOLD, |_| false);
        assert!(ledger.is_empty());
    }

    #[test]
    fn a_runner_listed_before_it_left_is_never_held() {
        let start = Instant::now();
        let mut ledger = Ledger::default();
        ledger.listed(&[named("a")], start);
        // The listener dropped the name after the set acted on it; the runner is still there.
        ledger.prune(start + HOLD, HOLD, |name| name == "a");
        ledger.left("a", 0, start);
        assert_eq!(ledger.held(start, HOLD), (0, None));
        ledger.left("a", 0, start);
        assert_eq!(ledger.held(start, HOLD), (0, None), "seen leaving twice");
    }

    #[test]
    fn a_runner_reported_gone_after_it_left_the_cache_is_not_held_again() {
        let start = Instant::now();
        let mut ledger = Ledger::default();
        ledger.listed(&[named("a")], start);
        ledger.left("a", 0, start);
        // A step between the runner's removal from the cache and the watch's report of it: not listed, not there.
        let moment = start + Duration::from_secs(1);
        ledger.prune(moment, HOLD, |_| false);
        ledger.left("a", 0, moment);
        assert_eq!(ledger.held(moment, HOLD), (0, None));
        // Long after, the name is forgotten.
        ledger.prune(moment + HOLD, HOLD, |_| false);
        assert!(ledger.is_empty());
    }

    #[test]
    fn a_place_is_kept_at_most_the_hold() {
        let start = Instant::now();
        let mut ledger = Ledger::default();
        ledger.left("a", 0, start);
        ledger.left("b", 0, start + Duration::from_secs(4));
        let later = start + Duration::from_secs(6);
        assert_eq!(ledger.held(later, HOLD), (2, Some(Duration::from_secs(4))));
        let (count, next) = ledger.held(start + HOLD, HOLD);
        assert_eq!((count, next), (1, Some(Duration::from_secs(4))));
        // Released by the clock: seeing it leave again does not hold it again.
        ledger.left("a", 0, start + HOLD);
        assert_eq!(ledger.held(start + HOLD, HOLD).0, 1);
        ledger.prune(start + HOLD * 3, HOLD, |_| false);
        assert_eq!(
            ledger.held(start + HOLD, HOLD).0,
            1,
            "a kept place is not pruned"
        );
    }

    #[test]
    fn only_a_runner_with_a_job_that_is_going_leaves_with_one() {
        use crds::EphemeralRunnerStatus;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use k8s_openapi::jiff::Timestamp;

        let mut runner = EphemeralRunner::new("r", Default::default());
        assert!(!leaving_with_job(&runner, true), "no job");
        runner.status = Some(EphemeralRunnerStatus {
            job_id: "7".into(),
            ..EphemeralRunnerStatus::default()
        });
        assert!(!leaving_with_job(&runner, false), "busy, not going");
        assert!(leaving_with_job(&runner, true));
        runner.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        assert!(leaving_with_job(&runner, false));
    }

    #[test]
    fn the_listing_is_read_from_the_annotation() {
        let annotations = [(COMPLETED_RUNNERS_ANNOTATION.to_owned(), "a,b,".to_owned())].into();
        assert_eq!(listing(&annotations), [named("a"), named("b")]);
        assert!(listing(&Default::default()).is_empty());
    }

    #[test]
    fn a_deleted_set_is_forgotten_with_its_held_places() {
        let completions = Completions::default();
        completions.left("ns/set", "a", 0);
        assert_eq!(
            completions
                .standing("ns/set", &[], &[], |_| false, HOLD)
                .0
                .held,
            1
        );
        completions.forget("ns/set");
        assert!(lock(&completions.sets).is_empty());
    }

    #[test]
    fn sets_are_forgotten_once_nothing_is_held() {
        let completions = Completions::default();
        let nothing = (Places::default(), None);
        assert_eq!(
            completions.standing("ns/set", &[], &[counted("a", false)], |_| true, HOLD),
            nothing
        );
        assert!(lock(&completions.sets).is_empty());
        assert_eq!(
            completions.standing("ns/set", &[named("a")], &[], |_| false, HOLD),
            nothing
        );
        // The name left the listing and no runner has it: forgotten once it has not mattered for the hold.
        assert_eq!(
            completions.standing("ns/set", &[], &[], |_| false, Duration::ZERO),
            nothing
        );
        assert!(lock(&completions.sets).is_empty());
    }

    #[test]
    fn a_runner_whose_job_is_over_fills_no_place_while_it_is_still_there() {
        let completions = Completions::default();
        let standing = |listed: &[CompletedRunner], counted: &[Counted<'_>]| {
            completions
                .standing("ns/set", listed, counted, |name| name != "gone", HOLD)
                .0
        };
        // Listed while it is still there (its teardown lags): finishing, nothing held.
        assert_eq!(
            standing(&[named("a")], &[counted("a", false), counted("b", false)]),
            Places {
                held: 0,
                finishing: 1
            }
        );
        // The listener dropped the name once the set acted on it: still known to be finishing.
        assert_eq!(
            standing(&[], &[counted("a", false), counted("b", false)]),
            Places {
                held: 0,
                finishing: 1
            }
        );
        // Its pod succeeded before any listing: finishing, and its place held until the listing names it.
        assert_eq!(
            standing(&[], &[counted("a", false), counted("b", true)]),
            Places {
                held: 1,
                finishing: 2
            }
        );
        assert_eq!(
            standing(&[named("b")], &[counted("a", false), counted("b", true)]),
            Places {
                held: 0,
                finishing: 2
            }
        );
    }

    #[test]
    fn a_runner_that_registered_again_after_its_listed_job_serves_again() {
        let completions = Completions::default();
        let at = |registration| Counted {
            name: "a",
            registration,
            succeeded: false,
        };
        let listed = [CompletedRunner::new("a", 7)];
        // Its job under registration 7 is over: finishing.
        let places = completions
            .standing("ns/set", &listed, &[at(7)], |_| true, HOLD)
            .0;
        assert_eq!(places.finishing, 1);
        // Its pod was taken away and it registered again as 8: its new life serves, though still listed.
        let places = completions
            .standing("ns/set", &listed, &[at(8)], |_| true, HOLD)
            .0;
        assert_eq!(places, Places::default());
        // A registration not known (between the old one's removal and the new one's record) cannot be told apart.
        let places = completions
            .standing("ns/set", &listed, &[at(0)], |_| true, HOLD)
            .0;
        assert_eq!(places.finishing, 1);
        // Its second job, under 8, ends and it leaves with it: held until listed, not settled by the first.
        let mut ledger = Ledger::default();
        let now = Instant::now();
        ledger.listed(&listed, now);
        ledger.left("a", 8, now);
        assert_eq!(ledger.held(now, HOLD).0, 1);
        ledger.listed(&[CompletedRunner::new("a", 8)], now);
        assert_eq!(ledger.held(now, HOLD).0, 0);
    }

    #[derive(Debug, Clone)]
    enum Event {
        Listed(u8),
        Left(u8),
        Tick(u8),
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (0u8..6).prop_map(Event::Listed),
            (0u8..6).prop_map(Event::Left),
            (0u8..12).prop_map(Event::Tick),
        ]
    }

    proptest! {
        /// A runner is held exactly while it has left, has not been listed (before or after leaving), and left
        /// less than the hold ago: no place is kept forever, and a listed runner is never held.
        #[test]
        fn held_places_are_exactly_the_unlisted_recent_leavers(events in prop::collection::vec(event(), 0..60)) {
            let start = Instant::now();
            let mut now = start;
            let mut ledger = Ledger::default();
            let mut listed = std::collections::HashSet::new();
            let mut left_at: HashMap<u8, Instant> = HashMap::new();
            for event in events {
                match event {
                    Event::Listed(n) => {
                        listed.insert(n);
                        ledger.listed(&[named(&format!("r{n}"))], now);
                    }
                    Event::Left(n) => {
                        left_at.entry(n).or_insert(now);
                        ledger.left(&format!("r{n}"), 0, now);
                    }
                    Event::Tick(secs) => now += Duration::from_secs(u64::from(secs)),
                }
                let expected = left_at
                    .iter()
                    .filter(|(n, at)| !listed.contains(n) && now.duration_since(**at) < HOLD)
                    .count();
                let (count, next) = ledger.held(now, HOLD);
                prop_assert_eq!(count, expected);
                prop_assert_eq!(count == 0, next.is_none());
                prop_assert!(next.is_none_or(|next| next <= HOLD));
            }
        }
    }
}
