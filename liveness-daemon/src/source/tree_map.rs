//! The kernel's side of process trees: the eBPF members map, which the fork program fills
//! with every new process descended from a tracked one and the exit program empties as
//! they die. User space reads it, and seeds it with descendants that existed before their
//! root was tracked, so that their own children join the tree in the kernel too.
//!
//! Every tracked process has an entry too, as the root of its own tree, so that a process
//! with no entry costs the programs one lookup. Members may hold at most `capacity` entries
//! (the counted ones, see [`MEMBER_FLAG_COUNTED`]); the map has room for one more entry per
//! tracked process, so a tracked process's entry always fits. The kernel only ever adds an
//! entry where there is none, and deletes only an exiting process's own: user space, one
//! task, is the only writer that replaces or removes entries of others.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aya::Pod;
use aya::maps::{Array, HashMap, IterableMap, Map, MapData, MapError};
use aya::sys::SyscallError;

use super::map_batch;
use super::shared_array::SharedArray;
use liveness_common::identity::ProcessKey;
use liveness_ebpf::record::{
    Lineage, MEMBER_COUNTER_ADDED, MEMBER_COUNTER_FULL, MEMBER_COUNTER_SLOTS, MEMBER_FLAG_COUNTED,
    MemberRecord, UID_BUCKETS, UID_SHARE_LAST_REFUSED, UID_SHARE_REFUSED, UID_SHARE_SLOTS,
    UID_SHARE_USED,
};

/// BPF_NOEXIST and BPF_EXIST, for `bpf_map_update_elem`.
const NO_EXIST: u64 = 1;
const EXIST: u64 = 2;
/// Attempts at writing an entry that the kernel changes under us, each time by a process's
/// fork or exit: more than a couple means something else is wrong.
const WRITE_ATTEMPTS: usize = 4;

/// Why an entry could not be written.
#[derive(Debug, thiserror::Error)]
pub enum TreeMapError {
    #[error("every one of the members map's {0} member slots is taken")]
    Full(u32),
    #[error("the members map has no room left (raise --ebpf-max-tracked): {0}")]
    NoRoom(#[source] MapError),
    #[error("the members map's entry for pid {0} kept changing while it was written")]
    Contended(u32),
    #[error(transparent)]
    Map(#[from] MapError),
}

/// The map's value as aya reads and writes it.
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub(super) struct Value(MemberRecord);

/// The lineages map's value as aya reads it.
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub(super) struct LineageValue(Lineage);

// SAFETY: `Lineage` is `repr(C)` plain old data of integers only, with no padding bytes (its
// ancestors' `pad` fields fill them), so every bit pattern is valid.
unsafe impl Pod for LineageValue {}

// SAFETY: `MemberRecord` is `repr(C)` plain old data of integers only (no padding bytes:
// its `flags` field fills the tail), so every bit pattern is valid.
unsafe impl Pod for Value {}

/// One member as the kernel recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelMember {
    pub member: ProcessKey,
    /// The tracked process whose tree it belongs to.
    pub root: ProcessKey,
}

impl KernelMember {
    /// A tracked process's own entry.
    fn is_root(&self) -> bool {
        self.member == self.root
    }

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

/// The count of counted entries, and each uid bucket's share, shared with the kernel through
/// mappings of the `member_slots` and `uid_shares` arrays, so both sides change them with
/// atomic instructions.
#[derive(Debug)]
struct MemberSlots {
    used: SharedArray,
    capacity: u64,
    shares: SharedArray,
    /// The slots the processes of one uid but root may hold.
    share: u64,
}

/// Adds one to `used` unless that makes it more than `max`, as the fork program does: add
/// first, then check, so that the count is never below the entries.
fn take_within(used: &AtomicU64, max: u64) -> bool {
    if used.fetch_add(1, Ordering::SeqCst) < max {
        return true;
    }
    used.fetch_sub(1, Ordering::SeqCst);
    false
}

impl MemberSlots {
    fn used(&self) -> &AtomicU64 {
        self.used.slot(0)
    }

    /// Field `field` (`UID_SHARE_*`) of the share of the bucket `bucket`.
    fn share_of(&self, bucket: u32, field: u32) -> &AtomicU64 {
        self.shares.slot(bucket * UID_SHARE_SLOTS + field)
    }

    /// Takes a slot and one of `uid`'s share (root has none of its own), or neither.
    fn take(&self, uid: u32) -> bool {
        let bucket = uid % UID_BUCKETS;
        let share = if uid == 0 { self.capacity } else { self.share };
        if !take_within(self.share_of(bucket, UID_SHARE_USED), share) {
            self.share_of(bucket, UID_SHARE_REFUSED)
                .fetch_add(1, Ordering::Relaxed);
            self.share_of(bucket, UID_SHARE_LAST_REFUSED)
                .store(u64::from(uid), Ordering::Relaxed);
            return false;
        }
        if take_within(self.used(), self.capacity) {
            return true;
        }
        self.share_of(bucket, UID_SHARE_USED)
            .fetch_sub(1, Ordering::SeqCst);
        false
    }

    fn release(&self, uid: u32) {
        self.used().fetch_sub(1, Ordering::SeqCst);
        self.share_of(uid % UID_BUCKETS, UID_SHARE_USED)
            .fetch_sub(1, Ordering::SeqCst);
    }
}

/// One bucket of uids over its share of the members map, or refused for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidShare {
    /// The uid last refused for the bucket's share; else the bucket itself.
    pub uid: u32,
    pub used: u64,
    pub refused: u64,
}

/// The maps of [`TreeMap`], as the loader takes them from the object.
pub(super) struct TreeMaps {
    pub lineages: Map,
    pub members: Map,
    pub counters: Map,
    pub slots: Map,
    pub uid_shares: Map,
}

/// Since when the lineages are complete, and whether they outlive this daemon.
#[derive(Debug)]
pub struct LineageKeep {
    /// When the lineage programs were first attached (ms since the epoch): by this daemon,
    /// or by an earlier one whose pinned programs it adopted.
    pub since_ms: i64,
    /// Where they are pinned, or why they are not (they then go with this daemon).
    pub pinned: Result<std::path::PathBuf, String>,
    /// The pin root (`--ebpf-pin-dir`), when asked for: status lists the sets in it.
    pub pin_root: Option<std::path::PathBuf>,
    /// Links of theirs held open while the daemon runs: a pinned one then stays attached
    /// even if its pin is removed by hand, one whose pin failed stays attached at all.
    _links: Vec<aya::programs::links::FdLink>,
    /// The lock on the pins, held while the daemon runs: no other daemon removes them.
    _lock: Option<std::os::fd::OwnedFd>,
}

impl LineageKeep {
    pub(super) fn pinned(since_ms: i64, pins: super::lineage_pin::PinSet) -> LineageKeep {
        let dir = pins.dir.clone();
        let (links, lock) = pins.into_held();
        LineageKeep {
            since_ms,
            pinned: Ok(dir),
            pin_root: None,
            _links: links,
            _lock: Some(lock),
        }
    }

    /// The entries of the pin root, for status; a root that cannot be listed says so in one.
    pub fn pin_sets(&self) -> Vec<super::lineage_pin::FoundPins> {
        let Some(root) = &self.pin_root else {
            return Vec::new();
        };
        super::lineage_pin::find(root).unwrap_or_else(|error| {
            vec![super::lineage_pin::FoundPins {
                path: root.clone(),
                owner: Err(error.to_string()),
            }]
        })
    }

    /// Attached by this daemon, now, for its life.
    pub(super) fn unpinned(
        reason: String,
        links: Vec<aya::programs::links::FdLink>,
    ) -> LineageKeep {
        LineageKeep {
            since_ms: super::lineage_pin::epoch_ms(std::time::SystemTime::now()),
            pinned: Err(reason),
            pin_root: None,
            _links: links,
            _lock: None,
        }
    }
}

/// A handle on the members map and its counters. The eBPF source holds one for the roots
/// and the engine's trees another for the members; both belong to the engine's task.
pub struct TreeMap {
    map: HashMap<MapData, u32, Value>,
    /// Every process's lineage since the programs were loaded (read only here).
    lineages: Arc<HashMap<MapData, u32, LineageValue>>,
    /// Since when lineages are complete, and whether they are kept across restarts.
    lineage: Arc<LineageKeep>,
    counters: Arc<SharedArray>,
    slots: Arc<MemberSlots>,
    /// Processes user space found no slot for, each once, that the kernel did not count at
    /// their fork; shared by every handle.
    refused: Arc<AtomicU64>,
    /// Walks of the members map (see [`TreeMap::walks`]).
    walks: Arc<AtomicU64>,
}

impl std::fmt::Debug for TreeMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TreeMap")
            .field("capacity", &self.slots.capacity)
            .finish_non_exhaustive()
    }
}

/// A second handle on the same kernel map, through a duplicated file descriptor.
fn duplicate(map: &MapData) -> Result<MapData, MapError> {
    let fd = map
        .fd()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|io_error| SyscallError {
            call: "dup",
            io_error,
        })?;
    MapData::from_fd(fd)
}

impl TreeMap {
    /// The handle on the maps named by [`liveness_ebpf::record`]'s `MAP_MEMBER*`.
    pub(super) fn new(
        maps: TreeMaps,
        capacity: u32,
        share: u32,
        lineage: LineageKeep,
    ) -> Result<TreeMap, MapError> {
        let array = |map: Map| -> Result<Array<MapData, u64>, MapError> { Array::try_from(map) };
        let (slots, counters) = (array(maps.slots)?, array(maps.counters)?);
        let shares: Array<MapData, [u64; UID_SHARE_SLOTS as usize]> =
            Array::try_from(maps.uid_shares)?;
        Ok(TreeMap {
            lineage: Arc::new(lineage),
            lineages: Arc::new(HashMap::try_from(maps.lineages)?),
            map: HashMap::try_from(maps.members)?,
            counters: Arc::new(SharedArray::map(
                counters.map(),
                MEMBER_COUNTER_SLOTS as usize,
            )?),
            slots: Arc::new(MemberSlots {
                used: SharedArray::map(slots.map(), 1)?,
                capacity: u64::from(capacity),
                shares: SharedArray::map(shares.map(), (UID_BUCKETS * UID_SHARE_SLOTS) as usize)?,
                share: u64::from(share),
            }),
            refused: Arc::new(AtomicU64::new(0)),
            walks: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Another handle on the same maps and slot count.
    pub(crate) fn try_clone(&self) -> Result<TreeMap, MapError> {
        Ok(TreeMap {
            lineage: Arc::clone(&self.lineage),
            lineages: Arc::clone(&self.lineages),
            map: HashMap::try_from(Map::HashMap(duplicate(self.map.map())?))?,
            counters: Arc::clone(&self.counters),
            slots: Arc::clone(&self.slots),
            refused: Arc::clone(&self.refused),
            walks: Arc::clone(&self.walks),
        })
    }

    /// The members' share of the map (`--ebpf-max-members`).
    pub fn capacity(&self) -> u32 {
        self.slots.capacity as u32
    }

    /// Every member the kernel holds now, roots left out. Entries that vanish during the
    /// walk (a member exiting) are skipped.
    pub fn members(&self) -> Vec<KernelMember> {
        self.walks.fetch_add(1, Ordering::Relaxed);
        map_batch::entries(&self.map)
            .into_iter()
            .map(|(pid, Value(record))| KernelMember::of(pid, record))
            .filter(|entry| !entry.is_root())
            .collect()
    }

    /// The processes whose recorded lineage has `root` among their ancestors: those it
    /// started (up to [`LINEAGE_DEPTH`](liveness_ebpf::record::LINEAGE_DEPTH) generations
    /// down), whatever they were reparented to
    /// since, as long as they were forked after the programs were loaded. A walk of the map.
    pub fn started_by(&self, root: ProcessKey) -> Vec<ProcessKey> {
        map_batch::entries(&self.lineages)
            .into_iter()
            .filter(|(_, LineageValue(lineage))| {
                lineage
                    .ancestors
                    .iter()
                    .take_while(|ancestor| ancestor.tgid != 0)
                    .any(|ancestor| {
                        ancestor.tgid == root.pid && ancestor.start_ticks == root.start_ticks
                    })
            })
            .map(|(pid, LineageValue(lineage))| ProcessKey {
                pid,
                start_ticks: lineage.start_ticks,
            })
            .collect()
    }

    /// Since when the lineages are complete, and whether they outlive this daemon.
    pub fn lineage(&self) -> &LineageKeep {
        &self.lineage
    }

    /// The member entry for `pid`, if the kernel holds one: one lookup, not a walk.
    pub fn get(&self, pid: u32) -> Option<KernelMember> {
        self.record(pid)
            .map(|record| KernelMember::of(pid, record))
            .filter(|entry| !entry.is_root())
    }

    fn record(&self, pid: u32) -> Option<MemberRecord> {
        self.map.get(&pid, 0).ok().map(|Value(record)| record)
    }

    /// Deletes `pid`'s entry, read as `record`, and gives its slot back if it held one.
    /// Only one deletion succeeds when the exit program races for it.
    fn delete(&mut self, pid: u32, record: MemberRecord) {
        if self.map.remove(&pid).is_ok() && record.flags & MEMBER_FLAG_COUNTED != 0 {
            self.slots.release(record.uid);
        }
    }

    /// Adds a member found in `/proc`, whose real uid is `uid`, so that its new children
    /// join its tree in the kernel. True when this wrote its entry; false when the process
    /// has one already (a member, or tracked itself).
    pub fn insert(&mut self, member: KernelMember, uid: u32) -> Result<bool, TreeMapError> {
        match self.record(member.member.pid) {
            Some(record) if record.start_ticks == member.member.start_ticks => return Ok(false),
            // An earlier process that had this pid.
            Some(stale) => self.delete(member.member.pid, stale),
            None => {}
        }
        if !self.slots.take(uid) {
            return Err(TreeMapError::Full(self.capacity()));
        }
        let record = MemberRecord {
            start_ticks: member.member.start_ticks,
            root_start_ticks: member.root.start_ticks,
            root_tgid: member.root.pid,
            flags: MEMBER_FLAG_COUNTED,
            uid,
            pad: 0,
        };
        match self.map.insert(member.member.pid, Value(record), NO_EXIST) {
            Ok(()) => Ok(true),
            Err(error) => {
                self.slots.release(uid);
                match map_errno(&error) {
                    // The fork program added it meanwhile.
                    Some(libc::EEXIST) => Ok(false),
                    Some(libc::E2BIG | libc::ENOMEM) => Err(TreeMapError::NoRoom(error)),
                    _ => Err(error.into()),
                }
            }
        }
    }

    /// Removes a member of a tree nobody follows any more. An entry for another process
    /// that has the pid now, or one that makes the process a root, is left alone.
    pub fn remove(&mut self, member: KernelMember) {
        if let Some(record) = self.record(member.member.pid)
            && KernelMember::of(member.member.pid, record) == member
            && !member.is_root()
        {
            self.delete(member.member.pid, record);
        }
    }

    /// Moves a member's entry to the tree of `root` (the tree of a nested session that
    /// ended goes to the tree that holds its owner), keeping its slot. Only the entry that
    /// `member` names is changed: one its exit deleted meanwhile is not written again. Only
    /// if that process exits, its pid is reused and the fork program adds the new one
    /// between this read and this write is the new one's entry changed instead.
    pub fn reroot(&mut self, member: KernelMember, root: ProcessKey) {
        if let Some(record) = self.record(member.member.pid)
            && KernelMember::of(member.member.pid, record) == member
            && !member.is_root()
        {
            let moved = MemberRecord {
                root_start_ticks: root.start_ticks,
                root_tgid: root.pid,
                ..record
            };
            // Gone meanwhile: its exit took the entry, and nothing is left to move.
            let _ = self.map.insert(member.member.pid, Value(moved), EXIST);
        }
    }

    /// Makes `root`, a tracked process, the root of its own tree: its entry tells the
    /// programs, in one lookup, that its exit is to be reported and whose tree its children
    /// join. An entry it has as a member of another tree becomes its root entry and keeps
    /// its slot; so the inner of two nested sessions gets the children.
    pub fn add_root(&mut self, root: ProcessKey) -> Result<(), TreeMapError> {
        for _ in 0..WRITE_ATTEMPTS {
            let mut record = MemberRecord {
                start_ticks: root.start_ticks,
                root_start_ticks: root.start_ticks,
                root_tgid: root.pid,
                ..MemberRecord::default()
            };
            let flags = match self.record(root.pid) {
                Some(existing) if existing.start_ticks == root.start_ticks => {
                    // Only over the entry just read (its exit may delete it meanwhile),
                    // with its slot.
                    record.flags = existing.flags;
                    record.uid = existing.uid;
                    EXIST
                }
                Some(stale) => {
                    self.delete(root.pid, stale);
                    NO_EXIST
                }
                None => NO_EXIST,
            };
            match self.map.insert(root.pid, Value(record), flags) {
                Ok(()) => return Ok(()),
                // Changed meanwhile: read it again.
                Err(error) if matches!(map_errno(&error), Some(libc::EEXIST | libc::ENOENT)) => {}
                Err(error) if matches!(map_errno(&error), Some(libc::E2BIG | libc::ENOMEM)) => {
                    return Err(TreeMapError::NoRoom(error));
                }
                Err(error) => return Err(error.into()),
            }
        }
        Err(TreeMapError::Contended(root.pid))
    }

    /// Removes `root`'s entry as the root of its tree, not an entry of a newer process with
    /// its pid. Only if that process exits, its pid is reused and the fork program adds the
    /// new one between this read and this deletion is the new one's entry deleted instead:
    /// a member the kernel then does not follow.
    pub fn remove_root(&mut self, root: ProcessKey) {
        if let Some(record) = self.root_record(root) {
            self.delete(root.pid, record);
        }
    }

    /// Whether `root` has its entry as the root of its tree: the programs then report its
    /// exit and add what it forks.
    pub fn has_root(&self, root: ProcessKey) -> bool {
        self.root_record(root).is_some()
    }

    fn root_record(&self, root: ProcessKey) -> Option<MemberRecord> {
        self.record(root.pid).filter(|&record| {
            KernelMember::of(root.pid, record) == KernelMember { member: root, root }
        })
    }

    /// New processes of trees that found no slot, or that user space found none for,
    /// since the daemon started: each once (see [`TreeMap::count_refused`]).
    pub fn full_count(&self) -> u64 {
        self.counters.get(MEMBER_COUNTER_FULL) + self.refused.load(Ordering::Relaxed)
    }

    /// Counts a process that user space found no slot for and whose fork the kernel did not
    /// count: one that existed before its tree was followed, or whose parent had no entry.
    /// A write retried later is not counted again.
    pub fn count_refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Walks of the members map since the daemon started, by every handle of it: each costs
    /// two system calls per entry, so they are made only when the kernel added members.
    pub fn walks(&self) -> u64 {
        self.walks.load(Ordering::Relaxed)
    }

    /// New processes the kernel added since the daemon started: one read, where a walk of
    /// the map visits every bucket of it, empty or not.
    pub fn added_count(&self) -> u64 {
        self.counters.get(MEMBER_COUNTER_ADDED)
    }

    /// The slots the processes of one uid but root may hold.
    pub fn share(&self) -> u64 {
        self.slots.share
    }

    /// The buckets of uids that hold their whole share now, or were refused a slot for it
    /// since the daemon started.
    pub fn over_share(&self) -> Vec<UidShare> {
        (0..UID_BUCKETS)
            .filter_map(|bucket| {
                let field = |field| self.slots.share_of(bucket, field).load(Ordering::SeqCst);
                let (used, refused) = (field(UID_SHARE_USED), field(UID_SHARE_REFUSED));
                let full = bucket != 0 && used >= self.slots.share;
                let named = u32::try_from(field(UID_SHARE_LAST_REFUSED)).unwrap_or(bucket);
                let uid = if refused > 0 && named % UID_BUCKETS == bucket {
                    named
                } else {
                    bucket
                };
                (full || refused > 0).then_some(UidShare { uid, used, refused })
            })
            .collect()
    }

    /// The member slots taken now: the counted entries, which the kernel keeps within
    /// [`TreeMap::capacity`], and any a writer is adding or has just deleted.
    pub fn slots_used(&self) -> u64 {
        self.slots.used().load(Ordering::SeqCst)
    }
}

pub(super) fn map_errno(error: &MapError) -> Option<i32> {
    match error {
        MapError::SyscallError(error) => error.io_error.raw_os_error(),
        _ => None,
    }
}
