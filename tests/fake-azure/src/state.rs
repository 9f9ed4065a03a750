//! What the fake knows (registered apps, issued tokens, secrets) and what it saw.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// An app registration: a client in a tenant with its certificate (DER).
#[derive(Debug, Clone)]
pub struct Registration {
    /// Tenant ID.
    pub tenant_id: String,
    /// Client ID.
    pub client_id: String,
    /// The registered certificate (public part), DER.
    pub certificate_der: Vec<u8>,
}

/// One token request and the verdict.
#[derive(Debug, Clone)]
pub struct TokenRequest {
    /// Tenant from the path.
    pub tenant_id: String,
    /// `client_id` form field.
    pub client_id: String,
    /// The raw client assertion (for log scans: it must appear nowhere).
    pub assertion: String,
    /// `scope` form field.
    pub scope: String,
    /// The assertion's decoded header and claims, when it decoded.
    pub header: Option<serde_json::Value>,
    /// See `header`.
    pub claims: Option<serde_json::Value>,
    /// `Ok` with the issued token's index, or the AADSTS error sent.
    pub outcome: Result<usize, String>,
}

/// One vault request and the answer.
#[derive(Debug, Clone)]
pub struct VaultRequest {
    /// The secret name from the path.
    pub secret: String,
    /// Whether the bearer token was one the fake issued and still valid.
    pub token_valid: bool,
    /// HTTP status sent.
    pub status: u16,
}

#[derive(Debug)]
pub(crate) struct State {
    pub registrations: Vec<Registration>,
    pub token_lifetime: Duration,
    /// Issued tokens and when they expire.
    pub tokens: HashMap<String, Instant>,
    pub issued: usize,
    pub seen_jti: HashSet<String>,
    /// Secret versions, latest last.
    pub secrets: HashMap<String, Vec<String>>,
    pub denied: HashSet<String>,
    pub token_requests: Vec<TokenRequest>,
    pub vault_requests: Vec<VaultRequest>,
    /// The resource the vault's challenge names and the token endpoint issues tokens for (the cloud's Key Vault
    /// resource).
    pub vault_resource: String,
}

impl Default for State {
    fn default() -> Self {
        Self {
            registrations: Vec::new(),
            token_lifetime: Duration::from_secs(3599),
            tokens: HashMap::new(),
            issued: 0,
            seen_jti: HashSet::new(),
            secrets: HashMap::new(),
            denied: HashSet::new(),
            token_requests: Vec::new(),
            vault_requests: Vec::new(),
            vault_resource: crate::PUBLIC_VAULT_RESOURCE.to_owned(),
        }
    }
}
