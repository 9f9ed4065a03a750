//! The EphemeralRunner's next step, as one pure function of what a pass has observed (docs/runner-lifecycle.md).
//!
//! A pass starts from the cache (the runner and its pod) and asks for more only when a decision needs it: the
//! JIT Secret, the pod or the runner itself read straight from the API server. Each step the function returns is
//! either such a read, a write after which the executor updates the facts and asks again, or the last step of
//! the pass. Correctness rests on facts the API server gives, never on how late a watch event might be:
//!
//! * **A JIT config goes into at most one pod.** The Secret is created in the pass that creates the pod, so a
//!   Secret without a pod means its config may have been consumed (a pod deleted, evicted, or a crash between the
//!   two writes): it is discarded, with its registration, before a new one is made. "Without a pod" is an
//!   uncached read, not the cache's word.
//! * **A first attempt learns of an earlier Secret from the API server's refusal.** A runner whose status shows no
//!   attempt at all (no phase, reason, identity or failure) and whose pod the cache does not show is registered
//!   without reading its Secret first: the Secret's creation is refused when one exists (a crash between creating
//!   it and recording the attempt), and the pass then removes the registration it just made and reads the Secret.
//!   A name the service already knows sends such a pass to read the Secret too, before any registration is
//!   removed. Every pod this controller creates has its Secret created before it, and a first attempt has none
//!   deleted, so a pod the cache does not show yet still makes the creation refused.
//! * **Nothing is registered for a runner that is going.** Before a registration (the one effect that cannot be
//!   undone by deleting objects), the runner itself is read from the API server: a runner deleted or finalized a
//!   moment ago, still alive in the cache, registers nothing.
//! * **A busy runner is never restarted.** A runner with a job (the listener's report or the service's refusal
//!   to deregister it) whose pod goes away is finished, not given a new pod.

use std::time::Duration;

use super::policy::PodVerdict;

/// What a pass knows about the runner's pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodFact {
    /// The cache shows none; the API server has not been asked.
    NotCached,
    /// The API server says there is none.
    Gone,
    /// A pod not being deleted, and what its state means.
    Live(PodVerdict),
    /// A pod being deleted (by us, a drain, an eviction, `kubectl delete`).
    Terminating {
        /// What its state means.
        verdict: PodVerdict,
        /// Its deletion deadline (set by the API server from the grace period) has passed: the node is not
        /// stopping it (a lost node, a stuck runtime).
        past_deadline: bool,
    },
}

/// What a pass knows about the runner's JIT config Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretFact {
    /// Not read in this pass.
    Unread,
    /// The API server says there is none.
    Absent,
    /// Present and readable.
    Valid,
    /// Present but unreadable (keys missing or malformed).
    Corrupt,
    /// Created in this pass: no pod can have used it yet.
    Fresh,
}

/// What a pass knows about the runner object itself, read from the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerFact {
    /// Not read in this pass (the cached copy is all there is).
    Unread,
    /// Exists, same uid, not being deleted.
    Live,
    /// Gone, replaced, or being deleted.
    Going,
}

/// Everything the decision reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The runner has a deletion timestamp.
    pub deleting: bool,
    /// The runner reached a terminal phase (Failed, Outdated, Succeeded): it only keeps its place.
    pub done: bool,
    /// One of the two runner finalizers is missing.
    pub finalizers_missing: bool,
    /// Counted pod failures so far.
    pub failures: usize,
    /// The budget of counted failures (more than this gives the runner up).
    pub max_failures: usize,
    /// The listener reported a job on the runner.
    pub has_job: bool,
    /// The service refused to deregister the runner in this pass: it holds a job the listener has not reported.
    pub service_busy: bool,
    /// The status records a registration (a runner id).
    pub registered: bool,
    /// Time left before the next pod may be created (after counted failures or disruptions).
    pub backoff: Option<Duration>,
    /// The last pod creation was refused by a quota or an admission check: try the next one dry first.
    pub rejected: bool,
    /// A dry-run creation passed in this pass.
    pub dry_run_passed: bool,
    /// The pod.
    pub pod: PodFact,
    /// The JIT Secret.
    pub secret: SecretFact,
    /// The runner, from the API server.
    pub fresh_runner: RunnerFact,
    /// No attempt shows in the status (no phase, reason, identity or failure), and this process remembers none (no
    /// disruption, no pod it created or failed to create). With no pod in the cache either, the Secret is not read
    /// before registering (its creation is refused if one exists).
    pub first_attempt: bool,
    /// The runner was made from an older template than its set's current one (by the set's cached copy): the
    /// set replaces it, so it registers nothing and starts no pod from the old template.
    pub outdated_template: bool,
}

/// The next step of a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    // Reads (the pass goes on).
    /// Read the JIT Secret from the API server.
    ReadSecret,
    /// Read the pod from the API server (the cache shows none while a Secret exists).
    ReadPod,
    /// Read the runner from the API server before registering.
    ReadRunner,

    // Writes after which the pass goes on.
    /// Add the missing finalizers.
    AddFinalizers,
    /// Remove the registration whose config a vanished pod may have consumed, then its Secret.
    DiscardConfig,
    /// The pod is going away and the runner is idle: remove its registration now, so the service gives it no
    /// job, and forget the identity.
    ReleaseIdle,
    /// Create the pod in dry-run mode: after a refusal, nothing is registered until the cluster would admit it.
    DryRunPod,
    /// Register the runner (a JIT config) and store the config in its Secret.
    Register,

    // Last steps of a pass.
    /// Deletion: deregister, delete the pod and the Secret, drop the finalizers.
    Finalize,
    /// A terminal runner: delete its pod and Secret, keep the object for the set.
    DeleteChildren,
    /// Too many counted failures: delete the runner, the set replaces it.
    GiveUp,
    /// Wait this long (failure or disruption backoff).
    Wait(Duration),
    /// The runner held a job and lost its pod: delete the runner (the job is the service's to fail or retry).
    FinishInterrupted,
    /// The idle runner's pod is going away: wait for it to be gone, then a new one follows.
    AwaitPodGone,
    /// The pod stays after its deletion deadline: delete the runner so the set replaces it elsewhere.
    GiveUpPlace,
    /// Create the pod from the Secret made in this pass.
    CreatePod,
    /// Follow the live pod (mirror its state, act on its end).
    Follow,
    /// The runner is going; nothing to do.
    Stop,
}

/// The next step for a runner, given what the pass has observed so far.
pub fn decide(facts: &Facts) -> Next {
    if facts.deleting {
        return Next::Finalize;
    }
    if facts.done {
        return Next::DeleteChildren;
    }
    if facts.finalizers_missing {
        return Next::AddFinalizers;
    }
    if super::policy::retries_exhausted(facts.failures, facts.max_failures) {
        return Next::GiveUp;
    }
    let busy = facts.has_job || facts.service_busy;
    match &facts.pod {
        // The identity a live pod runs under comes from the status, or from the Secret when the status does not
        // record it yet.
        PodFact::Live(_) if !facts.registered && facts.secret == SecretFact::Unread => {
            Next::ReadSecret
        }
        PodFact::Live(_) => Next::Follow,
        // A runner with a job whose container exited 0 finished it. An idle runner exits 0 too when its pod is
        // deleted or evicted (SIGTERM): that is a pod taken away, not a finished runner, and it gets a fresh
        // registration and pod like any idle runner whose pod was deleted.
        PodFact::Terminating { verdict, .. } if *verdict == PodVerdict::Succeeded && busy => {
            Next::Follow
        }
        PodFact::Terminating { .. } if busy => Next::FinishInterrupted,
        PodFact::Terminating { .. } if facts.registered => Next::ReleaseIdle,
        PodFact::Terminating {
            past_deadline: true,
            ..
        } => Next::GiveUpPlace,
        PodFact::Terminating { .. } => Next::AwaitPodGone,
        PodFact::NotCached | PodFact::Gone => without_pod(facts, busy),
    }
}

fn without_pod(facts: &Facts, busy: bool) -> Next {
    if let Some(wait) = facts.backoff.filter(|wait| !wait.is_zero()) {
        return Next::Wait(wait);
    }
    match facts.secret {
        SecretFact::Unread if !(facts.first_attempt && facts.pod == PodFact::NotCached) => {
            Next::ReadSecret
        }
        SecretFact::Unread | SecretFact::Absent if busy => Next::FinishInterrupted,
        SecretFact::Unread | SecretFact::Absent if facts.outdated_template => Next::Stop,
        SecretFact::Fresh => Next::CreatePod,
        SecretFact::Valid | SecretFact::Corrupt if facts.pod == PodFact::NotCached => Next::ReadPod,
        SecretFact::Valid | SecretFact::Corrupt if busy => Next::FinishInterrupted,
        SecretFact::Valid | SecretFact::Corrupt => Next::DiscardConfig,
        SecretFact::Unread | SecretFact::Absent => match facts.fresh_runner {
            RunnerFact::Unread => Next::ReadRunner,
            RunnerFact::Going => Next::Stop,
            RunnerFact::Live if facts.rejected && !facts.dry_run_passed => Next::DryRunPod,
            RunnerFact::Live => Next::Register,
        },
    }
}

/// What a teardown pass knows: a runner being deleted, or whose pod succeeded ([`super::facts::in_teardown`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TeardownFacts {
    /// The runner has a deletion timestamp (else its pod succeeded and the pass asks for its deletion).
    pub deleting: bool,
    /// Its cleanup finalizer is gone, or this process saw the API server accept the removal of its finalizers:
    /// the object is gone, and the pass runs on a cached copy from before.
    pub finalized: bool,
    /// This process saw the API server accept both the removal of its finalizers and its deletion (asked by
    /// someone, or in that pass): the object is gone, whatever a cached copy shows.
    pub gone: bool,
    /// Its registration finalizer is still there: a registration may be left to remove.
    pub registration_finalizer: bool,
    /// The cache shows its pod terminated: nothing runs in it any more.
    pub pod_terminated: bool,
    /// Its pod's container hooks may have made pods and Secrets of their own.
    pub container_hooks: bool,
    /// Its own finalizers are gone and only the one of an interrupted job's re-run holds it (super::rerun).
    pub rerun_owed: bool,
}

/// The first stage of a teardown: requests that depend on nothing, sent at once. The deregistration removes the
/// Secret once the service let go; a pod that may still run waits for that answer, which is the check that no
/// job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TeardownStart {
    /// Remove its registrations (and then its Secret).
    pub deregister: bool,
    /// Delete its terminated pod now (a runner being deleted: nothing else would).
    pub delete_terminated_pod: bool,
}

/// A teardown pass's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Teardown {
    /// The runner is gone already: at most ask for its deletion again, which is answered as done.
    Gone {
        /// Ask for its deletion.
        delete_self: bool,
    },
    /// Tear it down, starting with these.
    Start(TeardownStart),
    /// Torn down, deleted, and owed the re-run of its interrupted job: ask GitHub for it.
    Rerun,
}

/// The teardown's plan for a runner in the teardown lane.
pub fn plan_teardown(facts: &TeardownFacts) -> Teardown {
    let delete_self = !facts.deleting;
    if facts.rerun_owed && facts.deleting {
        return Teardown::Rerun;
    }
    if facts.finalized {
        // A cached copy from before a teardown of this process's own needs nothing more: asking again for the
        // deletion of what is gone would cost a request answered 404 (a pass that its pod's deletion event
        // brings, say).
        return Teardown::Gone {
            delete_self: delete_self && !facts.gone,
        };
    }
    Teardown::Start(TeardownStart {
        deregister: facts.registration_finalizer,
        // A runner whose pod succeeded loses the pod with its own deletion ([`TeardownEnd::Finish`]): were the pod
        // gone first, a restart between the two would find a live runner without a pod and make it a new one.
        delete_terminated_pod: facts.pod_terminated && facts.deleting,
    })
}

/// What is left once the first stage was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TeardownEnd {
    /// The service says the runner still runs a job: nothing more now; the removal is asked again later, and
    /// the pod keeps running.
    AwaitJob,
    /// The service let go: delete the hooks' objects, then at once the runner's own pod and Secret, its
    /// finalizers and, when its pod succeeded, the runner itself. Its deletion and its finalizers' removal go out
    /// together, one round trip for the last two writes of every finished runner: whichever the API server takes
    /// first, the runner is gone after both, and nothing is left for the finalizers to record (the registration
    /// is removed, the Secret and the pod are the runner's own, which the garbage collector deletes with it
    /// should their deletes fail).
    Finish {
        /// Ask for the runner's deletion (its pod succeeded; nobody asked yet).
        delete_self: bool,
        /// Delete the pod (not deleted in the first stage).
        delete_pod: bool,
        /// Delete the pods and Secrets its container hooks made.
        delete_hook_objects: bool,
    },
}

/// The rest of a teardown, given whether the service agreed to remove the runner's registrations.
pub fn after_deregistration(facts: &TeardownFacts, removal_agreed: bool) -> TeardownEnd {
    if !removal_agreed {
        return TeardownEnd::AwaitJob;
    }
    TeardownEnd::Finish {
        delete_self: !facts.deleting,
        delete_pod: !(facts.pod_terminated && facts.deleting),
        delete_hook_objects: facts.container_hooks,
    }
}

/// Which registrations a runner's deregistration removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deregistration {
    /// Registration ids to remove, each once.
    pub remove: Vec<i64>,
    /// Nothing records a registration: ask the service for one under the runner's name (a crash between
    /// registering and recording).
    pub look_up_by_name: bool,
}

/// The registrations to remove: the one the status records and the one the JIT Secret records (each 0 when
/// none), which differ when a later attempt's Secret was made and the status write after it failed; those this
/// process removed already (`removed`) are not asked again.
pub fn deregistration(
    recorded: i64,
    in_secret: i64,
    removed: impl Fn(i64) -> bool,
) -> Deregistration {
    let mut known: Vec<i64> = [recorded, in_secret]
        .into_iter()
        .filter(|id| *id != 0)
        .collect();
    known.dedup();
    Deregistration {
        look_up_by_name: known.is_empty(),
        remove: known.into_iter().filter(|id| !removed(*id)).collect(),
    }
}

/// Whether the service removed registration `recorded` (the one the runner's status records; 0: none) by itself,
/// so that asking it to would only cost a call: the listener recorded a job started on that very registration
/// (`job_started`; its write is refused when the status records another, docs/runner-lifecycle.md, "The happy
/// path") and its set's completed-runners listing names the registration's job as completed. The service removes an
/// ephemeral runner as the one job it ran completes. A job completion alone is not enough: an assignment the
/// service takes back before the job starts also ends in `JobCompleted` naming the runner, and the runner stays
/// registered (and free for another job). An entry without a registration (a listener of an earlier release)
/// names none.
pub fn released_with_job(
    name: &str,
    recorded: i64,
    job_started: bool,
    listing: &[crds::listing::CompletedRunner],
) -> bool {
    recorded != 0
        && job_started
        && listing
            .iter()
            .any(|entry| entry.name == name && entry.runner_id == recorded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ephemeral_runner::policy::PodFailure;
    use proptest::prelude::*;

    fn fresh() -> Facts {
        Facts {
            deleting: false,
            done: false,
            finalizers_missing: false,
            failures: 0,
            max_failures: 5,
            has_job: false,
            service_busy: false,
            registered: false,
            backoff: None,
            rejected: false,
            dry_run_passed: false,
            pod: PodFact::NotCached,
            secret: SecretFact::Unread,
            fresh_runner: RunnerFact::Unread,
            outdated_template: false,
            first_attempt: false,
        }
    }

    fn progress() -> PodVerdict {
        PodVerdict::Progress {
            phase: "Running".to_owned(),
            ready: true,
            reason: String::new(),
            message: String::new(),
        }
    }

    fn failed() -> PodVerdict {
        PodVerdict::Failed(PodFailure {
            counted: true,
            class: "runner_exit",
            reason: "RunnerExited".to_owned(),
            message: "exit 1".to_owned(),
        })
    }

    #[test]
    fn a_new_runner_reads_then_registers_then_creates_its_pod() {
        let mut facts = fresh();
        assert_eq!(decide(&facts), Next::ReadSecret);
        facts.secret = SecretFact::Absent;
        assert_eq!(decide(&facts), Next::ReadRunner);
        facts.fresh_runner = RunnerFact::Live;
        assert_eq!(decide(&facts), Next::Register);
        facts.secret = SecretFact::Fresh;
        assert_eq!(decide(&facts), Next::CreatePod);
    }

    #[test]
    fn a_first_attempt_registers_without_reading_the_secret() {
        let mut facts = fresh();
        facts.first_attempt = true;
        assert_eq!(
            decide(&facts),
            Next::ReadRunner,
            "the fence still comes first"
        );
        facts.fresh_runner = RunnerFact::Live;
        assert_eq!(decide(&facts), Next::Register);
        // The Secret's creation was refused: the pass reads it, as any other attempt does.
        facts.first_attempt = false;
        assert_eq!(decide(&facts), Next::ReadSecret);
        // A pod in the cache is an attempt, whatever the status says.
        facts.first_attempt = true;
        facts.pod = PodFact::Gone;
        assert_eq!(decide(&facts), Next::ReadSecret);
    }

    #[test]
    fn a_first_attempt_refused_finds_the_pod_the_cache_did_not_show() {
        let mut facts = fresh();
        facts.first_attempt = true;
        facts.fresh_runner = RunnerFact::Live;
        assert_eq!(decide(&facts), Next::Register);
        // The Secret's creation was refused (a pod made moments ago has it): read it, then the pod, and follow.
        facts.first_attempt = false;
        assert_eq!(decide(&facts), Next::ReadSecret);
        facts.secret = SecretFact::Valid;
        assert_eq!(decide(&facts), Next::ReadPod);
        facts.pod = PodFact::Live(PodVerdict::Wait);
        assert_eq!(decide(&facts), Next::Follow);
    }

    #[test]
    fn a_first_attempt_of_an_outdated_or_busy_runner_registers_nothing() {
        let mut facts = fresh();
        facts.first_attempt = true;
        facts.outdated_template = true;
        assert_eq!(decide(&facts), Next::Stop);
        facts.outdated_template = false;
        facts.has_job = true;
        assert_eq!(decide(&facts), Next::FinishInterrupted);
    }

    #[test]
    fn a_secret_without_a_pod_is_confirmed_then_discarded() {
        let mut facts = fresh();
        facts.registered = true;
        facts.secret = SecretFact::Valid;
        assert_eq!(
            decide(&facts),
            Next::ReadPod,
            "the cache's word is not enough"
        );
        facts.pod = PodFact::Gone;
        assert_eq!(decide(&facts), Next::DiscardConfig);
        facts.has_job = true;
        assert_eq!(decide(&facts), Next::FinishInterrupted);
    }

    #[test]
    fn a_runner_going_away_registers_nothing() {
        let mut facts = fresh();
        facts.secret = SecretFact::Absent;
        facts.fresh_runner = RunnerFact::Going;
        assert_eq!(decide(&facts), Next::Stop);
    }

    #[test]
    fn a_pod_deleted_by_someone_else() {
        let mut facts = fresh();
        facts.registered = true;
        facts.pod = PodFact::Terminating {
            verdict: progress(),
            past_deadline: false,
        };
        assert_eq!(decide(&facts), Next::ReleaseIdle);
        facts.registered = false;
        assert_eq!(decide(&facts), Next::AwaitPodGone);
        facts.pod = PodFact::Terminating {
            verdict: progress(),
            past_deadline: true,
        };
        assert_eq!(decide(&facts), Next::GiveUpPlace);
        facts.service_busy = true;
        assert_eq!(decide(&facts), Next::FinishInterrupted);
        facts.pod = PodFact::Terminating {
            verdict: PodVerdict::Succeeded,
            past_deadline: false,
        };
        assert_eq!(decide(&facts), Next::Follow, "exit 0 is a finished runner");
    }

    #[test]
    fn an_idle_runner_exiting_0_as_its_pod_is_evicted_is_not_finished() {
        let mut facts = fresh();
        facts.registered = true;
        facts.pod = PodFact::Terminating {
            verdict: PodVerdict::Succeeded,
            past_deadline: false,
        };
        assert_eq!(decide(&facts), Next::ReleaseIdle);
        facts.registered = false;
        assert_eq!(decide(&facts), Next::AwaitPodGone);
        facts.has_job = true;
        assert_eq!(
            decide(&facts),
            Next::Follow,
            "with a job, exit 0 finished it"
        );
    }

    #[test]
    fn a_runner_of_an_older_template_starts_nothing() {
        let mut facts = fresh();
        facts.secret = SecretFact::Absent;
        facts.outdated_template = true;
        assert_eq!(decide(&facts), Next::Stop);
    }

    #[test]
    fn after_a_refusal_the_next_pod_is_tried_dry_first() {
        let mut facts = fresh();
        facts.rejected = true;
        facts.secret = SecretFact::Absent;
        facts.fresh_runner = RunnerFact::Live;
        assert_eq!(decide(&facts), Next::DryRunPod);
        facts.dry_run_passed = true;
        assert_eq!(decide(&facts), Next::Register);
    }

    #[test]
    fn backoff_comes_before_any_registration() {
        let mut facts = fresh();
        facts.backoff = Some(Duration::from_secs(5));
        assert_eq!(decide(&facts), Next::Wait(Duration::from_secs(5)));
    }

    fn arb_verdict() -> impl Strategy<Value = PodVerdict> {
        prop_oneof![
            Just(PodVerdict::Wait),
            Just(progress()),
            Just(PodVerdict::Succeeded),
            Just(PodVerdict::Outdated),
            Just(failed()),
        ]
    }

    fn arb_pod() -> impl Strategy<Value = PodFact> {
        prop_oneof![
            Just(PodFact::NotCached),
            Just(PodFact::Gone),
            arb_verdict().prop_map(PodFact::Live),
            (arb_verdict(), any::<bool>()).prop_map(|(verdict, past_deadline)| {
                PodFact::Terminating {
                    verdict,
                    past_deadline,
                }
            }),
        ]
    }

    /// What the API server may answer to a read.
    #[derive(Debug, Clone)]
    struct World {
        secret: SecretFact,
        pod: PodFact,
        runner: RunnerFact,
        service_busy: bool,
        dry_run_ok: bool,
    }

    fn arb_world() -> impl Strategy<Value = World> {
        (
            prop_oneof![
                Just(SecretFact::Absent),
                Just(SecretFact::Valid),
                Just(SecretFact::Corrupt)
            ],
            arb_pod().prop_filter("the API server answers", |pod| *pod != PodFact::NotCached),
            prop_oneof![Just(RunnerFact::Live), Just(RunnerFact::Going)],
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(secret, pod, runner, service_busy, dry_run_ok)| World {
                secret,
                pod,
                runner,
                service_busy,
                dry_run_ok,
            })
    }

    prop_compose! {
        fn arb_facts()(
            deleting in any::<bool>(),
            done in any::<bool>(),
            finalizers_missing in any::<bool>(),
            failures in 0usize..8,
            has_job in any::<bool>(),
            registered in any::<bool>(),
            backoff in proptest::option::of(0u64..10),
            rejected in any::<bool>(),
            pod in arb_pod(),
            outdated_template in any::<bool>(),
            first_attempt in any::<bool>(),
        ) -> Facts {
            Facts {
                deleting, done, finalizers_missing, failures, max_failures: 5, has_job,
                service_busy: false, registered, backoff: backoff.map(Duration::from_secs), rejected,
                dry_run_passed: false, pod, secret: SecretFact::Unread, fresh_runner: RunnerFact::Unread,
                outdated_template, first_attempt,
            }
        }
    }

    /// Runs a pass the way the executor does, against `world`; returns the steps taken.
    fn run_pass(mut facts: Facts, world: &World) -> Vec<Next> {
        let mut steps = Vec::new();
        loop {
            let next = decide(&facts);
            steps.push(next);
            assert!(
                steps.len() <= 12,
                "a pass ends in a bounded number of steps: {steps:?}"
            );
            match next {
                Next::ReadSecret => facts.secret = world.secret,
                Next::ReadPod => facts.pod = world.pod.clone(),
                Next::ReadRunner => facts.fresh_runner = world.runner,
                Next::AddFinalizers => facts.finalizers_missing = false,
                Next::DiscardConfig | Next::ReleaseIdle => {
                    if world.service_busy {
                        facts.service_busy = true;
                    } else {
                        facts.registered = false;
                        if next == Next::DiscardConfig {
                            facts.secret = SecretFact::Absent;
                        }
                    }
                }
                Next::DryRunPod => {
                    if !world.dry_run_ok {
                        return steps;
                    }
                    facts.dry_run_passed = true;
                }
                // Unread, the Secret may exist: its creation is refused then, or the service knows the name.
                Next::Register
                    if facts.secret == SecretFact::Unread && world.secret != SecretFact::Absent =>
                {
                    facts.first_attempt = false;
                }
                Next::Register => {
                    facts.secret = SecretFact::Fresh;
                    facts.registered = true;
                }
                _ => return steps,
            }
        }
    }

    #[test]
    fn a_teardown_removes_every_recorded_registration_once() {
        let none = |_| false;
        assert_eq!(
            deregistration(7, 0, none),
            Deregistration {
                remove: vec![7],
                look_up_by_name: false
            }
        );
        assert_eq!(
            deregistration(7, 9, none),
            Deregistration {
                remove: vec![7, 9],
                look_up_by_name: false
            },
            "the Secret's later registration as well"
        );
        assert_eq!(deregistration(7, 7, none).remove, vec![7]);
        assert_eq!(
            deregistration(0, 0, none),
            Deregistration {
                remove: vec![],
                look_up_by_name: true
            }
        );
        assert_eq!(
            deregistration(7, 9, |id| id == 7),
            Deregistration {
                remove: vec![9],
                look_up_by_name: false
            },
            "removed by the set's scale-down already"
        );
    }

    fn arb_teardown() -> impl Strategy<Value = TeardownFacts> {
        (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(
                |(
                    deleting,
                    gone,
                    finalized,
                    registration_finalizer,
                    pod_terminated,
                    container_hooks,
                    rerun_owed,
                )| {
                    TeardownFacts {
                        deleting,
                        // Gone only after this process finalized it.
                        gone: gone && finalized,
                        finalized,
                        registration_finalizer,
                        pod_terminated,
                        container_hooks,
                        // Owed only once its own finalizers are gone.
                        rerun_owed: rerun_owed && finalized,
                    }
                },
            )
    }

    proptest! {
        /// Whatever the teardown finds: a pod that may still run is deleted only once the service agreed to the
        /// deregistration; a runner whose pod succeeded is asked to be deleted once the service agreed, with its
        /// pod; a finalized one gets nothing but that request; and the registration finalizer always leads to a
        /// deregistration.
        #[test]
        fn a_teardown_never_stops_a_pod_before_the_service_agreed(facts in arb_teardown(), agreed in any::<bool>()) {
            match plan_teardown(&facts) {
                Teardown::Rerun => prop_assert!(facts.rerun_owed && facts.deleting),
                Teardown::Gone { delete_self } => {
                    prop_assert!(facts.finalized);
                    prop_assert_eq!(delete_self, !facts.deleting && !facts.gone);
                }
                Teardown::Start(start) => {
                    prop_assert!(!facts.finalized);
                    prop_assert_eq!(start.deregister, facts.registration_finalizer);
                    prop_assert!(!start.delete_terminated_pod || facts.pod_terminated);
                    // A live runner keeps its pod until it is deleted itself: a pod never goes first.
                    prop_assert!(!start.delete_terminated_pod || facts.deleting);
                    match after_deregistration(&facts, agreed) {
                        TeardownEnd::AwaitJob => prop_assert!(!agreed),
                        TeardownEnd::Finish { delete_self, delete_pod, delete_hook_objects } => {
                            prop_assert!(agreed);
                            // A runner whose pod succeeded is deleted, once the service let go.
                            prop_assert_eq!(delete_self, !facts.deleting);
                            // Every pod goes: in the first stage when terminated, here otherwise.
                            prop_assert!(delete_pod != start.delete_terminated_pod);
                            prop_assert_eq!(delete_hook_objects, facts.container_hooks);
                        }
                    }
                }
            }
        }

        #[test]
        fn a_deregistration_covers_both_records(recorded in 0i64..4, in_secret in 0i64..4, done in 0i64..4) {
            let plan = deregistration(recorded, in_secret, |id| id == done);
            for id in [recorded, in_secret] {
                if id != 0 && id != done {
                    prop_assert!(plan.remove.contains(&id));
                }
            }
            prop_assert!(!plan.remove.contains(&done) || done == 0);
            prop_assert!(!plan.remove.contains(&0));
            prop_assert_eq!(plan.look_up_by_name, recorded == 0 && in_secret == 0);
            let mut unique = plan.remove.clone();
            unique.dedup();
            prop_assert_eq!(unique, plan.remove);
        }
    }

    proptest! {
        #[test]
        fn every_pass_ends_and_keeps_the_invariants(facts in arb_facts(), world in arb_world()) {
            let steps = run_pass(facts.clone(), &world);
            let last = *steps.last().expect("a step");
            // A pod is created only from a config made in the same pass: never a JIT config used twice.
            if last == Next::CreatePod {
                prop_assert!(steps.contains(&Next::Register), "{steps:?}");
            }
            // Never two live pods: nothing is registered (and so no pod created) while the pass has seen a pod,
            // in the cache or from the API server.
            let alive = |pod: &PodFact| matches!(pod, PodFact::Live(_) | PodFact::Terminating { .. });
            // What the lifecycle rests on for a first attempt: a pod this controller made has a Secret.
            prop_assume!(!(facts.first_attempt && alive(&world.pod) && world.secret == SecretFact::Absent));
            // A registration that took (a pod follows in the same pass; a first attempt refused registers nothing).
            if steps.contains(&Next::CreatePod) {
                prop_assert!(!alive(&facts.pod), "{steps:?}");
                prop_assert!(!steps.contains(&Next::ReadPod) || !alive(&world.pod), "{steps:?}");
            }
            if steps.contains(&Next::Register) {
                prop_assert!(!alive(&facts.pod), "{steps:?}");
                // A Secret is created only where none is: read absent, or a first attempt's creation not refused.
                prop_assert!(
                    !steps.contains(&Next::CreatePod)
                        || world.secret == SecretFact::Absent
                        || steps.contains(&Next::DiscardConfig),
                    "{steps:?}"
                );
                // Nothing is registered for a runner the API server says is going.
                prop_assert!(steps.contains(&Next::ReadRunner) && world.runner == RunnerFact::Live);
                // A busy runner never gets a new pod, nor one of an older template.
                prop_assert!(!facts.has_job, "{steps:?}");
                prop_assert!(!facts.outdated_template, "{steps:?}");
            }
            // A busy runner is never released or discarded as if idle.
            if facts.has_job {
                prop_assert!(!steps.contains(&Next::DiscardConfig) && !steps.contains(&Next::ReleaseIdle));
            }
            // A deleting runner only finalizes.
            if facts.deleting {
                prop_assert_eq!(steps, vec![Next::Finalize]);
            }
        }
    }

    #[test]
    fn only_a_started_job_listed_under_the_same_registration_released_it() {
        use crds::listing::CompletedRunner;
        let listed = [CompletedRunner::new("r", 7), CompletedRunner::new("old", 0)];
        assert!(released_with_job("r", 7, true, &listed));
        // The job never started on it: an assignment taken back leaves the runner registered.
        assert!(!released_with_job("r", 7, false, &listed));
        // Another registration of the same runner, or none recorded.
        assert!(!released_with_job("r", 8, true, &listed));
        assert!(!released_with_job("r", 0, true, &listed));
        // An entry without a registration names none; another runner's entry says nothing.
        assert!(!released_with_job("old", 3, true, &listed));
        assert!(!released_with_job("s", 7, true, &listed));
        assert!(!released_with_job("r", 7, true, &[]));
    }
}
