//! Sends the status patches of [`super::super::status_patch`] under this controller's field manager.

use super::*;

impl Step<'_> {
    /// Records `identity` in `patch` when the status does not hold it yet ([`StatusPatch::record_identity`]).
    pub(super) fn record_identity(&self, identity: &JitIdentity, patch: &mut StatusPatch) {
        patch.record_identity(&self.status(), identity, || self.view_version());
    }

    /// The resource version of this pass's view: its last status write's, or the runner's as it read it.
    pub(super) fn view_version(&self) -> Option<String> {
        crate::context::lock(&self.written_at)
            .clone()
            .or_else(|| self.runner.resource_version())
    }

    /// Merge-patches the named status fields under this controller's field manager.
    pub(super) async fn patch_status(&self, patch: &StatusPatch) -> Result<()> {
        if patch.is_empty() {
            return Ok(());
        }
        let params = PatchParams {
            field_manager: Some(ER_FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        self.api
            .patch_status(
                &self.name,
                &params,
                &patch.to_patch(&self.status().failures)?,
            )
            .await
            .map(|mut written| {
                *crate::context::lock(&self.written_at) = written.resource_version();
                // Cached the way the watch caches it.
                written.managed_fields_mut().clear();
                super::super::prune_cached_runner(&mut written);
                self.memory.wrote(&self.uid, written);
            })
            .map_err(|source| Error::PatchObject {
                kind: EphemeralRunner::kind(&()),
                what: "status",
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                source: Box::new(source),
            })
    }
}
