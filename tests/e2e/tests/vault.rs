//! End to end with Azure Key Vault: a scale set installed from the chart with `keyVault` values, whose GitHub
//! credentials exist only in a fake Key Vault (tests/fake-azure, real HTTPS, checking every client assertion
//! and bearer token). The manager (in-process) and the real listener process (run by the listener-pod executor,
//! its environment from the chart's `listenerTemplate`) both sign in to the fake Entra ID with the same
//! certificate file and read the vault secret; jobs run, and the set settles back to its minimum.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use e2e::checks;
use e2e::world::{GITHUB_TOKEN, World, WorldConfig};
use fake_azure::{FakeAzure, Registration};
use serde_json::json;

const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
const CLIENT: &str = "0b6f5b52-8e2c-4d64-9d0b-1b2a3c4d5e6f";
/// The vault secret named by `githubConfigSecret`; no Kubernetes Secret holds the credentials.
const VAULT_SECRET: &str = "github-app-vault";
const WAIT: Duration = Duration::from_secs(300);

/// The fake's authority host and CA, for the manager's options (`WorldConfig::tune` is a plain function).
static AZURE: OnceLock<(String, String)> = OnceLock::new();

fn tune(options: &mut controller::Options) {
    let (authority_host, ca_pem) = AZURE.get().expect("the fake Azure runs").clone();
    options.vault = vault::Options {
        authority_host,
        proxy: actions_client::ProxyConfig::Disabled,
        extra_root_certificates: Some(ca_pem),
        ..vault::Options::default()
    };
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scale_set_with_key_vault_credentials_runs_jobs() {
    e2e::init_test_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("an RSA key");
    let cert = rcgen::CertificateParams::new(vec!["arc-rs e2e".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    let certificate_path: PathBuf = dir.path().join("client.pem");
    std::fs::write(
        &certificate_path,
        format!("{}{}", cert.pem(), key.serialize_pem()),
    )
    .expect("write the certificate file");
    let fake = FakeAzure::start(vec![Registration {
        tenant_id: TENANT.to_owned(),
        client_id: CLIENT.to_owned(),
        certificate_der: cert.der().to_vec(),
    }])
    .await
    .expect("the fake Azure starts");
    fake.set_secret(
        VAULT_SECRET,
        &format!(r#"{{"github_token":"{GITHUB_TOKEN}"}}"#),
    );
    let ca_path = dir.path().join("fake-azure-ca.pem");
    std::fs::write(&ca_path, fake.ca_pem()).expect("write the CA");
    AZURE
        .set((fake.authority_host(), fake.ca_pem().to_owned()))
        .expect("one world per test binary");

    let world = World::start(
        "e2e-vault",
        WorldConfig {
            values: json!({
                "githubConfigSecret": VAULT_SECRET,
                "keyVault": {
                    "type": "azure_key_vault",
                    "azureKeyVault": {
                        "url": fake.vault_url(),
                        "tenantId": TENANT,
                        "clientId": CLIENT,
                        "certificatePath": certificate_path.display().to_string(),
                    },
                },
                // The listener process finds the fake Entra ID and trusts the fake's CA the way a pod would be
                // told to: AZURE_AUTHORITY_HOST, and SSL_CERT_FILE for the system roots.
                "listenerTemplate": {"spec": {"containers": [{
                    "name": "listener",
                    "env": [
                        {"name": "AZURE_AUTHORITY_HOST", "value": fake.authority_host()},
                        {"name": "SSL_CERT_FILE", "value": ca_path.display().to_string()},
                    ],
                }]}},
                "maxRunners": 5,
            }),
            tune,
            ..WorldConfig::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("starting the world: {e:?}"));
    let rendered = world
        .rendered
        .iter()
        .find(|o| o["kind"] == "AutoscalingRunnerSet")
        .expect("an AutoscalingRunnerSet");
    assert_eq!(
        rendered["spec"]["vaultConfig"]["type"], "azure_key_vault",
        "the chart renders keyVault"
    );
    assert!(
        !world
            .rendered
            .iter()
            .any(|o| o["kind"] == "Secret" && o.to_string().contains(GITHUB_TOKEN)),
        "no Secret holds the credentials"
    );
    if let Err(error) = world.wait_listening(WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    let ids = world.enqueue(6).expect("enqueue");
    if let Err(error) = world.wait_jobs_completed(&ids, WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    // Both the manager and the listener signed in: one token per process at least, all assertions valid,
    // every vault read with a valid token.
    let tokens = fake.token_requests();
    assert!(tokens.len() >= 2, "manager and listener: {tokens:?}");
    assert!(tokens.iter().all(|t| t.outcome.is_ok()), "{tokens:?}");
    // Every read carries a valid token; the requests without one asked for the vault's authentication challenge.
    let reads: Vec<_> = fake
        .vault_requests()
        .into_iter()
        .filter(|r| r.secret != vault::constants::KEY_VAULT_CHALLENGE_PROBE)
        .collect();
    assert!(
        reads.iter().all(|r| r.token_valid && r.status == 200),
        "{reads:?}"
    );
    if let Err(error) = checks::settle_and_verify(&world, 0, &[], WAIT).await {
        panic!("{error}\n{}", world.diagnostics().await);
    }
    world.shutdown().await.expect("shutdown");
}
