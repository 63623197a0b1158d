//! A process of a tree moved into another cgroup (the kernel's record of the move, its
//! cgroup read off the engine by [`crate::cgroup::moves`]): for each ACTIVE session of its
//! tree that has a cgroup which does not hold it, an escape, recorded once and announced
//! by a `session.escaped` (docs/cgroups.md#escapes).

use std::path::Path;

use liveness_common::identity::ProcessKey;
use liveness_common::session::{CgroupEscape, Event};

use super::Op;
use crate::engine::actor::Context;
use crate::engine::watch::Link;
use crate::engine::{Caller, Refusal};

/// `member`, of the tree rooted at `root` as the kernel's members map has it, is now in
/// `cgroup` (as its `/proc/<pid>/cgroup` names it).
#[derive(Debug)]
pub struct Moved {
    pub member: ProcessKey,
    pub root: ProcessKey,
    pub cgroup: String,
}

impl Op for Moved {
    /// The `session.escaped` events recorded: none for a move within its sessions'
    /// cgroups, or an escape known already.
    type Answer = Vec<Event>;

    fn apply(self, cx: &mut Context<'_>, _caller: Caller) -> Result<Vec<Event>, Refusal> {
        let Moved {
            member,
            root,
            cgroup,
        } = self;
        let link = Link {
            key: member,
            pidfs_ino: None,
            kernel_root: Some(root),
        };
        let Some(owner) = cx.watched_owner(&link) else {
            return Ok(Vec::new());
        };
        // The owner's ACTIVE sessions (from memory: a registration's moves of a big tree
        // are as many operations) whose cgroups do not hold the process, compared as names
        // only.
        let escaped_from: Vec<(u32, String)> = (cx.sessions_of_owner(&owner))
            .filter(|s| {
                (s.cgroup.as_ref())
                    .is_some_and(|c| !crate::cgroup::holds(Path::new(&c.path), &cgroup))
            })
            .map(|s| (s.creator_uid, s.id.clone()))
            .collect();
        if escaped_from.is_empty() {
            return Ok(Vec::new());
        }
        let escape = CgroupEscape {
            pid: member.pid,
            start_ticks: member.start_ticks,
            cgroup,
        };
        let now = cx.now();
        cx.commit(|store| {
            let mut events = Vec::new();
            for (uid, id) in &escaped_from {
                events.extend(store.record_escape(*uid, id, &escape, now)?);
            }
            Ok((events.clone(), events))
        })
    }
}
