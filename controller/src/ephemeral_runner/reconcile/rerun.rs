//! A busy runner that lost its pod: why, said on the runner, and when its set asks for it, the re-run of its job,
//! owed from then on by a finalizer and asked of GitHub by the teardown lane once the runner is torn down
//! ([`super::super::rerun`] decides).

use super::super::rerun::{self, Interruption, rerun_limit, rerun_owed};
use super::*;
use crds::constants::{JOB_INTERRUPTED_ANNOTATION, JOB_RERUN_FINALIZER};

impl Step<'_> {
    /// A runner holding a job lost its pod (`pod` as last seen, `None` when gone): the Event (`event_reason`) says
    /// why and which job, and when the set asks for re-runs and the cluster is to blame, the re-run is owed before
    /// the runner's deletion (no finalizer can be added after). `otherwise`: what happened to the pod when it was
    /// not the cluster's doing.
    pub(super) async fn finish_with_job(
        &self,
        pod: Option<&CachedPod>,
        event_reason: &'static str,
        otherwise: &str,
    ) -> Result<Action> {
        let status = self.status();
        let (seen, remembered) = (
            rerun::interruption(pod),
            self.memory.pod_interrupted(&self.objects.uid),
        );
        let cause = rerun::more_telling(seen, remembered);
        tracing::info!(
            pod = pod.is_some(),
            ?seen,
            ?remembered,
            "a runner holding a job lost its pod"
        );
        let limit = self
            .live_set()
            .and_then(|set| rerun_limit(set.annotations()));
        let owed = rerun_owed(limit, &status, cause);
        if let Some(cause) = owed {
            self.owe_rerun(cause).await?;
        }
        let (patch, report) =
            rerun::finished_with_job(&status, event_reason, cause, otherwise, owed.is_some());
        self.patch_status(&patch).await?;
        self.leave(report).await
    }

    /// Adds the re-run finalizer and the interruption's annotation in one patch, failing (the pass is retried) if
    /// the finalizers changed since the runner was read.
    async fn owe_rerun(&self, cause: Interruption) -> Result<()> {
        self.objects
            .add_finalizer_with_annotation(
                self.runner,
                JOB_RERUN_FINALIZER,
                JOB_INTERRUPTED_ANNOTATION,
                cause.label(),
            )
            .await
    }
}
