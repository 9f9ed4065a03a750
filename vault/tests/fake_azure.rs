//! The vault client against a fake Entra ID token endpoint and a fake Key Vault over real HTTPS
//! (tests/fake-azure): the fake verifies the client assertion's signature against the registered certificate and
//! its claims, and the bearer token on every vault call.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use actions_client::{ProxyConfig, ProxyServer, ProxySettings};
use crds::appconfig::{CredentialsProblem, GitHubCredentials};
use fake_azure::{FakeAzure, Registration, VaultRequest};
use vault::certificate::{ClientCertificate, new_jti};
use vault::constants::{KEY_VAULT_CHALLENGE_PROBE, reasons};
use vault::{Error, KeyVaultClient, KeyVaultSettings, Options};

const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
const CLIENT: &str = "0b6f5b52-8e2c-4d64-9d0b-1b2a3c4d5e6f";
const SECRET_NAME: &str = "github-app";
const PRIVATE_KEY: &str =
    "-----BEGIN RSA PRIVATE KEY-----\\nMIIsecretkeymaterial\\n-----END RSA PRIVATE KEY-----";

fn app_json(installation: i64) -> String {
    format!(
        r#"{{"github_app_id":"123","github_app_installation_id":{installation},"github_app_private_key":"{PRIVATE_KEY}"}}"#
    )
}

struct World {
    _dir: tempfile::TempDir,
    certificate_path: PathBuf,
    certificate_der: Vec<u8>,
    fake: FakeAzure,
}

/// Writes a client certificate file (certificate then key) and starts the fake with it registered.
async fn world() -> World {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, der) = write_certificate(&dir, "client.pem");
    let fake = FakeAzure::start(vec![Registration {
        tenant_id: TENANT.to_owned(),
        client_id: CLIENT.to_owned(),
        certificate_der: der.clone(),
    }])
    .await
    .expect("the fake starts");
    fake.set_secret(SECRET_NAME, &app_json(7));
    World {
        _dir: dir,
        certificate_path: path,
        certificate_der: der,
        fake,
    }
}

fn write_certificate(dir: &tempfile::TempDir, name: &str) -> (PathBuf, Vec<u8>) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("an RSA key");
    let cert = rcgen::CertificateParams::new(vec!["arc-rs vault client".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    let path = dir.path().join(name);
    std::fs::write(&path, format!("{}{}", cert.pem(), key.serialize_pem())).expect("write");
    (path, cert.der().to_vec())
}

impl World {
    fn settings(&self) -> KeyVaultSettings {
        KeyVaultSettings {
            url: self.fake.vault_url(),
            tenant_id: TENANT.to_owned(),
            client_id: CLIENT.to_owned(),
            certificate_path: self.certificate_path.clone(),
        }
    }

    fn options(&self) -> Options {
        Options {
            authority_host: self.fake.authority_host(),
            call_timeout: Duration::from_secs(5),
            proxy: ProxyConfig::Disabled,
            extra_root_certificates: Some(self.fake.ca_pem().to_owned()),
            ..Options::default()
        }
    }

    fn client(&self) -> KeyVaultClient {
        KeyVaultClient::new(self.settings(), self.options()).expect("a client")
    }

    fn client_with(
        &self,
        edit: impl FnOnce(&mut KeyVaultSettings, &mut Options),
    ) -> KeyVaultClient {
        let mut settings = self.settings();
        let mut options = self.options();
        edit(&mut settings, &mut options);
        KeyVaultClient::new(settings, options).expect("a client")
    }
}

/// The error, after checking that its message carries no secret.
/// The vault requests that read a secret, without the one that asked for the authentication challenge.
fn secret_reads(world: &World) -> Vec<VaultRequest> {
    world
        .fake
        .vault_requests()
        .into_iter()
        .filter(|r| r.secret != KEY_VAULT_CHALLENGE_PROBE)
        .collect()
}

fn failure<T: std::fmt::Debug>(result: Result<T, Error>) -> Error {
    let err = result.expect_err("expected an error");
    let text = format!("{err} {err:?}");
    for secret in ["MIIsecretkeymaterial", "fake-token-", "PRIVATE KEY-----\n"] {
        assert!(!text.contains(secret), "secret material in {text}");
    }
    err
}

#[tokio::test]
async fn credentials_come_from_the_vault_and_the_token_is_reused() {
    let world = world().await;
    let client = world.client();
    let credentials = client.github_credentials(SECRET_NAME).await.expect("reads");
    assert_eq!(
        credentials,
        GitHubCredentials::App {
            app_id: "123".to_owned(),
            installation_id: 7,
            private_key: PRIVATE_KEY.replace("\\n", "\n"),
        }
    );
    client
        .github_credentials(SECRET_NAME)
        .await
        .expect("reads again");

    let tokens = world.fake.token_requests();
    assert_eq!(tokens.len(), 1, "one token for both reads: {tokens:?}");
    assert_eq!(tokens[0].outcome, Ok(0), "the fake accepted the assertion");
    let header = tokens[0].header.as_ref().expect("a header");
    assert_eq!(header["alg"], "PS256");
    let thumbprint = vault::certificate::thumbprint_s256(&world.certificate_der);
    assert_eq!(header["x5t#S256"], thumbprint.as_str());
    let claims = tokens[0].claims.as_ref().expect("claims");
    assert_eq!(claims["aud"], client.token_endpoint());
    assert_eq!(claims["iss"], CLIENT);
    assert_eq!(claims["sub"], CLIENT);
    // The scope is the one the vault's challenge named, asked once, without a token, before the first token.
    assert_eq!(tokens[0].scope, "https://vault.azure.net/.default");
    let vault = world.fake.vault_requests();
    assert_eq!(vault.len(), 3, "{vault:?}");
    assert!(
        vault[0].secret == KEY_VAULT_CHALLENGE_PROBE
            && !vault[0].token_valid
            && vault[0].status == 401,
        "{vault:?}"
    );
    assert!(
        vault[1..].iter().all(|r| r.token_valid && r.status == 200),
        "{vault:?}"
    );
}

/// A vault of another cloud names its own Key Vault resource in its challenge, and only tokens for that resource
/// open it: the client asks for that scope (Azure's SDKs do the same), not the public cloud's.
#[tokio::test]
async fn a_vault_in_another_cloud_gets_a_token_for_its_own_resource() {
    let world = world().await;
    world.fake.set_vault_resource("https://vault.azure.cn");
    let client = world.client();
    client
        .github_credentials(SECRET_NAME)
        .await
        .expect("reads from the other cloud's vault");
    let tokens = world.fake.token_requests();
    assert_eq!(tokens.len(), 1);
    assert_eq!(tokens[0].scope, "https://vault.azure.cn/.default");
    assert_eq!(tokens[0].outcome, Ok(0));
}

/// A challenge that names another service's resource (here Azure's management API) is refused before any token
/// is requested: a vault URL must not make the client fetch a token it would then send to that URL.
#[tokio::test]
async fn a_challenge_for_another_service_is_refused_before_any_token_request() {
    let world = world().await;
    world
        .fake
        .set_vault_resource("https://management.azure.com");
    let err = failure(world.client().secret(SECRET_NAME).await);
    assert!(matches!(err, Error::ReadChallenge { .. }), "{err:?}");
    assert_eq!(err.reason(), reasons::CONFIG_INVALID);
    assert!(err.to_string().contains("management.azure.com"), "{err}");
    assert!(world.fake.token_requests().is_empty());
    assert!(secret_reads(&world).is_empty());
}

#[tokio::test]
async fn a_new_secret_version_is_read_on_the_next_call() {
    let world = world().await;
    let client = world.client();
    let first = client.github_credentials(SECRET_NAME).await.expect("reads");
    world.fake.set_secret(SECRET_NAME, &app_json(8));
    let second = client.github_credentials(SECRET_NAME).await.expect("reads");
    assert!(matches!(
        first,
        GitHubCredentials::App {
            installation_id: 7,
            ..
        }
    ));
    assert!(matches!(
        second,
        GitHubCredentials::App {
            installation_id: 8,
            ..
        }
    ));
}

#[tokio::test]
async fn a_short_lived_token_is_replaced_before_it_expires() {
    let world = world().await;
    world.fake.set_token_lifetime(Duration::from_secs(2));
    let client = world.client();
    client.secret(SECRET_NAME).await.expect("reads");
    client.secret(SECRET_NAME).await.expect("reads");
    assert_eq!(world.fake.token_requests().len(), 1);
    // Halfway through a 2 s life the token is replaced, so the vault never sees an expired one.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    client.secret(SECRET_NAME).await.expect("reads");
    assert_eq!(world.fake.token_requests().len(), 2);
    assert!(secret_reads(&world).iter().all(|r| r.token_valid));
}

#[tokio::test]
async fn a_revoked_token_is_replaced_once() {
    let world = world().await;
    let client = world.client();
    client.secret(SECRET_NAME).await.expect("reads");
    world.fake.revoke_tokens();
    client
        .secret(SECRET_NAME)
        .await
        .expect("reads with a fresh token");
    let statuses: Vec<u16> = secret_reads(&world).iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 401, 200]);
    assert_eq!(world.fake.token_requests().len(), 2);
}

#[tokio::test]
async fn the_proxy_carries_both_calls() {
    let world = world().await;
    let proxy = fake_azure::ConnectProxy::start(world.fake.addr())
        .await
        .expect("proxy");
    let port = world.fake.addr().port();
    let client = world.client_with(|settings, options| {
        settings.url = format!("https://{}:{port}", fake_azure::VAULT_HOST);
        options.authority_host = format!("https://{}:{port}/", fake_azure::LOGIN_HOST);
        options.proxy = ProxyConfig::Explicit(ProxySettings {
            https: Some(ProxyServer::new(proxy.url())),
            ..ProxySettings::default()
        });
    });
    client
        .github_credentials(SECRET_NAME)
        .await
        .expect("reads through the proxy");
    let seen = proxy.requests();
    assert!(
        seen.iter()
            .any(|h| h.starts_with(&format!("CONNECT {}:{port} ", fake_azure::LOGIN_HOST))),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|h| h.starts_with(&format!("CONNECT {}:{port} ", fake_azure::VAULT_HOST))),
        "{seen:?}"
    );
    // The assertion's audience is the endpoint as the client named it, and the fake checked it.
    assert_eq!(world.fake.token_requests()[0].outcome, Ok(0));
}

#[tokio::test]
async fn a_missing_certificate_file_is_reported_before_any_call() {
    let world = world().await;
    let client =
        world.client_with(|settings, _| settings.certificate_path.set_file_name("absent.pem"));
    let err = failure(client.secret(SECRET_NAME).await);
    assert!(matches!(err, Error::ReadCertificate { .. }), "{err:?}");
    assert_eq!(err.reason(), reasons::CERTIFICATE_UNREADABLE);
    assert!(err.to_string().contains("absent.pem"), "{err}");
    assert!(world.fake.token_requests().is_empty());
}

#[tokio::test]
async fn a_certificate_file_without_a_key_is_invalid() {
    let world = world().await;
    let text = std::fs::read_to_string(&world.certificate_path).expect("read");
    let cert_only = text
        .split("-----BEGIN PRIVATE KEY-----")
        .next()
        .expect("cert part")
        .to_owned();
    std::fs::write(&world.certificate_path, cert_only).expect("write");
    let err = failure(world.client().secret(SECRET_NAME).await);
    assert!(matches!(err, Error::ParseCertificate { .. }), "{err:?}");
    assert_eq!(err.reason(), reasons::CERTIFICATE_INVALID);
}

fn rejection(err: &Error) -> Vec<u64> {
    match err {
        Error::TokenRejected(rejection) => rejection.codes.clone(),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn an_unregistered_certificate_is_rejected_by_its_thumbprint() {
    let world = world().await;
    let (other, _) = write_certificate(&world._dir, "other.pem");
    let err = failure(
        world
            .client_with(|s, _| s.certificate_path = other)
            .secret(SECRET_NAME)
            .await,
    );
    assert_eq!(rejection(&err), [700027]);
    assert_eq!(err.reason(), reasons::AUTHENTICATION_FAILED);
    assert!(err.to_string().contains("upload this certificate"), "{err}");
    assert!(secret_reads(&world).is_empty());
}

#[tokio::test]
async fn an_unknown_tenant_or_client_is_rejected_naming_the_setting() {
    let world = world().await;
    let err = failure(
        world
            .client_with(|s, _| s.tenant_id = "00000000-0000-0000-0000-000000000000".into())
            .secret(SECRET_NAME)
            .await,
    );
    assert_eq!(rejection(&err), [90002]);
    assert!(err.to_string().contains("check tenantId"), "{err}");

    let err = failure(
        world
            .client_with(|s, _| s.client_id = "11111111-1111-1111-1111-111111111111".into())
            .secret(SECRET_NAME)
            .await,
    );
    assert_eq!(rejection(&err), [700016]);
    assert!(err.to_string().contains("check clientId"), "{err}");
    assert_eq!(err.reason(), reasons::AUTHENTICATION_FAILED);
}

/// Posts a hand-made token request to the fake, for its checks that the client never trips.
async fn post_assertion(world: &World, assertion: &str) -> (u16, serde_json::Value) {
    let http = reqwest::Client::builder()
        .tls_certs_merge(
            reqwest::Certificate::from_pem_bundle(world.fake.ca_pem().as_bytes()).expect("ca"),
        )
        .build()
        .expect("http");
    let form = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("client_id", CLIENT)
        .append_pair("scope", "https://vault.azure.net/.default")
        .append_pair("grant_type", "client_credentials")
        .append_pair(
            "client_assertion_type",
            "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
        )
        .append_pair("client_assertion", assertion)
        .finish();
    let response = http
        .post(format!(
            "{}{TENANT}/oauth2/v2.0/token",
            world.fake.authority_host()
        ))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .expect("an answer");
    let status = response.status().as_u16();
    (status, response.json().await.expect("json"))
}

#[tokio::test]
async fn the_fake_checks_signature_audience_and_replay() {
    let world = world().await;
    let endpoint = format!("{}{TENANT}/oauth2/v2.0/token", world.fake.authority_host());
    let certificate = ClientCertificate::load(&world.certificate_path)
        .await
        .expect("loads");

    // A valid assertion is accepted once; the same jti again is a replay.
    let good = certificate
        .assertion(CLIENT, &endpoint, SystemTime::now(), &new_jti())
        .expect("signs");
    assert_eq!(post_assertion(&world, &good).await.0, 200);
    let (status, body) = post_assertion(&world, &good).await;
    assert_eq!(
        (status, body["error_codes"][0].as_u64()),
        (401, Some(7000215))
    );

    // Another tenant's endpoint as audience.
    let wrong_aud = certificate
        .assertion(
            CLIENT,
            "https://login.microsoftonline.com/other/oauth2/v2.0/token",
            SystemTime::now(),
            &new_jti(),
        )
        .expect("signs");
    let (status, body) = post_assertion(&world, &wrong_aud).await;
    assert_eq!(
        (status, body["error_codes"][0].as_u64()),
        (401, Some(700027)),
        "{body}"
    );

    // Expired (issued two hours ago).
    let old = certificate
        .assertion(
            CLIENT,
            &endpoint,
            SystemTime::now() - Duration::from_secs(7200),
            &new_jti(),
        )
        .expect("signs");
    let (status, body) = post_assertion(&world, &old).await;
    assert_eq!(
        (status, body["error_codes"][0].as_u64()),
        (401, Some(700024)),
        "{body}"
    );

    // The registered certificate's thumbprint, but the signature of another key.
    let (other_path, _) = write_certificate(&world._dir, "rogue.pem");
    let rogue = ClientCertificate::load(&other_path).await.expect("loads");
    let forged = rogue
        .assertion(CLIENT, &endpoint, SystemTime::now(), &new_jti())
        .expect("signs");
    let mut parts: Vec<String> = forged.split('.').map(str::to_owned).collect();
    parts[0] = good.split('.').next().expect("header").to_owned();
    let (status, body) = post_assertion(&world, &parts.join(".")).await;
    assert_eq!(
        (status, body["error_codes"][0].as_u64()),
        (401, Some(700027)),
        "{body}"
    );
    assert!(
        body["error_description"]
            .as_str()
            .unwrap_or_default()
            .contains("InvalidSignature"),
        "{body}"
    );
}

#[tokio::test]
async fn the_vault_rejects_a_request_without_a_token_it_issued() {
    let world = world().await;
    let http = reqwest::Client::builder()
        .tls_certs_merge(
            reqwest::Certificate::from_pem_bundle(world.fake.ca_pem().as_bytes()).expect("ca"),
        )
        .build()
        .expect("http");
    let response = http
        .get(format!(
            "{}/secrets/{SECRET_NAME}?api-version=7.4",
            world.fake.vault_url()
        ))
        .bearer_auth("made-up")
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status().as_u16(), 401);
    assert!(response.headers().contains_key("www-authenticate"));
}

#[tokio::test]
async fn a_missing_secret_and_a_denied_secret_have_their_own_reasons() {
    let world = world().await;
    let client = world.client();
    let err = failure(client.secret("absent").await);
    assert!(
        matches!(err, Error::SecretNotFound { ref code, .. } if code == "SecretNotFound"),
        "{err:?}"
    );
    assert_eq!(err.reason(), reasons::SECRET_NOT_FOUND);

    world.fake.deny_secret(SECRET_NAME);
    let err = failure(client.secret(SECRET_NAME).await);
    assert!(
        matches!(err, Error::SecretAccessDenied { status: 403, .. }),
        "{err:?}"
    );
    assert_eq!(err.reason(), reasons::ACCESS_DENIED);
    assert!(
        err.to_string().contains(CLIENT),
        "names the client to grant access to: {err}"
    );
}

#[tokio::test]
async fn an_invalid_secret_value_is_reported_without_quoting_it() {
    let world = world().await;
    let client = world.client();
    world.fake.set_secret(SECRET_NAME, "MIIsecretkeymaterial");
    let err = failure(client.github_credentials(SECRET_NAME).await);
    assert!(matches!(err, Error::ParseAppConfig { .. }), "{err:?}");
    assert_eq!(err.reason(), reasons::SECRET_INVALID);

    world.fake.set_secret(
        SECRET_NAME,
        r#"{"github_app_id":"123","github_app_private_key":"MIIsecretkeymaterial"}"#,
    );
    let err = failure(client.github_credentials(SECRET_NAME).await);
    assert!(
        matches!(
            err,
            Error::ValidateAppConfig {
                problem: CredentialsProblem::IncompleteApp,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.reason(), reasons::SECRET_INVALID);
}

async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    listener.local_addr().expect("addr").port()
}

#[tokio::test]
async fn unreachable_endpoints_are_transient_and_say_which() {
    let world = world().await;
    let port = closed_port().await;
    let err = failure(
        world
            .client_with(|_, o| o.authority_host = format!("https://127.0.0.1:{port}/"))
            .secret(SECRET_NAME)
            .await,
    );
    assert!(matches!(err, Error::RequestToken { .. }), "{err:?}");
    assert_eq!(err.reason(), reasons::UNREACHABLE);
    assert!(err.is_transient());

    let err = failure(
        world
            .client_with(|s, _| s.url = format!("https://127.0.0.1:{port}"))
            .secret(SECRET_NAME)
            .await,
    );
    assert!(matches!(err, Error::ReadSecret { .. }), "{err:?}");
    assert_eq!(err.reason(), reasons::UNREACHABLE);

    // A server whose certificate is not trusted is not talked to (the vault, asked first for its challenge).
    let err = failure(
        world
            .client_with(|_, o| o.extra_root_certificates = None)
            .secret(SECRET_NAME)
            .await,
    );
    assert!(matches!(err, Error::ReadSecret { .. }), "{err:?}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
}

#[tokio::test]
async fn every_call_has_a_deadline() {
    let world = world().await;
    // Accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let _hold = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let client = world.client_with(|_, o| {
        o.authority_host = format!("https://127.0.0.1:{port}/");
        o.call_timeout = Duration::from_millis(500);
    });
    let started = Instant::now();
    let err = failure(client.secret(SECRET_NAME).await);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, Error::RequestToken { .. }), "{err:?}");
    assert_eq!(err.reason(), reasons::UNREACHABLE);
}
