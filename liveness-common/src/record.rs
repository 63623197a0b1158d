//! The ring-buffer record and map names shared with the eBPF program (C, in
//! `liveness-ebpf/src/liveness.h`). Every layout here is mirrored by hand in that header;
//! the tests below and the BTF check in `liveness-daemon` pin both so they cannot drift
//! apart. Plain `core` only, so a Rust eBPF program could use it as it is.

/// Name of the `tp_btf/sched_process_exit` program in the object. The kernel keeps 15
/// bytes of a program's name: both names fit, so `bpftool prog` tells them apart.
pub const EXIT_PROGRAM_NAME: &str = "liveness_exit";
/// Name of the `tp_btf/sched_process_fork` program in the object.
pub const FORK_PROGRAM_NAME: &str = "liveness_fork";
/// Hash map `u32 tgid -> MemberRecord` of the processes descended from tracked ones, and
/// of the tracked processes themselves (each the root of its own tree).
pub const MAP_MEMBERS: &str = "members";
/// Array of one `u64`, mapped into user space: the members map's entries flagged
/// [`MEMBER_FLAG_COUNTED`], which the fork program keeps at most `max_members`.
pub const MAP_MEMBER_SLOTS: &str = "member_slots";
/// `u64` counters of the members map, indexed by the `MEMBER_COUNTER_*` constants, which
/// every CPU adds to atomically and the daemon maps (`BPF_F_MMAPABLE`).
pub const MAP_MEMBER_COUNTERS: &str = "member_counters";
/// Hash map `u32 tgid -> u64 expected start_ticks` of tracked processes.
pub const MAP_TRACKED: &str = "tracked";
/// Ring buffer carrying one [`ExitRecord`] per tracked process death.
pub const MAP_EXITS: &str = "exits";
/// `u64` counters, indexed by the `COUNTER_*` constants, as the members map's are.
pub const MAP_COUNTERS: &str = "counters";

/// Records written into the ring buffer.
pub const COUNTER_EMITTED: u32 = 0;
/// Deaths of tracked processes that could not be reported because the ring buffer was full.
pub const COUNTER_LOST: u32 = 1;
/// Number of slots in the counters map.
pub const COUNTER_SLOTS: u32 = 2;

/// New processes of a tree that the kernel could not add: every member slot was taken, or
/// an entry for an earlier process with the pid was in the way.
pub const MEMBER_COUNTER_FULL: u32 = 0;
/// New processes the kernel added to a tree: unchanged since a walk of the map means the
/// walk saw every member the kernel added.
pub const MEMBER_COUNTER_ADDED: u32 = 1;
/// Number of slots in the member counters map.
pub const MEMBER_COUNTER_SLOTS: u32 = 2;

/// [`MemberRecord::flags`]: the entry holds one of the `max_members` slots (every member's
/// entry, and a tracked process's entry made from its entry as a member).
pub const MEMBER_FLAG_COUNTED: u32 = 1;

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
    /// `MEMBER_FLAG_*` bits; the field also keeps the size a multiple of eight on both sides.
    pub flags: u32,
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
}

impl ExitRecord {
    /// Size of one record in the ring buffer.
    pub const SIZE: usize = core::mem::size_of::<Self>();

    /// Reads a record from ring-buffer bytes; `None` if the slice is too short.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < Self::SIZE {
            return None;
        }
        // SAFETY: the length was checked, the type is plain old data with no invalid bit
        // patterns, and `read_unaligned` tolerates any alignment of the ring-buffer slot.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<Self>()) })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn program_names_fit_the_kernels_and_differ() {
        for name in [EXIT_PROGRAM_NAME, FORK_PROGRAM_NAME] {
            assert!(name.len() <= 15, "{name} is cut to 15 bytes by the kernel");
        }
        assert_ne!(EXIT_PROGRAM_NAME, FORK_PROGRAM_NAME);
    }

    use super::*;
    use core::mem::{offset_of, size_of};

    /// The same numbers are asserted by `_Static_assert` in `liveness.h`.
    #[test]
    fn exit_record_layout_is_pinned() {
        assert_eq!(size_of::<ExitRecord>(), 24);
        assert_eq!(offset_of!(ExitRecord, start_ticks), 0);
        assert_eq!(offset_of!(ExitRecord, exit_monotonic_ns), 8);
        assert_eq!(offset_of!(ExitRecord, tgid), 16);
        assert_eq!(offset_of!(ExitRecord, wait_status), 20);
    }

    /// The same numbers are asserted by `_Static_assert` in `liveness.h`.
    #[test]
    fn member_record_layout_is_pinned() {
        assert_eq!(size_of::<MemberRecord>(), 24);
        assert_eq!(offset_of!(MemberRecord, start_ticks), 0);
        assert_eq!(offset_of!(MemberRecord, root_start_ticks), 8);
        assert_eq!(offset_of!(MemberRecord, root_tgid), 16);
        assert_eq!(offset_of!(MemberRecord, flags), 20);
    }

    #[test]
    fn from_bytes_reads_native_endian_fields_and_rejects_short_input() {
        let mut bytes = [0u8; 24];
        bytes[0..8].copy_from_slice(&1234u64.to_ne_bytes());
        bytes[8..16].copy_from_slice(&99u64.to_ne_bytes());
        bytes[16..20].copy_from_slice(&4321u32.to_ne_bytes());
        bytes[20..24].copy_from_slice(&0x0700u32.to_ne_bytes());
        let record = ExitRecord::from_bytes(&bytes).unwrap();
        assert_eq!(
            record,
            ExitRecord {
                start_ticks: 1234,
                exit_monotonic_ns: 99,
                tgid: 4321,
                wait_status: 0x0700
            }
        );
        assert_eq!(ExitRecord::from_bytes(&bytes[..23]), None);
    }
}
