//! The ACTIVE sessions and the locks they hold, in memory: what a death needs to end its
//! owner's sessions without reading the database (see [`super::apply`]). It follows the
//! database through the events of every commit (each change to an ACTIVE session or a
//! lock is one), reading back the rows they name, and starts from the database's rows.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};

use liveness_common::cause::SenderSession;
use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::lock::Lock;
use liveness_common::session::{Event, EventKind, Phase, Session};

use super::prepared::PreparedEnd;
use super::reader::ListQuery;
use super::{Store, StoreError};

/// A session's key: its creator's uid and its id.
type Key = (u32, String);

/// See the module.
#[derive(Debug, Default)]
pub struct Active {
    /// Boxed: a table grows by doubling, and its free slots would each hold a session's
    /// size (about 500 bytes) instead of a pointer's.
    sessions: HashMap<Key, Box<Tracked>>,
    /// Sessions by the pid and start time of their owner.
    by_owner: HashMap<ProcessKey, Keys>,
    /// Locks by holding session.
    locks: HashMap<Key, Vec<Lock>>,
}

/// An ACTIVE session, with its ended event prepared for its death.
#[derive(Debug)]
struct Tracked {
    session: Session,
    /// `None` only if serde could not write the session, which its death then reports.
    ended: Option<PreparedEnd>,
}

/// An ACTIVE session of a dead owner, as its death's batch needs it.
#[derive(Debug)]
pub struct Owned<'a> {
    pub session: &'a Session,
    pub ended: Option<&'a PreparedEnd>,
    /// The locks it holds.
    pub held: &'a [Lock],
}

/// The sessions of one owner. Almost every owner has one, which needs no set: a set's
/// first allocation (a B-tree node) costs more than the rest of a session's keys.
#[derive(Debug)]
enum Keys {
    One(Key),
    Many(BTreeSet<Key>),
}

impl Keys {
    fn insert(&mut self, key: Key) {
        match self {
            Keys::One(one) if *one == key => {}
            Keys::One(one) => {
                let one = std::mem::take(one);
                *self = Keys::Many(BTreeSet::from([one, key]));
            }
            Keys::Many(keys) => {
                keys.insert(key);
            }
        }
    }

    /// Removes `key`; whether none is left.
    fn remove(&mut self, key: &Key) -> bool {
        match self {
            Keys::One(one) => one == key,
            Keys::Many(keys) => {
                keys.remove(key);
                keys.is_empty()
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Key> {
        let (one, many) = match self {
            Keys::One(one) => (Some(one), None),
            Keys::Many(keys) => (None, Some(keys)),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

impl Active {
    /// The database's ACTIVE sessions and held locks.
    pub fn load(store: &Store) -> Result<Active, StoreError> {
        let mut active = Active::default();
        let sessions = store.list(&ListQuery {
            phase: Some(Phase::Active),
            limit: usize::MAX,
            ..ListQuery::default()
        })?;
        for session in sessions.sessions {
            active.insert(session);
        }
        for lock in store.locks(None)? {
            active
                .locks
                .entry((lock.uid, lock.session.clone()))
                .or_default()
                .push(lock);
        }
        Ok(active)
    }

    fn insert(&mut self, session: Session) {
        let key = (session.creator_uid, session.id.clone());
        self.unindex(&key);
        match self.by_owner.entry(session.owner.key()) {
            Entry::Occupied(mut keys) => keys.get_mut().insert(key.clone()),
            Entry::Vacant(keys) => {
                keys.insert(Keys::One(key.clone()));
            }
        }
        let ended = PreparedEnd::of(&session)
            .inspect_err(|e| tracing::error!(error = %e, session = %session.id, "cannot prepare the ended event"))
            .ok();
        self.sessions
            .insert(key, Box::new(Tracked { session, ended }));
    }

    fn unindex(&mut self, key: &Key) -> Option<Session> {
        let Tracked { session, .. } = *self.sessions.remove(key)?;
        let owner = session.owner.key();
        if let Some(keys) = self.by_owner.get_mut(&owner)
            && keys.remove(key)
        {
            self.by_owner.remove(&owner);
        }
        Some(session)
    }

    /// Follows what a commit's events changed, reading back the rows they name.
    pub fn sync(&mut self, events: &[Event], store: &Store) -> Result<(), StoreError> {
        for event in events {
            let key = (event.creator_uid, event.session.clone());
            match event.kind {
                EventKind::Registered
                | EventKind::OwnerChanged
                | EventKind::Renamed
                | EventKind::Escaped => {
                    if let Some(previous) = &event.previous_session {
                        let old = (event.creator_uid, previous.clone());
                        self.unindex(&old);
                        // A rename carries the locks, which now name the new id (the
                        // ending's release matches the lock's row by its session).
                        if let Some(mut held) = self.locks.remove(&old) {
                            for lock in &mut held {
                                lock.session.clone_from(&key.1);
                            }
                            self.locks.insert(key.clone(), held);
                        }
                    }
                    match store.get(key.0, &key.1)? {
                        Some(session) => self.follow(session),
                        None => self.forget(&key),
                    }
                }
                EventKind::Ended => self.forget(&key),
                EventKind::LockAcquired | EventKind::LockReleased => {
                    // A fleet lock is not released with the session's end by the journal:
                    // its daemon revokes the lease (see `crate::fleet`).
                    let host_lock = event.lock.as_ref().filter(|lock| !lock.cluster);
                    let Some(name) = host_lock.map(|lock| &lock.name) else {
                        continue;
                    };
                    let held = self.locks.entry(key.clone()).or_default();
                    held.retain(|lock| &lock.name != name);
                    if let Some(lock) = store.lock(key.0, name)?
                        && lock.session == key.1
                    {
                        held.push(lock);
                    }
                    if held.is_empty() {
                        self.locks.remove(&key);
                    }
                }
                // The episode under way is the session's: the stall's judgement, then none.
                EventKind::Stalled | EventKind::Unstalled => {
                    if let Some(Tracked { session, .. }) =
                        self.sessions.get_mut(&key).map(Box::as_mut)
                    {
                        session.activity = event
                            .activity
                            .clone()
                            .filter(|_| event.kind == EventKind::Stalled);
                    }
                }
                EventKind::Reaped | EventKind::Action | EventKind::Finalized => {}
            }
        }
        Ok(())
    }

    /// Takes `session` as written after a change that has no event (a registration by the
    /// same owner that replaced its end actions, a declaration): kept while ACTIVE.
    pub fn follow(&mut self, session: Session) {
        if session.phase == Phase::Active {
            self.insert(session);
        } else {
            self.forget(&(session.creator_uid, session.id));
        }
    }

    /// Forgets an ended session.
    pub fn forget(&mut self, key: &(u32, String)) {
        self.unindex(key);
        self.locks.remove(key);
    }

    /// Every ACTIVE session, in no order.
    pub fn sessions(&self) -> impl Iterator<Item = &Session> {
        self.sessions.values().map(|tracked| &tracked.session)
    }

    /// The ACTIVE sessions whose owner is `owner` (same pid, start time and boot, as the
    /// database's ending selects them), each with its prepared ended event and the locks
    /// it holds, in id order.
    pub fn of_owner(&self, owner: &Identity) -> Vec<Owned<'_>> {
        let Some(keys) = self.by_owner.get(&owner.key()) else {
            return Vec::new();
        };
        let mut found: Vec<Owned<'_>> = keys
            .iter()
            .filter_map(|key| {
                let tracked = self.sessions.get(key)?;
                let held = self.locks.get(key).map_or(&[][..], Vec::as_slice);
                (tracked.session.owner.boot_id == owner.boot_id).then_some(Owned {
                    session: &tracked.session,
                    ended: tracked.ended.as_ref(),
                    held,
                })
            })
            .collect();
        found.sort_by(|a, b| a.session.id.cmp(&b.session.id));
        found
    }

    /// The ACTIVE sessions whose owner is `owner`, in no order: each found without the
    /// others (an owner may have thousands).
    pub fn owned_by<'a>(&'a self, owner: &'a Identity) -> impl Iterator<Item = &'a Session> {
        (self
            .by_owner
            .get(&owner.key())
            .into_iter()
            .flat_map(Keys::iter))
        .filter_map(|key| self.sessions.get(key).map(|tracked| &tracked.session))
        .filter(|session| session.owner.boot_id == owner.boot_id)
    }

    /// The sessions of the process `owner` of boot `boot_id`, in id order: those a signal's
    /// sender belonged to, as the owner of its tree or a member.
    pub fn sessions_of(&self, owner: ProcessKey, boot_id: &str) -> Vec<SenderSession> {
        let Some(keys) = self.by_owner.get(&owner) else {
            return Vec::new();
        };
        let mut found: Vec<SenderSession> = keys
            .iter()
            .filter_map(|key| self.sessions.get(key).map(|tracked| &tracked.session))
            .filter(|session| session.owner.boot_id == boot_id)
            .map(|session| SenderSession {
                id: session.id.clone(),
                creator_uid: session.creator_uid,
            })
            .collect();
        found.sort_by(|a, b| a.id.cmp(&b.id));
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> Key {
        (1000, id.to_owned())
    }

    fn ids(keys: &Keys) -> Vec<&str> {
        let mut ids: Vec<&str> = keys.iter().map(|(_, id)| id.as_str()).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn an_owners_keys_grow_from_one_and_empty_out() {
        let mut keys = Keys::One(key("a"));
        keys.insert(key("a"));
        assert!(
            matches!(keys, Keys::One(_)),
            "the same key twice is one key"
        );
        keys.insert(key("c"));
        keys.insert(key("b"));
        assert_eq!(ids(&keys), ["a", "b", "c"]);
        assert!(!keys.remove(&key("b")));
        assert!(
            !keys.remove(&key("x")),
            "a key it never held changes nothing"
        );
        assert_eq!(ids(&keys), ["a", "c"]);
        assert!(!keys.remove(&key("a")));
        assert!(keys.remove(&key("c")));
        assert!(Keys::One(key("a")).remove(&key("a")));
    }
}
