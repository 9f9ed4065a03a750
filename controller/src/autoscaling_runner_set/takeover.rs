//! Taking over what an earlier controller left (docs/migrating-from-arc.md, "What the manager does with what ARC
//! left"): ARC up to 0.14 keeps one or more runner sets per scale set under generated names (`<set>-xxxxx`), this
//! project exactly one named like the scale set. The decision is pure: which runners move to the scale set's own
//! runner set, and which superseded runner sets are empty and may go.
//!
//! Moving a runner (its controller reference) keeps it, its pod, its registration and its job: a busy runner
//! finishes its job in the scale set's runner set, which counts it, so the listener's target (assigned jobs,
//! theirs included) creates no second runner for that job. A moved runner is marked as made from another
//! template, so an idle one is replaced once (deregistered first, with the service's consent) and a busy one is
//! torn down after its job like any other.

use std::borrow::Borrow;

use crds::constants::API_VERSION;
use crds::{AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet};
use kube::{Resource, ResourceExt};

/// The `actions.github.com/integrity-hash` a moved runner gets: no template hashes to it, so the runner set reads
/// the runner as made from another template.
pub const TAKEN_OVER_MARK: &str = "taken-over";

/// What one pass does about the runner sets an earlier controller left for this scale set.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TakeOver {
    /// Names of the superseded runner sets still there (being deleted or not).
    pub superseded: Vec<String>,
    /// Runners of those sets to move to the scale set's own runner set, by name.
    pub adopt: Vec<String>,
    /// How many of `adopt` hold a job.
    pub busy: usize,
    /// Superseded sets without runners and not being deleted yet: (name, uid).
    pub delete: Vec<(String, String)>,
}

impl TakeOver {
    /// Whether nothing is left to take over.
    pub fn is_done(&self) -> bool {
        self.superseded.is_empty()
    }

    /// The Event text for a pass that moves runners.
    pub fn adoption_note(&self) -> String {
        format!(
            "taking over {} runner(s) ({} with a job, left to finish it) from runner set(s) {} left by an earlier \
             controller; idle ones are replaced, and the old runner set(s) are deleted once empty",
            self.adopt.len(),
            self.busy,
            self.superseded.join(", ")
        )
    }
}

/// Whether `runner_set` is one of `owner`'s superseded runner sets ([`EphemeralRunnerSet::is_superseded`]):
/// controlled by `owner` (its uid, or its name when the reference carries no uid).
pub fn superseded_of(owner: &AutoscalingRunnerSet, runner_set: &EphemeralRunnerSet) -> bool {
    let uid = owner.uid().unwrap_or_default();
    runner_set.is_superseded()
        && runner_set.owner_references().iter().any(|reference| {
            reference.controller == Some(true)
                && reference.kind == AutoscalingRunnerSet::kind(&())
                && reference.api_version == API_VERSION
                && reference.name == owner.name_any()
                && (reference.uid.is_empty() || reference.uid == uid)
        })
}

/// Whether `runner` is controlled by the runner set named `set`.
fn controlled_by_set(runner: &EphemeralRunner, set: &str) -> bool {
    runner.owner_references().iter().any(|reference| {
        reference.controller == Some(true)
            && reference.kind == EphemeralRunnerSet::kind(&())
            && reference.name == set
    })
}

/// The pass's take-over, from the runner sets and runners of `owner`'s namespace.
pub fn plan(
    owner: &AutoscalingRunnerSet,
    runner_sets: &[impl Borrow<EphemeralRunnerSet>],
    runners: &[impl Borrow<EphemeralRunner>],
) -> TakeOver {
    let mut take_over = TakeOver::default();
    let mut superseded: Vec<&EphemeralRunnerSet> = runner_sets
        .iter()
        .map(Borrow::borrow)
        .filter(|runner_set| superseded_of(owner, runner_set))
        .collect();
    superseded.sort_by_key(|runner_set| runner_set.name_any());
    for runner_set in superseded {
        let name = runner_set.name_any();
        let mut theirs: Vec<&EphemeralRunner> = runners
            .iter()
            .map(Borrow::borrow)
            .filter(|runner| controlled_by_set(runner, &name))
            .collect();
        theirs.sort_by_key(|runner| runner.name_any());
        if theirs.is_empty() && runner_set.meta().deletion_timestamp.is_none() {
            take_over
                .delete
                .push((name.clone(), runner_set.uid().unwrap_or_default()));
        }
        take_over.busy += theirs.iter().filter(|runner| runner.has_job()).count();
        take_over
            .adopt
            .extend(theirs.iter().map(|runner| runner.name_any()));
        take_over.superseded.push(name);
    }
    take_over
}

/// Whether `runner_set` may be deleted now, from an uncached list of its namespace's runners: none is controlled
/// by it (a deletion would take a runner's pod and job with it).
pub fn is_empty(runner_set: &str, runners: &[EphemeralRunner]) -> bool {
    !runners
        .iter()
        .any(|runner| controlled_by_set(runner, runner_set))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use k8s_openapi::jiff::Timestamp;
    use proptest::prelude::*;

    fn reference(kind: &str, name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: API_VERSION.to_owned(),
            kind: kind.to_owned(),
            name: name.to_owned(),
            uid: uid.to_owned(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn scale_set() -> AutoscalingRunnerSet {
        let mut set = AutoscalingRunnerSet::new("arc", Default::default());
        set.metadata.uid = Some("ars-uid".to_owned());
        set
    }

    fn runner_set(name: &str, owner_uid: &str) -> EphemeralRunnerSet {
        let mut set = EphemeralRunnerSet::new(name, Default::default());
        set.metadata.uid = Some(format!("{name}-uid"));
        set.metadata.owner_references =
            Some(vec![reference("AutoscalingRunnerSet", "arc", owner_uid)]);
        set
    }

    fn runner(name: &str, set: &str, job: bool) -> EphemeralRunner {
        let mut runner = EphemeralRunner::new(name, Default::default());
        runner.metadata.owner_references = Some(vec![reference("EphemeralRunnerSet", set, "x")]);
        if job {
            runner.status = Some(crds::EphemeralRunnerStatus {
                job_id: "7".to_owned(),
                ..Default::default()
            });
        }
        runner
    }

    #[test]
    fn runners_of_generated_name_sets_move_and_empty_sets_go() {
        let sets = [
            runner_set("arc", "ars-uid"),
            runner_set("arc-x7k2p", "ars-uid"),
            runner_set("arc-b9q4z", "ars-uid"),
            // Another scale set's, and one of an earlier set of the same name (another uid).
            runner_set("other-h2k9d", "other-uid"),
            runner_set("arc-old00", "deleted-uid"),
        ];
        let runners = [
            runner("arc-runner-aaaaa", "arc", false),
            runner("arc-x7k2p-runner-bbbbb", "arc-x7k2p", true),
            runner("arc-x7k2p-runner-ccccc", "arc-x7k2p", false),
        ];
        let plan = plan(&scale_set(), &sets, &runners);
        assert_eq!(plan.superseded, ["arc-b9q4z", "arc-x7k2p"]);
        assert_eq!(
            plan.adopt,
            ["arc-x7k2p-runner-bbbbb", "arc-x7k2p-runner-ccccc"]
        );
        assert_eq!(plan.busy, 1);
        assert_eq!(
            plan.delete,
            [("arc-b9q4z".to_owned(), "arc-b9q4z-uid".to_owned())],
            "only an empty set goes"
        );
        assert!(!plan.is_done());
        assert!(plan.adoption_note().contains("2 runner(s) (1 with a job"));
    }

    #[test]
    fn a_set_being_deleted_is_not_deleted_again_and_keeps_the_take_over_open() {
        let mut deleting = runner_set("arc-x7k2p", "ars-uid");
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let plan = plan(&scale_set(), &[deleting], &[] as &[EphemeralRunner]);
        assert!(plan.delete.is_empty());
        assert_eq!(plan.superseded, ["arc-x7k2p"]);
        let done = super::plan(
            &scale_set(),
            &[runner_set("arc", "ars-uid")],
            &[] as &[EphemeralRunner],
        );
        assert!(done.is_done(), "{done:?}");
    }

    #[test]
    fn emptiness_is_told_by_the_controller_reference() {
        let runners = [runner("r1", "arc", false)];
        assert!(is_empty("arc-x7k2p", &runners));
        assert!(!is_empty("arc", &runners));
    }

    proptest! {
        /// Whatever the world, a set is deleted only when no runner is its, no runner of the scale set's own set
        /// is ever moved, and every runner of a superseded set is moved.
        #[test]
        fn never_deletes_a_set_with_runners_nor_moves_the_own_sets(
            owners in proptest::collection::vec((0usize..4, any::<bool>()), 0..12),
        ) {
            let names = ["arc", "arc-aaaaa", "arc-bbbbb", "arc-ccccc"];
            let sets: Vec<EphemeralRunnerSet> =
                names.iter().map(|name| runner_set(name, "ars-uid")).collect();
            let runners: Vec<EphemeralRunner> = owners
                .iter()
                .enumerate()
                .map(|(i, (set, job))| runner(&format!("r{i}"), names[*set], *job))
                .collect();
            let plan = plan(&scale_set(), &sets, &runners);
            for (name, _) in &plan.delete {
                prop_assert!(is_empty(name, &runners));
            }
            for runner in &runners {
                let own = controlled_by_set(runner, "arc");
                prop_assert_eq!(plan.adopt.contains(&runner.name_any()), !own);
            }
            prop_assert_eq!(
                plan.busy,
                runners.iter().filter(|r| !controlled_by_set(r, "arc") && r.has_job()).count()
            );
        }
    }
}
