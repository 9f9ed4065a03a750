//! A stateful fake of the GitHub Actions Service for the runner scale-set protocol.
//!
//! One loopback port serves the GitHub REST API in GHES form (`/api/v3/...`), the Actions Service
//! (`/tenant/{id}/_apis/...`), the message queue (`/broker/message`) and a control API (`/_fake/...`) that tests
//! use to enqueue jobs, bring runners online, run jobs and inject faults. Config URLs are `{base}/{org}`,
//! `{base}/{org}/{repo}` or `{base}/enterprises/{enterprise}`. See `docs/fake-actions-service.md`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fake_actions_service::Error> {
//! let fake = fake_actions_service::FakeActionsService::start(fake_actions_service::Config::default()).await?;
//! let config_url = format!("{}/my-org", fake.base_url());
//! # let _ = config_url;
//! fake.shutdown().await
//! # }
//! ```

mod api;
mod auth;
pub mod config;
pub mod control;
pub mod error;
pub mod faults;
mod rng;
pub mod routes;
mod server;
pub mod state;
pub mod wire;

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

pub use config::{Config, GitHubApp, JobDelivery, StrictAuth};
pub use control::{
    AddRunnerGroup, Counters, DropSessions, EnqueueJobs, ExpireTokens, FinishJob, JobState,
    JobView, RunnerGroupView, RunnerSelector, RunnerView, ScaleSetView, SessionView, StateSnapshot,
    TenantView, TokenKind,
};
pub use error::{Error, Rejection};
pub use faults::{ErrorFault, Faults, LatencyFault};
pub use wire::Statistics;

use server::Shared;
use state::{Clock, State};

/// How often auto-completion of jobs and lost runners are checked.
const TICK_INTERVAL: Duration = Duration::from_millis(50);

/// A running fake. Dropping it stops the server.
#[derive(Debug)]
pub struct FakeActionsService {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: Option<JoinHandle<std::io::Result<()>>>,
}

impl FakeActionsService {
    /// Bind `config.addr` and serve in the background.
    pub async fn start(config: Config) -> Result<Self, Error> {
        if let Some(url) = &config.advertised_url {
            url::Url::parse(url).map_err(|source| Error::ParseAdvertisedUrl {
                url: url.clone(),
                source,
            })?;
        }
        let state = State::new(&config, Clock::System)?;
        let listener = tokio::net::TcpListener::bind(config.addr)
            .await
            .map_err(|source| Error::Bind {
                addr: config.addr,
                source,
            })?;
        let addr = listener.local_addr().map_err(Error::LocalAddr)?;
        let shared = Arc::new(Shared::new(
            state,
            config.long_poll_timeout,
            config.advertised_url.clone(),
            base_url_for(addr),
            config.byte_order_mark,
        ));
        let shutdown = shared.shutdown_token().clone();
        if config.auto_complete_after.is_some() || config.runner_lost_timeout.is_some() {
            tokio::spawn(tick(Arc::clone(&shared)));
        }
        let app = server::router(Arc::clone(&shared));
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
        });
        tracing::info!(%addr, "fake Actions Service listening");
        Ok(Self {
            addr,
            shared,
            server: Some(server),
        })
    }

    /// Base URL, e.g. `http://127.0.0.1:34567` (no trailing slash).
    pub fn base_url(&self) -> String {
        base_url_for(self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// In-process inspection and control (the same operations as the control API).
    pub fn state(&self) -> StateHandle {
        StateHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Stop serving: pending long polls answer 202, then connections close.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        self.shared.shutdown_token().cancel();
        match self.server.take() {
            Some(server) => match server.await {
                Ok(result) => result.map_err(Error::Serve),
                // The task only ends early by panicking or being aborted; either way it is gone now.
                Err(_) => Ok(()),
            },
            None => Ok(()),
        }
    }
}

impl Drop for FakeActionsService {
    fn drop(&mut self) {
        self.shared.shutdown_token().cancel();
    }
}

fn base_url_for(addr: SocketAddr) -> String {
    // A wildcard bind is reachable on loopback; clients cannot connect to 0.0.0.0 portably.
    let addr = match addr {
        SocketAddr::V4(v4) if v4.ip().is_unspecified() => {
            SocketAddr::from((Ipv4Addr::LOCALHOST, v4.port()))
        }
        SocketAddr::V6(v6) if v6.ip().is_unspecified() => {
            SocketAddr::from((Ipv6Addr::LOCALHOST, v6.port()))
        }
        other => other,
    };
    format!("http://{addr}")
}

async fn tick(shared: Arc<Shared>) {
    let mut interval = tokio::time::interval(TICK_INTERVAL);
    loop {
        tokio::select! {
            () = shared.shutdown_token().cancelled() => return,
            _ = interval.tick() => {
                if shared.read(State::tick) {
                    shared.mutate(|_| ());
                }
            }
        }
    }
}

/// In-process handle on a fake's state; cheap to clone. Every method mirrors a control API call.
#[derive(Clone, Debug)]
pub struct StateHandle {
    shared: Arc<Shared>,
}

impl StateHandle {
    /// Everything, for assertions (`GET /_fake/state`).
    pub fn snapshot(&self) -> StateSnapshot {
        self.shared.read(State::snapshot)
    }

    /// How many of `ids` have completed: what a driver polling for completions needs, without copying the whole
    /// state under its lock (a snapshot of 2000 jobs, taken every tick, was most of the benchmark's own CPU and
    /// held every request to the fake back meanwhile).
    pub fn completed_among(&self, ids: &[i64]) -> usize {
        self.shared.read(|state| state.completed_among(ids))
    }

    /// Requests per endpoint name (`GET /_fake/counters`).
    pub fn counters(&self) -> Counters {
        self.shared.read(|state| state.counters())
    }

    /// Requests to one endpoint (0 if none).
    pub fn count(&self, endpoint: &str) -> u64 {
        self.counters().get(endpoint).copied().unwrap_or(0)
    }

    /// Last `User-Agent` per endpoint name (`GET /_fake/user-agents`).
    pub fn user_agents(&self) -> std::collections::BTreeMap<String, String> {
        self.shared.read(|state| state.user_agents())
    }

    /// Forget all counts (`DELETE /_fake/counters`).
    pub fn reset_counters(&self) {
        self.shared.read(State::reset_counters);
    }

    /// Enqueue jobs (`POST /_fake/jobs`); returns their request ids.
    pub fn enqueue_jobs(&self, request: &EnqueueJobs) -> Result<Vec<i64>, Rejection> {
        self.shared.mutate(|state| state.enqueue_jobs(request))
    }

    /// A job (`GET /_fake/jobs/{id}`).
    pub fn job(&self, id: i64) -> Result<JobView, Rejection> {
        self.shared.read(|state| state.job_view(id))
    }

    /// Start a job held by a runner (`POST /_fake/jobs/{id}/start`).
    pub fn start_job(&self, id: i64) -> Result<JobView, Rejection> {
        self.shared.mutate(|state| state.start_job(id))
    }

    /// Renew a running job, as its runner does while it runs it (`POST /_fake/jobs/{id}/renew`); 409 once
    /// the job is no longer running.
    pub fn renew_job(&self, id: i64) -> Result<JobView, Rejection> {
        // Not a change anyone waits for: no wake-up, so hundreds of renewing runners cost no re-checks.
        self.shared.read(|state| state.renew_job(id))
    }

    /// Finish a job with `result` (`POST /_fake/jobs/{id}/finish`).
    pub fn finish_job(&self, id: i64, result: &str) -> Result<JobView, Rejection> {
        self.shared.mutate(|state| state.finish_job(id, result))
    }

    /// Cancel a job (`POST /_fake/jobs/{id}/cancel`).
    pub fn cancel_job(&self, id: i64) -> Result<JobView, Rejection> {
        self.shared.mutate(|state| state.cancel_job(id))
    }

    /// Cancel a job's assignment and offer it again (`POST /_fake/jobs/{id}/requeue`).
    pub fn requeue_job(&self, id: i64) -> Result<JobView, Rejection> {
        self.shared.mutate(|state| state.requeue_job(id))
    }

    /// Mark a runner online by id or JIT config (`POST /_fake/runners/online`).
    pub fn mark_runner_online(&self, selector: &RunnerSelector) -> Result<RunnerView, Rejection> {
        self.shared
            .mutate(|state| state.mark_runner_online(selector))
    }

    /// A registered runner (`GET /_fake/runners/{id}`); 404 once deregistered.
    pub fn runner(&self, id: i64) -> Result<RunnerView, Rejection> {
        self.shared.read(|state| state.runner_view(id))
    }

    /// Mark a runner offline (`POST /_fake/runners/{id}/offline`).
    pub fn mark_runner_offline(&self, id: i64) -> Result<RunnerView, Rejection> {
        self.shared.mutate(|state| state.mark_runner_offline(id))
    }

    /// Deregister a runner server-side (`DELETE /_fake/runners/{id}`).
    pub fn deregister_runner(&self, id: i64) -> Result<(), Rejection> {
        self.shared.mutate(|state| state.deregister_runner(id))
    }

    /// Replace the fault rules (`PUT /_fake/faults`).
    pub fn set_faults(&self, faults: Faults) -> Result<(), Rejection> {
        self.shared.read(|state| state.set_faults(faults))
    }

    /// Current fault rules with remaining budgets (`GET /_fake/faults`).
    pub fn faults(&self) -> Faults {
        self.shared.read(|state| state.faults())
    }

    /// Remove all fault rules (`DELETE /_fake/faults`).
    pub fn clear_faults(&self) {
        // The default rules are always valid.
        let _ = self
            .shared
            .read(|state| state.set_faults(Faults::default()));
    }

    /// Drop sessions server-side (`POST /_fake/sessions/drop`); returns how many.
    pub fn drop_sessions(&self, request: &DropSessions) -> usize {
        self.shared.mutate(|state| state.drop_sessions(request))
    }

    /// Expire tokens now (`POST /_fake/tokens/expire`); returns how many.
    pub fn expire_tokens(&self, request: &ExpireTokens) -> usize {
        self.shared.mutate(|state| state.expire_tokens(request))
    }

    /// Delete a scale set server-side (`DELETE /_fake/scalesets/{id}?force=`).
    pub fn delete_scale_set(&self, id: i64, force: bool) -> Result<(), Rejection> {
        self.shared
            .mutate(|state| state.delete_scale_set(None, id, force))
    }

    /// Add a runner group to a tenant (`POST /_fake/runner-groups`).
    pub fn add_runner_group(&self, scope: &str, name: &str) -> Result<RunnerGroupView, Rejection> {
        self.shared
            .mutate(|state| state.add_runner_group(scope, name))
    }

    /// Wait until `condition` holds for a snapshot, re-checking on every state change; on timeout the last
    /// snapshot comes back as the error, for the assertion message.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut condition: impl FnMut(&StateSnapshot) -> bool,
    ) -> Result<StateSnapshot, Box<StateSnapshot>> {
        let mut last = None;
        let found = self
            .look_until(timeout, || {
                let snapshot = self.snapshot();
                let done = condition(&snapshot);
                last = Some(snapshot);
                done
            })
            .await;
        let snapshot = last.unwrap_or_else(|| self.snapshot());
        if found {
            Ok(snapshot)
        } else {
            Err(Box::new(snapshot))
        }
    }

    /// [`StateHandle::wait_for`] every one of `ids` completed, counted on each change without a snapshot
    /// ([`StateHandle::completed_among`]); the snapshot is taken once, at the end.
    pub async fn wait_completed(
        &self,
        ids: &[i64],
        timeout: Duration,
    ) -> Result<StateSnapshot, Box<StateSnapshot>> {
        let found = self
            .look_until(timeout, || self.completed_among(ids) == ids.len())
            .await;
        let snapshot = self.snapshot();
        if found {
            Ok(snapshot)
        } else {
            Err(Box::new(snapshot))
        }
    }

    /// Looks with `done` now and on every state change until it says so (true) or `timeout` passes (false).
    async fn look_until(&self, timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = self.shared.subscribe();
        loop {
            changes.borrow_and_update();
            if done() {
                return true;
            }
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return false,
                // Polls and GETs do not signal; look again now and then so conditions on them still resolve.
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
                changed = changes.changed() => {
                    if changed.is_err() {
                        return false;
                    }
                }
            }
        }
    }
}
