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
        // None of these moments is announced by an event, so the pass comes back at the first of them:
        // - a report going stale changes the verdict;
        // - the status shows the scheduled minimum, which changes when a window opens or closes;
        // - a runner pod still Pending counts as blocked once it has been so for the limit;
        // - the scale set's existence check falls due (without this the check waited for whatever pass came
        //   next, so its cadence followed the listener's reports and differed between the listener modes).
        let now = Timestamp::now();
        let wait = next_look(
            options.resync_interval,
            [
                verdict.recheck_in,
                schedule_status::next_change_in(&self.runner_set.spec, now),
                self.next_pending_deadline(),
                self.ctx.scale_set_check_in(&self.key),
            ],
        );
        Ok((Action::requeue(wait), verdict.outcome))
    }
}

/// When to look at a set again: at the first of `moments` (each no sooner than [`SHORT_WAIT`], so a moment already
/// past does not spin the pass), and at the latest after `resync`.
fn next_look(
    resync: std::time::Duration,
    moments: impl IntoIterator<Item = Option<std::time::Duration>>,
) -> std::time::Duration {
    moments
        .into_iter()
        .flatten()
        .map(|moment| moment.max(SHORT_WAIT))
        .fold(resync, std::cmp::Ord::min)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::{SHORT_WAIT, next_look};

    #[test]
    fn the_first_moment_wins_and_nothing_is_sooner_than_the_short_wait() {
        let resync = Duration::from_secs(300);
        assert_eq!(next_look(resync, [None, None]), resync);
        assert_eq!(
            next_look(
                resync,
                [Some(Duration::from_secs(90)), Some(Duration::from_secs(30))]
            ),
            Duration::from_secs(30)
        );
        assert_eq!(next_look(resync, [Some(Duration::ZERO)]), SHORT_WAIT);
        assert_eq!(next_look(resync, [Some(Duration::from_secs(900))]), resync);
    }

    proptest! {
        #[test]
        fn never_later_than_resync_nor_sooner_than_the_short_wait(
            resync in 1u64..1000,
            moments in proptest::collection::vec(proptest::option::of(0u64..2000), 0..5),
        ) {
            let resync = Duration::from_secs(resync).max(SHORT_WAIT);
            let look = next_look(resync, moments.iter().map(|m| m.map(Duration::from_secs)));
            prop_assert!(look <= resync);
            prop_assert!(look >= SHORT_WAIT);
            for moment in moments.iter().flatten() {
                prop_assert!(look <= Duration::from_secs(*moment).max(SHORT_WAIT));
            }
        }
    }
}
