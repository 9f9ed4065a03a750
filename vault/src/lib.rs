//! GitHub credentials from Azure Key Vault, as a scale set's `vaultConfig` (type `azure_key_vault`) asks for:
//! the secret named by `githubConfigSecret` holds the app config as JSON (docs/reference/controllers.md,
//! "Credentials Secret").
//!
//! * [`certificate`]: the client certificate file and the client assertion signed with it (aws-lc-rs, the
//!   workspace's only crypto backend; the official `azure_identity` certificate credential needs OpenSSL).
//! * [`KeyVaultClient`]: Entra ID client credentials, the token cached until shortly before expiry, the secret
//!   read by name; every call with a deadline, through the configured proxy.
//! * [`Error`]: one variant per failed operation, each with a condition reason ([`Error::reason`]).
//!
//! The manager and the listener both use this crate, so both resolve a vault the same way.

pub mod certificate;
pub mod client;
pub mod constants;
pub mod error;

pub use client::{
    KeyVaultClient, KeyVaultSettings, Options, parse_app_config, parse_proxy_credentials,
    refresh_at,
};
pub use error::{Error, Result, TokenRejection};
