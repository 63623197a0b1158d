//! Ending sessions in SQLite: the one compare-and-set every ending goes through, with the
//! locks it releases and the reaps it marks due.

use liveness_common::session::{Event, OnEnd, Session};
use rusqlite::{Connection, params};

use super::lock_rows::release_locks_of;
use super::rows::{append, json_value, name, session_from_row};
use super::{Ending, SESSION_COLUMNS, StoreError};

/// An [`Ending`] as [`end_selected`] writes it: with the time and its stored columns.
pub(super) struct EndingRow<'a> {
    pub(super) ending: &'a Ending,
    pub(super) now_ms: i64,
    /// The reason, exit and source as stored in their columns.
    pub(super) columns: (String, Option<String>, Option<String>),
}

impl EndingRow<'_> {
    pub(super) fn new(ending: &Ending, now_ms: i64) -> Result<EndingRow<'_>, StoreError> {
        let columns = (
            name(&ending.reason)?,
            json_value(ending.exit.as_ref())?,
            ending.detected_by.map(|d| name(&d)).transpose()?,
        );
        Ok(EndingRow {
            ending,
            now_ms,
            columns,
        })
    }
}

/// The compare-and-set that ends sessions, inside the caller's write transaction, and the
/// one place every ending is written: each session's locks are released with it, and a
/// reap its policy (or the ending) asks for is marked due ([`super::reaps`]). `select`
/// (made with [`select_active!`]) finds the ACTIVE sessions the ending applies to, and each
/// is updated by rowid. The transaction holds the write lock, so nothing changes between
/// the two. (One `UPDATE ... RETURNING` per death builds an ephemeral table and a
/// statement journal each time: ending 10,000 owners in batches of 64 took 2.2 times as
/// long that way.)
pub(super) fn end_selected(
    tx: &Connection,
    select: &str,
    params: impl rusqlite::Params,
    row: &EndingRow<'_>,
) -> Result<Vec<Event>, StoreError> {
    let (ending, now_ms) = (row.ending, row.now_ms);
    let mut found: Vec<(i64, Session)> = tx
        .prepare_cached(select)?
        .query_and_then(params, |row| {
            Ok::<_, StoreError>((row.get(SESSION_COLUMNS)?, session_from_row(row)?))
        })?
        .collect::<Result<_, _>>()?;
    // Events in id order, reproducibly; sorted here, as `ORDER BY` would make SQLite build
    // a temporary b-tree for what is nearly always one row.
    found.sort_unstable_by(|a, b| a.1.id.cmp(&b.1.id));
    let mut events = Vec::with_capacity(found.len());
    for (rowid, mut session) in found {
        let (reason, exit, detected_by) = &row.columns;
        // The survivors in the same statement: a second UPDATE of the row cost every ending.
        let survivors = json_value(ending.survivors.as_ref())?;
        ending.end(&mut session, now_ms);
        tx.prepare_cached(
            "UPDATE sessions SET phase = 'ended', reason = ?2, exit = ?3, detected_by = ?4, \
             ended_ms = ?5, updated_ms = ?5, survivors = COALESCE(?6, survivors), cause = ?7, \
             usage = ?8 WHERE rowid = ?1",
        )?
        .execute(params![
            rowid,
            reason,
            exit,
            detected_by,
            now_ms,
            survivors,
            json_value(session.cause.as_ref())?,
            json_value(session.usage.as_ref())?,
        ])?;
        if ending.terminate || session.on_end == OnEnd::Terminate {
            // The reap is due from this commit on: a restart that finds the row runs it.
            tx.prepare_cached("INSERT OR REPLACE INTO reaps (uid, session) VALUES (?1, ?2)")?
                .execute(params![session.creator_uid, session.id])?;
        }
        events.push(append(tx, ending.event(&session, now_ms))?);
        events.extend(release_locks_of(tx, &session, now_ms)?);
    }
    Ok(events)
}
