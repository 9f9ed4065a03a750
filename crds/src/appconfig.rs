//! GitHub credentials as stored in a Kubernetes Secret or a vault secret: a personal access token, or a GitHub App
//! (app or client ID, installation ID, private key); docs/reference/controllers.md, "Credentials Secret".

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::ByteString;
use serde::{Deserialize, Serialize};

use crate::Error;

/// Secret key of the personal access token.
pub const GITHUB_TOKEN_KEY: &str = "github_token";
/// Secret key of the GitHub App ID (or client ID).
pub const GITHUB_APP_ID_KEY: &str = "github_app_id";
/// Secret key of the GitHub App installation ID (decimal).
pub const GITHUB_APP_INSTALLATION_ID_KEY: &str = "github_app_installation_id";
/// Secret key of the GitHub App private key (PEM).
pub const GITHUB_APP_PRIVATE_KEY_KEY: &str = "github_app_private_key";

/// The four credential fields, as read. JSON form (vault secrets, listener config): the same keys, with
/// `github_app_installation_id` a number. Use [`AppConfig::validated`] before use.
#[derive(Serialize, Deserialize, Clone, Default, PartialEq, Eq)]
pub struct AppConfig {
    /// GitHub App ID or client ID (used verbatim as the JWT issuer).
    #[serde(default)]
    pub github_app_id: String,
    /// GitHub App installation ID.
    #[serde(default)]
    pub github_app_installation_id: i64,
    /// GitHub App private key, PEM.
    #[serde(default)]
    pub github_app_private_key: String,
    /// Personal access token.
    #[serde(default)]
    pub github_token: String,
}

/// Validated credentials: exactly one kind.
#[derive(Clone, PartialEq, Eq)]
pub enum GitHubCredentials {
    /// A personal access token.
    Token(String),
    /// A GitHub App installation.
    App {
        /// App ID or client ID.
        app_id: String,
        /// Installation ID (> 0).
        installation_id: i64,
        /// Private key, PEM.
        private_key: String,
    },
}

/// Why an [`AppConfig`] is not usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsProblem {
    /// Neither a token nor a complete App configuration.
    #[error(
        "no credentials: set github_token, or github_app_id, github_app_installation_id and github_app_private_key"
    )]
    Missing,
    /// Both a token and a complete App configuration.
    #[error("both github_token and GitHub App credentials are set; use only one kind")]
    Ambiguous,
    /// An App configuration with a missing part.
    #[error(
        "incomplete GitHub App credentials: github_app_id, github_app_installation_id (> 0) and github_app_private_key are all required"
    )]
    IncompleteApp,
}

impl AppConfig {
    /// Reads the four keys from a Secret's `data`. Absent keys are empty; values must be UTF-8 and the
    /// installation ID a decimal integer. Does not validate (see [`AppConfig::validated`]).
    pub fn from_secret_data(data: &BTreeMap<String, ByteString>) -> Result<Self, Error> {
        let text = |key: &'static str| -> Result<String, Error> {
            match data.get(key) {
                None => Ok(String::new()),
                Some(ByteString(bytes)) => {
                    String::from_utf8(bytes.clone()).map_err(|_| Error::ParseSecretCredentials {
                        key,
                        reason: "the value is not UTF-8".to_owned(),
                    })
                }
            }
        };
        let installation_id = text(GITHUB_APP_INSTALLATION_ID_KEY)?;
        let installation_id = if installation_id.is_empty() {
            0
        } else {
            installation_id
                .parse::<i64>()
                .map_err(|err| Error::ParseSecretCredentials {
                    key: GITHUB_APP_INSTALLATION_ID_KEY,
                    reason: format!("{installation_id:?} is not a decimal integer: {err}"),
                })?
        };
        Ok(Self {
            github_app_id: text(GITHUB_APP_ID_KEY)?,
            github_app_installation_id: installation_id,
            github_app_private_key: text(GITHUB_APP_PRIVATE_KEY_KEY)?,
            github_token: text(GITHUB_TOKEN_KEY)?,
        })
    }

    /// Reads the JSON form stored in a vault. Does not validate (see [`AppConfig::validated`]).
    pub fn from_json(json: &str) -> Result<Self, Error> {
        serde_json::from_str(json).map_err(Error::ParseJsonCredentials)
    }

    /// The credentials, if exactly one kind is fully present: a non-empty token, or an App with a non-empty ID,
    /// an installation ID > 0 and a non-empty private key. A token next to a partial App configuration counts as
    /// a token (the App fields are then ignored), as in ARC.
    pub fn credentials(&self) -> Result<GitHubCredentials, Error> {
        let has_token = !self.github_token.is_empty();
        let has_full_app = !self.github_app_id.is_empty()
            && self.github_app_installation_id > 0
            && !self.github_app_private_key.is_empty();
        let problem = match (has_token, has_full_app) {
            (true, false) => return Ok(GitHubCredentials::Token(self.github_token.clone())),
            (false, true) => {
                return Ok(GitHubCredentials::App {
                    app_id: self.github_app_id.clone(),
                    installation_id: self.github_app_installation_id,
                    private_key: self.github_app_private_key.clone(),
                });
            }
            (true, true) => CredentialsProblem::Ambiguous,
            (false, false) => {
                let has_any_app = !self.github_app_id.is_empty()
                    || self.github_app_installation_id != 0
                    || !self.github_app_private_key.is_empty();
                if has_any_app {
                    CredentialsProblem::IncompleteApp
                } else {
                    CredentialsProblem::Missing
                }
            }
        };
        Err(Error::ValidateCredentials(problem))
    }

    /// A copy that keeps only the valid credential kind (the other fields cleared), or why it is invalid.
    pub fn validated(&self) -> Result<Self, Error> {
        Ok(self.credentials()?.into())
    }
}

impl From<GitHubCredentials> for AppConfig {
    fn from(credentials: GitHubCredentials) -> Self {
        match credentials {
            GitHubCredentials::Token(github_token) => Self {
                github_token,
                ..Self::default()
            },
            GitHubCredentials::App {
                app_id,
                installation_id,
                private_key,
            } => Self {
                github_app_id: app_id,
                github_app_installation_id: installation_id,
                github_app_private_key: private_key,
                github_token: String::new(),
            },
        }
    }
}

/// Secrets never appear in logs: Debug shows which fields are set, not their values.
impl fmt::Debug for AppConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppConfig")
            .field("github_app_id", &self.github_app_id)
            .field(
                "github_app_installation_id",
                &self.github_app_installation_id,
            )
            .field(
                "github_app_private_key",
                &redacted(&self.github_app_private_key),
            )
            .field("github_token", &redacted(&self.github_token))
            .finish()
    }
}

/// Secrets never appear in logs: Debug shows the kind and the non-secret IDs only.
impl fmt::Debug for GitHubCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Token(token) => f.debug_tuple("Token").field(&redacted(token)).finish(),
            Self::App {
                app_id,
                installation_id,
                private_key,
            } => f
                .debug_struct("App")
                .field("app_id", app_id)
                .field("installation_id", installation_id)
                .field("private_key", &redacted(private_key))
                .finish(),
        }
    }
}

fn redacted(secret: &str) -> &'static str {
    if secret.is_empty() {
        "<empty>"
    } else {
        "<redacted>"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(entries: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
            .collect()
    }

    fn problem(result: Result<GitHubCredentials, Error>) -> CredentialsProblem {
        match result {
            Err(Error::ValidateCredentials(problem)) => problem,
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn token_from_secret() {
        let config =
            AppConfig::from_secret_data(&secret(&[("github_token", "ghp_abc")])).expect("parses");
        assert_eq!(
            config.credentials().expect("valid"),
            GitHubCredentials::Token("ghp_abc".to_owned())
        );
    }

    #[test]
    fn app_from_secret() {
        let config = AppConfig::from_secret_data(&secret(&[
            ("github_app_id", "Iv1.abc"),
            ("github_app_installation_id", "12345"),
            ("github_app_private_key", "-----BEGIN RSA PRIVATE KEY-----"),
        ]))
        .expect("parses");
        assert_eq!(
            config.credentials().expect("valid"),
            GitHubCredentials::App {
                app_id: "Iv1.abc".to_owned(),
                installation_id: 12345,
                private_key: "-----BEGIN RSA PRIVATE KEY-----".to_owned(),
            }
        );
    }

    #[test]
    fn installation_id_must_be_decimal() {
        let err = AppConfig::from_secret_data(&secret(&[("github_app_installation_id", "12a")]))
            .unwrap_err();
        match err {
            Error::ParseSecretCredentials { key, reason } => {
                assert_eq!(key, GITHUB_APP_INSTALLATION_ID_KEY);
                assert!(reason.contains("\"12a\""), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn non_utf8_values_are_errors() {
        let mut data = secret(&[]);
        data.insert(GITHUB_TOKEN_KEY.to_owned(), ByteString(vec![0xff, 0xfe]));
        assert!(matches!(
            AppConfig::from_secret_data(&data),
            Err(Error::ParseSecretCredentials {
                key: GITHUB_TOKEN_KEY,
                ..
            })
        ));
    }

    #[test]
    fn neither_kind_is_missing() {
        let config = AppConfig::from_secret_data(&secret(&[])).expect("parses");
        assert_eq!(problem(config.credentials()), CredentialsProblem::Missing);
    }

    #[test]
    fn both_kinds_are_ambiguous() {
        let config = AppConfig {
            github_token: "t".to_owned(),
            github_app_id: "1".to_owned(),
            github_app_installation_id: 2,
            github_app_private_key: "k".to_owned(),
        };
        assert_eq!(problem(config.credentials()), CredentialsProblem::Ambiguous);
    }

    #[test]
    fn token_with_a_partial_app_is_a_token_and_validation_clears_the_app_fields() {
        let config = AppConfig {
            github_token: "t".to_owned(),
            github_app_id: "1".to_owned(),
            ..AppConfig::default()
        };
        assert_eq!(
            config.credentials().expect("valid"),
            GitHubCredentials::Token("t".to_owned())
        );
        assert_eq!(config.validated().expect("valid").github_app_id, "");
    }

    #[test]
    fn incomplete_app_is_rejected() {
        for config in [
            AppConfig {
                github_app_id: "1".to_owned(),
                github_app_private_key: "k".to_owned(),
                ..AppConfig::default()
            },
            AppConfig {
                github_app_id: "1".to_owned(),
                github_app_installation_id: -3,
                github_app_private_key: "k".to_owned(),
                ..AppConfig::default()
            },
            AppConfig {
                github_app_installation_id: 2,
                github_app_private_key: "k".to_owned(),
                ..AppConfig::default()
            },
        ] {
            assert_eq!(
                problem(config.credentials()),
                CredentialsProblem::IncompleteApp,
                "{config:?}"
            );
        }
    }

    #[test]
    fn vault_json_uses_a_numeric_installation_id() {
        let config = AppConfig::from_json(
            r#"{"github_app_id":"42","github_app_installation_id":7,"github_app_private_key":"pem"}"#,
        )
        .expect("parses");
        assert_eq!(config.github_app_installation_id, 7);
        assert!(config.credentials().is_ok());
        assert!(matches!(
            AppConfig::from_json(r#"{"github_app_installation_id":"7"}"#),
            Err(Error::ParseJsonCredentials(_))
        ));
    }

    #[test]
    fn validated_keeps_only_the_chosen_kind() {
        let token = AppConfig {
            github_token: "t".to_owned(),
            ..AppConfig::default()
        };
        assert_eq!(token.validated().expect("valid"), token);
        let json = serde_json::to_value(token.validated().expect("valid")).expect("serialises");
        assert_eq!(
            json,
            serde_json::json!({
                "github_app_id": "",
                "github_app_installation_id": 0,
                "github_app_private_key": "",
                "github_token": "t",
            })
        );
    }

    #[test]
    fn debug_output_redacts_secrets() {
        let config = AppConfig {
            github_token: "ghp_secret".to_owned(),
            github_app_private_key: "pem-secret".to_owned(),
            ..AppConfig::default()
        };
        let shown = format!(
            "{config:?} {:?}",
            GitHubCredentials::Token("ghp_secret".to_owned())
        );
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }
}
