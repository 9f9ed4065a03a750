//! Names shared by the images, the runner binary and the tests that use them.

/// The project image's reference, as the e2e worlds name it in the manager's `--listener-image` default.
pub const PROJECT_IMAGE: &str = "ghcr.io/arc-rs/arc-rs:e2e";
/// The sandbox (pause) image, named in containerd's CRI `sandbox_image`.
pub const PAUSE_IMAGE: &str = "docker.io/arc-rs/pause:test";
/// The stand-in for `ghcr.io/actions/actions-runner`.
pub const RUNNER_IMAGE: &str = "docker.io/arc-rs/runner:test";

/// Entrypoints inside the images.
pub const MANAGER_PATH: &str = "/manager";
pub const LISTENER_PATH: &str = "/ghalistener";
pub const LISTENER_ALIAS: &str = "/listener";
pub const PAUSE_PATH: &str = "/pause";
pub const RUNNER_PATH: &str = "/runner";

/// The distroless `nonroot` user the Dockerfile's image runs as.
pub const NONROOT_UID: u32 = 65532;

/// The environment variable through which the runner container gets its encoded JIT config (a `secretKeyRef`
/// to the JIT Secret, as the EphemeralRunner controller wires it).
pub const JIT_CONFIG_ENV: &str = "ACTIONS_RUNNER_INPUT_JITCONFIG";

/// Switches of the runner image (environment variables of the runner container).
pub mod env {
    /// How long the job runs, in milliseconds (default 1000).
    pub const JOB_MS: &str = "ARC_RS_RUNNER_JOB_MS";
    /// The result reported for the job (default `succeeded`).
    pub const JOB_RESULT: &str = "ARC_RS_RUNNER_JOB_RESULT";
    /// The exit code after the job (default 0).
    pub const EXIT_CODE: &str = "ARC_RS_RUNNER_EXIT_CODE";
    /// How often the runner asks for its job, in milliseconds (default 200).
    pub const POLL_MS: &str = "ARC_RS_RUNNER_POLL_MS";
    /// How often the runner renews the job it runs, in milliseconds (default 1000); a runner that stops
    /// renewing (killed, its node gone) is lost once the fake's `runner_lost_timeout` passes.
    pub const RENEW_MS: &str = "ARC_RS_RUNNER_RENEW_MS";
    /// An exit code: the runner exits with it at once, before reporting online (a runner that cannot start:
    /// a broken image or configuration).
    pub const EXIT_AT_START: &str = "ARC_RS_RUNNER_EXIT_AT_START";
    /// `1`: the process starts and then does nothing at all (never reports online, never exits).
    pub const HANG: &str = "ARC_RS_RUNNER_HANG";
    /// `1`: SIGTERM is logged and ignored; only SIGKILL (the end of the grace period) stops the runner.
    pub const IGNORE_SIGTERM: &str = "ARC_RS_RUNNER_IGNORE_SIGTERM";
    /// `1`: once its job starts, the runner allocates and touches memory until the kernel OOM-kills it.
    pub const GROW_MEMORY: &str = "ARC_RS_RUNNER_GROW_MEMORY";
}

/// The key of the JIT config's runner file, and the field of it that names the fake's control API (the fake
/// puts it there for stand-in runners).
pub const JIT_RUNNER_FILE: &str = ".runner";
pub const JIT_FAKE_CONTROL_URL: &str = "fakeControlUrl";
