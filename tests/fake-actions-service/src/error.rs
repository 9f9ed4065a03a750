//! Errors of the fake itself (start-up and serving), and the refusals it answers clients with.

use std::net::SocketAddr;

/// What can go wrong running the fake.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listening socket could not be bound.
    #[error("binding {addr}")]
    Bind {
        /// Requested address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The bound socket did not report its address.
    #[error("reading the bound address")]
    LocalAddr(#[source] std::io::Error),
    /// A configured GitHub App public key is not a usable RSA PEM.
    #[error("parsing the public key of GitHub App {app_id}")]
    ParseAppPublicKey {
        /// The App.
        app_id: String,
        /// Cause.
        #[source]
        source: jsonwebtoken::errors::Error,
    },
    /// The configured advertised URL is not an absolute URL.
    #[error("parsing the advertised URL {url}")]
    ParseAdvertisedUrl {
        /// The URL.
        url: String,
        /// Cause.
        #[source]
        source: url::ParseError,
    },
    /// The HTTP server stopped with an error.
    #[error("serving HTTP")]
    Serve(#[source] std::io::Error),
}

/// A refusal: the status and error body the fake answers with. Returned by state operations and by the
/// in-process control handle.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct Rejection {
    /// HTTP status.
    pub status: u16,
    /// .NET exception type for Actions Service errors; `None` for GitHub and control errors.
    pub type_name: Option<String>,
    /// Human-readable text.
    pub message: String,
}

impl Rejection {
    /// A plain refusal (GitHub API and control API bodies carry only the message).
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            type_name: None,
            message: message.into(),
        }
    }

    /// An Actions Service exception.
    pub fn exception(status: u16, type_name: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            type_name: Some(type_name.to_owned()),
            message: message.into(),
        }
    }
}

/// Fully qualified .NET type names the fake answers with. The first three are matched by clients; the
/// session conflict, scale-set-not-found, session-expired and admin-exception names were observed on the real
/// service (public issues). The others are this fake's choice, built the same way.
pub mod exceptions {
    /// Duplicate runner name on JIT config (409).
    pub const AGENT_EXISTS: &str =
        "GitHub.DistributedTask.WebApi.AgentExistsException, GitHub.DistributedTask.WebApi";
    /// Unknown runner (404).
    pub const AGENT_NOT_FOUND: &str =
        "GitHub.DistributedTask.WebApi.AgentNotFoundException, GitHub.DistributedTask.WebApi";
    /// Removing a runner that holds a job (400).
    pub const JOB_STILL_RUNNING: &str =
        "GitHub.DistributedTask.WebApi.JobStillRunningException, GitHub.DistributedTask.WebApi";
    /// Second session for a scale set (409).
    pub const SESSION_CONFLICT: &str = "GitHub.Actions.Runtime.WebApi.RunnerScaleSetSessionConflictException, GitHub.Actions.Runtime.WebApi";
    /// Deleting an unknown session (400).
    pub const SESSION_EXPIRED: &str = "GitHub.Actions.Runtime.WebApi.RunnerScaleSetSessionExpiredException, GitHub.Actions.Runtime.WebApi";
    /// Refreshing an unknown session (404).
    pub const RUNNER_ADMIN: &str =
        "GitHub.Actions.Runtime.WebApi.RunnerAdminException, GitHub.Actions.Runtime.WebApi";
    /// Unknown scale set (404).
    pub const SCALE_SET_NOT_FOUND: &str = "GitHub.Actions.Runtime.WebApi.RunnerScaleSetNotFoundException, GitHub.Actions.Runtime.WebApi";
    /// Duplicate scale-set name in a runner group (409). Fake's choice.
    pub const SCALE_SET_EXISTS: &str = "GitHub.Actions.Runtime.WebApi.RunnerScaleSetExistsException, GitHub.Actions.Runtime.WebApi";
    /// Deleting a scale set while a runner runs a job (400). Fake's choice.
    pub const SCALE_SET_BUSY: &str =
        "GitHub.Actions.Runtime.WebApi.RunnerScaleSetBusyException, GitHub.Actions.Runtime.WebApi";
    /// Unknown runner group (404). Fake's choice.
    pub const RUNNER_GROUP_NOT_FOUND: &str =
        "GitHub.DistributedTask.WebApi.RunnerGroupNotFoundException, GitHub.DistributedTask.WebApi";
    /// Malformed request (400).
    pub const ARGUMENT: &str = "System.ArgumentException, mscorlib";
    /// Missing `api-version` (400). Fake's choice, named like the VSS framework's.
    pub const VERSION_NOT_SPECIFIED: &str =
        "GitHub.Services.WebApi.VssVersionNotSpecifiedException, GitHub.Services.WebApi";
    /// Missing, unknown or expired token (401).
    pub const UNAUTHORIZED: &str =
        "GitHub.Services.Common.VssUnauthorizedException, GitHub.Services.Common";
    /// Unknown path or wrong method (404/405).
    pub const RESOURCE_NOT_FOUND: &str =
        "GitHub.Services.WebApi.VssResourceNotFoundException, GitHub.Services.WebApi";
    /// A fault injected by a test (5xx, 429).
    pub const INJECTED_FAULT: &str =
        "FakeActionsService.InjectedFaultException, FakeActionsService";
}
