//! Locks: the queues of requests waiting for a lock, and what committed events change for
//! them.
//!
//! The store holds who has each lock; [`Locks`] holds who waits, in memory (a waiter is
//! an open connection, gone with a restart anyway). Every release and every session end
//! reaches [`Engine::publish`](super::Engine) as committed events, which hands the lock to
//! the next waiter right then, in the same turn of the engine: nothing polls. How a waiting
//! connection gives up (its timeout, its client hanging up) is the server's side of it.

use std::collections::{HashMap, VecDeque};

use tokio::sync::oneshot;

use crate::fair::limits::SessionUsage;
use crate::store::{Acquired, Store};
use liveness_common::lock::Lock;
use liveness_common::session::{Event, EventKind};

use super::Refusal;

/// Most requests waiting for one lock. A waiting request beyond it is refused at once
/// (`limit_reached`) rather than queued; every waiter also holds one of its uid's bounded
/// connections.
pub(super) const MAX_WAITERS_PER_LOCK: usize = 1024;

/// A lock: its namespace (uid) and name.
pub(super) type LockKey = (u32, String);

/// Where a waiting request's grant goes, or why none comes.
type GrantSender = oneshot::Sender<Result<Lock, Refusal>>;

/// The engine's answer to `lock_acquire`.
#[derive(Debug)]
pub enum Acquire {
    /// The session holds the lock: granted now, or held already.
    Held(Lock),
    /// Another session holds it and the request waits, first come first served.
    Queued(Queued),
}

/// A request in a lock's queue: the grant, or why none comes (its session ended), arrives
/// on `grant`. Dropping it leaves the queue.
#[derive(Debug)]
pub struct Queued {
    pub grant: oneshot::Receiver<Result<Lock, Refusal>>,
}

/// A `lock_acquire` with `wait`, queued: its session and where its grant goes.
#[derive(Debug)]
struct Waiter {
    session: String,
    grant: GrantSender,
}

/// A lock granted to a waiter, committed: its event to publish, then the grant to send.
#[derive(Debug)]
pub(super) struct Granted {
    pub(super) event: Event,
    lock: Lock,
    waiter: Waiter,
}

/// The requests waiting for each lock, first come first served. A waiter whose connection
/// closed (its grant channel is closed) is skipped and dropped wherever a queue is read.
#[derive(Debug, Default)]
pub(super) struct Locks {
    queues: HashMap<LockKey, VecDeque<Waiter>>,
}

/// What [`take`] found.
#[derive(Debug)]
pub(super) enum Taken {
    /// The lock was free and is now the session's, committed: publish `event`.
    Granted { lock: Lock, event: Box<Event> },
    /// The session holds it already.
    AlreadyHeld(Lock),
    /// Another session holds it.
    HeldByOther(Lock),
}

/// Takes lock `name` for user `uid`'s session `session` if it is free and the user's
/// limits allow one more: what `lock_acquire` and a grant to a waiter both do.
pub(super) fn take(
    store: &mut Store,
    usage: &mut SessionUsage,
    uid: u32,
    session: &str,
    name: &str,
    now: i64,
) -> Result<Taken, Refusal> {
    let room = usage.check_lock(uid, name);
    let acquired = store
        .acquire_lock(uid, session, name, room.is_ok(), now)
        .map_err(|e| store.explain(e))?;
    match acquired {
        Acquired::Granted { lock, event } => Ok(Taken::Granted { lock, event }),
        Acquired::AlreadyHeld(lock) => Ok(Taken::AlreadyHeld(lock)),
        Acquired::HeldByOther(lock) => Ok(Taken::HeldByOther(lock)),
        Acquired::NoRoom => Err(match room {
            Err(exceeded) => {
                usage.refused(exceeded.limit, uid);
                exceeded.into()
            }
            Ok(()) => Refusal::Internal("the store found no room for a lock the limits allow"),
        }),
    }
}

/// `lock_held`, naming the holder (a session of the same user: names are per user). How to
/// wait is each client's to say, in its own words (`--wait`, `Wait(timeout)`...).
pub(super) fn held_error(lock: &Lock) -> Refusal {
    Refusal::LockHeld(Box::new(lock.clone()))
}

impl Locks {
    pub(super) fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// Queues user `uid`'s session `session` last for lock `name`; refused when the queue
    /// is full.
    pub(super) fn queue(
        &mut self,
        uid: u32,
        name: &str,
        session: String,
    ) -> Result<Queued, Refusal> {
        let (grant, queued) = oneshot::channel();
        self.push((uid, name.to_owned()), Waiter { session, grant })
            .map_err(|_| Refusal::QueueFull {
                name: name.to_owned(),
                waiting: MAX_WAITERS_PER_LOCK,
            })?;
        Ok(Queued { grant: queued })
    }

    /// Queues `waiter` last; gives it back when the queue is full.
    fn push(&mut self, key: LockKey, waiter: Waiter) -> Result<(), Waiter> {
        let queue = self.queues.entry(key).or_default();
        queue.retain(|w| !w.grant.is_closed());
        if queue.len() >= MAX_WAITERS_PER_LOCK {
            return Err(waiter);
        }
        queue.push_back(waiter);
        Ok(())
    }

    /// The first waiter of `key` whose connection is still open.
    fn pop(&mut self, key: &LockKey) -> Option<Waiter> {
        let queue = self.queues.get_mut(key)?;
        let next = std::iter::from_fn(|| queue.pop_front()).find(|w| !w.grant.is_closed());
        if queue.is_empty() {
            self.queues.remove(key);
        }
        next
    }

    /// How many wait for `key` on open connections.
    pub(super) fn count(&self, key: &LockKey) -> u32 {
        self.queues.get(key).map_or(0, |queue| {
            queue.iter().filter(|w| !w.grant.is_closed()).count() as u32
        })
    }

    /// How many wait for each lock that has waiters.
    pub(super) fn waiting(&self) -> HashMap<LockKey, u32> {
        self.queues
            .keys()
            .map(|key| (key.clone(), self.count(key)))
            .filter(|(_, count)| *count > 0)
            .collect()
    }

    /// Takes out every waiter of user `uid`'s session `session`, with the lock it waited for.
    fn remove_session(&mut self, uid: u32, session: &str) -> Vec<(String, Waiter)> {
        let mut removed = Vec::new();
        self.queues.retain(|(lock_uid, name), queue| {
            if *lock_uid == uid {
                let (gone, kept): (VecDeque<_>, VecDeque<_>) =
                    queue.drain(..).partition(|w| w.session == session);
                removed.extend(gone.into_iter().map(|w| (name.clone(), w)));
                *queue = kept;
            }
            !queue.is_empty()
        });
        removed
    }

    /// A pending session that waits got its real id.
    fn rename_session(&mut self, uid: u32, from: &str, to: &str) {
        for ((lock_uid, _), queue) in &mut self.queues {
            if *lock_uid == uid {
                for waiter in queue.iter_mut().filter(|w| w.session == from) {
                    waiter.session = to.to_owned();
                }
            }
        }
    }

    /// What committed events change for the waiters, in event order: nothing without
    /// waiters, so that a burst of ends costs nothing more.
    pub(super) fn effects_of(&self, events: &[Event]) -> Vec<LockEffect> {
        if self.is_empty() {
            return Vec::new();
        }
        LockEffect::of(events)
    }

    /// Applies what a committed event changes for the waiters: a waiter whose session
    /// ended is told so; a freed lock is taken for the first waiter that can have it,
    /// committed, and returned for the engine to publish before it is sent.
    pub(super) fn follow(
        &mut self,
        effect: LockEffect,
        store: &mut Store,
        usage: &mut SessionUsage,
        now: i64,
    ) -> Option<Granted> {
        match effect {
            LockEffect::Freed(key) => self.grant_next(key, store, usage, now),
            LockEffect::SessionEnded { uid, session } => {
                for (name, waiter) in self.remove_session(uid, &session) {
                    let error = Refusal::EndedWaiting {
                        session: session.clone(),
                        name,
                    };
                    let _ = waiter.grant.send(Err(error));
                }
                None
            }
            LockEffect::Renamed { uid, from, to } => {
                self.rename_session(uid, &from, &to);
                None
            }
        }
    }

    /// Grants a lock that just became free to the first waiter that can take it.
    fn grant_next(
        &mut self,
        key: LockKey,
        store: &mut Store,
        usage: &mut SessionUsage,
        now: i64,
    ) -> Option<Granted> {
        let (uid, name) = &key;
        while let Some(waiter) = self.pop(&key) {
            match take(store, usage, *uid, &waiter.session, name, now) {
                Ok(Taken::Granted { lock, event }) => {
                    let waiters = self.count(&key);
                    return Some(Granted {
                        event: *event,
                        lock: Lock { waiters, ..lock },
                        waiter,
                    });
                }
                Ok(Taken::AlreadyHeld(lock)) => {
                    let _ = waiter.grant.send(Ok(lock));
                }
                // Not free after all: this waiter goes back first in line, and waits.
                Ok(Taken::HeldByOther(_)) => {
                    self.queues.entry(key).or_default().push_front(waiter);
                    return None;
                }
                Err(error) => {
                    let _ = waiter.grant.send(Err(error));
                }
            }
        }
        None
    }

    /// Sends a published grant. A waiter that left meanwhile has the lock released again:
    /// returns the release's event, to publish (it grants the lock to the next waiter).
    pub(super) fn deliver(
        &mut self,
        granted: Granted,
        store: &mut Store,
        now: i64,
    ) -> Option<Event> {
        let Granted { lock, waiter, .. } = granted;
        let (uid, name) = (lock.uid, lock.name.clone());
        if waiter.grant.send(Ok(lock)).is_ok() {
            return None;
        }
        tracing::debug!(lock = name, "a waiter left as it was granted; releasing");
        store
            .release_lock(uid, &waiter.session, &name, now)
            .ok()
            .map(|(_, event)| event)
    }
}

/// What committed events change for the waiters, in event order.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum LockEffect {
    /// A lock is free: the next waiter gets it.
    Freed(LockKey),
    /// A session ended: its waiting requests fail.
    SessionEnded { uid: u32, session: String },
    /// A pending session was renamed: its waiting requests follow.
    Renamed { uid: u32, from: String, to: String },
}

impl LockEffect {
    fn of(events: &[Event]) -> Vec<LockEffect> {
        events
            .iter()
            .filter_map(|event| {
                let uid = event.creator_uid;
                match (event.kind, &event.lock, &event.previous_session) {
                    // A fleet lock's waiters wait in etcd, not here.
                    (EventKind::LockReleased, Some(lock), _) if !lock.cluster => {
                        Some(LockEffect::Freed((uid, lock.name.clone())))
                    }
                    (EventKind::Ended, _, _) => Some(LockEffect::SessionEnded {
                        uid,
                        session: event.session.clone(),
                    }),
                    (EventKind::Renamed, _, Some(from)) => Some(LockEffect::Renamed {
                        uid,
                        from: from.clone(),
                        to: event.session.clone(),
                    }),
                    _ => None,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(session: &str) -> (Waiter, oneshot::Receiver<Result<Lock, Refusal>>) {
        let (grant, answer) = oneshot::channel();
        let session = session.to_owned();
        (Waiter { session, grant }, answer)
    }

    #[test]
    fn a_full_queue_refuses_and_closed_waiters_make_room() {
        let mut waiters = Locks::default();
        let key = (1000, "l".to_owned());
        let mut answers = Vec::new();
        for i in 0..MAX_WAITERS_PER_LOCK {
            let (w, answer) = waiter(&format!("s{i}"));
            waiters.push(key.clone(), w).expect("room in the queue");
            answers.push(answer);
        }
        let (extra, _) = waiter("extra");
        let refused = waiters
            .push(key.clone(), extra)
            .expect_err("the queue is full");
        assert_eq!(refused.session, "extra", "the refused waiter is given back");
        // The first in line hangs up: its place is free, and it is never served.
        drop(answers.remove(0));
        let (late, _late_answer) = waiter("late");
        waiters
            .push(key.clone(), late)
            .expect("a closed waiter's place is free");
        assert_eq!(waiters.count(&key), MAX_WAITERS_PER_LOCK as u32);
        let first = waiters.pop(&key).expect("a waiter");
        assert_eq!(
            first.session, "s1",
            "served in order, skipping the closed one"
        );
    }

    #[test]
    fn an_ended_sessions_waiters_leave_every_queue_of_its_user_only() {
        let mut waiters = Locks::default();
        let mut answers = Vec::new();
        for (uid, name, session) in [(1, "a", "s"), (1, "b", "s"), (1, "b", "t"), (2, "a", "s")] {
            let (w, answer) = waiter(session);
            waiters.push((uid, name.to_owned()), w).unwrap();
            answers.push(answer);
        }
        let mut removed: Vec<_> = waiters
            .remove_session(1, "s")
            .into_iter()
            .map(|(name, w)| (name, w.session))
            .collect();
        removed.sort();
        let s = || "s".to_owned();
        assert_eq!(removed, [("a".to_owned(), s()), ("b".to_owned(), s())]);
        assert_eq!(waiters.count(&(1, "a".into())), 0);
        assert_eq!(waiters.count(&(1, "b".into())), 1, "t still waits");
        assert_eq!(
            waiters.count(&(2, "a".into())),
            1,
            "another user's s still waits"
        );
    }
}
