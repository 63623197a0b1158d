//! What is read of the trees off the engine: copies taken on the engine ([`TreeView`],
//! [`RefreshView`]), whose reading costs as much as the trees and so runs elsewhere.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::session::Survivors;
use liveness_proc::identity::{Liveness, ProcRoot};

use super::known::Tree;
use super::walk::{descendants, subtree};
use crate::source::tree_map::{KernelMember, TreeMap};
use crate::store::Member;

/// What a refresh reads of the trees: a copy taken on the engine, read off it.
#[derive(Debug, Clone)]
pub struct RefreshView {
    pub(super) roots: HashSet<ProcessKey>,
    /// member -> its root.
    pub(super) known: HashMap<ProcessKey, ProcessKey>,
    /// Whether `/proc` is scanned for members (the kernel does not follow every tree).
    pub(super) scan: bool,
}

/// What a refresh found.
#[derive(Debug, Default)]
pub struct Refreshed {
    /// The kernel's count of added members, read before its map was.
    pub merged_added: Option<u64>,
    /// New members, from the kernel's map or a scan.
    pub found: Vec<Member>,
    /// Known members that died.
    pub dead: Vec<ProcessKey>,
}

impl RefreshView {
    /// Reads what the kernel added (through `kernel`, a handle of the members map), scans
    /// `/proc` where the kernel does not follow every fork, and finds the members that died.
    /// Its cost is the trees', so it runs off the engine.
    pub fn read(&self, kernel: Option<&TreeMap>, proc: &ProcRoot) -> Refreshed {
        let mut refreshed = Refreshed {
            // Read before the walk: a member added during it changes the count again.
            merged_added: kernel.map(TreeMap::added_count),
            ..Refreshed::default()
        };
        // With a kernel map that never filled, a member it does not hold has died (the exit
        // program removed it), or was never in it; only those are checked in /proc.
        let mut in_kernel = HashSet::new();
        for entry in kernel.map(TreeMap::members).unwrap_or_default() {
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
                    self.known.get(&key).copied()
                }
            };
            refreshed.found.extend(descendants(processes, tree_of));
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
        refreshed.dead = self
            .known
            .keys()
            .filter(|key| match &alive {
                Some(alive) => !alive.contains(key),
                None => !in_kernel.contains(key) && proc.check_key(**key) != Liveness::Alive,
            })
            .copied()
            .collect();
        refreshed
    }
}

/// One tree as the daemon knew it at a moment, for reading what is alive of it off the
/// engine: a walk of the kernel map and a `/proc` read per member cost what the tree's
/// owner chose, and nothing of the engine's.
#[derive(Debug, Clone)]
pub struct TreeView {
    pub(super) root: ProcessKey,
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
        let mut candidates = candidates(self.root, &self.members, &news);
        candidates.entry(self.root).or_default();
        candidates
            .into_iter()
            .filter(move |(key, _)| key.pid > after)
            .filter_map(|(key, (comm, in_kernel))| self.local.alive(proc, key, comm, in_kernel))
    }

    pub fn root(&self) -> ProcessKey {
        self.root
    }

    /// The survivors of the tree if its session ended now: its live members but the root.
    pub fn survivors(&self, kernel: Option<&TreeMap>, proc: &ProcRoot) -> Survivors {
        let mut alive = self.live_members(kernel, proc);
        alive.retain(|member| member.key() != self.root);
        Survivors::from_alive(alive)
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
        descendants(&processes, |key| {
            (key == root || self.members.contains_key(&key)).then_some(root)
        })
    }
}

/// This boot and host, which identities of members carry.
#[derive(Debug, Clone)]
pub(super) struct Local {
    pub(super) boot_id: String,
    pub(super) host: String,
}

impl Local {
    pub(super) fn identity(&self, key: ProcessKey, comm: &str) -> Identity {
        Identity {
            pid: key.pid,
            start_ticks: key.start_ticks,
            boot_id: self.boot_id.clone(),
            host: self.host.clone(),
            pidfs_ino: None,
            comm: comm.to_owned(),
        }
    }

    /// The identity of a process if it is alive now. One the kernel map holds has not
    /// exited (its exit removes it there): it is read in `/proc` only for a command name
    /// not known yet.
    pub(super) fn alive(
        &self,
        proc: &ProcRoot,
        key: ProcessKey,
        comm: String,
        in_kernel: bool,
    ) -> Option<Identity> {
        if in_kernel && !comm.is_empty() {
            return Some(self.identity(key, &comm));
        }
        let stat = proc.stat(key.pid).ok()?;
        if stat.start_ticks != key.start_ticks || stat.has_exited() {
            return None;
        }
        let comm = if comm.is_empty() { stat.comm } else { comm };
        Some(self.identity(key, &comm))
    }
}

/// What is known of the tree of `root`, the root excluded: each member with its command
/// name (empty until read) and whether the kernel map, read as `kernel`, holds it.
pub(super) fn candidates(
    root: ProcessKey,
    tree: &Tree,
    kernel: &[KernelMember],
) -> BTreeMap<ProcessKey, (String, bool)> {
    let mut candidates: BTreeMap<ProcessKey, (String, bool)> = tree
        .iter()
        .map(|(key, comm)| (*key, (comm.clone(), false)))
        .collect();
    for entry in kernel.iter().filter(|entry| entry.root == root) {
        candidates.entry(entry.member).or_default().1 = true;
    }
    candidates
}

/// What the kernel map holds beyond what was merged at the count `merged_added`: a walk
/// of the map only when the kernel added a member since, or nothing was merged yet.
pub(super) fn kernel_news(
    kernel: Option<&TreeMap>,
    merged_added: Option<u64>,
) -> Vec<KernelMember> {
    match kernel {
        Some(kernel) if Some(kernel.added_count()) != merged_added => kernel.members(),
        _ => Vec::new(),
    }
}
