//! The EphemeralRunner controller (docs/reference/controllers.md, "EphemeralRunner controller"): one runner pod per EphemeralRunner, its JIT config Secret, and
//! the runner's registration in the Actions Service.
//!
//! Wiring: primary EphemeralRunners from the manager's shared runner watch; owned runner pods from the shared
//! pod watch; pod deletions (which shared watches do not forward) through `reconcile_on`.

pub mod lifecycle;
pub mod pod;
pub mod policy;
mod reconcile;

use std::future::Future;
use std::sync::Arc;

use crds::EphemeralRunner;
use crds::constants::{CONTAINER_HOOKS_ENV, RUNNER_CONTAINER_NAME};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::ObjectRef;

pub use reconcile::{POD_DELETED_EVENT, POD_DELETED_REASON};

/// What the cache keeps of an EphemeralRunner: everything but its pod template, which only registering and
/// creating the pod read, from a copy read from the API server just before (the fence in front of every
/// registration). The template is most of a runner (containers, volumes, sidecars), and the cache holds every
/// runner for as long as it lives. Of the template stays only whether the runner container uses container hooks,
/// which teardown reads.
pub fn prune_cached_runner(runner: &mut EphemeralRunner) {
    let hooks = runner.has_container_hooks();
    let spec = &mut runner.spec;
    spec.metadata = Default::default();
    spec.ephemeral_runner_config_secret_metadata = None;
    spec.spec = Default::default();
    if hooks {
        spec.spec.containers = vec![Container {
            name: RUNNER_CONTAINER_NAME.to_owned(),
            env: Some(vec![EnvVar {
                name: CONTAINER_HOOKS_ENV.to_owned(),
                ..EnvVar::default()
            }]),
            ..Container::default()
        }];
    }
}

use crate::context::{Context, ErrorRequeue};
use crate::error::Error;

/// Controller name in metrics and logs (ARC's).
pub const CONTROLLER: &str = "ephemeralrunner";

async fn reconcile(runner: Arc<EphemeralRunner>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.instrumented(
        CONTROLLER,
        runner.as_ref(),
        reconcile::reconcile(Arc::clone(&runner), Arc::clone(&ctx)),
    )
    .await
}

fn error_policy(runner: Arc<EphemeralRunner>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.requeue_after_error(CONTROLLER, runner.as_ref(), error, ErrorRequeue::Backoff)
}

/// Controller name of the teardown lane in metrics and logs.
pub const TEARDOWN_CONTROLLER: &str = "ephemeralrunner-teardown";

async fn teardown(runner: Arc<EphemeralRunner>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.instrumented(
        TEARDOWN_CONTROLLER,
        runner.as_ref(),
        reconcile::teardown(Arc::clone(&runner), Arc::clone(&ctx)),
    )
    .await
}

fn teardown_error_policy(runner: Arc<EphemeralRunner>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.requeue_after_error(
        TEARDOWN_CONTROLLER,
        runner.as_ref(),
        error,
        ErrorRequeue::Backoff,
    )
}

/// Runs the teardown lane until `shutdown` resolves: runners being deleted, and runners whose pod succeeded, are
/// deregistered, their pod and Secret deleted and their finalizers dropped here, with a queue, a concurrency
/// and (in the binary) a client rate limit of their own. In one queue with the runners being created, a finished
/// runner waited behind the whole burst (p99 of 21 s from job finished to runner gone in a 500-job burst).
/// [`reconcile::reconcile`] leaves exactly these runners alone, so each effect has one owner.
pub async fn run_teardown(
    ctx: Arc<Context>,
    runners: impl Stream<Item = Arc<EphemeralRunner>> + Send + 'static,
    pods: impl Stream<Item = Arc<Pod>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let config = Config::default().concurrency(ctx.options.runner_teardown_concurrency);
    Controller::for_shared_stream(runners, ctx.stores.runners.clone())
        .owns_shared_stream(pods)
        .with_config(config)
        .graceful_shutdown_on(shutdown)
        .run(teardown, teardown_error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "ephemeral runner teardown event");
            }
        })
        .await;
}

/// Runs the controller until `shutdown` resolves and in-flight reconciles finish.
pub async fn run(
    ctx: Arc<Context>,
    runners: impl Stream<Item = Arc<EphemeralRunner>> + Send + 'static,
    pods: impl Stream<Item = Arc<Pod>> + Send + 'static,
    pod_deletions: impl Stream<Item = ObjectRef<EphemeralRunner>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let config = Config::default().concurrency(ctx.options.runner_concurrency);
    Controller::for_shared_stream(runners, ctx.stores.runners.clone())
        .owns_shared_stream(pods)
        .reconcile_on(pod_deletions)
        .with_config(config)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "ephemeral runner controller event");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::EphemeralRunnerSpec;
    use crds::common::ResourceMeta;
    use k8s_openapi::api::core::v1::{PodSpec, Volume};
    use kube::api::ObjectMeta;

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
                },
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
                },
                ..EphemeralRunnerSpec::default()
            },
        );
        runner.metadata.namespace = Some("ns".to_owned());
        runner
    }

    #[test]
    fn the_cache_keeps_what_decisions_read_and_no_template() {
        for env in [&["A"][..], &["A", CONTAINER_HOOKS_ENV][..]] {
            let full = runner(env);
            let mut cached = full.clone();
            prune_cached_runner(&mut cached);
            assert_eq!(cached.has_container_hooks(), full.has_container_hooks());
            assert_eq!(cached.metadata, full.metadata);
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
}
