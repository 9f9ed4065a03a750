//! The crate's error type: one variant per failed operation, each with the reason an operator acts on.
//!
//! No variant carries a secret: not the certificate's key, not a token, not the vault secret's value. Messages
//! from Entra ID and Key Vault are kept (they name the problem and carry trace IDs, never credentials).

use std::path::PathBuf;

use crds::appconfig::CredentialsProblem;

use crate::constants::reasons;

/// Everything that can fail while reading credentials from a vault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A vault setting is unusable before any call is made.
    #[error("check Azure Key Vault setting {field}: {reason}")]
    CheckSettings {
        /// The setting (`url`, `tenantId`, `clientId`, `certificatePath`, secret name, ...).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// The HTTP client could not be built (proxy or root certificate settings).
    #[error("build the Azure Key Vault HTTP client: {reason}")]
    BuildHttpClient {
        /// What failed.
        reason: String,
    },

    /// The certificate file could not be read.
    #[error("read the Azure client certificate {}: {source}", path.display())]
    ReadCertificate {
        /// `certificatePath`.
        path: PathBuf,
        /// The I/O error (not found, permission denied, ...).
        source: std::io::Error,
    },

    /// The certificate file does not hold a certificate and its RSA private key.
    #[error("parse the Azure client certificate {}: {reason}", path.display())]
    ParseCertificate {
        /// `certificatePath`.
        path: PathBuf,
        /// What is missing or wrong (never key material).
        reason: String,
    },

    /// The client assertion could not be signed.
    #[error("sign the Entra ID client assertion with the certificate {}", path.display())]
    SignClientAssertion {
        /// `certificatePath`.
        path: PathBuf,
    },

    /// The token endpoint could not be reached, timed out, or answered with something other than a token or an
    /// OAuth error.
    #[error("request an Entra ID token from {endpoint}: {reason}")]
    RequestToken {
        /// The token endpoint.
        endpoint: String,
        /// What happened.
        reason: String,
    },

    /// Entra ID refused the client credentials (boxed: the details are large and the path is cold).
    #[error("{0}")]
    TokenRejected(Box<TokenRejection>),

    /// The vault could not be reached, timed out, or answered with a server error.
    #[error("read secret {name} from Azure Key Vault {vault}: {reason}")]
    ReadSecret {
        /// The vault URL.
        vault: String,
        /// The secret name.
        name: String,
        /// What happened.
        reason: String,
    },

    /// The vault's authentication challenge was missing or named a resource the client does not ask tokens for.
    #[error("read the authentication challenge of Azure Key Vault {vault}: {reason}")]
    ReadChallenge {
        /// The vault URL.
        vault: String,
        /// What was wrong with the answer (never a token).
        reason: String,
    },

    /// The vault has no (enabled) secret by that name.
    #[error("read secret {name} from Azure Key Vault {vault}: the secret does not exist ({code})")]
    SecretNotFound {
        /// The vault URL.
        vault: String,
        /// The secret name.
        name: String,
        /// Key Vault's error code.
        code: String,
    },

    /// The vault refused the bearer token.
    #[error(
        "read secret {name} from Azure Key Vault {vault}: access denied ({status}); grant client {client_id} permission to get secrets: {detail}"
    )]
    SecretAccessDenied {
        /// The vault URL.
        vault: String,
        /// The secret name.
        name: String,
        /// `clientId`.
        client_id: String,
        /// HTTP status (401 or 403).
        status: u16,
        /// Key Vault's error code and message.
        detail: String,
    },

    /// The secret's value is not a JSON app config.
    #[error("parse secret {name} as GitHub app config JSON: {reason}")]
    ParseAppConfig {
        /// The secret name.
        name: String,
        /// What is wrong (position and kind, never the value).
        reason: String,
    },

    /// A proxy credentials secret's value is not JSON `{"username": "...", "password": "..."}`.
    #[error("parse secret {name} as proxy credentials JSON: {reason}")]
    ParseProxyCredentials {
        /// The secret name.
        name: String,
        /// What is wrong (position and kind, never the value).
        reason: String,
    },

    /// The secret's JSON does not hold exactly one complete credential kind.
    #[error("validate the GitHub app config in secret {name}: {problem}")]
    ValidateAppConfig {
        /// The secret name.
        name: String,
        /// What is missing.
        problem: CredentialsProblem,
    },
}

/// Entra ID's verdict on a token request: which client, its error and codes, and what to check.
#[derive(Debug, thiserror::Error)]
#[error(
    "Entra ID rejected client {client_id} in tenant {tenant_id} ({error}{codes}): {hint}; {description}",
    codes = if codes.is_empty() { String::new() } else { format!(", AADSTS{}", codes.iter().map(u64::to_string).collect::<Vec<_>>().join("/AADSTS")) }
)]
pub struct TokenRejection {
    /// `tenantId`.
    pub tenant_id: String,
    /// `clientId`.
    pub client_id: String,
    /// The OAuth error code (`invalid_client`, `invalid_request`, ...).
    pub error: String,
    /// Entra ID's numeric error codes.
    pub codes: Vec<u64>,
    /// What to check, from the codes.
    pub hint: &'static str,
    /// Entra ID's description.
    pub description: String,
}

impl Error {
    /// The condition reason for this failure (one of [`crate::constants::reasons`]).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::CheckSettings { .. }
            | Self::BuildHttpClient { .. }
            | Self::ReadChallenge { .. } => reasons::CONFIG_INVALID,
            Self::ReadCertificate { .. } => reasons::CERTIFICATE_UNREADABLE,
            Self::ParseCertificate { .. } | Self::SignClientAssertion { .. } => {
                reasons::CERTIFICATE_INVALID
            }
            Self::TokenRejected(_) => reasons::AUTHENTICATION_FAILED,
            Self::RequestToken { .. } | Self::ReadSecret { .. } => reasons::UNREACHABLE,
            Self::SecretAccessDenied { .. } => reasons::ACCESS_DENIED,
            Self::SecretNotFound { .. } => reasons::SECRET_NOT_FOUND,
            Self::ParseAppConfig { .. }
            | Self::ValidateAppConfig { .. }
            | Self::ParseProxyCredentials { .. } => reasons::SECRET_INVALID,
        }
    }

    /// Whether trying again later may succeed without anyone changing anything (network and server trouble).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::RequestToken { .. } | Self::ReadSecret { .. })
    }
}

/// What to check for Entra ID's error codes (AADSTS numbers), so the condition says which setting is wrong.
pub fn rejection_hint(codes: &[u64]) -> &'static str {
    // Codes from Entra ID's published error code list; the first one that is recognised wins.
    for code in codes {
        match code {
            90002 | 900023 | 90023 => return "the tenant does not exist; check tenantId",
            700016 | 900144 => {
                return "no application with this client ID in the tenant; check clientId and tenantId";
            }
            700027 | 7000274 | 7000215 | 700023 | 50012 => {
                return "the certificate is not accepted; upload this certificate to the app registration";
            }
            7000222 | 700024 => {
                return "the certificate or the assertion has expired; renew it or check the clock";
            }
            _ => {}
        }
    }
    "check tenantId, clientId and the certificate registered for the app"
}

/// Convenience alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_name_the_setting_to_check() {
        assert!(rejection_hint(&[90002]).contains("tenantId"));
        assert!(rejection_hint(&[700016]).contains("clientId"));
        assert!(rejection_hint(&[1, 700027]).contains("upload this certificate"));
        assert!(rejection_hint(&[]).contains("tenantId, clientId"));
    }

    #[test]
    fn rejection_message_lists_the_codes() {
        let err = Error::TokenRejected(Box::new(TokenRejection {
            tenant_id: "t".into(),
            client_id: "c".into(),
            error: "invalid_client".into(),
            codes: vec![700016, 1],
            hint: rejection_hint(&[700016]),
            description: "AADSTS700016: Application not found".into(),
        }));
        let text = err.to_string();
        assert!(text.contains("AADSTS700016/AADSTS1"), "{text}");
        assert_eq!(err.reason(), reasons::AUTHENTICATION_FAILED);
    }
}
