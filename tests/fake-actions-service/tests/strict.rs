//! Strict mode: configured PATs and GitHub App keys only, with GitHub's status codes. The App key is generated
//! at test time.

mod common;

use common::{fast_config, json_body, start};
use fake_actions_service::{Config, GitHubApp, StrictAuth};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::json;

struct AppKey {
    private_pem: String,
    public_pem: String,
}

fn generate_key() -> AppKey {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("RSA key generation");
    AppKey {
        private_pem: key.serialize_pem(),
        public_pem: key.public_key_pem(),
    }
}

fn app_jwt(key: &AppKey, iss: &str, iat: i64, exp: i64) -> String {
    let encoding = EncodingKey::from_rsa_pem(key.private_pem.as_bytes()).unwrap();
    jsonwebtoken::encode(
        &Header::new(Algorithm::RS256),
        &json!({"iss": iss, "exp": exp, "iat": iat}),
        &encoding,
    )
    .unwrap()
}

async fn installation_token(base: &str, installation: i64, jwt: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!(
            "{base}/api/v3/app/installations/{installation}/access_tokens"
        ))
        .header("Content-Type", "application/vnd.github+json")
        .header("Authorization", format!("Bearer {jwt}"))
        .send()
        .await
        .unwrap()
}

async fn registration_token(base: &str, credential: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!(
            "{base}/api/v3/orgs/my-org/actions/runners/registration-token"
        ))
        .header("Content-Type", "application/vnd.github.v3+json")
        .header("Authorization", format!("Bearer {credential}"))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn app_jwt_is_verified_against_the_configured_key() {
    let key = generate_key();
    let other_key = generate_key();
    let fake = start(Config {
        strict: Some(StrictAuth {
            pats: vec!["ghp_good".into()],
            apps: vec![GitHubApp {
                app_id: "Iv1.0123456789abcdef".into(),
                installation_ids: vec![42],
                public_key_pem: key.public_pem.clone(),
            }],
        }),
        ..fast_config()
    })
    .await;
    let base = fake.base_url();
    let now = jiff::Timestamp::now().as_second();
    // The clients' claims: iat = now - 60 s, exp = iat + 9 min.
    let good = app_jwt(&key, "Iv1.0123456789abcdef", now - 60, now + 480);

    let response = installation_token(&base, 42, &good).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let body = json_body(response).await;
    let token = body["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("ghs_"));
    assert!(
        body["expires_at"]
            .as_str()
            .unwrap()
            .parse::<jiff::Timestamp>()
            .is_ok()
    );

    // The installation token buys a registration token; a configured PAT does too; others do not.
    assert_eq!(
        registration_token(&base, &token).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(
        registration_token(&base, "ghp_good").await.status(),
        StatusCode::CREATED
    );
    let response = registration_token(&base, "ghp_bad").await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(json_body(response).await["message"], "Bad credentials");

    let rejected = [
        (
            "wrong key",
            app_jwt(&other_key, "Iv1.0123456789abcdef", now - 60, now + 480),
            42,
        ),
        (
            "unknown app",
            app_jwt(&key, "Iv1.unknown", now - 60, now + 480),
            42,
        ),
        (
            "expired",
            app_jwt(&key, "Iv1.0123456789abcdef", now - 700, now - 100),
            42,
        ),
        (
            "too long",
            app_jwt(&key, "Iv1.0123456789abcdef", now, now + 3600),
            42,
        ),
        (
            "issued in the future",
            app_jwt(&key, "Iv1.0123456789abcdef", now + 300, now + 500),
            42,
        ),
        ("not a jwt", "garbage".to_owned(), 42),
    ];
    for (case, jwt, installation) in rejected {
        let response = installation_token(&base, installation, &jwt).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{case}");
        assert!(json_body(response).await["message"].is_string(), "{case}");
    }
    let response = installation_token(&base, 7, &good).await;
    assert_eq!(
        response.status(),
        StatusCode::NOT_FOUND,
        "installation of another app"
    );
}

#[tokio::test]
async fn strict_runner_registration_needs_a_token_the_fake_issued() {
    let fake = start(Config {
        strict: Some(StrictAuth {
            pats: vec!["ghp_good".into()],
            apps: Vec::new(),
        }),
        ..fast_config()
    })
    .await;
    let base = fake.base_url();
    let register = |token: String| {
        let base = base.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{base}/api/v3/actions/runner-registration"))
                .header("Content-Type", "application/json")
                .header("Authorization", format!("RemoteAuth {token}"))
                .body(format!(
                    "{}\n",
                    json!({"url": format!("{base}/my-org"), "runner_event": "register"})
                ))
                .send()
                .await
                .unwrap()
        }
    };
    assert_eq!(
        register("made-up".into()).await.status(),
        StatusCode::UNAUTHORIZED
    );
    let token = json_body(registration_token(&base, "ghp_good").await).await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let response = register(token).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let body = json_body(response).await;
    assert_eq!(body["url"], format!("{base}/tenant/1/"));
}
