//! Capped exponential backoff with jitter, as a pure function of the attempt number and a random draw, so the
//! schedule can be tested without sleeping.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

/// A backoff schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Base wait of the first retry.
    pub initial: Duration,
    /// Cap of the base wait.
    pub max: Duration,
}

impl Backoff {
    /// For errors that clear by themselves: 1 s doubling to 10 s, so the listener is back within seconds of
    /// the service recovering (well inside the 30 s budget).
    pub const TRANSIENT: Self = Self {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(10),
    };

    /// For errors that need a person (bad credentials, missing permission or scale set): 10 s doubling to
    /// 5 minutes, slow enough not to hammer GitHub, fast enough to notice a fix.
    pub const FATAL: Self = Self {
        initial: Duration::from_secs(10),
        max: Duration::from_secs(300),
    };

    /// The base wait before retry `attempt` (0-based): `initial × 2^attempt`, capped at `max`.
    pub fn base(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The wait before retry `attempt` with "equal jitter": uniformly within the upper half of the base wait,
    /// `jitter` being a draw from `[0, 1)`. Many listeners recovering from one outage then spread out, and no wait
    /// is shorter than half its base.
    pub fn delay(&self, attempt: u32, jitter: f64) -> Duration {
        let base = self.base(attempt);
        let half = base / 2;
        half + half.mul_f64(jitter.clamp(0.0, 1.0))
    }
}

/// A draw from `[0, 1)`; randomness only spreads retries, so the standard library's per-process random hasher
/// keys are good enough.
pub fn jitter() -> f64 {
    let bits = RandomState::new().hash_one(std::time::Instant::now());
    // 53 random bits make an exactly representable fraction.
    #[allow(clippy::cast_precision_loss)]
    let fraction = (bits >> 11) as f64 / (1u64 << 53) as f64;
    fraction
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn schedules() {
        let secs = |s: u64| Duration::from_secs(s);
        let transient: Vec<_> = (0..6).map(|a| Backoff::TRANSIENT.base(a)).collect();
        assert_eq!(
            transient,
            [secs(1), secs(2), secs(4), secs(8), secs(10), secs(10)]
        );
        let fatal: Vec<_> = (0..7).map(|a| Backoff::FATAL.base(a)).collect();
        assert_eq!(
            fatal,
            [
                secs(10),
                secs(20),
                secs(40),
                secs(80),
                secs(160),
                secs(300),
                secs(300)
            ]
        );
        assert_eq!(Backoff::TRANSIENT.base(u32::MAX), secs(10));
        assert_eq!(Backoff::TRANSIENT.delay(0, 0.0), Duration::from_millis(500));
        assert_eq!(Backoff::TRANSIENT.delay(0, 0.5), Duration::from_millis(750));
        let near_cap = Backoff::FATAL.delay(10, 0.999_999);
        assert!(
            near_cap > secs(299) && near_cap <= secs(300),
            "{near_cap:?}"
        );
    }

    #[test]
    fn jitter_is_a_fraction() {
        for _ in 0..1000 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j), "{j}");
        }
    }

    proptest! {
        #[test]
        fn delay_is_within_half_and_cap(initial_ms in 1u64..60_000, extra_ms in 0u64..600_000, attempt in 0u32..100, draw in 0.0f64..1.0) {
            let policy = Backoff {
                initial: Duration::from_millis(initial_ms),
                max: Duration::from_millis(initial_ms + extra_ms),
            };
            let base = policy.base(attempt);
            let delay = policy.delay(attempt, draw);
            prop_assert!(delay <= policy.max);
            prop_assert!(delay <= base);
            prop_assert!(delay >= base / 2);
            prop_assert!(base >= policy.initial.min(policy.max));
        }

        #[test]
        fn base_is_monotonic(initial_ms in 1u64..60_000, extra_ms in 0u64..600_000, attempt in 0u32..100) {
            let policy = Backoff {
                initial: Duration::from_millis(initial_ms),
                max: Duration::from_millis(initial_ms + extra_ms),
            };
            prop_assert!(policy.base(attempt) <= policy.base(attempt + 1));
        }
    }
}
