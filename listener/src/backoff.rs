//! The listener's two retry schedules. The wait itself is the Actions client's backoff
//! ([`actions_client::retry::JitteredBackoff`], driven by `backon`): the base wait doubles from `min_wait` up to
//! `max_wait`, and each wait is drawn from the upper half of its base ("equal jitter"), so many listeners
//! recovering from one outage spread out and no wait is shorter than half its base.

use std::time::Duration;

use actions_client::RetryPolicy;

/// For errors that clear by themselves: 1 s doubling to 10 s, so the listener is back within seconds of the
/// service recovering (well inside the 30 s budget). Never runs out; the caller decides when to stop.
pub const TRANSIENT: RetryPolicy = RetryPolicy {
    max_retries: u32::MAX,
    min_wait: Duration::from_secs(1),
    max_wait: Duration::from_secs(10),
    jitter: true,
};

/// For errors that need a person (bad credentials, missing permission or scale set): 10 s doubling to
/// 5 minutes, slow enough not to hammer GitHub, fast enough to notice a fix. Never runs out.
pub const FATAL: RetryPolicy = RetryPolicy {
    max_retries: u32::MAX,
    min_wait: Duration::from_secs(10),
    max_wait: Duration::from_secs(300),
    jitter: true,
};

#[cfg(test)]
mod tests {
    use actions_client::retry::JitteredBackoff;
    use proptest::prelude::*;

    use super::*;

    fn bases(policy: RetryPolicy, count: usize) -> Vec<Duration> {
        let policy = RetryPolicy {
            jitter: false,
            ..policy
        };
        JitteredBackoff::new(policy).take(count).collect()
    }

    #[test]
    fn schedules() {
        let secs = |s: u64| Duration::from_secs(s);
        assert_eq!(
            bases(TRANSIENT, 6),
            [secs(1), secs(2), secs(4), secs(8), secs(10), secs(10)]
        );
        assert_eq!(
            bases(FATAL, 7),
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
        assert_eq!(TRANSIENT.base_delay(u32::MAX), secs(10));
    }

    #[test]
    fn the_schedules_do_not_run_out() {
        for policy in [TRANSIENT, FATAL] {
            let wait = JitteredBackoff::new(policy).nth(100_000).expect("a wait");
            assert!(
                wait >= policy.max_wait / 2 && wait <= policy.max_wait,
                "{wait:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn waits_are_within_half_their_base_and_the_cap(initial_ms in 1u64..60_000, extra_ms in 0u64..600_000, count in 1usize..40) {
            let policy = RetryPolicy {
                max_retries: u32::MAX,
                min_wait: Duration::from_millis(initial_ms),
                max_wait: Duration::from_millis(initial_ms + extra_ms),
                jitter: true,
            };
            let bases = bases(policy, count);
            let waits: Vec<_> = JitteredBackoff::new(policy).take(count).collect();
            prop_assert_eq!(waits.len(), count);
            for (wait, base) in waits.iter().zip(&bases) {
                prop_assert!(*wait <= policy.max_wait);
                prop_assert!(wait <= base);
                prop_assert!(*wait >= *base / 2);
                prop_assert!(*base >= policy.min_wait.min(policy.max_wait));
            }
            prop_assert!(bases.windows(2).all(|pair| pair[0] <= pair[1]), "bases never shrink");
        }
    }
}
