//! The client certificate and the JWT client assertion signed with it, as Entra ID's certificate credentials
//! expect: header `alg` PS256 with the certificate's SHA-256 thumbprint (`x5t#S256`), claims `aud` = the token
//! endpoint, `iss` = `sub` = the client ID, a fresh `jti`, `nbf`/`iat`/`exp`.
//!
//! The file is either PEM (the certificate and its unencrypted RSA private key, in either order, possibly with
//! chain certificates) or, as ARC accepts, a `.pfx` (PKCS#12) file without a password.
//!
//! The crypto is aws-lc-rs, the workspace's only backend (rustls uses it); no OpenSSL. p12-keystore only unpacks
//! a `.pfx` file; the key it yields is loaded into aws-lc-rs like a PEM one.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::digest;
use aws_lc_rs::rsa::KeyPair;
use aws_lc_rs::signature::{self, KeyPair as _};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;

use crate::constants::{ASSERTION_ALGORITHM, ASSERTION_LIFETIME};
use crate::error::{Error, Result};

/// A loaded client certificate: its thumbprint and its private key. Never printed.
pub struct ClientCertificate {
    path: PathBuf,
    thumbprint_s256: String,
    key: KeyPair,
}

impl std::fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCertificate")
            .field("path", &self.path)
            .field("thumbprint_s256", &self.thumbprint_s256)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct Header<'a> {
    alg: &'a str,
    typ: &'a str,
    #[serde(rename = "x5t#S256")]
    x5t_s256: &'a str,
}

#[derive(Serialize)]
struct Claims<'a> {
    aud: &'a str,
    iss: &'a str,
    sub: &'a str,
    jti: &'a str,
    nbf: u64,
    iat: u64,
    exp: u64,
}

impl ClientCertificate {
    /// Reads and parses the file at `path` (read anew each time a token is needed, so a renewed certificate
    /// mounted from a Secret is picked up without a restart).
    pub async fn load(path: &Path) -> Result<Self> {
        let read_error = |source| Error::ReadCertificate {
            path: path.to_owned(),
            source,
        };
        let metadata = tokio::fs::metadata(path).await.map_err(read_error)?;
        if metadata.len() > crate::constants::MAX_CERTIFICATE_FILE_BYTES {
            return Err(Error::ParseCertificate {
                path: path.to_owned(),
                reason: format!(
                    "the file has {} bytes; a certificate with its key has a few kilobytes",
                    metadata.len()
                ),
            });
        }
        let bytes = tokio::fs::read(path).await.map_err(read_error)?;
        Self::parse(path, &bytes)
    }

    /// Parses the file's bytes: PEM text holding one RSA private key (PKCS#8 `PRIVATE KEY` or PKCS#1
    /// `RSA PRIVATE KEY`) and the certificate of that key (other certificates, such as a chain, are ignored), or a
    /// `.pfx` (PKCS#12) file without a password (its first private key and that key's certificate).
    pub fn parse(path: &Path, contents: &[u8]) -> Result<Self> {
        let fail = |reason: &str| Error::ParseCertificate {
            path: path.to_owned(),
            reason: reason.to_owned(),
        };
        // Binary DER starts with a SEQUENCE (0x30), which PEM text never does: that is a .pfx file.
        let (key, certificates) = if contents.first() == Some(&0x30) {
            read_pkcs12(contents).map_err(fail)?
        } else {
            read_pem(contents).map_err(fail)?
        };
        if certificates.is_empty() {
            return Err(fail("the file holds no certificate"));
        }
        // The certificate whose subject public key is this key's: its DER contains the key's RSAPublicKey
        // encoding verbatim (inside the SubjectPublicKeyInfo bit string). A .pfx file may hold its chain too, and
        // not necessarily after the key's own certificate, so its order proves nothing.
        let public = key.public_key().as_ref();
        let certificate = certificates
            .iter()
            .find(|der| der.windows(public.len()).any(|window| window == public))
            .ok_or_else(|| {
                fail("the private key does not belong to any certificate in the file")
            })?;
        Ok(Self {
            path: path.to_owned(),
            thumbprint_s256: thumbprint_s256(certificate),
            key,
        })
    }

    /// The certificate's SHA-256 thumbprint, base64url without padding (the `x5t#S256` header).
    pub fn thumbprint_s256(&self) -> &str {
        &self.thumbprint_s256
    }

    /// A signed client assertion for `client_id` at `audience` (the token endpoint), valid from `now` for
    /// [`ASSERTION_LIFETIME`], identified by `jti`.
    pub fn assertion(
        &self,
        client_id: &str,
        audience: &str,
        now: SystemTime,
        jti: &str,
    ) -> Result<String> {
        let now = now
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_secs();
        let header = Header {
            alg: ASSERTION_ALGORITHM,
            typ: "JWT",
            x5t_s256: &self.thumbprint_s256,
        };
        let claims = Claims {
            aud: audience,
            iss: client_id,
            sub: client_id,
            jti,
            nbf: now,
            iat: now,
            exp: now + ASSERTION_LIFETIME.as_secs(),
        };
        let sign_error = || Error::SignClientAssertion {
            path: self.path.clone(),
        };
        let signing_input = format!(
            "{}.{}",
            encode_json(&header).ok_or_else(sign_error)?,
            encode_json(&claims).ok_or_else(sign_error)?
        );
        let mut signature = vec![0; self.key.public_modulus_len()];
        self.key
            .sign(
                &signature::RSA_PSS_SHA256,
                &aws_lc_rs::rand::SystemRandom::new(),
                signing_input.as_bytes(),
                &mut signature,
            )
            .map_err(|_| sign_error())?;
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature)
        ))
    }
}

/// The private key and the certificates (DER) of PEM text; the error is the reason, which never quotes the file.
fn read_pem(text: &[u8]) -> std::result::Result<(KeyPair, Vec<Vec<u8>>), &'static str> {
    // The parser's own error could quote file content; say only that the file is not PEM.
    let blocks = pem::parse_many(text)
        .map_err(|_| "the file is not PEM text (expected CERTIFICATE and PRIVATE KEY blocks)")?;
    let mut certificates = Vec::new();
    let mut key = None;
    for block in &blocks {
        match block.tag() {
            "CERTIFICATE" => certificates.push(block.contents().to_vec()),
            "PRIVATE KEY" | "RSA PRIVATE KEY" if key.is_some() => {
                return Err(
                    "the file holds more than one private key; keep only the certificate's",
                );
            }
            "PRIVATE KEY" => key = Some(rsa_key_from_pkcs8(block.contents())?),
            "RSA PRIVATE KEY" => {
                key = Some(
                    KeyPair::from_der(block.contents())
                        .map_err(|_| "the RSA private key is malformed")?,
                );
            }
            "ENCRYPTED PRIVATE KEY" => {
                return Err(
                    "the private key is encrypted; store it unencrypted (the file is protected by its mount)",
                );
            }
            _ => {}
        }
    }
    let key = key.ok_or("the file holds no private key")?;
    Ok((key, certificates))
}

/// What a password-protected .pfx file gets. The empty password is all this client tries: there is no setting for
/// another, and it would be stored next to the file (in the same Secret), protecting nothing the mount does not.
const PKCS12_PASSWORD_PROTECTED: &str = "the .pfx (PKCS#12) file does not open without a password (its integrity \
     check or its decryption fails with the empty one); a password-protected .pfx file is not supported: convert it \
     once to PEM with `openssl pkcs12 -in cert.pfx -out cert.pem -nodes` (add `-legacy` for files made by older \
     Windows tools) and mount the PEM file instead (docs/configuration.md)";

/// The first private key and all certificates (DER) of a PKCS#12 file without a password; the error is the
/// reason, which never quotes the file (the library's own errors are not passed on for that reason).
fn read_pkcs12(der: &[u8]) -> std::result::Result<(KeyPair, Vec<Vec<u8>>), &'static str> {
    use p12_keystore::error::Error as P12Error;
    // A file exported "without a password" has its MAC and its encryption keys derived from the empty password,
    // so that is the one password tried.
    let archive = p12_keystore::Pkcs12Archive::from_pkcs12(der, "").map_err(|error| match error {
        // A wrong password shows as a MAC mismatch or, in a file without a MAC, as bags that do not decrypt
        // (a bad padding, or bytes that are not a PKCS#8 key).
        P12Error::MacError(_)
        | P12Error::UnpadError
        | P12Error::Pkcs5Error(_)
        | P12Error::InvalidPrivateKey => PKCS12_PASSWORD_PROTECTED,
        P12Error::UnsupportedEncryptionScheme | P12Error::UnsupportedMacAlgorithm => {
            "the .pfx (PKCS#12) file is encrypted with a scheme this client does not read (it reads PBES2 with \
             AES, and 3DES or RC2 as older Windows tools write); convert it once to PEM with `openssl pkcs12 -in \
             cert.pfx -out cert.pem -nodes` (docs/configuration.md)"
        }
        P12Error::InvalidParameters => {
            "the .pfx (PKCS#12) file's encryption parameters are missing or out of bounds (more than 1,000,000 \
             key derivation iterations are refused); convert it once to PEM with `openssl pkcs12 -in cert.pfx \
             -out cert.pem -nodes` (docs/configuration.md)"
        }
        P12Error::UnsupportedCertificateType => {
            "the .pfx (PKCS#12) file holds a certificate that is not X.509"
        }
        _ => {
            "the file is binary but neither PEM text nor a readable .pfx (PKCS#12) file; store the certificate and \
             its unencrypted RSA key as PEM, or as a .pfx without a password; a .pfx converts to PEM with `openssl \
             pkcs12 -in cert.pfx -out cert.pem -nodes` (docs/configuration.md)"
        }
    })?;
    // The first key is the one used (a .pfx exported for one certificate holds one); whatever else the file
    // holds, the certificate chosen for it must belong to it.
    let key = archive
        .keys
        .first()
        .ok_or("the .pfx (PKCS#12) file holds no private key")?;
    let key = rsa_key_from_pkcs8(key.key.as_der())?;
    let certificates = archive
        .certs
        .iter()
        .map(|bag| bag.cert.as_der().to_vec())
        .collect();
    Ok((key, certificates))
}

/// An RSA key from its PKCS#8 encoding (what both a PEM `PRIVATE KEY` block and a PKCS#12 key bag hold).
fn rsa_key_from_pkcs8(der: &[u8]) -> std::result::Result<KeyPair, &'static str> {
    KeyPair::from_pkcs8(der).map_err(|_| {
        "the private key is not an RSA key (Entra ID accepts RSA certificates only) or is malformed"
    })
}

/// A JWT segment: the value's JSON, base64url without padding.
fn encode_json<T: Serialize>(value: &T) -> Option<String> {
    serde_json::to_vec(value)
        .ok()
        .map(|json| URL_SAFE_NO_PAD.encode(json))
}

/// SHA-256 of the certificate's DER, base64url without padding.
pub fn thumbprint_s256(certificate_der: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(digest::digest(&digest::SHA256, certificate_der))
}

/// A fresh random assertion ID, formatted as a version-4 UUID.
pub fn new_jti() -> String {
    let mut bytes = [0u8; 16];
    // The system RNG does not fail on supported platforms; a zero ID would still be a valid (if unlucky) jti.
    let _ = aws_lc_rs::rand::fill(&mut bytes);
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests;
