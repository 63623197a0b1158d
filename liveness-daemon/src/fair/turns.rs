//! Turns per uid: at most a few works of each user at once, the rest waiting in order, so
//! that one user's burst (requests over big trees, a storm of end actions) holds a bounded
//! share of the machine and never delays another user's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Per-uid counting semaphores.
///
/// Invariant: a uid has an entry while a turn of it is held or awaited, and none after,
/// so the map is as big as the users being served.
#[derive(Debug)]
pub struct UidTurns {
    per_uid: usize,
    by_uid: Mutex<HashMap<u32, Arc<Semaphore>>>,
}

/// A turn of one uid; dropping it lets the next work of that uid start.
#[derive(Debug)]
pub struct Turn {
    turns: Arc<UidTurns>,
    uid: u32,
    permit: Option<OwnedSemaphorePermit>,
}

impl UidTurns {
    /// At most `per_uid` turns held per user (at least 1).
    pub fn new(per_uid: usize) -> Arc<UidTurns> {
        Arc::new(UidTurns {
            per_uid: per_uid.max(1),
            by_uid: Mutex::default(),
        })
    }

    /// Waits until `uid` has a turn free.
    pub async fn take(self: &Arc<Self>, uid: u32) -> Turn {
        let semaphore = Arc::clone(
            self.by_uid()
                .entry(uid)
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_uid))),
        );
        // Made before the wait, so that a wait given up (a client that hung up) still
        // drops the entry it may leave unused.
        let mut turn = Turn {
            turns: Arc::clone(self),
            uid,
            permit: None,
        };
        // The semaphore is never closed.
        turn.permit = semaphore.acquire_owned().await.ok();
        turn
    }

    /// Users with a turn held or awaited.
    #[cfg(test)]
    fn users(&self) -> usize {
        self.by_uid().len()
    }

    fn by_uid(&self) -> MutexGuard<'_, HashMap<u32, Arc<Semaphore>>> {
        self.by_uid.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut by_uid = self.turns.by_uid();
        drop(self.permit.take());
        // Only the map's reference left: nobody holds or awaits a turn of this uid.
        if by_uid
            .get(&self.uid)
            .is_some_and(|semaphore| Arc::strong_count(semaphore) == 1)
        {
            by_uid.remove(&self.uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::*;

    /// Polls `future` once.
    fn poll_once<F: Future>(future: std::pin::Pin<&mut F>) -> Option<F::Output> {
        match future.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(output) => Some(output),
            Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn a_user_waits_for_its_own_turns_only() {
        let turns = UidTurns::new(2);
        let first = turns.take(1000).await;
        let _second = turns.take(1000).await;
        let mut third = pin!(turns.take(1000));
        assert!(poll_once(third.as_mut()).is_none(), "a third work ran");
        assert!(
            poll_once(pin!(turns.take(1001))).is_some(),
            "another user waited"
        );
        drop(first);
        assert!(
            poll_once(third.as_mut()).is_some(),
            "the freed turn is not the waiter's"
        );
    }

    #[tokio::test]
    async fn nothing_is_left_behind_by_users_that_are_done() {
        let turns = UidTurns::new(1);
        for uid in 0..100 {
            drop(turns.take(uid).await);
        }
        assert_eq!(turns.users(), 0);
        let held = turns.take(5).await;
        let mut waiting = pin!(turns.take(5));
        assert!(poll_once(waiting.as_mut()).is_none());
        drop(held);
        assert_eq!(turns.users(), 1, "the waiter still needs the user's entry");
        drop(poll_once(waiting.as_mut()).expect("the waiter's turn"));
        assert_eq!(turns.users(), 0);
    }

    #[tokio::test]
    async fn a_wait_given_up_leaves_nothing_behind() {
        let turns = UidTurns::new(1);
        let held = turns.take(7).await;
        {
            let mut waiting = pin!(turns.take(7));
            assert!(poll_once(waiting.as_mut()).is_none());
        }
        assert_eq!(turns.users(), 1, "the holder's entry is gone");
        drop(held);
        assert_eq!(turns.users(), 0, "a given-up wait left its entry");
    }
}
