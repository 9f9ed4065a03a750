//! The crate's error type, and how the message loop classifies each failure.

use std::path::PathBuf;

use actions_client::ErrorKind;

use crate::config::ConfigProblem;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How the message loop reacts to a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Severity {
    /// Likely to clear by itself (5xx, resets, timeouts, a dropped session): short capped backoff.
    Transient,
    /// Needs someone to act (bad credentials, missing permission, scale set or EphemeralRunnerSet gone): long
    /// capped backoff, reported as a metric, but the process stays up so it recovers once fixed.
    Fatal,
    /// The configuration can never work: the process exits.
    Unrecoverable,
}

impl Severity {
    /// Bounded metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Fatal => "fatal",
            Self::Unrecoverable => "unrecoverable",
        }
    }
}

/// What went wrong, as the listener reports it to the controller (`status.lastError.category` of its
/// AutoscalingListener, which the controller maps to a condition reason) and as the loop decides whether its
/// session is still good: one classification for both, so they cannot disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    /// Another listener holds the scale set's message session (409).
    SessionConflict,
    /// The service rejected the credentials (401).
    CredentialsRejected,
    /// The credentials lack a permission (403).
    PermissionDenied,
    /// The service no longer knows the scale set.
    ScaleSetNotFound,
    /// The service dropped the session, or its queue token expired.
    SessionLost,
    /// The service's certificate is not trusted.
    TlsCertificateRejected,
    /// The service could not be reached or did not answer properly: connection failures, timeouts, rate limits,
    /// 5xx answers. The session stays valid once the network is back.
    ServiceUnreachable,
    /// Any other failure talking to the service, and failures outside the message loop's calls.
    ServiceError,
    /// The EphemeralRunnerSet to scale is gone (404).
    RunnerSetNotFound,
    /// The API server refused a write the listener needs (401, 403).
    KubernetesForbidden,
    /// Any other Kubernetes API failure.
    KubernetesError,
}

impl Category {
    /// The fixed word the controller reads.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SessionConflict => "SessionConflict",
            Self::CredentialsRejected => "CredentialsRejected",
            Self::PermissionDenied => "PermissionDenied",
            Self::ScaleSetNotFound => "ScaleSetNotFound",
            Self::SessionLost => "SessionLost",
            Self::TlsCertificateRejected => "TlsCertificateRejected",
            Self::ServiceUnreachable => "ServiceUnreachable",
            Self::ServiceError => "ServiceError",
            Self::RunnerSetNotFound => "RunnerSetNotFound",
            Self::KubernetesForbidden => "KubernetesForbidden",
            Self::KubernetesError => "KubernetesError",
        }
    }

    /// The category of an Actions Service failure.
    fn of_actions(e: &actions_client::Error) -> Self {
        match e.kind() {
            Some(ErrorKind::SessionConflict) => Self::SessionConflict,
            Some(ErrorKind::Unauthorized) => Self::CredentialsRejected,
            Some(ErrorKind::Forbidden) => Self::PermissionDenied,
            Some(ErrorKind::ScaleSetNotFound) => Self::ScaleSetNotFound,
            Some(ErrorKind::SessionNotFound | ErrorKind::MessageQueueTokenExpired) => {
                Self::SessionLost
            }
            Some(ErrorKind::TlsCertificate) => Self::TlsCertificateRejected,
            Some(
                ErrorKind::RateLimited
                | ErrorKind::ServerError
                | ErrorKind::Connect
                | ErrorKind::Timeout
                | ErrorKind::DeadlineExceeded
                | ErrorKind::Transport,
            ) => Self::ServiceUnreachable,
            _ => Self::ServiceError,
        }
    }
}

/// Every error this crate returns. Variants name the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `LISTENER_CONFIG_PATH` is not set.
    #[error(
        "the environment variable LISTENER_CONFIG_PATH is not set; it must name the JSON config file"
    )]
    ConfigPathUnset,
    /// The config file could not be read.
    #[error("reading the config file {path} failed")]
    ReadConfig {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not the expected JSON.
    #[error("decoding the config file failed: {0}")]
    DecodeConfig(String),
    /// The config decoded but is not usable.
    #[error("invalid config: {0}")]
    ValidateConfig(ConfigProblem),
    /// The log subscriber could not be installed.
    #[error("setting up logging failed: {0}")]
    InitLogging(String),
    /// The Actions client could not be built (credentials, proxy or root CA unusable).
    #[error("building the GitHub Actions client failed")]
    BuildActionsClient(#[source] actions_client::Error),
    /// The GitHub credentials could not be read from Azure Key Vault (boxed: large, and only at start-up).
    #[error("reading the GitHub credentials from Azure Key Vault failed ({})", .0.reason())]
    ReadVaultCredentials(#[source] Box<vault::Error>),
    /// Neither an in-cluster configuration nor a kubeconfig was found.
    #[error("loading the Kubernetes client configuration failed")]
    InferKubeConfig(#[source] kube::config::InferConfigError),
    /// The Kubernetes client could not be built.
    #[error("building the Kubernetes client failed")]
    BuildKubeClient(#[source] kube::Error),
    /// An HTTP server (metrics, health) could not listen.
    #[error("binding the {what} server to {addr:?} failed")]
    BindServer {
        /// `metrics` or `health`.
        what: &'static str,
        /// The configured address.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An HTTP server stopped with an error.
    #[error("serving {what} failed")]
    Serve {
        /// `metrics` or `health`.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Creating the message session failed.
    #[error("creating the message session failed")]
    CreateSession(#[source] actions_client::Error),
    /// The service answered session creation with an unusable session.
    #[error("the message session returned by the service is unusable: {0}")]
    InvalidSession(&'static str),
    /// The long poll failed.
    #[error("polling the message queue failed")]
    GetMessage(#[source] actions_client::Error),
    /// Acknowledging a message failed.
    #[error("acknowledging message {message_id} failed")]
    DeleteMessage {
        /// The message.
        message_id: i64,
        /// Why.
        #[source]
        source: actions_client::Error,
    },
    /// Acquiring jobs failed.
    #[error("acquiring {count} job(s) failed")]
    AcquireJobs {
        /// How many were requested.
        count: usize,
        /// Why.
        #[source]
        source: actions_client::Error,
    },
    /// The replica patch of the EphemeralRunnerSet failed.
    #[error("patching EphemeralRunnerSet {namespace}/{name} failed")]
    PatchEphemeralRunnerSet {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The job status patch of an EphemeralRunner failed.
    #[error("patching the status of EphemeralRunner {namespace}/{name} failed")]
    PatchEphemeralRunner {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// How the message loop reacts to this error.
    pub fn severity(&self) -> Severity {
        match self {
            Self::ConfigPathUnset
            | Self::ReadConfig { .. }
            | Self::DecodeConfig(_)
            | Self::ValidateConfig(_)
            | Self::InitLogging(_)
            | Self::BuildActionsClient(_)
            | Self::ReadVaultCredentials(_)
            | Self::InferKubeConfig(_)
            | Self::BuildKubeClient(_)
            | Self::BindServer { .. }
            | Self::Serve { .. } => Severity::Unrecoverable,
            Self::InvalidSession(_) => Severity::Fatal,
            Self::CreateSession(e)
            | Self::GetMessage(e)
            | Self::DeleteMessage { source: e, .. }
            | Self::AcquireJobs { source: e, .. } => actions_severity(e),
            Self::PatchEphemeralRunnerSet { source, .. }
            | Self::PatchEphemeralRunner { source, .. } => kube_severity(source),
        }
    }

    /// Whether the message session should be replaced before trying again: the service no longer accepts it
    /// (dropped, token refresh failed, credentials changed), or an acquire failed after the offers were
    /// acknowledged (the loop acquires those jobs again itself on the new session; a service that re-offers
    /// unacquired jobs to a new session may offer them too, and acquiring twice is harmless). Network-level
    /// failures keep the session: it is still valid once the network is back.
    pub fn needs_new_session(&self) -> bool {
        match self {
            Self::InvalidSession(_) | Self::AcquireJobs { .. } => true,
            Self::CreateSession(_) => false,
            Self::GetMessage(_) | Self::DeleteMessage { .. } => {
                self.category() != Category::ServiceUnreachable
            }
            _ => false,
        }
    }

    /// What went wrong, for the controller and for [`Error::needs_new_session`].
    pub fn category(&self) -> Category {
        match self {
            Self::CreateSession(e)
            | Self::GetMessage(e)
            | Self::DeleteMessage { source: e, .. }
            | Self::AcquireJobs { source: e, .. } => Category::of_actions(e),
            Self::PatchEphemeralRunnerSet { .. } => match self.kube_status() {
                Some(404) => Category::RunnerSetNotFound,
                Some(401 | 403) => Category::KubernetesForbidden,
                _ => Category::KubernetesError,
            },
            Self::PatchEphemeralRunner { .. } => match self.kube_status() {
                Some(401 | 403) => Category::KubernetesForbidden,
                _ => Category::KubernetesError,
            },
            _ => Category::ServiceError,
        }
    }

    /// A bounded name of the failed operation, for metric labels.
    pub fn operation(&self) -> &'static str {
        match self {
            Self::ConfigPathUnset
            | Self::ReadConfig { .. }
            | Self::DecodeConfig(_)
            | Self::ValidateConfig(_) => "load_config",
            Self::InitLogging(_) => "init_logging",
            Self::BuildActionsClient(_) => "build_actions_client",
            Self::ReadVaultCredentials(_) => "read_vault_credentials",
            Self::InferKubeConfig(_) | Self::BuildKubeClient(_) => "build_kube_client",
            Self::BindServer { .. } | Self::Serve { .. } => "serve_http",
            Self::CreateSession(_) | Self::InvalidSession(_) => "create_session",
            Self::GetMessage(_) => "get_message",
            Self::DeleteMessage { .. } => "delete_message",
            Self::AcquireJobs { .. } => "acquire_jobs",
            Self::PatchEphemeralRunnerSet { .. } => "patch_ephemeral_runner_set",
            Self::PatchEphemeralRunner { .. } => "patch_ephemeral_runner",
        }
    }

    /// The HTTP status of the Kubernetes API answer, when this is a Kubernetes API error.
    pub fn kube_status(&self) -> Option<u16> {
        match self {
            Self::PatchEphemeralRunnerSet {
                source: kube::Error::Api(status),
                ..
            }
            | Self::PatchEphemeralRunner {
                source: kube::Error::Api(status),
                ..
            } => Some(status.code),
            _ => None,
        }
    }
}

/// Actions Service failures: the transient ones clear by themselves; a dropped session or expired queue token
/// clears with a new session; authentication, permission and a missing scale set need a person.
fn actions_severity(e: &actions_client::Error) -> Severity {
    use actions_client::Error as E;
    let kind = match e {
        E::Request(request) => request.kind,
        // The configuration itself is unusable: no retry can help.
        E::ParseConfigUrl { .. }
        | E::ValidateCredentials(_)
        | E::LoadAppPrivateKey(_)
        | E::SignAppJwt(_)
        | E::LoadRootCa { .. }
        | E::ConfigureProxy { .. }
        | E::BuildHttpClient(_) => return Severity::Unrecoverable,
        // Something the service sent cannot be used (an admin token without expiry, a malformed queue URL):
        // worth retrying slowly, the service may answer differently later.
        _ => return Severity::Fatal,
    };
    if kind.is_retryable() {
        return Severity::Transient;
    }
    match kind {
        ErrorKind::MessageQueueTokenExpired
        | ErrorKind::SessionNotFound
        | ErrorKind::InvalidResponse => Severity::Transient,
        _ => Severity::Fatal,
    }
}

/// Kubernetes failures: server errors, throttling and connection problems are transient; everything the API
/// server rejected on purpose (403 RBAC, 404 object gone, 422 invalid) needs a person or the controller.
fn kube_severity(e: &kube::Error) -> Severity {
    match e {
        kube::Error::Api(status) if status.code == 429 || status.code >= 500 => Severity::Transient,
        kube::Error::Api(_) => Severity::Fatal,
        _ => Severity::Transient,
    }
}

#[cfg(test)]
mod tests {
    use actions_client::{Operation, RequestError};
    use http::{Method, StatusCode};

    use super::*;

    fn actions(kind: ErrorKind, status: Option<u16>) -> actions_client::Error {
        actions_client::Error::from(RequestError {
            operation: Operation::GetMessage,
            kind,
            method: Method::GET,
            url: "http://fake/queue".into(),
            status: status.map(|s| StatusCode::from_u16(s).expect("status")),
            exception: None,
            body: None,
            activity_id: None,
            github_request_id: None,
            attempts: 1,
            detail: None,
            source: None,
        })
    }

    fn kube_api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("x", "y")
                .with_code(code)
                .boxed(),
        )
    }

    fn patch_set(code: u16) -> Error {
        Error::PatchEphemeralRunnerSet {
            namespace: "ns".into(),
            name: "n".into(),
            source: kube_api(code),
        }
    }

    #[test]
    fn categories() {
        let category_of = |error: &Error| error.category().as_str();
        let actions_kind = |kind| actions(kind, None);
        let session = |kind| Error::CreateSession(actions(kind, None));
        assert_eq!(
            category_of(&session(ErrorKind::SessionConflict)),
            "SessionConflict"
        );
        assert_eq!(
            category_of(&session(ErrorKind::Unauthorized)),
            "CredentialsRejected"
        );
        assert_eq!(
            category_of(&session(ErrorKind::Forbidden)),
            "PermissionDenied"
        );
        assert_eq!(
            category_of(&session(ErrorKind::ScaleSetNotFound)),
            "ScaleSetNotFound"
        );
        for kind in [
            ErrorKind::Connect,
            ErrorKind::ServerError,
            ErrorKind::Timeout,
            ErrorKind::Transport,
        ] {
            assert_eq!(
                category_of(&Error::GetMessage(actions(kind, None))),
                "ServiceUnreachable"
            );
        }
        assert_eq!(
            category_of(&Error::GetMessage(actions_kind(ErrorKind::SessionNotFound))),
            "SessionLost"
        );
        assert_eq!(
            category_of(&session(ErrorKind::TlsCertificate)),
            "TlsCertificateRejected"
        );
        assert_eq!(category_of(&Error::InvalidSession("x")), "ServiceError");
        let set = |code| Error::PatchEphemeralRunnerSet {
            namespace: "ns".into(),
            name: "n".into(),
            source: kube_api(code),
        };
        assert_eq!(category_of(&set(404)), "RunnerSetNotFound");
        assert_eq!(category_of(&set(403)), "KubernetesForbidden");
        assert_eq!(category_of(&set(500)), "KubernetesError");
        let runner = Error::PatchEphemeralRunner {
            namespace: "ns".into(),
            name: "n".into(),
            source: kube_api(404),
        };
        assert_eq!(category_of(&runner), "KubernetesError");
    }

    #[test]
    fn classification_table() {
        use ErrorKind as K;
        // (error, severity, needs a new session)
        let cases: Vec<(Error, Severity, bool)> = vec![
            (
                Error::GetMessage(actions(K::ServerError, Some(503))),
                Severity::Transient,
                false,
            ),
            (
                Error::GetMessage(actions(K::Connect, None)),
                Severity::Transient,
                false,
            ),
            (
                Error::GetMessage(actions(K::Transport, None)),
                Severity::Transient,
                false,
            ),
            (
                Error::GetMessage(actions(K::MessageQueueTokenExpired, Some(401))),
                Severity::Transient,
                true,
            ),
            (
                Error::GetMessage(actions(K::SessionNotFound, Some(404))),
                Severity::Transient,
                true,
            ),
            (
                Error::GetMessage(actions(K::Unauthorized, Some(401))),
                Severity::Fatal,
                true,
            ),
            (
                Error::GetMessage(actions(K::UnsupportedMessageType, Some(200))),
                Severity::Fatal,
                true,
            ),
            (
                Error::CreateSession(actions(K::SessionConflict, Some(409))),
                Severity::Transient,
                false,
            ),
            (
                Error::CreateSession(actions(K::Unauthorized, Some(401))),
                Severity::Fatal,
                false,
            ),
            (
                Error::CreateSession(actions(K::Forbidden, Some(403))),
                Severity::Fatal,
                false,
            ),
            (
                Error::CreateSession(actions(K::ScaleSetNotFound, Some(404))),
                Severity::Fatal,
                false,
            ),
            (
                Error::CreateSession(actions(K::TlsCertificate, None)),
                Severity::Fatal,
                false,
            ),
            (
                Error::CreateSession(actions_client::Error::ReadAdminTokenExpiry {
                    reason: "x".into(),
                }),
                Severity::Fatal,
                false,
            ),
            (
                Error::CreateSession(actions_client::Error::LoadRootCa { reason: "x".into() }),
                Severity::Unrecoverable,
                false,
            ),
            (
                Error::DeleteMessage {
                    message_id: 1,
                    source: actions(K::ServerError, Some(500)),
                },
                Severity::Transient,
                false,
            ),
            (
                Error::AcquireJobs {
                    count: 1,
                    source: actions(K::ServerError, Some(500)),
                },
                Severity::Transient,
                true,
            ),
            (Error::InvalidSession("x"), Severity::Fatal, true),
            (patch_set(500), Severity::Transient, false),
            (patch_set(429), Severity::Transient, false),
            (patch_set(404), Severity::Fatal, false),
            (patch_set(403), Severity::Fatal, false),
            (patch_set(422), Severity::Fatal, false),
            (Error::ConfigPathUnset, Severity::Unrecoverable, false),
            (
                Error::BindServer {
                    what: "metrics",
                    addr: ":1".into(),
                    source: std::io::Error::other("in use"),
                },
                Severity::Unrecoverable,
                false,
            ),
        ];
        for (error, severity, new_session) in cases {
            assert_eq!(error.severity(), severity, "{error:?}");
            assert_eq!(error.needs_new_session(), new_session, "{error:?}");
        }
        assert_eq!(patch_set(404).kube_status(), Some(404));
        assert_eq!(patch_set(404).operation(), "patch_ephemeral_runner_set");
    }
}
