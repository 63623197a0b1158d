//! The lock table's rows and statements, under the lock operations of the store
//! ([`super::locks`]): read, released with their session, renamed with it, paged.

use super::rows::{append, event_about, get_session, invisible_or_misleading};
use super::{MAX_ID_LEN, StoreError};
use liveness_common::lock::{Lock, LockChange, ReleaseReason};
use liveness_common::session::{Event, EventKind, Phase, Session};
use rusqlite::{Connection, OptionalExtension, Row, params};

pub(super) const LOCK_COLUMNS: &str = "name, uid, session, token, since_ms";

pub(super) fn lock_from_row(row: &Row<'_>) -> rusqlite::Result<Lock> {
    Ok(Lock {
        name: row.get(0)?,
        uid: row.get(1)?,
        session: row.get(2)?,
        token: row.get::<_, i64>(3)? as u64,
        since_ms: row.get(4)?,
        waiters: 0,
        cluster: false,
        host: None,
    })
}

pub(super) fn get_lock(
    conn: &Connection,
    uid: u32,
    name: &str,
) -> Result<Option<Lock>, StoreError> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {LOCK_COLUMNS} FROM locks WHERE uid = ?1 AND name = ?2"
        ))?
        .query_row(params![uid, name], lock_from_row)
        .optional()?)
}

pub fn validate_lock_name(name: &str) -> Result<(), StoreError> {
    let problem = if name.is_empty() {
        "empty".to_owned()
    } else if name.len() > MAX_ID_LEN {
        format!("{} bytes, at most {MAX_ID_LEN} allowed", name.len())
    } else if let Some(c) = name.chars().find(|&c| invisible_or_misleading(c)) {
        format!(
            "{name:?} contains U+{:04X}: control, bidirectional-override and zero-width \
             characters are not allowed, as they make two names look alike",
            u32::from(c)
        )
    } else {
        return Ok(());
    };
    Err(StoreError::InvalidLockName(problem))
}

/// The `lock.acquired` / `lock.released` event of `lock`, held by `session`.
pub(super) fn lock_event(
    kind: EventKind,
    session: &Session,
    lock: &Lock,
    reason: Option<ReleaseReason>,
    now_ms: i64,
) -> Event {
    Event {
        lock: Some(LockChange {
            name: lock.name.clone(),
            token: lock.token,
            cluster: lock.cluster,
            reason,
        }),
        ..event_about(kind, session, now_ms)
    }
}

/// Releases every lock `session` holds, inside the caller's transaction: the one that ends
/// the session (every ending goes through [`super::ending::end_selected`], which calls this).
pub(super) fn release_locks_of(
    tx: &Connection,
    session: &Session,
    now_ms: i64,
) -> Result<Vec<Event>, StoreError> {
    let mut held: Vec<Lock> = tx
        .prepare_cached(&format!(
            "DELETE FROM locks WHERE uid = ?1 AND session = ?2 RETURNING {LOCK_COLUMNS}"
        ))?
        .query_map(params![session.creator_uid, session.id], lock_from_row)?
        .collect::<Result<_, _>>()?;
    // Events in name order, reproducibly.
    held.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    held.iter()
        .map(|lock| {
            let event = lock_event(
                EventKind::LockReleased,
                session,
                lock,
                Some(ReleaseReason::SessionEnded),
                now_ms,
            );
            append(tx, event)
        })
        .collect()
}

/// Moves the locks (host and fleet) of a pending session to its new id, inside the rename's transaction.
pub(super) fn rename_holder(
    tx: &Connection,
    uid: u32,
    from: &str,
    to: &str,
) -> Result<(), StoreError> {
    tx.prepare_cached("UPDATE locks SET session = ?3 WHERE uid = ?1 AND session = ?2")?
        .execute(params![uid, from, to])?;
    tx.prepare_cached("UPDATE fleet_locks SET session = ?3 WHERE uid = ?1 AND session = ?2")?
        .execute(params![uid, from, to])?;
    Ok(())
}

/// Tokens granted per millisecond before the counter runs ahead of the clock.
const TOKENS_PER_MS: i64 = 1000;

/// The least token a grant at `now_ms` may have: the wall clock in microseconds. A token is
/// one more than the last one granted, or this floor if that is greater, like a hybrid
/// logical clock: so a grant after the state was deleted, or restored from an older copy,
/// still exceeds every token granted before, unless the clock stepped back or grants ran
/// ahead of it (more than [`TOKENS_PER_MS`] per millisecond, sustained). Microseconds keep
/// tokens below 2^53 (exact in JavaScript and in JSON readers that use doubles) until the
/// 23rd century.
pub(super) fn token_floor(now_ms: i64) -> i64 {
    now_ms.saturating_mul(TOKENS_PER_MS)
}

/// Raises the token counter by `jump`, inside the caller's transaction: after a possible
/// power loss, grants SQLite lost may have been handed out already.
pub(super) fn jump_tokens(tx: &Connection, jump: u64) -> Result<(), StoreError> {
    tx.prepare_cached("UPDATE meta SET value = value + ?1 WHERE key = 'lock_token'")?
        .execute([jump as i64])?;
    Ok(())
}

/// What [`super::EventReader::locks`] reads: held locks of one user's namespace or of every
/// user's, by uid and name (a host lock before a fleet lock of the same name), after a
/// cursor.
#[derive(Debug, Clone, Default)]
pub struct LockQuery {
    pub uid: Option<u32>,
    /// The uid, name and scope (`true`: a fleet lock) of the last lock of the previous page.
    pub after: Option<(u32, String, bool)>,
    pub limit: usize,
}

impl LockQuery {
    /// A `next` cursor as [`locks_page`] writes it: `UID/NAME`, or `UID+/NAME` after a
    /// fleet lock.
    pub fn parse_cursor(cursor: &str) -> Option<(u32, String, bool)> {
        let (uid, name) = cursor.split_once('/')?;
        let (uid, cluster) = match uid.strip_suffix('+') {
            Some(uid) => (uid, true),
            None => (uid, false),
        };
        Some((uid.parse().ok()?, name.to_owned(), cluster))
    }
}

/// A page of locks and the cursor of the next one (`None` on the last page).
#[derive(Debug)]
pub struct LockPage {
    pub locks: Vec<Lock>,
    pub next: Option<String>,
}

/// One page of held locks, host and fleet ones, range reads of the primary keys however
/// many there are.
pub(super) fn locks_page(conn: &Connection, query: &LockQuery) -> Result<LockPage, StoreError> {
    let (after_uid, after_name, after_cluster) = match &query.after {
        Some((uid, name, cluster)) => (Some(*uid), name.as_str(), *cluster),
        None => (None, "", false),
    };
    let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
    let locks: Vec<Lock> = conn
        .prepare_cached(&format!(
            "SELECT * FROM (\
               SELECT {LOCK_COLUMNS}, 0 AS cluster, NULL AS host FROM locks \
               UNION ALL SELECT {LOCK_COLUMNS}, 1, host FROM fleet_locks) \
             WHERE (?1 IS NULL OR uid = ?1) \
             AND (?2 IS NULL OR (uid, name, cluster) > (?2, ?3, ?5)) \
             ORDER BY uid, name, cluster LIMIT ?4"
        ))?
        .query_map(
            params![query.uid, after_uid, after_name, limit, after_cluster],
            |row| {
                Ok(Lock {
                    cluster: row.get(5)?,
                    host: row.get(6)?,
                    ..lock_from_row(row)?
                })
            },
        )?
        .collect::<Result<_, _>>()?;
    let next = (locks.len() >= query.limit)
        .then(|| {
            locks.last().map(|lock| {
                let scope = if lock.cluster { "+" } else { "" };
                format!("{}{scope}/{}", lock.uid, lock.name)
            })
        })
        .flatten();
    Ok(LockPage { locks, next })
}

/// User `uid`'s session `id`, which must be active to take a lock.
pub(super) fn active_session(conn: &Connection, uid: u32, id: &str) -> Result<Session, StoreError> {
    match get_session(conn, uid, id)? {
        None => Err(StoreError::NotFound(id.to_owned())),
        Some(session) if session.phase == Phase::Ended => Err(StoreError::AlreadyEnded(session.id)),
        Some(session) => Ok(session),
    }
}
