//! The objects an EphemeralRunner owns, built as pure functions: the JIT config Secret
//! (docs/reference/controllers.md, "JIT Secret"), the runner pod ("Runner pod") and the job labels and annotations
//! put on the pod once a job is assigned (docs/reference/beyond-arc.md, item 15).

use std::collections::BTreeMap;

use crds::EphemeralRunner;
use crds::EphemeralRunnerStatus;
use crds::constants::{
    EPHEMERAL_RUNNER_LABEL, EPHEMERAL_RUNNER_LABEL_VALUE, POD_TEMPLATE_HASH_LABEL,
    RUNNER_CONTAINER_NAME,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, Pod, PodSpec, Secret, SecretKeySelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::hash::integrity_hash;
use crate::labels::{merge_labels, sanitize_label_value};
use crate::pods::CachedPod;
use crate::proxy::{HTTP_PROXY_KEY, HTTPS_PROXY_KEY, NO_PROXY_KEY};

/// JIT Secret key of the encoded JIT config.
pub const JIT_TOKEN_KEY: &str = "jitToken";
/// JIT Secret key of the registered runner name.
pub const RUNNER_NAME_KEY: &str = "runnerName";
/// JIT Secret key of the decimal runner id.
pub const RUNNER_ID_KEY: &str = "runnerId";
/// JIT Secret key of the decimal scale set id.
pub const SCALE_SET_ID_KEY: &str = "scaleSetId";

/// Runner environment: the JIT config.
pub const JIT_CONFIG_ENV: &str = "ACTIONS_RUNNER_INPUT_JITCONFIG";
/// Runner environment: extra user agent.
pub const EXTRA_USER_AGENT_ENV: &str = "GITHUB_ACTIONS_RUNNER_EXTRA_USER_AGENT";
/// Runner environment: exit with code 7 when the runner version is deprecated.
pub const DEPRECATED_EXIT_CODE_ENV: &str = "ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE";

/// Pod annotation: `owner/repo` of the job.
pub const JOB_REPOSITORY_ANNOTATION: &str = "actions.github.com/job-repository";
/// Pod annotation: workflow ref of the job.
pub const JOB_WORKFLOW_REF_ANNOTATION: &str = "actions.github.com/job-workflow-ref";
/// Pod annotation and label: workflow run id.
pub const WORKFLOW_RUN_ID_KEY: &str = "actions.github.com/workflow-run-id";
/// Pod annotation and label: job id.
pub use crds::constants::JOB_ID_KEY;
/// Pod annotation: job display name.
pub const JOB_DISPLAY_NAME_ANNOTATION: &str = "actions.github.com/job-display-name";
/// Pod label: repository owner of the job (label-safe).
pub const JOB_REPOSITORY_OWNER_LABEL: &str = "actions.github.com/job-repository-owner";
/// Pod label: repository name of the job (label-safe).
pub const JOB_REPOSITORY_NAME_LABEL: &str = "actions.github.com/job-repository-name";
/// Pod label: workflow file name of the job (label-safe), e.g. `ci.yml`.
pub const JOB_WORKFLOW_LABEL: &str = "actions.github.com/job-workflow";
/// Every key job metadata may set, as a label or an annotation.
pub const JOB_METADATA_KEYS: [&str; 8] = [
    JOB_ID_KEY,
    WORKFLOW_RUN_ID_KEY,
    JOB_REPOSITORY_ANNOTATION,
    JOB_WORKFLOW_REF_ANNOTATION,
    JOB_DISPLAY_NAME_ANNOTATION,
    JOB_REPOSITORY_OWNER_LABEL,
    JOB_REPOSITORY_NAME_LABEL,
    JOB_WORKFLOW_LABEL,
];

/// Why a runner pod cannot be built from its EphemeralRunner.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodTemplateProblem {
    /// No container is named `runner`, so the runner would never get its JIT config (ARC waits forever).
    #[error("the pod template has no container named \"runner\"")]
    NoRunnerContainer,
}

/// What a runner's JIT Secret says about its registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitIdentity {
    /// Runner id in the Actions Service.
    pub runner_id: i64,
    /// Registered name.
    pub runner_name: String,
}

/// The JIT config Secret of `runner`: named like it, owned by it.
pub fn jit_secret(
    runner: &EphemeralRunner,
    owner: OwnerReference,
    jit: &actions_client::JitRunnerConfig,
    excluded_prefixes: &[String],
) -> Secret {
    let reference = jit.runner.clone().unwrap_or_default();
    let meta = runner.spec.ephemeral_runner_config_secret_metadata.as_ref();
    let data = [
        (
            JIT_TOKEN_KEY,
            jit.encoded_jit_config.expose_secret().to_owned(),
        ),
        (RUNNER_NAME_KEY, reference.name),
        (RUNNER_ID_KEY, reference.id.to_string()),
        (SCALE_SET_ID_KEY, reference.runner_scale_set_id.to_string()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), ByteString(value.into_bytes())))
    .collect();
    Secret {
        metadata: ObjectMeta {
            name: runner.metadata.name.clone(),
            namespace: runner.metadata.namespace.clone(),
            labels: meta.map(|meta| merge_labels(Some(&meta.labels), None, excluded_prefixes)),
            annotations: meta.map(|meta| meta.annotations.clone()),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..Secret::default()
    }
}

/// The runner id and name a JIT Secret records.
pub fn read_jit_identity(secret: &Secret) -> Result<JitIdentity, String> {
    let data = secret.data.as_ref();
    let text = |key: &str| -> Result<String, String> {
        let bytes = data
            .and_then(|data| data.get(key))
            .ok_or_else(|| format!("key {key} is missing"))?;
        String::from_utf8(bytes.0.clone()).map_err(|_| format!("key {key} is not UTF-8"))
    };
    let id = text(RUNNER_ID_KEY)?;
    let runner_id = id
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| format!("{RUNNER_ID_KEY} {id:?} is not a positive integer"))?;
    Ok(JitIdentity {
        runner_id,
        runner_name: text(RUNNER_NAME_KEY).unwrap_or_default(),
    })
}

/// The runner pod of `runner`: the template's spec with the runner environment appended to every container
/// named `runner`, the runner's labels and annotations with the template's on top.
pub fn desired_pod(
    runner: &EphemeralRunner,
    owner: OwnerReference,
    build_version: &str,
) -> Result<Pod, PodTemplateProblem> {
    let name = runner.metadata.name.clone().unwrap_or_default();
    let mut spec = PodSpec::clone(&runner.spec.spec);
    let mut found = false;
    for container in spec
        .containers
        .iter_mut()
        .filter(|container| container.name == RUNNER_CONTAINER_NAME)
    {
        found = true;
        container
            .env
            .get_or_insert_with(Vec::new)
            .extend(runner_env(runner, &name, build_version));
    }
    if !found {
        return Err(PodTemplateProblem::NoRunnerContainer);
    }
    let mut labels = runner.metadata.labels.clone().unwrap_or_default();
    labels.extend(runner.spec.metadata.labels.clone().unwrap_or_default());
    let mut annotations = runner.metadata.annotations.clone().unwrap_or_default();
    annotations.extend(runner.spec.metadata.annotations.clone().unwrap_or_default());
    // Informational only (no selector uses it); covers everything the pod is built from.
    let template_hash = integrity_hash(&(&labels, &annotations, &spec)).unwrap_or_default();
    labels.insert(
        EPHEMERAL_RUNNER_LABEL.to_owned(),
        EPHEMERAL_RUNNER_LABEL_VALUE.to_owned(),
    );
    labels.insert(POD_TEMPLATE_HASH_LABEL.to_owned(), template_hash);
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: runner.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    })
}

fn secret_env(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_owned(),
                key: key.to_owned(),
                optional: None,
            }),
            ..EnvVarSource::default()
        }),
    }
}

fn plain_env(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value),
        value_from: None,
    }
}

fn runner_env(runner: &EphemeralRunner, secret: &str, build_version: &str) -> Vec<EnvVar> {
    let mut env = vec![
        secret_env(JIT_CONFIG_ENV, secret, JIT_TOKEN_KEY),
        plain_env(
            EXTRA_USER_AGENT_ENV,
            format!("actions-runner-controller/{build_version}"),
        ),
        plain_env(DEPRECATED_EXIT_CODE_ENV, "1".to_owned()),
    ];
    if !runner.spec.proxy_secret_ref.is_empty()
        && let Some(proxy) = &runner.spec.proxy
    {
        let proxy_secret = &runner.spec.proxy_secret_ref;
        if proxy.http.is_some() {
            env.push(secret_env(HTTP_PROXY_KEY, proxy_secret, HTTP_PROXY_KEY));
        }
        if proxy.https.is_some() {
            env.push(secret_env(HTTPS_PROXY_KEY, proxy_secret, HTTPS_PROXY_KEY));
        }
        if !proxy.no_proxy.is_empty() {
            env.push(secret_env(NO_PROXY_KEY, proxy_secret, NO_PROXY_KEY));
        }
    }
    env
}

/// Labels and annotations describing a runner's job.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JobMetadata {
    /// Label-safe values, for selection.
    pub labels: BTreeMap<String, String>,
    /// Exact values.
    pub annotations: BTreeMap<String, String>,
}

impl JobMetadata {
    /// A digest of the metadata, for [`super::memory::RunnerMemory::job_metadata_due`].
    pub fn digest(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (&self.labels, &self.annotations).hash(&mut hasher);
        hasher.finish()
    }

    /// Whether `pod` already carries all of it.
    pub fn is_on(&self, pod: &CachedPod) -> bool {
        let has_all = |wanted: &BTreeMap<String, String>,
                       have: Option<&BTreeMap<String, String>>| {
            wanted
                .iter()
                .all(|(key, value)| have.and_then(|have| have.get(key)) == Some(value))
        };
        has_all(&self.labels, pod.metadata.labels.as_ref())
            && has_all(&self.annotations, pod.metadata.annotations.as_ref())
    }
}

/// The job metadata of a runner status, or `None` while it has no job.
pub fn job_metadata(status: &EphemeralRunnerStatus) -> Option<JobMetadata> {
    if !status.has_job() {
        return None;
    }
    let mut metadata = JobMetadata::default();
    let mut both = |key: &str, value: String| {
        let label = sanitize_label_value(&value);
        if !label.is_empty() {
            metadata.labels.insert(key.to_owned(), label);
        }
        metadata.annotations.insert(key.to_owned(), value);
    };
    both(JOB_ID_KEY, status.job_id.clone());
    if status.workflow_run_id != 0 {
        both(WORKFLOW_RUN_ID_KEY, status.workflow_run_id.to_string());
    }
    let mut annotate = |key: &str, value: &str| {
        if !value.is_empty() {
            metadata
                .annotations
                .insert(key.to_owned(), value.to_owned());
        }
    };
    annotate(JOB_REPOSITORY_ANNOTATION, &status.job_repository_name);
    annotate(JOB_WORKFLOW_REF_ANNOTATION, &status.job_workflow_ref);
    annotate(JOB_DISPLAY_NAME_ANNOTATION, &status.job_display_name);
    let mut label = |key: &str, value: &str| {
        let value = sanitize_label_value(value);
        if !value.is_empty() {
            metadata.labels.insert(key.to_owned(), value);
        }
    };
    if let Some((owner, repository)) = status.job_repository_name.split_once('/') {
        label(JOB_REPOSITORY_OWNER_LABEL, owner);
        label(JOB_REPOSITORY_NAME_LABEL, repository);
    } else {
        label(JOB_REPOSITORY_NAME_LABEL, &status.job_repository_name);
    }
    label(JOB_WORKFLOW_LABEL, workflow_file(&status.job_workflow_ref));
    Some(metadata)
}

/// `ci.yml` from `owner/repo/.github/workflows/ci.yml@refs/heads/main`.
fn workflow_file(workflow_ref: &str) -> &str {
    let path = workflow_ref.split('@').next().unwrap_or_default();
    path.rsplit('/').next().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::EphemeralRunnerSpec;
    use crds::common::{ProxyConfig, ProxyServerConfig};
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "actions.github.com/v1alpha1".into(),
            kind: "EphemeralRunner".into(),
            name: "set-runner-abcde".into(),
            uid: "uid-1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn runner(containers: &[&str]) -> EphemeralRunner {
        let mut runner = EphemeralRunner::new(
            "set-runner-abcde",
            EphemeralRunnerSpec {
                github_config_url: "https://github.com/org".into(),
                github_config_secret: "creds".into(),
                runner_scale_set_id: 3,
                metadata: ObjectMeta {
                    labels: Some(
                        [
                            ("from".into(), "template".into()),
                            ("shared".into(), "template".into()),
                        ]
                        .into(),
                    ),
                    annotations: Some([("t".into(), "1".into())].into()),
                    ..ObjectMeta::default()
                }
                .into(),
                spec: PodSpec {
                    containers: containers
                        .iter()
                        .map(|name| Container {
                            name: (*name).to_owned(),
                            image: Some("runner:latest".into()),
                            env: Some(vec![plain_env("USER_VAR", "x".into())]),
                            ..Container::default()
                        })
                        .collect(),
                    ..PodSpec::default()
                }
                .into(),
                ..EphemeralRunnerSpec::default()
            },
        );
        runner.metadata.namespace = Some("ns".into());
        runner.metadata.labels = Some(
            [
                ("shared".into(), "runner".into()),
                ("er".into(), "1".into()),
            ]
            .into(),
        );
        runner.metadata.annotations =
            Some([("actions.github.com/patch-id".into(), "4".into())].into());
        runner
    }

    fn env_names(pod: &Pod, container: usize) -> Vec<String> {
        pod.spec.as_ref().unwrap().containers[container]
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|var| var.name.clone())
            .collect()
    }

    #[test]
    fn runner_containers_get_the_jit_env_after_the_users() {
        let pod = desired_pod(&runner(&["runner", "sidecar"]), owner(), "1.2.3").unwrap();
        assert_eq!(
            env_names(&pod, 0),
            [
                "USER_VAR",
                JIT_CONFIG_ENV,
                EXTRA_USER_AGENT_ENV,
                DEPRECATED_EXIT_CODE_ENV
            ]
        );
        assert_eq!(env_names(&pod, 1), ["USER_VAR"]);
        let env = &pod.spec.as_ref().unwrap().containers[0]
            .env
            .as_ref()
            .unwrap()[1];
        let selector = env
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(
            (selector.name.as_str(), selector.key.as_str()),
            ("set-runner-abcde", JIT_TOKEN_KEY)
        );
        let agent = &pod.spec.as_ref().unwrap().containers[0]
            .env
            .as_ref()
            .unwrap()[2];
        assert_eq!(
            agent.value.as_deref(),
            Some("actions-runner-controller/1.2.3")
        );
    }

    #[test]
    fn metadata_merges_template_over_runner() {
        let pod = desired_pod(&runner(&["runner"]), owner(), "v").unwrap();
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["shared"], "template");
        assert_eq!(labels["er"], "1");
        assert_eq!(labels["from"], "template");
        assert_eq!(labels[EPHEMERAL_RUNNER_LABEL], "True");
        assert!(!labels[POD_TEMPLATE_HASH_LABEL].is_empty());
        let annotations = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations["actions.github.com/patch-id"], "4");
        assert_eq!(annotations["t"], "1");
        assert_eq!(pod.metadata.name.as_deref(), Some("set-runner-abcde"));
        assert_eq!(pod.metadata.owner_references, Some(vec![owner()]));
    }

    #[test]
    fn proxy_env_comes_from_the_proxy_secret() {
        let mut runner = runner(&["runner"]);
        runner.spec.proxy = Some(ProxyConfig {
            http: Some(ProxyServerConfig {
                url: "http://proxy:3128".into(),
                ..ProxyServerConfig::default()
            }),
            https: None,
            no_proxy: vec!["example.com".into()],
        });
        // Without the Secret reference nothing is added.
        assert_eq!(
            env_names(&desired_pod(&runner, owner(), "v").unwrap(), 0).len(),
            4
        );
        runner.spec.proxy_secret_ref = "set-proxy".into();
        let pod = desired_pod(&runner, owner(), "v").unwrap();
        assert_eq!(
            env_names(&pod, 0)[4..],
            [HTTP_PROXY_KEY.to_owned(), NO_PROXY_KEY.to_owned()]
        );
    }

    #[test]
    fn a_template_without_runner_container_is_rejected() {
        assert_eq!(
            desired_pod(&runner(&["main"]), owner(), "v").unwrap_err(),
            PodTemplateProblem::NoRunnerContainer
        );
    }

    #[test]
    fn jit_secret_round_trips_the_identity() {
        let jit = actions_client::JitRunnerConfig {
            runner: Some(actions_client::RunnerReference {
                id: 42,
                name: "set-runner-abcde".into(),
                runner_scale_set_id: 3,
            }),
            encoded_jit_config: "ENCODED".into(),
        };
        let mut runner = runner(&["runner"]);
        runner.spec.ephemeral_runner_config_secret_metadata = Some(crds::common::ResourceMeta {
            labels: [
                ("keep".into(), "1".into()),
                ("drop.io/x".into(), "1".into()),
            ]
            .into(),
            annotations: BTreeMap::new(),
        });
        let secret = jit_secret(&runner, owner(), &jit, &["drop.io/".to_owned()]);
        let data = secret.data.as_ref().unwrap();
        assert_eq!(data[JIT_TOKEN_KEY].0, b"ENCODED");
        assert_eq!(data[SCALE_SET_ID_KEY].0, b"3");
        assert_eq!(
            secret.metadata.labels,
            Some([("keep".to_owned(), "1".to_owned())].into())
        );
        assert_eq!(
            read_jit_identity(&secret),
            Ok(JitIdentity {
                runner_id: 42,
                runner_name: "set-runner-abcde".into()
            })
        );
    }

    #[test]
    fn corrupt_jit_secrets_are_reported() {
        let mut secret = Secret::default();
        assert!(read_jit_identity(&secret).unwrap_err().contains("missing"));
        secret.data = Some([(RUNNER_ID_KEY.to_owned(), ByteString(b"abc".to_vec()))].into());
        assert!(
            read_jit_identity(&secret)
                .unwrap_err()
                .contains("not a positive integer")
        );
        secret.data = Some([(RUNNER_ID_KEY.to_owned(), ByteString(b"0".to_vec()))].into());
        assert!(read_jit_identity(&secret).is_err());
    }

    #[test]
    fn job_metadata_has_safe_labels_and_exact_annotations() {
        let mut status = EphemeralRunnerStatus::default();
        assert_eq!(job_metadata(&status), None);
        status.job_id = "8f3a-11".into();
        status.job_repository_name = "octo-org/hello world".into();
        status.job_workflow_ref = "octo-org/hello/.github/workflows/ci.yml@refs/heads/main".into();
        status.workflow_run_id = 123;
        status.job_display_name = "build (ubuntu)".into();
        let metadata = job_metadata(&status).unwrap();
        assert_eq!(metadata.labels[JOB_ID_KEY], "8f3a-11");
        assert_eq!(metadata.labels[WORKFLOW_RUN_ID_KEY], "123");
        assert_eq!(metadata.labels[JOB_REPOSITORY_OWNER_LABEL], "octo-org");
        assert_eq!(metadata.labels[JOB_REPOSITORY_NAME_LABEL], "hello_world");
        assert_eq!(metadata.labels[JOB_WORKFLOW_LABEL], "ci.yml");
        assert_eq!(
            metadata.annotations[JOB_REPOSITORY_ANNOTATION],
            "octo-org/hello world"
        );
        assert_eq!(
            metadata.annotations[JOB_DISPLAY_NAME_ANNOTATION],
            "build (ubuntu)"
        );
        let mut pod = CachedPod::default();
        assert!(!metadata.is_on(&pod));
        pod.metadata.labels = Some(metadata.labels.clone());
        pod.metadata.annotations = Some(metadata.annotations.clone());
        assert!(metadata.is_on(&pod));
    }

    proptest! {
        #[test]
        fn job_labels_are_always_valid(
            job_id in ".{1,80}",
            repository in ".{0,120}",
            workflow in ".{0,120}",
            run in any::<i64>(),
        ) {
            let status = EphemeralRunnerStatus {
                job_id,
                job_repository_name: repository,
                job_workflow_ref: workflow,
                workflow_run_id: run,
                ..EphemeralRunnerStatus::default()
            };
            let metadata = job_metadata(&status).unwrap();
            for value in metadata.labels.values() {
                prop_assert!(!value.is_empty() && value.len() <= 63);
                prop_assert!(value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')));
            }
        }

        #[test]
        fn every_runner_container_gets_the_env(names in proptest::collection::vec(prop_oneof!["runner", "side", "init"], 1..5)) {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let runner = runner(&names);
            match desired_pod(&runner, owner(), "v") {
                Ok(pod) => {
                    for container in &pod.spec.as_ref().unwrap().containers {
                        let has = container.env.as_ref().unwrap().iter().any(|var| var.name == JIT_CONFIG_ENV);
                        prop_assert_eq!(has, container.name == RUNNER_CONTAINER_NAME);
                    }
                }
                Err(_) => prop_assert!(!names.contains(&"runner")),
            }
        }
    }
}
