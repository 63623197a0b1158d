//! Reaps due: the sessions whose surviving processes are being terminated and whose
//! `session.reaped` is not recorded yet. The mark is written with the end and removed with
//! the record, so a reap that a stop or a crash cut short is found by the next start, and
//! a session has one `session.reaped` at most, however often its reap ran.

use rusqlite::params;

use super::rows::{append, ended_event, json_value, session_from_row};
use super::{Store, StoreError};
use liveness_common::session::{Event, EventKind, Reaped};

impl Store {
    /// Records what terminating the surviving processes of ended sessions did, in one
    /// transaction: for each `(ended, reaped)`, the outcome in the session's row and the
    /// `session.reaped` event about the session as its `ended` event described it. A session whose reap is not due (its outcome is
    /// recorded already) gets none: the events returned are those written.
    pub fn record_reaped(
        &mut self,
        done: &[(Event, Reaped)],
        now_ms: i64,
    ) -> Result<Vec<Event>, StoreError> {
        let tx = self.write_tx()?;
        let mut events = Vec::with_capacity(done.len());
        for (ended, reaped) in done {
            let due = tx
                .prepare_cached("DELETE FROM reaps WHERE uid = ?1 AND session = ?2")?
                .execute(params![ended.creator_uid, ended.session])?;
            if due == 0 {
                tracing::warn!(
                    session = ended.session,
                    uid = ended.creator_uid,
                    "a reap finished whose outcome is recorded already; not recorded again"
                );
                continue;
            }
            tx.prepare_cached(
                "UPDATE sessions SET reaped = ?3 WHERE creator_uid = ?1 AND id = ?2",
            )?
            .execute(params![
                ended.creator_uid,
                ended.session,
                json_value(Some(reaped))?
            ])?;
            events.push(append(
                &tx,
                Event {
                    kind: EventKind::Reaped,
                    at_ms: now_ms,
                    exit: None,
                    detected_by: None,
                    observed_ms: None,
                    died_ms: None,
                    hops: None,
                    reaped: Some(reaped.clone()),
                    ..ended.clone()
                },
            )?);
        }
        tx.commit()?;
        Ok(events)
    }

    /// The `session.ended` events, as their rows record them, of the sessions whose reap is
    /// due: at start, those a stop or a crash cut short. A mark whose session is gone
    /// (pruned) is dropped.
    pub fn reaps_due(&mut self) -> Result<Vec<Event>, StoreError> {
        let tx = self.write_tx()?;
        let due = tx
            .prepare_cached(concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions JOIN reaps ON creator_uid = uid AND id = session \
                 ORDER BY ended_ms, creator_uid, id"
            ))?
            .query_and_then([], session_from_row)?
            .map(|session| session.map(|session| ended_event(&session)))
            .collect::<Result<Vec<Event>, StoreError>>()?;
        tx.execute(
            "DELETE FROM reaps WHERE NOT EXISTS (SELECT 1 FROM sessions \
             WHERE creator_uid = uid AND id = session)",
            [],
        )?;
        tx.commit()?;
        Ok(due)
    }
}
