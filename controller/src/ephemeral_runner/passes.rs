//! One pass at a time per runner, across the main lane and the teardown lane (two controllers over one store).
//!
//! Each lane's framework runs at most one pass per object, but nothing kept the two lanes apart: a main-lane pass
//! registering a runner could run beside the teardown of the same runner, which then saw no Secret and no
//! registration yet and dropped the finalizers while the registration was being made. Every main-lane pass, and
//! every teardown pass of a runner being deleted, holds its runner's turn (by uid) from its first read to its last
//! write; the other lane's pass waits for it. The teardown of a runner whose pod succeeded takes no turn: no
//! main-lane pass registers a runner that has a pod (`super::run_teardown`'s wrapper says why).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::context::lock;

/// The turns of the runners that have a pass running or waiting.
#[derive(Debug, Default)]
pub struct PassLocks {
    turns: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
}

/// A runner's turn, held for one pass; given back when dropped.
#[derive(Debug)]
pub struct Turn<'a> {
    locks: &'a PassLocks,
    uid: String,
    turn: Arc<AsyncMutex<()>>,
    guard: Option<OwnedMutexGuard<()>>,
}

impl PassLocks {
    /// Waits for runner `uid`'s turn.
    pub async fn turn(&self, uid: &str) -> Turn<'_> {
        let turn = Arc::clone(lock(&self.turns).entry(uid.to_owned()).or_default());
        let guard = Arc::clone(&turn).lock_owned().await;
        Turn {
            locks: self,
            uid: uid.to_owned(),
            turn,
            guard: Some(guard),
        }
    }

    /// How many runners have a pass running or waiting.
    pub fn len(&self) -> usize {
        lock(&self.turns).len()
    }

    /// Whether no runner has a pass running or waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut turns = lock(&self.locks.turns);
        // The map's copy and this one: nobody waits, so the entry goes (the map holds only runners in a pass).
        // A waiter clones its copy under the same lock, so it cannot slip in between.
        if Arc::strong_count(&self.turn) == 2 {
            turns.remove(&self.uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn passes_of_one_runner_take_turns_and_others_do_not_wait() {
        let locks = Arc::new(PassLocks::default());
        let first = locks.turn("a").await;
        let other = tokio::time::timeout(Duration::from_millis(100), locks.turn("b")).await;
        assert!(other.is_ok(), "another runner's pass does not wait");
        drop(other);
        let waiting = {
            let locks = Arc::clone(&locks);
            tokio::spawn(async move {
                let _turn = locks.turn("a").await;
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the same runner's pass waits");
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("its turn comes")
            .expect("task");
        assert!(locks.is_empty(), "nothing kept once no pass runs");
    }
}
