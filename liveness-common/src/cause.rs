//! Why a session's owner died, and what it cost: the cause and the usage of an ending, as
//! the kernel showed them to the eBPF programs, and how an exit record is read into them.
//!
//! A cause is reported only when it was observed: a source that cannot see one says
//! `unknown` with the reason, and a signal whose sender was not seen has no sender.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::end::EndReason;
use crate::exit::{DetectedBy, ExitStatus};
use crate::identity::ProcessKey;
use crate::record::{
    CAUSE_LIMITS_READ, CAUSE_OOM_MARKED, CAUSE_SENDER_IN_TREE, EXIT_HAS_CAUSE, EXIT_HAS_MEMBERS,
    EXIT_OOM_VICTIM, ExitRecord, ORIGIN_SIGINFO, SignalCause,
};

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
            KernelReason::Other => "the kernel",
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

struct Millis(u64);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1} ms", self.0 as f64 / 1000.0)
    }
}

struct Bytes(u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MIB: f64 = 1024.0 * 1024.0;
        write!(f, "{:.1} MiB", self.0 as f64 / MIB)
    }
}

/// What an eBPF exit record says beyond the status, before the daemon names the sender's
/// session and the OOM cgroup's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFacts {
    pub cause: Cause,
    pub usage: Usage,
    /// The root of the tree the sender belonged to when it sent the signal.
    pub sender_root: Option<ProcessKey>,
    /// The kernfs id of the memory cgroup whose limit the OOM kill answered.
    pub oom_cgroup_id: Option<u64>,
}

const SIGHUP: u8 = 1;
const SIGKILL: u8 = 9;
/// `si_code` values of signals a process sends: `kill`, `sigqueue`, a message queue's
/// notification, `tgkill`. Every other value is the kernel's.
const SI_USER: i32 = 0;
const SI_QUEUE: i32 = -1;
const SI_TIMER: i32 = -2;
const SI_MESGQ: i32 = -3;
const SI_TKILL: i32 = -6;

impl KernelFacts {
    /// Reads an exit record whose status is `status`; `page_size` turns pages into bytes.
    pub fn of_record(record: &ExitRecord, status: ExitStatus, page_size: u64) -> KernelFacts {
        let members = if record.flags & EXIT_HAS_MEMBERS != 0 {
            let tree = &record.members;
            let (cpu_user_us, cpu_system_us) = cpu_times(&tree.total);
            MembersUsage {
                exited: tree.exited,
                cpu_user_us,
                cpu_system_us,
                peak_rss_bytes: tree.total.peak_rss_pages.saturating_mul(page_size),
            }
        } else {
            MembersUsage::default()
        };
        let (cpu_user_us, cpu_system_us) = cpu_times(&record.usage);
        let usage = Usage {
            cpu_user_us,
            cpu_system_us,
            peak_rss_bytes: record.usage.peak_rss_pages.saturating_mul(page_size),
            members,
        };
        let signal = match status {
            ExitStatus::Exited { code } => {
                return KernelFacts {
                    cause: Cause::Exit { code },
                    usage,
                    sender_root: None,
                    oom_cgroup_id: None,
                };
            }
            ExitStatus::Signaled { signal, .. } => signal,
        };
        // The last killing signal queued is the one that killed, if its number is that one.
        let seen = (record.flags & EXIT_HAS_CAUSE != 0 && record.cause.signal == u32::from(signal))
            .then_some(&record.cause);
        let oom_marked = seen.is_some_and(|c| c.flags & CAUSE_OOM_MARKED != 0);
        let mut facts = KernelFacts {
            cause: Cause::Signal {
                signal,
                sender: None,
                kernel: None,
            },
            usage,
            sender_root: None,
            oom_cgroup_id: None,
        };
        if signal == SIGKILL && (record.flags & EXIT_OOM_VICTIM != 0 || oom_marked) {
            let scope_known = seen.filter(|c| c.flags & CAUSE_LIMITS_READ != 0);
            let scope = match scope_known.map(|c| c.oom_cgroup_id) {
                Some(0) => OomScope::Global,
                Some(id) => {
                    facts.oom_cgroup_id = Some(id);
                    OomScope::Cgroup
                }
                None => OomScope::Unknown,
            };
            facts.cause = Cause::Oom {
                scope,
                cgroup: None,
            };
            return facts;
        }
        let Some(seen) = seen else {
            return facts;
        };
        if sent_by_a_process(seen) {
            facts.cause = Cause::Signal {
                signal,
                sender: Some(Sender {
                    pid: seen.sender_tgid,
                    start_ticks: seen.sender_start_ticks,
                    comm: comm(&seen.sender_comm),
                    uid: seen.sender_uid,
                    session: None,
                }),
                kernel: None,
            };
            facts.sender_root = (seen.flags & CAUSE_SENDER_IN_TREE != 0).then_some(ProcessKey {
                pid: seen.sender_root_tgid,
                start_ticks: seen.sender_root_start_ticks,
            });
        } else if signal == SIGHUP {
            facts.cause = Cause::Hangup;
        } else {
            facts.cause = Cause::Signal {
                signal,
                sender: None,
                kernel: Some(kernel_reason(signal, seen)),
            };
        }
        facts
    }
}

/// User and system time in microseconds: the exact runtime split in the proportion of the
/// tick samples, as `getrusage` reports them (samples alone miss what ran between ticks).
fn cpu_times(usage: &crate::record::Usage) -> (u64, u64) {
    let sampled = u128::from(usage.user_ns) + u128::from(usage.system_ns);
    let runtime = u128::from(usage.runtime_ns);
    // No sample at all: it ran between ticks, counted as user time.
    let system = (runtime * u128::from(usage.system_ns))
        .checked_div(sampled)
        .unwrap_or(0);
    let micros = |ns: u128| u64::try_from(ns / 1000).unwrap_or(u64::MAX);
    (micros(runtime - system), micros(system))
}

/// Whether a process sent the signal (then `current` was its sender) rather than the kernel.
fn sent_by_a_process(cause: &SignalCause) -> bool {
    cause.origin == ORIGIN_SIGINFO && matches!(cause.code, SI_USER | SI_QUEUE | SI_MESGQ | SI_TKILL)
}

fn kernel_reason(signal: u8, cause: &SignalCause) -> KernelReason {
    const SIGINT: u8 = 2;
    const SIGQUIT: u8 = 3;
    const SIGILL: u8 = 4;
    const SIGTRAP: u8 = 5;
    const SIGBUS: u8 = 7;
    const SIGFPE: u8 = 8;
    const SIGSEGV: u8 = 11;
    const SIGPIPE: u8 = 13;
    const SIGALRM: u8 = 14;
    const SIGXCPU: u8 = 24;
    const SIGXFSZ: u8 = 25;
    const SIGVTALRM: u8 = 26;
    const SIGPROF: u8 = 27;
    const SIGSYS: u8 = 31;
    if cause.origin == ORIGIN_SIGINFO && cause.code == SI_TIMER {
        return KernelReason::Timer;
    }
    match signal {
        SIGSEGV | SIGBUS | SIGILL | SIGFPE | SIGTRAP => KernelReason::Fault,
        SIGSYS => KernelReason::BadSystemCall,
        SIGXCPU => KernelReason::CpuLimit,
        SIGXFSZ => KernelReason::FileSizeLimit,
        SIGPIPE => KernelReason::BrokenPipe,
        SIGINT | SIGQUIT => KernelReason::Terminal,
        SIGALRM | SIGVTALRM | SIGPROF => KernelReason::Timer,
        _ => KernelReason::Other,
    }
}

/// A NUL-padded command name.
fn comm(bytes: &[u8; 16]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{CAUSE_SIGNAL, ORIGIN_NOINFO, ORIGIN_PRIV, TreeUsage, Usage as Raw};

    fn record(signal: u32, origin: u16, code: i32, flags: u32) -> ExitRecord {
        let mut sender_comm = [0u8; 16];
        sender_comm[..4].copy_from_slice(b"kill");
        ExitRecord {
            start_ticks: 1,
            exit_monotonic_ns: 2,
            tgid: 3,
            wait_status: 0,
            usage: Raw {
                user_ns: 296_000_000,
                system_ns: 4_000_000,
                runtime_ns: 310_000_000,
                peak_rss_pages: 10,
            },
            members: TreeUsage {
                root_start_ticks: 1,
                total: Raw {
                    user_ns: 0,
                    system_ns: 0,
                    runtime_ns: 5_000,
                    peak_rss_pages: 2,
                },
                exited: 2,
                pad: 0,
            },
            cause: SignalCause {
                target_start_ticks: 1,
                sender_start_ticks: 77,
                sender_root_start_ticks: 50,
                oom_cgroup_id: 0,
                sender_tgid: 4121,
                sender_uid: 1000,
                sender_root_tgid: 4000,
                code,
                signal,
                origin,
                flags: CAUSE_SIGNAL | CAUSE_SENDER_IN_TREE,
                sender_comm,
            },
            flags,
            pad: 0,
        }
    }

    fn killed(signal: u8) -> ExitStatus {
        ExitStatus::Signaled {
            signal,
            core_dumped: false,
        }
    }

    #[test]
    fn a_process_sender_is_named_with_its_tree() {
        let facts = KernelFacts::of_record(
            &record(
                15,
                ORIGIN_SIGINFO,
                SI_USER,
                EXIT_HAS_CAUSE | EXIT_HAS_MEMBERS,
            ),
            killed(15),
            4096,
        );
        assert_eq!(
            facts.cause.to_string(),
            "killed by SIGTERM from kill (pid 4121, uid 1000)"
        );
        assert_eq!(
            facts.sender_root,
            Some(ProcessKey {
                pid: 4000,
                start_ticks: 50
            })
        );
        // 310 ms ran, 296 of 300 sampled ms in user mode.
        assert_eq!(
            (facts.usage.cpu_user_us, facts.usage.cpu_system_us),
            (305_866, 4_133)
        );
        // Between ticks: all of it counted as user time.
        assert_eq!(facts.usage.members.cpu_user_us, 5);
        assert_eq!(facts.usage.peak_rss_bytes, 40_960);
        assert_eq!(facts.usage.members.exited, 2);
        assert_eq!(facts.usage.members.peak_rss_bytes, 8192);
    }

    #[test]
    fn kernel_raised_signals_say_why() {
        let kernel = |signal, origin, code| {
            KernelFacts::of_record(
                &record(u32::from(signal), origin, code, EXIT_HAS_CAUSE),
                killed(signal),
                4096,
            )
            .cause
        };
        assert_eq!(kernel(1, ORIGIN_PRIV, 0), Cause::Hangup);
        assert_eq!(
            kernel(11, ORIGIN_SIGINFO, 1).to_string(),
            "killed by SIGSEGV from the kernel (a fault)"
        );
        for (signal, reason) in [(24, KernelReason::CpuLimit), (13, KernelReason::BrokenPipe)] {
            for origin in [ORIGIN_PRIV, ORIGIN_NOINFO] {
                assert!(matches!(
                    kernel(signal, origin, 0),
                    Cause::Signal { kernel: Some(r), sender: None, .. } if r == reason
                ));
            }
        }
        // A SIGHUP that a process sent is not a hang-up.
        assert!(matches!(
            kernel(1, ORIGIN_SIGINFO, SI_USER),
            Cause::Signal {
                sender: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn only_observed_facts_are_reported() {
        // The last signal seen is not the one that killed: its sender is not claimed.
        let cause = KernelFacts::of_record(
            &record(15, ORIGIN_SIGINFO, SI_USER, EXIT_HAS_CAUSE),
            killed(9),
            4096,
        )
        .cause;
        assert_eq!(cause.to_string(), "killed by SIGKILL (sender not seen)");
        // An exit is an exit, whatever was sent before.
        let facts = KernelFacts::of_record(
            &record(15, ORIGIN_SIGINFO, SI_USER, EXIT_HAS_CAUSE),
            ExitStatus::Exited { code: 3 },
            4096,
        );
        assert_eq!(facts.cause, Cause::Exit { code: 3 });
        assert_eq!(facts.sender_root, None);
    }

    #[test]
    fn oom_kills_name_their_scope() {
        let mut oom = record(9, ORIGIN_PRIV, 0, EXIT_HAS_CAUSE | EXIT_OOM_VICTIM);
        oom.cause.flags |= CAUSE_OOM_MARKED | CAUSE_LIMITS_READ;
        oom.cause.oom_cgroup_id = 1234;
        let facts = KernelFacts::of_record(&oom, killed(9), 4096);
        assert_eq!(facts.oom_cgroup_id, Some(1234));
        assert_eq!(facts.cause.kind(), CauseKind::Oom);
        oom.cause.oom_cgroup_id = 0;
        let facts = KernelFacts::of_record(&oom, killed(9), 4096);
        assert_eq!(
            facts.cause.to_string(),
            "OOM-killed: the machine ran out of memory"
        );
        // The victim flag alone: an OOM kill of unknown scope.
        let facts =
            KernelFacts::of_record(&record(9, ORIGIN_PRIV, 0, EXIT_OOM_VICTIM), killed(9), 4096);
        assert_eq!(
            facts.cause,
            Cause::Oom {
                scope: OomScope::Unknown,
                cgroup: None
            }
        );
    }

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
    }
}
