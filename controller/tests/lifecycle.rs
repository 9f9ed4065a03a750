//! Runner lifecycle paths a real cluster walks and a simulator does not: pods deleted or evicted through the API,
//! a template edited while runners wait, a listener restarted with its patch ids counting from the start again.
//! Each test is against a real API server and the fake Actions Service, the test acting as kubelet and listener.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::Env;
use crds::EphemeralRunner;
use fake_actions_service::Faults;
use k8s_openapi::api::core::v1::{Container, ContainerPort, Event, Pod};
use kube::api::{DeleteParams, EvictParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

fn runner_id(runner: &EphemeralRunner) -> i64 {
    runner.status.as_ref().map_or(0, |status| status.runner_id)
}

/// The JIT config in runner `name`'s Secret, once there is one.
async fn jit_token(env: &Env, name: &str) -> Option<Vec<u8>> {
    let secret = env.secrets_api().get_opt(name).await.ok()??;
    Some(secret.data?.get("jitToken")?.0.clone())
}

/// Waits for the one runner of a one-runner set to have a pod, runs that pod, and returns the runner's name,
/// pod uid, runner id and JIT config.
async fn one_idle_runner(env: &Env) -> (String, String, i64, Vec<u8>) {
    let (name, uid) = env
        .eventually("a pod", || async {
            env.pod_uids().await.into_iter().next()
        })
        .await;
    env.run_pod(&name).await;
    let id = env
        .eventually("the runner registered and running", || async {
            let runner = env.runners_api().get(&name).await.ok()?;
            let status = runner.status.clone()?;
            (status.phase == "Running" && status.runner_id != 0).then(|| runner_id(&runner))
        })
        .await;
    let token = jit_token(env, &name).await.expect("the JIT Secret");
    (name, uid, id, token)
}

/// Gives registered runner `runner_id` a job in the fake and reports it on the runner, as the service and the
/// listener would. Returns the job's request id.
async fn give_job(env: &Env, name: &str, runner_id: i64) -> i64 {
    let job = env.assign_job(runner_id).await;
    env.report_job(name, &format!("job-{job}")).await;
    job
}

/// Reasons of the Events about runner `name`.
async fn event_reasons(env: &Env, name: &str) -> BTreeSet<String> {
    let events: Api<Event> = env.ctx.api();
    events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|event| event.involved_object.name.as_deref() == Some(name))
        .filter_map(|event| event.reason)
        .collect()
}

/// Waits until runner `name` has a live pod other than `old_uid` and returns it.
async fn replacement_pod(env: &Env, name: &str, old_uid: &str) -> Pod {
    env.eventually("a new pod for the runner", || async {
        let pod = env.pods_api().get_opt(name).await.ok()??;
        (pod.uid().as_deref() != Some(old_uid) && pod.metadata.deletion_timestamp.is_none())
            .then_some(pod)
    })
    .await
}

/// An idle runner whose pod goes away through the API (a drain, the cluster autoscaler, `kubectl delete pod`)
/// gets a new pod with a fresh JIT config: the old one may have been consumed by the deleted pod's runner.
async fn idle_pod_removed_through_the_api(prefix: &str, evict: bool) {
    let env = Env::new(prefix).await;
    env.create_set("arc", 1, 0).await;
    let manager = env.start(env.options());
    let (name, uid, old_id, old_token) = one_idle_runner(&env).await;

    if evict {
        env.pods_api()
            .evict(&name, &EvictParams::default())
            .await
            .expect("evict the pod through the Eviction API");
    } else {
        env.pods_api()
            .delete(&name, &DeleteParams::default())
            .await
            .expect("delete the pod");
    }

    let pod = replacement_pod(&env, &name, &uid).await;
    let new_token = env
        .eventually("the new pod's JIT Secret", || jit_token(&env, &name))
        .await;
    assert!(
        new_token != old_token,
        "the new pod must not get the JIT config the deleted pod's runner may have consumed"
    );
    let runner = env
        .runners_api()
        .get(&name)
        .await
        .expect("the runner stays");
    let status = runner.status.clone().unwrap_or_default();
    assert!(
        status.failures.is_empty(),
        "a pod taken away by the cluster is not the runner's failure: {:?}",
        status.failures
    );
    env.eventually(
        "the consumed registration removed from the service",
        || async {
            let snapshot = env.fake.state().snapshot();
            (!snapshot.runners.iter().any(|runner| runner.id == old_id)).then_some(())
        },
    )
    .await;
    assert_eq!(
        env.jit_secrets().await.len(),
        1,
        "one JIT Secret, the new pod's"
    );
    assert_eq!(pod.name_any(), name);
    manager.stop().await;
}

#[tokio::test]
async fn an_idle_runners_pod_deleted_through_the_api_gets_a_fresh_config() {
    idle_pod_removed_through_the_api("lc-idle-delete", false).await;
}

#[tokio::test]
async fn an_idle_runners_pod_evicted_through_the_eviction_api_gets_a_fresh_config() {
    idle_pod_removed_through_the_api("lc-idle-evict", true).await;
}

/// A busy runner whose pod is deleted is finished, not restarted: its job is the service's to fail or retry, a
/// new pod would only get a runner that never sees that job.
#[tokio::test]
async fn a_busy_runners_pod_deleted_through_the_api_finishes_the_runner() {
    let env = Env::new("lc-busy-delete").await;
    env.create_set("arc", 1, 0).await;
    let manager = env.start(env.options());
    let (name, uid, id, _) = one_idle_runner(&env).await;
    let job = give_job(&env, &name, id).await;

    env.pods_api()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the busy runner's pod");

    env.eventually("the runner finished (being deleted)", || async {
        match env.runners_api().get_opt(&name).await.ok()? {
            None => Some(()),
            Some(runner) => runner.metadata.deletion_timestamp.map(drop),
        }
    })
    .await;
    env.eventually("an Event saying why", || async {
        event_reasons(&env, &name)
            .await
            .contains("RunnerPodDeleted")
            .then_some(())
    })
    .await;
    assert!(
        env.pods_api()
            .get_opt(&name)
            .await
            .expect("get pod")
            .is_none_or(|pod| pod.uid().as_deref() == Some(uid.as_str())),
        "no new pod for a runner whose job was interrupted"
    );
    // The service fails the interrupted job (the runner is gone); then the registration can go.
    env.fake
        .state()
        .finish_job(job, "failed")
        .expect("the service fails the job");
    env.eventually("the runner gone", || async {
        env.runners_api()
            .get_opt(&name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert!(!env.registered().contains(&name));
    manager.stop().await;
}

/// The image of a runner's pod.
fn image(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.containers.first())
        .and_then(|container| container.image.clone())
        .unwrap_or_default()
}

/// Writes a new runner image into the set the way the AutoscalingRunnerSet controller does: the template and the
/// set's integrity hash of it in one patch.
async fn change_image(env: &Env, set: &str, image: &str) {
    edit_runner_container(env, set, |container| {
        container.image = Some(image.to_owned());
        container.ports = None;
    })
    .await;
}

/// Edits the set's runner container, writing the template and its hash in one patch (as the AutoscalingRunnerSet
/// controller does).
async fn edit_runner_container(env: &Env, set: &str, edit: impl FnOnce(&mut Container)) {
    let mut spec = env
        .sets()
        .get(set)
        .await
        .expect("the set")
        .spec
        .ephemeral_runner_spec;
    edit(&mut Arc::make_mut(&mut spec.spec).containers[0]);
    let hash = controller::hash::runner_spec_hash(&spec).expect("hash");
    env.sets()
        .patch(
            set,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": { "annotations": { "actions.github.com/integrity-hash": hash } },
                "spec": { "ephemeralRunnerSpec": spec },
            })),
        )
        .await
        .expect("change the runner template");
}

/// A template edit replaces idle and pending runners; a busy runner finishes its job on the old template.
#[tokio::test]
async fn a_template_change_replaces_idle_runners_and_spares_busy_ones() {
    let env = Env::new("lc-template").await;
    env.create_set("arc", 3, 0).await;
    let manager = env.start(env.options());
    let pods = env
        .eventually("three pods", || async {
            let pods = env.pod_uids().await;
            (pods.len() == 3).then_some(pods)
        })
        .await;
    for (name, _) in &pods {
        env.run_pod(name).await;
    }
    let (busy, busy_uid) = pods[0].clone();
    let busy_id = env
        .eventually("the busy runner registered", || async {
            let runner = env.runners_api().get(&busy).await.ok()?;
            (runner_id(&runner) != 0).then(|| runner_id(&runner))
        })
        .await;
    give_job(&env, &busy, busy_id).await;

    change_image(&env, "arc", "example.com/runner:v2").await;

    env.eventually(
        "the idle runners replaced by runners of the new template",
        || async {
            let pods = env.pods().await;
            let live: Vec<&Pod> = pods
                .iter()
                .filter(|pod| pod.metadata.deletion_timestamp.is_none())
                .collect();
            let new = live
                .iter()
                .filter(|pod| image(pod) == "example.com/runner:v2")
                .count();
            let old_idle = live
                .iter()
                .filter(|pod| image(pod) != "example.com/runner:v2" && pod.name_any() != busy)
                .count();
            (new == 2 && old_idle == 0).then_some(())
        },
    )
    .await;
    let busy_pod = env
        .pods_api()
        .get(&busy)
        .await
        .expect("the busy runner's pod is not interrupted");
    assert_eq!(busy_pod.uid().as_deref(), Some(busy_uid.as_str()));
    assert_eq!(image(&busy_pod), "ghcr.io/actions/actions-runner:latest");
    manager.stop().await;
}

/// Runners whose pods the API server refused (a broken template) pick up the fixed template.
#[tokio::test]
async fn runners_refused_by_a_broken_template_recover_once_it_is_fixed() {
    let env = Env::new("lc-broken").await;
    env.create_set("arc", 2, 0).await;
    // A port the API server rejects (422): every pod creation is refused.
    edit_runner_container(&env, "arc", |container| {
        container.ports = Some(vec![ContainerPort {
            container_port: 0,
            ..ContainerPort::default()
        }]);
    })
    .await;
    let manager = env.start(env.options());
    env.eventually("both runners refused", || async {
        let runners = env.runners().await;
        (runners.len() == 2
            && runners.iter().all(|runner| {
                runner
                    .status
                    .as_ref()
                    .is_some_and(|status| status.phase == "Failed")
            }))
        .then_some(())
    })
    .await;
    assert!(env.pods().await.is_empty());

    change_image(&env, "arc", "example.com/runner:fixed").await;

    env.eventually("two pods of the fixed template", || async {
        let pods = env.pod_uids().await;
        let fixed = env
            .pods()
            .await
            .iter()
            .filter(|pod| {
                pod.metadata.deletion_timestamp.is_none()
                    && image(pod) == "example.com/runner:fixed"
            })
            .count();
        (pods.len() == 2 && fixed == 2).then_some(())
    })
    .await;
    manager.stop().await;
}

/// A listener's patch ids start again from its own count after a restart: a patch whose id equals one an earlier
/// listener used must still be acted upon.
#[tokio::test]
async fn a_restarted_listeners_patch_id_equal_to_an_old_one_still_scales() {
    let env = Env::new("lc-patch-id").await;
    env.create_set("arc", 0, 0).await;
    let manager = env.start(env.options());

    // The first listener's third patch asks for one runner.
    env.scale("arc", 1, 3).await;
    env.eventually("one runner", || async {
        (env.runners().await.len() == 1).then_some(())
    })
    .await;
    // A new listener starts: its first patch (id 0) is authoritative, and the idle runner goes.
    env.scale("arc", 0, 0).await;
    env.eventually("no runner", || async {
        env.runners().await.is_empty().then_some(())
    })
    .await;
    // Its third patch asks for two runners, with the id the old listener's acted-upon patch had.
    env.scale("arc", 2, 3).await;
    env.eventually("two runners", || async {
        let runners = env.runners().await;
        (runners
            .iter()
            .filter(|runner| runner.metadata.deletion_timestamp.is_none())
            .count()
            == 2)
            .then_some(())
    })
    .await;
    manager.stop().await;
}

/// A job the service reports late for a registration the runner is just giving up (its pod was taken away
/// mid-job, the listener's `JobStarted` came after) lands on the status between the pass's read and its next
/// write. The next registration must not inherit it: a runner with a job is never scaled down, and this one's
/// runner never runs that job, so it would stay forever, idle and registered.
#[tokio::test]
async fn a_job_reported_for_a_registration_being_given_up_does_not_stick_to_the_next_one() {
    let env = Env::new("lc-late-job").await;
    env.create_set("arc", 1, 0).await;
    let mut options = env.options();
    // Room for the held request below, on a machine busy with other tests.
    options.actions_call_timeout = Duration::from_secs(60);
    let manager = env.start(options.clone());
    let (name, _, old_id, _) = one_idle_runner(&env).await;

    // The pod goes while the manager is down (the chaos run kills it every few seconds), so the pass after its
    // restart finds the pod gone with the registration still recorded, and asks for the next one.
    manager.stop().await;
    env.pods_api()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the pod");
    env.eventually("the pod gone", || async {
        env.pods_api()
            .get_opt(&name)
            .await
            .expect("get pod")
            .is_none()
            .then_some(())
    })
    .await;
    // Hold the next registration's JIT config request long enough to report the job while it is in flight.
    let registrations = env.fake.state().count("generate_jit_config");
    env.slow_down("generate_jit_config", 10_000);
    let manager = env.start(options);
    env.eventually("the next registration requested", || async {
        (env.fake.state().count("generate_jit_config") > registrations).then_some(())
    })
    .await;
    // The listener's write: the job's fields, only while the status records the registration it started on.
    let fields = json!({"jobRequestId": 42, "jobId": "job-late", "jobRepositoryName": "org/repo",
        "jobWorkflowRef": "org/repo/.github/workflows/ci.yml@refs/heads/main", "workflowRunId": 9001,
        "jobDisplayName": "build"});
    env.runners_api()
        .patch_status(
            &name,
            &PatchParams::apply("arc-rs/listener"),
            &Patch::Apply(crds::job_fields_apply(
                &name,
                old_id,
                fields.as_object().expect("fields").clone(),
            )),
        )
        .await
        .expect(
            "the status still records the registration given up while the next one is requested",
        );
    env.fake
        .state()
        .set_faults(Faults::default())
        .expect("clear faults");

    let runner = env
        .eventually("the next registration recorded", || async {
            let runner = env.runners_api().get(&name).await.ok()?;
            let id = runner_id(&runner);
            (id != 0 && id != old_id).then_some(runner)
        })
        .await;
    let status = runner.status.clone().unwrap_or_default();
    assert!(
        !status.has_job() && status.job_request_id == 0 && status.job_display_name.is_empty(),
        "the next registration inherited the late job: {status:?}"
    );
    // And so it scales down like any idle runner (patch id 0: an authoritative count).
    env.run_pod(&name).await;
    env.scale("arc", 0, 0).await;
    env.eventually("the runner removed", || async {
        env.runners().await.is_empty().then_some(())
    })
    .await;
    assert!(
        env.registered().is_empty(),
        "no registration left: {:?}",
        env.registered()
    );
    manager.stop().await;
}

/// An idle runner whose pod is deleted but stays `Terminating` (a lost node: nothing stops it; here a finalizer
/// holds it) is released at once and, past the pod's deletion deadline, gives up its place so the set replaces
/// it: capacity never waits on a pod no kubelet will remove.
#[tokio::test]
async fn a_pod_stuck_terminating_does_not_hold_the_runners_place() {
    let env = Env::new("lc-stuck").await;
    env.create_set("arc", 1, 0).await;
    let manager = env.start(env.options());
    let (name, _, old_id, _) = one_idle_runner(&env).await;
    env.pods_api()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": ["test.arc-rs.dev/hold"] } })),
        )
        .await
        .expect("hold the pod");
    env.pods_api()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the pod");

    env.eventually("the idle runner released at once", || async {
        let runner = env.runners_api().get(&name).await.ok()?;
        let status = runner.status?;
        let released = status.reason == "PodDeleted"
            && status.runner_id == 0
            && !env
                .fake
                .state()
                .snapshot()
                .runners
                .iter()
                .any(|runner| runner.id == old_id);
        released.then_some(())
    })
    .await;
    let replacement = env
        .eventually("a replacement runner with a pod", || async {
            let runners = env.runners().await;
            let old_going = runners.iter().all(|runner| {
                runner.name_any() != name || runner.metadata.deletion_timestamp.is_some()
            });
            let pods = env.pod_uids().await;
            let other = pods.into_iter().find(|(pod, _)| *pod != name)?;
            old_going.then_some(other.0)
        })
        .await;
    assert_ne!(replacement, name);
    assert!(
        event_reasons(&env, &name)
            .await
            .contains("RunnerPodStuckTerminating")
    );
    // Let the held pod go.
    env.pods_api()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .expect("release the pod");
    manager.stop().await;
}

/// A pod creation the API server fails (here an admission webhook it cannot reach, failing closed: a 500, not a
/// refusal) after the runner registered: the registration is discarded, reported as a creation that failed (not
/// as a pod that was deleted), and no new registration is made until a dry run of the pod passes, so a webhook
/// that stays down costs the service nothing. Once the webhook is gone, the runner gets its pod.
#[tokio::test]
async fn a_pod_creation_that_fails_is_reported_as_such_and_registers_nothing_until_a_dry_run_passes()
 {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use kube::api::PostParams;

    let env = Env::new("lc-post-fails").await;
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(env.ctx.client.clone());
    let webhook_name = format!("{}-unreachable", env.ctx.namespace);
    let webhook: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": webhook_name},
        "webhooks": [{
            "name": "unreachable.arc-rs.test",
            // Nothing listens on port 1: every call fails, and failurePolicy Fail turns that into a 500.
            "clientConfig": {"url": "https://127.0.0.1:1/validate"},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": env.ctx.namespace}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 2,
        }],
    }))
    .expect("webhook");
    webhooks
        .create(&PostParams::default(), &webhook)
        .await
        .expect("create the webhook");
    // The API server takes up a new webhook a moment later: wait until a dry-run pod fails through it.
    let probe: Pod = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "spec": {"containers": [{"name": "c", "image": "example.com/probe"}]},
    }))
    .expect("probe pod");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    env.eventually("the webhook in force", || async {
        match env.pods_api().create(&dry_run, &probe).await {
            Err(kube::Error::Api(status)) if status.code == 500 => Some(()),
            _ => None,
        }
    })
    .await;
    env.create_set("arc", 1, 0).await;
    let manager = env.start(env.options());

    let name = env
        .eventually("the runner", || async {
            env.runners().await.first().map(ResourceExt::name_any)
        })
        .await;
    env.eventually("an Event saying the pod could not be created", || async {
        event_reasons(&env, &name)
            .await
            .contains(controller::ephemeral_runner::POD_CREATION_FAILED_EVENT)
            .then_some(())
    })
    .await;
    // Passes keep trying while the webhook is down: in dry-run mode, so nothing more is registered.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    assert_eq!(
        env.fake.state().count("generate_jit_config"),
        1,
        "only the registration whose pod failed"
    );
    assert!(
        env.registered().is_empty(),
        "the registration whose pod failed was removed"
    );
    let reasons = event_reasons(&env, &name).await;
    assert!(
        !reasons.contains(controller::ephemeral_runner::POD_DELETED_EVENT),
        "a pod that was never made is not reported as deleted: {reasons:?}"
    );
    assert!(env.pods().await.is_empty());

    webhooks
        .delete(&webhook_name, &DeleteParams::default())
        .await
        .expect("delete the webhook");
    env.eventually("the runner's pod, once the webhook is gone", || async {
        env.pods_api().get_opt(&name).await.ok().flatten()
    })
    .await;
    // Registered again: the identity shows once the pod runs.
    env.run_pod(&name).await;
    let registered = env.recorded_runner_id(&name).await;
    assert!(
        env.fake
            .state()
            .snapshot()
            .runners
            .iter()
            .any(|runner| runner.id == registered && runner.name == name),
        "the recorded registration is the service's"
    );
    manager.stop().await;
}
