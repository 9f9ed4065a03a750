//! The set's `effectiveMinRunners` and `activeMinRunnersSchedule` status fields (not in ARC): the scheduled
//! minimum as the listener applies it (the same pure function, `crds::schedule::evaluate`), and when to look
//! again so the fields change when a window opens or closes rather than at the next resync.

use std::time::Duration;

use crds::{AutoscalingRunnerSetSpec, AutoscalingRunnerSetStatus};
use k8s_openapi::jiff::Timestamp;

/// Sets the two fields from the spec at `now`: both absent without schedules (so the status of an ARC object is
/// unchanged) or with invalid ones (the set is `SpecInvalid` then).
pub fn apply(
    status: &mut AutoscalingRunnerSetStatus,
    spec: &AutoscalingRunnerSetSpec,
    now: Timestamp,
) {
    status.effective_min_runners = None;
    status.active_min_runners_schedule = None;
    if spec.min_runners_schedules.is_empty() {
        return;
    }
    let Ok(schedules) = crds::schedule::parse_all(&spec.min_runners_schedules) else {
        return;
    };
    let evaluation = crds::schedule::evaluate(&schedules, spec.effective_min_runners(), now);
    status.effective_min_runners = Some(evaluation.min_runners);
    status.active_min_runners_schedule = evaluation.active;
}

/// How long until the next window boundary, if the spec has valid schedules.
pub fn next_change_in(spec: &AutoscalingRunnerSetSpec, now: Timestamp) -> Option<Duration> {
    if spec.min_runners_schedules.is_empty() {
        return None;
    }
    let schedules = crds::schedule::parse_all(&spec.min_runners_schedules).ok()?;
    let next = crds::schedule::evaluate(&schedules, 0, now).next_boundary?;
    // A little past the boundary, so the evaluation then is surely on the far side of it.
    Some(next.duration_since(now).unsigned_abs() + Duration::from_millis(100))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::schedule::MinRunnersSchedule;

    fn spec() -> AutoscalingRunnerSetSpec {
        AutoscalingRunnerSetSpec {
            min_runners: Some(1),
            min_runners_schedules: vec![MinRunnersSchedule {
                name: "office".into(),
                min_runners: 4,
                start: "09:00".into(),
                end: "17:00".into(),
                ..MinRunnersSchedule::default()
            }],
            ..AutoscalingRunnerSetSpec::default()
        }
    }

    #[test]
    fn fields_follow_the_schedule_and_stay_absent_without_one() {
        let mut status = AutoscalingRunnerSetStatus::default();
        let inside: Timestamp = "2026-03-02T10:00:00Z".parse().unwrap();
        apply(&mut status, &spec(), inside);
        assert_eq!(status.effective_min_runners, Some(4));
        assert_eq!(
            status.active_min_runners_schedule.as_deref(),
            Some("office")
        );
        apply(
            &mut status,
            &spec(),
            "2026-03-02T18:00:00Z".parse().unwrap(),
        );
        assert_eq!(status.effective_min_runners, Some(1));
        assert_eq!(status.active_min_runners_schedule, None);
        apply(&mut status, &AutoscalingRunnerSetSpec::default(), inside);
        assert_eq!(status, AutoscalingRunnerSetStatus::default());
        assert_eq!(
            serde_json::to_value(&status)
                .unwrap()
                .get("effectiveMinRunners"),
            None
        );
        assert_eq!(
            next_change_in(&spec(), "2026-03-02T16:59:00Z".parse().unwrap()),
            Some(Duration::from_millis(60_100))
        );
        assert_eq!(
            next_change_in(&AutoscalingRunnerSetSpec::default(), inside),
            None
        );
    }
}
