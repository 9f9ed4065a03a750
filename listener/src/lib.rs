//! The runner scale-set listener: a drop-in replacement for ARC's `ghalistener`.
//!
//! It holds a message session with the GitHub Actions Service for one runner scale set, long-polls its message
//! queue, acquires the jobs offered, and scales one `EphemeralRunnerSet` by merge-patching `replicas` and
//! `patchID`. See `docs/listener.md` for the configuration, metrics, health endpoint and failure behaviour.
//!
//! * [`config`]: the JSON config file and its validation.
//! * [`scaling`] and [`backoff`]: the pure decisions (desired replicas, patch IDs) and the retry schedules;
//!   [`policy`]: scheduled minimums and the scale-down delay (not in ARC).
//! * [`listener`]: the message loop; [`target`]: the Kubernetes writes; [`status`]: what the controller is told,
//!   in the AutoscalingListener's status.
//! * [`metrics`], [`health`], [`server`]: observability.
//! * [`app`]: wiring from a config to a running listener.

pub mod app;
pub mod backoff;
pub mod completions;
pub mod config;
pub mod error;
pub mod health;
pub mod listener;
pub mod metrics;
pub mod policy;
pub mod scaling;
pub mod server;
pub mod status;
pub mod target;
pub mod telemetry;
pub mod workflow;

pub use app::Listener;
pub use config::Config;
pub use error::{Error, Result, Severity};
pub use listener::{MessageLoop, ScaleSet, Settings};
