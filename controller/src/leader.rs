//! Opt-in leader election on a `coordination.k8s.io/v1` Lease, so several manager replicas can run and only one
//! reconciles (`--enable-leader-election`, the Lease named by `--leader-election-id` in the manager's namespace).
//!
//! The protocol is client-go's: a candidate takes the Lease when it is free, already its own, or expired
//! (`renewTime + leaseDurationSeconds` in the past); the holder renews it every `retry_period`; every write is a
//! replace carrying the `resourceVersion` it read, so two candidates never both win. A leader that cannot renew
//! for `renew_deadline` must stop reconciling: [`LeaderElector::hold`] returns and the binary exits, as
//! controller-runtime does, so a restarted pod rejoins as a candidate. On a clean shutdown the Lease is released
//! (holder cleared) so another replica takes over at once instead of after the lease duration.
//!
//! Why no crate: kube-runtime 5.0 has no leader election, and none of the Lease crates fits. kube-leader-election
//! (0.44) is built on kube 4 and is a lock without fencing whose caller drives renewal and stepping down, which is
//! most of this module; kube-coordinate's newest release (2.0.0-rc.0) is built on kube 2; kube-lease-manager
//! (0.13) is on kube 5 but takes the Lease by server-side apply rather than client-go's read-and-replace, which
//! controller-runtime (ARC's manager) uses, and needs Rust 1.89 where the workspace supports 1.88. A second kube
//! in the binary or a second protocol costs more than this module, whose decisions are pure functions under test.

use std::future::Future;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result, is_status};

/// Timing of the election, client-go's defaults unless tests shorten them.
#[derive(Clone, Debug)]
pub struct LeaseTiming {
    /// How long a Lease stays valid after its last renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before giving up leadership.
    pub renew_deadline: Duration,
    /// Pause between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Whether `identity` may take (or keep) a Lease with this spec at `now`.
pub fn may_acquire(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> bool {
    match held_until(spec, identity) {
        Held::Free => true,
        Held::Until(expiry) => expiry < now,
    }
}

/// Who may take a Lease, and from when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// `identity` may take it now (none yet, released, its own, or never renewed).
    Free,
    /// Another holder's: free once this instant is past (`renewTime + leaseDurationSeconds`).
    Until(Timestamp),
}

/// Until when a Lease with this spec keeps `identity` out.
pub fn held_until(spec: Option<&LeaseSpec>, identity: &str) -> Held {
    let Some(spec) = spec else { return Held::Free };
    match spec.holder_identity.as_deref() {
        None | Some("") => Held::Free,
        Some(holder) if holder == identity => Held::Free,
        Some(_) => {
            let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
                return Held::Free;
            };
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0).max(0));
            Held::Until(renewed.0 + SignedDuration::from_secs(duration))
        }
    }
}

/// The spec to write when `identity` takes or renews a Lease that had `previous`.
pub fn claimed_spec(
    previous: Option<&LeaseSpec>,
    identity: &str,
    timing: &LeaseTiming,
    now: Timestamp,
) -> LeaseSpec {
    let same_holder = previous.and_then(|p| p.holder_identity.as_deref()) == Some(identity);
    let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        lease_duration_seconds: Some(
            i32::try_from(timing.lease_duration.as_secs()).unwrap_or(i32::MAX),
        ),
        acquire_time: if same_holder {
            previous.and_then(|p| p.acquire_time.clone())
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if same_holder || previous.is_none() {
            transitions
        } else {
            transitions.saturating_add(1)
        }),
        ..Default::default()
    }
}

/// One candidate in the election.
pub struct LeaderElector {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    timing: LeaseTiming,
}

impl LeaderElector {
    /// A candidate `identity` for Lease `namespace/name`.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timing: LeaseTiming,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            timing,
        }
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn error(&self, source: kube::Error) -> Error {
        Error::LeaderElection {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source: Box::new(source),
        }
    }

    /// One attempt to take or renew the Lease. `Ok(false)`: someone else holds it, or won a race.
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
        let now = Timestamp::now();
        let Some(mut lease) = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.error(e))?
        else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(claimed_spec(None, &self.identity, &self.timing, now)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(e) if is_status(&e, 409) => Ok(false),
                Err(e) => Err(self.error(e)),
            };
        };
        if !may_acquire(lease.spec.as_ref(), &self.identity, now) {
            return Ok(false);
        }
        lease.spec = Some(claimed_spec(
            lease.spec.as_ref(),
            &self.identity,
            &self.timing,
            now,
        ));
        // `replace` carries the resourceVersion read above: a concurrent writer makes this a 409, not a tie.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_status(&e, 409) => Ok(false),
            Err(e) => Err(self.error(e)),
        }
    }

    /// One attempt to take or renew the Lease, given up after `deadline`: an API server that accepts the
    /// connection and never answers must not hold the leader past its renew deadline.
    async fn attempt(&self, deadline: Duration) -> Result<bool> {
        match tokio::time::timeout(deadline, self.try_acquire_or_renew()).await {
            Ok(result) => result,
            Err(_) => Err(Error::LeaderElectionTimedOut {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                after: deadline,
            }),
        }
    }

    /// Waits until this candidate leads. `false` when `shutdown` fired first.
    ///
    /// Between attempts it watches the Lease: a leader that releases it (a SIGTERM, a rolling update) is followed
    /// one round trip later, and one that died (a SIGKILL, a lost node) the moment its last renewal expires, not
    /// up to a retry period later; either wait was most of a hand-over of the listeners' sessions
    /// (docs/listener-modes.md). Without the watch the retry period paces the attempts.
    pub async fn acquire(&self, shutdown: &CancellationToken) -> bool {
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let mut changes = std::pin::pin!(
            watcher(self.api.clone(), config)
                .default_backoff()
                .applied_objects()
        );
        // When the holder's last renewal seen expires: a dead holder's last renewal brings no event after it, so
        // it is remembered across attempts.
        let mut expiry = None;
        loop {
            match self.attempt(self.timing.renew_deadline).await {
                Ok(true) => {
                    tracing::info!(identity = %self.identity, lease = %self.name, "became leader");
                    return true;
                }
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, "leader election attempt failed"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return false,
                () = tokio::time::sleep(self.timing.retry_period) => {}
                () = freed(&mut changes, &self.identity, &mut expiry) => {}
            }
        }
    }

    /// Renews the Lease until `shutdown` fires (then releases it and returns `true`) or renewal has failed for
    /// `renew_deadline` (returns `false`: leadership is lost and the caller must stop reconciling).
    pub async fn hold(&self, shutdown: &CancellationToken) -> bool {
        self.hold_until(shutdown.cancelled()).await
    }

    /// Renews the Lease until `done` resolves (then releases it and returns `true`) or renewal has failed for
    /// `renew_deadline` (`false`). Each attempt gets what is left of the renew deadline, so an API server that
    /// stops answering ends the term by the deadline plus at most one retry period.
    async fn hold_until(&self, done: impl Future<Output = ()>) -> bool {
        let mut done = std::pin::pin!(done);
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = &mut done => {
                    self.release().await;
                    return true;
                }
                () = tokio::time::sleep(self.timing.retry_period) => {}
            }
            let left = self
                .timing
                .renew_deadline
                .saturating_sub(last_renewal.elapsed());
            match self.attempt(left).await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => {
                    tracing::error!(identity = %self.identity, "another replica took the leader Lease");
                    return false;
                }
                Err(error) => tracing::warn!(%error, "renewing the leader Lease failed"),
            }
            if last_renewal.elapsed() >= self.timing.renew_deadline {
                tracing::error!(identity = %self.identity, "could not renew the leader Lease in time");
                return false;
            }
        }
    }

    /// Leads: waits for the Lease, then runs `controllers` (given a token that asks them to stop) while holding
    /// it. The Lease is kept, and renewed, until the controllers have stopped: on `shutdown` they finish their
    /// in-flight passes first, and a successor that took the Lease at the signal would reconcile the same
    /// objects at the same time (a rolling update during a burst: both create runners for the same demand).
    /// Losing the Lease ends the term at once with [`Error::LeadershipLost`], without waiting for in-flight
    /// passes: another replica may already lead. The caller exits the process then, which ends what the
    /// controllers spawned.
    pub async fn lead<F, Fut>(&self, shutdown: &CancellationToken, controllers: F) -> Result<()>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        if !self.acquire(shutdown).await {
            return Ok(());
        }
        let stop = shutdown.child_token();
        let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
        let run = async {
            let result = controllers(stop.clone()).await;
            let _ = stopped_tx.send(());
            result
        };
        let hold = self.hold_until(async {
            let _ = stopped_rx.await;
        });
        let mut run = std::pin::pin!(run);
        let mut hold = std::pin::pin!(hold);
        let mut result = None;
        loop {
            tokio::select! {
                finished = &mut run, if result.is_none() => result = Some(finished),
                kept = &mut hold => {
                    if !kept {
                        stop.cancel();
                        return Err(Error::LeadershipLost);
                    }
                    // Released after the controllers stopped.
                    return result.unwrap_or(Ok(()));
                }
            }
        }
    }

    /// Clears the holder if it is still us, so the next replica need not wait for the Lease to expire.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        // A one-second lease that ended now: free at once for everyone, as client-go's ReleaseOnCancel does.
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        if let Err(error) = self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            tracing::warn!(%error, "releasing the leader Lease failed; it expires by itself");
        }
    }
}

/// Resolves once `identity` may take the Lease: a change shows it released, or the expiry of the holder's last
/// renewal seen (`expiry`, updated from every change, cleared when it fires so a lost race does not spin) has
/// passed. A failing watch brings no change: the caller's retry period paces the attempts then.
async fn freed<S>(changes: &mut S, identity: &str, expiry: &mut Option<Timestamp>)
where
    S: Stream<Item = std::result::Result<Lease, watcher::Error>> + Unpin,
{
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(Ok(lease)) => match held_until(lease.spec.as_ref(), identity) {
                    Held::Free => return,
                    Held::Until(at) => *expiry = Some(at),
                },
                Some(Err(_)) => {}
                // Watchers never end; should this one, the expiry seen still counts.
                None => {
                    past(expiry.take()).await;
                    return;
                }
            },
            () = past(*expiry) => {
                *expiry = None;
                return;
            }
        }
    }
}

/// Resolves just past `at` (`may_acquire` wants the expiry strictly behind); never without one.
async fn past(at: Option<Timestamp>) {
    match at {
        Some(at) => tokio::time::sleep(until(at) + EXPIRY_MARGIN).await,
        None => std::future::pending().await,
    }
}

/// How long after the observed expiry an attempt goes out.
const EXPIRY_MARGIN: Duration = Duration::from_millis(20);

/// How long from now until `at` (zero when past).
fn until(at: Timestamp) -> Duration {
    Duration::try_from(at.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, renewed_secs_ago: i64, duration: i32) -> LeaseSpec {
        let now = Timestamp::now();
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: Some(duration),
            renew_time: Some(MicroTime(now - SignedDuration::from_secs(renewed_secs_ago))),
            ..Default::default()
        }
    }

    #[test]
    fn who_may_take_the_lease() {
        let now = Timestamp::now();
        assert!(may_acquire(None, "a", now), "no Lease yet");
        assert!(may_acquire(Some(&spec(None, 0, 15)), "a", now), "released");
        assert!(
            may_acquire(Some(&spec(Some(""), 0, 15)), "a", now),
            "empty holder"
        );
        assert!(
            may_acquire(Some(&spec(Some("a"), 0, 15)), "a", now),
            "our own"
        );
        assert!(
            !may_acquire(Some(&spec(Some("b"), 5, 15)), "a", now),
            "held and fresh"
        );
        assert!(
            may_acquire(Some(&spec(Some("b"), 20, 15)), "a", now),
            "expired"
        );
        let no_times = LeaseSpec {
            holder_identity: Some("b".into()),
            ..Default::default()
        };
        assert!(may_acquire(Some(&no_times), "a", now), "never renewed");
    }

    #[test]
    fn a_held_lease_frees_when_its_last_renewal_expires() {
        let now = Timestamp::now();
        let held = spec(Some("b"), 5, 15);
        let renewed = held.renew_time.as_ref().unwrap().0;
        assert_eq!(
            held_until(Some(&held), "a"),
            Held::Until(renewed + SignedDuration::from_secs(15))
        );
        // The expiry is what `may_acquire` decides by: kept out before it, free after it.
        assert!(!may_acquire(Some(&held), "a", now));
        assert!(may_acquire(
            Some(&held),
            "a",
            renewed + SignedDuration::from_secs(15) + SignedDuration::from_millis(1)
        ));
        for free in [spec(None, 0, 15), spec(Some("a"), 0, 15)] {
            assert_eq!(held_until(Some(&free), "a"), Held::Free);
        }
        assert_eq!(held_until(None, "a"), Held::Free);
    }

    #[test]
    fn claiming_counts_transitions_and_keeps_acquire_time_on_renewal() {
        let timing = LeaseTiming::default();
        let t0 = Timestamp::now();
        let first = claimed_spec(None, "a", &timing, t0);
        assert_eq!(first.lease_transitions, Some(0));
        assert_eq!(first.lease_duration_seconds, Some(15));
        let t1 = t0 + SignedDuration::from_secs(2);
        let renewed = claimed_spec(Some(&first), "a", &timing, t1);
        assert_eq!(renewed.acquire_time, first.acquire_time);
        assert_eq!(renewed.renew_time, Some(MicroTime(t1)));
        assert_eq!(renewed.lease_transitions, Some(0));
        let taken = claimed_spec(Some(&renewed), "b", &timing, t1);
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
        assert_eq!(taken.acquire_time, Some(MicroTime(t1)));
        assert_eq!(taken.lease_transitions, Some(1));
    }
}
