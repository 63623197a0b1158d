//! Locks: `lock_acquire`, `lock_release`, `lock_list`, and the queues of requests waiting
//! for a lock.
//!
//! The store holds who has each lock; the engine holds who waits, in memory (a waiter is
//! an open connection, gone with a restart anyway). Every release and every session end
//! reaches [`Engine::publish`] as committed events, which hands the lock to the next waiter
//! right then, in the same turn of the engine: nothing polls.

use std::collections::{HashMap, VecDeque};

use tokio::sync::oneshot;

use crate::store::Acquired;
use liveness_common::lock::Lock;
use liveness_common::protocol::{ErrorBody, ErrorCode, Reply};
use liveness_common::session::{Event, EventKind};

use super::auth::Caller;
use super::{Engine, store_error};

/// Most requests waiting for one lock. A waiting request beyond it is refused at once
/// (`limit_reached`) rather than queued; every waiter also holds one of its uid's bounded
/// connections.
pub(super) const MAX_WAITERS_PER_LOCK: usize = 1024;

/// A lock: its namespace (uid) and name.
type LockKey = (u32, String);

/// A `lock_acquire` with `wait`, queued: its session and where its reply goes.
#[derive(Debug)]
struct Waiter {
    session: String,
    reply: oneshot::Sender<Reply>,
}

/// The requests waiting for each lock, first come first served. A waiter whose connection
/// closed (its reply channel is closed) is skipped and dropped wherever a queue is read.
#[derive(Debug, Default)]
pub(super) struct Waiters {
    queues: HashMap<LockKey, VecDeque<Waiter>>,
}

impl Waiters {
    pub(super) fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// Queues `waiter` last; gives it back when the queue is full.
    fn push(&mut self, key: LockKey, waiter: Waiter) -> Result<(), Waiter> {
        let queue = self.queues.entry(key).or_default();
        queue.retain(|w| !w.reply.is_closed());
        if queue.len() >= MAX_WAITERS_PER_LOCK {
            return Err(waiter);
        }
        queue.push_back(waiter);
        Ok(())
    }

    /// The first waiter of `key` whose connection is still open.
    fn pop(&mut self, key: &LockKey) -> Option<Waiter> {
        let queue = self.queues.get_mut(key)?;
        let next = std::iter::from_fn(|| queue.pop_front()).find(|w| !w.reply.is_closed());
        if queue.is_empty() {
            self.queues.remove(key);
        }
        next
    }

    /// How many wait for `key` on open connections.
    fn count(&self, key: &LockKey) -> u32 {
        self.queues.get(key).map_or(0, |queue| {
            queue.iter().filter(|w| !w.reply.is_closed()).count() as u32
        })
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
    pub(super) fn of(events: &[Event]) -> Vec<LockEffect> {
        events
            .iter()
            .filter_map(|event| {
                let uid = event.creator_uid;
                match (event.kind, &event.lock, &event.previous_session) {
                    (EventKind::LockReleased, Some(lock), _) => {
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

/// The reply of a lock that was granted or held.
fn lock_reply(lock: Lock) -> Reply {
    Reply {
        lock: Some(lock),
        ..Reply::ok()
    }
}

impl Engine {
    /// `lock_acquire`. A request that waits keeps `reply` in the lock's queue; every other
    /// outcome is sent at once.
    pub(super) fn lock_acquire(
        &mut self,
        caller: Caller,
        request: AcquireRequest,
        reply: oneshot::Sender<Reply>,
    ) {
        let AcquireRequest {
            name,
            session,
            uid,
            wait,
            timeout_ms,
        } = request;
        let answer = |reply: oneshot::Sender<Reply>, answer: Reply| {
            // The client may have gone; its reply has nowhere to go.
            let _ = reply.send(answer);
        };
        if timeout_ms.is_some() && !wait {
            let error = Reply::error(
                ErrorCode::InvalidRequest,
                "`timeout_ms` applies only to a request that waits: add `wait: true`",
            );
            return answer(reply, error);
        }
        let holder = match self.addressed(caller, &session, uid) {
            Ok(holder) => holder,
            Err(error) => return answer(reply, error.into()),
        };
        let now = self.config.clock.now_ms();
        let uid = holder.creator_uid;
        let room = self.usage.check_lock(uid, &name);
        match self
            .store
            .acquire_lock(uid, &holder.id, &name, room.is_ok(), now)
        {
            Ok(Acquired::Granted { lock, event }) => {
                self.publish(vec![*event]);
                answer(reply, lock_reply(lock));
            }
            Ok(Acquired::AlreadyHeld(lock)) => {
                let waiters = self.waiters.count(&(uid, name));
                answer(reply, lock_reply(Lock { waiters, ..lock }));
            }
            Ok(Acquired::NoRoom) => {
                if let Err((limit, error)) = room {
                    self.usage.refused(limit, uid);
                    answer(reply, error.into());
                }
            }
            Ok(Acquired::HeldByOther(lock)) if !wait => answer(reply, held_error(&lock).into()),
            Ok(Acquired::HeldByOther(_)) => {
                let waiter = Waiter {
                    session: holder.id,
                    reply,
                };
                if let Err(refused) = self.waiters.push((uid, name.clone()), waiter) {
                    let error = Reply::error(
                        ErrorCode::LimitReached,
                        format!(
                            "{MAX_WAITERS_PER_LOCK} requests wait for lock {name:?} already; try again later"
                        ),
                    );
                    answer(refused.reply, error);
                }
            }
            Err(e) => answer(reply, store_error(self.store.explain(e)).into()),
        }
    }

    /// `lock_release`: only the holding session releases, and only its user (or root)
    /// names that session.
    pub(super) fn lock_release(
        &mut self,
        caller: Caller,
        name: &str,
        session: &str,
        uid: Option<u32>,
    ) -> Reply {
        let holder = match self.addressed(caller, session, uid) {
            Ok(holder) => holder,
            Err(error) => return error.into(),
        };
        let now = self.config.clock.now_ms();
        match self
            .store
            .release_lock(holder.creator_uid, &holder.id, name, now)
        {
            Ok((lock, event)) => {
                self.publish(vec![event]);
                lock_reply(lock)
            }
            Err(e) => store_error(self.store.explain(e)).into(),
        }
    }

    /// `lock_list`: the held locks of the caller's namespace (root: every one, or `uid`'s).
    /// How many requests wait for each lock that has any: as many as there are open
    /// connections waiting at most, whatever the number of locks.
    pub(super) fn waiting(&self) -> std::collections::HashMap<LockKey, u32> {
        let waiters = &self.waiters;
        waiters
            .queues
            .keys()
            .map(|key| (key.clone(), waiters.count(key)))
            .filter(|(_, count)| *count > 0)
            .collect()
    }

    /// Applies what committed events change for the waiters (see [`LockEffect`]).
    pub(super) fn follow_locks(&mut self, effects: Vec<LockEffect>) {
        for effect in effects {
            match effect {
                LockEffect::Freed(key) => self.grant_next(key),
                LockEffect::SessionEnded { uid, session } => {
                    for (name, waiter) in self.waiters.remove_session(uid, &session) {
                        let error = Reply::error(
                            ErrorCode::AlreadyEnded,
                            format!("session {session:?} ended while waiting for lock {name:?}"),
                        );
                        let _ = waiter.reply.send(error);
                    }
                }
                LockEffect::Renamed { uid, from, to } => {
                    self.waiters.rename_session(uid, &from, &to);
                }
            }
        }
    }

    /// Grants a lock that just became free to the first waiter that can take it.
    fn grant_next(&mut self, key: LockKey) {
        let (uid, name) = &key;
        while let Some(waiter) = self.waiters.pop(&key) {
            let now = self.config.clock.now_ms();
            let room = self.usage.check_lock(*uid, name);
            match self
                .store
                .acquire_lock(*uid, &waiter.session, name, room.is_ok(), now)
            {
                Ok(Acquired::Granted { lock, event }) => {
                    let waiters = self.waiters.count(&key);
                    // Published before the reply: the connection may have closed just now,
                    // and then the grant is undone by a release, which is published too.
                    self.publish(vec![*event]);
                    if waiter
                        .reply
                        .send(lock_reply(Lock { waiters, ..lock }))
                        .is_err()
                    {
                        tracing::debug!(lock = name, "a waiter left as it was granted; releasing");
                        if let Ok((_, event)) =
                            self.store.release_lock(*uid, &waiter.session, name, now)
                        {
                            // Its release event grants the lock to the next waiter.
                            self.publish(vec![event]);
                        }
                    }
                    return;
                }
                Ok(Acquired::AlreadyHeld(lock)) => {
                    let _ = waiter.reply.send(lock_reply(lock));
                }
                Ok(Acquired::NoRoom) => {
                    if let Err((limit, error)) = room {
                        self.usage.refused(limit, *uid);
                        let _ = waiter.reply.send(error.into());
                    }
                }
                // Not free after all: this waiter goes back first in line, and waits.
                Ok(Acquired::HeldByOther(_)) => {
                    self.waiters
                        .queues
                        .entry(key.clone())
                        .or_default()
                        .push_front(waiter);
                    return;
                }
                Err(e) => {
                    let _ = waiter.reply.send(store_error(self.store.explain(e)).into());
                }
            }
        }
    }
}

/// A `lock_acquire` request's fields.
#[derive(Debug)]
pub(super) struct AcquireRequest {
    pub(super) name: String,
    pub(super) session: String,
    pub(super) uid: Option<u32>,
    pub(super) wait: bool,
    pub(super) timeout_ms: Option<u64>,
}

/// `lock_held`, naming the holder (a session of the same user: names are per user).
fn held_error(lock: &Lock) -> ErrorBody {
    ErrorBody::new(
        ErrorCode::LockHeld,
        format!(
            "lock {:?} is held by session {:?} (token {}); wait for it with `wait` (--wait)",
            lock.name, lock.session, lock.token
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(session: &str) -> (Waiter, oneshot::Receiver<Reply>) {
        let (reply, answer) = oneshot::channel();
        let session = session.to_owned();
        (Waiter { session, reply }, answer)
    }

    #[test]
    fn a_full_queue_refuses_and_closed_waiters_make_room() {
        let mut waiters = Waiters::default();
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
        let mut waiters = Waiters::default();
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
