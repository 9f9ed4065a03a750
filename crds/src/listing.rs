//! The completed-runners listing ([`COMPLETED_RUNNERS_ANNOTATION`]) as one typed value that the listener writes
//! and the EphemeralRunnerSet controller reads, so both processes agree on its format in one place.
//!
//! Each entry names a runner and the registration (runner id) its finished job ran under: `name:id`. The id
//! matters because a runner object outlives its registrations: an idle runner whose pod was taken away gets a
//! fresh registration and pod under the same name, and the job the listing reports may have ended on the old
//! one. Read by name alone, the set would count the runner's new, idle life as finishing and never scale it
//! down. An entry without an id (`name`, as a listener of an earlier release wrote it) matches any
//! registration of that runner.
//!
//! [`COMPLETED_RUNNERS_ANNOTATION`]: crate::constants::COMPLETED_RUNNERS_ANNOTATION

use std::fmt;

/// One runner whose finished job a listener's target no longer counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompletedRunner {
    /// The EphemeralRunner's name.
    pub name: String,
    /// The registration the job ran under; 0 when not known (an entry of an earlier listener, or a job message
    /// without one).
    pub runner_id: i64,
}

impl CompletedRunner {
    /// A runner's completed job under registration `runner_id` (0: not known).
    pub fn new(name: impl Into<String>, runner_id: i64) -> Self {
        Self {
            name: name.into(),
            runner_id: runner_id.max(0),
        }
    }

    /// Whether this entry may be about the runner `name` while it holds registration `runner_id` (0: not
    /// known). An unknown registration on either side matches: it cannot be told apart.
    pub fn matches(&self, name: &str, runner_id: i64) -> bool {
        self.name == name && same_registration(self.runner_id, runner_id)
    }
}

/// Whether two registrations, each 0 when not known, may be the same one.
pub fn same_registration(a: i64, b: i64) -> bool {
    a == 0 || b == 0 || a == b
}

impl fmt::Display for CompletedRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.runner_id == 0 {
            f.write_str(&self.name)
        } else {
            write!(f, "{}:{}", self.name, self.runner_id)
        }
    }
}

/// The annotation's value for `entries` (comma-separated, in order).
pub fn format(entries: &[CompletedRunner]) -> String {
    entries
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The entries an annotation's value carries. Empty items are skipped; an id that does not parse is read as not
/// known (the name alone still releases the runner's place), so a malformed entry never hides a runner.
pub fn parse(value: &str) -> Vec<CompletedRunner> {
    value
        .split(',')
        .filter(|item| !item.is_empty())
        .map(|item| match item.split_once(':') {
            Some((name, id)) => CompletedRunner::new(name, id.parse().unwrap_or(0)),
            None => CompletedRunner::new(item, 0),
        })
        .filter(|entry| !entry.name.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn entries_carry_the_registration_and_read_an_earlier_listeners_names() {
        let entries = vec![CompletedRunner::new("a", 7), CompletedRunner::new("b", 0)];
        assert_eq!(format(&entries), "a:7,b");
        assert_eq!(parse("a:7,b"), entries);
        assert_eq!(
            parse("a,,b,"),
            vec![CompletedRunner::new("a", 0), CompletedRunner::new("b", 0)]
        );
        assert_eq!(parse("a:x,:3"), vec![CompletedRunner::new("a", 0)]);
        assert!(parse("").is_empty());
    }

    #[test]
    fn an_entry_matches_its_registration_or_an_unknown_one() {
        let entry = CompletedRunner::new("a", 7);
        assert!(entry.matches("a", 7));
        assert!(
            entry.matches("a", 0),
            "the runner's registration is not known"
        );
        assert!(
            !entry.matches("a", 8),
            "the runner has moved on to a new registration"
        );
        assert!(!entry.matches("b", 7));
        assert!(
            CompletedRunner::new("a", 0).matches("a", 8),
            "an earlier listener's entry"
        );
    }

    proptest! {
        #[test]
        fn a_listing_reads_back_as_written(
            entries in proptest::collection::vec(("[a-z0-9][a-z0-9.-]{0,20}", 0i64..1_000_000), 0..20)
        ) {
            let entries: Vec<CompletedRunner> =
                entries.into_iter().map(|(name, id)| CompletedRunner::new(name, id)).collect();
            prop_assert_eq!(parse(&format(&entries)), entries);
        }
    }
}
