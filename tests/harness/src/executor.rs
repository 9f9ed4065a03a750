//! The listener-pod executor: the kubelet's part for listener pods, since the test control plane has none.
//!
//! It watches pods labelled `app.kubernetes.io/component=runner-scale-set-listener` and, for each, runs the real
//! listener binary as a local process configured the way the pod would configure it:
//!
//! - the `listener-config` Secret volume's `config.json` is written to a private directory and
//!   `LISTENER_CONFIG_PATH` points at it;
//! - the listener's `metrics_addr` is rewritten to a free loopback port (several listeners share this host),
//!   see [`ListenerExecutor::metrics_url`]; `health_addr` (the manager's `:8080`, or none without metrics) gets a
//!   free port too, or the metrics port when the config shares the two;
//! - plain `env` values and `secretKeyRef` values (the proxy variables) are passed through;
//! - the process talks to the API server as the pod's ServiceAccount, with a token from the TokenRequest API, so
//!   it has exactly the RBAC the controller granted, not admin rights.
//!
//! The process is reflected in the pod's status (Running and Ready, or Succeeded/Failed with the container's
//! exit code) and stopped (SIGTERM) when the pod is deleted. Pods are never bound to a node here, so the API
//! server deletes them at once; a pod whose process exited is left for its controller to recreate.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::ControlPlane;
use crate::control_plane::kubeconfig_json;
use crate::process::Supervised;

/// Label selector of the pods this executor runs.
pub const LISTENER_POD_SELECTOR: &str = "app.kubernetes.io/component=runner-scale-set-listener";

const CONFIG_VOLUME: &str = "listener-config";
const CONFIG_KEY: &str = "config.json";
const LISTENER_CONTAINER: &str = "listener";

#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error("pod {pod} has no `{CONFIG_VOLUME}` Secret volume")]
    MissingConfigVolume { pod: String },
    #[error("pod {pod}: Secret {secret} has no key {key}")]
    MissingSecretKey {
        pod: String,
        secret: String,
        key: String,
    },
    #[error("pod {pod}: config.json is not a JSON object")]
    InvalidConfig { pod: String },
    #[error("pod {pod}: {source}")]
    Kube {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("pod {pod}: {source}")]
    Io {
        pod: String,
        #[source]
        source: std::io::Error,
    },
    #[error("pod {pod}: {source}")]
    Start {
        pod: String,
        #[source]
        source: crate::Error,
    },
}

/// One running listener process.
struct Running {
    uid: String,
    process: Supervised,
    metrics_url: Option<String>,
    reported_exit: bool,
}

type Table = Arc<Mutex<HashMap<(String, String), Running>>>;

/// Runs listener pods as local processes until dropped or [`ListenerExecutor::stop`]ped.
pub struct ListenerExecutor {
    table: Table,
    errors: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl ListenerExecutor {
    /// Starts watching listener pods in `namespace` (all namespaces when `None`) and running `binary` for each.
    pub fn start(
        control_plane: &ControlPlane,
        client: Client,
        namespace: Option<&str>,
        binary: PathBuf,
    ) -> Result<Self, crate::Error> {
        let dir = tempfile::Builder::new()
            .prefix("arc-rs-listener-executor-")
            .tempdir()
            .map_err(crate::Error::CreateTempDir)?;
        let mut dir = dir;
        if crate::keep_logs() {
            // The listeners' logs outlive the run for a look afterwards.
            dir.disable_cleanup(true);
            eprintln!("listener logs kept in {}", dir.path().display());
        }
        let table: Table = Arc::default();
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let runner = Runner {
            client: client.clone(),
            server: control_plane.server_url().to_owned(),
            ca_file: control_plane.dir().join("ca.crt"),
            binary,
            dir: dir.path().to_owned(),
            table: table.clone(),
            errors: errors.clone(),
        };
        let pods: Api<Pod> = match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        };
        let task = tokio::spawn(runner.run(pods));
        Ok(Self {
            table,
            errors,
            task,
            _dir: dir,
        })
    }

    /// The listener's metrics URL (`http://127.0.0.1:PORT<endpoint>`) once its pod runs with metrics enabled.
    pub fn metrics_url(&self, namespace: &str, pod: &str) -> Option<String> {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table
            .get(&(namespace.to_owned(), pod.to_owned()))
            .and_then(|r| r.metrics_url.clone())
    }

    /// Pods whose listener process currently runs, as `namespace/name`.
    pub fn running(&self) -> Vec<String> {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let mut names: Vec<String> = table
            .iter_mut()
            .filter_map(|((ns, name), r)| {
                r.process.exited().is_none().then(|| format!("{ns}/{name}"))
            })
            .collect();
        names.sort();
        names
    }

    /// The process id of the listener of a pod, while it runs.
    pub fn pid(&self, namespace: &str, pod: &str) -> Option<u32> {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table
            .get_mut(&(namespace.to_owned(), pod.to_owned()))
            .and_then(|r| r.process.exited().is_none().then_some(r))
            .and_then(|r| r.process.pid())
    }

    /// Kills the listener of a pod with SIGKILL, as an OOM kill would; its pod then turns Failed (exit 137) and
    /// its controller has to replace it.
    pub fn kill(&self, namespace: &str, pod: &str) -> Result<(), crate::Error> {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        match table.get_mut(&(namespace.to_owned(), pod.to_owned())) {
            Some(running) => running.process.kill(),
            None => Err(crate::Error::KillProcess {
                name: format!("listener {namespace}/{pod}"),
                reason: "the executor runs no process for that pod".to_owned(),
            }),
        }
    }

    /// Problems the executor met (a pod it could not start), for test assertions and diagnostics.
    pub fn errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The log of the listener process of a pod.
    pub fn log(&self, namespace: &str, pod: &str) -> Option<String> {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table
            .get(&(namespace.to_owned(), pod.to_owned()))
            .map(|r| r.process.log_tail(1 << 20))
    }

    /// Stops watching and stops every listener process (SIGTERM first).
    pub fn stop(self) {
        self.task.abort();
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        for (_, mut running) in table.drain() {
            running.process.stop();
        }
    }
}

impl Drop for ListenerExecutor {
    fn drop(&mut self) {
        self.task.abort();
        // A failing test shows what its listeners said; a passing one stays quiet.
        if std::thread::panicking() {
            let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
            for ((ns, name), running) in table.iter() {
                eprintln!(
                    "--- listener {ns}/{name} log (tail) ---\n{}",
                    running.process.log_tail(8000)
                );
            }
            for error in self.errors.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                eprintln!("--- listener executor error: {error}");
            }
        }
    }
}

struct Runner {
    client: Client,
    server: String,
    ca_file: PathBuf,
    binary: PathBuf,
    dir: PathBuf,
    table: Table,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Runner {
    async fn run(self, pods: Api<Pod>) {
        let config = watcher::Config::default().labels(LISTENER_POD_SELECTOR);
        let mut events = watcher(pods, config).boxed();
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => self.on_pod(pod).await,
                    Some(Ok(watcher::Event::Delete(pod))) => self.on_delete(&pod),
                    Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
                    // The watcher re-lists by itself; slow down a little on errors.
                    Some(Err(_)) => tokio::time::sleep(Duration::from_millis(200)).await,
                    None => return,
                },
                _ = tick.tick() => self.report_exits().await,
            }
        }
    }

    fn record_error(&self, error: &ExecutorError) {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(error.to_string());
    }

    async fn on_pod(&self, pod: Pod) {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        let uid = pod.uid().unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() {
            self.on_delete(&pod);
            return;
        }
        {
            let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
            match table.get(&key) {
                Some(r) if r.uid == uid => return,
                // Same name, new pod: the old process belongs to a pod that is gone.
                Some(_) => {
                    if let Some(mut old) = table.remove(&key) {
                        old.process.stop();
                    }
                }
                None => {}
            }
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return;
        }
        match self.launch(&pod).await {
            Ok(running) => {
                self.table
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.clone(), running);
                let _ = self.set_running(&key.0, &key.1).await;
            }
            Err(e) => {
                self.record_error(&e);
                let _ = self
                    .set_terminated(&key.0, &key.1, 128, &e.to_string())
                    .await;
            }
        }
    }

    fn on_delete(&self, pod: &Pod) {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        let removed = self
            .table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        if let Some(mut running) = removed {
            // Blocking for up to a few seconds while the process handles SIGTERM, off the async threads.
            tokio::task::spawn_blocking(move || running.process.stop());
        }
    }

    async fn launch(&self, pod: &Pod) -> Result<Running, ExecutorError> {
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let kube_err = |source| ExecutorError::Kube {
            pod: name.clone(),
            source,
        };
        let io_err = |source| ExecutorError::Io {
            pod: name.clone(),
            source,
        };
        let spec = pod.spec.clone().unwrap_or_default();
        let secret_name = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == CONFIG_VOLUME)
            .and_then(|v| v.secret.as_ref())
            .and_then(|s| s.secret_name.clone())
            .ok_or_else(|| ExecutorError::MissingConfigVolume { pod: name.clone() })?;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &ns);
        let config_bytes = secret_value(&secrets, &secret_name, CONFIG_KEY)
            .await
            .map_err(kube_err)?
            .ok_or_else(|| ExecutorError::MissingSecretKey {
                pod: name.clone(),
                secret: secret_name.clone(),
                key: CONFIG_KEY.to_owned(),
            })?;
        let mut config: Value = serde_json::from_slice(&config_bytes)
            .ok()
            .filter(Value::is_object)
            .ok_or_else(|| ExecutorError::InvalidConfig { pod: name.clone() })?;

        let original_metrics = config
            .get("metrics_addr")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let metrics_url = match config.get("metrics_addr").and_then(Value::as_str) {
            Some(addr) if !addr.is_empty() => {
                let port = free_port().map_err(io_err)?;
                config["metrics_addr"] = json!(format!("127.0.0.1:{port}"));
                let endpoint = config
                    .get("metrics_endpoint")
                    .and_then(Value::as_str)
                    .unwrap_or("/metrics")
                    .to_owned();
                Some(format!("http://127.0.0.1:{port}{endpoint}"))
            }
            _ => None,
        };
        // The manager asks for /healthz on :8080 (where the chart's probe looks), which several local listeners
        // cannot share: a free port instead, or the metrics server's when the config shares it; without metrics
        // and without an address the listener would take :8080 as well.
        match config.get("health_addr").and_then(Value::as_str) {
            Some("") => {}
            Some(addr) if addr == original_metrics && metrics_url.is_some() => {
                config["health_addr"] = config["metrics_addr"].clone();
            }
            Some(_) => {
                let port = free_port().map_err(io_err)?;
                config["health_addr"] = json!(format!("127.0.0.1:{port}"));
            }
            None if metrics_url.is_none() => {
                let port = free_port().map_err(io_err)?;
                config["health_addr"] = json!(format!("127.0.0.1:{port}"));
            }
            None => {}
        }

        let pod_dir = self
            .dir
            .join(format!("{ns}--{name}--{}", pod.uid().unwrap_or_default()));
        std::fs::create_dir_all(&pod_dir).map_err(io_err)?;
        let config_path = pod_dir.join(CONFIG_KEY);
        std::fs::write(&config_path, config.to_string()).map_err(io_err)?;

        let service_account = spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let token = service_account_token(&self.client, &ns, &service_account)
            .await
            .map_err(kube_err)?;
        let kubeconfig = pod_dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            kubeconfig_json(&self.server, &self.ca_file, json!({"token": token})),
        )
        .map_err(io_err)?;

        let mut env: BTreeMap<String, String> = BTreeMap::new();
        if let Some(container) = spec
            .containers
            .iter()
            .find(|c| c.name == LISTENER_CONTAINER)
        {
            for var in container.env.iter().flatten() {
                if let Some(value) = &var.value {
                    env.insert(var.name.clone(), value.clone());
                } else if let Some(key_ref) = var
                    .value_from
                    .as_ref()
                    .and_then(|v| v.secret_key_ref.as_ref())
                    && let Some(bytes) = secret_value(&secrets, &key_ref.name, &key_ref.key)
                        .await
                        .map_err(kube_err)?
                {
                    env.insert(
                        var.name.clone(),
                        String::from_utf8_lossy(&bytes).into_owned(),
                    );
                }
            }
        }
        env.insert(
            "LISTENER_CONFIG_PATH".to_owned(),
            config_path.display().to_string(),
        );
        env.insert("KUBECONFIG".to_owned(), kubeconfig.display().to_string());

        // `env` passes everything through the watchdog's exec without a shell quoting layer.
        let mut args: Vec<String> = vec!["-i".to_owned()];
        // Keep PATH and HOME so the process behaves like any local one; nothing else leaks from the test.
        for inherited in ["PATH", "HOME", "RUST_LOG", "RUST_BACKTRACE"] {
            if let Ok(v) = std::env::var(inherited) {
                args.push(format!("{inherited}={v}"));
            }
        }
        args.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        args.push(self.binary.display().to_string());
        let process = Supervised::spawn(
            &format!("listener {ns}/{name}"),
            Path::new("env"),
            &args,
            &pod_dir.join("listener.log"),
        )
        .map_err(|source| ExecutorError::Start {
            pod: name.clone(),
            source,
        })?;
        Ok(Running {
            uid: pod.uid().unwrap_or_default(),
            process,
            metrics_url,
            reported_exit: false,
        })
    }

    /// Reflects processes that exited in their pods' status.
    async fn report_exits(&self) {
        let exited: Vec<((String, String), i32, String)> = {
            let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
            table
                .iter_mut()
                .filter(|(_, r)| !r.reported_exit)
                .filter_map(|(key, r)| {
                    r.process.exited().map(|status| {
                        let code = status.code().unwrap_or(137);
                        (key.clone(), code, r.process.log_tail(400))
                    })
                })
                .collect()
        };
        for ((ns, name), code, tail) in exited {
            // Only a status the API server took counts as reported: an exit while it is down (a chaos run
            // restarts it) is reported again on the next tick, as a kubelet would keep trying.
            if self.set_terminated(&ns, &name, code, &tail).await.is_ok()
                && let Some(running) = self
                    .table
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_mut(&(ns, name))
            {
                running.reported_exit = true;
            }
        }
    }

    async fn set_running(&self, ns: &str, name: &str) -> Result<(), kube::Error> {
        let now = Timestamp::now().to_string();
        let status = json!({"status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
            "containerStatuses": [{
                "name": LISTENER_CONTAINER,
                "ready": true,
                "restartCount": 0,
                "image": "listener",
                "imageID": "",
                "started": true,
                "state": {"running": {"startedAt": now}}
            }]
        }});
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map(|_| ())
    }

    async fn set_terminated(
        &self,
        ns: &str,
        name: &str,
        code: i32,
        message: &str,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now().to_string();
        let phase = if code == 0 { "Succeeded" } else { "Failed" };
        let reason = if code == 0 { "Completed" } else { "Error" };
        let status = json!({"status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
            "containerStatuses": [{
                "name": LISTENER_CONTAINER,
                "ready": false,
                "restartCount": 0,
                "image": "listener",
                "imageID": "",
                "started": false,
                "state": {"terminated": {
                    "exitCode": code,
                    "reason": reason,
                    "message": message,
                    "finishedAt": now
                }}
            }]
        }});
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map(|_| ())
    }
}

async fn secret_value(
    secrets: &Api<Secret>,
    name: &str,
    key: &str,
) -> Result<Option<Vec<u8>>, kube::Error> {
    Ok(secrets
        .get_opt(name)
        .await?
        .and_then(|s| s.data)
        .and_then(|mut d| d.remove(key))
        .map(|b| b.0))
}

/// A short-lived token for `namespace/service_account`, as the kubelet would project into the pod.
async fn service_account_token(
    client: &Client,
    namespace: &str,
    service_account: &str,
) -> Result<String, kube::Error> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(24 * 3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let response: TokenRequest = api
        .create_subresource("token", service_account, &PostParams::default(), &request)
        .await?;
    Ok(response.status.and_then(|s| s.token).unwrap_or_default())
}

fn free_port() -> std::io::Result<u16> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()
        .map(|a| a.port())
}
