//! One real node for the control plane: containerd (its own root, state, socket and config), a kubelet with a
//! node client certificate from the control plane's CA; and the control plane's kube-scheduler, started with
//! its first node.
//!
//! Pods reach the API server through host networking: [`RealNode::api_server_env`] gives the
//! `KUBERNETES_SERVICE_HOST`/`PORT` a pod needs (the API server listens on 127.0.0.1, which a CNI bridge
//! cannot reach, and there is no kube-proxy for the `kubernetes` Service's ClusterIP). docs/development.md
//! says why.
//!
//! The node leaves nothing behind: see [`janitor`]. Dropping a [`RealNode`] tears it down (a panicking test
//! too); [`RealNode::teardown`] also reports anything that is still there.

mod config;
mod janitor;
mod prerequisites;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{EnvVar, Node};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Client};

pub use config::{first_global_ipv4, mounts_under};
pub use prerequisites::{Gate, NodeParts, PROVISION_NODE_COMMAND, gate, node_parts, node_tier};

use crate::control_plane::{ControlPlane, kubeconfig_json};
use crate::process::Supervised;
use crate::{Error, keep_logs};
use config::Layout;
use janitor::{Janitor, Scope};

/// How long the node may take to register and turn Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How many times a kubelet that exits before its node is Ready is started again.
const KUBELET_START_RESTARTS: u32 = 2;
/// How long before a kubelet that exited is started again.
const KUBELET_RESTART_DELAY: Duration = Duration::from_secs(1);
/// How long teardown waits for the last traces (the watchdogs' delayed kills) to go.
const TEARDOWN_SETTLE: Duration = Duration::from_secs(15);
/// Host directories the kubelet or containerd create outside the node's directory whatever they are told.
const HOST_DIRS: &[&str] = &[
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
    "/var/lib/cni",
];

/// What to start.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The sandbox image's docker archive and reference (the reference goes into containerd's config).
    pub pause_image: (PathBuf, String),
    /// Further docker archives to import before the kubelet starts.
    pub images: Vec<PathBuf>,
}

/// Where a node leaves traces on the host.
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    pub dir: PathBuf,
    pub cgroup_root: String,
    pub socket: PathBuf,
    pub bridge: String,
}

impl NodeIdentity {
    /// What of the node is still on the host (processes, mounts, cgroups, log links, bridge, directories), one
    /// line each; empty when nothing is.
    pub fn leftovers(&self) -> Vec<String> {
        janitor::leftovers(
            &self.dir,
            &self.cgroup_root,
            &self.socket,
            &self.bridge,
            keep_logs(),
        )
    }

    /// [`NodeIdentity::leftovers`] once they stop shrinking to nothing: polls for a while, since the process
    /// watchdogs send their last SIGKILL a few seconds after their server has gone. Blocks.
    pub fn settled_leftovers(&self) -> Vec<String> {
        let deadline = Instant::now() + TEARDOWN_SETTLE;
        loop {
            let left = self.leftovers();
            if left.is_empty() || Instant::now() >= deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// A running node. Dropping it tears it down.
pub struct RealNode {
    name: String,
    dir: PathBuf,
    cgroup_root: String,
    socket: PathBuf,
    bridge: String,
    ctr: PathBuf,
    api_server_port: String,
    pod_logs_dir: PathBuf,
    client: Client,
    /// For a client of its own in `Drop`, which runs outside any runtime the first client knows.
    kube_config: kube::Config,
    /// Stopped in reverse order of start, then the janitor cleans.
    processes: Vec<Supervised>,
    janitor: Option<Janitor>,
    /// Whether the Node object and the RBAC binding are gone already.
    objects_deleted: bool,
    /// The kubelet's program and arguments, to start it again after [`RealNode::kill_kubelet`].
    kubelet_command: (PathBuf, Vec<String>),
    /// How long start-up took, from nothing to a Ready node.
    pub started_in: Duration,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts a real node for this control plane (see [`RealNode`]); `parts` come from [`node_tier`].
    pub async fn start_node(
        &self,
        parts: &NodeParts,
        config: NodeConfig,
    ) -> Result<RealNode, Error> {
        RealNode::start(self, parts, config).await
    }
}

impl RealNode {
    pub async fn start(
        control_plane: &ControlPlane,
        parts: &NodeParts,
        config: NodeConfig,
    ) -> Result<Self, Error> {
        let started = Instant::now();
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("arc-rs-node-{}-{n}", std::process::id());
        let dir = tempfile::Builder::new()
            .prefix("arc-rs-node-")
            .tempdir()
            .map_err(Error::CreateTempDir)?
            .keep();
        let cgroup_root = format!("/{name}");
        // Interface names are at most 15 bytes.
        let bridge = format!("arcrs{}", (std::process::id() % 100_000) * 100 + n % 100);
        let created_host_dirs: Vec<PathBuf> = HOST_DIRS
            .iter()
            .map(PathBuf::from)
            .filter(|d| !d.exists())
            .collect();
        let node_ip = node_ip()?;
        let [kubelet_port, kubelet_healthz_port] = free_ports()?;
        let client_ca = control_plane.dir().join("ca.crt");
        let layout = Layout {
            dir: &dir,
            node_ip: &node_ip,
            cgroup_root: &cgroup_root,
            pause_image: &config.pause_image.1,
            cni_bin_dir: &parts.cni_bin_dir,
            bridge: &bridge,
            kubelet_port,
            kubelet_healthz_port,
            client_ca: &client_ca,
        };
        let socket = layout.containerd_socket();
        // The janitor first: whatever fails from here on, it cleans up.
        let janitor = Janitor::start(&Scope {
            dir: &dir,
            cgroup_root: &cgroup_root,
            socket: &socket,
            bridge: &bridge,
            keep_logs: keep_logs(),
            created_host_dirs: &created_host_dirs,
        })?;
        let api_server_port = control_plane
            .server_url()
            .rsplit(':')
            .next()
            .unwrap_or_default()
            .to_owned();
        let mut node = Self {
            name: name.clone(),
            dir: dir.clone(),
            cgroup_root: cgroup_root.clone(),
            socket: socket.clone(),
            bridge: bridge.clone(),
            ctr: parts.ctr.clone(),
            api_server_port,
            pod_logs_dir: layout.pod_logs_dir(),
            client: control_plane.client()?,
            kube_config: control_plane.config().clone(),
            processes: Vec::new(),
            janitor: Some(janitor),
            objects_deleted: false,
            kubelet_command: (parts.kubelet.clone(), Vec::new()),
            started_in: Duration::ZERO,
        };

        for sub in [
            "containerd",
            "cni/net.d",
            "cni/ipam",
            "kubelet",
            "pod-logs",
            "volume-plugins",
        ] {
            create_dir(&dir.join(sub))?;
        }
        create_cgroup_root(&cgroup_root)?;
        write(
            &layout.cni_conf_dir().join("10-arc-rs.conflist"),
            &config::cni_conflist(&layout),
        )?;
        let containerd_config = dir.join("containerd.toml");
        write(&containerd_config, &config::containerd_toml(&layout))?;
        node.processes.push(Supervised::spawn(
            "containerd",
            &parts.containerd,
            &[
                "--config".to_owned(),
                containerd_config.display().to_string(),
            ],
            &dir.join("containerd.log"),
        )?);
        node.wait_for_containerd().await?;
        node.import_image(&config.pause_image.0).await?;
        for image in &config.images {
            node.import_image(image).await?;
        }

        let ca_key =
            std::fs::read_to_string(control_plane.dir().join("ca.key")).map_err(|source| {
                Error::WriteFile {
                    path: control_plane.dir().join("ca.key"),
                    source,
                }
            })?;
        let (cert, key) = crate::pki::node_client_cert(&ca_key, &name)?;
        let cert_path = dir.join("kubelet-client.crt");
        let key_path = dir.join("kubelet-client.key");
        write(&cert_path, &cert)?;
        write(&key_path, &key)?;
        let kubeconfig = dir.join("kubelet.kubeconfig");
        write(
            &kubeconfig,
            &kubeconfig_json(
                control_plane.server_url(),
                &client_ca,
                serde_json::json!({"client-certificate": cert_path, "client-key": key_path}),
            ),
        )?;
        node.bind_node_role().await?;
        let kubelet_config = dir.join("kubelet-config.json");
        write(&kubelet_config, &config::kubelet_config(&layout))?;
        node.kubelet_command.1 = vec![
            format!("--config={}", kubelet_config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", layout.kubelet_root().display()),
            format!("--cert-dir={}", dir.join("kubelet-pki").display()),
            format!("--node-ip={node_ip}"),
            format!("--hostname-override={name}"),
            "--v=1".to_owned(),
        ];
        node.spawn_kubelet()?;
        ensure_scheduler(control_plane, parts)?;
        node.wait_ready().await?;
        node.started_in = started.elapsed();
        Ok(node)
    }

    /// The Node object's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's directory (containerd's and the kubelet's roots, logs, configs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What identifies the node's traces on the host, to check for leftovers after it is gone.
    pub fn identity(&self) -> NodeIdentity {
        NodeIdentity {
            dir: self.dir.clone(),
            cgroup_root: self.cgroup_root.clone(),
            socket: self.socket.clone(),
            bridge: self.bridge.clone(),
        }
    }

    /// The containerd socket.
    pub fn containerd_socket(&self) -> &Path {
        &self.socket
    }

    /// The environment a `hostNetwork` pod needs to reach the API server: the `kubernetes` Service's ClusterIP
    /// the kubelet injects works only with kube-proxy, which this node does not run.
    pub fn api_server_env(&self) -> Vec<EnvVar> {
        [
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", self.api_server_port.as_str()),
        ]
        .into_iter()
        .map(|(name, value)| EnvVar {
            name: name.to_owned(),
            value: Some(value.to_owned()),
            ..EnvVar::default()
        })
        .collect()
    }

    /// The log of one container of a pod (the kubelet's files; `kubectl logs` would need the API server to
    /// hold a kubelet client certificate).
    pub fn container_log(&self, namespace: &str, pod: &str, container: &str) -> Option<String> {
        let prefix = format!("{namespace}_{pod}_");
        let pod_dir = std::fs::read_dir(&self.pod_logs_dir)
            .ok()?
            .filter_map(Result::ok)
            .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))?
            .path()
            .join(container);
        let mut logs: Vec<PathBuf> = std::fs::read_dir(pod_dir)
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        logs.sort();
        let mut text = String::new();
        for log in logs {
            text.push_str(&std::fs::read_to_string(log).unwrap_or_default());
        }
        Some(text)
    }

    /// Imports a docker archive into the node's containerd (namespace `k8s.io`, where the kubelet looks).
    pub async fn import_image(&self, archive: &Path) -> Result<(), Error> {
        let output = tokio::process::Command::new(&self.ctr)
            .arg("-a")
            .arg(&self.socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(archive)
            .output()
            .await
            .map_err(|source| Error::StartProcess {
                name: "ctr images import".to_owned(),
                source,
            })?;
        if output.status.success() {
            Ok(())
        } else {
            Err(Error::NotReady {
                component: "containerd".to_owned(),
                detail: format!(
                    "importing {}: {}",
                    archive.display(),
                    String::from_utf8_lossy(&output.stderr)
                ),
                log_tail: self.log_tail("containerd"),
            })
        }
    }

    /// The end of a node component's log (`containerd`, `kubelet`).
    pub fn log_tail(&self, component: &str) -> String {
        crate::process::log_tail(&self.dir.join(format!("{component}.log")), 4000)
    }

    /// Components that exited, with their log tails; empty while all run.
    pub fn exited_components(&mut self) -> Vec<String> {
        self.processes
            .iter_mut()
            .filter_map(|p| {
                p.exited()
                    .map(|status| format!("{} exited ({status}):\n{}", p.name(), p.log_tail(2000)))
            })
            .collect()
    }

    /// Process ids of the node's components, by name.
    pub fn component_pids(&self) -> Vec<(String, u32)> {
        self.processes
            .iter()
            .filter_map(|p| p.pid().map(|pid| (p.name().to_owned(), pid)))
            .collect()
    }

    fn spawn_kubelet(&mut self) -> Result<(), Error> {
        let (program, args) = &self.kubelet_command;
        let kubelet = Supervised::spawn("kubelet", program, args, &self.dir.join("kubelet.log"))?;
        self.processes.push(kubelet);
        Ok(())
    }

    /// Kills the kubelet with SIGKILL, as a node failure would (the containers keep running: see
    /// [`RealNode::kill_containers`]); [`RealNode::start_kubelet`] brings it back.
    pub fn kill_kubelet(&mut self) -> Result<(), Error> {
        let Some(index) = self.processes.iter().position(|p| p.name() == "kubelet") else {
            return Err(Error::KillProcess {
                name: "kubelet".to_owned(),
                reason: "it is not running".to_owned(),
            });
        };
        let mut kubelet = self.processes.remove(index);
        kubelet.kill()?;
        kubelet.stop();
        Ok(())
    }

    /// Starts the kubelet again, with its first arguments, after [`RealNode::kill_kubelet`].
    pub fn start_kubelet(&mut self) -> Result<(), Error> {
        if self.processes.iter().any(|p| p.name() == "kubelet") {
            return Ok(());
        }
        self.spawn_kubelet()
    }

    /// Kills every process of every container and pod sandbox of the node (SIGKILL to everything in the node's
    /// cgroups), as a power loss would; returns how many processes were signalled. containerd and its shims
    /// live outside those cgroups: they record the containers as exited (137).
    pub fn kill_containers(&self) -> usize {
        let mut killed = std::collections::BTreeSet::new();
        for _ in 0..50 {
            // A killed process stays listed until its parent reaps it: only live ones count.
            let live: Vec<String> = config::cgroup_hierarchies()
                .iter()
                .map(|h| h.join(self.cgroup_root.trim_start_matches('/')))
                .flat_map(|root| cgroup_procs_under(&root))
                .filter(|pid| is_live(pid))
                .collect();
            if live.is_empty() {
                break;
            }
            for pid in live {
                let signalled = std::process::Command::new("kill")
                    .args(["-KILL", &pid])
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if signalled {
                    killed.insert(pid);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        killed.len()
    }

    /// Sends `signal` (e.g. `SIGSTOP`) to a container's main process through containerd; `container_id` as in
    /// the pod status, with or without its `containerd://` prefix.
    pub async fn signal_container(&self, container_id: &str, signal: &str) -> Result<(), Error> {
        let id = container_id.trim_start_matches("containerd://");
        let output = tokio::process::Command::new(&self.ctr)
            .arg("-a")
            .arg(&self.socket)
            .args(["-n", "k8s.io", "tasks", "kill", "--signal", signal, id])
            .output()
            .await
            .map_err(|source| Error::StartProcess {
                name: "ctr tasks kill".to_owned(),
                source,
            })?;
        if output.status.success() {
            Ok(())
        } else {
            Err(Error::KillProcess {
                name: format!("container {id}"),
                reason: String::from_utf8_lossy(&output.stderr).into_owned(),
            })
        }
    }

    /// Stops everything, removes the Node object and the node's RBAC binding, cleans the host and returns
    /// what is still there (empty when nothing is).
    pub async fn teardown(mut self) -> Vec<String> {
        delete_objects(self.client.clone(), &self.name).await;
        self.objects_deleted = true;
        let identity = self.identity();
        let cleaned = tokio::task::spawn_blocking(move || self.clean()).await;
        if let Err(e) = cleaned {
            return vec![format!("teardown task: {e}")];
        }
        tokio::task::spawn_blocking(move || identity.settled_leftovers())
            .await
            .unwrap_or_else(|e| vec![format!("teardown task: {e}")])
    }

    /// The janitor kills everything at once (the kubelet first); then the watchdogs are released.
    fn clean(&mut self) {
        if let Some(mut janitor) = self.janitor.take() {
            janitor.clean();
        }
        while let Some(mut process) = self.processes.pop() {
            process.stop();
        }
    }

    async fn wait_for_containerd(&mut self) -> Result<(), Error> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = tokio::process::Command::new(&self.ctr)
                .arg("-a")
                .arg(&self.socket)
                .arg("version")
                .output()
                .await
                .is_ok_and(|o| o.status.success());
            if ok {
                return Ok(());
            }
            let exited = self.processes[0].exited();
            if exited.is_some() || Instant::now() >= deadline {
                return Err(Error::NotReady {
                    component: "containerd".to_owned(),
                    detail: format!("serving on {} ({exited:?})", self.socket.display()),
                    log_tail: self.log_tail("containerd"),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The kubelet authenticates as `system:node:<name>`; the API server authorizes with RBAC alone (no Node
    /// authorizer), so the user gets the built-in `system:node` role, which no subject holds by default.
    async fn bind_node_role(&self) -> Result<(), Error> {
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
                kind: "ClusterRole".to_owned(),
                name: "system:node".to_owned(),
            },
            subjects: Some(vec![Subject {
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
                kind: "User".to_owned(),
                name: format!("system:node:{}", self.name),
                namespace: None,
            }]),
        };
        Api::<ClusterRoleBinding>::all(self.client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .map(|_| ())
            .map_err(Error::Kube)
    }

    async fn wait_ready(&mut self) -> Result<(), Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut restarts = 0;
        loop {
            let ready = nodes
                .get_opt(&self.name)
                .await
                .ok()
                .flatten()
                .is_some_and(|node| {
                    node.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                });
            if ready {
                return Ok(());
            }
            let exited = self.exited_components();
            if restarts < KUBELET_START_RESTARTS
                && exited.len() == 1
                && let Some(index) = self
                    .processes
                    .iter_mut()
                    .position(|p| p.name() == "kubelet" && p.exited().is_some())
            {
                // A node's service manager restarts a kubelet that exits (the kubelet's systemd unit has
                // `Restart=always`); once seen in CI, a kubelet failed to move its pod-resources socket into place
                // at start-up, before any of the project's code ran. Said loudly, so a kubelet that keeps failing
                // is still visible: after the restarts, the start fails with its log.
                restarts += 1;
                eprintln!(
                    "real node {}: {}\nrestarting the kubelet ({restarts} of {KUBELET_START_RESTARTS}), as the node's \
                     service manager would",
                    self.name, exited[0]
                );
                self.processes.remove(index).stop();
                tokio::time::sleep(KUBELET_RESTART_DELAY).await;
                self.spawn_kubelet()?;
                continue;
            }
            if !exited.is_empty() || Instant::now() >= deadline {
                return Err(Error::NotReady {
                    component: "kubelet".to_owned(),
                    detail: format!("node {} Ready; exited: {exited:?}", self.name),
                    log_tail: self.log_tail("kubelet"),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.clean();
        if !self.objects_deleted {
            // A Node object left behind would keep attracting pods until the node-lifecycle controller taints
            // it, long after; the test's runtime may be gone (a panic), so a runtime of its own.
            let (config, name) = (self.kube_config.clone(), self.name.clone());
            let deleted = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                let Ok(runtime) = runtime else {
                    return;
                };
                runtime.block_on(async {
                    // The client's middleware needs the runtime from its construction on.
                    if let Ok(client) = Client::try_from(config) {
                        let _ = tokio::time::timeout(
                            Duration::from_secs(10),
                            delete_objects(client, &name),
                        )
                        .await;
                    }
                });
            });
            let _ = deleted.join();
        }
    }
}

/// Deletes the node's Node object and RBAC binding (either may be gone already).
async fn delete_objects(client: Client, name: &str) {
    let dp = DeleteParams::default();
    let _ = Api::<Node>::all(client.clone()).delete(name, &dp).await;
    let _ = Api::<ClusterRoleBinding>::all(client)
        .delete(name, &dp)
        .await;
}

/// kube-scheduler for the control plane, started with its first node and kept for the test process's
/// lifetime (its watchdog stops it when the process ends): every node of the control plane shares it, so two
/// tests' nodes never have two schedulers binding the same pods.
fn ensure_scheduler(control_plane: &ControlPlane, parts: &NodeParts) -> Result<(), Error> {
    static SCHEDULERS: Mutex<Vec<(String, Supervised)>> = Mutex::new(Vec::new());
    let mut schedulers = SCHEDULERS.lock().unwrap_or_else(|p| p.into_inner());
    let server = control_plane.server_url().to_owned();
    schedulers.retain_mut(|(_, process)| process.exited().is_none());
    if schedulers.iter().any(|(s, _)| *s == server) {
        return Ok(());
    }
    let admin = control_plane.kubeconfig_path().display().to_string();
    let process = Supervised::spawn(
        "kube-scheduler",
        &parts.kube_scheduler,
        &[
            format!("--kubeconfig={admin}"),
            format!("--authentication-kubeconfig={admin}"),
            format!("--authorization-kubeconfig={admin}"),
            "--secure-port=0".to_owned(),
            "--leader-elect=false".to_owned(),
            "--v=1".to_owned(),
        ],
        &control_plane.dir().join("kube-scheduler.log"),
    )?;
    schedulers.push((server, process));
    Ok(())
}

fn node_ip() -> Result<String, Error> {
    let output = std::process::Command::new("ip")
        .args(["-o", "-4", "addr", "show", "scope", "global"])
        .output()
        .map_err(|source| Error::StartProcess {
            name: "ip addr".to_owned(),
            source,
        })?;
    first_global_ipv4(&String::from_utf8_lossy(&output.stdout)).ok_or_else(|| Error::NotReady {
        component: "host network".to_owned(),
        detail: "no global IPv4 address for the kubelet's --node-ip (127.0.0.1 leaves the node without addresses)".to_owned(),
        log_tail: String::new(),
    })
}

fn free_ports<const N: usize>() -> Result<[u16; N], Error> {
    let listeners = (0..N)
        .map(|_| std::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, 0)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(Error::AllocatePort)?;
    let mut ports = [0u16; N];
    for (port, l) in ports.iter_mut().zip(&listeners) {
        *port = l.local_addr().map_err(Error::AllocatePort)?.port();
    }
    Ok(ports)
}

/// Whether process `pid` exists and is not a zombie.
fn is_live(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name, which is in parentheses and may hold spaces.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// Process ids in every `cgroup.procs` under `root` (nothing when it does not exist).
fn cgroup_procs_under(root: &Path) -> Vec<String> {
    let mut pids = Vec::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(entry.path());
            }
        }
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            pids.extend(procs.split_whitespace().map(str::to_owned));
        }
    }
    pids
}

fn write(path: &Path, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(|source| Error::WriteFile {
        path: path.to_owned(),
        source,
    })
}

fn create_dir(path: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(path).map_err(|source| Error::WriteFile {
        path: path.to_owned(),
        source,
    })
}

/// The kubelet's `cgroupRoot`, created in every hierarchy beforehand (a second kubelet on a host needs it),
/// with the cpuset hierarchy's CPUs and memory nodes copied from the top (a new cpuset is empty, and tasks
/// cannot join an empty one).
fn create_cgroup_root(root: &str) -> Result<(), Error> {
    for hierarchy in config::cgroup_hierarchies() {
        let dir = hierarchy.join(root.trim_start_matches('/'));
        create_dir(&dir)?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(hierarchy.join(file)) {
                write(&dir.join(file), value.trim())?;
            }
        }
    }
    Ok(())
}
