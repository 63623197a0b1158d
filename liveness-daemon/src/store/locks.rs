//! Locks held by sessions: granted with a fencing token from one counter that only grows,
//! released by their session or, in the transaction that ends it, with the session.

use super::StoreError;
use super::lock_rows::{
    LOCK_COLUMNS, active_session, get_lock, lock_event, lock_from_row, token_floor,
    validate_lock_name,
};
use super::rows::{append, get_session};
use super::writer::Store;
use liveness_common::lock::{Lock, ReleaseReason};
use liveness_common::session::{Event, EventKind};
use rusqlite::params;

/// Most locks one session holds at once: with the per-uid session limit, it bounds what a
/// user can make the daemon store.
pub const MAX_LOCKS_PER_SESSION: usize = 256;

/// What [`Store::acquire_lock`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The lock was free and is now the session's: publish `event`.
    Granted { lock: Lock, event: Box<Event> },
    /// The session holds it already (no new grant, the token stays).
    AlreadyHeld(Lock),
    /// Another session holds it.
    HeldByOther(Lock),
    /// It is free, but the caller said there is no room for one more (nothing changed).
    NoRoom,
}

impl Store {
    /// Grants lock `name` of user `uid`'s namespace to that user's active session
    /// `session`, if no session holds it and `room` (the user's limits allow one more),
    /// with the next token.
    pub fn acquire_lock(
        &mut self,
        uid: u32,
        session: &str,
        name: &str,
        room: bool,
        now_ms: i64,
    ) -> Result<Acquired, StoreError> {
        validate_lock_name(name)?;
        let tx = self.write_tx()?;
        let holder = active_session(&tx, uid, session)?;
        if let Some(lock) = get_lock(&tx, uid, name)? {
            return Ok(if lock.session == session {
                Acquired::AlreadyHeld(lock)
            } else {
                Acquired::HeldByOther(lock)
            });
        }
        let held: i64 = tx
            .prepare_cached("SELECT COUNT(*) FROM locks WHERE uid = ?1 AND session = ?2")?
            .query_row(params![uid, session], |r| r.get(0))?;
        if held as usize >= MAX_LOCKS_PER_SESSION {
            return Err(StoreError::TooManyLocks(session.to_owned()));
        }
        if !room {
            return Ok(Acquired::NoRoom);
        }
        let token: i64 = tx
            .prepare_cached(
                "UPDATE meta SET value = max(value + 1, ?1) WHERE key = 'lock_token' RETURNING value",
            )?
            .query_row([token_floor(now_ms)], |r| r.get(0))?;
        let lock = Lock {
            name: name.to_owned(),
            uid,
            session: session.to_owned(),
            token: token as u64,
            since_ms: now_ms,
            waiters: 0,
            cluster: false,
            host: None,
        };
        tx.prepare_cached(
            "INSERT INTO locks (uid, name, session, token, since_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute(params![uid, name, session, token, now_ms])?;
        let event = append(
            &tx,
            lock_event(EventKind::LockAcquired, &holder, &lock, None, now_ms),
        )?;
        tx.commit()?;
        Ok(Acquired::Granted {
            lock,
            event: Box::new(event),
        })
    }

    /// Releases lock `name` of user `uid`'s namespace, which session `session` must hold.
    pub fn release_lock(
        &mut self,
        uid: u32,
        session: &str,
        name: &str,
        now_ms: i64,
    ) -> Result<(Lock, Event), StoreError> {
        validate_lock_name(name)?;
        let tx = self.write_tx()?;
        let holder = get_session(&tx, uid, session)?
            .ok_or_else(|| StoreError::NotFound(session.to_owned()))?;
        let lock = match get_lock(&tx, uid, name)? {
            Some(lock) if lock.session == session => lock,
            _ => {
                return Err(StoreError::NotHeld {
                    name: name.to_owned(),
                    session: session.to_owned(),
                });
            }
        };
        tx.prepare_cached("DELETE FROM locks WHERE uid = ?1 AND name = ?2")?
            .execute(params![uid, name])?;
        let event = append(
            &tx,
            lock_event(
                EventKind::LockReleased,
                &holder,
                &lock,
                Some(ReleaseReason::Released),
                now_ms,
            ),
        )?;
        tx.commit()?;
        Ok((lock, event))
    }

    /// Held locks, of user `uid`'s namespace or of every user's, by uid and name.
    pub fn locks(&self, uid: Option<u32>) -> Result<Vec<Lock>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {LOCK_COLUMNS} FROM locks WHERE ?1 IS NULL OR uid = ?1 ORDER BY uid, name"
            ))?
            .query_map(params![uid], lock_from_row)?
            .collect::<Result<_, _>>()?)
    }

    /// Lock `name` of user `uid`'s namespace, if held.
    pub fn lock(&self, uid: u32, name: &str) -> Result<Option<Lock>, StoreError> {
        get_lock(&self.conn, uid, name)
    }
}
