//! Configuration of a fake instance.

use std::net::SocketAddr;
use std::time::Duration;

/// How a fake instance behaves. `Config::default()` is the zero-set-up mode: any non-empty credential and any
/// organization, repository or enterprise is accepted.
#[derive(Clone, Debug)]
pub struct Config {
    /// Address to listen on; port 0 picks a free port.
    pub addr: SocketAddr,
    /// Base URL written into runner-registration answers, session queue URLs and JIT configs. When unset the
    /// URL is taken from each request's `Host` header, so clients reaching the fake under any address (for
    /// example from inside a cluster) are sent back to that same address.
    pub advertised_url: Option<String>,
    /// How long an empty long poll is held before the 202 answer (the service holds about 50 s).
    pub long_poll_timeout: Duration,
    /// Lifetime of admin tokens (the `exp` claim the client reads).
    pub admin_token_lifetime: Duration,
    /// Lifetime of message-queue access tokens; an expired token gets 401 on queue calls.
    pub message_queue_token_lifetime: Duration,
    /// Lifetime of registration and installation tokens.
    pub registration_token_lifetime: Duration,
    /// A session nobody polled for this long is forgotten, as the service forgets the session of a crashed
    /// listener; `None` keeps sessions until deleted. Keep it above `long_poll_timeout`.
    pub session_idle_timeout: Option<Duration>,
    /// Runner groups, besides `Default` (id 1), that every organization or enterprise starts with.
    pub runner_groups: Vec<String>,
    /// Strict credential checking; `None` accepts any non-empty credential.
    pub strict: Option<StrictAuth>,
    /// Runners are online as soon as their JIT config is generated (no runner process needed).
    pub auto_online_runners: bool,
    /// A job starts as soon as it is assigned to a runner.
    pub auto_start_jobs: bool,
    /// Running jobs complete with result `succeeded` after this long.
    pub auto_complete_after: Option<Duration>,
    /// A runner running a job renews it periodically (`POST /_fake/jobs/{id}/renew`), as the runner renews
    /// its job request with the service; a job not renewed for this long is failed (result `failed`, the
    /// job marked `runnerLost`) and its runner is gone, as the service does with a runner that lost
    /// communication (an OOM-killed or crashed runner, a node gone). `None`: runners are never lost (jobs
    /// started with no runner process behind them, `auto_start_jobs`). The service waits minutes; tests set
    /// seconds, above the renewal interval of their runners.
    pub runner_lost_timeout: Option<Duration>,
    /// Most job messages in one queue message; the service caps batches at 50.
    pub max_job_messages_per_message: usize,
    /// Start every Actions Service and queue JSON body with a UTF-8 byte order mark, as the real service does;
    /// clients must strip it.
    pub byte_order_mark: bool,
    /// Seed for ids and tokens; `None` seeds from the clock. Fault decisions use their own seed.
    pub seed: Option<u64>,
    /// How jobs reach a scale set's listener.
    pub job_delivery: JobDelivery,
    /// A new session is offered the jobs still available whose offers were acknowledged but never acquired. The
    /// real service is not known to do so; a listener must recover from a failed acquire either way.
    pub reoffer_to_new_sessions: bool,
}

/// How the service hands a scale set its jobs (docs/reference/actions-service-protocol.md, "Job delivery").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobDelivery {
    /// GitHub Enterprise Server: each job is offered with `JobAvailable` and is the scale set's once its listener
    /// acquires it (`JobAssigned` follows).
    #[default]
    Acquire,
    /// github.com: each job arrives assigned to the scale set (`JobAssigned`, no offer); acquiring it is unneeded
    /// and acquires nothing.
    Direct,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertised_url: None,
            long_poll_timeout: Duration::from_secs(50),
            admin_token_lifetime: Duration::from_secs(3600),
            message_queue_token_lifetime: Duration::from_secs(3600),
            registration_token_lifetime: Duration::from_secs(3600),
            session_idle_timeout: Some(Duration::from_secs(120)),
            runner_groups: Vec::new(),
            strict: None,
            auto_online_runners: false,
            auto_start_jobs: false,
            auto_complete_after: None,
            runner_lost_timeout: None,
            max_job_messages_per_message: 50,
            job_delivery: JobDelivery::Acquire,
            reoffer_to_new_sessions: true,
            byte_order_mark: false,
            seed: None,
        }
    }
}

/// Credentials accepted in strict mode; everything else is rejected with GitHub's status codes.
#[derive(Clone, Debug, Default)]
pub struct StrictAuth {
    /// Personal access tokens accepted for registration tokens.
    pub pats: Vec<String>,
    /// GitHub Apps whose JWTs are accepted for installation tokens.
    pub apps: Vec<GitHubApp>,
}

/// A GitHub App known to a strict fake.
#[derive(Clone, Debug)]
pub struct GitHubApp {
    /// The JWT `iss` the App signs with: its client id or its numeric App id written as a string.
    pub app_id: String,
    /// Installations of the App.
    pub installation_ids: Vec<i64>,
    /// PEM of the App's RSA public key (`PUBLIC KEY` or `RSA PUBLIC KEY`).
    pub public_key_pem: String,
}
