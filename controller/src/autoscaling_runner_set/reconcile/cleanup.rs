//! Deletion (docs/reference/controllers.md, "ARS deletion"): listeners, EphemeralRunnerSet, scale set, the
//! cleanup-protection finalizers of Helm's objects, then the set's own finalizer.

use crds::constants::{
    AUTOSCALING_RUNNER_SET_FINALIZER, CLEANUP_GITHUB_SECRET_NAME_ANNOTATION,
    CLEANUP_KUBERNETES_MODE_ROLE_BINDING_NAME_ANNOTATION,
    CLEANUP_KUBERNETES_MODE_ROLE_NAME_ANNOTATION,
    CLEANUP_KUBERNETES_MODE_SERVICE_ACCOUNT_NAME_ANNOTATION,
    CLEANUP_MANAGER_ROLE_BINDING_ANNOTATION, CLEANUP_MANAGER_ROLE_NAME_ANNOTATION,
    CLEANUP_NO_PERMISSION_SERVICE_ACCOUNT_NAME_ANNOTATION, CLEANUP_PROTECTION_FINALIZER,
};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::ListParams;
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::{SHORT_WAIT, Step};
use crate::autoscaling_runner_set::desired::desired_listener_name;
use crate::error::{Error, Result, is_status};
use crate::kubeutil::{delete_if_present, remove_finalizers};

impl Step<'_> {
    /// Deletion (docs/reference/controllers.md, "ARS deletion"), in order; each step waits until its objects are
    /// gone. Runs on the set as just read from the API server, still carrying the finalizer
    /// ([`crate::kubeutil::still_finalizing`]): everything below goes by name.
    pub(super) async fn finalize(&self) -> Result<Action> {
        let current = desired_listener_name(self.runner_set);
        let mut listeners = self.orphan_listeners(&current);
        listeners.push(current);
        let mut waiting = false;
        for listener in &listeners {
            waiting |= self.delete_listener(listener).await?;
        }
        if waiting {
            return Ok(Action::requeue(SHORT_WAIT));
        }
        // The set's own runner set and any an earlier controller left (their runners deregister as they go).
        let superseded = self.superseded_runner_sets();
        let own = self.get_runner_set().await?;
        if own.is_some() || !superseded.is_empty() {
            if own.is_some_and(|set| set.meta().deletion_timestamp.is_none()) {
                delete_if_present(&self.runner_sets, &self.name, &self.namespace).await?;
            }
            for (name, deleting) in superseded {
                if !deleting {
                    delete_if_present(&self.runner_sets, &name, &self.namespace).await?;
                }
            }
            return Ok(Action::requeue(SHORT_WAIT));
        }
        self.delete_scale_set().await?;
        self.release_protected_objects().await?;
        remove_finalizers(
            &self.api,
            self.runner_set,
            &[AUTOSCALING_RUNNER_SET_FINALIZER],
        )
        .await?;
        self.ctx.forget(&self.key);
        // A deleted set has no session to report, and its series must not linger as 0 either.
        self.ctx
            .base
            .metrics
            .listener_session_held
            .remove(&self.metric_labels());
        Ok(Action::await_change())
    }

    /// Lets Helm's protected objects go, in ARC's order (docs/reference/controllers.md, "ARS deletion", step 4).
    async fn release_protected_objects(&self) -> Result<()> {
        let annotations = self.runner_set.annotations();
        let client = &self.ctx.base.client;
        let ns = self.namespace.as_str();
        for (annotation, kind) in [
            (
                CLEANUP_KUBERNETES_MODE_ROLE_BINDING_NAME_ANNOTATION,
                ObjectKind::RoleBinding,
            ),
            (
                CLEANUP_KUBERNETES_MODE_ROLE_NAME_ANNOTATION,
                ObjectKind::Role,
            ),
            (
                CLEANUP_KUBERNETES_MODE_SERVICE_ACCOUNT_NAME_ANNOTATION,
                ObjectKind::ServiceAccount,
            ),
            (
                CLEANUP_NO_PERMISSION_SERVICE_ACCOUNT_NAME_ANNOTATION,
                ObjectKind::ServiceAccount,
            ),
            (CLEANUP_GITHUB_SECRET_NAME_ANNOTATION, ObjectKind::Secret),
            (
                CLEANUP_MANAGER_ROLE_BINDING_ANNOTATION,
                ObjectKind::RoleBinding,
            ),
            (CLEANUP_MANAGER_ROLE_NAME_ANNOTATION, ObjectKind::Role),
        ] {
            let Some(name) = annotations.get(annotation).filter(|n| !n.is_empty()) else {
                continue;
            };
            match kind {
                ObjectKind::RoleBinding => {
                    release::<RoleBinding>(&Api::namespaced(client.clone(), ns), name, ns).await?
                }
                ObjectKind::Role => {
                    release::<Role>(&Api::namespaced(client.clone(), ns), name, ns).await?
                }
                ObjectKind::ServiceAccount => {
                    release::<ServiceAccount>(&Api::namespaced(client.clone(), ns), name, ns)
                        .await?
                }
                ObjectKind::Secret => {
                    release::<Secret>(&Api::namespaced(client.clone(), ns), name, ns).await?
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum ObjectKind {
    RoleBinding,
    Role,
    ServiceAccount,
    Secret,
}

/// Removes the cleanup-protection finalizer from an object; gone (or, for a Secret, no longer readable) counts
/// as done.
///
/// The object is read with a list by name, not a get: the scale-set chart's manager Role, which grants the get,
/// is bound by the manager RoleBinding released just before it, so a later pass (the Role's finalizer, or a pass
/// that failed after the binding went) has only what the controller chart grants, which lists ServiceAccounts,
/// Roles and RoleBindings and patches Roles. A get would be refused there and the set never finalized.
async fn release<K>(api: &Api<K>, name: &str, namespace: &str) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let by_name = ListParams::default().fields(&format!("metadata.name={name}"));
    let found = match api.list(&by_name).await {
        Ok(list) => list.items.into_iter().next(),
        Err(error) if K::kind(&()) == Secret::kind(&()) && is_status(&error, 403) => None,
        Err(source) => {
            return Err(Error::ReadObjects {
                kind: K::kind(&()),
                namespace: namespace.to_owned(),
                source: Box::new(source),
            });
        }
    };
    let Some(obj) = found else {
        return Ok(());
    };
    remove_finalizers(api, &obj, &[CLEANUP_PROTECTION_FINALIZER]).await?;
    Ok(())
}
