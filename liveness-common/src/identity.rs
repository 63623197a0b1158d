//! Process fingerprints: which process a session belongs to, named so that PID reuse and
//! reboots can never be mistaken for it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The fingerprint of one process: equal fingerprints mean the same process.
///
/// JSON field names are part of the public protocol (`docs/protocol.md`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    /// Process id (thread-group id).
    pub pid: u32,
    /// Start time in clock ticks after boot: `/proc/<pid>/stat` field 22, as read in the
    /// initial time namespace (a reader in a time namespace subtracts its boottime offset).
    pub start_ticks: u64,
    /// `/proc/sys/kernel/random/boot_id` of the boot the process runs in: decides "this
    /// kernel, this boot".
    pub boot_id: String,
    /// Host name (UTS namespace) of the process's reader when captured. A label for humans
    /// and multi-host consumers: never compared to decide liveness.
    pub host: String,
    /// Inode number of the process's pidfd in pidfs (Linux 6.9+): unique among the
    /// processes of one boot, so it tells apart two processes that got the same pid within
    /// one clock tick. Absent on older kernels and in identities captured without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pidfs_ino: Option<u64>,
    /// Command name when captured. For display only: `execve` changes it, so it is not
    /// part of the fingerprint compared by [`Identity::same_process`].
    #[serde(default)]
    pub comm: String,
}

impl Identity {
    /// The key that names this process among the processes of this boot.
    pub fn key(&self) -> ProcessKey {
        ProcessKey {
            pid: self.pid,
            start_ticks: self.start_ticks,
        }
    }

    /// True when both identities name the same process: same boot, pid and start time,
    /// and the same pidfs inode where both know it. The comm and the host name are labels.
    pub fn same_process(&self, other: &Identity) -> bool {
        self.key() == other.key()
            && self.boot_id == other.boot_id
            && match (self.pidfs_ino, other.pidfs_ino) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}[{}] start={} on {}",
            self.comm, self.pid, self.start_ticks, self.host
        )
    }
}

/// A process of the local boot: PID plus start time, immune to PID reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProcessKey {
    pub pid: u32,
    pub start_ticks: u64,
}

impl fmt::Display for ProcessKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.pid, self.start_ticks)
    }
}

/// Why a process counts as dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeathReason {
    /// No process has the PID any more, or it is a zombie waiting to be reaped.
    Exited,
    /// The PID now belongs to another process (different start time). Named on the wire
    /// as a session's end reason is, `owner_reused`; `pid_reused` is still read.
    #[serde(rename = "owner_reused", alias = "pid_reused")]
    PidReused,
    /// The machine rebooted since the identity was captured.
    Rebooted,
}

impl fmt::Display for DeathReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeathReason::Exited => "the process exited",
            DeathReason::PidReused => "the PID now belongs to a different process",
            DeathReason::Rebooted => "the machine rebooted since the identity was captured",
        })
    }
}
