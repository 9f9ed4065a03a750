//! One AutoscalingListener reconcile (docs/reference/controllers.md, "AL reconcile").
//!
//! # Expected flow
//! finalizer → scale set still there? → ServiceAccount → Role → RoleBinding → status Role and RoleBinding (the
//! listener's right to report in its own status) → proxy Secret → config Secret → listener pod (create; recreate
//! when anything it depends on changed; recreate with backoff, recorded in `status.podFailures`, when it failed).
//!
//! # Guarantees
//! * Secrets, ServiceAccount and RBAC are server-side applied with the controller's own field manager, so
//!   drift is repaired and labels others add are kept.
//! * The config Secret is rewritten from the credentials Secret on every pass; its hash is part of the pod's,
//!   so rotated credentials restart the listener by themselves.
//! * Deletion removes the pod, both Secrets, the RoleBinding, the Role and the ServiceAccount before the
//!   finalizer goes.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use actions_client::{GitHubConfig, Scope};
use crds::appconfig::AppConfig;
use crds::constants::{AUTOSCALING_LISTENER_FINALIZER, INTEGRITY_HASH_ANNOTATION};
use crds::names::{listener_config_secret_name, listener_proxy_secret_name};
use crds::{AutoscalingListener, AutoscalingRunnerSet, ListenerPodFailures};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::in_manager::{self, TaskFacts, TaskStep};
use super::resources::{
    CONFIG_KEY, ConfigSettings, ListenerIdentity, PodInputs, config_secret_metadata,
    listener_config, listener_pod, metrics_port, proxy_secret_labels, role, role_binding,
    service_account, status_role, status_role_binding,
};
use super::{ListenerContext, pod_failure_delay};
use crate::actions::read_secret;
use crate::error::{Error, Result, is_status};
use crate::hash::integrity_hash;
use crate::kubeutil::{
    add_finalizers, controller_ref, delete_if_present, get_if_present, name_and_namespace,
    remove_finalizers, still_finalizing,
};
use crate::listener_tasks::ListenerTasks;
use crate::metrics::ScaleSetLabels;
use crate::options::AL_FIELD_MANAGER;
use crate::pods::{PodState, pod_state};

/// Come back soon: waiting for something to go away.
const SHORT_WAIT: Duration = Duration::from_secs(1);
/// A pod running this long without failing resets the failure count.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);

/// Reconciles one AutoscalingListener.
#[tracing::instrument(skip(listener, ctx), fields(listener = %listener.name_any()))]
pub async fn reconcile(
    listener: Arc<AutoscalingListener>,
    ctx: Arc<ListenerContext>,
) -> Result<Action> {
    let step = Step::new(&listener, &ctx)?;
    if listener.meta().deletion_timestamp.is_some() {
        // The deletion works on the listener as it is now: a cached one its last pass already finalized shares its
        // name (and its pod's, its loop's, its RBAC's) with the listener of a set reinstalled since.
        let fresh = still_finalizing(
            &step.listeners,
            &*listener,
            &[AUTOSCALING_LISTENER_FINALIZER],
        )
        .await?;
        return match fresh {
            Some(fresh) => Step::new(&fresh, &ctx)?.finalize().await,
            None => Ok(Action::await_change()),
        };
    }
    if add_finalizers(
        &step.listeners,
        &listener,
        &[AUTOSCALING_LISTENER_FINALIZER],
    )
    .await?
    {
        return Ok(Action::requeue(SHORT_WAIT));
    }
    let Some(runner_set) = step.runner_set().await? else {
        // Its scale set is gone (or the listener is an orphan of a renamed one): nothing to listen for.
        tracing::info!("AutoscalingRunnerSet is gone; deleting the listener");
        delete_if_present(&step.listeners, &step.name, &step.namespace).await?;
        return Ok(Action::await_change());
    };
    if let Some(tasks) = &ctx.base.listener_tasks {
        return step.run_in_manager(tasks, &runner_set).await;
    }
    let owner = controller_ref(&*listener)?;
    let id = ListenerIdentity {
        listener: &listener,
        owner,
        excluded_prefixes: &ctx.base.options.exclude_label_propagation_prefixes,
    };
    // Each object is read and written only when it is not as this controller built it: a running listener's
    // periodic pass costs reads only.
    let account: ServiceAccount = step
        .ensure(&step.accounts(), &service_account(&id)?)
        .await?;
    let role: Role = step
        .ensure_with(&step.roles(), &role(&id)?, |existing, desired| {
            existing.rules == desired.rules
        })
        .await?;
    let binding = step.ensure_role_binding(&role_binding(&id)?).await?;
    step.reconcile_status_rbac(&id).await?;
    let proxy_hash = step.reconcile_proxy_secret(&id).await?;
    let config_hash = step.reconcile_config_secret(&id, &runner_set).await?;
    let settings = &ctx.base.options.listener;
    let dependencies = integrity_hash(&(
        integrity_hash(&listener.spec)?,
        config_hash,
        proxy_hash,
        hash_of(&account),
        hash_of(&role),
        hash_of(&binding),
        &settings.metrics_addr,
        &settings.metrics_endpoint,
        &settings.entrypoint,
    ))?;
    let pod = listener_pod(
        &id,
        &PodInputs {
            entrypoint: &settings.entrypoint,
            metrics_port: metrics_enabled(&settings.metrics_addr)
                .then(|| metrics_port(&settings.metrics_addr))
                .flatten(),
            dependencies_hash: dependencies,
        },
    )?;
    step.reconcile_pod(pod, &runner_set).await
}

/// Whether two Secrets hold the same data (the integrity hash is of what the data was made from, so an edit of
/// the data itself keeps it).
fn same_data(existing: &Secret, desired: &Secret) -> bool {
    existing.data == desired.data
}

fn hash_of<K: Resource>(obj: &K) -> Option<String> {
    obj.annotations().get(INTEGRITY_HASH_ANNOTATION).cloned()
}

/// ARC's rule: metrics are off when the address is `0` (or empty here).
fn metrics_enabled(addr: &str) -> bool {
    !addr.is_empty() && addr != "0"
}

struct Step<'a> {
    listener: &'a AutoscalingListener,
    ctx: &'a ListenerContext,
    name: String,
    namespace: String,
    listeners: Api<AutoscalingListener>,
    secrets: Api<Secret>,
    pods: Api<Pod>,
}

impl<'a> Step<'a> {
    fn new(listener: &'a AutoscalingListener, ctx: &'a ListenerContext) -> Result<Self> {
        let (name, namespace) = name_and_namespace(listener)?;
        let client = ctx.client.clone();
        Ok(Self {
            listener,
            ctx,
            listeners: Api::namespaced(client.clone(), &namespace),
            secrets: Api::namespaced(client.clone(), &namespace),
            pods: Api::namespaced(client, &namespace),
            name,
            namespace,
        })
    }

    fn runner_set_namespace(&self) -> &str {
        &self.listener.spec.autoscaling_runner_set_namespace
    }

    fn accounts(&self) -> Api<ServiceAccount> {
        Api::namespaced(self.ctx.client.clone(), &self.namespace)
    }

    fn roles(&self) -> Api<Role> {
        Api::namespaced(self.ctx.client.clone(), self.runner_set_namespace())
    }

    fn bindings(&self) -> Api<RoleBinding> {
        Api::namespaced(self.ctx.client.clone(), self.runner_set_namespace())
    }

    /// The AutoscalingRunnerSet, read directly: a stale cache must never make a listener look orphaned.
    async fn runner_set(&self) -> Result<Option<AutoscalingRunnerSet>> {
        let spec = &self.listener.spec;
        let api: Api<AutoscalingRunnerSet> = Api::namespaced(
            self.ctx.client.clone(),
            &spec.autoscaling_runner_set_namespace,
        );
        let found = api
            .get_opt(&spec.autoscaling_runner_set_name)
            .await
            .map_err(|source| Error::ReadObjects {
                kind: AutoscalingRunnerSet::kind(&()),
                namespace: spec.autoscaling_runner_set_namespace.clone(),
                source: Box::new(source),
            })?;
        // A set being deleted still needs its listener gone first; it deletes the listener itself.
        Ok(found)
    }

    fn runner_set_ref(&self, runner_set: &AutoscalingRunnerSet) -> ObjectReference {
        runner_set.object_ref(&())
    }

    /// Server-side applies `obj` (the whole desired object) with this controller's field manager.
    async fn apply<K>(&self, api: &Api<K>, obj: &K) -> Result<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
    {
        let name = obj.meta().name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply(AL_FIELD_MANAGER).force(),
            &Patch::Apply(obj),
        )
        .await
        .map_err(|source| Error::PatchObject {
            kind: K::kind(&()),
            what: "server-side apply",
            namespace: obj.meta().namespace.clone().unwrap_or_default(),
            name,
            source: Box::new(source),
        })
    }

    /// Not in ARC: the listener's right to write its own status, a Role and RoleBinding next to it (owned by the
    /// listener, so they go with it). A manager whose RBAC does not let it create them there (a controller chart
    /// older than the manager) still runs the listener, which then cannot report; the AutoscalingRunnerSet says
    /// so (`ListenerNotReporting`).
    async fn reconcile_status_rbac(&self, id: &ListenerIdentity<'_>) -> Result<()> {
        let client = &self.ctx.client;
        let roles: Api<Role> = Api::namespaced(client.clone(), &self.namespace);
        let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &self.namespace);
        let ensured = async {
            self.ensure(&roles, &status_role(id)?).await?;
            self.ensure(&bindings, &status_role_binding(id)?)
                .await
                .map(|_| ())
        }
        .await;
        match ensured {
            Err(
                Error::PatchObject { source, kind, .. } | Error::ReadObjects { source, kind, .. },
            ) if is_status(&source, 403) => {
                tracing::warn!(
                    kind = &*kind,
                    error = %source,
                    "the manager may not grant the listener the right to report its state (Roles and \
                     RoleBindings in the controller namespace); the listener runs without reporting"
                );
                Ok(())
            }
            other => other,
        }
    }

    /// Applies `desired` unless it is in place as this controller built it (same integrity hash, owner, and its
    /// labels and annotations, the user's among them): a read instead of a write on every pass of every
    /// listener.
    async fn ensure<K>(&self, api: &Api<K>, desired: &K) -> Result<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
    {
        self.ensure_with(api, desired, |_, _| true).await
    }

    /// [`Self::ensure`], with `also_same` comparing what the integrity hash does not cover. Returns the object
    /// as it now is.
    async fn ensure_with<K>(
        &self,
        api: &Api<K>,
        desired: &K,
        also_same: impl Fn(&K, &K) -> bool,
    ) -> Result<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
    {
        let existing = self.read(api, desired).await?;
        self.ensure_over(api, existing, desired, also_same).await
    }

    /// The object `desired` names, from the API server.
    async fn read<K>(&self, api: &Api<K>, desired: &K) -> Result<Option<K>>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        get_if_present(
            api,
            &desired.meta().name.clone().unwrap_or_default(),
            &desired.meta().namespace.clone().unwrap_or_default(),
        )
        .await
    }

    /// Keeps `existing` when it is as this controller builds `desired` (see [`Self::ensure`]), else applies
    /// `desired`.
    async fn ensure_over<K>(
        &self,
        api: &Api<K>,
        existing: Option<K>,
        desired: &K,
        also_same: impl Fn(&K, &K) -> bool,
    ) -> Result<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
    {
        let contains = |have: &BTreeMap<String, String>, want: &BTreeMap<String, String>| {
            want.iter().all(|(key, value)| have.get(key) == Some(value))
        };
        match existing {
            Some(existing)
                if hash_of(&existing) == hash_of(desired)
                    && existing.owner_references() == desired.owner_references()
                    && contains(existing.labels(), desired.labels())
                    && contains(existing.annotations(), desired.annotations())
                    && also_same(&existing, desired) =>
            {
                Ok(existing)
            }
            _ => self.apply(api, desired).await,
        }
    }

    /// The RoleBinding; its `roleRef` cannot change in place, so a binding pointing elsewhere is replaced.
    async fn ensure_role_binding(&self, desired: &RoleBinding) -> Result<RoleBinding> {
        let api = self.bindings();
        let mut existing = self.read(&api, desired).await?;
        if existing
            .as_ref()
            .is_some_and(|binding| binding.role_ref != desired.role_ref)
        {
            delete_if_present(&api, &self.name, self.runner_set_namespace()).await?;
            existing = None;
        }
        self.ensure_over(&api, existing, desired, |existing, desired| {
            existing.subjects == desired.subjects
        })
        .await
    }

    fn secret(
        &self,
        name: String,
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
        data: BTreeMap<String, ByteString>,
    ) -> Result<Secret> {
        Ok(Secret {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(self.namespace.clone()),
                labels: Some(labels),
                annotations: Some(annotations),
                owner_references: Some(vec![controller_ref(self.listener)?]),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..Secret::default()
        })
    }

    /// The proxy Secret the pod's proxy variables come from; its data is recomputed every pass (ARC computes
    /// it once), so rotated proxy credentials reach the listener too. Returns its hash.
    async fn reconcile_proxy_secret(&self, id: &ListenerIdentity<'_>) -> Result<Option<String>> {
        let name = listener_proxy_secret_name(&self.name);
        let Some(proxy) = &self.listener.spec.proxy else {
            // Looked for first: on most passes there is none, and a read is what that costs.
            if get_if_present(&self.secrets, &name, &self.namespace)
                .await?
                .is_some()
            {
                delete_if_present(&self.secrets, &name, &self.namespace).await?;
            }
            return Ok(None);
        };
        let data = crate::proxy::secret_data(
            &self.ctx.client,
            self.runner_set_namespace(),
            &self.name,
            proxy,
        )
        .await?;
        let hash = integrity_hash(&data)?;
        let data = data
            .into_iter()
            .map(|(key, value)| (key, ByteString(value.into_bytes())))
            .collect();
        let annotations = BTreeMap::from([(INTEGRITY_HASH_ANNOTATION.to_owned(), hash.clone())]);
        let secret = self.secret(name, proxy_secret_labels(id.listener), annotations, data)?;
        self.ensure_with(&self.secrets, &secret, same_data).await?;
        Ok(Some(hash))
    }

    /// The config Secret (`config.json`), rebuilt from the credentials Secret. Returns its hash.
    async fn reconcile_config_secret(
        &self,
        id: &ListenerIdentity<'_>,
        runner_set: &AutoscalingRunnerSet,
    ) -> Result<String> {
        let ListenerInputs { data, hash, .. } = self.config(runner_set).await?;
        let (labels, mut annotations) = config_secret_metadata(id.listener, id.excluded_prefixes);
        annotations.insert(INTEGRITY_HASH_ANNOTATION.to_owned(), hash.clone());
        let secret = self.secret(
            listener_config_secret_name(&self.name),
            labels,
            annotations,
            data,
        )?;
        self.ensure_with(&self.secrets, &secret, same_data).await?;
        Ok(hash)
    }

    /// The listener's `config.json`, rebuilt from the credentials Secret, as Secret data, and its hash (a vault's
    /// current credentials included).
    pub(super) async fn config(&self, runner_set: &AutoscalingRunnerSet) -> Result<ListenerInputs> {
        let spec = &self.listener.spec;
        let namespace = self.runner_set_namespace();
        let credentials = if spec.vault_config.is_some() {
            None
        } else {
            let secret = read_secret(&self.ctx.client, namespace, &spec.github_config_secret)
                .await?
                .ok_or_else(|| Error::CredentialsSecretMissing {
                    namespace: namespace.to_owned(),
                    name: spec.github_config_secret.clone(),
                })?;
            let credentials = AppConfig::from_secret_data(&secret.data.unwrap_or_default())
                .and_then(|config| config.credentials())
                .map_err(|source| Error::ReadCredentials {
                    namespace: namespace.to_owned(),
                    name: spec.github_config_secret.clone(),
                    source,
                })?;
            Some(credentials)
        };
        let ca = match &spec.github_server_tls {
            Some(tls) => self.read_ca(tls).await?,
            None => String::new(),
        };
        let settings = &self.ctx.base.options.listener;
        let metrics = metrics_enabled(&settings.metrics_addr);
        let text = listener_config(
            self.listener,
            credentials.as_ref(),
            &ca,
            &ConfigSettings {
                log_level: &settings.log_level,
                log_format: &settings.log_format,
                metrics_addr: if metrics { &settings.metrics_addr } else { "" },
                metrics_endpoint: if metrics {
                    &settings.metrics_endpoint
                } else {
                    ""
                },
                health_addr: &settings.health_addr,
            },
        )
        .map_err(|error| {
            // The scale set owner should hear about a listener that cannot be configured.
            tracing::warn!(%error, runner_set = %runner_set.name_any(), "listener config is invalid");
            error
        })?;
        let data = BTreeMap::from([(CONFIG_KEY.to_owned(), ByteString(text.into_bytes()))]);
        // With a vault the config holds no credentials, so the vault's current value joins the hash: a new
        // version restarts the listener, which reads it at start (the hash without a vault is unchanged).
        let source = crate::actions::ClientSource {
            namespace,
            github_config_url: &spec.github_config_url,
            github_config_secret: &spec.github_config_secret,
            proxy: spec.proxy.as_ref(),
            tls: spec.github_server_tls.as_ref(),
            vault: spec.vault_config.as_ref(),
        };
        let vault = self.ctx.base.actions.vault_app_config(&source).await?;
        let hash = match &vault {
            Some(vault_credentials) => integrity_hash(&(&data, vault_credentials))?,
            None => integrity_hash(&data)?,
        };
        Ok(ListenerInputs { data, hash, vault })
    }

    async fn read_ca(&self, tls: &crds::common::TlsConfig) -> Result<String> {
        let fail = |reason: String| Error::ReadTlsCertificate { reason };
        let selector = tls
            .certificate_from
            .as_ref()
            .and_then(|from| from.config_map_key_ref.as_ref())
            .ok_or_else(|| {
                fail("githubServerTLS.certificateFrom.configMapKeyRef is missing".into())
            })?;
        let namespace = self.runner_set_namespace();
        let config_map = Api::<ConfigMap>::namespaced(self.ctx.client.clone(), namespace)
            .get_opt(&selector.name)
            .await
            .map_err(|e| fail(format!("get ConfigMap {namespace}/{}: {e}", selector.name)))?
            .ok_or_else(|| {
                fail(format!(
                    "ConfigMap {namespace}/{} does not exist",
                    selector.name
                ))
            })?;
        config_map
            .data
            .and_then(|mut data| data.remove(&selector.key))
            .ok_or_else(|| {
                fail(format!(
                    "ConfigMap {namespace}/{} has no key {:?}",
                    selector.name, selector.key
                ))
            })
    }

    fn gauge_labels(&self) -> ScaleSetLabels {
        let mut labels = ScaleSetLabels {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            ..ScaleSetLabels::default()
        };
        if let Ok(config) = GitHubConfig::parse(&self.listener.spec.github_config_url) {
            match config.scope() {
                Scope::Organization { organization } => {
                    labels.organization.clone_from(organization);
                }
                Scope::Enterprise { enterprise } => labels.enterprise.clone_from(enterprise),
                Scope::Repository { owner, repository } => {
                    labels.organization.clone_from(owner);
                    labels.repository.clone_from(repository);
                }
            }
        }
        labels
    }

    fn set_running(&self, running: bool) {
        self.ctx
            .base
            .metrics
            .running_listeners
            .get_or_create(&self.gauge_labels())
            .set(i64::from(running));
    }

    /// The current pod, read directly (the pod is recreated by this controller, so a stale "absent" from a
    /// cache would create a second one and fail).
    async fn current_pod(&self) -> Result<Option<Pod>> {
        self.pods
            .get_opt(&self.name)
            .await
            .map_err(|source| Error::ReadObjects {
                kind: Pod::kind(&()),
                namespace: self.namespace.clone(),
                source: Box::new(source),
            })
    }

    async fn reconcile_pod(
        &self,
        desired: Pod,
        runner_set: &AutoscalingRunnerSet,
    ) -> Result<Action> {
        let resync = self.ctx.base.options.resync_interval;
        let Some(pod) = self.current_pod().await? else {
            self.set_running(false);
            let failures = self.live_pod_failures().await?;
            if let Some(wait) = failures
                .as_ref()
                .and_then(|f| time_until(f.next_attempt_time.as_ref()))
            {
                return Ok(Action::requeue(wait));
            }
            self.create_pod(&desired).await?;
            return Ok(Action::requeue(resync));
        };
        if pod.metadata.deletion_timestamp.is_some() {
            return Ok(Action::requeue(SHORT_WAIT));
        }
        if hash_of(&pod) != hash_of(&desired) {
            tracing::info!("listener inputs changed; recreating its pod");
            self.set_running(false);
            // A new configuration deserves a fresh start, not the old failures' backoff.
            self.forget_pod_failures().await?;
            delete_if_present(&self.pods, &self.name, &self.namespace).await?;
            return Ok(Action::requeue(SHORT_WAIT));
        }
        match pod_state(&pod) {
            PodState::Failed(what) => {
                self.set_running(false);
                let describe = |count, wait: &str| {
                    format!(
                        "listener pod {}/{} {what} (failure {count}); recreating it in {wait}",
                        self.namespace, self.name
                    )
                };
                let delay = self.record_failure(runner_set, &what, describe).await?;
                delete_if_present(&self.pods, &self.name, &self.namespace).await?;
                Ok(Action::requeue(delay.max(SHORT_WAIT)))
            }
            PodState::Running(since) => {
                self.set_running(true);
                let pass = running_pass(since, Timestamp::now(), resync);
                if pass.healthy {
                    self.forget_pod_failures().await?;
                }
                Ok(Action::requeue(pass.next))
            }
            PodState::Starting => Ok(Action::requeue(resync)),
        }
    }

    /// Records the listener's next failure in a row (`what`: how it ended) in its status and says so in a Warning
    /// Event on its scale set (`describe`, from the count and the wait); returns the wait before the next attempt.
    async fn record_failure(
        &self,
        runner_set: &AutoscalingRunnerSet,
        what: &str,
        describe: impl FnOnce(i64, &str) -> String,
    ) -> Result<Duration> {
        let options = &self.ctx.base.options;
        let count = self
            .live_pod_failures()
            .await?
            .map_or(1, |f| f.count.saturating_add(1));
        let delay = pod_failure_delay(count, options.error_backoff_min, options.error_backoff_max);
        let now = Timestamp::now();
        let next = now
            .checked_add(SignedDuration::try_from(delay).unwrap_or(SignedDuration::MAX))
            .unwrap_or(now);
        self.write_pod_failures(Some(&ListenerPodFailures {
            count,
            last: what.to_owned(),
            time: Some(Time(now)),
            next_attempt_time: Some(Time(next)),
        }))
        .await?;
        self.ctx
            .base
            .publish(
                &self.runner_set_ref(runner_set),
                EventType::Warning,
                "ListenerFailed",
                "RecreateListener",
                describe(count, &describe_wait(delay)),
            )
            .await;
        Ok(delay)
    }

    /// The pod failures recorded in the status, read from the API server: the cached listener may not show the
    /// failure recorded a moment ago, and a backoff read from it could be skipped.
    async fn live_pod_failures(&self) -> Result<Option<ListenerPodFailures>> {
        let live =
            self.listeners
                .get_opt(&self.name)
                .await
                .map_err(|source| Error::ReadObjects {
                    kind: AutoscalingListener::kind(&()),
                    namespace: self.namespace.clone(),
                    source: Box::new(source),
                })?;
        Ok(live.and_then(|l| l.status).and_then(|s| s.pod_failures))
    }

    /// Records the pod failures in the status (`None` removes them), under this controller's field manager; the
    /// listener's own fields there are left alone.
    async fn write_pod_failures(&self, failures: Option<&ListenerPodFailures>) -> Result<()> {
        let params = PatchParams {
            field_manager: Some(AL_FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let patch = serde_json::json!({"status": {"podFailures": failures}});
        self.listeners
            .patch_status(&self.name, &params, &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|source| Error::PatchObject {
                kind: AutoscalingListener::kind(&()),
                what: "status",
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            })
    }

    /// Clears the failure record, if the cached listener shows one (status-only changes do not start a pass, so
    /// the cache has caught up by the next one).
    async fn forget_pod_failures(&self) -> Result<()> {
        let recorded = self
            .listener
            .status
            .as_ref()
            .is_some_and(|s| s.pod_failures.is_some());
        if recorded {
            self.write_pod_failures(None).await?;
        }
        Ok(())
    }

    async fn create_pod(&self, pod: &Pod) -> Result<()> {
        match self.pods.create(&PostParams::default(), pod).await {
            Ok(_) => Ok(()),
            // Created by an earlier pass the cache or this read missed; the next pass compares it.
            Err(error) if is_status(&error, 409) => Ok(()),
            Err(source) => Err(Error::CreateObject {
                kind: Pod::kind(&()),
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            }),
        }
    }

    /// Deletion: the loop this manager runs for the listener stops (its session closed), everything this
    /// controller created goes, then the finalizer. Runs on the listener as just read from the API server, still
    /// carrying its finalizer.
    async fn finalize(&self) -> Result<Action> {
        if let Some(tasks) = &self.ctx.base.listener_tasks {
            tasks.stop(&ObjectRef::from_obj(self.listener)).await;
        }
        if self.delete_pod_objects().await? {
            // Deletes were issued (or objects are still terminating): confirm they are gone next pass.
            return Ok(Action::requeue(SHORT_WAIT));
        }
        remove_finalizers(
            &self.listeners,
            self.listener,
            &[AUTOSCALING_LISTENER_FINALIZER],
        )
        .await?;
        Ok(Action::await_change())
    }

    /// Deletes the listener pod and everything made for it (its Secrets, ServiceAccount, Roles and RoleBindings);
    /// returns whether any was still there. The deletes go out together: one after the other they held a worker
    /// of this controller for seconds under a burst, once per set when a new leader starts its loops (the
    /// manager's listener mode), while other sets waited for a worker to start theirs.
    async fn delete_pod_objects(&self) -> Result<bool> {
        let (config, proxy) = (
            listener_config_secret_name(&self.name),
            listener_proxy_secret_name(&self.name),
        );
        let (bindings, roles, accounts) = (self.bindings(), self.roles(), self.accounts());
        let set_namespace = self.runner_set_namespace();
        let (pod, config, proxy, binding, role, account) = futures::join!(
            delete_if_present(&self.pods, &self.name, &self.namespace),
            delete_if_present(&self.secrets, &config, &self.namespace),
            delete_if_present(&self.secrets, &proxy, &self.namespace),
            delete_if_present(&bindings, &self.name, set_namespace),
            delete_if_present(&roles, &self.name, set_namespace),
            delete_if_present(&accounts, &self.name, &self.namespace),
        );
        let pod = pod?;
        self.set_running(false);
        Ok(pod | config? | proxy? | binding? | role? | account?)
    }
}

/// What a listener's loop is made from: its `config.json` as Secret data, the digest of that and of a vault's
/// credentials, and those credentials (the manager's listener mode gives them to the loop inline).
pub(super) struct ListenerInputs {
    data: BTreeMap<String, ByteString>,
    hash: String,
    vault: Option<AppConfig>,
}

impl Step<'_> {
    /// The manager's listener mode (docs/listener-modes.md): the listener's loop runs as a task of this manager
    /// rather than in a pod; [`in_manager::decide`] says what the pass does with it.
    async fn run_in_manager(
        &self,
        tasks: &ListenerTasks,
        runner_set: &AutoscalingRunnerSet,
    ) -> Result<Action> {
        let key = ObjectRef::from_obj(self.listener);
        let uid = self.listener.uid().unwrap_or_default();
        let inputs = self.config(runner_set).await?;
        let status = self.listener.status.clone().unwrap_or_default();
        let recorded = status
            .session
            .map(|session| session.id)
            .filter(|id| !id.is_empty());
        let view = tasks.view(&key);
        let facts = TaskFacts {
            task: view.as_ref(),
            uid: &uid,
            inputs: &inputs.hash,
            recorded_session: recorded.as_deref(),
            recorded_held: status.session_held == Some(true),
            backoff_left: status
                .pod_failures
                .as_ref()
                .and_then(|failures| time_until(failures.next_attempt_time.as_ref())),
        };
        let resync = self.ctx.base.options.resync_interval;
        let step = in_manager::decide(&facts);
        tracing::debug!(?step, "listener loop step");
        match step {
            TaskStep::Wait(wait) => {
                self.set_running(false);
                Ok(Action::requeue(wait))
            }
            TaskStep::Failed(why) => {
                self.set_running(false);
                tasks.stop(&key).await;
                self.loop_failed(runner_set, &why).await
            }
            TaskStep::Start | TaskStep::Restart | TaskStep::Retake => {
                if step == TaskStep::Restart {
                    tracing::info!("listener inputs changed; restarting its loop");
                    // A new configuration deserves a fresh start, not the old failures' backoff.
                    self.forget_pod_failures().await?;
                }
                tracing::info!(?step, predecessor = ?recorded, "starting the listener's loop");
                match self
                    .embedded_listener(tasks, &inputs, recorded.as_deref())
                    .await
                {
                    Ok(listener) => {
                        tasks
                            .start(key, (&uid, &inputs.hash), recorded, listener)
                            .await;
                        self.set_running(true);
                        Ok(Action::requeue(resync))
                    }
                    Err(why) => self.loop_failed(runner_set, &why).await,
                }
            }
            TaskStep::DeletePodObjects => {
                self.delete_pod_objects().await?;
                tasks.pod_objects_deleted(&key);
                Ok(Action::requeue(resync))
            }
            TaskStep::RewriteStatus => {
                tasks.rewrite_status(&key);
                Ok(Action::requeue(resync))
            }
            TaskStep::Running { holding } => {
                self.set_running(true);
                if !holding {
                    // The loop's session change brings the listener back (`ListenerTasks`).
                    return Ok(Action::requeue(resync));
                }
                let started = view.map(|task| task.started);
                let pass = running_pass(started, Timestamp::now(), resync);
                if pass.healthy {
                    self.forget_pod_failures().await?;
                }
                Ok(Action::requeue(pass.next))
            }
        }
    }

    /// The loop could not start, or ended with an error or a panic: recorded as a failure of the listener, started
    /// again after the backoff.
    async fn loop_failed(&self, runner_set: &AutoscalingRunnerSet, why: &str) -> Result<Action> {
        let describe = |count, wait: &str| {
            format!(
                "the loop of listener {}/{} in the manager failed: {why} (failure {count}); restarting it in {wait}",
                self.namespace, self.name
            )
        };
        let delay = self.record_failure(runner_set, why, describe).await?;
        Ok(Action::requeue(delay.max(SHORT_WAIT)))
    }

    /// The listener's loop, built as the listener binary builds it from `config.json` (with a vault's credentials
    /// inline: the manager read them), reporting to this AutoscalingListener, deleting session `predecessor` first.
    /// Any failure comes back as the text the Event and the status show.
    async fn embedded_listener(
        &self,
        tasks: &ListenerTasks,
        inputs: &ListenerInputs,
        predecessor: Option<&str>,
    ) -> std::result::Result<listener::Listener, String> {
        let text = inputs
            .data
            .get(CONFIG_KEY)
            .map(|bytes| bytes.0.as_slice())
            .unwrap_or_default();
        let mut config = listener::Config::decode(text).map_err(|error| error.to_string())?;
        if let Some(vault) = &inputs.vault {
            config.vault_type = String::new();
            config.github_token.clone_from(&vault.github_token);
            config.github_app_id.clone_from(&vault.github_app_id);
            config.github_app_installation_id = vault.github_app_installation_id;
            config
                .github_app_private_key
                .clone_from(&vault.github_app_private_key);
        }
        config.validate().map_err(|error| error.to_string())?;
        config.status_target = Some(listener::config::StatusTarget {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        });
        let predecessor = predecessor.and_then(|id| id.parse().ok());
        listener::Listener::embedded(
            &config,
            tasks.client(),
            self.ctx.base.options.listener.loop_settings.clone(),
            predecessor,
        )
        .await
        .map_err(|error| listener::listener::error_chain(&error))
    }
}

/// How long until `at`, if it is in the future.
fn time_until(at: Option<&Time>) -> Option<Duration> {
    let left = at?.0.duration_since(Timestamp::now());
    Duration::try_from(left).ok().filter(|left| !left.is_zero())
}

/// A wait for people to read: whole seconds from 10 s on, tenths below (a 0.5 s backoff is not "0s").
fn describe_wait(wait: Duration) -> String {
    if wait >= Duration::from_secs(10) {
        format!("{}s", wait.as_secs())
    } else {
        format!("{:.1}s", wait.as_secs_f64())
    }
}

/// What a pass on a listener whose pod runs decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunningPass {
    /// The pod has run [`HEALTHY_AFTER`] (or since when is unknown): the pod failures on record are forgotten.
    pub healthy: bool,
    /// When the next pass comes without an event.
    pub next: Duration,
}

/// The pass on a listener whose pod has run since `since`: a pod not yet healthy is looked at again when it
/// gets there (to forget its failures), a healthy one only at the periodic `resync`. Every change a pass acts
/// on brings an event (the listener, its pod, ServiceAccount, Role and RoleBinding are watched); the periodic
/// pass is what picks up a rotated credentials Secret. A pass every minute for every running listener was 11
/// requests, five of them writes, per scale set and minute while nothing happened (docs/benchmarks.md,
/// "Many scale sets").
pub fn running_pass(since: Option<Timestamp>, now: Timestamp, resync: Duration) -> RunningPass {
    let ran = since.map(|since| now.duration_since(since).unsigned_abs());
    match ran {
        Some(ran) if ran < HEALTHY_AFTER => RunningPass {
            healthy: false,
            next: (HEALTHY_AFTER - ran).max(SHORT_WAIT).min(resync),
        },
        _ => RunningPass {
            healthy: true,
            next: resync,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_read_well_and_only_future_times_wait() {
        assert_eq!(describe_wait(Duration::from_millis(500)), "0.5s");
        assert_eq!(describe_wait(Duration::from_millis(9_960)), "10.0s");
        assert_eq!(describe_wait(Duration::from_secs(300)), "300s");
        let later = Timestamp::now()
            .checked_add(SignedDuration::from_secs(30))
            .unwrap();
        let wait = time_until(Some(&Time(later))).unwrap();
        assert!(wait > Duration::from_secs(25) && wait <= Duration::from_secs(30));
        let earlier = Timestamp::now()
            .checked_sub(SignedDuration::from_secs(1))
            .unwrap();
        assert_eq!(time_until(Some(&Time(earlier))), None);
        assert_eq!(time_until(None), None);
    }

    #[test]
    fn a_running_listener_is_looked_at_when_healthy_then_only_at_the_resync() {
        let resync = Duration::from_secs(300);
        let now = Timestamp::now();
        let ago = |secs| now.checked_sub(SignedDuration::from_secs(secs)).unwrap();
        // Just started: one pass when it has run a minute.
        assert_eq!(
            running_pass(Some(ago(15)), now, resync),
            RunningPass {
                healthy: false,
                next: Duration::from_secs(45)
            }
        );
        // Healthy, or since when unknown: failures forgotten, and no pass before the resync.
        for since in [Some(ago(60)), Some(ago(3600)), None] {
            assert_eq!(
                running_pass(since, now, resync),
                RunningPass {
                    healthy: true,
                    next: resync
                }
            );
        }
        // Never sooner than SHORT_WAIT, never later than a shorter resync.
        assert_eq!(
            running_pass(Some(now), now, Duration::from_secs(5)).next,
            Duration::from_secs(5)
        );
        let almost = now
            .checked_sub(SignedDuration::from_millis(59_900))
            .unwrap();
        assert_eq!(running_pass(Some(almost), now, resync).next, SHORT_WAIT);
    }
}
