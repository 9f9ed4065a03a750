use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use aws_lc_rs::signature::{RSA_PSS_2048_8192_SHA256, UnparsedPublicKey};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::*;

fn rsa_certificate(name: &str) -> (String, String, Vec<u8>) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("an RSA key");
    let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    (cert.pem(), key.serialize_pem(), cert.der().to_vec())
}

fn parse(text: &str) -> Result<ClientCertificate> {
    ClientCertificate::parse(Path::new("/etc/vault/cert.pem"), text.as_bytes())
}

fn reason(result: Result<ClientCertificate>) -> String {
    match result {
        Err(Error::ParseCertificate { reason, path }) => {
            assert_eq!(path, Path::new("/etc/vault/cert.pem"));
            reason
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn certificate_and_key_in_either_order_give_the_sha256_thumbprint() {
    let (cert, key, der) = rsa_certificate("client");
    let expected = URL_SAFE_NO_PAD.encode(digest::digest(&digest::SHA256, &der));
    for text in [format!("{cert}{key}"), format!("{key}\n{cert}")] {
        let parsed = parse(&text).expect("parses");
        assert_eq!(parsed.thumbprint_s256(), expected);
        assert_eq!(thumbprint_s256(&der), expected);
    }
}

#[test]
fn the_certificate_of_the_key_is_chosen_among_a_chain() {
    let (other, _, _) = rsa_certificate("issuer");
    let (cert, key, der) = rsa_certificate("client");
    let parsed = parse(&format!("{other}{cert}{key}")).expect("parses");
    assert_eq!(parsed.thumbprint_s256(), thumbprint_s256(&der));
}

#[test]
fn unusable_files_say_what_is_wrong_without_quoting_key_material() {
    let (cert, key, _) = rsa_certificate("client");
    let (other_cert, other_key, _) = rsa_certificate("other");
    let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("ec key");
    let cases = [
        (cert.clone(), "no private key"),
        (key.clone(), "no certificate"),
        (format!("{other_cert}{key}"), "does not belong"),
        (
            format!("{cert}{key}{other_key}"),
            "more than one private key",
        ),
        (format!("{cert}{}", ec.serialize_pem()), "not an RSA key"),
        (
            format!(
                "{cert}-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n"
            ),
            "encrypted",
        ),
        ("hello".to_owned(), "no private key"),
        (
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n".to_owned(),
            "not PEM",
        ),
    ];
    for (text, expected) in cases {
        let reason = reason(parse(&text));
        assert!(reason.contains(expected), "{expected:?} not in {reason:?}");
        assert!(!reason.contains("MII"), "key material in {reason:?}");
    }
}

#[tokio::test]
async fn a_missing_file_is_a_read_error_naming_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("absent.pem");
    match ClientCertificate::load(&path).await {
        Err(err @ Error::ReadCertificate { .. }) => {
            assert!(err.to_string().contains("absent.pem"), "{err}");
            assert_eq!(
                err.reason(),
                crate::constants::reasons::CERTIFICATE_UNREADABLE
            );
        }
        other => panic!("expected a read error, got {other:?}"),
    }
}

#[test]
fn the_assertion_is_a_ps256_jwt_with_the_thumbprint_and_the_claims_signed_by_the_key() {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("an RSA key");
    let cert = rcgen::CertificateParams::new(vec!["client".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    let parsed = parse(&format!("{}{}", cert.pem(), key.serialize_pem())).expect("parses");
    let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let jwt = parsed
        .assertion(
            "client-id",
            "https://login.example/t/oauth2/v2.0/token",
            now,
            "jti-1",
        )
        .expect("signs");
    let parts: Vec<&str> = jwt.split('.').collect();
    assert_eq!(parts.len(), 3);
    let json = |part: &str| -> serde_json::Value {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).expect("base64url")).expect("json")
    };
    assert_eq!(
        json(parts[0]),
        serde_json::json!({"alg": "PS256", "typ": "JWT", "x5t#S256": thumbprint_s256(cert.der())})
    );
    assert_eq!(
        json(parts[1]),
        serde_json::json!({
            "aud": "https://login.example/t/oauth2/v2.0/token",
            "iss": "client-id",
            "sub": "client-id",
            "jti": "jti-1",
            "nbf": 1_800_000_000u64,
            "iat": 1_800_000_000u64,
            "exp": 1_800_000_600u64,
        })
    );
    // The key's public half, as the certificate carries it (rcgen's raw form is the RSAPublicKey DER).
    let public = UnparsedPublicKey::new(&RSA_PSS_2048_8192_SHA256, key.public_key_raw());
    let signature = URL_SAFE_NO_PAD.decode(parts[2]).expect("base64url");
    let signed = format!("{}.{}", parts[0], parts[1]);
    public
        .verify(signed.as_bytes(), &signature)
        .expect("the signature verifies");
    assert!(
        public.verify(b"something else", &signature).is_err(),
        "the check can fail"
    );
}

#[test]
fn jti_values_are_fresh_uuids() {
    let a = new_jti();
    let b = new_jti();
    assert_ne!(a, b);
    assert_eq!(a.len(), 36);
    assert_eq!(a.as_bytes()[14], b'4');
}

#[test]
fn a_pfx_file_is_named_with_how_to_convert_it() {
    // A PKCS#12 file is DER: it starts with a SEQUENCE (0x30), here with a certificate's DER as a stand-in.
    let (_, _, der) = rsa_certificate("pfx");
    let Err(error) = ClientCertificate::parse(Path::new("/etc/vault/cert.pfx"), &der) else {
        panic!("a DER file parsed as PEM");
    };
    let text = error.to_string();
    assert!(
        text.contains(".pfx") && text.contains("openssl pkcs12"),
        "{text}"
    );
}
