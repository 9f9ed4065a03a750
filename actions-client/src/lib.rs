//! Client for the GitHub API calls and the GitHub Actions Service "runner scale set" protocol.
//!
//! The controllers and the listener talk to GitHub only through this crate:
//!
//! * [`GitHubConfig`] parses a config URL (repository, organization or enterprise; hosted or GHES).
//! * [`ActionsClient`] authenticates (PAT or GitHub App), caches the Actions Service admin token with a
//!   single-flight refresh, and exposes every endpoint as a typed async method.
//! * [`MessageSessionClient`] owns a message session: long poll, acknowledge, acquire jobs, with the queue token
//!   refreshed on 401.
//! * [`Error`] carries the operation, method, URL, status, service exception, request ids and an [`ErrorKind`];
//!   [`Error::is_retryable`] tells transient failures apart.
//!
//! Transport: JSON User-Agent, proxies from the environment or explicit (with credentials), extra root CAs, a
//! deadline on every call, and retries with jittered exponential backoff for transient failures only.
//! Secrets (tokens, keys, JIT configs) are [`SecretString`]s and never appear in `Debug` output or errors.

pub mod auth;
pub mod client;
pub mod config;
pub mod decode;
pub mod error;
pub mod jwt;
pub mod messages;
pub mod models;
pub mod proxy;
pub mod retry;
pub mod secret;
pub mod session;
pub mod transport;
pub mod urls;

pub use auth::{AdminConnection, Credentials, GitHubAppCredentials};
pub use client::{ActionsClient, ClientOptions};
pub use config::{GitHubConfig, Scope};
pub use error::{Error, ErrorKind, Operation, RequestError, Result, ServiceException};
pub use messages::{
    JobAssigned, JobAvailable, JobCompleted, JobInfo, JobMessage, JobStarted, RunnerScaleSetMessage,
};
pub use models::{
    AcquirableJob, DEFAULT_RUNNER_GROUP_ID, DEFAULT_RUNNER_GROUP_NAME, JitRunnerConfig, JitSetting,
    Label, RerunOutcome, RunnerGroup, RunnerReference, RunnerScaleSet, RunnerScaleSetSession,
    RunnerSetting, SessionId, Statistics, WorkflowJob,
};
pub use proxy::{ProxyConfig, ProxyServer, ProxySettings};
pub use retry::RetryPolicy;
pub use secret::SecretString;
pub use session::MessageSessionClient;
pub use transport::{HttpOptions, SystemInfo, Timeouts, TlsRoots};
