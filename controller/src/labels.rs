//! Label and annotation merging (docs/reference/controllers.md, "Label and annotation merging"), and label-value
//! sanitising for values that come from GitHub.
//!
//! ARC returns an absent map when both inputs are absent and panics on a labels-only metadata block (a Go nil
//! map); here an absent input is simply empty, which is the evident intent.

use std::collections::BTreeMap;

/// `base` without excluded keys, then every non-excluded key of `overwrite` on top (overwrite wins).
pub fn merge_labels(
    base: Option<&BTreeMap<String, String>>,
    overwrite: Option<&BTreeMap<String, String>>,
    excluded_prefixes: &[String],
) -> BTreeMap<String, String> {
    let keep = |key: &String| {
        !excluded_prefixes
            .iter()
            .any(|prefix| key.starts_with(prefix.as_str()))
    };
    base.into_iter()
        .chain(overwrite)
        .flatten()
        .filter(|(key, _)| keep(key))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// A copy of `base` with `overwrite` on top; no filtering.
pub fn merge_annotations(
    base: Option<&BTreeMap<String, String>>,
    overwrite: Option<&BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    base.into_iter()
        .chain(overwrite)
        .flatten()
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// Longest label value Kubernetes accepts.
const MAX_LABEL_VALUE: usize = 63;

/// `value` made into a valid label value: characters other than ASCII alphanumerics, `-`, `_` and `.` become
/// `_`, the result is cut to 63 characters and must start and end with an alphanumeric (others are trimmed).
/// May be empty.
pub fn sanitize_label_value(value: &str) -> String {
    let replaced: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(MAX_LABEL_VALUE)
        .collect();
    replaced
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn overwrite_wins_and_exclusions_apply_to_both() {
        let base = map(&[("a", "1"), ("internal.io/x", "1"), ("b", "base")]);
        let overwrite = map(&[("b", "over"), ("internal.io/y", "2")]);
        let merged = merge_labels(Some(&base), Some(&overwrite), &["internal.io/".to_owned()]);
        assert_eq!(merged, map(&[("a", "1"), ("b", "over")]));
    }

    #[test]
    fn absent_maps_are_empty() {
        assert!(merge_labels(None, None, &[]).is_empty());
        assert!(merge_annotations(None, None).is_empty());
        let only = map(&[("k", "v")]);
        assert_eq!(merge_annotations(None, Some(&only)), only);
        assert_eq!(merge_annotations(Some(&only), None), only);
    }

    #[test]
    fn annotations_are_not_filtered() {
        let base = map(&[("internal.io/x", "1")]);
        assert_eq!(merge_annotations(Some(&base), None), base);
    }

    #[test]
    fn sanitising() {
        assert_eq!(
            sanitize_label_value("octo-org/hello.world"),
            "octo-org_hello.world"
        );
        assert_eq!(sanitize_label_value("--x--"), "x");
        assert_eq!(sanitize_label_value("/"), "");
        assert_eq!(sanitize_label_value(&"a".repeat(100)).len(), 63);
    }

    fn is_label_value(s: &str) -> bool {
        s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
    }

    proptest! {
        #[test]
        fn sanitised_values_are_valid(value in ".{0,200}") {
            prop_assert!(is_label_value(&sanitize_label_value(&value)));
        }

        #[test]
        fn merged_labels_never_carry_excluded_keys(
            base in proptest::collection::btree_map("[a-c]{1,3}(/[a-z]{0,2})?", "[a-z]{0,3}", 0..6),
            over in proptest::collection::btree_map("[a-c]{1,3}(/[a-z]{0,2})?", "[a-z]{0,3}", 0..6),
            prefix in "[a-c]{1,2}",
        ) {
            let merged = merge_labels(Some(&base), Some(&over), std::slice::from_ref(&prefix));
            prop_assert!(merged.keys().all(|k| !k.starts_with(&prefix)));
            for (k, v) in &over {
                if !k.starts_with(&prefix) {
                    prop_assert_eq!(merged.get(k), Some(v));
                }
            }
        }
    }
}
