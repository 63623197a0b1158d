//! How an exit record is read into the facts the daemon reports: the cause of a death and
//! what it cost ([`Cause`], [`Usage`] of the wire vocabulary), before the daemon names the
//! sender's session and the OOM cgroup's path.

use liveness_common::cause::{Cause, KernelReason, MembersUsage, OomScope, Sender, Usage};
use liveness_common::exit::ExitStatus;
use liveness_common::identity::ProcessKey;

use crate::record::{
    CAUSE_INFO_ON_STACK, CAUSE_LIMITS_READ, CAUSE_OOM_KILLER, CAUSE_OOM_MARKED, CAUSE_SAME_SESSION,
    CAUSE_SENDER_EXITING, CAUSE_SENDER_IN_TREE, CAUSE_SENDER_TTY_LEADER, EXIT_HAS_CAUSE,
    EXIT_HAS_MEMBERS, EXIT_OOM_VICTIM, ExitRecord, ORIGIN_NOINFO, ORIGIN_PRIV, ORIGIN_SIGINFO,
    SignalCause,
};

/// What an eBPF exit record says beyond the status.
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
/// `kill`'s `si_code`. Every code up to it is a process's (the kernel's `SI_FROMUSER`):
/// `rt_sigqueueinfo` lets a sender choose any of them, the kernel raises none of them but
/// `SI_TIMER`.
const SI_USER: i32 = 0;
/// A POSIX timer's expiry, queued by the kernel; also a code `rt_sigqueueinfo` accepts.
const SI_TIMER: i32 = -2;

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
        // Marked after its SIGKILL, which the victim may outrun: the killer on the stack of
        // the SIGKILL tells it too.
        let oom_marked = seen.is_some_and(|c| c.flags & (CAUSE_OOM_MARKED | CAUSE_OOM_KILLER) != 0);
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
        let raised = raised_by(signal, seen, record);
        if raised == Raiser::Process {
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
        } else if raised == Raiser::Terminal {
            facts.cause = Cause::Hangup;
        } else {
            facts.cause = Cause::Signal {
                signal,
                sender: None,
                kernel: Some(match raised {
                    Raiser::Kernel(reason) => reason,
                    _ => kernel_reason(signal, seen),
                }),
            };
        }
        facts
    }
}

/// Who raised a signal, as far as its record tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Raiser {
    /// A process: `current` when it was queued.
    Process,
    /// The kernel, for a terminal's hang-up.
    Terminal,
    /// The kernel, for this reason.
    Kernel(KernelReason),
    /// The kernel, for the reason its number and code say.
    KernelBySignal,
}

fn raised_by(signal: u8, cause: &SignalCause, record: &ExitRecord) -> Raiser {
    let from_itself =
        cause.sender_tgid == record.tgid && cause.sender_start_ticks == record.start_ticks;
    let flag = |bit| cause.flags & bit != 0;
    match cause.origin {
        ORIGIN_SIGINFO
            if cause.code <= SI_USER && (cause.code != SI_TIMER || flag(CAUSE_INFO_ON_STACK)) =>
        {
            Raiser::Process
        }
        // forget_original_parent: the exiting parent sends the death signal it was asked for.
        ORIGIN_NOINFO if flag(CAUSE_SENDER_EXITING) && !from_itself => {
            Raiser::Kernel(KernelReason::ParentDied)
        }
        // kill_orphaned_pgrp, from an exiting process of the session that no longer holds a
        // terminal; a session leader hanging up its terminal at exit still does.
        ORIGIN_PRIV
            if signal == SIGHUP
                && flag(CAUSE_SENDER_EXITING)
                && flag(CAUSE_SAME_SESSION)
                && !flag(CAUSE_SENDER_TTY_LEADER) =>
        {
            Raiser::Kernel(KernelReason::OrphanedGroup)
        }
        ORIGIN_PRIV | ORIGIN_NOINFO if signal == SIGHUP => Raiser::Terminal,
        // The CPU-time limits' SIGKILL is raised at a tick of the process itself. The OOM
        // killer's, in the allocating process, was told apart before (by its mark, or by the
        // killer on the stack), and leaves a memory cgroup at its limit.
        ORIGIN_PRIV if signal == SIGKILL && from_itself && cause.oom_cgroup_id == 0 => {
            Raiser::Kernel(KernelReason::CpuLimit)
        }
        _ => Raiser::KernelBySignal,
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
    use liveness_common::cause::CauseKind;

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
    fn every_code_up_to_si_user_names_its_sender() {
        let cause = |signal, code, flags| {
            let mut raw = record(u32::from(signal), ORIGIN_SIGINFO, code, EXIT_HAS_CAUSE);
            raw.cause.flags |= flags;
            KernelFacts::of_record(&raw, killed(signal), 4096).cause
        };
        // SI_QUEUE, SI_MESGQ, SI_ASYNCIO, SI_SIGIO, SI_TKILL, SI_DETHREAD, and beyond.
        for code in [-1, -3, -4, -5, -6, -7, -60] {
            for signal in [1, 9, 11] {
                assert!(
                    matches!(
                        cause(signal, code, 0),
                        Cause::Signal {
                            sender: Some(_),
                            kernel: None,
                            ..
                        }
                    ),
                    "si_code {code}"
                );
            }
        }
        // SI_TIMER: a POSIX timer's, unless a system call built it.
        assert!(matches!(
            cause(9, SI_TIMER, 0),
            Cause::Signal {
                kernel: Some(KernelReason::Timer),
                ..
            }
        ));
        assert!(matches!(
            cause(9, SI_TIMER, CAUSE_INFO_ON_STACK),
            Cause::Signal {
                sender: Some(_),
                ..
            }
        ));
        // A kernel code the process sent itself is its own lie about itself.
        assert_eq!(
            cause(11, 1, 0).to_string(),
            "killed by SIGSEGV from the kernel (a fault)"
        );
    }

    #[test]
    fn the_kernels_sighups_are_told_apart() {
        let cause = |origin, flags| {
            let mut raw = record(1, origin, 0, EXIT_HAS_CAUSE);
            raw.cause.flags |= flags;
            KernelFacts::of_record(&raw, killed(1), 4096).cause
        };
        let kernel = |reason| Cause::Signal {
            signal: 1,
            sender: None,
            kernel: Some(reason),
        };
        assert_eq!(
            cause(ORIGIN_NOINFO, CAUSE_SENDER_EXITING),
            kernel(KernelReason::ParentDied)
        );
        let orphaned = CAUSE_SENDER_EXITING | CAUSE_SAME_SESSION;
        assert_eq!(
            cause(ORIGIN_PRIV, orphaned),
            kernel(KernelReason::OrphanedGroup)
        );
        // A session leader hanging up its terminal as it exits; a pty's master closed.
        assert_eq!(
            cause(ORIGIN_PRIV, orphaned | CAUSE_SENDER_TTY_LEADER),
            Cause::Hangup
        );
        assert_eq!(cause(ORIGIN_PRIV, 0), Cause::Hangup);
        assert_eq!(
            kernel(KernelReason::OrphanedGroup).to_string(),
            "killed by SIGHUP from the kernel (its process group was orphaned with stopped members)"
        );
    }

    #[test]
    fn a_sigkill_the_process_raised_at_its_own_tick_is_the_cpu_limit() {
        let mut raw = record(9, ORIGIN_PRIV, 0, EXIT_HAS_CAUSE);
        let other = KernelFacts::of_record(&raw, killed(9), 4096).cause;
        assert_eq!(other.to_string(), "killed by SIGKILL from the kernel");
        (raw.cause.sender_tgid, raw.cause.sender_start_ticks) = (raw.tgid, raw.start_ticks);
        assert_eq!(
            KernelFacts::of_record(&raw, killed(9), 4096)
                .cause
                .to_string(),
            "killed by SIGKILL from the kernel (the CPU-time limit)"
        );
        // In a memory cgroup at its limit: not claimed to be the CPU limit.
        raw.cause.oom_cgroup_id = 5;
        assert_eq!(KernelFacts::of_record(&raw, killed(9), 4096).cause, other);
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
        // The OOM killer's SIGKILL, not (yet) marked: a victim that outran its mark, or a
        // process that shares the victim's memory.
        let mut killer = record(9, ORIGIN_PRIV, 0, EXIT_HAS_CAUSE);
        killer.cause.flags |= CAUSE_OOM_KILLER | CAUSE_LIMITS_READ;
        killer.cause.oom_cgroup_id = 77;
        let facts = KernelFacts::of_record(&killer, killed(9), 4096);
        assert_eq!(
            (facts.cause.kind(), facts.oom_cgroup_id),
            (CauseKind::Oom, Some(77))
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
}
