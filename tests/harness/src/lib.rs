//! A real local control plane for tests: etcd, kube-apiserver and kube-controller-manager built from their
//! upstream Go modules by `tests/env/provision.sh`, started once per test binary on free loopback ports.
//!
//! ```no_run
//! # async fn demo() {
//! let ctx = test_harness::TestContext::new("my-test").await;
//! // ctx.client is an admin kube::Client; ctx.namespace is a fresh namespace for this test only.
//! # }
//! ```
//!
//! Every test gets its own namespace. The processes (and the temporary directory) go away when the test
//! binary exits, whether it passes, panics or is killed: see [`process`].

mod assets;
mod binaries;
mod control_plane;
mod crds;
pub mod executor;
pub mod node;
mod pki;
pub mod process;
pub mod requests;
mod scheduler;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::OnceCell;

/// Whether `ARC_RS_KEEP_CONTROL_PLANE=1` asks to keep the control plane's directory and every process's log.
pub fn keep_logs() -> bool {
    std::env::var("ARC_RS_KEEP_CONTROL_PLANE").is_ok_and(|v| v == "1")
}

pub use assets::{K8S_VERSION, PROVISION_COMMAND, assets_dir, binary};
pub use binaries::workspace_binary;
pub use control_plane::{ApiServerRestart, ControlPlane};
pub use crds::{FIELD_MANAGER, apply_crds};
pub use executor::{LISTENER_POD_SELECTOR, ListenerExecutor};
pub use node::{NodeConfig, RealNode, node_tier};
pub use scheduler::{TEST_SCHEDULER, start_scheduler};

/// Everything that can go wrong while starting the control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "`{name}` is not in {dir} (KUBEBUILDER_ASSETS); build the test binaries with `{}` and export \
         KUBEBUILDER_ASSETS to the directory it prints",
        PROVISION_COMMAND
    )]
    MissingBinary { name: String, dir: PathBuf },
    #[error("creating the control plane's temporary directory")]
    CreateTempDir(#[source] std::io::Error),
    #[error("writing {path}")]
    WriteFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("generating the control plane's certificates")]
    GenerateCertificates(#[source] rcgen::Error),
    #[error("allocating a free loopback port")]
    AllocatePort(#[source] std::io::Error),
    #[error("starting {name}")]
    StartProcess {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("killing {name}: {reason}")]
    KillProcess { name: String, reason: String },
    #[error("{component} did not become ready ({detail}); end of its log:\n{log_tail}")]
    NotReady {
        component: String,
        detail: String,
        log_tail: String,
    },
    #[error("reading the generated kubeconfig")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    #[error("talking to the API server")]
    Kube(#[source] kube::Error),
    #[error("building binary {bin} of package {package} with cargo failed:\n{stderr}")]
    BuildBinary {
        package: String,
        bin: String,
        stderr: String,
    },
    #[error(
        "{} is not there; build it first, or unset {} to let the tests build it",
        path.display(),
        binaries::PREBUILT_BIN_DIR_ENV
    )]
    PrebuiltBinaryMissing { path: PathBuf },
    #[error("CustomResourceDefinition {name} was not Established within {timeout:?}")]
    CrdNotEstablished { name: String, timeout: Duration },
    #[error("etcd request {path}: {detail}")]
    EtcdRequest { path: String, detail: String },
    #[error("namespace {namespace} got no default service account within {timeout:?}")]
    NamespaceNotReady {
        namespace: String,
        timeout: Duration,
    },
}

static CONTROL_PLANE: OnceCell<Result<ControlPlane, String>> = OnceCell::const_new();

/// The control plane of this test binary, started on first use.
///
/// A failed start is remembered, so every later test fails fast with the same message.
pub async fn control_plane() -> Result<&'static ControlPlane, String> {
    CONTROL_PLANE
        .get_or_init(|| async { ControlPlane::start().await.map_err(|e| format!("{e}")) })
        .await
        .as_ref()
        .map_err(Clone::clone)
}

/// A control plane for one test alone, for a test that counts the API server's requests: on the binary's shared
/// one, the garbage collector still cleaning up after another test counts as this test's requests (a CI run saw a
/// previous test's 30 runners' owner lookups in an idle window). It lives as long as the shared one, until the
/// binary exits, unless [`ControlPlane::stop`] ends it first.
pub async fn own_control_plane() -> Result<&'static ControlPlane, String> {
    let control_plane = ControlPlane::start().await.map_err(|e| format!("{e}"))?;
    Ok(Box::leak(Box::new(control_plane)))
}

/// What one test needs: an admin client and a namespace of its own.
pub struct TestContext {
    pub control_plane: &'static ControlPlane,
    pub client: Client,
    pub namespace: String,
}

impl TestContext {
    /// Starts the control plane if needed and creates a fresh namespace named after `prefix`.
    ///
    /// Panics with the start-up error: this is a test fixture and a test cannot go on without it.
    pub async fn new(prefix: &str) -> Self {
        match Self::try_new(prefix).await {
            Ok(ctx) => ctx,
            Err(e) => panic!("test control plane unavailable: {e}"),
        }
    }

    pub async fn try_new(prefix: &str) -> Result<Self, String> {
        Self::try_new_on(control_plane().await?, prefix).await
    }

    /// A fresh namespace named after `prefix` on `control_plane` (the shared one or [`own_control_plane`]).
    pub async fn try_new_on(
        control_plane: &'static ControlPlane,
        prefix: &str,
    ) -> Result<Self, String> {
        let client = control_plane.client().map_err(|e| e.to_string())?;
        let namespace = create_namespace(&client, prefix)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self {
            control_plane,
            client,
            namespace,
        })
    }

    /// A typed API in this test's namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}

const NAMESPACE_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Creates a uniquely named namespace and waits for its `default` service account, without which the
/// ServiceAccount admission plugin rejects pods.
pub async fn create_namespace(client: &Client, prefix: &str) -> Result<String, Error> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = namespace_name(prefix, std::process::id(), n);
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some([("arc-rs.test/harness".to_owned(), "true".to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create(&PostParams::default(), &ns)
        .await
        .map_err(Error::Kube)?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
    let deadline = Instant::now() + NAMESPACE_READY_TIMEOUT;
    while Instant::now() < deadline {
        if sas.get_opt("default").await.map_err(Error::Kube)?.is_some() {
            return Ok(name);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(Error::NamespaceNotReady {
        namespace: name,
        timeout: NAMESPACE_READY_TIMEOUT,
    })
}

/// A DNS-1123 label: the sanitised prefix, then the process id and a counter so names never collide.
fn namespace_name(prefix: &str, pid: u32, n: u32) -> String {
    let suffix = format!("-{pid}-{n}");
    let mut base: String = prefix
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    base.truncate(63 - suffix.len());
    let base = base.trim_matches('-');
    let base = if base.is_empty() { "test" } else { base };
    format!("{base}{suffix}")
}

/// Polls `check` until it returns `Some`, and returns that value; panics naming `what` after `timeout`.
///
/// The one waiting loop of the integration tests: the control plane has no kubelet and controllers converge
/// asynchronously, so tests wait for observable state instead of sleeping.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    match poll_until(timeout, check).await {
        Some(value) => value,
        None => panic!("timed out after {timeout:?} waiting for {what}"),
    }
}

/// Polls `check` until it returns `Some` (that value) or `timeout` passes (`None`), so a caller can say what the
/// world looked like before it fails.
pub async fn poll_until<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names_are_dns_labels() {
        for prefix in [
            "crd_roundtrip",
            "",
            "---",
            "A Very Long Prefix Indeed ".repeat(5).as_str(),
        ] {
            let name = namespace_name(prefix, 4_294_967_295, 4_294_967_295);
            assert!(name.len() <= 63, "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
            assert!(!name.starts_with('-') && !name.ends_with('-'), "{name}");
        }
        assert_eq!(namespace_name("crd_roundtrip", 7, 3), "crd-roundtrip-7-3");
    }
}
