//! JWTs: the GitHub App JWT this client signs, and the expiry of the admin token it is handed
//! (docs/reference/actions-service-protocol.md, "App JWT" and "Admin token lifetime").

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use jiff::Timestamp;
use std::sync::Arc;

use jsonwebtoken::{Algorithm, EncodingKey};
use serde::Serialize;

use crate::error::{Error, KeyProblem};
use crate::secret::SecretString;

/// Seconds the App JWT's `iat` is backdated, allowing for clock skew between us and GitHub.
pub const APP_JWT_CLOCK_SKEW_SECS: i64 = 60;
/// Lifetime of the App JWT from its (backdated) `iat`; GitHub accepts at most 10 minutes.
pub const APP_JWT_LIFETIME_SECS: i64 = 9 * 60;

/// Claims of the App JWT, in the order the reference client emits them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppJwtClaims {
    /// Client id or numeric App id.
    pub iss: String,
    /// `iat` + 9 minutes.
    pub exp: i64,
    /// Now − 60 s.
    pub iat: i64,
}

impl AppJwtClaims {
    /// Claims for a JWT minted at `now_secs` (seconds since the epoch).
    pub fn new(client_id: &str, now_secs: i64) -> Self {
        let iat = now_secs - APP_JWT_CLOCK_SKEW_SECS;
        Self {
            iss: client_id.to_owned(),
            exp: iat + APP_JWT_LIFETIME_SECS,
            iat,
        }
    }
}

/// A validated RSA private key of a GitHub App.
#[derive(Clone)]
pub struct AppPrivateKey {
    key: EncodingKey,
}

impl std::fmt::Debug for AppPrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AppPrivateKey(<redacted>)")
    }
}

impl AppPrivateKey {
    /// Loads a PEM key: PKCS#1 (`RSA PRIVATE KEY`) or PKCS#8 (`PRIVATE KEY`) holding an RSA key, unencrypted.
    ///
    /// The key is checked by signing a throwaway JWT, so a damaged key fails here, at configuration time, rather
    /// than at the first token refresh.
    pub fn from_pem(pem: &SecretString) -> Result<Self, Error> {
        let text = pem.expose_secret();
        let (label, headers, der) = first_pem_block(text).map_err(Error::LoadAppPrivateKey)?;
        check_key_kind(&label, &headers, &der).map_err(Error::LoadAppPrivateKey)?;
        let key = EncodingKey::from_rsa_pem(text.as_bytes())
            .map_err(|e| Error::LoadAppPrivateKey(KeyProblem::Malformed(e.to_string())))?;
        let loaded = Self { key };
        loaded
            .sign(&AppJwtClaims::new("validation", 0))
            .map_err(|e| match e {
                Error::SignAppJwt(inner) => {
                    Error::LoadAppPrivateKey(KeyProblem::Malformed(inner.to_string()))
                }
                other => other,
            })?;
        Ok(loaded)
    }

    /// Signs an RS256 JWT. The header bytes are exactly `{"alg":"RS256","typ":"JWT"}`, as the reference client
    /// emits them (jsonwebtoken's own header type orders the keys differently).
    pub fn sign(&self, claims: &AppJwtClaims) -> Result<SecretString, Error> {
        let claims_json =
            serde_json::to_vec(claims).map_err(|e| Error::SignAppJwt(Arc::new(e.into())))?;
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(APP_JWT_HEADER),
            URL_SAFE_NO_PAD.encode(claims_json)
        );
        let signature =
            jsonwebtoken::crypto::sign(signing_input.as_bytes(), &self.key, Algorithm::RS256)
                .map_err(|e| Error::SignAppJwt(Arc::new(e)))?;
        Ok(SecretString::new(format!("{signing_input}.{signature}")))
    }
}

/// The JOSE header of the App JWT.
const APP_JWT_HEADER: &[u8] = br#"{"alg":"RS256","typ":"JWT"}"#;

/// Splits off the first PEM block: its label, its `Key: value` headers and its decoded body.
fn first_pem_block(text: &str) -> Result<(String, Vec<String>, Vec<u8>), KeyProblem> {
    let mut lines = text.lines().map(str::trim);
    let label = loop {
        let line = lines.next().ok_or(KeyProblem::NotPem)?;
        if let Some(label) = line
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        {
            break label.to_owned();
        }
    };
    let end = format!("-----END {label}-----");
    let mut headers = Vec::new();
    let mut body = String::new();
    let mut closed = false;
    for line in lines {
        if line == end {
            closed = true;
            break;
        }
        if line.contains(':') {
            headers.push(line.to_owned());
        } else {
            body.push_str(line);
        }
    }
    if !closed {
        return Err(KeyProblem::NotPem);
    }
    let der = STANDARD
        .decode(body.as_bytes())
        .map_err(|_| KeyProblem::BadBase64)?;
    Ok((label, headers, der))
}

/// DER encodings of the algorithm OIDs that can appear in a PKCS#8 `PrivateKeyInfo`.
const OID_RSA: &[u8] = &[
    0x06, 0x09, 0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x01, 0x01,
];
const OID_EC: &[u8] = &[0x06, 0x07, 0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x02, 0x01];
const OID_ED25519: &[u8] = &[0x06, 0x03, 0x2B, 0x65, 0x70];

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Rejects everything but an unencrypted RSA private key, naming what was found instead.
fn check_key_kind(label: &str, headers: &[String], der: &[u8]) -> Result<(), KeyProblem> {
    match label {
        "RSA PRIVATE KEY" => {
            if headers
                .iter()
                .any(|h| h.starts_with("Proc-Type") && h.contains("ENCRYPTED"))
            {
                Err(KeyProblem::Encrypted)
            } else {
                Ok(())
            }
        }
        "PRIVATE KEY" => {
            // The algorithm identifier sits near the start of PrivateKeyInfo; look only there so key material
            // cannot be mistaken for an OID.
            let prefix = &der[..der.len().min(32)];
            if contains(prefix, OID_RSA) {
                Ok(())
            } else if contains(prefix, OID_EC) {
                Err(KeyProblem::NotRsa("EC"))
            } else if contains(prefix, OID_ED25519) {
                Err(KeyProblem::NotRsa("Ed25519"))
            } else {
                Err(KeyProblem::NotRsa("non-RSA"))
            }
        }
        "ENCRYPTED PRIVATE KEY" => Err(KeyProblem::Encrypted),
        "EC PRIVATE KEY" => Err(KeyProblem::NotRsa("EC")),
        "DSA PRIVATE KEY" => Err(KeyProblem::NotRsa("DSA")),
        "PUBLIC KEY" | "RSA PUBLIC KEY" => Err(KeyProblem::NotAPrivateKey("public key".into())),
        "CERTIFICATE" => Err(KeyProblem::NotAPrivateKey("certificate".into())),
        other => Err(KeyProblem::UnsupportedLabel(other.to_owned())),
    }
}

/// JOSE `alg` values golang-jwt knows, `none` included (it registers the unsigned method, so GitHub's Go client
/// reads an unsigned admin token's `exp`, and so must this one); the reference client rejects tokens with any other.
const KNOWN_ALGORITHMS: &[&str] = &[
    "HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256",
    "ES384", "ES512", "EdDSA", "none",
];

/// Reads the `exp` claim of the admin token without verifying its signature (the client cannot: it has no key).
///
/// Errors describe the problem without ever including the token.
pub fn admin_token_expiry(token: &SecretString) -> Result<Timestamp, Error> {
    let fail = |reason: &str| Error::ReadAdminTokenExpiry {
        reason: reason.to_owned(),
    };
    let parts: Vec<&str> = token.expose_secret().split('.').collect();
    let [header, payload, _signature] = parts.as_slice() else {
        return Err(fail("not a JWT: expected three dot-separated segments"));
    };
    let decode_part = |part: &str, what: &str| -> Result<serde_json::Value, Error> {
        // Unpadded base64url is the standard; tolerate padding some encoders add.
        let bytes = URL_SAFE_NO_PAD
            .decode(part.trim_end_matches('='))
            .map_err(|_| fail(&format!("the {what} is not base64url")))?;
        serde_json::from_slice(&bytes).map_err(|_| fail(&format!("the {what} is not JSON")))
    };
    let header = decode_part(header, "header")?;
    let alg = header
        .get("alg")
        .and_then(|a| a.as_str())
        .unwrap_or_default();
    if !KNOWN_ALGORITHMS.contains(&alg) {
        return Err(fail("the header has no known \"alg\""));
    }
    let payload = decode_part(payload, "payload")?;
    let exp = payload
        .get("exp")
        .and_then(serde_json::Value::as_f64)
        .ok_or_else(|| fail("the payload has no numeric \"exp\" claim"))?;
    let millis = (exp * 1000.0).round();
    if !millis.is_finite() || millis.abs() > 1e17 {
        return Err(fail("the \"exp\" claim is out of range"));
    }
    // The range check above keeps the cast exact.
    #[allow(clippy::cast_possible_truncation)]
    Timestamp::from_millisecond(millis as i64)
        .map_err(|_| fail("the \"exp\" claim is out of range"))
}

/// Seconds before expiry at which the admin token is replaced.
pub const ADMIN_TOKEN_REFRESH_MARGIN_SECS: i64 = 60;

/// Whether the admin token must be refreshed before the next Actions Service call: when none is held yet, or it
/// expires within the next minute.
pub fn admin_token_needs_refresh(expires_at: Option<Timestamp>, now: Timestamp) -> bool {
    match expires_at {
        None => true,
        Some(exp) => now.as_second() + ADMIN_TOKEN_REFRESH_MARGIN_SECS > exp.as_second(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use jsonwebtoken::{DecodingKey, Validation};

    /// A fresh 2048-bit RSA key in PKCS#8 PEM, plus its public key (generated per test run, never stored).
    pub(crate) fn rsa_key_pair() -> (String, String) {
        let key =
            rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("generates an RSA key");
        (key.serialize_pem(), key.public_key_pem())
    }

    #[test]
    fn claims_follow_the_spec_example() {
        let claims = AppJwtClaims::new("Iv1.0123456789abcdef", 1_700_000_060);
        assert_eq!(
            serde_json::to_string(&claims).expect("encodes"),
            r#"{"iss":"Iv1.0123456789abcdef","exp":1700000540,"iat":1700000000}"#
        );
    }

    #[test]
    fn signs_rs256_jwts_that_verify() {
        let (pem, public_pem) = rsa_key_pair();
        let key = AppPrivateKey::from_pem(&SecretString::new(pem)).expect("loads");
        let now = Timestamp::now().as_second();
        let jwt = key.sign(&AppJwtClaims::new("123", now)).expect("signs");
        let header_json = URL_SAFE_NO_PAD
            .decode(jwt.expose_secret().split('.').next().expect("header"))
            .expect("b64");
        assert_eq!(header_json, br#"{"alg":"RS256","typ":"JWT"}"#);
        let mut validation = Validation::new(Algorithm::RS256);
        validation.set_required_spec_claims(&["exp", "iss"]);
        let decoded = jsonwebtoken::decode::<serde_json::Value>(
            jwt.expose_secret(),
            &DecodingKey::from_rsa_pem(public_pem.as_bytes()).expect("public key"),
            &validation,
        )
        .expect("verifies");
        assert_eq!(decoded.claims["iss"], "123");
        assert_eq!(decoded.claims["iat"], now - 60);
        assert_eq!(decoded.claims["exp"], now - 60 + 540);
    }

    /// Reads one DER tag-length header, returning (tag, content start, content length).
    fn der_header(der: &[u8], at: usize) -> (u8, usize, usize) {
        let tag = der[at];
        let first = der[at + 1] as usize;
        if first < 0x80 {
            return (tag, at + 2, first);
        }
        let n = first & 0x7f;
        let len = der[at + 2..at + 2 + n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | *b as usize);
        (tag, at + 2 + n, len)
    }

    /// Converts a PKCS#8 RSA key to PKCS#1 PEM: the RSAPrivateKey is the OCTET STRING after version and algorithm.
    fn pkcs8_to_pkcs1_pem(pkcs8_pem: &str) -> String {
        let (_, _, der) = first_pem_block(pkcs8_pem).expect("pem");
        let (_, seq_start, _) = der_header(&der, 0);
        let (_, v_start, v_len) = der_header(&der, seq_start);
        let (_, a_start, a_len) = der_header(&der, v_start + v_len);
        let (tag, k_start, k_len) = der_header(&der, a_start + a_len);
        assert_eq!(tag, 0x04, "octet string");
        let body = STANDARD.encode(&der[k_start..k_start + k_len]);
        let lines: Vec<&str> = body
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).expect("ascii"))
            .collect();
        format!(
            "-----BEGIN RSA PRIVATE KEY-----\n{}\n-----END RSA PRIVATE KEY-----\n",
            lines.join("\n")
        )
    }

    #[test]
    fn pkcs1_keys_load_too() {
        let (pem, _) = rsa_key_pair();
        let pkcs1 = pkcs8_to_pkcs1_pem(&pem);
        let key = AppPrivateKey::from_pem(&SecretString::new(pkcs1)).expect("PKCS#1 loads");
        key.sign(&AppJwtClaims::new("1", 1_700_000_000))
            .expect("signs");
        assert_eq!(format!("{key:?}"), "AppPrivateKey(<redacted>)");
    }

    fn load_err(pem: &str) -> KeyProblem {
        match AppPrivateKey::from_pem(&SecretString::new(pem)) {
            Err(Error::LoadAppPrivateKey(problem)) => problem,
            other => panic!("expected a key problem, got {other:?}"),
        }
    }

    #[test]
    fn unusable_keys_are_named() {
        let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("ec");
        assert_eq!(load_err(&ec.serialize_pem()), KeyProblem::NotRsa("EC"));
        let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("ed25519");
        assert_eq!(load_err(&ed.serialize_pem()), KeyProblem::NotRsa("Ed25519"));
        assert_eq!(
            load_err(&ec.public_key_pem()),
            KeyProblem::NotAPrivateKey("public key".into())
        );
        assert_eq!(load_err("just some text"), KeyProblem::NotPem);
        assert_eq!(load_err(""), KeyProblem::NotPem);
        assert_eq!(
            load_err("-----BEGIN PRIVATE KEY-----\nMIIE\n"),
            KeyProblem::NotPem,
            "an unterminated block is not PEM"
        );
        assert_eq!(
            load_err(
                "-----BEGIN RSA PRIVATE KEY-----\n!!!not base64!!!\n-----END RSA PRIVATE KEY-----"
            ),
            KeyProblem::BadBase64
        );
        assert_eq!(
            load_err(
                "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----"
            ),
            KeyProblem::Encrypted
        );
        assert_eq!(
            load_err(
                "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\nAAAA\n-----END RSA PRIVATE KEY-----"
            ),
            KeyProblem::Encrypted
        );
        assert_eq!(
            load_err(
                "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----"
            ),
            KeyProblem::UnsupportedLabel("OPENSSH PRIVATE KEY".into())
        );
        assert!(matches!(
            load_err("-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----"),
            KeyProblem::Malformed(_)
        ));
        let err = AppPrivateKey::from_pem(&SecretString::new(ec.serialize_pem())).expect_err("EC");
        assert_eq!(
            err.to_string(),
            "loading the GitHub App private key failed: the key is a EC key; GitHub App keys are RSA"
        );
    }

    fn token(header: &str, payload: &str) -> SecretString {
        SecretString::new(format!(
            "{}.{}.c2ln",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(payload)
        ))
    }

    #[test]
    fn admin_token_expiry_is_read_without_verification() {
        let exp = admin_token_expiry(&token(
            r#"{"alg":"RS256","typ":"JWT"}"#,
            r#"{"exp":1700003600}"#,
        ))
        .expect("reads");
        assert_eq!(exp.as_second(), 1_700_003_600);
        let exp = admin_token_expiry(&token(r#"{"alg":"HS256"}"#, r#"{"exp":1700003600.5}"#))
            .expect("fractional");
        assert_eq!(exp.as_millisecond(), 1_700_003_600_500);
        // A sample admin token: an RS256 header and `exp` 1700003600, with a dummy signature.
        let sample =
            SecretString::new("eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJleHAiOjE3MDAwMDM2MDB9.c2ln");
        assert_eq!(
            admin_token_expiry(&sample).expect("sample").as_second(),
            1_700_003_600
        );
    }

    #[test]
    fn an_unsigned_admin_token_is_read_as_githubs_client_reads_it() {
        let exp = admin_token_expiry(&token(
            r#"{"alg":"none","typ":"JWT"}"#,
            r#"{"exp":1700000000}"#,
        ))
        .expect("alg none is a known method");
        assert_eq!(exp.as_second(), 1_700_000_000);
    }

    #[test]
    fn admin_token_problems_are_described_without_the_token() {
        let cases = [
            (
                SecretString::new("opaque-secret-token"),
                "three dot-separated",
            ),
            (SecretString::new("a.b"), "three dot-separated"),
            (SecretString::new("!!.e30.c2ln"), "header is not base64url"),
            (token("not json", "{}"), "header is not JSON"),
            (token(r#"{"alg":"XS999"}"#, r#"{"exp":1}"#), "known"),
            (token(r#"{"alg":"RS256"}"#, r#"{"iat":1}"#), "no numeric"),
            (
                token(r#"{"alg":"RS256"}"#, r#"{"exp":"soon"}"#),
                "no numeric",
            ),
            (
                token(r#"{"alg":"RS256"}"#, r#"{"exp":1e300}"#),
                "out of range",
            ),
        ];
        for (token, needle) in cases {
            let err = admin_token_expiry(&token).expect_err(needle);
            let text = err.to_string();
            assert!(text.contains(needle), "{text}");
            assert!(!text.contains(token.expose_secret()), "{text}");
        }
    }

    #[test]
    fn refresh_decision_table() {
        let now: Timestamp = "2025-01-01T00:00:00Z".parse().expect("ts");
        let at = |secs: i64| Some(Timestamp::from_second(now.as_second() + secs).expect("ts"));
        assert!(admin_token_needs_refresh(None, now), "no token yet");
        assert!(
            admin_token_needs_refresh(at(59), now),
            "expires within a minute"
        );
        assert!(admin_token_needs_refresh(at(-5), now), "already expired");
        assert!(
            !admin_token_needs_refresh(at(60), now),
            "exactly a minute left is still fine"
        );
        assert!(
            !admin_token_needs_refresh(at(3600), now),
            "valid for an hour"
        );
    }
}
