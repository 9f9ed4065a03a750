//! When to repeat a request and how long to wait: pure decisions, driven by `backon` in the transport
//! (docs/reference/actions-service-protocol.md, "Retries").
//!
//! Only transient outcomes are retried: connection failures, 429 and 5xx other than 501. A request that may have
//! taken effect (a create call whose response was lost to a timeout or reset) is not repeated, because repeating
//! it would make a second scale set, a conflicting session or a duplicate runner registration.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use http::{HeaderMap, StatusCode, header::RETRY_AFTER};
use jiff::Timestamp;

/// Retry settings. The defaults are the reference client's: 4 retries (5 attempts), waits 1 s, 2 s, 4 s, 8 s
/// capped at 30 s, plus jitter so many clients recovering from one outage do not retry in lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt; 0 disables retrying.
    pub max_retries: u32,
    /// Wait before the first retry; doubles each retry.
    pub min_wait: Duration,
    /// Cap on the computed wait (a server's `Retry-After` is honoured beyond it, within the call deadline).
    pub max_wait: Duration,
    /// Randomise each wait within its upper half.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 4,
            min_wait: Duration::from_secs(1),
            max_wait: Duration::from_secs(30),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// No retries at all.
    pub fn none() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }

    /// The wait before retry number `retry` (0-based) without jitter: `min_wait × 2^retry`, capped.
    pub fn base_delay(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry).unwrap_or(u32::MAX);
        self.min_wait.saturating_mul(factor).min(self.max_wait)
    }
}

/// Whether repeating a request is harmless.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idempotency {
    /// Reads, deletes, refreshes, token requests, acquire-jobs: repeating gives the same end state.
    Safe,
    /// Creates: repeat only when the server certainly did not act (connection never made, 429, 5xx reported).
    Unsafe,
}

/// Transport-level failure classes that matter for retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportFailure {
    /// The connection was never established: nothing reached the server.
    Connect,
    /// The server's certificate was rejected: a configuration problem that retrying cannot fix.
    Certificate,
    /// The attempt timed out, possibly after the server received the request.
    Timeout,
    /// Reset, protocol error or similar after the request may have been sent.
    Interrupted,
    /// The request could not be built (bad header, unsupported scheme, redirect loop).
    Unsendable,
}

/// 429 and every 5xx except 501 Not Implemented.
pub fn status_is_transient(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS
        || (status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED)
}

/// Whether a response status warrants another attempt. `retry_auth_failures` is set only for runner-registration,
/// which GitHub may briefly answer with 401/403 right after the registration token is issued.
pub fn should_retry_status(status: StatusCode, retry_auth_failures: bool) -> bool {
    // A status response means the server processed and reported the outcome; the reference client's contract
    // (e.g. 500 on session creation is retried) applies to creates too.
    status_is_transient(status)
        || (retry_auth_failures
            && (status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN))
}

/// Whether a transport failure warrants another attempt.
pub fn should_retry_transport(failure: TransportFailure, idempotency: Idempotency) -> bool {
    match failure {
        TransportFailure::Connect => true,
        TransportFailure::Timeout | TransportFailure::Interrupted => {
            idempotency == Idempotency::Safe
        }
        TransportFailure::Certificate | TransportFailure::Unsendable => false,
    }
}

/// The server-requested wait of a 429 or 503 response: `Retry-After` as integer seconds or an HTTP date.
/// A date in the past means "now".
pub fn retry_after(status: StatusCode, headers: &HeaderMap, now: Timestamp) -> Option<Duration> {
    if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = jiff::fmt::rfc2822::parse(value).ok()?.timestamp();
    let wait = at.as_second().saturating_sub(now.as_second());
    Some(Duration::from_secs(u64::try_from(wait).unwrap_or(0)))
}

/// Exponential backoff with optional "equal jitter" (each wait uniform in the upper half of its base delay), as a
/// `backon` backoff.
#[derive(Debug, Clone)]
pub struct JitteredBackoff {
    policy: RetryPolicy,
    retry: u32,
    random: RandomState,
}

impl JitteredBackoff {
    /// A fresh backoff sequence for one call.
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            retry: 0,
            random: RandomState::new(),
        }
    }
}

impl Iterator for JitteredBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.retry >= self.policy.max_retries {
            return None;
        }
        let base = self.policy.base_delay(self.retry);
        self.retry += 1;
        if !self.policy.jitter {
            return Some(base);
        }
        // RandomState is randomly keyed per process and per instance; hashing the retry number gives a cheap,
        // dependency-free uniform value, which is all jitter needs.
        let sample = self.random.hash_one(self.retry);
        let half = base / 2;
        let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let extra = if nanos == 0 { 0 } else { sample % (nanos + 1) };
        Some(half + Duration::from_nanos(extra))
    }
}

/// Builds [`JitteredBackoff`] for `backon`.
#[derive(Debug, Clone, Copy)]
pub struct JitteredBackoffBuilder(pub RetryPolicy);

impl backon::BackoffBuilder for JitteredBackoffBuilder {
    type Backoff = JitteredBackoff;

    fn build(self) -> Self::Backoff {
        JitteredBackoff::new(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(code: u16) -> StatusCode {
        StatusCode::from_u16(code).expect("valid status")
    }

    #[test]
    fn transient_statuses() {
        for code in [429, 500, 502, 503, 504, 599] {
            assert!(status_is_transient(s(code)), "{code}");
            assert!(should_retry_status(s(code), false), "{code}");
        }
        for code in [200, 201, 202, 204, 400, 401, 403, 404, 409, 422, 501] {
            assert!(!status_is_transient(s(code)), "{code}");
            assert!(!should_retry_status(s(code), false), "{code}");
        }
        assert!(should_retry_status(s(401), true));
        assert!(should_retry_status(s(403), true));
        assert!(!should_retry_status(s(404), true));
    }

    #[test]
    fn transport_failures_by_idempotency() {
        use Idempotency::{Safe, Unsafe};
        use TransportFailure as F;
        let table = [
            (F::Connect, Safe, true),
            (F::Connect, Unsafe, true),
            (F::Timeout, Safe, true),
            (F::Timeout, Unsafe, false),
            (F::Interrupted, Safe, true),
            (F::Interrupted, Unsafe, false),
            (F::Certificate, Safe, false),
            (F::Unsendable, Safe, false),
        ];
        for (failure, idempotency, expected) in table {
            assert_eq!(
                should_retry_transport(failure, idempotency),
                expected,
                "{failure:?} {idempotency:?}"
            );
        }
    }

    #[test]
    fn retry_after_parsing() {
        let now: Timestamp = "2015-10-21T07:28:00Z".parse().expect("ts");
        let headers = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(RETRY_AFTER, v.parse().expect("header"));
            h
        };
        assert_eq!(
            retry_after(s(429), &headers("7"), now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            retry_after(s(503), &headers(" 3 "), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(s(429), &headers("Wed, 21 Oct 2015 07:28:10 GMT"), now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            retry_after(s(429), &headers("Wed, 21 Oct 2015 07:27:00 GMT"), now),
            Some(Duration::ZERO),
            "a past date means now"
        );
        assert_eq!(retry_after(s(429), &headers("soon"), now), None);
        assert_eq!(
            retry_after(s(500), &headers("7"), now),
            None,
            "only 429 and 503 carry a wait"
        );
        assert_eq!(retry_after(s(429), &HeaderMap::new(), now), None);
    }

    #[test]
    fn backoff_doubles_caps_and_stops() {
        let policy = RetryPolicy {
            jitter: false,
            ..RetryPolicy::default()
        };
        let waits: Vec<u64> = JitteredBackoff::new(policy).map(|d| d.as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8]);
        let capped = RetryPolicy {
            max_retries: 8,
            max_wait: Duration::from_secs(10),
            jitter: false,
            ..RetryPolicy::default()
        };
        let waits: Vec<u64> = JitteredBackoff::new(capped).map(|d| d.as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10, 10, 10]);
        assert_eq!(JitteredBackoff::new(RetryPolicy::none()).count(), 0);
        assert_eq!(
            policy.base_delay(200),
            Duration::from_secs(30),
            "no overflow on huge retry numbers"
        );
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        let policy = RetryPolicy::default();
        for _ in 0..50 {
            for (i, wait) in JitteredBackoff::new(policy).enumerate() {
                let base = policy.base_delay(u32::try_from(i).expect("small"));
                assert!(wait >= base / 2 && wait <= base, "{wait:?} vs {base:?}");
            }
        }
        let distinct: std::collections::HashSet<Duration> = (0..20)
            .filter_map(|_| JitteredBackoff::new(policy).next())
            .collect();
        assert!(distinct.len() > 1, "jitter varies between calls");
    }
}
