use std::path::Path;
use std::process::Command;
use std::time::{Duration, UNIX_EPOCH};

use aws_lc_rs::signature::{RSA_PSS_2048_8192_SHA256, UnparsedPublicKey};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use p12_keystore::{
    EncryptionAlgorithm, KeyStore, KeyStoreEntry, MacAlgorithm, PrivateKey, PrivateKeyChain,
};

use super::*;

const PEM_PATH: &str = "/etc/vault/cert.pem";
const PFX_PATH: &str = "/etc/vault/cert.pfx";
/// What a refused password-protected .pfx file must tell the operator to run.
const CONVERT_COMMAND: &str = "openssl pkcs12 -in cert.pfx -out cert.pem -nodes";

// The encryption OIDs as DER (tag, length, value), so a test can check which scheme a fixture really uses.
const PBES2: &[u8] = &[
    0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x05, 0x0d,
];
const AES_256_CBC: &[u8] = &[
    0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x01, 0x2a,
];
const PBE_SHA1_3DES: &[u8] = &[
    0x06, 0x0a, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x0c, 0x01, 0x03,
];
const PBE_SHA1_RC2_40: &[u8] = &[
    0x06, 0x0a, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x0c, 0x01, 0x06,
];

fn rsa_certificate(name: &str) -> (String, String, Vec<u8>) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("an RSA key");
    let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    (cert.pem(), key.serialize_pem(), cert.der().to_vec())
}

/// An RSA key and its self-signed certificate, for fixtures that need the key's DER or public half.
fn rsa_identity(name: &str) -> (rcgen::KeyPair, rcgen::Certificate) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("an RSA key");
    let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    (key, cert)
}

fn parse(text: &str) -> Result<ClientCertificate> {
    ClientCertificate::parse(Path::new(PEM_PATH), text.as_bytes())
}

fn parse_pfx(der: &[u8]) -> Result<ClientCertificate> {
    ClientCertificate::parse(Path::new(PFX_PATH), der)
}

fn reason(result: Result<ClientCertificate>) -> String {
    reason_at(PEM_PATH, result)
}

fn reason_at(expected_path: &str, result: Result<ClientCertificate>) -> String {
    match result {
        Err(Error::ParseCertificate { reason, path }) => {
            assert_eq!(path, Path::new(expected_path));
            reason
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// Checks the JWT's signature with `public_key` (the RSAPublicKey DER a certificate carries).
fn assert_signed_by(jwt: &str, public_key: &[u8]) {
    let parts: Vec<&str> = jwt.split('.').collect();
    assert_eq!(parts.len(), 3);
    let public = UnparsedPublicKey::new(&RSA_PSS_2048_8192_SHA256, public_key);
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

/// Signs an assertion with `parsed` and checks it carries `thumbprint` and verifies with `public_key`.
fn assert_assertion_verifies(parsed: &ClientCertificate, thumbprint: &str, public_key: &[u8]) {
    let jwt = parsed
        .assertion(
            "client-id",
            "https://login.example/t/oauth2/v2.0/token",
            SystemTime::now(),
            &new_jti(),
        )
        .expect("signs");
    let header = jwt.split('.').next().expect("a header");
    let header: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).expect("base64url")).expect("json");
    assert_eq!(header["x5t#S256"], thumbprint);
    assert_signed_by(&jwt, public_key);
}

/// A .pfx file written by p12-keystore: `key` (PKCS#8 DER) with its certificate, after an unrelated certificate
/// so that the key's certificate is not simply the file's first one.
fn pkcs12_file(
    key: &[u8],
    certificate: &[u8],
    unrelated: &[u8],
    password: &str,
    encryption: EncryptionAlgorithm,
    mac: MacAlgorithm,
) -> Vec<u8> {
    let cert = |der| p12_keystore::Certificate::from_der(der).expect("an X.509 certificate");
    let mut store = KeyStore::new();
    store.add_entry("issuer", KeyStoreEntry::Certificate(cert(unrelated)));
    let chain = PrivateKeyChain::new(
        b"key-1".as_slice(),
        PrivateKey::from_der(key).expect("a PKCS#8 key"),
        [cert(certificate)],
    );
    store.add_entry("client", KeyStoreEntry::PrivateKeyChain(chain));
    // Few iterations: the tests check the formats, not the key stretching.
    store
        .writer(password)
        .encryption_algorithm(encryption)
        .encryption_iterations(2048)
        .mac_algorithm(mac)
        .mac_iterations(2048)
        .write()
        .expect("a PKCS#12 file")
}

/// The schemes real .pfx files use: OpenSSL 3's default, and the two legacy ones (`openssl pkcs12 -legacy` and
/// Windows tools encrypt the key with 3DES and the certificates with 40-bit RC2), with the OIDs that show them.
const PFX_SCHEMES: [(EncryptionAlgorithm, MacAlgorithm, &[&[u8]]); 3] = [
    (
        EncryptionAlgorithm::PbeWithHmacSha256AndAes256,
        MacAlgorithm::HmacSha256,
        &[PBES2, AES_256_CBC],
    ),
    (
        EncryptionAlgorithm::PbeWithShaAnd3KeyTripleDesCbc,
        MacAlgorithm::HmacSha1,
        &[PBE_SHA1_3DES],
    ),
    (
        // The library's name says RC4; its OID is pbeWithSHAAnd40BitRC2-CBC, as the check below proves.
        EncryptionAlgorithm::PbeWithShaAnd40BitRc4Cbc,
        MacAlgorithm::HmacSha1,
        &[PBE_SHA1_RC2_40],
    ),
];

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
    assert_signed_by(&jwt, key.public_key_raw());
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
fn a_binary_file_that_is_not_pkcs12_names_what_is_read_and_how_to_convert() {
    // A certificate's DER starts with a SEQUENCE (0x30) as a .pfx file does, but is no PKCS#12 file.
    let (_, _, der) = rsa_certificate("pfx");
    let Err(error) = parse_pfx(&der) else {
        panic!("a bare DER certificate parsed");
    };
    let text = error.to_string();
    assert!(
        text.contains(".pfx") && text.contains(CONVERT_COMMAND),
        "{text}"
    );
}

#[test]
fn a_pfx_without_a_password_gives_the_pem_thumbprint_and_key_in_every_scheme() {
    let (key, cert) = rsa_identity("client");
    let (_, _, issuer) = rsa_certificate("issuer");
    let pem = parse(&format!("{}{}", cert.pem(), key.serialize_pem())).expect("the PEM parses");
    assert_eq!(pem.thumbprint_s256(), thumbprint_s256(cert.der()));
    for (encryption, mac, oids) in PFX_SCHEMES {
        let pfx = pkcs12_file(
            &key.serialize_der(),
            cert.der(),
            &issuer,
            "",
            encryption,
            mac,
        );
        for oid in oids {
            assert!(
                contains(&pfx, oid),
                "{encryption:?}: {oid:02x?} not in the file"
            );
        }
        let parsed = parse_pfx(&pfx).unwrap_or_else(|error| panic!("{encryption:?}: {error}"));
        assert_eq!(
            parsed.thumbprint_s256(),
            pem.thumbprint_s256(),
            "{encryption:?}"
        );
        assert_assertion_verifies(&parsed, pem.thumbprint_s256(), key.public_key_raw());
    }
}

#[test]
fn a_password_protected_pfx_is_refused_with_how_to_convert_it() {
    let (key, cert) = rsa_identity("client");
    let (_, _, issuer) = rsa_certificate("issuer");
    for (encryption, mac, _) in PFX_SCHEMES {
        let pfx = pkcs12_file(
            &key.serialize_der(),
            cert.der(),
            &issuer,
            "secret",
            encryption,
            mac,
        );
        let reason = reason_at(PFX_PATH, parse_pfx(&pfx));
        assert!(
            reason.contains("password-protected .pfx file is not supported")
                && reason.contains(CONVERT_COMMAND),
            "{encryption:?}: {reason}"
        );
    }
}

#[test]
fn unusable_pfx_files_say_what_is_wrong() {
    let (key, cert) = rsa_identity("client");
    let (_, _, other) = rsa_certificate("other");
    let ec_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("an EC key");
    let ec_cert = rcgen::CertificateParams::new(vec!["ec".to_owned()])
        .expect("params")
        .self_signed(&ec_key)
        .expect("an EC certificate");
    let aes = EncryptionAlgorithm::PbeWithHmacSha256AndAes256;
    let sha256 = MacAlgorithm::HmacSha256;

    let mut certificate_only = KeyStore::new();
    certificate_only.add_entry(
        "client",
        KeyStoreEntry::Certificate(
            p12_keystore::Certificate::from_der(cert.der()).expect("a certificate"),
        ),
    );
    let certificate_only = certificate_only.writer("").write().expect("a PKCS#12 file");
    // The key paired with a certificate of another key (the library does not check the pair).
    let foreign_certificate = pkcs12_file(&key.serialize_der(), &other, &other, "", aes, sha256);
    let ec = pkcs12_file(
        &ec_key.serialize_der(),
        ec_cert.der(),
        &other,
        "",
        aes,
        sha256,
    );
    for (file, expected) in [
        (certificate_only, "no private key"),
        (foreign_certificate, "does not belong"),
        (ec, "not an RSA key"),
    ] {
        let reason = reason_at(PFX_PATH, parse_pfx(&file));
        assert!(reason.contains(expected), "{expected:?} not in {reason:?}");
    }
}

#[test]
fn a_truncated_pfx_is_an_error_not_a_panic() {
    let (key, cert) = rsa_identity("client");
    let pfx = pkcs12_file(
        &key.serialize_der(),
        cert.der(),
        cert.der(),
        "",
        EncryptionAlgorithm::PbeWithHmacSha256AndAes256,
        MacAlgorithm::HmacSha256,
    );
    for length in (1..pfx.len()).step_by(37) {
        let reason = reason_at(PFX_PATH, parse_pfx(&pfx[..length]));
        assert!(reason.contains(".pfx"), "{length}: {reason}");
    }
}

/// Whether `openssl` can be run. Missing, the interoperability test fails unless VAULT_TESTS_WITHOUT_OPENSSL=1
/// says to skip it: a silent pass would hide that files made by a real tool were never read.
fn openssl_available() -> bool {
    let found = Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|output| output.status.success());
    if !found && std::env::var("VAULT_TESTS_WITHOUT_OPENSSL").as_deref() != Ok("1") {
        panic!(
            "openssl is not on PATH: this test reads .pfx files that OpenSSL writes; install it \
             (apt-get install openssl) or set VAULT_TESTS_WITHOUT_OPENSSL=1 to skip it"
        );
    }
    found
}

/// Runs `openssl` with `args` in `dir`; the file it wrote, or None (with its stderr printed) if it failed.
fn openssl(dir: &Path, args: &[&str], output: &str) -> Option<Vec<u8>> {
    let result = Command::new("openssl")
        .args(args)
        .args(["-out", output])
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    if !result.status.success() {
        eprintln!(
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&result.stderr)
        );
        return None;
    }
    Some(std::fs::read(dir.join(output)).expect("openssl wrote its output"))
}

#[test]
fn pfx_files_written_by_openssl_parse_like_their_pem() {
    if !openssl_available() {
        eprintln!("VAULT_TESTS_WITHOUT_OPENSSL=1: .pfx files written by OpenSSL are not tested");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let req: Vec<&str> =
        "req -x509 -newkey rsa:2048 -nodes -keyout key.pem -subj /CN=vault-test -days 1"
            .split(' ')
            .collect();
    let cert_pem = openssl(dir, &req, "cert.pem").expect("openssl makes a key and a certificate");
    let key_pem = std::fs::read(dir.join("key.pem")).expect("the key");
    let pem = ClientCertificate::parse(Path::new(PEM_PATH), &[cert_pem, key_pem].concat())
        .expect("the PEM parses");
    let public_key = pem.key.public_key().as_ref().to_vec();
    let export = |extra: &[&str], output: &str| {
        let args = [
            &["pkcs12", "-export", "-inkey", "key.pem", "-in", "cert.pem"][..],
            extra,
        ]
        .concat();
        openssl(dir, &args, output)
    };

    let default = export(&["-passout", "pass:"], "default.pfx").expect("openssl exports a .pfx");
    // OpenSSL 3's default; before 3.0 the default was the legacy scheme.
    assert!(
        (contains(&default, PBES2) && contains(&default, AES_256_CBC))
            || contains(&default, PBE_SHA1_3DES),
        "the default export uses neither PBES2 with AES nor 3DES"
    );
    let mut unprotected = vec![("default", default)];
    match export(&["-legacy", "-passout", "pass:"], "legacy.pfx") {
        Some(legacy) => {
            assert!(contains(&legacy, PBE_SHA1_3DES) && contains(&legacy, PBE_SHA1_RC2_40));
            unprotected.push(("-legacy", legacy));
        }
        None => eprintln!(
            "this openssl writes no -legacy files; the legacy schemes are tested with p12-keystore's only"
        ),
    }
    // No MAC at all: nothing to check the empty password against, the bags still decrypt with it.
    if let Some(no_mac) = export(&["-nomac", "-passout", "pass:"], "nomac.pfx") {
        unprotected.push(("-nomac", no_mac));
    }
    for (variant, pfx) in &unprotected {
        let parsed = parse_pfx(pfx).unwrap_or_else(|error| panic!("{variant}: {error}"));
        assert_eq!(parsed.thumbprint_s256(), pem.thumbprint_s256(), "{variant}");
        assert_assertion_verifies(&parsed, pem.thumbprint_s256(), &public_key);
    }

    let mut protected = vec![(
        "password",
        export(&["-passout", "pass:secret"], "password.pfx").expect("openssl exports a .pfx"),
    )];
    // Without a MAC the wrong password shows only when the bags do not decrypt.
    if let Some(no_mac) = export(&["-nomac", "-passout", "pass:secret"], "password-nomac.pfx") {
        protected.push(("password, -nomac", no_mac));
    }
    for (variant, pfx) in protected {
        let reason = reason_at(PFX_PATH, parse_pfx(&pfx));
        assert!(
            reason.contains("password-protected .pfx file is not supported")
                && reason.contains(CONVERT_COMMAND),
            "{variant}: {reason}"
        );
    }
}
