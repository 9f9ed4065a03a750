//! etcd + kube-apiserver + kube-controller-manager on free loopback ports, in a temporary directory.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::ChildStdin;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};

use crate::Error;
use crate::assets;
use crate::pki::Pki;
use crate::process::{Supervised, remove_dir_when_process_exits};

const START_TIMEOUT: Duration = Duration::from_secs(180);

/// Audit policy for `ARC_RS_AUDIT_WRITES=1`: every write at metadata level, nothing else.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: None
"#;

/// Whether `ARC_RS_AUDIT_WRITES=1` asks kube-apiserver to log every write to `audit.log` in the control plane's
/// directory (keep it with `ARC_RS_KEEP_CONTROL_PLANE=1`).
pub fn audit_writes() -> bool {
    std::env::var("ARC_RS_AUDIT_WRITES").is_ok_and(|v| v == "1")
}

/// Index of kube-apiserver in [`ControlPlane::processes`] (etcd is 0, the controller-manager 2).
const API_SERVER: usize = 1;

/// A running control plane. Its processes stop when the test process exits, however it exits.
pub struct ControlPlane {
    dir: PathBuf,
    server: String,
    /// etcd's client address (`127.0.0.1:port`).
    etcd: String,
    kubeconfig: PathBuf,
    config: kube::Config,
    processes: Mutex<Vec<Supervised>>,
    /// How kube-apiserver was started, so that it can be started again the same way.
    api_server: Launch,
    /// One API-server restart at a time.
    restarting: tokio::sync::Mutex<()>,
    _cleanup: ChildStdin,
}

/// A server's program, flags and log.
#[derive(Debug, Clone)]
struct Launch {
    name: &'static str,
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
}

impl Launch {
    fn spawn(&self) -> Result<Supervised, Error> {
        Supervised::spawn(self.name, &self.program, &self.args, &self.log)
    }
}

/// How an API-server restart went (see [`ControlPlane::restart_api_server`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiServerRestart {
    /// From the stop request until the old process had exited.
    pub stop: Duration,
    /// From starting the new process until its `/readyz` answered `ok`.
    pub start: Duration,
}

impl ApiServerRestart {
    /// How long the API server did not serve: stop plus start.
    pub fn down(&self) -> Duration {
        self.stop + self.start
    }
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("dir", &self.dir)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager and waits until all three serve.
    pub async fn start() -> Result<Self, Error> {
        let etcd_bin = assets::binary("etcd")?;
        let apiserver_bin = assets::binary("kube-apiserver")?;
        let kcm_bin = assets::binary("kube-controller-manager")?;

        let dir = tempfile::Builder::new()
            .prefix("arc-rs-control-plane-")
            .tempdir()
            .map_err(Error::CreateTempDir)?
            .keep();
        let cleanup = remove_dir_when_process_exits(&dir)?;
        let pki = Pki::generate()?;
        let file = |name: &str, contents: &str| -> Result<PathBuf, Error> {
            let path = dir.join(name);
            std::fs::write(&path, contents).map_err(|source| Error::WriteFile {
                path: path.clone(),
                source,
            })?;
            Ok(path)
        };
        let ca = file("ca.crt", &pki.ca_cert)?;
        // Kept for signing real nodes' client certificates (`node`).
        file("ca.key", &pki.ca_key)?;
        let serving_cert = file("apiserver.crt", &pki.serving_cert)?;
        let serving_key = file("apiserver.key", &pki.serving_key)?;
        let admin_cert = file("admin.crt", &pki.admin_cert)?;
        let admin_key = file("admin.key", &pki.admin_key)?;
        let sa_key = file("service-account.key", &pki.service_account_key)?;
        // The API server reads verification keys only from PUBLIC KEY / RSA blocks, not from PKCS#8.
        let sa_pub = file("service-account.pub", &pki.service_account_public_key)?;

        let [etcd_client, etcd_peer, apiserver_port] = free_ports()?;
        let server = format!("https://127.0.0.1:{apiserver_port}");
        let kubeconfig = file(
            "kubeconfig",
            &kubeconfig_json(
                &server,
                &ca,
                serde_json::json!({"client-certificate": admin_cert, "client-key": admin_key}),
            ),
        )?;

        let mut processes = Vec::new();
        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let etcd_data = dir.join("etcd");
        processes.push(Supervised::spawn(
            "etcd",
            &etcd_bin,
            &args(&[
                ("--name", "default"),
                ("--data-dir", &path_str(&etcd_data)),
                ("--listen-client-urls", &etcd_url),
                ("--advertise-client-urls", &etcd_url),
                ("--listen-peer-urls", &peer_url),
                ("--initial-advertise-peer-urls", &peer_url),
                ("--initial-cluster", &format!("default={peer_url}")),
                // Test data is disposable; fsync dominates etcd latency on small VMs.
                ("--unsafe-no-fsync", "true"),
                ("--log-level", "warn"),
            ]),
            &dir.join("etcd.log"),
        )?);
        wait_for_port(&mut processes[0], etcd_client).await?;

        let mut api_server_args = args(&[
            ("--etcd-servers", &etcd_url),
            ("--bind-address", "127.0.0.1"),
            ("--advertise-address", "127.0.0.1"),
            ("--secure-port", &apiserver_port.to_string()),
            ("--cert-dir", &path_str(&dir.join("apiserver-certs"))),
            ("--tls-cert-file", &path_str(&serving_cert)),
            ("--tls-private-key-file", &path_str(&serving_key)),
            ("--client-ca-file", &path_str(&ca)),
            // RBAC for real, so the security tests' SubjectAccessReviews mean something.
            ("--authorization-mode", "RBAC"),
            (
                "--service-account-issuer",
                "https://kubernetes.default.svc.cluster.local",
            ),
            ("--service-account-key-file", &path_str(&sa_pub)),
            ("--service-account-signing-key-file", &path_str(&sa_key)),
            ("--service-cluster-ip-range", "10.0.0.0/24"),
            // The dind container mode needs privileged pods.
            ("--allow-privileged", "true"),
            ("--v", "1"),
        ]);
        if audit_writes() {
            // Who wrote what: one JSON line per write request (user, user agent, verb, object, code), for
            // attributing a benchmark's writes to the manager, the listener, the garbage collector or the
            // simulated kubelet. Off by default: it costs the API server time on every write.
            let policy = file("audit-policy.yaml", AUDIT_POLICY)?;
            api_server_args.extend(args(&[
                ("--audit-policy-file", &path_str(&policy)),
                ("--audit-log-path", &path_str(&dir.join("audit.log"))),
                ("--audit-log-format", "json"),
                ("--audit-log-mode", "batch"),
            ]));
        }
        let api_server = Launch {
            name: "kube-apiserver",
            program: apiserver_bin,
            args: api_server_args,
            log: dir.join("kube-apiserver.log"),
        };
        processes.push(api_server.spawn()?);

        let kube_options = KubeConfigOptions::default();
        let kc = Kubeconfig::read_from(&kubeconfig).map_err(Error::Kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &kube_options)
            .await
            .map_err(Error::Kubeconfig)?;
        let client = Client::try_from(config.clone()).map_err(Error::Kube)?;
        wait_until_ready(&mut processes[API_SERVER], &client).await?;

        processes.push(Supervised::spawn(
            "kube-controller-manager",
            &kcm_bin,
            &args(&[
                ("--kubeconfig", &path_str(&kubeconfig)),
                ("--authentication-kubeconfig", &path_str(&kubeconfig)),
                ("--authorization-kubeconfig", &path_str(&kubeconfig)),
                ("--secure-port", "0"),
                ("--leader-elect", "false"),
                ("--service-account-private-key-file", &path_str(&sa_key)),
                ("--root-ca-file", &path_str(&ca)),
                ("--use-service-account-credentials", "false"),
                ("--cluster-signing-cert-file", &path_str(&ca)),
                ("--v", "1"),
            ]),
            &dir.join("kube-controller-manager.log"),
        )?);
        // The service-account controller creating `default/default` proves the controller-manager works.
        wait_for_default_service_account(&mut processes[2], &client, "default").await?;

        Ok(Self {
            dir,
            server,
            etcd: format!("127.0.0.1:{etcd_client}"),
            kubeconfig,
            config,
            processes: Mutex::new(processes),
            api_server,
            restarting: tokio::sync::Mutex::new(()),
            _cleanup: cleanup,
        })
    }

    /// Restarts kube-apiserver alone, as a rolling update of the control plane would: SIGTERM (SIGKILL after
    /// 5 s), then the same binary with the same flags, port and certificates, against the same etcd and its
    /// data; returns once `/readyz` answers `ok` again. etcd and the controller-manager keep running (the
    /// latter reconnects by itself). Clients built before keep working: they reconnect on their next request,
    /// and watches resume from their resource versions.
    ///
    /// The control plane is shared by every test of a test binary, so a test that restarts it disturbs the
    /// others: give it a test binary of its own.
    pub async fn restart_api_server(&self) -> Result<ApiServerRestart, Error> {
        self.restart_api_server_with(async {}).await
    }

    /// [`Self::restart_api_server`], running `while_down` once the old process has exited and before the new
    /// one starts: what happens to etcd's data then reaches clients only through the new API server (a watch
    /// that cannot resume lists again, see [`Self::etcd_delete`]).
    pub async fn restart_api_server_with(
        &self,
        while_down: impl Future<Output = ()>,
    ) -> Result<ApiServerRestart, Error> {
        let _one_at_a_time = self.restarting.lock().await;
        let stopping = Instant::now();
        let old = self
            .processes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(API_SERVER);
        // `stop` blocks (it polls the exit for up to 10 s): keep it off the async threads.
        let stopped = tokio::task::spawn_blocking(move || {
            let mut old = old;
            old.stop();
            old
        })
        .await
        .map_err(|e| Error::StartProcess {
            name: self.api_server.name.to_owned(),
            source: std::io::Error::other(format!("stopping the old process: {e}")),
        })?;
        drop(stopped);
        let stop = stopping.elapsed();
        while_down.await;

        let starting = Instant::now();
        let new = self.api_server.spawn()?;
        self.processes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(API_SERVER, new);
        let client = self.client()?;
        self.wait_until_api_server_ready(&client).await?;
        Ok(ApiServerRestart {
            stop,
            start: starting.elapsed(),
        })
    }

    /// Deletes etcd key `key` (an object's is `/registry/<resource>/<namespace>/<name>`, e.g.
    /// `/registry/configmaps/ns/a`) through etcd's JSON gateway, behind the API server's back: no watch event
    /// reports it. With the API server stopped ([`Self::restart_api_server_with`]), the new one's watch cache
    /// starts past every watch opened before, so those watches list again and the object is only missing from
    /// the list, as after a watch closed by a busy API server. Fails unless exactly one key was deleted.
    pub async fn etcd_delete(&self, key: &str) -> Result<(), Error> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const PATH: &str = "/v3/kv/deleterange";
        let failed = |detail: String| Error::EtcdRequest {
            path: PATH.to_owned(),
            detail,
        };
        // The gateway takes keys base64-encoded, which is how `ByteString` serialises.
        let body = serde_json::json!({ "key": k8s_openapi::ByteString(key.as_bytes().to_vec()) })
            .to_string();
        let request = format!(
            "POST {PATH} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            self.etcd,
            body.len()
        );
        let mut stream = tokio::net::TcpStream::connect(&self.etcd)
            .await
            .map_err(|e| failed(format!("connecting to {}: {e}", self.etcd)))?;
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| failed(format!("sending: {e}")))?;
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .map_err(|e| failed(format!("reading the answer: {e}")))?;
        // The JSON object of the body, whether or not it came in chunks.
        let answer = response
            .split_once("\r\n\r\n")
            .and_then(|(_, body)| body.get(body.find('{')?..=body.rfind('}')?))
            .unwrap_or_default();
        let deleted = serde_json::from_str::<serde_json::Value>(answer)
            .ok()
            .and_then(|value| value["deleted"].as_str().map(str::to_owned));
        if response.starts_with("HTTP/1.1 200") && deleted.as_deref() == Some("1") {
            Ok(())
        } else {
            Err(failed(format!("key {key}: {response}")))
        }
    }

    /// Polls `/readyz` until it answers `ok`, failing early if the API server exits.
    async fn wait_until_api_server_ready(&self, client: &Client) -> Result<(), Error> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let req = http::Request::get("/readyz").body(Vec::new());
            if let Ok(req) = req
                && let Ok(body) = client.request_text(req).await
                && body.trim() == "ok"
            {
                return Ok(());
            }
            {
                let mut processes = self.processes.lock().unwrap_or_else(|p| p.into_inner());
                let process = &mut processes[API_SERVER];
                if process.exited().is_some() || Instant::now() >= deadline {
                    return Err(not_ready(process, "/readyz after a restart"));
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A new client; one per test, since a client is tied to the tokio runtime that first uses it.
    pub fn client(&self) -> Result<Client, Error> {
        Client::try_from(self.config.clone()).map_err(Error::Kube)
    }

    /// A new admin client that hands every answer back as it came: kube's default client retries 429 and 503 by
    /// itself, so a refused eviction (429, a disruption budget) would look like one call that waits until the pod
    /// is gone. `kubectl drain` sees each refusal, as a test of one must.
    pub fn client_without_retries(&self) -> Result<Client, Error> {
        let mut config = self.config.clone();
        config.default_retry = false;
        Client::try_from(config).map_err(Error::Kube)
    }

    /// The admin `kube::Config`.
    pub fn config(&self) -> &kube::Config {
        &self.config
    }

    /// A kubeconfig file with admin credentials, for `helm` and other processes.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server URL.
    pub fn server_url(&self) -> &str {
        &self.server
    }

    /// The directory holding certificates, the etcd data and the three logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Each running component's name and process id (etcd, kube-apiserver, kube-controller-manager), for
    /// measurements such as the benchmark's CPU time per process.
    pub fn component_pids(&self) -> Vec<(String, u32)> {
        let procs = self.processes.lock().unwrap_or_else(|p| p.into_inner());
        procs
            .iter()
            .filter_map(|p| p.pid().map(|pid| (p.name().to_owned(), pid)))
            .collect()
    }

    /// Stops every component (SIGTERM, then SIGKILL), for a control plane of one test's own
    /// ([`crate::own_control_plane`]) whose test is over. Requests made to it afterwards fail.
    pub fn stop(&self) {
        // Taken out first, so the lock is not held for the seconds the components take to exit.
        let stopped =
            std::mem::take(&mut *self.processes.lock().unwrap_or_else(|p| p.into_inner()));
        drop(stopped);
    }

    /// Names of components that have exited, with their log tails; empty while all run.
    pub fn exited_components(&self) -> Vec<String> {
        let mut procs = self.processes.lock().unwrap_or_else(|p| p.into_inner());
        procs
            .iter_mut()
            .filter_map(|p| {
                p.exited()
                    .map(|status| format!("{} exited ({status}):\n{}", p.name(), p.log_tail(2000)))
            })
            .collect()
    }
}

fn args(pairs: &[(&str, &str)]) -> Vec<String> {
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

/// A kubeconfig (JSON, which every YAML reader accepts) for `server` trusting `ca`, authenticating as `user`
/// (a kubeconfig `user` object: client certificate files, or a token).
pub(crate) fn kubeconfig_json(server: &str, ca: &Path, user: serde_json::Value) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "arc-rs", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "arc-rs", "context": {"cluster": "arc-rs", "user": "user"}}],
        "current-context": "arc-rs",
    })
    .to_string()
}

/// Ports the kernel considers free right now. Held together while choosing so the three differ.
fn free_ports<const N: usize>() -> Result<[u16; N], Error> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(Error::AllocatePort)?;
    let mut ports = [0u16; N];
    for (port, l) in ports.iter_mut().zip(&listeners) {
        *port = l.local_addr().map_err(Error::AllocatePort)?.port();
    }
    Ok(ports)
}

fn not_ready(process: &mut Supervised, what: &str) -> Error {
    let state = match process.exited() {
        Some(status) => format!("exited ({status})"),
        None => format!("not ready after {}s", START_TIMEOUT.as_secs()),
    };
    Error::NotReady {
        component: process.name().to_owned(),
        detail: format!("{what}: {state}"),
        log_tail: process.log_tail(4000),
    }
}

async fn wait_for_port(process: &mut Supervised, port: u16) -> Result<(), Error> {
    let deadline = Instant::now() + START_TIMEOUT;
    while Instant::now() < deadline && process.exited().is_none() {
        if TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(not_ready(process, &format!("port {port}")))
}

async fn wait_until_ready(process: &mut Supervised, client: &Client) -> Result<(), Error> {
    let deadline = Instant::now() + START_TIMEOUT;
    while Instant::now() < deadline && process.exited().is_none() {
        let req = http::Request::get("/readyz").body(Vec::new());
        if let Ok(req) = req
            && let Ok(body) = client.request_text(req).await
            && body.trim() == "ok"
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(not_ready(process, "/readyz"))
}

pub(crate) async fn wait_for_default_service_account(
    process: &mut Supervised,
    client: &Client,
    namespace: &str,
) -> Result<(), Error> {
    let deadline = Instant::now() + START_TIMEOUT;
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    while Instant::now() < deadline && process.exited().is_none() {
        if let Ok(Some(_)) = api.get_opt("default").await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(not_ready(
        process,
        &format!("service account {namespace}/default"),
    ))
}
