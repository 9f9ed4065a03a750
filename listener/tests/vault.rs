//! The listener's credentials from Azure Key Vault (`vault_type` azure_key_vault in the config the manager
//! writes), against a fake Entra ID and Key Vault over HTTPS (tests/fake-azure): the config validates without
//! inline credentials, the vault secret's JSON becomes the credentials, and a failure is an error carrying the
//! vault reason and never the secret.

use std::path::{Path, PathBuf};
use std::time::Duration;

use actions_client::Credentials;
use fake_azure::{FakeAzure, Registration};
use listener::Config;
use listener::app::resolve_credentials;
use serde_json::json;

const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
const CLIENT: &str = "0b6f5b52-8e2c-4d64-9d0b-1b2a3c4d5e6f";
const TOKEN: &str = "ghp_listenervaulttoken42";

async fn azure(dir: &Path) -> (FakeAzure, PathBuf) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("an RSA key");
    let cert = rcgen::CertificateParams::new(vec!["arc-rs listener".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    let path = dir.join("client.pem");
    std::fs::write(&path, format!("{}{}", key.serialize_pem(), cert.pem())).expect("write");
    let fake = FakeAzure::start(vec![Registration {
        tenant_id: TENANT.to_owned(),
        client_id: CLIENT.to_owned(),
        certificate_der: cert.der().to_vec(),
    }])
    .await
    .expect("the fake Azure starts");
    (fake, path)
}

/// The listener config the manager writes for a set with `vaultConfig` (no inline credentials).
fn config(fake: &FakeAzure, certificate: &Path, lookup_key: &str) -> Config {
    let value = json!({
        "configure_url": "https://github.com/acme",
        "vault_type": "azure_key_vault",
        "vault_lookup_key": lookup_key,
        "azure_key_vault": {
            "tenant_id": TENANT,
            "client_id": CLIENT,
            "url": fake.vault_url(),
            "certificate_path": certificate.to_str().expect("utf-8 path"),
        },
        "ephemeral_runner_set_namespace": "arc-runners",
        "ephemeral_runner_set_name": "linux-x64-7f9c2",
        "max_runners": 10,
        "min_runners": 0,
        "runner_scale_set_id": 17,
        "runner_scale_set_name": "linux-x64",
        "server_root_ca": "",
        "log_level": "debug",
        "log_format": "text",
        "metrics_addr": "",
        "metrics_endpoint": "",
        "metrics": null
    });
    let config = Config::decode(value.to_string().as_bytes()).expect("decodes");
    config
        .validate()
        .expect("a vault config needs no inline credentials");
    config
}

fn options(fake: &FakeAzure) -> vault::Options {
    vault::Options {
        authority_host: fake.authority_host(),
        call_timeout: Duration::from_secs(5),
        proxy: actions_client::ProxyConfig::Disabled,
        extra_root_certificates: Some(fake.ca_pem().to_owned()),
        ..vault::Options::default()
    }
}

#[tokio::test]
async fn the_credentials_come_from_the_vault_secret_named_by_the_lookup_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (fake, certificate) = azure(dir.path()).await;
    fake.set_secret("gh-token", &format!(r#"{{"github_token":"{TOKEN}"}}"#));
    fake.set_secret(
        "gh-app",
        r#"{"github_app_id":"Iv1.abc","github_app_installation_id":99,"github_app_private_key":"pem"}"#,
    );

    let token = resolve_credentials(&config(&fake, &certificate, "gh-token"), options(&fake))
        .await
        .expect("resolves");
    match token {
        Credentials::Pat(secret) => assert_eq!(secret.expose_secret(), TOKEN),
        other => panic!("expected a PAT, got {other:?}"),
    }
    let app = resolve_credentials(&config(&fake, &certificate, "gh-app"), options(&fake))
        .await
        .expect("resolves");
    match app {
        Credentials::App(app) => {
            assert_eq!(
                (app.client_id.as_str(), app.installation_id),
                ("Iv1.abc", 99)
            );
        }
        other => panic!("expected an App, got {other:?}"),
    }
    assert!(
        fake.token_requests().iter().all(|t| t.outcome.is_ok()),
        "the fake accepted every assertion"
    );
}

#[tokio::test]
async fn a_vault_failure_names_its_reason_and_never_the_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (fake, certificate) = azure(dir.path()).await;
    fake.set_secret("partial", &format!(r#"{{"github_app_id":"{TOKEN}"}}"#));
    for (key, reason) in [
        ("absent", "VaultSecretNotFound"),
        ("partial", "VaultSecretInvalid"),
    ] {
        let err = resolve_credentials(&config(&fake, &certificate, key), options(&fake))
            .await
            .expect_err("fails");
        assert!(
            matches!(&err, listener::Error::ReadVaultCredentials(e) if e.reason() == reason),
            "{key}: {err:?}"
        );
        let chain = listener::listener::error_chain(&err);
        assert!(chain.contains(reason) && !chain.contains(TOKEN), "{chain}");
        assert_eq!(err.severity(), listener::Severity::Unrecoverable);
    }
}
