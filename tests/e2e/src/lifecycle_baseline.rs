//! The lifecycle baseline of `e2e-bench`: how fast this API server lets runners live and go when nothing decides
//! anything. A minimal driver takes each runner through the writes a runner's life costs in this design (docs/
//! benchmarks.md lists them), with no controller logic, no Actions Service and no waiting for watch events, while
//! the same watches as in a measured run are open (the manager's on runners, runner pods and listener pods, the
//! simulated kubelet's on runner pods, the bench's own on runners), so every write pays the watch fan-out it pays
//! there. The benchmark reports its throughput as a fraction of this, and its burst → pods against this one's.
//!
//! One runner, in order: EphemeralRunner POST (with both finalizers), JIT Secret POST, pod POST; the kubelet's
//! read of the Secret and its pod status `Running`, the runner's status `Running` with its identity, the
//! listener's job fields, the job metadata on the pod; the kubelet's pod status `Succeeded`; then the runner's
//! DELETE, the pod's and the Secret's, and the finalizers' removal: 13 writes and the kubelet's one read.

use std::time::{Duration, Instant};

use crds::EphemeralRunner;
use crds::constants::{
    COMPONENT_LABEL, COMPONENT_LISTENER, EPHEMERAL_RUNNER_FINALIZER, EPHEMERAL_RUNNER_LABEL,
    EPHEMERAL_RUNNER_LABEL_VALUE, EPHEMERAL_RUNNER_REGISTRATION_FINALIZER,
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde::Serialize;
use serde_json::json;

use crate::simulator::{running_status, terminated_status};
use crate::{Error, Result};

/// Writes of one runner's life in the baseline.
pub const WRITES_PER_RUNNER: usize = 13;

/// The objects every baseline runner is a copy of. From a measured run: its first runner, pod and JIT Secret as
/// the API server gave them (the user's template in the runner's spec, the pod the manager builds from it, the
/// service's JIT config), so each write in the baseline costs what it costs in the run: a CRD status write
/// decodes, validates and fans out the whole runner. Stripped of what the API server or the run added (identity,
/// owners, status, managed fields, the service-account token volume admission adds again), renamed per copy.
#[derive(Debug, Clone)]
pub struct Sample {
    runner: serde_json::Value,
    secret: serde_json::Value,
    pod: serde_json::Value,
    /// The name in the sampled objects (runner, Secret and pod share it), replaced by each copy's own.
    name: String,
    /// Whether the objects came from a measured run (or are [`Sample::minimal`]).
    pub from_run: bool,
}

impl Sample {
    /// Objects as small as a scale set makes them (no run to copy).
    pub fn minimal() -> serde_json::Result<Self> {
        let (runner, secret, pod) = sample_objects("x")?;
        Ok(Self {
            runner: serde_json::to_value(runner)?,
            secret: serde_json::to_value(secret)?,
            pod: serde_json::to_value(pod)?,
            name: "x".to_owned(),
            from_run: false,
        })
    }

    /// The objects of one runner of a measured run.
    pub fn from_run(
        runner: &EphemeralRunner,
        pod: &Pod,
        secret: &Secret,
    ) -> serde_json::Result<Self> {
        let name = runner.metadata.name.clone().unwrap_or_default();
        let mut pod = serde_json::to_value(pod)?;
        strip_token_volume(&mut pod["spec"]);
        if let Some(spec) = pod["spec"].as_object_mut() {
            // Set by the scheduler, and by admission from the priority class (which refuses a pod that brings
            // its own).
            for field in ["nodeName", "priority"] {
                spec.remove(field);
            }
        }
        Ok(Self {
            runner: serde_json::to_value(runner)?,
            secret: serde_json::to_value(secret)?,
            pod,
            name,
            from_run: true,
        })
    }

    /// Copies named `name`, ready to create.
    pub fn copies(&self, name: &str) -> serde_json::Result<(EphemeralRunner, Secret, Pod)> {
        let copy = |object: &serde_json::Value| {
            let mut object = object.clone();
            rename(&mut object, &self.name, name);
            if let Some(fields) = object.as_object_mut() {
                fields.remove("status");
            }
            let meta = &object["metadata"];
            let kept = json!({
                "name": name,
                "labels": meta.get("labels"),
                "annotations": meta.get("annotations"),
            });
            object["metadata"] = kept;
            object
        };
        Ok((
            serde_json::from_value(copy(&self.runner))?,
            serde_json::from_value(copy(&self.secret))?,
            serde_json::from_value(copy(&self.pod))?,
        ))
    }

    /// The service account the pod runs as, unless it is the namespace's `default` (which every namespace has).
    fn service_account(&self) -> Option<&str> {
        self.pod["spec"]["serviceAccountName"]
            .as_str()
            .filter(|account| *account != "default")
    }

    /// Sizes in bytes of a copy's JSON: runner, Secret, pod.
    pub fn sizes(&self) -> serde_json::Result<[usize; 3]> {
        let (runner, secret, pod) = self.copies(&self.name)?;
        Ok([
            serde_json::to_vec(&runner)?.len(),
            serde_json::to_vec(&secret)?.len(),
            serde_json::to_vec(&pod)?.len(),
        ])
    }
}

/// Replaces every string equal to `from` in `value` with `to`.
fn rename(value: &mut serde_json::Value, from: &str, to: &str) {
    match value {
        serde_json::Value::String(s) if s == from => *s = to.to_owned(),
        serde_json::Value::Array(items) => items.iter_mut().for_each(|v| rename(v, from, to)),
        serde_json::Value::Object(fields) => fields.values_mut().for_each(|v| rename(v, from, to)),
        _ => {}
    }
}

/// Removes the service-account token volume (and its mounts) the API server's admission added to a pod spec:
/// creating the copy adds it again.
fn strip_token_volume(spec: &mut serde_json::Value) {
    const PREFIX: &str = "kube-api-access-";
    let is_token = |v: &serde_json::Value| {
        v["name"]
            .as_str()
            .is_some_and(|name| name.starts_with(PREFIX))
    };
    if let Some(volumes) = spec["volumes"].as_array_mut() {
        volumes.retain(|v| !is_token(v));
    }
    for containers in ["initContainers", "containers"] {
        for container in spec[containers].as_array_mut().into_iter().flatten() {
            if let Some(mounts) = container["volumeMounts"].as_array_mut() {
                mounts.retain(|m| !is_token(m));
            }
        }
    }
}

/// What the lifecycle baseline measured.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleBaseline {
    /// Runners taken through their whole life.
    pub runners: usize,
    /// Runners in flight at once.
    pub concurrency: usize,
    /// Writes in all.
    pub writes: usize,
    /// From the first write to the last runner gone.
    pub secs: f64,
    /// Runners per second over the whole run.
    pub runners_per_sec: f64,
    /// From the first write until every runner's pod had been created.
    pub all_pods_secs: f64,
    /// Whether the runners were copies of the measured run's objects ([`Sample`]).
    pub objects_from_run: bool,
    /// Sizes in bytes of each runner's, Secret's and pod's JSON as created.
    pub object_bytes: [usize; 3],
    /// Every concurrency tried ([`fastest`]); the figures above are the fastest's, but for `all_pods_secs`, the
    /// shortest of all.
    pub tried: Vec<LifecycleTry>,
}

/// One concurrency the baseline tried.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleTry {
    pub concurrency: usize,
    pub runners_per_sec: f64,
    pub all_pods_secs: f64,
}

/// Runners in flight at once in the baseline's tries. As fast as possible is not as many at once as possible: on
/// a small control plane, more requests in flight queue in the API server (the run's own client keeps 8 in
/// flight), and a baseline that queues would set the bar below what the server can do.
pub const CONCURRENCIES: [usize; 3] = [16, 32, 64];

/// The baseline at each of [`CONCURRENCIES`], one after the other in `namespace`: the fastest.
pub async fn fastest(
    client: &Client,
    namespace: &str,
    runners: usize,
    sample: &Sample,
) -> Result<LifecycleBaseline> {
    // The pods run as the run's did: as the scale set's service account (the chart's no-permission one), which
    // admission looks up for every pod.
    if let Some(account) = sample.service_account() {
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
        let object: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": account}}))
            .map_err(|e| Error::Invariant(format!("a service account: {e}")))?;
        accounts.create(&PostParams::default(), &object).await?;
    }
    let mut tries = Vec::new();
    for (n, concurrency) in CONCURRENCIES.into_iter().enumerate() {
        tries.push(
            run(
                client,
                namespace,
                &format!("life-{n}"),
                runners,
                concurrency,
                sample,
            )
            .await?,
        );
    }
    let all_pods_secs = tries
        .iter()
        .map(|t| t.all_pods_secs)
        .fold(f64::INFINITY, f64::min);
    let tried = tries
        .iter()
        .map(|t| LifecycleTry {
            concurrency: t.concurrency,
            runners_per_sec: t.runners_per_sec,
            all_pods_secs: t.all_pods_secs,
        })
        .collect();
    let mut best = tries
        .into_iter()
        .max_by(|a, b| a.runners_per_sec.total_cmp(&b.runners_per_sec))
        .unwrap_or_default();
    best.all_pods_secs = all_pods_secs;
    best.tried = tried;
    Ok(best)
}

/// Takes `runners` runners (named `prefix-N`) through their life in `namespace`, `concurrency` at a time, with
/// the run's watches open.
async fn run(
    client: &Client,
    namespace: &str,
    prefix: &str,
    runners: usize,
    concurrency: usize,
    sample: &Sample,
) -> Result<LifecycleBaseline> {
    let runner_api: Api<EphemeralRunner> = Api::namespaced(client.clone(), namespace);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let secret_api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let runner_pods = watcher::Config::default().labels(&format!(
        "{EPHEMERAL_RUNNER_LABEL}={EPHEMERAL_RUNNER_LABEL_VALUE}"
    ));
    let listener_pods =
        watcher::Config::default().labels(&format!("{COMPONENT_LABEL}={COMPONENT_LISTENER}"));
    let watches = [
        // The manager's.
        tokio::spawn(drain(watcher(
            runner_api.clone(),
            watcher::Config::default(),
        ))),
        tokio::spawn(drain(watcher(pod_api.clone(), runner_pods.clone()))),
        tokio::spawn(drain(watcher(pod_api.clone(), listener_pods))),
        // The simulated kubelet's.
        tokio::spawn(drain(watcher(pod_api.clone(), runner_pods))),
        // The bench's own ([`crate::bench`] follows every runner).
        tokio::spawn(drain(watcher(
            runner_api.clone(),
            watcher::Config::default(),
        ))),
    ];
    // Every runner's objects, made before the clock starts (the driver's own work is not the API server's).
    let copies = (0..runners)
        .map(|i| sample.copies(&format!("{prefix}-{i}")))
        .collect::<serde_json::Result<Vec<_>>>()
        .map_err(|e| Error::Invariant(format!("a baseline object: {e}")))?;
    // Let the watches list before the first write.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let started = Instant::now();
    let pods_created = std::sync::atomic::AtomicUsize::new(0);
    let all_pods_at = std::sync::Mutex::new(None::<Duration>);
    let apis = (&runner_api, &pod_api, &secret_api);
    let outcome: std::result::Result<Vec<()>, kube::Error> = stream::iter(copies)
        .map(|objects| {
            let (pods_created, all_pods_at) = (&pods_created, &all_pods_at);
            async move {
                let pod_created = || {
                    let n = pods_created.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    if n == runners {
                        *all_pods_at.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some(started.elapsed());
                    }
                };
                one_life(apis, objects, pod_created).await
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect()
        .await;
    let secs = started.elapsed().as_secs_f64();
    for watch in watches {
        watch.abort();
    }
    outcome.map_err(|e| Error::Invariant(format!("a lifecycle baseline write failed: {e}")))?;
    let all_pods_secs = all_pods_at
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .map_or(secs, |at| at.as_secs_f64());
    Ok(LifecycleBaseline {
        runners,
        concurrency,
        writes: runners * WRITES_PER_RUNNER,
        secs,
        runners_per_sec: runners as f64 / secs.max(1e-3),
        all_pods_secs,
        tried: Vec::new(),
        objects_from_run: sample.from_run,
        object_bytes: sample
            .sizes()
            .map_err(|e| Error::Invariant(format!("a baseline object: {e}")))?,
    })
}

/// Reads a watch to its end (it ends when aborted), as a controller's reflector would.
async fn drain<S, K>(stream: S)
where
    S: futures::Stream<Item = std::result::Result<watcher::Event<K>, watcher::Error>>,
{
    futures::pin_mut!(stream);
    while stream.next().await.is_some() {}
}

/// One runner's 13 writes, each after the one before.
async fn one_life(
    (runners, pods, secrets): (&Api<EphemeralRunner>, &Api<Pod>, &Api<Secret>),
    (mut runner, secret, pod): (EphemeralRunner, Secret, Pod),
    pod_created: impl Fn(),
) -> std::result::Result<(), kube::Error> {
    let post = PostParams::default();
    let merge = PatchParams::default();
    let name = runner.metadata.name.clone().unwrap_or_default();
    let name = name.as_str();
    runner.metadata.finalizers = Some(vec![
        EPHEMERAL_RUNNER_FINALIZER.to_owned(),
        EPHEMERAL_RUNNER_REGISTRATION_FINALIZER.to_owned(),
    ]);
    runners.create(&post, &runner).await?;
    secrets.create(&post, &secret).await?;
    pods.create(&post, &pod).await?;
    pod_created();
    let status = |fields: serde_json::Value| Patch::Merge(json!({ "status": fields }));
    // The kubelet reads the Secret for the runner container's environment before it starts it.
    secrets.get(name).await?;
    pods.patch_status(name, &merge, &Patch::Merge(running_status()))
        .await?;
    runners
        .patch_status(
            name,
            &merge,
            &status(json!({"phase": "Running", "ready": true, "runnerId": 1, "runnerName": name})),
        )
        .await?;
    runners
        .patch_status(
            name,
            &merge,
            &status(json!({"jobRequestId": 1, "jobRepositoryName": "bench/bench", "jobId": "1"})),
        )
        .await?;
    pods.patch(
        name,
        &merge,
        &Patch::Merge(json!({"metadata": {
            "labels": {"actions.github.com/job-id": "1"},
            "annotations": {"actions.github.com/job-repository": "bench/bench"},
        }})),
    )
    .await?;
    pods.patch_status(
        name,
        &merge,
        &Patch::Merge(terminated_status(0, "Completed", "runner exited")),
    )
    .await?;
    runners.delete(name, &DeleteParams::default()).await?;
    pods.delete(name, &DeleteParams::default().grace_period(0))
        .await?;
    secrets.delete(name, &DeleteParams::default()).await?;
    runners
        .patch(
            name,
            &merge,
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    Ok(())
}

/// A runner named `name` as small as a scale set makes one, its JIT Secret and its pod: what both baselines write
/// (this one and the raw write rate in [`crate::bench`]).
pub(crate) fn sample_objects(name: &str) -> serde_json::Result<(EphemeralRunner, Secret, Pod)> {
    let runner = serde_json::from_value(json!({
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "EphemeralRunner",
        "metadata": {"name": name},
        "spec": {
            "githubConfigUrl": "https://github.com/bench",
            "githubConfigSecret": "bench",
            "runnerScaleSetId": 1,
            "spec": {"containers": [{"name": "runner", "image": "runner"}]},
        },
    }))?;
    let secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": {"jitToken": "x".repeat(1500), "runnerId": "1"},
    }))?;
    let pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {EPHEMERAL_RUNNER_LABEL: EPHEMERAL_RUNNER_LABEL_VALUE}},
        "spec": {"containers": [{"name": "runner", "image": "runner"}]},
    }))?;
    Ok((runner, secret, pod))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_of_a_runs_objects_keeps_their_content_under_its_own_name_and_nothing_the_server_added()
     {
        let runner: EphemeralRunner = serde_json::from_value(json!({
            "apiVersion": "actions.github.com/v1alpha1",
            "kind": "EphemeralRunner",
            "metadata": {
                "name": "set-abc", "namespace": "ns", "uid": "u1", "resourceVersion": "9",
                "labels": {"app": "a"}, "annotations": {"note": "n"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "EphemeralRunnerSet", "name": "set", "uid": "u0"}],
                "managedFields": [{"manager": "m"}],
                "finalizers": ["f"],
            },
            "spec": {
                "githubConfigUrl": "https://github.com/o",
                "githubConfigSecret": "s",
                "runnerScaleSetId": 1,
                "spec": {"containers": [{"name": "runner", "image": "big"}]},
            },
            "status": {"phase": "Running", "runnerId": 5},
        }))
        .expect("runner");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "set-abc", "uid": "u2", "labels": {EPHEMERAL_RUNNER_LABEL: EPHEMERAL_RUNNER_LABEL_VALUE}},
            "spec": {
                "nodeName": "n1",
                "containers": [{
                    "name": "runner", "image": "big",
                    "env": [{"name": "JIT", "valueFrom": {"secretKeyRef": {"name": "set-abc", "key": "jitToken"}}}],
                    "volumeMounts": [{"name": "work", "mountPath": "/w"}, {"name": "kube-api-access-x1", "mountPath": "/t"}],
                }],
                "volumes": [{"name": "work", "emptyDir": {}}, {"name": "kube-api-access-x1", "projected": {"sources": []}}],
            },
            "status": {"phase": "Running"},
        }))
        .expect("pod");
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "set-abc", "uid": "u3"},
            "data": {"jitToken": "YWJj"},
        }))
        .expect("secret");

        let sample = Sample::from_run(&runner, &pod, &secret).expect("sample");
        assert!(sample.from_run);
        let (runner, secret, pod) = sample.copies("life-7").expect("copies");

        for meta in [&runner.metadata, &secret.metadata, &pod.metadata] {
            assert_eq!(meta.name.as_deref(), Some("life-7"));
            assert!(
                meta.uid.is_none() && meta.resource_version.is_none() && meta.namespace.is_none()
            );
            assert!(
                meta.owner_references.is_none()
                    && meta.managed_fields.is_none()
                    && meta.finalizers.is_none()
            );
        }
        assert!(runner.status.is_none() && pod.status.is_none());
        assert_eq!(
            runner
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .map(String::as_str),
            Some("a")
        );
        assert_eq!(runner.spec.spec.containers[0].image.as_deref(), Some("big"));
        let spec = pod.spec.expect("pod spec");
        assert!(spec.node_name.is_none());
        let names = |v: &[String]| v.to_vec();
        assert_eq!(
            names(
                &spec
                    .volumes
                    .unwrap_or_default()
                    .into_iter()
                    .map(|v| v.name)
                    .collect::<Vec<_>>()
            ),
            ["work"]
        );
        let container = &spec.containers[0];
        assert_eq!(container.volume_mounts.as_ref().map(Vec::len), Some(1));
        let secret_ref = container
            .env
            .as_ref()
            .and_then(|env| env[0].value_from.as_ref())
            .and_then(|from| from.secret_key_ref.as_ref())
            .map(|r| r.name.clone());
        assert_eq!(
            secret_ref.as_deref(),
            Some("life-7"),
            "the env points at the copy's own Secret"
        );
        assert!(
            secret
                .data
                .is_some_and(|data| data.contains_key("jitToken"))
        );
    }

    #[test]
    fn the_minimal_sample_makes_copies_too() {
        let sample = Sample::minimal().expect("sample");
        assert!(!sample.from_run);
        let (runner, _, pod) = sample.copies("life-0").expect("copies");
        assert_eq!(runner.metadata.name.as_deref(), Some("life-0"));
        assert_eq!(pod.metadata.name.as_deref(), Some("life-0"));
    }
}
