use crds::schedule::MinRunnersSchedule;
use proptest::prelude::*;

use super::*;
use crate::scaling::{Scaler, desired_replicas};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn no_delay_holds_nothing() {
    let t0 = Instant::now();
    let mut hold = PeakHold::new(Duration::ZERO);
    assert_eq!(hold.observe(5, t0).value, 5);
    assert_eq!(
        hold.observe(0, t0 + secs(1)),
        Held {
            value: 0,
            until: None
        }
    );
}

#[test]
fn a_burst_is_held_for_the_delay_after_it_ends_then_steps_down() {
    let t0 = Instant::now();
    let mut hold = PeakHold::new(secs(300));
    assert_eq!(hold.observe(6, t0).value, 6);
    // The burst lasts 290 s: the delay counts from when it ended, not from when it began.
    assert_eq!(hold.observe(6, t0 + secs(290)).value, 6);
    let after = hold.observe(2, t0 + secs(290));
    assert_eq!(
        after,
        Held {
            value: 6,
            until: Some(t0 + secs(590))
        }
    );
    assert_eq!(hold.observe(0, t0 + secs(400)).value, 6);
    // At 590 the 6 expires; the 2 (in effect until 400) is still recent.
    assert_eq!(
        hold.observe(0, t0 + secs(590)),
        Held {
            value: 2,
            until: Some(t0 + secs(700))
        }
    );
    assert_eq!(hold.observe(0, t0 + secs(700)).value, 0);
    // A new burst above the old level is taken at once.
    assert_eq!(hold.observe(9, t0 + secs(701)).value, 9);
}

#[test]
fn without_schedules_or_delay_the_plan_is_arcs() {
    let t0 = Instant::now();
    let mut policy = Policy::new(Vec::new(), 2, 10, Duration::ZERO);
    assert!(!policy.is_active());
    let plan = policy.plan(7, Timestamp::now(), t0);
    assert_eq!(
        plan,
        Plan {
            min_runners: 2,
            active_schedule: None,
            assigned_jobs: 7,
            held_runners: 0,
            wake_at: None
        }
    );
}

#[test]
fn a_window_opening_wakes_the_listener_at_its_start() {
    let now_wall: Timestamp = "2026-03-02T08:59:00Z".parse().unwrap();
    let schedule = MinRunnersSchedule {
        name: "office".into(),
        min_runners: 4,
        start: "09:00".into(),
        end: "17:00".into(),
        ..MinRunnersSchedule::default()
    }
    .parse(0)
    .unwrap();
    let t0 = Instant::now();
    let mut policy = Policy::new(vec![schedule], 0, 10, Duration::ZERO);
    let before = policy.plan(0, now_wall, t0);
    assert_eq!(
        (before.min_runners, before.active_schedule.as_deref()),
        (0, None)
    );
    assert_eq!(before.wake_at, Some(t0 + secs(60) + BOUNDARY_MARGIN));
    let inside = policy.plan(0, "2026-03-02T09:00:00Z".parse().unwrap(), t0 + secs(60));
    assert_eq!(
        (inside.min_runners, inside.active_schedule.as_deref()),
        (4, Some("office"))
    );
    assert_eq!(
        inside.wake_at,
        Some(t0 + secs(60 + 8 * 3600) + BOUNDARY_MARGIN)
    );
}

#[test]
fn the_earlier_of_a_boundary_and_the_end_of_a_hold_wakes_the_listener() {
    let now_wall: Timestamp = "2026-03-02T08:00:00Z".parse().unwrap();
    let schedule = MinRunnersSchedule {
        min_runners: 1,
        start: "09:00".into(),
        duration: "1h".into(),
        ..MinRunnersSchedule::default()
    }
    .parse(0)
    .unwrap();
    let t0 = Instant::now();
    let mut policy = Policy::new(vec![schedule], 0, 10, secs(120));
    policy.plan(3, now_wall, t0);
    let quiet = policy.plan(0, now_wall, t0 + secs(10));
    assert_eq!(quiet.assigned_jobs, 3);
    assert_eq!(quiet.held_runners, 3);
    assert_eq!(quiet.wake_at, Some(t0 + secs(130)));
}

fn arb_schedules() -> impl Strategy<Value = Vec<Schedule>> {
    proptest::collection::vec((0..24i8, 1..600i64, 0..8i64), 0..4).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (hour, minutes, min))| {
                MinRunnersSchedule {
                    min_runners: min,
                    start: format!("{hour:02}:00"),
                    duration: format!("{minutes}m"),
                    time_zone: "Europe/Berlin".into(),
                    ..MinRunnersSchedule::default()
                }
                .parse(i)
                .unwrap()
            })
            .collect()
    })
}

proptest! {
    /// The held value is the maximum of the demands in effect at some point of the last `delay` (brute force
    /// over the history), never below the current demand.
    #[test]
    fn the_hold_is_the_recent_maximum(
        delay in 0..200u64,
        steps in proptest::collection::vec((0..100u64, 0..20i64), 1..40),
    ) {
        let t0 = Instant::now();
        let mut hold = PeakHold::new(secs(delay));
        let mut seen: Vec<(Instant, i64)> = Vec::new();
        let mut now = t0;
        for (gap, demand) in steps {
            now += secs(gap);
            seen.push((now, demand));
            let held = hold.observe(demand, now);
            let expected = seen
                .iter()
                .enumerate()
                .filter(|(i, _)| match seen.get(i + 1) {
                    None => true,
                    Some((ended, _)) => *ended + secs(delay) > now,
                })
                .map(|(_, (_, v))| *v)
                .max()
                .unwrap();
            prop_assert_eq!(held.value, expected);
            prop_assert!(held.value >= demand);
            prop_assert_eq!(held.until.is_some(), held.value > demand);
            if let Some(until) = held.until {
                prop_assert!(until > now && until <= now + secs(delay));
            }
        }
    }

    /// Whatever the schedules, the delay and the instant, busy runners are never asked away: the target covers
    /// the assigned jobs (up to maxRunners), also in the step where a window ends, and never exceeds maxRunners.
    #[test]
    fn busy_runners_are_never_scaled_away(
        schedules in arb_schedules(),
        base in 0..3i64,
        max in 3..12i64,
        delay in 0..600u64,
        steps in proptest::collection::vec((0..7200i64, 0..15i64), 1..20),
    ) {
        let t0 = Instant::now();
        let start: Timestamp = "2026-03-28T20:00:00Z".parse().unwrap(); // across Berlin's DST change
        let mut policy = Policy::new(schedules, base, max, secs(delay));
        let mut scaler = Scaler::default();
        let (mut wall, mut now) = (start, t0);
        for (gap, assigned) in steps {
            wall = wall.checked_add(jiff::SignedDuration::from_secs(gap)).unwrap();
            now += secs(gap.unsigned_abs());
            let plan = policy.plan(assigned, wall, now);
            let decision = scaler.decide(plan.assigned_jobs, plan.min_runners, max);
            prop_assert!(decision.target >= assigned.min(max));
            prop_assert!(decision.target <= max);
            prop_assert_eq!(decision.target, desired_replicas(plan.assigned_jobs, plan.min_runners, max));
            // Converging (the only patch that removes runners) never happens while the delay holds runners.
            if plan.held_runners > 0 {
                prop_assert_ne!(decision.patch_id, 0);
            }
        }
    }

    /// Without schedules and delay, every plan is the configured minimum and the demand, with no wake-up.
    #[test]
    fn an_arc_config_plans_exactly_as_arc(base in 0..5i64, max in 5..20i64, demands in proptest::collection::vec(0..30i64, 1..20)) {
        let t0 = Instant::now();
        let mut policy = Policy::new(Vec::new(), base, max, Duration::ZERO);
        for (i, demand) in demands.into_iter().enumerate() {
            let plan = policy.plan(demand, Timestamp::now(), t0 + secs(i as u64));
            prop_assert_eq!(plan, Plan { min_runners: base, active_schedule: None, assigned_jobs: demand, held_runners: 0, wake_at: None });
        }
    }
}
