//! One budget of Kubernetes requests waiting for the API server's answer, shared by the manager's two clients
//! (`--k8s-client-max-in-flight`): the main lane (every controller) waits for room in it; the teardown lane
//! (deleting finished runners) never waits, but each of its requests in flight takes a place the main lane cannot
//! use until it is answered. The watches are outside it (`Manager::with_watch_client`).
//!
//! Why: on a busy API server every request waits behind those already in it, so a finished runner's deletes queue
//! behind a burst's creations even on a client of their own. Holding the burst back while teardown requests are
//! out gives them the server's attention, and costs the burst nothing when nothing is being torn down
//! (docs/benchmarks.md, "Teardown").
//!
//! As with [`crate::ratelimit`], kube calls `poll_ready` of the stack for one request at a time (behind its
//! buffer), so the main lane's wait there holds back the requests queued behind it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tower::{Layer, Service};

/// Which of the two clients a request comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Everything but runner teardown: waits for room in the budget.
    Main,
    /// Runner teardown: never waits; its requests in flight shrink the main lane's room.
    Teardown,
}

/// The places the main lane always keeps, however many teardown requests are out: a teardown that floods the
/// budget slows the controllers down but never stops them (a quarter of the budget, at least one).
pub fn main_lane_floor(max: usize) -> usize {
    (max / 4).max(1)
}

/// Whether the main lane may send one more request, with `main` of its own and `teardown` of the teardown lane's
/// waiting for answers in a budget of `max`.
pub fn main_may_send(main: usize, teardown: usize, max: usize) -> bool {
    main < max.saturating_sub(teardown).max(main_lane_floor(max))
}

/// The shared budget; [`Self::layer`] gives each client its lane's layer.
#[derive(Debug, Clone)]
pub struct InFlightBudget {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    max: usize,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    main: usize,
    teardown: usize,
    /// The main lane's `poll_ready` waiting for room (one per client stack).
    waiting: Vec<Waker>,
}

impl Shared {
    fn counts(&self) -> MutexGuard<'_, Counts> {
        // The counts stay consistent whatever panicked while they were held: every change is one statement.
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl InFlightBudget {
    /// A budget of `max` requests in flight (at least one).
    pub fn new(max: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                max: max.max(1),
                counts: Mutex::default(),
            }),
        }
    }

    /// The layer that counts one client's requests in this budget as `lane`'s.
    pub fn layer(&self, lane: Lane) -> InFlightLayer {
        InFlightLayer {
            shared: self.shared.clone(),
            lane,
        }
    }

    /// Requests of each lane waiting for answers now (main, teardown).
    #[cfg(test)]
    fn in_flight(&self) -> (usize, usize) {
        let counts = self.shared.counts();
        (counts.main, counts.teardown)
    }
}

/// A place in the budget, given back when dropped: when the request's answer (for a watch, its stream's opening)
/// arrives, or when the request is abandoned.
#[derive(Debug)]
struct Place {
    shared: Arc<Shared>,
    lane: Lane,
}

impl Place {
    /// Takes a place for `lane` if it may have one now; else registers `waker` for when a place is given back.
    fn take(shared: &Arc<Shared>, lane: Lane, waker: &Waker) -> Option<Self> {
        let mut counts = shared.counts();
        match lane {
            Lane::Teardown => counts.teardown += 1,
            Lane::Main if main_may_send(counts.main, counts.teardown, shared.max) => {
                counts.main += 1;
            }
            Lane::Main => {
                if !counts.waiting.iter().any(|w| w.will_wake(waker)) {
                    counts.waiting.push(waker.clone());
                }
                return None;
            }
        }
        Some(Self {
            shared: shared.clone(),
            lane,
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let waiting = {
            let mut counts = self.shared.counts();
            match self.lane {
                Lane::Main => counts.main -= 1,
                Lane::Teardown => counts.teardown -= 1,
            }
            std::mem::take(&mut counts.waiting)
        };
        waiting.into_iter().for_each(Waker::wake);
    }
}

/// Layer counting a client's requests in an [`InFlightBudget`].
#[derive(Debug, Clone)]
pub struct InFlightLayer {
    shared: Arc<Shared>,
    lane: Lane,
}

impl<S> Layer<S> for InFlightLayer {
    type Service = InFlight<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlight {
            inner,
            shared: self.shared.clone(),
            lane: self.lane,
            reserved: None,
        }
    }
}

/// The budgeted service.
#[derive(Debug)]
pub struct InFlight<S> {
    inner: S,
    shared: Arc<Shared>,
    lane: Lane,
    /// The place taken for the next `call`; `poll_ready` may be called again before it without taking another.
    reserved: Option<Place>,
}

impl<S, R> Service<R> for InFlight<S>
where
    S: Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.reserved.is_none() {
            match Place::take(&self.shared, self.lane, cx.waker()) {
                Some(place) => self.reserved = Some(place),
                None => return Poll::Pending,
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let place = self.reserved.take();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            drop(place);
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;
    use tokio::sync::oneshot;

    use super::*;

    #[test]
    fn the_main_lane_has_the_whole_budget_when_nothing_is_torn_down() {
        assert!(main_may_send(7, 0, 8));
        assert!(!main_may_send(8, 0, 8));
    }

    #[test]
    fn teardown_requests_take_the_main_lanes_places_down_to_its_floor() {
        assert!(!main_may_send(5, 3, 8));
        assert!(main_may_send(4, 3, 8));
        // Eight teardown requests out: the main lane keeps two places.
        assert!(main_may_send(1, 8, 8));
        assert!(!main_may_send(2, 8, 8));
        assert!(!main_may_send(2, 50, 8));
        assert_eq!(main_lane_floor(1), 1);
        assert_eq!(main_lane_floor(3), 1);
    }

    proptest! {
        #[test]
        fn the_main_lane_stays_within_the_budget_and_above_its_floor(
            max in 1usize..64, main in 0usize..80, teardown in 0usize..80,
        ) {
            let may = main_may_send(main, teardown, max);
            // Never past the budget, whatever the teardown lane does.
            if main >= max {
                prop_assert!(!may);
            }
            // Never held below its floor.
            if main < main_lane_floor(max) {
                prop_assert!(may);
            }
            // Together the two lanes never pass the budget through the main lane's sending.
            if may && teardown <= max - main_lane_floor(max) {
                prop_assert!(main + teardown < max);
            }
            // More teardown in flight never gives the main lane more room.
            if !may {
                prop_assert!(!main_may_send(main, teardown + 1, max));
            }
        }
    }

    /// Answers each request when its sender is dropped or fired: the test decides when the server answers.
    #[derive(Clone)]
    struct Held;

    impl Service<oneshot::Receiver<()>> for Held {
        type Response = ();
        type Error = std::convert::Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<(), Self::Error>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, answer: oneshot::Receiver<()>) -> Self::Future {
            Box::pin(async move {
                let _ = answer.await;
                Ok(())
            })
        }
    }

    /// Sends one request through `service` once it is ready, in a task of its own; the returned sender answers it.
    async fn send(
        service: &mut InFlight<Held>,
    ) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let (answer, request) = oneshot::channel();
        let pending = service.call(request);
        (answer, tokio::spawn(async move { pending.await.unwrap() }))
    }

    #[tokio::test]
    async fn the_main_lane_waits_while_teardown_requests_are_out_and_teardown_never_waits() {
        let budget = InFlightBudget::new(4);
        let mut main = budget.layer(Lane::Main).layer(Held);
        let mut teardown = budget.layer(Lane::Teardown).layer(Held);
        let mut main_out = Vec::new();
        for _ in 0..3 {
            main_out.push(send(&mut main).await);
        }
        // The budget is nearly full; teardown still sends, twice, past it.
        let first = send(&mut teardown).await;
        let second = send(&mut teardown).await;
        assert_eq!(budget.in_flight(), (3, 2));
        // The main lane has no room until places come back.
        let mut waiting = Box::pin(send(&mut main));
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut waiting)
                .await
                .is_err()
        );
        // One main answer and the teardown ones: main has 2 + 0 of 4, and the waiting request goes.
        let (answer, task) = main_out.pop().unwrap();
        answer.send(()).unwrap();
        task.await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut waiting)
                .await
                .is_err(),
            "2 main + 2 teardown fill a budget of 4"
        );
        for (answer, task) in [first, second] {
            drop(answer);
            task.await.unwrap();
        }
        let (answer, task) = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("room once the teardown requests were answered");
        assert_eq!(budget.in_flight(), (3, 0));
        drop(answer);
        task.await.unwrap();
        for (answer, task) in main_out {
            drop(answer);
            task.await.unwrap();
        }
        assert_eq!(budget.in_flight(), (0, 0));
    }

    #[tokio::test]
    async fn an_abandoned_request_gives_its_place_back() {
        let budget = InFlightBudget::new(1);
        let mut main = budget.layer(Lane::Main).layer(Held);
        std::future::poll_fn(|cx| main.poll_ready(cx))
            .await
            .unwrap();
        let (_answer, request) = oneshot::channel();
        let pending = main.call(request);
        assert_eq!(budget.in_flight(), (1, 0));
        drop(pending);
        assert_eq!(budget.in_flight(), (0, 0));
    }
}
