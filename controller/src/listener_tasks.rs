//! The manager's listener mode (`--listener-mode=manager`, docs/listener-modes.md): each AutoscalingListener's
//! message loop runs as a task of the manager, the listener crate's own loop (the one the listener binary runs),
//! instead of in a pod of its own.
//!
//! One owner for each effect: the AutoscalingListener controller starts, restarts and stops the tasks; the
//! AutoscalingRunnerSet controller only reads how they run (its `ListenerReady` condition); the manager stops them
//! all once its controllers have stopped and before it gives up the Lease, so every loop closes its session first
//! and the next leader opens its own at once. Each task is isolated: its own Actions client, backoff and errors; a
//! loop that fails or panics ends only its own task, and its listener's pass learns of it at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crds::AutoscalingListener;
use futures::channel::mpsc;
use futures::future::BoxFuture;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;
use listener::app::MetricsSource;
use listener::error::Category;
use listener::status::Report;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::context::lock;

/// How a task's loop ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It was stopped (its session closed).
    Stopped,
    /// It failed or panicked: why, as logged.
    Failed(String),
}

/// What the controllers see of one listener's task.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskView {
    /// The listener's uid when the task started (a listener recreated under the same name is another).
    pub uid: String,
    /// The digest of the inputs the loop runs with (its config, and a vault's credentials).
    pub inputs: String,
    /// When the task started.
    pub started: Timestamp,
    /// Whether the loop holds its message session now.
    pub session_held: bool,
    /// The session it holds, or last held.
    pub session: Option<String>,
    /// Whether the loop is failing because the service refuses it a session: another holds one.
    pub conflict: bool,
    /// The predecessor's session the loop deleted before creating its own.
    pub predecessor: Option<String>,
    /// How the loop ended, once it has.
    pub ended: Option<Ended>,
    /// Whether the listener pod's objects (of the pod mode, or an earlier manager's) were deleted since the loop
    /// started: they go once it holds the session, never before.
    pub pod_objects_deleted: bool,
}

struct Task {
    uid: String,
    inputs: String,
    predecessor: Option<String>,
    started: Timestamp,
    stop: CancellationToken,
    /// Ends once the loop has ended (its session closed) and its end is recorded.
    done: JoinHandle<()>,
    report: watch::Receiver<Report>,
    metrics: Option<MetricsSource>,
    ended: Arc<Mutex<Option<Ended>>>,
    rewriter: Option<Arc<Notify>>,
    pod_objects_deleted: bool,
}

/// Whether a report says the loop holds its session, and whether the service refuses it one (another holds it).
fn session_state(report: &Report) -> (bool, bool) {
    let conflict = report.failing()
        && report
            .last_error
            .as_ref()
            .is_some_and(|error| error.category == Category::SessionConflict.as_str());
    (report.session_held, conflict)
}

impl Task {
    fn view(&self) -> TaskView {
        let report = self.report.borrow();
        let (session_held, conflict) = session_state(&report);
        TaskView {
            uid: self.uid.clone(),
            inputs: self.inputs.clone(),
            started: self.started,
            session_held,
            session: report.session.as_ref().map(|(id, _)| id.clone()),
            conflict,
            predecessor: self.predecessor.clone(),
            ended: lock(&self.ended).clone(),
            pod_objects_deleted: self.pod_objects_deleted,
        }
    }
}

/// What the supervision of one loop needs of it: its reports, its metrics, a way to have its status written again,
/// and the loop itself, run until the token is cancelled.
struct LoopParts {
    report: watch::Receiver<Report>,
    metrics: Option<MetricsSource>,
    rewriter: Option<Arc<Notify>>,
    run: Box<dyn FnOnce(CancellationToken) -> BoxFuture<'static, listener::Result<()>> + Send>,
}

/// The listener loops this manager runs, by AutoscalingListener.
pub struct ListenerTasks {
    /// The loops' Kubernetes client (their runner set patches, runner status patches and status reports).
    client: kube::Client,
    tasks: Mutex<HashMap<ObjectRef<AutoscalingListener>, Task>>,
    /// Brings a listener's pass back when its loop ends.
    ended: mpsc::UnboundedSender<ObjectRef<AutoscalingListener>>,
}

impl ListenerTasks {
    /// No tasks yet, whose loops will use `client`, and the stream of listeners whose loop ended or whose session
    /// changed, for the AutoscalingListener controller.
    pub fn new(
        client: kube::Client,
    ) -> (
        Self,
        mpsc::UnboundedReceiver<ObjectRef<AutoscalingListener>>,
    ) {
        let (ended, endings) = mpsc::unbounded();
        let tasks = Self {
            client,
            tasks: Mutex::default(),
            ended,
        };
        (tasks, endings)
    }

    /// The loops' Kubernetes client.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The task of `key`, if one was started and not stopped since.
    pub fn view(&self, key: &ObjectRef<AutoscalingListener>) -> Option<TaskView> {
        lock(&self.tasks).get(key).map(Task::view)
    }

    /// Runs `listener` as the task of `key`: the listener of uid `uid`, from `inputs`, which deletes session
    /// `predecessor` before it creates its own. A task `key` had is stopped first: never two loops for one scale set.
    pub async fn start(
        &self,
        key: ObjectRef<AutoscalingListener>,
        ids: (&str, &str),
        predecessor: Option<String>,
        listener: listener::Listener,
    ) {
        let parts = LoopParts {
            report: listener.status(),
            metrics: listener.metrics(),
            rewriter: listener.status_rewriter(),
            run: Box::new(move |stop| Box::pin(listener.run(stop))),
        };
        self.start_loop(key, ids, predecessor, parts).await;
    }

    /// [`ListenerTasks::start`] for a loop given by its parts.
    async fn start_loop(
        &self,
        key: ObjectRef<AutoscalingListener>,
        (uid, inputs): (&str, &str),
        predecessor: Option<String>,
        parts: LoopParts,
    ) {
        self.stop(&key).await;
        let stop = CancellationToken::new();
        let LoopParts {
            report,
            metrics,
            rewriter,
            run,
        } = parts;
        let ended = Arc::new(Mutex::new(None));
        // Every line the loop logs names its listener: one log carries every set's.
        let name = format!(
            "{}/{}",
            key.namespace.as_deref().unwrap_or_default(),
            key.name
        );
        // Not a child of the pass that started it: the loop outlives it.
        let span = tracing::info_span!(parent: None, "listener", listener = %name);
        let mut run = tokio::spawn(run(stop.clone()).instrument(span));
        let (record, wake, woken) = (Arc::clone(&ended), self.ended.clone(), key.clone());
        let mut reports = report.clone();
        let done = tokio::spawn(async move {
            // The listener's pass hears of each change of the session (the pod objects go once it is held; the
            // status events that carry it do not start a pass), of a refusal of the session (another holds it) and
            // of the loop's end.
            let mut seen = session_state(&reports.borrow_and_update());
            let joined = loop {
                tokio::select! {
                    joined = &mut run => break joined,
                    changed = reports.changed() => {
                        let now = if changed.is_ok() {
                            session_state(&reports.borrow_and_update())
                        } else {
                            (false, false)
                        };
                        if now != seen {
                            seen = now;
                            let _ = wake.unbounded_send(woken.clone());
                        }
                        if changed.is_err() {
                            break (&mut run).await;
                        }
                    }
                }
            };
            let outcome = match joined {
                Ok(Ok(())) => Ended::Stopped,
                Ok(Err(error)) => Ended::Failed(listener::listener::error_chain(&error)),
                Err(error) if error.is_panic() => {
                    Ended::Failed(format!("the listener loop panicked: {}", panic_text(error)))
                }
                Err(_) => Ended::Failed("the listener loop was cancelled".to_owned()),
            };
            if let Ended::Failed(why) = &outcome {
                tracing::warn!(listener = %woken, error = %why, "a listener loop ended");
            }
            *lock(&record) = Some(outcome);
            // None listens once the controllers have stopped.
            let _ = wake.unbounded_send(woken);
        });
        let task = Task {
            uid: uid.to_owned(),
            inputs: inputs.to_owned(),
            predecessor,
            started: Timestamp::now(),
            stop,
            done,
            report,
            metrics,
            ended,
            rewriter,
            pod_objects_deleted: false,
        };
        lock(&self.tasks).insert(key, task);
    }

    /// Records that the listener pod's objects were deleted for the task of `key`.
    pub fn pod_objects_deleted(&self, key: &ObjectRef<AutoscalingListener>) {
        if let Some(task) = lock(&self.tasks).get_mut(key) {
            task.pod_objects_deleted = true;
        }
    }

    /// Has the task of `key` write its listener's status again at once.
    pub fn rewrite_status(&self, key: &ObjectRef<AutoscalingListener>) {
        if let Some(rewriter) = lock(&self.tasks)
            .get(key)
            .and_then(|task| task.rewriter.clone())
        {
            rewriter.notify_one();
        }
    }

    /// Stops the task of `key`, if there is one, and waits until its loop has closed its session; returns whether
    /// there was one.
    pub async fn stop(&self, key: &ObjectRef<AutoscalingListener>) -> bool {
        let task = lock(&self.tasks).remove(key);
        let Some(task) = task else {
            return false;
        };
        task.stop.cancel();
        // A panic in it is recorded and logged by the task itself.
        let _ = task.done.await;
        true
    }

    /// Stops every task at once and waits until each has closed its session: the manager's last step before it
    /// releases the Lease, so the next leader's loops are not refused as second sessions.
    pub async fn stop_all(&self) {
        let tasks: Vec<Task> = lock(&self.tasks).drain().map(|(_, task)| task).collect();
        if tasks.is_empty() {
            return;
        }
        tracing::info!(listeners = tasks.len(), "closing the listeners' sessions");
        for task in &tasks {
            task.stop.cancel();
        }
        futures::future::join_all(tasks.into_iter().map(|task| task.done)).await;
    }

    /// Every running listener's metrics in the text format, one text per listener.
    pub fn encode_metrics(&self) -> Vec<String> {
        let sources: Vec<MetricsSource> = lock(&self.tasks)
            .values()
            .filter_map(|task| task.metrics.clone())
            .collect();
        sources
            .iter()
            .filter_map(|source| source.encode().ok())
            .collect()
    }

    /// How many tasks run.
    pub fn len(&self) -> usize {
        lock(&self.tasks).len()
    }

    /// Whether no task runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The message a panic carried, when it was text.
fn panic_text(error: tokio::task::JoinError) -> String {
    let payload = error.into_panic();
    payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::*;

    fn key(name: &str) -> ObjectRef<AutoscalingListener> {
        ObjectRef::new(name).within("arc")
    }

    fn parts(
        run: impl FnOnce(CancellationToken) -> BoxFuture<'static, listener::Result<()>> + Send + 'static,
    ) -> (LoopParts, watch::Sender<Report>) {
        let (reports, report) = watch::channel(Report::default());
        let parts = LoopParts {
            report,
            metrics: None,
            rewriter: None,
            run: Box::new(run),
        };
        (parts, reports)
    }

    async fn tasks() -> (
        ListenerTasks,
        mpsc::UnboundedReceiver<ObjectRef<AutoscalingListener>>,
    ) {
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("url"));
        ListenerTasks::new(kube::Client::try_from(config).expect("client"))
    }

    #[tokio::test]
    async fn a_panicking_loop_ends_only_its_own_task_and_its_pass_hears_of_it() {
        let (tasks, mut endings) = tasks().await;
        let (panicking, _a) = parts(|_| Box::pin(async { panic!("boom") }));
        let (running, b) = parts(|stop| {
            Box::pin(async move {
                stop.cancelled().await;
                Ok(())
            })
        });
        tasks
            .start_loop(key("a"), ("u1", "h"), None, panicking)
            .await;
        tasks
            .start_loop(key("b"), ("u2", "h"), Some("old".to_owned()), running)
            .await;
        let woken = tokio::time::timeout(Duration::from_secs(5), endings.next())
            .await
            .expect("woken");
        assert_eq!(woken, Some(key("a")));
        let ended = tasks.view(&key("a")).expect("a").ended;
        assert_eq!(
            ended,
            Some(Ended::Failed("the listener loop panicked: boom".to_owned()))
        );
        // The other loop runs on, and hears of its session.
        let other = tasks.view(&key("b")).expect("b");
        assert_eq!(
            (other.ended, other.predecessor.as_deref()),
            (None, Some("old"))
        );
        b.send_modify(|report| {
            report.session_held = true;
            report.session = Some(("s".to_owned(), "m".to_owned()));
        });
        let woken = tokio::time::timeout(Duration::from_secs(5), endings.next())
            .await
            .expect("woken");
        assert_eq!(woken, Some(key("b")));
        let held = tasks.view(&key("b")).expect("b");
        assert!(held.session_held);
        assert_eq!(held.session.as_deref(), Some("s"));
        // Stopping them all waits for each loop's end.
        tasks.stop_all().await;
        assert!(tasks.is_empty());
    }

    #[tokio::test]
    async fn a_new_start_stops_the_old_loop_first() {
        let (tasks, _endings) = tasks().await;
        let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&stopped);
        let (first, _a) = parts(move |stop| {
            Box::pin(async move {
                stop.cancelled().await;
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            })
        });
        tasks.start_loop(key("a"), ("u", "h1"), None, first).await;
        let (second, _b) = parts(|stop| {
            Box::pin(async move {
                stop.cancelled().await;
                Ok(())
            })
        });
        tasks.start_loop(key("a"), ("u", "h2"), None, second).await;
        assert!(
            stopped.load(std::sync::atomic::Ordering::SeqCst),
            "the first loop ended before the second began"
        );
        assert_eq!(tasks.view(&key("a")).expect("a").inputs, "h2");
        assert_eq!(tasks.len(), 1);
        tasks.stop_all().await;
    }
}
