//! Every finalizer, annotation and label key the controllers, the listener and the Helm charts share, plus
//! container names and status phase values. The values are part of ARC's observable contract (objects created by
//! ARC must keep working), so they must not change.

/// API group of the four kinds.
pub const GROUP: &str = "actions.github.com";
/// The only version of the four kinds.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of the four kinds.
pub const API_VERSION: &str = "actions.github.com/v1alpha1";

// Finalizers (docs/reference/controllers.md, "Finalizers").

/// On AutoscalingRunnerSets; removed by the ARS controller after cleanup.
pub const AUTOSCALING_RUNNER_SET_FINALIZER: &str =
    "autoscalingrunnerset.actions.github.com/finalizer";
/// On AutoscalingListeners; removed by the AL controller after cleanup.
pub const AUTOSCALING_LISTENER_FINALIZER: &str = "autoscalinglistener.actions.github.com/finalizer";
/// On EphemeralRunnerSets; removed by the ERS controller after cleanup.
pub const EPHEMERAL_RUNNER_SET_FINALIZER: &str = "ephemeralrunnerset.actions.github.com/finalizer";
/// On EphemeralRunners; removed last by the ER controller.
pub const EPHEMERAL_RUNNER_FINALIZER: &str = "ephemeralrunner.actions.github.com/finalizer";
/// What ARC up to 0.14 puts on its EphemeralRunnerSets (the runners' string, not a set's); the ERS controller
/// removes it with its own when a runner set of such a release is deleted, or the set would stay forever.
pub const LEGACY_EPHEMERAL_RUNNER_SET_FINALIZER: &str = EPHEMERAL_RUNNER_FINALIZER;
/// On EphemeralRunners; removed once the runner is deregistered from the Actions Service.
pub const EPHEMERAL_RUNNER_REGISTRATION_FINALIZER: &str =
    "ephemeralrunner.actions.github.com/runner-registration-finalizer";
/// Not in ARC: on an EphemeralRunner whose job the cluster interrupted, in a set that asks for re-runs: the re-run
/// still owed. Removed once GitHub accepted it, or it is given up (docs/runner-lifecycle.md).
pub const JOB_RERUN_FINALIZER: &str = "ephemeralrunner.actions.github.com/job-rerun";
/// Put by the Helm chart on its RBAC objects, ServiceAccounts and Secrets; removed (never added) by the ARS
/// controller when the ARS is deleted.
pub const CLEANUP_PROTECTION_FINALIZER: &str = "actions.github.com/cleanup-protection";

// Annotations (docs/reference/controllers.md, "Annotations").

/// Decimal scale set ID on the ARS (no prefix, as in ARC).
pub const RUNNER_SCALE_SET_ID_ANNOTATION: &str = "runner-scale-set-id";
/// Scale set name as returned by the Actions Service.
pub const RUNNER_SCALE_SET_NAME_ANNOTATION: &str = "actions.github.com/runner-scale-set-name";
/// Runner group name as returned by the Actions Service.
pub const RUNNER_GROUP_NAME_ANNOTATION: &str = "actions.github.com/runner-group-name";
/// Opaque hash of what an object was built from, used to detect changes.
pub const INTEGRITY_HASH_ANNOTATION: &str = "actions.github.com/integrity-hash";
/// Not in ARC: on an EphemeralRunnerSet whose AutoscalingRunnerSet asks for the re-run of interrupted jobs, the
/// most re-runs of one job (`spec.rerunInterruptedJobs.maxReruns`); absent: none.
pub const RERUN_INTERRUPTED_JOBS_ANNOTATION: &str = "actions.github.com/rerun-interrupted-jobs";
/// Not in ARC: on an EphemeralRunner holding [`JOB_RERUN_FINALIZER`], why its job was interrupted
/// (`oom_killed`, `evicted`, `deleted`, `node_lost`).
pub const JOB_INTERRUPTED_ANNOTATION: &str = "actions.github.com/job-interrupted";
/// The ERS `spec.patchID` at the moment an ER was created.
pub const PATCH_ID_ANNOTATION: &str = "actions.github.com/patch-id";
/// Not in ARC. On an ERS: the `metadata.generation` whose positive patch id the set acted upon.
///
/// A patch id only means something within one listener's life: a new listener counts from the start again. ARC
/// infers "this patch was acted upon" from the patch ids on the runners, so a new listener's patch whose id equals
/// one an earlier listener used is ignored, and a controller stopped half-way through a scale-up never finishes
/// it. The API server gives every change of the spec a new generation, so recording the generation acted upon
/// says exactly which version of the request was served, whoever wrote it. The listener reads it back, as the
/// acknowledgement of [`COMPLETED_RUNNERS_ANNOTATION`].
pub const APPLIED_GENERATION_ANNOTATION: &str = "actions.github.com/applied-generation";
/// Not in ARC. On an ERS, written by the listener with every scaling patch: the runners (comma-separated
/// `name:runnerId`, [`crate::listing`]) whose finished jobs the patch's `replicas` no longer counts. The set keeps counting a runner that left
/// with a job until its name is listed (or a while has passed), so a target computed before the job's completion
/// reached the listener does not make the set replace a runner whose job is over. The listener lists a name until
/// the set records, in [`APPLIED_GENERATION_ANNOTATION`], a generation that carried it.
pub const COMPLETED_RUNNERS_ANNOTATION: &str = "actions.github.com/completed-runners";
/// Set by Helm on the ARS: RoleBinding whose cleanup-protection finalizer is removed at ARS deletion.
pub const CLEANUP_MANAGER_ROLE_BINDING_ANNOTATION: &str =
    "actions.github.com/cleanup-manager-role-binding";
/// Set by Helm on the ARS: manager Role to release at ARS deletion.
pub const CLEANUP_MANAGER_ROLE_NAME_ANNOTATION: &str =
    "actions.github.com/cleanup-manager-role-name";
/// Set by Helm on the ARS: kubernetes-mode Role to release at ARS deletion.
pub const CLEANUP_KUBERNETES_MODE_ROLE_NAME_ANNOTATION: &str =
    "actions.github.com/cleanup-kubernetes-mode-role-name";
/// Set by Helm on the ARS: kubernetes-mode RoleBinding to release at ARS deletion.
pub const CLEANUP_KUBERNETES_MODE_ROLE_BINDING_NAME_ANNOTATION: &str =
    "actions.github.com/cleanup-kubernetes-mode-role-binding-name";
/// Set by Helm on the ARS: kubernetes-mode ServiceAccount to release at ARS deletion.
pub const CLEANUP_KUBERNETES_MODE_SERVICE_ACCOUNT_NAME_ANNOTATION: &str =
    "actions.github.com/cleanup-kubernetes-mode-service-account-name";
/// Set by Helm on the ARS: GitHub credentials Secret to release at ARS deletion.
pub const CLEANUP_GITHUB_SECRET_NAME_ANNOTATION: &str =
    "actions.github.com/cleanup-github-secret-name";
/// Set by Helm on the ARS: no-permission ServiceAccount to release at ARS deletion.
pub const CLEANUP_NO_PERMISSION_SERVICE_ACCOUNT_NAME_ANNOTATION: &str =
    "actions.github.com/cleanup-no-permission-service-account-name";
/// Not in ARC: on the ARS, the scale set labels last known to be in the Actions Service (a JSON list of names),
/// so a change of `runnerScaleSetLabels` is pushed to the service once.
pub const SCALE_SET_LABELS_ANNOTATION: &str = "actions.github.com/runner-scale-set-labels";
/// Set by Helm on the ARS; not read by the controllers.
pub const VALUES_HASH_ANNOTATION: &str = "actions.github.com/values-hash";

// Labels (docs/reference/controllers.md, "Labels").

/// `app.kubernetes.io/part-of`, value [`PART_OF_VALUE`].
pub const PART_OF_LABEL: &str = "app.kubernetes.io/part-of";
/// Value of [`PART_OF_LABEL`] on everything the controllers create.
pub const PART_OF_VALUE: &str = "gha-runner-scale-set";
/// `app.kubernetes.io/component`, values `COMPONENT_*`.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// [`COMPONENT_LABEL`] value on EphemeralRunnerSets.
pub const COMPONENT_RUNNER_SET: &str = "runner-set";
/// [`COMPONENT_LABEL`] value on AutoscalingListeners.
pub const COMPONENT_LISTENER: &str = "runner-scale-set-listener";
/// Not in ARC. Where the listener serves `/healthz`, whatever its metrics address: the scale-set chart's liveness
/// probe (`listenerLivenessProbe`) asks port 8080. The manager writes it into every listener's config
/// (`health_addr`); with `/healthz` on the metrics server instead, a metrics address of another port had the
/// probe fail and the kubelet kill the listener every minute.
pub const LISTENER_HEALTH_ADDR: &str = ":8080";
/// [`COMPONENT_LABEL`] value on EphemeralRunners.
pub const COMPONENT_RUNNER: &str = "runner";
/// `app.kubernetes.io/component` of a set's PodDisruptionBudget for busy runners (beyond ARC).
pub const COMPONENT_BUSY_RUNNERS_BUDGET: &str = "busy-runners-budget";
/// `app.kubernetes.io/version`: read on the ARS for the version gate, copied to the ERS and AL.
pub const VERSION_LABEL: &str = "app.kubernetes.io/version";
/// ARS name, on the objects derived from it.
pub const SCALE_SET_NAME_LABEL: &str = "actions.github.com/scale-set-name";
/// ARS namespace, on the objects derived from it.
pub const SCALE_SET_NAMESPACE_LABEL: &str = "actions.github.com/scale-set-namespace";
/// Enterprise part of the GitHub config URL (trimmed, see [`crate::names::url_label_value`]).
pub const ENTERPRISE_LABEL: &str = "actions.github.com/enterprise";
/// Organization part of the GitHub config URL.
pub const ORGANIZATION_LABEL: &str = "actions.github.com/organization";
/// Repository part of the GitHub config URL.
pub const REPOSITORY_LABEL: &str = "actions.github.com/repository";
/// AL name, on the listener Role and RoleBinding (which cannot have an owner in another namespace).
pub const LISTENER_NAME_LABEL: &str = "auto-scaling-listener-name";
/// AL namespace, on the listener Role and RoleBinding.
pub const LISTENER_NAMESPACE_LABEL: &str = "auto-scaling-listener-namespace";
/// On runner pods, value [`EPHEMERAL_RUNNER_LABEL_VALUE`].
pub const EPHEMERAL_RUNNER_LABEL: &str = "actions-ephemeral-runner";
/// Value of [`EPHEMERAL_RUNNER_LABEL`].
pub const EPHEMERAL_RUNNER_LABEL_VALUE: &str = "True";
/// Opaque hash on runner pods.
pub const POD_TEMPLATE_HASH_LABEL: &str = "pod-template-hash";
/// Set by the runner's container hooks on the pods and Secrets they create (value: ER name); the ER controller
/// deletes objects carrying it.
pub const RUNNER_POD_LABEL: &str = "runner-pod";
/// Never set; filtered out of label maps before hashing, as ARC does.
pub const RUNNER_TEMPLATE_HASH_LABEL: &str = "runner-template-hash";
/// Label and annotation on a busy runner's pod: the id of its job. Written by the manager with the job's other
/// metadata; the set's disruption budget for busy runners selects pods by it (beyond ARC).
pub const JOB_ID_KEY: &str = "actions.github.com/job-id";
/// Name suffix of a set's PodDisruptionBudget for busy runners (`<set>-busy-runners`, beyond ARC).
pub const BUSY_RUNNERS_BUDGET_SUFFIX: &str = "-busy-runners";

// Containers and environment.

/// Name of the runner container in runner pod templates.
pub const RUNNER_CONTAINER_NAME: &str = "runner";
/// Name of the listener container in the listener pod.
pub const LISTENER_CONTAINER_NAME: &str = "listener";
/// Environment variable of the runner container that enables container hooks.
pub const CONTAINER_HOOKS_ENV: &str = "ACTIONS_RUNNER_CONTAINER_HOOKS";
/// Not in ARC: environment variable of the listener container naming its AutoscalingListener, whose status the
/// listener reports to. Without it (and [`LISTENER_NAMESPACE_ENV`]) the listener reports nothing.
pub const LISTENER_NAME_ENV: &str = "AUTOSCALING_LISTENER_NAME";
/// Not in ARC: environment variable of the listener container with its AutoscalingListener's namespace.
pub const LISTENER_NAMESPACE_ENV: &str = "AUTOSCALING_LISTENER_NAMESPACE";

/// Values of `status.phase` (docs/reference/controllers.md, "Status phases"). ARS: Pending, Running, Outdated.
/// ERS: Running, Outdated. ER: empty, Pending, Running, Succeeded, Failed, Outdated (Pending/Running/Succeeded/Failed
/// copy the pod phase).
pub mod phase {
    /// Being set up.
    pub const PENDING: &str = "Pending";
    /// Working.
    pub const RUNNING: &str = "Running";
    /// The runner (or a runner of the set) reported that its version is no longer accepted.
    pub const OUTDATED: &str = "Outdated";
    /// ER only: finished successfully.
    pub const SUCCEEDED: &str = "Succeeded";
    /// ER only: failed.
    pub const FAILED: &str = "Failed";
}

/// Values of ER `status.reason` written by the controllers besides a pod's own reason.
pub mod reason {
    /// The runner pod could not be created from the template.
    pub const INVALID_POD: &str = "InvalidPod";
    /// The runner exited because its version is outdated.
    pub const OUTDATED: &str = "Outdated";
    /// Pod creation is refused for now, by a quota or an admission check (retried; the runner's set reports it).
    pub const POD_CREATION_REJECTED: &str = "PodCreationRejected";
    /// Defined by ARC but never written.
    pub const TOO_MANY_POD_FAILURES: &str = "TooManyPodFailures";
}
