//! GitHub credentials and the admin connection they are exchanged for
//! (docs/reference/actions-service-protocol.md, "Authentication").

use jiff::Timestamp;
use url::Url;

use crate::error::Error;
use crate::jwt::{self, AppJwtClaims, AppPrivateKey};
use crate::secret::SecretString;

/// How the client authenticates to GitHub.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// A personal access token.
    Pat(SecretString),
    /// A GitHub App installation.
    App(GitHubAppCredentials),
}

/// GitHub App credentials.
#[derive(Debug, Clone)]
pub struct GitHubAppCredentials {
    /// Client id (`Iv1.…`) or the numeric App id written as a string.
    pub client_id: String,
    /// Installation id; must be positive.
    pub installation_id: i64,
    /// PEM private key of the App.
    pub private_key: SecretString,
}

impl Credentials {
    /// Picks credentials the way the reference client does: a non-empty PAT wins, otherwise the App fields are
    /// used and must all be present.
    pub fn from_parts(
        pat: Option<SecretString>,
        app_client_id: Option<String>,
        app_installation_id: Option<i64>,
        app_private_key: Option<SecretString>,
    ) -> Result<Self, Error> {
        if let Some(pat) = pat.filter(|p| !p.is_empty()) {
            return Ok(Self::Pat(pat));
        }
        match (app_client_id, app_installation_id, app_private_key) {
            (None, None, None) => Err(Error::ValidateCredentials(
                "neither a personal access token nor GitHub App credentials were given",
            )),
            (client_id, installation_id, private_key) => Ok(Self::App(GitHubAppCredentials {
                client_id: client_id.unwrap_or_default(),
                installation_id: installation_id.unwrap_or_default(),
                private_key: private_key.unwrap_or_default(),
            })),
        }
    }
}

/// Credentials after validation; the App key is parsed once.
#[derive(Debug, Clone)]
pub(crate) enum LoadedCredentials {
    Pat(SecretString),
    App {
        client_id: String,
        installation_id: i64,
        key: AppPrivateKey,
    },
}

impl LoadedCredentials {
    pub(crate) fn load(credentials: &Credentials) -> Result<Self, Error> {
        match credentials {
            Credentials::Pat(pat) if pat.is_empty() => Err(Error::ValidateCredentials(
                "the personal access token is empty",
            )),
            Credentials::Pat(pat) => Ok(Self::Pat(pat.clone())),
            Credentials::App(app) => {
                if app.client_id.trim().is_empty() {
                    return Err(Error::ValidateCredentials(
                        "the GitHub App client id is empty",
                    ));
                }
                if app.installation_id <= 0 {
                    return Err(Error::ValidateCredentials(
                        "the GitHub App installation id must be positive",
                    ));
                }
                if app.private_key.is_empty() {
                    return Err(Error::ValidateCredentials(
                        "the GitHub App private key is empty",
                    ));
                }
                Ok(Self::App {
                    client_id: app.client_id.clone(),
                    installation_id: app.installation_id,
                    key: AppPrivateKey::from_pem(&app.private_key)?,
                })
            }
        }
    }

    /// A freshly signed App JWT (minted anew for every installation token, as in the reference client).
    pub(crate) fn app_jwt(key: &AppPrivateKey, client_id: &str) -> Result<SecretString, Error> {
        key.sign(&AppJwtClaims::new(client_id, Timestamp::now().as_second()))
    }
}

/// The Actions Service endpoint and admin token from runner-registration.
#[derive(Debug, Clone)]
pub struct AdminConnection {
    /// Actions Service base URL for the tenant.
    pub service_url: Url,
    /// Admin token (a JWT).
    pub token: SecretString,
    /// The token's `exp`.
    pub expires_at: Timestamp,
}

impl AdminConnection {
    /// Whether the token must be replaced before the next Actions Service call.
    pub fn needs_refresh(&self, now: Timestamp) -> bool {
        jwt::admin_token_needs_refresh(Some(self.expires_at), now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pat_wins_over_app_fields() {
        let creds = Credentials::from_parts(
            Some("ghp_x".into()),
            Some("1".into()),
            Some(2),
            Some("k".into()),
        )
        .expect("valid");
        assert!(matches!(creds, Credentials::Pat(p) if p.expose_secret() == "ghp_x"));
    }

    #[test]
    fn incomplete_credentials_are_rejected() {
        assert!(matches!(
            Credentials::from_parts(Some("".into()), None, None, None),
            Err(Error::ValidateCredentials(_))
        ));
        let cases = [
            (
                Credentials::Pat("".into()),
                "personal access token is empty",
            ),
            (
                Credentials::App(GitHubAppCredentials {
                    client_id: " ".into(),
                    installation_id: 1,
                    private_key: "k".into(),
                }),
                "client id is empty",
            ),
            (
                Credentials::App(GitHubAppCredentials {
                    client_id: "1".into(),
                    installation_id: 0,
                    private_key: "k".into(),
                }),
                "installation id must be positive",
            ),
            (
                Credentials::App(GitHubAppCredentials {
                    client_id: "1".into(),
                    installation_id: 3,
                    private_key: "".into(),
                }),
                "private key is empty",
            ),
        ];
        for (creds, needle) in cases {
            let err = LoadedCredentials::load(&creds).expect_err(needle);
            assert!(err.to_string().contains(needle), "{err}");
        }
        let creds =
            Credentials::from_parts(None, Some("1".into()), None, Some("k".into())).expect("shape");
        assert!(
            LoadedCredentials::load(&creds).is_err(),
            "a missing installation id is caught at load"
        );
    }

    #[test]
    fn debug_output_redacts_keys() {
        let creds = Credentials::App(GitHubAppCredentials {
            client_id: "1".into(),
            installation_id: 3,
            private_key: "-----BEGIN RSA PRIVATE KEY-----secret".into(),
        });
        assert!(!format!("{creds:?}").contains("secret"));
    }
}
