//! The readers: [`EventReader`] connections for event replay and listings.

use super::lock_rows::{LockPage, LockQuery, locks_page};
use super::rows::{name, session_from_row, ticks_to_sql};
use super::schema::check_version;
use super::{BUSY_TIMEOUT, SESSION_COLUMNS, StoreError};
use liveness_common::identity::Identity;
use liveness_common::session::{Phase, Session};
use rusqlite::{Connection, OpenFlags, params};
use std::path::Path;

/// A read-only connection for event replay and listings, usable beside the [`Store`] (WAL
/// readers do not block the writer, nor it them).
#[derive(Debug)]
pub struct EventReader {
    pub(super) conn: Connection,
}

impl EventReader {
    /// Opens an existing database that [`Store::open`] has already created and migrated.
    pub fn open(path: impl AsRef<Path>) -> Result<EventReader, StoreError> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        check_version(&conn, true)?;
        Ok(EventReader { conn })
    }

    /// One page of held locks (see [`LockQuery`]).
    pub fn locks(&self, query: &LockQuery) -> Result<LockPage, StoreError> {
        locks_page(&self.conn, query)
    }

    /// One page of sessions, oldest first.
    pub fn list(&self, query: &ListQuery) -> Result<SessionPage, StoreError> {
        list(&self.conn, query)
    }

    /// The ENDED sessions (still retained) that list `survivor`, a process of this boot, among
    /// the survivors of their end, newest first, for `creator` (`None`: any). A survivor
    /// whose recorded pidfs inode is not `survivor`'s is another process that took its pid.
    pub fn ended_with_survivor(
        &self,
        survivor: &Identity,
        creator: Option<u32>,
    ) -> Result<Vec<Session>, StoreError> {
        let sessions = self
            .conn
            .prepare_cached(concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions WHERE phase = 'ended' AND survivors LIKE ?1 \
                 AND (?5 IS NULL OR creator_uid = ?5) \
                 AND EXISTS (SELECT 1 FROM json_each(survivors, '$.members') AS m \
                   WHERE json_extract(m.value, '$.pid') = ?2 \
                   AND json_extract(m.value, '$.start_ticks') = ?3 \
                   AND json_extract(m.value, '$.boot_id') = ?4) \
                 ORDER BY ended_ms DESC LIMIT 16"
            ))?
            .query_and_then(
                params![
                    // A cheap filter before the JSON is read.
                    format!("%\"pid\":{}%", survivor.pid),
                    survivor.pid,
                    ticks_to_sql(survivor.start_ticks),
                    survivor.boot_id,
                    creator,
                ],
                session_from_row,
            )?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(sessions
            .into_iter()
            .filter(|session| {
                session.survivors.as_ref().is_some_and(|survivors| {
                    survivors
                        .members
                        .iter()
                        .any(|member| member.same_process(survivor))
                })
            })
            .collect())
    }
}

/// What [`EventReader::list`] returns: sessions of one phase and/or one creator, after a
/// cursor.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListQuery {
    pub phase: Option<Phase>,
    pub creator_uid: Option<u32>,
    /// The `next` of the previous page; 0 for the first.
    pub after: i64,
    pub limit: usize,
}

/// A page of sessions and the cursor of the next one (`None` on the last page).
#[derive(Debug)]
pub struct SessionPage {
    pub sessions: Vec<Session>,
    pub next: Option<i64>,
}

/// Pages by rowid, the order in which sessions were created, so that each page is one
/// range read however many sessions there are.
pub(super) fn list(conn: &Connection, query: &ListQuery) -> Result<SessionPage, StoreError> {
    let phase = query.phase.map(|p| name(&p)).transpose()?;
    let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
    let mut last = None;
    let sessions = conn
        .prepare_cached(concat!(
            "SELECT ",
            session_columns!(),
            ", rowid FROM sessions WHERE rowid > ?1 AND (?2 IS NULL OR phase = ?2) \
             AND (?3 IS NULL OR creator_uid = ?3) ORDER BY rowid LIMIT ?4"
        ))?
        .query_and_then(
            params![query.after, phase, query.creator_uid, limit],
            |row| {
                last = Some(row.get::<_, i64>(SESSION_COLUMNS)?);
                session_from_row(row)
            },
        )?
        .collect::<Result<Vec<_>, _>>()?;
    let next = last.filter(|_| sessions.len() >= query.limit);
    Ok(SessionPage { sessions, next })
}
