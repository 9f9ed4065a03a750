//! The set's status: phase, counters and conditions (among them the runners that cannot start, from the manager's
//! caches), written only when they changed, and the Events for condition changes that matter to users.

use std::sync::Arc;
use std::time::Duration;

use crds::constants::phase;
use crds::{AutoscalingRunnerSet, EphemeralRunner};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::Step;
use crate::autoscaling_runner_set::conditions::{self, Finding, Observation};
use crate::autoscaling_runner_set::runners::{
    blockage, pending_deadline, runner_set_of_runner, runners_finding,
};
use crate::autoscaling_runner_set::schedule_status;
use crate::autoscaling_runner_set::served::LISTENER_PROGRESS_REASONS;
use crate::error::Result;
use crate::options::ARS_FIELD_MANAGER;
use crate::pods::CachedPod;

impl Step<'_> {
    /// The set's runner pods, from the manager's caches (runners being deleted left out).
    fn runner_pods(
        &self,
    ) -> impl Iterator<Item = (Arc<EphemeralRunner>, Option<Arc<CachedPod>>)> + '_ {
        let stores = &self.ctx.base.stores;
        let set = ObjectRef::<AutoscalingRunnerSet>::new(&self.name).within(&self.namespace);
        stores
            .runners
            .state()
            .into_iter()
            .filter(move |runner| {
                runner.metadata.deletion_timestamp.is_none()
                    && runner_set_of_runner(runner).as_ref() == Some(&set)
            })
            .map(|runner| {
                let pod = stores
                    .pods
                    .get(&ObjectRef::new(&runner.name_any()).within(&self.namespace));
                (runner, pod)
            })
    }

    /// When the first of the set's Pending runner pods would count as blocked by the clock alone.
    pub(super) fn next_pending_deadline(&self) -> Option<Duration> {
        let now = Timestamp::now();
        let limit = self.ctx.base.options.pending_pod_limit;
        self.runner_pods()
            .filter_map(|(_, pod)| pending_deadline(pod.as_deref()?, now, limit))
            .min()
    }

    /// The set's runners that cannot start, from the manager's caches of runners and their pods.
    fn runners(&self) -> Result<String, Finding> {
        let mut total = 0;
        let mut blocked = Vec::new();
        for (runner, pod) in self.runner_pods() {
            total += 1;
            let name = runner.name_any();
            if let Some(why) = blockage(
                &runner,
                pod.as_deref(),
                self.ctx.base.options.pending_pod_limit,
            ) {
                blocked.push((name, why));
            }
        }
        runners_finding(&blocked, total)
    }

    /// Writes phase, counters and conditions; publishes an Event when the `Ready` reason changes.
    pub(super) async fn write_status(
        &self,
        scale_set: Result<String, Finding>,
        listener: Option<Result<String, Finding>>,
        runner_set_status: Option<&crds::EphemeralRunnerSetStatus>,
    ) -> Result<()> {
        let previous = self.runner_set.status.clone().unwrap_or_default();
        let mut status = previous.clone();
        let fully_reconciled = scale_set.is_ok() && listener.is_some();
        if let Some(counts) = runner_set_status {
            // All four counters (ARC only copies them when the current count changes;
            // docs/reference/controllers.md, "Status and conditions").
            status.current_runners = counts.current_replicas;
            status.pending_ephemeral_runners = counts.pending_ephemeral_runners;
            status.running_ephemeral_runners = counts.running_ephemeral_runners;
            status.failed_ephemeral_runners = counts.failed_ephemeral_runners;
        }
        if fully_reconciled {
            status.phase = phase::RUNNING.to_owned();
        }
        schedule_status::apply(&mut status, &self.runner_set.spec, Timestamp::now());
        self.ctx
            .base
            .metrics
            .listener_session_held
            .get_or_create(&self.metric_labels())
            .set(i64::from(matches!(listener, Some(Ok(_)))));
        let observation = Observation {
            scale_set,
            listener,
            runners: Some(self.runners()),
            capacity: runner_set_status.map(|counts| {
                (
                    counts.current_replicas,
                    self.runner_set.spec.effective_max_runners(),
                )
            }),
        };
        let now = Time(Timestamp::now());
        let mut computed = conditions::compute(
            &previous.conditions,
            &observation,
            self.runner_set.metadata.generation,
            &now,
        );
        if observation.capacity.is_none() {
            // Not observed this pass: keep what was known.
            if let Some(kept) = previous
                .conditions
                .iter()
                .find(|c| c.type_ == conditions::MAX_RUNNERS_REACHED)
            {
                computed.insert(computed.len() - 1, kept.clone());
            }
        }
        status.conditions = computed;
        self.announce(&previous.conditions, &status.conditions)
            .await;
        // Unchanged conditions keep their times, so an unchanged status compares equal: no write.
        if status == previous {
            return Ok(());
        }
        self.apply_status(&status).await
    }

    /// Events for condition changes that matter to users.
    async fn announce(&self, previous: &[Condition], current: &[Condition]) {
        let before = conditions::ready(previous);
        if let Some(now) = conditions::ready(current) {
            let changed = before.is_none_or(|b| b.status != now.status || b.reason != now.reason);
            if changed {
                if now.status == "True" {
                    if before.is_some() {
                        self.event(EventType::Normal, "Ready", "Reconcile", now.message.clone())
                            .await;
                    }
                } else if !is_transient_reason(&now.reason) {
                    self.event(
                        EventType::Warning,
                        &now.reason,
                        "Reconcile",
                        now.message.clone(),
                    )
                    .await;
                }
            }
        }
        let find = |list: &[Condition]| {
            list.iter()
                .find(|c| c.type_ == conditions::MAX_RUNNERS_REACHED)
                .map(|c| c.status.clone())
        };
        if let (Some(before), Some(now)) = (find(previous), find(current))
            && before != now
            && now == "True"
        {
            self.event(
                EventType::Normal,
                "MaxRunnersReached",
                "Scale",
                format!(
                    "maxRunners ({}) reached: jobs wait for a runner to finish",
                    self.runner_set.spec.effective_max_runners()
                ),
            )
            .await;
        }
    }

    pub(super) async fn apply_status(
        &self,
        status: &crds::AutoscalingRunnerSetStatus,
    ) -> Result<()> {
        let patch = json!({
            "apiVersion": crds::constants::API_VERSION,
            "kind": AutoscalingRunnerSet::kind(&()),
            "status": status,
        });
        self.api
            .patch_status(
                &self.name,
                &PatchParams::apply(ARS_FIELD_MANAGER).force(),
                &Patch::Apply(patch),
            )
            .await
            .map(drop)
            .map_err(self.patch_error("status"))
    }
}

/// Reasons that describe progress rather than a problem: no Warning Event for them.
fn is_transient_reason(reason: &str) -> bool {
    LISTENER_PROGRESS_REASONS.contains(&reason)
        || matches!(
            reason,
            "ListenerRestarting" | "WaitingForScaleSet" | "EphemeralRunnerSetDeleting"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_reasons_are_not_warnings() {
        assert!(is_transient_reason("ListenerStarting"));
        assert!(is_transient_reason("SessionLost"));
        assert!(!is_transient_reason("CredentialsInvalid"));
        assert!(!is_transient_reason("SessionConflict"));
    }
}
