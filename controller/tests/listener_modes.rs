//! The manager's listener mode (docs/listener-modes.md) against the real control plane and the fake Actions
//! Service: the manager serves a scale set with no listener pod or per-set object, its listener's metrics on its
//! own endpoint, and the set's report on the AutoscalingListener's status as a listener pod gives it; and a live
//! installation switches from listener pods to the manager and back with jobs flowing, each switch deleting the
//! old side's objects only once the new side holds the session.

mod ars_support;

use std::collections::BTreeSet;

use ars_support::Env;
use controller::options::ListenerMode;
use fake_actions_service::EnqueueJobs;
use kube::ResourceExt;
use kube::api::ListParams;

/// The session the fake holds for scale set `name`, if any.
fn session_of(env: &Env, name: &str) -> Option<String> {
    env.fake
        .state()
        .snapshot()
        .scale_sets
        .into_iter()
        .find(|set| set.name == name)
        .and_then(|set| set.session_id)
}

/// Queues `count` jobs for scale set `name`.
fn enqueue(env: &Env, name: &str, count: u32) {
    env.fake
        .state()
        .enqueue_jobs(&EnqueueJobs {
            scale_set_name: Some(name.to_owned()),
            count,
            ..EnqueueJobs::default()
        })
        .expect("enqueue jobs");
}

async fn wait_replicas(env: &Env, name: &str, replicas: i64) {
    env.eventually(&format!("{name} at {replicas} replicas"), || async {
        let set = env.ephemeral_runner_sets().get_opt(name).await.unwrap()?;
        (set.spec.replicas == replicas).then_some(())
    })
    .await;
}

/// The names of the listener objects in the controller namespace and the set's namespace: pods, ServiceAccounts,
/// Secrets, Roles and RoleBindings (the set's own credentials Secret left out).
async fn listener_objects(env: &Env) -> BTreeSet<String> {
    let list = ListParams::default();
    let mut names = BTreeSet::new();
    for pod in env.controller_pods().list(&list).await.unwrap() {
        names.insert(format!("pod/{}", pod.name_any()));
    }
    for account in env.controller_accounts().list(&list).await.unwrap() {
        // Every namespace has its `default` ServiceAccount.
        if account.name_any() != "default" {
            names.insert(format!("serviceaccount/{}", account.name_any()));
        }
    }
    for secret in env.controller_secrets().list(&list).await.unwrap() {
        names.insert(format!("secret/{}", secret.name_any()));
    }
    let labelled = ListParams::default().labels(crds::constants::LISTENER_NAME_LABEL);
    for role in env.roles().list(&labelled).await.unwrap() {
        names.insert(format!("role/{}", role.name_any()));
    }
    for binding in env.role_bindings().list(&labelled).await.unwrap() {
        names.insert(format!("rolebinding/{}", binding.name_any()));
    }
    names
}

async fn wait_served(env: &Env, name: &str) {
    env.eventually(&format!("{name}: ListenerReady=True"), || async {
        env.condition(name, "ListenerReady")
            .await
            .filter(|c| c.status == "True")
    })
    .await;
}

/// The session recorded on the set's AutoscalingListener status, once it is the one the fake holds.
async fn wait_recorded_session(env: &Env, name: &str) -> String {
    env.eventually(&format!("{name}: the held session recorded"), || async {
        let held = session_of(env, name)?;
        let listener = env
            .listeners()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|l| l.spec.autoscaling_runner_set_name == name)?;
        let status = listener.status?;
        let recorded = status.session?.id;
        (recorded == held && status.session_held == Some(true)).then_some(held)
    })
    .await
}

#[tokio::test]
async fn in_the_manager_mode_the_manager_serves_the_set_and_nothing_is_made_per_set() {
    let env = Env::new("lm-manager").await;
    let mut options = env.options();
    options.listener.mode = ListenerMode::Manager;
    let manager = env.start(options);
    env.create_runner_set("inproc", env.runner_set_spec()).await;

    wait_served(&env, "inproc").await;
    let session = wait_recorded_session(&env, "inproc").await;
    enqueue(&env, "inproc", 2);
    wait_replicas(&env, "inproc", 2).await;
    assert_eq!(
        listener_objects(&env).await,
        BTreeSet::new(),
        "no listener pod, ServiceAccount, Role, RoleBinding or Secret in the manager's listener mode"
    );
    assert_eq!(
        session_of(&env, "inproc").as_deref(),
        Some(session.as_str()),
        "one session all along"
    );
    // The listener's metrics, on the manager's endpoint, for this set.
    let text = manager.exposition.encode();
    let assigned = text
        .lines()
        .find(|line| line.starts_with("gha_assigned_jobs{") && line.contains("inproc"))
        .unwrap_or_else(|| panic!("no gha_assigned_jobs series for the set in:\n{text}"));
    assert!(assigned.ends_with(" 2"), "{assigned}");
    assert_eq!(
        text.matches("# TYPE gha_assigned_jobs ").count(),
        1,
        "one family header"
    );

    // Deleting the set stops its loop, which closes its session.
    env.runner_sets()
        .delete("inproc", &Default::default())
        .await
        .expect("delete the set");
    env.eventually("the set's session closed", || async {
        env.fake
            .state()
            .snapshot()
            .sessions
            .is_empty()
            .then_some(())
    })
    .await;
    env.eventually("the listener gone", || async {
        env.listeners()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    manager.stop().await;
}

#[tokio::test]
async fn a_live_installation_switches_from_pods_to_the_manager_and_back_with_jobs_flowing() {
    let env = Env::new("lm-switch").await;
    let executor = env.listener_executor();
    let mut spec = env.runner_set_spec();
    spec.max_runners = Some(10);

    // Pod mode, as ARC runs it.
    let pods = env.start(env.options());
    env.create_runner_set("switch", spec).await;
    wait_served(&env, "switch").await;
    let pod_session = wait_recorded_session(&env, "switch").await;
    assert!(
        listener_objects(&env)
            .await
            .iter()
            .any(|o| o.starts_with("pod/")),
        "a listener pod"
    );
    enqueue(&env, "switch", 1);
    wait_replicas(&env, "switch", 1).await;
    pods.stop().await;

    // The manager's listener mode: it takes the session over, then the pod and its objects go. Jobs queued
    // meanwhile reach the set.
    let mut options = env.options();
    options.listener.mode = ListenerMode::Manager;
    let manager = env.start(options);
    enqueue(&env, "switch", 2);
    let manager_session = env
        .eventually("the manager's session", || async {
            session_of(&env, "switch").filter(|id| *id != pod_session)
        })
        .await;
    wait_replicas(&env, "switch", 3).await;
    env.eventually("the listener pod's objects gone", || async {
        listener_objects(&env).await.is_empty().then_some(())
    })
    .await;
    assert_eq!(
        wait_recorded_session(&env, "switch").await,
        manager_session,
        "the manager's session is recorded, not the stopped pod's"
    );
    wait_served(&env, "switch").await;
    // A stopping manager closes its sessions before it lets go.
    manager.stop().await;
    assert_eq!(session_of(&env, "switch"), None, "closed at shutdown");

    // Back to pods.
    let pods = env.start(env.options());
    enqueue(&env, "switch", 1);
    env.eventually("a listener pod's session", || async {
        session_of(&env, "switch").filter(|id| *id != manager_session)
    })
    .await;
    wait_replicas(&env, "switch", 4).await;
    wait_served(&env, "switch").await;
    assert!(
        listener_objects(&env)
            .await
            .iter()
            .any(|o| o.starts_with("pod/")),
        "a listener pod again"
    );
    pods.stop().await;
    assert!(executor.errors().is_empty(), "{:?}", executor.errors());
}

#[tokio::test]
async fn a_set_whose_credentials_break_never_holds_up_another_set() {
    let env = Env::with_fake(
        "lm-isolated",
        fake_actions_service::Config {
            strict: Some(fake_actions_service::StrictAuth {
                pats: vec!["ghp_test".to_owned(), "ghp_other".to_owned()],
                apps: Vec::new(),
            }),
            ..fake_actions_service::Config::default()
        },
    )
    .await;
    let other = "other-credentials";
    let put_other = |token: &'static str| {
        let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> = env.ctx.api();
        async move {
            let secret = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": other},
                "stringData": {"github_token": token},
            });
            secrets
                .patch(
                    other,
                    &kube::api::PatchParams::apply("test").force(),
                    &kube::api::Patch::Apply(&secret),
                )
                .await
                .expect("apply the other credentials");
        }
    };
    put_other("ghp_other").await;
    let mut options = env.options();
    options.listener.mode = ListenerMode::Manager;
    let manager = env.start(options);
    env.create_runner_set("good", env.runner_set_spec()).await;
    let mut broken = env.runner_set_spec();
    broken.github_config_secret = other.to_owned();
    env.create_runner_set("broken", broken).await;
    wait_served(&env, "good").await;
    wait_served(&env, "broken").await;

    // The other set's token is revoked: its loop restarts with it and cannot hold a session.
    put_other("ghp_revoked").await;
    env.eventually("broken: ListenerReady=False", || async {
        env.condition("broken", "ListenerReady")
            .await
            .filter(|c| c.status == "False")
    })
    .await;
    let started = tokio::time::Instant::now();
    enqueue(&env, "good", 2);
    wait_replicas(&env, "good", 2).await;
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(15),
        "the healthy set scaled {took:?} after its jobs, beside a failing one"
    );
    let good = env.condition("good", "ListenerReady").await;
    assert_eq!(good.map(|c| c.status).as_deref(), Some("True"));
    manager.stop().await;
}
