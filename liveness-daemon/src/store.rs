//! Durable session state and the event log, in one SQLite file.
//!
//! Every state change is ONE transaction that writes the session row and its event row
//! together, and returns the committed [`Event`]: the caller announces it only after the
//! commit (state and events are written before they are announced). Finalization is a
//! compare-and-set on `phase = 'active'` plus the owner fingerprint, so a session ends
//! exactly once and never by the death of an owner it no longer has.
//!
//! One [`Store`] (one writer connection) is driven by the engine; event replay may use
//! [`EventReader`]s, extra read-only connections that WAL lets read during commits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior, params};
use serde::Serialize;
use serde::de::DeserializeOwned;

use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::identity::Identity;
use liveness_common::session::{EndReason, Event, EventKind, Phase, Session};

/// Longest accepted session id, in bytes.
pub const MAX_ID_LEN: usize = 256;

/// How long a statement waits for a lock held by another connection before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Schema migrations, in order: migration `i` brings `user_version` from `i` to `i + 1`.
/// Never edit a released entry; append a new one.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE sessions (
    id TEXT PRIMARY KEY NOT NULL,
    owner_pid INTEGER NOT NULL,
    owner_start_ticks INTEGER NOT NULL,
    owner_boot_id TEXT NOT NULL,
    owner_host TEXT NOT NULL,
    owner_comm TEXT NOT NULL,
    phase TEXT NOT NULL CHECK (phase IN ('active', 'ended')),
    pending INTEGER NOT NULL,
    reason TEXT,
    exit TEXT,
    detected_by TEXT,
    creator_uid INTEGER NOT NULL,
    labels TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    ended_ms INTEGER,
    touched_ms INTEGER NOT NULL,
    pending_expires_ms INTEGER
);
CREATE INDEX sessions_by_owner ON sessions (phase, owner_pid, owner_start_ticks);
-- AUTOINCREMENT: a seq is never reused, even after retention deleted the newest rows.
CREATE TABLE events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    session TEXT NOT NULL,
    creator_uid INTEGER NOT NULL,
    at_ms INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX events_by_session ON events (session, seq);
CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value NOT NULL);
INSERT INTO meta (key, value) VALUES ('pruned_through', 0);
-- The boot of the last daemon run and whether it stopped cleanly (see begin_run).
INSERT INTO meta (key, value) VALUES ('run_boot_id', ''), ('run_clean', 1);
"#,
    r#"
-- Housekeeping runs every few seconds over up to 100k ACTIVE sessions: these partial
-- indexes hold only the rows it looks for, so an idle daemon reads next to nothing.
CREATE INDEX sessions_pending_expiry ON sessions (pending_expires_ms)
    WHERE phase = 'active' AND pending;
CREATE INDEX sessions_active_by_host ON sessions (owner_host, touched_ms)
    WHERE phase = 'active';
"#,
    r#"
-- Fewer pages written per finalization (a one-death commit went from 7.8 WAL frames to 4.7).
-- The owner index no longer holds the phase, which made every ending move its entry from
-- one part of the index to another; an owner has few sessions to filter by phase.
DROP INDEX sessions_by_owner;
CREATE INDEX sessions_by_owner ON sessions (owner_pid, owner_start_ticks);
-- Events lose AUTOINCREMENT, whose sqlite_sequence row every append rewrote. The head seq
-- is now the largest of the newest event, the pruned prefix and meta 'seq_floor' (where a
-- seq jump after a power loss goes), so a seq is still never handed out twice.
CREATE TABLE events_v3 (
    seq INTEGER PRIMARY KEY NOT NULL,
    kind TEXT NOT NULL,
    session TEXT NOT NULL,
    creator_uid INTEGER NOT NULL,
    at_ms INTEGER NOT NULL,
    body TEXT NOT NULL
);
INSERT INTO events_v3 SELECT seq, kind, session, creator_uid, at_ms, body FROM events;
INSERT INTO meta (key, value)
    VALUES ('seq_floor', COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0));
DROP TABLE events;
ALTER TABLE events_v3 RENAME TO events;
CREATE INDEX events_by_session ON events (session, seq);
"#,
    r#"
-- The store's identity, made once with the database: seqs mean something only within one
-- store, so a consumer whose cursor came from another (the database was deleted, replaced
-- or restored) is told to start over rather than have every seq up to its cursor skipped.
INSERT INTO meta (key, value) VALUES ('store_id', lower(hex(randomblob(16))));
"#,
    r#"
-- Session ids are per user: the key is (creator_uid, id), so no user can take another
-- user's id first, nor learn from an error that it exists. The table is rebuilt for its new
-- key, with every column, and its indexes made again.
CREATE TABLE sessions_v5 (
    id TEXT NOT NULL,
    owner_pid INTEGER NOT NULL,
    owner_start_ticks INTEGER NOT NULL,
    owner_boot_id TEXT NOT NULL,
    owner_host TEXT NOT NULL,
    owner_comm TEXT NOT NULL,
    phase TEXT NOT NULL CHECK (phase IN ('active', 'ended')),
    pending INTEGER NOT NULL,
    reason TEXT,
    exit TEXT,
    detected_by TEXT,
    creator_uid INTEGER NOT NULL,
    labels TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    ended_ms INTEGER,
    touched_ms INTEGER NOT NULL,
    pending_expires_ms INTEGER,
    PRIMARY KEY (creator_uid, id)
);
INSERT INTO sessions_v5 (id, owner_pid, owner_start_ticks, owner_boot_id, owner_host,
    owner_comm, phase, pending, reason, exit, detected_by, creator_uid, labels, created_ms,
    updated_ms, ended_ms, touched_ms, pending_expires_ms)
SELECT id, owner_pid, owner_start_ticks, owner_boot_id, owner_host, owner_comm, phase,
    pending, reason, exit, detected_by, creator_uid, labels, created_ms, updated_ms,
    ended_ms, touched_ms, pending_expires_ms FROM sessions;
DROP TABLE sessions;
ALTER TABLE sessions_v5 RENAME TO sessions;
CREATE INDEX sessions_by_owner ON sessions (owner_pid, owner_start_ticks);
CREATE INDEX sessions_pending_expiry ON sessions (pending_expires_ms)
    WHERE phase = 'active' AND pending;
CREATE INDEX sessions_active_by_host ON sessions (owner_host, touched_ms)
    WHERE phase = 'active';
-- Root may name a session by id alone when one user has it.
CREATE INDEX sessions_by_id ON sessions (id);
"#,
    r#"
-- The pidfs inode (Linux 6.9+) joins the owner fingerprint: it tells apart two processes
-- that got the same pid within one clock tick. NULL where it was not known.
ALTER TABLE sessions ADD COLUMN owner_pidfs_ino INTEGER;
-- The host name is a label, no longer a liveness fact: owners nobody can watch are those
-- of another boot (another machine), found by boot id, not by host name.
DROP INDEX sessions_active_by_host;
CREATE INDEX sessions_active_by_boot ON sessions (owner_boot_id, touched_ms)
    WHERE phase = 'active';
-- Every boot a daemon ran on with this database: an owner of one of them is of this
-- machine, so a reboot ends it even after the host was renamed.
CREATE TABLE boots (boot_id TEXT PRIMARY KEY NOT NULL);
INSERT INTO boots (boot_id) SELECT value FROM meta WHERE key = 'run_boot_id' AND value != '';
"#,
];

/// The schema version this code writes and understands.
const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Number of columns in [`session_columns!`].
const SESSION_COLUMNS: usize = 19;

/// Columns of a session row, in the order [`session_from_row`] reads them.
macro_rules! session_columns {
    () => {
        "id, owner_pid, owner_start_ticks, owner_boot_id, owner_host, owner_comm, phase, \
         pending, reason, exit, detected_by, creator_uid, labels, created_ms, updated_ms, \
         touched_ms, ended_ms, pending_expires_ms, owner_pidfs_ino"
    };
}

/// Selects the ACTIVE sessions an ending applies to, with their rowids, for [`end_selected`];
/// the caller appends the rest of the filter.
macro_rules! select_active {
    ($filter:literal) => {
        concat!(
            "SELECT ",
            session_columns!(),
            ", rowid FROM sessions WHERE phase = 'active' AND ",
            $filter
        )
    };
}

/// Errors of the store. Every operation that fails has changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no session {0:?}")]
    NotFound(String),
    #[error("session {0:?} has ended; ids are not reused")]
    AlreadyEnded(String),
    #[error("session {0:?} already exists")]
    AlreadyExists(String),
    #[error("session {0:?} is not pending; only a pending session can be renamed")]
    NotPending(String),
    #[error("invalid session id: {0}")]
    InvalidId(String),
    #[error(
        "the database has schema version {found}, newer than this build supports ({supported}); \
         upgrade liveness"
    )]
    SchemaTooNew { found: u32, supported: u32 },
    #[error(
        "the database has schema version {found}, this build needs {supported}; \
         start livenessd once to migrate it"
    )]
    SchemaTooOld { found: u32, supported: u32 },
    #[error(
        "the database {path} is damaged ({detail}); it was left as it is. Run \
         `livenessd --recover` with the same flags to set it aside and start from what can \
         be read, or restore a backup"
    )]
    Damaged { path: PathBuf, detail: String },
    #[error(
        "the database {path} was {what} while the daemon ran; stopping rather than writing \
         where nobody reads. Restart livenessd (and find out what {what} it)"
    )]
    FileChanged { path: PathBuf, what: &'static str },
    #[error("cannot {action} {path}: {source}")]
    File {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no space left on device for the database {path}: free some space ({detail})")]
    NoSpace { path: PathBuf, detail: String },
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("stored JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// An event about `session` as it is now, before its seq is assigned.
fn event_about(kind: EventKind, session: &Session, at_ms: i64) -> Event {
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
        detected_by: None,
        observed_ms: None,
        died_ms: None,
        labels: session.labels.clone(),
        creator_uid: session.creator_uid,
    }
}

/// The `session.ended` event of a session that `ending` just ended.
fn event_ended(session: &Session, ending: &Ending) -> Event {
    Event {
        reason: session.reason,
        exit: session.exit,
        detected_by: session.detected_by,
        observed_ms: ending.observed_ms,
        died_ms: ending.died_ms,
        ..event_about(EventKind::Ended, session, ending.now_ms)
    }
}

/// A registration request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSession {
    pub id: String,
    pub owner: Identity,
    pub pending: bool,
    /// Only meaningful for a pending session; ignored otherwise.
    pub pending_expires_ms: Option<i64>,
    pub creator_uid: u32,
    pub labels: BTreeMap<String, String>,
}

/// Result of [`Store::register`]: the session as stored, and the event to publish, if any
/// (none when the same owner registered the same session again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub session: Session,
    pub event: Option<Event>,
}

/// One owner's death, to finalize every active session it owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerDeath {
    pub owner: Identity,
    pub reason: EndReason,
    pub exit: Option<ExitStatus>,
    pub detected_by: DetectedBy,
    /// When the source observed the death.
    pub observed_ms: i64,
    /// When the owner died by the kernel's clock, where the source knows it.
    pub died_ms: Option<i64>,
}

/// Which events a replay returns.
#[derive(Debug, Clone, Copy, Default)]
pub struct EventFilter<'a> {
    /// Only events written under this session id.
    pub session: Option<&'a str>,
    /// Only events of sessions registered by this uid.
    pub creator_uid: Option<u32>,
}

/// One stored event: its seq and its JSON body as sent to subscribers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    pub seq: u64,
    pub body: String,
}

/// Answer of `events_after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventPage {
    /// The events after `since`, oldest first.
    Events(Vec<StoredEvent>),
    /// Retention deleted events after `requested_since`: the consumer must resynchronize
    /// (events after `pruned_through` are all still there).
    Gap {
        requested_since: u64,
        pruned_through: u64,
    },
}

/// The writer: owns the only read-write connection.
/// How far the seq counter jumps after a possible power loss: further than the commits
/// SQLite can lose (those after the last WAL sync), so a seq already streamed is never
/// given to another event.
pub const SEQ_JUMP_AFTER_POWER_LOSS: u64 = 1 << 20;

#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: PathBuf,
    /// Device and inode of the file opened, to notice it being replaced or deleted.
    file: FileId,
}

/// A file's device and inode.
type FileId = (u64, u64);

fn file_id(path: &Path) -> std::io::Result<FileId> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path)?;
    Ok((metadata.dev(), metadata.ino()))
}

/// A file that exists but is empty, with no write-ahead log holding its content: a
/// database that was truncated (a new one is never empty, see [`create`]).
fn is_truncated(path: &Path) -> bool {
    let length = |path: &Path| std::fs::metadata(path).map(|m| m.len()).ok();
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    length(path) == Some(0) && length(Path::new(&wal)).unwrap_or(0) == 0
}

/// Creates a migrated database at `path` all at once (built beside it, then renamed), so
/// that an empty file found later can only be a damaged one.
fn create(path: &Path) -> Result<(), StoreError> {
    let building = with_suffix(path, ".creating");
    let _ = std::fs::remove_file(&building);
    let mut conn = Connection::open(&building)?;
    migrate(&mut conn)?;
    drop(conn);
    std::fs::rename(&building, path).map_err(|source| StoreError::File {
        action: "create",
        path: path.into(),
        source,
    })
}

/// Whether SQLite found the file to be no database or a corrupt one.
fn is_damage(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
    )
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

    fn open_checked(path: &Path) -> Result<Store, StoreError> {
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
    /// stop cleanly: then the counter jumps by [`SEQ_JUMP_AFTER_POWER_LOSS`]. A daemon
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
            }
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
    fn durably<T>(
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
                    detected_by: None,
                    creator_uid: req.creator_uid,
                    labels: req.labels,
                    created_ms: now_ms,
                    updated_ms: now_ms,
                    touched_ms: now_ms,
                    ended_ms: None,
                    pending_expires_ms: req.pending_expires_ms.filter(|_| req.pending),
                };
                insert_session(&tx, &session)?;
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
                touch_active(&tx, session.creator_uid, &session.id, now_ms)?;
                session.touched_ms = now_ms;
                Registered {
                    session,
                    event: None,
                }
            }
            Some(mut session) => {
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

    /// Records activity on an active session (no event).
    pub fn touch(&mut self, uid: u32, id: &str, now_ms: i64) -> Result<(), StoreError> {
        // A single UPDATE commits atomically on its own.
        if touch_active(&self.conn, uid, id, now_ms)? {
            return Ok(());
        }
        match get_session(&self.conn, uid, id)? {
            None => Err(StoreError::NotFound(id.to_owned())),
            Some(_) => Err(StoreError::AlreadyEnded(id.to_owned())),
        }
    }

    /// Ends user `uid`'s session `id` if it is still active and, when `expected_owner` is
    /// given, still owned by that process. `Ok(None)` when it was already ended or the
    /// owner changed.
    #[expect(
        clippy::too_many_arguments,
        reason = "each is an independent fact of the ending"
    )]
    pub fn end(
        &mut self,
        uid: u32,
        id: &str,
        reason: EndReason,
        exit: Option<ExitStatus>,
        detected_by: Option<DetectedBy>,
        observed_ms: Option<i64>,
        expected_owner: Option<&Identity>,
        now_ms: i64,
    ) -> Result<Option<Event>, StoreError> {
        let tx = self.write_tx()?;
        let ending = Ending::new(reason, exit, detected_by, observed_ms, now_ms)?;
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
            &ending,
        )?;
        let Some(event) = ended.into_iter().next() else {
            return if get_session(&tx, uid, id)?.is_some() {
                Ok(None)
            } else {
                Err(StoreError::NotFound(id.to_owned()))
            };
        };
        tx.commit()?;
        Ok(Some(event))
    }

    /// Finalizes the sessions of many dead owners in ONE transaction (bursts of exits).
    /// Each session ends by compare-and-set on its owner fingerprint, so sessions that
    /// moved on to a new owner are left alone. Events come out in `deaths` order.
    pub fn end_many(
        &mut self,
        deaths: &[OwnerDeath],
        now_ms: i64,
    ) -> Result<Vec<Event>, StoreError> {
        let tx = self.write_tx()?;
        let mut events = Vec::new();
        for death in deaths {
            let owner = &death.owner;
            let ending = Ending {
                died_ms: death.died_ms,
                ..Ending::new(
                    death.reason,
                    death.exit,
                    Some(death.detected_by),
                    Some(death.observed_ms),
                    now_ms,
                )?
            };
            events.extend(end_selected(
                &tx,
                select_active!("owner_pid = ?1 AND owner_start_ticks = ?2 AND owner_boot_id = ?3"),
                params![owner.pid, ticks_to_sql(owner.start_ticks), owner.boot_id],
                &ending,
            )?);
        }
        tx.commit()?;
        Ok(events)
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

    /// Deletes sessions that ended before `ended_before_ms`; their ids become free again.
    pub fn prune_sessions(&mut self, ended_before_ms: i64) -> Result<u64, StoreError> {
        let deleted = self
            .conn
            .prepare_cached("DELETE FROM sessions WHERE phase = 'ended' AND ended_ms < ?1")?
            .execute(params![ended_before_ms])?;
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

    /// Up to `limit` events with seq > `since` that match `filter`, or a gap.
    pub fn events_after(
        &self,
        since: u64,
        limit: usize,
        filter: &EventFilter<'_>,
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

    /// IMMEDIATE: take the write lock up front, so a read-then-write transaction can never
    /// fail half-way with SQLITE_BUSY because a reader connection holds a snapshot.
    fn write_tx(&mut self) -> Result<rusqlite::Transaction<'_>, StoreError> {
        Ok(self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?)
    }

    fn sessions(
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

/// A read-only connection for event replay and listings, usable beside the [`Store`] (WAL
/// readers do not block the writer, nor it them).
#[derive(Debug)]
pub struct EventReader {
    conn: Connection,
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

    pub fn head_seq(&self) -> Result<u64, StoreError> {
        head_seq(&self.conn)
    }

    /// Same as [`Store::events_after`].
    pub fn events_after(
        &self,
        since: u64,
        limit: usize,
        filter: &EventFilter<'_>,
    ) -> Result<EventPage, StoreError> {
        events_after(&self.conn, since, limit, filter)
    }

    /// One page of sessions, oldest first.
    pub fn list(&self, query: &ListQuery) -> Result<SessionPage, StoreError> {
        list(&self.conn, query)
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

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Copies into `into` (a new database) whatever rows of the damaged database at `from`
/// can be read: each table until the first unreadable page, each row that parses.
fn salvage(from: &Path, into: &mut Connection) -> Recovered {
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
    let floor = (highest as u64).saturating_add(SEQ_JUMP_AFTER_POWER_LOSS);
    // Replays from before the oldest event read are told of a gap, not silently skipped.
    let floored = tx
        .execute(
            "UPDATE meta SET value = ?1 WHERE key = 'seq_floor'",
            [floor as i64],
        )
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
fn list(conn: &Connection, query: &ListQuery) -> Result<SessionPage, StoreError> {
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

/// Reads `user_version`; newer than [`SCHEMA_VERSION`] is always an error, older only when
/// the caller cannot migrate.
fn check_version(conn: &Connection, exact: bool) -> Result<u32, StoreError> {
    let found: u32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if exact && found < SCHEMA_VERSION {
        return Err(StoreError::SchemaTooOld {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(found)
}

/// Applies the missing migrations, each in its own transaction with its version bump.
fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    loop {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Re-read under the write lock: another process may have migrated meanwhile.
        let version = check_version(&tx, false)?;
        let Some(sql) = MIGRATIONS.get(version as usize) else {
            return Ok(());
        };
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", version + 1)?;
        tx.commit()?;
    }
}

fn validate_id(id: &str) -> Result<(), StoreError> {
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
fn invisible_or_misleading(c: char) -> bool {
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
fn ticks_to_sql(ticks: u64) -> i64 {
    ticks as i64
}

fn ticks_from_sql(stored: i64) -> u64 {
    stored as u64
}

/// The serde name of a unit enum variant (e.g. `"owner_exited"`), so the database and the
/// protocol spell values the same way.
fn name<T: Serialize>(value: &T) -> Result<String, serde_json::Error> {
    match serde_json::to_value(value)? {
        serde_json::Value::String(s) => Ok(s),
        _ => Err(serde::ser::Error::custom("not a unit enum variant")),
    }
}

fn from_name<T: DeserializeOwned>(name: String) -> Result<T, serde_json::Error> {
    serde_json::from_value(serde_json::Value::String(name))
}

fn session_from_row(row: &Row<'_>) -> Result<Session, StoreError> {
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
        exit: row
            .get::<_, Option<String>>(9)?
            .map(|s| serde_json::from_str(&s))
            .transpose()?,
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
    })
}

fn get_session(conn: &Connection, uid: u32, id: &str) -> Result<Option<Session>, StoreError> {
    conn.prepare_cached(concat!(
        "SELECT ",
        session_columns!(),
        " FROM sessions WHERE creator_uid = ?1 AND id = ?2"
    ))?
    .query_and_then(params![uid, id], session_from_row)?
    .next()
    .transpose()
}

fn insert_session(conn: &Connection, s: &Session) -> Result<(), StoreError> {
    conn.prepare_cached(concat!(
        "INSERT INTO sessions (",
        session_columns!(),
        ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, \
         ?19)"
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
        s.exit.map(|e| serde_json::to_string(&e)).transpose()?,
        s.detected_by.map(|d| name(&d)).transpose()?,
        s.creator_uid,
        serde_json::to_string(&s.labels)?,
        s.created_ms,
        s.updated_ms,
        s.touched_ms,
        s.ended_ms,
        s.pending_expires_ms,
        s.owner.pidfs_ino.map(ticks_to_sql),
    ])?;
    Ok(())
}

/// How sessions end: what [`end_selected`] writes into each.
struct Ending {
    reason: EndReason,
    exit: Option<ExitStatus>,
    detected_by: Option<DetectedBy>,
    observed_ms: Option<i64>,
    died_ms: Option<i64>,
    now_ms: i64,
    /// The same three as stored in their columns.
    columns: (String, Option<String>, Option<String>),
}

impl Ending {
    fn new(
        reason: EndReason,
        exit: Option<ExitStatus>,
        detected_by: Option<DetectedBy>,
        observed_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<Ending, StoreError> {
        let columns = (
            name(&reason)?,
            exit.map(|e| serde_json::to_string(&e)).transpose()?,
            detected_by.map(|d| name(&d)).transpose()?,
        );
        Ok(Ending {
            reason,
            exit,
            detected_by,
            observed_ms,
            died_ms: None,
            now_ms,
            columns,
        })
    }
}

/// The compare-and-set that ends sessions, inside the caller's write transaction: `select`
/// (made with [`select_active!`]) finds the ACTIVE sessions the ending applies to, and each
/// is updated by rowid. The transaction holds the write lock, so nothing changes between
/// the two. (One `UPDATE ... RETURNING` per death builds an ephemeral table and a
/// statement journal each time: ending 10,000 owners in batches of 64 took 2.2 times as
/// long that way.)
fn end_selected(
    tx: &Connection,
    select: &str,
    params: impl rusqlite::Params,
    ending: &Ending,
) -> Result<Vec<Event>, StoreError> {
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
        let (reason, exit, detected_by) = &ending.columns;
        tx.prepare_cached(
            "UPDATE sessions SET phase = 'ended', reason = ?2, exit = ?3, detected_by = ?4, \
             ended_ms = ?5, updated_ms = ?5 WHERE rowid = ?1",
        )?
        .execute(params![rowid, reason, exit, detected_by, ending.now_ms])?;
        session.phase = Phase::Ended;
        session.reason = Some(ending.reason);
        session.exit = ending.exit;
        session.detected_by = ending.detected_by;
        session.ended_ms = Some(ending.now_ms);
        session.updated_ms = ending.now_ms;
        events.push(append(tx, event_ended(&session, ending))?);
    }
    Ok(events)
}

/// True when user `uid`'s active session `id` was touched.
fn touch_active(conn: &Connection, uid: u32, id: &str, now_ms: i64) -> Result<bool, StoreError> {
    let changed = conn
        .prepare_cached(
            "UPDATE sessions SET touched_ms = ?2 \
             WHERE creator_uid = ?3 AND id = ?1 AND phase = 'active'",
        )?
        .execute(params![id, now_ms, uid])?;
    Ok(changed > 0)
}

/// Gives `event` the next seq and stores it, inside the caller's write transaction. The seq
/// is explicit (rather than assigned by the insert) because the stored body contains it.
fn append(conn: &Connection, mut event: Event) -> Result<Event, StoreError> {
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

fn head_seq(conn: &Connection) -> Result<u64, StoreError> {
    let seq: i64 = conn
        .prepare_cached(
            "SELECT MAX(COALESCE((SELECT MAX(seq) FROM events), 0), \
             (SELECT value FROM meta WHERE key = 'pruned_through'), \
             (SELECT value FROM meta WHERE key = 'seq_floor'))",
        )?
        .query_row([], |r| r.get(0))?;
    Ok(seq as u64)
}

fn events_after(
    conn: &Connection,
    since: u64,
    limit: usize,
    filter: &EventFilter<'_>,
) -> Result<EventPage, StoreError> {
    // One read transaction: the gap check and the rows come from the same snapshot, so a
    // prune committed in between cannot delete events unnoticed.
    let tx = conn.unchecked_transaction()?;
    let pruned_through: i64 = tx
        .prepare_cached("SELECT value FROM meta WHERE key = 'pruned_through'")?
        .query_row([], |r| r.get(0))?;
    let pruned_through = pruned_through as u64;
    if since < pruned_through {
        return Ok(EventPage::Gap {
            requested_since: since,
            pruned_through,
        });
    }
    let since = i64::try_from(since).unwrap_or(i64::MAX);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let row = |r: &Row<'_>| {
        Ok(StoredEvent {
            seq: r.get::<_, i64>(0)? as u64,
            body: r.get(1)?,
        })
    };
    let events = tx
        .prepare_cached(
            "SELECT seq, body FROM events WHERE seq > ?1 \
             AND (?3 IS NULL OR session = ?3) AND (?4 IS NULL OR creator_uid = ?4) \
             ORDER BY seq LIMIT ?2",
        )?
        .query_map(
            params![since, limit, filter.session, filter.creator_uid],
            row,
        )?
        .collect::<Result<_, _>>()?;
    Ok(EventPage::Events(events))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_000;
    /// The uid that [`req`] registers as.
    const UID: u32 = 1000;

    fn only(session: &str) -> EventFilter<'_> {
        EventFilter {
            session: Some(session),
            creator_uid: None,
        }
    }

    fn owner(pid: u32) -> Identity {
        Identity {
            pid,
            start_ticks: 1000 + u64::from(pid),
            boot_id: "boot-a".into(),
            host: "devbox".into(),
            pidfs_ino: None,
            comm: "agent".into(),
        }
    }

    fn req(id: &str, owner: Identity) -> NewSession {
        NewSession {
            id: id.into(),
            owner,
            pending: false,
            pending_expires_ms: None,
            creator_uid: UID,
            labels: BTreeMap::from([("tool".into(), "claude".into())]),
        }
    }

    fn pending(id: &str, owner: Identity, expires_ms: i64) -> NewSession {
        NewSession {
            pending: true,
            pending_expires_ms: Some(expires_ms),
            ..req(id, owner)
        }
    }

    struct Db {
        dir: tempfile::TempDir,
    }

    impl Db {
        fn new() -> Db {
            Db {
                dir: tempfile::tempdir().unwrap(),
            }
        }
        fn path(&self) -> std::path::PathBuf {
            self.dir.path().join("liveness.db")
        }
        fn open(&self) -> Store {
            Store::open(self.path()).unwrap()
        }
    }

    fn exited(code: u8) -> Option<ExitStatus> {
        Some(ExitStatus::Exited { code })
    }

    fn end_by_owner(store: &mut Store, who: &Identity) -> Vec<Event> {
        end_owner(store, who, exited(0), DetectedBy::Pidfd, NOW + 5, NOW + 6)
    }

    /// Ends every active session of `owner`, as a lone death in a burst would.
    fn end_owner(
        store: &mut Store,
        owner: &Identity,
        exit: Option<ExitStatus>,
        detected_by: DetectedBy,
        observed_ms: i64,
        now_ms: i64,
    ) -> Vec<Event> {
        store
            .end_many(
                &[OwnerDeath {
                    owner: owner.clone(),
                    reason: EndReason::OwnerExited,
                    exit,
                    detected_by,
                    observed_ms,
                    died_ms: None,
                }],
                now_ms,
            )
            .unwrap()
    }

    fn events(page: EventPage) -> Vec<Event> {
        match page {
            EventPage::Events(stored) => stored
                .into_iter()
                .map(|s| {
                    let event: Event = serde_json::from_str(&s.body).unwrap();
                    assert_eq!(event.seq, s.seq);
                    event
                })
                .collect(),
            gap => panic!("expected events, got {gap:?}"),
        }
    }

    #[test]
    fn register_then_new_owner_is_owner_changed() {
        let db = Db::new();
        let mut store = db.open();
        let first = store.register(req("s1", owner(10)), NOW).unwrap();
        let event = first.event.unwrap();
        assert_eq!((event.seq, event.kind), (1, EventKind::Registered));
        assert_eq!(event.owner, owner(10));
        assert_eq!(first.session.phase, Phase::Active);
        assert_eq!(store.get(UID, "s1").unwrap(), Some(first.session.clone()));

        // The same process again (even after an exec renamed it): idempotent, no event.
        let again = Identity {
            comm: "exec'd".into(),
            ..owner(10)
        };
        let same = store.register(req("s1", again), NOW + 1).unwrap();
        assert_eq!(same.event, None);
        assert_eq!(same.session.owner, owner(10));
        assert_eq!(same.session.touched_ms, NOW + 1);
        assert_eq!(store.head_seq().unwrap(), 1);

        let turn = store.register(req("s1", owner(11)), NOW + 2).unwrap();
        let event = turn.event.unwrap();
        assert_eq!((event.seq, event.kind), (2, EventKind::OwnerChanged));
        assert_eq!(event.owner, owner(11));
        assert_eq!(event.previous_owner, Some(owner(10)));
        assert_eq!(store.get(UID, "s1").unwrap().unwrap().owner, owner(11));
    }

    #[test]
    fn only_the_current_owner_ends_a_session_exactly_once() {
        let db = Db::new();
        let mut store = db.open();
        store.register(req("s1", owner(10)), NOW).unwrap();
        store.register(req("s1", owner(11)), NOW + 1).unwrap();

        assert!(end_by_owner(&mut store, &owner(10)).is_empty());
        let stale = store
            .end(
                UID,
                "s1",
                EndReason::OwnerExited,
                None,
                Some(DetectedBy::Ebpf),
                None,
                Some(&owner(10)),
                NOW + 2,
            )
            .unwrap();
        assert_eq!(stale, None, "an old owner's death never ends a new turn");
        assert_eq!(store.get(UID, "s1").unwrap().unwrap().phase, Phase::Active);

        let ended = end_by_owner(&mut store, &owner(11));
        assert_eq!(ended.len(), 1);
        let event = &ended[0];
        assert_eq!((event.seq, event.kind), (3, EventKind::Ended));
        assert_eq!(event.reason, Some(EndReason::OwnerExited));
        assert_eq!(event.exit, exited(0));
        assert_eq!(event.detected_by, Some(DetectedBy::Pidfd));
        assert_eq!((event.observed_ms, event.at_ms), (Some(NOW + 5), NOW + 6));
        let session = store.get(UID, "s1").unwrap().unwrap();
        assert_eq!(session.phase, Phase::Ended);
        assert_eq!(session.ended_ms, Some(NOW + 6));

        // A second source reporting the same death, or an explicit stop: nothing more.
        assert!(end_by_owner(&mut store, &owner(11)).is_empty());
        let stop = store.end(
            UID,
            "s1",
            EndReason::Stopped,
            None,
            None,
            None,
            None,
            NOW + 7,
        );
        assert_eq!(stop.unwrap(), None);
        assert_eq!(store.head_seq().unwrap(), 3);
        assert!(matches!(
            store.end(UID, "nope", EndReason::Stopped, None, None, None, None, NOW),
            Err(StoreError::NotFound(id)) if id == "nope"
        ));
    }

    #[test]
    fn end_by_id_with_and_without_expected_owner() {
        let db = Db::new();
        let mut store = db.open();
        store.register(req("a", owner(10)), NOW).unwrap();
        store.register(req("b", owner(10)), NOW).unwrap();
        let event = store
            .end(
                UID,
                "a",
                EndReason::OwnerReused,
                None,
                Some(DetectedBy::Reconcile),
                Some(NOW),
                Some(&owner(10)),
                NOW + 1,
            )
            .unwrap()
            .unwrap();
        assert_eq!(event.reason, Some(EndReason::OwnerReused));
        let event = store
            .end(
                UID,
                "b",
                EndReason::Timeout,
                None,
                None,
                None,
                None,
                NOW + 2,
            )
            .unwrap()
            .unwrap();
        assert_eq!(
            (event.reason, event.detected_by, event.exit),
            (Some(EndReason::Timeout), None, None)
        );
        assert_eq!(store.get(UID, "b").unwrap().unwrap().detected_by, None);
    }

    #[test]
    fn sessions_sharing_an_owner_all_end() {
        let db = Db::new();
        let mut store = db.open();
        store.register(req("b", owner(10)), NOW).unwrap();
        store.register(req("a", owner(10)), NOW).unwrap();
        store.register(req("c", owner(20)), NOW).unwrap();
        assert_eq!(store.active_owners().unwrap().len(), 2);
        let mine = store.active_sessions_of_owner(&owner(10)).unwrap();
        assert_eq!(
            mine.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );

        let ended = end_by_owner(&mut store, &owner(10));
        let ids: Vec<_> = ended.iter().map(|e| (e.seq, e.session.as_str())).collect();
        assert_eq!(ids, [(4, "a"), (5, "b")]);
        assert_eq!(store.active_owners().unwrap(), [owner(20)]);
        assert!(
            store
                .active_sessions_of_owner(&owner(10))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn owner_fingerprint_includes_boot_but_not_host() {
        let db = Db::new();
        let mut store = db.open();
        let with_ino = Identity {
            pidfs_ino: Some(77),
            ..owner(10)
        };
        store.register(req("s", with_ino.clone()), NOW).unwrap();
        assert_eq!(store.get(UID, "s").unwrap().unwrap().owner, with_ino);
        assert_eq!(store.active_owners().unwrap(), [with_ino]);
        for other in [
            Identity {
                start_ticks: 1,
                ..owner(10)
            },
            Identity {
                boot_id: "boot-b".into(),
                ..owner(10)
            },
        ] {
            assert!(end_by_owner(&mut store, &other).is_empty(), "{other:?}");
        }
        // The host name changed while the process ran: its death still ends the session.
        let renamed = Identity {
            host: "renamed".into(),
            ..owner(10)
        };
        assert_eq!(end_by_owner(&mut store, &renamed).len(), 1);
    }

    #[test]
    fn boots_run_on_are_remembered() {
        let db = Db::new();
        let mut store = db.open();
        assert!(!store.is_known_boot("boot-a").unwrap());
        store.begin_run("boot-a").unwrap();
        store.begin_run("boot-b").unwrap();
        assert!(store.is_known_boot("boot-a").unwrap());
        assert!(store.is_known_boot("boot-b").unwrap());
        assert!(!db.open().is_known_boot("boot-c").unwrap());
    }

    #[test]
    fn pending_session_is_renamed() {
        let db = Db::new();
        let mut store = db.open();
        store
            .register(pending("pending-10", owner(10), NOW + 60_000), NOW)
            .unwrap();
        assert!(store.expired_pending(NOW + 59_999).unwrap().is_empty());
        assert_eq!(store.expired_pending(NOW + 60_000).unwrap().len(), 1);

        let event = store.rename(UID, "pending-10", "real", NOW + 1).unwrap();
        assert_eq!((event.seq, event.kind), (2, EventKind::Renamed));
        assert_eq!(event.session, "real");
        assert_eq!(event.previous_session.as_deref(), Some("pending-10"));
        assert_eq!(store.get(UID, "pending-10").unwrap(), None);
        let session = store.get(UID, "real").unwrap().unwrap();
        assert!(!session.pending);
        assert_eq!(session.pending_expires_ms, None);
        assert_eq!(session.created_ms, NOW);
        assert!(store.expired_pending(NOW + 60_000).unwrap().is_empty());
        assert_eq!(end_by_owner(&mut store, &owner(10))[0].session, "real");
    }

    #[test]
    fn rename_errors_change_nothing() {
        let db = Db::new();
        let mut store = db.open();
        store.register(pending("p1", owner(10), NOW), NOW).unwrap();
        store.register(pending("p2", owner(11), NOW), NOW).unwrap();
        store.register(req("real", owner(12)), NOW).unwrap();
        store
            .end(
                UID,
                "p2",
                EndReason::PendingExpired,
                None,
                None,
                None,
                None,
                NOW,
            )
            .unwrap();
        let head = store.head_seq().unwrap();

        assert!(matches!(
            store.rename(UID, "missing", "x", NOW),
            Err(StoreError::NotFound(_))
        ));
        assert!(matches!(
            store.rename(UID, "real", "x", NOW),
            Err(StoreError::NotPending(id)) if id == "real"
        ));
        assert!(matches!(
            store.rename(UID, "p1", "real", NOW),
            Err(StoreError::AlreadyExists(id)) if id == "real"
        ));
        assert!(matches!(
            store.rename(UID, "p1", "p1", NOW),
            Err(StoreError::AlreadyExists(_))
        ));
        assert!(matches!(
            store.rename(UID, "p2", "x", NOW),
            Err(StoreError::AlreadyEnded(_))
        ));
        assert!(matches!(
            store.rename(UID, "p1", "", NOW),
            Err(StoreError::InvalidId(_))
        ));
        assert_eq!(store.head_seq().unwrap(), head);
        assert!(store.get(UID, "p1").unwrap().unwrap().pending);
        assert_eq!(store.get(UID, "x").unwrap(), None);
    }

    #[test]
    fn only_idle_owners_of_other_boots_time_out() {
        let db = Db::new();
        let mut store = db.open();
        let on = |boot: &str, pid| Identity {
            boot_id: boot.into(),
            ..owner(pid)
        };
        // Hosts sorting before and after the local one, both idle and busy.
        store
            .register(req("zulu-idle", on("zulu", 1)), NOW)
            .unwrap();
        store
            .register(req("alpha-idle", on("alpha", 2)), NOW)
            .unwrap();
        store
            .register(req("local-idle", on("boot-a", 3)), NOW)
            .unwrap();
        store
            .register(req("alpha-busy", on("alpha", 4)), NOW)
            .unwrap();
        store.touch(UID, "alpha-busy", NOW + 100).unwrap();
        store
            .register(req("zulu-ended", on("zulu", 5)), NOW)
            .unwrap();
        end_by_owner(&mut store, &on("zulu", 5));

        let idle = store.idle_of_other_boots(NOW + 50, "boot-a").unwrap();
        assert_eq!(
            idle.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["alpha-idle", "zulu-idle"]
        );
        assert!(store.idle_of_other_boots(NOW, "boot-a").unwrap().is_empty());
    }

    #[test]
    fn ended_id_cannot_be_registered_again_until_pruned() {
        let db = Db::new();
        let mut store = db.open();
        store.register(req("s", owner(10)), NOW).unwrap();
        end_by_owner(&mut store, &owner(10));
        assert!(matches!(
            store.register(req("s", owner(11)), NOW + 10),
            Err(StoreError::AlreadyEnded(id)) if id == "s"
        ));
        assert!(matches!(
            store.touch(UID, "s", NOW),
            Err(StoreError::AlreadyEnded(_))
        ));
        assert_eq!(store.head_seq().unwrap(), 2);

        assert_eq!(store.prune_sessions(NOW + 6).unwrap(), 0);
        assert_eq!(store.prune_sessions(NOW + 7).unwrap(), 1);
        assert_eq!(store.get(UID, "s").unwrap(), None);
        assert!(store.register(req("s", owner(11)), NOW + 10).is_ok());
    }

    #[test]
    fn touch_list_and_idle() {
        let db = Db::new();
        let mut store = db.open();
        store.register(req("a", owner(10)), NOW).unwrap();
        store
            .register(
                NewSession {
                    creator_uid: 0,
                    ..req("b", owner(11))
                },
                NOW + 1,
            )
            .unwrap();
        store.register(req("c", owner(12)), NOW + 2).unwrap();
        end_by_owner(&mut store, &owner(12));
        store.touch(UID, "a", NOW + 100).unwrap();
        assert!(matches!(
            store.touch(UID, "zz", NOW),
            Err(StoreError::NotFound(_))
        ));

        let idle = store.idle_of_other_boots(NOW + 50, "boot-z").unwrap();
        assert_eq!(idle.iter().map(|s| &s.id).collect::<Vec<_>>(), ["b"]);
        let ids = |phase, creator_uid| {
            let query = ListQuery {
                phase,
                creator_uid,
                after: 0,
                limit: 10,
            };
            let page = store.list(&query).unwrap();
            assert_eq!(page.next, None, "one page holds them all");
            page.sessions.into_iter().map(|s| s.id).collect::<Vec<_>>()
        };
        assert_eq!(ids(None, None), ["a", "b", "c"]);
        assert_eq!(ids(Some(Phase::Active), None), ["a", "b"]);
        assert_eq!(ids(Some(Phase::Ended), None), ["c"]);
        assert_eq!(ids(None, Some(1000)), ["a", "c"]);
        assert_eq!(ids(Some(Phase::Active), Some(0)), ["b"]);
        assert_eq!(store.count(Phase::Active).unwrap(), 2);
        assert_eq!(store.count(Phase::Ended).unwrap(), 1);
    }

    fn sessions_in(path: &Path) -> Vec<String> {
        let store = Store::open(path).unwrap();
        let query = ListQuery {
            limit: 1000,
            ..ListQuery::default()
        };
        let page = store.list(&query).unwrap();
        page.sessions.into_iter().map(|s| s.id).collect()
    }

    #[test]
    fn a_truncated_database_is_refused_until_recovered() {
        let db = Db::new();
        let mut store = db.open();
        store.register(req("s", owner(10)), NOW).unwrap();
        drop(store);
        std::fs::File::create(db.path()).unwrap();
        let refused = Store::open(db.path()).expect_err("an empty database file");
        assert!(matches!(refused, StoreError::Damaged { .. }), "{refused}");
        assert!(refused.to_string().contains("--recover"), "{refused}");
        assert_eq!(
            std::fs::metadata(db.path()).unwrap().len(),
            0,
            "left as it was"
        );

        let recovered = Store::recover(&db.path()).unwrap();
        let aside = recovered.aside.expect("the damaged file is kept");
        assert!(aside.exists(), "{}", aside.display());
        assert_eq!((recovered.sessions, recovered.events), (0, 0));
        let store = db.open();
        assert_eq!(store.head_seq().unwrap(), SEQ_JUMP_AFTER_POWER_LOSS);
        assert!(
            Store::recover(&db.path()).unwrap().aside.is_none(),
            "intact now"
        );
    }

    #[test]
    fn overwritten_pages_are_refused_and_what_is_readable_is_recovered() {
        use std::io::{Seek, SeekFrom, Write};
        let db = Db::new();
        let mut store = db.open();
        let damaged_store = store.store_id().unwrap();
        for i in 0..200 {
            let labels = BTreeMap::from([("pad".to_owned(), "x".repeat(300))]);
            store
                .register(
                    NewSession {
                        labels,
                        ..req(&format!("s{i:03}"), owner(10 + i))
                    },
                    NOW,
                )
                .unwrap();
        }
        drop(store);
        assert_eq!(sessions_in(&db.path()).len(), 200);
        let length = std::fs::metadata(db.path()).unwrap().len();
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(db.path())
            .unwrap();
        // Garbage over a page in the middle (pages are 4 KiB; page 1 holds the header).
        file.seek(SeekFrom::Start(length / 2 / 4096 * 4096))
            .unwrap();
        file.write_all(&[0xa5; 4096]).unwrap();
        drop(file);
        let refused = Store::open(db.path()).expect_err("a page of garbage");
        assert!(matches!(refused, StoreError::Damaged { .. }), "{refused}");

        let recovered = Store::recover(&db.path()).unwrap();
        assert!(recovered.aside.is_some());
        let kept = sessions_in(&db.path());
        assert_eq!(kept.len() as u64, recovered.sessions);
        // Which rows survive depends on what the garbage hit (a table or an index page).
        assert!(
            (1..=200).contains(&kept.len()),
            "{} sessions read back",
            kept.len()
        );
        assert_ne!(
            db.open().store_id().unwrap(),
            damaged_store,
            "a recovered database is a new store: its consumers are told to start over"
        );
    }

    #[test]
    fn a_deleted_or_replaced_file_is_noticed() {
        let db = Db::new();
        let store = db.open();
        store.check_file().expect("the file opened");
        std::fs::remove_file(db.path()).unwrap();
        let deleted = store.check_file().expect_err("deleted");
        assert!(deleted.to_string().contains("deleted"), "{deleted}");
        std::fs::write(db.path(), b"").unwrap();
        let replaced = store.check_file().expect_err("replaced");
        assert!(replaced.to_string().contains("replaced"), "{replaced}");
    }

    #[test]
    fn lists_page_through_every_session_once() {
        let db = Db::new();
        let mut store = db.open();
        for i in 0..7 {
            store
                .register(req(&format!("s{i}"), owner(10 + i)), NOW)
                .unwrap();
        }
        let reader = EventReader::open(db.path()).unwrap();
        let mut seen = Vec::new();
        let mut after = 0;
        let mut pages = 0;
        loop {
            let query = ListQuery {
                after,
                limit: 3,
                ..ListQuery::default()
            };
            let page = reader.list(&query).unwrap();
            pages += 1;
            seen.extend(page.sessions.into_iter().map(|s| s.id));
            match page.next {
                Some(next) => after = next,
                None => break,
            }
        }
        assert_eq!(seen, ["s0", "s1", "s2", "s3", "s4", "s5", "s6"]);
        assert_eq!(pages, 3);
    }

    #[test]
    fn bad_ids_are_rejected_and_nothing_is_written() {
        let db = Db::new();
        let mut store = db.open();
        let long = "x".repeat(MAX_ID_LEN + 1);
        for bad in [
            "",
            long.as_str(),
            "a\nb",
            "tab\there",
            "del\u{7f}",
            "\u{85}",
            // Displayed as "evil" + "txt.exe" reversed, or as another id.
            "right-to-left\u{202E}override",
            "embedding\u{202A}",
            "isolate\u{2066}x\u{2069}",
            "zero\u{200B}width",
            "joiner\u{200D}",
            "word\u{2060}joiner",
            "\u{FEFF}bom",
        ] {
            assert!(
                matches!(
                    store.register(req(bad, owner(10)), NOW),
                    Err(StoreError::InvalidId(_))
                ),
                "{bad:?}"
            );
        }
        assert_eq!(store.head_seq().unwrap(), 0);
        assert_eq!(store.count(Phase::Active).unwrap(), 0);

        let longest = "é".repeat(MAX_ID_LEN / 2);
        assert!(store.register(req(&longest, owner(10)), NOW).is_ok());
        assert!(
            store
                .register(req("with space/and:punct", owner(10)), NOW)
                .is_ok()
        );
    }

    #[test]
    fn seq_survives_reopen_and_is_never_reused_after_prune() {
        let db = Db::new();
        {
            let mut store = db.open();
            for i in 0..3 {
                store
                    .register(req(&format!("s{i}"), owner(10)), NOW)
                    .unwrap();
            }
        }
        let mut store = db.open();
        assert_eq!(store.head_seq().unwrap(), 3);
        let event = store
            .register(req("s3", owner(10)), NOW)
            .unwrap()
            .event
            .unwrap();
        assert_eq!(event.seq, 4);

        assert_eq!(store.prune(0, i64::MAX, NOW).unwrap(), 4);
        assert_eq!(store.head_seq().unwrap(), 4);
        drop(store);
        let mut store = db.open();
        let event = store
            .register(req("s4", owner(10)), NOW)
            .unwrap()
            .event
            .unwrap();
        assert_eq!(event.seq, 5, "seqs continue after everything was pruned");
        assert_eq!(
            events(store.events_after(4, 10, &EventFilter::default()).unwrap()),
            [event]
        );
        assert_eq!(
            store.events_after(3, 10, &EventFilter::default()).unwrap(),
            EventPage::Gap {
                requested_since: 3,
                pruned_through: 4
            }
        );
    }

    #[test]
    fn events_after_replays_exactly_what_follows() {
        let db = Db::new();
        let mut store = db.open();
        let mut all = Vec::new();
        for i in 0..5u32 {
            let r = store.register(req(&format!("s{}", i % 2), owner(10 + i)), NOW);
            all.push(r.unwrap().event.unwrap());
        }
        all.extend(end_by_owner(&mut store, &owner(14)));
        assert_eq!(
            all.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 6]
        );

        assert_eq!(
            events(store.events_after(0, 100, &EventFilter::default()).unwrap()),
            all
        );
        assert_eq!(
            events(store.events_after(2, 100, &EventFilter::default()).unwrap()),
            all[2..]
        );
        assert_eq!(
            events(store.events_after(2, 2, &EventFilter::default()).unwrap()),
            all[2..4]
        );
        assert!(events(store.events_after(6, 100, &EventFilter::default()).unwrap()).is_empty());
        let s0: Vec<_> = all.iter().filter(|e| e.session == "s0").cloned().collect();
        assert_eq!(s0.len(), 4);
        assert_eq!(events(store.events_after(0, 100, &only("s0")).unwrap()), s0);
        assert_eq!(
            events(store.events_after(1, 2, &only("s0")).unwrap()),
            s0[1..3]
        );
        assert!(events(store.events_after(0, 100, &only("none")).unwrap()).is_empty());
    }

    #[test]
    fn events_after_filters_by_creator() {
        let db = Db::new();
        let mut store = db.open();
        store.register(req("mine", owner(10)), NOW).unwrap();
        let theirs = NewSession {
            creator_uid: 2000,
            ..req("theirs", owner(11))
        };
        store.register(theirs, NOW).unwrap();
        let mine = EventFilter {
            session: None,
            creator_uid: Some(1000),
        };
        let got = events(store.events_after(0, 10, &mine).unwrap());
        let sessions: Vec<_> = got
            .iter()
            .map(|e| (e.session.as_str(), e.creator_uid))
            .collect();
        assert_eq!(sessions, [("mine", 1000)]);
    }

    #[test]
    fn prune_by_age_and_count_reports_gaps() {
        let db = Db::new();
        let mut store = db.open();
        for i in 0..10 {
            store
                .register(req(&format!("s{i}"), owner(10)), NOW + i * 1000)
                .unwrap();
        }
        // Older than 5 s at NOW + 10 s: the events at +0 .. +4 s.
        assert_eq!(store.prune(100, 5_000, NOW + 10_000).unwrap(), 5);
        assert!(matches!(
            store.events_after(5, 100, &EventFilter::default()).unwrap(),
            EventPage::Events(v) if v.len() == 5
        ));
        assert_eq!(
            store.events_after(0, 100, &EventFilter::default()).unwrap(),
            EventPage::Gap {
                requested_since: 0,
                pruned_through: 5
            }
        );
        // Count bound: keep the newest 3.
        assert_eq!(store.prune(3, i64::MAX, NOW).unwrap(), 2);
        assert!(matches!(
            store.events_after(4, 100, &only("s9")).unwrap(),
            EventPage::Gap {
                pruned_through: 7,
                ..
            }
        ));
        assert_eq!(
            events(store.events_after(7, 100, &EventFilter::default()).unwrap())
                .iter()
                .map(|e| e.seq)
                .collect::<Vec<_>>(),
            [8, 9, 10]
        );
        assert_eq!(
            store.prune(3, i64::MAX, NOW).unwrap(),
            0,
            "nothing more to do"
        );
    }

    #[test]
    fn seqs_jump_only_after_an_unclean_stop_on_another_boot() {
        let db = Db::new();
        let next_seq = |store: &mut Store, id: &str| {
            store
                .register(req(id, owner(10)), NOW)
                .unwrap()
                .event
                .unwrap()
                .seq
        };
        let mut store = db.open();
        assert!(
            !store.begin_run("boot-a").unwrap(),
            "a new database has nothing to protect"
        );
        assert_eq!(next_seq(&mut store, "a"), 1);
        drop(store);
        // Killed, restarted on the same boot: nothing can have been lost.
        let mut store = db.open();
        assert!(!store.begin_run("boot-a").unwrap());
        assert_eq!(next_seq(&mut store, "b"), 2);
        drop(store);
        // Not stopped cleanly, and now another boot: maybe a power loss.
        let mut store = db.open();
        assert!(store.begin_run("boot-b").unwrap());
        assert_eq!(next_seq(&mut store, "c"), 3 + SEQ_JUMP_AFTER_POWER_LOSS);
        store.end_run().unwrap();
        drop(store);
        let mut store = db.open();
        assert!(
            !store.begin_run("boot-c").unwrap(),
            "after a clean stop the boot does not matter"
        );
        assert_eq!(next_seq(&mut store, "d"), 4 + SEQ_JUMP_AFTER_POWER_LOSS);
    }

    #[test]
    fn open_sets_wal_and_the_schema_version() {
        let db = Db::new();
        let store = db.open();
        let pragma = |name: &str| {
            store
                .conn
                .pragma_query_value(None, name, |r| r.get::<_, rusqlite::types::Value>(0))
                .unwrap()
        };
        use rusqlite::types::Value;
        assert_eq!(pragma("journal_mode"), Value::Text("wal".into()));
        assert_eq!(pragma("synchronous"), Value::Integer(1), "NORMAL");
        assert_eq!(pragma("foreign_keys"), Value::Integer(1));
        assert_eq!(
            pragma("user_version"),
            Value::Integer(SCHEMA_VERSION.into())
        );
        drop(store);
        // Reopening an up-to-date database migrates nothing and keeps the data.
        let mut store = db.open();
        store.register(req("s", owner(10)), NOW).unwrap();
        drop(store);
        assert!(db.open().get(UID, "s").unwrap().is_some());
    }

    #[test]
    fn a_first_version_database_is_migrated_with_its_sessions() {
        let db = Db::new();
        let conn = Connection::open(db.path()).unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.execute(
            "INSERT INTO sessions (id, owner_pid, owner_start_ticks, owner_boot_id, owner_host, \
             owner_comm, phase, pending, creator_uid, labels, created_ms, updated_ms, touched_ms) \
             VALUES ('old', 7, 1007, 'boot-a', 'elsewhere', 'agent', 'active', 0, 1000, '{}', \
             ?1, ?1, ?1)",
            [NOW],
        )
        .unwrap();
        conn.execute(
            "UPDATE meta SET value = 'boot-old' WHERE key = 'run_boot_id'",
            [],
        )
        .unwrap();
        drop(conn);

        let store = db.open();
        assert!(
            store.is_known_boot("boot-old").unwrap(),
            "the boot of the last run is known after the migration"
        );
        assert_eq!(
            store.get(1000, "old").unwrap().unwrap().owner.pidfs_ino,
            None
        );
        let version: u32 = store
            .conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        // The queries that need the new indexes (INDEXED BY fails without them) see the row.
        let idle = store.idle_of_other_boots(NOW + 1, "boot-z").unwrap();
        assert_eq!(
            idle.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["old"]
        );
        assert!(store.expired_pending(NOW + 1).unwrap().is_empty());
        assert!(
            store.get(1000, "old").unwrap().is_some(),
            "the session is in its creator's namespace"
        );
        assert_eq!(
            store.store_id().unwrap().len(),
            32,
            "the store got an identity"
        );
    }

    #[test]
    fn session_ids_are_per_user() {
        let db = Db::new();
        let mut store = db.open();
        let other = |id: &str, pid| NewSession {
            creator_uid: 2000,
            ..req(id, owner(pid))
        };
        store.register(req("shared", owner(10)), NOW).unwrap();
        let theirs = store.register(other("shared", 20), NOW).unwrap();
        assert!(
            theirs.event.is_some(),
            "a second user's registration of the same text is a new session, not a new owner"
        );
        assert_eq!(store.get(UID, "shared").unwrap().unwrap().owner, owner(10));
        assert_eq!(store.get(2000, "shared").unwrap().unwrap().owner, owner(20));
        let uids: Vec<u32> = store
            .find_any_user("shared")
            .unwrap()
            .iter()
            .map(|s| s.creator_uid)
            .collect();
        assert_eq!(uids, [UID, 2000]);

        // Each user's operations stay in its own namespace.
        let ended = store
            .end(
                UID,
                "shared",
                EndReason::Stopped,
                None,
                None,
                None,
                None,
                NOW + 1,
            )
            .unwrap();
        assert!(ended.is_some());
        assert_eq!(
            store.get(2000, "shared").unwrap().unwrap().phase,
            Phase::Active
        );
        assert!(matches!(
            store.touch(3000, "shared", NOW),
            Err(StoreError::NotFound(_))
        ));
        store.register(other("pending-1", 21), NOW).unwrap();
        store.register(req("taken", owner(11)), NOW).unwrap();
        store
            .rename(2000, "pending-1", "taken", NOW)
            .map_err(|e| e.to_string())
            .expect_err("only a pending session renames");
        store
            .register(
                NewSession {
                    pending: true,
                    ..other("pending-2", 22)
                },
                NOW,
            )
            .unwrap();
        store
            .rename(2000, "pending-2", "taken", NOW)
            .expect("another user's id does not block a rename");
        assert_eq!(store.get(UID, "taken").unwrap().unwrap().owner, owner(11));
        assert_eq!(store.get(2000, "taken").unwrap().unwrap().owner, owner(22));
    }

    #[test]
    fn the_store_id_is_random_and_kept() {
        let (first, second) = (Db::new(), Db::new());
        let id = first.open().store_id().unwrap();
        assert!(
            id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id:?}"
        );
        assert_eq!(first.open().store_id().unwrap(), id, "kept across opens");
        assert_ne!(second.open().store_id().unwrap(), id, "each store its own");
    }

    #[test]
    fn a_second_version_database_keeps_its_events_and_seq_head() {
        let db = Db::new();
        let mut conn = Connection::open(db.path()).unwrap();
        for (version, sql) in MIGRATIONS[..2].iter().enumerate() {
            conn.execute_batch(sql).unwrap();
            conn.pragma_update(None, "user_version", version as i64 + 1)
                .unwrap();
        }
        let tx = conn.transaction().unwrap();
        for seq in 1..=3 {
            tx.execute(
                "INSERT INTO events (seq, kind, session, creator_uid, at_ms, body) \
                 VALUES (?1, 'session.registered', 's', 0, 0, '{}')",
                [seq],
            )
            .unwrap();
        }
        // What begin_run left after a possible power loss: the counter ahead of the events.
        tx.execute(
            "UPDATE sqlite_sequence SET seq = 5000 WHERE name = 'events'",
            [],
        )
        .unwrap();
        tx.commit().unwrap();
        drop(conn);

        let mut store = db.open();
        assert_eq!(store.head_seq().unwrap(), 5000, "the jumped head survives");
        match store.events_after(0, 10, &only("s")).unwrap() {
            EventPage::Events(stored) => {
                assert_eq!(stored.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3])
            }
            gap => panic!("expected the three events, got {gap:?}"),
        }
        let registered = store.register(req("after", owner(9)), NOW).unwrap();
        assert_eq!(registered.event.unwrap().seq, 5001);
        let autoincrement: i64 = store
            .conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE sql LIKE '%AUTOINCREMENT%'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(autoincrement, 0, "no table keeps AUTOINCREMENT");
    }

    #[test]
    fn schema_newer_than_the_code_is_refused() {
        let db = Db::new();
        drop(db.open());
        Connection::open(db.path())
            .unwrap()
            .pragma_update(None, "user_version", 99)
            .unwrap();
        assert!(matches!(
            Store::open(db.path()),
            Err(StoreError::SchemaTooNew {
                found: 99,
                supported: SCHEMA_VERSION
            })
        ));
        assert!(matches!(
            EventReader::open(db.path()),
            Err(StoreError::SchemaTooNew { .. })
        ));
    }

    #[test]
    fn reader_needs_a_migrated_database_and_sees_commits() {
        let db = Db::new();
        drop(Connection::open(db.path()).unwrap());
        assert!(matches!(
            EventReader::open(db.path()),
            Err(StoreError::SchemaTooOld { found: 0, .. })
        ));
        std::fs::remove_file(db.path()).unwrap();

        let mut store = db.open();
        let reader = EventReader::open(db.path()).unwrap();
        assert_eq!(reader.head_seq().unwrap(), 0);
        let event = store
            .register(req("s", owner(10)), NOW)
            .unwrap()
            .event
            .unwrap();
        assert_eq!(reader.head_seq().unwrap(), 1);
        assert_eq!(
            events(reader.events_after(0, 10, &only("s")).unwrap()),
            [event]
        );
    }

    #[test]
    fn end_many_finalizes_a_thousand_owners_in_one_transaction() {
        let db = Db::new();
        let mut store = db.open();
        for pid in 0..1000 {
            store
                .register(req(&format!("s{pid}"), owner(pid)), NOW)
                .unwrap();
        }
        // One of them moved on to a new owner before the burst arrives.
        store.register(req("s7", owner(5000)), NOW).unwrap();
        let deaths: Vec<_> = (0..1000)
            .map(|pid| OwnerDeath {
                owner: owner(pid),
                reason: EndReason::OwnerExited,
                exit: Some(ExitStatus::Signaled {
                    signal: 9,
                    core_dumped: false,
                }),
                detected_by: DetectedBy::Ebpf,
                observed_ms: NOW,
                died_ms: None,
            })
            .collect();
        let start = std::time::Instant::now();
        let ended = store.end_many(&deaths, NOW + 1).unwrap();
        eprintln!("end_many of 1000 owners: {:?}", start.elapsed());

        assert_eq!(ended.len(), 999);
        assert!(ended.iter().all(|e| e.session != "s7"));
        let seqs: Vec<u64> = ended.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1002..=2000).collect::<Vec<_>>());
        assert_eq!(store.head_seq().unwrap(), 2000);
        assert_eq!(store.active_owners().unwrap(), [owner(5000)]);
        assert!(store.end_many(&deaths, NOW + 2).unwrap().is_empty());
    }

    #[test]
    fn stored_body_round_trips_to_the_returned_event() {
        let db = Db::new();
        let mut store = db.open();
        let mut returned = vec![
            store
                .register(pending("p", owner(10), NOW + 9), NOW)
                .unwrap()
                .event
                .unwrap(),
        ];
        returned.push(
            store
                .register(req("p", owner(11)), NOW)
                .unwrap()
                .event
                .unwrap(),
        );
        returned.push(store.rename(UID, "p", "real", NOW).unwrap());
        returned.extend(end_owner(
            &mut store,
            &owner(11),
            Some(ExitStatus::Signaled {
                signal: 11,
                core_dumped: true,
            }),
            DetectedBy::Ebpf,
            NOW - 1,
            NOW,
        ));
        let EventPage::Events(stored) = store.events_after(0, 10, &EventFilter::default()).unwrap()
        else {
            panic!("no gap expected");
        };
        assert_eq!(stored.len(), 4);
        for (stored, event) in stored.iter().zip(&returned) {
            assert_eq!(stored.body, serde_json::to_string(event).unwrap());
            assert_eq!(&serde_json::from_str::<Event>(&stored.body).unwrap(), event);
        }
        let registered: serde_json::Value = serde_json::from_str(&stored[0].body).unwrap();
        assert_eq!(registered["kind"], "session.registered");
        assert!(
            registered.get("reason").is_none(),
            "None fields are omitted"
        );
        let ended: serde_json::Value = serde_json::from_str(&stored[3].body).unwrap();
        assert_eq!(ended["kind"], "session.ended");
        assert_eq!(ended["reason"], "owner_exited");
        assert_eq!(ended["detected_by"], "ebpf");
        assert_eq!(ended["exit"]["kind"], "signaled");
        assert_eq!(ended["observed_ms"], NOW - 1);
    }

    #[test]
    fn commits_survive_an_unclean_drop() {
        let db = Db::new();
        let mut store = db.open();
        store.register(req("s", owner(10)), NOW).unwrap();
        end_by_owner(&mut store, &owner(10));
        // No close, no checkpoint: the commits live only in the WAL.
        std::mem::forget(store);
        let store = db.open();
        assert_eq!(store.head_seq().unwrap(), 2);
        assert_eq!(store.get(UID, "s").unwrap().unwrap().phase, Phase::Ended);
    }

    /// The real thing: a child process commits, then SIGKILLs itself.
    #[test]
    fn commits_survive_sigkill() {
        const CHILD_DB: &str = "LIVENESS_STORE_TEST_CHILD_DB";
        if let Some(path) = std::env::var_os(CHILD_DB) {
            let mut store = Store::open(path).unwrap();
            store.register(req("s", owner(10)), NOW).unwrap();
            end_by_owner(&mut store, &owner(10));
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL)
                .unwrap();
            unreachable!("SIGKILL returned");
        }
        let db = Db::new();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "store::tests::commits_survive_sigkill",
                "--nocapture",
            ])
            .env(CHILD_DB, db.path())
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{status:?}");
        let store = db.open();
        assert_eq!(store.head_seq().unwrap(), 2);
        assert_eq!(store.get(UID, "s").unwrap().unwrap().phase, Phase::Ended);
    }
}
