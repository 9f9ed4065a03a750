//! Credentials from Azure Key Vault (`vaultConfig` type `azure_key_vault`) against a real API server, the fake
//! Actions Service and a fake Entra ID + Key Vault over HTTPS (tests/fake-azure): a set whose credentials live
//! only in the vault gets its scale set, a new secret version reaches the manager without a restart, and each
//! vault failure shows as `Ready=False` with its own reason and a Warning Event, never quoting a secret.

mod ars_support;

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ars_support::{CREDENTIALS, Env};
use crds::common::{AzureKeyVaultConfig, ProxyConfig, ProxyServerConfig, VaultConfig};
use fake_azure::{FakeAzure, Registration};
use k8s_openapi::api::core::v1::Secret;
use kube::api::DeleteParams;
use kube::{Api, ResourceExt};

const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
const CLIENT: &str = "0b6f5b52-8e2c-4d64-9d0b-1b2a3c4d5e6f";
/// The vault secret holding the app config; no Kubernetes Secret has this name.
const VAULT_SECRET: &str = "github-app-vault";
/// The token in the vault secret: it must never appear in a condition or an Event.
const TOKEN: &str = "ghp_vaultonlytoken0123456789";

struct Azure {
    dir: tempfile::TempDir,
    certificate_path: PathBuf,
    /// The client certificate's private key, PEM (must appear in no log line).
    key_pem: String,
    fake: FakeAzure,
}

async fn azure() -> Azure {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("an RSA key");
    let cert = rcgen::CertificateParams::new(vec!["arc-rs manager".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    let certificate_path = dir.path().join("client.pem");
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
    fake.set_secret(VAULT_SECRET, &format!(r#"{{"github_token":"{TOKEN}"}}"#));
    Azure {
        dir,
        certificate_path,
        key_pem: key.serialize_pem(),
        fake,
    }
}

impl Azure {
    fn vault_config(&self) -> VaultConfig {
        VaultConfig {
            type_: "azure_key_vault".to_owned(),
            azure_key_vault: Some(AzureKeyVaultConfig {
                url: self.fake.vault_url(),
                tenant_id: TENANT.to_owned(),
                client_id: CLIENT.to_owned(),
                certificate_path: self.certificate_path.display().to_string(),
            }),
            proxy: None,
        }
    }

    fn options(&self, env: &Env) -> controller::Options {
        let mut options = env.options();
        options.vault = vault::Options {
            authority_host: self.fake.authority_host(),
            call_timeout: Duration::from_secs(5),
            proxy: actions_client::ProxyConfig::Disabled,
            extra_root_certificates: Some(self.fake.ca_pem().to_owned()),
            ..vault::Options::default()
        };
        options
    }
}

/// An https proxy whose credentials are the vault secret `credentials` (the fake Actions Service is plain http on
/// loopback, so the proxy itself is never used; its credentials are still resolved).
fn proxy_with_vault_credentials(credentials: &str) -> Option<ProxyConfig> {
    Some(ProxyConfig {
        https: Some(ProxyServerConfig {
            url: "http://proxy.example:3128".to_owned(),
            credential_secret_ref: credentials.to_owned(),
        }),
        ..ProxyConfig::default()
    })
}

fn vault_spec(
    env: &Env,
    azure: &Azure,
    edit: impl FnOnce(&mut VaultConfig, &mut String),
) -> crds::AutoscalingRunnerSetSpec {
    let mut spec = env.runner_set_spec();
    let mut vault = azure.vault_config();
    let mut name = VAULT_SECRET.to_owned();
    edit(&mut vault, &mut name);
    spec.vault_config = Some(vault);
    spec.github_config_secret = name;
    spec
}

async fn config_json(env: &Env, listener: &str) -> serde_json::Value {
    let secret = env
        .controller_secrets()
        .get(&format!("{listener}-config"))
        .await
        .expect("config secret");
    let bytes = &secret.data.expect("data")["config.json"].0;
    serde_json::from_slice(bytes).expect("config.json is JSON")
}

/// Waits for `Ready=False/<reason>` with `message` in it and a Warning Event with that reason; neither may
/// quote the vault secret's token.
async fn assert_reported(env: &Env, set: &str, reason: &str, message: &str) {
    let ready = env
        .eventually(&format!("Ready=False/{reason} on {set}"), || async {
            env.condition(set, "Ready")
                .await
                .filter(|c| c.status == "False" && c.reason == reason)
        })
        .await;
    assert!(
        ready.message.contains(message),
        "{set}: the message {:?} does not say {message:?}",
        ready.message
    );
    assert!(!ready.message.contains(TOKEN), "{set}: {}", ready.message);
    let event = env
        .eventually(&format!("a {reason} Event on {set}"), || async {
            env.events(set, reason).await.into_iter().next()
        })
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"), "{set}");
    assert!(
        !event.message.as_deref().unwrap_or_default().contains(TOKEN),
        "{set}: {:?}",
        event.message
    );
}

/// Every formatted log line of this test binary at trace level (all crates), captured from the first call on.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture() -> Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED
        .get_or_init(|| {
            let captured = Captured::default();
            let writer = captured.clone();
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
                .with_writer(move || writer.clone())
                .with_ansi(false)
                .try_init()
                .expect("the only subscriber of this test binary");
            captured
        })
        .clone()
}

/// No captured log line holds the vault secret's token, an Entra ID access token (the fake issues them with the
/// prefix `fake-token-`), the client certificate's private key or a client assertion.
fn assert_no_vault_secret_in_logs(captured: &Captured, azure: &Azure) {
    let text = String::from_utf8_lossy(
        &captured
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
    .into_owned();
    assert!(text.contains(" TRACE "), "trace-level lines are captured");
    assert!(
        text.contains(&azure.fake.addr().to_string()),
        "the logs hold this test's calls to the fake vault"
    );
    let key_line = azure
        .key_pem
        .lines()
        .nth(3)
        .expect("a line of key material")
        .to_owned();
    let mut secrets = vec![
        ("vault secret token", TOKEN.to_owned()),
        ("Entra ID access token", "fake-token-".to_owned()),
        (
            "vault proxy password",
            "proxy-password-0123456789".to_owned(),
        ),
        ("client certificate key", key_line),
    ];
    for request in azure.fake.token_requests() {
        let signature = request.assertion.rsplit('.').next().unwrap_or_default();
        assert!(signature.len() > 100, "a signed assertion was recorded");
        secrets.push(("client assertion", signature[..60].to_owned()));
    }
    for (what, secret) in secrets {
        let leak = text.lines().find(|line| line.contains(&secret));
        assert!(leak.is_none(), "the {what} appears in a log line: {leak:?}");
    }
}

#[tokio::test]
async fn a_set_whose_credentials_live_only_in_the_vault_gets_its_scale_set() {
    let captured = capture();
    let env = Env::new("vault-ok").await;
    let azure = azure().await;
    // No Kubernetes Secret holds credentials.
    let secrets: Api<Secret> = env.ctx.api();
    secrets
        .delete(CREDENTIALS, &DeleteParams::default())
        .await
        .expect("delete the credentials Secret");
    // With a vault, the proxy's credentialSecretRef is a vault secret too (no Kubernetes Secret has that name).
    azure.fake.set_secret(
        "proxy-creds",
        r#"{"username":"u","password":"proxy-password-0123456789"}"#,
    );
    let manager = env.start(azure.options(&env));
    env.create_runner_set("vault-ok", vault_spec(&env, &azure, |_, _| {}))
        .await;
    // The manager's Actions client takes its proxy credentials from the vault as well (the listener's and the
    // runners' proxy Secrets still read Kubernetes Secrets, as in ARC, so this set gets no listener here).
    let mut spec = vault_spec(&env, &azure, |_, _| {});
    spec.proxy = proxy_with_vault_credentials("proxy-creds");
    env.create_runner_set("vault-proxy", spec).await;
    env.eventually("the scale set in the fake", || async {
        Some(env.scale_sets_named("vault-ok")).filter(|ids| !ids.is_empty())
    })
    .await;
    env.eventually("the proxied set's scale set in the fake", || async {
        Some(env.scale_sets_named("vault-proxy")).filter(|ids| !ids.is_empty())
    })
    .await;
    env.eventually("ScaleSetReady=True", || async {
        env.condition("vault-ok", "ScaleSetReady")
            .await
            .filter(|c| c.status == "True")
    })
    .await;
    let tokens = azure.fake.token_requests();
    assert!(!tokens.is_empty());
    assert!(
        tokens.iter().all(|t| t.outcome.is_ok()),
        "every assertion the manager sent was valid: {tokens:?}"
    );
    // Each vault client first asks for the vault's authentication challenge (no token, answered 401), which
    // names the token's scope; every secret read after it carries a valid token.
    let (challenges, reads): (Vec<_>, Vec<_>) = azure
        .fake
        .vault_requests()
        .into_iter()
        .partition(|r| r.secret == vault::constants::KEY_VAULT_CHALLENGE_PROBE);
    assert!(!challenges.is_empty() && challenges.iter().all(|r| r.status == 401));
    assert!(
        reads.iter().all(|r| r.token_valid && r.status == 200),
        "{reads:?}"
    );
    assert!(
        reads.iter().any(|r| r.secret == "proxy-creds"),
        "the proxy credentials were read from the vault: {reads:?}"
    );
    assert!(
        tokens.len() < reads.len(),
        "the token is reused across reads: {} tokens for {} reads",
        tokens.len(),
        reads.len()
    );

    // The listener's config names the vault and carries no credentials.
    let listener = env
        .eventually("the AutoscalingListener", || async {
            env.listeners()
                .list(&Default::default())
                .await
                .expect("list listeners")
                .items
                .into_iter()
                .find(|l| l.spec.autoscaling_runner_set_name == "vault-ok")
        })
        .await
        .name_any();
    let first = env
        .eventually("the listener pod", || async {
            env.controller_pods().get_opt(&listener).await.unwrap()
        })
        .await;
    let config = config_json(&env, &listener).await;
    assert_eq!(config["vault_type"], "azure_key_vault");
    assert_eq!(config["vault_lookup_key"], VAULT_SECRET);
    assert_eq!(
        config["azure_key_vault"]["url"],
        azure.fake.vault_url().as_str()
    );
    assert!(!config.to_string().contains(TOKEN), "{config}");
    // A new version in the vault restarts the listener (which reads the vault at start), without anyone
    // deleting a pod.
    azure.fake.set_secret(
        VAULT_SECRET,
        &format!(r#"{{"github_token":"{TOKEN}_rotated"}}"#),
    );
    env.eventually("a new listener pod", || async {
        let pod = env.controller_pods().get_opt(&listener).await.unwrap()?;
        (pod.uid() != first.uid()).then_some(())
    })
    .await;

    // A new version in the vault reaches the running manager: an unusable one shows at once on the next
    // periodic check, and a good one clears it.
    azure
        .fake
        .set_secret(VAULT_SECRET, r#"{"github_app_id":"1"}"#);
    assert_reported(
        &env,
        "vault-ok",
        "VaultSecretInvalid",
        "incomplete GitHub App credentials",
    )
    .await;
    azure
        .fake
        .set_secret(VAULT_SECRET, &format!(r#"{{"github_token":"{TOKEN}"}}"#));
    env.eventually("ScaleSetReady=True again", || async {
        env.condition("vault-ok", "ScaleSetReady")
            .await
            .filter(|c| c.status == "True")
    })
    .await;
    manager.stop().await;
    assert!(
        !azure.fake.token_requests().is_empty(),
        "the scan below covers real assertions"
    );
    assert_no_vault_secret_in_logs(&captured, &azure);
}

#[tokio::test]
async fn each_vault_failure_has_its_own_condition_and_event() {
    let captured = capture();
    let env = Env::new("vault-bad").await;
    let azure = azure().await;
    azure.fake.set_secret("not-json", TOKEN);
    azure.fake.set_secret("no-keys", "{}");
    azure.fake.set_secret("denied", "{}");
    azure.fake.deny_secret("denied");
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let manager = env.start(azure.options(&env));
    let absent = azure.dir.path().join("absent.pem").display().to_string();
    let cases: Vec<(&str, crds::AutoscalingRunnerSetSpec, &str, &str)> = vec![
        (
            "v-cert",
            vault_spec(&env, &azure, |v, _| {
                if let Some(a) = v.azure_key_vault.as_mut() {
                    a.certificate_path = absent.clone();
                }
            }),
            "VaultCertificateUnreadable",
            "absent.pem",
        ),
        (
            "v-tenant",
            vault_spec(&env, &azure, |v, _| {
                if let Some(a) = v.azure_key_vault.as_mut() {
                    a.tenant_id = "00000000-0000-0000-0000-000000000000".to_owned();
                }
            }),
            "VaultAuthenticationFailed",
            "check tenantId",
        ),
        (
            "v-client",
            vault_spec(&env, &azure, |v, _| {
                if let Some(a) = v.azure_key_vault.as_mut() {
                    a.client_id = "11111111-1111-1111-1111-111111111111".to_owned();
                }
            }),
            "VaultAuthenticationFailed",
            "check clientId",
        ),
        (
            "v-missing",
            vault_spec(&env, &azure, |_, name| *name = "absent-secret".to_owned()),
            "VaultSecretNotFound",
            "absent-secret",
        ),
        (
            "v-not-json",
            vault_spec(&env, &azure, |_, name| *name = "not-json".to_owned()),
            "VaultSecretInvalid",
            "not a JSON object",
        ),
        (
            "v-no-keys",
            vault_spec(&env, &azure, |_, name| *name = "no-keys".to_owned()),
            "VaultSecretInvalid",
            "no credentials",
        ),
        (
            "v-denied",
            vault_spec(&env, &azure, |_, name| *name = "denied".to_owned()),
            "VaultAccessDenied",
            CLIENT,
        ),
        (
            "v-down",
            vault_spec(&env, &azure, |v, _| {
                if let Some(a) = v.azure_key_vault.as_mut() {
                    a.url = format!("https://127.0.0.1:{closed}");
                }
            }),
            "VaultUnreachable",
            "127.0.0.1",
        ),
        (
            "v-proxy-missing",
            {
                let mut spec = vault_spec(&env, &azure, |_, _| {});
                spec.proxy = proxy_with_vault_credentials("absent-proxy-creds");
                spec
            },
            "VaultSecretNotFound",
            "absent-proxy-creds",
        ),
        (
            "v-proxy-invalid",
            {
                let mut spec = vault_spec(&env, &azure, |_, _| {});
                spec.proxy = proxy_with_vault_credentials("not-json");
                spec
            },
            "VaultSecretInvalid",
            "proxy credentials",
        ),
        (
            "v-no-azure",
            vault_spec(&env, &azure, |v, _| v.azure_key_vault = None),
            "VaultConfigInvalid",
            "azureKeyVault",
        ),
    ];
    for (name, spec, _, _) in &cases {
        env.create_runner_set(name, spec.clone()).await;
    }
    for (name, _, reason, message) in &cases {
        assert_reported(&env, name, reason, message).await;
        assert!(env.scale_sets_named(name).is_empty(), "{name}");
    }
    manager.stop().await;
    assert_no_vault_secret_in_logs(&captured, &azure);
}
