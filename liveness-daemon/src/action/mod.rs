//! End actions: the commands a session's creator registered, run when the session ends,
//! whatever ended it (invariant 13).
//!
//! An action runs as the session's creator, never as root on a user's behalf: a root
//! daemon takes on the creator's uid, primary group and supplementary groups (the way cron
//! and `systemd-run --uid` do), a per-user daemon runs actions as itself. Either way the
//! action has no capabilities (every set empty, the bounding set too where the daemon may
//! drop it), `no_new_privs`, a clean environment ([`env`]), its registered working
//! directory (or the user's home) entered as the user, no controlling terminal, a session
//! and process group of its own, and none of the daemon's descriptors. Its stdin is the
//! [`EndFacts`](liveness_common::action::EndFacts) as JSON; its stdout is discarded; the
//! last 4 KiB of its stderr are kept. At its timeout its whole tree is ended ([`tree`]).
//! Each user has at most a few actions running at once ([`crate::fair::turns`]).
//!
//! The daemon's mount namespace and file system view are the action's: a unit that hides
//! home directories from the daemon hides them from actions too.
//!
//! The system calls are behind [`sys`]; [`spawn`] starts the process without waiting on
//! it (a user may stop it before its exec); [`runner`] runs one action to its
//! [`ActionOutcome`](liveness_common::action::ActionOutcome), its start bounded.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

pub mod env;
pub mod runner;
pub mod spawn;
pub mod sys;
pub mod tail;
pub mod tree;
pub mod user;

#[cfg(test)]
mod tests;

pub use runner::{ActionRunner, RunOptions};

use sys::Step;

/// Why an action could not be run. Its text is the outcome's `error`.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("cannot look up uid {uid} in the user database: {source}")]
    Lookup { uid: u32, source: io::Error },
    #[error(
        "the daemon runs as uid {daemon} and cannot run an action as uid {uid}: an action runs \
         only as its session's creator (a per-user daemon serves its own user; run livenessd \
         as root to serve others)"
    )]
    OtherUser { daemon: u32, uid: u32 },
    #[error("cannot prepare the action: {0}")]
    Prepare(#[source] io::Error),
    #[error("the action could not {step} as uid {uid} (working directory {}): {source}", cwd.display())]
    Setup {
        step: Step,
        uid: u32,
        cwd: PathBuf,
        source: io::Error,
    },
    #[error("cannot run {program:?}: {source}")]
    Exec { program: String, source: io::Error },
    #[error(
        "the action's process was not released to run: the daemon could not record it first, \
         and a restart could not have told that it ran"
    )]
    NotRecorded,
    #[error(
        "the action's process neither ran its program nor exited within {0:?} of its start \
         (stopped or stuck before its exec): it was killed"
    )]
    StartBound(Duration),
    #[error("cannot watch or reap the action's process: {0}")]
    Wait(#[source] io::Error),
}

impl ActionError {
    /// Whether the action's program never ran: every error but a failed watch of a
    /// program that did.
    pub fn before_start(&self) -> bool {
        !matches!(self, ActionError::Wait(_))
    }
}
