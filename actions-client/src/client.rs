//! The Actions client: GitHub authentication, the admin-token cache, and every Actions Service endpoint
//! (docs/reference/actions-service-protocol.md, "Endpoints").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use http::header::{ACCEPT, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use jiff::Timestamp;
use url::Url;

use crate::auth::{AdminConnection, Credentials, LoadedCredentials};
use crate::config::GitHubConfig;
use crate::error::{Error, ErrorKind, Operation, Result, ServiceException};
use crate::jwt;
use crate::messages::{self, MessageProblem, RunnerScaleSetMessage};
use crate::models::{
    AcquirableJob, AdminConnectionResponse, GitHubToken, JitRunnerConfig, JitSetting, ListEnvelope,
    RawMessage, RerunOutcome, RunnerGroup, RunnerReference, RunnerRegistrationRequest,
    RunnerScaleSet, RunnerScaleSetSession, SYSTEM_LABEL_TYPE, SessionId, WorkflowJob,
    WorkflowJobsPage,
};
use crate::retry::Idempotency;
use crate::secret::SecretString;
use crate::session::MessageSessionClient;
use crate::transport::{
    HttpOptions, MAX_CAPACITY, Request, Response, SystemInfo, Transport, request_headers,
    user_agent,
};
use crate::urls;

const JSON: &str = "application/json";
/// Media type of GitHub REST requests and responses.
const GITHUB_JSON: &str = "application/vnd.github+json";
/// Pins the REST API version the workflow-job calls were written against.
const GITHUB_API_VERSION: HeaderName = HeaderName::from_static("x-github-api-version");
/// GitHub's largest `per_page`.
const JOBS_PER_PAGE: usize = 100;
/// Bounds one listing at 1000 jobs, all attempts together.
const MAX_JOB_PAGES: usize = 10;
/// Longest refusal message kept from a 403 body that is not GitHub's JSON.
const MAX_REFUSAL_CHARS: usize = 1024;

/// Options for [`ActionsClient::new`].
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// Sent as the User-Agent; the scale set id can be updated later.
    pub system_info: SystemInfo,
    /// Transport settings: timeouts, retries, proxy, TLS.
    pub http: HttpOptions,
}

/// A client for one GitHub config URL and credential. Cheap to clone; clones share the connection pool and the
/// admin token.
///
/// Nothing is sent on construction. The first Actions Service call fetches the admin token (installation token
/// for Apps, registration token, runner-registration); later calls reuse it until it is within 60 s of expiry.
/// Concurrent callers that find the token stale share a single refresh.
#[derive(Debug, Clone)]
pub struct ActionsClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: GitHubConfig,
    credentials: LoadedCredentials,
    transport: Transport,
    system_info: RwLock<SystemInfo>,
    admin: RwLock<Option<AdminConnection>>,
    refresh: tokio::sync::Mutex<RefreshState>,
    /// Completed refresh attempts (success or failure), readable without the refresh lock.
    refresh_attempts: AtomicU64,
}

#[derive(Debug, Default)]
struct RefreshState {
    /// The failure of the most recent attempt, handed to callers that waited for it.
    last_failure: Option<Error>,
}

fn bearer(token: &SecretString) -> String {
    format!("Bearer {}", token.expose_secret())
}

impl ActionsClient {
    /// Builds a client. Fails on unusable credentials (e.g. a malformed App key), proxy or TLS settings.
    pub fn new(
        config: GitHubConfig,
        credentials: &Credentials,
        options: ClientOptions,
    ) -> Result<Self> {
        let credentials = LoadedCredentials::load(credentials)?;
        let transport = Transport::new(&options.http)?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                credentials,
                transport,
                system_info: RwLock::new(options.system_info),
                admin: RwLock::new(None),
                refresh: tokio::sync::Mutex::new(RefreshState::default()),
                refresh_attempts: AtomicU64::new(0),
            }),
        })
    }

    /// The config URL this client serves.
    pub fn config(&self) -> &GitHubConfig {
        &self.inner.config
    }

    /// The current system info.
    pub fn system_info(&self) -> SystemInfo {
        self.inner
            .system_info
            .read()
            .map(|g| g.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Replaces the system info (affects the User-Agent of later calls).
    pub fn set_system_info(&self, info: SystemInfo) {
        match self.inner.system_info.write() {
            Ok(mut guard) => *guard = info,
            Err(poisoned) => *poisoned.into_inner() = info,
        }
    }

    /// Records the scale set id in the system info once it is known.
    pub fn set_scale_set_id(&self, scale_set_id: i64) {
        let mut info = self.system_info();
        info.scale_set_id = scale_set_id;
        self.set_system_info(info);
    }

    /// How many admin-token refreshes were attempted so far (for metrics and tests).
    pub fn admin_token_refreshes(&self) -> u64 {
        self.inner.refresh_attempts.load(Ordering::Relaxed)
    }

    fn user_agent(&self) -> String {
        user_agent(&self.system_info())
    }

    fn headers(
        &self,
        operation: Operation,
        content_type: Option<&str>,
        authorization: Option<String>,
    ) -> Result<HeaderMap> {
        request_headers(
            operation,
            content_type,
            authorization.as_deref(),
            &self.user_agent(),
        )
    }

    // ----- admin connection -----

    fn current_admin(&self) -> Option<AdminConnection> {
        let guard = self
            .inner
            .admin
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        guard
            .as_ref()
            .filter(|c| !c.needs_refresh(Timestamp::now()))
            .cloned()
    }

    /// The admin connection, refreshed first when missing or within 60 s of expiry.
    ///
    /// Single flight: callers that find the token stale queue on one lock; the first refreshes, the rest see the
    /// new token. If that refresh fails, the callers that were already waiting get the same error instead of
    /// each repeating the whole exchange against a failing GitHub; the next call tries again.
    pub async fn admin_connection(&self) -> Result<AdminConnection> {
        if let Some(connection) = self.current_admin() {
            return Ok(connection);
        }
        let attempts_seen = self.inner.refresh_attempts.load(Ordering::Acquire);
        let mut state = self.inner.refresh.lock().await;
        if let Some(connection) = self.current_admin() {
            return Ok(connection);
        }
        if self.inner.refresh_attempts.load(Ordering::Acquire) > attempts_seen
            && let Some(failure) = &state.last_failure
        {
            return Err(failure.clone());
        }
        let result = self.fetch_admin_connection().await;
        self.inner.refresh_attempts.fetch_add(1, Ordering::AcqRel);
        match result {
            Ok(connection) => {
                state.last_failure = None;
                let mut guard = self
                    .inner
                    .admin
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                *guard = Some(connection.clone());
                Ok(connection)
            }
            Err(err) => {
                tracing::warn!(error = %err, "admin token refresh failed");
                state.last_failure = Some(err.clone());
                Err(err)
            }
        }
    }

    async fn fetch_admin_connection(&self) -> Result<AdminConnection> {
        let github_token = self.github_token().await?;
        let registration_token = self.registration_token(&github_token).await?;
        self.register_runner_admin(&registration_token).await
    }

    /// The credential for GitHub REST calls: the PAT, or for an App a new installation token (never cached, see
    /// docs/reference/actions-service-protocol.md, "Installation token").
    async fn github_token(&self) -> Result<SecretString> {
        match &self.inner.credentials {
            LoadedCredentials::Pat(pat) => Ok(pat.clone()),
            LoadedCredentials::App {
                client_id,
                installation_id,
                key,
            } => {
                self.installation_token(client_id, *installation_id, key)
                    .await
            }
        }
    }

    /// `POST /app/installations/{id}/access_tokens` with a fresh App JWT; exactly 201.
    async fn installation_token(
        &self,
        client_id: &str,
        installation_id: i64,
        key: &jwt::AppPrivateKey,
    ) -> Result<SecretString> {
        let op = Operation::CreateInstallationToken;
        let jwt = LoadedCredentials::app_jwt(key, client_id)?;
        let url = self.inner.config.api_url(&format!(
            "/app/installations/{installation_id}/access_tokens"
        ))?;
        let mut request = Request::new(op, Method::POST, url);
        request.idempotency = Idempotency::Safe;
        request.headers =
            self.headers(op, Some("application/vnd.github+json"), Some(bearer(&jwt)))?;
        let response = self.inner.transport.send(request).await?;
        if response.status != StatusCode::CREATED {
            return Err(response.status_error(None));
        }
        let token: GitHubToken = response.decode()?;
        if token.token.is_empty() {
            return Err(response.invalid(ErrorKind::InvalidResponse, "missing token"));
        }
        Ok(token.token)
    }

    /// `POST {scope}/actions/runners/registration-token`; exactly 201.
    async fn registration_token(&self, github_token: &SecretString) -> Result<SecretString> {
        let op = Operation::CreateRegistrationToken;
        let url = self
            .inner
            .config
            .api_url(&self.inner.config.registration_token_path())?;
        let mut request = Request::new(op, Method::POST, url);
        request.idempotency = Idempotency::Safe;
        request.body = Some(Vec::new());
        request.headers = self.headers(
            op,
            Some("application/vnd.github.v3+json"),
            Some(bearer(github_token)),
        )?;
        let response = self.inner.transport.send(request).await?;
        if response.status != StatusCode::CREATED {
            return Err(response.status_error(None));
        }
        let token: GitHubToken = response.decode()?;
        if token.token.is_empty() {
            return Err(response.invalid(ErrorKind::InvalidResponse, "missing token"));
        }
        Ok(token.token)
    }

    /// `POST /actions/runner-registration` with `RemoteAuth`; any 2xx; retried on 401/403 as well.
    async fn register_runner_admin(
        &self,
        registration_token: &SecretString,
    ) -> Result<AdminConnection> {
        let op = Operation::RegisterRunnerAdmin;
        let url = self.inner.config.api_url("/actions/runner-registration")?;
        let mut body = serde_json::to_vec(&RunnerRegistrationRequest {
            url: self.inner.config.as_str(),
            runner_event: "register",
        })
        .map_err(|e| Error::InvalidRequest {
            operation: op,
            reason: e.to_string(),
        })?;
        body.push(b'\n');
        let mut request = Request::new(op, Method::POST, url);
        request.idempotency = Idempotency::Safe;
        request.retry_auth_failures = true;
        request.body = Some(body);
        request.headers = self.headers(
            op,
            Some(JSON),
            Some(format!("RemoteAuth {}", registration_token.expose_secret())),
        )?;
        let response = self.inner.transport.send(request).await?;
        if !response.status.is_success() {
            return Err(response.status_error(None));
        }
        let admin: AdminConnectionResponse = response.decode()?;
        if admin.url.is_empty() {
            return Err(response.invalid(ErrorKind::InvalidResponse, "missing url"));
        }
        if admin.token.is_empty() {
            return Err(response.invalid(ErrorKind::InvalidResponse, "missing token"));
        }
        let service_url = Url::parse(&admin.url).map_err(|e| {
            response.invalid(
                ErrorKind::InvalidResponse,
                format!("invalid service url: {e}"),
            )
        })?;
        let expires_at = jwt::admin_token_expiry(&admin.token)?;
        tracing::debug!(service_url = %service_url, %expires_at, "obtained Actions Service admin token");
        Ok(AdminConnection {
            service_url,
            token: admin.token,
            expires_at,
        })
    }

    // ----- GitHub REST: workflow run jobs -----

    /// Headers of the workflow-job calls: GitHub's media type both ways and a pinned API version.
    fn github_rest_headers(&self, operation: Operation, token: &SecretString) -> Result<HeaderMap> {
        let mut headers = self.headers(operation, Some(GITHUB_JSON), Some(bearer(token)))?;
        headers.insert(ACCEPT, HeaderValue::from_static(GITHUB_JSON));
        headers.insert(GITHUB_API_VERSION, HeaderValue::from_static("2022-11-28"));
        Ok(headers)
    }

    /// Every attempt of every job of workflow run `run_id` in repository `repository` ("owner/repo").
    ///
    /// Reads up to ten pages of 100 jobs (`filter=all`), stopping at a short page or once `total_count` jobs
    /// arrived. An App mints one installation token for the whole listing.
    pub async fn list_workflow_run_jobs(
        &self,
        repository: &str,
        run_id: i64,
    ) -> Result<Vec<WorkflowJob>> {
        let op = Operation::ListWorkflowRunJobs;
        check_repository(op, repository)?;
        let url = self
            .inner
            .config
            .api_url(&format!("/repos/{repository}/actions/runs/{run_id}/jobs"))?;
        let token = self.github_token().await?;
        let per_page = JOBS_PER_PAGE.to_string();
        let mut jobs = Vec::new();
        for page in 1..=MAX_JOB_PAGES {
            let mut page_url = url.clone();
            page_url
                .query_pairs_mut()
                .append_pair("filter", "all")
                .append_pair("per_page", &per_page)
                .append_pair("page", &page.to_string());
            let mut request = Request::new(op, Method::GET, page_url);
            request.idempotency = Idempotency::Safe;
            request.headers = self.github_rest_headers(op, &token)?;
            let response = self.inner.transport.send(request).await?;
            if response.status != StatusCode::OK {
                return Err(github_status_error(&response));
            }
            let body: WorkflowJobsPage = response.decode()?;
            let received = body.jobs.len();
            jobs.extend(body.jobs);
            // A missing `total_count` (0) must not end the listing after a full page.
            let complete = usize::try_from(body.total_count)
                .is_ok_and(|total| total > 0 && jobs.len() >= total);
            if received < JOBS_PER_PAGE || complete {
                return Ok(jobs);
            }
        }
        tracing::warn!(
            repository,
            run_id,
            jobs = jobs.len(),
            "workflow run has more jobs than one listing reads; the rest are left out"
        );
        Ok(jobs)
    }

    /// Asks GitHub to re-run job `job_id` (a REST job id) of `repository` ("owner/repo").
    ///
    /// GitHub's answers that are not failures of the call come back as a [`RerunOutcome`]; a 403 that is a rate
    /// limit (`Retry-After`, or no requests left) is an [`ErrorKind::RateLimited`] error instead, since it clears
    /// by itself. Not retried after a lost answer: a repeated re-run would be refused anyway.
    pub async fn rerun_workflow_job(&self, repository: &str, job_id: i64) -> Result<RerunOutcome> {
        let op = Operation::RerunWorkflowJob;
        check_repository(op, repository)?;
        let url = self
            .inner
            .config
            .api_url(&format!("/repos/{repository}/actions/jobs/{job_id}/rerun"))?;
        let token = self.github_token().await?;
        let mut request = Request::new(op, Method::POST, url);
        request.body = Some(b"{}".to_vec());
        request.headers = self.github_rest_headers(op, &token)?;
        let response = self.inner.transport.send(request).await?;
        match response.status {
            StatusCode::CREATED => Ok(RerunOutcome::Requested),
            StatusCode::FORBIDDEN if !is_rate_limited(&response) => {
                Ok(RerunOutcome::Refused(refusal_message(&response.body)))
            }
            StatusCode::NOT_FOUND => Ok(RerunOutcome::NotFound),
            _ => Err(github_status_error(&response)),
        }
    }

    // ----- Actions Service requests -----

    /// Sends an Actions Service request with the admin token. `auth_override` replaces the admin token
    /// (acquire-jobs uses the message-queue token).
    async fn service(
        &self,
        operation: Operation,
        method: Method,
        path: &str,
        params: &[(&str, &str)],
        body: Option<Vec<u8>>,
        auth_override: Option<&SecretString>,
    ) -> Result<Response> {
        let admin = self.admin_connection().await?;
        let url = urls::service_url(&admin.service_url, path, params);
        let mut request = Request::new(operation, method, url);
        request.headers = self.headers(
            operation,
            Some(JSON),
            Some(bearer(auth_override.unwrap_or(&admin.token))),
        )?;
        request.body = body;
        match operation {
            Operation::UpdateRunnerScaleSet
            | Operation::RefreshMessageSession
            | Operation::AcquireJobs => {
                request.idempotency = Idempotency::Safe;
            }
            _ => {}
        }
        self.inner.transport.send(request).await
    }

    fn encode<T: serde::Serialize>(operation: Operation, value: &T) -> Result<Vec<u8>> {
        serde_json::to_vec(value).map_err(|e| Error::InvalidRequest {
            operation,
            reason: e.to_string(),
        })
    }

    /// A 200 whose JSON body decodes as `T`; any other status is the service's error.
    fn ok_json<T: serde::de::DeserializeOwned>(response: &Response) -> Result<T> {
        Self::expect(response, StatusCode::OK)?;
        response.decode()
    }

    fn expect(response: &Response, status: StatusCode) -> Result<()> {
        if response.status == status {
            Ok(())
        } else {
            Err(response.status_error(None))
        }
    }

    /// Picks the single item of a list envelope by its `count`: 0 → `None`, 1 → the item, more → error.
    fn single<T: serde::de::DeserializeOwned>(
        response: &Response,
        what: &str,
        name: &str,
    ) -> Result<Option<T>> {
        let mut list: ListEnvelope<T> = response.decode()?;
        match list.count {
            0 => Ok(None),
            1 if !list.value.is_empty() => Ok(Some(list.value.swap_remove(0))),
            1 => Err(response.invalid(
                ErrorKind::InvalidResponse,
                "count is 1 but the list is empty",
            )),
            n => Err(response.invalid(
                ErrorKind::AmbiguousName,
                format!("multiple {what} found with name {name:?} (count {n})"),
            )),
        }
    }

    /// The scale set with `name` in runner group `runner_group_id`, or `None`.
    pub async fn get_runner_scale_set(
        &self,
        runner_group_id: i64,
        name: &str,
    ) -> Result<Option<RunnerScaleSet>> {
        let op = Operation::GetRunnerScaleSet;
        let group = runner_group_id.to_string();
        let params = [("runnerGroupId", group.as_str()), ("name", name)];
        let response = self
            .service(
                op,
                Method::GET,
                "/_apis/runtime/runnerscalesets",
                &params,
                None,
                None,
            )
            .await?;
        Self::expect(&response, StatusCode::OK)?;
        Self::single(&response, "runner scale sets", name)
    }

    /// The scale set with `id`; `None` when the service answers `null`. A 404 is
    /// [`ErrorKind::ScaleSetNotFound`].
    pub async fn get_runner_scale_set_by_id(&self, id: i64) -> Result<Option<RunnerScaleSet>> {
        let op = Operation::GetRunnerScaleSetById;
        let path = format!("/_apis/runtime/runnerscalesets/{id}");
        let response = self
            .service(op, Method::GET, &path, &[], None, None)
            .await?;
        Self::ok_json(&response)
    }

    /// Creates a scale set. Without labels, the name becomes the only label; empty label types become
    /// `System`. A scale set with neither labels nor name is rejected without a request.
    pub async fn create_runner_scale_set(
        &self,
        scale_set: &RunnerScaleSet,
    ) -> Result<RunnerScaleSet> {
        let op = Operation::CreateRunnerScaleSet;
        let mut body = scale_set.clone();
        if body.labels.is_empty() {
            if body.name.is_empty() {
                return Err(Error::InvalidRequest {
                    operation: op,
                    reason: "a runner scale set needs a name or at least one label".to_owned(),
                });
            }
            body.labels = vec![crate::models::Label::system(body.name.clone())];
        }
        default_label_types(&mut body);
        let response = self
            .service(
                op,
                Method::POST,
                "/_apis/runtime/runnerscalesets",
                &[],
                Some(Self::encode(op, &body)?),
                None,
            )
            .await?;
        Self::ok_json(&response)
    }

    /// Partial update of scale set `id` (set only the fields to change); returns the updated set.
    pub async fn update_runner_scale_set(
        &self,
        id: i64,
        scale_set: &RunnerScaleSet,
    ) -> Result<RunnerScaleSet> {
        let op = Operation::UpdateRunnerScaleSet;
        let mut body = scale_set.clone();
        default_label_types(&mut body);
        let path = format!("/_apis/runtime/runnerscalesets/{id}");
        let response = self
            .service(
                op,
                Method::PATCH,
                &path,
                &[],
                Some(Self::encode(op, &body)?),
                None,
            )
            .await?;
        Self::ok_json(&response)
    }

    /// Deletes scale set `id` (exactly 204).
    pub async fn delete_runner_scale_set(&self, id: i64) -> Result<()> {
        let op = Operation::DeleteRunnerScaleSet;
        let path = format!("/_apis/runtime/runnerscalesets/{id}");
        let response = self
            .service(op, Method::DELETE, &path, &[], None, None)
            .await?;
        Self::expect(&response, StatusCode::NO_CONTENT)
    }

    /// The runner group named `name`. No match is [`ErrorKind::RunnerGroupNotFound`]. Callers use
    /// [`crate::DEFAULT_RUNNER_GROUP_ID`] for `default` without calling this.
    pub async fn get_runner_group_by_name(&self, name: &str) -> Result<RunnerGroup> {
        let op = Operation::GetRunnerGroupByName;
        let response = self
            .service(
                op,
                Method::GET,
                "/_apis/runtime/runnergroups/",
                &[("groupName", name)],
                None,
                None,
            )
            .await?;
        Self::expect(&response, StatusCode::OK)?;
        Self::single(&response, "runner groups", name)?.ok_or_else(|| {
            response.invalid(
                ErrorKind::RunnerGroupNotFound,
                format!("no runner group found with name {name:?}"),
            )
        })
    }

    /// Registers a runner and returns its JIT configuration. A name clash is [`ErrorKind::RunnerExists`].
    pub async fn generate_jit_runner_config(
        &self,
        scale_set_id: i64,
        setting: &JitSetting,
    ) -> Result<JitRunnerConfig> {
        let op = Operation::GenerateJitRunnerConfig;
        let path = format!("/_apis/runtime/runnerscalesets/{scale_set_id}/generatejitconfig");
        let response = self
            .service(
                op,
                Method::POST,
                &path,
                &[],
                Some(Self::encode(op, setting)?),
                None,
            )
            .await?;
        Self::ok_json(&response)
    }

    /// The runner with `runner_id`. Unknown runners are [`ErrorKind::RunnerNotFound`].
    pub async fn get_runner(&self, runner_id: i64) -> Result<RunnerReference> {
        let op = Operation::GetRunner;
        let path = format!("/_apis/distributedtask/pools/0/agents/{runner_id}");
        let response = self
            .service(op, Method::GET, &path, &[], None, None)
            .await?;
        Self::ok_json(&response)
    }

    /// The runner named `name`, or `None`.
    pub async fn get_runner_by_name(&self, name: &str) -> Result<Option<RunnerReference>> {
        let op = Operation::GetRunnerByName;
        let response = self
            .service(
                op,
                Method::GET,
                "/_apis/distributedtask/pools/0/agents",
                &[("agentName", name)],
                None,
                None,
            )
            .await?;
        Self::expect(&response, StatusCode::OK)?;
        Self::single(&response, "runners", name)
    }

    /// Removes a runner (204, also when it does not exist). A busy runner is
    /// [`ErrorKind::JobStillRunning`].
    pub async fn remove_runner(&self, runner_id: i64) -> Result<()> {
        let op = Operation::RemoveRunner;
        let path = format!("/_apis/distributedtask/pools/0/agents/{runner_id}");
        let response = self
            .service(op, Method::DELETE, &path, &[], None, None)
            .await?;
        Self::expect(&response, StatusCode::NO_CONTENT)
    }

    /// Creates a message session. A second session for the same set is [`ErrorKind::SessionConflict`].
    pub async fn create_message_session(
        &self,
        scale_set_id: i64,
        owner_name: &str,
    ) -> Result<RunnerScaleSetSession> {
        let op = Operation::CreateMessageSession;
        let body = RunnerScaleSetSession {
            session_id: SessionId::NIL,
            owner_name: owner_name.to_owned(),
            ..Default::default()
        };
        let path = format!("/_apis/runtime/runnerscalesets/{scale_set_id}/sessions");
        let response = self
            .service(
                op,
                Method::POST,
                &path,
                &[],
                Some(Self::encode(op, &body)?),
                None,
            )
            .await?;
        Self::ok_json(&response)
    }

    /// Refreshes a session, returning it with a new message-queue token. A session the service dropped
    /// is [`ErrorKind::SessionNotFound`].
    pub async fn refresh_message_session(
        &self,
        scale_set_id: i64,
        session_id: SessionId,
    ) -> Result<RunnerScaleSetSession> {
        let op = Operation::RefreshMessageSession;
        let path = format!("/_apis/runtime/runnerscalesets/{scale_set_id}/sessions/{session_id}");
        let response = self
            .service(op, Method::PATCH, &path, &[], None, None)
            .await?;
        Self::ok_json(&response)
    }

    /// Deletes a session (exactly 204).
    pub async fn delete_message_session(
        &self,
        scale_set_id: i64,
        session_id: SessionId,
    ) -> Result<()> {
        let op = Operation::DeleteMessageSession;
        let path = format!("/_apis/runtime/runnerscalesets/{scale_set_id}/sessions/{session_id}");
        let response = self
            .service(op, Method::DELETE, &path, &[], None, None)
            .await?;
        Self::expect(&response, StatusCode::NO_CONTENT)
    }

    /// Long-polls the message queue. `None` when the poll window passed without a message (202).
    /// 401 is [`ErrorKind::MessageQueueTokenExpired`]; [`MessageSessionClient`] handles it by refreshing.
    pub async fn get_message(
        &self,
        queue_url: &str,
        queue_token: &SecretString,
        last_message_id: i64,
        max_capacity: u32,
    ) -> Result<Option<RunnerScaleSetMessage>> {
        let op = Operation::GetMessage;
        let queue = parse_queue_url(op, queue_url)?;
        let mut request = Request::new(
            op,
            Method::GET,
            urls::message_poll_url(&queue, last_message_id),
        );
        request.long_poll = true;
        request.headers = self.headers(op, None, Some(bearer(queue_token)))?;
        request.headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json; api-version=6.0-preview"),
        );
        request
            .headers
            .insert(MAX_CAPACITY, HeaderValue::from(max_capacity));
        let response = self.inner.transport.send(request).await?;
        match response.status {
            StatusCode::OK => {}
            StatusCode::ACCEPTED => return Ok(None),
            StatusCode::UNAUTHORIZED => {
                return Err(response.status_error(Some(ErrorKind::MessageQueueTokenExpired)));
            }
            _ => return Err(response.status_error(None)),
        }
        let raw: RawMessage = response.decode()?;
        messages::parse_message(raw)
            .map(Some)
            .map_err(|problem| match problem {
                MessageProblem::UnsupportedType(t) => response.invalid(
                    ErrorKind::UnsupportedMessageType,
                    format!("message type {t:?}"),
                ),
                MessageProblem::Decode(e) => {
                    response.invalid(ErrorKind::InvalidResponse, format!("message body: {e}"))
                }
            })
    }

    /// Acknowledges (deletes) a message (exactly 204).
    pub async fn delete_message(
        &self,
        queue_url: &str,
        queue_token: &SecretString,
        message_id: i64,
    ) -> Result<()> {
        let op = Operation::DeleteMessage;
        let queue = parse_queue_url(op, queue_url)?;
        let mut request = Request::new(
            op,
            Method::DELETE,
            urls::message_delete_url(&queue, message_id),
        );
        request.headers = self.headers(op, Some(JSON), Some(bearer(queue_token)))?;
        let response = self.inner.transport.send(request).await?;
        match response.status {
            StatusCode::NO_CONTENT => Ok(()),
            StatusCode::UNAUTHORIZED => {
                Err(response.status_error(Some(ErrorKind::MessageQueueTokenExpired)))
            }
            _ => Err(response.status_error(None)),
        }
    }

    /// Acquires jobs by `runnerRequestId`; returns the ids actually acquired (possibly fewer).
    pub async fn acquire_jobs(
        &self,
        scale_set_id: i64,
        queue_token: &SecretString,
        request_ids: &[i64],
    ) -> Result<Vec<i64>> {
        let op = Operation::AcquireJobs;
        let path = format!("/_apis/runtime/runnerscalesets/{scale_set_id}/acquirejobs");
        let body = Self::encode(op, &request_ids)?;
        let response = self
            .service(op, Method::POST, &path, &[], Some(body), Some(queue_token))
            .await?;
        match response.status {
            StatusCode::OK => Ok(response.decode::<ListEnvelope<i64>>()?.value),
            StatusCode::UNAUTHORIZED => {
                Err(response.status_error(Some(ErrorKind::MessageQueueTokenExpired)))
            }
            _ => Err(response.status_error(None)),
        }
    }

    /// Jobs the scale set may acquire (only ARC's older client used this); 204 means none.
    pub async fn get_acquirable_jobs(&self, scale_set_id: i64) -> Result<Vec<AcquirableJob>> {
        let op = Operation::GetAcquirableJobs;
        let path = format!("/_apis/runtime/runnerscalesets/{scale_set_id}/acquirablejobs");
        let response = self
            .service(op, Method::GET, &path, &[], None, None)
            .await?;
        match response.status {
            StatusCode::NO_CONTENT => Ok(Vec::new()),
            StatusCode::OK => Ok(response.decode::<ListEnvelope<AcquirableJob>>()?.value),
            _ => Err(response.status_error(None)),
        }
    }

    /// Creates a message session and returns a client that owns it and refreshes its queue token on 401.
    pub async fn message_session(
        &self,
        scale_set_id: i64,
        owner_name: &str,
    ) -> Result<MessageSessionClient> {
        let session = self
            .create_message_session(scale_set_id, owner_name)
            .await?;
        Ok(MessageSessionClient::new(
            self.clone(),
            scale_set_id,
            session,
        ))
    }
}

fn default_label_types(scale_set: &mut RunnerScaleSet) {
    for label in &mut scale_set.labels {
        if label.label_type.is_empty() {
            SYSTEM_LABEL_TYPE.clone_into(&mut label.label_type);
        }
    }
}

/// Accepts exactly `owner/repo` with the characters GitHub allows in names, so the value cannot reach another
/// path (`..`, more segments, a query) once placed in a URL.
fn check_repository(operation: Operation, repository: &str) -> Result<()> {
    let name_ok = |name: &str| {
        !name.is_empty()
            && name != "."
            && name != ".."
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    match repository.split_once('/') {
        Some((owner, repo)) if name_ok(owner) && name_ok(repo) => Ok(()),
        _ => Err(Error::InvalidRequest {
            operation,
            reason: format!("the repository {repository:?} is not of the form owner/repo"),
        }),
    }
}

/// Whether a 403 is GitHub's rate limit rather than a refusal (GitHub REST docs, "Rate limits").
fn is_rate_limited(response: &Response) -> bool {
    let header = |name: &str| response.headers.get(name).and_then(|v| v.to_str().ok());
    header("retry-after").is_some() || header("x-ratelimit-remaining") == Some("0")
}

/// The error for an unexpected status of a GitHub REST call; a rate-limiting 403 counts as 429.
fn github_status_error(response: &Response) -> Error {
    if response.status == StatusCode::FORBIDDEN && is_rate_limited(response) {
        response.status_error(Some(ErrorKind::RateLimited))
    } else {
        response.status_error(None)
    }
}

/// Why GitHub refused: the `message` of its JSON error body, else the body's text, else "forbidden".
fn refusal_message(body: &[u8]) -> String {
    if let Ok(error) = crate::decode::from_slice::<ServiceException>(body)
        && !error.message.trim().is_empty()
    {
        return error.message;
    }
    let text = String::from_utf8_lossy(crate::decode::strip_bom(body));
    let text = text.trim();
    if text.is_empty() {
        "forbidden".to_owned()
    } else {
        text.chars().take(MAX_REFUSAL_CHARS).collect()
    }
}

fn parse_queue_url(operation: Operation, queue_url: &str) -> Result<Url> {
    Url::parse(queue_url).map_err(|e| Error::InvalidRequest {
        operation,
        reason: format!("the message queue URL is invalid: {e}"),
    })
}
