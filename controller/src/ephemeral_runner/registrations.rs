//! One runner's registrations in the Actions Service: finding them and removing them. Every removal the service
//! confirms is remembered ([`RunnerMemory::deregistered`]): the teardown then need not ask again, and the set's
//! census knows a runner deregistered while idle left with no job (`super::facts::may_have_left_with_job`).

use super::memory::RunnerMemory;
use super::pod::JitIdentity;
use crate::actions::{Actions, Removal};
use crate::error::Result;

/// The service client of a runner's scale set, with what identifies the runner there.
pub struct Registrations<'a> {
    pub actions: Actions,
    memory: &'a RunnerMemory,
    uid: &'a str,
    name: &'a str,
    scale_set_id: i64,
}

impl<'a> Registrations<'a> {
    pub fn new(
        actions: Actions,
        memory: &'a RunnerMemory,
        uid: &'a str,
        name: &'a str,
        scale_set_id: i64,
    ) -> Self {
        Self {
            actions,
            memory,
            uid,
            name,
            scale_set_id,
        }
    }

    /// The registration of the runner's name in its own scale set, if the service has one (a crash between
    /// registering and recording leaves one only the service knows).
    pub async fn by_name(&self) -> Result<Option<i64>> {
        Ok(self
            .actions
            .get_runner_by_name(self.name)
            .await?
            .filter(|found| found.runner_scale_set_id == self.scale_set_id)
            .map(|found| found.id))
    }

    /// `identity`'s registration, else the name's; 0 when there is none.
    pub async fn find(&self, identity: Option<&JitIdentity>) -> Result<i64> {
        match identity {
            Some(identity) => Ok(identity.runner_id),
            None => Ok(self.by_name().await?.unwrap_or(0)),
        }
    }

    /// Removes registration `runner_id` unless the service says it holds a job.
    pub async fn remove(&self, runner_id: i64) -> Result<Removal> {
        let removal = self.actions.remove_runner(runner_id).await?;
        if removal == Removal::Removed {
            self.memory.deregistered(self.uid, runner_id);
        }
        Ok(removal)
    }

    /// Removes each of `runner_ids` in turn, stopping at the first the service says holds a job.
    pub async fn remove_all(&self, runner_ids: impl IntoIterator<Item = i64>) -> Result<Removal> {
        for runner_id in runner_ids {
            if self.remove(runner_id).await? == Removal::JobStillRunning {
                return Ok(Removal::JobStillRunning);
            }
        }
        Ok(Removal::Removed)
    }

    /// Removes the runner's registration (`identity`'s, else the name's) unless the service says it holds a job;
    /// returns what happened and which registration it was (0: none).
    pub async fn remove_idle(&self, identity: Option<&JitIdentity>) -> Result<(Removal, i64)> {
        let runner_id = self.find(identity).await?;
        if runner_id == 0 {
            return Ok((Removal::Removed, 0));
        }
        Ok((self.remove(runner_id).await?, runner_id))
    }
}
