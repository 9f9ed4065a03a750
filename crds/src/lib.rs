//! The four `actions.github.com/v1alpha1` kinds of ARC's runner scale set mode as Rust types, the CRDs generated
//! from them, and the names, labels and helpers shared by the controllers and the listener.
//!
//! JSON shapes follow ARC exactly: field names, which fields are omitted when empty (Go's `omitempty`, here
//! `skip_serializing_if`) and which are always written, because the listener and the controllers exchange these
//! objects through merge patches and objects created by ARC must keep working.
//!
//! Use [`all_crds`] (or [`crd`]) rather than `K::crd()`: they apply the schema fixes of [`schema::finalize`].

pub mod appconfig;
pub mod common;
pub mod constants;
pub mod listing;
pub mod names;
pub mod schedule;
pub mod schema;
pub mod version;

mod autoscaling_listener;
mod autoscaling_runner_set;
mod ephemeral_runner;
mod ephemeral_runner_set;
mod error;
mod render;

pub use autoscaling_listener::{
    AutoscalingListener, AutoscalingListenerSpec, AutoscalingListenerStatus, ListenerError,
    ListenerPodFailures, ListenerSession, ListenerStatistics,
};
pub use autoscaling_runner_set::{
    AutoscalingRunnerSet, AutoscalingRunnerSetSpec, AutoscalingRunnerSetStatus,
    RerunInterruptedJobs,
};
pub use ephemeral_runner::{
    EphemeralRunner, EphemeralRunnerSpec, EphemeralRunnerStatus, job_fields_apply,
    registration_guarded_status_patch,
};
pub use ephemeral_runner_set::{
    EphemeralRunnerSet, EphemeralRunnerSetSpec, EphemeralRunnerSetStatus,
};
pub use error::Error;
pub use render::{
    CRD_DIR, Drift, all_crds, check_dir, crd, crd_file_name, render_all, render_crd,
    workspace_crd_dir, write_all,
};

/// `skip_serializing_if` for Go integers tagged `omitempty`.
#[allow(clippy::trivially_copy_pass_by_ref)] // serde passes a reference
pub(crate) fn is_zero(value: &i64) -> bool {
    *value == 0
}
