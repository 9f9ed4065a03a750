//! Security checks against a real API server: what the manager's and the listener's ServiceAccounts may do
//! (SubjectAccessReview), which Secrets a runner pod can see, that the listener pod meets the `restricted` Pod
//! Security Standard, and that no credential (PAT or GitHub App) reaches a log line.

mod ars_support;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use ars_support::{CREDENTIALS, Env};
use chart_tests::{Chart, Template};
use crds::{EphemeralRunner, EphemeralRunnerSet};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

/// Whether `user` (a ServiceAccount) may `verb` `resource` (`group/resource[/subresource]`).
async fn can(
    client: &Client,
    user: &str,
    verb: &str,
    resource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> bool {
    let (group, rest) = resource.split_once('/').unwrap_or(("", resource));
    let (resource, subresource) = rest
        .split_once('/')
        .map_or((rest, None), |(r, s)| (r, Some(s)));
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            groups: Some(vec![
                "system:serviceaccounts".to_owned(),
                "system:authenticated".to_owned(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                subresource: subresource.map(str::to_owned),
                verb: Some(verb.to_owned()),
                namespace: namespace.map(str::to_owned),
                name: name.map(str::to_owned),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("SubjectAccessReview")
        .status
        .is_some_and(|status| status.allowed)
}

async fn create<K>(api: Api<K>, object: &Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let typed: K = serde_json::from_value(object.clone()).expect("a rendered object");
    api.create(&PostParams::default(), &typed)
        .await
        .unwrap_or_else(|e| panic!("create {}: {e}", typed.name_any()));
}

/// Installs the RBAC objects the controller chart renders; returns the manager's ServiceAccount user name.
async fn install_chart_rbac(
    client: &Client,
    release: &str,
    namespace: &str,
    values: Value,
) -> String {
    let manifests = Template::new(Chart::Controller)
        .release(release)
        .namespace(namespace)
        .values(values)
        .render()
        .expect("render the controller chart");
    let mut account = None;
    for object in manifests.objects() {
        let ns = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or(namespace);
        match object["kind"].as_str() {
            Some("ServiceAccount") => {
                account = object["metadata"]["name"].as_str().map(str::to_owned);
                create::<ServiceAccount>(Api::namespaced(client.clone(), ns), object).await;
            }
            Some("Role") => create::<Role>(Api::namespaced(client.clone(), ns), object).await,
            Some("RoleBinding") => {
                create::<RoleBinding>(Api::namespaced(client.clone(), ns), object).await
            }
            Some("ClusterRole") => create::<ClusterRole>(Api::all(client.clone()), object).await,
            Some("ClusterRoleBinding") => {
                create::<ClusterRoleBinding>(Api::all(client.clone()), object).await
            }
            _ => {}
        }
    }
    let account = account.expect("the chart renders a ServiceAccount");
    let user = format!("system:serviceaccount:{namespace}:{account}");
    await_bindings_in_force(client, &user, manifests.objects(), namespace).await;
    user
}

/// Waits until the API server's authorizer grants `user` one right of every binding the chart rendered. The RBAC
/// authorizer reads roles and bindings from its own watch caches, so a binding just created may not be in force
/// yet; without this barrier a check right after installing fails now and then (CI saw it), and a negative check
/// could pass only because the authorizer had not caught up.
async fn await_bindings_in_force(client: &Client, user: &str, objects: &[Value], namespace: &str) {
    let role_rules = |kind: &str, ns: Option<&str>, name: &str| {
        objects
            .iter()
            .find(|o| {
                o["kind"] == kind
                    && o["metadata"]["name"] == name
                    && (kind == "ClusterRole"
                        || o["metadata"]["namespace"].as_str().unwrap_or(namespace)
                            == ns.unwrap_or(namespace))
            })
            .and_then(|o| o["rules"].as_array().cloned())
            .unwrap_or_default()
    };
    for binding in objects {
        let ns = match binding["kind"].as_str() {
            Some("RoleBinding") => Some(
                binding["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or(namespace),
            ),
            Some("ClusterRoleBinding") => None,
            _ => continue,
        };
        let role = &binding["roleRef"];
        let rules = role_rules(
            role["kind"].as_str().unwrap_or_default(),
            ns,
            role["name"].as_str().unwrap_or_default(),
        );
        // The first rule naming a concrete verb and resource is enough to see the binding in force.
        let probe = rules.iter().find_map(|rule| {
            let first = |key: &str| {
                rule[key]
                    .as_array()
                    .and_then(|v| v.first())
                    .and_then(Value::as_str)
                    .filter(|v| *v != "*")
                    .map(str::to_owned)
            };
            Some((
                first("verbs")?,
                format!(
                    "{}/{}",
                    first("apiGroups").unwrap_or_default(),
                    first("resources")?
                ),
                first("resourceNames"),
            ))
        });
        let Some((verb, resource, name)) = probe else {
            continue;
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !can(client, user, &verb, &resource, ns, name.as_deref()).await {
            assert!(
                std::time::Instant::now() < deadline,
                "the authorizer never granted {user} {verb} {resource} from binding {}",
                binding["metadata"]["name"]
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}

/// In single-namespace mode the manager reads Secrets in the watched namespace (credentials) and its own
/// (listener config Secrets), and nowhere else.
#[tokio::test]
async fn the_manager_cannot_read_secrets_outside_its_namespaces_in_single_namespace_mode() {
    let env = Env::new("sec-manager").await;
    let client = env.client();
    let watched = env.ctx.namespace.clone();
    let controller = env.controller_namespace.clone();
    let elsewhere = test_harness::create_namespace(&client, "sec-elsewhere")
        .await
        .expect("another namespace");
    // Cluster-scoped names must not collide with other tests: the release name carries the namespace.
    let release = format!("r-{controller}");
    let user = install_chart_rbac(
        &client,
        &release,
        &controller,
        json!({"flags": {"watchSingleNamespace": watched}}),
    )
    .await;
    let reads = |namespace: Option<String>| {
        let client = client.clone();
        let user = user.clone();
        async move {
            let ns = namespace.as_deref();
            (
                can(&client, &user, "get", "secrets", ns, Some("x")).await,
                can(&client, &user, "list", "secrets", ns, None).await,
                can(&client, &user, "watch", "secrets", ns, None).await,
            )
        }
    };
    assert_eq!(reads(Some(elsewhere.clone())).await, (false, false, false));
    assert_eq!(reads(None).await, (false, false, false), "cluster-wide");
    assert_eq!(
        reads(Some("kube-system".to_owned())).await,
        (false, false, false)
    );
    // Its own namespace holds the listener config Secrets it writes. Secrets in the watched namespace come
    // from the scale-set chart's manager Role, as with ARC: the controller chart alone grants none there.
    let own = Some(controller.as_str());
    assert!(
        can(
            &client,
            &user,
            "get",
            "secrets",
            own,
            Some("x-listener-config")
        )
        .await
    );
    assert!(
        !can(
            &client,
            &user,
            "get",
            "secrets",
            Some(&watched),
            Some(CREDENTIALS)
        )
        .await
    );
    // Nor may it create pods or change RBAC elsewhere.
    assert!(!can(&client, &user, "create", "pods", Some(&elsewhere), None).await);
    assert!(
        !can(
            &client,
            &user,
            "create",
            "rbac.authorization.k8s.io/roles",
            Some(&elsewhere),
            None
        )
        .await
    );
}

/// The listener's ServiceAccount, made by the real controllers, may patch its own EphemeralRunnerSet and
/// EphemeralRunner status, and nothing else.
#[tokio::test]
async fn the_listener_account_can_only_patch_its_own_set_and_runner_status() {
    let env = Env::new("sec-listener").await;
    let manager = env.start(env.options());
    env.create_runner_set("mine", env.runner_set_spec()).await;
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
    env.eventually("the RoleBinding", || async {
        env.role_bindings().get_opt(&listener).await.unwrap()
    })
    .await;
    let client = env.client();
    let user = format!(
        "system:serviceaccount:{}:{listener}",
        env.controller_namespace
    );
    let ns = env.ctx.namespace.as_str();
    let controller_ns = env.controller_namespace.as_str();
    let sets = "actions.github.com/ephemeralrunnersets";
    assert!(can(&client, &user, "patch", sets, Some(ns), Some("mine")).await);
    assert!(
        can(
            &client,
            &user,
            "patch",
            "actions.github.com/ephemeralrunners/status",
            Some(ns),
            Some("mine-runner-abcde")
        )
        .await
    );
    for (verb, resource, namespace, name) in [
        ("patch", sets, ns, Some("another-set")),
        ("get", sets, ns, Some("mine")),
        ("list", sets, ns, None),
        ("delete", sets, ns, Some("mine")),
        (
            "delete",
            "actions.github.com/ephemeralrunners",
            ns,
            Some("mine-runner-abcde"),
        ),
        ("get", "secrets", ns, Some(CREDENTIALS)),
        (
            "get",
            "secrets",
            controller_ns,
            Some(&format!("{listener}-config")),
        ),
        ("list", "secrets", ns, None),
        ("list", "secrets", controller_ns, None),
        ("create", "pods", ns, None),
        ("create", "pods", controller_ns, None),
        (
            "get",
            "actions.github.com/autoscalingrunnersets",
            ns,
            Some("mine"),
        ),
    ] {
        assert!(
            !can(&client, &user, verb, resource, Some(namespace), name).await,
            "the listener may {verb} {resource} {name:?} in {namespace}"
        );
    }
    manager.stop().await;
}

/// Beyond ARC, the listener reports its message session in its AutoscalingListener's status: its ServiceAccount
/// may patch that status subresource, of its own listener only, and nothing else of any listener.
#[tokio::test]
async fn the_listener_account_can_patch_only_its_own_listener_status() {
    let env = Env::new("sec-al-status").await;
    let manager = env.start(env.options());
    env.create_runner_set("mine", env.runner_set_spec()).await;
    env.create_runner_set("theirs", env.runner_set_spec()).await;
    let listener_of = |set: &'static str| {
        let env = &env;
        async move {
            env.eventually("the listener", || async {
                env.listeners()
                    .list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .into_iter()
                    .find(|l| l.spec.autoscaling_runner_set_name == set)
                    .map(|l| l.name_any())
            })
            .await
        }
    };
    let mine = listener_of("mine").await;
    let theirs = listener_of("theirs").await;
    let bindings: Api<RoleBinding> = Api::namespaced(env.client(), &env.controller_namespace);
    for listener in [&mine, &theirs] {
        env.eventually("the status RoleBinding", || async {
            bindings
                .get_opt(&format!("{listener}-status"))
                .await
                .unwrap()
        })
        .await;
    }
    let client = env.client();
    let controller_ns = env.controller_namespace.as_str();
    let status = "actions.github.com/autoscalinglisteners/status";
    let listeners = "actions.github.com/autoscalinglisteners";
    let user = |listener: &str| format!("system:serviceaccount:{controller_ns}:{listener}");
    for (own, other) in [(&mine, &theirs), (&theirs, &mine)] {
        let user = user(own);
        let own_role = format!("{own}-status");
        assert!(
            can(
                &client,
                &user,
                "patch",
                status,
                Some(controller_ns),
                Some(own.as_str())
            )
            .await,
            "{own} may report in its own status"
        );
        for (verb, resource, namespace, name) in [
            ("patch", status, controller_ns, Some(other.as_str())),
            ("update", status, controller_ns, Some(own.as_str())),
            ("get", status, controller_ns, Some(own.as_str())),
            ("patch", listeners, controller_ns, Some(own.as_str())),
            ("get", listeners, controller_ns, Some(own.as_str())),
            ("list", listeners, controller_ns, None),
            ("delete", listeners, controller_ns, Some(own.as_str())),
            ("create", listeners, controller_ns, None),
            (
                "patch",
                status,
                env.ctx.namespace.as_str(),
                Some(own.as_str()),
            ),
            (
                "patch",
                "rbac.authorization.k8s.io/roles",
                controller_ns,
                Some(own_role.as_str()),
            ),
        ] {
            assert!(
                !can(&client, &user, verb, resource, Some(namespace), name).await,
                "{own} may {verb} {resource} {name:?} in {namespace}"
            );
        }
    }
    manager.stop().await;
}

/// The controller chart lets the manager give each listener that right: it may create Roles and RoleBindings in
/// its own namespace and holds the right it grants there (the API server refuses to let anyone grant more than
/// it has).
#[tokio::test]
async fn the_chart_lets_the_manager_grant_listeners_their_status_right() {
    let env = Env::new("sec-manager-grant").await;
    let client = env.client();
    let controller = env.controller_namespace.clone();
    let release = format!("r-{controller}");
    let user = install_chart_rbac(&client, &release, &controller, json!({})).await;
    let ns = Some(controller.as_str());
    for (verb, resource) in [
        ("create", "rbac.authorization.k8s.io/roles"),
        ("patch", "rbac.authorization.k8s.io/roles"),
        ("create", "rbac.authorization.k8s.io/rolebindings"),
        ("patch", "rbac.authorization.k8s.io/rolebindings"),
        ("patch", "actions.github.com/autoscalinglisteners/status"),
    ] {
        assert!(
            can(&client, &user, verb, resource, ns, Some("l-status")).await,
            "the manager may {verb} {resource} in its namespace"
        );
    }
    assert!(
        !can(
            &client,
            &user,
            "create",
            "rbac.authorization.k8s.io/clusterroles",
            None,
            None
        )
        .await
    );
}

/// The listener only writes `ephemeralrunners/status` (job identity). Patching the runners themselves would let
/// a compromised listener rewrite a runner's pod spec, which the controller then runs.
#[tokio::test]
async fn the_listener_account_cannot_patch_runner_specs() {
    let env = Env::new("sec-er-spec").await;
    let manager = env.start(env.options());
    env.create_runner_set("mine", env.runner_set_spec()).await;
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
    env.eventually("the RoleBinding", || async {
        env.role_bindings().get_opt(&listener).await.unwrap()
    })
    .await;
    let user = format!(
        "system:serviceaccount:{}:{listener}",
        env.controller_namespace
    );
    let runners = "actions.github.com/ephemeralrunners";
    let ns = Some(env.ctx.namespace.as_str());
    assert!(
        can(
            &env.client(),
            &user,
            "patch",
            &format!("{runners}/status"),
            ns,
            Some("r")
        )
        .await
    );
    assert!(!can(&env.client(), &user, "patch", runners, ns, Some("r")).await);
    manager.stop().await;
}

/// Names of all Secrets a pod spec can read: env, envFrom and volumes (projected ones included).
fn referenced_secrets(pod: &Pod) -> Vec<String> {
    let spec = pod.spec.as_ref().expect("spec");
    let mut names = Vec::new();
    for container in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        for env in container.env.iter().flatten() {
            if let Some(key) = env
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
            {
                names.push(key.name.clone());
            }
        }
        for from in container.env_from.iter().flatten() {
            if let Some(secret) = &from.secret_ref {
                names.push(secret.name.clone());
            }
        }
    }
    for volume in spec.volumes.iter().flatten() {
        if let Some(secret) = volume.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            names.push(secret);
        }
        for source in volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
        {
            if let Some(secret) = &source.secret {
                names.push(secret.name.clone());
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

/// Scales the set's EphemeralRunnerSet to one runner and returns its pod.
async fn one_runner_pod(env: &Env, set: &str) -> Pod {
    let sets: Api<EphemeralRunnerSet> = env.ctx.api();
    env.eventually("the EphemeralRunnerSet", || async {
        sets.get_opt(set).await.unwrap()
    })
    .await;
    sets.patch(
        set,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1, "patchID": 1}})),
    )
    .await
    .expect("scale up");
    let pods: Api<Pod> = env.ctx.api();
    env.eventually("a runner pod", || async {
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .next()
    })
    .await
}

/// A runner pod sees its JIT config Secret and nothing else; no credential is written into the pod spec or the
/// JIT Secret.
#[tokio::test]
async fn runner_pods_get_only_their_jit_secret() {
    let env = Env::new("sec-pod").await;
    env.put_credentials(b"ghp_never_in_a_pod_0123").await;
    let manager = env.start(env.options());
    env.create_runner_set("pods", env.runner_set_spec()).await;
    let pod = one_runner_pod(&env, "pods").await;
    assert_eq!(referenced_secrets(&pod), [pod.name_any()]);
    let spec_text = serde_json::to_string(&pod.spec).expect("JSON");
    assert!(
        !spec_text.contains("ghp_never_in_a_pod_0123"),
        "the token is in the pod spec"
    );
    assert!(
        !spec_text.contains(CREDENTIALS),
        "the pod names the credentials Secret"
    );
    let runners: Api<EphemeralRunner> = env.ctx.api();
    let runner = runners.get(&pod.name_any()).await.expect("the runner");
    assert!(
        !serde_json::to_string(&runner)
            .unwrap()
            .contains("ghp_never_in_a_pod_0123")
    );
    let secrets: Api<Secret> = env.ctx.api();
    let jit = secrets.get(&pod.name_any()).await.expect("the JIT Secret");
    for (key, value) in jit.data.iter().flatten() {
        assert!(
            !String::from_utf8_lossy(&value.0).contains("ghp_never_in_a_pod_0123"),
            "the token is in the JIT Secret under {key}"
        );
    }
    // The pod runs as the namespace's default account unless the template says otherwise, and gets no token
    // mounted for the manager's or the listener's account.
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone());
    assert!(
        account.as_deref().is_none_or(|a| a == "default"),
        "{account:?}"
    );
    manager.stop().await;
}

/// Collects every formatted log line of this process.
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

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(
            &self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_owned()
    }
}

/// The logs of this test binary at trace level (every crate, as `RUST_LOG=trace` gives the manager), captured
/// from the first call on. The subscriber is global,
/// so the log-scanning tests share it: each one scans everything captured for its own secrets, and checks that
/// lines of its own run are there.
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

/// Fails when any line of `text` contains one of `secrets` (what, value).
fn assert_no_leak(text: &str, secrets: &[(&str, &str)]) {
    for (what, secret) in secrets {
        assert!(secret.len() >= 16, "{what} is too short to scan for");
        let leaks: Vec<&str> = text.lines().filter(|line| line.contains(secret)).collect();
        assert!(
            leaks.is_empty(),
            "the {what} appears in {} log line(s): {:?}",
            leaks.len(),
            leaks.first()
        );
    }
}

/// A scale set through its whole lifecycle with trace logs (every crate) captured: no token, JIT config or
/// listener config value appears in any line.
#[tokio::test]
async fn no_credential_appears_in_trace_logs() {
    let captured = capture();
    const TOKEN: &str = "ghp_log_scan_secret_4f1d9a";
    let env = Env::new("sec-logs").await;
    env.put_credentials(TOKEN.as_bytes()).await;
    let manager = env.start(env.options());
    env.create_runner_set("logs", env.runner_set_spec()).await;
    let pod = one_runner_pod(&env, "logs").await;
    let secrets: Api<Secret> = env.ctx.api();
    let jit = env
        .eventually("the JIT Secret", || async {
            secrets.get_opt(&pod.name_any()).await.unwrap()
        })
        .await;
    let jit_config =
        String::from_utf8(jit.data.expect("data")["jitToken"].0.clone()).expect("UTF-8");
    assert!(jit_config.len() > 32, "a real JIT config");
    // A credentials change (the token is rotated) and the deletion are logged too.
    env.put_credentials(format!("{TOKEN}_rotated").as_bytes())
        .await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    env.runner_sets()
        .delete("logs", &DeleteParams::default())
        .await
        .expect("delete the set");
    env.eventually("the set to be gone", || async {
        env.runner_set("logs").await.is_none().then_some(())
    })
    .await;
    manager.stop().await;

    let text = captured.text();
    assert!(text.lines().count() > 50, "trace logs were captured");
    assert!(text.contains(" TRACE "), "trace-level lines are captured");
    assert!(
        text.contains(&env.ctx.namespace),
        "the logs hold this test's reconciles"
    );
    // The JIT config is base64 of JSON; any 40-character piece of it is as good as the whole.
    let jit_piece = &jit_config[jit_config.len() / 2..jit_config.len() / 2 + 40];
    assert_no_leak(&text, &[("token", TOKEN), ("JIT config", jit_piece)]);
}

/// Response bytes relayed from the fake Actions Service: the fake keeps the tokens it issues to itself, so the
/// tests read them from what the manager actually received.
#[derive(Clone, Default)]
struct Relayed(Arc<Mutex<Vec<u8>>>);

impl Relayed {
    /// Every string value of `"field":"..."` in the relayed responses.
    fn values_of(&self, field: &str) -> Vec<String> {
        let bytes = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let text = String::from_utf8_lossy(&bytes);
        let needle = format!("\"{field}\":\"");
        text.match_indices(&needle)
            .filter_map(|(at, _)| {
                let rest = &text[at + needle.len()..];
                rest.find('"').map(|end| rest[..end].to_owned())
            })
            .collect()
    }
}

/// A TCP relay to `upstream` on a free local port. The fake builds the URLs it hands out from the Host header,
/// so a client given the relay's address keeps talking through it.
async fn relay(upstream: std::net::SocketAddr, relayed: Relayed) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("relay port");
    let addr = listener.local_addr().expect("relay address");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let relayed = relayed.clone();
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let requests = tokio::spawn(async move {
                    tokio::io::copy(&mut client_read, &mut server_write)
                        .await
                        .ok();
                    server_write.shutdown().await.ok();
                });
                let mut buffer = vec![0_u8; 16 * 1024];
                while let Ok(n) = server_read.read(&mut buffer).await {
                    if n == 0 {
                        break;
                    }
                    relayed
                        .0
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .extend_from_slice(&buffer[..n]);
                    if client_write.write_all(&buffer[..n]).await.is_err() {
                        break;
                    }
                }
                client_write.shutdown().await.ok();
                requests.abort();
            });
        }
    });
    addr
}

/// The same lifecycle with GitHub App credentials: the private key (which the manager also copies into the
/// listener config Secret), the App JWT, the installation, registration and admin tokens the fake issued, and
/// the JIT config stay out of every log line.
#[tokio::test]
async fn no_github_app_credential_appears_in_trace_logs() {
    let captured = capture();
    let env = Env::new("sec-app-logs").await;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("an RSA key");
    let private_key = key.serialize_pem();
    env.put_secret_data(&[
        ("github_app_id", b"Iv1.logscan"),
        ("github_app_installation_id", b"4242"),
        ("github_app_private_key", private_key.as_bytes()),
    ])
    .await;
    let relayed = Relayed::default();
    let relay_addr = relay(env.fake.addr(), relayed.clone()).await;
    let mut spec = env.runner_set_spec();
    spec.github_config_url = format!("http://{relay_addr}/org/repo");
    let manager = env.start(env.options());
    env.create_runner_set("applogs", spec).await;
    let pod = one_runner_pod(&env, "applogs").await;
    let secrets: Api<Secret> = env.ctx.api();
    let jit = env
        .eventually("the JIT Secret", || async {
            secrets.get_opt(&pod.name_any()).await.unwrap()
        })
        .await;
    let jit_config =
        String::from_utf8(jit.data.expect("data")["jitToken"].0.clone()).expect("UTF-8");
    // The listener config Secret carries the key: the manager has handled it in full by now.
    let listener_config = env
        .eventually("the listener config Secret", || async {
            env.controller_secrets()
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|s| s.name_any().ends_with("-config"))
        })
        .await;
    let config = &listener_config.data.expect("data")["config.json"].0;
    assert!(
        String::from_utf8_lossy(config).contains("PRIVATE KEY"),
        "the listener gets the App key"
    );
    env.runner_sets()
        .delete("applogs", &DeleteParams::default())
        .await
        .expect("delete the set");
    env.eventually("the set to be gone", || async {
        env.runner_set("applogs").await.is_none().then_some(())
    })
    .await;
    manager.stop().await;

    let text = captured.text();
    assert!(
        text.lines()
            .any(|line| line.contains(&relay_addr.to_string()) && line.contains("admin token")),
        "the logs hold this test's App sign-in"
    );
    let tokens = relayed.values_of("token");
    assert!(
        tokens.iter().any(|t| t.starts_with("ghs_")),
        "an installation token was issued: {tokens:?}"
    );
    assert!(
        tokens.iter().any(|t| t.starts_with("eyJ")),
        "an admin token was issued: {tokens:?}"
    );
    let mut scanned: Vec<(&str, &str)> = private_key
        .lines()
        .filter(|line| !line.starts_with("-----") && !line.trim().is_empty())
        .map(|line| ("private key line", line))
        .collect();
    scanned.extend(
        tokens
            .iter()
            .map(|t| ("token issued by the fake", t.as_str())),
    );
    let jit_piece = &jit_config[jit_config.len() / 2..jit_config.len() / 2 + 40];
    scanned.push(("JIT config", jit_piece));
    assert_no_leak(&text, &scanned);
    // The App JWT the manager signs never comes back in a response; JWTs and installation tokens have shapes.
    for line in text.lines() {
        for marker in ["ghs_", "eyJhbGci", "PRIVATE KEY"] {
            assert!(
                !line.contains(marker),
                "a log line holds something shaped like a secret ({marker}): {line}"
            );
        }
    }
}

/// The listener pod the manager builds is admitted into a controller namespace that enforces the `restricted`
/// Pod Security Standard (the API server's own check of the default listener securityContext).
#[tokio::test]
async fn the_listener_pod_meets_the_restricted_pod_security_standard() {
    let env = Env::new("sec-pss").await;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client())
        .patch(
            &env.controller_namespace,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            }}})),
        )
        .await
        .expect("label the controller namespace");
    let manager = env.start(env.options());
    env.create_runner_set("pss", env.runner_set_spec()).await;
    let pod = env
        .eventually("the listener pod", || async {
            env.controller_pods()
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .next()
        })
        .await;
    let container = &pod.spec.expect("spec").containers[0];
    let context = container
        .security_context
        .as_ref()
        .expect("a securityContext");
    assert_eq!(context.run_as_non_root, Some(true));
    assert_eq!(context.read_only_root_filesystem, Some(true));
    manager.stop().await;
}
