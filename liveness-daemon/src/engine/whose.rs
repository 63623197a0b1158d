//! `whose`: the session whose process tree holds a process (so an orphan reparented to
//! init still names it), else the nearest registered owner among its ancestors.

use liveness_common::identity::ProcessKey;
use liveness_common::protocol::{ErrorCode, Reply};
use liveness_proc::identity::IdentityError;

use super::auth::Caller;
use super::{Engine, store_error};

impl Engine {
    /// Walks up from `pid` (or, for a thread id, its process) to the nearest process that
    /// owns an ACTIVE session or belongs to one's tree. `pid` is read in the caller's PID
    /// namespace.
    pub(super) fn whose(&self, caller: Caller, pid: u32) -> Reply {
        let local = match self.config.proc.translate_pid(caller.pid, pid) {
            Ok(local) => local,
            Err(e) => return Reply::error(ErrorCode::NotFound, e.to_string()),
        };
        let mut current = self.config.proc.tgid(local).unwrap_or(local);
        // Deep enough for any real process tree, bounded against a corrupt one.
        for _ in 0..256 {
            if current == 0 {
                break;
            }
            let stat = match self.config.proc.stat(current) {
                Ok(stat) => stat,
                Err(IdentityError::NoSuchProcess(p)) if p == local => {
                    return Reply::error(ErrorCode::NotFound, format!("no process with PID {pid}"));
                }
                Err(e) => return Reply::error(ErrorCode::NotFound, e.to_string()),
            };
            let key = ProcessKey {
                pid: current,
                start_ticks: stat.start_ticks,
            };
            // Membership first: a member's parent may be init, or a process of another tree.
            let owner = self.membership.root_of(key).unwrap_or(key);
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
            current = stat.ppid;
        }
        Reply::error(
            ErrorCode::NotFound,
            format!("no active session owns PID {pid} or any of its ancestors"),
        )
    }
}
