//! Why the engine does not do what it is asked, in the engine's own terms. Operations
//! return a [`Refusal`]; the server alone turns one into the wire's error code and
//! message (`server/reply.rs`), so that the engine knows nothing of the protocol's codes.

use crate::fair::limits::Exceeded;
use crate::store::StoreError;
use liveness_common::lock::Lock;
use liveness_proc::identity::IdentityError;

/// What an operation refuses, or the failure that stopped it.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The store refused the change (no such session, ended, a bad id...) or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The owner named cannot be bound: it does not exist for this client, or it can
    /// never be watched as a process (a kernel thread).
    #[error(transparent)]
    Owner(#[from] IdentityError),
    /// A user's limit.
    #[error(transparent)]
    Limit(#[from] Exceeded),
    /// The request contradicts itself or the session it names.
    #[error("{0}")]
    Invalid(String),
    /// Descriptor `index` of the request line is not a pidfd.
    #[error(
        "descriptor {index} of the request line is a {kind}, not a pidfd: send one from pidfd_open(2)"
    )]
    NotPidfd { index: usize, kind: String },
    /// A user named another user's sessions.
    #[error("only root may name another user's sessions with `uid` (you are uid {caller})")]
    OthersSessions { caller: u32 },
    /// A user named another user's process as an owner.
    #[error("process {pid} belongs to uid {uid}, not to you (uid {caller})")]
    OthersProcess { pid: u32, uid: u32, caller: u32 },
    /// Root named, without `uid`, a session id that several users have.
    #[error(
        "session {id:?} exists for uids {}; name one with `uid` (--uid)",
        join(uids)
    )]
    Ambiguous { id: String, uids: Vec<u32> },
    /// The session had ended already.
    #[error("session {0:?} has already ended")]
    Ended(String),
    /// The session ended while its request waited for a lock.
    #[error("session {session:?} ended while waiting for lock {name:?}")]
    EndedWaiting { session: String, name: String },
    /// The lock is another session's, and the request does not wait (or waited long enough).
    #[error("lock {:?} is held by session {:?} (token {})", .0.name, .0.session, .0.token)]
    LockHeld(Box<Lock>),
    /// As many requests as a lock's queue holds wait for it already.
    #[error("{waiting} requests wait for lock {name:?} already; try again later")]
    QueueFull { name: String, waiting: usize },
    /// What a `whose` or an ancestry looked for is not there.
    #[error("{0}")]
    NotFound(String),
    /// Published deaths are not in SQLite yet, and the operation writes.
    #[error("the database cannot be written (see the daemon's log); try again")]
    Behind,
    /// The engine has stopped.
    #[error("the daemon is stopping")]
    Stopping,
    /// The engine's own books disagree.
    #[error("{0}")]
    Internal(&'static str),
}

fn join(uids: &[u32]) -> String {
    let uids: Vec<String> = uids.iter().map(u32::to_string).collect();
    uids.join(", ")
}
