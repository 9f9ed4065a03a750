//! The Grafana dashboard and `docs/metrics.md` against the listener's metrics: every listener metric a dashboard
//! query names is exported (with the default metric selection, which is what the chart configures), with the
//! labels the query uses, and the documentation mentions every metric the listener exports. The manager's half
//! and the shared checks are in the controller crate's tests.

#[path = "../../controller/tests/dashboard_support/mod.rs"]
mod dashboard_support;

use actions_client::{GitHubConfig, JobCompleted, JobInfo, JobStarted, Statistics};
use listener::Severity;
use listener::metrics::{Metrics, ScaleSetIdentity};

fn job() -> JobInfo {
    let at = |s: &str| Some(s.parse().expect("a timestamp"));
    JobInfo {
        repository_name: "widgets".into(),
        owner_name: "acme".into(),
        job_workflow_ref: "acme/widgets/.github/workflows/ci.yml@refs/heads/main".into(),
        job_display_name: "build".into(),
        event_name: "push".into(),
        queue_time: at("2025-01-01T10:00:00Z"),
        scale_set_assign_time: at("2025-01-01T10:00:01Z"),
        runner_assign_time: at("2025-01-01T10:00:05Z"),
        finish_time: at("2025-01-01T10:01:05Z"),
        ..JobInfo::default()
    }
}

/// The listener's metrics as it serves them, with one value in every family so that the label names show.
fn listener_exposition() -> String {
    let github = GitHubConfig::parse_with("https://github.com/acme/widgets", false).expect("a URL");
    let identity = ScaleSetIdentity::new(&github, "arc-runners", "arc-runner-set");
    let metrics = Metrics::new(identity, None).expect("the default selection");
    metrics.record_bounds(0, 10);
    metrics.record_statistics(&Statistics {
        total_assigned_jobs: 1,
        total_running_jobs: 1,
        total_registered_runners: 1,
        total_busy_runners: 1,
        ..Statistics::default()
    });
    metrics.record_desired(1);
    metrics.record_policy(2, 1);
    metrics.record_job_started(&JobStarted {
        job: job(),
        runner_id: 1,
        runner_name: "runner".into(),
    });
    metrics.record_job_completed(&JobCompleted {
        job: job(),
        result: "succeeded".into(),
        runner_id: 1,
        runner_name: "runner".into(),
    });
    metrics.record_error(Severity::Transient, "get_message");
    metrics.set_fatal(false);
    metrics.encode(1.0).expect("encoding")
}

#[test]
fn the_promql_reader_works() {
    dashboard_support::check_reader();
}

#[test]
fn dashboard_and_docs_match_the_listeners_metrics() {
    let exported = dashboard_support::Exported::parse(&listener_exposition());
    assert!(
        exported.series.contains_key("gha_completed_jobs_total"),
        "the exposition was not read: {:?}",
        exported.series.keys()
    );
    dashboard_support::assert_consistent(
        &exported,
        |name| !dashboard_support::is_manager_metric(name),
        "listener",
    );
}
