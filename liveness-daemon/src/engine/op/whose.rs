//! `whose`: the session whose process tree holds a process (so an orphan reparented to
//! init still names it), else the nearest registered owner among its ancestors.
//!
//! The walk up the ancestry reads `/proc` (and the kernel's members map) once per
//! ancestor, as deep as the asker made the chain: [`ancestry`] does it off the engine,
//! which then only looks up the links in memory, and the store for the few that are
//! tracked owners.

use liveness_common::identity::ProcessKey;
use liveness_common::session::Session;
use liveness_proc::identity::{IdentityError, ProcRoot};

use super::Op;
use crate::engine::actor::Context;
use crate::engine::watch::Link;
use crate::engine::{Caller, Refusal};
use crate::source::tree_map::TreeMap;

/// Deep enough for any real process tree, bounded against a corrupt one.
const MAX_DEPTH: usize = 256;

/// The ancestry of `pid` (read in the PID namespace of `caller_pid`; for a thread id, of
/// its process), nearest first, up to the first process without a parent.
pub fn ancestry(
    proc: &ProcRoot,
    kernel: Option<&TreeMap>,
    caller_pid: u32,
    pid: u32,
) -> Result<Vec<Link>, Refusal> {
    let local = proc
        .translate_pid(caller_pid, pid)
        .map_err(|e| Refusal::NotFound(e.to_string()))?;
    let mut current = proc.tgid(local).unwrap_or(local);
    let mut links = Vec::new();
    while current != 0 && links.len() < MAX_DEPTH {
        let stat = match proc.stat(current) {
            Ok(stat) => stat,
            Err(IdentityError::NoSuchProcess(p)) if p == local => {
                return Err(Refusal::NotFound(format!("no process with PID {pid}")));
            }
            Err(e) => return Err(Refusal::NotFound(e.to_string())),
        };
        let key = ProcessKey {
            pid: current,
            start_ticks: stat.start_ticks,
        };
        let kernel_root = kernel
            .and_then(|kernel| kernel.get(key.pid))
            .filter(|entry| entry.member == key)
            .map(|entry| entry.root);
        let pidfs_ino = proc.pidfs_ino_of_key(key);
        links.push(Link {
            key,
            pidfs_ino,
            kernel_root,
        });
        current = stat.ppid;
    }
    Ok(links)
}

/// `whose`, with the ancestry of the pid read off the engine (see [`ancestry`]).
#[derive(Debug)]
pub struct Whose {
    /// As the caller asked.
    pub pid: u32,
    pub ancestry: Vec<Link>,
}

/// The session found, and its owner's pid in the caller's PID namespace (0 when the
/// owner is outside it).
#[derive(Debug)]
pub struct Found {
    pub session: Session,
    pub owner_pid: u32,
}

impl Op for Whose {
    type Answer = Found;

    /// The nearest link of the ancestry that owns an ACTIVE session the caller may see or
    /// belongs to one's tree.
    fn apply(self, cx: &mut Context<'_>, caller: Caller) -> Result<Found, Refusal> {
        for link in self.ancestry {
            // The store is asked only about owners that are watched.
            let Some(owner) = cx.watched_owner(&link) else {
                continue;
            };
            let sessions = (cx.store()).active_sessions_of_owner(&owner)?;
            if let Some(session) = sessions.into_iter().find(|s| caller.may_see(s)) {
                // In the caller's namespace, like the pid it asked about.
                let seen = cx.facts().proc().pid_seen_by(caller.pid, owner.pid);
                return Ok(Found {
                    session,
                    owner_pid: seen.unwrap_or(0),
                });
            }
        }
        Err(Refusal::NotFound(format!(
            "no active session owns PID {} or any of its ancestors",
            self.pid
        )))
    }
}
