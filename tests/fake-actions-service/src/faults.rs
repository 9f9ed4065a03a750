//! Fault injection: error statuses at a rate (reproducible from a seed) or for the next N calls, 429 with
//! `Retry-After`, and added latency, per endpoint name, per surface (`github`, `actions`, `queue`) or for all.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Rejection;
use crate::rng::SplitMix64;
use crate::routes::{ENDPOINT_NAMES, Endpoint};

/// The whole fault configuration; replacing it resets the generator to `seed`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Faults {
    /// Seed of the draws for `rate`; the same seed and request order give the same faults.
    pub seed: u64,
    /// Error rules; the first matching rule with budget left decides.
    pub errors: Vec<ErrorFault>,
    /// Latency rules; all matching rules add up.
    pub latency: Vec<LatencyFault>,
}

/// Answer matching requests with an error status instead of handling them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ErrorFault {
    /// Endpoint name, surface name, or `None` for every endpoint.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Status to answer, 400–599 (e.g. 500, 503, 429).
    pub status: u16,
    /// Probability per matching request; default 1.
    #[serde(default = "always")]
    pub rate: f64,
    /// Inject at most this many times; `None` forever.
    #[serde(default)]
    pub count: Option<u32>,
    /// `Retry-After` seconds to send with the error.
    #[serde(default)]
    pub retry_after_secs: Option<u64>,
}

fn always() -> f64 {
    1.0
}

/// Delay matching requests before handling them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LatencyFault {
    /// Endpoint name, surface name, or `None` for every endpoint.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Added delay in milliseconds.
    pub millis: u64,
}

/// What to do with one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultDecision {
    /// Sleep this long first.
    pub delay: Duration,
    /// Then answer this instead of handling the request.
    pub error: Option<InjectedError>,
}

/// An injected error answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InjectedError {
    /// Status.
    pub status: u16,
    /// `Retry-After` seconds.
    pub retry_after_secs: Option<u64>,
}

fn matches(filter: Option<&str>, endpoint: &Endpoint) -> bool {
    filter.is_none_or(|filter| filter == endpoint.name() || filter == endpoint.surface().name())
}

fn validate_filter(filter: Option<&str>) -> Result<(), Rejection> {
    match filter {
        Some(name)
            if !ENDPOINT_NAMES.contains(&name)
                && !["github", "actions", "queue"].contains(&name) =>
        {
            Err(Rejection::new(
                400,
                format!("unknown endpoint or surface {name:?} in fault rule"),
            ))
        }
        _ => Ok(()),
    }
}

/// Fault rules plus the generator and the remaining budgets.
#[derive(Clone, Debug)]
pub struct FaultState {
    faults: Faults,
    rng: SplitMix64,
}

impl Default for FaultState {
    fn default() -> Self {
        Self {
            faults: Faults::default(),
            rng: SplitMix64::new(0),
        }
    }
}

impl FaultState {
    /// Replace the rules after validating them.
    pub fn set(&mut self, faults: Faults) -> Result<(), Rejection> {
        for rule in &faults.errors {
            validate_filter(rule.endpoint.as_deref())?;
            if !(400..=599).contains(&rule.status) {
                return Err(Rejection::new(
                    400,
                    format!("fault status {} is not 400-599", rule.status),
                ));
            }
            if !(0.0..=1.0).contains(&rule.rate) {
                return Err(Rejection::new(
                    400,
                    format!("fault rate {} is not within 0..1", rule.rate),
                ));
            }
        }
        for rule in &faults.latency {
            validate_filter(rule.endpoint.as_deref())?;
        }
        self.rng = SplitMix64::new(faults.seed);
        self.faults = faults;
        Ok(())
    }

    /// The rules with their remaining budgets.
    pub fn current(&self) -> Faults {
        self.faults.clone()
    }

    /// Decide the fate of one request to `endpoint`.
    pub fn decide(&mut self, endpoint: &Endpoint) -> FaultDecision {
        let delay = self
            .faults
            .latency
            .iter()
            .filter(|rule| matches(rule.endpoint.as_deref(), endpoint))
            .map(|rule| Duration::from_millis(rule.millis))
            .sum();
        let mut error = None;
        for rule in &mut self.faults.errors {
            if !matches(rule.endpoint.as_deref(), endpoint) || rule.count == Some(0) {
                continue;
            }
            // A draw per matching rule keeps the sequence a function of the seed and the request order only.
            let hit = rule.rate >= 1.0 || self.rng.next_f64() < rule.rate;
            if hit {
                if let Some(count) = rule.count.as_mut() {
                    *count -= 1;
                }
                error = Some(InjectedError {
                    status: rule.status,
                    retry_after_secs: rule.retry_after_secs,
                });
                break;
            }
        }
        FaultDecision { delay, error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn rule(endpoint: Option<&str>, status: u16, rate: f64, count: Option<u32>) -> ErrorFault {
        ErrorFault {
            endpoint: endpoint.map(str::to_owned),
            status,
            rate,
            count,
            retry_after_secs: None,
        }
    }

    #[test]
    fn count_limits_injections() {
        let mut state = FaultState::default();
        state
            .set(Faults {
                errors: vec![rule(Some("get_message"), 503, 1.0, Some(2))],
                ..Faults::default()
            })
            .unwrap();
        let decisions: Vec<Option<u16>> = (0..3)
            .map(|_| state.decide(&Endpoint::GetMessage).error.map(|e| e.status))
            .collect();
        assert_eq!(decisions, vec![Some(503), Some(503), None]);
        assert_eq!(state.decide(&Endpoint::RunnerRegistration).error, None);
        assert_eq!(state.current().errors[0].count, Some(0));
    }

    #[test]
    fn rate_is_reproducible_from_seed() {
        let run = |seed| {
            let mut state = FaultState::default();
            state
                .set(Faults {
                    seed,
                    errors: vec![rule(None, 500, 0.3, None)],
                    ..Faults::default()
                })
                .unwrap();
            (0..200)
                .map(|_| state.decide(&Endpoint::GetMessage).error.is_some())
                .collect::<Vec<_>>()
        };
        let first = run(42);
        assert_eq!(first, run(42));
        assert_ne!(first, run(43));
        let hits = first.iter().filter(|hit| **hit).count();
        assert!((30..90).contains(&hits), "{hits}");
    }

    #[test]
    fn surfaces_and_latency_match() {
        let mut state = FaultState::default();
        state
            .set(Faults {
                latency: vec![
                    LatencyFault {
                        endpoint: Some("queue".into()),
                        millis: 30,
                    },
                    LatencyFault {
                        endpoint: None,
                        millis: 5,
                    },
                ],
                errors: vec![rule(Some("github"), 429, 1.0, None)],
                ..Faults::default()
            })
            .unwrap();
        let decision = state.decide(&Endpoint::DeleteMessage { message: 1 });
        assert_eq!(decision.delay, Duration::from_millis(35));
        assert_eq!(decision.error, None);
        assert_eq!(
            state
                .decide(&Endpoint::RunnerRegistration)
                .error
                .map(|e| e.status),
            Some(429)
        );
    }

    #[test]
    fn invalid_rules_are_refused() {
        let mut state = FaultState::default();
        for faults in [
            Faults {
                errors: vec![rule(Some("nope"), 500, 1.0, None)],
                ..Faults::default()
            },
            Faults {
                errors: vec![rule(None, 200, 1.0, None)],
                ..Faults::default()
            },
            Faults {
                errors: vec![rule(None, 500, 1.5, None)],
                ..Faults::default()
            },
        ] {
            assert_eq!(state.set(faults).unwrap_err().status, 400);
        }
    }
}
