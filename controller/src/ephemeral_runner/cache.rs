//! What the manager's caches keep of EphemeralRunners and their pods: what the controllers' decisions read, no
//! more (docs/reference/controllers.md, "Watches"). The cache holds every runner and pod for as long as they live.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use crds::EphemeralRunner;
use crds::constants::{
    CONTAINER_HOOKS_ENV, INTEGRITY_HASH_ANNOTATION, JOB_INTERRUPTED_ANNOTATION,
    PATCH_ID_ANNOTATION, RUNNER_CONTAINER_NAME, SCALE_SET_NAME_LABEL, SCALE_SET_NAMESPACE_LABEL,
};
use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec};
use kube::api::ObjectMeta;

use super::pod;
use crate::pods::CachedPod;

/// What the cache keeps of an EphemeralRunner: what the controllers' decisions read of it. Its pod template
/// is read only to register the runner and create its pod, from a copy read from the API server just before (the
/// fence in front of every registration); of it stays only whether the runner container uses container hooks,
/// which teardown reads. Of its labels and annotations stay the scale set's name and namespace (metric labels),
/// the template hash, the patch id, and why a job was interrupted (the re-run's). The cache holds every runner for as long as it lives, and the template,
/// the labels and the annotations are most of one (docs/benchmarks.md, manager memory).
pub fn prune_cached_runner(runner: &mut EphemeralRunner) {
    let hooks = runner.has_container_hooks();
    keep_keys(
        &mut runner.metadata.labels,
        &[SCALE_SET_NAME_LABEL, SCALE_SET_NAMESPACE_LABEL],
    );
    keep_keys(
        &mut runner.metadata.annotations,
        &[
            INTEGRITY_HASH_ANNOTATION,
            PATCH_ID_ANNOTATION,
            JOB_INTERRUPTED_ANNOTATION,
        ],
    );
    let spec = &mut runner.spec;
    spec.ephemeral_runner_config_secret_metadata = None;
    // Every pruned runner shares one of two templates: no copy of a template per runner.
    static NO_TEMPLATE: LazyLock<(Arc<ObjectMeta>, Arc<PodSpec>, Arc<PodSpec>)> =
        LazyLock::new(|| {
            let hooks = PodSpec {
                containers: vec![Container {
                    name: RUNNER_CONTAINER_NAME.to_owned(),
                    env: Some(vec![EnvVar {
                        name: CONTAINER_HOOKS_ENV.to_owned(),
                        ..EnvVar::default()
                    }]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            };
            (Arc::default(), Arc::default(), Arc::new(hooks))
        });
    let (metadata, plain, with_hooks) = &*NO_TEMPLATE;
    spec.metadata = Arc::clone(metadata);
    spec.spec = Arc::clone(if hooks { with_hooks } else { plain });
}

/// Of a cached runner pod's labels and annotations, only the job metadata stays (the pod's other labels and
/// annotations are its runner's).
pub fn prune_cached_pod(pod: &mut CachedPod) {
    keep_keys(&mut pod.metadata.labels, &pod::JOB_METADATA_KEYS);
    keep_keys(&mut pod.metadata.annotations, &pod::JOB_METADATA_KEYS);
}

/// Drops every entry of `map` but `keys`.
fn keep_keys(map: &mut Option<BTreeMap<String, String>>, keys: &[&str]) {
    if let Some(entries) = map {
        entries.retain(|key, _| keys.contains(&key.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::EphemeralRunnerSpec;
    use crds::common::ResourceMeta;
    use k8s_openapi::api::core::v1::{Pod, Volume};

    fn runner(env: &[&str]) -> EphemeralRunner {
        let container = |name: &str, env: &[&str]| Container {
            name: name.to_owned(),
            image: Some("ghcr.io/actions/actions-runner:latest".to_owned()),
            env: Some(
                env.iter()
                    .map(|name| EnvVar {
                        name: (*name).to_owned(),
                        value: Some("x".to_owned()),
                        ..EnvVar::default()
                    })
                    .collect(),
            ),
            ..Container::default()
        };
        let mut runner = EphemeralRunner::new(
            "set-runner-abcde",
            EphemeralRunnerSpec {
                github_config_url: "https://github.com/org".to_owned(),
                github_config_secret: "creds".to_owned(),
                runner_scale_set_id: 7,
                proxy_secret_ref: "proxy".to_owned(),
                ephemeral_runner_config_secret_metadata: Some(ResourceMeta::default()),
                metadata: ObjectMeta {
                    labels: Some([("team".to_owned(), "a".to_owned())].into()),
                    ..ObjectMeta::default()
                }
                .into(),
                spec: PodSpec {
                    containers: vec![
                        container(RUNNER_CONTAINER_NAME, env),
                        container("dind", &[]),
                    ],
                    volumes: Some(vec![Volume {
                        name: "work".to_owned(),
                        ..Volume::default()
                    }]),
                    ..PodSpec::default()
                }
                .into(),
                ..EphemeralRunnerSpec::default()
            },
        );
        runner.metadata.namespace = Some("ns".to_owned());
        runner.metadata.labels = Some(
            [
                (SCALE_SET_NAME_LABEL, "set"),
                (SCALE_SET_NAMESPACE_LABEL, "ns"),
                ("app.kubernetes.io/part-of", "gha-rs"),
                ("helm.sh/chart", "gha-rs-0.14.0"),
            ]
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .into(),
        );
        runner.metadata.annotations = Some(
            [
                (INTEGRITY_HASH_ANNOTATION, "abc"),
                (PATCH_ID_ANNOTATION, "3"),
                (JOB_INTERRUPTED_ANNOTATION, "evicted"),
                ("actions.github.com/values-hash", "def"),
            ]
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .into(),
        );
        runner
    }

    #[test]
    fn the_cache_keeps_what_decisions_read_and_no_template() {
        for env in [&["A"][..], &["A", CONTAINER_HOOKS_ENV][..]] {
            let full = runner(env);
            let mut cached = full.clone();
            prune_cached_runner(&mut cached);
            assert_eq!(cached.has_container_hooks(), full.has_container_hooks());
            let keys = |map: &Option<BTreeMap<String, String>>| {
                map.iter()
                    .flat_map(|map| map.keys().cloned())
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                keys(&cached.metadata.labels),
                [SCALE_SET_NAME_LABEL, SCALE_SET_NAMESPACE_LABEL]
            );
            assert_eq!(
                keys(&cached.metadata.annotations),
                [
                    INTEGRITY_HASH_ANNOTATION,
                    JOB_INTERRUPTED_ANNOTATION,
                    PATCH_ID_ANNOTATION
                ]
            );
            assert_eq!(cached.metadata.finalizers, full.metadata.finalizers);
            assert_eq!(
                cached.metadata.owner_references,
                full.metadata.owner_references
            );
            assert_eq!(cached.status, full.status);
            assert_eq!(cached.spec.github_config_url, full.spec.github_config_url);
            assert_eq!(
                cached.spec.github_config_secret,
                full.spec.github_config_secret
            );
            assert_eq!(
                cached.spec.runner_scale_set_id,
                full.spec.runner_scale_set_id
            );
            assert_eq!(cached.spec.proxy_secret_ref, full.spec.proxy_secret_ref);
            assert!(cached.spec.spec.volumes.is_none());
            assert!(cached.spec.metadata.labels.is_none());
            assert!(
                cached
                    .spec
                    .ephemeral_runner_config_secret_metadata
                    .is_none()
            );
            assert!(cached.spec.spec.containers.len() <= 1);
            let kept = serde_json::to_vec(&cached).unwrap().len();
            let whole = serde_json::to_vec(&full).unwrap().len();
            assert!(kept < whole, "{kept} < {whole}");
        }
    }

    #[test]
    fn cached_runners_share_one_template() {
        for env in [&["A"][..], &["A", CONTAINER_HOOKS_ENV][..]] {
            let (mut one, mut other) = (runner(env), runner(env));
            prune_cached_runner(&mut one);
            prune_cached_runner(&mut other);
            assert!(Arc::ptr_eq(&one.spec.spec, &other.spec.spec));
            assert!(Arc::ptr_eq(&one.spec.metadata, &other.spec.metadata));
        }
        let (mut plain, mut hooks) = (runner(&["A"]), runner(&[CONTAINER_HOOKS_ENV]));
        prune_cached_runner(&mut plain);
        prune_cached_runner(&mut hooks);
        assert!(!Arc::ptr_eq(&plain.spec.spec, &hooks.spec.spec));
    }

    #[test]
    fn a_cached_pod_keeps_its_status_placement_and_job_metadata() {
        let status = crds::EphemeralRunnerStatus {
            job_id: "8f3a-11".to_owned(),
            job_request_id: 5,
            workflow_run_id: 123,
            job_repository_name: "octo-org/hello".to_owned(),
            job_workflow_ref: "octo-org/hello/.github/workflows/ci.yml@refs/heads/main".to_owned(),
            job_display_name: "build".to_owned(),
            ..crds::EphemeralRunnerStatus::default()
        };
        let metadata = pod::job_metadata(&status).expect("a job");
        let full = |labelled: bool| {
            let mut labels: BTreeMap<String, String> = [
                ("actions-ephemeral-runner", "True"),
                ("app.kubernetes.io/part-of", "gha-rs"),
            ]
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .into();
            let mut annotations = BTreeMap::from([("note".to_owned(), "n".to_owned())]);
            if labelled {
                labels.extend(metadata.labels.clone());
                annotations.extend(metadata.annotations.clone());
            }
            let mut pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "set-runner-abcde", "namespace": "ns", "uid": "u1"},
                "spec": {
                    "nodeName": "node-1",
                    "schedulerName": "custom",
                    "containers": [{"name": "runner", "image": "runner:latest"}],
                },
                "status": {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                    "containerStatuses": [{
                        "name": "runner", "image": "runner:latest", "imageID": "", "ready": true,
                        "restartCount": 0, "state": {"running": {}},
                    }],
                },
            }))
            .unwrap();
            pod.metadata.labels = Some(labels);
            pod.metadata.annotations = Some(annotations);
            pod
        };
        for labelled in [false, true] {
            let whole = full(labelled);
            // The watch decodes the API server's answer straight into the cached type; a pod read from the API
            // server directly is converted. Both keep the same.
            let decoded: CachedPod =
                serde_json::from_value(serde_json::to_value(&whole).unwrap()).unwrap();
            assert_eq!(decoded, CachedPod::from(whole.clone()));
            let mut cached = decoded;
            prune_cached_pod(&mut cached);
            assert_eq!(metadata.is_on(&cached), labelled);
            assert_eq!(cached.status, whole.status);
            assert_eq!(cached.metadata.uid, whole.metadata.uid);
            let spec = cached.spec.as_ref().expect("a spec");
            assert_eq!(spec.node_name.as_deref(), Some("node-1"));
            assert_eq!(spec.scheduler_name.as_deref(), Some("custom"));
            assert!(
                cached
                    .metadata
                    .labels
                    .iter()
                    .chain(&cached.metadata.annotations)
                    .flat_map(|map| map.keys())
                    .all(|key| pod::JOB_METADATA_KEYS.contains(&key.as_str()))
            );
        }
    }
}
