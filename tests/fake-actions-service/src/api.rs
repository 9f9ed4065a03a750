//! The protocol's HTTP semantics, free of any server framework: which header and query parameter each endpoint
//! reads, the order of checks (authentication, then `api-version`, then the operation), and how results and
//! refusals become status codes and bodies.

use serde::Serialize;

use crate::error::{Rejection, exceptions};
use crate::faults::InjectedError;
use crate::routes::{Endpoint, NoRoute, Surface};
use crate::state::{DEFAULT_PER_PAGE, MAX_PER_PAGE, RunJobsFilter, RunJobsQuery, State};
use crate::wire::{
    ExceptionJson, GitHubErrorJson, JitRequest, ListEnvelope, RerunJobInput, ScaleSetInput,
    SessionInput,
};

/// The parts of a request the handlers read.
#[derive(Clone, Copy, Debug)]
pub struct ApiRequest<'a> {
    /// Resolved endpoint.
    pub endpoint: &'a Endpoint,
    /// Form-decoded query pairs.
    pub query: &'a [(String, String)],
    /// `Authorization` header.
    pub authorization: Option<&'a str>,
    /// `X-ScaleSetMaxCapacity` header.
    pub max_capacity: Option<&'a str>,
    /// Raw body.
    pub body: &'a [u8],
    /// URL the fake is reached under, without trailing slash.
    pub base_url: &'a str,
    /// Path of the request as received (for pagination links).
    pub path: &'a str,
}

/// A response before framing: status, optional JSON body, optional `Retry-After` and `Link`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// JSON body, if any.
    pub body: Option<Vec<u8>>,
    /// `Retry-After` seconds.
    pub retry_after_secs: Option<u64>,
    /// `Link` header (GitHub's pagination links).
    pub link: Option<String>,
}

impl Reply {
    /// A status without body (202, 204).
    pub fn empty(status: u16) -> Self {
        Self {
            status,
            body: None,
            retry_after_secs: None,
            link: None,
        }
    }

    /// A JSON body.
    pub fn json(status: u16, value: &impl Serialize) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => Self {
                status,
                body: Some(body),
                retry_after_secs: None,
                link: None,
            },
            Err(error) => Self::rejection(
                Surface::Actions,
                &Rejection::new(500, format!("encoding the response failed: {error}")),
            ),
        }
    }

    /// The error body a surface uses: GitHub's `{message, documentation_url}` or the Actions Service's
    /// exception object.
    pub fn rejection(surface: Surface, rejection: &Rejection) -> Self {
        match surface {
            Surface::GitHub => Self::json(
                rejection.status,
                &GitHubErrorJson {
                    message: rejection.message.clone(),
                    documentation_url: "https://docs.github.com/rest".to_owned(),
                },
            ),
            Surface::Actions | Surface::Queue => {
                let type_name = rejection
                    .type_name
                    .as_deref()
                    .unwrap_or(exceptions::RESOURCE_NOT_FOUND);
                Self::json(
                    rejection.status,
                    &ExceptionJson {
                        id: "1".to_owned(),
                        inner_exception: None,
                        message: rejection.message.clone(),
                        type_name: type_name.to_owned(),
                        type_key: type_key(type_name).to_owned(),
                        error_code: 0,
                        event_id: 3000,
                    },
                )
            }
        }
    }
}

/// `Namespace.TypeName, Assembly` → `TypeName`.
fn type_key(type_name: &str) -> &str {
    let qualified = type_name.split(',').next().unwrap_or(type_name);
    qualified.rsplit('.').next().unwrap_or(qualified)
}

/// The answer to a request no endpoint matched.
pub fn no_route(miss: NoRoute) -> Reply {
    match miss {
        NoRoute::NotFound(Some(Surface::GitHub)) => {
            Reply::rejection(Surface::GitHub, &Rejection::new(404, "Not Found"))
        }
        NoRoute::NotFound(_) => Reply::rejection(
            Surface::Actions,
            &Rejection::exception(
                404,
                exceptions::RESOURCE_NOT_FOUND,
                "The requested resource was not found.",
            ),
        ),
        NoRoute::MethodNotAllowed(surface) => Reply::rejection(
            surface,
            &Rejection::exception(
                405,
                exceptions::RESOURCE_NOT_FOUND,
                "The requested method is not allowed here.",
            ),
        ),
    }
}

/// The answer to a request a fault rule hit.
pub fn injected(surface: Surface, error: InjectedError) -> Reply {
    let rejection = Rejection::exception(
        error.status,
        exceptions::INJECTED_FAULT,
        format!("fake-actions-service injected status {}", error.status),
    );
    Reply {
        retry_after_secs: error.retry_after_secs,
        ..Reply::rejection(surface, &rejection)
    }
}

fn query<'a>(request: &ApiRequest<'a>, key: &str) -> Option<&'a str> {
    // The .NET service binds query parameters case-insensitively.
    request
        .query
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(key))
        .map(|(_, value)| value.as_str())
}

fn bad_request(message: impl Into<String>) -> Rejection {
    Rejection::exception(400, exceptions::ARGUMENT, message)
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Rejection> {
    serde_json::from_slice(body)
        .map_err(|error| bad_request(format!("The request body is not valid: {error}")))
}

fn query_i64(request: &ApiRequest<'_>, key: &str) -> Result<Option<i64>, Rejection> {
    query(request, key)
        .map(|value| {
            value
                .parse::<i64>()
                .map_err(|_| bad_request(format!("{key} must be an integer, got {value:?}")))
        })
        .transpose()
}

fn require_api_version(request: &ApiRequest<'_>) -> Result<(), Rejection> {
    if query(request, "api-version").is_some_and(|version| !version.is_empty()) {
        Ok(())
    } else {
        Err(Rejection::exception(
            400,
            exceptions::VERSION_NOT_SPECIFIED,
            "No api-version was supplied for the request. The api-version query parameter is required.",
        ))
    }
}

/// `per_page` and `page` of a GitHub list: a positive integer, else the default; `per_page` at most
/// [`MAX_PER_PAGE`].
fn page_number(request: &ApiRequest<'_>, key: &str, default: usize) -> usize {
    query(request, key)
        .and_then(|value| value.trim().parse::<usize>().ok())
        .filter(|number| *number > 0)
        .unwrap_or(default)
}

fn run_jobs_query(request: &ApiRequest<'_>) -> Result<RunJobsQuery, Rejection> {
    let filter = match query(request, "filter") {
        None => RunJobsFilter::Latest,
        Some(value) if value.eq_ignore_ascii_case("latest") => RunJobsFilter::Latest,
        Some(value) if value.eq_ignore_ascii_case("all") => RunJobsFilter::All,
        Some(value) => {
            return Err(Rejection::new(
                422,
                format!("filter must be latest or all, got {value:?}"),
            ));
        }
    };
    Ok(RunJobsQuery {
        filter,
        per_page: page_number(request, "per_page", DEFAULT_PER_PAGE).min(MAX_PER_PAGE),
        page: page_number(request, "page", 1),
    })
}

/// GitHub's `Link` header for page `page` of `last_page`: `prev` and `first` after the first page, `next` and
/// `last` before the last one; `None` when there is only one page and it was asked for. The URLs are the request's
/// with `page` replaced.
fn pagination_link(request: &ApiRequest<'_>, page: usize, last_page: usize) -> Option<String> {
    let mut rels = Vec::new();
    if page > 1 {
        rels.push(("prev", (page - 1).min(last_page)));
    }
    if page < last_page {
        rels.push(("next", page + 1));
        rels.push(("last", last_page));
    }
    if page > 1 {
        rels.push(("first", 1));
    }
    if rels.is_empty() {
        return None;
    }
    let url = |number: usize| {
        let mut pairs = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in request.query {
            if !name.eq_ignore_ascii_case("page") {
                pairs.append_pair(name, value);
            }
        }
        pairs.append_pair("page", &number.to_string());
        format!("{}{}?{}", request.base_url, request.path, pairs.finish())
    };
    let links: Vec<String> = rels
        .into_iter()
        .map(|(rel, number)| format!("<{}>; rel=\"{rel}\"", url(number)))
        .collect();
    Some(links.join(", "))
}

/// Handle any endpoint but the long poll (see [`prepare_poll`]).
pub fn handle(state: &mut State, request: &ApiRequest<'_>) -> Reply {
    let surface = request.endpoint.surface();
    match dispatch(state, request) {
        Ok(reply) => reply,
        Err(rejection) => Reply::rejection(surface, &rejection),
    }
}

fn dispatch(state: &mut State, request: &ApiRequest<'_>) -> Result<Reply, Rejection> {
    match request.endpoint {
        Endpoint::InstallationToken { installation_id } => Ok(Reply::json(
            201,
            &state.installation_token(request.authorization, installation_id)?,
        )),
        Endpoint::RegistrationToken { scope } => Ok(Reply::json(
            201,
            &state.registration_token(request.authorization, scope)?,
        )),
        Endpoint::RunnerRegistration => Ok(Reply::json(
            201,
            &state.runner_registration(request.authorization, request.body, request.base_url)?,
        )),
        Endpoint::ListRunJobs {
            owner,
            repository,
            run,
        } => {
            state.authorize_github(request.authorization)?;
            let query = run_jobs_query(request)?;
            let listed = state.run_jobs(owner, repository, *run, query, request.base_url)?;
            Ok(Reply {
                link: pagination_link(request, query.page, listed.last_page),
                ..Reply::json(200, &listed.body)
            })
        }
        Endpoint::RerunJob {
            owner,
            repository,
            job,
        } => {
            state.authorize_github(request.authorization)?;
            let input: RerunJobInput = if request.body.iter().all(u8::is_ascii_whitespace) {
                RerunJobInput::default()
            } else {
                serde_json::from_slice(request.body)
                    .map_err(|_| Rejection::new(400, "Problems parsing JSON"))?
            };
            state.rerun_job(
                owner,
                repository,
                *job,
                input.enable_debug_logging.unwrap_or(false),
            )?;
            Ok(Reply::json(201, &serde_json::Map::new()))
        }
        Endpoint::GetMessage => Err(Rejection::new(
            500,
            "the long poll is handled by the server loop",
        )),
        Endpoint::DeleteMessage { message } => {
            let session =
                state.authorize_queue(request.authorization, query(request, "sessionId"))?;
            state.ack_message(&session, *message)?;
            Ok(Reply::empty(204))
        }
        Endpoint::AcquireJobs { tenant, scale_set } => {
            // Acquire-jobs is an Actions Service call authorized with the message-queue token.
            let session = state.authorize_queue(request.authorization, None)?;
            require_api_version(request)?;
            let ids: Vec<i64> = parse_json(request.body)?;
            let acquired = state.acquire_jobs(*tenant, *scale_set, &session, &ids)?;
            Ok(Reply::json(200, &ListEnvelope::from(acquired)))
        }
        endpoint => {
            let tenant = admin_tenant(endpoint);
            state.authorize_admin(tenant, request.authorization)?;
            require_api_version(request)?;
            admin_dispatch(state, request, tenant)
        }
    }
}

fn admin_tenant(endpoint: &Endpoint) -> i64 {
    match endpoint {
        Endpoint::GetScaleSetByName { tenant }
        | Endpoint::GetScaleSetById { tenant, .. }
        | Endpoint::CreateScaleSet { tenant }
        | Endpoint::UpdateScaleSet { tenant, .. }
        | Endpoint::DeleteScaleSet { tenant, .. }
        | Endpoint::GetRunnerGroupByName { tenant }
        | Endpoint::GenerateJitConfig { tenant, .. }
        | Endpoint::GetRunnerById { tenant, .. }
        | Endpoint::GetRunnerByName { tenant }
        | Endpoint::RemoveRunner { tenant, .. }
        | Endpoint::CreateSession { tenant, .. }
        | Endpoint::RefreshSession { tenant, .. }
        | Endpoint::DeleteSession { tenant, .. }
        | Endpoint::AcquireJobs { tenant, .. }
        | Endpoint::AcquirableJobs { tenant, .. } => *tenant,
        Endpoint::InstallationToken { .. }
        | Endpoint::RegistrationToken { .. }
        | Endpoint::RunnerRegistration
        | Endpoint::ListRunJobs { .. }
        | Endpoint::RerunJob { .. }
        | Endpoint::GetMessage
        | Endpoint::DeleteMessage { .. } => 0,
    }
}

fn admin_dispatch(
    state: &mut State,
    request: &ApiRequest<'_>,
    tenant: i64,
) -> Result<Reply, Rejection> {
    let base_url = request.base_url;
    match request.endpoint {
        Endpoint::GetScaleSetByName { .. } => {
            let group = query_i64(request, "runnerGroupId")?.filter(|group| *group != 0);
            let sets = state.scale_sets_by_name(tenant, group, query(request, "name"));
            Ok(Reply::json(200, &ListEnvelope::from(sets)))
        }
        Endpoint::GetScaleSetById { scale_set, .. } => {
            Ok(Reply::json(200, &state.scale_set(tenant, *scale_set)?))
        }
        Endpoint::CreateScaleSet { .. } => {
            let input: ScaleSetInput = parse_json(request.body)?;
            Ok(Reply::json(200, &state.create_scale_set(tenant, input)?))
        }
        Endpoint::UpdateScaleSet { scale_set, .. } => {
            let input: ScaleSetInput = parse_json(request.body)?;
            Ok(Reply::json(
                200,
                &state.update_scale_set(tenant, *scale_set, input)?,
            ))
        }
        Endpoint::DeleteScaleSet { scale_set, .. } => {
            state.delete_scale_set(Some(tenant), *scale_set, false)?;
            Ok(Reply::empty(204))
        }
        Endpoint::GetRunnerGroupByName { .. } => {
            let groups = state.runner_groups(tenant, query(request, "groupName"));
            Ok(Reply::json(200, &ListEnvelope::from(groups)))
        }
        Endpoint::GenerateJitConfig { scale_set, .. } => {
            let input: JitRequest = parse_json(request.body)?;
            let response = state.generate_jit_config(
                tenant,
                *scale_set,
                input.name.as_deref(),
                input.work_folder.as_deref(),
                base_url,
            )?;
            Ok(Reply::json(200, &response))
        }
        Endpoint::GetRunnerById { runner, .. } => {
            Ok(Reply::json(200, &state.runner(tenant, *runner)?))
        }
        Endpoint::GetRunnerByName { .. } => {
            let runners = state.runners_by_name(tenant, query(request, "agentName"));
            Ok(Reply::json(200, &ListEnvelope::from(runners)))
        }
        Endpoint::RemoveRunner { runner, .. } => {
            state.remove_runner(tenant, *runner)?;
            Ok(Reply::empty(204))
        }
        Endpoint::CreateSession { scale_set, .. } => {
            let input: SessionInput = parse_json(request.body)?;
            let session =
                state.create_session(tenant, *scale_set, input.owner_name.as_deref(), base_url)?;
            Ok(Reply::json(200, &session))
        }
        Endpoint::RefreshSession {
            scale_set, session, ..
        } => Ok(Reply::json(
            200,
            &state.refresh_session(tenant, *scale_set, session, base_url)?,
        )),
        Endpoint::DeleteSession {
            scale_set, session, ..
        } => {
            state.delete_session(tenant, *scale_set, session)?;
            Ok(Reply::empty(204))
        }
        Endpoint::AcquirableJobs { scale_set, .. } => {
            let jobs = state.acquirable_jobs(tenant, *scale_set)?;
            if jobs.is_empty() {
                Ok(Reply::empty(204))
            } else {
                Ok(Reply::json(200, &ListEnvelope::from(jobs)))
            }
        }
        Endpoint::InstallationToken { .. }
        | Endpoint::RegistrationToken { .. }
        | Endpoint::RunnerRegistration
        | Endpoint::ListRunJobs { .. }
        | Endpoint::RerunJob { .. }
        | Endpoint::GetMessage
        | Endpoint::DeleteMessage { .. }
        | Endpoint::AcquireJobs { .. } => {
            Err(Rejection::new(500, "endpoint routed to the wrong handler"))
        }
    }
}

/// What a long poll waits on, once authorized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PollParams {
    /// Session id.
    pub session: String,
    /// `lastMessageId` (0 when absent).
    pub last_message_id: i64,
    /// `X-ScaleSetMaxCapacity`, when sent.
    pub max_capacity: Option<i64>,
}

/// Authorize a long poll and read its parameters.
pub fn prepare_poll(state: &mut State, request: &ApiRequest<'_>) -> Result<PollParams, Reply> {
    let prepare = |state: &mut State| -> Result<PollParams, Rejection> {
        let session = state.authorize_queue(request.authorization, query(request, "sessionId"))?;
        let last_message_id = query_i64(request, "lastMessageId")?.unwrap_or(0);
        let max_capacity = request
            .max_capacity
            .map(|value| {
                value
                    .trim()
                    .parse::<i64>()
                    .ok()
                    .filter(|capacity| *capacity >= 0)
                    .ok_or_else(|| {
                        bad_request(format!(
                            "X-ScaleSetMaxCapacity must be a non-negative integer, got {value:?}"
                        ))
                    })
            })
            .transpose()?;
        Ok(PollParams {
            session,
            last_message_id,
            max_capacity,
        })
    };
    prepare(state).map_err(|rejection| Reply::rejection(Surface::Queue, &rejection))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn type_key_is_short_name() {
        assert_eq!(type_key(exceptions::AGENT_EXISTS), "AgentExistsException");
        assert_eq!(type_key("Plain"), "Plain");
    }

    #[test]
    fn actions_rejection_has_exception_shape() {
        let reply = Reply::rejection(
            Surface::Actions,
            &Rejection::exception(409, exceptions::SESSION_CONFLICT, "busy"),
        );
        assert_eq!(reply.status, 409);
        let body: Value = serde_json::from_slice(&reply.body.unwrap()).unwrap();
        assert_eq!(body["typeName"], exceptions::SESSION_CONFLICT);
        assert_eq!(body["message"], "busy");
        assert_eq!(body["typeKey"], "RunnerScaleSetSessionConflictException");
    }

    #[test]
    fn github_rejection_has_message_and_docs() {
        let reply = Reply::rejection(Surface::GitHub, &Rejection::new(401, "Bad credentials"));
        let body: Value = serde_json::from_slice(&reply.body.unwrap()).unwrap();
        assert_eq!(body["message"], "Bad credentials");
        assert!(body["documentation_url"].is_string());
        assert!(body.get("typeName").is_none());
    }

    fn list_request<'a>(endpoint: &'a Endpoint, query: &'a [(String, String)]) -> ApiRequest<'a> {
        ApiRequest {
            endpoint,
            query,
            authorization: None,
            max_capacity: None,
            body: b"",
            base_url: "http://fake.test",
            path: "/api/v3/repos/o/r/actions/runs/9/jobs",
        }
    }

    #[test]
    fn run_jobs_query_defaults_clamps_and_refuses_unknown_filters() {
        let endpoint = Endpoint::ListRunJobs {
            owner: "o".into(),
            repository: "r".into(),
            run: 9,
        };
        let pairs = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect()
        };
        let none = pairs(&[]);
        assert_eq!(
            run_jobs_query(&list_request(&endpoint, &none)).unwrap(),
            RunJobsQuery::default()
        );
        let given = pairs(&[("filter", "all"), ("per_page", "500"), ("page", "3")]);
        assert_eq!(
            run_jobs_query(&list_request(&endpoint, &given)).unwrap(),
            RunJobsQuery {
                filter: RunJobsFilter::All,
                per_page: 100,
                page: 3
            }
        );
        let junk = pairs(&[("per_page", "0"), ("page", "x")]);
        assert_eq!(
            run_jobs_query(&list_request(&endpoint, &junk)).unwrap(),
            RunJobsQuery::default()
        );
        let bad = pairs(&[("filter", "newest")]);
        assert_eq!(
            run_jobs_query(&list_request(&endpoint, &bad))
                .unwrap_err()
                .status,
            422
        );
    }

    #[test]
    fn pagination_link_has_github_rels() {
        let endpoint = Endpoint::ListRunJobs {
            owner: "o".into(),
            repository: "r".into(),
            run: 9,
        };
        let query = vec![
            ("filter".to_owned(), "all".to_owned()),
            ("page".to_owned(), "2".to_owned()),
            ("per_page".to_owned(), "2".to_owned()),
        ];
        let request = list_request(&endpoint, &query);
        let url = |page: u32| {
            format!(
                "http://fake.test/api/v3/repos/o/r/actions/runs/9/jobs?filter=all&per_page=2&page={page}"
            )
        };
        assert_eq!(
            pagination_link(&request, 1, 3).unwrap(),
            format!("<{}>; rel=\"next\", <{}>; rel=\"last\"", url(2), url(3))
        );
        assert_eq!(
            pagination_link(&request, 2, 3).unwrap(),
            format!(
                "<{}>; rel=\"prev\", <{}>; rel=\"next\", <{}>; rel=\"last\", <{}>; rel=\"first\"",
                url(1),
                url(3),
                url(3),
                url(1)
            )
        );
        assert_eq!(
            pagination_link(&request, 3, 3).unwrap(),
            format!("<{}>; rel=\"prev\", <{}>; rel=\"first\"", url(2), url(1))
        );
        assert_eq!(pagination_link(&request, 1, 1), None);
    }

    #[test]
    fn injected_fault_carries_retry_after() {
        let reply = injected(
            Surface::Queue,
            InjectedError {
                status: 429,
                retry_after_secs: Some(2),
            },
        );
        assert_eq!((reply.status, reply.retry_after_secs), (429, Some(2)));
    }
}
