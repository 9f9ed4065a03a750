use actions_client::{JobInfo, JobStarted};
use jiff::Timestamp;
use pretty_assertions::assert_eq;

use super::*;

fn identity() -> ScaleSetIdentity {
    let github = GitHubConfig::parse_with("https://github.com/acme/widgets", false).unwrap();
    ScaleSetIdentity::new(&github, "arc-runners", "set-abc")
}

fn ts(s: &str) -> Option<Timestamp> {
    Some(s.parse().unwrap())
}

fn job(result: &str) -> JobInfo {
    JobInfo {
        runner_request_id: 7,
        repository_name: "widgets".into(),
        owner_name: "acme".into(),
        job_id: "j".into(),
        job_workflow_ref: "acme/widgets/.github/workflows/ci.yml@refs/heads/main".into(),
        job_display_name: format!("build-{result}"),
        workflow_run_id: 99,
        event_name: "push".into(),
        queue_time: ts("2025-01-01T10:00:00Z"),
        scale_set_assign_time: ts("2025-01-01T10:00:02.900Z"),
        runner_assign_time: ts("2025-01-01T10:00:05.100Z"),
        finish_time: ts("2025-01-01T10:01:05.999Z"),
        ..JobInfo::default()
    }
}

fn lines_of<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| {
            l.starts_with(&format!("{name}{{"))
                || l.starts_with(&format!("{name} "))
                || l.starts_with(&format!("{name}_"))
        })
        .collect()
}

#[test]
fn default_set_has_arcs_names_types_and_help() {
    let metrics = Metrics::new(identity(), None).unwrap();
    metrics.record_bounds(1, 10);
    metrics.record_statistics(&Statistics {
        total_assigned_jobs: 3,
        total_running_jobs: 2,
        total_registered_runners: 4,
        total_busy_runners: 2,
        total_idle_runners: 2,
        ..Statistics::default()
    });
    metrics.record_desired(4);
    metrics.record_job_started(&JobStarted {
        job: job("x"),
        runner_id: 1,
        runner_name: "r".into(),
    });
    metrics.record_job_completed(&JobCompleted {
        job: job("x"),
        result: "succeeded".into(),
        runner_id: 1,
        runner_name: "r".into(),
    });
    let text = metrics.encode(1.5).unwrap();
    for metric in ArcMetric::ALL {
        let family = match metric.kind() {
            Kind::Counter => metric.name().trim_end_matches("_total"),
            _ => metric.name(),
        };
        let kind = match metric.kind() {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        assert!(
            text.contains(&format!("# TYPE {family} {kind}\n")),
            "{family} {kind} in\n{text}"
        );
        assert!(
            text.contains(&format!("# HELP {family} {}\n", metric.help())),
            "help of {family} in\n{text}"
        );
    }
    let scale_set_labels = r#"{enterprise="",organization="acme",repository="widgets",name="set-abc",namespace="arc-runners"}"#;
    for (name, value) in [
        ("gha_assigned_jobs", 3),
        ("gha_running_jobs", 2),
        ("gha_registered_runners", 4),
        ("gha_busy_runners", 2),
        ("gha_idle_runners", 2),
        ("gha_min_runners", 1),
        ("gha_max_runners", 10),
        ("gha_desired_runners", 4),
    ] {
        assert_eq!(
            lines_of(&text, name),
            [format!("{name}{scale_set_labels} {value}")],
            "{name}"
        );
    }
    assert_eq!(
        lines_of(&text, "gha_started_jobs"),
        [
            r#"gha_started_jobs_total{enterprise="",organization="acme",repository="widgets",job_name="build-x",event_name="push"} 1"#
        ]
    );
    assert_eq!(
        lines_of(&text, "gha_completed_jobs"),
        [
            r#"gha_completed_jobs_total{enterprise="",organization="acme",repository="widgets",job_name="build-x",event_name="push",job_result="succeeded"} 1"#
        ]
    );
    // Whole seconds, as ARC: 10:00:05 - 10:00:02 = 3 s; 10:01:05 - 10:00:05 = 60 s.
    assert!(
        text.contains(r#"gha_job_startup_duration_seconds_sum{enterprise="",organization="acme",repository="widgets",job_name="build-x",event_name="push"} 3.0"#),
        "{text}"
    );
    assert!(
        text.contains(r#"gha_job_execution_duration_seconds_sum{enterprise="",organization="acme",repository="widgets",job_name="build-x",event_name="push",job_result="succeeded"} 60.0"#),
        "{text}"
    );
    let buckets = lines_of(&text, "gha_job_startup_duration_seconds")
        .iter()
        .filter(|l| l.contains("_bucket"))
        .count();
    assert_eq!(buckets, DEFAULT_BUCKETS.len() + 1, "45 buckets plus +Inf");
    // The listener's own metrics.
    assert!(
        text.contains(
            r#"gha_listener_last_poll_age_seconds{name="set-abc",namespace="arc-runners"} 1.5"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"gha_last_job_queue_duration_seconds{name="set-abc",namespace="arc-runners"} 5.0"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"gha_listener_fatal_error{name="set-abc",namespace="arc-runners"} 0"#),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn selection_replaces_defaults_and_resolves_labels() {
    let selection: MetricsSelection = serde_json::from_value(serde_json::json!({
        "counters": {
            "gha_started_jobs_total": {"labels": ["repository", "job_workflow_name", "job_workflow_target", "name", "bogus"]},
            "gha_assigned_jobs": {"labels": []}
        },
        "gauges": {"gha_desired_runners": {"labels": ["namespace", "job_name"]}, "gha_nope": {"labels": []}},
        "histograms": {"gha_job_startup_duration_seconds": {"labels": [], "buckets": [1, 10]}}
    }))
    .unwrap();
    assert_eq!(
        unknown_entries(Some(&selection)),
        [
            (Kind::Counter, "gha_assigned_jobs".to_owned()),
            (Kind::Gauge, "gha_nope".to_owned())
        ]
    );
    let metrics = Metrics::new(identity(), Some(&selection)).unwrap();
    metrics.record_statistics(&Statistics {
        total_assigned_jobs: 3,
        ..Statistics::default()
    });
    metrics.record_desired(2);
    metrics.record_job_started(&JobStarted {
        job: job("x"),
        runner_id: 1,
        runner_name: "r".into(),
    });
    let text = metrics.encode(0.0).unwrap();
    assert!(!text.contains("gha_assigned_jobs"), "{text}");
    assert!(!text.contains("gha_completed_jobs"), "{text}");
    assert_eq!(
        lines_of(&text, "gha_desired_runners"),
        [r#"gha_desired_runners{namespace="arc-runners",job_name=""} 2"#]
    );
    assert_eq!(
        lines_of(&text, "gha_started_jobs"),
        [
            r#"gha_started_jobs_total{repository="widgets",job_workflow_name="ci",job_workflow_target="heads/main",name="",bogus=""} 1"#
        ]
    );
    let startup = lines_of(&text, "gha_job_startup_duration_seconds");
    assert!(
        startup.contains(&r#"gha_job_startup_duration_seconds_bucket{le="1.0"} 0"#),
        "{startup:?}"
    );
    assert!(
        startup.contains(&r#"gha_job_startup_duration_seconds_bucket{le="10.0"} 1"#),
        "{startup:?}"
    );
    assert!(
        startup.contains(&r#"gha_job_startup_duration_seconds_bucket{le="+Inf"} 1"#),
        "{startup:?}"
    );

    let nothing = Metrics::new(identity(), Some(&MetricsSelection::default())).unwrap();
    let text = nothing.encode(0.0).unwrap();
    assert!(
        ArcMetric::ALL.iter().all(|m| !text.contains(m.name())),
        "{text}"
    );
    assert!(text.contains("gha_listener_last_poll_age_seconds"));
}

#[test]
fn jobs_without_timestamps() {
    let metrics = Metrics::new(identity(), None).unwrap();
    let bare = JobInfo {
        owner_name: "acme".into(),
        ..JobInfo::default()
    };
    // Started without times: counted, no duration observed (ARC would observe garbage).
    metrics.record_job_started(&JobStarted {
        job: bare.clone(),
        ..JobStarted::default()
    });
    // Completed before a runner got it: not counted at all, as in ARC.
    metrics.record_job_completed(&JobCompleted {
        job: bare,
        result: "canceled".into(),
        ..JobCompleted::default()
    });
    let text = metrics.encode(0.0).unwrap();
    assert_eq!(lines_of(&text, "gha_started_jobs").len(), 1, "{text}");
    assert!(lines_of(&text, "gha_completed_jobs").is_empty(), "{text}");
    assert!(
        lines_of(&text, "gha_job_startup_duration_seconds").is_empty(),
        "{text}"
    );
}

#[test]
fn errors_and_fatal_state() {
    let metrics = Metrics::new(identity(), None).unwrap();
    metrics.record_error(Severity::Transient, "get_message");
    metrics.record_error(Severity::Transient, "get_message");
    metrics.record_error(Severity::Fatal, "create_session");
    metrics.set_fatal(true);
    let text = metrics.encode(0.0).unwrap();
    assert!(text.contains(r#"gha_listener_errors_total{name="set-abc",namespace="arc-runners",severity="transient",operation="get_message"} 2"#), "{text}");
    assert!(text.contains(r#"gha_listener_errors_total{name="set-abc",namespace="arc-runners",severity="fatal",operation="create_session"} 1"#), "{text}");
    assert!(
        text.contains(r#"gha_listener_fatal_error{name="set-abc",namespace="arc-runners"} 1"#),
        "{text}"
    );
}

#[test]
fn enterprise_and_org_identities() {
    let enterprise = GitHubConfig::parse_with("https://github.com/enterprises/big", false).unwrap();
    let id = ScaleSetIdentity::new(&enterprise, "ns", "n");
    assert_eq!(
        (
            id.enterprise.as_str(),
            id.organization.as_str(),
            id.repository.as_str()
        ),
        ("big", "", "")
    );
    let org = GitHubConfig::parse_with("https://github.com/acme", false).unwrap();
    let id = ScaleSetIdentity::new(&org, "ns", "n");
    assert_eq!(
        (
            id.enterprise.as_str(),
            id.organization.as_str(),
            id.repository.as_str()
        ),
        ("", "acme", "")
    );
}

#[test]
fn selection_problems() {
    let check = |value: serde_json::Value| {
        let selection: MetricsSelection = serde_json::from_value(value).unwrap();
        check_selection(Some(&selection)).map_err(|p| p.to_string())
    };
    assert_eq!(
        check(serde_json::json!({"gauges": {"gha_idle_runners": {"labels": ["name", "name"]}}})),
        Err("metrics.gauges.gha_idle_runners: label \"name\" is listed twice".into())
    );
    assert_eq!(
        check(serde_json::json!({"gauges": {"gha_idle_runners": {"labels": ["bad-label"]}}})),
        Err("metrics.gauges.gha_idle_runners: \"bad-label\" is not a valid label name".into())
    );
    assert_eq!(
        check(serde_json::json!({"gauges": {"gha_idle_runners": {"labels": ["__x"]}}})),
        Err("metrics.gauges.gha_idle_runners: \"__x\" is not a valid label name".into())
    );
    assert_eq!(
        check(serde_json::json!({"histograms": {"gha_job_execution_duration_seconds": {"labels": ["le"]}}})),
        Err("metrics.histograms.gha_job_execution_duration_seconds: \"le\" is reserved for histogram buckets".into())
    );
    assert_eq!(
        check(serde_json::json!({"histograms": {"gha_job_execution_duration_seconds": {"buckets": [1, 1]}}})),
        Err("metrics.histograms.gha_job_execution_duration_seconds: buckets must be strictly increasing".into())
    );
    assert_eq!(
        check(serde_json::json!({"counters": {"gha_started_jobs_total": {"buckets": [1]}}})),
        Err("metrics.counters.gha_started_jobs_total: buckets only apply to histograms".into())
    );
    // Unknown or misplaced names are skipped, not errors, whatever their value.
    assert_eq!(
        check(serde_json::json!({"counters": {"gha_idle_runners": null, "x": {"labels": ["-"]}}})),
        Ok(())
    );
    // `le` is fine on a gauge.
    assert_eq!(
        check(serde_json::json!({"gauges": {"gha_idle_runners": {"labels": ["le"]}}})),
        Ok(())
    );
}
