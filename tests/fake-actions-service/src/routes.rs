//! Maps a request line to the protocol endpoint it addresses, and names every endpoint for counters and faults.
//!
//! Routing is by hand rather than with axum's router because the fake must accept what real clients send:
//! duplicate slashes (ARC's older client builds `{tenant}//_apis/...`), an optional trailing slash (the runner
//! groups path is sent with one), and owner/repository names in any case.

use std::fmt;

use axum::http::Method;

/// Path prefix of the GitHub REST API in GHES form.
pub const GITHUB_API_PREFIX: &str = "api/v3";
/// First path segment of every Actions Service tenant URL: `{base}/tenant/{tenantId}/`.
pub const TENANT_SEGMENT: &str = "tenant";
/// Path of the message queue (long poll); acks append `/{messageId}`.
pub const QUEUE_PATH: &str = "broker/message";

/// Which of the three surfaces an endpoint belongs to (docs/reference/actions-service-protocol.md, "Surfaces").
/// Fault rules may target a whole surface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Surface {
    /// GitHub REST API (`/api/v3/...`).
    GitHub,
    /// Actions Service (`/tenant/{id}/_apis/...`).
    Actions,
    /// Message queue (`/broker/message`).
    Queue,
}

impl Surface {
    /// Stable name used in fault rules.
    pub fn name(self) -> &'static str {
        match self {
            Self::GitHub => "github",
            Self::Actions => "actions",
            Self::Queue => "queue",
        }
    }
}

/// The scope a config URL points at.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// `{base}/enterprises/{enterprise}`.
    Enterprise(String),
    /// `{base}/{organization}`.
    Organization(String),
    /// `{base}/{owner}/{repository}`.
    Repository {
        /// Owner (organization or user).
        owner: String,
        /// Repository name.
        repository: String,
    },
}

impl Scope {
    /// Scope of a config URL: leading/trailing `/` trimmed, then one path segment is an organization,
    /// two are an enterprise (`enterprises/x`) or a repository, anything else is invalid.
    pub fn from_config_url(config_url: &str) -> Option<Self> {
        let parsed = url::Url::parse(config_url.trim_matches('/')).ok()?;
        Self::from_path(parsed.path())
    }

    /// Scope from the path part of a config URL (`my-org`, `my-org/my-repo`, `enterprises/my-ent`).
    pub fn from_path(path: &str) -> Option<Self> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        match segments.as_slice() {
            [org] if !org.is_empty() => Some(Self::Organization((*org).to_owned())),
            [first, enterprise]
                if first.eq_ignore_ascii_case("enterprises") && !enterprise.is_empty() =>
            {
                Some(Self::Enterprise((*enterprise).to_owned()))
            }
            [owner, repository] if !owner.is_empty() && !repository.is_empty() => {
                Some(Self::Repository {
                    owner: (*owner).to_owned(),
                    repository: (*repository).to_owned(),
                })
            }
            _ => None,
        }
    }

    /// Case-insensitive identity of the scope: GitHub owner, repository and enterprise names are
    /// case-insensitive.
    pub fn key(&self) -> String {
        self.to_string().to_ascii_lowercase()
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Enterprise(name) => write!(f, "enterprises/{name}"),
            Self::Organization(name) => write!(f, "{name}"),
            Self::Repository { owner, repository } => write!(f, "{owner}/{repository}"),
        }
    }
}

/// A protocol endpoint with its path parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /api/v3/app/installations/{id}/access_tokens`.
    InstallationToken {
        /// Installation id as written in the path (validated by the handler).
        installation_id: String,
    },
    /// `POST /api/v3/{orgs|enterprises|repos}/.../actions/runners/registration-token`.
    RegistrationToken {
        /// Scope from the path.
        scope: Scope,
    },
    /// `POST /api/v3/actions/runner-registration`.
    RunnerRegistration,
    /// Get a scale set by name.
    GetScaleSetByName {
        /// Tenant id from the path.
        tenant: i64,
    },
    /// Get a scale set by id.
    GetScaleSetById {
        /// Tenant id.
        tenant: i64,
        /// Scale set id.
        scale_set: i64,
    },
    /// Create a scale set.
    CreateScaleSet {
        /// Tenant id.
        tenant: i64,
    },
    /// Update a scale set.
    UpdateScaleSet {
        /// Tenant id.
        tenant: i64,
        /// Scale set id.
        scale_set: i64,
    },
    /// Delete a scale set.
    DeleteScaleSet {
        /// Tenant id.
        tenant: i64,
        /// Scale set id.
        scale_set: i64,
    },
    /// Get a runner group by name.
    GetRunnerGroupByName {
        /// Tenant id.
        tenant: i64,
    },
    /// Generate a JIT config.
    GenerateJitConfig {
        /// Tenant id.
        tenant: i64,
        /// Scale set id.
        scale_set: i64,
    },
    /// Get a runner by id.
    GetRunnerById {
        /// Tenant id.
        tenant: i64,
        /// Runner id.
        runner: i64,
    },
    /// Get a runner by name.
    GetRunnerByName {
        /// Tenant id.
        tenant: i64,
    },
    /// Remove a runner.
    RemoveRunner {
        /// Tenant id.
        tenant: i64,
        /// Runner id.
        runner: i64,
    },
    /// Create a session.
    CreateSession {
        /// Tenant id.
        tenant: i64,
        /// Scale set id.
        scale_set: i64,
    },
    /// Refresh a session.
    RefreshSession {
        /// Tenant id.
        tenant: i64,
        /// Scale set id.
        scale_set: i64,
        /// Session id as written in the path.
        session: String,
    },
    /// Delete a session.
    DeleteSession {
        /// Tenant id.
        tenant: i64,
        /// Scale set id.
        scale_set: i64,
        /// Session id as written in the path.
        session: String,
    },
    /// Get a message (long poll).
    GetMessage,
    /// Acknowledge a message.
    DeleteMessage {
        /// Message id from the path.
        message: i64,
    },
    /// Acquire jobs (message-queue token).
    AcquireJobs {
        /// Tenant id.
        tenant: i64,
        /// Scale set id.
        scale_set: i64,
    },
    /// Acquirable jobs (ARC's older client only).
    AcquirableJobs {
        /// Tenant id.
        tenant: i64,
        /// Scale set id.
        scale_set: i64,
    },
    /// `GET /api/v3/repos/{owner}/{repo}/actions/runs/{run_id}/jobs`.
    ListRunJobs {
        /// Repository owner as written in the path.
        owner: String,
        /// Repository name as written in the path.
        repository: String,
        /// Workflow run id.
        run: i64,
    },
    /// `POST /api/v3/repos/{owner}/{repo}/actions/jobs/{job_id}/rerun`.
    RerunJob {
        /// Repository owner as written in the path.
        owner: String,
        /// Repository name as written in the path.
        repository: String,
        /// REST id of the job (one attempt).
        job: i64,
    },
}

/// Every endpoint name, in the order of the reference's endpoint table; counters report these keys.
pub const ENDPOINT_NAMES: [&str; 22] = [
    "installation_token",
    "registration_token",
    "runner_registration",
    "get_scale_set_by_name",
    "get_scale_set_by_id",
    "create_scale_set",
    "update_scale_set",
    "delete_scale_set",
    "get_runner_group_by_name",
    "generate_jit_config",
    "get_runner_by_id",
    "get_runner_by_name",
    "remove_runner",
    "create_session",
    "refresh_session",
    "delete_session",
    "get_message",
    "delete_message",
    "acquire_jobs",
    "acquirable_jobs",
    "list_run_jobs",
    "rerun_job",
];

impl Endpoint {
    /// Stable name for counters and fault rules (one of [`ENDPOINT_NAMES`]).
    pub fn name(&self) -> &'static str {
        match self {
            Self::InstallationToken { .. } => "installation_token",
            Self::RegistrationToken { .. } => "registration_token",
            Self::RunnerRegistration => "runner_registration",
            Self::GetScaleSetByName { .. } => "get_scale_set_by_name",
            Self::GetScaleSetById { .. } => "get_scale_set_by_id",
            Self::CreateScaleSet { .. } => "create_scale_set",
            Self::UpdateScaleSet { .. } => "update_scale_set",
            Self::DeleteScaleSet { .. } => "delete_scale_set",
            Self::GetRunnerGroupByName { .. } => "get_runner_group_by_name",
            Self::GenerateJitConfig { .. } => "generate_jit_config",
            Self::GetRunnerById { .. } => "get_runner_by_id",
            Self::GetRunnerByName { .. } => "get_runner_by_name",
            Self::RemoveRunner { .. } => "remove_runner",
            Self::CreateSession { .. } => "create_session",
            Self::RefreshSession { .. } => "refresh_session",
            Self::DeleteSession { .. } => "delete_session",
            Self::GetMessage => "get_message",
            Self::DeleteMessage { .. } => "delete_message",
            Self::AcquireJobs { .. } => "acquire_jobs",
            Self::AcquirableJobs { .. } => "acquirable_jobs",
            Self::ListRunJobs { .. } => "list_run_jobs",
            Self::RerunJob { .. } => "rerun_job",
        }
    }

    /// The surface the endpoint lives on.
    pub fn surface(&self) -> Surface {
        match self {
            Self::InstallationToken { .. }
            | Self::RegistrationToken { .. }
            | Self::RunnerRegistration
            | Self::ListRunJobs { .. }
            | Self::RerunJob { .. } => Surface::GitHub,
            Self::GetMessage | Self::DeleteMessage { .. } => Surface::Queue,
            _ => Surface::Actions,
        }
    }
}

/// Why a request matched no endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoRoute {
    /// The path is unknown on the surface it appears to address.
    NotFound(Option<Surface>),
    /// The path exists but not for this method.
    MethodNotAllowed(Surface),
}

/// Resolve a request to an endpoint. `path` is the raw URI path (without query).
pub fn route(method: &Method, path: &str) -> Result<Endpoint, NoRoute> {
    // Empty segments come from duplicate or trailing slashes; no endpoint has a meaningful empty segment.
    let segments: Vec<&str> = path
        .split('/')
        .filter(|segment| !segment.is_empty())
        .collect();
    match segments.as_slice() {
        ["api", "v3", rest @ ..] => route_github(method, rest),
        [tenant, id, "_apis", rest @ ..] if *tenant == TENANT_SEGMENT => {
            let Ok(tenant) = id.parse::<i64>() else {
                return Err(NoRoute::NotFound(Some(Surface::Actions)));
            };
            route_actions(method, tenant, rest)
        }
        ["broker", "message"] => only(method, Method::GET, Surface::Queue, Endpoint::GetMessage),
        ["broker", "message", id] => {
            let message = parse_id(id, Surface::Queue)?;
            only(
                method,
                Method::DELETE,
                Surface::Queue,
                Endpoint::DeleteMessage { message },
            )
        }
        _ => Err(NoRoute::NotFound(None)),
    }
}

fn parse_id(text: &str, surface: Surface) -> Result<i64, NoRoute> {
    text.parse::<i64>()
        .map_err(|_| NoRoute::NotFound(Some(surface)))
}

fn only(
    method: &Method,
    allowed: Method,
    surface: Surface,
    endpoint: Endpoint,
) -> Result<Endpoint, NoRoute> {
    if *method == allowed {
        Ok(endpoint)
    } else {
        Err(NoRoute::MethodNotAllowed(surface))
    }
}

fn route_github(method: &Method, rest: &[&str]) -> Result<Endpoint, NoRoute> {
    let surface = Surface::GitHub;
    let post = |endpoint| only(method, Method::POST, surface, endpoint);
    match rest {
        ["app", "installations", id, "access_tokens"] => post(Endpoint::InstallationToken {
            installation_id: (*id).to_owned(),
        }),
        ["orgs", org, "actions", "runners", "registration-token"] => {
            post(Endpoint::RegistrationToken {
                scope: Scope::Organization((*org).to_owned()),
            })
        }
        [
            "enterprises",
            enterprise,
            "actions",
            "runners",
            "registration-token",
        ] => post(Endpoint::RegistrationToken {
            scope: Scope::Enterprise((*enterprise).to_owned()),
        }),
        [
            "repos",
            owner,
            repository,
            "actions",
            "runners",
            "registration-token",
        ] => post(Endpoint::RegistrationToken {
            scope: Scope::Repository {
                owner: (*owner).to_owned(),
                repository: (*repository).to_owned(),
            },
        }),
        ["actions", "runner-registration"] => post(Endpoint::RunnerRegistration),
        ["repos", owner, repository, "actions", "runs", run, "jobs"] => {
            let run = parse_id(run, surface)?;
            only(
                method,
                Method::GET,
                surface,
                Endpoint::ListRunJobs {
                    owner: (*owner).to_owned(),
                    repository: (*repository).to_owned(),
                    run,
                },
            )
        }
        ["repos", owner, repository, "actions", "jobs", job, "rerun"] => {
            let job = parse_id(job, surface)?;
            post(Endpoint::RerunJob {
                owner: (*owner).to_owned(),
                repository: (*repository).to_owned(),
                job,
            })
        }
        _ => Err(NoRoute::NotFound(Some(surface))),
    }
}

fn route_actions(method: &Method, tenant: i64, rest: &[&str]) -> Result<Endpoint, NoRoute> {
    let surface = Surface::Actions;
    let not_allowed = Err(NoRoute::MethodNotAllowed(surface));
    match rest {
        ["runtime", "runnerscalesets"] => match *method {
            Method::GET => Ok(Endpoint::GetScaleSetByName { tenant }),
            Method::POST => Ok(Endpoint::CreateScaleSet { tenant }),
            _ => not_allowed,
        },
        ["runtime", "runnerscalesets", id, tail @ ..] => {
            let scale_set = parse_id(id, surface)?;
            match (tail, method.clone()) {
                ([], Method::GET) => Ok(Endpoint::GetScaleSetById { tenant, scale_set }),
                ([], Method::PATCH) => Ok(Endpoint::UpdateScaleSet { tenant, scale_set }),
                ([], Method::DELETE) => Ok(Endpoint::DeleteScaleSet { tenant, scale_set }),
                (["generatejitconfig"], Method::POST) => {
                    Ok(Endpoint::GenerateJitConfig { tenant, scale_set })
                }
                (["sessions"], Method::POST) => Ok(Endpoint::CreateSession { tenant, scale_set }),
                (["sessions", session], Method::PATCH) => Ok(Endpoint::RefreshSession {
                    tenant,
                    scale_set,
                    session: (*session).to_owned(),
                }),
                (["sessions", session], Method::DELETE) => Ok(Endpoint::DeleteSession {
                    tenant,
                    scale_set,
                    session: (*session).to_owned(),
                }),
                (["acquirejobs"], Method::POST) => Ok(Endpoint::AcquireJobs { tenant, scale_set }),
                (["acquirablejobs"], Method::GET) => {
                    Ok(Endpoint::AcquirableJobs { tenant, scale_set })
                }
                (
                    []
                    | ["generatejitconfig"]
                    | ["sessions"]
                    | ["sessions", _]
                    | ["acquirejobs"]
                    | ["acquirablejobs"],
                    _,
                ) => not_allowed,
                _ => Err(NoRoute::NotFound(Some(surface))),
            }
        }
        ["runtime", "runnergroups"] => only(
            method,
            Method::GET,
            surface,
            Endpoint::GetRunnerGroupByName { tenant },
        ),
        // The pool id is the literal 0 in both clients.
        ["distributedtask", "pools", "0", "agents"] => only(
            method,
            Method::GET,
            surface,
            Endpoint::GetRunnerByName { tenant },
        ),
        ["distributedtask", "pools", "0", "agents", id] => {
            let runner = parse_id(id, surface)?;
            match *method {
                Method::GET => Ok(Endpoint::GetRunnerById { tenant, runner }),
                Method::DELETE => Ok(Endpoint::RemoveRunner { tenant, runner }),
                _ => not_allowed,
            }
        }
        _ => Err(NoRoute::NotFound(Some(surface))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn config_url_scopes_follow_spec_table() {
        assert_eq!(
            Scope::from_config_url("https://github.com/org/repo/"),
            Some(Scope::Repository {
                owner: "org".into(),
                repository: "repo".into()
            })
        );
        assert_eq!(
            Scope::from_config_url("http://127.0.0.1:3000/my-org"),
            Some(Scope::Organization("my-org".into()))
        );
        assert_eq!(
            Scope::from_config_url("https://github.com/Enterprises/my-enterprise/"),
            Some(Scope::Enterprise("my-enterprise".into()))
        );
        for invalid in [
            "https://github.com",
            "https://github.com/",
            "https://github.com/some/random/path",
            "nope",
        ] {
            assert_eq!(Scope::from_config_url(invalid), None, "{invalid}");
        }
    }

    #[test]
    fn scope_key_is_case_insensitive() {
        let a = Scope::from_path("My-Org/Repo").unwrap();
        let b = Scope::from_path("my-org/repo").unwrap();
        assert_eq!(a.key(), b.key());
        assert_eq!(a.to_string(), "My-Org/Repo");
    }

    #[test]
    fn routes_github_surface() {
        assert_eq!(
            route(
                &Method::POST,
                "/api/v3/repos/o/r/actions/runners/registration-token"
            ),
            Ok(Endpoint::RegistrationToken {
                scope: Scope::Repository {
                    owner: "o".into(),
                    repository: "r".into()
                }
            })
        );
        assert_eq!(
            route(&Method::POST, "/api/v3/app/installations/42/access_tokens").map(|e| e.name()),
            Ok("installation_token")
        );
        assert_eq!(
            route(&Method::GET, "/api/v3/actions/runner-registration"),
            Err(NoRoute::MethodNotAllowed(Surface::GitHub))
        );
    }

    #[test]
    fn routes_run_jobs_and_rerun() {
        assert_eq!(
            route(
                &Method::GET,
                "/api/v3/repos/Octo/App/actions/runs/9000001/jobs/"
            ),
            Ok(Endpoint::ListRunJobs {
                owner: "Octo".into(),
                repository: "App".into(),
                run: 9_000_001
            })
        );
        assert_eq!(
            route(
                &Method::POST,
                "/api/v3/repos/o/r/actions/jobs/30000001/rerun"
            ),
            Ok(Endpoint::RerunJob {
                owner: "o".into(),
                repository: "r".into(),
                job: 30_000_001
            })
        );
        assert_eq!(
            route(&Method::POST, "/api/v3/repos/o/r/actions/runs/9/jobs"),
            Err(NoRoute::MethodNotAllowed(Surface::GitHub))
        );
        assert_eq!(
            route(&Method::GET, "/api/v3/repos/o/r/actions/jobs/7/rerun"),
            Err(NoRoute::MethodNotAllowed(Surface::GitHub))
        );
        assert_eq!(
            route(&Method::GET, "/api/v3/repos/o/r/actions/runs/x/jobs"),
            Err(NoRoute::NotFound(Some(Surface::GitHub)))
        );
        // The fake serves the GitHub API in GHES form only, as for every other GitHub endpoint.
        assert_eq!(
            route(&Method::GET, "/repos/o/r/actions/runs/9/jobs"),
            Err(NoRoute::NotFound(None))
        );
    }

    #[test]
    fn routes_tolerate_duplicate_and_trailing_slashes() {
        assert_eq!(
            route(
                &Method::POST,
                "/tenant/3//_apis/runtime/runnerscalesets/9/acquirejobs"
            ),
            Ok(Endpoint::AcquireJobs {
                tenant: 3,
                scale_set: 9
            })
        );
        assert_eq!(
            route(&Method::GET, "/tenant/3/_apis/runtime/runnergroups/"),
            Ok(Endpoint::GetRunnerGroupByName { tenant: 3 })
        );
    }

    #[test]
    fn routes_sessions_and_queue() {
        assert_eq!(
            route(
                &Method::PATCH,
                "/tenant/1/_apis/runtime/runnerscalesets/2/sessions/abc"
            ),
            Ok(Endpoint::RefreshSession {
                tenant: 1,
                scale_set: 2,
                session: "abc".into()
            })
        );
        assert_eq!(
            route(&Method::GET, "/broker/message"),
            Ok(Endpoint::GetMessage)
        );
        assert_eq!(
            route(&Method::DELETE, "/broker/message/17"),
            Ok(Endpoint::DeleteMessage { message: 17 })
        );
        assert_eq!(
            route(&Method::GET, "/broker/message/x"),
            Err(NoRoute::NotFound(Some(Surface::Queue)))
        );
    }

    #[test]
    fn routes_agents_with_literal_pool_zero() {
        assert_eq!(
            route(
                &Method::DELETE,
                "/tenant/1/_apis/distributedtask/pools/0/agents/5"
            ),
            Ok(Endpoint::RemoveRunner {
                tenant: 1,
                runner: 5
            })
        );
        assert_eq!(
            route(
                &Method::GET,
                "/tenant/1/_apis/distributedtask/pools/1/agents/5"
            ),
            Err(NoRoute::NotFound(Some(Surface::Actions)))
        );
    }

    #[test]
    fn every_endpoint_is_reachable_under_its_listed_name() {
        let requests = [
            (Method::POST, "/api/v3/app/installations/1/access_tokens"),
            (
                Method::POST,
                "/api/v3/orgs/o/actions/runners/registration-token",
            ),
            (Method::POST, "/api/v3/actions/runner-registration"),
            (Method::GET, "/tenant/1/_apis/runtime/runnerscalesets"),
            (Method::GET, "/tenant/1/_apis/runtime/runnerscalesets/2"),
            (Method::POST, "/tenant/1/_apis/runtime/runnerscalesets"),
            (Method::PATCH, "/tenant/1/_apis/runtime/runnerscalesets/2"),
            (Method::DELETE, "/tenant/1/_apis/runtime/runnerscalesets/2"),
            (Method::GET, "/tenant/1/_apis/runtime/runnergroups/"),
            (
                Method::POST,
                "/tenant/1/_apis/runtime/runnerscalesets/2/generatejitconfig",
            ),
            (
                Method::GET,
                "/tenant/1/_apis/distributedtask/pools/0/agents/3",
            ),
            (
                Method::GET,
                "/tenant/1/_apis/distributedtask/pools/0/agents",
            ),
            (
                Method::DELETE,
                "/tenant/1/_apis/distributedtask/pools/0/agents/3",
            ),
            (
                Method::POST,
                "/tenant/1/_apis/runtime/runnerscalesets/2/sessions",
            ),
            (
                Method::PATCH,
                "/tenant/1/_apis/runtime/runnerscalesets/2/sessions/s",
            ),
            (
                Method::DELETE,
                "/tenant/1/_apis/runtime/runnerscalesets/2/sessions/s",
            ),
            (Method::GET, "/broker/message"),
            (Method::DELETE, "/broker/message/4"),
            (
                Method::POST,
                "/tenant/1/_apis/runtime/runnerscalesets/2/acquirejobs",
            ),
            (
                Method::GET,
                "/tenant/1/_apis/runtime/runnerscalesets/2/acquirablejobs",
            ),
            (Method::GET, "/api/v3/repos/o/r/actions/runs/9/jobs"),
            (Method::POST, "/api/v3/repos/o/r/actions/jobs/7/rerun"),
        ];
        let names: Vec<&str> = requests
            .iter()
            .map(|(method, path)| {
                route(method, path)
                    .unwrap_or_else(|miss| panic!("{path}: {miss:?}"))
                    .name()
            })
            .collect();
        assert_eq!(names, ENDPOINT_NAMES.to_vec());
    }

    #[test]
    fn wrong_method_on_known_path_is_method_not_allowed() {
        assert_eq!(
            route(&Method::PUT, "/tenant/1/_apis/runtime/runnerscalesets/2"),
            Err(NoRoute::MethodNotAllowed(Surface::Actions))
        );
        assert_eq!(
            route(&Method::GET, "/elsewhere"),
            Err(NoRoute::NotFound(None))
        );
    }
}
