//! How a session ended: why, and which processes of its tree outlived it. Apart from
//! [`crate::session`] so that what an end action is told ([`crate::action`]) and why an
//! owner died ([`crate::cause`]) can name them without the session itself.

use serde::{Deserialize, Serialize};

use crate::identity::{DeathReason, Identity};

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    OwnerExited,
    /// The owner's PID now belongs to another process: the owner died unseen.
    OwnerReused,
    Reboot,
    /// A client stopped it explicitly.
    Stopped,
    /// No activity within the inactivity timeout.
    Timeout,
    /// A pending session was never renamed to its real id in time.
    PendingExpired,
    /// A session registered `until: "tree"`: the last process of its tree exited.
    TreeExited,
}

impl From<DeathReason> for EndReason {
    fn from(reason: DeathReason) -> EndReason {
        match reason {
            DeathReason::Exited => EndReason::OwnerExited,
            DeathReason::PidReused => EndReason::OwnerReused,
            DeathReason::Rebooted => EndReason::Reboot,
        }
    }
}

/// Most survivors listed by identity; [`Survivors::total`] counts them all.
pub const MAX_SURVIVORS_LISTED: usize = 1000;

/// The processes of a session's tree (its owner and every descendant since registration,
/// whatever they were reparented to) that were alive when the session ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Survivors {
    /// Every survivor, listed or not.
    pub total: u32,
    /// At most [`MAX_SURVIVORS_LISTED`] of them, by pid.
    pub members: Vec<Identity>,
    /// For an `end` request made from inside the tree: the process that made it, then its
    /// ancestors up to the first that is no member. Alive at the end, but not survivors:
    /// they are ending the session (a hook and its shell), and are never signalled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requested_by: Vec<Identity>,
}

impl Survivors {
    /// The bounded list of `alive`, sorted by pid, with their total.
    pub fn from_alive(mut alive: Vec<Identity>) -> Survivors {
        alive.sort_by_key(|identity| identity.key());
        let total = u32::try_from(alive.len()).unwrap_or(u32::MAX);
        alive.truncate(MAX_SURVIVORS_LISTED);
        Survivors {
            total,
            members: alive,
            requested_by: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn death_reasons_map_to_end_reasons() {
        assert_eq!(EndReason::from(DeathReason::Exited), EndReason::OwnerExited);
        assert_eq!(
            EndReason::from(DeathReason::PidReused),
            EndReason::OwnerReused
        );
        assert_eq!(EndReason::from(DeathReason::Rebooted), EndReason::Reboot);
        assert_eq!(
            serde_json::to_string(&EndReason::PendingExpired).unwrap(),
            r#""pending_expired""#
        );
    }

    #[test]
    fn survivors_are_sorted_bounded_and_counted() {
        let identity = |pid| Identity {
            pid,
            start_ticks: 1,
            boot_id: "b".into(),
            host: "h".into(),
            pidfs_ino: None,
            comm: "c".into(),
        };
        let alive: Vec<Identity> = (0..MAX_SURVIVORS_LISTED as u32 + 5)
            .rev()
            .map(identity)
            .collect();
        let survivors = Survivors::from_alive(alive);
        assert_eq!(survivors.total, MAX_SURVIVORS_LISTED as u32 + 5);
        assert_eq!(survivors.members.len(), MAX_SURVIVORS_LISTED);
        assert_eq!(survivors.members[0].pid, 0, "listed by pid, lowest first");
    }
}
