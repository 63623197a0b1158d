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
use std::path::PathBuf;
use std::time::Duration;

use liveness_common::action::ActionSpec;
use liveness_common::activity::StallPolicy;
use liveness_common::cause::{Cause, SenderSession, Usage};
use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::session::{
    EndReason, Event, EventKind, OnEnd, Phase, Session, SessionCgroup, Survivors, Until,
};

/// Longest accepted session id, in bytes.
pub const MAX_ID_LEN: usize = 256;

/// How long a statement waits for a lock held by another connection before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Number of columns in [`session_columns!`].
const SESSION_COLUMNS: usize = 32;

/// Columns of a session row, in the order [`session_from_row`] reads them.
macro_rules! session_columns {
    () => {
        "id, owner_pid, owner_start_ticks, owner_boot_id, owner_host, owner_comm, phase, \
         pending, reason, exit, detected_by, creator_uid, labels, created_ms, updated_ms, \
         touched_ms, ended_ms, pending_expires_ms, owner_pidfs_ino, survivors, on_end, grace_ms, \
         cause, usage, on_end_run, finalized_ms, until, reaped, declared, activity, on_stall, \
         cgroup"
    };
}

/// Selects the ACTIVE sessions an ending applies to, with their rowids, for [`ending::end_selected`];
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
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    #[error(
        "session {0:?} has ended; its id stays taken while the ended session is kept \
         (livenessd --retain-age, 7 days by default): use a new id"
    )]
    AlreadyEnded(String),
    #[error("session {0:?} already exists")]
    AlreadyExists(String),
    #[error("session {0:?} is not pending; only a pending session can be renamed")]
    NotPending(String),
    #[error("invalid session id: {0}")]
    InvalidId(String),
    #[error("invalid lock name: {0}")]
    InvalidLockName(String),
    #[error("session {session:?} does not hold lock {name:?}")]
    NotHeld { name: String, session: String },
    #[error(
        "session {0:?} holds {max} locks already, the most one session may; release some",
        max = locks::MAX_LOCKS_PER_SESSION
    )]
    TooManyLocks(String),
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
    #[error("no space left on device for {path}: free some space ({detail})")]
    NoSpace { path: PathBuf, detail: String },
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("stored JSON: {0}")]
    Json(#[from] serde_json::Error),
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
    pub on_end: OnEnd,
    pub grace_ms: u64,
    pub until: Until,
    /// The end actions; `None` keeps those of an ACTIVE session registered again.
    pub on_end_run: Option<Vec<ActionSpec>>,
    /// The stall policy; `None` keeps that of an ACTIVE session registered again.
    pub on_stall: Option<StallPolicy>,
    /// The cgroup made for a new session (ignored for an existing one).
    pub cgroup: Option<SessionCgroup>,
    /// The creator's primary group as it registered (`SO_PEERCRED`), when it registered
    /// for itself: the group its actions run with should the user databases not know it.
    pub creator_gid: Option<u32>,
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
    /// The members of the owner's process tree still alive.
    pub survivors: Option<Survivors>,
    /// Why it died, where a kernel program saw it; otherwise what the reason, the source
    /// and the status can say (see [`Cause::unseen`]).
    pub cause: Option<Cause>,
    /// What it cost, where the kernel showed it.
    pub usage: Option<Usage>,
    /// The owner of the tree the signal's sender belonged to when it sent the signal: its
    /// session is named in the cause of each ending whose readers may see it.
    pub sender_root: Option<ProcessKey>,
    /// Whether its sessions that last until their trees do in cgroups of their own wait
    /// for those to be empty.
    pub tree_cgroups: TreeCgroups,
}

/// Where the cgroups of a dead owner's sessions that last until their trees do stand: a
/// tree is over once none of its members lives and its session's cgroup holds no process
/// (a process that joined the cgroup without being forked in the tree, one the tree's
/// view missed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TreeCgroups {
    /// Not looked at yet.
    #[default]
    Unasked,
    /// Waited for: such a session with a cgroup outlives this death.
    Held,
    /// Found empty.
    Empty,
}

/// How a session ends: what [`Store::end`] and [`Store::end_many`] write into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    pub reason: EndReason,
    pub exit: Option<ExitStatus>,
    /// The source that saw the death, for an ending that is one.
    pub detected_by: Option<DetectedBy>,
    /// When the source observed the death.
    pub observed_ms: Option<i64>,
    /// When the owner died by the kernel's clock, where the source knows it.
    pub died_ms: Option<i64>,
    /// The members of the owner's process tree still alive.
    pub survivors: Option<Survivors>,
    /// Why the owner died, where a kernel program saw it; otherwise what the reason, the
    /// source and the status can say.
    pub cause: Option<Cause>,
    /// What the owner cost, where the kernel showed it.
    pub usage: Option<Usage>,
    /// The sessions a signal's sender belonged to: each cause names the first that its
    /// readers may see.
    pub sender_sessions: Vec<SenderSession>,
    /// Terminate the surviving processes whatever the session's policy (`end --terminate`).
    pub terminate: bool,
}

impl Ending {
    /// An ending for `reason` and nothing else known.
    pub fn because(reason: EndReason) -> Ending {
        Ending {
            reason,
            exit: None,
            detected_by: None,
            observed_ms: None,
            died_ms: None,
            survivors: None,
            cause: None,
            usage: None,
            sender_sessions: Vec::new(),
            terminate: false,
        }
    }

    /// Ends `session` in memory as this ending says, at `now_ms`: what its row and its
    /// `session.ended` event then record, whether the ending is journaled or committed.
    fn end(&self, session: &mut Session, now_ms: i64) {
        session.phase = Phase::Ended;
        session.reason = Some(self.reason);
        session.exit = self.exit;
        session.detected_by = self.detected_by;
        session.cause = Some(self.cause_of(session.creator_uid));
        session.usage.clone_from(&self.usage);
        session.ended_ms = Some(now_ms);
        session.updated_ms = now_ms;
        if self.survivors.is_some() {
            session.survivors.clone_from(&self.survivors);
        }
    }

    /// The cause this ending records for a session of `creator_uid`.
    fn cause_of(&self, creator_uid: u32) -> Cause {
        let mut cause = self
            .cause
            .clone()
            .unwrap_or_else(|| Cause::unseen(self.reason, self.detected_by, self.exit));
        cause.name_sender_session(&self.sender_sessions, creator_uid);
        cause
    }

    /// The `session.ended` event of `session` (ACTIVE, or as [`Ending::end`] left it) that
    /// this ending ends at `now_ms`, made without a copy of the session.
    fn event(&self, session: &Session, now_ms: i64) -> Event {
        Event {
            reason: Some(self.reason),
            exit: self.exit,
            cause: Some(self.cause_of(session.creator_uid)),
            usage: self.usage.clone(),
            detected_by: self.detected_by,
            observed_ms: self.observed_ms,
            died_ms: self.died_ms,
            survivors: self.survivors.clone().or_else(|| session.survivors.clone()),
            ..rows::event_about(EventKind::Ended, session, now_ms)
        }
    }
}

impl OwnerDeath {
    /// Whether processes of the owner's tree outlive it: a session registered `until:
    /// "tree"` then lasts until they have exited too.
    pub fn tree_outlives(&self) -> bool {
        self.survivors
            .as_ref()
            .is_some_and(|survivors| survivors.total > 0)
    }

    /// Whether `session`, which lasts until its tree does, outlives this death: members
    /// of the tree live, or its cgroup still holds processes.
    pub fn tree_holds(&self, session: &Session) -> bool {
        self.tree_outlives() || (self.tree_cgroups == TreeCgroups::Held && session.cgroup.is_some())
    }

    /// The ending of every session the dead owner had; `sender_sessions` are those of its
    /// [`OwnerDeath::sender_root`].
    fn ending(&self, sender_sessions: Vec<SenderSession>) -> Ending {
        Ending {
            exit: self.exit,
            detected_by: Some(self.detected_by),
            observed_ms: Some(self.observed_ms),
            died_ms: self.died_ms,
            survivors: self.survivors.clone(),
            cause: self.cause.clone(),
            usage: self.usage.clone(),
            sender_sessions,
            ..Ending::because(self.reason)
        }
    }
}

/// A member of a process tree, as persisted across daemon restarts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub key: ProcessKey,
    /// The tracked owner whose tree it belongs to.
    pub root: ProcessKey,
    /// Command name when first seen, for display.
    pub comm: String,
    /// Its pidfs inode, where the kernel has pidfs (6.9+): with the pid and start time, what
    /// tells it from a process that took its pid within its clock tick.
    pub pidfs_ino: Option<u64>,
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

mod actions;
mod active;
mod apply;
mod cgroups;
mod checkpoint;
mod ending;
mod fleet_locks;
pub mod journal;
mod lineage;
mod lock_rows;
mod locks;
mod prepared;
mod reader;
mod reaps;
mod recovery;
mod replay;
mod rows;
mod schema;
mod tree;
mod writer;

pub use actions::{ActionKey, Begin, DueAction};
pub use active::Active;
pub use apply::{JournaledDeaths, journal_deaths};
pub use checkpoint::Checkpointer;
pub use lineage::Lineage;
/// Fleet locks' names follow the rules of the host's.
#[cfg(feature = "fleet")]
pub use lock_rows::validate_lock_name;
pub use lock_rows::{LockPage, LockQuery};
pub use locks::Acquired;
pub use reader::{EventReader, ListQuery, SessionPage};
pub use replay::EventFilter;
pub use writer::{SEQ_JUMP_AFTER_POWER_LOSS, Store};

#[cfg(test)]
mod tests;
