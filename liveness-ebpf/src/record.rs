//! The ring-buffer record and map names shared with the eBPF programs (C, in
//! `bpf/liveness.h`). Every layout here is mirrored by hand in that header; the tests below
//! pin the Rust side and compare it with the committed object's BTF, so the two cannot
//! drift apart. Plain `core` only, so a Rust eBPF program could use it as it is.

/// Name of the `tp_btf/sched_process_exit` program in the object. The kernel keeps 15
/// bytes of a program's name: both names fit, so `bpftool prog` tells them apart.
pub const EXIT_PROGRAM_NAME: &str = "liveness_exit";
/// Name of the `tp_btf/sched_process_fork` program in the object.
pub const FORK_PROGRAM_NAME: &str = "liveness_fork";
/// Name of the `tp_btf/sched_process_fork` program that records every new process's
/// lineage; it and [`LINEAGE_EXIT_PROGRAM_NAME`] may be pinned, and outlive the daemon.
pub const LINEAGE_FORK_PROGRAM_NAME: &str = "lineage_fork";
/// Name of the `tp_btf/sched_process_exit` program that deletes an exited process's lineage.
pub const LINEAGE_EXIT_PROGRAM_NAME: &str = "lineage_exit";
/// Name of the `tp_btf/signal_generate` program: the senders of killing signals.
pub const SIGNAL_PROGRAM_NAME: &str = "liveness_signal";
/// Name of the `tp_btf/mark_victim` program: the OOM killer's victims.
pub const OOM_PROGRAM_NAME: &str = "liveness_oom";
/// Name of the `tp_btf/cgroup_attach_task` program: the cgroup moves of tracked processes
/// and members.
pub const MOVE_PROGRAM_NAME: &str = "liveness_move";
/// Every program of the object, by name.
pub const PROGRAM_NAMES: [&str; 7] = [
    EXIT_PROGRAM_NAME,
    FORK_PROGRAM_NAME,
    LINEAGE_FORK_PROGRAM_NAME,
    LINEAGE_EXIT_PROGRAM_NAME,
    SIGNAL_PROGRAM_NAME,
    OOM_PROGRAM_NAME,
    MOVE_PROGRAM_NAME,
];
/// Hash map `u32 tgid -> SignalCause` of the last killing signal sent to each tracked process.
pub const MAP_CAUSES: &str = "causes";
/// Hash map `u32 root tgid -> TreeUsage` of the members of each tree that exited.
pub const MAP_TREE_USAGES: &str = "tree_usages";
/// Hash map `u32 tgid -> MemberRecord` of the processes descended from tracked ones, and
/// of the tracked processes themselves (each the root of its own tree).
pub const MAP_MEMBERS: &str = "members";
/// Array of one `u64`, mapped into user space: the members map's entries flagged
/// [`MEMBER_FLAG_COUNTED`], which the fork program keeps at most `max_members`.
pub const MAP_MEMBER_SLOTS: &str = "member_slots";
/// `u64` counters of the members map, indexed by the `MEMBER_COUNTER_*` constants, which
/// every CPU adds to atomically and the daemon maps (`BPF_F_MMAPABLE`).
pub const MAP_MEMBER_COUNTERS: &str = "member_counters";
/// Array of [`UID_BUCKETS`] shares, each three `u64` (`UID_SHARE_*`), mapped into user
/// space: per bucket of uids, its share of the member slots, which the fork program keeps at
/// most `max_members_per_uid` for any uid but root.
pub const MAP_UID_SHARES: &str = "uid_shares";
/// [`MAP_UID_SHARES`]: the counted entries whose uid falls in the bucket.
pub const UID_SHARE_USED: u32 = 0;
/// [`MAP_UID_SHARES`]: the forks refused because the bucket's share was taken.
pub const UID_SHARE_REFUSED: u32 = 1;
/// [`MAP_UID_SHARES`]: the uid last refused.
pub const UID_SHARE_LAST_REFUSED: u32 = 2;
/// The `u64` slots of one share.
pub const UID_SHARE_SLOTS: u32 = 3;
/// Hash map `u32 tgid -> Lineage` of every live process forked since the programs were
/// loaded: the fork program writes it, the exit program deletes it.
pub const MAP_LINEAGES: &str = "lineages";
/// Hash map `u32 tgid -> u64 expected start_ticks` of tracked processes.
pub const MAP_TRACKED: &str = "tracked";
/// Ring buffer carrying one [`ExitRecord`] per tracked process death.
pub const MAP_EXITS: &str = "exits";
/// Ring buffer carrying one [`MoveRecord`] per cgroup move of a tracked process or member.
pub const MAP_MOVES: &str = "moves";
/// `u64` counters, indexed by the `COUNTER_*` constants, as the members map's are.
pub const MAP_COUNTERS: &str = "counters";

/// Records written into the ring buffer.
pub const COUNTER_EMITTED: u32 = 0;
/// Deaths of tracked processes that could not be reported because the ring buffer was full.
pub const COUNTER_LOST: u32 = 1;
/// Signals to tracked processes whose sender could not be kept: the causes map was full.
pub const COUNTER_CAUSES_LOST: u32 = 2;
/// Exits of tree members whose usage could not be added: the tree usage map was full.
pub const COUNTER_USAGE_LOST: u32 = 3;
/// Number of slots in the counters map.
pub const COUNTER_SLOTS: u32 = 4;

/// New processes of a tree that the kernel could not add: every member slot was taken, or
/// an entry for an earlier process with the pid was in the way.
pub const MEMBER_COUNTER_FULL: u32 = 0;
/// New processes the kernel added to a tree: unchanged since a walk of the map means the
/// walk saw every member the kernel added.
pub const MEMBER_COUNTER_ADDED: u32 = 1;
/// Number of slots in the member counters map.
pub const MEMBER_COUNTER_SLOTS: u32 = 2;

/// [`MemberRecord::flags`]: the entry holds one of the `max_members` slots and one of its
/// uid's share (every member's entry, and a tracked process's entry made from its entry as
/// a member).
pub const MEMBER_FLAG_COUNTED: u32 = 1;

/// Uids share a budget of member slots when equal modulo this (the buckets of
/// [`MAP_UID_SLOTS`]): every uid below it has its own.
pub const UID_BUCKETS: u32 = 4096;

/// The ancestors a [`Lineage`] keeps.
pub const LINEAGE_DEPTH: usize = 8;

/// One ancestor of a [`Lineage`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ancestor {
    pub start_ticks: u64,
    /// 0 past the last ancestor known.
    pub tgid: u32,
    pub pad: u32,
}

/// A process's start time and its ancestors when it was forked, nearest first, whatever
/// they became since: the value of the lineages map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lineage {
    pub start_ticks: u64,
    pub ancestors: [Ancestor; LINEAGE_DEPTH],
}

/// One member of a process tree: a process forked, directly or not, by a tracked process
/// (the tree's root), or a tracked process itself (its own root). The value of the members
/// map, whose key is the process's tgid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemberRecord {
    /// The member's start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_ticks: u64,
    /// The root's start time, with `root_tgid` the key of the tree it belongs to.
    pub root_start_ticks: u64,
    pub root_tgid: u32,
    /// `MEMBER_FLAG_*` bits.
    pub flags: u32,
    /// The uid whose share a counted entry holds: its forker's real uid.
    pub uid: u32,
    /// Keeps the size a multiple of eight on both sides.
    pub pad: u32,
}

/// [`SignalCause::flags`]: a signal was recorded.
pub const CAUSE_SIGNAL: u16 = 1;
/// [`SignalCause::flags`]: the sender belonged to a tree, rooted at `sender_root_*`.
pub const CAUSE_SENDER_IN_TREE: u16 = 2;
/// [`SignalCause::flags`]: the `mark_victim` program saw the OOM killer choose the process.
pub const CAUSE_OOM_MARKED: u16 = 4;
/// [`SignalCause::flags`]: the kernel sent SIGKILL and the target's memory cgroups' limits
/// were read then: `oom_cgroup_id` is the one at its limit, or 0.
pub const CAUSE_LIMITS_READ: u16 = 8;
/// [`SignalCause::flags`]: the sender was exiting (`PF_EXITING`): a parent's death signal,
/// an orphaned process group's SIGHUP, a session leader's hang-up of its terminal.
pub const CAUSE_SENDER_EXITING: u16 = 16;
/// [`SignalCause::flags`]: the sender led its session and still held its terminal (or the
/// foreground group of one that hung up).
pub const CAUSE_SENDER_TTY_LEADER: u16 = 32;
/// [`SignalCause::flags`]: the sender was in the target's session.
pub const CAUSE_SAME_SESSION: u16 = 64;
/// [`SignalCause::flags`]: the siginfo lay on the sender's kernel stack: a system call
/// built it (`rt_sigqueueinfo`), not a POSIX timer.
pub const CAUSE_INFO_ON_STACK: u16 = 128;
/// [`SignalCause::flags`]: the OOM killer sent this SIGKILL (its `__oom_kill_process` was
/// on the kernel stack): to its victim, or to a process sharing the victim's memory.
pub const CAUSE_OOM_KILLER: u16 = 256;
/// [`SignalCause::flags`]: the signal was sent to one thread (`tgkill`, `abort`, a fault),
/// not to the process.
pub const CAUSE_THREAD_DIRECTED: u16 = 512;

/// [`SignalCause::origin`]: the sender passed a siginfo, whose `si_code` is in `code`.
pub const ORIGIN_SIGINFO: u16 = 0;
/// [`SignalCause::origin`]: `SEND_SIG_NOINFO`, a signal the kernel sends on the current
/// task's behalf (`SIGPIPE`, `SIGXFSZ`, a parent-death signal).
pub const ORIGIN_NOINFO: u16 = 1;
/// [`SignalCause::origin`]: `SEND_SIG_PRIV`, a signal the kernel raises itself (a terminal's
/// hang-up, a CPU-time limit, the OOM killer).
pub const ORIGIN_PRIV: u16 = 2;

/// [`ExitRecord::flags`]: `cause` holds the last killing signal sent to the process.
pub const EXIT_HAS_CAUSE: u32 = 1;
/// [`ExitRecord::flags`]: `members` holds the usage of its tree's members that exited.
pub const EXIT_HAS_MEMBERS: u32 = 2;
/// [`ExitRecord::flags`]: the OOM killer chose the process (`signal->oom_mm` was set).
pub const EXIT_OOM_VICTIM: u32 = 4;

/// CPU time and peak resident memory, of one process or summed over a tree's members. The
/// user and system times are samples taken at ticks, the runtime is exact: the kernel's
/// `getrusage` splits the runtime in the samples' proportion, and so does the daemon.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub user_ns: u64,
    pub system_ns: u64,
    pub runtime_ns: u64,
    /// Of one process; over a tree's members, the largest member's.
    pub peak_rss_pages: u64,
}

/// The members of a tracked process's tree that exited while it was tracked.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeUsage {
    pub root_start_ticks: u64,
    pub total: Usage,
    pub exited: u32,
    pub pad: u32,
}

/// The last signal that kills by default sent to a tracked process, as the `signal_generate`
/// program saw it queued: the sender is the task that was running (`current`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SignalCause {
    pub target_start_ticks: u64,
    pub sender_start_ticks: u64,
    pub sender_root_start_ticks: u64,
    /// With [`CAUSE_LIMITS_READ`]: the kernfs id (inode number) of the nearest memory
    /// cgroup of the target within one charge of its limit when the kernel sent SIGKILL;
    /// 0 when none was (an OOM kill then answered the machine's memory).
    pub oom_cgroup_id: u64,
    pub sender_tgid: u32,
    pub sender_uid: u32,
    pub sender_root_tgid: u32,
    /// `si_code`, when `origin` is [`ORIGIN_SIGINFO`].
    pub code: i32,
    pub signal: u32,
    /// `ORIGIN_*`.
    pub origin: u16,
    /// `CAUSE_*` bits.
    pub flags: u16,
    /// The sender's command name, NUL-padded.
    pub sender_comm: [u8; 16],
}

/// The death of a tracked process, as the eBPF program reports it.
///
/// Emitted exactly once per process, when its last thread exits.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitRecord {
    /// Start time in clock ticks since boot: the same value as `/proc/<pid>/stat` field 22.
    pub start_ticks: u64,
    /// `CLOCK_MONOTONIC` nanoseconds when the last thread passed `sched_process_exit`.
    pub exit_monotonic_ns: u64,
    /// The process id (thread-group id).
    pub tgid: u32,
    /// The status exactly as `wait(2)` reports it to the parent.
    pub wait_status: u32,
    /// The process's own usage, at its exit.
    pub usage: Usage,
    /// With [`EXIT_HAS_MEMBERS`].
    pub members: TreeUsage,
    /// With [`EXIT_HAS_CAUSE`].
    pub cause: SignalCause,
    /// `EXIT_*` bits.
    pub flags: u32,
    pub pad: u32,
}

impl ExitRecord {
    /// Size of one record in the ring buffer.
    pub const SIZE: usize = core::mem::size_of::<Self>();

    /// Reads a record from ring-buffer bytes; `None` if the slice is too short.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        // SAFETY: plain old data, every field an integer or an array of them.
        unsafe { read_record(bytes) }
    }
}

/// Reads a `T` from the start of ring-buffer bytes; `None` if the slice is too short.
///
/// # Safety
///
/// Every bit pattern of `T`'s size must be a valid `T` (plain old data).
unsafe fn read_record<T: Copy>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < core::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: the length was checked, the caller vouches for the bit patterns, and
    // `read_unaligned` tolerates any alignment of the ring-buffer slot.
    Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// A tracked process or a member, of the tree rooted at `root_tgid`, moved into another
/// cgroup of the unified hierarchy (a write to a `cgroup.procs` or `cgroup.threads`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoveRecord {
    pub start_ticks: u64,
    pub root_start_ticks: u64,
    /// The kernfs id (inode number) of the destination cgroup.
    pub cgroup_id: u64,
    pub tgid: u32,
    pub root_tgid: u32,
}

impl MoveRecord {
    /// Reads a record from ring-buffer bytes; `None` if the slice is too short.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        // SAFETY: plain old data, every field an integer.
        unsafe { read_record(bytes) }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn program_names_fit_the_kernels_and_differ() {
        let names = PROGRAM_NAMES;
        for name in names {
            assert!(name.len() <= 15, "{name} is cut to 15 bytes by the kernel");
        }
        let distinct: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), names.len());
    }

    use super::*;
    use core::mem::{offset_of, size_of};

    /// The same numbers are asserted by `_Static_assert` in `liveness.h`.
    #[test]
    fn exit_record_layout_is_pinned() {
        assert_eq!(size_of::<ExitRecord>(), 184);
        assert_eq!(offset_of!(ExitRecord, start_ticks), 0);
        assert_eq!(offset_of!(ExitRecord, exit_monotonic_ns), 8);
        assert_eq!(offset_of!(ExitRecord, tgid), 16);
        assert_eq!(offset_of!(ExitRecord, wait_status), 20);
        assert_eq!(offset_of!(ExitRecord, usage), 24);
        assert_eq!(offset_of!(ExitRecord, members), 56);
        assert_eq!(offset_of!(ExitRecord, cause), 104);
        assert_eq!(offset_of!(ExitRecord, flags), 176);
        assert_eq!(size_of::<Usage>(), 32);
        assert_eq!(size_of::<TreeUsage>(), 48);
        assert_eq!(offset_of!(TreeUsage, total), 8);
        assert_eq!(offset_of!(TreeUsage, exited), 40);
        assert_eq!(size_of::<SignalCause>(), 72);
        assert_eq!(offset_of!(SignalCause, sender_tgid), 32);
        assert_eq!(offset_of!(SignalCause, signal), 48);
        assert_eq!(offset_of!(SignalCause, origin), 52);
        assert_eq!(offset_of!(SignalCause, sender_comm), 56);
    }

    /// The same numbers are asserted by `_Static_assert` in `liveness.h`.
    #[test]
    fn member_record_layout_is_pinned() {
        assert_eq!(size_of::<MemberRecord>(), 32);
        assert_eq!(size_of::<Ancestor>(), 16);
        assert_eq!(size_of::<Lineage>(), 8 + 16 * LINEAGE_DEPTH);
        assert_eq!(offset_of!(MemberRecord, start_ticks), 0);
        assert_eq!(offset_of!(MemberRecord, root_start_ticks), 8);
        assert_eq!(offset_of!(MemberRecord, root_tgid), 16);
        assert_eq!(offset_of!(MemberRecord, flags), 20);
        assert_eq!(offset_of!(MemberRecord, uid), 24);
    }

    /// The same numbers are asserted by `_Static_assert` in `liveness.h`.
    #[test]
    fn move_record_layout_is_pinned() {
        assert_eq!(size_of::<MoveRecord>(), 32);
        assert_eq!(offset_of!(MoveRecord, cgroup_id), 16);
        assert_eq!(offset_of!(MoveRecord, tgid), 24);
        assert_eq!(offset_of!(MoveRecord, root_tgid), 28);
        let mut bytes = [0u8; 32];
        bytes[16..24].copy_from_slice(&77u64.to_ne_bytes());
        bytes[24..28].copy_from_slice(&4711u32.to_ne_bytes());
        let record = MoveRecord::from_bytes(&bytes).unwrap();
        assert_eq!((record.cgroup_id, record.tgid), (77, 4711));
        assert_eq!(MoveRecord::from_bytes(&bytes[..31]), None);
    }

    #[test]
    fn from_bytes_reads_native_endian_fields_and_rejects_short_input() {
        let mut bytes = [0u8; ExitRecord::SIZE];
        bytes[0..8].copy_from_slice(&1234u64.to_ne_bytes());
        bytes[8..16].copy_from_slice(&99u64.to_ne_bytes());
        bytes[16..20].copy_from_slice(&4321u32.to_ne_bytes());
        bytes[20..24].copy_from_slice(&0x0700u32.to_ne_bytes());
        bytes[24..32].copy_from_slice(&5u64.to_ne_bytes());
        bytes[104 + 48..104 + 52].copy_from_slice(&15u32.to_ne_bytes());
        bytes[104 + 56..104 + 60].copy_from_slice(b"kill");
        bytes[176..180].copy_from_slice(&EXIT_HAS_CAUSE.to_ne_bytes());
        let record = ExitRecord::from_bytes(&bytes).unwrap();
        assert_eq!(
            (
                record.start_ticks,
                record.exit_monotonic_ns,
                record.tgid,
                record.wait_status
            ),
            (1234, 99, 4321, 0x0700)
        );
        assert_eq!(record.usage.user_ns, 5);
        assert_eq!(record.cause.signal, 15);
        assert_eq!(&record.cause.sender_comm[..5], b"kill\0");
        assert_eq!(record.flags, EXIT_HAS_CAUSE);
        assert_eq!(ExitRecord::from_bytes(&bytes[..ExitRecord::SIZE - 1]), None);
    }
}
