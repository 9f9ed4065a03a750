//! Which finished runners the listener's target no longer counts, as the EphemeralRunnerSet must hear it
//! (docs/reference/controllers.md, "Finished runners and the target"; the annotation
//! [`crds::constants::COMPLETED_RUNNERS_ANNOTATION`]).
//!
//! The statistics a target is computed from describe the moment a message was fetched. A runner whose job
//! completes after that moment can leave the set before the patch lands, and the set, counting one runner short,
//! would make a spare. So the set keeps counting a runner that left with a job until a patch names it here. The
//! set may act on only the last of several patches, so a name stays in every patch until the set has recorded
//! (`actions.github.com/applied-generation`) a generation that carried it.

use std::collections::VecDeque;

use crds::constants::COMPLETED_RUNNERS_ANNOTATION;
use crds::listing::{self, CompletedRunner};
use serde_json::{Value, json};

/// How many names are listed at most. A set that never acknowledges (one run by another controller) must not make
/// every patch grow; an unlisted runner only costs its set a short wait before replacing it.
pub const MAX_LISTED: usize = 256;

/// The runners listed, oldest first.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Completions {
    entries: VecDeque<Entry>,
    /// The last patch that reached the API server listed names: an empty list must then remove the annotation.
    sent: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    runner: CompletedRunner,
    /// The generation of the first patch that carried the name; `None` until one reached the API server.
    carried_by: Option<i64>,
}

impl Completions {
    /// A JobCompleted message named `runner`, registered as `runner_id` (empty: the job ended before a runner took
    /// it, nothing to list). The registration goes with the name: the runner object may outlive it (a fresh
    /// registration after its pod was taken away), and the set must not take its next life for this finished one.
    pub fn record(&mut self, runner: &str, runner_id: i64) {
        let runner = CompletedRunner::new(runner, runner_id);
        if runner.name.is_empty() || self.entries.iter().any(|entry| entry.runner == runner) {
            return;
        }
        self.entries.push_back(Entry {
            runner,
            carried_by: None,
        });
        while self.entries.len() > MAX_LISTED {
            self.entries.pop_front();
        }
    }

    /// The annotation's value for the next patch; `None` (remove it) when nothing is listed.
    pub fn annotation(&self) -> Option<String> {
        if self.entries.is_empty() {
            return None;
        }
        let entries: Vec<CompletedRunner> = self.entries.iter().map(|e| e.runner.clone()).collect();
        Some(listing::format(&entries))
    }

    /// Adds the listing to `patch` (a merge patch of the EphemeralRunnerSet): the names, or the annotation's
    /// removal once the list is empty. A listener that never saw a completion sends ARC's patch unchanged.
    pub fn annotate(&self, patch: &mut Value) {
        let value = match self.annotation() {
            Some(names) => Value::String(names),
            None if self.sent => Value::Null,
            None => return,
        };
        if let Value::Object(body) = patch {
            body.insert(
                "metadata".to_owned(),
                json!({ "annotations": { COMPLETED_RUNNERS_ANNOTATION: value } }),
            );
        }
    }

    /// A patch carrying [`Completions::annotation`] reached the API server, which answered with the set's
    /// `generation` and its recorded `applied` generation. Names the set has acted upon are dropped: a generation
    /// it recorded carried them, and every later patch's target leaves their jobs out as well.
    pub fn patched(&mut self, generation: Option<i64>, applied: Option<i64>) {
        self.sent = !self.entries.is_empty();
        for entry in &mut self.entries {
            if entry.carried_by.is_none() {
                entry.carried_by = generation;
            }
        }
        if let Some(applied) = applied {
            self.entries
                .retain(|entry| entry.carried_by.is_none_or(|carried| carried > applied));
        }
    }

    /// How many names are listed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no name is listed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_name_stays_until_a_generation_that_carried_it_is_applied() {
        let mut completions = Completions::default();
        completions.record("a", 0);
        completions.record("", 0);
        completions.record("a", 0);
        assert_eq!(completions.annotation().as_deref(), Some("a"));
        // Patch at generation 5; the set had applied 4.
        completions.patched(Some(5), Some(4));
        completions.record("b", 0);
        assert_eq!(completions.annotation().as_deref(), Some("a,b"));
        // Patch at generation 6; the set had applied 5 (which carried "a").
        completions.patched(Some(6), Some(5));
        assert_eq!(completions.annotation().as_deref(), Some("b"));
        completions.patched(Some(7), Some(6));
        assert_eq!(completions.annotation(), None);
        assert!(completions.is_empty());
    }

    #[test]
    fn the_patch_lists_the_names_then_removes_the_annotation_once() {
        let spec = json!({"spec": {"patchID": 1, "replicas": 2}});
        let mut completions = Completions::default();
        let mut patch = spec.clone();
        completions.annotate(&mut patch);
        assert_eq!(patch, spec, "nothing to list, nothing added");
        completions.record("a", 0);
        completions.record("b", 0);
        completions.annotate(&mut patch);
        assert_eq!(
            patch,
            json!({"metadata": {"annotations": {COMPLETED_RUNNERS_ANNOTATION: "a,b"}}, "spec": {"patchID": 1, "replicas": 2}})
        );
        completions.patched(Some(2), Some(2));
        let mut patch = spec.clone();
        completions.annotate(&mut patch);
        assert_eq!(
            patch["metadata"]["annotations"][COMPLETED_RUNNERS_ANNOTATION],
            Value::Null,
            "the listing is removed"
        );
        completions.patched(Some(3), Some(2));
        let mut patch = spec.clone();
        completions.annotate(&mut patch);
        assert_eq!(patch, spec, "and then left alone");
    }

    #[test]
    fn without_an_acknowledgement_names_stay_and_are_capped() {
        let mut completions = Completions::default();
        for i in 0..MAX_LISTED + 10 {
            completions.record(&format!("r{i}"), 0);
            completions.patched(Some(i64::try_from(i).unwrap_or_default()), None);
        }
        assert_eq!(completions.len(), MAX_LISTED);
        let listed = completions.annotation().unwrap_or_default();
        assert!(listed.starts_with("r10,"), "the oldest go first");
    }

    #[test]
    fn each_registration_of_a_runner_is_listed_with_its_id() {
        let mut completions = Completions::default();
        completions.record("a", 7);
        completions.record("a", 7);
        // The same runner, a later registration (its pod was taken away and it registered again).
        completions.record("a", 9);
        assert_eq!(completions.annotation().as_deref(), Some("a:7,a:9"));
    }

    #[test]
    fn a_failed_patch_carries_nothing() {
        let mut completions = Completions::default();
        completions.record("a", 0);
        // Only successful patches are reported; an acknowledgement of an older generation drops nothing.
        completions.patched(Some(9), Some(8));
        assert_eq!(completions.annotation().as_deref(), Some("a"));
    }

    proptest! {
        /// A name leaves only once the set has recorded a generation at least that of the first patch that
        /// carried it, so the set has seen it in the spec it acted upon.
        #[test]
        fn a_name_leaves_only_after_the_set_acted_on_a_patch_carrying_it(
            steps in prop::collection::vec((0usize..4, 0i64..3), 1..40),
        ) {
            let mut completions = Completions::default();
            let mut generation = 0;
            let mut applied = 0;
            let mut first_carried: std::collections::HashMap<String, i64> = Default::default();
            for (step, (new_names, lag)) in steps.into_iter().enumerate() {
                for n in 0..new_names {
                    completions.record(&format!("r{step}-{n}"), 0);
                }
                let before = completions.annotation().unwrap_or_default();
                generation += 1;
                for name in before.split(',').filter(|name| !name.is_empty()) {
                    first_carried.entry(name.to_owned()).or_insert(generation);
                }
                applied = (generation - lag).max(applied);
                completions.patched(Some(generation), Some(applied));
                let after = completions.annotation().unwrap_or_default();
                for name in before.split(',').filter(|name| !name.is_empty()) {
                    if !after.split(',').any(|kept| kept == name) {
                        prop_assert!(first_carried[name] <= applied, "{name} dropped too early");
                    }
                }
            }
        }
    }
}
