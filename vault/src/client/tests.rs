use std::time::{Duration, Instant};

use actions_client::SecretString;
use crds::appconfig::{CredentialsProblem, GitHubCredentials};

use super::*;
use crate::constants::reasons;

#[test]
fn tokens_are_refreshed_five_minutes_early_or_halfway_for_short_ones() {
    let t0 = Instant::now();
    assert_eq!(
        refresh_at(t0, Duration::from_secs(3600)),
        t0 + Duration::from_secs(3300)
    );
    assert_eq!(
        refresh_at(t0, Duration::from_secs(120)),
        t0 + Duration::from_secs(60)
    );
    assert_eq!(
        refresh_at(t0, Duration::from_secs(600)),
        t0 + Duration::from_secs(300)
    );
}

#[test]
fn expires_in_is_read_as_a_number_or_a_string() {
    assert_eq!(
        seconds(&serde_json::json!(3599)),
        Some(Duration::from_secs(3599))
    );
    assert_eq!(
        seconds(&serde_json::json!("3599")),
        Some(Duration::from_secs(3599))
    );
    assert_eq!(seconds(&serde_json::json!(0)), None);
    assert_eq!(seconds(&serde_json::json!(-5)), None);
    assert_eq!(seconds(&serde_json::json!(null)), None);
}

#[test]
fn app_config_json_is_validated_like_a_kubernetes_secret() {
    let app = parse_app_config(
        "gh",
        &SecretString::new(
            r#"{"github_app_id":"42","github_app_installation_id":7,"github_app_private_key":"pem"}"#,
        ),
    )
    .expect("valid");
    assert!(matches!(
        app,
        GitHubCredentials::App {
            installation_id: 7,
            ..
        }
    ));
    let token =
        parse_app_config("gh", &SecretString::new(r#"{"github_token":"ghp_x"}"#)).expect("valid");
    assert_eq!(token, GitHubCredentials::Token("ghp_x".to_owned()));

    for (value, problem) in [
        ("{}", CredentialsProblem::Missing),
        (
            r#"{"github_app_id":"42","github_app_private_key":"pem"}"#,
            CredentialsProblem::IncompleteApp,
        ),
        (
            r#"{"github_token":"t","github_app_id":"42","github_app_installation_id":7,"github_app_private_key":"pem"}"#,
            CredentialsProblem::Ambiguous,
        ),
    ] {
        match parse_app_config("gh", &SecretString::new(value)) {
            Err(err @ Error::ValidateAppConfig { .. }) => {
                assert!(
                    matches!(&err, Error::ValidateAppConfig { problem: p, .. } if *p == problem)
                );
                assert_eq!(err.reason(), reasons::SECRET_INVALID);
            }
            other => panic!("{value}: expected a validation error, got {other:?}"),
        }
    }
}

#[test]
fn unparseable_values_are_described_without_quoting_them() {
    for value in [
        "ghp_supersecret",
        r#""ghp_supersecret""#,
        r#"{"github_token": 12345678}"#,
        r#"{"github_app_installation_id":"ghp_supersecret"}"#,
        r#"{"github_token":"ghp_supersecret""#,
        r#"["ghp_supersecret", 1]"#,
    ] {
        match parse_app_config("gh", &SecretString::new(value)) {
            Err(err @ Error::ParseAppConfig { .. }) => {
                let text = err.to_string();
                assert!(!text.contains("supersecret"), "{text}");
                assert!(!text.contains("12345678"), "{text}");
                assert!(text.contains("secret gh"), "{text}");
                assert_eq!(err.reason(), reasons::SECRET_INVALID);
            }
            other => panic!("{value}: expected a parse error, got {other:?}"),
        }
    }
}

fn settings() -> KeyVaultSettings {
    KeyVaultSettings {
        url: "https://example.vault.azure.net/".to_owned(),
        tenant_id: "00000000-0000-0000-0000-000000000001".to_owned(),
        client_id: "00000000-0000-0000-0000-000000000002".to_owned(),
        certificate_path: "/etc/vault/cert.pem".into(),
    }
}

fn field(result: Result<KeyVaultClient>) -> &'static str {
    match result {
        Err(err @ Error::CheckSettings { .. }) => {
            assert_eq!(err.reason(), reasons::CONFIG_INVALID);
            match err {
                Error::CheckSettings { field, .. } => field,
                _ => unreachable!(),
            }
        }
        other => panic!("expected a settings error, got {other:?}"),
    }
}

#[test]
fn settings_are_checked_before_any_call() {
    let client = KeyVaultClient::new(settings(), Options::default()).expect("valid");
    assert_eq!(
        client.token_endpoint(),
        "https://login.microsoftonline.com/00000000-0000-0000-0000-000000000001/oauth2/v2.0/token"
    );
    let with = |edit: fn(&mut KeyVaultSettings)| {
        let mut s = settings();
        edit(&mut s);
        KeyVaultClient::new(s, Options::default())
    };
    assert_eq!(
        field(with(|s| s.url = "http://example.vault.azure.net".into())),
        "url"
    );
    assert_eq!(field(with(|s| s.url = "not a url".into())), "url");
    assert_eq!(
        field(with(|s| s.url = "https://v.example/?x=1".into())),
        "url"
    );
    assert_eq!(field(with(|s| s.tenant_id = String::new())), "tenantId");
    assert_eq!(field(with(|s| s.tenant_id = "a/b".into())), "tenantId");
    assert_eq!(field(with(|s| s.client_id = String::new())), "clientId");
    assert_eq!(
        field(with(|s| s.certificate_path = "".into())),
        "certificatePath"
    );
    let options = Options {
        authority_host: "http://login.example".into(),
        ..Options::default()
    };
    assert_eq!(
        field(KeyVaultClient::new(settings(), options)),
        "authorityHost"
    );
}

#[tokio::test]
async fn secret_names_are_checked_before_any_call() {
    let client = KeyVaultClient::new(settings(), Options::default()).expect("valid");
    for name in ["", "a/b", "a_b", &"x".repeat(128)] {
        match client.secret(name).await {
            Err(Error::CheckSettings { field, .. }) => assert_eq!(field, "githubConfigSecret"),
            other => panic!("{name:?}: expected a settings error, got {other:?}"),
        }
    }
}

#[test]
fn the_authority_host_can_come_from_the_environment() {
    let options = Options::from_lookup(|name| {
        (name == "AZURE_AUTHORITY_HOST").then(|| "https://login.microsoftonline.us/".to_owned())
    });
    assert_eq!(options.authority_host, "https://login.microsoftonline.us/");
    assert_eq!(
        Options::from_lookup(|_| Some("  ".to_owned())).authority_host,
        crate::constants::DEFAULT_AUTHORITY_HOST
    );
}

#[test]
fn proxy_credentials_are_a_json_object_of_strings() {
    let (user, password) = parse_proxy_credentials(
        "proxy",
        &SecretString::new(r#"{"username":"u","password":"p4ssw0rd-secret"}"#),
    )
    .expect("valid");
    assert_eq!(
        (user.as_str(), password.expose_secret()),
        ("u", "p4ssw0rd-secret")
    );
    for value in [
        "p4ssw0rd-secret",
        r#"{"password": 12345678}"#,
        r#"["p4ssw0rd-secret"]"#,
    ] {
        match parse_proxy_credentials("proxy", &SecretString::new(value)) {
            Err(err @ Error::ParseProxyCredentials { .. }) => {
                let text = err.to_string();
                assert!(
                    !text.contains("p4ssw0rd") && !text.contains("12345678"),
                    "{text}"
                );
                assert_eq!(err.reason(), reasons::SECRET_INVALID);
            }
            other => panic!("{value}: expected a parse error, got {other:?}"),
        }
    }
}

#[test]
fn the_challenge_names_the_scope_of_the_vaults_own_cloud() {
    let scope = |vault: &str, challenge: &str| challenge_scope(vault, challenge);
    assert_eq!(
        scope(
            "https://x.vault.azure.net",
            r#"Bearer authorization="https://login.microsoftonline.com/t", resource="https://vault.azure.net""#
        ),
        Ok("https://vault.azure.net/.default".to_owned())
    );
    assert_eq!(
        scope(
            "https://x.vault.azure.cn",
            r#"Bearer authorization="https://login.chinacloudapi.cn/t", resource="https://vault.azure.cn/""#
        ),
        Ok("https://vault.azure.cn/.default".to_owned())
    );
    // A `scope` parameter wins over `resource`.
    assert_eq!(
        scope(
            "https://x.vault.usgovcloudapi.net",
            r#"Bearer resource="https://ignored", scope="https://vault.usgovcloudapi.net/.default""#
        ),
        Ok("https://vault.usgovcloudapi.net/.default".to_owned())
    );
    // A private cloud's vault, within the resource's domain.
    assert_eq!(
        scope(
            "https://x.vault.azurestack.example",
            r#"Bearer resource="https://vault.azurestack.example""#
        ),
        Ok("https://vault.azurestack.example/.default".to_owned())
    );
}

#[test]
fn a_challenge_for_another_service_or_without_a_resource_is_refused() {
    let refused = |vault: &str, challenge: &str| challenge_scope(vault, challenge).is_err();
    assert!(refused(
        "https://x.vault.azure.net",
        r#"Bearer resource="https://management.azure.com""#
    ));
    assert!(refused(
        "https://x.vault.azure.net",
        r#"Bearer scope="https://graph.microsoft.com/.default""#
    ));
    // A name that merely ends like the resource is not within its domain.
    assert!(refused(
        "https://evilvault.example",
        r#"Bearer resource="https://vault.example""#
    ));
    assert!(refused(
        "https://x.vault.azure.net",
        r#"Bearer authorization="https://login""#
    ));
    assert!(refused("https://x.vault.azure.net", r#"Basic realm="x""#));
}
