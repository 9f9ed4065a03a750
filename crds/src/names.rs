//! Object names and label values derived from other objects (docs/reference/controllers.md, "Object names").
//! They must match ARC's exactly: a controller taking over from ARC finds the existing listener and proxy Secrets
//! by these names.

use std::collections::BTreeMap;

use crate::constants::{ENTERPRISE_LABEL, ORGANIZATION_LABEL, REPOSITORY_LABEL};

/// Kubernetes' "safe encode" alphabet (no vowels, no confusable characters), as used for generated names.
const SAFE_ALPHABET: &[u8; 27] = b"bcdfghjklmnpqrstvwxz2456789";

/// Longest label value Kubernetes accepts.
const MAX_LABEL_VALUE_LEN: usize = 63;

/// 32-bit FNV-1a of `data`.
pub fn fnv1a_32(data: &[u8]) -> u32 {
    const OFFSET_BASIS: u32 = 2_166_136_261;
    const PRIME: u32 = 16_777_619;
    data.iter().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(PRIME)
    })
}

/// Maps each character through the safe-encode alphabet by its code point modulo 27.
pub fn safe_encode(s: &str) -> String {
    s.chars()
        .map(|c| {
            // u32 % 27 is < 27, so the index is always in range.
            let index = (u32::from(c) % 27) as usize;
            char::from(SAFE_ALPHABET[index])
        })
        .collect()
}

/// FNV-1a of `s`, as an unpadded decimal, safe-encoded: 1 to 10 characters of the safe alphabet.
pub fn fnv32a_safe(s: &str) -> String {
    safe_encode(&fnv1a_32(s.as_bytes()).to_string())
}

/// The first 8 characters of [`fnv32a_safe`] (fewer when the decimal hash is shorter).
pub fn hash8(s: &str) -> String {
    let mut encoded = fnv32a_safe(s);
    // All characters are ASCII, so truncating at a byte index is safe.
    encoded.truncate(8);
    encoded
}

/// Name of the AutoscalingListener (and of its pod, ServiceAccount, Role and RoleBinding) of an ARS:
/// `<ARS name>-<hash8(namespace@runnerGroup@githubConfigUrl)>-listener`.
pub fn listener_name(
    ars_name: &str,
    ars_namespace: &str,
    runner_group: &str,
    github_config_url: &str,
) -> String {
    let hash = hash8(&format!(
        "{ars_namespace}@{runner_group}@{github_config_url}"
    ));
    format!("{ars_name}-{hash}-listener")
}

/// Name of the listener config Secret: `<AL name>-config`.
pub fn listener_config_secret_name(listener_name: &str) -> String {
    format!("{listener_name}-config")
}

/// Name of the listener proxy Secret: `<AL name>-proxy`.
pub fn listener_proxy_secret_name(listener_name: &str) -> String {
    format!("{listener_name}-proxy")
}

/// Not in ARC: name of the Role and RoleBinding (in the controller namespace) that let a listener write its
/// AutoscalingListener's status: `<AL name>-status`. The listener's other Role, in the scale set's namespace, has
/// the AL's own name, so the two never collide when both namespaces are the same.
pub fn listener_status_role_name(listener_name: &str) -> String {
    format!("{listener_name}-status")
}

/// Name of the EphemeralRunnerSet of an ARS: the ARS name (one-to-one).
pub fn ephemeral_runner_set_name(ars_name: &str) -> &str {
    ars_name
}

/// Name of the EphemeralRunnerSet's proxy Secret: `<ERS name>-<hash8(ERS namespace)>-runner-proxy`.
pub fn ephemeral_runner_set_proxy_secret_name(ers_name: &str, ers_namespace: &str) -> String {
    format!("{ers_name}-{}-runner-proxy", hash8(ers_namespace))
}

/// `generateName` of EphemeralRunners: `<ERS name>-runner-` (the API server appends 5 characters).
pub fn ephemeral_runner_generate_name(ers_name: &str) -> String {
    format!("{ers_name}-runner-")
}

/// Label value for one part (enterprise, organization or repository) of a GitHub config URL: `None` when the part
/// is empty; longer than 63 bytes ⇒ the first 58 bytes followed by `-trim`; otherwise the part with leading and
/// trailing `-`, `_` and `.` removed.
///
/// Note (as in ARC): the `-trim` form is not further cleaned, and the trimmed form may be empty (e.g. `"--"`).
pub fn url_label_value(part: &str) -> Option<String> {
    if part.is_empty() {
        return None;
    }
    if part.len() > MAX_LABEL_VALUE_LEN {
        // Lengths are in bytes, as in ARC; GitHub names are ASCII, but never split a character.
        let mut end = MAX_LABEL_VALUE_LEN - "-trim".len();
        while !part.is_char_boundary(end) {
            end -= 1;
        }
        return Some(format!("{}-trim", &part[..end]));
    }
    Some(part.trim_matches(['-', '_', '.']).to_owned())
}

/// The `actions.github.com/{enterprise,organization,repository}` labels for the parts of a parsed GitHub config
/// URL; empty parts produce no label.
pub fn github_url_labels(
    enterprise: &str,
    organization: &str,
    repository: &str,
) -> BTreeMap<String, String> {
    [
        (ENTERPRISE_LABEL, enterprise),
        (ORGANIZATION_LABEL, organization),
        (REPOSITORY_LABEL, repository),
    ]
    .into_iter()
    .filter_map(|(key, part)| url_label_value(part).map(|value| (key.to_owned(), value)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        // Published FNV-1a 32-bit test vectors.
        assert_eq!(fnv1a_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a_32(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn safe_encode_maps_digits_as_the_spec_says() {
        assert_eq!(safe_encode("0123456789"), "456789bcdf");
    }

    #[test]
    fn worked_example_listener_name() {
        assert_eq!(
            fnv1a_32(b"arc-runners@@https://github.com/org/repo"),
            3_954_087_200
        );
        assert_eq!(
            fnv32a_safe("arc-runners@@https://github.com/org/repo"),
            "7f984dc644"
        );
        assert_eq!(
            listener_name(
                "arc-runner-set",
                "arc-runners",
                "",
                "https://github.com/org/repo"
            ),
            "arc-runner-set-7f984dc6-listener"
        );
    }

    #[test]
    fn worked_example_runner_proxy_secret_name() {
        assert_eq!(fnv1a_32(b"arc-runners"), 3_106_134_893);
        assert_eq!(
            ephemeral_runner_set_proxy_secret_name("arc-runner-set", "arc-runners"),
            "arc-runner-set-754b578d-runner-proxy"
        );
    }

    #[test]
    fn listener_name_changes_with_runner_group_and_url() {
        let base = listener_name("set", "ns", "", "https://github.com/org");
        assert_ne!(
            base,
            listener_name("set", "ns", "group", "https://github.com/org")
        );
        assert_ne!(
            base,
            listener_name("set", "ns", "", "https://github.com/other")
        );
        assert_ne!(
            base,
            listener_name("set", "other-ns", "", "https://github.com/org")
        );
    }

    #[test]
    fn hash8_is_never_padded() {
        // hash8 keeps at most 8 characters of the unpadded decimal, so its length is min(8, digits).
        for input in ["", "a", "arc-runners", "x@y@z"] {
            let digits = fnv1a_32(input.as_bytes()).to_string().len();
            assert_eq!(hash8(input).len(), digits.min(8), "{input}");
        }
    }

    #[test]
    fn derived_secret_and_runner_names() {
        assert_eq!(listener_config_secret_name("l"), "l-config");
        assert_eq!(listener_proxy_secret_name("l"), "l-proxy");
        assert_eq!(ephemeral_runner_set_name("set"), "set");
        assert_eq!(ephemeral_runner_generate_name("set"), "set-runner-");
    }

    #[test]
    fn url_label_values() {
        assert_eq!(url_label_value(""), None);
        assert_eq!(url_label_value("my-org"), Some("my-org".to_owned()));
        assert_eq!(url_label_value("_.-my.org-._"), Some("my.org".to_owned()));
        let long = "a".repeat(64);
        let trimmed = url_label_value(&long).expect("non-empty");
        assert_eq!(trimmed.len(), 63);
        assert_eq!(trimmed, format!("{}-trim", "a".repeat(58)));
        // Exactly 63 characters is kept, only cleaned.
        let exact = format!("-{}", "b".repeat(62));
        assert_eq!(url_label_value(&exact), Some("b".repeat(62)));
    }

    #[test]
    fn github_url_labels_skip_empty_parts() {
        let labels = github_url_labels("", "org", "repo");
        assert_eq!(labels.len(), 2);
        assert_eq!(labels[ORGANIZATION_LABEL], "org");
        assert_eq!(labels[REPOSITORY_LABEL], "repo");
        let labels = github_url_labels("ent", "", "");
        assert_eq!(
            labels.into_iter().collect::<Vec<_>>(),
            [(ENTERPRISE_LABEL.to_owned(), "ent".to_owned())]
        );
    }

    fn is_dns_label(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    /// Secret names are DNS subdomains as Kubernetes validates them: at most 253 characters, dot-separated
    /// parts of lowercase alphanumerics and `-` that start and end alphanumeric (no per-part length limit).
    fn is_dns_subdomain(s: &str) -> bool {
        s.len() <= 253
            && s.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    }

    proptest! {
        /// The listener name is also a label value, so it must fit in 63 characters; the Helm chart limits ARS
        /// names to 45 characters for that reason.
        #[test]
        fn names_are_valid_for_chart_sized_ars_names(
            ars_name in "[a-z]([-a-z0-9]{0,43}[a-z0-9])?",
            namespace in "[a-z]([-a-z0-9]{0,61}[a-z0-9])?",
            group in ".{0,40}",
            url in "https://[a-z.]{1,30}/[-_.a-zA-Z0-9]{1,40}",
        ) {
            let listener = listener_name(&ars_name, &namespace, &group, &url);
            prop_assert!(is_dns_label(&listener), "{listener}");
            let proxy = ephemeral_runner_set_proxy_secret_name(&ars_name, &namespace);
            prop_assert!(is_dns_subdomain(&proxy), "{proxy}");
            prop_assert!(is_dns_subdomain(&listener_config_secret_name(&listener)));
            prop_assert!(is_dns_subdomain(&listener_proxy_secret_name(&listener)));
        }

        #[test]
        fn hash8_is_stable_and_uses_the_safe_alphabet(input in ".*") {
            let hash = hash8(&input);
            prop_assert_eq!(&hash, &hash8(&input));
            prop_assert!(!hash.is_empty() && hash.len() <= 8);
            prop_assert!(hash.bytes().all(|b| SAFE_ALPHABET.contains(&b)));
            prop_assert!(fnv32a_safe(&input).starts_with(&hash));
        }

        #[test]
        fn url_label_values_fit_in_a_label(part in ".{1,200}") {
            let value = url_label_value(&part).expect("non-empty input");
            prop_assert!(value.len() <= 63);
        }
    }
}
