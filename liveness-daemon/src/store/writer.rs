//! The writer: [`Store`], the one read-write connection the engine drives.

#[cfg(test)]
use super::OwnerDeath;
use super::actions::set_actions;
use super::ending::{EndingRow, end_selected};
use super::journal::JournalError;
use super::lock_rows::{jump_tokens, rename_holder};
use super::reader::{ListQuery, SessionPage};
use super::replay::events_after;
use super::rows::{
    append, event_about, get_session, head_seq, insert_session, json_value, name, session_from_row,
    specs_column, ticks_from_sql, ticks_to_sql, touch_active, validate_id,
};
use super::schema::{FileId, check_version, create, file_id, is_damage, is_truncated, migrate};
use super::{
    BUSY_TIMEOUT, Ending, EventFilter, EventPage, Lineage, NewSession, Registered, StoreError,
};
use liveness_common::activity::{Activity, Declared, StallPolicy};
use liveness_common::identity::Identity;
use liveness_common::session::{Event, EventKind, Phase, Session};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use std::path::{Path, PathBuf};

use super::reader::list;

/// The writer: owns the only read-write connection.
/// How far the seq counter jumps after a possible power loss: further than the commits
/// SQLite can lose (those after the last WAL sync), so a seq already streamed is never
/// given to another event.
pub const SEQ_JUMP_AFTER_POWER_LOSS: u64 = 1 << 20;

#[derive(Debug)]
pub struct Store {
    pub(super) conn: Connection,
    pub(super) path: PathBuf,
    /// Device and inode of the file opened, to notice it being replaced or deleted.
    pub(super) file: FileId,
}

impl Store {
    /// Opens (creating if needed) the database at `path`, checks that it is intact and
    /// migrates it. The parent directory must exist. A damaged database is refused
    /// ([`StoreError::Damaged`]) without being changed.
    pub fn open(path: impl AsRef<Path>) -> Result<Store, StoreError> {
        let path = path.as_ref();
        if !path.exists() {
            create(path)?;
        }
        if is_truncated(path) {
            return Err(StoreError::Damaged {
                path: path.into(),
                detail: "the file is empty: it was truncated".into(),
            });
        }
        Store::open_checked(path).map_err(|e| match e {
            StoreError::Sqlite(e) if is_damage(&e) => StoreError::Damaged {
                path: path.into(),
                detail: e.to_string(),
            },
            other => other,
        })
    }

    pub(super) fn open_checked(path: &Path) -> Result<Store, StoreError> {
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        // Refuse before touching anything (even the journal mode) of a newer schema.
        check_version(&conn, false)?;
        // Pages and indexes, without the cross-checks of a full integrity_check: a damaged
        // file is refused before anything trusts (or writes) it.
        let verdict: String = conn.pragma_query_value(None, "quick_check", |r| r.get(0))?;
        if verdict != "ok" {
            return Err(StoreError::Damaged {
                path: path.into(),
                detail: verdict,
            });
        }
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // WAL + NORMAL: a commit survives a daemon crash or SIGKILL (it is in the WAL file);
        // only a power loss may drop the newest commits. That is acceptable because start-up
        // reconcile re-checks every ACTIVE session and finalizes those whose owner is gone,
        // and begin_run keeps the seqs of lost events from being reused. It saves an fsync
        // per commit (about 250 us here), more than the whole latency budget of a death.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", true)?;
        // Never inside a commit: the checkpoint has a thread of its own (see `checkpoint`).
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        // 32 MiB (negative = KiB) instead of 2: a burst of thousands of finalizations in one
        // transaction dirties pages all over the sessions table, and a small cache spills them
        // to the WAL mid-transaction (end_many of 10k measured ~1.5x faster).
        conn.pragma_update(None, "cache_size", -32 * 1024)?;
        conn.set_prepared_statement_cache_capacity(64);
        migrate(&mut conn)?;
        let file = file_id(path).map_err(|source| StoreError::File {
            action: "stat",
            path: path.into(),
            source,
        })?;
        Ok(Store {
            conn,
            path: path.into(),
            file,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Fails once the database file was deleted or replaced by another file since it was
    /// opened: commits would then go to a file that nobody will ever open again.
    pub fn check_file(&self) -> Result<(), StoreError> {
        let what = match file_id(&self.path) {
            Ok(file) if file == self.file => return Ok(()),
            Ok(_) => "replaced",
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "deleted",
            // Unreadable for another reason (a permission change): not proof of a ghost.
            Err(_) => return Ok(()),
        };
        Err(StoreError::FileChanged {
            path: self.path.clone(),
            what,
        })
    }

    /// Says "no space left on device" for a failure caused by a full disk, which SQLite
    /// may report as a generic I/O error (when it grows the write-ahead log).
    pub fn explain(&self, error: StoreError) -> StoreError {
        if let StoreError::Journal(JournalError::Io { path, source }) = &error
            && source.raw_os_error() == Some(libc::ENOSPC)
        {
            return StoreError::NoSpace {
                path: path.clone(),
                detail: source.to_string(),
            };
        }
        let StoreError::Sqlite(e) = &error else {
            return error;
        };
        let full = match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DiskFull) => true,
            Some(rusqlite::ErrorCode::SystemIoFailure) => {
                // SAFETY: the handle is only read, on the thread that owns the connection.
                let errno = unsafe { rusqlite::ffi::sqlite3_system_errno(self.conn.handle()) };
                errno == libc::ENOSPC
            }
            _ => false,
        };
        if !full {
            return error;
        }
        StoreError::NoSpace {
            path: self.path.clone(),
            detail: e.to_string(),
        }
    }

    /// Marks the start of a daemon run on boot `boot_id`; returns whether seqs jumped.
    ///
    /// With `synchronous=NORMAL` a power loss can drop the newest commits after their
    /// events were streamed; reusing those seqs would make a consumer that handled one skip
    /// the new event that takes it. A power loss means a new boot, and a run that did not
    /// stop cleanly: then the counter jumps by [`SEQ_JUMP_AFTER_POWER_LOSS`], and so does
    /// the lock token counter (a lost grant's token may be in use by a writer). A daemon
    /// crash on the same boot loses nothing, so seqs stay contiguous.
    pub fn begin_run(&mut self, boot_id: &str) -> Result<bool, StoreError> {
        self.durably(|conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let meta = |key: &str| {
                tx.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| {
                    r.get::<_, rusqlite::types::Value>(0)
                })
            };
            let last_boot = meta("run_boot_id")?;
            let clean = meta("run_clean")?;
            let jump = clean == rusqlite::types::Value::Integer(0)
                && last_boot != rusqlite::types::Value::Text(boot_id.to_owned());
            if jump {
                let floor = (head_seq(&tx)? + SEQ_JUMP_AFTER_POWER_LOSS) as i64;
                tx.execute(
                    "UPDATE meta SET value = ?1 WHERE key = 'seq_floor'",
                    [floor],
                )?;
                jump_tokens(&tx, SEQ_JUMP_AFTER_POWER_LOSS)?;
            }
            tx.execute(
                "INSERT INTO runs (run, started_after) VALUES (lower(hex(randomblob(8))), ?1)",
                [head_seq(&tx)? as i64],
            )?;
            tx.execute(
                "UPDATE meta SET value = ?1 WHERE key = 'run_boot_id'",
                [boot_id],
            )?;
            tx.execute("UPDATE meta SET value = 0 WHERE key = 'run_clean'", [])?;
            tx.execute(
                "INSERT OR IGNORE INTO boots (boot_id) VALUES (?1)",
                [boot_id],
            )?;
            tx.commit()?;
            Ok(jump)
        })
    }

    /// Whether a daemon ran on boot `boot_id` with this database: its owners were of this
    /// machine, whatever host name they carry.
    pub fn is_known_boot(&self, boot_id: &str) -> Result<bool, StoreError> {
        let found = self
            .conn
            .prepare_cached("SELECT 1 FROM boots WHERE boot_id = ?1")?
            .query_row([boot_id], |_| Ok(()))
            .optional()?;
        Ok(found.is_some())
    }

    /// Marks a clean stop: the next run, on any boot, continues the seqs as they are.
    pub fn end_run(&mut self) -> Result<(), StoreError> {
        self.durably(|conn| {
            conn.execute("UPDATE meta SET value = 1 WHERE key = 'run_clean'", [])?;
            Ok(())
        })
    }

    /// Runs `f` with every commit synced to disk: for the few writes that must survive a
    /// power loss even though ordinary commits need not.
    pub(super) fn durably<T>(
        &mut self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.conn.pragma_update(None, "synchronous", "FULL")?;
        let result = f(&mut self.conn);
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        result
    }

    /// Registers a session, or gives an active one a new owner (a new turn).
    ///
    /// Authorization (may this caller touch an existing session?) is the engine's job: it
    /// calls [`Store::get`] first.
    pub fn register(&mut self, req: NewSession, now_ms: i64) -> Result<Registered, StoreError> {
        validate_id(&req.id)?;
        let tx = self.write_tx()?;
        let registered = match get_session(&tx, req.creator_uid, &req.id)? {
            None => {
                let session = Session {
                    id: req.id,
                    owner: req.owner,
                    phase: Phase::Active,
                    pending: req.pending,
                    reason: None,
                    exit: None,
                    cause: None,
                    usage: None,
                    detected_by: None,
                    creator_uid: req.creator_uid,
                    labels: req.labels,
                    created_ms: now_ms,
                    updated_ms: now_ms,
                    touched_ms: now_ms,
                    ended_ms: None,
                    pending_expires_ms: req.pending_expires_ms.filter(|_| req.pending),
                    survivors: None,
                    on_end: req.on_end,
                    grace_ms: req.grace_ms,
                    until: req.until,
                    on_end_run: req.on_end_run.unwrap_or_default(),
                    on_stall: req.on_stall,
                    cgroup: req.cgroup,
                    actions: Vec::new(),
                    finalized_ms: None,
                    reaped: None,
                    declared: None,
                    activity: None,
                };
                insert_session(&tx, &session)?;
                set_actions(
                    &tx,
                    session.creator_uid,
                    &session.id,
                    session.on_end_run.len(),
                    req.creator_gid,
                )?;
                let event = append(&tx, event_about(EventKind::Registered, &session, now_ms))?;
                Registered {
                    session,
                    event: Some(event),
                }
            }
            Some(session) if session.phase == Phase::Ended => {
                return Err(StoreError::AlreadyEnded(session.id));
            }
            Some(mut session) if session.owner.same_process(&req.owner) => {
                // Same owner again: idempotent, but it is activity.
                touch_active(&tx, session.creator_uid, &session.id, now_ms, None)?;
                replace_actions(&tx, &mut session, req.on_end_run, req.creator_gid)?;
                replace_stall_policy(&tx, &mut session, req.on_stall)?;
                session.touched_ms = now_ms;
                Registered {
                    session,
                    event: None,
                }
            }
            Some(mut session) => {
                replace_actions(&tx, &mut session, req.on_end_run, req.creator_gid)?;
                replace_stall_policy(&tx, &mut session, req.on_stall)?;
                let previous = std::mem::replace(&mut session.owner, req.owner);
                let owner = &session.owner;
                tx.prepare_cached(
                    "UPDATE sessions SET owner_pid = ?2, owner_start_ticks = ?3, \
                     owner_boot_id = ?4, owner_host = ?5, owner_comm = ?6, updated_ms = ?7, \
                     touched_ms = ?7, owner_pidfs_ino = ?9 \
                     WHERE id = ?1 AND creator_uid = ?8 AND phase = 'active'",
                )?
                .execute(params![
                    session.id,
                    owner.pid,
                    ticks_to_sql(owner.start_ticks),
                    owner.boot_id,
                    owner.host,
                    owner.comm,
                    now_ms,
                    session.creator_uid,
                    owner.pidfs_ino.map(ticks_to_sql),
                ])?;
                session.updated_ms = now_ms;
                session.touched_ms = now_ms;
                let event = append(
                    &tx,
                    Event {
                        previous_owner: Some(previous),
                        ..event_about(EventKind::OwnerChanged, &session, now_ms)
                    },
                )?;
                Registered {
                    session,
                    event: Some(event),
                }
            }
        };
        tx.commit()?;
        Ok(registered)
    }

    /// Gives user `uid`'s pending session its real id, in the same user's namespace; it
    /// stops being pending. Earlier events keep the old id; the `session.renamed` event
    /// links the two.
    pub fn rename(
        &mut self,
        uid: u32,
        id: &str,
        to: &str,
        now_ms: i64,
    ) -> Result<Event, StoreError> {
        validate_id(to)?;
        let tx = self.write_tx()?;
        let mut session =
            get_session(&tx, uid, id)?.ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        if session.phase == Phase::Ended {
            return Err(StoreError::AlreadyEnded(session.id));
        }
        if !session.pending {
            return Err(StoreError::NotPending(session.id));
        }
        if get_session(&tx, uid, to)?.is_some() {
            return Err(StoreError::AlreadyExists(to.to_owned()));
        }
        tx.prepare_cached(
            "UPDATE sessions SET id = ?2, pending = 0, pending_expires_ms = NULL, \
             updated_ms = ?3, touched_ms = ?3 WHERE id = ?1 AND creator_uid = ?4",
        )?
        .execute(params![id, to, now_ms, uid])?;
        rename_holder(&tx, uid, id, to)?;
        tx.prepare_cached("UPDATE actions SET session = ?3 WHERE uid = ?1 AND session = ?2")?
            .execute(params![uid, id, to])?;
        session.id = to.to_owned();
        let event = append(
            &tx,
            Event {
                previous_session: Some(id.to_owned()),
                ..event_about(EventKind::Renamed, &session, now_ms)
            },
        )?;
        tx.commit()?;
        Ok(event)
    }

    /// Records activity on an active session, and what its agent declared (no event).
    pub fn touch(
        &mut self,
        uid: u32,
        id: &str,
        now_ms: i64,
        declared: Option<&Declared>,
    ) -> Result<(), StoreError> {
        // A single UPDATE commits atomically on its own.
        if touch_active(&self.conn, uid, id, now_ms, declared)? {
            return Ok(());
        }
        match get_session(&self.conn, uid, id)? {
            None => Err(StoreError::NotFound(id.to_owned())),
            Some(_) => Err(StoreError::AlreadyEnded(id.to_owned())),
        }
    }

    /// Records a stall episode's start (`session.stalled`, its judgement kept with the
    /// session) or end (`session.unstalled`, the judgement cleared) for user `uid`'s ACTIVE
    /// session `id`, in one transaction. None when the session is no longer active.
    pub fn record_activity(
        &mut self,
        uid: u32,
        id: &str,
        activity: &Activity,
        now_ms: i64,
    ) -> Result<Option<Event>, StoreError> {
        let kind = if activity.state.is_stall() {
            EventKind::Stalled
        } else {
            EventKind::Unstalled
        };
        let tx = self.write_tx()?;
        let Some(session) = get_session(&tx, uid, id)?.filter(|s| s.phase == Phase::Active) else {
            return Ok(None);
        };
        let kept = (kind == EventKind::Stalled).then_some(activity);
        tx.prepare_cached("UPDATE sessions SET activity = ?3 WHERE creator_uid = ?1 AND id = ?2")?
            .execute(params![uid, id, json_value(kept)?])?;
        let event = append(
            &tx,
            Event {
                activity: Some(activity.clone()),
                ..event_about(kind, &session, now_ms)
            },
        )?;
        tx.commit()?;
        Ok(Some(event))
    }

    /// Ends user `uid`'s session `id` as `ending` says, if it is still active and, when
    /// `expected_owner` is given, still owned by that process: its `session.ended` event,
    /// then those of the locks it held. None when it was already ended or the owner changed.
    pub fn end(
        &mut self,
        uid: u32,
        id: &str,
        expected_owner: Option<&Identity>,
        ending: &Ending,
        now_ms: i64,
    ) -> Result<Vec<Event>, StoreError> {
        let tx = self.write_tx()?;
        let ended = end_selected(
            &tx,
            select_active!(
                "id = ?1 AND creator_uid = ?5 AND (?2 IS NULL OR (owner_pid = ?2 \
                 AND owner_start_ticks = ?3 AND owner_boot_id = ?4))"
            ),
            params![
                id,
                expected_owner.map(|o| o.pid),
                expected_owner.map(|o| ticks_to_sql(o.start_ticks)),
                expected_owner.map(|o| &o.boot_id),
                uid,
            ],
            &EndingRow::new(ending, now_ms)?,
        )?;
        if ended.is_empty() {
            return if get_session(&tx, uid, id)?.is_some() {
                Ok(ended)
            } else {
                Err(StoreError::NotFound(id.to_owned()))
            };
        }
        tx.commit()?;
        Ok(ended)
    }

    /// Ends every ACTIVE session of each dead owner now, as the engine's journaled path
    /// does (the same [`super::journal_deaths`] and [`Store::apply`]), without a journal:
    /// what the store's tests of endings run.
    #[cfg(test)]
    pub fn end_many(
        &mut self,
        deaths: &[OwnerDeath],
        now_ms: i64,
    ) -> Result<Vec<Event>, StoreError> {
        let active = super::Active::load(self)?;
        let batch = super::journal_deaths(&active, deaths, now_ms, self.head_seq()?)?;
        self.apply(std::slice::from_ref(&batch.entry))?;
        Ok(batch.events)
    }

    /// User `uid`'s session `id`.
    pub fn get(&self, uid: u32, id: &str) -> Result<Option<Session>, StoreError> {
        get_session(&self.conn, uid, id)
    }

    /// Every user's session of this id, by uid: how root finds a session by id alone.
    pub fn find_any_user(&self, id: &str) -> Result<Vec<Session>, StoreError> {
        self.sessions(
            concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions WHERE id = ?1 ORDER BY creator_uid"
            ),
            params![id],
        )
    }

    /// Same as [`EventReader::list`].
    pub fn list(&self, query: &ListQuery) -> Result<SessionPage, StoreError> {
        list(&self.conn, query)
    }

    /// How many sessions are in `phase`.
    pub fn count(&self, phase: Phase) -> Result<u64, StoreError> {
        let count: i64 = self
            .conn
            .prepare_cached("SELECT COUNT(*) FROM sessions WHERE phase = ?1")?
            .query_row(params![name(&phase)?], |r| r.get(0))?;
        Ok(count as u64)
    }

    /// Each distinct owner of an active session (to track, and to reconcile at start).
    pub fn active_owners(&self) -> Result<Vec<Identity>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT owner_pid, owner_start_ticks, owner_boot_id, MAX(owner_host), \
             MAX(owner_comm), MAX(owner_pidfs_ino) FROM sessions WHERE phase = 'active' \
             GROUP BY owner_pid, owner_start_ticks, owner_boot_id",
        )?;
        let owners = stmt
            .query_map([], |row| {
                Ok(Identity {
                    pid: row.get(0)?,
                    start_ticks: ticks_from_sql(row.get(1)?),
                    boot_id: row.get(2)?,
                    host: row.get(3)?,
                    comm: row.get(4)?,
                    pidfs_ino: row.get::<_, Option<i64>>(5)?.map(ticks_from_sql),
                })
            })?
            .collect::<Result<_, _>>()?;
        Ok(owners)
    }

    /// Active sessions whose owner is the same process as `owner` (fingerprint; comm and
    /// host ignored).
    pub fn active_sessions_of_owner(&self, owner: &Identity) -> Result<Vec<Session>, StoreError> {
        self.sessions(
            concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions WHERE phase = 'active' AND owner_pid = ?1 \
                 AND owner_start_ticks = ?2 AND owner_boot_id = ?3 ORDER BY id"
            ),
            params![owner.pid, ticks_to_sql(owner.start_ticks), owner.boot_id],
        )
    }

    /// Active pending sessions whose deadline to be renamed has passed.
    pub fn expired_pending(&self, now_ms: i64) -> Result<Vec<Session>, StoreError> {
        self.sessions(
            concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions INDEXED BY sessions_pending_expiry \
                 WHERE phase = 'active' AND pending AND pending_expires_ms <= ?1 ORDER BY id"
            ),
            params![now_ms],
        )
    }

    /// Active sessions owned on a boot other than `local_boot` without activity since
    /// `cutoff_ms`: owners on other machines, the only ones nothing can watch, so the
    /// inactivity timeout ends them. Two range searches skip every session of this boot,
    /// however many there are.
    pub fn idle_of_other_boots(
        &self,
        cutoff_ms: i64,
        local_boot: &str,
    ) -> Result<Vec<Session>, StoreError> {
        macro_rules! idle_where_boot {
            ($comparison:literal) => {
                concat!(
                    "SELECT ",
                    session_columns!(),
                    " FROM sessions INDEXED BY sessions_active_by_boot \
                     WHERE phase = 'active' AND owner_boot_id ",
                    $comparison,
                    " ?2 AND touched_ms < ?1"
                )
            };
        }
        let mut idle = Vec::new();
        for sql in [idle_where_boot!("<"), idle_where_boot!(">")] {
            idle.extend(self.sessions(sql, params![cutoff_ms, local_boot])?);
        }
        idle.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        Ok(idle)
    }

    /// Deletes sessions that ended before `ended_before_ms`. Their ids become free again:
    /// an ended id is refused only while its session is kept (as documented).
    pub fn prune_sessions(&mut self, ended_before_ms: i64) -> Result<u64, StoreError> {
        let deleted = self
            .conn
            .prepare_cached("DELETE FROM sessions WHERE phase = 'ended' AND ended_ms < ?1")?
            .execute(params![ended_before_ms])?;
        self.conn
            .prepare_cached(
                "DELETE FROM actions WHERE NOT EXISTS (SELECT 1 FROM sessions \
                 WHERE creator_uid = uid AND id = session)",
            )?
            .execute([])?;
        Ok(deleted as u64)
    }

    /// The last committed seq, 0 before the first event.
    pub fn head_seq(&self) -> Result<u64, StoreError> {
        head_seq(&self.conn)
    }

    /// The store's identity: random, made with the database, never changed.
    pub fn store_id(&self) -> Result<String, StoreError> {
        Ok(self
            .conn
            .query_row("SELECT value FROM meta WHERE key = 'store_id'", [], |r| {
                r.get(0)
            })?)
    }

    /// The store and the daemon runs it had (see [`Lineage`]).
    pub fn lineage(&self) -> Result<Lineage, StoreError> {
        let runs = self
            .conn
            .prepare_cached("SELECT run, started_after FROM runs ORDER BY rowid")?
            .query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?
            .collect::<Result<_, _>>()?;
        Ok(Lineage {
            store: self.store_id()?,
            runs,
        })
    }

    /// Up to `limit` events with seq > `since` that match `filter`, or a gap.
    pub fn events_after(
        &self,
        since: u64,
        limit: usize,
        filter: &EventFilter,
    ) -> Result<EventPage, StoreError> {
        events_after(&self.conn, since, limit, filter)
    }

    /// Retention: deletes the oldest events, all but the newest `keep_count` and those older
    /// than `max_age_ms`, and records the highest deleted seq so replays report the gap.
    /// Always deletes a prefix of the log, so every seq after `pruned_through` is present.
    pub fn prune(
        &mut self,
        keep_count: u64,
        max_age_ms: i64,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        let tx = self.write_tx()?;
        let by_count: Option<i64> = tx
            .prepare_cached("SELECT seq FROM events ORDER BY seq DESC LIMIT 1 OFFSET ?1")?
            .query_row([i64::try_from(keep_count).unwrap_or(i64::MAX)], |r| {
                r.get(0)
            })
            .optional()?;
        // Old events form a prefix up to the first young one: scanning stops there, and a
        // clock step backwards cannot punch holes in the middle of the log.
        let first_young: Option<i64> = tx
            .prepare_cached("SELECT seq FROM events WHERE at_ms >= ?1 ORDER BY seq LIMIT 1")?
            .query_row([now_ms.saturating_sub(max_age_ms)], |r| r.get(0))
            .optional()?;
        let by_age = match first_young {
            Some(seq) => seq - 1,
            None => head_seq(&tx)? as i64,
        };
        let through = by_count.unwrap_or(0).max(by_age);
        let deleted = tx
            .prepare_cached("DELETE FROM events WHERE seq <= ?1")?
            .execute([through])?;
        if deleted > 0 {
            tx.prepare_cached(
                "UPDATE meta SET value = MAX(value, ?1) WHERE key = 'pruned_through'",
            )?
            .execute([through])?;
        }
        tx.commit()?;
        Ok(deleted as u64)
    }

    /// Makes every write fail (SQLite's `query_only`) until turned off again: how tests
    /// reach what callers do with a commit that fails.
    #[cfg(test)]
    pub fn fail_writes(&self, fail: bool) -> Result<(), StoreError> {
        self.conn.pragma_update(None, "query_only", fail)?;
        Ok(())
    }

    /// IMMEDIATE: take the write lock up front, so a read-then-write transaction can never
    /// fail half-way with SQLITE_BUSY because a reader connection holds a snapshot.
    pub(super) fn write_tx(&mut self) -> Result<rusqlite::Transaction<'_>, StoreError> {
        Ok(self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?)
    }

    pub(super) fn sessions(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<Session>, StoreError> {
        self.conn
            .prepare_cached(sql)?
            .query_and_then(params, session_from_row)?
            .collect()
    }
}

/// A registration of an ACTIVE session that names end actions replaces its list (an agent
/// reads its settings again at each start); one that names none keeps it.
fn replace_actions(
    tx: &rusqlite::Transaction<'_>,
    session: &mut Session,
    on_end_run: Option<Vec<liveness_common::action::ActionSpec>>,
    gid: Option<u32>,
) -> Result<(), StoreError> {
    let Some(specs) = on_end_run else {
        return Ok(());
    };
    tx.prepare_cached("UPDATE sessions SET on_end_run = ?3 WHERE creator_uid = ?1 AND id = ?2")?
        .execute(params![
            session.creator_uid,
            session.id,
            specs_column(&specs)?
        ])?;
    set_actions(tx, session.creator_uid, &session.id, specs.len(), gid)?;
    session.on_end_run = specs;
    Ok(())
}

/// A registration of an ACTIVE session that names a stall policy replaces it, as it does
/// its end actions.
fn replace_stall_policy(
    tx: &rusqlite::Transaction<'_>,
    session: &mut Session,
    on_stall: Option<StallPolicy>,
) -> Result<(), StoreError> {
    let Some(policy) = on_stall else {
        return Ok(());
    };
    tx.prepare_cached("UPDATE sessions SET on_stall = ?3 WHERE creator_uid = ?1 AND id = ?2")?
        .execute(params![
            session.creator_uid,
            session.id,
            json_value(Some(&policy))?
        ])?;
    session.on_stall = Some(policy);
    Ok(())
}
