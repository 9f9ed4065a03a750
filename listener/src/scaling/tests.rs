use actions_client::{JobInfo, JobStarted};
use pretty_assertions::assert_eq;
use proptest::prelude::*;
use serde_json::json;

use super::*;

#[test]
fn desired_replicas_table() {
    // (assigned, min, max, expected)
    let cases = [
        (0, 0, 10, 0),
        (3, 1, i64::from(i32::MAX), 4), // min is added, not a floor
        (6, 0, 5, 5),                   // max caps
        (0, 2, 2, 2),
        (10, 2, 2, 2),
        (0, -3, 5, -3), // negative min: no lower clamp, as in ARC
        (i64::MAX, 5, 100, 100),
    ];
    for (assigned, min, max, expected) in cases {
        assert_eq!(
            desired_replicas(assigned, min, max),
            expected,
            "assigned={assigned} min={min} max={max}"
        );
    }
}

#[test]
fn patch_seq_table() {
    assert_eq!(next_patch_seq(-1), 0);
    assert_eq!(next_patch_seq(0), 1);
    assert_eq!(next_patch_seq(41), 42);
    assert_eq!(next_patch_seq(i32::MAX - 1), i32::MAX);
    assert_eq!(next_patch_seq(i32::MAX), 1);
}

/// The reference's scaler test sequence, step by step: (event before the step, assigned, expected decision).
#[test]
fn decision_sequence_pins_the_reference_behaviour() {
    let (min, max) = (1, 10);
    let mut scaler = Scaler::default();
    let mut step = |dirty: bool, assigned: i64| {
        if dirty {
            scaler.mark_dirty();
        }
        scaler.decide(assigned, min, max)
    };
    // The first patch of a process is always 0.
    assert_eq!(
        step(false, 0),
        Decision {
            target: 1,
            patch_id: 0
        }
    );
    // Quiet at min: converge again, the sequence still advances underneath.
    assert_eq!(
        step(false, 0),
        Decision {
            target: 1,
            patch_id: 0
        }
    );
    // Jobs assigned: scale up with the sequence value.
    assert_eq!(
        step(false, 3),
        Decision {
            target: 4,
            patch_id: 2
        }
    );
    // Same count, target != min: a sequence value, not 0.
    assert_eq!(
        step(false, 3),
        Decision {
            target: 4,
            patch_id: 3
        }
    );
    // Jobs completed (dirty) and count back to 0: target min, non-zero id.
    assert_eq!(
        step(true, 0),
        Decision {
            target: 1,
            patch_id: 4
        }
    );
    // Nothing happened and still at min: force the state.
    assert_eq!(
        step(false, 0),
        Decision {
            target: 1,
            patch_id: 0
        }
    );
    // A job started without changing the count: dirty prevents converging.
    assert_eq!(
        step(true, 0),
        Decision {
            target: 1,
            patch_id: 6
        }
    );
    // Capped at max.
    assert_eq!(
        step(false, 50),
        Decision {
            target: 10,
            patch_id: 7
        }
    );
}

#[test]
fn a_failed_patch_never_leads_to_converge() {
    let mut scaler = Scaler::default();
    scaler.decide(0, 0, 5);
    scaler.decide(0, 0, 5);
    scaler.patch_failed();
    assert_ne!(scaler.decide(0, 0, 5).patch_id, 0);
    assert_eq!(scaler.decide(0, 0, 5).patch_id, 0);
}

#[test]
fn sequence_wraps_to_one() {
    let mut scaler = Scaler {
        target: 5,
        patch_seq: i32::MAX - 1,
        dirty: false,
    };
    assert_eq!(scaler.decide(5, 0, 10).patch_id, i32::MAX);
    assert_eq!(scaler.decide(5, 0, 10).patch_id, 1);
    assert_eq!(scaler.decide(5, 0, 10).patch_id, 2);
}

#[test]
fn runner_set_patch_bodies() {
    assert_eq!(
        runner_set_patch(Decision {
            target: 4,
            patch_id: 7
        }),
        json!({"spec": {"patchID": 7, "replicas": 4}})
    );
    assert_eq!(
        runner_set_patch(Decision {
            target: 0,
            patch_id: 3
        }),
        json!({"spec": {"patchID": 3, "replicas": null}})
    );
    assert_eq!(
        runner_set_patch(Decision {
            target: -1,
            patch_id: 0
        }),
        json!({"spec": {"patchID": 0}})
    );
    assert_eq!(
        runner_set_patch(Decision {
            target: -2,
            patch_id: 1
        }),
        json!({"spec": {"patchID": 1, "replicas": -2}})
    );
    // The exact bytes ARC sends (keys sorted), since serde_json's map is ordered.
    assert_eq!(
        runner_set_patch(Decision {
            target: 0,
            patch_id: 0
        })
        .to_string(),
        r#"{"spec":{"patchID":0,"replicas":null}}"#
    );
}

#[test]
fn runner_status_patch_keeps_only_set_fields() {
    let full = JobStarted {
        job: JobInfo {
            runner_request_id: 9001,
            repository_name: "repo".into(),
            owner_name: "org".into(),
            job_id: "job-1".into(),
            job_workflow_ref: "org/repo/.github/workflows/ci.yml@refs/heads/main".into(),
            job_display_name: "build".into(),
            workflow_run_id: 77,
            ..JobInfo::default()
        },
        runner_id: 3,
        runner_name: "runner-a".into(),
    };
    assert_eq!(
        runner_job_status_patch(&full),
        json!({"status": {
            "jobRequestId": 9001,
            "jobRepositoryName": "org/repo",
            "jobId": "job-1",
            "workflowRunId": 77,
            "jobWorkflowRef": "org/repo/.github/workflows/ci.yml@refs/heads/main",
            "jobDisplayName": "build",
        }})
    );
    assert_eq!(
        runner_job_status_patch(&JobStarted::default()),
        json!({"status": {"jobRepositoryName": "/"}})
    );
}

/// One step of a random history: a job event or not, and the assigned count of the step.
fn steps() -> impl Strategy<Value = Vec<(bool, i64)>> {
    prop::collection::vec((any::<bool>(), 0i64..200), 1..60)
}

#[test]
fn only_patches_that_do_not_raise_the_target_wait() {
    let window = std::time::Duration::from_secs(1);
    // A job started (same target) or finished (lower): it may wait.
    assert!(may_defer(10, 10, true, window));
    assert!(may_defer(9, 10, true, window));
    // New jobs came: the patch goes at once.
    assert!(!may_defer(11, 10, true, window));
    // The first patch of a process, and a quiet step (it may be the "converge" patch): at once.
    assert!(!may_defer(0, -1, true, window));
    assert!(!may_defer(5, 10, false, window));
    // No window: ARC's behaviour.
    assert!(!may_defer(9, 10, true, std::time::Duration::ZERO));
}

proptest! {
    /// A patch that waits never raises the target the set already has, and is never a converge.
    #[test]
    fn a_deferred_patch_never_scales_up_or_converges(
        target in -1i64..50,
        last_sent in -1i64..50,
        eventful: bool,
        window_ms in 0u64..3000,
    ) {
        let window = std::time::Duration::from_millis(window_ms);
        if may_defer(target, last_sent, eventful, window) {
            prop_assert!(target <= last_sent);
            prop_assert!(eventful);
            prop_assert!(!window.is_zero());
        }
    }

    #[test]
    fn target_stays_within_bounds(assigned in 0i64..i64::MAX, min in 0i64..1000, extra in 0i64..i64::from(i32::MAX)) {
        let max = min.saturating_add(extra);
        let target = desired_replicas(assigned, min, max);
        prop_assert!(target >= min && target <= max);
        prop_assert_eq!(target, (min + assigned.min(max)).min(max));
    }

    #[test]
    fn zero_only_when_quiet_at_min(history in steps(), min in 0i64..5, extra in 0i64..20) {
        let max = min + extra;
        let mut scaler = Scaler::default();
        let mut previous: Option<i64> = None;
        for (i, (dirty, assigned)) in history.into_iter().enumerate() {
            if dirty {
                scaler.mark_dirty();
            }
            let decision = scaler.decide(assigned, min, max);
            prop_assert!(decision.target >= min && decision.target <= max);
            prop_assert!(!scaler.is_dirty(), "a step clears the dirty flag");
            let quiet_at_min = !dirty && previous == Some(decision.target) && decision.target == min;
            if i == 0 {
                prop_assert_eq!(decision.patch_id, 0, "the first patch converges");
            } else if quiet_at_min {
                prop_assert_eq!(decision.patch_id, 0);
            } else {
                prop_assert_eq!(decision.patch_id, i32::try_from(i).unwrap(), "otherwise the step's sequence value");
            }
            previous = Some(decision.target);
        }
    }

    #[test]
    fn sequence_never_yields_zero_after_start(start in 0i32..=i32::MAX, steps in 1usize..50) {
        let mut seq = start;
        for _ in 0..steps {
            seq = next_patch_seq(seq);
            prop_assert!(seq >= 1);
        }
    }

    #[test]
    fn patch_body_has_replicas_iff_target_is_not_minus_one(target in -5i64..100, patch_id in 0i32..=i32::MAX) {
        let body = runner_set_patch(Decision { target, patch_id });
        let spec = body["spec"].as_object().unwrap();
        prop_assert_eq!(spec["patchID"].as_i64(), Some(i64::from(patch_id)));
        match target {
            -1 => prop_assert!(!spec.contains_key("replicas")),
            0 => prop_assert!(spec["replicas"].is_null()),
            n => prop_assert_eq!(spec["replicas"].as_i64(), Some(n)),
        }
    }
}

#[test]
fn settle_converges_above_the_minimum_only_when_quiet_and_unchanged() {
    let mut scaler = Scaler::default();
    scaler.decide(3, 2, 10); // target 5
    // The policy lowered the minimum: the first step only announces the new target.
    let lowered = scaler.decide(3, 0, 10);
    assert_eq!(lowered.target, 3);
    assert_ne!(lowered.patch_id, 0);
    // Settling right after: same target, nothing happened, so converge although 3 > min 0.
    assert_eq!(
        scaler.settle(3, 0, 10),
        Decision {
            target: 3,
            patch_id: 0
        }
    );
    // A job event in between: no converge.
    scaler.decide(4, 0, 10);
    scaler.mark_dirty();
    assert_ne!(scaler.settle(4, 0, 10).patch_id, 0);
    // A changed target: no converge either.
    assert_ne!(scaler.settle(2, 0, 10).patch_id, 0);
    // A failed patch counts as an event.
    scaler.patch_failed();
    assert_ne!(scaler.settle(2, 0, 10).patch_id, 0);
}
