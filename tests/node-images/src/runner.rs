//! What a runner does, as far as the Actions Service can tell, in one place for the runner image and the
//! e2e simulator: report online with the JIT config, wait for the job the service assigns, start it, run it
//! for its duration, report it finished, exit; and, when stopped early, fail the job it was running or go
//! offline.
//!
//! The service is a trait: the simulator implements it on the fake's in-process handle, the runner image
//! over the fake's HTTP control API ([`http::HttpService`]).

use std::future::Future;
use std::time::Duration;

use crate::constants::env;
use crate::{Error, Result};

/// What a runner learns when it asks for its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poll {
    /// Registered, no job yet (or the service could not be asked; ask again).
    Waiting,
    /// The service assigned this job request.
    Job(i64),
    /// The registration is gone: the job completed without the runner (cancelled), or the runner was removed.
    Gone,
}

/// The Actions Service as a runner sees it.
pub trait RunnerService: Sync {
    /// Reports the runner online by its JIT config; returns its id, or why the service refused it.
    fn online(&self, jit_config: &str) -> impl Future<Output = Result<i64, String>> + Send;
    fn poll(&self, runner_id: i64) -> impl Future<Output = Poll> + Send;
    /// Starts the job; `false` when it was cancelled or requeued since it was assigned.
    fn start_job(&self, job: i64) -> impl Future<Output = bool> + Send;
    /// Renews the running job, as the runner renews its job request while it runs it (a runner that stops
    /// renewing is lost, and the service fails its job); `Some(false)` when the service says the job is over
    /// (cancelled, or failed because the runner was taken for lost), `None` when it could not be asked.
    fn renew_job(&self, job: i64) -> impl Future<Output = Option<bool>> + Send;
    /// Reports the job finished with `result`; `false` when the service no longer takes it (cancelled).
    fn finish_job(&self, job: i64, result: &str) -> impl Future<Output = bool> + Send;
    fn offline(&self, runner_id: i64) -> impl Future<Output = ()> + Send;
}

/// How a runner runs its job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobBehaviour {
    pub job_duration: Duration,
    pub job_result: String,
    /// The runner's exit code after its job.
    pub exit_code: i32,
    pub poll_interval: Duration,
    /// How often a running job is renewed (the actions/runner renews every 60 s; tests renew faster and run
    /// the fake with a lost-runner timeout a few renewals long).
    pub renew_interval: Duration,
}

impl Default for JobBehaviour {
    fn default() -> Self {
        Self {
            job_duration: Duration::from_secs(1),
            job_result: "succeeded".to_owned(),
            exit_code: 0,
            poll_interval: Duration::from_millis(200),
            renew_interval: Duration::from_secs(1),
        }
    }
}

/// The job a runner holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Holding {
    #[default]
    Nothing,
    /// Assigned, not started.
    Assigned(i64),
    Started(i64),
}

/// What happened, for the caller's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Online(i64),
    Started(i64),
    /// The job finished; `reported` when the service took the result (not when it was cancelled meanwhile).
    Finished {
        job: i64,
        reported: bool,
    },
}

/// One runner's life.
#[derive(Debug, Default)]
pub struct Session {
    pub runner_id: Option<i64>,
    pub holding: Holding,
}

/// What [`Session::terminate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Termination {
    /// The runner had not reported online: nothing to tell the service.
    NotOnline,
    /// The runner went offline (a job assigned but not started goes back to the queue).
    WentOffline,
    /// The job it was running failed: what a pod deleted under a busy runner costs.
    Interrupted(i64),
}

impl Session {
    /// Reports online with `jit_config`, then serves: returns the exit code.
    pub async fn run<S: RunnerService>(
        &mut self,
        service: &S,
        jit_config: &str,
        behaviour: &JobBehaviour,
        on_event: &mut (impl FnMut(Event) + Send),
    ) -> Result<i32> {
        let id = service.online(jit_config).await.map_err(Error::Service)?;
        self.runner_id = Some(id);
        on_event(Event::Online(id));
        Ok(self.serve(service, id, behaviour, on_event).await)
    }

    /// Waits for a job, runs it and returns the exit code.
    pub async fn serve<S: RunnerService>(
        &mut self,
        service: &S,
        runner_id: i64,
        behaviour: &JobBehaviour,
        on_event: &mut (impl FnMut(Event) + Send),
    ) -> i32 {
        loop {
            match service.poll(runner_id).await {
                Poll::Gone => return 0,
                Poll::Waiting => tokio::time::sleep(behaviour.poll_interval).await,
                Poll::Job(job) => {
                    self.holding = Holding::Assigned(job);
                    if !service.start_job(job).await {
                        // Cancelled or requeued between the assignment and the start; look again.
                        self.holding = Holding::Nothing;
                        tokio::time::sleep(behaviour.poll_interval).await;
                        continue;
                    }
                    self.holding = Holding::Started(job);
                    on_event(Event::Started(job));
                    let reported = if run_job(service, job, behaviour).await {
                        service.finish_job(job, &behaviour.job_result).await
                    } else {
                        false
                    };
                    self.holding = Holding::Nothing;
                    on_event(Event::Finished { job, reported });
                    return behaviour.exit_code;
                }
            }
        }
    }

    /// The runner is stopped before the end of its life (its pod deleted, SIGTERM): a started job fails, as
    /// the service sees it when a runner dies mid-job; otherwise the runner goes offline.
    pub async fn terminate<S: RunnerService>(&self, service: &S) -> Termination {
        let Some(runner_id) = self.runner_id else {
            return Termination::NotOnline;
        };
        match self.holding {
            Holding::Started(job) if service.finish_job(job, "failed").await => {
                Termination::Interrupted(job)
            }
            Holding::Started(_) => Termination::WentOffline,
            Holding::Nothing | Holding::Assigned(_) => {
                service.offline(runner_id).await;
                Termination::WentOffline
            }
        }
    }
}

/// Runs a started job for its duration, renewing it every `renew_interval`; `false` when the service says
/// the job ended meanwhile (then there is no result to report: the runner stops, as the actions/runner does
/// when its job is cancelled).
async fn run_job<S: RunnerService>(service: &S, job: i64, behaviour: &JobBehaviour) -> bool {
    let ends = tokio::time::Instant::now() + behaviour.job_duration;
    let renew_every = behaviour.renew_interval.max(Duration::from_millis(10));
    loop {
        let next = tokio::time::Instant::now() + renew_every;
        if next >= ends {
            tokio::time::sleep_until(ends).await;
            return true;
        }
        tokio::time::sleep_until(next).await;
        // An unanswered renewal is retried at the next one; the service's lost-runner timeout spans several.
        if service.renew_job(job).await == Some(false) {
            return false;
        }
    }
}

/// The runner image's switches (see [`crate::constants::env`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Switches {
    pub job: JobBehaviour,
    /// Exit at once with this code, before reporting online.
    pub exit_at_start: Option<i32>,
    pub hang: bool,
    pub ignore_sigterm: bool,
    pub grow_memory: bool,
}

impl Switches {
    /// Reads the switches through `var` (the process environment in the image); unset means the default.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let defaults = JobBehaviour::default();
        let millis = |name: &'static str, default: Duration| -> Result<Duration> {
            match var(name) {
                None => Ok(default),
                Some(value) => value
                    .trim()
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|e| Error::Setting {
                        name,
                        value,
                        reason: e.to_string(),
                    }),
            }
        };
        let flag = |name: &'static str| -> Result<bool> {
            match var(name).as_deref().map(str::trim) {
                None | Some("" | "0" | "false") => Ok(false),
                Some("1" | "true") => Ok(true),
                Some(other) => Err(Error::Setting {
                    name,
                    value: other.to_owned(),
                    reason: "expected 1/true or 0/false".to_owned(),
                }),
            }
        };
        let code = |name: &'static str| -> Result<Option<i32>> {
            var(name)
                .map(|value| {
                    value
                        .trim()
                        .parse::<u8>()
                        .map(i32::from)
                        .map_err(|e| Error::Setting {
                            name,
                            value,
                            reason: format!("an exit code is 0 to 255: {e}"),
                        })
                })
                .transpose()
        };
        let exit_code = code(env::EXIT_CODE)?.unwrap_or(0);
        Ok(Self {
            job: JobBehaviour {
                job_duration: millis(env::JOB_MS, defaults.job_duration)?,
                job_result: var(env::JOB_RESULT).unwrap_or(defaults.job_result),
                exit_code,
                poll_interval: millis(env::POLL_MS, defaults.poll_interval)?,
                renew_interval: millis(env::RENEW_MS, defaults.renew_interval)?,
            },
            exit_at_start: code(env::EXIT_AT_START)?,
            hang: flag(env::HANG)?,
            ignore_sigterm: flag(env::IGNORE_SIGTERM)?,
            grow_memory: flag(env::GROW_MEMORY)?,
        })
    }
}

pub mod http {
    //! The fake's control API over HTTP, as the runner image reaches it from its pod.

    use super::{Poll, RunnerService};
    use serde_json::json;

    pub struct HttpService {
        client: reqwest::Client,
        /// `http://host:port/_fake`.
        control_url: String,
    }

    impl HttpService {
        pub fn new(control_url: &str) -> crate::Result<Self> {
            let client = reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(10))
                .build()
                .map_err(|e| crate::Error::Service(format!("building the HTTP client: {e}")))?;
            Ok(Self {
                client,
                control_url: control_url.trim_end_matches('/').to_owned(),
            })
        }

        async fn post(&self, path: &str, body: serde_json::Value) -> Option<reqwest::Response> {
            self.client
                .post(format!("{}{path}", self.control_url))
                .json(&body)
                .send()
                .await
                .ok()
        }
    }

    impl RunnerService for HttpService {
        async fn online(&self, jit_config: &str) -> Result<i64, String> {
            let response = self
                .post("/runners/online", json!({"jitConfig": jit_config}))
                .await
                .ok_or_else(|| format!("{} did not answer", self.control_url))?;
            let status = response.status();
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            if !status.is_success() {
                return Err(format!("{status}: {body}"));
            }
            body["id"]
                .as_i64()
                .ok_or_else(|| format!("no runner id in {body}"))
        }

        async fn poll(&self, runner_id: i64) -> Poll {
            let url = format!("{}/runners/{runner_id}", self.control_url);
            let Ok(response) = self.client.get(url).send().await else {
                return Poll::Waiting;
            };
            if response.status() == reqwest::StatusCode::NOT_FOUND {
                return Poll::Gone;
            }
            if !response.status().is_success() {
                return Poll::Waiting;
            }
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            body["jobRequestId"]
                .as_i64()
                .map_or(Poll::Waiting, Poll::Job)
        }

        async fn start_job(&self, job: i64) -> bool {
            self.post(&format!("/jobs/{job}/start"), json!({}))
                .await
                .is_some_and(|r| r.status().is_success())
        }

        async fn renew_job(&self, job: i64) -> Option<bool> {
            let response = self.post(&format!("/jobs/{job}/renew"), json!({})).await?;
            match response.status() {
                status if status.is_success() => Some(true),
                reqwest::StatusCode::CONFLICT | reqwest::StatusCode::NOT_FOUND => Some(false),
                _ => None,
            }
        }

        async fn finish_job(&self, job: i64, result: &str) -> bool {
            self.post(&format!("/jobs/{job}/finish"), json!({"result": result}))
                .await
                .is_some_and(|r| r.status().is_success())
        }

        async fn offline(&self, runner_id: i64) {
            let _ = self
                .post(&format!("/runners/{runner_id}/offline"), json!({}))
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    #[test]
    fn switches_default_and_parse() {
        let none = Switches::from_env(|_| None).unwrap();
        assert_eq!(none.job, JobBehaviour::default());
        assert!(!none.hang && !none.ignore_sigterm && !none.grow_memory);
        assert_eq!(none.exit_at_start, None);
        let vars: HashMap<&str, &str> = [
            (env::JOB_MS, "2500"),
            (env::EXIT_CODE, "3"),
            (env::IGNORE_SIGTERM, "1"),
            (env::GROW_MEMORY, "true"),
            (env::JOB_RESULT, "failed"),
            (env::EXIT_AT_START, "1"),
        ]
        .into();
        let set = Switches::from_env(|k| vars.get(k).map(|v| (*v).to_owned())).unwrap();
        assert_eq!(set.job.job_duration, Duration::from_millis(2500));
        assert_eq!(set.job.exit_code, 3);
        assert_eq!(set.job.job_result, "failed");
        assert!(set.ignore_sigterm && set.grow_memory && !set.hang);
        assert_eq!(set.exit_at_start, Some(1));
    }

    #[test]
    fn bad_switches_are_named() {
        for (name, value) in [
            (env::JOB_MS, "soon"),
            (env::EXIT_CODE, "300"),
            (env::EXIT_AT_START, "-1"),
            (env::HANG, "yes please"),
        ] {
            let error = Switches::from_env(|k| (k == name).then(|| value.to_owned()))
                .unwrap_err()
                .to_string();
            assert!(error.contains(name), "{error}");
        }
    }

    /// A scripted service: polls answer from a queue, calls are recorded.
    #[derive(Default)]
    struct Script {
        polls: Mutex<Vec<Poll>>,
        start_ok: bool,
        /// Answers to renewals, in order; then `Some(true)`.
        renewals: Mutex<Vec<bool>>,
        calls: Mutex<Vec<String>>,
    }

    impl RunnerService for Script {
        async fn online(&self, jit: &str) -> Result<i64, String> {
            self.calls.lock().unwrap().push(format!("online {jit}"));
            if jit == "bad" {
                Err("unknown JIT config".to_owned())
            } else {
                Ok(7)
            }
        }
        async fn poll(&self, _: i64) -> Poll {
            let mut polls = self.polls.lock().unwrap();
            if polls.is_empty() {
                Poll::Gone
            } else {
                polls.remove(0)
            }
        }
        async fn start_job(&self, job: i64) -> bool {
            self.calls.lock().unwrap().push(format!("start {job}"));
            self.start_ok
        }
        async fn renew_job(&self, job: i64) -> Option<bool> {
            self.calls.lock().unwrap().push(format!("renew {job}"));
            let mut renewals = self.renewals.lock().unwrap();
            if renewals.is_empty() {
                Some(true)
            } else {
                Some(renewals.remove(0))
            }
        }
        async fn finish_job(&self, job: i64, result: &str) -> bool {
            self.calls
                .lock()
                .unwrap()
                .push(format!("finish {job} {result}"));
            true
        }
        async fn offline(&self, id: i64) {
            self.calls.lock().unwrap().push(format!("offline {id}"));
        }
    }

    fn fast() -> JobBehaviour {
        JobBehaviour {
            job_duration: Duration::from_millis(1),
            poll_interval: Duration::from_millis(1),
            exit_code: 5,
            ..JobBehaviour::default()
        }
    }

    #[tokio::test]
    async fn a_runner_takes_one_job_and_exits_with_its_code() {
        let service = Script {
            polls: Mutex::new(vec![Poll::Waiting, Poll::Job(11), Poll::Job(12)]),
            start_ok: true,
            ..Script::default()
        };
        let mut events = Vec::new();
        let mut session = Session::default();
        let code = session
            .run(&service, "jit", &fast(), &mut |e| events.push(e))
            .await
            .unwrap();
        assert_eq!(code, 5);
        assert_eq!(
            events,
            vec![
                Event::Online(7),
                Event::Started(11),
                Event::Finished {
                    job: 11,
                    reported: true
                }
            ]
        );
        assert_eq!(
            *service.calls.lock().unwrap(),
            vec!["online jit", "start 11", "finish 11 succeeded"]
        );
        assert_eq!(session.holding, Holding::Nothing);
    }

    #[tokio::test(start_paused = true)]
    async fn a_running_job_is_renewed_and_a_refused_renewal_ends_it_unreported() {
        let behaviour = JobBehaviour {
            job_duration: Duration::from_millis(3500),
            renew_interval: Duration::from_secs(1),
            poll_interval: Duration::from_millis(1),
            ..JobBehaviour::default()
        };
        let service = Script {
            polls: Mutex::new(vec![Poll::Job(11)]),
            start_ok: true,
            ..Script::default()
        };
        let mut session = Session::default();
        session
            .run(&service, "jit", &behaviour, &mut |_| {})
            .await
            .unwrap();
        assert_eq!(
            *service.calls.lock().unwrap(),
            vec![
                "online jit",
                "start 11",
                "renew 11",
                "renew 11",
                "renew 11",
                "finish 11 succeeded"
            ],
            "renewed every second of a 3.5 s job, then finished"
        );

        let service = Script {
            polls: Mutex::new(vec![Poll::Job(12)]),
            start_ok: true,
            renewals: Mutex::new(vec![true, false]),
            ..Script::default()
        };
        let mut events = Vec::new();
        let mut session = Session::default();
        let started = tokio::time::Instant::now();
        session
            .run(&service, "jit", &behaviour, &mut |e| events.push(e))
            .await
            .unwrap();
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(2),
            "stopped at the refused renewal"
        );
        assert_eq!(
            *service.calls.lock().unwrap(),
            vec!["online jit", "start 12", "renew 12", "renew 12"],
            "nothing reported for a job the service ended"
        );
        assert_eq!(
            events.last(),
            Some(&Event::Finished {
                job: 12,
                reported: false
            })
        );
    }

    #[tokio::test]
    async fn a_gone_registration_exits_0_and_a_refused_config_is_an_error() {
        let service = Script::default();
        let mut session = Session::default();
        assert_eq!(
            session
                .run(&service, "jit", &fast(), &mut |_| {})
                .await
                .unwrap(),
            0
        );
        let error = Session::default()
            .run(&service, "bad", &fast(), &mut |_| {})
            .await
            .unwrap_err();
        assert!(error.to_string().contains("unknown JIT config"));
    }

    #[tokio::test]
    async fn termination_fails_a_started_job_and_takes_an_idle_runner_offline() {
        let service = Script {
            start_ok: true,
            ..Script::default()
        };
        assert_eq!(
            Session::default().terminate(&service).await,
            Termination::NotOnline
        );
        let busy = Session {
            runner_id: Some(7),
            holding: Holding::Started(3),
        };
        assert_eq!(busy.terminate(&service).await, Termination::Interrupted(3));
        let idle = Session {
            runner_id: Some(7),
            holding: Holding::Assigned(4),
        };
        assert_eq!(idle.terminate(&service).await, Termination::WentOffline);
        assert_eq!(
            *service.calls.lock().unwrap(),
            vec!["finish 3 failed", "offline 7"]
        );
    }
}
