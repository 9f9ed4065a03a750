//! The crate's error type: what failed, the request and response it concerned, and what kind of condition it
//! was, so callers can branch on [`ErrorKind`] instead of parsing text
//! (docs/reference/actions-service-protocol.md, "Errors").

use std::fmt;
use std::sync::Arc;

use http::{Method, StatusCode};

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a config URL was rejected (a reason inside [`Error::ParseConfigUrl`], not an error of its own).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigUrlProblem {
    /// The text is not a URL at all.
    NotAUrl(String),
    /// The URL has no host.
    NoHost,
    /// The path has the wrong number of segments.
    NotAScope,
}

impl fmt::Display for ConfigUrlProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotAUrl(reason) => write!(f, "not a URL: {reason}"),
            Self::NoHost => f.write_str("the URL has no host"),
            Self::NotAScope => {
                f.write_str("invalid config URL, should point to an enterprise, org, or repository")
            }
        }
    }
}

/// Why a GitHub App private key was rejected (a reason inside [`Error::LoadAppPrivateKey`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyProblem {
    /// No `-----BEGIN ...-----` block was found.
    NotPem,
    /// The PEM block's base64 body does not decode.
    BadBase64,
    /// The key is password-protected.
    Encrypted,
    /// The PEM holds a public key or a certificate.
    NotAPrivateKey(String),
    /// The key is a private key of another algorithm.
    NotRsa(&'static str),
    /// A PEM label no parser understands, e.g. `OPENSSH PRIVATE KEY`.
    UnsupportedLabel(String),
    /// The key decoded but signing with it failed (a damaged key).
    Malformed(String),
}

impl fmt::Display for KeyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotPem => {
                f.write_str("no PEM block found; expected a PEM-encoded RSA private key")
            }
            Self::BadBase64 => f.write_str("the PEM block's body is not valid base64"),
            Self::Encrypted => {
                f.write_str("the key is encrypted; an unencrypted RSA private key is required")
            }
            Self::NotAPrivateKey(what) => write!(f, "the PEM block is a {what}, not a private key"),
            Self::NotRsa(algorithm) => {
                write!(f, "the key is a {algorithm} key; GitHub App keys are RSA")
            }
            Self::UnsupportedLabel(label) => write!(
                f,
                "unsupported PEM label {label:?}; expected RSA PRIVATE KEY (PKCS#1) or PRIVATE KEY (PKCS#8)"
            ),
            Self::Malformed(reason) => write!(f, "the RSA key is malformed: {reason}"),
        }
    }
}

/// The operation a request was made for. Its [`Operation::as_str`] form is a bounded metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// GitHub: create an App installation access token.
    CreateInstallationToken,
    /// GitHub: create a runner registration token.
    CreateRegistrationToken,
    /// GitHub: runner-registration, discovering the Actions Service and its admin token.
    RegisterRunnerAdmin,
    /// GitHub: list the jobs (every attempt) of a workflow run.
    ListWorkflowRunJobs,
    /// GitHub: re-run one job of a workflow run.
    RerunWorkflowJob,
    /// Actions Service: get a scale set by name.
    GetRunnerScaleSet,
    /// Actions Service: get a scale set by id.
    GetRunnerScaleSetById,
    /// Actions Service: create a scale set.
    CreateRunnerScaleSet,
    /// Actions Service: update a scale set.
    UpdateRunnerScaleSet,
    /// Actions Service: delete a scale set.
    DeleteRunnerScaleSet,
    /// Actions Service: get a runner group by name.
    GetRunnerGroupByName,
    /// Actions Service: generate a JIT config (registers a runner).
    GenerateJitRunnerConfig,
    /// Actions Service: get a runner by id.
    GetRunner,
    /// Actions Service: get a runner by name.
    GetRunnerByName,
    /// Actions Service: remove (deregister) a runner.
    RemoveRunner,
    /// Actions Service: create a message session.
    CreateMessageSession,
    /// Actions Service: refresh a message session.
    RefreshMessageSession,
    /// Actions Service: delete a message session.
    DeleteMessageSession,
    /// Message queue: get a message (long poll).
    GetMessage,
    /// Message queue: acknowledge (delete) a message.
    DeleteMessage,
    /// Actions Service, with the message-queue token: acquire jobs.
    AcquireJobs,
    /// Actions Service: jobs the scale set may acquire (ARC's older client only).
    GetAcquirableJobs,
}

impl Operation {
    /// A stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CreateInstallationToken => "create_installation_token",
            Self::CreateRegistrationToken => "create_registration_token",
            Self::RegisterRunnerAdmin => "register_runner_admin",
            Self::ListWorkflowRunJobs => "list_workflow_run_jobs",
            Self::RerunWorkflowJob => "rerun_workflow_job",
            Self::GetRunnerScaleSet => "get_runner_scale_set",
            Self::GetRunnerScaleSetById => "get_runner_scale_set_by_id",
            Self::CreateRunnerScaleSet => "create_runner_scale_set",
            Self::UpdateRunnerScaleSet => "update_runner_scale_set",
            Self::DeleteRunnerScaleSet => "delete_runner_scale_set",
            Self::GetRunnerGroupByName => "get_runner_group_by_name",
            Self::GenerateJitRunnerConfig => "generate_jit_runner_config",
            Self::GetRunner => "get_runner",
            Self::GetRunnerByName => "get_runner_by_name",
            Self::RemoveRunner => "remove_runner",
            Self::CreateMessageSession => "create_message_session",
            Self::RefreshMessageSession => "refresh_message_session",
            Self::DeleteMessageSession => "delete_message_session",
            Self::GetMessage => "get_message",
            Self::DeleteMessage => "delete_message",
            Self::AcquireJobs => "acquire_jobs",
            Self::GetAcquirableJobs => "get_acquirable_jobs",
        }
    }

    /// Whether this call goes to the message queue or uses its token (then a 401 means the queue token expired).
    pub fn uses_message_queue_token(self) -> bool {
        matches!(
            self,
            Self::GetMessage | Self::DeleteMessage | Self::AcquireJobs
        )
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of condition a failed request represents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// `AgentExistsException`: a runner with that name is already registered (JIT config, 409).
    RunnerExists,
    /// `AgentNotFoundException`, or 404 when reading a runner.
    RunnerNotFound,
    /// `JobStillRunningException`: the runner cannot be removed while it runs a job (400).
    JobStillRunning,
    /// 401 from the message queue or acquire-jobs: refresh the session and retry once.
    MessageQueueTokenExpired,
    /// 409 on session creation: the scale set already has an active session.
    SessionConflict,
    /// 404 on session refresh or deletion: the service dropped the session.
    SessionNotFound,
    /// 404 on a scale-set endpoint, or a `RunnerScaleSetNotFoundException`.
    ScaleSetNotFound,
    /// 409 on scale-set create or rename: the name is taken in that runner group.
    ScaleSetExists,
    /// A runner group lookup found no group of that name, or a scale set named an unknown group.
    RunnerGroupNotFound,
    /// A lookup by name matched more than one object.
    AmbiguousName,
    /// A message whose `messageType` is not `RunnerScaleSetJobMessages`.
    UnsupportedMessageType,
    /// 401 outside the message queue (bad credentials, expired admin token).
    Unauthorized,
    /// 403.
    Forbidden,
    /// 429.
    RateLimited,
    /// 5xx.
    ServerError,
    /// Any other unexpected status.
    UnexpectedStatus,
    /// The status was expected but the body could not be decoded or lacked a required field.
    InvalidResponse,
    /// The connection could not be established (refused, DNS, TLS handshake other than certificates).
    Connect,
    /// The server's certificate was not trusted; never retried, a configuration problem.
    TlsCertificate,
    /// One attempt exceeded its timeout.
    Timeout,
    /// The whole call (all attempts and waits) exceeded its deadline.
    DeadlineExceeded,
    /// Another transport failure (connection reset, protocol error).
    Transport,
    /// The request could not be sent at all (invalid header, unsupported scheme, redirect loop).
    Unsendable,
}

impl ErrorKind {
    /// Whether trying the same call again later may succeed without anything else changing.
    ///
    /// A session conflict counts as retryable: it clears once the service expires the previous session.
    /// [`ErrorKind::MessageQueueTokenExpired`] does not: the session must be refreshed first.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::RateLimited
                | Self::ServerError
                | Self::Connect
                | Self::Timeout
                | Self::DeadlineExceeded
                | Self::Transport
                | Self::SessionConflict
        )
    }

    fn describe(self) -> &'static str {
        match self {
            Self::RunnerExists => "runner exists",
            Self::RunnerNotFound => "runner not found",
            Self::JobStillRunning => "job still running",
            Self::MessageQueueTokenExpired => "message queue token expired",
            Self::SessionConflict => "session conflict",
            Self::SessionNotFound => "message session not found",
            Self::ScaleSetNotFound => "runner scale set not found",
            Self::ScaleSetExists => "runner scale set already exists",
            Self::RunnerGroupNotFound => "runner group not found",
            Self::AmbiguousName => "more than one object has that name",
            Self::UnsupportedMessageType => "unsupported message type",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::RateLimited => "rate limited",
            Self::ServerError => "server error",
            Self::UnexpectedStatus => "unexpected status code",
            Self::InvalidResponse => "invalid response",
            Self::Connect => "connection failed",
            Self::TlsCertificate => "TLS certificate not trusted",
            Self::Timeout => "timed out",
            Self::DeadlineExceeded => "deadline exceeded",
            Self::Transport => "transport error",
            Self::Unsendable => "request could not be sent",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// The exception object the Actions Service sends in error bodies.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Deserialize)]
pub struct ServiceException {
    /// Fully qualified .NET type name, e.g. `GitHub.DistributedTask.WebApi.AgentExistsException, ...`.
    #[serde(rename = "typeName", default)]
    pub type_name: String,
    /// Human-readable text (GitHub REST errors use the same key).
    #[serde(default)]
    pub message: String,
}

/// A failed request: everything known about it for diagnostics.
#[derive(Debug, Clone)]
pub struct RequestError {
    /// What the request was for.
    pub operation: Operation,
    /// What kind of failure this is.
    pub kind: ErrorKind,
    /// HTTP method.
    pub method: Method,
    /// Request URL. URLs carry no credentials in this protocol.
    pub url: String,
    /// Response status, when a response arrived.
    pub status: Option<StatusCode>,
    /// The decoded service exception, when the body was one.
    pub exception: Option<ServiceException>,
    /// The raw body (truncated) when it was plain text or not a decodable exception.
    pub body: Option<String>,
    /// The Actions Service `ActivityId` response header.
    pub activity_id: Option<String>,
    /// The GitHub REST `X-GitHub-Request-Id` response header.
    pub github_request_id: Option<String>,
    /// How many attempts were made (more than one when the transport retried).
    pub attempts: u32,
    /// Extra detail that is not an error value (e.g. "missing token", "count was 3").
    pub detail: Option<String>,
    /// The underlying transport or decoding error.
    pub source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: request {} {} failed",
            self.operation, self.method, self.url
        )?;
        if let Some(status) = self.status {
            write!(f, "(status=\"{status}\"")?;
            if let Some(id) = &self.activity_id {
                write!(f, ", activity_id=\"{id}\"")?;
            }
            if let Some(id) = &self.github_request_id {
                write!(f, ", github_request_id=\"{id}\"")?;
            }
            f.write_str(")")?;
        }
        if self.attempts > 1 {
            write!(f, " after {} attempts", self.attempts)?;
        }
        write!(f, ": {}", self.kind)?;
        if let Some(detail) = &self.detail {
            write!(f, ": {detail}")?;
        }
        if let Some(exception) = &self.exception {
            if !exception.type_name.is_empty() {
                write!(f, ": {}", exception.type_name)?;
            }
            if !exception.message.is_empty() {
                write!(f, ": {}", exception.message)?;
            }
        } else if let Some(body) = &self.body {
            write!(f, ": {body}")?;
        } else if self.status.is_some() && self.source.is_none() && self.detail.is_none() {
            f.write_str(": unknown error")?;
        }
        Ok(())
    }
}

impl std::error::Error for RequestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Every error this crate returns.
///
/// Variants name the step that failed. Sources are reference-counted so the error is `Clone`: one failed admin
/// token refresh is handed to every caller that was waiting for it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The config URL does not name a repository, organization or enterprise.
    #[error("parsing the GitHub config URL {url:?} failed: {problem}")]
    ParseConfigUrl {
        /// The rejected input.
        url: String,
        /// Why it was rejected.
        problem: ConfigUrlProblem,
    },
    /// The credentials are incomplete.
    #[error("validating the GitHub credentials failed: {0}")]
    ValidateCredentials(&'static str),
    /// The GitHub App private key is unusable.
    #[error("loading the GitHub App private key failed: {0}")]
    LoadAppPrivateKey(KeyProblem),
    /// Signing the App JWT failed.
    #[error("signing the GitHub App JWT failed")]
    SignAppJwt(#[source] Arc<jsonwebtoken::errors::Error>),
    /// The custom root CA bundle is unusable.
    #[error("loading the root CA bundle failed: {reason}")]
    LoadRootCa {
        /// What was wrong with it.
        reason: String,
    },
    /// A proxy setting is unusable.
    #[error("configuring the proxy {url:?} failed: {reason}")]
    ConfigureProxy {
        /// The proxy URL with any password removed.
        url: String,
        /// What was wrong with it.
        reason: String,
    },
    /// The HTTP client could not be built (TLS backend, resolver).
    #[error("building the HTTP client failed")]
    BuildHttpClient(#[source] Arc<reqwest::Error>),
    /// The request was rejected before anything was sent.
    #[error("{operation} was not sent: {reason}")]
    InvalidRequest {
        /// The operation.
        operation: Operation,
        /// Why.
        reason: String,
    },
    /// The admin token from runner-registration is not a JWT with an `exp` claim.
    #[error("reading the admin token expiry failed: {reason}")]
    ReadAdminTokenExpiry {
        /// What was wrong with the token (never the token itself).
        reason: String,
    },
    /// An HTTP request failed or its response was unusable.
    #[error(transparent)]
    Request(Box<RequestError>),
}

impl Error {
    /// The request details, when this error came from an HTTP exchange.
    pub fn request(&self) -> Option<&RequestError> {
        match self {
            Self::Request(r) => Some(r),
            _ => None,
        }
    }

    /// The kind of request failure, if this error came from an HTTP exchange.
    pub fn kind(&self) -> Option<ErrorKind> {
        self.request().map(|r| r.kind)
    }

    /// Whether the error is of the given kind.
    pub fn is(&self, kind: ErrorKind) -> bool {
        self.kind() == Some(kind)
    }

    /// The HTTP status of the failed response, if one arrived.
    pub fn status(&self) -> Option<StatusCode> {
        self.request().and_then(|r| r.status)
    }

    /// The Actions Service `ActivityId` of the failed response.
    pub fn activity_id(&self) -> Option<&str> {
        self.request().and_then(|r| r.activity_id.as_deref())
    }

    /// The GitHub `X-GitHub-Request-Id` of the failed response.
    pub fn github_request_id(&self) -> Option<&str> {
        self.request().and_then(|r| r.github_request_id.as_deref())
    }

    /// The service exception carried by the failed response.
    pub fn exception(&self) -> Option<&ServiceException> {
        self.request().and_then(|r| r.exception.as_ref())
    }

    /// Whether the same call may succeed later without a configuration change (see [`ErrorKind::is_retryable`]).
    /// Configuration errors (bad URL, key, CA, proxy) are never retryable.
    pub fn is_retryable(&self) -> bool {
        self.kind().is_some_and(ErrorKind::is_retryable)
    }
}

impl From<RequestError> for Error {
    fn from(value: RequestError) -> Self {
        Self::Request(Box::new(value))
    }
}

/// Which kind a non-success response is, from the operation, the status and the exception type
/// (docs/reference/actions-service-protocol.md, "Error kinds").
/// Exception names are matched as substrings because the service sends fully qualified .NET names.
pub fn classify_response(
    operation: Operation,
    status: StatusCode,
    type_name: Option<&str>,
) -> ErrorKind {
    if let Some(name) = type_name {
        let by_name = [
            ("AgentExistsException", ErrorKind::RunnerExists),
            ("AgentNotFoundException", ErrorKind::RunnerNotFound),
            ("JobStillRunningException", ErrorKind::JobStillRunning),
            ("SessionConflictException", ErrorKind::SessionConflict),
            (
                "RunnerScaleSetNotFoundException",
                ErrorKind::ScaleSetNotFound,
            ),
            (
                "RunnerScaleSetSessionExpiredException",
                ErrorKind::SessionNotFound,
            ),
            (
                "RunnerGroupNotFoundException",
                ErrorKind::RunnerGroupNotFound,
            ),
        ];
        if let Some((_, kind)) = by_name.iter().find(|(needle, _)| name.contains(needle)) {
            return *kind;
        }
    }
    use Operation as Op;
    match (status.as_u16(), operation) {
        (401, op) if op.uses_message_queue_token() => ErrorKind::MessageQueueTokenExpired,
        (409, Op::CreateMessageSession) => ErrorKind::SessionConflict,
        (409, Op::GenerateJitRunnerConfig) => ErrorKind::RunnerExists,
        (409, Op::CreateRunnerScaleSet | Op::UpdateRunnerScaleSet) => ErrorKind::ScaleSetExists,
        (404, Op::RefreshMessageSession | Op::DeleteMessageSession) => ErrorKind::SessionNotFound,
        (404, Op::GetRunner | Op::RemoveRunner) => ErrorKind::RunnerNotFound,
        (
            404,
            Op::GetRunnerScaleSetById
            | Op::UpdateRunnerScaleSet
            | Op::DeleteRunnerScaleSet
            | Op::GenerateJitRunnerConfig
            | Op::CreateMessageSession
            | Op::GetAcquirableJobs,
        ) => ErrorKind::ScaleSetNotFound,
        (401, _) => ErrorKind::Unauthorized,
        (403, _) => ErrorKind::Forbidden,
        (429, _) => ErrorKind::RateLimited,
        // 501 Not Implemented will not change on a retry; the transport does not retry it either.
        (501, _) => ErrorKind::UnexpectedStatus,
        (500..=599, _) => ErrorKind::ServerError,
        _ => ErrorKind::UnexpectedStatus,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_table() {
        use ErrorKind as K;
        use Operation as Op;
        let s = |c: u16| StatusCode::from_u16(c).expect("valid status");
        let exists =
            "GitHub.DistributedTask.WebApi.AgentExistsException, GitHub.DistributedTask.WebApi";
        let conflict = "GitHub.Actions.Runtime.WebApi.RunnerScaleSetSessionConflictException, GitHub.Actions.Runtime.WebApi";
        let cases: &[(Op, u16, Option<&str>, K)] = &[
            (
                Op::GenerateJitRunnerConfig,
                409,
                Some(exists),
                K::RunnerExists,
            ),
            // Classification by exception name ignores the status, as the reference client does.
            (
                Op::GenerateJitRunnerConfig,
                400,
                Some(exists),
                K::RunnerExists,
            ),
            (
                Op::GetRunner,
                404,
                Some("X.AgentNotFoundException"),
                K::RunnerNotFound,
            ),
            (
                Op::RemoveRunner,
                400,
                Some("X.JobStillRunningException, Y"),
                K::JobStillRunning,
            ),
            (
                Op::CreateMessageSession,
                409,
                Some(conflict),
                K::SessionConflict,
            ),
            (Op::CreateMessageSession, 409, None, K::SessionConflict),
            (Op::GetMessage, 401, None, K::MessageQueueTokenExpired),
            (
                Op::DeleteMessage,
                401,
                Some("Whatever"),
                K::MessageQueueTokenExpired,
            ),
            (Op::AcquireJobs, 401, None, K::MessageQueueTokenExpired),
            (Op::GetRunnerScaleSet, 401, None, K::Unauthorized),
            (Op::CreateRegistrationToken, 403, None, K::Forbidden),
            (
                Op::RefreshMessageSession,
                404,
                Some("X.RunnerAdminException"),
                K::SessionNotFound,
            ),
            (Op::GetRunnerScaleSetById, 404, None, K::ScaleSetNotFound),
            (Op::DeleteRunnerScaleSet, 404, None, K::ScaleSetNotFound),
            (
                Op::GetRunnerScaleSet,
                400,
                Some("RunnerScaleSetNotFoundException"),
                K::ScaleSetNotFound,
            ),
            (Op::GetRunnerScaleSet, 429, None, K::RateLimited),
            (
                Op::CreateRunnerScaleSet,
                409,
                Some("X.RunnerScaleSetExistsException"),
                K::ScaleSetExists,
            ),
            (
                Op::CreateRunnerScaleSet,
                404,
                Some("X.RunnerGroupNotFoundException, Y"),
                K::RunnerGroupNotFound,
            ),
            (
                Op::DeleteMessageSession,
                400,
                Some("X.RunnerScaleSetSessionExpiredException"),
                K::SessionNotFound,
            ),
            (Op::GetRunnerScaleSet, 503, None, K::ServerError),
            (Op::GetRunnerScaleSet, 501, None, K::UnexpectedStatus),
            (
                Op::DeleteRunnerScaleSet,
                400,
                Some("Other"),
                K::UnexpectedStatus,
            ),
        ];
        for (op, status, type_name, kind) in cases {
            assert_eq!(
                classify_response(*op, s(*status), *type_name),
                *kind,
                "{op} {status} {type_name:?}"
            );
        }
    }

    #[test]
    fn retryable_kinds() {
        assert!(ErrorKind::ServerError.is_retryable());
        assert!(ErrorKind::RateLimited.is_retryable());
        assert!(ErrorKind::Connect.is_retryable());
        assert!(ErrorKind::SessionConflict.is_retryable());
        assert!(!ErrorKind::TlsCertificate.is_retryable());
        assert!(!ErrorKind::Unauthorized.is_retryable());
        assert!(!ErrorKind::MessageQueueTokenExpired.is_retryable());
        assert!(!ErrorKind::RunnerExists.is_retryable());
        let config_error = Error::ValidateCredentials("empty PAT");
        assert!(!config_error.is_retryable());
        assert_eq!(config_error.kind(), None);
    }

    #[test]
    fn display_carries_request_metadata() {
        let err = Error::from(RequestError {
            operation: Operation::RemoveRunner,
            kind: ErrorKind::JobStillRunning,
            method: Method::DELETE,
            url: "https://svc/_apis/distributedtask/pools/0/agents/7".into(),
            status: Some(StatusCode::BAD_REQUEST),
            exception: Some(ServiceException {
                type_name: "X.JobStillRunningException".into(),
                message: "busy".into(),
            }),
            body: None,
            activity_id: Some("act-1".into()),
            github_request_id: None,
            attempts: 1,
            detail: None,
            source: None,
        });
        let text = err.to_string();
        assert_eq!(
            text,
            "remove_runner: request DELETE https://svc/_apis/distributedtask/pools/0/agents/7 \
             failed(status=\"400 Bad Request\", activity_id=\"act-1\"): job still running: \
             X.JobStillRunningException: busy"
        );
        assert_eq!(err.activity_id(), Some("act-1"));
        assert_eq!(err.status(), Some(StatusCode::BAD_REQUEST));
        assert!(err.is(ErrorKind::JobStillRunning));
    }
}
