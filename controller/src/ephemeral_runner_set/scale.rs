//! Pure decisions of the EphemeralRunnerSet controller: counting runners, the patch-ID protocol, and which idle
//! runners a scale-down may remove (docs/reference/controllers.md, "Counting runners", "The patch-ID protocol",
//! "Scale down"; docs/reference/beyond-arc.md, item 8).

use std::sync::Arc;
use std::time::Duration;

use crds::constants::{INTEGRITY_HASH_ANNOTATION, PATCH_ID_ANNOTATION, phase, reason};
use crds::{EphemeralRunner, EphemeralRunnerSetStatus};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

pub use crate::completions::Places;
use crate::ephemeral_runner::facts::runner_not_started;
use crate::pods::CachedPod;
use crate::pods::{is_waiting_for_node, ready_since};

/// Where a runner stands, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucket {
    /// Not running yet (any phase other than the ones below).
    Pending,
    /// Its pod runs.
    Running,
    /// Marked Failed; kept for inspection, counted.
    Failed,
    /// Succeeded (not counted; deleted on the next scaling step).
    Finished,
    /// Its runner version is deprecated (not counted).
    Outdated,
    /// Being deleted (not counted).
    Deleting,
}

/// The bucket of one runner.
pub fn bucket(runner: &EphemeralRunner) -> Bucket {
    if runner.metadata.deletion_timestamp.is_some() {
        return Bucket::Deleting;
    }
    match runner.status.as_ref().map(|status| status.phase.as_str()) {
        Some(phase::RUNNING) => Bucket::Running,
        Some(phase::SUCCEEDED) => Bucket::Finished,
        Some(phase::FAILED) => Bucket::Failed,
        Some(phase::OUTDATED) => Bucket::Outdated,
        _ => Bucket::Pending,
    }
}

/// The runners of a set, by bucket.
#[derive(Debug, Default, Clone)]
pub struct Census {
    /// Pending runners.
    pub pending: Vec<Arc<EphemeralRunner>>,
    /// Running runners.
    pub running: Vec<Arc<EphemeralRunner>>,
    /// Failed runners.
    pub failed: Vec<Arc<EphemeralRunner>>,
    /// Finished runners.
    pub finished: Vec<Arc<EphemeralRunner>>,
    /// Outdated runners.
    pub outdated: Vec<Arc<EphemeralRunner>>,
    /// Runners being deleted.
    pub deleting: Vec<Arc<EphemeralRunner>>,
    /// Highest `actions.github.com/patch-id` among all runners (deleting ones included), 0 if none.
    pub latest_patch_id: i64,
}

impl Census {
    /// Sorts `runners` into buckets.
    pub fn of(runners: impl IntoIterator<Item = Arc<EphemeralRunner>>) -> Self {
        let mut census = Self::default();
        for runner in runners {
            let patch_id = runner
                .annotations()
                .get(PATCH_ID_ANNOTATION)
                .and_then(|value| value.parse::<i64>().ok())
                .unwrap_or(0);
            census.latest_patch_id = census.latest_patch_id.max(patch_id);
            let list = match bucket(&runner) {
                Bucket::Pending => &mut census.pending,
                Bucket::Running => &mut census.running,
                Bucket::Failed => &mut census.failed,
                Bucket::Finished => &mut census.finished,
                Bucket::Outdated => &mut census.outdated,
                Bucket::Deleting => &mut census.deleting,
            };
            list.push(runner);
        }
        census
    }

    /// The names of all its runners, those being deleted included.
    pub fn names(&self) -> impl Iterator<Item = String> + '_ {
        [
            &self.pending,
            &self.running,
            &self.failed,
            &self.finished,
            &self.outdated,
            &self.deleting,
        ]
        .into_iter()
        .flatten()
        .map(|runner| runner.name_any())
    }

    /// Runners that hold a place in the set: pending + running + failed.
    pub fn total(&self) -> usize {
        self.pending.len() + self.running.len() + self.failed.len()
    }

    /// The runners [`Census::total`] counts.
    pub fn counted(&self) -> impl Iterator<Item = &Arc<EphemeralRunner>> {
        self.pending.iter().chain(&self.running).chain(&self.failed)
    }

    /// The status these runners give, keeping a sticky `Outdated` and defaulting to `Running`.
    pub fn status(&self, current_phase: &str) -> EphemeralRunnerSetStatus {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let phase = if !self.outdated.is_empty() {
            phase::OUTDATED
        } else if current_phase.is_empty() {
            phase::RUNNING
        } else {
            current_phase
        };
        EphemeralRunnerSetStatus {
            current_replicas: count(self.total()),
            pending_ephemeral_runners: count(self.pending.len()),
            running_ephemeral_runners: count(self.running.len()),
            failed_ephemeral_runners: count(self.failed.len()),
            phase: phase.to_owned(),
        }
    }
}

/// What a scaling step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalePlan {
    /// This patch was already acted upon: no scaling, no cleanup of finished runners.
    AlreadyApplied,
    /// Create this many runners.
    Create(usize),
    /// Remove this many idle runners (authoritative patches only).
    Remove(usize),
    /// The count is right (or an incremental patch asks for fewer runners, which drain by themselves).
    Hold,
}

/// The annotation an earlier version of this controller recorded patch ids in; stripped from new runners.
pub const LEGACY_APPLIED_PATCH_ID_ANNOTATION: &str = "actions.github.com/applied-patch-id";

/// Whether the set's current request (`patch_id` at `generation`) was already acted upon. Patch 0 is
/// authoritative and always acted upon. Without a recorded generation (a set adopted from ARC), ARC's rule: the
/// highest patch id on the runners.
pub fn already_applied(
    patch_id: i64,
    generation: Option<i64>,
    recorded: Option<&String>,
    census: &Census,
) -> bool {
    if patch_id <= 0 {
        return false;
    }
    match recorded.and_then(|value| value.parse::<i64>().ok()) {
        Some(applied) => generation == Some(applied),
        None => patch_id == census.latest_patch_id,
    }
}

impl Places {
    /// How many of the runners `census` counts still serve a job the target counts, or wait for one.
    fn serving(&self, census: &Census) -> usize {
        census.total().saturating_sub(self.finishing)
    }
}

/// The patch-ID protocol (docs/reference/controllers.md, "The patch-ID protocol"): `patch_id` 0 is
/// authoritative (scale both ways); a positive one only scales up, once (see [`already_applied`]). Held places
/// ([`Places::held`]) are not filled, and never make a scale-down remove more; finishing runners
/// ([`Places::finishing`]) fill no place and are never what a scale-down removes for.
pub fn plan(
    replicas: i64,
    patch_id: i64,
    applied: bool,
    census: &Census,
    places: Places,
) -> ScalePlan {
    if applied {
        return ScalePlan::AlreadyApplied;
    }
    let replicas = usize::try_from(replicas.max(0)).unwrap_or(usize::MAX);
    let serving = places.serving(census);
    if serving.saturating_add(places.held) < replicas {
        ScalePlan::Create(replicas - serving - places.held)
    } else if patch_id == 0 && serving > replicas {
        ScalePlan::Remove(serving - replicas)
    } else {
        ScalePlan::Hold
    }
}

/// How many of the places `replicas` asks for are kept by held runners rather than filled. While any are, the
/// patch is not recorded as acted upon, so it is served again once they are released.
pub fn places_held(replicas: i64, census: &Census, places: Places) -> usize {
    let replicas = usize::try_from(replicas.max(0)).unwrap_or(usize::MAX);
    places
        .held
        .min(replicas.saturating_sub(places.serving(census)))
}

/// Runners made from another template than the set's current one (`hash`, compared with each runner's
/// `actions.github.com/integrity-hash`) that may go now: failed ones, and pending or running ones without a job.
/// A busy runner finishes its job on the template it started with. Runners without the annotation (made by hand
/// or another tool) are taken as current; those ARC made carry ARC's hash of the set, so a takeover replaces its
/// idle runners once.
pub fn stale_runners<'a>(census: &'a Census, hash: &str) -> Vec<&'a Arc<EphemeralRunner>> {
    census
        .failed
        .iter()
        .chain(&census.pending)
        .chain(&census.running)
        .filter(|runner| {
            runner
                .annotations()
                .get(INTEGRITY_HASH_ANNOTATION)
                .is_some_and(|made_from| made_from != hash)
        })
        .filter(|runner| bucket(runner) == Bucket::Failed || !runner.has_job())
        .collect()
}

/// Why a runner may not be removed by a scale-down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// No registration known (no runner id in the status, none kept for its pod) while its runner may have
    /// started (no pod yet, mid-registration; or a pod whose runner container started): it cannot be asked about
    /// before its deletion; reconsidered later.
    Unregistered,
    /// Assigned or running a job.
    HasJob,
    /// Ready for less than the grace period; removable after this much longer.
    JustReady(Duration),
}

/// Whether `runner` (with its pod if any) cannot serve a job now: its pod waits for a node, or the cluster refused
/// its last pod (a quota or an admission check) and none exists. A scale-down removes such runners first: they
/// hold a place and serve nothing, where a Ready runner would take the next job at once.
pub fn cannot_start(runner: &EphemeralRunner, pod: Option<&CachedPod>) -> bool {
    match pod {
        Some(pod) => is_waiting_for_node(pod),
        None => refused(runner),
    }
}

/// The cluster refused the runner's last pod and nothing was registered since: the refusal removed the
/// registration and its Secret, and a later attempt records its identity before it creates a pod.
fn refused(runner: &EphemeralRunner) -> bool {
    runner.status.as_ref().is_some_and(|status| {
        status.reason == reason::POD_CREATION_REJECTED && status.runner_id == 0
    })
}

/// Whether a runner (pending or running, with its pod if any, registered as `registration`, 0 when not known)
/// may be removed now.
pub fn keep_reason(
    runner: &EphemeralRunner,
    pod: Option<&CachedPod>,
    registration: i64,
    grace: Duration,
    now: Timestamp,
) -> Option<Keep> {
    let status = runner.status.clone().unwrap_or_default();
    if status.has_job() {
        return Some(Keep::HasJob);
    }
    // A pod whose runner has not started holds no job: it may go without asking the service first, and its
    // finalizer deregisters it (with the service's consent, should it start meanwhile). A refused runner has
    // neither a pod nor a registration: nothing of it runs.
    if registration == 0
        && !pod.is_some_and(runner_not_started)
        && !(pod.is_none() && refused(runner))
    {
        return Some(Keep::Unregistered);
    }
    let since = ready_since(pod?)?;
    let ready_for = Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO);
    grace
        .checked_sub(ready_for)
        .filter(|left| !left.is_zero())
        .map(Keep::JustReady)
}

/// Scale-down candidates in the order they are tried: runners that cannot start ([`cannot_start`]) oldest first,
/// then the other pending runners oldest first, then running runners oldest first (ARC's order after the first
/// group), minus those [`keep_reason`] protects. Also returns the shortest remaining grace period, so the caller
/// can come back when a protected runner becomes removable. `registration_of`: the registration a runner holds
/// (its status's, or the one its pod was created under), 0 when not known.
pub fn removal_candidates<'a>(
    census: &'a Census,
    pod_of: impl Fn(&EphemeralRunner) -> Option<Arc<CachedPod>>,
    registration_of: impl Fn(&EphemeralRunner, Option<&CachedPod>) -> i64,
    grace: Duration,
    now: Timestamp,
) -> (Vec<&'a Arc<EphemeralRunner>>, Option<Duration>) {
    let by_age = |runners: &'a [Arc<EphemeralRunner>]| {
        let mut sorted: Vec<&'a Arc<EphemeralRunner>> = runners.iter().collect();
        sorted.sort_by(|a, b| {
            let created =
                |runner: &EphemeralRunner| runner.metadata.creation_timestamp.as_ref().map(|t| t.0);
            created(a)
                .cmp(&created(b))
                .then_with(|| a.name_any().cmp(&b.name_any()))
        });
        sorted
    };
    let mut stuck = Vec::new();
    let mut others = Vec::new();
    let mut retry_after: Option<Duration> = None;
    for runner in by_age(&census.pending)
        .into_iter()
        .chain(by_age(&census.running))
    {
        let pod = pod_of(runner);
        let registration = registration_of(runner, pod.as_deref());
        match keep_reason(runner, pod.as_deref(), registration, grace, now) {
            None if cannot_start(runner, pod.as_deref()) => stuck.push(runner),
            None => others.push(runner),
            Some(Keep::JustReady(left)) => {
                retry_after = Some(retry_after.map_or(left, |current| current.min(left)));
            }
            Some(_) => {}
        }
    }
    stuck.extend(others);
    (stuck, retry_after)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::{EphemeralRunnerSpec, EphemeralRunnerStatus};
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use proptest::prelude::*;

    fn recorded_registration(runner: &EphemeralRunner, _: Option<&CachedPod>) -> i64 {
        runner.status.as_ref().map_or(0, |status| status.runner_id)
    }

    fn runner(
        name: &str,
        phase: &str,
        created: i64,
        runner_id: i64,
        job: bool,
        patch: Option<i64>,
    ) -> Arc<EphemeralRunner> {
        let mut runner = EphemeralRunner::new(name, EphemeralRunnerSpec::default());
        runner.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        if let Some(patch) = patch {
            runner.metadata.annotations =
                Some([(PATCH_ID_ANNOTATION.to_owned(), patch.to_string())].into());
        }
        runner.status = Some(EphemeralRunnerStatus {
            phase: phase.to_owned(),
            runner_id,
            job_id: if job { "job".into() } else { String::new() },
            ..EphemeralRunnerStatus::default()
        });
        Arc::new(runner)
    }

    fn ready_pod(since: i64) -> Arc<CachedPod> {
        Arc::new(CachedPod {
            status: Some(PodStatus {
                phase: Some("Running".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(Timestamp::from_second(since).unwrap())),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
            ..CachedPod::default()
        })
    }

    fn unschedulable_pod() -> Arc<CachedPod> {
        Arc::new(CachedPod {
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                conditions: Some(vec![PodCondition {
                    type_: "PodScheduled".into(),
                    status: "False".into(),
                    reason: Some("Unschedulable".into()),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
            ..CachedPod::default()
        })
    }

    #[test]
    fn census_counts_and_status() {
        let mut deleting = (*runner("d", "Running", 1, 1, false, Some(9))).clone();
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(5).unwrap()));
        let census = Census::of([
            runner("p1", "", 1, 0, false, Some(2)),
            runner("p2", "Pending", 1, 1, false, None),
            runner("r", "Running", 1, 1, false, Some(3)),
            runner("f", "Failed", 1, 1, false, None),
            runner("s", "Succeeded", 1, 1, false, None),
            Arc::new(deleting),
        ]);
        assert_eq!(census.total(), 4);
        assert_eq!(census.latest_patch_id, 9);
        let status = census.status("");
        assert_eq!(
            status,
            EphemeralRunnerSetStatus {
                current_replicas: 4,
                pending_ephemeral_runners: 2,
                running_ephemeral_runners: 1,
                failed_ephemeral_runners: 1,
                phase: "Running".into(),
            }
        );
        let outdated = Census::of([runner("o", "Outdated", 1, 1, false, None)]);
        assert_eq!(outdated.status("Running").phase, "Outdated");
        assert_eq!(Census::default().status("Outdated").phase, "Outdated");
    }

    #[test]
    fn patch_protocol() {
        let census = Census::of([runner("a", "Running", 1, 1, false, Some(4))]);
        // Not recorded (adopted from ARC): ARC's rule.
        assert!(already_applied(4, Some(7), None, &census));
        assert!(!already_applied(5, Some(7), None, &census));
        let none = Places::default();
        let held = |held| Places { held, finishing: 0 };
        assert_eq!(plan(3, 4, true, &census, none), ScalePlan::AlreadyApplied);
        assert_eq!(plan(3, 5, false, &census, none), ScalePlan::Create(2));
        assert_eq!(plan(0, 5, false, &census, none), ScalePlan::Hold);
        assert_eq!(plan(0, 0, false, &census, none), ScalePlan::Remove(1));
        assert_eq!(plan(1, 0, false, &census, none), ScalePlan::Hold);
        assert_eq!(plan(-3, 0, false, &census, none), ScalePlan::Remove(1));
        // Places held for runners that left with a job are not filled, and never make a scale-down remove more.
        assert_eq!(plan(3, 5, false, &census, held(1)), ScalePlan::Create(1));
        assert_eq!(places_held(3, &census, held(1)), 1);
        assert_eq!(plan(3, 5, false, &census, held(4)), ScalePlan::Hold);
        assert_eq!(places_held(3, &census, held(4)), 2);
        assert_eq!(plan(0, 0, false, &census, held(3)), ScalePlan::Remove(1));
        assert_eq!(places_held(0, &census, held(3)), 0);
        // A runner whose job is over fills no place: one queued job gets a runner while it is still there...
        let finishing = Places {
            held: 0,
            finishing: 1,
        };
        assert_eq!(plan(1, 6, false, &census, finishing), ScalePlan::Create(1));
        // ...and it is never what a scale-down removes an idle runner for.
        assert_eq!(plan(0, 0, false, &census, finishing), ScalePlan::Hold);
        // Until the listener lists it, its place is held as well: nothing changes.
        let both = Places {
            held: 1,
            finishing: 1,
        };
        assert_eq!(plan(1, 6, false, &census, both), ScalePlan::Hold);
        assert_eq!(places_held(1, &census, both), 1);
        // Patch 0 is never "already applied", even when a runner carries patch id 0.
        let zero = Census::of([runner("a", "Running", 1, 1, false, Some(0))]);
        assert!(!already_applied(0, Some(3), None, &zero));
    }

    #[test]
    fn a_recorded_generation_decides_not_the_patch_id() {
        let census = Census::of([runner("a", "Pending", 1, 1, false, Some(4))]);
        let recorded = "7".to_owned();
        // The same version of the spec: done.
        assert!(already_applied(4, Some(7), Some(&recorded), &census));
        // A new listener's patch with an id an old one used, or an interrupted scale-up: a new generation.
        assert!(!already_applied(4, Some(9), Some(&recorded), &census));
        let garbage = "x".to_owned();
        assert!(
            already_applied(4, Some(9), Some(&garbage), &census),
            "falls back to ARC's rule"
        );
    }

    #[test]
    fn stale_runners_are_the_idle_and_failed_ones_of_another_template() {
        let with_hash = |runner: Arc<EphemeralRunner>, hash: &str| {
            let mut runner = (*runner).clone();
            runner
                .annotations_mut()
                .insert(INTEGRITY_HASH_ANNOTATION.to_owned(), hash.to_owned());
            Arc::new(runner)
        };
        let census = Census::of([
            with_hash(runner("old-idle", "Running", 1, 1, false, None), "old"),
            with_hash(runner("old-pending", "Pending", 1, 2, false, None), "old"),
            with_hash(runner("old-busy", "Running", 1, 3, true, None), "old"),
            with_hash(runner("old-failed", "Failed", 1, 4, false, None), "old"),
            with_hash(runner("new-idle", "Running", 1, 5, false, None), "new"),
            runner("adopted", "Running", 1, 6, false, None),
        ]);
        let mut names: Vec<String> = stale_runners(&census, "new")
            .into_iter()
            .map(|runner| runner.name_any())
            .collect();
        names.sort();
        assert_eq!(names, ["old-failed", "old-idle", "old-pending"]);
    }

    #[test]
    fn candidates_skip_busy_unregistered_and_just_ready_runners_and_start_with_those_that_cannot_start()
     {
        let mut refused = (*runner("refused", "", 12, 0, false, None)).clone();
        refused.status.as_mut().unwrap().reason = reason::POD_CREATION_REJECTED.to_owned();
        let census = Census::of([
            runner("busy", "Running", 1, 1, true, None),
            runner("new", "", 2, 0, false, None),
            runner("waiting", "Pending", 3, 3, false, None),
            Arc::new(refused),
            runner("pending-old", "Pending", 4, 4, false, None),
            runner("pending-young", "Pending", 9, 5, false, None),
            runner("idle-old", "Running", 0, 6, false, None),
            runner("idle-fresh", "Running", 1, 7, false, None),
            // No identity recorded yet: removable only while its runner has not started.
            runner("unrecorded-starting", "", 10, 0, false, None),
            runner("unrecorded-running", "", 11, 0, false, None),
        ]);
        let now = Timestamp::from_second(1000).unwrap();
        let pod_of = |runner: &EphemeralRunner| match runner.name_any().as_str() {
            "waiting" => Some(unschedulable_pod()),
            "idle-old" => Some(ready_pod(100)),
            "idle-fresh" => Some(ready_pod(990)),
            "unrecorded-starting" => Some(Arc::new(CachedPod {
                status: Some(PodStatus {
                    phase: Some("Pending".into()),
                    ..PodStatus::default()
                }),
                ..CachedPod::default()
            })),
            "unrecorded-running" => Some(ready_pod(100)),
            _ => None,
        };
        let (candidates, retry) = removal_candidates(
            &census,
            pod_of,
            recorded_registration,
            Duration::from_secs(30),
            now,
        );
        let names: Vec<String> = candidates.iter().map(|runner| runner.name_any()).collect();
        assert_eq!(
            names,
            [
                "waiting",
                "refused",
                "pending-old",
                "pending-young",
                "unrecorded-starting",
                "idle-old"
            ]
        );
        assert_eq!(retry, Some(Duration::from_secs(20)));
    }

    proptest! {
        /// Whatever the runners, a scale-down never picks one with a job or without a registration, and the
        /// plan never removes runners for an incremental patch.
        #[test]
        fn scale_down_is_safe(
            runners in proptest::collection::vec(
                (prop_oneof!["", "Pending", "Running", "Failed", "Succeeded"], 0i64..100, 0i64..3, any::<bool>(), proptest::option::of(0i64..5)),
                0..30,
            ),
            replicas in -2i64..40,
            patch_id in 0i64..5,
            ready_at in 0i64..200,
            held in 0usize..5,
            finishing in 0usize..5,
        ) {
            let runners: Vec<_> = runners
                .into_iter()
                .enumerate()
                .map(|(i, (phase, created, id, job, patch))| runner(&format!("r{i}"), &phase, created, id, job, patch))
                .collect();
            let census = Census::of(runners);
            let applied = already_applied(patch_id, None, None, &census);
            let finishing = finishing.min(census.total());
            let places = Places { held, finishing };
            let serving = census.total() - finishing;
            let plan = plan(replicas, patch_id, applied, &census, places);
            if patch_id > 0 {
                prop_assert!(!matches!(plan, ScalePlan::Remove(_)));
            }
            if let ScalePlan::Create(n) = plan {
                // Every place asked for is filled by a runner still serving, by a new one, or held.
                prop_assert_eq!(
                    serving + n + places_held(replicas, &census, places),
                    usize::try_from(replicas).unwrap()
                );
            }
            if let ScalePlan::Remove(n) = plan {
                prop_assert_eq!(serving - n, usize::try_from(replicas.max(0)).unwrap(), "held places remove nothing");
            }
            let now = Timestamp::from_second(150).unwrap();
            let (candidates, _) = removal_candidates(&census, |_| Some(ready_pod(ready_at)), recorded_registration, Duration::from_secs(30), now);
            for runner in candidates {
                let status = runner.status.as_ref().unwrap();
                prop_assert!(!status.has_job());
                prop_assert!(status.runner_id != 0);
                prop_assert!(ready_at + 30 <= 150);
                prop_assert!(matches!(bucket(runner), Bucket::Pending | Bucket::Running));
            }
        }
    }
}
