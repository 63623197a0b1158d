//! Fleet locks' rows (`--etcd`, see `crate::fleet`): etcd holds the lock on the session's
//! lease; the row records the grant on this host, with that lease, so that `lock_list` and
//! the event stream show it as they show a host lock, and a restarted daemon knows which
//! leases to re-attach.

use super::StoreError;
use super::lock_rows::{active_session, lock_event, lock_from_row};
use super::locks::MAX_LOCKS_PER_SESSION;
use super::rows::{append, get_session};
use super::writer::Store;
use liveness_common::lock::{Lock, ReleaseReason};
use liveness_common::session::{Event, EventKind};
use rusqlite::{Connection, Row, params};

/// The columns of a host lock's row first, as [`lock_from_row`] reads them.
pub(super) const FLEET_LOCK_COLUMNS: &str = "name, uid, session, token, since_ms, lease, host";

/// A fleet lock's row: the lock, and the etcd lease it is on.
pub(super) fn fleet_lock_from_row(row: &Row<'_>) -> rusqlite::Result<(Lock, i64)> {
    let lock = Lock {
        cluster: true,
        host: Some(row.get(6)?),
        ..lock_from_row(row)?
    };
    Ok((lock, row.get(5)?))
}

impl Store {
    /// Records the grant of fleet lock `lock` (`cluster`, with its host) on etcd lease
    /// `lease` to its session, which must be ACTIVE: its `lock.acquired` event. A row left
    /// of an earlier grant of the name is of a lease that ended: released as lost.
    pub fn grant_fleet_lock(
        &mut self,
        lock: &Lock,
        lease: i64,
        now_ms: i64,
    ) -> Result<Vec<Event>, StoreError> {
        let tx = self.write_tx()?;
        let holder = active_session(&tx, lock.uid, &lock.session)?;
        let held: i64 = tx
            .prepare_cached("SELECT COUNT(*) FROM fleet_locks WHERE uid = ?1 AND session = ?2")?
            .query_row(params![lock.uid, lock.session], |r| r.get(0))?;
        if held as usize >= MAX_LOCKS_PER_SESSION {
            return Err(StoreError::TooManyLocks(lock.session.clone()));
        }
        let mut events = release_rows(
            &tx,
            "DELETE FROM fleet_locks WHERE name = ?1 AND token != ?2",
            params![lock.name, lock.token as i64],
            ReleaseReason::LeaseLost,
            now_ms,
        )?;
        let inserted = tx
            .prepare_cached(
                "INSERT OR IGNORE INTO fleet_locks (name, uid, session, token, since_ms, lease, \
                 host) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                lock.name,
                lock.uid,
                lock.session,
                lock.token as i64,
                lock.since_ms,
                lease,
                lock.host.as_deref().unwrap_or_default(),
            ])?;
        if inserted > 0 {
            let event = lock_event(EventKind::LockAcquired, &holder, lock, None, now_ms);
            events.push(append(&tx, event)?);
        }
        tx.commit()?;
        Ok(events)
    }

    /// Releases the fleet locks of user `uid`'s session `session`: lock `name` of that
    /// grant (`token`) only, or all of them. Their `lock.released` events, with `reason`.
    pub fn release_fleet_locks(
        &mut self,
        uid: u32,
        session: &str,
        only: Option<(&str, u64)>,
        reason: ReleaseReason,
        now_ms: i64,
    ) -> Result<Vec<Event>, StoreError> {
        let tx = self.write_tx()?;
        let events = match only {
            Some((name, token)) => release_rows(
                &tx,
                "DELETE FROM fleet_locks WHERE uid = ?1 AND session = ?2 AND name = ?3 \
                 AND token = ?4",
                params![uid, session, name, token as i64],
                reason,
                now_ms,
            )?,
            None => release_rows(
                &tx,
                "DELETE FROM fleet_locks WHERE uid = ?1 AND session = ?2",
                params![uid, session],
                reason,
                now_ms,
            )?,
        };
        tx.commit()?;
        Ok(events)
    }

    /// Every fleet lock held here, with its lease, by name.
    pub fn fleet_locks(&self) -> Result<Vec<(Lock, i64)>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {FLEET_LOCK_COLUMNS} FROM fleet_locks ORDER BY name"
            ))?
            .query_map([], fleet_lock_from_row)?
            .collect::<Result<_, _>>()?)
    }
}

/// Deletes the rows `delete` selects, inside the caller's transaction, and appends their
/// `lock.released` events in name order. A row whose session retention already deleted
/// has nobody to tell.
fn release_rows(
    tx: &Connection,
    delete: &str,
    params: impl rusqlite::Params,
    reason: ReleaseReason,
    now_ms: i64,
) -> Result<Vec<Event>, StoreError> {
    let mut released: Vec<Lock> = tx
        .prepare(&format!("{delete} RETURNING {FLEET_LOCK_COLUMNS}"))?
        .query_map(params, fleet_lock_from_row)?
        .map(|row| row.map(|(lock, _)| lock))
        .collect::<Result<_, _>>()?;
    released.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    let mut events = Vec::new();
    for lock in released {
        if let Some(holder) = get_session(tx, lock.uid, &lock.session)? {
            let event = lock_event(
                EventKind::LockReleased,
                &holder,
                &lock,
                Some(reason),
                now_ms,
            );
            events.push(append(tx, event)?);
        }
    }
    Ok(events)
}
