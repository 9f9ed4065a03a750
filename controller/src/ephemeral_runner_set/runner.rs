//! The EphemeralRunner a set creates (docs/reference/controllers.md, "A new EphemeralRunner") and the hash that
//! detects a change of its template.

use std::collections::BTreeMap;

use crds::constants::{
    APPLIED_GENERATION_ANNOTATION, COMPLETED_RUNNERS_ANNOTATION, COMPONENT_LABEL, COMPONENT_RUNNER,
    EPHEMERAL_RUNNER_FINALIZER, EPHEMERAL_RUNNER_REGISTRATION_FINALIZER, INTEGRITY_HASH_ANNOTATION,
    PATCH_ID_ANNOTATION, SCALE_SET_NAME_LABEL, SCALE_SET_NAMESPACE_LABEL,
};
use crds::names::{ephemeral_runner_generate_name, ephemeral_runner_set_proxy_secret_name};
use crds::{EphemeralRunner, EphemeralRunnerSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;

use crate::labels::{merge_annotations, merge_labels};

/// Annotation kubectl keeps the whole last-applied object in; copying it onto every runner and pod would only
/// bloat them.
const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A new runner of `set` (to be created with `generateName`), stamped with `template_hash`, the
/// [`crate::hash::runner_spec_hash`] of the template it copies: the set tells a runner made from an older template by it.
pub fn desired_runner(
    set: &EphemeralRunnerSet,
    owner: OwnerReference,
    excluded_prefixes: &[String],
    template_hash: &str,
) -> EphemeralRunner {
    let set_name = set.name_any();
    let namespace = set.namespace().unwrap_or_default();
    let mut labels = set.labels().clone();
    labels.insert(COMPONENT_LABEL.to_owned(), COMPONENT_RUNNER.to_owned());
    let meta = set.spec.ephemeral_runner_metadata.as_ref();
    let labels = merge_labels(
        meta.map(|meta| &meta.labels),
        Some(&labels),
        excluded_prefixes,
    );
    let mut annotations: BTreeMap<String, String> = set.annotations().clone();
    annotations.remove(LAST_APPLIED_ANNOTATION);
    annotations.remove(APPLIED_GENERATION_ANNOTATION);
    annotations.remove(super::scale::LEGACY_APPLIED_PATCH_ID_ANNOTATION);
    annotations.remove(COMPLETED_RUNNERS_ANNOTATION);
    annotations.insert(
        INTEGRITY_HASH_ANNOTATION.to_owned(),
        template_hash.to_owned(),
    );
    annotations.insert(
        PATCH_ID_ANNOTATION.to_owned(),
        set.spec.patch_id.to_string(),
    );
    let annotations = merge_annotations(meta.map(|meta| &meta.annotations), Some(&annotations));
    let mut spec = set.spec.ephemeral_runner_spec.clone();
    if spec.proxy.is_some() {
        spec.proxy_secret_ref = ephemeral_runner_set_proxy_secret_name(&set_name, &namespace);
    }
    EphemeralRunner {
        metadata: ObjectMeta {
            generate_name: Some(ephemeral_runner_generate_name(&set_name)),
            namespace: Some(namespace),
            labels: Some(labels),
            annotations: Some(annotations),
            finalizers: Some(vec![
                EPHEMERAL_RUNNER_FINALIZER.to_owned(),
                EPHEMERAL_RUNNER_REGISTRATION_FINALIZER.to_owned(),
            ]),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

/// The scale set a set belongs to (its labels, else the set itself), for metric labels.
pub fn scale_set_identity(set: &EphemeralRunnerSet) -> (String, String) {
    let labels = set.labels();
    (
        labels
            .get(SCALE_SET_NAME_LABEL)
            .cloned()
            .unwrap_or_else(|| set.name_any()),
        labels
            .get(SCALE_SET_NAMESPACE_LABEL)
            .cloned()
            .unwrap_or_else(|| set.namespace().unwrap_or_default()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::runner_spec_hash;
    use crds::EphemeralRunnerSetSpec;
    use crds::EphemeralRunnerSpec;
    use crds::common::{ProxyConfig, ResourceMeta};
    use pretty_assertions::assert_eq;

    fn set() -> EphemeralRunnerSet {
        let mut set = EphemeralRunnerSet::new(
            "arc",
            EphemeralRunnerSetSpec {
                replicas: 2,
                patch_id: 7,
                ephemeral_runner_spec: EphemeralRunnerSpec {
                    github_config_url: "https://github.com/org".into(),
                    github_config_secret: "creds".into(),
                    runner_scale_set_id: 1,
                    ..EphemeralRunnerSpec::default()
                },
                ephemeral_runner_metadata: Some(ResourceMeta {
                    labels: [
                        ("extra".into(), "1".into()),
                        (COMPONENT_LABEL.into(), "mine".into()),
                    ]
                    .into(),
                    annotations: [
                        ("note".into(), "n".into()),
                        (PATCH_ID_ANNOTATION.into(), "99".into()),
                    ]
                    .into(),
                }),
            },
        );
        set.metadata.namespace = Some("ns".into());
        set.metadata.labels = Some(
            [
                (SCALE_SET_NAME_LABEL.into(), "arc".into()),
                ("internal.io/x".into(), "1".into()),
                (COMPONENT_LABEL.into(), "runner-set".into()),
            ]
            .into(),
        );
        set.metadata.annotations = Some(
            [
                (
                    "actions.github.com/runner-group-name".into(),
                    "default".into(),
                ),
                (LAST_APPLIED_ANNOTATION.into(), "{...}".into()),
                (COMPLETED_RUNNERS_ANNOTATION.into(), "arc-runner-a".into()),
            ]
            .into(),
        );
        set
    }

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "actions.github.com/v1alpha1".into(),
            kind: "EphemeralRunnerSet".into(),
            name: "arc".into(),
            uid: "u".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    #[test]
    fn runner_from_set() {
        let runner = desired_runner(&set(), owner(), &["internal.io/".to_owned()], "h1");
        assert_eq!(
            runner.metadata.generate_name.as_deref(),
            Some("arc-runner-")
        );
        assert_eq!(
            runner.metadata.finalizers,
            Some(vec![
                EPHEMERAL_RUNNER_FINALIZER.to_owned(),
                EPHEMERAL_RUNNER_REGISTRATION_FINALIZER.to_owned()
            ])
        );
        let labels = runner.metadata.labels.unwrap();
        // Set-derived values win over the metadata block; excluded prefixes are dropped.
        assert_eq!(labels[COMPONENT_LABEL], COMPONENT_RUNNER);
        assert_eq!(labels["extra"], "1");
        assert!(!labels.contains_key("internal.io/x"));
        let annotations = runner.metadata.annotations.unwrap();
        assert_eq!(annotations[PATCH_ID_ANNOTATION], "7");
        assert_eq!(annotations["note"], "n");
        assert!(!annotations.contains_key(LAST_APPLIED_ANNOTATION));
        assert!(
            !annotations.contains_key(COMPLETED_RUNNERS_ANNOTATION),
            "the listener's listing is the set's own"
        );
        assert_eq!(
            annotations[INTEGRITY_HASH_ANNOTATION], "h1",
            "the runner records the template it was made from"
        );
        assert_eq!(runner.spec.proxy_secret_ref, "");
        assert_eq!(runner.metadata.owner_references, Some(vec![owner()]));
    }

    #[test]
    fn proxied_runners_reference_the_proxy_secret() {
        let mut set = set();
        set.spec.ephemeral_runner_spec.proxy = Some(ProxyConfig::default());
        let runner = desired_runner(&set, owner(), &[], "h1");
        assert_eq!(
            runner.spec.proxy_secret_ref,
            ephemeral_runner_set_proxy_secret_name("arc", "ns")
        );
    }

    #[test]
    fn the_spec_hash_ignores_replicas_and_sees_template_changes() {
        let mut a = set();
        let hash = runner_spec_hash(&a.spec.ephemeral_runner_spec).unwrap();
        a.spec.replicas = 50;
        assert_eq!(
            runner_spec_hash(&a.spec.ephemeral_runner_spec).unwrap(),
            hash
        );
        a.spec.ephemeral_runner_spec.runner_scale_set_id = 2;
        assert_ne!(
            runner_spec_hash(&a.spec.ephemeral_runner_spec).unwrap(),
            hash
        );
        assert_eq!(
            scale_set_identity(&set()),
            ("arc".to_owned(), "ns".to_owned())
        );
    }
}
