//! The Grafana dashboard and `docs/metrics.md` against the manager's metrics: every manager metric a dashboard
//! query names is exported, with the labels the query uses, and the documentation mentions every metric the
//! manager exports. The listener's half is `listener/tests/dashboard.rs`; the shared checks are in
//! `dashboard_support`.

mod dashboard_support;

use std::time::Instant;

use controller::metrics::{
    ActionsCallLabels, Metrics, RunnerLabels, RunnerReasonLabels, ScaleSetLabels, encode,
};
use prometheus_client::registry::Registry;

/// The manager's registry as it serves it, with one value in every family so that the label names show.
fn manager_exposition() -> String {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let scale_set = ScaleSetLabels {
        name: "set".into(),
        namespace: "runners".into(),
        ..ScaleSetLabels::default()
    };
    let runner = RunnerLabels {
        name: "set".into(),
        namespace: "runners".into(),
    };
    let reason = RunnerReasonLabels {
        name: "set".into(),
        namespace: "runners".into(),
        reason: "runner_exit",
    };
    for gauge in [
        &metrics.pending_runners,
        &metrics.running_runners,
        &metrics.failed_runners,
        &metrics.running_listeners,
    ] {
        gauge.get_or_create(&scale_set).set(1);
    }
    for counter in [
        &metrics.pod_failures,
        &metrics.pod_disruptions,
        &metrics.pod_rejections,
    ] {
        counter.get_or_create(&reason).inc();
    }
    metrics.listener_session_held.get_or_create(&runner).set(1);
    for counter in [
        &metrics.retries_exhausted,
        &metrics.zombie_runners,
        &metrics.runners_created,
        &metrics.runners_scaled_down,
    ] {
        counter.get_or_create(&runner).inc();
    }
    metrics
        .actions_requests
        .get_or_create(&ActionsCallLabels {
            operation: "generate_jit_config",
            result: "ok",
        })
        .inc();
    let error = controller::Error::Several(Vec::new());
    metrics.record_reconcile("ephemeralrunner", Instant::now(), Some(&error));
    encode(&registry)
}

#[test]
fn the_promql_reader_works() {
    dashboard_support::check_reader();
}

#[test]
fn dashboard_and_docs_match_the_managers_metrics() {
    let exported = dashboard_support::Exported::parse(&manager_exposition());
    assert!(
        exported
            .series
            .contains_key("controller_runtime_reconcile_time_seconds_bucket"),
        "the exposition was not read: {:?}",
        exported.series.keys()
    );
    dashboard_support::assert_consistent(
        &exported,
        dashboard_support::is_manager_metric,
        "manager",
    );
}
