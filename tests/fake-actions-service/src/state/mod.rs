//! The fake's whole state and every operation on it, without HTTP: tenants and runner groups, scale sets,
//! sessions and their message queues, runners, jobs, tokens, counters and faults.
//!
//! Methods take parsed inputs and return wire types or a [`Rejection`]; the HTTP layer only extracts inputs
//! and encodes outputs. Times are milliseconds since the Unix epoch from a [`Clock`], so tests can move time.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::json;

use crate::auth::{self, AppKey};
use crate::config::{Config, JobDelivery};
use crate::control::{
    Counters, DropSessions, EnqueueJobs, ExpireTokens, JobState, JobView, RunnerGroupView,
    RunnerSelector, RunnerView, ScaleSetView, SessionView, StateSnapshot, TenantView, TokenKind,
};
use crate::error::{Error, Rejection, exceptions};
use crate::faults::{FaultDecision, FaultState, Faults};
use crate::rng::SplitMix64;
use crate::routes::{Endpoint, QUEUE_PATH, Scope, TENANT_SEGMENT};
use crate::wire::{
    AcquirableJobJson, JitResponse, JobMessage, Label, MessageJson, RunnerGroupJson,
    RunnerReferenceJson, RunnerRegistrationJson, RunnerSetting, ScaleSetInput, ScaleSetJson,
    SessionJson, Statistics, TokenJson,
};

mod runs;
#[cfg(test)]
mod tests;

pub use runs::{
    DEFAULT_PER_PAGE, MAX_PER_PAGE, RunJobsFilter, RunJobsPage, RunJobsQuery, github_conclusion,
    github_status,
};

/// The zero time of Go's `time.Time`, which the clients send and expect for "not yet".
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";
/// The only message type clients accept.
pub const MESSAGE_TYPE: &str = "RunnerScaleSetJobMessages";
const DEFAULT_GROUP_ID: i64 = 1;
/// Bounds one enqueue call, so a typo cannot make the fake allocate for minutes.
const MAX_JOBS_PER_ENQUEUE: u32 = 100_000;
const DEFAULT_GROUP_NAME: &str = "Default";

const JOB_AVAILABLE: &str = "JobAvailable";
const JOB_ASSIGNED: &str = "JobAssigned";
const JOB_STARTED: &str = "JobStarted";
const JOB_COMPLETED: &str = "JobCompleted";

/// Where "now" comes from.
#[derive(Clone, Copy, Debug)]
pub enum Clock {
    /// The system clock.
    System,
    /// A fixed time (milliseconds since the epoch) moved by tests.
    Manual(i64),
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms).map_or_else(|_| ZERO_TIME.to_owned(), |ts| ts.to_string())
}

fn rfc3339_or_zero(ms: Option<i64>) -> String {
    ms.map_or_else(|| ZERO_TIME.to_owned(), rfc3339)
}

fn unauthorized(message: &str) -> Rejection {
    Rejection::exception(401, exceptions::UNAUTHORIZED, message)
}

fn scale_set_not_found(id: i64) -> Rejection {
    Rejection::exception(
        404,
        exceptions::SCALE_SET_NOT_FOUND,
        format!("No runner scale set found with identifier {id}."),
    )
}

/// State-level settings derived from [`Config`].
#[derive(Clone, Debug)]
struct Settings {
    admin_token_lifetime: i64,
    queue_token_lifetime: i64,
    registration_token_lifetime: i64,
    session_idle_timeout: Option<i64>,
    runner_groups: Vec<String>,
    strict: Option<Strict>,
    auto_online_runners: bool,
    auto_start_jobs: bool,
    auto_complete_after: Option<i64>,
    runner_lost_timeout: Option<i64>,
    max_job_messages: usize,
    job_delivery: JobDelivery,
    reoffer_to_new_sessions: bool,
}

#[derive(Clone, Debug)]
struct Strict {
    pats: Vec<String>,
    apps: Vec<AppKey>,
}

#[derive(Clone, Debug)]
struct Group {
    id: i64,
    name: String,
}

#[derive(Clone, Debug)]
struct Tenant {
    id: i64,
    scope: Scope,
    config_url: Option<String>,
    service_url: Option<String>,
    groups: Vec<Group>,
}

#[derive(Clone, Debug)]
struct QueuedEvent {
    job: i64,
    message: JobMessage,
}

#[derive(Clone, Debug)]
struct StoredMessage {
    id: i64,
    events: Vec<QueuedEvent>,
}

#[derive(Clone, Debug, Default)]
struct Queue {
    /// Job messages not packed into a queue message yet.
    pending: Vec<QueuedEvent>,
    /// Packed messages not acknowledged yet, in id order.
    messages: Vec<StoredMessage>,
}

#[derive(Clone, Debug)]
struct ScaleSetRec {
    id: i64,
    tenant: i64,
    name: String,
    group: i64,
    labels: Vec<Label>,
    setting: RunnerSetting,
    created_ms: i64,
    queue: Queue,
}

#[derive(Clone, Debug)]
struct SessionRec {
    id: String,
    scale_set: i64,
    owner: String,
    last_seen_ms: i64,
    last_max_capacity: Option<i64>,
    polls: u64,
}

#[derive(Clone, Debug)]
struct RunnerRec {
    id: i64,
    name: String,
    tenant: i64,
    scale_set: i64,
    work_folder: String,
    online: bool,
    job: Option<i64>,
}

#[derive(Clone, Debug)]
struct JobRec {
    request_id: i64,
    job_id: String,
    tenant: i64,
    scale_set: Option<i64>,
    target_name: String,
    state: JobState,
    runner: Option<(i64, String)>,
    result: Option<String>,
    repository: String,
    owner: String,
    workflow_ref: String,
    display_name: String,
    workflow_run_id: i64,
    event_name: String,
    labels: Vec<String>,
    queue_ms: i64,
    scale_set_assign_ms: Option<i64>,
    runner_assign_ms: Option<i64>,
    finish_ms: Option<i64>,
    running_since_ms: Option<i64>,
    /// When its runner last renewed it (the start counts as a renewal).
    renewed_ms: Option<i64>,
    /// Failed because its runner stopped renewing it.
    runner_lost: bool,
    /// `JobAvailable` messages queued or delivered but not acknowledged; a new session re-offers an available
    /// job only when this is 0, so a listener that acked the offer and crashed before acquiring still gets it.
    offers_outstanding: u32,
    times_acquired: u32,
    times_started: u32,
    times_requeued: u32,
    /// Id of this attempt in the GitHub REST API (`/actions/jobs/{id}`), from its own range.
    rest_id: i64,
    /// Attempt of the workflow run this job belongs to (1, then one more per re-run in the run).
    run_attempt: u32,
    /// Request id of the attempt this one re-runs.
    rerun_of: Option<i64>,
    /// Request id of the attempt that re-ran this one (this one is then no longer the latest).
    next_attempt: Option<i64>,
    /// The re-run asked for debug logging.
    debug_logging: bool,
}

/// The whole state of a fake instance.
#[derive(Debug)]
pub struct State {
    settings: Settings,
    clock: Clock,
    rng: SplitMix64,
    admin_secret: Vec<u8>,
    tenants: BTreeMap<i64, Tenant>,
    scale_sets: BTreeMap<i64, ScaleSetRec>,
    sessions: BTreeMap<String, SessionRec>,
    runners: BTreeMap<i64, RunnerRec>,
    jobs: BTreeMap<i64, JobRec>,
    jit_configs: HashMap<String, i64>,
    /// JIT configs a runner has reported online with: the service takes each once.
    used_jit_configs: HashSet<String>,
    /// Reports refused because their JIT config had been used before.
    jit_config_reuses: u64,
    registration_tokens: HashMap<String, (String, i64)>,
    installation_tokens: HashMap<String, i64>,
    admin_tokens: HashMap<String, (i64, i64)>,
    queue_tokens: HashMap<String, (String, i64)>,
    counters: Counters,
    user_agents: BTreeMap<String, String>,
    faults: FaultState,
    next_tenant: i64,
    next_scale_set: i64,
    next_runner: i64,
    next_job: i64,
    next_run: i64,
    next_message: i64,
    next_rest_job: i64,
    /// REST id of a job attempt → its request id.
    rest_jobs: HashMap<i64, i64>,
    /// Workflow run id → request ids of its jobs, every attempt, in creation order.
    runs: HashMap<i64, Vec<i64>>,
    /// Jobs re-run through the REST API.
    job_reruns: u64,
}

impl State {
    /// A fresh state for `config`.
    pub fn new(config: &Config, clock: Clock) -> Result<Self, Error> {
        let strict = match &config.strict {
            Some(strict) => Some(Strict {
                pats: strict.pats.clone(),
                apps: auth::parse_apps(&strict.apps)?,
            }),
            None => None,
        };
        let seed = config.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_nanos() as u64)
        });
        let mut rng = SplitMix64::new(seed);
        let admin_secret = rng.bytes(32);
        Ok(Self {
            settings: Settings {
                admin_token_lifetime: millis(config.admin_token_lifetime),
                queue_token_lifetime: millis(config.message_queue_token_lifetime),
                registration_token_lifetime: millis(config.registration_token_lifetime),
                session_idle_timeout: config.session_idle_timeout.map(millis),
                runner_groups: config.runner_groups.clone(),
                strict,
                auto_online_runners: config.auto_online_runners,
                auto_start_jobs: config.auto_start_jobs,
                auto_complete_after: config.auto_complete_after.map(millis),
                runner_lost_timeout: config.runner_lost_timeout.map(millis),
                max_job_messages: config.max_job_messages_per_message.max(1),
                job_delivery: config.job_delivery,
                reoffer_to_new_sessions: config.reoffer_to_new_sessions,
            },
            clock,
            rng,
            admin_secret,
            tenants: BTreeMap::new(),
            scale_sets: BTreeMap::new(),
            sessions: BTreeMap::new(),
            runners: BTreeMap::new(),
            jobs: BTreeMap::new(),
            jit_configs: HashMap::new(),
            used_jit_configs: HashSet::new(),
            jit_config_reuses: 0,
            registration_tokens: HashMap::new(),
            installation_tokens: HashMap::new(),
            admin_tokens: HashMap::new(),
            queue_tokens: HashMap::new(),
            counters: Counters::new(),
            user_agents: BTreeMap::new(),
            faults: FaultState::default(),
            next_tenant: 1,
            // Distinct ranges per kind make a client that mixes ids up fail loudly instead of by luck.
            next_scale_set: 1,
            next_runner: 1001,
            next_job: 500_001,
            next_run: 9_000_001,
            next_message: 1,
            // REST job ids differ from request ids, as on GitHub, so a client sending one for the other fails.
            next_rest_job: 30_000_001,
            rest_jobs: HashMap::new(),
            runs: HashMap::new(),
            job_reruns: 0,
        })
    }

    /// Now, in milliseconds since the epoch.
    pub fn now_ms(&self) -> i64 {
        match self.clock {
            Clock::System => jiff::Timestamp::now().as_millisecond(),
            Clock::Manual(ms) => ms,
        }
    }

    /// Move a manual clock forward (no effect on the system clock).
    pub fn advance(&mut self, by: Duration) {
        if let Clock::Manual(ms) = &mut self.clock {
            *ms = ms.saturating_add(millis(by));
        }
    }

    fn fresh_id(counter: &mut i64) -> i64 {
        let id = *counter;
        *counter += 1;
        id
    }

    // ---------------------------------------------------------------------------------------------------------
    // Request accounting and faults.

    /// Count one request to `endpoint` and remember its `User-Agent`.
    pub fn record_call(&mut self, endpoint: &Endpoint, user_agent: Option<&str>) {
        *self.counters.entry(endpoint.name().to_owned()).or_default() += 1;
        if let Some(user_agent) = user_agent {
            self.user_agents
                .insert(endpoint.name().to_owned(), user_agent.to_owned());
        }
    }

    /// Requests per endpoint name.
    pub fn counters(&self) -> Counters {
        self.counters.clone()
    }

    /// Forget all counts.
    pub fn reset_counters(&mut self) {
        self.counters.clear();
    }

    /// Last `User-Agent` seen per endpoint name.
    pub fn user_agents(&self) -> BTreeMap<String, String> {
        self.user_agents.clone()
    }

    /// Decide injected latency and errors for one request.
    pub fn decide_fault(&mut self, endpoint: &Endpoint) -> FaultDecision {
        self.faults.decide(endpoint)
    }

    /// Replace the fault rules.
    pub fn set_faults(&mut self, faults: Faults) -> Result<(), Rejection> {
        self.faults.set(faults)
    }

    /// Current fault rules with remaining budgets.
    pub fn faults(&self) -> Faults {
        self.faults.current()
    }

    // ---------------------------------------------------------------------------------------------------------
    // Tenants.

    fn tenant_for_scope(&mut self, scope: &Scope) -> i64 {
        let key = scope.key();
        if let Some(tenant) = self
            .tenants
            .values()
            .find(|tenant| tenant.scope.key() == key)
        {
            return tenant.id;
        }
        let id = Self::fresh_id(&mut self.next_tenant);
        let mut groups = vec![Group {
            id: DEFAULT_GROUP_ID,
            name: DEFAULT_GROUP_NAME.to_owned(),
        }];
        for (index, name) in self.settings.runner_groups.iter().enumerate() {
            groups.push(Group {
                id: DEFAULT_GROUP_ID + 1 + index as i64,
                name: name.clone(),
            });
        }
        self.tenants.insert(
            id,
            Tenant {
                id,
                scope: scope.clone(),
                config_url: None,
                service_url: None,
                groups,
            },
        );
        id
    }

    /// Add a runner group to the tenant of `scope` (created if new). Adding an existing name returns it.
    pub fn add_runner_group(
        &mut self,
        scope: &str,
        name: &str,
    ) -> Result<RunnerGroupView, Rejection> {
        let scope = Scope::from_path(scope)
            .ok_or_else(|| Rejection::new(400, format!("invalid scope {scope:?}")))?;
        if name.trim().is_empty() {
            return Err(Rejection::new(400, "runner group name is empty"));
        }
        let tenant_id = self.tenant_for_scope(&scope);
        let tenant = self
            .tenants
            .get_mut(&tenant_id)
            .ok_or_else(|| Rejection::new(500, "tenant vanished"))?;
        let group = match tenant
            .groups
            .iter()
            .find(|group| group.name.eq_ignore_ascii_case(name))
        {
            Some(group) => group.clone(),
            None => {
                let id = tenant
                    .groups
                    .iter()
                    .map(|group| group.id)
                    .max()
                    .unwrap_or(0)
                    + 1;
                let group = Group {
                    id,
                    name: name.to_owned(),
                };
                tenant.groups.push(group.clone());
                group
            }
        };
        Ok(RunnerGroupView {
            id: group.id,
            name: group.name,
            is_default: group.id == DEFAULT_GROUP_ID,
        })
    }

    fn group_name(&self, tenant: i64, group: i64) -> String {
        self.tenants
            .get(&tenant)
            .and_then(|tenant| tenant.groups.iter().find(|g| g.id == group))
            .map(|group| group.name.clone())
            .unwrap_or_default()
    }

    // ---------------------------------------------------------------------------------------------------------
    // GitHub API: installation token, registration token, runner registration.

    fn strict(&self) -> Option<&Strict> {
        self.settings.strict.as_ref()
    }

    /// `POST /app/installations/{id}/access_tokens`: exchange an App JWT for an installation token.
    pub fn installation_token(
        &mut self,
        authorization: Option<&str>,
        installation_id: &str,
    ) -> Result<TokenJson, Rejection> {
        let installation_id = installation_id
            .parse::<i64>()
            .ok()
            .filter(|id| *id > 0)
            .ok_or_else(|| Rejection::new(404, "Not Found"))?;
        let jwt = auth::credential(authorization, &["Bearer"])
            .ok_or_else(|| Rejection::new(401, "A JSON web token could not be decoded"))?;
        let now = self.now_ms();
        if let Some(strict) = self.strict() {
            let app = auth::verify_app_jwt(jwt, &strict.apps, now / 1000)?;
            if !app.installation_ids.contains(&installation_id) {
                return Err(Rejection::new(404, "Not Found"));
            }
        }
        let token = format!("ghs_{}", self.rng.alphanumeric(36));
        let expires = now + self.settings.registration_token_lifetime;
        self.installation_tokens.insert(token.clone(), expires);
        Ok(TokenJson {
            token,
            expires_at: rfc3339(expires),
        })
    }

    /// Check the credential of a GitHub REST call made with a PAT or an installation token (`Bearer` or
    /// `token`): tokens this fake issued must be unexpired; unknown credentials pass only without strict mode
    /// (in strict mode they must be a configured PAT).
    pub fn authorize_github(&self, authorization: Option<&str>) -> Result<(), Rejection> {
        let credential = auth::credential(authorization, &["Bearer", "token"])
            .ok_or_else(|| Rejection::new(401, "Requires authentication"))?;
        let now = self.now_ms();
        let accepted = match self.installation_tokens.get(credential) {
            Some(expires) => *expires > now,
            None => self
                .strict()
                .is_none_or(|strict| strict.pats.iter().any(|pat| pat == credential)),
        };
        if accepted {
            Ok(())
        } else {
            Err(Rejection::new(401, "Bad credentials"))
        }
    }

    /// `POST /{scope}/actions/runners/registration-token` with a PAT or an installation token.
    pub fn registration_token(
        &mut self,
        authorization: Option<&str>,
        scope: &Scope,
    ) -> Result<TokenJson, Rejection> {
        self.authorize_github(authorization)?;
        let now = self.now_ms();
        let token = self.rng.alphanumeric(29).to_ascii_uppercase();
        let expires = now + self.settings.registration_token_lifetime;
        self.registration_tokens
            .insert(token.clone(), (scope.key(), expires));
        Ok(TokenJson {
            token,
            expires_at: rfc3339(expires),
        })
    }

    /// `POST /actions/runner-registration`: hand out the tenant's Actions Service URL and an admin token.
    /// `base_url` is the URL the fake is reached under (no trailing slash).
    pub fn runner_registration(
        &mut self,
        authorization: Option<&str>,
        body: &[u8],
        base_url: &str,
    ) -> Result<RunnerRegistrationJson, Rejection> {
        let token = auth::credential(authorization, &["RemoteAuth"])
            .ok_or_else(|| Rejection::new(401, "Requires authentication"))?;
        let input: crate::wire::RunnerRegistrationInput = serde_json::from_slice(body)
            .map_err(|_| Rejection::new(400, "Problems parsing JSON"))?;
        let config_url = input
            .url
            .filter(|url| !url.is_empty())
            .ok_or_else(|| Rejection::new(422, "url is missing"))?;
        if input.runner_event.as_deref() != Some("register") {
            return Err(Rejection::new(422, "runner_event must be \"register\""));
        }
        let scope = Scope::from_config_url(&config_url).ok_or_else(|| {
            Rejection::new(
                404,
                format!("{config_url} does not point to an enterprise, organization or repository"),
            )
        })?;
        let now = self.now_ms();
        let accepted = match self.registration_tokens.get(token) {
            Some((scope_key, expires)) => *scope_key == scope.key() && *expires > now,
            None => self.strict().is_none(),
        };
        if !accepted {
            return Err(Rejection::new(401, "Bad credentials"));
        }
        let tenant_id = self.tenant_for_scope(&scope);
        let service_url = format!("{base_url}/{TENANT_SEGMENT}/{tenant_id}/");
        if let Some(tenant) = self.tenants.get_mut(&tenant_id) {
            tenant.config_url = Some(config_url.trim_matches('/').to_owned());
            tenant.service_url = Some(service_url.clone());
        }
        let expires = now + self.settings.admin_token_lifetime;
        let nonce = self.rng.uuid();
        let token = auth::mint_admin_token(
            &self.admin_secret,
            tenant_id,
            &nonce,
            now / 1000,
            expires.div_euclid(1000),
        )?;
        self.admin_tokens
            .insert(token.clone(), (tenant_id, expires));
        Ok(RunnerRegistrationJson {
            url: service_url,
            token,
            token_schema: "OAuthAccessToken".to_owned(),
        })
    }

    // ---------------------------------------------------------------------------------------------------------
    // Actions Service endpoints (docs/reference/actions-service-protocol.md, "Endpoints").

    /// Check `Authorization: Bearer <admin token>` for a call on `tenant`.
    pub fn authorize_admin(
        &self,
        tenant: i64,
        authorization: Option<&str>,
    ) -> Result<(), Rejection> {
        let token = auth::credential(authorization, &["Bearer"])
            .ok_or_else(|| unauthorized("Authorization with a Bearer admin token is required."))?;
        match self.admin_tokens.get(token) {
            Some((owner, expires)) if *owner == tenant && *expires > self.now_ms() => Ok(()),
            Some((owner, _)) if *owner == tenant => {
                Err(unauthorized("The admin token has expired."))
            }
            _ => Err(unauthorized(
                "The admin token is not valid for this tenant.",
            )),
        }
    }

    fn scale_set_in(&self, tenant: i64, id: i64) -> Result<&ScaleSetRec, Rejection> {
        self.scale_sets
            .get(&id)
            .filter(|set| set.tenant == tenant)
            .ok_or_else(|| scale_set_not_found(id))
    }

    /// Statistics of a scale set, computed from jobs and runners.
    pub fn statistics(&self, scale_set: i64) -> Statistics {
        let mut stats = Statistics::default();
        for job in self
            .jobs
            .values()
            .filter(|job| job.scale_set == Some(scale_set))
        {
            match job.state {
                JobState::Available => stats.total_available_jobs += 1,
                JobState::Acquired | JobState::Assigned => {
                    stats.total_acquired_jobs += 1;
                    stats.total_assigned_jobs += 1;
                }
                JobState::Running => {
                    stats.total_assigned_jobs += 1;
                    stats.total_running_jobs += 1;
                }
                JobState::Queued | JobState::Completed => {}
            }
        }
        for runner in self
            .runners
            .values()
            .filter(|runner| runner.scale_set == scale_set)
        {
            stats.total_registered_runners += 1;
            if runner.job.is_some() {
                stats.total_busy_runners += 1;
            } else {
                stats.total_idle_runners += 1;
            }
        }
        stats
    }

    fn scale_set_json(&self, set: &ScaleSetRec) -> ScaleSetJson {
        let jit_url = self
            .tenants
            .get(&set.tenant)
            .and_then(|tenant| tenant.service_url.as_deref())
            .map(|url| {
                format!(
                    "{url}_apis/runtime/runnerscalesets/{}/generatejitconfig",
                    set.id
                )
            })
            .unwrap_or_default();
        ScaleSetJson {
            id: set.id,
            name: set.name.clone(),
            runner_group_id: set.group,
            runner_group_name: self.group_name(set.tenant, set.group),
            labels: set.labels.clone(),
            runner_setting: set.setting,
            created_on: rfc3339(set.created_ms),
            runner_jit_config_url: jit_url,
            statistics: self.statistics(set.id),
        }
    }

    /// Get a scale set by name: scale sets of a tenant filtered by name (case-insensitive) and runner group; both
    /// filters optional.
    pub fn scale_sets_by_name(
        &self,
        tenant: i64,
        group: Option<i64>,
        name: Option<&str>,
    ) -> Vec<ScaleSetJson> {
        self.scale_sets
            .values()
            .filter(|set| set.tenant == tenant)
            .filter(|set| group.is_none_or(|group| group == set.group))
            .filter(|set| name.is_none_or(|name| set.name.eq_ignore_ascii_case(name)))
            .map(|set| self.scale_set_json(set))
            .collect()
    }

    /// Get a scale set by id.
    pub fn scale_set(&self, tenant: i64, id: i64) -> Result<ScaleSetJson, Rejection> {
        Ok(self.scale_set_json(self.scale_set_in(tenant, id)?))
    }

    fn check_group(&self, tenant: i64, group: i64) -> Result<(), Rejection> {
        let known = self
            .tenants
            .get(&tenant)
            .is_some_and(|tenant| tenant.groups.iter().any(|g| g.id == group));
        if known {
            Ok(())
        } else {
            Err(Rejection::exception(
                404,
                exceptions::RUNNER_GROUP_NOT_FOUND,
                format!("No runner group found with identifier {group}."),
            ))
        }
    }

    fn check_name_free(
        &self,
        tenant: i64,
        group: i64,
        name: &str,
        except: Option<i64>,
    ) -> Result<(), Rejection> {
        let taken = self.scale_sets.values().any(|set| {
            set.tenant == tenant
                && set.group == group
                && Some(set.id) != except
                && set.name.eq_ignore_ascii_case(name)
        });
        if taken {
            Err(Rejection::exception(
                409,
                exceptions::SCALE_SET_EXISTS,
                format!(
                    "A runner scale set named '{name}' already exists in runner group {group}."
                ),
            ))
        } else {
            Ok(())
        }
    }

    /// Create a scale set. Names are unique within a runner group; a missing group means `Default`.
    pub fn create_scale_set(
        &mut self,
        tenant: i64,
        input: ScaleSetInput,
    ) -> Result<ScaleSetJson, Rejection> {
        let name = input
            .name
            .filter(|name| !name.trim().is_empty())
            .ok_or_else(|| {
                Rejection::exception(
                    400,
                    exceptions::ARGUMENT,
                    "The runner scale set name is required.",
                )
            })?;
        let group = input
            .runner_group_id
            .filter(|id| *id != 0)
            .unwrap_or(DEFAULT_GROUP_ID);
        self.check_group(tenant, group)?;
        self.check_name_free(tenant, group, &name, None)?;
        let labels = input
            .labels
            .filter(|labels| !labels.is_empty())
            .unwrap_or_else(|| vec![Label::system(&name)]);
        let id = Self::fresh_id(&mut self.next_scale_set);
        let set = ScaleSetRec {
            id,
            tenant,
            name: name.clone(),
            group,
            labels,
            setting: input.runner_setting.unwrap_or_default(),
            created_ms: self.now_ms(),
            queue: Queue::default(),
        };
        self.scale_sets.insert(id, set);
        // Jobs left behind by a deleted scale set of the same name target it now (jobs follow labels).
        let orphans: Vec<i64> = self
            .jobs
            .values()
            .filter(|job| {
                job.tenant == tenant
                    && job.state == JobState::Queued
                    && job.target_name.eq_ignore_ascii_case(&name)
            })
            .map(|job| job.request_id)
            .collect();
        for job_id in orphans {
            if let Some(job) = self.jobs.get_mut(&job_id) {
                job.scale_set = Some(id);
                job.state = JobState::Available;
            }
            self.offer(job_id);
        }
        self.scale_set(tenant, id)
    }

    /// Update a scale set: merge the fields that are present and not default.
    pub fn update_scale_set(
        &mut self,
        tenant: i64,
        id: i64,
        input: ScaleSetInput,
    ) -> Result<ScaleSetJson, Rejection> {
        let current = self.scale_set_in(tenant, id)?;
        let group = input
            .runner_group_id
            .filter(|id| *id != 0)
            .unwrap_or(current.group);
        let name = input
            .name
            .filter(|name| !name.trim().is_empty())
            .unwrap_or_else(|| current.name.clone());
        self.check_group(tenant, group)?;
        self.check_name_free(tenant, group, &name, Some(id))?;
        let set = self
            .scale_sets
            .get_mut(&id)
            .ok_or_else(|| scale_set_not_found(id))?;
        set.group = group;
        set.name = name;
        if let Some(labels) = input.labels.filter(|labels| !labels.is_empty()) {
            set.labels = labels;
        }
        if let Some(setting) = input.runner_setting {
            set.setting.disable_update |= setting.disable_update;
            set.setting.ephemeral |= setting.ephemeral;
            set.setting.is_elastic |= setting.is_elastic;
        }
        self.scale_set(tenant, id)
    }

    /// Delete a scale set, and the control API's server-side deletion (`tenant` = `None`). Refused while a runner of
    /// the set runs a job unless `force`; jobs not running go back to `queued`; runners and the session go away.
    pub fn delete_scale_set(
        &mut self,
        tenant: Option<i64>,
        id: i64,
        force: bool,
    ) -> Result<(), Rejection> {
        let set = match tenant {
            Some(tenant) => self.scale_set_in(tenant, id)?,
            None => self
                .scale_sets
                .get(&id)
                .ok_or_else(|| scale_set_not_found(id))?,
        };
        let name = set.name.clone();
        let running = self
            .jobs
            .values()
            .any(|job| job.scale_set == Some(id) && job.state == JobState::Running);
        if running && !force {
            return Err(Rejection::exception(
                400,
                exceptions::SCALE_SET_BUSY,
                format!(
                    "The runner scale set '{name}' has runners running jobs and cannot be deleted."
                ),
            ));
        }
        let now = self.now_ms();
        for job in self
            .jobs
            .values_mut()
            .filter(|job| job.scale_set == Some(id))
        {
            match job.state {
                JobState::Available | JobState::Acquired | JobState::Assigned => {
                    if job.state != JobState::Available {
                        job.times_requeued += 1;
                    }
                    job.state = JobState::Queued;
                    job.scale_set = None;
                    job.runner = None;
                    job.scale_set_assign_ms = None;
                    job.runner_assign_ms = None;
                    job.offers_outstanding = 0;
                }
                JobState::Running => {
                    job.state = JobState::Completed;
                    job.result = Some("canceled".to_owned());
                    job.finish_ms = Some(now);
                }
                JobState::Queued | JobState::Completed => {}
            }
        }
        self.runners.retain(|_, runner| runner.scale_set != id);
        self.sessions.retain(|_, session| session.scale_set != id);
        self.scale_sets.remove(&id);
        Ok(())
    }

    /// Get a runner group by name: groups of the tenant, by name (case-insensitive) or all.
    pub fn runner_groups(&self, tenant: i64, name: Option<&str>) -> Vec<RunnerGroupJson> {
        let Some(tenant) = self.tenants.get(&tenant) else {
            return Vec::new();
        };
        tenant
            .groups
            .iter()
            .filter(|group| name.is_none_or(|name| group.name.eq_ignore_ascii_case(name)))
            .map(|group| RunnerGroupJson {
                id: group.id,
                name: group.name.clone(),
                size: self
                    .runners
                    .values()
                    .filter(|runner| {
                        runner.tenant == tenant.id
                            && self
                                .scale_sets
                                .get(&runner.scale_set)
                                .is_some_and(|set| set.group == group.id)
                    })
                    .count() as i64,
                is_default_group: group.id == DEFAULT_GROUP_ID,
            })
            .collect()
    }

    /// Generate a JIT config: register a runner (offline until it reports in) and return its encoded JIT config.
    pub fn generate_jit_config(
        &mut self,
        tenant: i64,
        scale_set: i64,
        name: Option<&str>,
        work_folder: Option<&str>,
        base_url: &str,
    ) -> Result<JitResponse, Rejection> {
        let set = self.scale_set_in(tenant, scale_set)?;
        let disable_update = set.setting.disable_update;
        let name = name.filter(|name| !name.trim().is_empty()).ok_or_else(|| {
            Rejection::exception(400, exceptions::ARGUMENT, "The runner name is required.")
        })?;
        if self
            .runners
            .values()
            .any(|runner| runner.tenant == tenant && runner.name.eq_ignore_ascii_case(name))
        {
            return Err(Rejection::exception(
                409,
                exceptions::AGENT_EXISTS,
                format!("Runner '{name}' already exists."),
            ));
        }
        let tenant_rec = self.tenants.get(&tenant);
        let service_url = tenant_rec
            .and_then(|t| t.service_url.clone())
            .unwrap_or_default();
        let config_url = tenant_rec
            .and_then(|t| t.config_url.clone())
            .unwrap_or_default();
        let id = Self::fresh_id(&mut self.next_runner);
        let work_folder = work_folder.unwrap_or_default().to_owned();
        let runner_file = json!({
            "agentId": id,
            "agentName": name,
            "poolId": 0,
            "poolName": "Default",
            "serverUrl": service_url,
            "gitHubUrl": config_url,
            "workFolder": if work_folder.is_empty() { "_work" } else { &work_folder },
            "ephemeral": true,
            "disableUpdate": disable_update,
            "runnerScaleSetId": scale_set,
            // Lets a stand-in runner find the fake's control API to report itself online.
            "fakeControlUrl": format!("{base_url}/_fake"),
        });
        let credentials = json!({
            "scheme": "OAuth",
            "data": {
                "clientId": self.rng.uuid(),
                "authorizationUrl": format!("{service_url}_apis/oauth2/token"),
                "requireFipsCryptography": "False",
            },
        });
        let encode = |value: &serde_json::Value| BASE64.encode(value.to_string());
        let outer = json!({
            ".runner": encode(&runner_file),
            ".credentials": encode(&credentials),
            ".credentials_rsaparams": BASE64.encode(self.rng.bytes(48)),
        });
        let encoded = encode(&outer);
        self.runners.insert(
            id,
            RunnerRec {
                id,
                name: name.to_owned(),
                tenant,
                scale_set,
                work_folder,
                online: self.settings.auto_online_runners,
                job: None,
            },
        );
        self.jit_configs.insert(encoded.clone(), id);
        if self.settings.auto_online_runners {
            self.dispatch(scale_set);
        }
        Ok(JitResponse {
            runner: RunnerReferenceJson {
                id,
                name: name.to_owned(),
                runner_scale_set_id: scale_set,
            },
            encoded_jit_config: encoded,
        })
    }

    fn runner_json(runner: &RunnerRec) -> RunnerReferenceJson {
        RunnerReferenceJson {
            id: runner.id,
            name: runner.name.clone(),
            runner_scale_set_id: runner.scale_set,
        }
    }

    /// Get a runner by id.
    pub fn runner(&self, tenant: i64, id: i64) -> Result<RunnerReferenceJson, Rejection> {
        self.runners
            .get(&id)
            .filter(|runner| runner.tenant == tenant)
            .map(Self::runner_json)
            .ok_or_else(|| {
                Rejection::exception(
                    404,
                    exceptions::AGENT_NOT_FOUND,
                    format!("No runner found with identifier {id}."),
                )
            })
    }

    /// Get a runner by name (case-insensitive).
    pub fn runners_by_name(&self, tenant: i64, name: Option<&str>) -> Vec<RunnerReferenceJson> {
        self.runners
            .values()
            .filter(|runner| runner.tenant == tenant)
            .filter(|runner| name.is_none_or(|name| runner.name.eq_ignore_ascii_case(name)))
            .map(Self::runner_json)
            .collect()
    }

    /// Remove a runner: 204 also for unknown runners; refused while the runner holds a job.
    pub fn remove_runner(&mut self, tenant: i64, id: i64) -> Result<(), Rejection> {
        let Some(runner) = self
            .runners
            .get(&id)
            .filter(|runner| runner.tenant == tenant)
        else {
            return Ok(());
        };
        if let Some(job) = runner.job {
            return Err(Rejection::exception(
                400,
                exceptions::JOB_STILL_RUNNING,
                format!("Runner '{}' is still running job {job}.", runner.name),
            ));
        }
        self.runners.remove(&id);
        Ok(())
    }

    // ---------------------------------------------------------------------------------------------------------
    // Sessions and the message queue (docs/reference/actions-service-protocol.md, "Message sessions").

    fn expire_idle_sessions(&mut self) {
        if let Some(idle) = self.settings.session_idle_timeout {
            let now = self.now_ms();
            self.sessions
                .retain(|_, session| now - session.last_seen_ms <= idle);
        }
    }

    fn issue_queue_token(&mut self, session: &str) -> String {
        let token = format!("mq_{}", self.rng.alphanumeric(40));
        let expires = self.now_ms() + self.settings.queue_token_lifetime;
        self.queue_tokens
            .insert(token.clone(), (session.to_owned(), expires));
        token
    }

    fn session_json(
        &self,
        session: &SessionRec,
        token: String,
        base_url: &str,
    ) -> Result<SessionJson, Rejection> {
        let set = self
            .scale_sets
            .get(&session.scale_set)
            .ok_or_else(|| scale_set_not_found(session.scale_set))?;
        Ok(SessionJson {
            session_id: session.id.clone(),
            owner_name: session.owner.clone(),
            runner_scale_set: self.scale_set_json(set),
            message_queue_url: format!("{base_url}/{QUEUE_PATH}?sessionId={}", session.id),
            message_queue_access_token: token,
            statistics: self.statistics(set.id),
        })
    }

    /// Create a session: one active session per scale set; a second one gets 409.
    pub fn create_session(
        &mut self,
        tenant: i64,
        scale_set: i64,
        owner: Option<&str>,
        base_url: &str,
    ) -> Result<SessionJson, Rejection> {
        let set_name = self.scale_set_in(tenant, scale_set)?.name.clone();
        self.expire_idle_sessions();
        if self
            .sessions
            .values()
            .any(|session| session.scale_set == scale_set)
        {
            return Err(Rejection::exception(
                409,
                exceptions::SESSION_CONFLICT,
                format!("The actions runner scaleset {set_name} already has an active session."),
            ));
        }
        let id = self.rng.uuid();
        let session = SessionRec {
            id: id.clone(),
            scale_set,
            owner: owner.unwrap_or_default().to_owned(),
            last_seen_ms: self.now_ms(),
            last_max_capacity: None,
            polls: 0,
        };
        self.sessions.insert(id.clone(), session.clone());
        // Re-offer available jobs whose offer was acknowledged but never acquired (e.g. the previous listener
        // acked and crashed): a new listener would otherwise never hear of them.
        let unoffered: Vec<i64> = self
            .jobs
            .values()
            .filter(|_| self.settings.reoffer_to_new_sessions)
            .filter(|job| {
                job.scale_set == Some(scale_set)
                    && job.state == JobState::Available
                    && job.offers_outstanding == 0
            })
            .map(|job| job.request_id)
            .collect();
        for job in unoffered {
            self.emit(job, JOB_AVAILABLE);
        }
        let token = self.issue_queue_token(&id);
        self.session_json(&session, token, base_url)
    }

    fn session_of(&self, scale_set: i64, session: &str) -> Option<&SessionRec> {
        self.sessions
            .get(&session.to_ascii_lowercase())
            .filter(|rec| rec.scale_set == scale_set)
    }

    /// Refresh a session: a new message-queue token; 404 when the session is gone.
    pub fn refresh_session(
        &mut self,
        tenant: i64,
        scale_set: i64,
        session: &str,
        base_url: &str,
    ) -> Result<SessionJson, Rejection> {
        self.scale_set_in(tenant, scale_set)?;
        self.expire_idle_sessions();
        let now = self.now_ms();
        let Some(rec) = self.session_of(scale_set, session).cloned() else {
            return Err(Rejection::exception(
                404,
                exceptions::RUNNER_ADMIN,
                format!("Runner referenced a session ID that doesn't exist: {session}"),
            ));
        };
        if let Some(stored) = self.sessions.get_mut(&rec.id) {
            stored.last_seen_ms = now;
        }
        let token = self.issue_queue_token(&rec.id);
        self.session_json(&rec, token, base_url)
    }

    /// Delete a session.
    pub fn delete_session(
        &mut self,
        tenant: i64,
        scale_set: i64,
        session: &str,
    ) -> Result<(), Rejection> {
        self.scale_set_in(tenant, scale_set)?;
        let Some(id) = self
            .session_of(scale_set, session)
            .map(|rec| rec.id.clone())
        else {
            return Err(Rejection::exception(
                400,
                exceptions::SESSION_EXPIRED,
                format!("The session identifier {session} is not valid."),
            ));
        };
        self.sessions.remove(&id);
        self.queue_tokens.retain(|_, (owner, _)| *owner != id);
        Ok(())
    }

    /// Check `Authorization: Bearer <message queue token>` (get message, acknowledge, acquire jobs) and return the
    /// session id. A token of a dropped, deleted or idle-expired session gets the same 401 as an expired one, so the
    /// client refreshes and then learns from the refresh's 404 that the session is gone.
    pub fn authorize_queue(
        &mut self,
        authorization: Option<&str>,
        session_hint: Option<&str>,
    ) -> Result<String, Rejection> {
        self.expire_idle_sessions();
        let token = auth::credential(authorization, &["Bearer"]).ok_or_else(|| {
            unauthorized("Authorization with a Bearer message queue token is required.")
        })?;
        let now = self.now_ms();
        let session = match self.queue_tokens.get(token) {
            Some((session, expires)) if *expires > now && self.sessions.contains_key(session) => {
                session.clone()
            }
            Some(_) => return Err(unauthorized("The message queue access token has expired.")),
            None => return Err(unauthorized("The message queue access token is not valid.")),
        };
        if session_hint.is_some_and(|hint| !hint.eq_ignore_ascii_case(&session)) {
            return Err(unauthorized(
                "The message queue access token belongs to another session.",
            ));
        }
        Ok(session)
    }

    /// Get a message, one attempt: the first unacknowledged message after `last_message_id`, else a new message
    /// packed from pending job messages, else `None` (the caller waits and tries again, then answers 202).
    pub fn poll_message(
        &mut self,
        session: &str,
        last_message_id: i64,
        max_capacity: Option<i64>,
    ) -> Result<Option<MessageJson>, Rejection> {
        let now = self.now_ms();
        let rec = self
            .sessions
            .get_mut(session)
            .ok_or_else(|| unauthorized("The message session is gone."))?;
        rec.last_seen_ms = now;
        rec.polls += 1;
        if max_capacity.is_some() {
            rec.last_max_capacity = max_capacity;
        }
        let scale_set = rec.scale_set;
        let max = self.settings.max_job_messages;
        let next_id = self.next_message;
        let set = self
            .scale_sets
            .get_mut(&scale_set)
            .ok_or_else(|| unauthorized("The message session is gone."))?;
        let queue = &mut set.queue;
        let message = match queue
            .messages
            .iter()
            .find(|message| message.id > last_message_id)
        {
            Some(message) => message.clone(),
            None if !queue.pending.is_empty() => {
                let take = queue.pending.len().min(max);
                let events: Vec<QueuedEvent> = queue.pending.drain(..take).collect();
                let message = StoredMessage {
                    id: next_id,
                    events,
                };
                queue.messages.push(message.clone());
                self.next_message += 1;
                message
            }
            None => return Ok(None),
        };
        let messages: Vec<&JobMessage> =
            message.events.iter().map(|event| &event.message).collect();
        let body = serde_json::to_string(&messages).map_err(|error| {
            Rejection::new(500, format!("encoding job messages failed: {error}"))
        })?;
        Ok(Some(MessageJson {
            message_id: message.id,
            message_type: MESSAGE_TYPE.to_owned(),
            body,
            statistics: self.statistics(scale_set),
        }))
    }

    /// Acknowledge a message; acknowledging it again is fine, an id never issued is 404.
    pub fn ack_message(&mut self, session: &str, message_id: i64) -> Result<(), Rejection> {
        let scale_set = self
            .sessions
            .get(session)
            .map(|rec| rec.scale_set)
            .ok_or_else(|| unauthorized("The message session is gone."))?;
        let set = self
            .scale_sets
            .get_mut(&scale_set)
            .ok_or_else(|| scale_set_not_found(scale_set))?;
        let Some(index) = set
            .queue
            .messages
            .iter()
            .position(|message| message.id == message_id)
        else {
            return if message_id > 0 && message_id < self.next_message {
                Ok(())
            } else {
                Err(Rejection::exception(
                    404,
                    exceptions::RESOURCE_NOT_FOUND,
                    format!("Message {message_id} was not found."),
                ))
            };
        };
        let message = set.queue.messages.remove(index);
        for event in message.events {
            if event.message.message_type == JOB_AVAILABLE
                && let Some(job) = self.jobs.get_mut(&event.job)
            {
                job.offers_outstanding = job.offers_outstanding.saturating_sub(1);
            }
        }
        Ok(())
    }

    /// Acquire jobs: takes the requested jobs that are available in the session's scale set; returns the ids actually
    /// acquired.
    pub fn acquire_jobs(
        &mut self,
        tenant: i64,
        scale_set: i64,
        session: &str,
        ids: &[i64],
    ) -> Result<Vec<i64>, Rejection> {
        self.scale_set_in(tenant, scale_set)?;
        if self
            .sessions
            .get(session)
            .is_none_or(|rec| rec.scale_set != scale_set)
        {
            return Err(unauthorized(
                "The message queue access token is not valid for this scale set.",
            ));
        }
        let now = self.now_ms();
        let mut acquired = Vec::new();
        for id in ids {
            let Some(job) = self.jobs.get_mut(id) else {
                continue;
            };
            if job.scale_set != Some(scale_set) || job.state != JobState::Available {
                continue;
            }
            job.state = JobState::Acquired;
            job.scale_set_assign_ms = Some(now);
            job.times_acquired += 1;
            acquired.push(*id);
            self.emit(*id, JOB_ASSIGNED);
        }
        self.dispatch(scale_set);
        Ok(acquired)
    }

    /// Acquirable jobs: the available jobs of a scale set.
    pub fn acquirable_jobs(
        &self,
        tenant: i64,
        scale_set: i64,
    ) -> Result<Vec<AcquirableJobJson>, Rejection> {
        self.scale_set_in(tenant, scale_set)?;
        Ok(self
            .jobs
            .values()
            .filter(|job| job.scale_set == Some(scale_set) && job.state == JobState::Available)
            .map(|job| {
                let message = self.job_message(job, JOB_AVAILABLE);
                AcquirableJobJson {
                    acquire_job_url: message.acquire_job_url.unwrap_or_default(),
                    message_type: JOB_AVAILABLE.to_owned(),
                    runner_request_id: job.request_id,
                    repository_name: job.repository.clone(),
                    owner_name: job.owner.clone(),
                    job_workflow_ref: job.workflow_ref.clone(),
                    event_name: job.event_name.clone(),
                    request_labels: job.labels.clone(),
                }
            })
            .collect())
    }

    // ---------------------------------------------------------------------------------------------------------
    // Jobs and runners: the life cycle driven by the control API.

    fn job_message(&self, job: &JobRec, kind: &str) -> JobMessage {
        let acquire_job_url = (kind == JOB_AVAILABLE).then(|| {
            let service_url = self
                .tenants
                .get(&job.tenant)
                .and_then(|tenant| tenant.service_url.clone())
                .unwrap_or_default();
            format!(
                "{service_url}_apis/runtime/runnerscalesets/{}/acquirejobs",
                job.scale_set.unwrap_or_default()
            )
        });
        let with_runner = kind == JOB_STARTED || kind == JOB_COMPLETED;
        JobMessage {
            message_type: kind.to_owned(),
            acquire_job_url,
            runner_request_id: job.request_id,
            repository_name: job.repository.clone(),
            owner_name: job.owner.clone(),
            job_id: job.job_id.clone(),
            job_workflow_ref: job.workflow_ref.clone(),
            job_display_name: job.display_name.clone(),
            workflow_run_id: job.workflow_run_id,
            event_name: job.event_name.clone(),
            request_labels: job.labels.clone(),
            queue_time: rfc3339(job.queue_ms),
            scale_set_assign_time: rfc3339_or_zero(job.scale_set_assign_ms),
            runner_assign_time: rfc3339_or_zero(job.runner_assign_ms),
            finish_time: rfc3339_or_zero(job.finish_ms),
            runner_id: job
                .runner
                .as_ref()
                .filter(|_| with_runner)
                .map(|(id, _)| *id),
            runner_name: job
                .runner
                .as_ref()
                .filter(|_| with_runner)
                .map(|(_, name)| name.clone()),
            result: if kind == JOB_COMPLETED {
                job.result.clone()
            } else {
                None
            },
        }
    }

    /// Hands a job that is its scale set's to take to the scale set's listener: offered (`JobAvailable`, to be
    /// acquired), or, when the service assigns jobs directly (github.com), assigned to the scale set at once
    /// (`JobAssigned`) and given to an idle online runner if there is one.
    fn offer(&mut self, job_id: i64) {
        if self.settings.job_delivery == JobDelivery::Acquire {
            self.emit(job_id, JOB_AVAILABLE);
            return;
        }
        let now = self.now_ms();
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        let Some(scale_set) = job.scale_set else {
            return;
        };
        job.state = JobState::Acquired;
        job.scale_set_assign_ms = Some(now);
        self.emit(job_id, JOB_ASSIGNED);
        self.dispatch(scale_set);
    }

    /// Queue a job message of `kind` for the job's scale set.
    fn emit(&mut self, job_id: i64, kind: &str) {
        let Some(job) = self.jobs.get(&job_id) else {
            return;
        };
        let Some(scale_set) = job.scale_set else {
            return;
        };
        let message = self.job_message(job, kind);
        let Some(set) = self.scale_sets.get_mut(&scale_set) else {
            return;
        };
        set.queue.pending.push(QueuedEvent {
            job: job_id,
            message,
        });
        if kind == JOB_AVAILABLE
            && let Some(job) = self.jobs.get_mut(&job_id)
        {
            job.offers_outstanding += 1;
        }
    }

    /// Give acquired jobs (oldest first) to idle online runners (lowest id first) of the scale set.
    fn dispatch(&mut self, scale_set: i64) {
        let now = self.now_ms();
        loop {
            let job = self
                .jobs
                .values()
                .find(|job| job.scale_set == Some(scale_set) && job.state == JobState::Acquired)
                .map(|job| job.request_id);
            let runner = self
                .runners
                .values()
                .find(|runner| {
                    runner.scale_set == scale_set && runner.online && runner.job.is_none()
                })
                .map(|runner| (runner.id, runner.name.clone()));
            let (Some(job_id), Some((runner_id, runner_name))) = (job, runner) else {
                return;
            };
            if let Some(runner) = self.runners.get_mut(&runner_id) {
                runner.job = Some(job_id);
            }
            if let Some(job) = self.jobs.get_mut(&job_id) {
                job.state = JobState::Assigned;
                job.runner = Some((runner_id, runner_name));
                job.runner_assign_ms = Some(now);
            }
            if self.settings.auto_start_jobs {
                self.begin_job(job_id);
            }
        }
    }

    fn begin_job(&mut self, job_id: i64) {
        let now = self.now_ms();
        if let Some(job) = self.jobs.get_mut(&job_id) {
            job.state = JobState::Running;
            job.times_started += 1;
            job.running_since_ms = Some(now);
            job.renewed_ms = Some(now);
        }
        self.emit(job_id, JOB_STARTED);
    }

    fn resolve_scale_set(
        &self,
        id: Option<i64>,
        name: Option<&str>,
        scope: Option<&str>,
    ) -> Result<i64, Rejection> {
        if let Some(id) = id {
            return self
                .scale_sets
                .contains_key(&id)
                .then_some(id)
                .ok_or_else(|| Rejection::new(404, format!("no scale set with id {id}")));
        }
        let name = name.ok_or_else(|| Rejection::new(400, "give scaleSetId or scaleSetName"))?;
        let scope_key = match scope {
            Some(scope) => Some(
                Scope::from_path(scope)
                    .ok_or_else(|| Rejection::new(400, format!("invalid scope {scope:?}")))?
                    .key(),
            ),
            None => None,
        };
        let matches: Vec<i64> = self
            .scale_sets
            .values()
            .filter(|set| set.name.eq_ignore_ascii_case(name))
            .filter(|set| {
                scope_key.as_ref().is_none_or(|key| {
                    self.tenants
                        .get(&set.tenant)
                        .is_some_and(|tenant| tenant.scope.key() == *key)
                })
            })
            .map(|set| set.id)
            .collect();
        match matches.as_slice() {
            [id] => Ok(*id),
            [] => Err(Rejection::new(404, format!("no scale set named {name:?}"))),
            _ => Err(Rejection::new(
                409,
                format!("several scale sets are named {name:?}; give the scope"),
            )),
        }
    }

    /// Enqueue jobs (one workflow run) for a scale set; each is offered with `JobAvailable`, or assigned at once when
    /// the service assigns directly ([`JobDelivery::Direct`]).
    pub fn enqueue_jobs(&mut self, request: &EnqueueJobs) -> Result<Vec<i64>, Rejection> {
        if request.count > MAX_JOBS_PER_ENQUEUE {
            return Err(Rejection::new(
                400,
                format!("count {} is above {MAX_JOBS_PER_ENQUEUE}", request.count),
            ));
        }
        let scale_set = self.resolve_scale_set(
            request.scale_set_id,
            request.scale_set_name.as_deref(),
            request.scope.as_deref(),
        )?;
        let set = self
            .scale_sets
            .get(&scale_set)
            .ok_or_else(|| scale_set_not_found(scale_set))?;
        let (tenant, set_name) = (set.tenant, set.name.clone());
        let (default_owner, default_repository) = match self.tenants.get(&tenant).map(|t| &t.scope)
        {
            Some(Scope::Repository { owner, repository }) => (owner.clone(), repository.clone()),
            Some(Scope::Organization(name) | Scope::Enterprise(name)) => {
                (name.clone(), "repo".to_owned())
            }
            None => ("owner".to_owned(), "repo".to_owned()),
        };
        let owner = request.owner.clone().unwrap_or(default_owner);
        let repository = request.repository.clone().unwrap_or(default_repository);
        let workflow_ref = request.workflow_ref.clone().unwrap_or_else(|| {
            format!("{owner}/{repository}/.github/workflows/ci.yml@refs/heads/main")
        });
        let labels = request
            .labels
            .clone()
            .unwrap_or_else(|| vec![set_name.clone()]);
        let display = request
            .display_name
            .clone()
            .unwrap_or_else(|| "job".to_owned());
        let run = Self::fresh_id(&mut self.next_run);
        let now = self.now_ms();
        let mut ids = Vec::new();
        for index in 1..=request.count.max(1) {
            let request_id = Self::fresh_id(&mut self.next_job);
            let rest_id = Self::fresh_id(&mut self.next_rest_job);
            let job = JobRec {
                request_id,
                job_id: self.rng.uuid(),
                tenant,
                scale_set: Some(scale_set),
                target_name: set_name.clone(),
                state: JobState::Available,
                runner: None,
                result: None,
                repository: repository.clone(),
                owner: owner.clone(),
                workflow_ref: workflow_ref.clone(),
                display_name: format!("{display}-{index}"),
                workflow_run_id: run,
                event_name: request
                    .event_name
                    .clone()
                    .unwrap_or_else(|| "push".to_owned()),
                labels: labels.clone(),
                queue_ms: now,
                scale_set_assign_ms: None,
                runner_assign_ms: None,
                finish_ms: None,
                running_since_ms: None,
                renewed_ms: None,
                runner_lost: false,
                offers_outstanding: 0,
                times_acquired: 0,
                times_started: 0,
                times_requeued: 0,
                rest_id,
                run_attempt: 1,
                rerun_of: None,
                next_attempt: None,
                debug_logging: false,
            };
            self.jobs.insert(request_id, job);
            self.rest_jobs.insert(rest_id, request_id);
            self.runs.entry(run).or_default().push(request_id);
            self.offer(request_id);
            ids.push(request_id);
        }
        Ok(ids)
    }

    fn job_mut(&mut self, id: i64) -> Result<&mut JobRec, Rejection> {
        self.jobs
            .get_mut(&id)
            .ok_or_else(|| Rejection::new(404, format!("no job with request id {id}")))
    }

    /// Start a job its runner holds (`JobStarted`).
    pub fn start_job(&mut self, id: i64) -> Result<JobView, Rejection> {
        let state = self.job_mut(id)?.state;
        if state != JobState::Assigned {
            return Err(Rejection::new(
                409,
                format!("job {id} is {state:?}; only a job assigned to a runner can start"),
            ));
        }
        self.begin_job(id);
        self.job_view(id)
    }

    /// The runner running the job renews it (the runner's periodic job-request renewal): it is still there.
    /// 409 once the job is no longer running (finished, cancelled, or failed because the runner was lost), so
    /// the runner knows to stop.
    pub fn renew_job(&mut self, id: i64) -> Result<JobView, Rejection> {
        let now = self.now_ms();
        let job = self.job_mut(id)?;
        if job.state != JobState::Running {
            let state = job.state;
            return Err(Rejection::new(
                409,
                format!("job {id} is {state:?}; only a running job is renewed"),
            ));
        }
        job.renewed_ms = Some(now);
        self.job_view(id)
    }

    /// Finish a job assigned to or running on a runner (`JobCompleted` with `result`); the ephemeral runner is
    /// deregistered, as a JIT runner is after its one job.
    pub fn finish_job(&mut self, id: i64, result: &str) -> Result<JobView, Rejection> {
        let state = self.job_mut(id)?.state;
        if !matches!(state, JobState::Assigned | JobState::Running) {
            return Err(Rejection::new(
                409,
                format!(
                    "job {id} is {state:?}; only a job on a runner can finish (cancel it instead)"
                ),
            ));
        }
        self.complete(id, result);
        self.job_view(id)
    }

    /// Cancel a job in any state but `completed`. The scale set hears `JobCompleted` (`canceled`) only if it had
    /// acquired the job.
    pub fn cancel_job(&mut self, id: i64) -> Result<JobView, Rejection> {
        let state = self.job_mut(id)?.state;
        match state {
            JobState::Completed => {
                return Err(Rejection::new(
                    409,
                    format!("job {id} is already completed"),
                ));
            }
            JobState::Queued | JobState::Available => {
                let now = self.now_ms();
                let job = self.job_mut(id)?;
                job.state = JobState::Completed;
                job.result = Some("canceled".to_owned());
                job.finish_ms = Some(now);
            }
            JobState::Acquired | JobState::Assigned | JobState::Running => {
                self.complete(id, "canceled")
            }
        }
        self.job_view(id)
    }

    fn complete(&mut self, id: i64, result: &str) {
        let now = self.now_ms();
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        job.state = JobState::Completed;
        job.result = Some(result.to_owned());
        job.finish_ms = Some(now);
        let runner = job.runner.as_ref().map(|(runner, _)| *runner);
        self.emit(id, JOB_COMPLETED);
        if let Some(runner) = runner {
            self.runners.remove(&runner);
        }
    }

    /// Cancel the job's assignment and offer it again, as the service does when no runner picks a job up in
    /// time: `JobCompleted` (`canceled`) then a new `JobAvailable`. The runner, if any, is freed.
    pub fn requeue_job(&mut self, id: i64) -> Result<JobView, Rejection> {
        let now = self.now_ms();
        let job = self.job_mut(id)?;
        if !matches!(job.state, JobState::Acquired | JobState::Assigned) {
            return Err(Rejection::new(
                409,
                format!(
                    "job {id} is {:?}; only an acquired or assigned job can be requeued",
                    job.state
                ),
            ));
        }
        let scale_set = job.scale_set;
        // The JobCompleted of a cancelled assignment carries the result and finish time like any other.
        job.result = Some("canceled".to_owned());
        job.finish_ms = Some(now);
        let runner = job.runner.as_ref().map(|(runner, _)| *runner);
        self.emit(id, JOB_COMPLETED);
        if let Some(runner) = runner.and_then(|runner| self.runners.get_mut(&runner)) {
            runner.job = None;
        }
        let job = self.job_mut(id)?;
        job.state = JobState::Available;
        job.result = None;
        job.finish_ms = None;
        job.runner = None;
        job.scale_set_assign_ms = None;
        job.runner_assign_ms = None;
        job.times_requeued += 1;
        self.offer(id);
        if let Some(scale_set) = scale_set {
            self.dispatch(scale_set);
        }
        self.job_view(id)
    }

    /// Mark a runner online (its process reported in), by id or by its JIT config. A JIT config works once: a
    /// second report is a conflict, and the config of a deregistered runner is gone.
    pub fn mark_runner_online(
        &mut self,
        selector: &RunnerSelector,
    ) -> Result<RunnerView, Rejection> {
        let id = match (selector.runner_id, selector.jit_config.as_deref()) {
            (Some(id), _) => id,
            (None, Some(jit)) => *self
                .jit_configs
                .get(jit)
                .ok_or_else(|| Rejection::new(404, "unknown JIT config"))?,
            (None, None) => return Err(Rejection::new(400, "give runnerId or jitConfig")),
        };
        let runner = self.runners.get_mut(&id).ok_or_else(|| {
            Rejection::new(
                if selector.jit_config.is_some() {
                    410
                } else {
                    404
                },
                format!("runner {id} is not registered"),
            )
        })?;
        if runner.online && selector.jit_config.is_some() {
            return Err(Rejection::new(
                409,
                format!("the JIT config of runner {id} is already in use"),
            ));
        }
        if let Some(jit) = selector.jit_config.as_deref()
            && !self.used_jit_configs.insert(jit.to_owned())
        {
            // A runner started again with a config another runner process consumed (a pod re-created from the
            // same JIT Secret): the service refuses it, and tests count it as a controller bug.
            self.jit_config_reuses += 1;
            return Err(Rejection::new(
                409,
                format!("the JIT config of runner {id} was already used"),
            ));
        }
        runner.online = true;
        let scale_set = runner.scale_set;
        self.dispatch(scale_set);
        self.runner_view(id)
    }

    /// Mark a runner offline; a job given to it but not started goes back to waiting for a runner.
    pub fn mark_runner_offline(&mut self, id: i64) -> Result<RunnerView, Rejection> {
        let runner = self
            .runners
            .get_mut(&id)
            .ok_or_else(|| Rejection::new(404, format!("runner {id} is not registered")))?;
        runner.online = false;
        let scale_set = runner.scale_set;
        let job_id = runner.job;
        if let Some(job_id) = job_id
            && let Some(job) = self.jobs.get_mut(&job_id)
            && job.state == JobState::Assigned
        {
            job.state = JobState::Acquired;
            job.runner = None;
            job.runner_assign_ms = None;
            if let Some(runner) = self.runners.get_mut(&id) {
                runner.job = None;
            }
            self.dispatch(scale_set);
        }
        self.runner_view(id)
    }

    /// Deregister a runner server-side (as if removed on GitHub); refused while it holds a job.
    pub fn deregister_runner(&mut self, id: i64) -> Result<(), Rejection> {
        let runner = self
            .runners
            .get(&id)
            .ok_or_else(|| Rejection::new(404, format!("runner {id} is not registered")))?;
        if let Some(job) = runner.job {
            return Err(Rejection::new(409, format!("runner {id} holds job {job}")));
        }
        self.runners.remove(&id);
        Ok(())
    }

    /// Drop sessions server-side; returns how many.
    pub fn drop_sessions(&mut self, request: &DropSessions) -> usize {
        let before = self.sessions.len();
        self.sessions.retain(|id, session| {
            let selected = request
                .session_id
                .as_ref()
                .is_none_or(|wanted| wanted.eq_ignore_ascii_case(id))
                && request
                    .scale_set_id
                    .is_none_or(|set| set == session.scale_set);
            !selected
        });
        before - self.sessions.len()
    }

    /// Expire tokens now; returns how many.
    pub fn expire_tokens(&mut self, request: &ExpireTokens) -> usize {
        let expired = self.now_ms() - 1;
        let mut count = 0;
        let mut expire = |expires: &mut i64| {
            *expires = expired;
            count += 1;
        };
        match request.kind {
            TokenKind::MessageQueue => {
                for (session, expires) in self.queue_tokens.values_mut() {
                    let selected = request
                        .session_id
                        .as_ref()
                        .is_none_or(|wanted| wanted.eq_ignore_ascii_case(session))
                        && request.scale_set_id.is_none_or(|set| {
                            self.sessions
                                .get(session.as_str())
                                .is_some_and(|rec| rec.scale_set == set)
                        });
                    if selected {
                        expire(expires);
                    }
                }
            }
            TokenKind::Admin => {
                for (tenant, expires) in self.admin_tokens.values_mut() {
                    if request.tenant_id.is_none_or(|wanted| wanted == *tenant) {
                        expire(expires);
                    }
                }
            }
            TokenKind::Registration => self
                .registration_tokens
                .values_mut()
                .for_each(|(_, expires)| expire(expires)),
            TokenKind::Installation => self.installation_tokens.values_mut().for_each(expire),
        }
        count
    }

    /// Complete running jobs older than `auto_complete_after`, and fail running jobs whose runner stopped
    /// renewing them for `runner_lost_timeout` (the runner is gone with its job); returns whether anything
    /// changed.
    pub fn tick(&mut self) -> bool {
        let now = self.now_ms();
        let auto_complete = self.settings.auto_complete_after;
        let lost_after = self.settings.runner_lost_timeout;
        let mut due = Vec::new();
        let mut lost = Vec::new();
        for job in self.jobs.values() {
            if job.state != JobState::Running {
                continue;
            }
            if auto_complete.is_some_and(|after| {
                job.running_since_ms
                    .is_some_and(|since| now - since >= after)
            }) {
                due.push(job.request_id);
            } else if lost_after
                .is_some_and(|after| job.renewed_ms.is_some_and(|renewed| now - renewed >= after))
            {
                lost.push(job.request_id);
            }
        }
        for id in &due {
            self.complete(*id, "succeeded");
        }
        for id in &lost {
            if let Some(job) = self.jobs.get_mut(id) {
                job.runner_lost = true;
            }
            self.complete(*id, "failed");
        }
        !due.is_empty() || !lost.is_empty()
    }

    // ---------------------------------------------------------------------------------------------------------
    // Views.

    /// A registered runner's view; 404 once it is deregistered (a stand-in runner polls this to know its
    /// job is over).
    pub fn runner_view(&self, id: i64) -> Result<RunnerView, Rejection> {
        let runner = self
            .runners
            .get(&id)
            .ok_or_else(|| Rejection::new(404, format!("runner {id} is not registered")))?;
        Ok(RunnerView {
            id: runner.id,
            name: runner.name.clone(),
            scale_set_id: runner.scale_set,
            tenant_id: runner.tenant,
            online: runner.online,
            job_request_id: runner.job,
            work_folder: runner.work_folder.clone(),
        })
    }

    /// How many of `ids` have completed.
    pub fn completed_among(&self, ids: &[i64]) -> usize {
        ids.iter()
            .filter(|id| {
                self.jobs
                    .get(id)
                    .is_some_and(|job| job.state == JobState::Completed)
            })
            .count()
    }

    /// A job's view.
    pub fn job_view(&self, id: i64) -> Result<JobView, Rejection> {
        let job = self
            .jobs
            .get(&id)
            .ok_or_else(|| Rejection::new(404, format!("no job with request id {id}")))?;
        Ok(JobView {
            request_id: job.request_id,
            job_id: job.job_id.clone(),
            tenant_id: job.tenant,
            scale_set_id: job.scale_set,
            scale_set_name: job.target_name.clone(),
            state: job.state,
            runner_id: job.runner.as_ref().map(|(id, _)| *id),
            runner_name: job.runner.as_ref().map(|(_, name)| name.clone()),
            result: job.result.clone(),
            repository: job.repository.clone(),
            owner: job.owner.clone(),
            workflow_ref: job.workflow_ref.clone(),
            workflow_run_id: job.workflow_run_id,
            labels: job.labels.clone(),
            times_acquired: job.times_acquired,
            times_started: job.times_started,
            times_requeued: job.times_requeued,
            runner_lost: job.runner_lost,
            display_name: job.display_name.clone(),
            rest_id: job.rest_id,
            run_attempt: job.run_attempt,
            rerun_of: job.rerun_of,
            next_attempt: job.next_attempt,
            debug_logging: job.debug_logging,
        })
    }

    /// Everything, for assertions. Idle sessions past their timeout are dropped first.
    pub fn snapshot(&mut self) -> StateSnapshot {
        self.expire_idle_sessions();
        StateSnapshot {
            tenants: self
                .tenants
                .values()
                .map(|tenant| TenantView {
                    id: tenant.id,
                    scope: tenant.scope.to_string(),
                    service_url: tenant.service_url.clone(),
                    runner_groups: tenant
                        .groups
                        .iter()
                        .map(|group| RunnerGroupView {
                            id: group.id,
                            name: group.name.clone(),
                            is_default: group.id == DEFAULT_GROUP_ID,
                        })
                        .collect(),
                })
                .collect(),
            scale_sets: self
                .scale_sets
                .values()
                .map(|set| ScaleSetView {
                    id: set.id,
                    tenant_id: set.tenant,
                    name: set.name.clone(),
                    runner_group_id: set.group,
                    runner_group_name: self.group_name(set.tenant, set.group),
                    labels: set.labels.clone(),
                    disable_update: set.setting.disable_update,
                    statistics: self.statistics(set.id),
                    session_id: self
                        .sessions
                        .values()
                        .find(|session| session.scale_set == set.id)
                        .map(|session| session.id.clone()),
                    pending_job_messages: set.queue.pending.len(),
                    unacked_message_ids: set
                        .queue
                        .messages
                        .iter()
                        .map(|message| message.id)
                        .collect(),
                })
                .collect(),
            sessions: self
                .sessions
                .values()
                .map(|session| SessionView {
                    id: session.id.clone(),
                    scale_set_id: session.scale_set,
                    owner_name: session.owner.clone(),
                    last_max_capacity: session.last_max_capacity,
                    polls: session.polls,
                })
                .collect(),
            runners: self
                .runners
                .keys()
                .filter_map(|id| self.runner_view(*id).ok())
                .collect(),
            jobs: self
                .jobs
                .keys()
                .filter_map(|id| self.job_view(*id).ok())
                .collect(),
            jit_config_reuses: self.jit_config_reuses,
            job_reruns: self.job_reruns,
        }
    }
}
