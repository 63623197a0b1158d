//! End actions in the store: a row per action, made with the registration, so that an
//! ending writes nothing more (the death path is unchanged). An action is marked `running`
//! in a committed transaction before it is spawned, and `done` in the one that writes its
//! `session.action` event (and the `session.finalized` of its session when it is the
//! last): an outcome is recorded once, and a run a crash cut short is found at start.

use rusqlite::{Connection, OptionalExtension, params};

use liveness_common::action::{ActionOutcome, Skipped};
use liveness_common::identity::ProcessKey;
use liveness_common::session::{ActionPhase, ActionState, Event, EventKind, Phase, Session};

use super::rows::{append, event_about, from_name, get_session, ticks_from_sql, ticks_to_sql};
use super::{Store, StoreError};

/// One end action of one session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ActionKey {
    pub uid: u32,
    pub session: String,
    pub index: u32,
}

/// An end action of an ended session that has no outcome yet: to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueAction {
    pub key: ActionKey,
    /// The creator's primary group as it registered, if known.
    pub gid: Option<u32>,
    /// An earlier run was cut short (the row was `running`).
    pub resumed: bool,
    /// The first process of that earlier run, if it was spawned.
    pub root: Option<ProcessKey>,
}

/// What [`Store::run_action`] says of an action about to be spawned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// Marked `running`: spawn it, with these facts of its ended session.
    Run(Box<Session>),
    /// It has an outcome already (skipped meanwhile) or its session is gone: do not.
    Skip,
}

/// Gives user `uid`'s session `id` `count` pending actions, replacing any it had.
pub(super) fn set_actions(
    tx: &Connection,
    uid: u32,
    id: &str,
    count: usize,
    gid: Option<u32>,
) -> Result<(), StoreError> {
    tx.prepare_cached("DELETE FROM actions WHERE uid = ?1 AND session = ?2")?
        .execute(params![uid, id])?;
    for index in 0..count {
        tx.prepare_cached(
            "INSERT INTO actions (uid, session, idx, gid, state) VALUES (?1, ?2, ?3, ?4, 'pending')",
        )?
        .execute(params![uid, id, index as i64, gid])?;
    }
    Ok(())
}

/// The `session.finalized` event of user `uid`'s session `id`, written with its
/// `finalized_ms`, when it has ended and each of its actions has its outcome (once).
fn finalize_if_done(
    tx: &Connection,
    uid: u32,
    id: &str,
    now_ms: i64,
) -> Result<Option<Event>, StoreError> {
    let Some(mut session) = get_session(tx, uid, id)? else {
        return Ok(None);
    };
    if session.phase != Phase::Ended
        || session.finalized_ms.is_some()
        || session.on_end_run.is_empty()
    {
        return Ok(None);
    }
    let open: Option<i64> = tx
        .prepare_cached(
            "SELECT 1 FROM actions WHERE uid = ?1 AND session = ?2 AND state != 'done' LIMIT 1",
        )?
        .query_row(params![uid, id], |r| r.get(0))
        .optional()?;
    if open.is_some() {
        return Ok(None);
    }
    tx.prepare_cached("UPDATE sessions SET finalized_ms = ?3 WHERE creator_uid = ?1 AND id = ?2")?
        .execute(params![uid, id, now_ms])?;
    session.finalized_ms = Some(now_ms);
    Ok(Some(append(
        tx,
        event_about(EventKind::Finalized, &session, now_ms),
    )?))
}

/// Marks action `key` done with `outcome` and writes its `session.action` event, if it was
/// in one of `from` states; then the session's `session.finalized` if it was the last.
fn record(
    tx: &Connection,
    key: &ActionKey,
    outcome: &ActionOutcome,
    from: &str,
    now_ms: i64,
    events: &mut Vec<Event>,
) -> Result<bool, StoreError> {
    let changed = tx
        .prepare_cached(
            "UPDATE actions SET state = 'done', outcome = ?4 \
             WHERE uid = ?1 AND session = ?2 AND idx = ?3 AND instr(?5, state) > 0",
        )?
        .execute(params![
            key.uid,
            key.session,
            i64::from(key.index),
            serde_json::to_string(outcome)?,
            from
        ])?;
    if changed == 0 {
        return Ok(false);
    }
    let Some(session) = get_session(tx, key.uid, &key.session)? else {
        return Ok(false);
    };
    events.push(append(
        tx,
        Event {
            action: Some(outcome.clone()),
            ..event_about(EventKind::Action, &session, now_ms)
        },
    )?);
    Ok(true)
}

impl Store {
    /// Marks action `key` `running` before it is spawned (a resumed one again, its old
    /// first process forgotten), and returns its session; [`Begin::Skip`] when it has
    /// an outcome already.
    pub fn run_action(&mut self, key: &ActionKey) -> Result<Begin, StoreError> {
        let tx = self.write_tx()?;
        let changed = tx
            .prepare_cached(
                "UPDATE actions SET state = 'running', root_pid = NULL, root_start_ticks = NULL \
                 WHERE uid = ?1 AND session = ?2 AND idx = ?3 AND state != 'done'",
            )?
            .execute(params![key.uid, key.session, i64::from(key.index)])?;
        let session = get_session(&tx, key.uid, &key.session)?;
        tx.commit()?;
        Ok(match session {
            Some(session) if changed > 0 && session.phase == Phase::Ended => {
                Begin::Run(Box::new(session))
            }
            _ => Begin::Skip,
        })
    }

    /// Records the first process of running action `key` before it runs anything, so that
    /// a restart can end what is left of it before running it again. `false`: the action
    /// is not running (it has its outcome), and the process must not run.
    pub fn action_spawned(
        &mut self,
        key: &ActionKey,
        root: ProcessKey,
    ) -> Result<bool, StoreError> {
        let changed = self
            .conn
            .prepare_cached(
                "UPDATE actions SET root_pid = ?4, root_start_ticks = ?5 \
                 WHERE uid = ?1 AND session = ?2 AND idx = ?3 AND state = 'running'",
            )?
            .execute(params![
                key.uid,
                key.session,
                i64::from(key.index),
                root.pid,
                ticks_to_sql(root.start_ticks)
            ])?;
        Ok(changed > 0)
    }

    /// Records the outcomes of finished runs, in one transaction: each action's
    /// `session.action` event, and the `session.finalized` of each session whose last
    /// action it was. An action whose outcome is recorded already gets nothing more: the
    /// events returned are those written.
    pub fn record_actions(
        &mut self,
        done: &[(ActionKey, ActionOutcome)],
        now_ms: i64,
    ) -> Result<Vec<Event>, StoreError> {
        let tx = self.write_tx()?;
        let mut events = Vec::with_capacity(done.len());
        for (key, outcome) in done {
            if !record(&tx, key, outcome, "running", now_ms, &mut events)? {
                tracing::warn!(
                    session = key.session,
                    uid = key.uid,
                    index = key.index,
                    "an end action finished whose outcome is recorded already; not recorded again"
                );
                continue;
            }
            events.extend(finalize_if_done(&tx, key.uid, &key.session, now_ms)?);
        }
        tx.commit()?;
        Ok(events)
    }

    /// `actions_done`: every pending action of user `uid`'s session `id` gets the outcome
    /// `skipped: done_by_agent`; then, if the session has ended and none is left running,
    /// its `session.finalized`. Returns the events and how many actions are still running.
    pub fn skip_actions(
        &mut self,
        uid: u32,
        id: &str,
        now_ms: i64,
    ) -> Result<(Vec<Event>, usize), StoreError> {
        let tx = self.write_tx()?;
        let pending: Vec<u32> = tx
            .prepare_cached(
                "SELECT idx FROM actions WHERE uid = ?1 AND session = ?2 AND state = 'pending' \
                 ORDER BY idx",
            )?
            .query_map(params![uid, id], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let mut events = Vec::with_capacity(pending.len() + 1);
        for index in pending {
            let key = ActionKey {
                uid,
                session: id.to_owned(),
                index,
            };
            let outcome = ActionOutcome::skipped(index, Skipped::DoneByAgent, now_ms);
            record(&tx, &key, &outcome, "pending", now_ms, &mut events)?;
        }
        events.extend(finalize_if_done(&tx, uid, id, now_ms)?);
        let running: i64 = tx
            .prepare_cached(
                "SELECT COUNT(*) FROM actions WHERE uid = ?1 AND session = ?2 AND state = 'running'",
            )?
            .query_row(params![uid, id], |r| r.get(0))?;
        tx.commit()?;
        Ok((events, usize::try_from(running).unwrap_or_default()))
    }

    /// The `session.finalized` of user `uid`'s ended session `id` when none of its actions
    /// is left to run (each was skipped before it ended), written now; else nothing.
    pub fn finalize_if_done(
        &mut self,
        uid: u32,
        id: &str,
        now_ms: i64,
    ) -> Result<Option<Event>, StoreError> {
        let tx = self.write_tx()?;
        let event = finalize_if_done(&tx, uid, id, now_ms)?;
        tx.commit()?;
        Ok(event)
    }

    /// The actions without an outcome of ended sessions: of user `uid`'s session `id`, or
    /// with `None` of every session (at start: those whose session ended while the daemon
    /// was down, and runs a stop or a crash cut short).
    pub fn actions_due(&self, session: Option<(u32, &str)>) -> Result<Vec<DueAction>, StoreError> {
        let (uid, id) = session.map_or((None, None), |(uid, id)| (Some(uid), Some(id)));
        let due = self
            .conn
            .prepare_cached(
                "SELECT a.uid, a.session, a.idx, a.gid, a.state, a.root_pid, a.root_start_ticks \
                 FROM actions a INDEXED BY actions_not_done \
                 JOIN sessions s ON s.creator_uid = a.uid AND s.id = a.session \
                 WHERE a.state != 'done' AND s.phase = 'ended' \
                 AND (?1 IS NULL OR (a.uid = ?1 AND a.session = ?2)) \
                 ORDER BY s.ended_ms, a.uid, a.session, a.idx",
            )?
            .query_and_then(params![uid, id], |row| {
                let state: ActionPhase = from_name(row.get(4)?)?;
                let root_pid: Option<u32> = row.get(5)?;
                let root_ticks: Option<i64> = row.get(6)?;
                Ok::<_, StoreError>(DueAction {
                    key: ActionKey {
                        uid: row.get(0)?,
                        session: row.get(1)?,
                        index: row.get(2)?,
                    },
                    gid: row.get(3)?,
                    resumed: state == ActionPhase::Running,
                    root: root_pid.zip(root_ticks).map(|(pid, ticks)| ProcessKey {
                        pid,
                        start_ticks: ticks_from_sql(ticks),
                    }),
                })
            })?
            .collect::<Result<_, _>>()?;
        Ok(due)
    }

    /// How many end actions of user `uid` have no outcome (those of its active sessions,
    /// and those waiting or running after their session ended), and how many of them are
    /// its session `id`'s.
    pub fn unfinished_actions(&self, uid: u32, id: &str) -> Result<(u64, u64), StoreError> {
        let (all, of_session): (i64, i64) = self
            .conn
            .prepare_cached(
                "SELECT count(*), count(*) FILTER (WHERE session = ?2) \
                 FROM actions INDEXED BY actions_not_done WHERE uid = ?1 AND state != 'done'",
            )?
            .query_row(params![uid, id], |row| Ok((row.get(0)?, row.get(1)?)))?;
        Ok((all.unsigned_abs(), of_session.unsigned_abs()))
    }

    /// Where each end action of user `uid`'s session `id` stands, for `get`.
    pub fn action_states(&self, uid: u32, id: &str) -> Result<Vec<ActionState>, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT idx, state, outcome FROM actions WHERE uid = ?1 AND session = ?2 \
                 ORDER BY idx",
            )?
            .query_and_then(params![uid, id], |row| {
                Ok::<_, StoreError>(ActionState {
                    index: row.get(0)?,
                    state: from_name(row.get(1)?)?,
                    outcome: row
                        .get::<_, Option<String>>(2)?
                        .map(|s| serde_json::from_str(&s))
                        .transpose()?,
                })
            })?
            .collect()
    }
}
