//! Set-up of the AutoscalingRunnerSet / AutoscalingListener integration tests: a real control plane, the fake
//! Actions Service, a scale set namespace and a controller namespace, and the manager running in-process.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use controller::{Manager, Options};
use crds::{
    AutoscalingListener, AutoscalingRunnerSet, AutoscalingRunnerSetSpec, EphemeralRunnerSet,
};
use fake_actions_service::FakeActionsService;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Container, Event, Pod, PodSpec, PodTemplateSpec, Secret, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use prometheus_client::registry::Registry;
use test_harness::TestContext;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Name of the GitHub credentials Secret the tests create.
pub const CREDENTIALS: &str = "github-credentials";
/// How long a test waits for a condition before failing.
pub const WAIT: Duration = Duration::from_secs(90);

/// One test's world.
pub struct Env {
    pub ctx: TestContext,
    /// Where listeners live.
    pub controller_namespace: String,
    pub fake: FakeActionsService,
    pub config_url: String,
}

/// A manager running in this process.
pub struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<controller::Result<()>>,
    pub registry: Arc<Registry>,
    /// What its `/metrics` shows (the listeners' metrics too, in the manager's listener mode).
    pub exposition: controller::server::Exposition,
}

impl Running {
    /// Graceful stop: in-flight reconciles finish.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task
            .await
            .expect("manager task")
            .expect("manager result");
    }

    /// Reconcile errors of a controller so far (from the manager's metrics).
    pub fn reconcile_errors(&self, controller: &str) -> u64 {
        let text = controller::metrics::encode(&self.registry);
        text.lines()
            .filter(|line| {
                line.starts_with("controller_runtime_reconcile_errors_total{")
                    && line.contains(&format!("controller=\"{controller}\""))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Reconciles of a controller so far.
    pub fn reconciles(&self, controller: &str) -> u64 {
        let text = controller::metrics::encode(&self.registry);
        text.lines()
            .filter(|line| {
                line.starts_with("controller_runtime_reconcile_total{")
                    && line.contains(&format!("controller=\"{controller}\""))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }
}

impl Env {
    pub async fn new(prefix: &str) -> Self {
        Self::with_fake(
            prefix,
            fake_actions_service::Config {
                runner_groups: vec!["gpu".to_owned()],
                ..fake_actions_service::Config::default()
            },
        )
        .await
    }

    /// A world whose fake Actions Service runs with `fake` (short long polls, for one).
    pub async fn with_fake(prefix: &str, fake: fake_actions_service::Config) -> Self {
        let ctx = TestContext::new(prefix).await;
        test_harness::apply_crds(&ctx.client, &crds::all_crds())
            .await
            .expect("install CRDs");
        let controller_namespace = test_harness::create_namespace(&ctx.client, "arc-system")
            .await
            .expect("controller namespace");
        let fake = FakeActionsService::start(fake)
            .await
            .expect("start the fake Actions Service");
        let config_url = format!("{}/org/repo", fake.base_url());
        let env = Self {
            ctx,
            controller_namespace,
            fake,
            config_url,
        };
        env.put_credentials(b"ghp_test").await;
        env
    }

    pub fn client(&self) -> Client {
        self.ctx.client.clone()
    }

    /// Creates or replaces the credentials Secret with this token.
    pub async fn put_credentials(&self, token: &[u8]) {
        self.put_secret_data(&[("github_token", token)]).await;
    }

    /// Creates or replaces the credentials Secret with exactly this data.
    pub async fn put_secret_data(&self, data: &[(&str, &[u8])]) {
        let secrets: Api<Secret> = self.ctx.api();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(CREDENTIALS.to_owned()),
                ..ObjectMeta::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        };
        match secrets.get_opt(CREDENTIALS).await.expect("get secret") {
            Some(_) => {
                secrets
                    .replace(CREDENTIALS, &PostParams::default(), &secret)
                    .await
                    .expect("replace the credentials Secret");
            }
            None => {
                secrets
                    .create(&PostParams::default(), &secret)
                    .await
                    .expect("create the credentials Secret");
            }
        }
    }

    /// Options with short delays.
    pub fn options(&self) -> Options {
        let mut options = Options {
            watch_namespace: Some(self.ctx.namespace.clone()),
            build_version: "dev".to_owned(),
            actions_call_timeout: Duration::from_secs(10),
            resync_interval: Duration::from_secs(5),
            error_backoff_min: Duration::from_millis(200),
            error_backoff_max: Duration::from_secs(2),
            scale_set_check_interval: Duration::from_secs(2),
            configuration_error_backoff: Duration::from_secs(5),
            ..Options::default()
        };
        options.listener.namespace = Some(self.controller_namespace.clone());
        options.listener.image = "ghcr.io/example/arc-rs:test".to_owned();
        options.listener.log_level = "debug".to_owned();
        // The manager's listener mode: its loops report every 2 s rather than every 30 s.
        options.listener.loop_settings.status_heartbeat = Duration::from_secs(2);
        options.runner.failure_backoff_base = Duration::from_millis(100);
        options.scale_down.ready_grace_period = Duration::ZERO;
        options
    }

    /// Runs the listener pods of this test's controller namespace as the real listener binary.
    pub fn listener_executor(&self) -> test_harness::ListenerExecutor {
        let binary =
            test_harness::workspace_binary("listener", "listener").expect("listener binary");
        test_harness::ListenerExecutor::start(
            self.ctx.control_plane,
            self.client(),
            Some(&self.controller_namespace),
            binary,
        )
        .expect("listener executor")
    }

    pub fn start(&self, options: Options) -> Running {
        let shutdown = CancellationToken::new();
        let manager = Manager::new(self.ctx.client.clone(), options);
        let registry = manager.registry();
        let exposition = manager.exposition();
        let task = tokio::spawn(manager.run(shutdown.clone()));
        Running {
            shutdown,
            task,
            registry,
            exposition,
        }
    }

    pub fn runner_set_spec(&self) -> AutoscalingRunnerSetSpec {
        AutoscalingRunnerSetSpec {
            github_config_url: self.config_url.clone(),
            github_config_secret: CREDENTIALS.to_owned(),
            max_runners: Some(3),
            min_runners: Some(0),
            template: PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "runner".to_owned(),
                        image: Some("ghcr.io/actions/actions-runner:latest".to_owned()),
                        ..Container::default()
                    }],
                    restart_policy: Some("Never".to_owned()),
                    ..PodSpec::default()
                }),
            },
            ..AutoscalingRunnerSetSpec::default()
        }
    }

    pub async fn create_runner_set(
        &self,
        name: &str,
        spec: AutoscalingRunnerSetSpec,
    ) -> AutoscalingRunnerSet {
        self.runner_sets()
            .create(
                &PostParams::default(),
                &AutoscalingRunnerSet::new(name, spec),
            )
            .await
            .expect("create the AutoscalingRunnerSet")
    }

    pub fn runner_sets(&self) -> Api<AutoscalingRunnerSet> {
        self.ctx.api()
    }

    pub fn ephemeral_runner_sets(&self) -> Api<EphemeralRunnerSet> {
        self.ctx.api()
    }

    pub fn listeners(&self) -> Api<AutoscalingListener> {
        Api::namespaced(self.client(), &self.controller_namespace)
    }

    pub fn controller_pods(&self) -> Api<Pod> {
        Api::namespaced(self.client(), &self.controller_namespace)
    }

    pub fn controller_secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client(), &self.controller_namespace)
    }

    pub fn controller_accounts(&self) -> Api<ServiceAccount> {
        Api::namespaced(self.client(), &self.controller_namespace)
    }

    pub fn roles(&self) -> Api<Role> {
        self.ctx.api()
    }

    pub fn role_bindings(&self) -> Api<RoleBinding> {
        self.ctx.api()
    }

    /// The set, read now.
    pub async fn runner_set(&self, name: &str) -> Option<AutoscalingRunnerSet> {
        self.runner_sets().get_opt(name).await.expect("get ARS")
    }

    /// A condition of a set.
    pub async fn condition(&self, name: &str, type_: &str) -> Option<Condition> {
        self.runner_set(name)
            .await?
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == type_)
    }

    /// Events about the set with this reason.
    pub async fn events(&self, name: &str, reason: &str) -> Vec<Event> {
        let events: Api<Event> = self.ctx.api();
        events
            .list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.name.as_deref() == Some(name)
                    && e.reason.as_deref() == Some(reason)
            })
            .collect()
    }

    /// Scale sets named `name` in the fake.
    pub fn scale_sets_named(&self, name: &str) -> Vec<i64> {
        self.fake
            .state()
            .snapshot()
            .scale_sets
            .into_iter()
            .filter(|set| set.name.eq_ignore_ascii_case(name))
            .map(|set| set.id)
            .collect()
    }

    /// Waits until `check` returns `Some`, polling.
    pub async fn eventually<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        test_harness::eventually(what, WAIT, check).await
    }
}
