//! The kernel's side of process trees: the eBPF members map, which the fork program fills
//! with every new process descended from a tracked one and the exit program empties as
//! they die. User space reads it, and seeds it with descendants that existed before their
//! root was tracked, so that their own children join the tree in the kernel too.

use aya::Pod;
use aya::maps::{HashMap, MapData, MapError, PerCpuArray};
use liveness_common::identity::ProcessKey;
use liveness_common::record::{MEMBER_COUNTER_ADDED, MEMBER_COUNTER_FULL, MemberRecord};

/// The map's value as aya reads and writes it.
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub(super) struct Value(MemberRecord);

// SAFETY: `MemberRecord` is `repr(C)` plain old data of integers only (no padding bytes:
// its explicit `padding` field fills the tail), so every bit pattern is valid.
unsafe impl Pod for Value {}

/// One member as the kernel recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelMember {
    pub member: ProcessKey,
    /// The tracked process whose tree it belongs to.
    pub root: ProcessKey,
}

impl KernelMember {
    fn of(pid: u32, record: MemberRecord) -> KernelMember {
        KernelMember {
            member: ProcessKey {
                pid,
                start_ticks: record.start_ticks,
            },
            root: ProcessKey {
                pid: record.root_tgid,
                start_ticks: record.root_start_ticks,
            },
        }
    }
}

/// The members map and its counter, taken from the eBPF source when it starts.
pub struct MembersMap {
    map: HashMap<MapData, u32, Value>,
    counters: PerCpuArray<MapData, u64>,
    capacity: u32,
}

impl std::fmt::Debug for MembersMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MembersMap")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl MembersMap {
    pub(super) fn new(
        map: HashMap<MapData, u32, Value>,
        counters: PerCpuArray<MapData, u64>,
        capacity: u32,
    ) -> MembersMap {
        MembersMap {
            map,
            counters,
            capacity,
        }
    }

    /// The map's capacity (`--ebpf-max-members`).
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Every member the kernel holds now. Entries that vanish during the walk (a member
    /// exiting) are skipped.
    pub fn members(&self) -> Vec<KernelMember> {
        self.map
            .iter()
            .filter_map(Result::ok)
            .map(|(pid, Value(record))| KernelMember::of(pid, record))
            .collect()
    }

    /// The entry for `pid`, if the kernel holds one: one lookup, not a walk of the map.
    pub fn get(&self, pid: u32) -> Option<KernelMember> {
        let Value(record) = self.map.get(&pid, 0).ok()?;
        Some(KernelMember::of(pid, record))
    }

    /// Adds a member found in `/proc`, so that its new children join its tree in the kernel.
    pub fn insert(&mut self, member: KernelMember) -> Result<(), MapError> {
        let record = MemberRecord {
            start_ticks: member.member.start_ticks,
            root_start_ticks: member.root.start_ticks,
            root_tgid: member.root.pid,
            padding: 0,
        };
        self.map.insert(member.member.pid, Value(record), 0)
    }

    /// Removes a member of a tree nobody follows any more; an entry for another process
    /// that has the pid now is left alone.
    pub fn remove(&mut self, member: ProcessKey) {
        if self
            .get(member.pid)
            .is_some_and(|entry| entry.member == member)
        {
            // Gone meanwhile (it exited): nothing to remove.
            let _ = self.map.remove(&member.pid);
        }
    }

    /// New processes of trees that found the map full since the daemon started.
    pub fn full_count(&self) -> u64 {
        self.counter(MEMBER_COUNTER_FULL).unwrap_or(0)
    }

    /// New processes the kernel added since the daemon started: one read, where a walk of
    /// the map visits every bucket of it, empty or not.
    pub fn added_count(&self) -> Option<u64> {
        self.counter(MEMBER_COUNTER_ADDED)
    }

    fn counter(&self, slot: u32) -> Option<u64> {
        match self.counters.get(&slot, 0) {
            Ok(values) => Some(values.iter().sum()),
            Err(error) => {
                tracing::warn!(%error, "cannot read the members map counter");
                None
            }
        }
    }
}
