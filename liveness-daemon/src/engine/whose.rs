//! `whose`: the session whose process tree holds a process (so an orphan reparented to
//! init still names it), else the nearest registered owner among its ancestors.
//!
//! The walk up the ancestry reads `/proc` (and the kernel's members map) once per
//! ancestor, as deep as the asker made the chain: [`ancestry`] does it off the engine,
//! which then only looks up the links in memory, and the store for the few that are
//! tracked owners.

use liveness_common::identity::ProcessKey;
use liveness_common::protocol::{ErrorBody, ErrorCode, Reply};
use liveness_proc::identity::{IdentityError, ProcRoot};

use super::auth::Caller;
use super::{Engine, store_error};
use crate::source::members_map::MembersMap;

/// Deep enough for any real process tree, bounded against a corrupt one.
const MAX_DEPTH: usize = 256;

/// One ancestor: its key, and the tree the kernel's members map holds it in (forked since
/// the engine last merged the map).
pub type Link = (ProcessKey, Option<ProcessKey>);

/// The ancestry of `pid` (read in the PID namespace of `caller_pid`; for a thread id, of
/// its process), nearest first, up to the first process without a parent.
pub fn ancestry(
    proc: &ProcRoot,
    kernel: Option<&MembersMap>,
    caller_pid: u32,
    pid: u32,
) -> Result<Vec<Link>, ErrorBody> {
    let local = proc
        .translate_pid(caller_pid, pid)
        .map_err(|e| ErrorBody::new(ErrorCode::NotFound, e.to_string()))?;
    let mut current = proc.tgid(local).unwrap_or(local);
    let mut links = Vec::new();
    while current != 0 && links.len() < MAX_DEPTH {
        let stat = match proc.stat(current) {
            Ok(stat) => stat,
            Err(IdentityError::NoSuchProcess(p)) if p == local => {
                return Err(ErrorBody::new(
                    ErrorCode::NotFound,
                    format!("no process with PID {pid}"),
                ));
            }
            Err(e) => return Err(ErrorBody::new(ErrorCode::NotFound, e.to_string())),
        };
        let key = ProcessKey {
            pid: current,
            start_ticks: stat.start_ticks,
        };
        let kernel_root = kernel
            .and_then(|kernel| kernel.get(key.pid))
            .filter(|entry| entry.member == key)
            .map(|entry| entry.root);
        links.push((key, kernel_root));
        current = stat.ppid;
    }
    Ok(links)
}

impl Engine {
    /// The nearest link of `ancestry` (of `pid`, as the caller asked) that owns an ACTIVE
    /// session the caller may see or belongs to one's tree.
    pub(super) fn whose(&self, caller: Caller, pid: u32, ancestry: &[Link]) -> Reply {
        for &(key, kernel_root) in ancestry {
            // Membership first: a member's parent may be init, or a process of another tree.
            let owner = self
                .membership
                .known_root_of(key)
                .or(kernel_root.filter(|root| self.membership.follows(*root)))
                .unwrap_or(key);
            // Every owner of an ACTIVE session of this boot is tracked: the store is asked
            // only about those.
            if !self.monitor.is_tracked(owner) {
                continue;
            }
            match self
                .store
                .active_sessions_of_owner(&self.identity_of(owner))
            {
                Ok(sessions) => {
                    if let Some(session) = sessions.into_iter().find(|s| caller.may_see(s)) {
                        // In the caller's namespace, like the pid it asked about.
                        let seen = self.config.proc.pid_seen_by(caller.pid, owner.pid);
                        return Reply {
                            owner_pid: Some(seen.unwrap_or(0)),
                            ..Reply::with_session(session)
                        };
                    }
                }
                Err(e) => return store_error(e).into(),
            }
        }
        Reply::error(
            ErrorCode::NotFound,
            format!("no active session owns PID {pid} or any of its ancestors"),
        )
    }
}
