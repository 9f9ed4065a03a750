//! Taking over what each ARC release line left, against the real control plane (docs/migrating-from-arc.md, "What
//! the manager does with what ARC left"). Each fixture is written as that release writes its objects (names,
//! owner references, finalizers, annotations, status, JIT Secret keys; facts from the release notes of each line),
//! with the fake holding the matching registrations and jobs, and is in the API server before the manager starts.
//! The CRDs installed are the project's: a field a release wrote that they do not have (0.12's
//! `status.runnerJITConfig`) is pruned by the API server, as it is on a real upgrade of the CRDs.

mod common;

use std::collections::BTreeSet;

use actions_client::JitSetting;
use common::{CREDENTIALS, Env};
use crds::constants::{
    AUTOSCALING_LISTENER_FINALIZER, AUTOSCALING_RUNNER_SET_FINALIZER, EPHEMERAL_RUNNER_FINALIZER,
    EPHEMERAL_RUNNER_REGISTRATION_FINALIZER, EPHEMERAL_RUNNER_SET_FINALIZER,
};
use crds::{AutoscalingListener, AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet};
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

/// The release lines whose objects differ where a take-over matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// 0.12.x: JIT token in the runner's status, jobs by request id only, finished runners kept as `Succeeded`,
    /// listener named by the namespace hash.
    V0_12,
    /// 0.13.0: JIT Secret with the runner id, `jobId`; listener still named by the namespace hash.
    V0_13_0,
    /// 0.14.2: `status.phase`, `change-hash`, listener named by namespace@group@URL; here in the middle of an
    /// `immediate` template change (two runner sets).
    V0_14_2,
    /// ARC's master (the 0.15 line): one runner set named like the scale set, its own finalizer, integrity hashes.
    Master,
}

impl Line {
    fn version_label(self) -> &'static str {
        match self {
            Self::V0_12 => "0.12.1",
            Self::V0_13_0 => "0.13.0",
            // master's charts still say 0.14.2.
            Self::V0_14_2 | Self::Master => "0.14.2",
        }
    }

    /// ARC's finalizer on its runner sets.
    fn runner_set_finalizer(self) -> &'static str {
        match self {
            Self::Master => EPHEMERAL_RUNNER_SET_FINALIZER,
            _ => EPHEMERAL_RUNNER_FINALIZER,
        }
    }

    /// The hash annotation ARC puts on runner sets, listeners and (inherited) runners.
    fn hash_annotation(self) -> &'static str {
        match self {
            Self::Master => "actions.github.com/integrity-hash",
            _ => "actions.github.com/runner-spec-hash",
        }
    }
}

/// One runner of a fixture.
struct FixtureRunner {
    name: String,
    /// The job it runs (request id), if busy.
    job: Option<i64>,
    runner_id: i64,
    finished: bool,
}

struct Fixture {
    env: Env,
    /// ARC's runner sets, oldest first.
    runner_sets: Vec<String>,
    runners: Vec<FixtureRunner>,
    listener: String,
    /// The objects ARC made for its listener besides the pod: (kind, name, uid).
    listener_objects: Vec<(&'static str, String, String)>,
}

const ARS: &str = "arc";

fn owner(kind: &str, name: &str, uid: &str) -> Value {
    json!([{
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": true,
        "blockOwnerDeletion": true,
    }])
}

fn scale_set_labels() -> Value {
    json!({
        "app.kubernetes.io/part-of": "gha-runner-scale-set",
        "actions.github.com/scale-set-name": ARS,
    })
}

fn runner_template() -> Value {
    json!({"spec": {"containers": [{"name": "runner", "image": "ghcr.io/actions/actions-runner:latest"}],
                    "restartPolicy": "Never"}})
}

async fn create<K>(api: &Api<K>, body: Value) -> K
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let object: K = serde_json::from_value(body).expect("fixture object");
    api.create(&PostParams::default(), &object)
        .await
        .expect("create a fixture object")
}

async fn put_status<K>(api: &Api<K>, name: &str, status: Value)
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .expect("write a fixture status");
}

/// The AutoscalingRunnerSet as ARC's chart made it and ARC's controller annotated it (with the scale set's id when
/// `registered`).
async fn arc_scale_set(
    env: &Env,
    line: Line,
    prefix: &str,
    registered: bool,
) -> AutoscalingRunnerSet {
    let ns = env.ctx.namespace.clone();
    let mut ars_annotations = json!({
        "actions.github.com/runner-scale-set-name": format!("set-{prefix}"),
        "actions.github.com/runner-group-name": "Default",
        "actions.github.com/values-hash": "0f3c9e",
    });
    if registered {
        ars_annotations["runner-scale-set-id"] = json!(env.scale_set_id.to_string());
    }
    if line == Line::V0_14_2 {
        ars_annotations["actions.github.com/change-hash"] = json!("5c7d8b9f");
    }
    create(
        &env.ctx.api(),
        json!({
            "apiVersion": "actions.github.com/v1alpha1", "kind": "AutoscalingRunnerSet",
            "metadata": {
                "name": ARS,
                "labels": {
                    "app.kubernetes.io/version": line.version_label(),
                    "app.kubernetes.io/part-of": "gha-rs",
                    "app.kubernetes.io/component": "autoscaling-runner-set",
                    "actions.github.com/scale-set-name": ARS,
                    "actions.github.com/scale-set-namespace": ns,
                },
                "annotations": ars_annotations,
                "finalizers": [AUTOSCALING_RUNNER_SET_FINALIZER],
            },
            "spec": {
                "githubConfigUrl": env.config_url, "githubConfigSecret": CREDENTIALS,
                "runnerScaleSetName": format!("set-{prefix}"),
                "maxRunners": 10, "minRunners": 0,
                "template": runner_template(),
            },
        }),
    )
    .await
}

/// Places, before the manager starts, what `line` leaves for a scale set with one busy and one idle runner (and,
/// for 0.12, a finished one; for 0.14.2, the busy runner in the older of two runner sets), ARC's listener with its
/// pod, and the fake's registrations and job.
async fn fixture(line: Line, prefix: &str) -> Fixture {
    let env = Env::new(prefix).await;
    let ns = env.ctx.namespace.clone();
    let ars_api: Api<AutoscalingRunnerSet> = env.ctx.api();
    let ars = arc_scale_set(&env, line, prefix, true).await;
    let ars_uid = ars.uid().expect("uid");
    if line != Line::V0_12 && line != Line::V0_13_0 {
        put_status(
            &ars_api,
            ARS,
            json!({"currentRunners": 2, "phase": "Running"}),
        )
        .await;
    }

    let runner_set_names: Vec<String> = match line {
        Line::Master => vec![ARS.to_owned()],
        Line::V0_14_2 => vec![format!("{ARS}-b7x2q"), format!("{ARS}-m4k9z")],
        _ => vec![format!("{ARS}-x7k2p")],
    };
    let sets: Api<EphemeralRunnerSet> = env.ctx.api();
    for (i, name) in runner_set_names.iter().enumerate() {
        create(
            &sets,
            json!({
                "apiVersion": "actions.github.com/v1alpha1", "kind": "EphemeralRunnerSet",
                "metadata": {
                    "name": name,
                    "labels": scale_set_labels(),
                    "annotations": {
                        line.hash_annotation(): format!("h{i}"),
                        "actions.github.com/runner-scale-set-name": format!("set-{prefix}"),
                    },
                    "ownerReferences": owner("AutoscalingRunnerSet", ARS, &ars_uid),
                    "finalizers": [line.runner_set_finalizer()],
                },
                "spec": {
                    // As ARC's listener last patched it.
                    "replicas": 2, "patchID": 41,
                    "ephemeralRunnerSpec": {
                        "githubConfigUrl": env.config_url, "githubConfigSecret": CREDENTIALS,
                        "runnerScaleSetId": env.scale_set_id,
                        "spec": runner_template()["spec"],
                    },
                },
            }),
        )
        .await;
        let mut status = json!({"currentReplicas": 1, "pendingEphemeralRunners": 0, "runningEphemeralRunners": 1,
                                "failedEphemeralRunners": 0});
        if matches!(line, Line::V0_14_2 | Line::Master) {
            status["phase"] = json!("Running");
        }
        put_status(&sets, name, status).await;
    }

    // The busy runner in the oldest set, the idle one in the newest; 0.12 also keeps a finished one.
    let oldest = runner_set_names[0].clone();
    let newest = runner_set_names.last().expect("a set").clone();
    let mut plan = vec![
        (
            format!("{oldest}-runner-busy1"),
            oldest.clone(),
            true,
            false,
        ),
        (
            format!("{newest}-runner-idle1"),
            newest.clone(),
            false,
            false,
        ),
    ];
    if line == Line::V0_12 {
        plan.push((
            format!("{oldest}-runner-done1"),
            oldest.clone(),
            false,
            true,
        ));
    }
    let runners_api: Api<EphemeralRunner> = env.ctx.api();
    let pods: Api<Pod> = env.ctx.api();
    let secrets: Api<Secret> = env.ctx.api();
    let mut runners = Vec::new();
    for (name, set, busy, finished) in plan {
        let set_uid = sets
            .get(&set)
            .await
            .expect("runner set")
            .uid()
            .expect("uid");
        let config = env
            .actions
            .generate_jit_runner_config(
                env.scale_set_id,
                &JitSetting {
                    name: name.clone(),
                    work_folder: String::new(),
                },
            )
            .await
            .expect("register the runner as ARC did");
        let runner_id = config.runner.as_ref().expect("runner").id;
        let token = config.encoded_jit_config.expose_secret().to_owned();
        let mut annotations = json!({
            line.hash_annotation(): "h0",
            "actions.github.com/patch-id": "41",
            "actions.github.com/runner-scale-set-name": format!("set-{prefix}"),
            "actions.github.com/runner-group-name": "Default",
        });
        if line == Line::Master {
            annotations["actions.github.com/integrity-hash"] = json!("arc-master-hash");
        }
        let runner = create(
            &runners_api,
            json!({
                "apiVersion": "actions.github.com/v1alpha1", "kind": "EphemeralRunner",
                "metadata": {
                    "name": name,
                    "labels": {"app.kubernetes.io/component": "runner", "actions.github.com/scale-set-name": ARS},
                    "annotations": annotations,
                    "ownerReferences": owner("EphemeralRunnerSet", &set, &set_uid),
                    "finalizers": [EPHEMERAL_RUNNER_FINALIZER, EPHEMERAL_RUNNER_REGISTRATION_FINALIZER],
                },
                "spec": {
                    "githubConfigUrl": env.config_url, "githubConfigSecret": CREDENTIALS,
                    "runnerScaleSetId": env.scale_set_id,
                    "spec": runner_template()["spec"],
                },
            }),
        )
        .await;
        let runner_uid = runner.uid().expect("uid");
        let mut secret_data = json!({"jitToken": token});
        if line != Line::V0_12 {
            secret_data["runnerName"] = json!(name);
            secret_data["runnerId"] = json!(runner_id.to_string());
            secret_data["scaleSetId"] = json!(env.scale_set_id.to_string());
        }
        create::<Secret>(
            &secrets,
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "ownerReferences": owner("EphemeralRunner", &name, &runner_uid)},
                "stringData": secret_data,
            }),
        )
        .await;
        let mut job = None;
        if finished {
            // Its runner exited 0 after its job and removed itself from the service; ARC 0.12 keeps the object.
            env.actions
                .remove_runner(runner_id)
                .await
                .expect("the runner left");
            put_status(
                &runners_api,
                &name,
                json!({"phase": "Succeeded", "ready": false, "runnerId": runner_id, "runnerName": name,
                       "runnerJITConfig": token}),
            )
            .await;
        } else {
            let owner_ref = owner("EphemeralRunner", &name, &runner_uid);
            create::<Pod>(
                &pods,
                json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "labels": {"actions-ephemeral-runner": "True"},
                                 "ownerReferences": owner_ref},
                    "spec": runner_template()["spec"],
                }),
            )
            .await;
            env.run_pod(&name).await;
            let mut status = json!({"phase": "Running", "ready": true, "runnerId": runner_id, "runnerName": name});
            if line == Line::V0_12 {
                status["runnerJITConfig"] = json!(token);
            }
            if busy {
                let request = env.assign_job(runner_id).await;
                env.fake.state().start_job(request).expect("start the job");
                status["jobRequestId"] = json!(request);
                status["jobRepositoryName"] = json!("org/repo");
                status["workflowRunId"] = json!(9001);
                if line != Line::V0_12 {
                    status["jobId"] = json!(format!("job-{request}"));
                }
                job = Some(request);
            }
            put_status(&runners_api, &name, status).await;
        }
        runners.push(FixtureRunner {
            name,
            job,
            runner_id,
            finished,
        });
    }

    // ARC's listener, still there (and, as far as anything can tell, still polling) when the manager starts.
    let listener = match line {
        Line::V0_12 | Line::V0_13_0 => format!("{ARS}-{}-listener", crds::names::hash8(&ns)),
        _ => crds::names::listener_name(ARS, &ns, "", &env.config_url),
    };
    let listeners: Api<AutoscalingListener> = env.ctx.api();
    let al = create(
        &listeners,
        json!({
            "apiVersion": "actions.github.com/v1alpha1", "kind": "AutoscalingListener",
            "metadata": {
                "name": listener,
                "labels": {
                    "app.kubernetes.io/component": "runner-scale-set-listener",
                    "actions.github.com/scale-set-name": ARS,
                    "actions.github.com/scale-set-namespace": ns,
                },
                "annotations": {line.hash_annotation(): "l0"},
                "finalizers": [AUTOSCALING_LISTENER_FINALIZER],
            },
            "spec": {
                "githubConfigUrl": env.config_url, "githubConfigSecret": CREDENTIALS,
                "runnerScaleSetId": env.scale_set_id,
                "autoscalingRunnerSetNamespace": ns, "autoscalingRunnerSetName": ARS,
                "ephemeralRunnerSetName": newest, "maxRunners": 10,
                "image": "ghcr.io/actions/gha-runner-scale-set-controller:0.14.2",
            },
        }),
    )
    .await;
    let listener_objects = listener_objects(&env, line, &listener, &al, &newest).await;
    create::<Pod>(
        &pods,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": listener, "labels": {"app.kubernetes.io/component": "runner-scale-set-listener"},
                         "ownerReferences": owner("AutoscalingListener", &listener, &al.uid().expect("uid"))},
            // ARC's listener reads its config from the Secret, mounted as `listener-config` (the project's listener
            // reads the same file: `an_arc_listener_still_polling_hands_its_session_over` runs it in this pod).
            "spec": {"containers": [{"name": "listener", "image": "ghcr.io/actions/gha-runner-scale-set-controller:0.14.2",
                                     "env": [{"name": "LISTENER_CONFIG_PATH", "value": "/etc/gha-listener/config.json"}],
                                     "volumeMounts": [{"name": "listener-config", "mountPath": "/etc/gha-listener", "readOnly": true}]}],
                     "volumes": [{"name": "listener-config", "secret": {"secretName": format!("{listener}-config")}}],
                     "restartPolicy": "Never", "serviceAccountName": listener},
        }),
    )
    .await;
    Fixture {
        env,
        runner_sets: runner_set_names,
        runners,
        listener,
        listener_objects,
    }
}

/// What ARC makes for its listener besides the pod (spec "Inventory and naming"): the ServiceAccount and the config
/// Secret in the listener's namespace, owned by the listener; the Role and RoleBinding in the set's namespace, named
/// like the listener, owned by nothing (ARC deletes them by name), the Role allowing the patch of the one runner set.
async fn listener_objects(
    env: &Env,
    line: Line,
    listener: &str,
    al: &AutoscalingListener,
    runner_set: &str,
) -> Vec<(&'static str, String, String)> {
    let ns = env.ctx.namespace.clone();
    let owned_by_listener = owner("AutoscalingListener", listener, &al.uid().expect("uid"));
    let labels = json!({
        "app.kubernetes.io/component": "runner-scale-set-listener",
        "app.kubernetes.io/part-of": "gha-runner-scale-set",
        "actions.github.com/scale-set-name": ARS,
        "actions.github.com/scale-set-namespace": ns,
    });
    let mut rbac_labels = labels.clone();
    rbac_labels["auto-scaling-listener-name"] = json!(listener);
    rbac_labels["auto-scaling-listener-namespace"] = json!(ns);
    let (role_annotations, binding_annotations) = match line {
        Line::Master => (
            json!({"actions.github.com/integrity-hash": "r0"}),
            json!({"actions.github.com/integrity-hash": "b0"}),
        ),
        // Up to 0.14 the Role and RoleBinding carry hashes of their rules, reference and subject.
        _ => (
            json!({"role-policy-rules-hash": "5d8c7f"}),
            json!({"role-binding-role-ref-hash": "7a1b2c", "role-binding-subject-hash": "9e4f3d"}),
        ),
    };
    let account = create::<ServiceAccount>(
        &env.ctx.api(),
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": listener, "labels": labels, "ownerReferences": owned_by_listener},
        }),
    )
    .await;
    let role = create::<Role>(
        &env.ctx.api(),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": listener, "labels": rbac_labels, "annotations": role_annotations},
            "rules": [
                {"apiGroups": ["actions.github.com"], "resources": ["ephemeralrunnersets"],
                 "resourceNames": [runner_set], "verbs": ["patch"]},
                {"apiGroups": ["actions.github.com"], "resources": ["ephemeralrunners", "ephemeralrunners/status"],
                 "verbs": ["patch"]},
            ],
        }),
    )
    .await;
    let binding = create::<RoleBinding>(
        &env.ctx.api(),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": listener, "labels": rbac_labels, "annotations": binding_annotations},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": listener},
            "subjects": [{"kind": "ServiceAccount", "name": listener, "namespace": ns}],
        }),
    )
    .await;
    let config = create::<Secret>(
        &env.ctx.api(),
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("{listener}-config"), "labels": labels,
                         "ownerReferences": owned_by_listener},
            // The keys every release writes (the credentials inlined, no vault, no metrics here).
            "stringData": {"config.json": json!({
                "configure_url": env.config_url, "github_token": "ghp_test",
                "ephemeral_runner_set_namespace": ns, "ephemeral_runner_set_name": runner_set,
                "max_runners": 10, "min_runners": 0, "runner_scale_set_id": env.scale_set_id,
                "runner_scale_set_name": ARS, "log_level": "debug", "log_format": "text",
            }).to_string()},
        }),
    )
    .await;
    vec![
        (
            "ServiceAccount",
            account.name_any(),
            account.uid().expect("uid"),
        ),
        ("Role", role.name_any(), role.uid().expect("uid")),
        (
            "RoleBinding",
            binding.name_any(),
            binding.uid().expect("uid"),
        ),
        ("Secret", config.name_any(), config.uid().expect("uid")),
    ]
}

/// The uid of the object of `kind` named `name` in the test's namespace, if there is one.
async fn uid_of(env: &Env, kind: &str, name: &str) -> Option<String> {
    async fn get<K>(api: Api<K>, name: &str) -> Option<String>
    where
        K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        api.get_opt(name).await.expect("read an object")?.uid()
    }
    match kind {
        "ServiceAccount" => get::<ServiceAccount>(env.ctx.api(), name).await,
        "Role" => get::<Role>(env.ctx.api(), name).await,
        "RoleBinding" => get::<RoleBinding>(env.ctx.api(), name).await,
        "Secret" => get::<Secret>(env.ctx.api(), name).await,
        other => panic!("no such fixture kind {other}"),
    }
}

async fn runner_names(env: &Env) -> BTreeSet<String> {
    env.runners_api()
        .list(&ListParams::default())
        .await
        .expect("list runners")
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect()
}

/// The manager as an arc-rs release would run it, its listeners in the test's namespace.
fn manager_options(env: &Env) -> controller::Options {
    let mut options = env.options();
    options.listener.namespace = Some(env.ctx.namespace.clone());
    options.listener.image = "ghcr.io/example/arc-rs:test".to_owned();
    options.build_version = "0.1.0".to_owned();
    options
}

async fn take_over(line: Line, prefix: &str) {
    let fixture = fixture(line, prefix).await;
    let env = &fixture.env;
    let options = manager_options(env);
    let busy = fixture
        .runners
        .iter()
        .find(|runner| runner.job.is_some())
        .expect("a busy runner");
    let pods: Api<Pod> = env.ctx.api();
    let busy_pod = pods.get(&busy.name).await.expect("busy pod").uid();
    let before = runner_names(env).await;
    let manager = env.start(options);

    // ARC's listener, polling until its pod goes, asks its runner set for more runners. (Master's one runner set is
    // the scale set's own: a patch of it is demand like any other, served.)
    for set in fixture.runner_sets.iter().filter(|set| *set != ARS) {
        env.sets()
            .patch(
                set,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 6, "patchID": 42}})),
            )
            .await
            .expect("ARC's listener patch");
    }

    let listeners: Api<AutoscalingListener> = env.ctx.api();
    let ours = env
        .eventually("ARC's listener replaced by the set's own", || async {
            let all = listeners.list(&ListParams::default()).await.ok()?.items;
            let arc_gone = !all.iter().any(|l| {
                l.name_any() == fixture.listener && l.spec.ephemeral_runner_set_name != ARS
            });
            let ours = all
                .into_iter()
                .find(|l| l.spec.ephemeral_runner_set_name == ARS)?;
            arc_gone.then_some(ours)
        })
        .await;
    assert_eq!(
        ours.spec.runner_scale_set_id, env.scale_set_id,
        "the scale set is kept"
    );
    // ARC's listener went with everything ARC made for it. (From 0.14.2 on, ARC's listener has the name the set's
    // own takes, so its objects' names come back, made anew by the manager; master's are the manager's own already.)
    if line != Line::Master {
        for (kind, name, uid) in &fixture.listener_objects {
            let now = uid_of(env, kind, name).await;
            assert_ne!(
                now.as_ref(),
                Some(uid),
                "ARC's listener {kind} {name} is still there"
            );
        }
    }
    env.eventually(
        "one runner set, the scale set's own, with the busy runner",
        || async {
            let sets = env.sets().list(&ListParams::default()).await.ok()?.items;
            let names: Vec<String> = sets.iter().map(ResourceExt::name_any).collect();
            let runner = env.runners_api().get_opt(&busy.name).await.ok()??;
            let moved = runner
                .owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && o.name == ARS);
            (names == [ARS] && moved).then_some(())
        },
    )
    .await;
    // Idle and finished runners were deregistered and deleted; the busy one runs its job in the same pod.
    for runner in fixture.runners.iter().filter(|r| r.job.is_none()) {
        env.wait_runner_gone(&format!("{} gone", runner.name), &runner.name)
            .await;
        if !runner.finished {
            assert!(
                env.fake.state().runner(runner.runner_id).is_err(),
                "{}: its registration was removed",
                runner.name
            );
        }
    }
    assert_eq!(
        pods.get(&busy.name).await.expect("busy pod").uid(),
        busy_pod,
        "the busy runner's pod was left alone"
    );
    let job = busy.job.expect("job");
    assert!(
        env.fake.state().job(job).expect("job").runner_id == Some(busy.runner_id),
        "the job still runs on its runner"
    );
    // No runner set was scaled for ARC's listener's last patch: every runner is one of the fixture's. (Master's
    // runner set is the scale set's own and keeps the `replicas` ARC's listener gave it: its idle runner's
    // replacement is made there.)
    if line != Line::Master {
        let now = runner_names(env).await;
        assert!(
            now.is_subset(&before),
            "runners made during the take-over: {now:?} (before: {before:?})"
        );
    }
    let ars: AutoscalingRunnerSet = env
        .ctx
        .api::<AutoscalingRunnerSet>()
        .get(ARS)
        .await
        .expect("ars");
    assert_eq!(
        ars.annotations().get("runner-scale-set-id"),
        Some(&env.scale_set_id.to_string()),
        "the scale set's id is kept"
    );
    if line != Line::Master {
        let events = env.event_notes("TakingOver").await;
        assert!(
            events.iter().any(|note| note.contains("1 with a job")),
            "an Event says what is taken over: {events:?}"
        );
    }

    // The job ends: the runner exits 0 and goes, with its registration.
    env.fake
        .state()
        .finish_job(job, "succeeded")
        .expect("finish the job");
    env.end_pod(&busy.name, "Succeeded", Some(0), None).await;
    env.wait_runner_gone("the busy runner gone after its job", &busy.name)
        .await;
    assert!(
        env.fake.state().runner(busy.runner_id).is_err(),
        "its registration was removed"
    );
    let registered = env.registered();
    let existing = runner_names(env).await;
    assert!(
        registered.is_subset(&existing),
        "registrations left for runners that are gone: {registered:?} (runners: {existing:?})"
    );

    // Uninstalling afterwards leaves nothing.
    env.ctx
        .api::<AutoscalingRunnerSet>()
        .delete(ARS, &DeleteParams::default())
        .await
        .expect("delete the set");
    env.eventually("the set and everything of it gone", || async {
        let ars = env
            .ctx
            .api::<AutoscalingRunnerSet>()
            .get_opt(ARS)
            .await
            .ok()?;
        let sets = env.sets().list(&ListParams::default()).await.ok()?.items;
        let listeners = listeners.list(&ListParams::default()).await.ok()?.items;
        (ars.is_none() && sets.is_empty() && listeners.is_empty()).then_some(())
    })
    .await;
    assert!(
        env.registered().is_empty(),
        "registrations left after the uninstall: {:?}",
        env.registered()
    );
    manager.stop().await;
}

/// ARC's listener still polling when the manager starts: the project's listener binary runs in ARC's 0.14.2 listener
/// pod, with ARC's config Secret and ARC's RBAC (it speaks the same protocol), and holds the scale set's one message
/// session, as ARC's would. The manager stops it before the set's own listener starts: the stopped listener closes
/// its session, the set's own listener holds the only one, and a new job scales the set's own runner set, never
/// ARC's.
#[tokio::test]
async fn an_arc_listener_still_polling_hands_its_session_over() {
    let fixture = fixture(Line::V0_14_2, "to-poll").await;
    let env = &fixture.env;
    // The session the fixture used to hand the busy runner its job stands for ARC's listener's: it goes, and ARC's
    // listener, run for real from here, makes its own.
    env.fake
        .state()
        .drop_sessions(&fake_actions_service::DropSessions {
            session_id: None,
            scale_set_id: Some(env.scale_set_id),
        });
    let _executor = env.listener_executor();
    let sessions = || {
        env.fake
            .state()
            .snapshot()
            .sessions
            .into_iter()
            .filter(|session| session.scale_set_id == env.scale_set_id)
            .collect::<Vec<_>>()
    };
    let arcs = env
        .eventually("ARC's listener polls on its session", || async {
            sessions().into_iter().find(|session| session.polls > 0)
        })
        .await;
    let closed_before = env.fake.state().count("delete_session");

    let manager = env.start(manager_options(env));
    let ours = env
        .eventually(
            "the set's own listener polls on the only session",
            || async {
                let now = sessions();
                match now.as_slice() {
                    [only] if only.id != arcs.id && only.polls > 0 => Some(only.clone()),
                    _ => None,
                }
            },
        )
        .await;
    assert!(
        env.fake.state().count("delete_session") > closed_before,
        "ARC's listener closed its session as it stopped (session {} of {})",
        arcs.id,
        arcs.owner_name
    );
    env.eventually("ARC's runner sets gone", || async {
        let sets = env.sets().list(&ListParams::default()).await.ok()?.items;
        sets.iter().all(|set| set.name_any() == ARS).then_some(())
    })
    .await;

    // A new job: the set's own listener asks the set's own runner set for a runner beside the busy one.
    env.fake
        .state()
        .enqueue_jobs(&fake_actions_service::EnqueueJobs {
            scale_set_id: Some(env.scale_set_id),
            count: 1,
            ..fake_actions_service::EnqueueJobs::default()
        })
        .expect("enqueue a job");
    env.eventually(
        "the set's own runner set scaled for the new job",
        || async {
            let set = env.sets().get_opt(ARS).await.ok()??;
            (set.spec.replicas >= 2).then_some(())
        },
    )
    .await;
    let sets = env.sets().list(&ListParams::default()).await.expect("sets");
    assert_eq!(
        sets.items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>(),
        [ARS],
        "no runner set of ARC's came back"
    );
    assert_eq!(sessions().len(), 1, "one session: {ours:?}");
    manager.stop().await;
}

#[tokio::test]
async fn what_arc_0_12_left_is_taken_over_without_losing_a_job() {
    take_over(Line::V0_12, "to-012").await;
}

#[tokio::test]
async fn what_arc_0_13_left_is_taken_over_without_losing_a_job() {
    take_over(Line::V0_13_0, "to-013").await;
}

#[tokio::test]
async fn what_arc_0_14_2_left_mid_template_change_is_taken_over_without_losing_a_job() {
    take_over(Line::V0_14_2, "to-0142").await;
}

#[tokio::test]
async fn what_arc_master_left_is_taken_over_without_losing_a_job() {
    take_over(Line::Master, "to-master").await;
}

/// ARC 0.14 parks a set whose runners reported an outdated runner version: phase `Outdated`, its listener, runner
/// sets and GitHub scale set deleted (the id annotation removed), until its spec changes. The manager cannot tell
/// whether the spec changed since (ARC's `change-hash` is ARC's own), and a set parked for good is what users of
/// 0.14 reported as stuck: it registers the scale set again and serves the set; runners that still report an outdated
/// version are replaced with a Warning Event, as for any set (docs/migrating-from-arc.md).
#[tokio::test]
async fn a_set_arc_0_14_parked_as_outdated_is_served_again_with_a_new_scale_set() {
    let prefix = "to-outdated";
    let env = Env::new(prefix).await;
    env.actions
        .delete_runner_scale_set(env.scale_set_id)
        .await
        .expect("ARC deleted the scale set");
    arc_scale_set(&env, Line::V0_14_2, prefix, false).await;
    put_status(
        &env.ctx.api::<AutoscalingRunnerSet>(),
        ARS,
        json!({"phase": "Outdated", "currentRunners": 0}),
    )
    .await;
    let manager = env.start(manager_options(&env));

    let ars_api = env.ctx.api::<AutoscalingRunnerSet>();
    let id = env
        .eventually("the set registered again, served and Running", || async {
            let ars = ars_api.get(ARS).await.ok()?;
            let id: i64 = ars.annotations().get("runner-scale-set-id")?.parse().ok()?;
            let running = ars.status.as_ref()?.phase == "Running";
            let set = env.sets().get_opt(ARS).await.ok()??;
            let listeners = env
                .ctx
                .api::<AutoscalingListener>()
                .list(&ListParams::default())
                .await
                .ok()?
                .items;
            let listener = listeners.iter().any(|l| {
                l.spec.runner_scale_set_id == id && l.spec.ephemeral_runner_set_name == ARS
            });
            (running && listener && set.meta().deletion_timestamp.is_none()).then_some(id)
        })
        .await;
    assert_ne!(id, env.scale_set_id, "ARC's scale set is gone; a new one");
    let registered = env
        .actions
        .get_runner_scale_set_by_id(id)
        .await
        .expect("read the scale set")
        .expect("the scale set exists on the service");
    assert_eq!(registered.name, format!("set-{prefix}"));
    assert!(
        ars_api
            .get(ARS)
            .await
            .expect("ars")
            .meta()
            .deletion_timestamp
            .is_none(),
        "the set is not deleted"
    );
    manager.stop().await;
}
