//! The two endpoints and the handle tests drive the fake with.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Path, Query, State as AxumState};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::state::{Registration, State, TokenRequest, VaultRequest};
use crate::{API_VERSION, Error};

const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// Clock skew Entra ID tolerates on `nbf`/`exp`.
const LEEWAY_SECS: u64 = 300;

type Shared = Arc<Mutex<State>>;

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running fake; stops when dropped.
pub struct FakeAzure {
    addr: SocketAddr,
    ca_pem: String,
    shared: Shared,
    task: JoinHandle<()>,
}

impl Drop for FakeAzure {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeAzure {
    /// Serves on 127.0.0.1 (a free port) with the given app registrations.
    pub async fn start(registrations: Vec<Registration>) -> Result<Self, Error> {
        let (ca_pem, acceptor) = crate::tls::generate()?;
        let tcp = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(Error::Bind)?;
        let listener = crate::tls::TlsListener::new(tcp, acceptor).map_err(Error::Bind)?;
        let addr = axum::serve::Listener::local_addr(&listener).map_err(Error::Bind)?;
        let shared: Shared = Arc::new(Mutex::new(State {
            registrations,
            ..State::default()
        }));
        let app = Router::new()
            .route("/{tenant}/oauth2/v2.0/token", post(token))
            .route("/secrets/{name}", get(secret))
            .with_state(Arc::clone(&shared));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            addr,
            ca_pem,
            shared,
            task,
        })
    }

    /// The socket address (for a proxy to tunnel to).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The CA that signed the serving certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The authority host for clients: `https://127.0.0.1:<port>/`.
    pub fn authority_host(&self) -> String {
        format!("https://{}/", self.addr)
    }

    /// The vault URL for clients: `https://127.0.0.1:<port>`.
    pub fn vault_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Stores a new version of secret `name` (created if absent).
    pub fn set_secret(&self, name: &str, value: &str) {
        lock(&self.shared)
            .secrets
            .entry(name.to_owned())
            .or_default()
            .push(value.to_owned());
    }

    /// Deletes secret `name`.
    pub fn delete_secret(&self, name: &str) {
        lock(&self.shared).secrets.remove(name);
    }

    /// Answers 403 for secret `name` from now on (no read permission).
    pub fn deny_secret(&self, name: &str) {
        lock(&self.shared).denied.insert(name.to_owned());
    }

    /// Lifetime (`expires_in`) of tokens issued from now on.
    pub fn set_token_lifetime(&self, lifetime: Duration) {
        lock(&self.shared).token_lifetime = lifetime;
    }

    /// Serves as a vault of another cloud (or a resource a client must refuse): the challenge names `resource`
    /// (`https://vault.azure.cn`), and the token endpoint issues tokens for `<resource>/.default` only.
    pub fn set_vault_resource(&self, resource: &str) {
        lock(&self.shared).vault_resource = resource.to_owned();
    }

    /// Invalidates every issued token (the vault then answers 401 to them).
    pub fn revoke_tokens(&self) {
        lock(&self.shared).tokens.clear();
    }

    /// Token requests seen, in order.
    pub fn token_requests(&self) -> Vec<TokenRequest> {
        lock(&self.shared).token_requests.clone()
    }

    /// Vault requests seen, in order.
    pub fn vault_requests(&self) -> Vec<VaultRequest> {
        lock(&self.shared).vault_requests.clone()
    }
}

fn oauth_error(status: StatusCode, error: &str, code: u64, description: &str) -> Response {
    (
        status,
        axum::Json(json!({
            "error": error,
            "error_description": format!("AADSTS{code}: {description} Trace ID: 00000000-0000-0000-0000-000000000000"),
            "error_codes": [code],
        })),
    )
        .into_response()
}

/// `POST /{tenant}/oauth2/v2.0/token`.
async fn token(
    AxumState(shared): AxumState<Shared>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let form: std::collections::HashMap<String, String> =
        url::form_urlencoded::parse(body.as_bytes())
            .into_owned()
            .collect();
    let field = |name: &str| form.get(name).cloned().unwrap_or_default();
    let client_id = field("client_id");
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let audience = format!("https://{host}/{tenant}/oauth2/v2.0/token");
    let mut state = lock(&shared);
    let mut record = TokenRequest {
        tenant_id: tenant.clone(),
        client_id: client_id.clone(),
        assertion: field("client_assertion"),
        scope: field("scope"),
        header: None,
        claims: None,
        outcome: Err(String::new()),
    };
    let verdict = check_token_request(&mut state, &tenant, &form, &audience, &mut record);
    let response = match verdict {
        Ok(()) => {
            let token = random_token();
            let lifetime = state.token_lifetime;
            state
                .tokens
                .insert(token.clone(), Instant::now() + lifetime);
            record.outcome = Ok(state.issued);
            state.issued += 1;
            axum::Json(json!({
                "token_type": "Bearer",
                "expires_in": lifetime.as_secs(),
                "ext_expires_in": lifetime.as_secs(),
                "access_token": token,
            }))
            .into_response()
        }
        Err((status, error, code, description)) => {
            record.outcome = Err(format!("AADSTS{code}: {description}"));
            oauth_error(status, error, code, &description)
        }
    };
    state.token_requests.push(record);
    response
}

type Rejection = (StatusCode, &'static str, u64, String);

fn check_token_request(
    state: &mut State,
    tenant: &str,
    form: &std::collections::HashMap<String, String>,
    audience: &str,
    record: &mut TokenRequest,
) -> Result<(), Rejection> {
    let field = |name: &str| form.get(name).map(String::as_str).unwrap_or_default();
    let bad = |error, code, text: String| Err((StatusCode::BAD_REQUEST, error, code, text));
    let unauthorized =
        |code, text: String| Err((StatusCode::UNAUTHORIZED, "invalid_client", code, text));
    if !state.registrations.iter().any(|r| r.tenant_id == tenant) {
        return bad(
            "invalid_request",
            90002,
            format!("Tenant '{tenant}' not found."),
        );
    }
    if field("grant_type") != "client_credentials" {
        return bad(
            "unsupported_grant_type",
            70003,
            "The app requested an unsupported grant type.".into(),
        );
    }
    if field("scope") != format!("{}/.default", state.vault_resource) {
        return bad(
            "invalid_scope",
            70011,
            format!("The provided scope {:?} is not valid.", field("scope")),
        );
    }
    if field("client_assertion_type") != ASSERTION_TYPE {
        return bad(
            "invalid_request",
            900144,
            "The request body must contain client_assertion_type.".into(),
        );
    }
    let client_id = field("client_id");
    let Some(registration) = state
        .registrations
        .iter()
        .find(|r| r.tenant_id == tenant && r.client_id == client_id)
        .cloned()
    else {
        return bad(
            "unauthorized_client",
            700016,
            format!(
                "Application with identifier '{client_id}' was not found in the directory '{tenant}'."
            ),
        );
    };
    let assertion = field("client_assertion");
    let jwt_header = jsonwebtoken::decode_header(assertion).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            "invalid_request",
            50027,
            format!("Invalid JWT token: {e}"),
        )
    })?;
    record.header = serde_json::to_value(&jwt_header).ok();
    record.claims = assertion
        .split('.')
        .nth(1)
        .and_then(|part| URL_SAFE_NO_PAD.decode(part).ok())
        .and_then(|json| serde_json::from_slice(&json).ok());
    if !matches!(jwt_header.alg, Algorithm::PS256 | Algorithm::RS256) {
        return unauthorized(
            5002738,
            format!("Unsupported assertion algorithm {:?}.", jwt_header.alg),
        );
    }
    let thumbprint = URL_SAFE_NO_PAD.encode(aws_lc_rs::digest::digest(
        &aws_lc_rs::digest::SHA256,
        &registration.certificate_der,
    ));
    if jwt_header.x5t_s256.as_deref() != Some(thumbprint.as_str()) {
        return unauthorized(
            700027,
            "The certificate with identifier used to sign the client assertion is not registered on application.".into(),
        );
    }
    let key = DecodingKey::from_rsa_pem(certificate_pem(&registration.certificate_der).as_bytes())
        .map_err(|e| {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                0,
                format!("registered certificate: {e}"),
            )
        })?;
    let mut validation = Validation::new(jwt_header.alg);
    validation.set_audience(&[audience]);
    validation.set_issuer(&[client_id]);
    validation.sub = Some(client_id.to_owned());
    validation.validate_nbf = true;
    validation.leeway = LEEWAY_SECS;
    validation.set_required_spec_claims(&["exp", "nbf", "aud", "iss", "sub"]);
    let claims = jsonwebtoken::decode::<serde_json::Value>(assertion, &key, &validation)
        .map_err(|e| {
            let code = match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => 700024,
                _ => 700027,
            };
            (
                StatusCode::UNAUTHORIZED,
                "invalid_client",
                code,
                format!("Client assertion failed validation: {e:?}."),
            )
        })?
        .claims;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let exp = claims["exp"].as_u64().unwrap_or(0);
    if exp > now + 3600 + LEEWAY_SECS {
        return unauthorized(
            700025,
            "Client assertion lifetime is longer than an hour.".into(),
        );
    }
    let Some(jti) = claims["jti"].as_str().filter(|j| !j.is_empty()) else {
        return unauthorized(700023, "Client assertion has no jti.".into());
    };
    if !state.seen_jti.insert(jti.to_owned()) {
        return unauthorized(
            7000215,
            "Client assertion jti was already used (replay).".into(),
        );
    }
    Ok(())
}

#[derive(serde::Deserialize)]
struct VaultQuery {
    #[serde(rename = "api-version", default)]
    api_version: String,
}

/// `GET /secrets/{name}?api-version=7.4`.
async fn secret(
    AxumState(shared): AxumState<Shared>,
    Path(name): Path<String>,
    Query(query): Query<VaultQuery>,
    headers: HeaderMap,
) -> Response {
    let mut state = lock(&shared);
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .unwrap_or_default();
    let token_valid = state
        .tokens
        .get(token)
        .is_some_and(|expires| Instant::now() < *expires);
    let vault_error = |status: StatusCode, code: &str, message: String| {
        (
            status,
            axum::Json(json!({"error": {"code": code, "message": message}})),
        )
            .into_response()
    };
    let response = if query.api_version != API_VERSION {
        vault_error(
            StatusCode::BAD_REQUEST,
            "BadParameter",
            format!(
                "The api-version {:?} is not supported by this fake.",
                query.api_version
            ),
        )
    } else if !token_valid {
        let mut response = vault_error(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "AKV10000: Request is missing a Bearer or PoP token.".into(),
        );
        let challenge = format!(
            "Bearer authorization=\"https://login.microsoftonline.com/common\", resource=\"{}\"",
            state.vault_resource
        );
        if let Ok(value) = challenge.parse() {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, value);
        }
        response
    } else if state.denied.contains(&name) {
        vault_error(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "The user, group or application does not have secrets get permission on this key vault.".into(),
        )
    } else {
        match state
            .secrets
            .get(&name)
            .and_then(|versions| versions.last().map(|v| (versions.len(), v)))
        {
            Some((version, value)) => axum::Json(json!({
                "value": value,
                "id": format!("https://vault/secrets/{name}/{version:032x}"),
                "attributes": {"enabled": true},
            }))
            .into_response(),
            None => vault_error(
                StatusCode::NOT_FOUND,
                "SecretNotFound",
                format!("A secret with (name/id) {name} was not found in this key vault."),
            ),
        }
    };
    state.vault_requests.push(VaultRequest {
        secret: name,
        token_valid,
        status: response.status().as_u16(),
    });
    response
}

fn certificate_pem(der: &[u8]) -> String {
    let body = STANDARD.encode(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|chunk| std::str::from_utf8(chunk).unwrap_or_default())
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
}

fn random_token() -> String {
    let mut bytes = [0u8; 32];
    let _ = aws_lc_rs::rand::fill(&mut bytes);
    format!("fake-token-{}", URL_SAFE_NO_PAD.encode(bytes))
}
