//! The axum layer: one fallback handler for the protocol (routing is in `routes`, semantics in `api`), the
//! long-poll loop, and the control API under `/_fake`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State as AxumState};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::{self, ApiRequest, Reply};
use crate::control::{
    AddRunnerGroup, DropSessions, EnqueueJobs, ExpireTokens, FinishJob, RunnerSelector,
};
use crate::error::Rejection;
use crate::faults::Faults;
use crate::routes::{self, Endpoint, Surface};
use crate::state::State;

/// Largest request body read; real requests are a few hundred bytes.
const MAX_BODY_BYTES: usize = 1 << 20;
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// What the handlers share: the state behind a lock, a change counter long polls wait on, and settings.
#[derive(Debug)]
pub struct Shared {
    state: Mutex<State>,
    changes: watch::Sender<u64>,
    shutdown: CancellationToken,
    long_poll_timeout: Duration,
    advertised_url: Option<String>,
    fallback_base_url: String,
    byte_order_mark: bool,
    activity_ids: AtomicU64,
}

impl Shared {
    /// Shared state for a server.
    pub fn new(
        state: State,
        long_poll_timeout: Duration,
        advertised_url: Option<String>,
        fallback_base_url: String,
        byte_order_mark: bool,
    ) -> Self {
        Self {
            state: Mutex::new(state),
            changes: watch::Sender::new(0),
            shutdown: CancellationToken::new(),
            long_poll_timeout,
            advertised_url,
            fallback_base_url,
            byte_order_mark,
            activity_ids: AtomicU64::new(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the state as it was at that point; a fake keeps serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Run `f` on the state without waking long polls.
    pub fn read<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.lock())
    }

    /// Run `f` on the state, then wake long polls so they look again.
    pub fn mutate<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let result = f(&mut self.lock());
        self.notify();
        result
    }

    fn notify(&self) {
        // send_modify updates the value even when no poll is waiting, unlike send.
        self.changes
            .send_modify(|version| *version = version.wrapping_add(1));
    }

    /// Subscribe to state changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Token cancelled when the server shuts down.
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    fn base_url(&self, headers: &HeaderMap) -> String {
        if let Some(url) = &self.advertised_url {
            return url.trim_end_matches('/').to_owned();
        }
        headers
            .get(header::HOST)
            .and_then(|host| host.to_str().ok())
            .filter(|host| !host.is_empty())
            .map_or_else(
                || self.fallback_base_url.clone(),
                |host| format!("http://{host}"),
            )
    }

    fn activity_id(&self) -> String {
        let counter = self.activity_ids.fetch_add(1, Ordering::Relaxed);
        format!(
            "00000000-0000-4000-8000-{:012x}",
            counter & 0xFFFF_FFFF_FFFF
        )
    }
}

/// The router: control API under `/_fake`, everything else to the protocol handler.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/_fake/healthz", get(|| async { "ok" }))
        .route("/_fake/state", get(snapshot))
        .route("/_fake/counters", get(counters).delete(reset_counters))
        .route("/_fake/user-agents", get(user_agents))
        .route("/_fake/jobs", post(enqueue_jobs))
        .route("/_fake/jobs/{id}", get(job))
        .route("/_fake/jobs/{id}/start", post(start_job))
        .route("/_fake/jobs/{id}/renew", post(renew_job))
        .route("/_fake/jobs/{id}/finish", post(finish_job))
        .route("/_fake/jobs/{id}/cancel", post(cancel_job))
        .route("/_fake/jobs/{id}/requeue", post(requeue_job))
        .route("/_fake/runners/online", post(runner_online))
        .route("/_fake/runners/{id}/offline", post(runner_offline))
        .route("/_fake/runners/{id}", get(runner).delete(deregister_runner))
        .route(
            "/_fake/faults",
            get(faults).put(set_faults).delete(clear_faults),
        )
        .route("/_fake/sessions/drop", post(drop_sessions))
        .route("/_fake/tokens/expire", post(expire_tokens))
        .route("/_fake/scalesets/{id}", delete(delete_scale_set))
        .route("/_fake/runner-groups", post(add_runner_group))
        .fallback(protocol)
        .with_state(shared)
}

// -------------------------------------------------------------------------------------------------------------
// Protocol.

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

async fn protocol(AxumState(shared): AxumState<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let endpoint = match routes::route(&parts.method, parts.uri.path()) {
        Ok(endpoint) => endpoint,
        Err(miss) => return frame(&shared, None, api::no_route(miss)),
    };
    let surface = endpoint.surface();
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        let rejection = Rejection::exception(
            413,
            crate::error::exceptions::ARGUMENT,
            "The request body is too large.",
        );
        return frame(
            &shared,
            Some(surface),
            Reply::rejection(surface, &rejection),
        );
    };
    let headers = &parts.headers;
    let decision = shared.read(|state| {
        state.record_call(&endpoint, header_str(headers, "user-agent"));
        state.decide_fault(&endpoint)
    });
    tracing::debug!(endpoint = endpoint.name(), method = %parts.method, uri = %parts.uri, "request");
    if !decision.delay.is_zero() {
        tokio::time::sleep(decision.delay).await;
    }
    if let Some(error) = decision.error {
        return frame(&shared, Some(surface), api::injected(surface, error));
    }
    let query: Vec<(String, String)> = parts
        .uri
        .query()
        .map(|query| {
            url::form_urlencoded::parse(query.as_bytes())
                .into_owned()
                .collect()
        })
        .unwrap_or_default();
    let base_url = shared.base_url(headers);
    let request = ApiRequest {
        endpoint: &endpoint,
        query: &query,
        authorization: header_str(headers, "authorization"),
        max_capacity: header_str(headers, "x-scalesetmaxcapacity"),
        body: &body,
        base_url: &base_url,
        path: parts.uri.path(),
    };
    let reply = if endpoint == Endpoint::GetMessage {
        long_poll(&shared, &request).await
    } else {
        shared.mutate(|state| api::handle(state, &request))
    };
    frame(&shared, Some(surface), reply)
}

/// The long poll: answer at once when a message is there, else wait for state changes until the timeout, then 202.
async fn long_poll(shared: &Shared, request: &ApiRequest<'_>) -> Reply {
    let params = match shared.read(|state| api::prepare_poll(state, request)) {
        Ok(params) => params,
        Err(reply) => return reply,
    };
    let deadline = tokio::time::Instant::now() + shared.long_poll_timeout;
    let mut changes = shared.subscribe();
    loop {
        // Mark the current version seen before looking, so a change after the look wakes the wait below.
        changes.borrow_and_update();
        let polled = shared.read(|state| {
            state.poll_message(&params.session, params.last_message_id, params.max_capacity)
        });
        match polled {
            Ok(Some(message)) => return Reply::json(200, &message),
            Ok(None) => {}
            Err(rejection) => return Reply::rejection(Surface::Queue, &rejection),
        }
        tokio::select! {
            () = shared.shutdown.cancelled() => return Reply::empty(202),
            () = tokio::time::sleep_until(deadline) => return Reply::empty(202),
            changed = changes.changed() => {
                if changed.is_err() {
                    return Reply::empty(202);
                }
            }
        }
    }
}

/// Turn a reply into a response with the headers of its surface.
fn frame(shared: &Shared, surface: Option<Surface>, reply: Reply) -> Response {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let github = surface == Some(Surface::GitHub);
    let mut body = reply.body.unwrap_or_default();
    let has_body = !body.is_empty();
    if has_body && !github && shared.byte_order_mark {
        body.splice(0..0, BOM.iter().copied());
    }
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    if has_body {
        let content_type = if github {
            "application/json; charset=utf-8"
        } else {
            "application/json; charset=utf-8; api-version=6.0-preview"
        };
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    }
    let id = shared.activity_id();
    let (name, value) = if github {
        ("x-github-request-id", id.to_ascii_uppercase())
    } else {
        ("activityid", id)
    };
    if let Ok(value) = HeaderValue::from_str(&value) {
        headers.insert(name, value);
    }
    if let Some(seconds) = reply.retry_after_secs {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    if let Some(link) = reply
        .link
        .and_then(|link| HeaderValue::from_str(&link).ok())
    {
        headers.insert(header::LINK, link);
    }
    response
}

// -------------------------------------------------------------------------------------------------------------
// Control API.

type SharedState = AxumState<Arc<Shared>>;

fn control_error(rejection: &Rejection) -> Response {
    let status =
        StatusCode::from_u16(rejection.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        axum::Json(serde_json::json!({ "message": rejection.message })),
    )
        .into_response()
}

fn control<T: Serialize>(result: Result<T, Rejection>) -> Response {
    match result {
        Ok(value) => axum::Json(value).into_response(),
        Err(rejection) => control_error(&rejection),
    }
}

fn no_content(result: Result<(), Rejection>) -> Response {
    match result {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(rejection) => control_error(&rejection),
    }
}

/// Decode a control body; an empty body means the default value.
fn body<T: DeserializeOwned + Default>(bytes: &Bytes) -> Result<T, Rejection> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    required_body(bytes)
}

fn required_body<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, Rejection> {
    serde_json::from_slice(bytes)
        .map_err(|error| Rejection::new(400, format!("invalid JSON body: {error}")))
}

async fn snapshot(AxumState(shared): SharedState) -> Response {
    control(Ok(shared.read(State::snapshot)))
}

async fn counters(AxumState(shared): SharedState) -> Response {
    control(Ok(shared.read(|state| state.counters())))
}

async fn reset_counters(AxumState(shared): SharedState) -> Response {
    shared.read(State::reset_counters);
    StatusCode::NO_CONTENT.into_response()
}

async fn user_agents(AxumState(shared): SharedState) -> Response {
    control(Ok(shared.read(|state| state.user_agents())))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EnqueuedJobs {
    job_ids: Vec<i64>,
}

async fn enqueue_jobs(AxumState(shared): SharedState, bytes: Bytes) -> Response {
    let result = body::<EnqueueJobs>(&bytes)
        .and_then(|request| shared.mutate(|state| state.enqueue_jobs(&request)));
    control(result.map(|job_ids| EnqueuedJobs { job_ids }))
}

async fn job(AxumState(shared): SharedState, Path(id): Path<i64>) -> Response {
    control(shared.read(|state| state.job_view(id)))
}

async fn start_job(AxumState(shared): SharedState, Path(id): Path<i64>) -> Response {
    control(shared.mutate(|state| state.start_job(id)))
}

async fn renew_job(AxumState(shared): SharedState, Path(id): Path<i64>) -> Response {
    control(shared.read(|state| state.renew_job(id)))
}

async fn finish_job(AxumState(shared): SharedState, Path(id): Path<i64>, bytes: Bytes) -> Response {
    let result = body::<FinishJob>(&bytes).and_then(|request| {
        let result = request.result.unwrap_or_else(|| "succeeded".to_owned());
        shared.mutate(|state| state.finish_job(id, &result))
    });
    control(result)
}

async fn cancel_job(AxumState(shared): SharedState, Path(id): Path<i64>) -> Response {
    control(shared.mutate(|state| state.cancel_job(id)))
}

async fn requeue_job(AxumState(shared): SharedState, Path(id): Path<i64>) -> Response {
    control(shared.mutate(|state| state.requeue_job(id)))
}

async fn runner_online(AxumState(shared): SharedState, bytes: Bytes) -> Response {
    let result = body::<RunnerSelector>(&bytes)
        .and_then(|selector| shared.mutate(|state| state.mark_runner_online(&selector)));
    control(result)
}

async fn runner(AxumState(shared): SharedState, Path(id): Path<i64>) -> Response {
    control(shared.read(|state| state.runner_view(id)))
}

async fn runner_offline(AxumState(shared): SharedState, Path(id): Path<i64>) -> Response {
    control(shared.mutate(|state| state.mark_runner_offline(id)))
}

async fn deregister_runner(AxumState(shared): SharedState, Path(id): Path<i64>) -> Response {
    no_content(shared.mutate(|state| state.deregister_runner(id)))
}

async fn faults(AxumState(shared): SharedState) -> Response {
    control(Ok(shared.read(|state| state.faults())))
}

async fn set_faults(AxumState(shared): SharedState, bytes: Bytes) -> Response {
    no_content(
        body::<Faults>(&bytes).and_then(|faults| shared.read(|state| state.set_faults(faults))),
    )
}

async fn clear_faults(AxumState(shared): SharedState) -> Response {
    no_content(shared.read(|state| state.set_faults(Faults::default())))
}

#[derive(Serialize)]
struct Affected {
    count: usize,
}

async fn drop_sessions(AxumState(shared): SharedState, bytes: Bytes) -> Response {
    let result = body::<DropSessions>(&bytes)
        .map(|request| shared.mutate(|state| state.drop_sessions(&request)));
    control(result.map(|count| Affected { count }))
}

async fn expire_tokens(AxumState(shared): SharedState, bytes: Bytes) -> Response {
    let result = required_body::<ExpireTokens>(&bytes)
        .map(|request| shared.mutate(|state| state.expire_tokens(&request)));
    control(result.map(|count| Affected { count }))
}

#[derive(serde::Deserialize)]
struct DeleteOptions {
    #[serde(default)]
    force: bool,
}

async fn delete_scale_set(
    AxumState(shared): SharedState,
    Path(id): Path<i64>,
    Query(options): Query<DeleteOptions>,
) -> Response {
    no_content(shared.mutate(|state| state.delete_scale_set(None, id, options.force)))
}

async fn add_runner_group(AxumState(shared): SharedState, bytes: Bytes) -> Response {
    let result = required_body::<AddRunnerGroup>(&bytes).and_then(|request| {
        shared.mutate(|state| state.add_runner_group(&request.scope, &request.name))
    });
    control(result)
}
