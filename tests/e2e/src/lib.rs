//! End-to-end testing of the runner scale-set mode, and the local demo.
//!
//! * [`simulator`] stands in for the kubelet and the runner binary of runner pods.
//! * [`world`] starts everything a scale set needs on one machine: the local control plane, the fake Actions
//!   Service, the manager in-process, the listener-pod executor running the real listener, the simulator, and
//!   one scale set installed from the objects `helm template` renders for the scale-set chart.
//! * [`node_world`] is the same on a real node: the listener and the runners real pods from the project's
//!   images, run by a kubelet (the real-node tier and `demo --real-node`).
//! * [`bench`] and [`many_sets`] are the benchmark behind `e2e-bench`: one scale set and a burst of jobs, or
//!   many scale sets with a few jobs each.
//! * [`checks`] are the invariants every suite ends with: every job completed exactly once, no runner left in
//!   the fake, no orphan pod, Secret or EphemeralRunner.
//!
//! The suites are in `tests/`; the demo is `cargo run -p e2e --bin demo` (see `docs/demo.md`).

pub mod bench;
pub mod chaos;
pub mod checks;
pub mod cli;
pub mod lifecycle_baseline;
pub mod manager_rbac;
pub mod many_sets;
pub mod node_world;
pub mod simulator;
pub mod world;

use std::time::Duration;

/// Everything that can go wrong while setting up or checking an end-to-end world.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the local control plane: {0}")]
    ControlPlane(String),
    #[error("the test harness")]
    Harness(#[from] test_harness::Error),
    #[error("the fake Actions Service")]
    Fake(#[from] fake_actions_service::Error),
    #[error("the fake Actions Service refused a control call: {0}")]
    FakeRejected(#[from] fake_actions_service::Rejection),
    #[error("rendering the chart")]
    Chart(#[from] chart_tests::Error),
    #[error("talking to the API server")]
    Kube(#[from] kube::Error),
    #[error("rendered object {what} is not a valid Kubernetes object: {reason}")]
    InvalidObject { what: String, reason: String },
    #[error("the manager stopped: {0}")]
    Manager(String),
    #[error("timed out after {timeout:?} waiting for {what}; last seen: {detail}")]
    Timeout {
        what: String,
        timeout: Duration,
        detail: String,
    },
    #[error("invariant violated: {0}")]
    Invariant(String),
    #[error("stopping the listener process of pod {pod}: {reason}")]
    KillListener { pod: String, reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Logs to the test output, filtered by `RUST_LOG` (nothing by default), once per process.
pub fn init_test_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
}
