//! Deterministic hashes of desired state, stored in `actions.github.com/integrity-hash` and
//! `pod-template-hash`.
//!
//! ARC hashes a Go-specific dump that cannot be reproduced; this manager hashes canonical JSON
//! (object keys sorted at every level) with the same FNV-1a + safe-encode scheme ARC uses for names, so values
//! look alike and are stable across runs, builds and field order (docs/reference/controllers.md, "Hashes").

use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// The hash of `value`'s canonical JSON form: 1 to 10 characters of Kubernetes' safe alphabet.
pub fn integrity_hash<T: Serialize>(value: &T) -> Result<String> {
    let json = serde_json::to_value(value).map_err(|source| Error::Serialize {
        what: "hash input",
        source,
    })?;
    Ok(crds::names::fnv32a_safe(&canonical_json(&json)))
}

/// The integrity hash of a runner template (`spec.ephemeralRunnerSpec` of a set, stamped on each runner made from
/// it): the AutoscalingRunnerSet, EphemeralRunnerSet and EphemeralRunner controllers all compare this one value.
pub fn runner_spec_hash(spec: &crds::EphemeralRunnerSpec) -> Result<String> {
    integrity_hash(spec)
}

/// `value` as compact JSON with object keys sorted at every level, whatever map type serde_json was built with.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                // A string always serialises.
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(value, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_matter() {
        let a = json!({"b": 1, "a": {"y": [1, 2], "x": "s"}});
        let b = json!({"a": {"x": "s", "y": [1, 2]}, "b": 1});
        assert_eq!(canonical_json(&a), r#"{"a":{"x":"s","y":[1,2]},"b":1}"#);
        assert_eq!(integrity_hash(&a).unwrap(), integrity_hash(&b).unwrap());
    }

    #[test]
    fn different_values_hash_differently() {
        assert_ne!(
            integrity_hash(&json!({"a": 1})).unwrap(),
            integrity_hash(&json!({"a": 2})).unwrap()
        );
        // Array order is significant.
        assert_ne!(
            integrity_hash(&json!([1, 2])).unwrap(),
            integrity_hash(&json!([2, 1])).unwrap()
        );
    }

    proptest! {
        #[test]
        fn hashes_are_short_safe_label_values(keys in proptest::collection::btree_map(".{0,8}", any::<i64>(), 0..8)) {
            let hash = integrity_hash(&keys).unwrap();
            prop_assert!(!hash.is_empty() && hash.len() <= 10);
            prop_assert!(hash.bytes().all(|b| b.is_ascii_alphanumeric()));
            prop_assert_eq!(hash, integrity_hash(&keys).unwrap());
        }
    }
}
