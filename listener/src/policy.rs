//! Scaling policy beyond ARC (docs/configuration.md, "Scheduled minimums" and "Scale-down delay"): which minimum
//! applies now ([`crds::schedule::evaluate`]), how many assigned jobs the target is computed from while the
//! scale-down delay holds a recent peak ([`PeakHold`]), and when the listener must wake up to apply a change that
//! no message announces. Pure: time is always passed in.
//!
//! Without schedules and with no delay the plan is ARC's: the configured minimum and the assigned jobs as they
//! are, and no wake-ups.

use std::collections::VecDeque;
use std::time::Duration;

use crds::schedule::{Schedule, evaluate};
use jiff::Timestamp;
use tokio::time::Instant;

/// Margin after a window boundary before evaluating, so the wall clock is surely past it.
pub const BOUNDARY_MARGIN: Duration = Duration::from_millis(50);

/// Keeps the highest demand of the last `delay` (a sliding-window maximum of a step function: a value counts
/// until `delay` after it was last in effect).
#[derive(Debug, Clone)]
pub struct PeakHold {
    delay: Duration,
    current: Option<i64>,
    /// Earlier values and when they stopped being in effect; values strictly decrease from front to back (a
    /// value at or below a later one can never be the maximum again).
    history: VecDeque<(i64, Instant)>,
}

/// What [`PeakHold::observe`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The demand to scale for: the observed one, or a higher one of the last `delay`.
    pub value: i64,
    /// When the held value may drop (the oldest peak expires); `None` when nothing is held.
    pub until: Option<Instant>,
}

impl PeakHold {
    /// A hold of `delay`; zero holds nothing.
    pub fn new(delay: Duration) -> Self {
        Self {
            delay,
            current: None,
            history: VecDeque::new(),
        }
    }

    /// Records the demand at `now` (not earlier than the previous call) and returns what to scale for.
    pub fn observe(&mut self, demand: i64, now: Instant) -> Held {
        if self.delay.is_zero() {
            return Held {
                value: demand,
                until: None,
            };
        }
        if let Some(previous) = self.current.replace(demand)
            && previous != demand
        {
            while self.history.back().is_some_and(|(v, _)| *v <= previous) {
                self.history.pop_back();
            }
            self.history.push_back((previous, now));
        }
        while self
            .history
            .front()
            .is_some_and(|(_, ended)| *ended + self.delay <= now)
        {
            self.history.pop_front();
        }
        match self.history.front() {
            Some(&(peak, ended)) if peak > demand => Held {
                value: peak,
                until: Some(ended + self.delay),
            },
            _ => Held {
                value: demand,
                until: None,
            },
        }
    }
}

/// The listener's scaling inputs at one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The minimum in effect.
    pub min_runners: i64,
    /// The schedule whose window sets it, if any.
    pub active_schedule: Option<String>,
    /// Assigned jobs to scale for (the held peak while the delay lasts).
    pub assigned_jobs: i64,
    /// Runners kept only by the delay: the target with the held demand minus the target with the real one.
    pub held_runners: i64,
    /// When to evaluate again without a message: the next window boundary or the end of the hold.
    pub wake_at: Option<Instant>,
}

/// Schedules, base minimum and delay of one listener.
#[derive(Debug, Clone)]
pub struct Policy {
    schedules: Vec<Schedule>,
    base_min: i64,
    max: i64,
    hold: PeakHold,
}

impl Policy {
    /// A policy; `schedules` empty and `delay` zero is ARC's behaviour.
    pub fn new(schedules: Vec<Schedule>, base_min: i64, max: i64, delay: Duration) -> Self {
        Self {
            schedules,
            base_min,
            max,
            hold: PeakHold::new(delay),
        }
    }

    /// Whether anything beyond ARC is configured.
    pub fn is_active(&self) -> bool {
        !self.schedules.is_empty() || !self.hold.delay.is_zero()
    }

    /// The plan for `assigned_jobs` at wall-clock `now_wall` and monotonic `now`.
    pub fn plan(&mut self, assigned_jobs: i64, now_wall: Timestamp, now: Instant) -> Plan {
        let evaluation = evaluate(&self.schedules, self.base_min, now_wall);
        let held = self.hold.observe(assigned_jobs, now);
        let target =
            |jobs: i64| crate::scaling::desired_replicas(jobs, evaluation.min_runners, self.max);
        let boundary = evaluation.next_boundary.map(|at| {
            let wait = at.duration_since(now_wall).unsigned_abs();
            now + wait + BOUNDARY_MARGIN
        });
        let wake_at = match (boundary, held.until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Plan {
            min_runners: evaluation.min_runners,
            active_schedule: evaluation.active,
            assigned_jobs: held.value,
            held_runners: target(held.value) - target(assigned_jobs),
            wake_at,
        }
    }
}

#[cfg(test)]
mod tests;
