//! What the trees keep of each member, apart from [`super::known`] (which changes the
//! trees) and [`super::view`] (which reads copies of them off the engine).

use std::collections::BTreeMap;

use liveness_common::identity::ProcessKey;

use crate::store::Member;

/// What is kept of a member: its command name (empty until read) and its pidfs inode
/// (where the kernel has pidfs, and once read), which tells it from a process that took
/// its pid within its clock tick.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    pub comm: String,
    pub pidfs_ino: Option<u64>,
}

impl Facts {
    pub fn of(member: &Member) -> Facts {
        Facts {
            comm: member.comm.clone(),
            pidfs_ino: member.pidfs_ino,
        }
    }

    /// Whether a process read as `key` with the inode `pidfs_ino` may be this member: an
    /// inode known on both sides must be the same.
    pub fn matches(&self, pidfs_ino: Option<u64>) -> bool {
        match (self.pidfs_ino, pidfs_ino) {
            (Some(known), Some(now)) => known == now,
            _ => true,
        }
    }
}

/// A tree's members (the root not included).
pub type Tree = BTreeMap<ProcessKey, Facts>;
