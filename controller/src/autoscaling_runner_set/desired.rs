//! What an AutoscalingRunnerSet asks for, as pure functions: its integrity hash, the scale set's labels in the
//! Actions Service, its EphemeralRunnerSet and its AutoscalingListener (docs/reference/controllers.md, "Label and
//! annotation merging", "The scale set", "The EphemeralRunnerSet", "The listener object").

use std::collections::BTreeMap;

use actions_client::{GitHubConfig, Label, Scope};
use crds::constants::{
    BUSY_RUNNERS_BUDGET_SUFFIX, COMPONENT_BUSY_RUNNERS_BUDGET, COMPONENT_LABEL, COMPONENT_LISTENER,
    COMPONENT_RUNNER_SET, EPHEMERAL_RUNNER_LABEL, EPHEMERAL_RUNNER_LABEL_VALUE,
    INTEGRITY_HASH_ANNOTATION, JOB_ID_KEY, PART_OF_LABEL, PART_OF_VALUE,
    RERUN_INTERRUPTED_JOBS_ANNOTATION, RUNNER_GROUP_NAME_ANNOTATION,
    RUNNER_SCALE_SET_ID_ANNOTATION, RUNNER_SCALE_SET_NAME_ANNOTATION, SCALE_SET_NAME_LABEL,
    SCALE_SET_NAMESPACE_LABEL, VERSION_LABEL,
};
use crds::names::{github_url_labels, listener_name};
use crds::{
    AutoscalingListener, AutoscalingListenerSpec, AutoscalingRunnerSet, EphemeralRunnerSet,
    EphemeralRunnerSetSpec, EphemeralRunnerSpec, RerunInterruptedJobs,
};
use k8s_openapi::api::core::v1::LocalObjectReference;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use serde_json::json;

use crate::error::Result;
use crate::hash::{integrity_hash, runner_spec_hash};
use crate::labels::{merge_annotations, merge_labels};

/// The integrity hash of an AutoscalingRunnerSet: its spec and labels (docs/reference/controllers.md, "Hashes").
pub fn runner_set_hash(runner_set: &AutoscalingRunnerSet) -> Result<String> {
    integrity_hash(&json!({"spec": runner_set.spec, "labels": runner_set.labels()}))
}

/// The scale set id recorded on the AutoscalingRunnerSet, if it is a positive integer.
pub fn recorded_scale_set_id(runner_set: &AutoscalingRunnerSet) -> Option<i64> {
    runner_set
        .annotations()
        .get(RUNNER_SCALE_SET_ID_ANNOTATION)?
        .parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
}

/// The `actions.github.com/{enterprise,organization,repository}` labels of a config URL (none if unparseable).
pub fn url_labels(github_config_url: &str) -> BTreeMap<String, String> {
    let Ok(config) = GitHubConfig::parse(github_config_url) else {
        return BTreeMap::new();
    };
    match config.scope() {
        Scope::Organization { organization } => github_url_labels("", organization, ""),
        Scope::Enterprise { enterprise } => github_url_labels(enterprise, "", ""),
        Scope::Repository { owner, repository } => github_url_labels("", owner, repository),
    }
}

/// The labels of a new scale set: its name, then each `runnerScaleSetLabels` entry once, all `System`.
pub fn scale_set_labels(name: &str, extra: &[String]) -> Vec<Label> {
    let mut labels: Vec<Label> = vec![Label::system(name)];
    for label in extra {
        if !labels.iter().any(|existing| existing.name == *label) {
            labels.push(Label::system(label.clone()));
        }
    }
    labels
}

/// Labels every child of the AutoscalingRunnerSet gets: its own (minus excluded prefixes), then
/// `own` on top, then the GitHub URL labels (docs/reference/controllers.md, "Label and annotation merging").
fn child_labels(
    runner_set: &AutoscalingRunnerSet,
    component: &str,
    excluded_prefixes: &[String],
) -> BTreeMap<String, String> {
    let mut own = BTreeMap::from([
        (PART_OF_LABEL.to_owned(), PART_OF_VALUE.to_owned()),
        (COMPONENT_LABEL.to_owned(), component.to_owned()),
        (SCALE_SET_NAME_LABEL.to_owned(), runner_set.name_any()),
        (
            SCALE_SET_NAMESPACE_LABEL.to_owned(),
            runner_set.namespace().unwrap_or_default(),
        ),
    ]);
    if let Some(version) = runner_set.labels().get(VERSION_LABEL) {
        own.insert(VERSION_LABEL.to_owned(), version.clone());
    }
    let mut labels = merge_labels(Some(runner_set.labels()), Some(&own), excluded_prefixes);
    labels.extend(url_labels(&runner_set.spec.github_config_url));
    labels
}

/// The EphemeralRunnerSet of an AutoscalingRunnerSet: same name and namespace, replicas 0
/// (docs/reference/controllers.md, "The EphemeralRunnerSet").
pub fn desired_runner_set(
    runner_set: &AutoscalingRunnerSet,
    owner: OwnerReference,
    scale_set_id: i64,
    excluded_prefixes: &[String],
) -> Result<EphemeralRunnerSet> {
    let spec = &runner_set.spec;
    let template = spec.template.clone();
    let runner_spec = EphemeralRunnerSpec {
        github_config_url: spec.github_config_url.clone(),
        github_config_secret: spec.github_config_secret.clone(),
        github_server_tls: spec.github_server_tls.clone(),
        runner_scale_set_id: scale_set_id,
        proxy: spec.proxy.clone(),
        vault_config: spec.vault_config.clone(),
        ephemeral_runner_config_secret_metadata: spec
            .ephemeral_runner_config_secret_metadata
            .clone(),
        metadata: template.metadata.unwrap_or_default().into(),
        spec: template.spec.unwrap_or_default().into(),
        ..EphemeralRunnerSpec::default()
    };
    let base = child_labels(runner_set, COMPONENT_RUNNER_SET, excluded_prefixes);
    let meta = spec.ephemeral_runner_set_metadata.as_ref();
    let labels = merge_labels(meta.map(|m| &m.labels), Some(&base), excluded_prefixes);
    let own_annotations: BTreeMap<String, String> = [
        RUNNER_GROUP_NAME_ANNOTATION,
        RUNNER_SCALE_SET_NAME_ANNOTATION,
    ]
    .into_iter()
    .map(|key| {
        (
            key.to_owned(),
            runner_set
                .annotations()
                .get(key)
                .cloned()
                .unwrap_or_default(),
        )
    })
    .collect();
    let mut annotations = merge_annotations(meta.map(|m| &m.annotations), Some(&own_annotations));
    annotations.insert(
        INTEGRITY_HASH_ANNOTATION.to_owned(),
        runner_spec_hash(&runner_spec)?,
    );
    // Read by the runner controller when a job is interrupted (the set is in its cache; the scale set is not).
    if let Some(limit) = spec
        .rerun_interrupted_jobs
        .as_ref()
        .and_then(RerunInterruptedJobs::limit)
    {
        annotations.insert(
            RERUN_INTERRUPTED_JOBS_ANNOTATION.to_owned(),
            limit.to_string(),
        );
    }
    Ok(EphemeralRunnerSet {
        metadata: ObjectMeta {
            name: Some(runner_set.name_any()),
            namespace: runner_set.namespace(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: EphemeralRunnerSetSpec {
            replicas: 0,
            patch_id: 0,
            ephemeral_runner_spec: runner_spec,
            ephemeral_runner_metadata: spec.ephemeral_runner_metadata.clone(),
        },
        status: None,
    })
}

/// Manager-level inputs of a listener.
#[derive(Debug, Clone, Copy)]
pub struct ListenerInputs<'a> {
    /// Controller namespace.
    pub namespace: &'a str,
    /// Listener image.
    pub image: &'a str,
    /// Image pull secrets of listener pods.
    pub image_pull_secrets: &'a [String],
    /// Label key prefixes never propagated.
    pub excluded_prefixes: &'a [String],
}

/// The name of the AutoscalingListener of an AutoscalingRunnerSet (docs/reference/controllers.md, "Object names").
pub fn desired_listener_name(runner_set: &AutoscalingRunnerSet) -> String {
    listener_name(
        &runner_set.name_any(),
        &runner_set.namespace().unwrap_or_default(),
        &runner_set.spec.runner_group,
        &runner_set.spec.github_config_url,
    )
}

/// The AutoscalingListener of an AutoscalingRunnerSet (docs/reference/controllers.md, "The listener object").
/// Unlike ARC, the image pull secrets are part of the comparison too, so configuring them does not recreate the
/// listener on every pass.
pub fn desired_listener(
    runner_set: &AutoscalingRunnerSet,
    scale_set_id: i64,
    inputs: &ListenerInputs<'_>,
) -> Result<AutoscalingListener> {
    let spec = &runner_set.spec;
    let listener_spec = AutoscalingListenerSpec {
        github_config_url: spec.github_config_url.clone(),
        github_config_secret: spec.github_config_secret.clone(),
        runner_scale_set_id: scale_set_id,
        autoscaling_runner_set_namespace: runner_set.namespace().unwrap_or_default(),
        autoscaling_runner_set_name: runner_set.name_any(),
        ephemeral_runner_set_name: runner_set.name_any(),
        max_runners: spec.effective_max_runners(),
        min_runners: spec.effective_min_runners(),
        min_runners_schedules: spec.min_runners_schedules.clone(),
        scale_down_delay_seconds: spec.scale_down_delay_seconds.unwrap_or(0),
        image: inputs.image.to_owned(),
        image_pull_secrets: inputs
            .image_pull_secrets
            .iter()
            .map(|name| LocalObjectReference { name: name.clone() })
            .collect(),
        proxy: spec.proxy.clone(),
        github_server_tls: spec.github_server_tls.clone(),
        vault_config: spec.vault_config.clone(),
        metrics: spec.listener_metrics.clone(),
        template: spec.listener_template.clone(),
        config_secret_metadata: spec.listener_config_secret_metadata.clone(),
        service_account_metadata: spec.listener_service_account_metadata.clone(),
        role_metadata: spec.listener_role_metadata.clone(),
        role_binding_metadata: spec.listener_role_binding_metadata.clone(),
    };
    let base = child_labels(runner_set, COMPONENT_LISTENER, inputs.excluded_prefixes);
    let meta = spec.autoscaling_listener.as_ref();
    let labels = merge_labels(
        meta.map(|m| &m.labels),
        Some(&base),
        inputs.excluded_prefixes,
    );
    let hash = BTreeMap::from([(
        INTEGRITY_HASH_ANNOTATION.to_owned(),
        integrity_hash(&listener_spec)?,
    )]);
    let annotations = merge_annotations(meta.map(|m| &m.annotations), Some(&hash));
    Ok(AutoscalingListener {
        metadata: ObjectMeta {
            name: Some(desired_listener_name(runner_set)),
            namespace: Some(inputs.namespace.to_owned()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: listener_spec,
        status: None,
    })
}

/// The name of a set's PodDisruptionBudget for busy runners.
pub fn busy_runners_budget_name(runner_set: &AutoscalingRunnerSet) -> String {
    format!("{}{BUSY_RUNNERS_BUDGET_SUFFIX}", runner_set.name_any())
}

/// The PodDisruptionBudget that keeps voluntary evictions (a drain, the cluster autoscaler, a node upgrade) away
/// from the set's busy runners (docs/runner-lifecycle.md, "Drains wait for busy runners"). It selects the set's
/// runner pods that carry a job id, a label the manager writes with the job's other metadata, so idle runners
/// are evicted at once and a pod whose job ended (it exits, and a finished pod is always evictable) needs no
/// write. `minAvailable` is an integer no set reaches, so no selected pod may go: a percentage or
/// `maxUnavailable` would make the disruption controller look for a scale subresource on the pods' owner, which
/// an EphemeralRunner has not. A busy pod that is not Ready (its runner broken) may still be evicted.
pub fn desired_busy_runners_budget(
    runner_set: &AutoscalingRunnerSet,
    owner: OwnerReference,
    excluded_prefixes: &[String],
) -> PodDisruptionBudget {
    let selector = LabelSelector {
        match_labels: Some(BTreeMap::from([
            (
                EPHEMERAL_RUNNER_LABEL.to_owned(),
                EPHEMERAL_RUNNER_LABEL_VALUE.to_owned(),
            ),
            (SCALE_SET_NAME_LABEL.to_owned(), runner_set.name_any()),
            (
                SCALE_SET_NAMESPACE_LABEL.to_owned(),
                runner_set.namespace().unwrap_or_default(),
            ),
        ])),
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: JOB_ID_KEY.to_owned(),
            operator: "Exists".to_owned(),
            values: None,
        }]),
    };
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(busy_runners_budget_name(runner_set)),
            namespace: runner_set.namespace(),
            labels: Some(child_labels(
                runner_set,
                COMPONENT_BUSY_RUNNERS_BUDGET,
                excluded_prefixes,
            )),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(i32::MAX)),
            selector: Some(selector),
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".to_owned()),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}

/// What a pass does about the busy runners' budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetStep {
    Create,
    /// The budget's spec differs (an older manager's, or edited by hand): replace the spec.
    Update,
    /// Protection is turned off (`--protect-busy-runners=false`): the set's own budget goes.
    Delete,
    /// A budget of that name that this set does not control: left alone, with a warning.
    Foreign,
    Nothing,
}

/// The step for the set's budget: `enabled` (the manager's flag), the budget found under its name (`existing`) and
/// the one wanted; `owner_uid` is the set's.
pub fn budget_step(
    enabled: bool,
    existing: Option<&PodDisruptionBudget>,
    desired: &PodDisruptionBudget,
    owner_uid: &str,
) -> BudgetStep {
    let Some(existing) = existing else {
        return if enabled {
            BudgetStep::Create
        } else {
            BudgetStep::Nothing
        };
    };
    let ours = existing
        .owner_references()
        .iter()
        .any(|owner| owner.controller == Some(true) && owner.uid == owner_uid);
    match (ours, enabled) {
        (false, _) => BudgetStep::Foreign,
        (true, false) => BudgetStep::Delete,
        (true, true) => {
            let spec_same = existing.spec.as_ref().is_some_and(|have| {
                let want = desired.spec.as_ref();
                want.is_some_and(|want| {
                    have.min_available == want.min_available
                        && have.selector == want.selector
                        && have.unhealthy_pod_eviction_policy == want.unhealthy_pod_eviction_policy
                        && have.max_unavailable.is_none()
                })
            });
            if spec_same {
                BudgetStep::Nothing
            } else {
                BudgetStep::Update
            }
        }
    }
}

/// Whether `existing` already is what `desired` describes: every desired label and annotation is present,
/// the integrity hash of the spec included. The stored spec itself is not compared, since the API server
/// applies schema defaults to it; labels or annotations others add (e.g. a mutating webhook) do not cause
/// ARC's endless recreation.
pub fn listener_up_to_date(existing: &AutoscalingListener, desired: &AutoscalingListener) -> bool {
    contains_all(existing.labels(), desired.labels())
        && contains_all(existing.annotations(), desired.annotations())
}

/// Whether `map` has every entry of `wanted`.
pub fn contains_all(map: &BTreeMap<String, String>, wanted: &BTreeMap<String, String>) -> bool {
    wanted
        .iter()
        .all(|(key, value)| map.get(key) == Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::AutoscalingRunnerSetSpec;
    use crds::common::ResourceMeta;
    use pretty_assertions::assert_eq;

    fn runner_set() -> AutoscalingRunnerSet {
        let mut ars = AutoscalingRunnerSet::new(
            "arc-runner-set",
            AutoscalingRunnerSetSpec {
                github_config_url: "https://github.com/org/repo".to_owned(),
                github_config_secret: "creds".to_owned(),
                max_runners: Some(4),
                ..AutoscalingRunnerSetSpec::default()
            },
        );
        ars.metadata.namespace = Some("arc-runners".to_owned());
        ars.metadata.labels = Some(BTreeMap::from([
            (VERSION_LABEL.to_owned(), "0.1.0".to_owned()),
            ("argocd.argoproj.io/instance".to_owned(), "x".to_owned()),
        ]));
        ars.metadata.annotations = Some(BTreeMap::from([
            (RUNNER_SCALE_SET_ID_ANNOTATION.to_owned(), "12".to_owned()),
            (
                RUNNER_GROUP_NAME_ANNOTATION.to_owned(),
                "Default".to_owned(),
            ),
        ]));
        ars
    }

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "actions.github.com/v1alpha1".to_owned(),
            kind: "AutoscalingRunnerSet".to_owned(),
            name: "arc-runner-set".to_owned(),
            uid: "u".to_owned(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    #[test]
    fn hash_is_stable_and_covers_spec_and_labels() {
        let ars = runner_set();
        let hash = runner_set_hash(&ars).unwrap();
        assert_eq!(hash, runner_set_hash(&ars.clone()).unwrap());
        let mut changed = ars.clone();
        changed.spec.max_runners = Some(5);
        assert_ne!(hash, runner_set_hash(&changed).unwrap());
        let mut relabelled = ars.clone();
        relabelled.labels_mut().insert("team".into(), "ci".into());
        assert_ne!(hash, runner_set_hash(&relabelled).unwrap());
        // Annotations (where the controller records its own state) do not count.
        let mut annotated = ars;
        annotated.annotations_mut().insert("x".into(), "y".into());
        assert_eq!(hash, runner_set_hash(&annotated).unwrap());
    }

    #[test]
    fn scale_set_ids() {
        let mut ars = runner_set();
        assert_eq!(recorded_scale_set_id(&ars), Some(12));
        for bad in ["", "abc", "0", "-3"] {
            ars.annotations_mut()
                .insert(RUNNER_SCALE_SET_ID_ANNOTATION.into(), bad.into());
            assert_eq!(recorded_scale_set_id(&ars), None, "{bad:?}");
        }
    }

    #[test]
    fn scale_set_labels_are_unique_and_ordered() {
        let labels = scale_set_labels(
            "set",
            &["gpu".into(), "set".into(), "gpu".into(), "x".into()],
        );
        let names: Vec<_> = labels.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["set", "gpu", "x"]);
        assert!(labels.iter().all(|l| l.label_type == "System"));
    }

    #[test]
    fn runner_set_follows_the_recipe() {
        let mut ars = runner_set();
        ars.spec.ephemeral_runner_set_metadata = Some(ResourceMeta {
            labels: BTreeMap::from([("team".into(), "ci".into())]),
            annotations: BTreeMap::new(),
        });
        let excluded = ["argocd.argoproj.io/".to_owned()];
        let ers = desired_runner_set(&ars, owner(), 12, &excluded).unwrap();
        let labels = ers.metadata.labels.clone().unwrap();
        assert_eq!(labels[COMPONENT_LABEL], COMPONENT_RUNNER_SET);
        assert_eq!(labels[SCALE_SET_NAME_LABEL], "arc-runner-set");
        assert_eq!(labels[SCALE_SET_NAMESPACE_LABEL], "arc-runners");
        assert_eq!(labels[VERSION_LABEL], "0.1.0");
        assert_eq!(labels["actions.github.com/organization"], "org");
        assert_eq!(labels["actions.github.com/repository"], "repo");
        assert_eq!(labels["team"], "ci");
        assert!(!labels.contains_key("argocd.argoproj.io/instance"));
        let annotations = ers.metadata.annotations.clone().unwrap();
        assert_eq!(annotations[RUNNER_GROUP_NAME_ANNOTATION], "Default");
        assert_eq!(
            annotations[INTEGRITY_HASH_ANNOTATION],
            runner_spec_hash(&ers.spec.ephemeral_runner_spec).unwrap()
        );
        assert_eq!(ers.spec.ephemeral_runner_spec.runner_scale_set_id, 12);
        assert_eq!(ers.spec.replicas, 0);
        assert_eq!(ers.metadata.name.as_deref(), Some("arc-runner-set"));
    }

    #[test]
    fn listener_follows_the_recipe() {
        let ars = runner_set();
        let inputs = ListenerInputs {
            namespace: "arc-system",
            image: "ghcr.io/example/arc:1",
            image_pull_secrets: &["regcred".to_owned()],
            excluded_prefixes: &[],
        };
        let listener = desired_listener(&ars, 12, &inputs).unwrap();
        assert_eq!(
            listener.metadata.name.as_deref(),
            Some("arc-runner-set-7f984dc6-listener")
        );
        assert_eq!(listener.metadata.namespace.as_deref(), Some("arc-system"));
        assert_eq!(listener.spec.max_runners, 4);
        assert_eq!(listener.spec.min_runners, 0);
        assert_eq!(listener.spec.runner_scale_set_id, 12);
        assert_eq!(listener.spec.image_pull_secrets[0].name, "regcred");
        assert_eq!(listener.labels()[COMPONENT_LABEL], COMPONENT_LISTENER);
        assert!(listener_up_to_date(&listener, &listener));
        // A foreign label does not make it outdated; a spec change does.
        let mut decorated = listener.clone();
        decorated.labels_mut().insert("webhook".into(), "x".into());
        assert!(listener_up_to_date(&decorated, &listener));
        let mut other = ars.clone();
        other.spec.max_runners = Some(9);
        let changed = desired_listener(&other, 12, &inputs).unwrap();
        assert!(!listener_up_to_date(&listener, &changed));
        // The name changes with the runner group (ARC's rule).
        other.spec.runner_group = "gpu".into();
        assert_ne!(desired_listener_name(&other), desired_listener_name(&ars));
    }

    #[test]
    fn the_busy_runners_budget_selects_the_sets_runner_pods_with_a_job_and_lets_none_go() {
        let ars = runner_set();
        let budget = desired_busy_runners_budget(&ars, owner(), &[]);
        assert_eq!(
            budget.metadata.name.as_deref(),
            Some("arc-runner-set-busy-runners")
        );
        assert_eq!(budget.metadata.namespace.as_deref(), Some("arc-runners"));
        assert_eq!(
            budget.labels()[COMPONENT_LABEL],
            COMPONENT_BUSY_RUNNERS_BUDGET
        );
        let spec = budget.spec.clone().unwrap();
        // An integer: a percentage would need a scale subresource on the pods' owner.
        assert_eq!(spec.min_available, Some(IntOrString::Int(i32::MAX)));
        assert_eq!(spec.max_unavailable, None);
        assert_eq!(
            spec.unhealthy_pod_eviction_policy.as_deref(),
            Some("AlwaysAllow")
        );
        let selector = spec.selector.unwrap();
        let labels = selector.match_labels.unwrap();
        assert_eq!(labels[SCALE_SET_NAME_LABEL], "arc-runner-set");
        assert_eq!(labels[SCALE_SET_NAMESPACE_LABEL], "arc-runners");
        assert_eq!(labels[EPHEMERAL_RUNNER_LABEL], EPHEMERAL_RUNNER_LABEL_VALUE);
        let expressions = selector.match_expressions.unwrap();
        assert_eq!(expressions.len(), 1);
        assert_eq!(expressions[0].key, JOB_ID_KEY);
        assert_eq!(expressions[0].operator, "Exists");
    }

    #[test]
    fn the_budget_is_made_kept_repaired_or_removed_and_a_foreign_one_left_alone() {
        let ars = runner_set();
        let mine = owner();
        let uid = mine.uid.clone();
        let desired = desired_busy_runners_budget(&ars, mine, &[]);
        assert_eq!(budget_step(true, None, &desired, &uid), BudgetStep::Create);
        assert_eq!(
            budget_step(false, None, &desired, &uid),
            BudgetStep::Nothing
        );
        assert_eq!(
            budget_step(true, Some(&desired), &desired, &uid),
            BudgetStep::Nothing
        );
        assert_eq!(
            budget_step(false, Some(&desired), &desired, &uid),
            BudgetStep::Delete
        );
        let mut edited = desired.clone();
        if let Some(spec) = edited.spec.as_mut() {
            spec.min_available = Some(IntOrString::Int(1));
        }
        assert_eq!(
            budget_step(true, Some(&edited), &desired, &uid),
            BudgetStep::Update
        );
        let mut widened = desired.clone();
        if let Some(spec) = widened.spec.as_mut() {
            spec.max_unavailable = Some(IntOrString::Int(1));
        }
        assert_eq!(
            budget_step(true, Some(&widened), &desired, &uid),
            BudgetStep::Update
        );
        let mut foreign = desired.clone();
        foreign.metadata.owner_references = None;
        assert_eq!(
            budget_step(true, Some(&foreign), &desired, &uid),
            BudgetStep::Foreign
        );
        assert_eq!(
            budget_step(false, Some(&foreign), &desired, &uid),
            BudgetStep::Foreign,
            "turning protection off never deletes what is not the set's"
        );
    }
}
