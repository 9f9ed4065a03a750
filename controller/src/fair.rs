//! Which runner passes the runner controller asks for next: passes wait here, one place per runner, and when a
//! pass may start, the place goes to each group (EphemeralRunnerSet) with passes waiting in rotation, oldest first
//! within a group (docs/runner-lifecycle.md, "Scale sets take turns").
//!
//! Why: the controller framework starts the passes waiting for a worker in the order of a hash set, so the runners
//! of a set that scaled up during another set's burst of hundreds waited for most of that burst. The framework's
//! own queue is not replaced, only kept short: passes are handed to it no faster than its workers take them, so
//! its order decides only for its own requeues (a timer a pass set, a retry after an error).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;

/// Waiters queued per group, served in rotation: the decision of who goes next, with no IO and no clock.
#[derive(Debug)]
pub struct FairQueue<K, W> {
    waiting: HashMap<K, VecDeque<W>>,
    /// Each group with waiters, once, in the order its turn comes.
    rotation: VecDeque<K>,
}

impl<K: Clone + Eq + Hash, W> Default for FairQueue<K, W> {
    fn default() -> Self {
        Self {
            waiting: HashMap::new(),
            rotation: VecDeque::new(),
        }
    }
}

impl<K: Clone + Eq + Hash, W> FairQueue<K, W> {
    /// Queues `waiter` at the back of `group`'s line; a group that had no waiters joins the rotation last.
    pub fn push(&mut self, group: K, waiter: W) {
        let line = self.waiting.entry(group.clone()).or_default();
        if line.is_empty() {
            self.rotation.push_back(group);
        }
        line.push_back(waiter);
    }

    /// The next waiter: the oldest of the group whose turn it is. The group goes to the back of the rotation
    /// if it has more waiters, and leaves it otherwise.
    pub fn pop(&mut self) -> Option<(K, W)> {
        let group = self.rotation.pop_front()?;
        let line = self.waiting.get_mut(&group)?;
        let waiter = line.pop_front()?;
        if line.is_empty() {
            self.waiting.remove(&group);
        } else {
            self.rotation.push_back(group.clone());
        }
        Some((group, waiter))
    }

    /// Whether nobody waits.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.rotation.is_empty()
    }

    /// How many wait, over every group.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.waiting.values().map(VecDeque::len).sum()
    }
}

/// The passes asked for, per runner, and those handed on (`out`): at most `limit` out at once (0: no limit). A
/// runner asked for while its pass is out is asked for again once that pass is done, as the framework would.
#[derive(Debug)]
pub struct FairLane<G, R> {
    limit: usize,
    waiting: FairQueue<G, R>,
    queued: HashSet<R>,
    out: HashSet<R>,
    again: HashMap<R, G>,
}

impl<G: Clone + Eq + Hash, R: Clone + Eq + Hash> FairLane<G, R> {
    /// A lane handing on at most `limit` passes at once (0: no limit).
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            waiting: FairQueue::default(),
            queued: HashSet::new(),
            out: HashSet::new(),
            again: HashMap::new(),
        }
    }

    /// A pass of `item` (in `group`) is asked for: it waits, once, however often it is asked for.
    pub fn ask(&mut self, group: G, item: R) {
        if self.out.contains(&item) {
            self.again.insert(item, group);
        } else if self.queued.insert(item.clone()) {
            self.waiting.push(group, item);
        }
    }

    /// The next pass to hand on, while fewer than the limit are out.
    pub fn hand_on(&mut self) -> Option<R> {
        if self.limit != 0 && self.out.len() >= self.limit {
            return None;
        }
        let (_, item) = self.waiting.pop()?;
        self.queued.remove(&item);
        self.out.insert(item.clone());
        Some(item)
    }

    /// A pass handed on is over; one asked for meanwhile waits at the back of its group's line.
    pub fn done(&mut self, item: &R) {
        if self.out.remove(item)
            && let Some(group) = self.again.remove(item)
        {
            self.ask(group, item.clone());
        }
    }

    /// Passes waiting and passes out.
    #[cfg(test)]
    pub fn counts(&self) -> (usize, usize) {
        (self.queued.len(), self.out.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn groups_take_turns_and_each_keeps_its_order() {
        let mut queue = FairQueue::default();
        for i in 0..4 {
            queue.push("big", i);
        }
        queue.push("small", 100);
        queue.push("other", 200);
        let order: Vec<_> = std::iter::from_fn(|| queue.pop()).collect();
        assert_eq!(
            order,
            vec![
                ("big", 0),
                ("small", 100),
                ("other", 200),
                ("big", 1),
                ("big", 2),
                ("big", 3)
            ]
        );
        assert!(queue.is_empty());
    }

    #[test]
    fn a_group_that_joins_late_waits_one_turn_of_each_group_ahead() {
        let mut queue = FairQueue::default();
        for i in 0..100 {
            queue.push("big", i);
        }
        assert_eq!(queue.pop(), Some(("big", 0)));
        queue.push("late", 1000);
        assert_eq!(queue.pop(), Some(("big", 1)));
        assert_eq!(queue.pop(), Some(("late", 1000)));
    }

    proptest! {
        /// Whatever the pushes and pops: nothing is lost or made up, each group's waiters come out in the order
        /// they went in, and while a group waits, no other group is served twice before it is served once.
        #[test]
        fn fair_queue_is_fifo_per_group_and_bounded_in_bypass(
            ops in prop::collection::vec(prop::option::of(0u8..5), 0..200)
        ) {
            let mut queue = FairQueue::default();
            let mut next = 0u32;
            let mut pushed: HashMap<u8, VecDeque<u32>> = HashMap::new();
            // For each group waiting, how often each other group was served since it last was (or since it joined).
            let mut bypassed: HashMap<u8, HashMap<u8, u32>> = HashMap::new();
            for op in ops {
                match op {
                    Some(group) => {
                        queue.push(group, next);
                        pushed.entry(group).or_default().push_back(next);
                        bypassed.entry(group).or_default();
                        next += 1;
                    }
                    None => match queue.pop() {
                        Some((group, waiter)) => {
                            let line = pushed.get_mut(&group).expect("a group that waits");
                            prop_assert_eq!(line.pop_front(), Some(waiter));
                            bypassed.insert(group, HashMap::new());
                            if line.is_empty() {
                                pushed.remove(&group);
                                bypassed.remove(&group);
                            }
                            for (_, served) in bypassed.iter_mut().filter(|(g, _)| **g != group) {
                                let count = served.entry(group).or_default();
                                *count += 1;
                                prop_assert!(*count <= 1, "a group was passed over twice by another");
                            }
                        }
                        None => prop_assert!(pushed.is_empty()),
                    },
                }
                prop_assert_eq!(queue.len(), pushed.values().map(VecDeque::len).sum::<usize>());
            }
        }
    }

    #[test]
    fn the_lane_hands_on_no_more_than_the_limit_and_each_runner_once() {
        let mut lane = FairLane::new(2);
        for (group, item) in [("big", 1), ("big", 2), ("big", 3), ("small", 10)] {
            lane.ask(group, item);
        }
        lane.ask("big", 1);
        assert_eq!(lane.hand_on(), Some(1));
        assert_eq!(
            lane.hand_on(),
            Some(10),
            "the small set's turn comes second"
        );
        assert_eq!(lane.hand_on(), None, "two out");
        // Asked for while out: again once done, at the back of its line.
        lane.ask("big", 1);
        lane.done(&1);
        assert_eq!(lane.counts(), (3, 1));
        assert_eq!(lane.hand_on(), Some(2));
        lane.done(&10);
        lane.done(&2);
        assert_eq!(lane.hand_on(), Some(3));
        assert_eq!(lane.hand_on(), Some(1));
        assert_eq!(lane.hand_on(), None);
        assert_eq!(lane.counts(), (0, 2));
    }

    proptest! {
        /// Whatever is asked for and finished: never more out than the limit, never a runner out twice, and
        /// every runner asked for is handed on once the passes out are done.
        #[test]
        fn the_lane_loses_nothing_and_keeps_its_limit(
            limit in 1usize..4,
            ops in prop::collection::vec((0u8..3, 0u8..4, any::<bool>()), 0..150)
        ) {
            let mut lane = FairLane::new(limit);
            let mut out: Vec<u8> = Vec::new();
            let mut asked: HashSet<u8> = HashSet::new();
            for (group, item, finish) in ops {
                if finish && !out.is_empty() {
                    let done = out.remove(usize::from(item) % out.len());
                    lane.done(&done);
                } else {
                    lane.ask(group, item);
                    asked.insert(item);
                }
                while let Some(next) = lane.hand_on() {
                    prop_assert!(!out.contains(&next), "a runner out twice");
                    asked.remove(&next);
                    out.push(next);
                }
                prop_assert!(out.len() <= limit);
            }
            // Drain: finish everything out; whatever was asked for comes out.
            while let Some(done) = out.pop() {
                lane.done(&done);
                while let Some(next) = lane.hand_on() {
                    asked.remove(&next);
                    out.push(next);
                }
            }
            prop_assert!(asked.is_empty(), "never handed on: {:?}", asked);
            prop_assert_eq!(lane.counts(), (0, 0));
        }
    }
}
