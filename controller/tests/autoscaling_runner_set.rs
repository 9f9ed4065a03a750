//! The AutoscalingRunnerSet and AutoscalingListener controllers against a real API server and the fake Actions
//! Service: what an AutoscalingRunnerSet creates, updates and removes, and the conditions it reports.

mod ars_support;

use std::pin::pin;
use std::time::Duration;

use ars_support::{CREDENTIALS, Env, WAIT};
use controller::kubeutil::{remove_finalizers, still_finalizing};
use crds::AutoscalingRunnerSet;
use crds::constants::{
    AUTOSCALING_RUNNER_SET_FINALIZER, CLEANUP_GITHUB_SECRET_NAME_ANNOTATION,
    CLEANUP_PROTECTION_FINALIZER, RUNNER_SCALE_SET_ID_ANNOTATION,
};
use futures::StreamExt;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

fn scale_set_id(set: &crds::AutoscalingRunnerSet) -> Option<i64> {
    set.annotations()
        .get(RUNNER_SCALE_SET_ID_ANNOTATION)?
        .parse()
        .ok()
}

/// Waits for the set's scale set id annotation and returns it.
async fn wait_for_scale_set(env: &Env, name: &str) -> i64 {
    env.eventually("the scale set id annotation", || async {
        env.runner_set(name).await.as_ref().and_then(scale_set_id)
    })
    .await
}

/// Waits for the listener of a set and returns its name.
async fn wait_for_listener(env: &Env, set: &str) -> crds::AutoscalingListener {
    env.eventually("the AutoscalingListener", || async {
        env.listeners()
            .list(&Default::default())
            .await
            .expect("list listeners")
            .items
            .into_iter()
            .find(|l| {
                l.spec.autoscaling_runner_set_name == set && l.metadata.deletion_timestamp.is_none()
            })
    })
    .await
}

async fn config_json(env: &Env, listener: &str) -> Value {
    let secret = env
        .controller_secrets()
        .get(&format!("{listener}-config"))
        .await
        .expect("config secret");
    let bytes = &secret.data.expect("data")["config.json"].0;
    serde_json::from_slice(bytes).expect("config.json is JSON")
}

#[tokio::test]
async fn a_runner_set_gets_a_scale_set_a_runner_set_and_a_listener() {
    let env = Env::new("ars-basic").await;
    let manager = env.start(env.options());
    let mut spec = env.runner_set_spec();
    spec.runner_scale_set_labels = vec!["linux".to_owned(), "basic".to_owned()];
    env.create_runner_set("basic", spec).await;

    let id = wait_for_scale_set(&env, "basic").await;
    let snapshot = env.fake.state().snapshot();
    let scale_set = snapshot
        .scale_sets
        .iter()
        .find(|s| s.id == id)
        .expect("scale set in the fake");
    assert_eq!(scale_set.name, "basic");
    let labels: Vec<_> = scale_set.labels.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(labels, ["basic", "linux"]);
    assert!(scale_set.disable_update);

    let set = env.runner_set("basic").await.expect("ARS");
    assert!(
        set.finalizers()
            .contains(&AUTOSCALING_RUNNER_SET_FINALIZER.to_owned())
    );
    assert_eq!(set.spec.runner_scale_set_name, "basic");
    assert_eq!(set.labels()["actions.github.com/organization"], "org");

    let ers = env
        .eventually("the EphemeralRunnerSet", || async {
            env.ephemeral_runner_sets()
                .get_opt("basic")
                .await
                .expect("get ERS")
        })
        .await;
    assert_eq!(ers.spec.ephemeral_runner_spec.runner_scale_set_id, id);
    assert_eq!(
        ers.spec.ephemeral_runner_spec.github_config_secret,
        CREDENTIALS
    );

    let listener = wait_for_listener(&env, "basic").await;
    let name = listener.name_any();
    assert_eq!(listener.spec.runner_scale_set_id, id);
    assert_eq!(listener.spec.max_runners, 3);
    let pod = env
        .eventually("the listener pod", || async {
            env.controller_pods().get_opt(&name).await.expect("get pod")
        })
        .await;
    let spec = pod.spec.expect("pod spec");
    assert_eq!(spec.service_account_name.as_deref(), Some(name.as_str()));
    assert_eq!(
        spec.containers[0].image.as_deref(),
        Some("ghcr.io/example/arc-rs:test")
    );
    assert_eq!(spec.termination_grace_period_seconds, Some(60));

    let config = config_json(&env, &name).await;
    assert_eq!(config["github_token"], "ghp_test");
    assert_eq!(config["runner_scale_set_id"], id);
    assert_eq!(config["ephemeral_runner_set_name"], "basic");
    assert_eq!(
        config["ephemeral_runner_set_namespace"],
        env.ctx.namespace.as_str()
    );
    assert_eq!(config["max_runners"], 3);

    assert!(
        env.controller_accounts()
            .get_opt(&name)
            .await
            .unwrap()
            .is_some()
    );
    let role = env.roles().get(&name).await.expect("Role");
    assert_eq!(role.rules.expect("rules").len(), 2);
    let binding = env.role_bindings().get(&name).await.expect("RoleBinding");
    assert_eq!(binding.role_ref.name, name);

    // Nothing runs the listener pod here, so the set waits for it and says so.
    let listener_ready = env
        .eventually("the ListenerReady condition", || async {
            env.condition("basic", "ListenerReady").await
        })
        .await;
    assert_eq!(listener_ready.status, "False");
    let scale_set_ready = env
        .condition("basic", "ScaleSetReady")
        .await
        .expect("condition");
    assert_eq!(scale_set_ready.status, "True");
    assert_eq!(
        env.runner_set("basic").await.unwrap().status.unwrap().phase,
        "Running"
    );
    manager.stop().await;
}

#[tokio::test]
async fn the_listener_may_patch_only_its_own_runner_set() {
    let env = Env::new("ars-rbac").await;
    let manager = env.start(env.options());
    env.create_runner_set("rbac", env.runner_set_spec()).await;
    let listener = wait_for_listener(&env, "rbac").await.name_any();
    env.eventually("the RoleBinding", || async {
        env.role_bindings().get_opt(&listener).await.unwrap()
    })
    .await;
    let user = format!(
        "system:serviceaccount:{}:{listener}",
        env.controller_namespace
    );
    let reviews: Api<SubjectAccessReview> = Api::all(env.client());
    let can = |verb: &'static str, resource: &'static str, name: Option<&'static str>| {
        let reviews = reviews.clone();
        let user = user.clone();
        let namespace = env.ctx.namespace.clone();
        async move {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user),
                    groups: Some(vec!["system:serviceaccounts".to_owned()]),
                    resource_attributes: Some(ResourceAttributes {
                        group: Some("actions.github.com".to_owned()),
                        resource: Some(resource.to_owned()),
                        verb: Some(verb.to_owned()),
                        namespace: Some(namespace),
                        name: name.map(str::to_owned),
                        ..ResourceAttributes::default()
                    }),
                    ..SubjectAccessReviewSpec::default()
                },
                ..SubjectAccessReview::default()
            };
            reviews
                .create(&PostParams::default(), &review)
                .await
                .expect("SubjectAccessReview")
                .status
                .is_some_and(|status| status.allowed)
        }
    };
    assert!(can("patch", "ephemeralrunnersets", Some("rbac")).await);
    assert!(!can("patch", "ephemeralrunnersets", Some("someone-else")).await);
    assert!(!can("update", "ephemeralrunnersets", Some("rbac")).await);
    assert!(!can("delete", "ephemeralrunnersets", Some("rbac")).await);
    assert!(!can("get", "ephemeralrunnersets", Some("rbac")).await);
    // Only `ephemeralrunners/status` (checked in security.rs), never the runner's spec.
    assert!(!can("patch", "ephemeralrunners", Some("any-runner")).await);
    assert!(!can("delete", "ephemeralrunners", Some("any-runner")).await);
    assert!(!can("create", "autoscalingrunnersets", None).await);
    manager.stop().await;
}

#[tokio::test]
async fn a_spec_change_updates_the_scale_set_and_recreates_the_listener() {
    let env = Env::new("ars-update").await;
    let manager = env.start(env.options());
    env.create_runner_set("update", env.runner_set_spec()).await;
    let id = wait_for_scale_set(&env, "update").await;
    let before = wait_for_listener(&env, "update").await;

    env.runner_sets()
        .patch(
            "update",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxRunners": 7, "runnerScaleSetName": "renamed"}})),
        )
        .await
        .expect("patch the ARS");
    env.eventually("the scale set renamed in the fake", || async {
        env.fake
            .state()
            .snapshot()
            .scale_sets
            .iter()
            .any(|s| s.id == id && s.name == "renamed")
            .then_some(())
    })
    .await;
    let after = env
        .eventually("a new listener with the new maximum", || async {
            let listener = wait_for_listener(&env, "update").await;
            (listener.uid() != before.uid() && listener.spec.max_runners == 7).then_some(listener)
        })
        .await;
    let name = after.name_any();
    env.eventually("the new config", || async {
        let config = env
            .controller_secrets()
            .get_opt(&format!("{name}-config"))
            .await
            .unwrap()?;
        let value: Value = serde_json::from_slice(&config.data?["config.json"].0).ok()?;
        (value["max_runners"] == 7).then_some(())
    })
    .await;
    // The same scale set is kept.
    assert_eq!(
        scale_set_id(&env.runner_set("update").await.unwrap()),
        Some(id)
    );
    manager.stop().await;
}

#[tokio::test]
async fn deletion_cleans_up_everything_even_across_a_restart() {
    let env = Env::new("ars-delete").await;
    let manager = env.start(env.options());
    let mut spec = env.runner_set_spec();
    spec.runner_scale_set_name = "to-delete".to_owned();
    env.create_runner_set("delete", spec).await;
    // A Helm-style protected credentials Secret, named on the set.
    env.runner_sets()
        .patch(
            "delete",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {CLEANUP_GITHUB_SECRET_NAME_ANNOTATION: CREDENTIALS}}})),
        )
        .await
        .expect("annotate");
    env.ctx
        .api::<k8s_openapi::api::core::v1::Secret>()
        .patch(
            CREDENTIALS,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": [CLEANUP_PROTECTION_FINALIZER]}})),
        )
        .await
        .expect("protect the Secret");
    wait_for_scale_set(&env, "delete").await;
    let listener = wait_for_listener(&env, "delete").await.name_any();
    env.eventually("the listener pod", || async {
        env.controller_pods().get_opt(&listener).await.unwrap()
    })
    .await;

    env.runner_sets()
        .delete("delete", &DeleteParams::default())
        .await
        .expect("delete the ARS");
    // Stop the manager in the middle of the deletion, then start a new one.
    env.eventually("the deletion to start", || async {
        env.listeners()
            .get_opt(&listener)
            .await
            .unwrap()
            .is_none_or(|l| l.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;
    manager.stop().await;
    let manager = env.start(env.options());

    env.eventually("the ARS to be gone", || async {
        env.runner_set("delete").await.is_none().then_some(())
    })
    .await;
    assert!(
        env.scale_sets_named("to-delete").is_empty(),
        "scale set left in the fake"
    );
    assert!(env.listeners().get_opt(&listener).await.unwrap().is_none());
    assert!(
        env.controller_pods()
            .get_opt(&listener)
            .await
            .unwrap()
            .is_none()
    );
    for secret in [format!("{listener}-config"), format!("{listener}-proxy")] {
        assert!(
            env.controller_secrets()
                .get_opt(&secret)
                .await
                .unwrap()
                .is_none()
        );
    }
    assert!(
        env.controller_accounts()
            .get_opt(&listener)
            .await
            .unwrap()
            .is_none()
    );
    assert!(env.roles().get_opt(&listener).await.unwrap().is_none());
    assert!(
        env.role_bindings()
            .get_opt(&listener)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        env.ephemeral_runner_sets()
            .get_opt("delete")
            .await
            .unwrap()
            .is_none()
    );
    let secret = env
        .ctx
        .api::<k8s_openapi::api::core::v1::Secret>()
        .get(CREDENTIALS)
        .await
        .expect("the Secret is kept");
    assert!(
        !secret
            .finalizers()
            .contains(&CLEANUP_PROTECTION_FINALIZER.to_owned())
    );
    manager.stop().await;
}

/// A protected Secret (Helm's kind, named on the set) and a set that names it, as `helm install` creates them.
async fn install_protected(env: &Env, name: &str, secret: &str) -> (String, String) {
    let protected = Secret {
        metadata: ObjectMeta {
            name: Some(secret.to_owned()),
            finalizers: Some(vec![CLEANUP_PROTECTION_FINALIZER.to_owned()]),
            ..ObjectMeta::default()
        },
        ..Secret::default()
    };
    let protected = env
        .ctx
        .api::<Secret>()
        .create(&PostParams::default(), &protected)
        .await
        .expect("create the protected Secret");
    let mut set = AutoscalingRunnerSet::new(name, env.runner_set_spec());
    set.metadata.annotations = Some(
        [(
            CLEANUP_GITHUB_SECRET_NAME_ANNOTATION.to_owned(),
            secret.to_owned(),
        )]
        .into(),
    );
    let set = env
        .runner_sets()
        .create(&PostParams::default(), &set)
        .await
        .expect("create the set");
    (set.uid().expect("uid"), protected.uid().expect("uid"))
}

/// `helm uninstall` then at once `helm install` of the same release, three times: the old set's deletion ends with
/// passes that can run from a cache still holding it (its own last writes queue them), and everything such a pass
/// does goes by name; it must leave the new install's objects alone. The protected Secret of the new install keeps
/// its finalizer, and the new set gets its own runner set and listener and keeps them.
#[tokio::test]
async fn a_set_installed_again_the_moment_the_old_one_is_gone_keeps_everything_it_was_given() {
    const SET: &str = "again";
    const PROTECTED: &str = "again-protected";
    let env = Env::new("ars-again").await;
    let manager = env.start(env.options());
    let secrets = env.ctx.api::<Secret>();
    install_protected(&env, SET, PROTECTED).await;
    for round in 0..3 {
        let listener = wait_for_listener(&env, SET).await;
        env.eventually("the runner set", || async {
            env.ephemeral_runner_sets().get_opt(SET).await.unwrap()
        })
        .await;
        // Follow the set from before the uninstall, so the new install comes the moment its deletion ends.
        let sets = env.runner_sets();
        let config = watcher::Config::default().fields(&format!("metadata.name={SET}"));
        let mut events = pin!(watcher(sets.clone(), config));
        loop {
            if let Some(Ok(watcher::Event::InitDone)) = events.next().await {
                break;
            }
        }
        sets.delete(SET, &DeleteParams::default())
            .await
            .expect("delete the set");
        secrets
            .delete(PROTECTED, &DeleteParams::default())
            .await
            .expect("delete the protected Secret");
        tokio::time::timeout(WAIT, async {
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Delete(_)) = event {
                    return;
                }
            }
        })
        .await
        .expect("the set's deletion ends");
        let (set_uid, secret_uid) = install_protected(&env, SET, PROTECTED).await;

        // The new set converges: a runner set and a listener of its own.
        let new_listener = env
            .eventually("the new set's listener", || async {
                env.listeners()
                    .get_opt(&listener.name_any())
                    .await
                    .unwrap()
                    .filter(|l| {
                        l.uid() != listener.uid() && l.metadata.deletion_timestamp.is_none()
                    })
            })
            .await;
        let runner_set = env
            .eventually("the new set's runner set", || async {
                env.ephemeral_runner_sets()
                    .get_opt(SET)
                    .await
                    .unwrap()
                    .filter(|ers| ers.owner_references().iter().any(|o| o.uid == set_uid))
            })
            .await;
        let set = env.runner_set(SET).await.expect("the new set");
        assert_eq!(
            set.uid().as_deref(),
            Some(set_uid.as_str()),
            "round {round}"
        );
        assert!(set.metadata.deletion_timestamp.is_none(), "round {round}");
        assert!(
            set.finalizers()
                .contains(&AUTOSCALING_RUNNER_SET_FINALIZER.to_owned()),
            "round {round}: {:?}",
            set.finalizers()
        );
        assert!(
            runner_set.metadata.deletion_timestamp.is_none(),
            "round {round}"
        );
        assert!(
            new_listener.metadata.deletion_timestamp.is_none(),
            "round {round}"
        );
        let secret = secrets.get(PROTECTED).await.expect("the new Secret");
        assert_eq!(
            secret.uid().as_deref(),
            Some(secret_uid.as_str()),
            "round {round}"
        );
        assert!(
            secret
                .finalizers()
                .contains(&CLEANUP_PROTECTION_FINALIZER.to_owned()),
            "round {round}: the new install's Secret lost its protection: {:?}",
            secret.finalizers()
        );
    }
    manager.stop().await;
}

/// The deletion helpers' guards against a copy of a deleted object from a cache: once an object is gone and
/// another takes its name, the copy is no longer "still finalizing", and a finalizer edit made from it leaves the
/// successor as it is (the uid is part of the edit's precondition).
#[tokio::test]
async fn a_copy_of_a_deleted_object_touches_nothing_of_its_successor() {
    const FINALIZER: &str = "arc-rs.test/guard";
    let env = Env::new("ars-guard").await;
    let api = env.ctx.api::<ConfigMap>();
    let create = || async {
        let object = ConfigMap {
            metadata: ObjectMeta {
                name: Some("guarded".to_owned()),
                finalizers: Some(vec![FINALIZER.to_owned()]),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &object)
            .await
            .expect("create");
        api.delete("guarded", &DeleteParams::default())
            .await
            .expect("delete");
        api.get("guarded").await.expect("being deleted")
    };
    let first = create().await;
    let fresh = still_finalizing(&api, &first, &[FINALIZER])
        .await
        .expect("read")
        .expect("the object being deleted is still finalizing");
    assert_eq!(fresh.uid(), first.uid());
    remove_finalizers(&api, &fresh, &[FINALIZER])
        .await
        .expect("finalize");
    assert!(api.get_opt("guarded").await.unwrap().is_none());

    let successor = create().await;
    assert!(
        still_finalizing(&api, &first, &[FINALIZER])
            .await
            .expect("read")
            .is_none(),
        "the copy of the first object is finalizing the successor"
    );
    // From the stale copy the edit is refused; the successor keeps its finalizer.
    assert!(remove_finalizers(&api, &first, &[FINALIZER]).await.is_err());
    let now = api.get("guarded").await.expect("the successor");
    assert_eq!(now.uid(), successor.uid());
    assert_eq!(now.finalizers(), [FINALIZER.to_owned()]);
    remove_finalizers(&api, &now, &[FINALIZER])
        .await
        .expect("finalize the successor");
}

#[tokio::test]
async fn a_scale_set_deleted_on_github_is_recreated_and_the_listener_follows() {
    let env = Env::new("ars-recreate").await;
    let manager = env.start(env.options());
    let mut spec = env.runner_set_spec();
    spec.runner_group = "gpu".to_owned();
    spec.runner_scale_set_labels = vec!["cuda".to_owned()];
    env.create_runner_set("recreate", spec).await;
    let old = wait_for_scale_set(&env, "recreate").await;
    wait_for_listener(&env, "recreate").await;

    env.fake
        .state()
        .delete_scale_set(old, true)
        .expect("delete in the fake");
    let new = env
        .eventually("a new scale set id", || async {
            let id = scale_set_id(&env.runner_set("recreate").await?)?;
            (id != old).then_some(id)
        })
        .await;
    let snapshot = env.fake.state().snapshot();
    let recreated = snapshot
        .scale_sets
        .iter()
        .find(|s| s.id == new)
        .expect("in the fake");
    assert_eq!(recreated.name, "recreate");
    assert_eq!(recreated.runner_group_name, "gpu");
    let labels: Vec<_> = recreated.labels.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(labels, ["recreate", "cuda"]);
    env.eventually("the listener on the new scale set", || async {
        let listener = wait_for_listener(&env, "recreate").await;
        (listener.spec.runner_scale_set_id == new).then_some(())
    })
    .await;
    env.eventually("the runner set on the new scale set", || async {
        let ers = env
            .ephemeral_runner_sets()
            .get_opt("recreate")
            .await
            .unwrap()?;
        (ers.spec.ephemeral_runner_spec.runner_scale_set_id == new).then_some(())
    })
    .await;
    assert!(!env.events("recreate", "ScaleSetRecreated").await.is_empty());
    manager.stop().await;
}

/// Runners made for a scale set that GitHub no longer has cannot register (every JIT request gets 404); once the
/// scale set is re-created they are replaced by runners of the new one instead of retrying forever.
#[tokio::test]
async fn runners_waiting_on_a_deleted_scale_set_are_replaced_once_it_is_recreated() {
    let env = Env::new("ars-stale-id").await;
    let manager = env.start(env.options());
    env.create_runner_set("stale-id", env.runner_set_spec())
        .await;
    let old = wait_for_scale_set(&env, "stale-id").await;
    env.eventually("the runner set", || async {
        env.ephemeral_runner_sets()
            .get_opt("stale-id")
            .await
            .unwrap()
    })
    .await;
    // GitHub forgets the scale set, and before the controller notices, the listener asks for two runners.
    env.fake
        .state()
        .delete_scale_set(old, true)
        .expect("delete in the fake");
    env.ephemeral_runner_sets()
        .patch(
            "stale-id",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 2, "patchID": 0 } })),
        )
        .await
        .expect("scale up");
    let runners: Api<crds::EphemeralRunner> = Api::namespaced(
        env.client(),
        &env.runner_set("stale-id")
            .await
            .unwrap()
            .namespace()
            .unwrap(),
    );
    let new = env
        .eventually(
            "two registered runners of the re-created scale set",
            || async {
                let id = scale_set_id(&env.runner_set("stale-id").await?)?;
                // Registered: the service knows the name (the status records the identity only once the pod,
                // which no kubelet runs here, shows a state worth a write).
                let registered: Vec<String> = env
                    .fake
                    .state()
                    .snapshot()
                    .runners
                    .into_iter()
                    .filter(|runner| runner.scale_set_id == id)
                    .map(|runner| runner.name)
                    .collect();
                let live: Vec<_> = runners
                    .list(&Default::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .filter(|runner| runner.metadata.deletion_timestamp.is_none())
                    .collect();
                (id != old
                    && live.len() == 2
                    && live.iter().all(|runner| {
                        runner.spec.runner_scale_set_id == id
                            && registered.contains(&runner.name_any())
                    }))
                .then_some(id)
            },
        )
        .await;
    let snapshot = env.fake.state().snapshot();
    assert_eq!(
        snapshot
            .runners
            .iter()
            .filter(|runner| runner.scale_set_id == new)
            .count(),
        2,
        "both runners registered with the new scale set"
    );
    manager.stop().await;
}

#[tokio::test]
async fn rotated_credentials_reach_the_listener() {
    let env = Env::new("ars-rotate").await;
    let manager = env.start(env.options());
    env.create_runner_set("rotate", env.runner_set_spec()).await;
    let listener = wait_for_listener(&env, "rotate").await.name_any();
    let first = env
        .eventually("the listener pod", || async {
            env.controller_pods().get_opt(&listener).await.unwrap()
        })
        .await;
    assert_eq!(
        config_json(&env, &listener).await["github_token"],
        "ghp_test"
    );

    env.put_credentials(b"ghp_rotated").await;
    env.eventually("the new token in the listener config", || async {
        (config_json(&env, &listener).await["github_token"] == "ghp_rotated").then_some(())
    })
    .await;
    env.eventually("a new listener pod", || async {
        let pod = env.controller_pods().get_opt(&listener).await.unwrap()?;
        (pod.uid() != first.uid()).then_some(())
    })
    .await;
    manager.stop().await;
}

/// A configuration problem gives a False condition with a fixed reason and a Warning Event, and is retried
/// slowly (the options say at most every 5 s).
async fn assert_reported_without_hot_loop(
    env: &Env,
    manager: &ars_support::Running,
    set: &str,
    reason: &str,
) {
    let ready = env
        .eventually(&format!("Ready=False/{reason}"), || async {
            env.condition(set, "Ready")
                .await
                .filter(|c| c.status == "False" && c.reason == reason)
        })
        .await;
    assert!(!ready.message.is_empty());
    env.eventually(&format!("a {reason} Event"), || async {
        (!env.events(set, reason).await.is_empty()).then_some(())
    })
    .await;
    let before = manager.reconciles("autoscalingrunnerset");
    tokio::time::sleep(Duration::from_secs(8)).await;
    let during = manager.reconciles("autoscalingrunnerset") - before;
    assert!(during <= 4, "{during} reconciles in 8 s: a hot loop");
}

#[tokio::test]
async fn a_missing_secret_is_reported_without_a_hot_loop() {
    let env = Env::new("ars-nosecret").await;
    let manager = env.start(env.options());
    let mut spec = env.runner_set_spec();
    spec.github_config_secret = "does-not-exist".to_owned();
    env.create_runner_set("nosecret", spec).await;
    assert_reported_without_hot_loop(&env, &manager, "nosecret", "CredentialsSecretMissing").await;
    manager.stop().await;
}

#[tokio::test]
async fn a_secret_with_a_bad_key_is_reported_without_a_hot_loop() {
    let env = Env::new("ars-badkey").await;
    env.put_secret_data(&[
        ("github_app_id", b"123"),
        ("github_app_installation_id", b"not-a-number"),
        ("github_app_private_key", b"-----BEGIN RSA PRIVATE KEY-----"),
    ])
    .await;
    let manager = env.start(env.options());
    env.create_runner_set("badkey", env.runner_set_spec()).await;
    assert_reported_without_hot_loop(&env, &manager, "badkey", "CredentialsInvalid").await;
    manager.stop().await;
}

#[tokio::test]
async fn an_unknown_runner_group_is_reported_without_a_hot_loop() {
    let env = Env::new("ars-nogroup").await;
    let manager = env.start(env.options());
    let mut spec = env.runner_set_spec();
    spec.runner_group = "no-such-group".to_owned();
    env.create_runner_set("nogroup", spec).await;
    assert_reported_without_hot_loop(&env, &manager, "nogroup", "RunnerGroupNotFound").await;
    let lookups = env.fake.state().count("get_runner_group_by_name");
    assert!(lookups <= 6, "{lookups} runner group lookups");
    // Fixing the spec recovers without a restart.
    env.runner_sets()
        .patch(
            "nogroup",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"runnerGroup": "gpu"}})),
        )
        .await
        .expect("fix the group");
    env.eventually("ScaleSetReady=True", || async {
        env.condition("nogroup", "ScaleSetReady")
            .await
            .filter(|c| c.status == "True")
    })
    .await;
    manager.stop().await;
}

#[tokio::test]
async fn sets_made_by_arc_are_adopted_and_other_versions_left_alone_with_a_condition() {
    // Switching from ARC by changing images keeps ARC's chart labels: `app.kubernetes.io/version: 0.14.2`.
    let env = Env::new("ars-version").await;
    let mut options = env.options();
    options.build_version = "0.1.0".to_owned();
    let manager = env.start(options);
    for (name, version) in [("from-arc", "0.14.2"), ("too-old", "0.11.0")] {
        let mut set = crds::AutoscalingRunnerSet::new(name, env.runner_set_spec());
        set.metadata.labels =
            Some([("app.kubernetes.io/version".to_owned(), version.to_owned())].into());
        env.runner_sets()
            .create(&PostParams::default(), &set)
            .await
            .expect("create the AutoscalingRunnerSet");
    }
    let id = wait_for_scale_set(&env, "from-arc").await;
    assert!(id > 0);
    wait_for_listener(&env, "from-arc").await;
    // ARC deletes such a set, which uninstalls its scale set; it is left alone and says why.
    let refused = env
        .eventually("the incompatible set refused", || async {
            let set = env.runner_set("too-old").await?;
            let conditions = set.status?.conditions;
            conditions
                .into_iter()
                .find(|condition| condition.reason == "VersionNotAccepted")
        })
        .await;
    assert_eq!(refused.status, "False", "{refused:?}");
    assert!(
        refused
            .message
            .contains("nothing of this scale set is changed or deleted")
    );
    let events = env.events("too-old", "VersionNotAccepted").await;
    assert!(
        events.iter().any(|e| e
            .message
            .as_deref()
            .is_some_and(|m| m.contains("\"0.11.0\""))),
        "{events:?}"
    );
    assert!(
        env.scale_sets_named("too-old").is_empty(),
        "no scale set is created for a rejected set"
    );
    assert!(env.runner_set("from-arc").await.is_some());
    assert!(
        env.runner_set("too-old").await.is_some(),
        "a set of another version is never deleted"
    );
    manager.stop().await;
}
