//! Helpers shared by the integration tests: tiny scripted HTTP servers, a TLS server, a recording proxy, and
//! client builders with test-friendly timings.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actions_client::{
    ActionsClient, ClientOptions, Credentials, GitHubConfig, HttpOptions, RetryPolicy,
    SecretString, Timeouts,
};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An unsigned admin JWT expiring `secs_from_now` seconds from now (the client never checks signatures).
pub fn admin_jwt(secs_from_now: i64) -> String {
    let exp = jiff::Timestamp::now().as_second() + secs_from_now;
    format!(
        "{}.{}.c2ln",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(format!(r#"{{"exp":{exp}}}"#))
    )
}

/// Fast retries so tests do not sleep for seconds.
pub fn fast_retry(max_retries: u32) -> RetryPolicy {
    RetryPolicy {
        max_retries,
        min_wait: Duration::from_millis(10),
        max_wait: Duration::from_millis(50),
        jitter: true,
    }
}

/// Options with fast retries and short, test-sized timeouts.
pub fn test_options(max_retries: u32) -> ClientOptions {
    ClientOptions {
        http: HttpOptions {
            retry: fast_retry(max_retries),
            timeouts: Timeouts {
                connect: Duration::from_secs(2),
                request: Duration::from_secs(5),
                call: Duration::from_secs(10),
                long_poll_request: Duration::from_secs(10),
                long_poll_call: Duration::from_secs(20),
            },
            ..HttpOptions::default()
        },
        ..ClientOptions::default()
    }
}

/// A PAT client for `config_url` (GHES form, never forced).
pub fn pat_client(config_url: &str, options: ClientOptions) -> ActionsClient {
    let config = GitHubConfig::parse_with(config_url, false).expect("valid config URL");
    ActionsClient::new(
        config,
        &Credentials::Pat(SecretString::new("ghp_test")),
        options,
    )
    .expect("client builds")
}

/// One request as a scripted server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn path(&self) -> &str {
        self.uri.path()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// What a scripted handler answers.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub delay: Duration,
}

impl Reply {
    pub fn json(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.into(),
            delay: Duration::ZERO,
        }
    }

    pub fn empty(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: String::new(),
            delay: Duration::ZERO,
        }
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

type Handler = dyn Fn(&Recorded, usize) -> Option<Reply> + Send + Sync;

struct ServerState {
    base_url: String,
    admin_token: Mutex<String>,
    requests: Mutex<Vec<Recorded>>,
    handler: Box<Handler>,
}

/// A scripted server playing GitHub (GHES paths), the Actions Service (`/tenant/1/`) and anything else the
/// handler answers. The handler sees every request with the number of earlier requests on the same path; when it
/// returns `None`, registration token and runner-registration get a valid default answer and anything else 404.
pub struct MockServer {
    state: Arc<ServerState>,
    pub addr: SocketAddr,
}

impl MockServer {
    pub async fn start(
        handler: impl Fn(&Recorded, usize) -> Option<Reply> + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(ServerState {
            base_url: format!("http://{addr}"),
            admin_token: Mutex::new(admin_jwt(3600)),
            requests: Mutex::new(Vec::new()),
            handler: Box::new(handler),
        });
        let app = axum::Router::new()
            .fallback(serve)
            .with_state(Arc::clone(&state));
        tokio::spawn(async move {
            // The server lives as long as the test's runtime.
            let _ = axum::serve(listener, app).await;
        });
        Self { state, addr }
    }

    pub fn base_url(&self) -> &str {
        &self.state.base_url
    }

    /// Config URL of an organization on this server.
    pub fn org_url(&self) -> String {
        format!("{}/my-org", self.state.base_url)
    }

    pub fn set_admin_token(&self, token: String) {
        *self.state.admin_token.lock().expect("lock") = token;
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().expect("lock").clone()
    }

    /// Requests whose path ends with `suffix`.
    pub fn requests_to(&self, suffix: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.path().ends_with(suffix))
            .collect()
    }
}

async fn serve(
    State(state): State<Arc<ServerState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let recorded = Recorded {
        method,
        uri,
        headers,
        body: body.to_vec(),
    };
    let earlier = {
        let mut requests = state.requests.lock().expect("lock");
        let earlier = requests
            .iter()
            .filter(|r| r.uri.path() == recorded.uri.path())
            .count();
        requests.push(recorded.clone());
        earlier
    };
    let path = recorded.uri.path().to_owned();
    let reply = (state.handler)(&recorded, earlier).unwrap_or_else(|| {
        if path.ends_with("/runners/registration-token") && path.starts_with("/api/v3/") {
            Reply::json(
                201,
                r#"{"token":"registration-token","expires_at":"2030-01-01T00:00:00Z"}"#,
            )
        } else if path == "/api/v3/actions/runner-registration" {
            let token = state.admin_token.lock().expect("lock").clone();
            Reply::json(
                201,
                format!(
                    r#"{{"url":"{}/tenant/1/","token":"{token}"}}"#,
                    state.base_url
                ),
            )
        } else {
            Reply::json(404, r#"{"message":"no route in mock server"}"#)
        }
    });
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut response = (
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        reply.body,
    )
        .into_response();
    for (name, value) in reply.headers {
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(name.as_bytes()),
            axum::http::HeaderValue::from_str(&value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// A certificate authority and a server certificate it signed.
pub struct TestPki {
    pub ca_pem: String,
    pub server_cert_der: Vec<u8>,
    pub server_key_der: Vec<u8>,
}

impl TestPki {
    /// A CA plus a leaf for `names` (DNS names or IP addresses).
    pub fn new(names: &[&str]) -> Self {
        let ca_key = rcgen::KeyPair::generate().expect("ca key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "actions-client test CA");
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("ca cert");
        let leaf_key = rcgen::KeyPair::generate().expect("leaf key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let leaf_params = rcgen::CertificateParams::new(names).expect("leaf params");
        let leaf = leaf_params.signed_by(&leaf_key, &ca).expect("leaf cert");
        Self {
            ca_pem: ca.pem(),
            server_cert_der: leaf.der().to_vec(),
            server_key_der: leaf_key.serialize_der(),
        }
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(self.server_cert_der.clone())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.server_key_der.clone())),
            )
            .expect("server config");
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }
}

/// Reads one HTTP/1.1 request head from `stream` (bodies are not expected by these servers).
async fn read_head<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> Option<String> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.push(byte[0]);
        if buf.len() > 64 * 1024 {
            return None;
        }
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// A TLS server answering every request with 202 and no body (an empty long poll); returns its port and the
/// request heads it saw.
pub async fn start_tls_server(pki: &TestPki) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let acceptor = pki.acceptor();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_in_task = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = Arc::clone(&seen_in_task);
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                while let Some(head) = read_head(&mut tls).await {
                    seen.lock().expect("lock").push(head);
                    let answer = "HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n";
                    if tls.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, seen)
}

/// A recording proxy: a plain `GET http://...` is answered with 202 itself; `CONNECT host:port` is tunnelled to
/// `tunnel_to` (whatever the requested host). Returns its address and the request heads it saw.
pub async fn start_proxy(tunnel_to: Option<SocketAddr>) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_in_task = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let seen = Arc::clone(&seen_in_task);
            tokio::spawn(async move {
                while let Some(head) = read_head(&mut client).await {
                    seen.lock().expect("lock").push(head.clone());
                    if head.starts_with("CONNECT ") {
                        let Some(target) = tunnel_to else { return };
                        let Ok(mut upstream) = TcpStream::connect(target).await else {
                            return;
                        };
                        if client
                            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                            .await
                            .is_err()
                        {
                            return;
                        }
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                        return;
                    }
                    let answer = "HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n";
                    if client.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}
