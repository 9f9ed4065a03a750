//! One runner's own objects in the API server (the runner, its pod, its JIT Secret, its container hooks' pods and
//! Secrets) and the requests a pass makes on them, each idempotent where the API allows it and each failure named.
//! Nothing is decided here: the executor (`reconcile`) says which request goes when, from what
//! [`super::lifecycle`] and [`super::pod_steps`] decided.

use std::borrow::Cow;

use crds::EphemeralRunner;
use crds::constants::RUNNER_POD_LABEL;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

use super::lifecycle::{RunnerFact, SecretFact};
use super::pod::{JitIdentity, JobMetadata, read_jit_identity};
use crate::actions::read_secret;
use crate::error::{Error, Result, is_status};
use crate::kubeutil::{
    add_finalizer_with_annotation, add_finalizers, delete_if_present, delete_terminated_pod,
    name_and_namespace, remove_finalizers,
};
use crate::options::{ER_FIELD_MANAGER, ER_JOB_METADATA_FIELD_MANAGER};
use crate::pods::CachedPod;

/// What became of the job's labels and annotations sent to a runner's pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetadataApplied {
    /// The pod carries them.
    Applied,
    /// The pod is gone (404), or the name now belongs to another pod (409): its own pass labels that one.
    PodGone,
    /// The scale set's namespace grants no pod patch (ARC's scale-set chart, whose manager Role stops at create,
    /// delete and get): the labels are an extra, never a reason to hold the runner's pass.
    Forbidden,
}

/// A runner's name, namespace and uid, and the API handles of its objects, all through one client (the lane's).
pub struct RunnerObjects {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    runners: Api<EphemeralRunner>,
    pods: Api<Pod>,
    secrets: Api<Secret>,
    client: kube::Client,
}

impl RunnerObjects {
    pub fn new(runner: &EphemeralRunner, client: kube::Client) -> Result<Self> {
        let (name, namespace) = name_and_namespace(runner)?;
        Ok(Self {
            uid: runner.uid().unwrap_or_default(),
            runners: Api::namespaced(client.clone(), &namespace),
            pods: Api::namespaced(client.clone(), &namespace),
            secrets: Api::namespaced(client.clone(), &namespace),
            client,
            name,
            namespace,
        })
    }

    /// Whether this very runner (same uid) still exists and is not being deleted, from the API server: the fence
    /// in front of a registration, which a cache a moment behind must never cause for a runner that is gone. A
    /// live runner comes back too: its pod template is what the Secret and the pod are made from.
    pub async fn read_self(&self) -> Result<(RunnerFact, Option<EphemeralRunner>)> {
        let current = self
            .runners
            .get_opt(&self.name)
            .await
            .map_err(|source| self.read_failed(EphemeralRunner::kind(&()), source))?;
        Ok(match current {
            Some(runner) if self.is_live(runner.meta()) => (RunnerFact::Live, Some(runner)),
            _ => (RunnerFact::Going, None),
        })
    }

    /// Whether `meta`, as the API server gave it, is this very runner's (same uid), not being deleted.
    fn is_live(&self, meta: &ObjectMeta) -> bool {
        meta.uid.as_deref() == Some(self.uid.as_str()) && meta.deletion_timestamp.is_none()
    }

    /// Whether this very runner (same uid) still exists and is not being deleted, from the API server's metadata
    /// of it alone: the fence after a registration, which needs no pod template ([`Self::read_self`] is the one
    /// before, whose copy the Secret and the pod are made from). The whole runner, template included, would cost
    /// the API server its encoding once more for every runner a burst creates.
    pub async fn still_live(&self) -> Result<RunnerFact> {
        let current = self
            .runners
            .get_metadata_opt(&self.name)
            .await
            .map_err(|source| self.read_failed(EphemeralRunner::kind(&()), source))?;
        Ok(match current {
            Some(meta) if self.is_live(&meta.metadata) => RunnerFact::Live,
            _ => RunnerFact::Going,
        })
    }

    /// The pod, from the API server.
    pub async fn read_pod(&self) -> Result<Option<CachedPod>> {
        self.pods
            .get_opt(&self.name)
            .await
            .map(|pod| pod.map(CachedPod::from))
            .map_err(|source| self.read_failed(Pod::kind(&()), source))
    }

    /// The JIT Secret, from the API server, and the identity it records.
    pub async fn read_jit_secret(&self) -> Result<(SecretFact, Option<JitIdentity>)> {
        Ok(
            match read_secret(&self.client, &self.namespace, &self.name).await? {
                None => (SecretFact::Absent, None),
                Some(secret) => match read_jit_identity(&secret) {
                    Ok(identity) => (SecretFact::Valid, Some(identity)),
                    Err(reason) => {
                        tracing::warn!(%reason, "the JIT Secret is corrupt; it is discarded");
                        (SecretFact::Corrupt, None)
                    }
                },
            },
        )
    }

    /// The registration the JIT Secret records, from the API server (0: no Secret, or none readable in it).
    pub async fn secret_registration(&self) -> Result<i64> {
        let (_, identity) = self.read_jit_secret().await?;
        Ok(identity.map_or(0, |identity| identity.runner_id))
    }

    /// Asks for the runner's deletion (idempotent: the object is gone or going either way).
    pub async fn delete_self(&self) -> Result<()> {
        delete_if_present(&self.runners, &self.name, &self.namespace)
            .await
            .map(drop)
    }

    /// Adds whichever of `finalizers` `runner` lacks, in one patch.
    pub async fn add_finalizers(
        &self,
        runner: &EphemeralRunner,
        finalizers: &[&str],
    ) -> Result<()> {
        add_finalizers(&self.runners, runner, finalizers)
            .await
            .map(drop)
    }

    /// Removes `finalizers` from `runner`, failing if its finalizers changed since it was read.
    pub async fn remove_finalizers(
        &self,
        runner: &EphemeralRunner,
        finalizers: &[&str],
    ) -> Result<()> {
        remove_finalizers(&self.runners, runner, finalizers)
            .await
            .map(drop)
    }

    /// Adds `finalizer` and sets annotation `key` to `value` in one patch, failing if the finalizers changed since
    /// `runner` was read.
    pub async fn add_finalizer_with_annotation(
        &self,
        runner: &EphemeralRunner,
        finalizer: &str,
        key: &str,
        value: &str,
    ) -> Result<()> {
        add_finalizer_with_annotation(&self.runners, runner, finalizer, key, value)
            .await
            .map(drop)
    }

    /// Merge-patches the runner's status under this controller's field manager; returns the runner as written.
    pub async fn patch_status(&self, patch: &Patch<Value>) -> Result<EphemeralRunner> {
        let params = PatchParams {
            field_manager: Some(ER_FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        self.runners
            .patch_status(&self.name, &params, patch)
            .await
            .map_err(|source| Error::PatchObject {
                kind: EphemeralRunner::kind(&()),
                what: "status",
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            })
    }

    /// Applies the job's labels and annotations to pod `pod_uid`. The uid in the body makes the apply fail instead
    /// of creating a pod when that one is already gone (an apply creates what does not exist): a pass working from a
    /// cache a moment behind must not bring a finished runner's pod back. Repeating it changes nothing (same content,
    /// same field manager).
    pub async fn apply_job_metadata(
        &self,
        metadata: &JobMetadata,
        pod_uid: &str,
    ) -> Result<MetadataApplied> {
        let patch = json!({
            "apiVersion": Pod::api_version(&()),
            "kind": Pod::kind(&()),
            "metadata": {
                "name": self.name,
                "uid": pod_uid,
                "labels": metadata.labels,
                "annotations": metadata.annotations,
            },
        });
        let params = PatchParams::apply(ER_JOB_METADATA_FIELD_MANAGER).force();
        match self
            .pods
            .patch(&self.name, &params, &Patch::Apply(&patch))
            .await
        {
            Ok(_) => Ok(MetadataApplied::Applied),
            Err(error) if is_status(&error, 404) || is_status(&error, 409) => {
                Ok(MetadataApplied::PodGone)
            }
            Err(error) if is_status(&error, 403) => {
                tracing::warn!(
                    namespace = %self.namespace,
                    pod = %self.name,
                    %error,
                    "may not patch runner pods here: the job's labels and annotations stay off this pod \
                     (the scale-set chart of arc-rs grants it)"
                );
                Ok(MetadataApplied::Forbidden)
            }
            Err(source) => Err(Error::PatchObject {
                kind: Pod::kind(&()),
                what: "job metadata",
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            }),
        }
    }

    /// Creates the JIT Secret; the API server's refusal is returned as it is, for the caller to classify.
    pub async fn create_secret(&self, secret: &Secret) -> kube::Result<Secret> {
        self.secrets.create(&PostParams::default(), secret).await
    }

    /// Creates the pod (`dry_run`: only asks whether the API server would admit it); a refusal is returned as it
    /// is, for the caller to classify.
    pub async fn create_pod(&self, pod: &Pod, dry_run: bool) -> kube::Result<Pod> {
        let params = PostParams {
            dry_run,
            ..PostParams::default()
        };
        self.pods.create(&params, pod).await
    }

    /// The error for a refused creation of one of the runner's objects, named after `kind`.
    pub fn create_failed(&self, kind: Cow<'static, str>, source: kube::Error) -> Error {
        Error::CreateObject {
            kind,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source: Box::new(source),
        }
    }

    /// Deletes the pod: the one of uid `terminated` only, when the cache shows it terminated (a pod made since under
    /// the same name is not this one), else whatever pod has the name.
    pub async fn delete_pod(&self, terminated: Option<&str>) -> Result<()> {
        match terminated {
            Some(uid) => delete_terminated_pod(&self.pods, &self.name, &self.namespace, uid)
                .await
                .map(drop),
            None => delete_if_present(&self.pods, &self.name, &self.namespace)
                .await
                .map(drop),
        }
    }

    /// Deletes the JIT Secret, if there is one.
    pub async fn delete_secret(&self) -> Result<()> {
        delete_if_present(&self.secrets, &self.name, &self.namespace)
            .await
            .map(drop)
    }

    /// Deletes the pods and Secrets the runner's container hooks created (label `runner-pod=<runner name>`).
    pub async fn delete_hook_objects(&self) -> Result<()> {
        let selector = ListParams::default().labels(&format!("{RUNNER_POD_LABEL}={}", self.name));
        let pods = self
            .pods
            .list(&selector)
            .await
            .map_err(|source| self.read_failed(Pod::kind(&()), source))?;
        for pod in pods
            .items
            .iter()
            .filter(|pod| pod.meta().deletion_timestamp.is_none())
        {
            delete_if_present(&self.pods, &pod.name_any(), &self.namespace).await?;
        }
        let secrets = self
            .secrets
            .list(&selector)
            .await
            .map_err(|source| self.read_failed(Secret::kind(&()), source))?;
        for secret in secrets
            .items
            .iter()
            .filter(|secret| secret.meta().deletion_timestamp.is_none())
        {
            delete_if_present(&self.secrets, &secret.name_any(), &self.namespace).await?;
        }
        Ok(())
    }

    fn read_failed(&self, kind: Cow<'static, str>, source: kube::Error) -> Error {
        Error::ReadObjects {
            kind,
            namespace: self.namespace.clone(),
            source: Box::new(source),
        }
    }
}
