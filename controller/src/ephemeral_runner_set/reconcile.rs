//! One EphemeralRunnerSet reconcile (docs/reference/controllers.md, "ERS reconcile").
//!
//! # Expected flow
//! finalizer → template change? (clean up idle runners) → outdated? (clean up) → proxy Secret → count runners →
//! scale per the patch-ID protocol (create or remove in parallel, bounded) → delete finished runners → status.
//!
//! # Guarantees
//! * No duplicate runners from a stale cache: runners this process created or deleted must show up in the
//!   runner watch before the set scales again ([`crate::context::Expectations`]); after a restart the watch is
//!   fully listed before any reconcile runs.
//! * A scale-down only removes registered, idle runners whose pod is not waiting for a node and has been Ready
//!   for the grace period, and deregisters each before deleting it; a runner the service reports busy is kept.
//! * Deleting the set deregisters and deletes idle runners first and waits for busy ones to finish.

use std::cell::OnceCell;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actions_client::{GitHubConfig, Scope};
use crds::constants::{
    APPLIED_GENERATION_ANNOTATION, EPHEMERAL_RUNNER_SET_FINALIZER, INTEGRITY_HASH_ANNOTATION,
    LEGACY_EPHEMERAL_RUNNER_SET_FINALIZER, SCALE_SET_NAME_LABEL, SCALE_SET_NAMESPACE_LABEL, phase,
};
use crds::names::ephemeral_runner_set_proxy_secret_name;
use crds::{EphemeralRunner, EphemeralRunnerSet};
use futures::{StreamExt, stream};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::SetContext;
use super::runner::{desired_runner, scale_set_identity};
use super::scale::{
    Census, ScalePlan, already_applied, places_held, plan, removal_candidates, stale_runners,
};
use crate::actions::{Actions, ClientSource, Removal, credentials_gone};
use crate::completions::{Counted, listing, set_key};
use crate::context::{CacheView, Context};
use crate::ephemeral_runner::facts::{
    RunnerMemory, in_teardown, known_identity, may_have_left_with_job,
};
use crate::error::{Error, Result};
use crate::hash::{integrity_hash, runner_spec_hash};
use crate::kubeutil::{
    add_finalizers, controller_ref, delete_if_present, is_controlled_by, name_and_namespace,
    remove_finalizers, still_finalizing,
};
use crate::metrics::{RunnerLabels, ScaleSetLabels};
use crate::options::ERS_FIELD_MANAGER;
use crate::pods::CachedPod;

/// The finalizers a set's deletion removes: its own, and the one ARC up to 0.14 marks its runner sets with (its
/// runners' finalizer), which nothing else removes.
const DELETION_FINALIZERS: [&str; 2] = [
    EPHEMERAL_RUNNER_SET_FINALIZER,
    LEGACY_EPHEMERAL_RUNNER_SET_FINALIZER,
];

/// Reconciles one EphemeralRunnerSet.
#[tracing::instrument(skip(set, lane), fields(set = %set.name_any(), namespace = set.namespace().unwrap_or_default()))]
pub async fn reconcile(set: Arc<EphemeralRunnerSet>, lane: Arc<SetContext>) -> Result<Action> {
    let ctx = lane.base.as_ref();
    let step = SetStep::new(&set, ctx, &lane.runners)?;
    if set.meta().deletion_timestamp.is_some() {
        // The deletion works on the set as it is now: a cached one its last pass already finalized shares its name
        // (and so its runners, which are matched by name) with a set made since.
        let fresh = still_finalizing(&step.api, &*set, &DELETION_FINALIZERS).await?;
        return match fresh {
            Some(fresh) => SetStep::new(&fresh, ctx, &lane.runners)?.finalize().await,
            None => Ok(Action::await_change()),
        };
    }
    if set.is_superseded() {
        // A runner set an earlier controller left beside the scale set's own (ARC up to 0.14): never scaled, even
        // when that controller's listener, still polling, patches its replicas; the AutoscalingRunnerSet
        // controller moves its runners to the scale set's runner set and then deletes it.
        return Ok(Action::await_change());
    }
    step.ensure_finalizer().await?;
    let hash = runner_spec_hash(&set.spec.ephemeral_runner_spec)?;
    // The set's own stamp is informational (ARC's users read it); which runners are stale is told by each
    // runner's stamp, so a writer that updates template and stamp together (the AutoscalingRunnerSet controller)
    // still has its change reach the runners.
    if set.annotations().get(INTEGRITY_HASH_ANNOTATION) != Some(&hash) {
        step.stamp_hash(&hash).await?;
    }
    if set
        .status
        .as_ref()
        .is_some_and(|status| status.phase == phase::OUTDATED)
    {
        step.cleanup().await?;
        return Ok(Action::requeue(ctx.options.resync_interval));
    }
    step.reconcile_proxy_secret().await?;
    // Waiting for the cache needs no poll: the runner events that settle the expectations start the next pass
    // (the set owns its runners, and their deletions reach it through `reconcile_on`). The requeue only bounds
    // how long a lost event is waited for.
    if !step.cache_caught_up().await? {
        return Ok(Action::requeue(
            ctx.expectations
                .left(&step.key)
                .unwrap_or(ctx.options.resync_interval),
        ));
    }
    let census = Census::of(step.children());
    step.update_gauges(&census);
    // A template change: idle and failed runners of an older template go first; the set scales once the cache
    // shows them going, so their replacements are counted against the request.
    let (replaced, stale_errors) = step.replace_stale(&census, &hash).await;
    if replaced {
        // Their deletion events bring the next pass, with the expectations recorded for them.
        return stale_errors.map(|()| Action::requeue(ctx.options.resync_interval));
    }
    // A stale runner whose removal fails (its service unreachable, say) must not stop the whole set from
    // scaling: the pass scales, then reports the failure, whose backoff brings the removal back.
    let next = step.scale(&census).await?;
    let census = Census::of(step.children());
    step.write_status(&census).await?;
    stale_errors?;
    Ok(Action::requeue(next.unwrap_or(ctx.options.resync_interval)))
}

struct SetStep<'a> {
    set: &'a EphemeralRunnerSet,
    ctx: &'a Context,
    /// The runner controller's memory of its runners.
    memory: &'a RunnerMemory,
    name: String,
    namespace: String,
    key: String,
    api: Api<EphemeralRunnerSet>,
    runners: Api<EphemeralRunner>,
    secrets: Api<Secret>,
}

impl<'a> SetStep<'a> {
    fn new(
        set: &'a EphemeralRunnerSet,
        ctx: &'a Context,
        memory: &'a RunnerMemory,
    ) -> Result<Self> {
        let (name, namespace) = name_and_namespace(set)?;
        let client = ctx.client.clone();
        Ok(Self {
            set,
            ctx,
            memory,
            key: set_key(&namespace, &name),
            api: Api::namespaced(client.clone(), &namespace),
            runners: Api::namespaced(client.clone(), &namespace),
            secrets: Api::namespaced(client, &namespace),
            name,
            namespace,
        })
    }

    /// The set's runners, from the cache.
    fn children(&self) -> Vec<Arc<EphemeralRunner>> {
        self.ctx.stores.runners.state_filter(|runner| {
            runner.metadata.namespace.as_deref() == Some(self.namespace.as_str())
                && is_controlled_by::<EphemeralRunnerSet>(runner, &self.name)
        })
    }

    fn cached_runner(&self, name: &str) -> Option<Arc<EphemeralRunner>> {
        self.ctx
            .stores
            .runners
            .get(&ObjectRef::new(name).within(&self.namespace))
    }

    fn pod_of(&self, runner: &EphemeralRunner) -> Option<Arc<CachedPod>> {
        self.ctx
            .stores
            .pods
            .get(&ObjectRef::new(&runner.name_any()).within(&self.namespace))
    }

    /// The registration `runner` holds: the one its status records, or, until the status records one, the one
    /// this process created its pod `pod` under (the runner controller writes the identity with the pod's first
    /// state worth showing). 0 when neither is known.
    fn registration_of(&self, runner: &EphemeralRunner, pod: Option<&CachedPod>) -> i64 {
        known_identity(self.memory, runner, pod).map_or(0, |identity| identity.runner_id)
    }

    /// Whether every runner this process created or deleted for the set is visible in the cache. Expectations
    /// overdue are settled by a quorum list of the set's runners, not by the clock: only what the cache still shows
    /// otherwise than the API server is waited for again.
    async fn cache_caught_up(&self) -> Result<bool> {
        let seen = |name: &str| self.cached_runner(name).is_some();
        let alive = |name: &str| {
            self.cached_runner(name)
                .is_some_and(|runner| runner.metadata.deletion_timestamp.is_none())
        };
        match self.ctx.expectations.satisfied(&self.key, seen, alive) {
            CacheView::CaughtUp => Ok(true),
            CacheView::Behind => Ok(false),
            CacheView::Overdue => {
                let listed = self.list_runners().await?;
                let behind = self.ctx.expectations.rebase(
                    &self.key,
                    |name| listed.contains_key(name),
                    |name| listed.get(name) == Some(&true),
                    seen,
                    alive,
                );
                if !behind.is_empty() {
                    tracing::warn!(
                        set = %self.key,
                        ?behind,
                        "the runner watch still does not show what the API server holds; the set waits for it"
                    );
                }
                Ok(behind.is_empty())
            }
        }
    }

    /// The set's runners by name, from the API server (a quorum read, metadata only), each with whether it is
    /// alive (not being deleted).
    async fn list_runners(&self) -> Result<std::collections::HashMap<String, bool>> {
        let listed = self
            .runners
            .list_metadata(&ListParams::default())
            .await
            .map_err(|source| Error::ReadObjects {
                kind: EphemeralRunner::kind(&()),
                namespace: self.namespace.clone(),
                source: Box::new(source),
            })?;
        Ok(listed
            .items
            .into_iter()
            .filter(|runner| is_controlled_by::<EphemeralRunnerSet>(runner, &self.name))
            .map(|runner| {
                let alive = runner.metadata.deletion_timestamp.is_none();
                (runner.name_any(), alive)
            })
            .collect())
    }

    fn scale_set(&self) -> RunnerLabels {
        let (name, namespace) = scale_set_identity(self.set);
        RunnerLabels { name, namespace }
    }

    async fn ensure_finalizer(&self) -> Result<()> {
        add_finalizers(&self.api, self.set, &[EPHEMERAL_RUNNER_SET_FINALIZER]).await?;
        Ok(())
    }

    async fn stamp_hash(&self, hash: &str) -> Result<()> {
        let patch = json!({ "metadata": { "annotations": { INTEGRITY_HASH_ANNOTATION: hash } } });
        self.api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|source| Error::PatchObject {
                kind: EphemeralRunnerSet::kind(&()),
                what: "integrity hash",
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            })
    }

    fn proxy_secret_name(&self) -> String {
        ephemeral_runner_set_proxy_secret_name(&self.name, &self.namespace)
    }

    /// The proxy Secret runner pods read their proxy environment from (docs/reference/controllers.md, "Proxy
    /// Secrets"), applied every pass so rotated proxy credentials reach new runners.
    async fn reconcile_proxy_secret(&self) -> Result<()> {
        let Some(proxy) = &self.set.spec.ephemeral_runner_spec.proxy else {
            return Ok(());
        };
        let data =
            crate::proxy::secret_data(&self.ctx.client, &self.namespace, &self.name, proxy).await?;
        let labels = self.set.labels();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(self.proxy_secret_name()),
                namespace: Some(self.namespace.clone()),
                labels: Some(
                    [SCALE_SET_NAME_LABEL, SCALE_SET_NAMESPACE_LABEL]
                        .into_iter()
                        .map(|key| (key.to_owned(), labels.get(key).cloned().unwrap_or_default()))
                        .collect(),
                ),
                annotations: Some(
                    [(INTEGRITY_HASH_ANNOTATION.to_owned(), integrity_hash(&data)?)].into(),
                ),
                owner_references: Some(vec![controller_ref(self.set)?]),
                ..ObjectMeta::default()
            },
            data: Some(
                data.into_iter()
                    .map(|(key, value)| (key, ByteString(value.into_bytes())))
                    .collect(),
            ),
            ..Secret::default()
        };
        let mut body = serde_json::to_value(&secret).map_err(|source| Error::Serialize {
            what: "proxy Secret",
            source,
        })?;
        body["apiVersion"] = json!(Secret::api_version(&()));
        body["kind"] = json!(Secret::kind(&()));
        self.secrets
            .patch(
                &self.proxy_secret_name(),
                &PatchParams::apply(ERS_FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map(drop)
            .map_err(|source| Error::PatchObject {
                kind: Secret::kind(&()),
                what: "proxy data",
                namespace: self.namespace.clone(),
                name: self.proxy_secret_name(),
                source: Box::new(source),
            })
    }

    fn update_gauges(&self, census: &Census) {
        if !self.ctx.options.runner_gauges {
            return;
        }
        let (name, namespace) = scale_set_identity(self.set);
        let mut labels = ScaleSetLabels {
            name,
            namespace,
            ..ScaleSetLabels::default()
        };
        if let Ok(config) =
            GitHubConfig::parse(&self.set.spec.ephemeral_runner_spec.github_config_url)
        {
            match config.scope() {
                Scope::Organization { organization } => {
                    labels.organization.clone_from(organization)
                }
                Scope::Enterprise { enterprise } => labels.enterprise.clone_from(enterprise),
                Scope::Repository { owner, repository } => {
                    labels.organization.clone_from(owner);
                    labels.repository.clone_from(repository);
                }
            }
        }
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let metrics = &self.ctx.metrics;
        metrics
            .pending_runners
            .get_or_create(&labels)
            .set(count(census.pending.len()));
        metrics
            .running_runners
            .get_or_create(&labels)
            .set(count(census.running.len()));
        metrics
            .failed_runners
            .get_or_create(&labels)
            .set(count(census.failed.len()));
    }

    /// The scaling step; returns when to come back early (a scale-down waiting for runners to become
    /// removable).
    async fn scale(&self, census: &Census) -> Result<Option<Duration>> {
        let patch_id = self.set.spec.patch_id;
        let applied = already_applied(
            patch_id,
            self.set.metadata.generation,
            self.set.annotations().get(APPLIED_GENERATION_ANNOTATION),
            census,
        );
        // The listing is recorded on every pass, acted upon or not: a runner listed now may leave later.
        let listed = listing(self.set.annotations());
        // The runners counted as holding a place, the registration each holds, and whether each one's pod
        // succeeded (its teardown may lag).
        let counted: Vec<Counted<'_>> = census
            .counted()
            .map(|runner| {
                let pod = self.pod_of(runner);
                let registration = self.registration_of(runner, pod.as_deref());
                Counted {
                    name: runner.metadata.name.as_deref().unwrap_or_default(),
                    registration,
                    succeeded: in_teardown(runner, pod.as_deref())
                        && may_have_left_with_job(
                            self.memory,
                            &runner.uid().unwrap_or_default(),
                            registration,
                        ),
                }
            })
            .collect();
        // Built only when the set has a ledger to prune.
        let present = OnceCell::new();
        let (places, released_in) = self.ctx.completions.standing(
            &self.key,
            &listed,
            &counted,
            |name| {
                present
                    .get_or_init(|| census.names().collect::<HashSet<String>>())
                    .contains(name)
            },
            self.ctx.options.completion_hold,
        );
        let replicas = self.set.spec.replicas;
        let decision = plan(replicas, patch_id, applied, census, places);
        let held_back = places_held(replicas, census, places);
        let result = match decision {
            ScalePlan::AlreadyApplied => return Ok(None),
            ScalePlan::Hold => Ok(None),
            ScalePlan::Create(count) => self.create_runners(count).await.map(|()| None),
            ScalePlan::Remove(count) => self.remove_idle(census, count).await,
        };
        // A request served only in part (places held) is not recorded as acted upon: it is served again when they
        // are released, by a patch listing them or by the clock.
        let result = if held_back > 0 {
            tracing::info!(
                held = held_back,
                "keeping places of runners that left with a job until the listener lists them"
            );
            result.map(|early| early.into_iter().chain(released_in).min())
        } else {
            if result.is_ok() && patch_id > 0 {
                self.record_applied_generation().await?;
            }
            result
        };
        // Finished runners go whenever a scaling step ran; failures here are only logged, as in ARC.
        for runner in &census.finished {
            if let Err(error) =
                delete_if_present(&self.runners, &runner.name_any(), &self.namespace).await
            {
                tracing::warn!(%error, "deleting a finished runner failed");
            }
        }
        result
    }

    async fn record_applied_generation(&self) -> Result<()> {
        let Some(generation) = self.set.metadata.generation else {
            return Ok(());
        };
        let value = generation.to_string();
        if self.set.annotations().get(APPLIED_GENERATION_ANNOTATION) == Some(&value) {
            return Ok(());
        }
        let patch =
            json!({ "metadata": { "annotations": { APPLIED_GENERATION_ANNOTATION: value } } });
        self.api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|source| Error::PatchObject {
                kind: EphemeralRunnerSet::kind(&()),
                what: "applied generation",
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            })
    }

    async fn create_runners(&self, count: usize) -> Result<()> {
        let owner = controller_ref(self.set)?;
        let template = desired_runner(
            self.set,
            owner,
            &self.ctx.options.exclude_label_propagation_prefixes,
            &runner_spec_hash(&self.set.spec.ephemeral_runner_spec)?,
        );
        // Runners of this batch may be gone before it ends (a short job); their deletions must settle them.
        self.ctx.expectations.creating(&self.key);
        let results: Vec<Result<String>> = stream::iter(0..count)
            .map(|_| {
                let runner = template.clone();
                async move {
                    self.runners
                        .create(&PostParams::default(), &runner)
                        .await
                        .map(|created| created.name_any())
                        .map_err(|source| Error::CreateObject {
                            kind: EphemeralRunner::kind(&()),
                            namespace: self.namespace.clone(),
                            name: runner.metadata.generate_name.clone().unwrap_or_default(),
                            source: Box::new(source),
                        })
                }
            })
            .buffer_unordered(self.ctx.options.runner_set_parallelism.max(1))
            .collect()
            .await;
        let (created, errors): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
        let created: Vec<String> = created.into_iter().filter_map(Result::ok).collect();
        self.ctx
            .metrics
            .runners_created
            .get_or_create(&self.scale_set())
            .inc_by(u64::try_from(created.len()).unwrap_or(u64::MAX));
        tracing::info!(created = created.len(), requested = count, "scaled up");
        self.ctx.expectations.created(&self.key, created);
        collect_errors(errors.into_iter().filter_map(Result::err).collect())
    }

    /// Removes up to `count` idle runners: deregister, then delete. Runners the service reports busy are skipped
    /// and the next candidates tried, in parallel batches.
    async fn remove_idle(&self, census: &Census, count: usize) -> Result<Option<Duration>> {
        let grace = self.ctx.options.scale_down.ready_grace_period;
        let (candidates, retry_after) = removal_candidates(
            census,
            |runner| self.pod_of(runner),
            |runner, pod| self.registration_of(runner, pod),
            grace,
            Timestamp::now(),
        );
        // Runners kept for a reason other than the grace period (busy, not registered, waiting for a node)
        // become removable by a change of their own status or their deletion, each an event of this set: only
        // the grace period, a matter of the clock, needs a timer.
        if candidates.is_empty() {
            return Ok(retry_after);
        }
        let mut remaining = candidates.into_iter();
        let mut needed = count;
        let mut removed = Vec::new();
        let mut errors = Vec::new();
        while needed > 0 {
            let batch: Vec<_> = remaining.by_ref().take(needed).collect();
            if batch.is_empty() {
                break;
            }
            let (gone, failed) = self.deregister_and_delete_all(batch).await;
            needed -= gone.len();
            removed.extend(gone);
            errors.extend(failed);
        }
        self.ctx
            .metrics
            .runners_scaled_down
            .get_or_create(&self.scale_set())
            .inc_by(u64::try_from(removed.len()).unwrap_or(u64::MAX));
        tracing::info!(removed = removed.len(), requested = count, "scaled down");
        self.ctx.expectations.deleted(&self.key, removed);
        collect_errors(errors)?;
        Ok(if needed > 0 { retry_after } else { None })
    }

    /// Deregisters and deletes the runners an older template made that may go now (failed, or idle); returns
    /// whether any went, and the removals that failed. Busy ones finish their job first; the service's word
    /// decides, as for a scale-down.
    async fn replace_stale(&self, census: &Census, hash: &str) -> (bool, Result<()>) {
        let stale = stale_runners(census, hash);
        if stale.is_empty() {
            return (false, Ok(()));
        }
        let (removed, errors) = self.deregister_and_delete_all(stale).await;
        if !removed.is_empty() {
            tracing::info!(
                replaced = removed.len(),
                "runners of an older template removed; replacements follow"
            );
        }
        let any = !removed.is_empty();
        self.ctx.expectations.deleted(&self.key, removed);
        (any, collect_errors(errors))
    }

    /// An Actions client for `runner`'s registration: the service and credentials the runner was registered with
    /// (its own spec), not the set's current ones, which a change of `githubConfigUrl` or of the credentials may
    /// point at another organization or host. There, the runner's id is unknown or another runner's: the answer
    /// would count as removed while the real registration stays. `None` when the credentials are gone (the set
    /// is then torn down without deregistering, which nothing could do any more).
    async fn actions(&self, runner: &EphemeralRunner) -> Result<Option<Actions>> {
        match self
            .ctx
            .actions
            .get(&ClientSource::for_runner(runner))
            .await
        {
            Ok(actions) => Ok(Some(actions)),
            Err(error)
                if credentials_gone(&error) && self.set.meta().deletion_timestamp.is_some() =>
            {
                tracing::warn!(%error, "credentials are gone; runners are deleted without deregistration");
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    /// [`Self::deregister_and_delete`] for each of `runners`, in parallel (bounded); returns the names of those
    /// removed and the errors met. Runners the service reports busy are in neither.
    async fn deregister_and_delete_all(
        &self,
        runners: Vec<&Arc<EphemeralRunner>>,
    ) -> (Vec<String>, Vec<Error>) {
        let outcomes: Vec<(String, Result<bool>)> = stream::iter(runners.into_iter().cloned())
            .map(|runner: Arc<EphemeralRunner>| async move {
                (runner.name_any(), self.deregister_and_delete(&runner).await)
            })
            .buffer_unordered(self.ctx.options.runner_set_parallelism.max(1))
            .collect()
            .await;
        let mut removed = Vec::new();
        let mut errors = Vec::new();
        for (name, outcome) in outcomes {
            match outcome {
                Ok(true) => removed.push(name),
                Ok(false) => {}
                Err(error) => errors.push(error),
            }
        }
        (removed, errors)
    }

    /// Deregisters a runner, then deletes it; `false` when the service says it is busy (kept).
    async fn deregister_and_delete(&self, runner: &EphemeralRunner) -> Result<bool> {
        let runner_id = self.registration_of(runner, self.pod_of(runner).as_deref());
        let uid = runner.uid().unwrap_or_default();
        if runner_id != 0
            && !self.memory.was_deregistered(&uid, runner_id)
            && let Some(actions) = self.actions(runner).await?
        {
            if actions.remove_runner(runner_id).await? == Removal::JobStillRunning {
                return Ok(false);
            }
            // The runner's own finalizer need not ask the service again.
            self.memory.deregistered(&uid, runner_id);
        }
        delete_if_present(&self.runners, &runner.name_any(), &self.namespace).await?;
        Ok(true)
    }

    /// Runner cleanup (docs/reference/controllers.md, "Runner cleanup"): terminal runners are deleted, idle ones
    /// deregistered and deleted, busy ones kept. Returns whether the set has no runners left.
    async fn cleanup(&self) -> Result<bool> {
        let census = Census::of(self.children());
        if census.total() == 0
            && census.finished.is_empty()
            && census.outdated.is_empty()
            && census.deleting.is_empty()
        {
            if self.set.spec.ephemeral_runner_spec.proxy.is_some() {
                delete_if_present(&self.secrets, &self.proxy_secret_name(), &self.namespace)
                    .await?;
            }
            return Ok(true);
        }
        let terminal = census
            .finished
            .iter()
            .chain(&census.failed)
            .chain(&census.outdated);
        let mut errors = Vec::new();
        for runner in terminal {
            if let Err(error) =
                delete_if_present(&self.runners, &runner.name_any(), &self.namespace).await
            {
                errors.push(error);
            }
        }
        collect_errors(errors)?;
        let idle: Vec<&Arc<EphemeralRunner>> = census
            .pending
            .iter()
            .chain(census.running.iter().filter(|runner| !runner.has_job()))
            .collect();
        if idle.is_empty() {
            return Ok(false);
        }
        let (_, errors) = self.deregister_and_delete_all(idle).await;
        collect_errors(errors)?;
        Ok(false)
    }

    /// Deletion (docs/reference/controllers.md, "ERS deletion"): runners first (busy ones are waited for), then the
    /// proxy Secret, then the finalizer. Runs on the set as just read from the API server, still carrying one of
    /// [`DELETION_FINALIZERS`].
    async fn finalize(&self) -> Result<Action> {
        if !self.cleanup().await? {
            // Busy runners finish and go, idle ones are already being deleted: each deletion is an event of
            // this set.
            return Ok(Action::requeue(self.ctx.options.resync_interval));
        }
        // A Secret has no finalizers of its own: once the delete is accepted it is gone, nothing to wait for.
        if self.set.spec.ephemeral_runner_spec.proxy.is_some() {
            delete_if_present(&self.secrets, &self.proxy_secret_name(), &self.namespace).await?;
        }
        remove_finalizers(&self.api, self.set, &DELETION_FINALIZERS).await?;
        self.ctx.expectations.forget(&self.key);
        self.ctx.completions.forget(&self.key);
        Ok(Action::await_change())
    }

    /// Applies the status when it differs (the controller is its only writer).
    async fn write_status(&self, census: &Census) -> Result<()> {
        let current = self.set.status.clone().unwrap_or_default();
        let desired = census.status(&current.phase);
        if self.set.status.is_some() && desired == current {
            return Ok(());
        }
        let body = json!({
            "apiVersion": crds::constants::API_VERSION,
            "kind": EphemeralRunnerSet::kind(&()),
            "status": desired,
        });
        self.api
            .patch_status(
                &self.name,
                &PatchParams::apply(ERS_FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map(drop)
            .map_err(|source| Error::PatchObject {
                kind: EphemeralRunnerSet::kind(&()),
                what: "status",
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            })
    }
}

fn collect_errors(mut errors: Vec<Error>) -> Result<()> {
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(Error::Several(errors)),
    }
}
