//! A fake Entra ID token endpoint and a fake Azure Key Vault, served together over real HTTPS (a throw-away CA
//! from rcgen; give [`FakeAzure::ca_pem`] to the client as an extra root).
//!
//! The token endpoint (`POST /{tenant}/oauth2/v2.0/token`) does what Entra ID does with certificate client
//! credentials: it knows registered apps (tenant, client ID, certificate), checks the form, the client
//! assertion's `x5t#S256` thumbprint against the registered certificate, its signature against that
//! certificate's public key, and its claims (`aud` = this endpoint, `iss` = `sub` = client ID, `exp`, `nbf`, a
//! `jti` never seen before), and answers with an opaque token or with an OAuth error carrying the AADSTS code
//! Entra ID uses. The vault (`GET /secrets/{name}?api-version=7.4`) accepts only unexpired tokens it issued and
//! answers like Key Vault: the latest version, 404 `SecretNotFound`, 403 `Forbidden`, 401 with a challenge that
//! names the cloud's Key Vault resource, the only one the token endpoint then issues tokens for.
//!
//! Everything it saw is recorded for assertions. Verification uses jsonwebtoken, independently of the signing
//! code under test.

mod proxy;
mod server;
mod state;
mod tls;

pub use proxy::ConnectProxy;
pub use server::FakeAzure;
pub use state::{Registration, TokenRequest, VaultRequest};

/// The scope the token endpoint accepts by default (Key Vault's in Azure's public cloud).
pub const KEY_VAULT_SCOPE: &str = "https://vault.azure.net/.default";
/// The resource the vault's challenge names by default (Azure's public cloud); another cloud's with
/// [`FakeAzure::set_vault_resource`].
pub const PUBLIC_VAULT_RESOURCE: &str = "https://vault.azure.net";
/// The API version the vault accepts.
pub const API_VERSION: &str = "7.4";
/// Host names the serving certificate covers besides `localhost` and 127.0.0.1; reachable only through
/// [`ConnectProxy`], which tunnels every `CONNECT` to the fake.
pub const LOGIN_HOST: &str = "login.fake-azure.test";
/// See [`LOGIN_HOST`].
pub const VAULT_HOST: &str = "vault.fake-azure.test";

/// What can fail while starting the fake.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The throw-away certificates could not be generated.
    #[error("generate the fake's TLS certificates: {0}")]
    GenerateCertificates(#[source] rcgen::Error),
    /// The TLS server configuration was refused.
    #[error("configure the fake's TLS server: {0}")]
    ConfigureTls(#[source] rustls::Error),
    /// The listening socket could not be opened.
    #[error("bind the fake's listening socket: {0}")]
    Bind(#[source] std::io::Error),
}
