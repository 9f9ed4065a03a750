//! The lifecycle baseline of `e2e-bench`: how fast this API server lets runners live and go when nothing decides
//! anything. A minimal driver takes each runner through the writes a runner's life costs in this design (docs/
//! benchmarks.md lists them), with no controller logic, no Actions Service and no waiting for watch events, while
//! two watches (runners and pods) stand in for the manager's, so every write pays its watch fan-out as in a real
//! run. The benchmark reports its throughput as a fraction of this, and its burst → pods against this one's.
//!
//! One runner, in order: EphemeralRunner POST (with both finalizers), JIT Secret POST, pod POST, the runner's
//! status with its identity and `Pending`; the kubelet's pod status `Running`, the runner's status `Running`, the
//! listener's job fields, the job metadata on the pod; the kubelet's pod status `Succeeded`; then the runner's
//! DELETE, the pod's and the Secret's, and the finalizers' removal: 14 writes.

use std::time::{Duration, Instant};

use crds::EphemeralRunner;
use crds::constants::{EPHEMERAL_RUNNER_FINALIZER, EPHEMERAL_RUNNER_REGISTRATION_FINALIZER};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde::Serialize;
use serde_json::json;

use crate::simulator::{running_status, terminated_status};
use crate::{Error, Result};

/// Writes of one runner's life in the baseline.
pub const WRITES_PER_RUNNER: usize = 14;

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
}

/// Takes `runners` runners through their life in `namespace`, `concurrency` at a time, with two watches open.
pub async fn run(
    client: &Client,
    namespace: &str,
    runners: usize,
    concurrency: usize,
) -> Result<LifecycleBaseline> {
    let runner_api: Api<EphemeralRunner> = Api::namespaced(client.clone(), namespace);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let secret_api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let watches = [
        tokio::spawn(drain(watcher(
            runner_api.clone(),
            watcher::Config::default(),
        ))),
        tokio::spawn(drain(watcher(pod_api.clone(), watcher::Config::default()))),
    ];
    // Let both watches list before the first write.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let started = Instant::now();
    let pods_created = std::sync::atomic::AtomicUsize::new(0);
    let all_pods_at = std::sync::Mutex::new(None::<Duration>);
    let apis = (&runner_api, &pod_api, &secret_api);
    let outcome: std::result::Result<Vec<()>, kube::Error> = stream::iter(0..runners)
        .map(|i| {
            let (pods_created, all_pods_at) = (&pods_created, &all_pods_at);
            async move {
                let name = format!("life-{i}");
                let pod_created = || {
                    let n = pods_created.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    if n == runners {
                        *all_pods_at.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some(started.elapsed());
                    }
                };
                one_life(apis, &name, pod_created).await
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect()
        .await;
    let secs = started.elapsed().as_secs_f64();
    for watch in watches {
        watch.abort();
    }
    outcome.map_err(Error::from)?;
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

/// One runner's 14 writes, each after the one before.
async fn one_life(
    (runners, pods, secrets): (&Api<EphemeralRunner>, &Api<Pod>, &Api<Secret>),
    name: &str,
    pod_created: impl Fn(),
) -> std::result::Result<(), kube::Error> {
    let post = PostParams::default();
    let merge = PatchParams::default();
    let (mut runner, secret, pod) = sample_objects(name).map_err(kube::Error::SerdeError)?;
    runner.metadata.finalizers = Some(vec![
        EPHEMERAL_RUNNER_FINALIZER.to_owned(),
        EPHEMERAL_RUNNER_REGISTRATION_FINALIZER.to_owned(),
    ]);
    runners.create(&post, &runner).await?;
    secrets.create(&post, &secret).await?;
    pods.create(&post, &pod).await?;
    pod_created();
    let status = |fields: serde_json::Value| Patch::Merge(json!({ "status": fields }));
    runners
        .patch_status(
            name,
            &merge,
            &status(json!({"phase": "Pending", "runnerId": 1, "runnerName": name})),
        )
        .await?;
    pods.patch_status(name, &merge, &Patch::Merge(running_status()))
        .await?;
    runners
        .patch_status(
            name,
            &merge,
            &status(json!({"phase": "Running", "ready": true})),
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
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "runner", "image": "runner"}]},
    }))?;
    Ok((runner, secret, pod))
}
