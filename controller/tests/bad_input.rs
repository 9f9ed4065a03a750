//! The bad-input catalogue: each case is one way a user (or something else) can get an AutoscalingRunnerSet,
//! its Secrets or its children wrong, against a real API server and the fake Actions Service (or a tiny
//! misbehaving server). Each asserts the exact outcome: the condition reason and message on the set, a Warning
//! Event with that reason, and no hot loop (reconciles and service calls counted over a few seconds). Listener
//! configuration errors are in `listener/tests/bad_config.rs`.

mod ars_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ars_support::{Env, Running};
use crds::common::{ProxyConfig, ProxyServerConfig, TlsCertificateSource, TlsConfig, VaultConfig};
use crds::{EphemeralRunner, EphemeralRunnerSet};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, ConfigMapKeySelector, Container, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// How long the no-hot-loop checks watch.
const QUIET: Duration = Duration::from_secs(8);
/// Most reconciles of one set allowed in [`QUIET`]: configuration problems are retried after
/// `configuration_error_backoff` (5 s in the test options), so 8 s hold two; a few more for the status and
/// Event writes of the first failure.
const MAX_RECONCILES: u64 = 4;

/// Reasons that describe progress, not a problem.
const PROGRESS: [&str; 4] = [
    "ListenerStarting",
    "ListenerRestarting",
    "WaitingForScaleSet",
    "EphemeralRunnerSetDeleting",
];
/// Accepts any reason that is not [`PROGRESS`], where the product has no fixed reason for a case yet.
const ANY_PROBLEM: &str = "*";

/// Waits for `Ready=False` with `reason` and a message containing `message`, and a Warning Event with the same
/// reason on the set; then checks that the set is not reconciled in a hot loop. Returns the condition message.
async fn assert_reported(
    env: &Env,
    manager: &Running,
    set: &str,
    reason: &str,
    message: &str,
) -> String {
    assert_reported_with(env, manager, set, reason, message, MAX_RECONCILES).await
}

/// [`assert_reported`] with another bound on reconciles in [`QUIET`].
async fn assert_reported_with(
    env: &Env,
    manager: &Running,
    set: &str,
    reason: &str,
    message: &str,
    most: u64,
) -> String {
    let ready = env
        .eventually(&format!("Ready=False/{reason} on {set}"), || async {
            env.condition(set, "Ready")
                .await
                .filter(|c| c.status == "False" && !PROGRESS.contains(&c.reason.as_str()))
        })
        .await;
    if reason != ANY_PROBLEM {
        assert_eq!(
            (ready.reason.as_str(), ready.status.as_str()),
            (reason, "False"),
            "message: {}",
            ready.message
        );
    }
    let reason = ready.reason.as_str();
    assert!(
        ready.message.contains(message),
        "the message {:?} does not say {message:?}",
        ready.message
    );
    let event = env
        .eventually(&format!("a {reason} Event"), || async {
            env.events(set, reason).await.into_iter().next()
        })
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.involved_object.kind.as_deref(),
        Some("AutoscalingRunnerSet")
    );
    assert_no_hot_loop(manager, "autoscalingrunnerset", most).await;
    ready.message.clone()
}

async fn assert_no_hot_loop(manager: &Running, controller: &str, most: u64) {
    let before = manager.reconciles(controller);
    tokio::time::sleep(QUIET).await;
    let during = manager.reconciles(controller) - before;
    assert!(
        during <= most,
        "{during} {controller} reconciles in {QUIET:?}: a hot loop"
    );
}

/// A set is created and the manager started; the first `Ready` problem is returned after the usual checks.
async fn case(
    prefix: &str,
    prepare: impl AsyncFnOnce(&Env, &mut crds::AutoscalingRunnerSetSpec),
    reason: &str,
    message: &str,
) -> (Env, Running, String) {
    let env = Env::new(prefix).await;
    let mut spec = env.runner_set_spec();
    prepare(&env, &mut spec).await;
    let manager = env.start(env.options());
    env.create_runner_set(prefix, spec).await;
    let text = assert_reported(&env, &manager, prefix, reason, message).await;
    (env, manager, text)
}

#[tokio::test]
async fn a_malformed_github_config_url() {
    let (env, manager, _) = case(
        "bad-url",
        async |_, spec| spec.github_config_url = "github.com/just-an-org".to_owned(),
        "ConfigurationInvalid",
        "github.com/just-an-org",
    )
    .await;
    assert!(env.fake.state().counters().values().all(|n| *n == 0));
    manager.stop().await;
}

#[tokio::test]
async fn a_github_config_url_with_no_organization() {
    let (env, manager, _) = case(
        "no-org",
        async |env, spec| spec.github_config_url = env.fake.base_url().to_string(),
        "ConfigurationInvalid",
        "",
    )
    .await;
    manager.stop().await;
    drop(env);
}

#[tokio::test]
async fn a_missing_credentials_secret() {
    let (env, manager, message) = case(
        "no-secret",
        async |_, spec| spec.github_config_secret = "nowhere".to_owned(),
        "CredentialsSecretMissing",
        "nowhere",
    )
    .await;
    assert!(message.contains(&env.ctx.namespace), "{message}");
    manager.stop().await;
}

#[tokio::test]
async fn a_secret_without_credential_keys() {
    let (env, manager, _) = case(
        "no-keys",
        async |env, _| {
            env.put_secret_data(&[("token", b"ghp_wrong_key_name")])
                .await
        },
        "CredentialsInvalid",
        "no credentials: set github_token, or github_app_id",
    )
    .await;
    // Fixing the Secret recovers without a restart.
    env.put_credentials(b"ghp_fixed").await;
    env.eventually("ScaleSetReady=True", || async {
        env.condition("no-keys", "ScaleSetReady")
            .await
            .filter(|c| c.status == "True")
    })
    .await;
    manager.stop().await;
}

#[tokio::test]
async fn a_pat_and_an_app_both_set() {
    let (_env, manager, _) = case(
        "both-creds",
        async |env, _| {
            env.put_secret_data(&[
                ("github_token", b"ghp_x"),
                ("github_app_id", b"123"),
                ("github_app_installation_id", b"456"),
                ("github_app_private_key", TEST_KEY.as_bytes()),
            ])
            .await
        },
        "CredentialsInvalid",
        "both github_token and GitHub App credentials are set",
    )
    .await;
    manager.stop().await;
}

/// Not a key at all, but a complete App triple: only building the client can tell.
const TEST_KEY: &str =
    "-----BEGIN RSA PRIVATE KEY-----\nbm90IGEga2V5\n-----END RSA PRIVATE KEY-----\n";

#[tokio::test]
async fn a_malformed_private_key() {
    let (_env, manager, message) = case(
        "bad-key",
        async |env, _| {
            env.put_secret_data(&[
                ("github_app_id", b"123"),
                ("github_app_installation_id", b"456"),
                ("github_app_private_key", TEST_KEY.as_bytes()),
            ])
            .await
        },
        "CredentialsInvalid",
        "private key",
    )
    .await;
    assert!(
        !message.contains("bm90IGEga2V5"),
        "the key leaked: {message}"
    );
    manager.stop().await;
}

#[tokio::test]
async fn an_installation_id_that_is_not_a_number() {
    let (_env, manager, _) = case(
        "bad-install",
        async |env, _| {
            env.put_secret_data(&[
                ("github_app_id", b"123"),
                ("github_app_installation_id", b"12a"),
                ("github_app_private_key", TEST_KEY.as_bytes()),
            ])
            .await
        },
        "CredentialsInvalid",
        "github_app_installation_id",
    )
    .await;
    manager.stop().await;
}

#[tokio::test]
async fn an_unknown_runner_group() {
    let (env, manager, _) = case(
        "no-group",
        async |_, spec| spec.runner_group = "nope".to_owned(),
        "RunnerGroupNotFound",
        "nope",
    )
    .await;
    assert!(env.scale_sets_named("no-group").is_empty());
    manager.stop().await;
}

#[tokio::test]
async fn an_unsupported_vault() {
    let (env, manager, _) = case(
        "vault",
        async |_, spec| {
            spec.vault_config = Some(VaultConfig {
                type_: "hashicorp".to_owned(),
                ..VaultConfig::default()
            })
        },
        "VaultUnsupported",
        "hashicorp",
    )
    .await;
    assert!(env.fake.state().counters().values().all(|n| *n == 0));
    manager.stop().await;
}

fn proxy(url: &str, credentials: &str) -> Option<ProxyConfig> {
    // Both schemes: the fake is plain HTTP, GitHub is HTTPS; a bad setting must be reported either way.
    let server = ProxyServerConfig {
        url: url.to_owned(),
        credential_secret_ref: credentials.to_owned(),
    };
    Some(ProxyConfig {
        http: Some(server.clone()),
        https: Some(server),
        ..ProxyConfig::default()
    })
}

/// `parse_proxy_url` follows Go and prepends `http://` to what does not parse, so only an unsupported scheme is
/// certain to be refused when the client is built.
#[tokio::test]
async fn an_invalid_proxy_url() {
    let (_env, manager, _) = case(
        "bad-proxy",
        async |_, spec| spec.proxy = proxy("ftp://proxy.example:21", ""),
        "ProxyInvalid",
        "ftp",
    )
    .await;
    manager.stop().await;
}

#[tokio::test]
async fn a_missing_proxy_credentials_secret() {
    let (_env, manager, _) = case(
        "proxy-secret",
        async |_, spec| spec.proxy = proxy("http://proxy.example:3128", "no-such-secret"),
        "ProxyInvalid",
        "no-such-secret",
    )
    .await;
    manager.stop().await;
}

fn tls(config_map: &str, key: &str) -> Option<TlsConfig> {
    Some(TlsConfig {
        certificate_from: Some(TlsCertificateSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: config_map.to_owned(),
                key: key.to_owned(),
                optional: None,
            }),
        }),
    })
}

#[tokio::test]
async fn a_missing_ca_config_map() {
    let (env, manager, message) = case(
        "no-ca",
        async |_, spec| spec.github_server_tls = tls("no-such-ca", "ca.crt"),
        "TlsCertificateInvalid",
        "no-such-ca",
    )
    .await;
    assert!(message.contains("does not exist"), "{message}");
    assert!(env.fake.state().counters().values().all(|n| *n == 0));
    manager.stop().await;
}

#[tokio::test]
async fn a_ca_config_map_without_the_key() {
    let (_env, manager, _) = case(
        "ca-key",
        async |env, spec| {
            let maps: Api<ConfigMap> = env.ctx.api();
            maps.create(
                &PostParams::default(),
                &ConfigMap {
                    metadata: ObjectMeta {
                        name: Some("ca".to_owned()),
                        ..ObjectMeta::default()
                    },
                    data: Some([("other.pem".to_owned(), "x".to_owned())].into()),
                    ..ConfigMap::default()
                },
            )
            .await
            .expect("create the ConfigMap");
            spec.github_server_tls = tls("ca", "ca.crt");
        },
        "TlsCertificateInvalid",
        "has no key \"ca.crt\"",
    )
    .await;
    manager.stop().await;
}

#[tokio::test]
async fn a_ca_that_is_not_pem() {
    let (_env, manager, _) = case(
        "ca-pem",
        async |env, spec| {
            let maps: Api<ConfigMap> = env.ctx.api();
            maps.create(
                &PostParams::default(),
                &ConfigMap {
                    metadata: ObjectMeta {
                        name: Some("ca".to_owned()),
                        ..ObjectMeta::default()
                    },
                    data: Some([("ca.crt".to_owned(), "not a certificate".to_owned())].into()),
                    ..ConfigMap::default()
                },
            )
            .await
            .expect("create the ConfigMap");
            spec.github_server_tls = tls("ca", "ca.crt");
        },
        "TlsCertificateInvalid",
        "certificate",
    )
    .await;
    manager.stop().await;
}

/// The listener controller refuses the listener config (`InvalidListenerConfig`), so this must reach the set;
/// the reason word is not fixed yet, the message must name the fields.
#[tokio::test]
async fn min_runners_above_max_runners() {
    let (_env, manager, _) = case(
        "min-max",
        async |_, spec| {
            spec.min_runners = Some(5);
            spec.max_runners = Some(2);
        },
        ANY_PROBLEM,
        "minRunners",
    )
    .await;
    manager.stop().await;
}

#[tokio::test]
async fn negative_runner_bounds_are_refused_by_the_api_server() {
    let env = Env::new("negative").await;
    let mut spec = env.runner_set_spec();
    spec.max_runners = Some(-1);
    let refused = env
        .runner_sets()
        .create(
            &PostParams::default(),
            &crds::AutoscalingRunnerSet::new("negative", spec),
        )
        .await
        .expect_err("a negative maxRunners is invalid");
    let kube::Error::Api(status) = refused else {
        panic!("not an API error: {refused}");
    };
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains("spec.maxRunners"),
        "{}",
        status.message
    );
}

/// Label values are at most 63 characters, and every child carries the set's name in a label; a longer name
/// can never work, so it must be reported as a configuration problem, not retried as if it might pass.
#[tokio::test]
async fn an_over_long_name() {
    let name = format!("long-{}", "x".repeat(60));
    let env = Env::new("long-name").await;
    let manager = env.start(env.options());
    env.create_runner_set(&name, env.runner_set_spec()).await;
    let message = assert_reported(&env, &manager, &name, "ChildrenNotReconciled", "63").await;
    assert!(message.contains("EphemeralRunnerSet"), "{message}");
    manager.stop().await;
}

/// A runner template without a container named `runner` cannot run a runner: each runner fails with
/// `InvalidPod` (status and Event) and no pod is created, and runners are not registered in a hot loop.
#[tokio::test]
async fn a_template_without_a_runner_container() {
    let env = Env::new("no-runner").await;
    let mut spec = env.runner_set_spec();
    if let Some(pod) = spec.template.spec.as_mut() {
        pod.containers = vec![Container {
            name: "main".to_owned(),
            image: Some("ghcr.io/actions/actions-runner:latest".to_owned()),
            ..Container::default()
        }];
    }
    let manager = env.start(env.options());
    env.create_runner_set("no-runner", spec).await;
    env.eventually("the EphemeralRunnerSet", || async {
        env.ephemeral_runner_sets()
            .get_opt("no-runner")
            .await
            .unwrap()
    })
    .await;
    env.ephemeral_runner_sets()
        .patch(
            "no-runner",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1, "patchID": 1}})),
        )
        .await
        .expect("scale up");
    let runners: Api<EphemeralRunner> = env.ctx.api();
    let failed = env
        .eventually("a Failed runner", || async {
            runners
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|r| r.status.as_ref().is_some_and(|s| s.phase == "Failed"))
        })
        .await;
    let status = failed.status.clone().expect("status");
    assert_eq!(status.reason, "InvalidPod");
    assert!(status.message.contains("runner"), "{}", status.message);
    let event = env
        .eventually("an InvalidPod Event", || async {
            env.events(&failed.name_any(), "InvalidPod")
                .await
                .into_iter()
                .next()
        })
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let pods: Api<Pod> = env.ctx.api();
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let before = env.fake.state().count("generate_jit_config");
    tokio::time::sleep(QUIET).await;
    let during = env.fake.state().count("generate_jit_config") - before;
    assert!(during <= 3, "{during} runner registrations in {QUIET:?}");
    manager.stop().await;
}

/// A tiny Actions "service" that answers every request with status 200 and this content type and body.
async fn misbehaving_server(
    content_type: &'static str,
    body: &'static str,
) -> (String, Arc<AtomicUsize>) {
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&requests);
    let app = axum::Router::new().fallback(move || {
        let counter = Arc::clone(&counter);
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            ([(http::header::CONTENT_TYPE, content_type)], body)
        }
    });
    let socket = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = socket.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(socket, app).await });
    (format!("http://{addr}/org/repo"), requests)
}

async fn misbehaving_service_case(prefix: &str, content_type: &'static str, body: &'static str) {
    let (url, requests) = misbehaving_server(content_type, body).await;
    let env = Env::new(prefix).await;
    let manager = env.start(env.options());
    let mut spec = env.runner_set_spec();
    spec.github_config_url = url;
    env.create_runner_set(prefix, spec).await;
    // The service may recover by itself (a captive portal, a broken proxy): retried with the error backoff,
    // capped at 2 s in the test options, so at most 4 in 8 s plus the tail of the ramp-up.
    assert_reported_with(
        &env,
        &manager,
        prefix,
        "ScaleSetLookupFailed",
        "registration-token",
        6,
    )
    .await;
    let before = requests.load(Ordering::SeqCst);
    tokio::time::sleep(QUIET).await;
    let during = requests.load(Ordering::SeqCst) - before;
    // One request per reconcile: the client does not retry an answer it cannot read.
    assert!(during <= 6, "{during} requests in {QUIET:?}");
    manager.stop().await;
}

#[tokio::test]
async fn the_service_answers_malformed_json() {
    misbehaving_service_case("bad-json", "application/json", "{\"token\": ").await;
}

#[tokio::test]
async fn the_service_answers_html() {
    misbehaving_service_case(
        "html",
        "text/html",
        "<html><body>Sign in to continue</body></html>",
    )
    .await;
}

#[tokio::test]
async fn the_service_rejects_the_credentials() {
    let (env, manager, _) = case(
        "rejected",
        async |env, _| {
            env.fake
                .state()
                .set_faults(
                    serde_json::from_value(
                        json!({"errors": [{"endpoint": "github", "status": 401}]}),
                    )
                    .unwrap(),
                )
                .expect("faults");
        },
        "CredentialsRejected",
        "",
    )
    .await;
    manager.stop().await;
    drop(env);
}

#[tokio::test]
async fn the_service_forbids_the_call() {
    let (_env, manager, _) = case(
        "forbidden",
        async |env, _| {
            env.fake
                .state()
                .set_faults(
                    serde_json::from_value(
                        json!({"errors": [{"endpoint": "github", "status": 403}]}),
                    )
                    .unwrap(),
                )
                .expect("faults");
        },
        "PermissionDenied",
        "",
    )
    .await;
    manager.stop().await;
}

/// The listener config Secret deleted by hand is written again and the listener keeps its name.
#[tokio::test]
async fn a_listener_config_secret_deleted_by_hand() {
    let env = Env::new("cfg-gone").await;
    let manager = env.start(env.options());
    env.create_runner_set("cfg-gone", env.runner_set_spec())
        .await;
    let listener = env
        .eventually("the listener", || async {
            env.listeners()
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .next()
        })
        .await
        .name_any();
    let secret = format!("{listener}-config");
    let first = env
        .eventually("the config Secret", || async {
            env.controller_secrets().get_opt(&secret).await.unwrap()
        })
        .await;
    env.controller_secrets()
        .delete(&secret, &Default::default())
        .await
        .expect("delete the config Secret");
    let again = env
        .eventually("a new config Secret", || async {
            env.controller_secrets()
                .get_opt(&secret)
                .await
                .unwrap()
                .filter(|s| s.uid() != first.uid())
        })
        .await;
    let config: serde_json::Value =
        serde_json::from_slice(&again.data.expect("data")["config.json"].0).expect("JSON");
    assert_eq!(config["github_token"], "ghp_test");
    manager.stop().await;
}

/// A negative `replicas` (the field has no minimum, as in ARC) counts as zero: runners go away and nothing
/// fails.
#[tokio::test]
async fn an_ephemeral_runner_set_edited_to_negative_replicas() {
    let env = Env::new("negative-ers").await;
    let manager = env.start(env.options());
    env.create_runner_set("negative-ers", env.runner_set_spec())
        .await;
    let sets: Api<EphemeralRunnerSet> = env.ctx.api();
    env.eventually("the EphemeralRunnerSet", || async {
        sets.get_opt("negative-ers").await.unwrap()
    })
    .await;
    let runners: Api<EphemeralRunner> = env.ctx.api();
    let scale = |replicas: i64, patch_id: i64| {
        let sets = sets.clone();
        async move {
            sets.patch(
                "negative-ers",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas, "patchID": patch_id}})),
            )
            .await
            .expect("patch replicas")
        }
    };
    scale(2, 1).await;
    env.eventually("two runners", || async {
        (runners
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len()
            == 2)
            .then_some(())
    })
    .await;
    // patchID 0 is the authoritative form that may scale down (a positive one only scales up).
    scale(-3, 0).await;
    env.eventually("no runners", || async {
        runners
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    let status = env
        .eventually("the set's status at zero", || async {
            sets.get("negative-ers")
                .await
                .unwrap()
                .status
                .filter(|s| s.current_replicas == 0)
        })
        .await;
    assert_eq!(status.current_replicas, 0);
    assert_eq!(manager.reconcile_errors("ephemeralrunnerset"), 0);
    manager.stop().await;
}

/// A JIT Secret whose runner id is garbage is never trusted: once the runner needs it again (its pod is gone), it
/// is discarded and replaced by a fresh registration, and the old registration (known from the status) is not
/// leaked in the service. While a pod runs, the runner's identity comes from its status, not the Secret.
#[tokio::test]
async fn a_corrupt_jit_secret() {
    let env = Env::new("corrupt-jit").await;
    let manager = env.start(env.options());
    env.create_runner_set("corrupt-jit", env.runner_set_spec())
        .await;
    let sets: Api<EphemeralRunnerSet> = env.ctx.api();
    env.eventually("the EphemeralRunnerSet", || async {
        sets.get_opt("corrupt-jit").await.unwrap()
    })
    .await;
    sets.patch(
        "corrupt-jit",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1, "patchID": 1}})),
    )
    .await
    .expect("scale up");
    let runners: Api<EphemeralRunner> = env.ctx.api();
    let pods: Api<Pod> = env.ctx.api();
    let secrets: Api<Secret> = env.ctx.api();
    // The Secret is made before the pod: under load the two are seconds apart, and the test is about a runner
    // whose pod exists (deleting it must find it).
    let runner = env
        .eventually("a runner with its JIT Secret and its pod", || async {
            let runner = runners
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .next()?;
            secrets.get_opt(&runner.name_any()).await.unwrap()?;
            pods.get_opt(&runner.name_any()).await.unwrap()?;
            Some(runner)
        })
        .await
        .name_any();
    secrets
        .patch(
            &runner,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"runnerId": ByteString(b"garbage".to_vec())}})),
        )
        .await
        .expect("corrupt the Secret");
    pods.delete(&runner, &DeleteParams::default())
        .await
        .expect("delete the runner's pod");
    let id = env
        .eventually("a valid JIT Secret again", || async {
            let secret = secrets.get_opt(&runner).await.unwrap()?;
            let id = String::from_utf8(secret.data?.get("runnerId")?.0.clone()).ok()?;
            id.parse::<i64>().ok().filter(|id| *id > 0)
        })
        .await;
    let registered: Vec<i64> = env
        .fake
        .state()
        .snapshot()
        .runners
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(
        registered,
        [id],
        "the service should know exactly the current runner"
    );
    manager.stop().await;
}

/// A set labelled for a version the controller does not take care of is left alone, with a condition and a Warning
/// Event that say why; one of the controller's previous minor (its chart not upgraded yet) is served.
#[tokio::test]
async fn an_incompatible_version_label() {
    let env = Env::new("version").await;
    // "dev" accepts every version; a release build does not.
    let mut options = env.options();
    options.build_version = "0.2.0".to_owned();
    let manager = env.start(options);
    let mut set = crds::AutoscalingRunnerSet::new("version", env.runner_set_spec());
    set.metadata.labels =
        Some([("app.kubernetes.io/version".to_owned(), "0.3.0".to_owned())].into());
    env.runner_sets()
        .create(&PostParams::default(), &set)
        .await
        .expect("create");
    let event = env
        .eventually("a VersionNotAccepted Event", || async {
            env.events("version", "VersionNotAccepted")
                .await
                .into_iter()
                .next()
        })
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(event.message.unwrap_or_default().contains("0.3.0"));
    env.eventually("the refusal on the set's conditions", || async {
        let conditions = env.runner_set("version").await?.status?.conditions;
        conditions
            .iter()
            .any(|condition| condition.reason == "VersionNotAccepted")
            .then_some(())
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert!(env.runner_set("version").await.is_some(), "never deleted");

    // Its chart one minor behind the controller's (the controller upgraded first): served.
    let mut previous = crds::AutoscalingRunnerSet::new("previous", env.runner_set_spec());
    previous.metadata.labels =
        Some([("app.kubernetes.io/version".to_owned(), "0.1.4".to_owned())].into());
    env.runner_sets()
        .create(&PostParams::default(), &previous)
        .await
        .expect("create");
    env.eventually("the previous minor's set served", || async {
        let status = env.runner_set("previous").await?.status?;
        (status.phase == "Running").then_some(())
    })
    .await;
    manager.stop().await;
}
