//! Row mapping and the statements the writer and the readers share.

use super::{MAX_ID_LEN, StoreError};
use liveness_common::activity::Declared;
use liveness_common::identity::Identity;
use liveness_common::session::{Event, EventKind, Session};
use rusqlite::{Connection, Row, params};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// An event about `session` as it is now, before its seq is assigned.
pub(super) fn event_about(kind: EventKind, session: &Session, at_ms: i64) -> Event {
    Event {
        seq: 0,
        kind,
        at_ms,
        session: session.id.clone(),
        owner: session.owner.clone(),
        previous_owner: None,
        previous_session: None,
        reason: None,
        exit: None,
        cause: None,
        usage: None,
        detected_by: None,
        observed_ms: None,
        died_ms: None,
        labels: session.labels.clone(),
        creator_uid: session.creator_uid,
        survivors: None,
        on_end: session.on_end,
        reaped: None,
        activity: None,
        lock: None,
        escape: None,
        hops: None,
        actions: u32::try_from(session.on_end_run.len()).unwrap_or(u32::MAX),
        action: None,
    }
}

/// The `session.ended` event of an ended session, as its row records it: what a reap
/// resumed after a restart reports about (the observation times are not stored).
pub(super) fn ended_event(session: &Session) -> Event {
    Event {
        reason: session.reason,
        exit: session.exit,
        cause: session.cause.clone(),
        usage: session.usage.clone(),
        detected_by: session.detected_by,
        survivors: session.survivors.clone(),
        ..event_about(
            EventKind::Ended,
            session,
            session.ended_ms.unwrap_or(session.updated_ms),
        )
    }
}

pub(super) fn validate_id(id: &str) -> Result<(), StoreError> {
    if id.is_empty() {
        return Err(StoreError::InvalidId("empty".into()));
    }
    if id.len() > MAX_ID_LEN {
        return Err(StoreError::InvalidId(format!(
            "{} bytes, at most {MAX_ID_LEN} allowed",
            id.len()
        )));
    }
    if let Some(c) = id.chars().find(|&c| invisible_or_misleading(c)) {
        return Err(StoreError::InvalidId(format!(
            "{id:?} contains U+{:04X}: control, bidirectional-override and zero-width \
             characters are not allowed, as they make two ids look alike",
            u32::from(c)
        )));
    }
    Ok(())
}

/// Characters an id may not hold: controls, and those that display an id as another
/// (bidirectional embeddings, overrides and isolates; zero-width spaces and joiners).
pub(super) fn invisible_or_misleading(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
                | '\u{200B}'..='\u{200D}'
                | '\u{2060}'
                | '\u{FEFF}'
        )
}

/// SQLite integers are i64; start times and pidfs inodes are u64. A bit-preserving cast
/// round-trips every value exactly and keeps equality comparisons correct (ordering is
/// never used).
pub(super) fn ticks_to_sql(ticks: u64) -> i64 {
    ticks as i64
}

pub(super) fn ticks_from_sql(stored: i64) -> u64 {
    stored as u64
}

/// The serde name of a unit enum variant (e.g. `"owner_exited"`), so the database and the
/// protocol spell values the same way.
pub(super) fn name<T: Serialize>(value: &T) -> Result<String, serde_json::Error> {
    match serde_json::to_value(value)? {
        serde_json::Value::String(s) => Ok(s),
        _ => Err(serde::ser::Error::custom("not a unit enum variant")),
    }
}

pub(super) fn from_name<T: DeserializeOwned>(name: String) -> Result<T, serde_json::Error> {
    serde_json::from_value(serde_json::Value::String(name))
}

pub(super) fn session_from_row(row: &Row<'_>) -> Result<Session, StoreError> {
    Ok(Session {
        id: row.get(0)?,
        owner: Identity {
            pid: row.get(1)?,
            start_ticks: ticks_from_sql(row.get(2)?),
            boot_id: row.get(3)?,
            host: row.get(4)?,
            comm: row.get(5)?,
            pidfs_ino: row.get::<_, Option<i64>>(18)?.map(ticks_from_sql),
        },
        phase: from_name(row.get(6)?)?,
        pending: row.get(7)?,
        reason: row
            .get::<_, Option<String>>(8)?
            .map(from_name)
            .transpose()?,
        exit: json_column(row, 9)?,
        detected_by: row
            .get::<_, Option<String>>(10)?
            .map(from_name)
            .transpose()?,
        creator_uid: row.get(11)?,
        labels: serde_json::from_str(&row.get::<_, String>(12)?)?,
        created_ms: row.get(13)?,
        updated_ms: row.get(14)?,
        touched_ms: row.get(15)?,
        ended_ms: row.get(16)?,
        pending_expires_ms: row.get(17)?,
        survivors: json_column(row, 19)?,
        on_end: from_name(row.get(20)?)?,
        grace_ms: u64::try_from(row.get::<_, i64>(21)?).unwrap_or_default(),
        cause: json_column(row, 22)?,
        usage: json_column(row, 23)?,
        on_end_run: json_column(row, 24)?.unwrap_or_default(),
        actions: Vec::new(),
        finalized_ms: row.get(25)?,
        until: from_name(row.get(26)?)?,
        reaped: lenient_json_column(row, 27),
        declared: lenient_json_column(row, 28),
        activity: lenient_json_column(row, 29),
        on_stall: json_column(row, 30)?,
        cgroup: json_column(row, 31)?,
    })
}

/// A nullable column holding JSON.
fn json_column<T: DeserializeOwned>(row: &Row<'_>, index: usize) -> Result<Option<T>, StoreError> {
    Ok(row
        .get::<_, Option<String>>(index)?
        .map(|s| serde_json::from_str(&s))
        .transpose()?)
}

/// A nullable column holding JSON that only reports: a value that does not read (damaged,
/// or written by a newer daemon) is logged and left out, never fails the session's read.
fn lenient_json_column<T: DeserializeOwned>(row: &Row<'_>, index: usize) -> Option<T> {
    match json_column(row, index) {
        Ok(value) => value,
        Err(error) => {
            tracing::warn!(%error, column = index, "an unreadable report is left out of a session");
            None
        }
    }
}

/// A nullable JSON column's value.
pub(super) fn json_value<T: Serialize>(value: Option<&T>) -> Result<Option<String>, StoreError> {
    Ok(value.map(serde_json::to_string).transpose()?)
}

pub(super) fn get_session(
    conn: &Connection,
    uid: u32,
    id: &str,
) -> Result<Option<Session>, StoreError> {
    conn.prepare_cached(concat!(
        "SELECT ",
        session_columns!(),
        " FROM sessions WHERE creator_uid = ?1 AND id = ?2"
    ))?
    .query_and_then(params![uid, id], session_from_row)?
    .next()
    .transpose()
}

pub(super) fn insert_session(conn: &Connection, s: &Session) -> Result<(), StoreError> {
    conn.prepare_cached(concat!(
        "INSERT INTO sessions (",
        session_columns!(),
        ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, \
         ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31, ?32)"
    ))?
    .execute(params![
        s.id,
        s.owner.pid,
        ticks_to_sql(s.owner.start_ticks),
        s.owner.boot_id,
        s.owner.host,
        s.owner.comm,
        name(&s.phase)?,
        s.pending,
        s.reason.map(|r| name(&r)).transpose()?,
        json_value(s.exit.as_ref())?,
        s.detected_by.map(|d| name(&d)).transpose()?,
        s.creator_uid,
        serde_json::to_string(&s.labels)?,
        s.created_ms,
        s.updated_ms,
        s.touched_ms,
        s.ended_ms,
        s.pending_expires_ms,
        s.owner.pidfs_ino.map(ticks_to_sql),
        json_value(s.survivors.as_ref())?,
        name(&s.on_end)?,
        i64::try_from(s.grace_ms).unwrap_or(i64::MAX),
        json_value(s.cause.as_ref())?,
        json_value(s.usage.as_ref())?,
        specs_column(&s.on_end_run)?,
        s.finalized_ms,
        name(&s.until)?,
        json_value(s.reaped.as_ref())?,
        json_value(s.declared.as_ref())?,
        json_value(s.activity.as_ref())?,
        json_value(s.on_stall.as_ref())?,
        json_value(s.cgroup.as_ref())?,
    ])?;
    Ok(())
}

/// The `on_end_run` column: NULL for none.
pub(super) fn specs_column(
    specs: &[liveness_common::action::ActionSpec],
) -> Result<Option<String>, StoreError> {
    Ok((!specs.is_empty())
        .then(|| serde_json::to_string(specs))
        .transpose()?)
}

/// True when user `uid`'s active session `id` was touched (and `declared` kept, if given).
pub(super) fn touch_active(
    conn: &Connection,
    uid: u32,
    id: &str,
    now_ms: i64,
    declared: Option<&Declared>,
) -> Result<bool, StoreError> {
    let changed = conn
        .prepare_cached(
            "UPDATE sessions SET touched_ms = ?2, declared = coalesce(?4, declared) \
             WHERE creator_uid = ?3 AND id = ?1 AND phase = 'active'",
        )?
        .execute(params![id, now_ms, uid, json_value(declared)?])?;
    Ok(changed > 0)
}

/// Gives `event` the next seq and stores it, inside the caller's write transaction. The seq
/// is explicit (rather than assigned by the insert) because the stored body contains it.
pub(super) fn append(conn: &Connection, mut event: Event) -> Result<Event, StoreError> {
    event.seq = head_seq(conn)? + 1;
    let body = serde_json::to_string(&event)?;
    conn.prepare_cached(
        "INSERT INTO events (seq, kind, session, creator_uid, at_ms, body) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        event.seq as i64,
        name(&event.kind)?,
        event.session,
        event.creator_uid,
        event.at_ms,
        body
    ])?;
    Ok(event)
}

pub(super) fn head_seq(conn: &Connection) -> Result<u64, StoreError> {
    let seq: i64 = conn
        .prepare_cached(
            "SELECT MAX(COALESCE((SELECT MAX(seq) FROM events), 0), \
             (SELECT value FROM meta WHERE key = 'pruned_through'), \
             (SELECT value FROM meta WHERE key = 'seq_floor'))",
        )?
        .query_row([], |r| r.get(0))?;
    Ok(seq as u64)
}
