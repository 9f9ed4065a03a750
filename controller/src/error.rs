//! The crate's error type: one variant per failed operation, each with a bounded metric label and a requeue
//! delay, so `error_policy` stays one line.

use std::borrow::Cow;
use std::time::Duration;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can fail in the manager and its reconcilers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An object lacks a field every stored object has (name, namespace or uid).
    #[error("{kind} has no metadata.{field}")]
    MissingObjectField {
        /// Kind of the object.
        kind: Cow<'static, str>,
        /// The missing field.
        field: &'static str,
    },

    /// Reading a Secret failed.
    #[error("get Secret {namespace}/{name}: {}", api_message(source))]
    GetSecret {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },

    /// The credentials Secret named by a resource does not exist.
    #[error("Secret {namespace}/{name} with the GitHub credentials does not exist")]
    CredentialsSecretMissing {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },

    /// The credentials in a Secret are unusable.
    #[error("read GitHub credentials from Secret {namespace}/{name}: {source}")]
    ReadCredentials {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: crds::Error,
    },

    /// GitHub credentials could not be read from Azure Key Vault (`vaultConfig` type `azure_key_vault`).
    #[error("read GitHub credentials for namespace {namespace} from Azure Key Vault: {source}")]
    ReadVaultCredentials {
        /// Namespace of the resource whose `vaultConfig` was used.
        namespace: String,
        /// Cause; its reason names what to fix (boxed: large, and only on a failure path).
        #[source]
        source: Box<vault::Error>,
    },

    /// A `vaultConfig` this manager cannot read.
    #[error(
        "vault type {vault_type:?} is not supported by this manager; store the credentials in a Secret"
    )]
    UnsupportedVault {
        /// The configured type.
        vault_type: String,
    },

    /// A proxy credentials Secret is missing a key or unreadable.
    #[error("read proxy credentials from Secret {namespace}/{name}: {reason}")]
    ReadProxyCredentials {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// What is wrong.
        reason: String,
    },

    /// The `githubServerTLS` certificate could not be read.
    #[error("read the GitHub server CA certificate: {reason}")]
    ReadTlsCertificate {
        /// What is wrong.
        reason: String,
    },

    /// Building an Actions Service client failed (bad URL, key, proxy or CA).
    #[error("build the Actions Service client for {url}: {source}")]
    BuildActionsClient {
        /// The GitHub config URL.
        url: String,
        /// Cause.
        #[source]
        source: actions_client::Error,
    },

    /// An Actions Service call did not finish within its deadline.
    #[error("{operation} did not finish within {after:?}")]
    ActionsDeadline {
        /// The call.
        operation: &'static str,
        /// The deadline.
        after: Duration,
    },

    /// Generating a JIT runner configuration failed.
    #[error("generate the JIT config of runner {runner}: {source}")]
    GenerateJitConfig {
        /// Runner (EphemeralRunner) name.
        runner: String,
        /// Cause.
        #[source]
        source: actions_client::Error,
    },

    /// Removing a runner registration failed.
    #[error("remove runner {runner_id} from the Actions Service: {source}")]
    RemoveRunner {
        /// Runner id.
        runner_id: i64,
        /// Cause.
        #[source]
        source: actions_client::Error,
    },

    /// Reading a runner registration failed.
    #[error("get runner {runner} from the Actions Service: {source}")]
    GetRunner {
        /// Runner id or name.
        runner: String,
        /// Cause.
        #[source]
        source: actions_client::Error,
    },

    /// Listing a workflow run's jobs on GitHub failed.
    #[error("list the jobs of workflow run {run_id} of {repository} on GitHub: {source}")]
    ListWorkflowRunJobs {
        /// `owner/repo`.
        repository: String,
        /// Workflow run id.
        run_id: i64,
        /// Cause.
        #[source]
        source: actions_client::Error,
    },

    /// Asking GitHub to re-run a job failed.
    #[error("re-run job {job_id} of {repository} on GitHub: {source}")]
    RerunWorkflowJob {
        /// `owner/repo`.
        repository: String,
        /// REST job id.
        job_id: i64,
        /// Cause.
        #[source]
        source: actions_client::Error,
    },

    /// The JIT Secret of a runner does not hold a usable runner id.
    #[error("JIT Secret {namespace}/{name} is corrupt: {reason}")]
    CorruptJitSecret {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// What is wrong.
        reason: String,
    },

    /// Creating an object failed.
    #[error("create {kind} {namespace}/{name}: {}", api_message(source))]
    CreateObject {
        /// Kind.
        kind: Cow<'static, str>,
        /// Namespace.
        namespace: String,
        /// Name (or generateName).
        name: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },

    /// Deleting an object failed.
    #[error("delete {kind} {namespace}/{name}: {}", api_message(source))]
    DeleteObject {
        /// Kind.
        kind: Cow<'static, str>,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },

    /// Patching an object (metadata, finalizers or status) failed.
    #[error("patch {what} of {kind} {namespace}/{name}: {}", api_message(source))]
    PatchObject {
        /// Kind.
        kind: Cow<'static, str>,
        /// What was patched.
        what: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },

    /// Reading or listing objects failed.
    #[error("read {kind} in {namespace}: {}", api_message(source))]
    ReadObjects {
        /// Kind.
        kind: Cow<'static, str>,
        /// Namespace.
        namespace: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },

    /// A desired object could not be serialised.
    #[error("serialise {what}: {source}")]
    Serialize {
        /// What.
        what: &'static str,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },

    /// A proxy URL in a resource is unusable.
    #[error("proxy setting of {namespace}/{name}: {source}")]
    ProxyUrl {
        /// Namespace.
        namespace: String,
        /// Resource name.
        name: String,
        /// Cause.
        #[source]
        source: actions_client::Error,
    },

    /// Several independent steps failed (scale up/down, cleanup); all were attempted.
    #[error("{} step(s) failed; first: {}", .0.len(), .0.first().map(ToString::to_string).unwrap_or_default())]
    Several(Vec<Error>),

    /// Looking up a runner group by name failed (including "no such group").
    #[error("get runner group {group:?}: {source}")]
    GetRunnerGroup {
        /// Group name.
        group: String,
        /// Cause.
        #[source]
        source: actions_client::Error,
    },

    /// Reading a scale set from the Actions Service failed.
    #[error("get runner scale set {scale_set}: {source}")]
    GetScaleSet {
        /// Name or id.
        scale_set: String,
        /// Cause.
        #[source]
        source: actions_client::Error,
    },

    /// The Actions Service refused to create a scale set.
    #[error("create runner scale set {scale_set:?}: {source}")]
    CreateScaleSet {
        /// Name.
        scale_set: String,
        /// Cause.
        #[source]
        source: actions_client::Error,
    },

    /// Updating a scale set (name or runner group) failed.
    #[error("update runner scale set {id}: {source}")]
    UpdateScaleSet {
        /// Scale set id.
        id: i64,
        /// Cause.
        #[source]
        source: actions_client::Error,
    },

    /// Deleting a scale set failed.
    #[error("delete runner scale set {id}: {source}")]
    DeleteScaleSet {
        /// Scale set id.
        id: i64,
        /// Cause.
        #[source]
        source: actions_client::Error,
    },

    /// An AutoscalingRunnerSet's spec contradicts itself (beyond what the CRD schema can check).
    #[error("invalid AutoscalingRunnerSet {name}: {reason}")]
    InvalidRunnerSetSpec {
        /// AutoscalingRunnerSet name.
        name: String,
        /// What is wrong.
        reason: String,
    },

    /// The listener of an AutoscalingListener cannot be configured from its spec.
    #[error("configure listener {listener}: {reason}")]
    InvalidListenerConfig {
        /// AutoscalingListener name.
        listener: String,
        /// What is wrong.
        reason: String,
    },

    /// A CRD the manager needs is not served by the API server.
    #[error("the {kind} API is not available (are the CRDs installed?): {source}")]
    CrdMissing {
        /// Kind.
        kind: Cow<'static, str>,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },

    /// A watch never delivered its initial list.
    #[error("the {kind} watch stopped before its initial list was read")]
    WatchNotReady {
        /// Kind.
        kind: Cow<'static, str>,
    },

    /// Building the Kubernetes client failed.
    #[error("build the Kubernetes client: {0}")]
    BuildKubeClient(#[source] Box<kube::Error>),

    /// Reading or writing the leader-election Lease failed.
    #[error("leader election Lease {namespace}/{name}: {}", api_message(source))]
    LeaderElection {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },

    /// Taking or renewing the leader-election Lease got no answer in time.
    #[error("leader election Lease {namespace}/{name}: no answer within {after:?}")]
    LeaderElectionTimedOut {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// How long the attempt waited.
        after: std::time::Duration,
    },

    /// A command-line flag has a value the manager cannot use.
    #[error("--{flag}: {reason}")]
    InvalidFlag {
        /// The flag's name.
        flag: &'static str,
        /// What is wrong with its value.
        reason: String,
    },

    /// The leader stopped holding its Lease: the controllers stopped, and the process should exit.
    #[error("the leader election Lease was lost")]
    LeadershipLost,

    /// Binding or serving an HTTP endpoint failed.
    #[error("serve HTTP on {addr}: {source}")]
    Serve {
        /// Address.
        addr: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether this is a patch of object `kind` `namespace`/`name` that the API server answered 404: the object a
    /// pass was about was deleted meanwhile (a runner's status written just as its teardown removed it), so
    /// nothing is left to do and nothing to warn about.
    pub fn is_gone(&self, kind: &str, namespace: &str, name: &str) -> bool {
        self.is_patch_answered(kind, namespace, name, 404)
    }

    /// Whether this is a patch of object `kind` `namespace`/`name` that the API server answered 409: it held at a
    /// resource version the object has moved past (a write the pass's view did not show yet), whose watch event
    /// brings the object back for a pass that sees it.
    pub fn is_overtaken(&self, kind: &str, namespace: &str, name: &str) -> bool {
        self.is_patch_answered(kind, namespace, name, 409)
    }

    /// Whether this is a patch of object `kind` `namespace`/`name` that the API server answered `code`.
    fn is_patch_answered(&self, kind: &str, namespace: &str, name: &str, code: u16) -> bool {
        matches!(
            self,
            Self::PatchObject { kind: patched, namespace: ns, name: n, source, .. }
                if patched == kind && ns == namespace && n == name && is_status(source, code)
        )
    }

    /// Whether the API server refused an object request for lack of permission (403).
    pub fn is_forbidden(&self) -> bool {
        matches!(
            self,
            Self::CreateObject { source, .. }
                | Self::DeleteObject { source, .. }
                | Self::PatchObject { source, .. }
                | Self::ReadObjects { source, .. }
                if is_status(source, 403)
        )
    }

    /// A bounded label for metrics: the variant name, never the message.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::MissingObjectField { .. } => "missing_object_field",
            Self::GetSecret { .. } => "get_secret",
            Self::CredentialsSecretMissing { .. } => "credentials_secret_missing",
            Self::ReadCredentials { .. } => "read_credentials",
            Self::UnsupportedVault { .. } => "unsupported_vault",
            Self::ReadVaultCredentials { .. } => "read_vault_credentials",
            Self::ReadProxyCredentials { .. } => "read_proxy_credentials",
            Self::ReadTlsCertificate { .. } => "read_tls_certificate",
            Self::BuildActionsClient { .. } => "build_actions_client",
            Self::ActionsDeadline { .. } => "actions_deadline",
            Self::GenerateJitConfig { .. } => "generate_jit_config",
            Self::RemoveRunner { .. } => "remove_runner",
            Self::GetRunner { .. } => "get_runner",
            Self::ListWorkflowRunJobs { .. } => "list_workflow_run_jobs",
            Self::RerunWorkflowJob { .. } => "rerun_workflow_job",
            Self::CorruptJitSecret { .. } => "corrupt_jit_secret",
            Self::CreateObject { .. } => "create_object",
            Self::DeleteObject { .. } => "delete_object",
            Self::PatchObject { .. } => "patch_object",
            Self::ReadObjects { .. } => "read_objects",
            Self::Serialize { .. } => "serialize",
            Self::ProxyUrl { .. } => "proxy_url",
            Self::Several(_) => "several",
            Self::GetRunnerGroup { .. } => "get_runner_group",
            Self::GetScaleSet { .. } => "get_scale_set",
            Self::CreateScaleSet { .. } => "create_scale_set",
            Self::UpdateScaleSet { .. } => "update_scale_set",
            Self::DeleteScaleSet { .. } => "delete_scale_set",
            Self::InvalidListenerConfig { .. } => "invalid_listener_config",
            Self::CrdMissing { .. } => "crd_missing",
            Self::WatchNotReady { .. } => "watch_not_ready",
            Self::BuildKubeClient(_) => "build_kube_client",
            Self::InvalidFlag { .. } => "invalid_flag",
            Self::LeadershipLost => "leadership_lost",
            Self::Serve { .. } => "serve",
            Self::LeaderElection { .. } | Self::LeaderElectionTimedOut { .. } => "leader_election",
            Self::InvalidRunnerSetSpec { .. } => "invalid_runner_set_spec",
        }
    }

    /// Whether retrying soon is pointless until someone changes the configuration (a Secret, a spec): such
    /// errors are retried slowly.
    pub fn is_configuration_problem(&self) -> bool {
        match self {
            // 422 Invalid: the object we derive from the user's spec can never be stored (e.g. a name longer than
            // a label value allows) until the spec changes.
            Self::CreateObject { source, .. } | Self::PatchObject { source, .. }
                if is_status(source, 422) =>
            {
                true
            }
            Self::CredentialsSecretMissing { .. }
            | Self::ReadCredentials { .. }
            | Self::UnsupportedVault { .. }
            | Self::ReadProxyCredentials { .. }
            | Self::ReadTlsCertificate { .. }
            | Self::BuildActionsClient { .. }
            | Self::ProxyUrl { .. }
            | Self::InvalidListenerConfig { .. }
            | Self::InvalidRunnerSetSpec { .. } => true,
            Self::GetRunnerGroup { source, .. }
            | Self::GetScaleSet { source, .. }
            | Self::CreateScaleSet { source, .. }
            | Self::UpdateScaleSet { source, .. }
            | Self::DeleteScaleSet { source, .. } => matches!(
                source.kind(),
                Some(
                    actions_client::ErrorKind::Unauthorized
                        | actions_client::ErrorKind::Forbidden
                        | actions_client::ErrorKind::RunnerGroupNotFound
                        | actions_client::ErrorKind::ScaleSetExists
                        | actions_client::ErrorKind::AmbiguousName
                        | actions_client::ErrorKind::TlsCertificate
                ) | None
            ),
            Self::GenerateJitConfig { source, .. }
            | Self::RemoveRunner { source, .. }
            | Self::GetRunner { source, .. } => {
                matches!(
                    source.kind(),
                    Some(
                        actions_client::ErrorKind::Unauthorized
                            | actions_client::ErrorKind::Forbidden
                    )
                ) || source.kind().is_none()
            }
            // Network trouble on the way to Entra ID or the vault passes; everything else needs a fix.
            Self::ReadVaultCredentials { source, .. } => !source.is_transient(),
            Self::Several(errors) => errors.iter().all(Self::is_configuration_problem),
            _ => false,
        }
    }
}

/// Whether a kube error is an API answer with this HTTP status.
pub fn is_status(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == code)
}

/// The API server's message for an API error, or the error's text.
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("boom", "Reason")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn labels_are_variant_names() {
        let error = Error::CreateObject {
            kind: "Pod".into(),
            namespace: "ns".into(),
            name: "p".into(),
            source: Box::new(api_error(500)),
        };
        assert_eq!(error.metric_label(), "create_object");
        assert!(!error.is_configuration_problem());
    }

    #[test]
    fn api_statuses_are_recognised() {
        assert!(is_status(&api_error(404), 404));
        assert!(!is_status(&api_error(409), 404));
        assert_eq!(api_message(&api_error(403)), "boom");
    }

    #[test]
    fn a_patch_answered_404_means_the_patched_object_is_gone() {
        let patch = |code, name: &str| Error::PatchObject {
            kind: "EphemeralRunner".into(),
            what: "status",
            namespace: "ns".into(),
            name: name.into(),
            source: Box::new(api_error(code)),
        };
        assert!(patch(404, "r").is_gone("EphemeralRunner", "ns", "r"));
        assert!(!patch(409, "r").is_gone("EphemeralRunner", "ns", "r"));
        assert!(!patch(404, "other").is_gone("EphemeralRunner", "ns", "r"));
        assert!(!patch(404, "r").is_gone("Pod", "ns", "r"));
        assert!(!patch(404, "r").is_gone("EphemeralRunner", "elsewhere", "r"));
        assert!(patch(409, "r").is_overtaken("EphemeralRunner", "ns", "r"));
        assert!(!patch(404, "r").is_overtaken("EphemeralRunner", "ns", "r"));
        assert!(!patch(409, "other").is_overtaken("EphemeralRunner", "ns", "r"));
        let create = Error::CreateObject {
            kind: "EphemeralRunner".into(),
            namespace: "ns".into(),
            name: "r".into(),
            source: Box::new(api_error(404)),
        };
        assert!(!create.is_gone("EphemeralRunner", "ns", "r"));
    }

    #[test]
    fn several_is_a_configuration_problem_only_if_all_are() {
        let missing = || Error::CredentialsSecretMissing {
            namespace: "ns".into(),
            name: "s".into(),
        };
        assert!(Error::Several(vec![missing(), missing()]).is_configuration_problem());
        let transient = Error::WatchNotReady { kind: "Pod".into() };
        let mixed = Error::Several(vec![missing(), transient]);
        assert!(!mixed.is_configuration_problem());
        assert!(mixed.to_string().starts_with("2 step(s) failed"), "{mixed}");
    }
}
