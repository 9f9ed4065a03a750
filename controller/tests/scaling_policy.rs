//! Issue 19 on the controller side, against a real API server and the fake Actions Service: scale set labels kept
//! in step with `runnerScaleSetLabels`, the scheduled minimum in the set's status, the schedules in the listener's
//! config, and invalid schedules reported as `SpecInvalid`. (The listener applying them, with runner pods, is in
//! the e2e crate's `scaling_policy.rs`.)

mod ars_support;

use ars_support::Env;
use crds::constants::SCALE_SET_LABELS_ANNOTATION;
use crds::schedule::MinRunnersSchedule;
use k8s_openapi::jiff::{SignedDuration, Timestamp, tz::TimeZone};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

/// The fake's labels of scale set `id`, by name.
fn fake_labels(env: &Env, id: i64) -> Vec<String> {
    env.fake
        .state()
        .snapshot()
        .scale_sets
        .into_iter()
        .find(|s| s.id == id)
        .map(|s| s.labels.into_iter().map(|l| l.name).collect())
        .unwrap_or_default()
}

async fn scale_set_id(env: &Env, name: &str) -> i64 {
    env.eventually("the scale set id", || async {
        env.runner_set(name)
            .await?
            .annotations()
            .get("runner-scale-set-id")?
            .parse()
            .ok()
    })
    .await
}

#[tokio::test]
async fn label_changes_reach_the_scale_set_once_with_an_event() {
    let env = Env::new("ars-labels").await;
    let manager = env.start(env.options());
    let mut spec = env.runner_set_spec();
    spec.runner_scale_set_labels = vec!["linux".into()];
    env.create_runner_set("labelled", spec).await;
    let id = scale_set_id(&env, "labelled").await;
    assert_eq!(fake_labels(&env, id), ["labelled", "linux"]);
    // Created here: the labels are recorded at once and nothing is pushed.
    env.eventually("the labels recorded", || async {
        let set = env.runner_set("labelled").await?;
        (set.annotations().get(SCALE_SET_LABELS_ANNOTATION)? == r#"["labelled","linux"]"#)
            .then_some(())
    })
    .await;
    assert!(
        env.events("labelled", "ScaleSetLabelsUpdated")
            .await
            .is_empty()
    );

    env.runner_sets()
        .patch(
            "labelled",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"runnerScaleSetLabels": ["linux", "gpu"]}})),
        )
        .await
        .expect("patch the labels");
    env.eventually("the new labels in the fake", || async {
        (fake_labels(&env, id) == ["labelled", "linux", "gpu"]).then_some(())
    })
    .await;
    let events = env
        .eventually("the Event", || async {
            let events = env.events("labelled", "ScaleSetLabelsUpdated").await;
            (!events.is_empty()).then_some(events)
        })
        .await;
    assert_eq!(
        events[0].message.as_deref(),
        Some(
            format!("runner scale set {id} labels changed from [labelled, linux] to [labelled, linux, gpu]")
                .as_str()
        )
    );
    env.eventually("the new labels recorded", || async {
        let set = env.runner_set("labelled").await?;
        (set.annotations().get(SCALE_SET_LABELS_ANNOTATION)? == r#"["labelled","linux","gpu"]"#)
            .then_some(())
    })
    .await;

    // A set without the record (as ARC leaves it) whose labels match: read once, recorded, no update, no Event.
    env.runner_sets()
        .patch(
            "labelled",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {SCALE_SET_LABELS_ANNOTATION: null}}}),
            ),
        )
        .await
        .expect("drop the record");
    env.eventually("recorded again", || async {
        env.runner_set("labelled")
            .await?
            .annotations()
            .get(SCALE_SET_LABELS_ANNOTATION)
            .is_some()
            .then_some(())
    })
    .await;
    // Removing every extra label leaves the name.
    env.runner_sets()
        .patch(
            "labelled",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"runnerScaleSetLabels": null}})),
        )
        .await
        .expect("drop the labels");
    env.eventually("only the name left in the fake", || async {
        (fake_labels(&env, id) == ["labelled"]).then_some(())
    })
    .await;
    let events = env.events("labelled", "ScaleSetLabelsUpdated").await;
    // Events with the same reason are one series (the note of the first is kept): count the occurrences.
    let count: i32 = events
        .iter()
        .map(|e| e.series.as_ref().and_then(|s| s.count).unwrap_or(1))
        .sum();
    assert_eq!(
        count, 2,
        "one Event per change, none for the re-read: {events:?}"
    );
    manager.stop().await;
}

/// `HH:MM:SS` in UTC, `offset` (whole seconds, rounded up) from now.
fn utc_time_in(offset_secs: i64) -> (String, Timestamp) {
    let at = Timestamp::now()
        .checked_add(SignedDuration::from_secs(offset_secs + 1))
        .unwrap();
    let at = Timestamp::from_second(at.as_second()).unwrap();
    let z = at.to_zoned(TimeZone::UTC);
    (
        format!("{:02}:{:02}:{:02}", z.hour(), z.minute(), z.second()),
        at,
    )
}

#[tokio::test]
async fn the_status_follows_the_schedule_and_the_listener_gets_it() {
    let env = Env::new("ars-schedule").await;
    let manager = env.start(env.options());
    let (start, opens) = utc_time_in(4);
    let (end, closes) = utc_time_in(9);
    let mut spec = env.runner_set_spec();
    spec.min_runners = Some(1);
    spec.max_runners = Some(5);
    spec.scale_down_delay_seconds = Some(30);
    spec.min_runners_schedules = vec![MinRunnersSchedule {
        name: "soon".into(),
        min_runners: 3,
        start,
        end,
        ..MinRunnersSchedule::default()
    }];
    env.create_runner_set("scheduled", spec).await;
    let status = |set: crds::AutoscalingRunnerSet| {
        set.status
            .map(|s| (s.effective_min_runners, s.active_min_runners_schedule))
    };
    env.eventually("minRunners before the window", || async {
        (status(env.runner_set("scheduled").await?)? == (Some(1), None)).then_some(())
    })
    .await;
    let listener = env
        .eventually("the listener", || async {
            env.listeners()
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|l| l.spec.autoscaling_runner_set_name == "scheduled")
        })
        .await;
    assert_eq!(listener.spec.scale_down_delay_seconds, 30);
    assert_eq!(listener.spec.min_runners_schedules.len(), 1);
    let config: Value = env
        .eventually("the listener config", || async {
            let secret = env
                .controller_secrets()
                .get_opt(&format!("{}-config", listener.name_any()))
                .await
                .ok()??;
            serde_json::from_slice(&secret.data?["config.json"].0).ok()
        })
        .await;
    assert_eq!(config["scale_down_delay_seconds"], 30);
    assert_eq!(config["min_runners_schedules"][0]["minRunners"], 3);

    // No spec change happens: the controller looks again at the boundaries by itself.
    env.eventually("the window's minimum once it opens", || async {
        let now = status(env.runner_set("scheduled").await?)?;
        (now == (Some(3), Some("soon".to_owned()))).then_some(())
    })
    .await;
    assert!(Timestamp::now() >= opens);
    env.eventually("minRunners again once it closes", || async {
        (status(env.runner_set("scheduled").await?)? == (Some(1), None)).then_some(())
    })
    .await;
    assert!(Timestamp::now() >= closes);
    manager.stop().await;
}

#[tokio::test]
async fn an_unusable_schedule_is_spec_invalid_and_nothing_is_created() {
    let env = Env::new("ars-bad-schedule").await;
    let manager = env.start(env.options());
    let mut spec = env.runner_set_spec();
    spec.min_runners_schedules = vec![MinRunnersSchedule {
        min_runners: 2,
        start: "09:00".into(),
        end: "17:00".into(),
        time_zone: "Europe/Atlantis".into(),
        ..MinRunnersSchedule::default()
    }];
    env.create_runner_set("atlantis", spec).await;
    let condition = env
        .eventually("SpecInvalid", || async {
            env.condition("atlantis", "Ready")
                .await
                .filter(|c| c.reason == "SpecInvalid")
        })
        .await;
    assert!(
        condition.message.contains("timeZone \"Europe/Atlantis\""),
        "{condition:?}"
    );
    assert!(env.scale_sets_named("atlantis").is_empty());
    manager.stop().await;
}
