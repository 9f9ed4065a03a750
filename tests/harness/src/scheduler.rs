//! kube-scheduler for tests that need the scheduler's verdict on pods without running a kubelet: a pod that no
//! node fits gets `PodScheduled=False` with reason `Unschedulable` and the scheduler's message, and a pod that
//! a node fits is bound to it.
//!
//! It serves only pods that name it in `spec.schedulerName` ([`TEST_SCHEDULER`]): the other tests of a test
//! binary create pods that nothing schedules, and must keep them that way. With no Node object at all, every
//! pod that names it is `Unschedulable` ("no nodes available").

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::process::Supervised;
use crate::{ControlPlane, Error, assets};

/// The `schedulerName` of the pods the test scheduler serves.
pub const TEST_SCHEDULER: &str = "arc-rs-test-scheduler";

/// How long the scheduler must stay up after its start to count as started (a bad configuration ends it at
/// once).
const SETTLE: Duration = Duration::from_secs(2);

/// Starts the test scheduler for `control_plane` unless it runs already; it runs until the test process ends
/// (its watchdog stops it). Returns the `schedulerName` pods have to carry.
pub async fn start_scheduler(control_plane: &ControlPlane) -> Result<&'static str, Error> {
    static SCHEDULERS: Mutex<Vec<(String, Supervised)>> = Mutex::new(Vec::new());
    let server = control_plane.server_url().to_owned();
    {
        let mut schedulers = SCHEDULERS.lock().unwrap_or_else(|p| p.into_inner());
        schedulers.retain_mut(|(_, process)| process.exited().is_none());
        if schedulers.iter().any(|(s, _)| *s == server) {
            return Ok(TEST_SCHEDULER);
        }
        let program = assets::binary("kube-scheduler")?;
        let dir = control_plane.dir();
        let kubeconfig = control_plane.kubeconfig_path().display().to_string();
        // With `--config`, the connection comes from the file (the flag form is deprecated and ignored then).
        let config = serde_json::json!({
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": kubeconfig},
            "leaderElection": {"leaderElect": false},
            "profiles": [{"schedulerName": TEST_SCHEDULER}],
        });
        let path = dir.join("test-scheduler.json");
        std::fs::write(&path, config.to_string()).map_err(|source| Error::WriteFile {
            path: path.clone(),
            source,
        })?;
        let process = Supervised::spawn(
            "kube-scheduler (test)",
            &program,
            &[
                format!("--config={}", path.display()),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                "--secure-port=0".to_owned(),
                "--v=1".to_owned(),
            ],
            &dir.join("test-scheduler.log"),
        )?;
        schedulers.push((server.clone(), process));
    }
    let started = Instant::now();
    while started.elapsed() < SETTLE {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut schedulers = SCHEDULERS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, process)) = schedulers.iter_mut().find(|(s, _)| *s == server)
            && let Some(status) = process.exited()
        {
            return Err(Error::NotReady {
                component: "kube-scheduler (test)".to_owned(),
                detail: format!("exited at once ({status})"),
                log_tail: process.log_tail(4000),
            });
        }
    }
    Ok(TEST_SCHEDULER)
}
