//! The HTTP layer: client construction (timeouts, proxy, TLS roots), the User-Agent, and sending one logical
//! request with retries, a per-attempt timeout and an overall deadline
//! (docs/reference/actions-service-protocol.md, "Transport").

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use backon::Retryable as _;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, USER_AGENT};
use http::{Method, StatusCode};
use jiff::Timestamp;
use serde::Serialize;
use tokio::time::Instant;
use url::Url;

use crate::decode;
use crate::error::{
    Error, ErrorKind, Operation, RequestError, ServiceException, classify_response,
};
use crate::proxy::{self, ProxyConfig};
use crate::retry::{
    self, Idempotency, JitteredBackoffBuilder, RetryPolicy, TransportFailure, should_retry_status,
    should_retry_transport,
};

/// Actions Service diagnostic header.
pub const ACTIVITY_ID: HeaderName = HeaderName::from_static("activityid");
/// GitHub REST diagnostic header.
pub const GITHUB_REQUEST_ID: HeaderName = HeaderName::from_static("x-github-request-id");
/// Header carrying the scale set's maximum runner count on long polls.
pub const MAX_CAPACITY: HeaderName = HeaderName::from_static("x-scalesetmaxcapacity");

/// Longest error-body excerpt kept in an error.
const MAX_BODY_EXCERPT: usize = 1024;

/// Identity of the program using the client, sent as the User-Agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemInfo {
    /// Product name, e.g. `actions-runner-controller`.
    pub system: String,
    /// Product version.
    pub version: String,
    /// Product commit.
    pub commit_sha: String,
    /// Scale set id, 0 until known.
    pub scale_set_id: i64,
    /// Component, e.g. `ghalistener` or `gha-scale-set-controller`.
    pub subsystem: String,
}

impl Default for SystemInfo {
    fn default() -> Self {
        Self {
            system: "actions-runner-controller".to_owned(),
            version: "NA".to_owned(),
            commit_sha: "NA".to_owned(),
            scale_set_id: 0,
            subsystem: String::new(),
        }
    }
}

/// The User-Agent value: a compact JSON object with the keys in the reference order. `build_version` and
/// `build_commit_sha` describe this crate; for a plain release version the commit is the version string itself.
pub fn user_agent(info: &SystemInfo) -> String {
    #[derive(Serialize)]
    struct UserAgent<'a> {
        system: &'a str,
        version: &'a str,
        commit_sha: &'a str,
        scale_set_id: i64,
        subsystem: &'a str,
        build_version: &'a str,
        build_commit_sha: &'a str,
        kind: &'a str,
    }
    let version = env!("CARGO_PKG_VERSION");
    let ua = UserAgent {
        system: &info.system,
        version: &info.version,
        commit_sha: &info.commit_sha,
        scale_set_id: info.scale_set_id,
        subsystem: &info.subsystem,
        build_version: version,
        build_commit_sha: version,
        kind: "scaleset",
    };
    // Serialising plain strings and integers cannot fail.
    serde_json::to_string(&ua).unwrap_or_default()
}

/// The headers every request carries: optional `Content-Type`, optional `Authorization` (marked sensitive so it
/// is never logged by the HTTP stack), and the User-Agent. A value with characters not allowed in a header (e.g. a
/// token with a newline pasted into a Secret) is an error naming the header, never a panic, and never shows the
/// value.
pub fn request_headers(
    operation: Operation,
    content_type: Option<&str>,
    authorization: Option<&str>,
    user_agent: &str,
) -> Result<HeaderMap, Error> {
    let invalid = |what: &str| Error::InvalidRequest {
        operation,
        reason: format!("the {what} contains characters not allowed in an HTTP header"),
    };
    let mut headers = HeaderMap::new();
    if let Some(ct) = content_type {
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_str(ct).map_err(|_| invalid("content type"))?,
        );
    }
    if let Some(auth) = authorization {
        let mut value = HeaderValue::from_str(auth).map_err(|_| invalid("credential"))?;
        value.set_sensitive(true);
        headers.insert(AUTHORIZATION, value);
    }
    headers.insert(
        USER_AGENT,
        HeaderValue::from_str(user_agent).map_err(|_| invalid("user agent"))?,
    );
    Ok(headers)
}

/// Time limits. Every call has a deadline, so no call can hold a worker for longer than `call` (or
/// `long_poll_call` for the long poll), whatever the server does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP connect (and TLS handshake) limit.
    pub connect: Duration,
    /// One attempt of an ordinary call, from sending to the end of the body.
    pub request: Duration,
    /// All attempts and waits of an ordinary call together.
    pub call: Duration,
    /// One long-poll attempt; must exceed the service's ~50 s hold time.
    pub long_poll_request: Duration,
    /// All attempts and waits of a long poll together.
    pub long_poll_call: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            request: Duration::from_secs(30),
            call: Duration::from_secs(120),
            long_poll_request: Duration::from_secs(90),
            long_poll_call: Duration::from_secs(180),
        }
    }
}

/// Which certificate authorities to trust.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TlsRoots {
    /// The system's roots.
    #[default]
    System,
    /// The system's roots plus the PEM certificates given (what the listener and controller do with
    /// `githubServerTLS`).
    SystemAnd(String),
    /// Only the PEM certificates given.
    Only(String),
}

/// Transport settings.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// Time limits.
    pub timeouts: Timeouts,
    /// Retry policy.
    pub retry: RetryPolicy,
    /// Proxy settings.
    pub proxy: ProxyConfig,
    /// Trusted roots.
    pub tls_roots: TlsRoots,
    /// Skip certificate verification entirely (tests against self-signed servers only).
    pub danger_accept_invalid_certs: bool,
}

/// What a reqwest client is built from, with the environment's proxy variables already read. Clients built from
/// equal keys behave the same, so one serves them all.
#[derive(PartialEq, Eq)]
struct ClientKey {
    connect_timeout: Duration,
    proxy: proxy::ProxySettings,
    tls_roots: TlsRoots,
    danger_accept_invalid_certs: bool,
}

/// The reqwest clients in use, by what they were built from. The manager builds one Actions client per scale set
/// and credentials; each reqwest client of its own loaded the system's root certificates again (about 120 KiB a
/// set, docs/benchmarks.md, "Many scale sets") and kept a connection pool of its own to the same hosts. An entry
/// lives as long as some transport holds its client.
static CLIENTS: std::sync::Mutex<Vec<(ClientKey, Weak<reqwest::Client>)>> =
    std::sync::Mutex::new(Vec::new());

/// The reqwest client for `options`: the one already in use for equal settings, or a new one.
pub(crate) fn shared_http_client(options: &HttpOptions) -> Result<Arc<reqwest::Client>, Error> {
    let key = ClientKey {
        connect_timeout: options.timeouts.connect,
        proxy: proxy::resolve(&options.proxy),
        tls_roots: options.tls_roots.clone(),
        danger_accept_invalid_certs: options.danger_accept_invalid_certs,
    };
    let mut clients = CLIENTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    clients.retain(|(_, client)| client.strong_count() > 0);
    if let Some(client) = clients
        .iter()
        .find(|(built_from, _)| *built_from == key)
        .and_then(|(_, client)| client.upgrade())
    {
        return Ok(client);
    }
    let client = Arc::new(build_http_client(&key)?);
    clients.push((key, Arc::downgrade(&client)));
    Ok(client)
}

/// Builds a reqwest client for `key`.
fn build_http_client(key: &ClientKey) -> Result<reqwest::Client, Error> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(key.connect_timeout)
        .tcp_keepalive(Duration::from_secs(30))
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(100)
        // Proxies are always configured explicitly below, so reqwest must not add its own from the environment.
        .no_proxy();
    for proxy in proxy::reqwest_proxies(&key.proxy)? {
        builder = builder.proxy(proxy);
    }
    builder = match &key.tls_roots {
        TlsRoots::System => builder,
        TlsRoots::SystemAnd(pem) => builder.tls_certs_merge(parse_certificates(pem)?),
        TlsRoots::Only(pem) => builder.tls_certs_only(parse_certificates(pem)?),
    };
    if key.danger_accept_invalid_certs {
        builder = builder.tls_danger_accept_invalid_certs(true);
    }
    builder
        .build()
        .map_err(|e| Error::BuildHttpClient(e.into()))
}

fn parse_certificates(pem: &str) -> Result<Vec<reqwest::Certificate>, Error> {
    let certs =
        reqwest::Certificate::from_pem_bundle(pem.as_bytes()).map_err(|e| Error::LoadRootCa {
            reason: format!("the PEM bundle does not parse: {e}"),
        })?;
    if certs.is_empty() {
        return Err(Error::LoadRootCa {
            reason: "the PEM bundle contains no certificate".to_owned(),
        });
    }
    Ok(certs)
}

/// One logical request.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub operation: Operation,
    pub method: Method,
    pub url: Url,
    pub headers: HeaderMap,
    pub body: Option<Vec<u8>>,
    pub idempotency: Idempotency,
    /// Retry 401/403 too (runner-registration only).
    pub retry_auth_failures: bool,
    /// Use the long-poll time limits.
    pub long_poll: bool,
}

impl Request {
    pub(crate) fn new(operation: Operation, method: Method, url: Url) -> Self {
        let idempotency = if method == Method::POST {
            Idempotency::Unsafe
        } else {
            Idempotency::Safe
        };
        Self {
            operation,
            method,
            url,
            headers: HeaderMap::new(),
            body: None,
            idempotency,
            retry_auth_failures: false,
            long_poll: false,
        }
    }
}

/// A complete response: status, headers and the body with its BOM removed.
#[derive(Debug, Clone)]
pub(crate) struct Response {
    pub operation: Operation,
    pub method: Method,
    pub url: String,
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub attempts: u32,
}

impl Response {
    fn header(&self, name: &HeaderName) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    fn base_error(&self, kind: ErrorKind) -> RequestError {
        RequestError {
            operation: self.operation,
            kind,
            method: self.method.clone(),
            url: self.url.clone(),
            status: Some(self.status),
            exception: None,
            body: None,
            activity_id: self.header(&ACTIVITY_ID),
            github_request_id: self.header(&GITHUB_REQUEST_ID),
            attempts: self.attempts,
            detail: None,
            source: None,
        }
    }

    /// Decodes a success body leniently (see `crate::decode`).
    pub(crate) fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        decode::from_slice(&self.body).map_err(|e| {
            let mut err = self.base_error(ErrorKind::InvalidResponse);
            err.body = Some(excerpt(&self.body));
            err.source = Some(std::sync::Arc::new(e));
            err.into()
        })
    }

    /// An error for a response that arrived fine but is unusable (multiple matches, missing field).
    pub(crate) fn invalid(&self, kind: ErrorKind, detail: impl Into<String>) -> Error {
        let mut err = self.base_error(kind);
        err.detail = Some(detail.into());
        err.into()
    }

    /// The error for an unexpected status: the body is read as a service exception
    /// unless it is empty or plain text; the kind comes from the exception name, the status and the operation.
    /// `forced` overrides the kind (and then the raw body is kept, as the reference client does).
    pub(crate) fn status_error(&self, forced: Option<ErrorKind>) -> Error {
        let mut err = self.base_error(ErrorKind::UnexpectedStatus);
        let is_text = self
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.contains("text/plain"));
        if !self.body.iter().all(u8::is_ascii_whitespace) {
            if forced.is_some() || is_text {
                err.body = Some(excerpt(&self.body));
            } else {
                match decode::from_slice::<ServiceException>(&self.body) {
                    Ok(exception) => err.exception = Some(exception),
                    Err(_) => {
                        err.detail = Some("failed to unmarshal error response body".to_owned());
                        err.body = Some(excerpt(&self.body));
                    }
                }
            }
        }
        err.kind = forced.unwrap_or_else(|| {
            classify_response(
                self.operation,
                self.status,
                err.exception.as_ref().map(|e| e.type_name.as_str()),
            )
        });
        err.into()
    }
}

fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(MAX_BODY_EXCERPT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Why one attempt did not produce a final response.
#[derive(Debug)]
enum AttemptFailure {
    /// A response with a retryable status.
    Status(Box<Response>),
    /// No (complete) response.
    Transport(reqwest::Error),
}

/// Whether `err` (or anything in its chain) is a rejected server certificate.
fn is_certificate_error(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return matches!(
                tls,
                rustls::Error::InvalidCertificate(_)
                    | rustls::Error::InvalidCertRevocationList(_)
                    | rustls::Error::NoCertificatesPresented
            );
        }
        // io::Error's `source()` skips the wrapped error itself, so look inside explicitly.
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && is_certificate_error(inner)
        {
            return true;
        }
        current = e.source();
    }
    false
}

/// Classifies a reqwest failure. Connect errors come first: a connect timeout means nothing was sent.
fn transport_failure(err: &reqwest::Error) -> TransportFailure {
    if is_certificate_error(err) {
        TransportFailure::Certificate
    } else if err.is_connect() {
        TransportFailure::Connect
    } else if err.is_timeout() {
        TransportFailure::Timeout
    } else if err.is_builder() || err.is_redirect() {
        TransportFailure::Unsendable
    } else {
        TransportFailure::Interrupted
    }
}

fn failure_kind(failure: TransportFailure) -> ErrorKind {
    match failure {
        TransportFailure::Connect => ErrorKind::Connect,
        TransportFailure::Certificate => ErrorKind::TlsCertificate,
        TransportFailure::Timeout => ErrorKind::Timeout,
        TransportFailure::Interrupted => ErrorKind::Transport,
        TransportFailure::Unsendable => ErrorKind::Unsendable,
    }
}

/// Sends requests with the configured client, retry policy and time limits.
#[derive(Debug, Clone)]
pub(crate) struct Transport {
    /// Shared with every transport built from equal settings ([`shared_http_client`]).
    http: Arc<reqwest::Client>,
    retry: RetryPolicy,
    timeouts: Timeouts,
}

impl Transport {
    pub(crate) fn new(options: &HttpOptions) -> Result<Self, Error> {
        Ok(Self {
            http: shared_http_client(options)?,
            retry: options.retry,
            timeouts: options.timeouts,
        })
    }

    /// Sends `request`, retrying transient failures. A final response is returned whatever its status (when
    /// retries on a transient status run out, the last response is returned, so the caller's error carries its
    /// status and body); transport failures and the deadline become errors here.
    ///
    /// Dropping the returned future cancels the request and any wait.
    pub(crate) async fn send(&self, request: Request) -> Result<Response, Error> {
        let started = Instant::now();
        let (attempt_timeout, deadline) = if request.long_poll {
            (
                self.timeouts.long_poll_request,
                self.timeouts.long_poll_call,
            )
        } else {
            (self.timeouts.request, self.timeouts.call)
        };
        let attempts = AtomicU32::new(0);
        let request = &request;
        let attempt = || async {
            let number = attempts.fetch_add(1, Ordering::Relaxed) + 1;
            self.attempt(request, attempt_timeout, number).await
        };
        let retried = attempt
            .retry(JitteredBackoffBuilder(self.retry))
            .sleep(tokio::time::sleep)
            .when(|failure| match failure {
                AttemptFailure::Status(_) => true,
                AttemptFailure::Transport(e) => should_retry_transport(transport_failure(e), request.idempotency),
            })
            .adjust(|failure, next| {
                let next = next?;
                let wait = match failure {
                    AttemptFailure::Status(r) => retry::retry_after(r.status, &r.headers, Timestamp::now()).unwrap_or(next),
                    AttemptFailure::Transport(_) => next,
                };
                // Waiting past the deadline would only end in a deadline error that hides the real failure.
                (started.elapsed() + wait < deadline).then_some(wait)
            })
            .notify(|failure, wait| match failure {
                AttemptFailure::Status(r) => tracing::debug!(
                    operation = %request.operation, status = %r.status, wait_ms = wait.as_millis(), "retrying request"
                ),
                AttemptFailure::Transport(e) => tracing::debug!(
                    operation = %request.operation, error = %e, wait_ms = wait.as_millis(), "retrying request"
                ),
            });
        let outcome =
            tokio::time::timeout(deadline.saturating_sub(started.elapsed()), retried).await;
        let attempts = attempts.load(Ordering::Relaxed);
        let transport_error =
            |kind: ErrorKind, source: Option<reqwest::Error>, detail: Option<String>| {
                Error::from(RequestError {
                    operation: request.operation,
                    kind,
                    method: request.method.clone(),
                    url: request.url.to_string(),
                    status: None,
                    exception: None,
                    body: None,
                    activity_id: None,
                    github_request_id: None,
                    attempts,
                    detail,
                    source: source.map(|e| std::sync::Arc::new(e) as _),
                })
            };
        match outcome {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(AttemptFailure::Status(response))) => Ok(*response),
            Ok(Err(AttemptFailure::Transport(e))) => {
                let kind = failure_kind(transport_failure(&e));
                Err(transport_error(kind, Some(e), None))
            }
            Err(_) => Err(transport_error(
                ErrorKind::DeadlineExceeded,
                None,
                Some(format!("no response within {deadline:?}")),
            )),
        }
    }

    async fn attempt(
        &self,
        request: &Request,
        timeout: Duration,
        number: u32,
    ) -> Result<Response, AttemptFailure> {
        let mut builder = self
            .http
            .request(request.method.clone(), request.url.clone())
            .headers(request.headers.clone())
            .timeout(timeout);
        match &request.body {
            Some(body) if !body.is_empty() => builder = builder.body(body.clone()),
            // An empty POST/PUT/PATCH carries `Content-Length: 0`, as Go's client sends it; some proxies and
            // servers answer 411 Length Required without it.
            _ if matches!(request.method, Method::POST | Method::PUT | Method::PATCH) => {
                builder = builder.header(http::header::CONTENT_LENGTH, 0);
            }
            _ => {}
        }
        let response = builder.send().await.map_err(AttemptFailure::Transport)?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.map_err(AttemptFailure::Transport)?;
        tracing::debug!(
            operation = %request.operation, method = %request.method, url = %request.url, %status, attempt = number,
            "actions request"
        );
        let response = Response {
            operation: request.operation,
            method: request.method.clone(),
            url: request.url.to_string(),
            status,
            headers,
            body: decode::strip_bom(&body).to_vec(),
            attempts: number,
        };
        if should_retry_status(status, request.retry_auth_failures) {
            Err(AttemptFailure::Status(Box::new(response)))
        } else {
            Ok(response)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_agent_is_compact_json_in_reference_order() {
        let info = SystemInfo {
            system: "dockerscaleset".into(),
            version: "0.1.0".into(),
            commit_sha: "NA".into(),
            scale_set_id: 7,
            subsystem: "dockerscaleset".into(),
        };
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            user_agent(&info),
            format!(
                r#"{{"system":"dockerscaleset","version":"0.1.0","commit_sha":"NA","scale_set_id":7,"subsystem":"dockerscaleset","build_version":"{version}","build_commit_sha":"{version}","kind":"scaleset"}}"#
            )
        );
        assert!(http::HeaderValue::from_str(&user_agent(&SystemInfo::default())).is_ok());
    }

    #[test]
    fn request_headers_table() {
        let op = Operation::GetMessage;
        let headers =
            request_headers(op, Some("application/json"), Some("Bearer abc"), "{}").expect("valid");
        assert_eq!(
            headers.get(CONTENT_TYPE).map(HeaderValue::as_bytes),
            Some(b"application/json".as_slice())
        );
        let auth = headers.get(AUTHORIZATION).expect("authorization");
        assert!(auth.is_sensitive());
        assert_eq!(
            headers.get(USER_AGENT).map(HeaderValue::as_bytes),
            Some(b"{}".as_slice())
        );

        let bare = request_headers(op, None, None, "ua").expect("valid");
        assert_eq!(bare.len(), 1, "only the User-Agent");

        let err =
            request_headers(op, None, Some("Bearer tok\nen-secret"), "ua").expect_err("newline");
        let text = err.to_string();
        assert!(
            text.contains("credential") && !text.contains("en-secret"),
            "{text}"
        );
        assert!(matches!(
            err,
            Error::InvalidRequest {
                operation: Operation::GetMessage,
                ..
            }
        ));
    }

    fn response(status: u16, content_type: Option<&str>, body: &str) -> Response {
        let mut headers = HeaderMap::new();
        if let Some(ct) = content_type {
            headers.insert(CONTENT_TYPE, ct.parse().expect("header"));
        }
        headers.insert(ACTIVITY_ID, "act-9".parse().expect("header"));
        Response {
            operation: Operation::GenerateJitRunnerConfig,
            method: Method::POST,
            url: "http://svc/x".into(),
            status: StatusCode::from_u16(status).expect("status"),
            headers,
            body: body.as_bytes().to_vec(),
            attempts: 1,
        }
    }

    #[test]
    fn status_errors_follow_the_reference_construction() {
        let exists = response(
            409,
            Some("application/json"),
            r#"{"typeName":"GitHub.DistributedTask.WebApi.AgentExistsException, X","message":"Runner 'r' already exists."}"#,
        )
        .status_error(None);
        assert!(exists.is(ErrorKind::RunnerExists));
        assert_eq!(exists.activity_id(), Some("act-9"));
        assert_eq!(
            exists.exception().map(|e| e.message.as_str()),
            Some("Runner 'r' already exists.")
        );

        let empty = response(400, None, "").status_error(None);
        assert!(
            empty
                .to_string()
                .ends_with("unexpected status code: unknown error"),
            "{empty}"
        );

        let text =
            response(400, Some("text/plain; charset=utf-8"), "Session expired").status_error(None);
        assert_eq!(
            text.request().and_then(|r| r.body.as_deref()),
            Some("Session expired")
        );
        assert!(text.exception().is_none());

        let garbage = response(500, Some("text/html"), "<html>oops</html>").status_error(None);
        let rendered = garbage.to_string();
        assert!(
            rendered.contains("failed to unmarshal error response body"),
            "{rendered}"
        );
        assert!(rendered.contains("<html>oops</html>"), "{rendered}");
        assert!(garbage.is(ErrorKind::ServerError));

        let forced = response(401, Some("application/json"), r#"{"message":"x"}"#)
            .status_error(Some(ErrorKind::MessageQueueTokenExpired));
        assert!(forced.is(ErrorKind::MessageQueueTokenExpired));
        assert_eq!(
            forced.request().and_then(|r| r.body.as_deref()),
            Some(r#"{"message":"x"}"#)
        );
    }

    #[test]
    fn excerpts_are_bounded() {
        let long = "é".repeat(5000);
        let cut = excerpt(long.as_bytes());
        assert_eq!(cut.chars().count(), MAX_BODY_EXCERPT + 1);
    }

    #[test]
    fn root_ca_bundle_must_hold_a_certificate() {
        let err = parse_certificates("no certificates here").expect_err("empty");
        assert!(err.to_string().contains("contains no certificate"), "{err}");
        let options = HttpOptions {
            tls_roots: TlsRoots::SystemAnd(String::new()),
            ..Default::default()
        };
        assert!(matches!(
            shared_http_client(&options),
            Err(Error::LoadRootCa { .. })
        ));
    }

    #[test]
    fn equal_settings_share_one_client_while_it_is_in_use() {
        // A connect timeout no other test uses keeps this test's clients apart from theirs.
        let options = HttpOptions {
            timeouts: Timeouts {
                connect: Duration::from_millis(4321),
                ..Timeouts::default()
            },
            proxy: ProxyConfig::Disabled,
            ..HttpOptions::default()
        };
        let first = shared_http_client(&options).expect("built");
        let second = shared_http_client(&options).expect("built");
        assert!(Arc::ptr_eq(&first, &second), "equal settings, one client");

        let other_roots = HttpOptions {
            danger_accept_invalid_certs: true,
            ..options.clone()
        };
        let third = shared_http_client(&other_roots).expect("built");
        assert!(
            !Arc::ptr_eq(&first, &third),
            "other settings, another client"
        );

        // Once no transport holds it, the client is freed and its entry dropped at the next look-up.
        let weak = Arc::downgrade(&first);
        drop((first, second));
        assert!(weak.upgrade().is_none(), "the cache keeps no client alive");
        let _again = shared_http_client(&options).expect("built");
        let entries = CLIENTS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(_, client)| Weak::ptr_eq(client, &weak))
            .count();
        assert_eq!(entries, 0, "the freed client's entry is gone");
    }
}
