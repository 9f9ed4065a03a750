//! The EphemeralRunnerSet and EphemeralRunner controllers against a real API server (test-harness) and the
//! fake Actions Service, with the manager running in-process and the test acting as kubelet and listener.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Env, registered_runners};
use crds::EphemeralRunner;
use crds::constants::{APPLIED_GENERATION_ANNOTATION, COMPLETED_RUNNERS_ANNOTATION};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

fn runner_id(runner: &EphemeralRunner) -> i64 {
    runner.status.as_ref().map_or(0, |status| status.runner_id)
}

#[tokio::test]
async fn a_set_scales_from_0_to_50_and_back_to_0() {
    let env = Env::new("ers-scale").await;
    env.create_set("arc", 0, 0).await;
    let manager = env.start(env.options());

    env.scale("arc", 50, 1).await;
    let runners = env
        .eventually("50 registered runners with pods", || async {
            let runners = env.runners().await;
            assert!(
                runners.len() <= 50,
                "never more runners than asked for: {}",
                runners.len()
            );
            let pods = env.pods().await;
            (registered_runners(&runners, &env.registered()) == 50 && pods.len() == 50)
                .then_some(runners)
        })
        .await;
    let names: BTreeSet<String> = runners.iter().map(ResourceExt::name_any).collect();
    assert_eq!(
        env.registered(),
        names,
        "every runner is registered once, under its own name"
    );
    assert_eq!(env.jit_secrets().await.len(), 50);
    for runner in &runners {
        assert_eq!(runner.annotations()["actions.github.com/patch-id"], "1");
        assert_eq!(
            runner.finalizers(),
            [
                "ephemeralrunner.actions.github.com/finalizer",
                "ephemeralrunner.actions.github.com/runner-registration-finalizer"
            ]
        );
    }
    // Half the pods start running; the rest stay pending.
    for name in names.iter().take(25) {
        env.run_pod(name).await;
    }
    env.eventually("status counts", || async {
        let set = env.sets().get("arc").await.expect("set");
        let status = set.status.unwrap_or_default();
        (status.current_replicas == 50
            && status.running_ephemeral_runners == 25
            && status.pending_ephemeral_runners == 25)
            .then_some(())
    })
    .await;

    env.scale("arc", 0, 0).await;
    env.eventually(
        "no runners, pods, Secrets or registrations left",
        || async {
            let done = env.runners().await.is_empty()
                && env.pods().await.is_empty()
                && env.jit_secrets().await.is_empty()
                && env.registered().is_empty();
            done.then_some(())
        },
    )
    .await;
    env.eventually("status at zero", || async {
        let status = env
            .sets()
            .get("arc")
            .await
            .expect("set")
            .status
            .unwrap_or_default();
        (status.current_replicas == 0).then_some(())
    })
    .await;
    manager.stop().await;
}

#[tokio::test]
async fn a_runner_whose_pod_keeps_failing_is_replaced() {
    let env = Env::new("er-failures").await;
    env.create_set("arc", 1, 0).await;
    let manager = env.start(env.options());

    let first = env
        .eventually("a runner", || async {
            env.runners().await.into_iter().next().map(|r| r.name_any())
        })
        .await;
    let mut seen_pods = BTreeSet::new();
    let mut seen_tokens = BTreeSet::new();
    // ARC's budget: the sixth failure gives the runner up.
    for attempt in 1..=6 {
        let uid = env
            .eventually("a new pod", || async {
                env.pod_uids()
                    .await
                    .into_iter()
                    .find(|(name, uid)| *name == first && !seen_pods.contains(uid))
                    .map(|(_, uid)| uid)
            })
            .await;
        seen_pods.insert(uid);
        let secret = env.secrets_api().get(&first).await.expect("JIT Secret");
        let token = secret.data.expect("data")["jitToken"].0.clone();
        assert!(
            seen_tokens.insert(token),
            "attempt {attempt} got a fresh JIT config"
        );
        env.end_pod(&first, "Failed", Some(1), None).await;
        if attempt < 6 {
            env.eventually("the failure recorded", || async {
                let runner = env.runners_api().get(&first).await.ok()?;
                let failures = runner.status?.failures.len();
                (failures == attempt).then_some(())
            })
            .await;
        }
    }
    let replacement = env
        .eventually("a replacement runner", || async {
            let runners = env.runners().await;
            let gone = runners.iter().all(|runner| runner.name_any() != first);
            let other = runners
                .into_iter()
                .find(|runner| runner.name_any() != first);
            if gone { other } else { None }
        })
        .await;
    assert!(
        replacement
            .status
            .is_none_or(|status| status.failures.is_empty())
    );
    env.eventually("the old registration removed", || async {
        (!env.registered().contains(&first)).then_some(())
    })
    .await;
    manager.stop().await;
}

#[tokio::test]
async fn an_eviction_is_not_counted_as_a_failure() {
    let env = Env::new("er-eviction").await;
    env.create_set("arc", 1, 0).await;
    let manager = env.start(env.options());

    let (name, uid) = env
        .eventually("a pod", || async {
            env.pod_uids().await.into_iter().next()
        })
        .await;
    env.run_pod(&name).await;
    env.end_pod(&name, "Failed", Some(137), Some("Evicted"))
        .await;
    let (_, new_uid) = env
        .eventually("a new pod for the same runner", || async {
            env.pod_uids()
                .await
                .into_iter()
                .find(|(n, u)| *n == name && *u != uid)
        })
        .await;
    assert_ne!(new_uid, uid);
    let runner = env
        .runners_api()
        .get(&name)
        .await
        .expect("the runner is kept");
    let status = runner.status.expect("status");
    assert!(
        status.failures.is_empty(),
        "evictions are not failures: {:?}",
        status.failures
    );
    manager.stop().await;
}

/// A scale-down that finds a runner mid-registration keeps it (it cannot be asked about before its deletion). Once
/// its pod exists, its runner holds no job until the pod starts, so it may go; nothing on the runner object changes
/// then (the manager records the identity only with the pod's first state worth showing), so the pod's appearance
/// must bring the set back, or the runner would stay until it ran.
#[tokio::test]
async fn a_runner_kept_mid_registration_by_a_scale_down_goes_once_its_pod_exists() {
    let env = Env::new("ers-mid-registration").await;
    env.create_set("arc", 0, 0).await;
    env.slow_down("generate_jit_config", 3_000);
    let manager = env.start(env.options());

    env.scale("arc", 1, 1).await;
    env.eventually("the registration requested", || async {
        (env.fake.state().count("generate_jit_config") == 1).then_some(())
    })
    .await;
    // Authoritative: no runner wanted, while the only one waits for its JIT configuration.
    env.scale("arc", 0, 0).await;
    env.eventually("the runner gone once its pod was made", || async {
        let gone = env.runners().await.is_empty() && env.pods().await.is_empty();
        gone.then_some(())
    })
    .await;
    assert_eq!(
        env.fake.state().count("generate_jit_config"),
        1,
        "no registration after the scale-down"
    );
    assert!(env.registered().is_empty(), "its registration removed");
    manager.stop().await;
}

#[tokio::test]
async fn a_runner_busy_on_removal_is_requeued_until_its_job_ends() {
    let env = Env::new("er-busy").await;
    env.create_set("arc", 1, 0).await;
    let manager = env.start(env.options());

    let runner = env.start_a_runner().await;
    let name = runner.name_any();
    let job = env.assign_job(runner_id(&runner)).await;
    env.runners_api()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the runner");
    // The service refuses to remove a runner with a job: the runner and its pod stay.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kept = env.runners_api().get(&name).await.expect("still there");
    assert!(kept.metadata.deletion_timestamp.is_some());
    assert!(
        env.pods_api().get(&name).await.is_ok(),
        "the busy runner's pod is not deleted"
    );
    assert!(env.registered().contains(&name));

    env.fake.state().start_job(job).expect("start the job");
    env.fake
        .state()
        .finish_job(job, "succeeded")
        .expect("finish the job");
    env.wait_runner_gone("the runner gone after its job", &name)
        .await;
    manager.stop().await;
}

#[tokio::test]
async fn a_zombie_runner_is_replaced() {
    let env = Env::new("er-zombie").await;
    env.create_set("arc", 1, 0).await;
    let mut options = env.options();
    options.runner.registration_check_interval = Duration::from_millis(500);
    let manager = env.start(options);

    let runner = env.start_a_runner().await;
    let name = runner.name_any();
    assert_eq!(runner.status.clone().unwrap_or_default().phase, "Running");
    env.fake
        .state()
        .deregister_runner(runner_id(&runner))
        .expect("forget the registration");
    let replacement = env
        .eventually("a replacement", || async {
            let runners = env.runners().await;
            let env_registered = env.registered();
            let old_gone = runners.iter().all(|runner| runner.name_any() != name);
            let new = runners.into_iter().find(|runner| {
                runner.name_any() != name && env_registered.contains(&runner.name_any())
            });
            if old_gone { new } else { None }
        })
        .await;
    assert!(env.registered().contains(&replacement.name_any()));
    manager.stop().await;
}

/// A runner whose job was too short for the listener's report to reach it looks idle when the service forgets it
/// as the job ends; its pod exits a moment later. That is a finished runner, not a zombie: no `ZombieRunner`
/// Event and no zombie count (issue 32, lesser). Fails without the confirmation (the first check replaced it).
#[tokio::test]
async fn a_runner_whose_short_job_went_unreported_is_not_taken_for_a_zombie() {
    let env = Env::new("er-not-zombie").await;
    env.create_set("arc", 1, 0).await;
    let mut options = env.options();
    options.runner.registration_check_interval = Duration::from_secs(2);
    let manager = env.start(options);

    let runner = env.start_a_runner().await;
    let name = runner.name_any();
    let checks = env.fake.state().count("get_runner_by_id");
    // The service ends the unreported job and forgets the runner, as it does with an ephemeral runner.
    env.fake
        .state()
        .deregister_runner(runner_id(&runner))
        .expect("forget the registration");
    env.eventually("a registration check after the job", || async {
        (env.fake.state().count("get_runner_by_id") > checks).then_some(())
    })
    .await;
    // The runner process exits 0 a moment after its job, as it does.
    env.end_pod(&name, "Succeeded", Some(0), None).await;
    env.wait_runner_gone("the finished runner gone", &name)
        .await;
    assert_eq!(
        env.event_notes("ZombieRunner").await,
        Vec::<String>::new(),
        "a finished runner is not a zombie"
    );
    manager.stop().await;
}

#[tokio::test]
async fn job_metadata_appears_on_the_pod() {
    let env = Env::new("er-job-labels").await;
    env.create_set("arc", 1, 0).await;
    let manager = env.start(env.options());

    let name = env
        .eventually("a pod", || async {
            env.pod_uids()
                .await
                .into_iter()
                .next()
                .map(|(name, _)| name)
        })
        .await;
    env.run_pod(&name).await;
    env.report_job(&name, "job-7f3a").await;
    let pod = env
        .eventually("job labels on the pod", || async {
            let pod = env.pods_api().get(&name).await.ok()?;
            pod.labels()
                .contains_key("actions.github.com/job-id")
                .then_some(pod)
        })
        .await;
    let labels = pod.labels();
    assert_eq!(labels["actions.github.com/job-id"], "job-7f3a");
    assert_eq!(labels["actions.github.com/workflow-run-id"], "9001");
    assert_eq!(labels["actions.github.com/job-repository-owner"], "org");
    assert_eq!(labels["actions.github.com/job-repository-name"], "repo");
    assert_eq!(labels["actions.github.com/job-workflow"], "ci.yml");
    let annotations = pod.annotations();
    assert_eq!(annotations["actions.github.com/job-repository"], "org/repo");
    assert_eq!(
        annotations["actions.github.com/job-workflow-ref"],
        "org/repo/.github/workflows/ci.yml@refs/heads/main"
    );
    // The template's own labels are untouched.
    assert_eq!(labels["actions-ephemeral-runner"], "True");
    manager.stop().await;
}

#[tokio::test]
async fn deleting_a_set_keeps_busy_runners_until_their_jobs_end() {
    let env = Env::new("ers-delete").await;
    env.create_set("arc", 3, 0).await;
    let manager = env.start(env.options());

    let runners = env
        .eventually("three registered runners with pods", || async {
            let runners = env.runners().await;
            (registered_runners(&runners, &env.registered()) == 3 && env.pods().await.len() == 3)
                .then_some(runners)
        })
        .await;
    for runner in &runners {
        env.run_pod(&runner.name_any()).await;
    }
    let busy_name = runners[0].name_any();
    let job = env
        .assign_job(env.recorded_runner_id(&busy_name).await)
        .await;
    env.fake.state().start_job(job).expect("start the job");
    env.report_job(&busy_name, "job-1").await;

    env.sets()
        .delete("arc", &DeleteParams::default())
        .await
        .expect("delete the set");
    env.eventually("only the busy runner left", || async {
        (env.runner_names().await == [busy_name.clone()]).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        env.pods_api().get(&busy_name).await.is_ok(),
        "the busy pod keeps running"
    );
    assert!(
        env.sets().get_opt("arc").await.expect("get").is_some(),
        "the set waits"
    );
    assert!(env.registered().contains(&busy_name));

    // The job ends: the service forgets the runner and the runner exits 0.
    env.fake
        .state()
        .finish_job(job, "succeeded")
        .expect("finish the job");
    env.end_pod(&busy_name, "Succeeded", Some(0), None).await;
    env.eventually("the set and its runners gone", || async {
        let gone = env.sets().get_opt("arc").await.expect("get").is_none()
            && env.runners().await.is_empty()
            && env.pods().await.is_empty()
            && env.jit_secrets().await.is_empty();
        gone.then_some(())
    })
    .await;
    assert!(env.registered().is_empty());
    manager.stop().await;
}

#[tokio::test]
async fn a_manager_killed_mid_scale_converges_without_duplicates_or_orphans() {
    let env = Env::new("ers-restart").await;
    env.create_set("arc", 0, 0).await;
    let first = env.start(env.options());
    env.scale("arc", 40, 1).await;
    // Kill as soon as the first runners exist. Waiting also for "fewer than 40 registered" raced with a fast
    // manager, which can register all 40 between two polls, and then the wait never ended.
    env.eventually("scaling under way", || async {
        (env.runners().await.len() >= 5).then_some(())
    })
    .await;
    first.kill().await;

    let second = env.start(env.options());
    let runners = env
        .eventually("40 registered runners with pods and Secrets", || async {
            let runners = env.runners().await;
            assert!(
                runners.len() <= 40,
                "no duplicate runners: {}",
                runners.len()
            );
            let ready = registered_runners(&runners, &env.registered()) == 40
                && env.pods().await.len() == 40
                && env.jit_secrets().await.len() == 40;
            ready.then_some(runners)
        })
        .await;
    let names: BTreeSet<String> = runners.iter().map(ResourceExt::name_any).collect();
    env.eventually("one registration per runner", || async {
        (env.registered() == names).then_some(())
    })
    .await;
    let pod_names: BTreeSet<String> = env.pod_names().await.into_iter().collect();
    assert_eq!(pod_names, names, "every pod belongs to a runner");

    env.scale("arc", 0, 0).await;
    env.eventually("everything cleaned up", || async {
        let clean = env.runners().await.is_empty()
            && env.pods().await.is_empty()
            && env.jit_secrets().await.is_empty()
            && env.registered().is_empty();
        clean.then_some(())
    })
    .await;
    second.stop().await;
}

#[tokio::test]
async fn a_quota_rejection_is_retried_not_counted() {
    let env = Env::new("er-quota").await;
    let quotas = no_pods_quota(&env).await;
    env.create_set("arc", 1, 0).await;
    let manager = env.start(env.options());

    let runner = env
        .eventually("the rejection on the runner", || async {
            env.runners().await.into_iter().find(|runner| {
                runner.status.as_ref().is_some_and(|status| {
                    status.reason == crds::constants::reason::POD_CREATION_REJECTED
                })
            })
        })
        .await;
    let status = runner.status.clone().expect("status");
    assert!(
        status.message.contains("exceeded quota"),
        "{}",
        status.message
    );
    assert!(status.failures.is_empty());
    assert_ne!(status.phase, "Failed");
    assert_eq!(
        status.runner_id, 0,
        "the registration recorded before the refused pod is removed, and forgotten with it"
    );
    assert!(env.pods().await.is_empty());

    quotas
        .delete("no-pods", &DeleteParams::default())
        .await
        .expect("lift the quota");
    env.eventually("the pod created once the quota is lifted", || async {
        env.pods_api()
            .get_opt(&runner.name_any())
            .await
            .ok()
            .flatten()
    })
    .await;
    env.eventually("the rejection cleared from the status", || async {
        let runner = env.runners_api().get(&runner.name_any()).await.ok()?;
        let reason = runner.status?.reason;
        (reason != crds::constants::reason::POD_CREATION_REJECTED).then_some(())
    })
    .await;
    manager.stop().await;
}

/// The job-metadata apply carries the pod's uid so that a pass working from a stale cache cannot create the
/// pod again once it is gone (an apply creates what does not exist): Kubernetes must refuse it.
#[tokio::test]
async fn an_apply_with_a_uid_never_recreates_a_deleted_pod() {
    let env = Env::new("er-apply-uid").await;
    let pods = env.pods_api();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "gone"},
        "spec": {"containers": [{"name": "runner", "image": "runner"}]},
    }))
    .expect("pod");
    let created = pods
        .create(&kube::api::PostParams::default(), &pod)
        .await
        .expect("create the pod");
    let uid = created.uid().expect("uid");
    let body = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gone", "uid": uid, "labels": {"job": "1"}},
    });
    let params = PatchParams::apply("job-metadata-test").force();
    pods.patch("gone", &params, &Patch::Apply(&body))
        .await
        .expect("the apply labels the pod while it exists");
    pods.delete("gone", &DeleteParams::default())
        .await
        .expect("delete the pod");
    env.eventually("the pod gone", || async {
        pods.get_opt("gone").await.unwrap().is_none().then_some(())
    })
    .await;
    let refused = pods
        .patch("gone", &params, &Patch::Apply(&body))
        .await
        .expect_err("an apply naming the old uid must not create a pod");
    assert!(
        matches!(&refused, kube::Error::Api(status) if status.code == 404 || status.code == 409),
        "{refused:?}"
    );
    assert!(pods.get_opt("gone").await.unwrap().is_none());
}

/// A runner that has a JIT Secret but no recorded attempt (a crash between creating the Secret and recording the
/// registration): its first attempt registers without reading the Secret, learns of it from the service (the
/// name is taken) or from the API server (the Secret's creation refused), and then discards the old config as
/// any runner does. Either way the pod gets a fresh config and no registration is left behind.
#[tokio::test]
async fn a_first_attempt_learns_of_a_leftover_secret_and_replaces_it() {
    use controller::ephemeral_runner::pod::jit_secret;
    use crds::common::ResourceMeta;
    use kube::Resource;
    use kube::api::PostParams;

    let env = Env::new("ers-leftover").await;
    let template = env.create_set("tmpl", 0, 0).await;
    let runners = env.runners_api();
    let secrets = env.secrets_api();
    let mut old_tokens = Vec::new();
    // "taken": the old registration is still in the service; "removed": it was removed before the crash.
    for (name, still_registered) in [("taken", true), ("removed", false)] {
        let mut runner = EphemeralRunner::new(name, template.spec.ephemeral_runner_spec.clone());
        runner.spec.ephemeral_runner_config_secret_metadata = Some(ResourceMeta::default());
        let runner = runners
            .create(&PostParams::default(), &runner)
            .await
            .expect("create the runner");
        let old = env
            .actions
            .generate_jit_runner_config(
                env.scale_set_id,
                &actions_client::JitSetting {
                    name: name.to_owned(),
                    work_folder: String::new(),
                },
            )
            .await
            .expect("an earlier registration");
        let owner = runner.controller_owner_ref(&()).expect("owner reference");
        secrets
            .create(
                &PostParams::default(),
                &jit_secret(&runner, owner, &old, &[]),
            )
            .await
            .expect("the leftover Secret");
        let old_id = old.runner.as_ref().expect("a runner").id;
        if !still_registered {
            env.fake
                .state()
                .deregister_runner(old_id)
                .expect("deregister");
        }
        old_tokens.push((
            name,
            old_id,
            old.encoded_jit_config.expose_secret().to_owned(),
        ));
    }
    let manager = env.start(env.options());
    for (name, old_id, old_token) in old_tokens {
        env.eventually(&format!("{name}: a pod with a fresh config"), || async {
            let pod = env.pods_api().get_opt(name).await.unwrap()?;
            let secret = secrets.get_opt(name).await.unwrap()?;
            let token = secret.data?.get("jitToken")?.0.clone();
            (pod.uid().is_some() && token != old_token.as_bytes()).then_some(())
        })
        .await;
        let registered: Vec<i64> = env
            .fake
            .state()
            .snapshot()
            .runners
            .into_iter()
            .filter(|runner| runner.name == name)
            .map(|runner| runner.id)
            .collect();
        assert_eq!(
            registered.len(),
            1,
            "{name}: one registration: {registered:?}"
        );
        assert_ne!(
            registered[0], old_id,
            "{name}: the old registration is gone"
        );
        // The status records the identity once the pod runs: the fresh registration's.
        env.run_pod(name).await;
        env.eventually(&format!("{name}: the fresh identity recorded"), || async {
            let status = runners.get(name).await.ok()?.status?;
            (status.runner_id == registered[0]).then_some(())
        })
        .await;
    }
    manager.stop().await;
}

/// Waits until set "arc" has exactly `count` runners, all registered, and returns them.
async fn registered(env: &Env, count: usize) -> Vec<EphemeralRunner> {
    env.eventually("the set's runners registered", || async {
        let runners = env.runners().await;
        (runners.len() == count && registered_runners(&runners, &env.registered()) == count)
            .then_some(runners)
    })
    .await
}

/// Brings a set to two registered runners with pods running, lets the first finish a job (with the listener's job
/// fields when `reported`, then its pod exits 0) and waits until it is gone. Returns the finished runner's name.
async fn one_of_two_runners_finishes_a_job(env: &Env, reported: bool) -> String {
    env.create_set("arc", 2, 1).await;
    let runners = registered(env, 2).await;
    for runner in &runners {
        env.run_pod(&runner.name_any()).await;
    }
    let finished = runners[0].name_any();
    if reported {
        env.report_job(&finished, "job-1").await;
    }
    env.end_pod(&finished, "Succeeded", Some(0), None).await;
    env.wait_runner_gone("the finished runner gone", &finished)
        .await;
    finished
}

/// The listener's patch: `replicas`, `patchID` and the runners whose finished jobs the target leaves out.
async fn listener_patch(env: &Env, replicas: i64, patch_id: i64, completed: Option<&str>) {
    env.sets()
        .patch(
            "arc",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": { "annotations": { COMPLETED_RUNNERS_ANNOTATION: completed } },
                "spec": { "replicas": replicas, "patchID": patch_id },
            })),
        )
        .await
        .expect("patch the set");
}

/// Waits until the set has recorded its current generation as acted upon.
async fn wait_applied(env: &Env) {
    env.eventually("the set acts on its current generation", || async {
        let set = env.sets().get("arc").await.expect("get the set");
        let applied = set
            .annotations()
            .get(APPLIED_GENERATION_ANNOTATION)
            .cloned();
        (applied == set.metadata.generation.map(|g| g.to_string())).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_target_that_still_counts_a_finished_job_makes_no_spare_runner() {
    let env = Env::new("ers-completed").await;
    let mut options = env.options();
    // Longer than the test: only the listener's listing may release the finished runner's place.
    options.completion_hold = Duration::from_secs(300);
    let manager = env.start(options);
    let finished = one_of_two_runners_finishes_a_job(&env, true).await;

    // A patch computed before the job's completion reached the listener: it still counts the job.
    listener_patch(&env, 2, 2, None).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let runners = env.runners().await;
    assert_eq!(
        runners.len(),
        1,
        "no spare runner for a job that is over: {:?}",
        runners
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>()
    );
    // The listener's next patch leaves the job out and lists the runner: acted upon, nothing created.
    listener_patch(&env, 1, 3, Some(&finished)).await;
    wait_applied(&env).await;
    assert_eq!(env.runners().await.len(), 1);
    // A new job: the listed runner's place is free, so the set makes one runner for it.
    listener_patch(&env, 2, 4, Some(&finished)).await;
    wait_applied(&env).await;
    env.eventually("a runner for the new job", || async {
        (env.runners().await.len() == 2).then_some(())
    })
    .await;
    manager.stop().await;
}

#[tokio::test]
async fn a_runner_whose_job_is_over_fills_no_place_while_it_is_still_there() {
    let env = Env::new("ers-finishing").await;
    let mut options = env.options();
    // Longer than the test: nothing here may wait for the clock.
    options.completion_hold = Duration::from_secs(300);
    let manager = env.start(options);
    env.create_set("arc", 1, 1).await;
    let runners = registered(&env, 1).await;
    let first = runners[0].name_any();
    env.run_pod(&first).await;
    env.report_job(&first, "job-1").await;

    // Its job completed and another one is queued, and the listener heard before the runner's pod reported its
    // end (in a burst, the runner's teardown can lag by seconds): the target is one, for the new job, and lists
    // the first runner. That runner serves no job the target counts, so the new job gets a runner now.
    listener_patch(&env, 1, 2, Some(&first)).await;
    let runners = env
        .eventually("a runner for the queued job", || async {
            let runners = env.runners().await;
            (runners.len() == 2).then_some(runners)
        })
        .await;
    assert!(
        runners.iter().any(|runner| runner.name_any() == first),
        "the finished runner is still there"
    );
    wait_applied(&env).await;
    // Once it goes, nothing replaces it: one runner, for the queued job.
    env.end_pod(&first, "Succeeded", Some(0), None).await;
    env.wait_runner_gone("the finished runner gone", &first)
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(env.runners().await.len(), 1);
    manager.stop().await;
}

/// The service removes an ephemeral runner's registration as the job it ran completes: a finished runner whose
/// job the listener recorded on it and its set lists as completed, under that registration, is torn down without
/// asking the service again (one call to GitHub fewer per job, and none between the pod's exit and the runner's
/// deletion). One its set does not list is asked, as always.
#[tokio::test]
async fn a_finished_runner_its_set_lists_is_not_deregistered_again() {
    let env = Env::new("er-released").await;
    let manager = env.start(env.options());
    env.create_set("arc", 2, 1).await;
    let runners = registered(&env, 2).await;
    for runner in &runners {
        env.run_pod(&runner.name_any()).await;
    }
    // The pods' first state worth showing brings each runner's registration into its status.
    let runners = env
        .eventually("both registrations in the status", || async {
            let runners = env.runners().await;
            runners
                .iter()
                .all(|runner| runner_id(runner) != 0)
                .then_some(runners)
        })
        .await;
    let (listed, unlisted) = (&runners[0], &runners[1]);
    for runner in &runners {
        env.report_job(&runner.name_any(), "job-1").await;
    }
    // The listed runner's job completes: the service removes its registration, the listener lists it.
    env.actions
        .remove_runner(runner_id(listed))
        .await
        .expect("the service removes the registration");
    let entry = format!("{}:{}", listed.name_any(), runner_id(listed));
    listener_patch(&env, 2, 2, Some(&entry)).await;
    wait_applied(&env).await;
    let before = env.fake.state().count("remove_runner");

    env.end_pod(&listed.name_any(), "Succeeded", Some(0), None)
        .await;
    env.wait_runner_gone("the listed runner gone", &listed.name_any())
        .await;
    assert_eq!(
        env.fake.state().count("remove_runner"),
        before,
        "no removal asked for a registration the service removed with its job"
    );

    env.end_pod(&unlisted.name_any(), "Succeeded", Some(0), None)
        .await;
    env.wait_runner_gone("the unlisted runner gone", &unlisted.name_any())
        .await;
    assert_eq!(
        env.fake.state().count("remove_runner"),
        before + 1,
        "the runner its set does not list is deregistered"
    );
    assert!(
        !env.registered().contains(&unlisted.name_any()),
        "its registration removed"
    );
    manager.stop().await;
}

/// Defect found by the chaos run: an idle runner's pod was taken away in the very moment the service gave it a job
/// that then failed at once. Its registration was removed (the job was already over, so the service agreed), the
/// runner registered again and got a new pod, and the listener listed the runner as completed. The set, reading
/// the listing by name, counted the runner's new, idle life as finishing: with the target at 0 it never scaled it
/// down, and it idled forever. The listing names the registration the job ran under, so the set tells the two
/// lives apart. (On the earlier main this test's listing was the name alone, as the listener wrote it then, and
/// the runner was never removed.)
#[tokio::test]
async fn a_runner_listed_for_a_job_of_its_earlier_registration_is_scaled_down() {
    let env = Env::new("ers-relisted").await;
    let mut options = env.options();
    // Longer than the test: the runner may only go because the set knows its current life serves.
    options.completion_hold = Duration::from_secs(300);
    let manager = env.start(options);
    env.create_set("arc", 1, 1).await;
    let name = registered(&env, 1).await[0].name_any();
    env.run_pod(&name).await;
    let old_id = env.recorded_runner_id(&name).await;
    let old_pod = env.pod_uids().await;

    // The run takes the pod away; the runner gets a fresh registration and a new pod under the same name.
    env.pods_api()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the runner's pod");
    env.eventually("a new pod for the runner", || async {
        let pods = env.pod_uids().await;
        (!pods.is_empty() && pods != old_pod).then_some(())
    })
    .await;
    env.run_pod(&name).await;
    env.eventually("the runner's fresh registration recorded", || async {
        let status = env.runners_api().get(&name).await.ok()?.status?;
        (status.runner_id != 0 && status.runner_id != old_id).then_some(())
    })
    .await;

    // The listener heard of the job's completion under the old registration, and its demand is now 0.
    let mut listing = listener::completions::Completions::default();
    listing.record(&name, old_id);
    listener_patch(&env, 0, 0, listing.annotation().as_deref()).await;
    env.wait_runner_gone("the idle runner scaled down", &name)
        .await;
    env.eventually("no registration left", || async {
        env.registered().is_empty().then_some(())
    })
    .await;
    manager.stop().await;
}

#[tokio::test]
async fn a_finished_runner_the_listener_never_lists_is_replaced_after_the_hold() {
    let env = Env::new("ers-hold").await;
    let mut options = env.options();
    options.completion_hold = Duration::from_secs(10);
    let manager = env.start(options);
    // A job shorter than the listener's write of its fields: the runner's own end (its pod succeeded) is what
    // holds its place.
    one_of_two_runners_finishes_a_job(&env, false).await;

    // The target counts the job, and no listing ever comes (say, a listener restarted before it heard of the
    // completion): the place is kept for the hold, then filled, and the patch is recorded as acted upon.
    listener_patch(&env, 2, 2, None).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(env.runners().await.len(), 1, "the place is held");
    env.eventually("a second runner once the hold is over", || async {
        (env.runners().await.len() == 2).then_some(())
    })
    .await;
    wait_applied(&env).await;
    manager.stop().await;
}

/// A set that scales up while another set's burst is being registered gets its runner after one of that burst's
/// passes, not after a share of them: the runner controller's passes take turns per set (docs/runner-lifecycle.md,
/// "Scale sets take turns"). One pass at a time and a slow registration make the order plain. Before the turns,
/// the framework started waiting passes in the order of a hash set: the small set's runner waited for 31, 37 and
/// 45 of the big set's 49 runners without pods in three runs; now for 1 or 2.
#[tokio::test]
async fn a_set_scaling_up_during_another_sets_burst_does_not_wait_for_it() {
    let env = Env::new("ers-turns").await;
    env.slow_down("generate_jit_config", 300);
    let mut options = env.options();
    options.runner_concurrency = 1;
    let manager = env.start(options);
    let count = |names: &[String], set: &str| {
        let prefix = format!("{set}-runner-");
        names
            .iter()
            .filter(|name| name.starts_with(&prefix))
            .count()
    };

    const BIG: usize = 50;
    env.create_set("big", i64::try_from(BIG).expect("small"), 1)
        .await;
    env.eventually("the big set's first pod", || async {
        (count(&env.pod_names().await, "big") > 0).then_some(())
    })
    .await;
    env.create_set("small", 1, 1).await;
    let big_pods_before = env
        .eventually("the small set's runner", || async {
            if count(&env.runner_names().await, "small") == 1 {
                Some(count(&env.pod_names().await, "big"))
            } else {
                None
            }
        })
        .await;
    let big_pods_after = env
        .eventually("the small set's pod", || async {
            let pods = env.pod_names().await;
            (count(&pods, "small") == 1).then(|| count(&pods, "big"))
        })
        .await;
    // The pass under way, at most one more of the big set's, and what a poll of the test can miss.
    assert!(
        big_pods_after - big_pods_before <= 4,
        "the small set's runner waited for {} of the big set's runners ({big_pods_before} of {BIG} had pods \
         when it was created)",
        big_pods_after - big_pods_before
    );
    assert!(
        big_pods_after < BIG,
        "the big set was still being registered"
    );
    env.eventually("every pod", || async {
        (count(&env.pod_names().await, "big") == BIG).then_some(())
    })
    .await;
    manager.stop().await;
}

/// Defect 2: the main lane's fence (the runner read from the API server) comes before the registration, which may
/// take seconds; a runner deleted meanwhile was finalized by its teardown (no Secret yet, no registration by that
/// name yet), and the pass then stored the config and made a pod for a runner that was gone, leaving the
/// registration on the service for good. On the earlier main this test failed: the name stayed registered.
#[tokio::test]
async fn a_runner_deleted_while_it_registers_leaves_no_registration() {
    let env = Env::new("er-deleted-registering").await;
    env.create_set("arc", 0, 0).await;
    env.slow_down("generate_jit_config", 3_000);
    let manager = env.start(env.options());

    env.scale("arc", 1, 1).await;
    env.eventually("the registration requested", || async {
        (env.fake.state().count("generate_jit_config") == 1).then_some(())
    })
    .await;
    // No replacement wanted (a scale-down keeps a runner mid-registration), then the runner deleted by hand.
    env.scale("arc", 0, 0).await;
    let name = env.runner_names().await.remove(0);
    env.runners_api()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the runner");
    env.wait_runner_gone("the runner finalized", &name).await;
    // The registration the service was making when the runner went has been made by now (3 s late).
    tokio::time::sleep(Duration::from_secs(4)).await;
    env.eventually("no registration left for the runner that went", || async {
        (!env.registered().contains(&name)).then_some(())
    })
    .await;
    env.eventually("nothing of it left", || async {
        (env.pods().await.is_empty() && env.jit_secrets().await.is_empty()).then_some(())
    })
    .await;
    manager.stop().await;
}

/// Marks pod `name` as waiting for a node, as the scheduler does when none fits.
async fn unschedulable(env: &Env, name: &str) {
    env.eventually("the runner's pod", || async {
        env.pods_api().get_opt(name).await.expect("get pod")
    })
    .await;
    env.pods_api()
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/0 nodes are available (stand-in scheduler)",
            }] } })),
        )
        .await
        .expect("mark the pod unschedulable");
}

/// Defect 3: a scale-down kept runners whose pods wait for a node and removed Ready idle ones instead, so a set
/// converging to its minimum kept exactly the runners that cannot start. The ones that cannot start go first. On
/// the earlier main this test failed: the Ready runners went.
#[tokio::test]
async fn a_scale_down_removes_runners_that_cannot_start_before_ready_ones() {
    let env = Env::new("ers-unschedulable").await;
    let manager = env.start(env.options());
    env.create_set("arc", 4, 1).await;
    let runners = registered(&env, 4).await;
    let names: Vec<String> = runners.iter().map(ResourceExt::name_any).collect();
    let (ready, waiting) = names.split_at(2);
    for name in ready {
        env.run_pod(name).await;
        env.recorded_runner_id(name).await;
    }
    for name in waiting {
        unschedulable(&env, name).await;
        env.recorded_runner_id(name).await;
    }

    env.scale("arc", 2, 0).await;
    env.eventually("the runners waiting for a node removed", || async {
        let left: BTreeSet<String> = env.runner_names().await.into_iter().collect();
        (left == ready.iter().cloned().collect::<BTreeSet<_>>()).then_some(())
    })
    .await;
    env.eventually("their registrations removed", || async {
        let registered = env.registered();
        waiting
            .iter()
            .all(|name| !registered.contains(name))
            .then_some(())
    })
    .await;
    manager.stop().await;
}

/// Defect 7: after a pod refused by a quota, a runner has no registration and no pod, and a scale-down kept it as
/// "not registered yet": after a burst under a quota the set stayed above its target, and pods nobody needed
/// followed once the quota freed. A refused runner runs nothing and may go. On the earlier main this test failed:
/// the refused runners stayed.
#[tokio::test]
async fn refused_runners_are_scaled_down() {
    let env = Env::new("ers-refused").await;
    let quotas = no_pods_quota(&env).await;
    env.create_set("arc", 3, 1).await;
    let manager = env.start(env.options());
    env.eventually("every runner refused", || async {
        let runners = env.runners().await;
        let refused = runners.iter().filter(|runner| {
            runner.status.as_ref().is_some_and(|status| {
                status.reason == crds::constants::reason::POD_CREATION_REJECTED
            })
        });
        (runners.len() == 3 && refused.count() == 3).then_some(())
    })
    .await;

    env.scale("arc", 0, 0).await;
    env.eventually("the refused runners removed", || async {
        env.runners().await.is_empty().then_some(())
    })
    .await;
    quotas
        .delete("no-pods", &DeleteParams::default())
        .await
        .expect("lift the quota");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        env.pods().await.is_empty(),
        "no pod for a runner nobody needs"
    );
    assert!(env.registered().is_empty(), "nothing registered");
    manager.stop().await;
}

/// Defect 5: a template change's replacement of idle runners deregistered them with the set's current service
/// and credentials. After `githubConfigUrl` moved to another service, that one answered "not found" for the old
/// ids, which counted as removed, and every old registration stayed on the first service. A runner is
/// deregistered where it was registered. On the earlier main this test failed: the first service kept the
/// registration.
#[tokio::test]
async fn a_runner_is_deregistered_from_its_own_service_when_the_set_moves_to_another() {
    use actions_client::{
        ActionsClient, ClientOptions, Credentials, GitHubConfig, RunnerScaleSet, SecretString,
    };
    use fake_actions_service::FakeActionsService;

    let env = Env::new("ers-moved").await;
    let manager = env.start(env.options());
    env.create_set("arc", 1, 1).await;
    let name = registered(&env, 1).await[0].name_any();
    env.run_pod(&name).await;
    env.recorded_runner_id(&name).await;

    let other = FakeActionsService::start(fake_actions_service::Config::default())
        .await
        .expect("start a second fake Actions Service");
    let other_url = format!("{}/other-org/repo", other.base_url());
    let other_client = ActionsClient::new(
        GitHubConfig::parse(&other_url).expect("config URL"),
        &Credentials::Pat(SecretString::new("ghp_test")),
        ClientOptions::default(),
    )
    .expect("Actions client");
    let other_set = other_client
        .create_runner_scale_set(&RunnerScaleSet {
            name: "moved".to_owned(),
            runner_group_id: 1,
            ..RunnerScaleSet::default()
        })
        .await
        .expect("create the scale set");
    env.sets()
        .patch(
            "arc",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "ephemeralRunnerSpec": {
                "githubConfigUrl": other_url,
                "runnerScaleSetId": other_set.id,
            } } })),
        )
        .await
        .expect("move the set to the other service");

    env.wait_runner_gone("the old runner replaced", &name).await;
    env.eventually("the first service holds no registration", || async {
        env.registered().is_empty().then_some(())
    })
    .await;
    env.eventually(
        "the replacement registered with the other service",
        || async {
            let registered = other.state().snapshot().runners;
            (registered.len() == 1 && registered[0].scale_set_id == other_set.id).then_some(())
        },
    )
    .await;
    manager.stop().await;
}

/// Defect 6: a later attempt's Secret (registration Y) made, then the status write before its pod failed: the
/// status still names the earlier registration X. Deleted before it registered again, the runner's teardown
/// removed X only, and Y stayed on the service. The objects are placed as that pass left them before the manager
/// starts. On the earlier main this test failed: Y stayed registered.
#[tokio::test]
async fn a_runner_whose_secret_and_status_name_two_registrations_removes_both() {
    use actions_client::JitSetting;
    use crds::constants::{EPHEMERAL_RUNNER_FINALIZER, EPHEMERAL_RUNNER_REGISTRATION_FINALIZER};
    use kube::api::PostParams;

    let env = Env::new("er-two-registrations").await;
    let name = "arc-runner-fixture";
    let register = || async {
        env.actions
            .generate_jit_runner_config(
                env.scale_set_id,
                &JitSetting {
                    name: name.to_owned(),
                    work_folder: String::new(),
                },
            )
            .await
            .expect("register")
    };
    // X: the earlier attempt's, recorded in the status and removed since; Y: the later attempt's, in the Secret.
    let x = register().await.runner.expect("runner").id;
    env.actions.remove_runner(x).await.expect("remove X");
    let jit_y = register().await;
    let set = env.create_set("arc", 0, 0).await;
    let mut runner = EphemeralRunner::new(name, set.spec.ephemeral_runner_spec.clone());
    runner.metadata.finalizers = Some(vec![
        EPHEMERAL_RUNNER_REGISTRATION_FINALIZER.to_owned(),
        EPHEMERAL_RUNNER_FINALIZER.to_owned(),
    ]);
    let runner = env
        .runners_api()
        .create(&PostParams::default(), &runner)
        .await
        .expect("create the runner");
    env.runners_api()
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": {
                "phase": "Pending", "runnerId": x, "runnerName": name,
            } })),
        )
        .await
        .expect("the status as the earlier attempt left it");
    let owner = kube::Resource::controller_owner_ref(&runner, &()).expect("owner reference");
    let secret = controller::ephemeral_runner::pod::jit_secret(&runner, owner, &jit_y, &[]);
    env.secrets_api()
        .create(&PostParams::default(), &secret)
        .await
        .expect("the later attempt's Secret");
    env.runners_api()
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete the runner");
    assert!(env.registered().contains(name), "Y registered");

    let manager = env.start(env.options());
    env.wait_runner_gone("the runner finalized", name).await;
    assert!(
        !env.registered().contains(name),
        "the Secret's registration removed too"
    );
    manager.stop().await;
}

/// A ResourceQuota `no-pods` that allows no pod in the test's namespace, once the quota controller has computed its
/// usage (it rejects nothing before).
async fn no_pods_quota(env: &Env) -> kube::Api<k8s_openapi::api::core::v1::ResourceQuota> {
    use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube::api::PostParams;

    let quotas: kube::Api<ResourceQuota> = env.ctx.api();
    let quota = ResourceQuota {
        metadata: kube::api::ObjectMeta {
            name: Some("no-pods".to_owned()),
            ..kube::api::ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some([("pods".to_owned(), Quantity("0".to_owned()))].into()),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    };
    quotas
        .create(&PostParams::default(), &quota)
        .await
        .expect("create the quota");
    env.eventually("the quota in force", || async {
        let quota = quotas.get("no-pods").await.ok()?;
        quota.status?.used.map(|_| ())
    })
    .await;
    quotas
}

/// The requests a client sent, by path and query.
type Sent = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// A client of the test's control plane that records every request it sends.
fn recording_client(env: &Env) -> (kube::Client, Sent) {
    let sent = Sent::default();
    let config = env.ctx.control_plane.config().clone();
    let client = kube::client::ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&Record(std::sync::Arc::clone(&sent)))
        .build();
    (client, sent)
}

/// The layer of [`recording_client`].
struct Record(Sent);

impl<S> tower::Layer<S> for Record {
    type Service = Recorded<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Recorded {
            inner,
            sent: std::sync::Arc::clone(&self.0),
        }
    }
}

/// The service of [`Record`]: notes each request's URI, then sends it on.
struct Recorded<S> {
    inner: S,
    sent: Sent,
}

impl<S, B> tower::Service<http::Request<B>> for Recorded<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        self.sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(request.uri().to_string());
        self.inner.call(request)
    }
}

/// The manager's watches go through the client `Manager::with_watch_client` gives them, never the main client:
/// the main client's requests wait for its in-flight budget behind the controllers' (`--k8s-client-max-in-flight`),
/// and a watch the API server closed must open again at once, not behind them (docs/benchmarks.md, "Teardown").
#[tokio::test]
async fn the_managers_watches_open_on_their_own_client() {
    let env = Env::new("ers-watch-client").await;
    env.create_set("arc", 1, 1).await;
    let (main, main_sent) = recording_client(&env);
    let (watches, watch_sent) = recording_client(&env);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let manager = controller::Manager::new(main, env.options()).with_watch_client(watches);
    let task = tokio::spawn(manager.run(shutdown.clone()));
    // The runner and its pod come through the watches, and the set's pass that made it ran on their caches.
    env.eventually("a registered runner with a pod", || async {
        (env.pod_names().await.len() == 1 && env.registered().len() == 1).then_some(())
    })
    .await;
    shutdown.cancel();
    task.await.expect("manager task").expect("manager result");

    let taken = |sent: &Sent| {
        sent.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    };
    let (main_sent, watch_sent) = (taken(&main_sent), taken(&watch_sent));
    let is_watch = |uri: &str| uri.contains("watch=true");
    let main_watches: Vec<_> = main_sent.iter().filter(|uri| is_watch(uri)).collect();
    assert!(
        main_watches.is_empty(),
        "a watch on the main client: {main_watches:?}"
    );
    for resource in ["/ephemeralrunnersets?", "/ephemeralrunners?", "/pods?"] {
        assert!(
            watch_sent
                .iter()
                .any(|uri| is_watch(uri) && uri.contains(resource)),
            "no watch of {resource} on the watch client: {watch_sent:?}"
        );
    }
    // The watch client carries the watches and their lists, nothing the controllers write or read one by one.
    let stray: Vec<_> = watch_sent
        .iter()
        .filter(|uri| {
            let path = uri.split('?').next().unwrap_or_default();
            !path.ends_with("/ephemeralrunnersets")
                && !path.ends_with("/ephemeralrunners")
                && !path.ends_with("/pods")
        })
        .collect();
    assert!(stray.is_empty(), "not a watch or its list: {stray:?}");
}
