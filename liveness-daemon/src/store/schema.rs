//! The schema: migrations, creating a database all at once, and the file checks.

use super::StoreError;
use rusqlite::{Connection, TransactionBehavior};
use std::path::{Path, PathBuf};

/// Schema migrations, in order: migration `i` brings `user_version` from `i` to `i + 1`.
/// Never edit a released entry; append a new one.
pub(super) const MIGRATIONS: &[&str] = &[
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
    r#"
-- Locks held by sessions: one row per held lock, named in the namespace of the holding
-- session's user. A release deletes the row; ending the session releases its locks in the
-- same transaction.
CREATE TABLE locks (
    uid INTEGER NOT NULL,
    name TEXT NOT NULL,
    session TEXT NOT NULL,
    token INTEGER NOT NULL,
    since_ms INTEGER NOT NULL,
    PRIMARY KEY (uid, name)
);
CREATE INDEX locks_by_session ON locks (uid, session);
-- The last fencing token granted. One counter for every lock, never lowered: a token is
-- greater than every earlier one of its lock whatever was released or pruned meanwhile.
INSERT INTO meta (key, value) VALUES ('lock_token', 0);
"#,
    r#"
-- Process trees. A session that ends records the members of its owner's tree still alive
-- (JSON: total and a bounded list of identities).
ALTER TABLE sessions ADD COLUMN survivors TEXT;
-- The members of the trees of live owners, so that a restarted daemon still knows the
-- orphans of a session: re-checked by fingerprint at start, the dead ones dropped.
CREATE TABLE members (
    pid INTEGER NOT NULL,
    start_ticks INTEGER NOT NULL,
    root_pid INTEGER NOT NULL,
    root_start_ticks INTEGER NOT NULL,
    comm TEXT NOT NULL,
    PRIMARY KEY (pid, start_ticks)
);
CREATE INDEX members_by_root ON members (root_pid, root_start_ticks);
"#,
    r#"
-- The cleanup policy, chosen at registration: whether the session's surviving processes
-- are terminated when it ends, and their grace between SIGTERM and SIGKILL. Sessions made
-- before it leave their processes, as they always did.
ALTER TABLE sessions ADD COLUMN on_end TEXT NOT NULL DEFAULT 'leave'
    CHECK (on_end IN ('leave', 'terminate'));
ALTER TABLE sessions ADD COLUMN grace_ms INTEGER NOT NULL DEFAULT 10000;
"#,
    r#"
-- Reaps due: a session that ends with its surviving processes to terminate gets a row in
-- the transaction of its end, and loses it in the one that records its session.reaped. A
-- row found at start is a reap that a stop or a crash cut short: it runs again.
CREATE TABLE reaps (
    uid INTEGER NOT NULL,
    session TEXT NOT NULL,
    PRIMARY KEY (uid, session)
);
"#,
    r#"
-- Why an ended session's owner died (JSON: the cause's kind and facts) and what it cost
-- (JSON: CPU time and peak memory, its tree's exited members summed). Sessions that ended
-- before have neither.
ALTER TABLE sessions ADD COLUMN cause TEXT;
ALTER TABLE sessions ADD COLUMN usage TEXT;
"#,
    r#"
-- End actions: the list a session's creator registered (JSON, NULL for none), and when the
-- last of them had its outcome.
ALTER TABLE sessions ADD COLUMN on_end_run TEXT;
ALTER TABLE sessions ADD COLUMN finalized_ms INTEGER;
-- One row per end action, made with the registration, so that ending a session writes
-- nothing more. `pending` until it starts; `running` (committed before it is spawned, with
-- its first process once known) until its outcome is committed with its event: a row still
-- `running` at start is a run a stop or a crash cut short, run again. `gid` is the primary
-- group the creator registered with, for a uid the user databases do not know.
CREATE TABLE actions (
    uid INTEGER NOT NULL,
    session TEXT NOT NULL,
    idx INTEGER NOT NULL,
    gid INTEGER,
    state TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done')),
    root_pid INTEGER,
    root_start_ticks INTEGER,
    outcome TEXT,
    PRIMARY KEY (uid, session, idx)
);
CREATE INDEX actions_not_done ON actions (uid, session) WHERE state != 'done';
"#,
    r#"
-- A member's pidfs inode (Linux 6.9+), so that a process that took a dead member's pid
-- within its clock tick is not taken for it after a restart either.
ALTER TABLE members ADD COLUMN pidfs_ino INTEGER;
"#,
    r#"
-- When a session ends by itself: at its owner's death, or at the last death of its tree.
ALTER TABLE sessions ADD COLUMN until TEXT NOT NULL DEFAULT 'owner'
    CHECK (until IN ('owner', 'tree'));
"#,
    r#"
-- The daemon's runs, oldest first, each named at its start with the newest seq then: the
-- store id reported names the current one, so that a cursor made in a run this database
-- never had (the state was restored from an older copy) is told to reset (see lineage).
CREATE TABLE runs (run TEXT PRIMARY KEY NOT NULL, started_after INTEGER NOT NULL);
"#,
    r#"
-- What terminating an ended session's surviving processes did (JSON: the pids terminated,
-- killed, already exited and not ended), written with its session.reaped, so that `get`
-- shows it. NULL until then, and for sessions whose reap was recorded before.
ALTER TABLE sessions ADD COLUMN reaped TEXT;
"#,
    r#"
-- What the session's agent last declared through `touch` (JSON: the turn and the tool in
-- flight), and the stall episode under way (JSON: the judgement of its session.stalled),
-- cleared by its session.unstalled. NULL when none.
ALTER TABLE sessions ADD COLUMN declared TEXT;
ALTER TABLE sessions ADD COLUMN activity TEXT;
"#,
    r#"
-- How the session's stalls are judged and what they do, as registered (JSON); NULL: the
-- daemon's defaults.
ALTER TABLE sessions ADD COLUMN on_stall TEXT;
"#,
    r#"
-- Fleet locks (--etcd) held by this host's sessions, one row per grant: etcd holds the
-- lock, on the session's lease; the row is what a restarted daemon re-attaches that lease
-- from (or, if it ended meanwhile, tells the holder so), and what `lock_list` shows. Names
-- are the fleet's, one namespace whatever the user; the token is etcd's create revision.
CREATE TABLE fleet_locks (
    name TEXT PRIMARY KEY NOT NULL,
    uid INTEGER NOT NULL,
    session TEXT NOT NULL,
    token INTEGER NOT NULL,
    since_ms INTEGER NOT NULL,
    lease INTEGER NOT NULL,
    host TEXT NOT NULL
);
CREATE INDEX fleet_locks_by_session ON fleet_locks (uid, session);
"#,
    r#"
-- The session's own cgroup and its limits (JSON), NULL when it has none.
ALTER TABLE sessions ADD COLUMN cgroup TEXT;
"#,
];

/// The schema version this code writes and understands.
pub(super) const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// A file's device and inode.
pub(super) type FileId = (u64, u64);

pub(super) fn file_id(path: &Path) -> std::io::Result<FileId> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path)?;
    Ok((metadata.dev(), metadata.ino()))
}

/// A file that exists but is empty, with no write-ahead log holding its content: a
/// database that was truncated (a new one is never empty, see [`create`]).
pub(super) fn is_truncated(path: &Path) -> bool {
    let length = |path: &Path| std::fs::metadata(path).map(|m| m.len()).ok();
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    length(path) == Some(0) && length(Path::new(&wal)).unwrap_or(0) == 0
}

/// Creates a migrated database at `path` all at once (built beside it, then renamed), so
/// that an empty file found later can only be a damaged one.
pub(super) fn create(path: &Path) -> Result<(), StoreError> {
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
pub(super) fn is_damage(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
    )
}

/// Reads `user_version`; newer than [`SCHEMA_VERSION`] is always an error, older only when
/// the caller cannot migrate.
pub(super) fn check_version(conn: &Connection, exact: bool) -> Result<u32, StoreError> {
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
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
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

pub(super) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}
