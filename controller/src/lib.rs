//! The controller manager of the runner scale set mode (`actions.github.com/v1alpha1`): a library with one
//! module tree per reconciler, sharing one [`context::Context`], and a thin `manager` binary ([`app::run`]).
//!
//! * [`manager::Manager`] starts the shared watches and the controllers and stops them on one shutdown token;
//!   tests run it in-process against a real API server.
//! * [`ephemeral_runner_set`] keeps the number of runners the listener asks for (patch-ID protocol).
//! * [`ephemeral_runner`] runs one runner: JIT registration, pod, failures, deregistration.
//! * Pure decisions (which runner to remove, failure policy, the pod and runner objects, names and hashes) live
//!   in their own modules with unit and property tests.
//! * Layers: the four controller modules ([`autoscaling_runner_set`], [`autoscaling_listener`],
//!   [`ephemeral_runner_set`], [`ephemeral_runner`]) use only the shared modules ([`context`], [`error`],
//!   [`kubeutil`], [`actions`], [`proxy`], [`options`], [`metrics`], [`hash`], [`labels`], [`pods`],
//!   [`completions`], [`listener_tasks`]), and the EphemeralRunnerSet controller reads what it may know of a runner from
//!   [`ephemeral_runner::facts`] alone, which imports nothing from the set; no controller imports another
//!   otherwise, and the shared modules use no controller module. What two controllers both need moves down into
//!   them.
//!
//! See `docs/runner-lifecycle.md` for the runner lifecycle and its failure handling.

pub mod actions;
pub mod app;
pub mod autoscaling_listener;
pub mod autoscaling_runner_set;
pub mod cli;
pub mod completions;
pub mod context;
pub mod ephemeral_runner;
pub mod ephemeral_runner_set;
pub mod error;
pub mod fair;
pub mod hash;
pub mod inflight;
pub mod kubeutil;
pub mod labels;
pub mod leader;
pub mod listener_tasks;
pub mod manager;
pub mod metrics;
pub mod options;
pub mod pods;
pub mod proxy;
pub mod ratelimit;
pub mod relist;
pub mod server;
pub mod telemetry;

pub use error::{Error, Result};
pub use manager::{Manager, Readiness};
pub use options::Options;
