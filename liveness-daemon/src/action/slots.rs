//! How many actions each user may have running at once: the rest wait their turn, in order,
//! so one user's burst of endings cannot fill the machine with another's cleanup delayed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Per-uid counting semaphores, each made on first use and dropped with its last holder
/// or waiter, so that many users leave nothing behind.
#[derive(Debug)]
pub struct ActionSlots {
    per_uid: usize,
    uids: Mutex<HashMap<u32, Arc<Semaphore>>>,
}

/// A running action's place; dropping it lets the next one of its user start.
#[derive(Debug)]
pub struct ActionSlot {
    slots: Arc<ActionSlots>,
    uid: u32,
    semaphore: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
}

impl ActionSlots {
    /// At most `per_uid` running actions per user (at least 1).
    pub fn new(per_uid: usize) -> Arc<ActionSlots> {
        Arc::new(ActionSlots {
            per_uid: per_uid.max(1),
            uids: Mutex::default(),
        })
    }

    /// Waits until `uid` has a free slot.
    pub async fn acquire(self: &Arc<Self>, uid: u32) -> ActionSlot {
        let semaphore = self
            .uids()
            .entry(uid)
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_uid)))
            .clone();
        let permit = semaphore
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        ActionSlot {
            slots: self.clone(),
            uid,
            semaphore,
            permit: Some(permit),
        }
    }

    /// Users with a running or waiting action.
    #[cfg(test)]
    pub fn users(&self) -> usize {
        self.uids().len()
    }

    fn uids(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Semaphore>>> {
        self.uids.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for ActionSlot {
    fn drop(&mut self) {
        let mut uids = self.slots.uids();
        drop(self.permit.take());
        // The map's reference and this one: nobody else holds or awaits this user's slots.
        if Arc::strong_count(&self.semaphore) == 2 {
            uids.remove(&self.uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_user_waits_for_its_own_slots_only() {
        let slots = ActionSlots::new(2);
        let first = slots.acquire(1000).await;
        let _second = slots.acquire(1000).await;
        let third = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire(1000).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !third.is_finished(),
            "a third action of the same user waits"
        );
        let other = tokio::time::timeout(Duration::from_secs(5), slots.acquire(1001)).await;
        assert!(other.is_ok(), "another user is not held up");
        drop(first);
        let third = tokio::time::timeout(Duration::from_secs(5), third)
            .await
            .expect("the freed slot goes to the waiter")
            .unwrap();
        drop(third);
    }

    #[tokio::test]
    async fn nothing_is_left_behind_by_users_that_are_done() {
        let slots = ActionSlots::new(1);
        for uid in 0..100 {
            drop(slots.acquire(uid).await);
        }
        assert_eq!(slots.users(), 0);
        let held = slots.acquire(5).await;
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire(5).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(held);
        assert_eq!(
            slots.users(),
            1,
            "the waiter still needs the user's semaphore"
        );
        drop(waiting.await.unwrap());
        assert_eq!(slots.users(), 0);
    }
}
