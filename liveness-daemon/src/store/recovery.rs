//! `livenessd --recover`: setting a damaged database aside and salvaging what it holds.

use super::StoreError;
use super::rows::{insert_session, session_from_row};
use super::schema::with_suffix;
use super::writer::{SEQ_JUMP_AFTER_POWER_LOSS, Store};
use rusqlite::{Connection, params};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

impl Store {
    /// `livenessd --recover`: sets a damaged database aside (renamed to
    /// `<name>.damaged-<unix time>`, with its write-ahead log) and starts a new one at
    /// `path` from every session and event that can still be read. Seqs continue a
    /// [`SEQ_JUMP_AFTER_POWER_LOSS`] above the highest one read, since events after it may
    /// have been streamed. Does nothing to an intact database.
    pub fn recover(path: &Path) -> Result<Recovered, StoreError> {
        match Store::open(path) {
            Ok(_) => return Ok(Recovered::default()),
            Err(StoreError::Damaged { .. }) => {}
            Err(other) => return Err(other),
        }
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let aside = with_suffix(path, &format!(".damaged-{stamp}"));
        let scratch = with_suffix(path, ".recovering");
        let io = |source| StoreError::File {
            action: "set aside",
            path: path.into(),
            source,
        };
        for suffix in ["", "-wal", "-shm"] {
            let from = with_suffix(path, suffix);
            if from.exists() {
                std::fs::rename(&from, with_suffix(&aside, suffix)).map_err(io)?;
                // Read from a copy: opening the kept file could change it (a WAL replay).
                std::fs::copy(with_suffix(&aside, suffix), with_suffix(&scratch, suffix))
                    .map_err(io)?;
            }
        }
        let mut store = Store::open(path)?;
        let recovered = salvage(&scratch, &mut store.conn);
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(with_suffix(&scratch, suffix));
        }
        Ok(Recovered {
            aside: Some(aside),
            ..recovered
        })
    }
}

/// What [`Store::recover`] did.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Where the damaged database was kept; `None` when it was intact.
    pub aside: Option<PathBuf>,
    pub sessions: u64,
    pub events: u64,
    /// The seq the new database continues from.
    pub seq_floor: u64,
}

/// Copies into `into` (a new database) whatever rows of the damaged database at `from`
/// can be read: each table until the first unreadable page, each row that parses.
pub(super) fn salvage(from: &Path, into: &mut Connection) -> Recovered {
    let mut recovered = Recovered::default();
    let Ok(old) = Connection::open(from) else {
        return recovered;
    };
    let Ok(tx) = into.transaction() else {
        return recovered;
    };
    if let Ok(mut stmt) = old.prepare(concat!("SELECT ", session_columns!(), " FROM sessions"))
        && let Ok(rows) = stmt.query_and_then([], session_from_row)
    {
        for session in rows.map_while(Result::ok) {
            if insert_session(&tx, &session).is_ok() {
                recovered.sessions += 1;
            }
        }
    }
    let (mut lowest, mut highest) = (i64::MAX, 0i64);
    if let Ok(mut stmt) =
        old.prepare("SELECT seq, kind, session, creator_uid, at_ms, body FROM events ORDER BY seq")
        && let Ok(rows) = stmt.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, u32>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, String>(5)?,
            ))
        })
    {
        for (seq, kind, session, creator_uid, at_ms, body) in rows.map_while(Result::ok) {
            let inserted = tx.execute(
                "INSERT INTO events (seq, kind, session, creator_uid, at_ms, body) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![seq, kind, session, creator_uid, at_ms, body],
            );
            if inserted.is_ok() {
                recovered.events += 1;
                (lowest, highest) = (lowest.min(seq), highest.max(seq));
            }
        }
    }
    let mut highest_token = 0i64;
    if let Ok(mut stmt) = old.prepare("SELECT uid, name, session, token, since_ms FROM locks")
        && let Ok(rows) = stmt.query_map([], |r| {
            Ok((
                r.get::<_, u32>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
            ))
        })
    {
        for (uid, name, session, token, since_ms) in rows.map_while(Result::ok) {
            highest_token = highest_token.max(token);
            // Only locks of a recovered active session: a lock whose session was lost would
            // have no end to release it.
            let _ = tx.execute(
                "INSERT OR IGNORE INTO locks (uid, name, session, token, since_ms) \
                 SELECT ?1, ?2, ?3, ?4, ?5 FROM sessions \
                 WHERE creator_uid = ?1 AND id = ?3 AND phase = 'active'",
                params![uid, name, session, token, since_ms],
            );
        }
    }
    let floor = (highest as u64).saturating_add(SEQ_JUMP_AFTER_POWER_LOSS);
    // Every grant wrote an event, so no token exceeds the highest seq; the old counter and
    // the tokens read are jumped past too, as grants after the last readable page may be lost.
    let old_token = old
        .query_row("SELECT value FROM meta WHERE key = 'lock_token'", [], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap_or(0)
        .max(highest_token) as u64;
    let token_floor = floor.max(old_token.saturating_add(SEQ_JUMP_AFTER_POWER_LOSS));
    // Replays from before the oldest event read are told of a gap, not silently skipped.
    let floored = tx
        .execute(
            "UPDATE meta SET value = ?1 WHERE key = 'seq_floor'",
            [floor as i64],
        )
        .and_then(|_| {
            tx.execute(
                "UPDATE meta SET value = ?1 WHERE key = 'lock_token'",
                [token_floor as i64],
            )
        })
        .and_then(|_| {
            tx.execute(
                "UPDATE meta SET value = ?1 WHERE key = 'pruned_through'",
                [lowest.saturating_sub(1).min(highest)],
            )
        });
    if floored.is_ok() && tx.commit().is_ok() {
        recovered.seq_floor = floor;
        recovered
    } else {
        Recovered::default()
    }
}
