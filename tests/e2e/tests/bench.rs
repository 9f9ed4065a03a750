//! The benchmark's own plumbing, small: `e2e-bench` must keep working, and the per-job budgets it reports are
//! counts (not timings), so they are checked here: at most 3 Actions Service calls per job, no runner created
//! for a job that is already done, and every runner's departure measured.

use std::time::Duration;

use e2e::bench::{BenchConfig, run};

#[tokio::test(flavor = "multi_thread")]
async fn a_small_bench_run_reports_every_figure_within_the_call_budget() {
    e2e::init_test_tracing();
    let jobs = 30;
    let report = run(&BenchConfig {
        jobs,
        job_duration: Duration::from_secs(1),
        timeout: Duration::from_secs(300),
        baseline_objects: 20,
    })
    .await
    .expect("the bench runs");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.completed, jobs as usize);
    assert!(report.burst_to_pods_secs.is_some(), "{report:?}");
    assert_eq!(report.finish_to_gone.samples, jobs as usize, "{report:?}");
    assert!(
        report.actions_calls_per_job <= 3.0,
        "Actions Service calls per job over budget: {:.2} {:?}",
        report.actions_calls_per_job,
        report.actions_calls
    );
    // A runner may rarely be made for a job that finishes in the same instant (the protocol's race); twice as
    // many runners as jobs was the bug this guards against.
    let runners = report
        .actions_calls
        .get("generate_jit_config")
        .copied()
        .unwrap_or(0);
    assert!(
        runners >= u64::from(jobs) && runners <= u64::from(jobs) + 3,
        "one runner per job, none for jobs already done: {:?}",
        report.actions_calls
    );
    assert!(
        report
            .actions_calls
            .get("remove_runner")
            .copied()
            .unwrap_or(0)
            <= runners,
        "at most one deregistration per runner: {:?}",
        report.actions_calls
    );
    assert!(report.manager_peak_rss_mib > 0.0 && report.listener_peak_rss_mib > 0.0);
    // The Kubernetes budget of a runner's life (docs/benchmarks.md lists the writes one by one); a small run
    // pays more per job for the set's own writes, which a burst shares.
    assert!(
        report.kubernetes_writes_per_job > 0.0 && report.kubernetes_writes_per_job <= 14.0,
        "Kubernetes writes per job over budget: {:.2} {:?}",
        report.kubernetes_writes_per_job,
        report.kubernetes_writes
    );
    // One look for the runner's JIT Secret before it exists, and the shared credentials read now and then: not
    // a read of either on every pass.
    let secret_reads = report
        .kubernetes_reads
        .get("secrets GET")
        .copied()
        .unwrap_or(0);
    assert!(
        secret_reads as f64 / f64::from(jobs) <= 2.0,
        "Secret reads per job over budget: {secret_reads} for {jobs} jobs"
    );
    for process in ["manager", "listener", "kube-apiserver", "etcd"] {
        assert!(
            report.cpu_secs.contains_key(process),
            "no CPU time for {process}: {:?}",
            report.cpu_secs
        );
    }
    assert_eq!(report.baseline.writes, 20 * 3 * 2);
}
