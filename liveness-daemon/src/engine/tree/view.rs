//! What is read of the trees off the engine: copies taken on the engine ([`TreeView`],
//! [`RefreshView`]), whose reading costs as much as the trees and so runs elsewhere.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::session::Survivors;
use liveness_proc::identity::{Liveness, ProcRoot};

use super::member::{Facts, Tree};
use super::walk::{descendants, subtree, with_inodes, write_member};
use crate::source::tree_map::{KernelMember, TreeMap};
use crate::store::Member;

/// What a refresh reads of the trees: a copy taken on the engine, read off it.
#[derive(Debug, Clone)]
pub struct RefreshView {
    pub(super) roots: HashSet<ProcessKey>,
    /// Roots the kernel does not follow: what they fork is not in its map.
    pub(super) unrooted: HashSet<ProcessKey>,
    /// member -> its root, and its pidfs inode where known.
    pub(super) known: HashMap<ProcessKey, (ProcessKey, Option<u64>)>,
    /// Whether `/proc` is scanned for members (the kernel does not follow every tree).
    pub(super) scan: bool,
    /// The kernel's count of added members the trees hold.
    pub(super) merged_added: Option<u64>,
}

/// What a refresh leaves to note, besides the members it found and those that died.
#[derive(Debug, Default, Clone, Copy)]
pub struct Merge {
    /// The kernel's count of added members, read before its map was.
    pub added: Option<u64>,
    /// The kernel's count of processes refused a slot, read before its map was.
    pub full: Option<u64>,
    /// Live members left without a kernel entry: no slot was free for them.
    pub unlinked: usize,
    /// Whether `/proc` was scanned.
    pub scanned: bool,
}

/// What a refresh found.
#[derive(Debug, Default)]
pub struct Refreshed {
    pub merge: Merge,
    /// New members, from the kernel's map or a scan, their kernel entries written.
    pub found: Vec<Member>,
    /// Known members that died.
    pub dead: Vec<ProcessKey>,
}

impl RefreshView {
    /// Reads what the kernel added (through `kernel`, a handle of the members map), scans
    /// `/proc` where the kernel does not follow every fork, finds the members that died,
    /// and writes the kernel entries of live members that have none while slots are free
    /// (those a scan found, and those refused a slot before). Its cost is the trees', so it
    /// runs off the engine.
    pub fn read(&self, mut kernel: Option<&mut TreeMap>, proc: &ProcRoot) -> Refreshed {
        let mut refreshed = Refreshed {
            merge: Merge {
                // Read before the walk: a member added during it changes the counts again.
                added: kernel.as_deref().map(TreeMap::added_count),
                full: kernel.as_deref().map(TreeMap::full_count),
                unlinked: 0,
                scanned: self.scan,
            },
            ..Refreshed::default()
        };
        // When the kernel added none since the trees' last merge, its map holds no member
        // they do not know: each known member's entry is looked up (one system call each,
        // and none for trees that are their owner alone) instead of a walk of the whole map
        // (every bucket of it scanned, every owner's entry copied out).
        let entries = match kernel.as_deref() {
            Some(kernel) if refreshed.merge.added == self.merged_added => (self.known.keys())
                .filter_map(|key| kernel.get(key.pid))
                .collect(),
            Some(kernel) => kernel.members(),
            None => Vec::new(),
        };
        // A member the kernel map does not hold has died (the exit program removed it), or
        // was never in it; only those are checked in /proc.
        let mut in_kernel = HashSet::new();
        for entry in entries {
            in_kernel.insert(entry.member);
            if !self.roots.contains(&entry.root) || self.known.contains_key(&entry.member) {
                continue;
            }
            // Its comm, and proof that it is still the process the kernel recorded.
            match proc.stat(entry.member.pid) {
                Ok(stat) if stat.start_ticks == entry.member.start_ticks => {
                    refreshed.found.push(Member {
                        key: entry.member,
                        root: entry.root,
                        comm: stat.comm,
                        pidfs_ino: proc.pidfs_ino_of_key(entry.member),
                    });
                }
                _ => {}
            }
        }
        let scanned = match self.scan.then(|| proc.processes()) {
            None => None,
            Some(Ok(processes)) => Some(processes),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cannot scan /proc for members");
                None
            }
        };
        if let Some(processes) = &scanned {
            let tree_of = |key: ProcessKey| {
                if self.roots.contains(&key) {
                    Some(key)
                } else {
                    self.known.get(&key).map(|(root, _)| *root)
                }
            };
            let found = with_inodes(proc, descendants(processes, tree_of));
            let parents: HashMap<u32, u32> =
                processes.iter().map(|stat| (stat.pid, stat.ppid)).collect();
            // The kernel saw the fork of a process whose parent has an entry, and counted it
            // if it found no slot; the others are counted here, once.
            let with_entry: HashSet<u32> = in_kernel
                .iter()
                .chain(self.roots.difference(&self.unrooted))
                .map(|key| key.pid)
                .collect();
            let kernel_saw_fork = |member: &Member| {
                parents
                    .get(&member.key.pid)
                    .is_some_and(|parent| with_entry.contains(parent))
            };
            for member in found {
                if let Some(kernel) = kernel.as_deref_mut() {
                    let entry = KernelMember {
                        member: member.key,
                        root: member.root,
                    };
                    if !write_member(kernel, proc, entry) {
                        refreshed.merge.unlinked += 1;
                        if !kernel_saw_fork(&member) {
                            kernel.count_refused();
                        }
                    }
                }
                refreshed.found.push(member);
            }
        }
        let alive: Option<HashSet<ProcessKey>> = scanned.as_ref().map(|processes| {
            processes
                .iter()
                .filter(|stat| !stat.has_exited())
                .map(|stat| ProcessKey {
                    pid: stat.pid,
                    start_ticks: stat.start_ticks,
                })
                .collect()
        });
        // A member whose pidfs inode is known is checked with it: a process that took its pid
        // within its clock tick has its pid and start time.
        let dead =
            |key: &ProcessKey, ino: Option<u64>| proc.check_process(*key, ino) != Liveness::Alive;
        let mut unlinked = Vec::new();
        for (key, (root, ino)) in &self.known {
            let died = match &alive {
                Some(alive) => !alive.contains(key) || (ino.is_some() && dead(key, *ino)),
                None => !in_kernel.contains(key) && dead(key, *ino),
            };
            if died {
                refreshed.dead.push(*key);
            } else if !in_kernel.contains(key) {
                unlinked.push(KernelMember {
                    member: *key,
                    root: *root,
                });
            }
        }
        // Members refused a slot before get one back once slots are free (a storm past).
        if let Some(kernel) = kernel {
            for entry in unlinked {
                let free = kernel.slots_used() < u64::from(kernel.capacity());
                if !(free && write_member(kernel, proc, entry)) {
                    refreshed.merge.unlinked += 1;
                }
            }
        }
        refreshed
    }
}

/// One tree as the daemon knew it at a moment, for reading what is alive of it off the
/// engine: a walk of the kernel map and a `/proc` read per member cost what the tree's
/// owner chose, and nothing of the engine's.
#[derive(Debug, Clone)]
pub struct TreeView {
    pub(super) root: ProcessKey,
    /// `root`, and the roots of the trees nested in its tree (whose members it holds too).
    pub(super) roots: Vec<ProcessKey>,
    pub(super) members: Arc<Tree>,
    /// The kernel's count of added members merged into `members`.
    pub(super) merged_added: Option<u64>,
    pub(super) local: Local,
}

impl TreeView {
    /// Every process of the tree still alive, the root included: what the daemon knew
    /// merged with what the kernel added since (read through `kernel`, a handle of the
    /// members map). Unbounded.
    pub fn live_members(&self, kernel: Option<&TreeMap>, proc: &ProcRoot) -> Vec<Identity> {
        self.live_after(kernel, proc, 0).collect()
    }

    /// The live processes of the tree with a pid above `after`, by pid; only those taken
    /// from the iterator are looked up in `/proc`.
    pub fn live_after<'a>(
        &'a self,
        kernel: Option<&TreeMap>,
        proc: &'a ProcRoot,
        after: u32,
    ) -> impl Iterator<Item = Identity> + 'a {
        let news = kernel_news(kernel, self.merged_added);
        let mut candidates = candidates(&self.roots, &self.members, &news);
        candidates.entry(self.root).or_default();
        candidates
            .into_iter()
            .filter(move |(key, _)| key.pid > after)
            .filter_map(|(key, (facts, in_kernel))| self.local.alive(proc, key, facts, in_kernel))
    }

    /// The processes of the tree as known, the root first among them by pid order, none
    /// checked in `/proc`: for a reader that reads each anyway and compares its start time
    /// (the activity sampler), which [`TreeView::live_members`] would make read twice.
    /// What the kernel added comes from `kernel`, walked once for every tree read with it.
    pub fn known_members(&self, kernel: &mut KernelMembers<'_>) -> Vec<Identity> {
        let news = kernel.news(&self.roots, self.merged_added);
        let mut candidates = candidates(&self.roots, &self.members, &news);
        candidates.entry(self.root).or_default();
        candidates
            .into_iter()
            .map(|(key, (facts, _))| self.local.identity(key, facts))
            .collect()
    }

    pub fn root(&self) -> ProcessKey {
        self.root
    }

    /// The survivors of the tree if its session ended now at the request of the process
    /// `caller` (its pid here, 0 for none): its live members but the root, and but the
    /// caller and those of its ancestors that are members, which are set apart (see
    /// [`Survivors::requested_by`]).
    pub fn survivors(&self, kernel: Option<&TreeMap>, proc: &ProcRoot, caller: u32) -> Survivors {
        let mut alive = self.live_members(kernel, proc);
        alive.retain(|member| member.key() != self.root);
        let requested_by = take_requesters(&mut alive, caller, proc);
        Survivors {
            requested_by,
            ..Survivors::from_alive(alive)
        }
    }

    /// The descendants in `/proc` of the root and of every member: the processes the owner
    /// started before its tree was followed.
    pub fn descendants(&self, proc: &ProcRoot) -> Vec<Member> {
        let mut starts: Vec<ProcessKey> = self.members.keys().copied().collect();
        starts.push(self.root);
        // The tree's own processes where the kernel lists children; else all of /proc.
        let processes = match subtree(proc, &starts).map_or_else(|| proc.processes(), Ok) {
            Ok(processes) => processes,
            Err(e) => {
                tracing::warn!(error = %e, "cannot scan /proc for a tree's members");
                return Vec::new();
            }
        };
        let root = self.root;
        let found = descendants(&processes, |key| {
            (key == root || self.members.contains_key(&key)).then_some(root)
        });
        with_inodes(proc, found)
    }
}

/// Takes out of `alive` the process `caller` and its ancestors, nearest first, up to the
/// first that is not in `alive`: an `end` sent from inside the tree (an agent's hook, run
/// through a shell) ends the session rather than outlives it. Each is matched by its start
/// time, so a pid another process took is no member.
fn take_requesters(alive: &mut Vec<Identity>, caller: u32, proc: &ProcRoot) -> Vec<Identity> {
    let members: HashSet<ProcessKey> = alive.iter().map(Identity::key).collect();
    let mut chain: HashMap<ProcessKey, usize> = HashMap::new();
    let mut pid = caller;
    while pid != 0 {
        let Ok(stat) = proc.stat(pid) else {
            break;
        };
        let key = ProcessKey {
            pid,
            start_ticks: stat.start_ticks,
        };
        if !members.contains(&key) || chain.contains_key(&key) {
            break;
        }
        chain.insert(key, chain.len());
        pid = stat.ppid;
    }
    if chain.is_empty() {
        return Vec::new();
    }
    let (mut requesters, rest): (Vec<Identity>, Vec<Identity>) = std::mem::take(alive)
        .into_iter()
        .partition(|member| chain.contains_key(&member.key()));
    *alive = rest;
    requesters.sort_by_key(|member| chain.get(&member.key()).copied());
    requesters
}

/// This boot and host, which identities of members carry.
#[derive(Debug, Clone)]
pub(super) struct Local {
    pub(super) boot_id: String,
    pub(super) host: String,
}

impl Local {
    pub(super) fn identity(&self, key: ProcessKey, facts: Facts) -> Identity {
        Identity {
            pid: key.pid,
            start_ticks: key.start_ticks,
            boot_id: self.boot_id.clone(),
            host: self.host.clone(),
            pidfs_ino: facts.pidfs_ino,
            comm: facts.comm,
        }
    }

    /// The identity of a process if it is alive now. One the kernel map holds has not
    /// exited (its exit removes it there): it is read in `/proc` only for a command name
    /// not known yet. Another is checked with its pidfs inode where known, which a
    /// process that took its pid within its clock tick does not have.
    pub(super) fn alive(
        &self,
        proc: &ProcRoot,
        key: ProcessKey,
        mut facts: Facts,
        in_kernel: bool,
    ) -> Option<Identity> {
        if in_kernel && !facts.comm.is_empty() {
            return Some(self.identity(key, facts));
        }
        if !in_kernel
            && facts.pidfs_ino.is_some()
            && proc.check_process(key, facts.pidfs_ino) != Liveness::Alive
        {
            return None;
        }
        let stat = proc.stat(key.pid).ok()?;
        if stat.start_ticks != key.start_ticks || stat.has_exited() {
            return None;
        }
        if facts.comm.is_empty() {
            facts.comm = stat.comm;
        }
        Some(self.identity(key, facts))
    }
}

/// What is known of the tree whose root and nested roots are `roots`, the root excluded:
/// each member with its facts and whether the kernel map, read as `kernel`, holds it.
pub(super) fn candidates(
    roots: &[ProcessKey],
    tree: &Tree,
    kernel: &[KernelMember],
) -> BTreeMap<ProcessKey, (Facts, bool)> {
    let mut candidates: BTreeMap<ProcessKey, (Facts, bool)> = tree
        .iter()
        .map(|(key, comm)| (*key, (comm.clone(), false)))
        .collect();
    for entry in kernel.iter().filter(|entry| roots.contains(&entry.root)) {
        candidates.entry(entry.member).or_default().1 = true;
    }
    candidates
}

/// Whether the kernel map may hold members beyond what was merged at the count
/// `merged_added`: the kernel added one since, or nothing was merged yet.
pub(super) fn kernel_added_since(kernel: Option<&TreeMap>, merged_added: Option<u64>) -> bool {
    kernel.is_some_and(|kernel| Some(kernel.added_count()) != merged_added)
}

/// The kernel map's members for many trees read one after another (a round of the
/// activity sampler): the map is walked once for them all, at the first tree that needs
/// it, where a walk per tree would visit every bucket of the map as many times as there
/// are trees. What the kernel adds after the walk is read by the next reader.
#[derive(Debug)]
pub struct KernelMembers<'a> {
    kernel: Option<&'a TreeMap>,
    /// Each root's members, once walked.
    by_root: Option<HashMap<ProcessKey, Vec<KernelMember>>>,
}

impl<'a> KernelMembers<'a> {
    /// Nothing walked yet of `kernel` (none where the eBPF source does not run).
    pub fn new(kernel: Option<&'a TreeMap>) -> KernelMembers<'a> {
        KernelMembers {
            kernel,
            by_root: None,
        }
    }

    /// What the map holds under `roots` beyond what was merged at the count
    /// `merged_added` (see [`kernel_news`]).
    fn news(&mut self, roots: &[ProcessKey], merged_added: Option<u64>) -> Vec<KernelMember> {
        let Some(kernel) = self.kernel else {
            return Vec::new();
        };
        if !kernel_added_since(Some(kernel), merged_added) {
            return Vec::new();
        }
        let by_root = self.by_root.get_or_insert_with(|| {
            let mut by_root: HashMap<ProcessKey, Vec<KernelMember>> = HashMap::new();
            for entry in kernel.members() {
                by_root.entry(entry.root).or_default().push(entry);
            }
            by_root
        });
        roots
            .iter()
            .filter_map(|root| by_root.get(root))
            .flatten()
            .copied()
            .collect()
    }
}

/// What the kernel map holds beyond what was merged at the count `merged_added`: a walk
/// of the map only when [`kernel_added_since`].
pub(super) fn kernel_news(
    kernel: Option<&TreeMap>,
    merged_added: Option<u64>,
) -> Vec<KernelMember> {
    match kernel {
        Some(map) if kernel_added_since(kernel, merged_added) => map.members(),
        _ => Vec::new(),
    }
}
