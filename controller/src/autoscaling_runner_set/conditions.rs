//! Status conditions of an AutoscalingRunnerSet (beyond ARC, which has none): every reason no runner is being
//! created gets a condition with a fixed reason word, computed by a pure function that keeps
//! `lastTransitionTime` while a condition's status does not change.
//!
//! | Type | False/True when |
//! |---|---|
//! | `ScaleSetReady` | False: the scale set cannot be created or read (credentials, Secret, runner group, refused creation, service down) |
//! | `ListenerReady` | True only while the listener holds the scale set's message session and its polls succeed (its own report); False: not started, failing, session refused or lost, credentials rejected, scale set missing, service unreachable, report stale |
//! | `RunnersCanStart` | False: runners of the set cannot be created or started (pods refused, invalid, unschedulable or Pending too long, images not pulled, pods failing again and again) |
//! | `MaxRunnersReached` | True: as many runners exist as `maxRunners` allows (or `maxRunners` is 0) |
//! | `Ready` | True: the set is served (scale set found, listener holding its session, runners able to start); otherwise the first failing reason |

use actions_client::ErrorKind;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::error::Error;

/// Condition type: the scale set exists in the Actions Service.
pub const SCALE_SET_READY: &str = "ScaleSetReady";
/// Condition type: the listener holds the message session and polls.
pub const LISTENER_READY: &str = "ListenerReady";
/// Condition type: no runner of the set is blocked from starting.
pub const RUNNERS_CAN_START: &str = "RunnersCanStart";
/// Condition type: no more runners can be created because of `maxRunners`.
pub const MAX_RUNNERS_REACHED: &str = "MaxRunnersReached";
/// Condition type: runners are created on demand.
pub const READY: &str = "Ready";

/// A reason word and a message for a condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// CamelCase reason.
    pub reason: &'static str,
    /// Human-readable explanation.
    pub message: String,
}

impl Finding {
    /// A finding.
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// What a reconcile observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// `Ok` with a message when the scale set exists, else why not.
    pub scale_set: Result<String, Finding>,
    /// `Ok` when the listener serves the set, else why not; `None` when not looked at (the scale set is
    /// missing).
    pub listener: Option<Result<String, Finding>>,
    /// `Ok` when no runner is blocked from starting, else how many are and why; `None` when not looked at.
    pub runners: Option<Result<String, Finding>>,
    /// Current runners and the effective maximum, when known.
    pub capacity: Option<(i64, i64)>,
}

/// The condition reason for a failure to create or read the scale set.
pub fn scale_set_reason(error: &Error) -> &'static str {
    let kind = |source: &actions_client::Error| source.kind();
    match error {
        Error::CredentialsSecretMissing { .. } => "CredentialsSecretMissing",
        Error::GetSecret { source, .. } if crate::error::is_status(source, 403) => {
            "CredentialsSecretForbidden"
        }
        Error::ReadCredentials { .. } => "CredentialsInvalid",
        Error::UnsupportedVault { .. } => "VaultUnsupported",
        // Vault{CertificateUnreadable, CertificateInvalid, AuthenticationFailed, Unreachable, AccessDenied,
        // SecretNotFound, SecretInvalid, ConfigInvalid}: one per thing the operator fixes.
        Error::ReadVaultCredentials { source, .. } => source.reason(),
        Error::InvalidRunnerSetSpec { .. } => "SpecInvalid",
        Error::ReadProxyCredentials { .. } | Error::ProxyUrl { .. } => "ProxyInvalid",
        Error::ReadTlsCertificate { .. } => "TlsCertificateInvalid",
        // Name the part of the configuration that is wrong, so the user knows where to look.
        Error::BuildActionsClient { source, .. } => match source {
            actions_client::Error::ValidateCredentials(_)
            | actions_client::Error::LoadAppPrivateKey(_)
            | actions_client::Error::SignAppJwt(_) => "CredentialsInvalid",
            actions_client::Error::LoadRootCa { .. } => "TlsCertificateInvalid",
            actions_client::Error::ConfigureProxy { .. } => "ProxyInvalid",
            _ => "ConfigurationInvalid",
        },
        Error::ActionsDeadline { .. } => "ActionsServiceUnavailable",
        Error::GetRunnerGroup { source, .. }
        | Error::GetScaleSet { source, .. }
        | Error::CreateScaleSet { source, .. }
        | Error::UpdateScaleSet { source, .. } => match kind(source) {
            Some(ErrorKind::RunnerGroupNotFound) => "RunnerGroupNotFound",
            Some(ErrorKind::Unauthorized) => "CredentialsRejected",
            Some(ErrorKind::Forbidden) => "PermissionDenied",
            Some(ErrorKind::TlsCertificate) => "TlsCertificateInvalid",
            Some(ErrorKind::AmbiguousName) => "AmbiguousName",
            Some(
                ErrorKind::RateLimited
                | ErrorKind::ServerError
                | ErrorKind::Connect
                | ErrorKind::Timeout
                | ErrorKind::DeadlineExceeded
                | ErrorKind::Transport,
            ) => "ActionsServiceUnavailable",
            _ if matches!(error, Error::CreateScaleSet { .. }) => "ScaleSetCreationRefused",
            _ if matches!(error, Error::UpdateScaleSet { .. }) => "ScaleSetUpdateRefused",
            _ => "ScaleSetLookupFailed",
        },
        _ => "ReconcileError",
    }
}

fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    previous: &[Condition],
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" };
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time,
    }
}

/// The conditions for `observation`, keeping each condition's `lastTransitionTime` from `previous` while its
/// status stays the same.
pub fn compute(
    previous: &[Condition],
    observation: &Observation,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let make = |type_: &str, status: bool, reason: &str, message: &str| {
        condition(type_, status, reason, message, generation, previous, now)
    };
    let mut conditions = Vec::with_capacity(4);
    let mut first_problem: Option<Finding> = None;
    match &observation.scale_set {
        Ok(message) => conditions.push(make(SCALE_SET_READY, true, "ScaleSetReady", message)),
        Err(finding) => {
            conditions.push(make(
                SCALE_SET_READY,
                false,
                finding.reason,
                &finding.message,
            ));
            first_problem.get_or_insert_with(|| finding.clone());
        }
    }
    let listener = observation.listener.clone().unwrap_or_else(|| {
        Err(Finding::new(
            "WaitingForScaleSet",
            "the listener starts once the scale set exists",
        ))
    });
    match &listener {
        Ok(message) => conditions.push(make(LISTENER_READY, true, "SessionHeld", message)),
        Err(finding) => {
            conditions.push(make(
                LISTENER_READY,
                false,
                finding.reason,
                &finding.message,
            ));
            first_problem.get_or_insert_with(|| finding.clone());
        }
    }
    match &observation.runners {
        Some(Ok(message)) => {
            conditions.push(make(RUNNERS_CAN_START, true, "RunnersStartable", message))
        }
        Some(Err(finding)) => {
            conditions.push(make(
                RUNNERS_CAN_START,
                false,
                finding.reason,
                &finding.message,
            ));
            first_problem.get_or_insert_with(|| finding.clone());
        }
        None => {}
    }
    if let Some((current, max)) = observation.capacity {
        let reached = current >= max;
        let (reason, message) = match (reached, max) {
            (true, 0) => (
                "MaxRunnersIsZero",
                "maxRunners is 0: no runner will ever be created".to_owned(),
            ),
            (true, _) => (
                "MaxRunnersReached",
                format!(
                    "{current} runners exist and maxRunners is {max}: jobs wait for a runner to finish"
                ),
            ),
            (false, _) => (
                "BelowMaxRunners",
                format!("{current} of at most {max} runners exist"),
            ),
        };
        conditions.push(make(MAX_RUNNERS_REACHED, reached, reason, &message));
    }
    match first_problem {
        None => conditions.push(make(
            READY,
            true,
            "Ready",
            "the scale set exists, its listener holds the message session and runners can start",
        )),
        Some(finding) => conditions.push(make(READY, false, finding.reason, &finding.message)),
    }
    conditions
}

/// The `Ready` condition of a list.
pub fn ready(conditions: &[Condition]) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == READY)
}

/// Whether two condition lists say the same, ignoring times (to avoid needless status writes).
pub fn same(a: &[Condition], b: &[Condition]) -> bool {
    let key = |c: &Condition| {
        (
            c.type_.clone(),
            c.status.clone(),
            c.reason.clone(),
            c.message.clone(),
            c.observed_generation,
        )
    };
    a.len() == b.len() && a.iter().map(key).eq(b.iter().map(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    fn healthy() -> Observation {
        Observation {
            scale_set: Ok("scale set 3".into()),
            listener: Some(Ok("running".into())),
            runners: Some(Ok("none blocked".into())),
            capacity: Some((1, 5)),
        }
    }

    fn get<'a>(conditions: &'a [Condition], type_: &str) -> &'a Condition {
        conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn healthy_set_is_ready() {
        let conditions = compute(&[], &healthy(), Some(2), &at(10));
        assert_eq!(get(&conditions, READY).status, "True");
        assert_eq!(get(&conditions, MAX_RUNNERS_REACHED).status, "False");
        assert_eq!(get(&conditions, READY).observed_generation, Some(2));
    }

    #[test]
    fn first_problem_names_the_ready_reason() {
        let observation = Observation {
            scale_set: Err(Finding::new("RunnerGroupNotFound", "no group gpu")),
            listener: None,
            runners: None,
            capacity: None,
        };
        let conditions = compute(&[], &observation, None, &at(10));
        let ready = get(&conditions, READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "RunnerGroupNotFound")
        );
        assert_eq!(
            get(&conditions, LISTENER_READY).reason,
            "WaitingForScaleSet"
        );
        assert!(conditions.iter().all(|c| c.type_ != MAX_RUNNERS_REACHED));

        let failing = Observation {
            listener: Some(Err(Finding::new("ListenerFailing", "exit 1"))),
            ..healthy()
        };
        let conditions = compute(&[], &failing, None, &at(10));
        assert_eq!(get(&conditions, READY).reason, "ListenerFailing");
    }

    #[test]
    fn blocked_runners_make_the_set_not_ready() {
        let blocked = Observation {
            runners: Some(Err(Finding::new(
                "ImagePullFailed",
                "1 of 1 runner(s) cannot start",
            ))),
            ..healthy()
        };
        let conditions = compute(&[], &blocked, None, &at(10));
        let runners = get(&conditions, RUNNERS_CAN_START);
        assert_eq!(
            (runners.status.as_str(), runners.reason.as_str()),
            ("False", "ImagePullFailed")
        );
        let ready = get(&conditions, READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "ImagePullFailed")
        );
        assert_eq!(get(&conditions, LISTENER_READY).status, "True");
        // The listener's problem comes first.
        let both = Observation {
            listener: Some(Err(Finding::new("SessionConflict", "claimed"))),
            ..blocked
        };
        assert_eq!(
            get(&compute(&[], &both, None, &at(10)), READY).reason,
            "SessionConflict"
        );
        let healthy = compute(&[], &healthy(), None, &at(10));
        assert_eq!(get(&healthy, RUNNERS_CAN_START).status, "True");
    }

    #[test]
    fn max_runners() {
        let full = Observation {
            capacity: Some((5, 5)),
            ..healthy()
        };
        let conditions = compute(&[], &full, None, &at(1));
        assert_eq!(get(&conditions, MAX_RUNNERS_REACHED).status, "True");
        assert_eq!(get(&conditions, READY).status, "True");
        let zero = Observation {
            capacity: Some((0, 0)),
            ..healthy()
        };
        let conditions = compute(&[], &zero, None, &at(1));
        assert_eq!(
            get(&conditions, MAX_RUNNERS_REACHED).reason,
            "MaxRunnersIsZero"
        );
    }

    #[test]
    fn transition_times_survive_unchanged_status() {
        let first = compute(&[], &healthy(), None, &at(10));
        let again = compute(&first, &healthy(), None, &at(20));
        assert_eq!(get(&again, READY).last_transition_time, at(10));
        assert!(same(&first, &again));
        let broken = Observation {
            scale_set: Err(Finding::new("CredentialsInvalid", "bad key")),
            ..healthy()
        };
        let changed = compute(&again, &broken, None, &at(30));
        assert_eq!(get(&changed, READY).last_transition_time, at(30));
        // The listener stayed ready: its time is kept.
        assert_eq!(get(&changed, LISTENER_READY).last_transition_time, at(10));
        assert!(!same(&again, &changed));
    }

    #[test]
    fn reasons_for_errors() {
        let missing = Error::CredentialsSecretMissing {
            namespace: "ns".into(),
            name: "s".into(),
        };
        assert_eq!(scale_set_reason(&missing), "CredentialsSecretMissing");
        let bad = Error::ReadCredentials {
            namespace: "ns".into(),
            name: "s".into(),
            source: crds::Error::ValidateCredentials(crds::appconfig::CredentialsProblem::Missing),
        };
        assert_eq!(scale_set_reason(&bad), "CredentialsInvalid");
        let deadline = Error::ActionsDeadline {
            operation: "x",
            after: std::time::Duration::from_secs(1),
        };
        assert_eq!(scale_set_reason(&deadline), "ActionsServiceUnavailable");
    }
}
