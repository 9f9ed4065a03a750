//! Credential parsing and checking: `Authorization` schemes, GitHub App JWTs, and the admin token the fake
//! mints.

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::config::GitHubApp;
use crate::error::{Error, Rejection};

/// GitHub's own limit: an App JWT may not expire more than ten minutes ahead.
const MAX_APP_JWT_LIFETIME_SECS: i64 = 600;
/// Clock drift GitHub tolerates on `iat`; the clients backdate `iat` by 60 s for the same reason.
const CLOCK_SKEW_SECS: i64 = 60;

/// The credential of `Authorization: <scheme> <credential>` if the scheme is one of `schemes` (compared
/// case-insensitively, as HTTP auth schemes are) and the credential is non-empty.
pub fn credential<'a>(header: Option<&'a str>, schemes: &[&str]) -> Option<&'a str> {
    let (scheme, credential) = header?.trim().split_once(' ')?;
    let credential = credential.trim();
    let known = schemes
        .iter()
        .any(|known| known.eq_ignore_ascii_case(scheme));
    (known && !credential.is_empty()).then_some(credential)
}

/// A configured GitHub App with its parsed key.
#[derive(Clone)]
pub struct AppKey {
    /// Expected `iss`.
    pub app_id: String,
    /// Installations of the App.
    pub installation_ids: Vec<i64>,
    key: DecodingKey,
}

impl std::fmt::Debug for AppKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppKey")
            .field("app_id", &self.app_id)
            .field("installation_ids", &self.installation_ids)
            .finish_non_exhaustive()
    }
}

/// Parse the public keys of the configured Apps.
pub fn parse_apps(apps: &[GitHubApp]) -> Result<Vec<AppKey>, Error> {
    apps.iter()
        .map(|app| {
            let key =
                DecodingKey::from_rsa_pem(app.public_key_pem.as_bytes()).map_err(|source| {
                    Error::ParseAppPublicKey {
                        app_id: app.app_id.clone(),
                        source,
                    }
                })?;
            Ok(AppKey {
                app_id: app.app_id.clone(),
                installation_ids: app.installation_ids.clone(),
                key,
            })
        })
        .collect()
}

#[derive(Deserialize)]
struct AppClaims {
    iss: String,
    iat: i64,
    exp: i64,
}

fn undecodable() -> Rejection {
    Rejection::new(401, "A JSON web token could not be decoded")
}

/// Check an App JWT the way GitHub does: RS256 signed by the key of the App named in `iss`, `iat` not in
/// the future (60 s drift allowed), `exp` in the future and at most ten minutes ahead. Returns the App.
pub fn verify_app_jwt<'a>(
    token: &str,
    apps: &'a [AppKey],
    now: i64,
) -> Result<&'a AppKey, Rejection> {
    let header = jsonwebtoken::decode_header(token).map_err(|_| undecodable())?;
    if header.alg != Algorithm::RS256 {
        return Err(undecodable());
    }
    let unverified: AppClaims =
        jsonwebtoken::dangerous::insecure_decode_claims(token).map_err(|_| undecodable())?;
    let app = apps
        .iter()
        .find(|app| app.app_id == unverified.iss)
        .ok_or_else(|| Rejection::new(401, "Integration not found"))?;

    let mut validation = Validation::new(Algorithm::RS256);
    // Times are checked below against the fake's clock, with GitHub's rules rather than the library's.
    validation.validate_exp = false;
    validation.set_required_spec_claims(&["exp", "iat", "iss"]);
    validation.set_issuer(&[&app.app_id]);
    let claims = jsonwebtoken::decode::<AppClaims>(token, &app.key, &validation)
        .map_err(|_| undecodable())?
        .claims;

    if claims.iat > now + CLOCK_SKEW_SECS {
        return Err(Rejection::new(
            401,
            "'Issued at' claim ('iat') must be an Integer representing a time in the past",
        ));
    }
    if claims.exp <= now {
        return Err(Rejection::new(
            401,
            "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires",
        ));
    }
    if claims.exp > now + MAX_APP_JWT_LIFETIME_SECS + CLOCK_SKEW_SECS
        || claims.exp - claims.iat > MAX_APP_JWT_LIFETIME_SECS + CLOCK_SKEW_SECS
    {
        return Err(Rejection::new(
            401,
            "'Expiration time' claim ('exp') is too far in the future",
        ));
    }
    Ok(app)
}

#[derive(Serialize)]
struct AdminClaims<'a> {
    iss: &'a str,
    aud: &'a str,
    sub: String,
    tid: i64,
    jti: &'a str,
    nbf: i64,
    iat: i64,
    exp: i64,
}

/// Mint an admin token: an HS256 JWT whose `exp` is the expiry the client reads. The fake recognises its
/// tokens by lookup, so the signing secret only has to make the token a well-formed JWT.
pub fn mint_admin_token(
    secret: &[u8],
    tenant: i64,
    nonce: &str,
    issued_at: i64,
    expires_at: i64,
) -> Result<String, Rejection> {
    let claims = AdminClaims {
        iss: "fake-actions-service",
        aud: "actions-service",
        sub: format!("tenant:{tenant}"),
        tid: tenant,
        jti: nonce,
        nbf: issued_at,
        iat: issued_at,
        exp: expires_at,
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )
    .map_err(|error| Rejection::new(500, format!("minting the admin token failed: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_parses_schemes_case_insensitively() {
        assert_eq!(credential(Some("Bearer abc"), &["bearer"]), Some("abc"));
        assert_eq!(
            credential(Some("token abc"), &["Bearer", "token"]),
            Some("abc")
        );
        assert_eq!(
            credential(Some("RemoteAuth  xyz "), &["RemoteAuth"]),
            Some("xyz")
        );
        assert_eq!(credential(Some("Basic abc"), &["Bearer"]), None);
        assert_eq!(credential(Some("Bearer "), &["Bearer"]), None);
        assert_eq!(credential(Some("Bearer"), &["Bearer"]), None);
        assert_eq!(credential(None, &["Bearer"]), None);
    }

    #[test]
    fn admin_token_carries_exp() {
        let token = mint_admin_token(b"secret", 3, "n", 1_700_000_000, 1_700_003_600).unwrap();
        assert_eq!(token.split('.').count(), 3);
        let claims: serde_json::Value =
            jsonwebtoken::dangerous::insecure_decode_claims(&token).unwrap();
        assert_eq!(claims["exp"], 1_700_003_600);
        assert_eq!(claims["tid"], 3);
        let header = jsonwebtoken::decode_header(&token).unwrap();
        assert_eq!(header.alg, Algorithm::HS256);
    }

    #[test]
    fn garbage_app_jwt_is_undecodable() {
        assert_eq!(verify_app_jwt("a.b.c", &[], 0).unwrap_err(), undecodable());
        assert_eq!(verify_app_jwt("", &[], 0).unwrap_err(), undecodable());
    }
}
