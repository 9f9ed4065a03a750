//! The set's AutoscalingListener: created, recreated when its settings change, listeners left under an older name
//! deleted, and its report and pod judged for the `ListenerReady` condition.

use crds::AutoscalingListener;
use crds::constants::{SCALE_SET_NAME_LABEL, SCALE_SET_NAMESPACE_LABEL};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::{SHORT_WAIT, Step};
use crate::autoscaling_runner_set::conditions::Finding;
use crate::autoscaling_runner_set::desired::{
    ListenerInputs, desired_listener, listener_up_to_date,
};
use crate::autoscaling_runner_set::schedule_status;
use crate::autoscaling_runner_set::served::{
    ListenerHost, ListenerView, TAKING_OVER, judge_listener,
};
use crate::error::{Error, Result};
use crate::kubeutil::{delete_if_present, get_if_present};

impl Step<'_> {
    /// Deletes listener `name` if present; returns whether it still exists.
    pub(super) async fn delete_listener(&self, name: &str) -> Result<bool> {
        let existing = get_if_present(&self.listeners, name, &self.ctx.namespace).await?;
        match existing {
            None => Ok(false),
            Some(listener) if listener.meta().deletion_timestamp.is_some() => Ok(true),
            Some(_) => delete_if_present(&self.listeners, name, &self.ctx.namespace).await,
        }
    }

    /// Listeners of this set under another name, left behind by a runner group or URL change
    /// (docs/reference/controllers.md, "Orphaned listeners").
    pub(super) fn orphan_listeners(&self, current: &str) -> Vec<String> {
        self.ctx
            .listeners
            .state()
            .iter()
            .filter(|listener| {
                let labels = listener.labels();
                listener.name_any() != current
                    && labels.get(SCALE_SET_NAME_LABEL) == Some(&self.name)
                    && labels.get(SCALE_SET_NAMESPACE_LABEL) == Some(&self.namespace)
            })
            .map(|listener| listener.name_any())
            .collect()
    }

    pub(super) async fn converge_listener(
        &self,
        scale_set_id: i64,
    ) -> Result<(Action, Result<String, Finding>)> {
        let options = &self.ctx.base.options;
        let desired = desired_listener(
            self.runner_set,
            scale_set_id,
            &ListenerInputs {
                namespace: &self.ctx.namespace,
                image: &options.listener.image,
                image_pull_secrets: &options.listener.image_pull_secrets,
                excluded_prefixes: &options.exclude_label_propagation_prefixes,
            },
        )?;
        let name = desired.name_any();
        let mut stopping = Vec::new();
        for orphan in self.orphan_listeners(&name) {
            tracing::info!(listener = %orphan, "deleting a listener left behind under an older name");
            if self.delete_listener(&orphan).await? {
                stopping.push(orphan);
            }
        }
        if !stopping.is_empty() {
            // Such a listener (an earlier controller's, still polling as the manager starts) holds the scale set's
            // message session and scales its own runner set: the set's listener starts once it is gone.
            return Ok((
                Action::requeue(SHORT_WAIT),
                Err(Finding::new(
                    TAKING_OVER,
                    format!(
                        "waiting for listener(s) {} left under another name to stop before this set's listener \
                         starts",
                        stopping.join(", ")
                    ),
                )),
            ));
        }
        let existing = get_if_present(&self.listeners, &name, &self.ctx.namespace).await?;
        let Some(existing) = existing else {
            self.listeners
                .create(&PostParams::default(), &desired)
                .await
                .map_err(|source| Error::CreateObject {
                    kind: AutoscalingListener::kind(&()),
                    namespace: self.ctx.namespace.clone(),
                    name: name.clone(),
                    source: Box::new(source),
                })?;
            return Ok((
                Action::requeue(SHORT_WAIT),
                Err(Finding::new("ListenerStarting", "creating the listener")),
            ));
        };
        if existing.meta().deletion_timestamp.is_some() {
            return Ok((
                Action::requeue(SHORT_WAIT),
                Err(Finding::new(
                    "ListenerRestarting",
                    "the previous listener is shutting down",
                )),
            ));
        }
        if !listener_up_to_date(&existing, &desired) {
            tracing::info!(listener = %name, "listener settings changed; recreating it");
            self.delete_listener(&name).await?;
            return Ok((
                Action::requeue(SHORT_WAIT),
                Err(Finding::new(
                    "ListenerRestarting",
                    "applying new listener settings",
                )),
            ));
        }
        let pod = self.ctx.listener_pod(&name);
        let task = self.ctx.listener_task(&name);
        // The manager's pod (its log carries the loops'), named in the condition's message.
        let manager_pod = std::env::var("HOSTNAME").unwrap_or_else(|_| "<manager pod>".to_owned());
        let host = match &self.ctx.base.listener_tasks {
            Some(_) => ListenerHost::Manager {
                task: task.as_ref(),
                pod: &manager_pod,
            },
            None => ListenerHost::Pod(pod.as_deref()),
        };
        let credentials = format!(
            "{}/{}",
            self.namespace, self.runner_set.spec.github_config_secret
        );
        let verdict = judge_listener(
            &ListenerView {
                listener: &existing,
                host,
                scale_set_id,
                credentials: &credentials,
                scale_set_check_interval: options.scale_set_check_interval,
            },
            Timestamp::now(),
        );
        // A report going stale changes the verdict without any event: look again by then.
        let wait = verdict
            .recheck_in
            .map_or(options.resync_interval, |recheck| {
                options.resync_interval.min(recheck.max(SHORT_WAIT))
            });
        // The status shows the scheduled minimum: look again when a window opens or closes.
        let wait = schedule_status::next_change_in(&self.runner_set.spec, Timestamp::now())
            .map_or(wait, |change| wait.min(change.max(SHORT_WAIT)));
        // A runner pod still Pending counts as blocked once it has been so for the limit, which no event
        // announces: look again at that moment, not at the next periodic pass.
        let wait = self
            .next_pending_deadline()
            .map_or(wait, |deadline| wait.min(deadline.max(SHORT_WAIT)));
        Ok((Action::requeue(wait), verdict.outcome))
    }
}
