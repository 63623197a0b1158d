//! Why a session's owner died, and what it cost: the cause and the usage of an ending, as
//! the kernel showed them to the eBPF programs (`liveness-ebpf` reads its records into them).
//!
//! A cause is reported only when it was observed: a source that cannot see one says
//! `unknown` with the reason, and a signal whose sender was not seen has no sender.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::end::EndReason;
use crate::exit::{DetectedBy, ExitStatus};

/// Why a session ended, from its owner's side. JSON: `{"kind": "...", ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Cause {
    /// The owner exited by itself (`exit`, or a return from `main`).
    Exit { code: u8 },
    /// A signal killed the owner. `sender` is the process that sent it, `kernel` the reason
    /// when the kernel raised it; neither when the sender was not seen.
    Signal {
        signal: u8,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sender: Option<Sender>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kernel: Option<KernelReason>,
    },
    /// The kernel's OOM killer chose the owner.
    Oom {
        scope: OomScope,
        /// The memory cgroup whose limit was reached, as a path in its hierarchy.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cgroup: Option<String>,
    },
    /// The kernel sent SIGHUP: the owner's terminal hung up (a closed terminal or pty, a
    /// dropped SSH connection). A SIGHUP that a process sent is a `signal`.
    Hangup,
    /// The death was seen by a source that cannot tell why (pidfd, `/proc`, a re-check
    /// after a restart), or not seen at all.
    Unknown { reason: String },
    /// The owner did not die: the session was stopped, timed out or expired (`reason`).
    #[serde(rename = "none")]
    NoDeath,
}

/// The process that sent a killing signal, as it was when it sent it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sender {
    pub pid: u32,
    pub start_ticks: u64,
    pub comm: String,
    /// Its real uid.
    pub uid: u32,
    /// The session the sender belonged to (as its owner or a member of its tree), when
    /// every reader of this ending may see it: a session of the same creator, or any session
    /// when root created this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// A session a signal's sender belonged to, before it is shown to the readers of an ending
/// that may see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SenderSession {
    pub id: String,
    pub creator_uid: u32,
}

impl Cause {
    /// Names the sender's session in the cause of a session created by `creator_uid`: the
    /// first of `sessions` (those of the sender's tree) that everyone who reads that session
    /// may see, its creator and root. Another user's session id is never shown to a
    /// non-root reader.
    pub fn name_sender_session(&mut self, sessions: &[SenderSession], creator_uid: u32) {
        if let Cause::Signal {
            sender: Some(sender),
            ..
        } = self
        {
            sender.session = sessions
                .iter()
                .find(|session| session.creator_uid == creator_uid || creator_uid == 0)
                .map(|session| session.id.clone());
        }
    }
}

/// Why the kernel raised a signal by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelReason {
    /// A fault of the process: a bad memory access, an illegal instruction, a division by
    /// zero, a breakpoint.
    Fault,
    /// A system call that seccomp forbids.
    BadSystemCall,
    /// `RLIMIT_CPU`.
    CpuLimit,
    /// `RLIMIT_FSIZE`.
    FileSizeLimit,
    /// A write to a pipe or socket nobody reads.
    BrokenPipe,
    /// The terminal's interrupt or quit key.
    Terminal,
    /// A timer the process set.
    Timer,
    /// The process asked for this signal when its parent dies (`PR_SET_PDEATHSIG`), and the
    /// parent died.
    ParentDied,
    /// Its process group was left orphaned (no parent in another group of its session)
    /// with stopped members: the kernel sends such a group SIGHUP and SIGCONT.
    OrphanedGroup,
    /// Another reason.
    Other,
}

impl fmt::Display for KernelReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KernelReason::Fault => "a fault",
            KernelReason::BadSystemCall => "a forbidden system call",
            KernelReason::CpuLimit => "the CPU-time limit",
            KernelReason::FileSizeLimit => "the file-size limit",
            KernelReason::BrokenPipe => "a write to a closed pipe",
            KernelReason::Terminal => "the terminal's interrupt or quit key",
            KernelReason::Timer => "a timer",
            KernelReason::ParentDied => "its parent died",
            KernelReason::OrphanedGroup => "its process group was orphaned with stopped members",
            KernelReason::Other => "another reason",
        })
    }
}

/// What ran out of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OomScope {
    /// A memory cgroup of the owner (its own or an ancestor) was at its limit
    /// (`memory.max`, or `memory.limit_in_bytes` on v1) when the kernel killed it.
    Cgroup,
    /// None was: the whole machine ran out.
    Global,
    /// The kill was seen, not the limits at its moment (its SIGKILL was not).
    Unknown,
}

/// The kinds of [`Cause`], to filter and count endings by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CauseKind {
    Exit,
    Signal,
    Oom,
    Hangup,
    Unknown,
    None,
}

impl CauseKind {
    pub const ALL: [CauseKind; 6] = [
        CauseKind::Exit,
        CauseKind::Signal,
        CauseKind::Oom,
        CauseKind::Hangup,
        CauseKind::Unknown,
        CauseKind::None,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CauseKind::Exit => "exit",
            CauseKind::Signal => "signal",
            CauseKind::Oom => "oom",
            CauseKind::Hangup => "hangup",
            CauseKind::Unknown => "unknown",
            CauseKind::None => "none",
        }
    }
}

impl fmt::Display for CauseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CauseKind {
    type Err = String;

    fn from_str(s: &str) -> Result<CauseKind, String> {
        CauseKind::ALL
            .into_iter()
            .find(|kind| kind.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = CauseKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown cause {s:?}: expected one of {}", names.join(", "))
            })
    }
}

impl Cause {
    /// The cause of an ending that no kernel program explained: what its reason, source and
    /// status can say, and nothing more.
    pub fn unseen(
        reason: EndReason,
        detected_by: Option<DetectedBy>,
        status: Option<ExitStatus>,
    ) -> Cause {
        let unknown = |reason: &str| Cause::Unknown {
            reason: reason.to_owned(),
        };
        match reason {
            EndReason::Stopped | EndReason::Timeout | EndReason::PendingExpired => Cause::NoDeath,
            EndReason::Reboot => unknown("the machine rebooted"),
            EndReason::OwnerReused => {
                unknown("the owner died unseen: its pid belongs to another process now")
            }
            // A status from pidfd says how, not why: an exit code is a cause, a signal's
            // sender was not seen.
            // The status is the last member's: the same reading holds.
            EndReason::OwnerExited | EndReason::TreeExited => match (status, detected_by) {
                (Some(ExitStatus::Exited { code }), _) => Cause::Exit { code },
                (_, Some(DetectedBy::Ebpf)) => unknown("the eBPF record carried no status"),
                (_, Some(DetectedBy::Pidfd)) => {
                    unknown("seen through a pidfd, which does not show why a process died")
                }
                (_, Some(DetectedBy::Procpoll)) => {
                    unknown("seen missing from /proc, which does not show why a process died")
                }
                (_, Some(DetectedBy::Reconcile) | None) => {
                    unknown("found dead by a re-check, after the fact")
                }
            },
        }
    }

    pub fn kind(&self) -> CauseKind {
        match self {
            Cause::Exit { .. } => CauseKind::Exit,
            Cause::Signal { .. } => CauseKind::Signal,
            Cause::Oom { .. } => CauseKind::Oom,
            Cause::Hangup => CauseKind::Hangup,
            Cause::Unknown { .. } => CauseKind::Unknown,
            Cause::NoDeath => CauseKind::None,
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Exit { code } => write!(f, "exited with code {code}"),
            Cause::Signal {
                signal,
                sender: Some(sender),
                ..
            } => {
                write!(
                    f,
                    "killed by {} from {} (pid {}, uid {}",
                    SignalName(*signal),
                    sender.comm,
                    sender.pid,
                    sender.uid
                )?;
                if let Some(session) = &sender.session {
                    write!(f, ", session {session}")?;
                }
                f.write_str(")")
            }
            Cause::Signal {
                signal,
                kernel: Some(KernelReason::Other),
                ..
            } => write!(f, "killed by {} from the kernel", SignalName(*signal)),
            Cause::Signal {
                signal,
                kernel: Some(reason),
                ..
            } => write!(
                f,
                "killed by {} from the kernel ({reason})",
                SignalName(*signal)
            ),
            Cause::Signal { signal, .. } => {
                write!(f, "killed by {} (sender not seen)", SignalName(*signal))
            }
            Cause::Oom {
                scope: OomScope::Cgroup,
                cgroup,
            } => write!(
                f,
                "OOM-killed: cgroup {} reached its memory limit",
                cgroup.as_deref().unwrap_or("(removed)")
            ),
            Cause::Oom {
                scope: OomScope::Global,
                ..
            } => f.write_str("OOM-killed: the machine ran out of memory"),
            Cause::Oom { .. } => f.write_str("OOM-killed"),
            Cause::Hangup => f.write_str("hung up (terminal closed)"),
            Cause::Unknown { reason } => write!(f, "cause unknown: {reason}"),
            Cause::NoDeath => f.write_str("the owner did not die"),
        }
    }
}

/// A signal's name (`SIGTERM`, `SIGRTMIN+3`), or its number.
#[derive(Debug, Clone, Copy)]
pub struct SignalName(pub u8);

const SIGNAL_NAMES: [&str; 31] = [
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGILL",
    "SIGTRAP",
    "SIGABRT",
    "SIGBUS",
    "SIGFPE",
    "SIGKILL",
    "SIGUSR1",
    "SIGSEGV",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGTERM",
    "SIGSTKFLT",
    "SIGCHLD",
    "SIGCONT",
    "SIGSTOP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGVTALRM",
    "SIGPROF",
    "SIGWINCH",
    "SIGIO",
    "SIGPWR",
    "SIGSYS",
];

impl fmt::Display for SignalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            n @ 1..=31 => f.write_str(SIGNAL_NAMES[n as usize - 1]),
            n @ 34..=64 => write!(f, "SIGRTMIN+{}", n - 34),
            n => write!(f, "signal {n}"),
        }
    }
}

/// CPU time and peak memory of an ending's owner, from the kernel at its exit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub cpu_user_us: u64,
    pub cpu_system_us: u64,
    pub peak_rss_bytes: u64,
    /// The members of the owner's tree that exited while it was tracked. Members still
    /// running when it ended are not counted.
    pub members: MembersUsage,
}

/// The usage of a tree's members that exited: CPU time summed, the largest peak.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembersUsage {
    pub exited: u32,
    pub cpu_user_us: u64,
    pub cpu_system_us: u64,
    /// The largest peak resident memory among them.
    pub peak_rss_bytes: u64,
}

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CPU {} user + {} system, peak memory {}",
            Millis(self.cpu_user_us),
            Millis(self.cpu_system_us),
            Bytes(self.peak_rss_bytes)
        )?;
        let members = &self.members;
        if members.exited > 0 {
            write!(
                f,
                "; {} members that exited: CPU {} user + {} system, largest peak {}",
                members.exited,
                Millis(members.cpu_user_us),
                Millis(members.cpu_system_us),
                Bytes(members.peak_rss_bytes)
            )?;
        }
        Ok(())
    }
}

pub(crate) struct Millis(pub(crate) u64);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1} ms", self.0 as f64 / 1000.0)
    }
}

pub(crate) struct Bytes(pub(crate) u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MIB: f64 = 1024.0 * 1024.0;
        write!(f, "{:.1} MiB", self.0 as f64 / MIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_tagged_json_and_kinds_parse() {
        let json = serde_json::to_string(&Cause::Hangup).unwrap();
        assert_eq!(json, r#"{"kind":"hangup"}"#);
        assert_eq!(
            serde_json::to_string(&Cause::NoDeath).unwrap(),
            r#"{"kind":"none"}"#
        );
        for kind in CauseKind::ALL {
            assert_eq!(kind.name().parse::<CauseKind>(), Ok(kind));
        }
        assert!("bogus".parse::<CauseKind>().is_err());
        assert_eq!(SignalName(36).to_string(), "SIGRTMIN+2");
        let other = Cause::Signal {
            signal: 9,
            sender: None,
            kernel: Some(KernelReason::Other),
        };
        assert_eq!(other.to_string(), "killed by SIGKILL from the kernel");
    }
}
