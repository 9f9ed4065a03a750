//! Liveness: whether the message loop is making progress.
//!
//! The loop is alive when it completed a poll (or created a session) recently, or when it is waiting out a
//! deliberate, bounded backoff. A loop stuck anywhere else (a hung connection, a deadlock) stops updating both,
//! and `/healthz` fails once the limit passes, so the kubelet restarts the pod. Backoff waits count as alive so
//! that a listener waiting for someone to fix its credentials is not turned into a crash loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Shared progress record; cheap to clone.
#[derive(Debug, Clone)]
pub struct Health {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    origin: Instant,
    limit: Duration,
    /// Milliseconds after `origin` of the last completed poll (or of the start).
    last_poll_ms: AtomicU64,
    /// Milliseconds after `origin` at which the current backoff ends; 0 when not backing off.
    backoff_until_ms: AtomicU64,
}

impl Health {
    /// A record that counts the start as progress; `limit` is how long the loop may go without progress.
    pub fn new(limit: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                origin: Instant::now(),
                limit,
                last_poll_ms: AtomicU64::new(0),
                backoff_until_ms: AtomicU64::new(0),
            }),
        }
    }

    /// The configured limit.
    pub fn limit(&self) -> Duration {
        self.inner.limit
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.inner.origin).as_millis())
            .unwrap_or(u64::MAX)
    }

    /// A poll completed (a message or an empty answer), or a session was created.
    pub fn poll_completed(&self) {
        self.inner
            .last_poll_ms
            .store(self.ms(Instant::now()), Ordering::Relaxed);
        self.inner.backoff_until_ms.store(0, Ordering::Relaxed);
    }

    /// The loop starts a deliberate wait of `wait`.
    pub fn backing_off(&self, wait: Duration) {
        let until = self.ms(Instant::now() + wait).max(1);
        self.inner.backoff_until_ms.store(until, Ordering::Relaxed);
    }

    /// Time since the last completed poll.
    pub fn last_poll_age(&self) -> Duration {
        let now = self.ms(Instant::now());
        Duration::from_millis(now.saturating_sub(self.inner.last_poll_ms.load(Ordering::Relaxed)))
    }

    /// Whether the loop made progress recently: a poll within the limit, or a backoff that ended less than the
    /// limit ago (the attempt after it is bounded by the same limit).
    pub fn is_healthy(&self) -> bool {
        let limit = u64::try_from(self.inner.limit.as_millis()).unwrap_or(u64::MAX);
        let now = self.ms(Instant::now());
        let polled = self.inner.last_poll_ms.load(Ordering::Relaxed);
        let backoff_until = self.inner.backoff_until_ms.load(Ordering::Relaxed);
        now.saturating_sub(polled) <= limit
            || (backoff_until != 0 && now <= backoff_until.saturating_add(limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn healthy_while_polling_or_backing_off() {
        let health = Health::new(Duration::from_secs(60));
        assert!(health.is_healthy(), "the start counts as progress");
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(health.is_healthy());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!health.is_healthy(), "no poll for 61 s");
        assert_eq!(health.last_poll_age(), Duration::from_secs(61));

        health.poll_completed();
        assert!(health.is_healthy());
        assert_eq!(health.last_poll_age(), Duration::ZERO);

        // A five-minute backoff keeps it alive, and so does the attempt right after it.
        health.backing_off(Duration::from_secs(300));
        tokio::time::advance(Duration::from_secs(330)).await;
        assert!(health.is_healthy());
        tokio::time::advance(Duration::from_secs(31)).await;
        assert!(
            !health.is_healthy(),
            "61 s after the backoff ended without progress"
        );

        health.poll_completed();
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(
            !health.is_healthy(),
            "a completed poll ends the backoff allowance"
        );
    }
}
