//! Process trees: which processes belong to which tracked owner.
//!
//! A tree is keyed by its root, the owner's [`ProcessKey`]; its members are the processes
//! descended from the root since it was followed, for life, whatever they were reparented
//! to. The owner's existing descendants are attached from `/proc` when the tree is
//! followed. After that, with eBPF, the kernel adds every new process as it is forked (the
//! members map, read here); without it, or for what the kernel map had no room for, a
//! `/proc` scan at an interval attaches the descendants of every known member. A member
//! seen once stays attributed by its fingerprint, so an orphan reparented to init still
//! names its tree.
//!
//! The daemon keeps its own copy of each tree (what it persists across restarts); the
//! kernel map is the live feed that [`Membership::refresh`] merges into it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::session::Survivors;
use liveness_common::status::{MembershipMode, MembershipStatus};
use liveness_proc::identity::{Liveness, ProcRoot, Stat};

use crate::source::members_map::{KernelMember, MembersMap};
use crate::store::Member;

/// How often trees are refreshed: the kernel map merged, and `/proc` scanned where the
/// kernel does not follow forks.
pub const REFRESH_PERIOD: Duration = Duration::from_secs(1);

/// What a refresh changed, for the store to persist.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<Member>,
    pub removed: Vec<ProcessKey>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

/// What a refresh reads of the trees: a copy taken on the engine, read off it.
#[derive(Debug, Clone)]
pub struct RefreshView {
    roots: HashSet<ProcessKey>,
    /// member -> its root.
    known: HashMap<ProcessKey, ProcessKey>,
    /// Whether `/proc` is scanned for members (the kernel does not follow every tree).
    scan: bool,
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
    pub fn read(&self, kernel: Option<&MembersMap>, proc: &ProcRoot) -> Refreshed {
        let mut refreshed = Refreshed {
            // Read before the walk: a member added during it changes the count again.
            merged_added: kernel.map(MembersMap::added_count),
            ..Refreshed::default()
        };
        // With a kernel map that never filled, a member it does not hold has died (the exit
        // program removed it), or was never in it; only those are checked in /proc.
        let mut in_kernel = HashSet::new();
        for entry in kernel.map(MembersMap::members).unwrap_or_default() {
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

/// What [`Membership::forget`] let go of: each forgotten tree with its root.
#[derive(Debug, Default)]
pub struct Forgotten {
    pub trees: Vec<(ProcessKey, Arc<Tree>)>,
}

impl Forgotten {
    /// The kernel entries of the forgotten members: with the roots of their trees, what
    /// [`Membership::unlink`] takes out.
    pub fn entries(&self) -> impl Iterator<Item = KernelMember> + '_ {
        self.trees.iter().flat_map(|(root, tree)| {
            tree.keys().map(|&member| KernelMember {
                member,
                root: *root,
            })
        })
    }
}

/// A tree's members (the root not included), with their command names (empty until read).
pub type Tree = BTreeMap<ProcessKey, String>;

/// One tree as the daemon knew it at a moment, for reading what is alive of it off the
/// engine: a walk of the kernel map and a `/proc` read per member cost what the tree's
/// owner chose, and nothing of the engine's.
#[derive(Debug, Clone)]
pub struct TreeView {
    root: ProcessKey,
    members: Arc<Tree>,
    /// The kernel's count of added members merged into `members`.
    merged_added: Option<u64>,
    local: Local,
}

impl TreeView {
    /// Every process of the tree still alive, the root included: what the daemon knew
    /// merged with what the kernel added since (read through `kernel`, a handle of the
    /// members map). Unbounded.
    pub fn live_members(&self, kernel: Option<&MembersMap>, proc: &ProcRoot) -> Vec<Identity> {
        let news = kernel_news(kernel, self.merged_added);
        let mut candidates = candidates(self.root, &self.members, &news);
        candidates.entry(self.root).or_default();
        candidates
            .into_iter()
            .filter_map(|(key, (comm, in_kernel))| self.local.alive(proc, key, comm, in_kernel))
            .collect()
    }

    pub fn root(&self) -> ProcessKey {
        self.root
    }

    /// The survivors of the tree if its session ended now: its live members but the root.
    pub fn survivors(&self, kernel: Option<&MembersMap>, proc: &ProcRoot) -> Survivors {
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
struct Local {
    boot_id: String,
    host: String,
}

impl Local {
    fn identity(&self, key: ProcessKey, comm: &str) -> Identity {
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
    fn alive(
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
fn candidates(
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
fn kernel_news(kernel: Option<&MembersMap>, merged_added: Option<u64>) -> Vec<KernelMember> {
    match kernel {
        Some(kernel) if Some(kernel.added_count()) != merged_added => kernel.members(),
        _ => Vec::new(),
    }
}

#[derive(Debug)]
pub struct Membership {
    proc: ProcRoot,
    local: Local,
    kernel: Option<MembersMap>,
    /// root -> its members (owners not included), with their command names. Shared with
    /// the [`TreeView`]s handed out, and copied on write only while one is held.
    trees: HashMap<ProcessKey, Arc<Tree>>,
    /// member -> its root. Entries of a forgotten tree stay until [`Membership::unlink`]
    /// takes them out a slice at a time: only those of followed trees count (see
    /// [`Membership::member_of`]).
    root_of: HashMap<ProcessKey, ProcessKey>,
    /// The kernel's count of added members when the last refresh walked the map: while it
    /// stays the same, `trees` holds every member the kernel added.
    merged_added: Option<u64>,
    /// Trees whose root the kernel does not follow (the eBPF source could not track it):
    /// `/proc` scans find their members.
    unrooted: HashSet<ProcessKey>,
}

impl Membership {
    pub fn new(
        proc: ProcRoot,
        kernel: Option<MembersMap>,
        boot_id: String,
        host: String,
    ) -> Membership {
        Membership {
            proc,
            local: Local { boot_id, host },
            kernel,
            trees: HashMap::new(),
            root_of: HashMap::new(),
            merged_added: None,
            unrooted: HashSet::new(),
        }
    }

    pub fn mode(&self) -> MembershipMode {
        match &self.kernel {
            None => MembershipMode::Scan,
            Some(kernel) if kernel.full_count() > 0 || !self.unrooted.is_empty() => {
                MembershipMode::KernelAndScan
            }
            Some(_) => MembershipMode::Kernel,
        }
    }

    /// Follows the tree of `root` (idempotent). Its members join with
    /// [`Membership::take_back`] (after a restart) and [`Membership::attach_found`] (what
    /// [`TreeView::descendants`] finds off the engine).
    pub fn follow(&mut self, root: ProcessKey) {
        self.trees.entry(root).or_default();
    }

    /// Takes back the members of `root`'s tree that an earlier run persisted and are still
    /// alive. Returns them, and the persisted members that died.
    pub fn take_back(&mut self, root: ProcessKey, persisted: Vec<Member>) -> Changes {
        let mut changes = Changes::default();
        for member in persisted {
            if self.proc.check_key(member.key) == Liveness::Alive {
                let member = Member { root, ..member };
                if self.attach(member.clone()) {
                    changes.added.push(member);
                }
            } else {
                changes.removed.push(member.key);
            }
        }
        changes
    }

    /// Takes members whose kernel entries were written off the engine (see
    /// [`write_members`]) into their trees, if still followed. Returns those that joined.
    pub fn adopt(&mut self, members: impl IntoIterator<Item = Member>) -> Changes {
        let mut changes = Changes::default();
        for member in members {
            if self.join(&member) {
                changes.added.push(member);
            }
        }
        changes
    }

    /// Adds a member to its tree here only; false when its tree is not followed or it is
    /// a member already.
    fn join(&mut self, member: &Member) -> bool {
        if member.key == member.root || self.member_of(member.key).is_some() {
            return false;
        }
        let Some(tree) = self.trees.get_mut(&member.root) else {
            return false;
        };
        Arc::make_mut(tree).insert(member.key, member.comm.clone());
        self.root_of.insert(member.key, member.root);
        true
    }

    /// Attaches members found off the engine, each to its tree if that is still followed.
    /// Returns those that joined.
    pub fn attach_found(&mut self, found: impl IntoIterator<Item = Member>) -> Changes {
        let mut changes = Changes::default();
        for member in found {
            if self.attach(member.clone()) {
                changes.added.push(member);
            }
        }
        changes
    }

    /// Checks that the kernel follows the forks of `root`, a live owner just tracked: where
    /// the eBPF source could not track it (its map full), the tree is scanned instead.
    pub fn check_rooted(&mut self, root: ProcessKey) {
        if let Some(kernel) = &self.kernel
            && self.trees.contains_key(&root)
            && !kernel.has_root(root)
        {
            tracing::warn!(%root, "the kernel does not follow this owner's forks: its tree is scanned in /proc");
            self.unrooted.insert(root);
        }
    }

    /// Adds a member to its tree and to the kernel map (so its own forks join in the
    /// kernel); false when it was already known.
    fn attach(&mut self, member: Member) -> bool {
        if !self.join(&member) {
            return false;
        }
        self.write_to_kernel(KernelMember {
            member: member.key,
            root: member.root,
        });
        true
    }

    /// A handle of the kernel's members map to write entries with off the engine (see
    /// [`write_members`]).
    pub fn kernel_writer(&self) -> Option<MembersMap> {
        self.kernel_reader()
    }

    /// Writes a member's entry to the kernel map, so that its own forks join its tree in
    /// the kernel.
    fn write_to_kernel(&mut self, entry: KernelMember) {
        if let Some(kernel) = &mut self.kernel {
            write_member(kernel, &self.proc, entry);
        }
    }

    /// Takes `key` into its tree now if the kernel map holds it as a member, one the last
    /// refresh has not merged yet: tracking it makes its entry there its own tree's root (a
    /// nested session), after which only this copy says it is a member. Returns it when it
    /// joined.
    pub fn merge_member(&mut self, key: ProcessKey) -> Option<Member> {
        if self.member_of(key).is_some() {
            return None;
        }
        let root = self.kernel_root_of(key)?;
        let stat = self.proc.stat(key.pid).ok()?;
        let member = Member {
            key,
            root,
            comm: stat.comm,
        };
        (stat.start_ticks == key.start_ticks && self.attach(member.clone())).then_some(member)
    }

    /// The roots of the trees followed.
    pub fn roots(&self) -> impl Iterator<Item = ProcessKey> + '_ {
        self.trees.keys().copied()
    }

    /// Stops following the trees of `roots`. Returns them, for [`Membership::unlink`] to
    /// take their members out here and in the kernel, a slice at a time (with what
    /// [`kernel_entries_of`] finds the kernel added since the last refresh).
    pub fn forget(&mut self, roots: &[ProcessKey]) -> Forgotten {
        let mut forgotten = Forgotten::default();
        for &root in roots {
            if let Some(tree) = self.trees.remove(&root) {
                self.unrooted.remove(&root);
                forgotten.trees.push((root, tree));
            }
        }
        // A root that is a member of a tree still followed (a nested session) had its
        // entry made its own tree's root while tracked: it goes back to the outer tree.
        for &(root, _) in &forgotten.trees {
            if let Some(outer) = self.member_of(root) {
                self.write_to_kernel(KernelMember {
                    member: root,
                    root: outer,
                });
            }
        }
        forgotten
    }

    /// Takes the members of forgotten trees out: here, unless a tree followed since holds
    /// them, and in the kernel, unless their tree is followed again.
    pub fn unlink(&mut self, entries: &[KernelMember]) {
        for &entry in entries {
            if self.root_of.get(&entry.member) == Some(&entry.root)
                && !self.trees.contains_key(&entry.root)
            {
                self.root_of.remove(&entry.member);
            }
            if let Some(kernel) = &mut self.kernel
                && !self.trees.contains_key(&entry.root)
            {
                kernel.remove(entry);
            }
        }
    }

    /// What a refresh reads of the trees (see [`RefreshView::read`]), or `None` with no
    /// tree followed.
    pub fn refresh_view(&self) -> Option<RefreshView> {
        if self.trees.is_empty() {
            return None;
        }
        Some(RefreshView {
            roots: self.trees.keys().copied().collect(),
            known: self.root_of.clone(),
            scan: self.mode() != MembershipMode::Kernel,
        })
    }

    /// Drops a member found dead. Returns whether it was one.
    pub fn drop_dead(&mut self, key: ProcessKey) -> bool {
        let Some(root) = self.member_of(key) else {
            return false;
        };
        self.root_of.remove(&key);
        if let Some(tree) = self.trees.get_mut(&root) {
            Arc::make_mut(tree).remove(&key);
        }
        true
    }

    /// Notes that the trees hold what the kernel added up to its count `added`.
    pub fn merged(&mut self, added: Option<u64>) {
        self.merged_added = added;
    }

    /// A whole refresh at once (at shutdown, and in tests): merges what the kernel added,
    /// scans `/proc` where the kernel does not follow every fork, and drops members that
    /// died.
    pub fn refresh(&mut self) -> Changes {
        let Some(view) = self.refresh_view() else {
            self.merged_added = self.kernel.as_ref().map(MembersMap::added_count);
            return Changes::default();
        };
        let refreshed = view.read(self.kernel.as_ref(), &self.proc);
        let mut changes = self.attach_found(refreshed.found);
        for key in refreshed.dead {
            if self.drop_dead(key) {
                changes.removed.push(key);
            }
        }
        self.merged_added = refreshed.merged_added;
        changes
    }

    /// The root of the tree `key` belongs to as far as merged (no kernel lookup): itself for
    /// a followed root.
    pub fn known_root_of(&self, key: ProcessKey) -> Option<ProcessKey> {
        if self.trees.contains_key(&key) {
            return Some(key);
        }
        self.member_of(key)
    }

    /// The followed tree `key` is a member of, as merged.
    fn member_of(&self, key: ProcessKey) -> Option<ProcessKey> {
        self.root_of
            .get(&key)
            .copied()
            .filter(|root| self.trees.contains_key(root))
    }

    /// Whether the tree of `root` is followed.
    pub fn follows(&self, root: ProcessKey) -> bool {
        self.trees.contains_key(&root)
    }

    /// The root of the tree `key` belongs to: itself for a followed root.
    pub fn root_of(&self, key: ProcessKey) -> Option<ProcessKey> {
        if self.trees.contains_key(&key) {
            return Some(key);
        }
        if let Some(root) = self.member_of(key) {
            return Some(root);
        }
        // Forked since the last refresh.
        self.kernel_root_of(key)
    }

    /// The followed tree the kernel map holds `key` in as a member.
    fn kernel_root_of(&self, key: ProcessKey) -> Option<ProcessKey> {
        self.kernel
            .as_ref()?
            .get(key.pid)
            .filter(|entry| entry.member == key && self.trees.contains_key(&entry.root))
            .map(|entry| entry.root)
    }

    /// What is known of the tree of `root`, the root excluded (see [`candidates`]).
    fn candidates(
        &self,
        root: ProcessKey,
        kernel: &[KernelMember],
    ) -> BTreeMap<ProcessKey, (String, bool)> {
        let empty = Tree::new();
        candidates(
            root,
            self.trees.get(&root).map_or(&empty, |tree| tree),
            kernel,
        )
    }

    /// What the kernel map holds beyond what the last refresh merged into `trees`.
    fn kernel_news(&self) -> Vec<KernelMember> {
        kernel_news(self.kernel.as_ref(), self.merged_added)
    }

    fn alive(&self, key: ProcessKey, comm: String, in_kernel: bool) -> Option<Identity> {
        self.local.alive(&self.proc, key, comm, in_kernel)
    }

    /// The tree of `root` as known now, to read off the engine (see [`TreeView`]); an
    /// empty one for a root not followed.
    pub fn view(&self, root: ProcessKey) -> TreeView {
        TreeView {
            root,
            members: self.trees.get(&root).cloned().unwrap_or_default(),
            merged_added: self.merged_added,
            local: self.local.clone(),
        }
    }

    /// Another handle on the kernel's members map, for reading [`TreeView`]s.
    pub fn kernel_reader(&self) -> Option<MembersMap> {
        let kernel = self.kernel.as_ref()?;
        kernel
            .try_clone()
            .inspect_err(|e| tracing::warn!(error = %e, "cannot open a reader of the members map"))
            .ok()
    }

    /// The survivors of the trees of `roots`, for sessions that end now: one for each, in
    /// order. A root is never its own survivor: an owner whose death the kernel reported
    /// may still show in `/proc` as running. The kernel map is read once for all of them,
    /// and a root without members costs no `/proc` read, so that an ending stays cheap.
    pub fn survivors(&self, roots: &[ProcessKey]) -> Vec<Survivors> {
        // A tree with members known takes the whole map, which spares a /proc read for each
        // member it holds; empty trees need only what the kernel added since the last refresh.
        let known = roots
            .iter()
            .any(|root| self.trees.get(root).is_some_and(|tree| !tree.is_empty()));
        let kernel = match &self.kernel {
            Some(kernel) if known => kernel.members(),
            _ if roots.iter().any(|root| self.trees.contains_key(root)) => self.kernel_news(),
            _ => Vec::new(),
        };
        roots
            .iter()
            .map(|&root| {
                let alive = self
                    .candidates(root, &kernel)
                    .into_iter()
                    .filter(|(key, _)| *key != root)
                    .filter_map(|(key, (comm, in_kernel))| self.alive(key, comm, in_kernel))
                    .collect();
                Survivors::from_alive(alive)
            })
            .collect()
    }

    pub fn status(&self, scan_interval: Duration) -> MembershipStatus {
        let mode = self.mode();
        MembershipStatus {
            mode,
            trees: self.trees.len() as u64,
            members: self.trees.values().map(|tree| tree.len() as u64).sum(),
            scan_interval_ms: scan_interval.as_millis() as u64,
            kernel_capacity: self.kernel.as_ref().map(MembersMap::capacity),
            kernel_used: self.kernel.as_ref().map(MembersMap::slots_used),
            kernel_full: self.kernel.as_ref().map_or(0, MembersMap::full_count),
            misses: mode.misses().to_owned(),
        }
    }
}

/// `starts` and every process descended from them, found through the kernel's lists of
/// children: proportional to the tree, not to the machine's processes. `None` where the
/// kernel has no such lists.
fn subtree(proc: &ProcRoot, starts: &[ProcessKey]) -> Option<Vec<Stat>> {
    let mut found = Vec::new();
    let mut queue: Vec<u32> = starts.iter().map(|key| key.pid).collect();
    let mut seen: HashSet<u32> = queue.iter().copied().collect();
    while let Some(pid) = queue.pop() {
        let Ok(stat) = proc.stat(pid) else {
            continue;
        };
        match proc.children(pid) {
            Ok(children) => {
                queue.extend(children.into_iter().filter(|child| seen.insert(*child)));
            }
            Err(liveness_proc::identity::IdentityError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound && proc.stat(pid).is_ok() =>
            {
                return None;
            }
            // Gone meanwhile.
            Err(_) => {}
        }
        found.push(stat);
    }
    Some(found)
}

/// Writes a member's entry to the kernel map, so that its own forks join its tree in the
/// kernel.
fn write_member(kernel: &mut MembersMap, proc: &ProcRoot, entry: KernelMember) {
    match kernel.insert(entry) {
        // A process that exited before its entry was written (a zombie still shows in
        // /proc) had nothing for its exit to remove: the entry would outlive it, and the
        // map's word is that its members are alive. Checked after the write, so an exit
        // after the check finds the entry and removes it.
        Ok(true) if proc.check_key(entry.member) != Liveness::Alive => {
            kernel.remove(entry);
        }
        Ok(_) => {}
        // No slot left: counted as full, so scans cover the trees from now on.
        Err(error) => {
            tracing::debug!(%error, member = %entry.member, "cannot add a member to the kernel map");
        }
    }
}

/// Writes the kernel entries of members found off the engine, there too: the engine then
/// only [`Membership::adopt`]s them.
pub fn write_members(kernel: Option<&mut MembersMap>, proc: &ProcRoot, members: &[Member]) {
    if let Some(kernel) = kernel {
        for member in members {
            let entry = KernelMember {
                member: member.key,
                root: member.root,
            };
            write_member(kernel, proc, entry);
        }
    }
}

/// The kernel map's entries of members of `roots`, by a walk of the map: what the kernel
/// added to forgotten trees since they were last merged.
pub fn kernel_entries_of(kernel: &MembersMap, roots: &HashSet<ProcessKey>) -> Vec<KernelMember> {
    kernel
        .members()
        .into_iter()
        .filter(|entry| roots.contains(&entry.root))
        .collect()
}

/// The processes descended from a process that `tree_of` places in a tree, each with that
/// tree's root. A process whose parent is unknown to `processes` (it exited) is found only
/// through a known ancestor, which is why members are remembered by fingerprint.
pub(super) fn descendants(
    processes: &[Stat],
    tree_of: impl Fn(ProcessKey) -> Option<ProcessKey>,
) -> Vec<Member> {
    let mut children: HashMap<u32, Vec<&Stat>> = HashMap::new();
    for stat in processes {
        children.entry(stat.ppid).or_default().push(stat);
    }
    let mut found = Vec::new();
    let mut queue: Vec<(&Stat, ProcessKey)> = processes
        .iter()
        .filter_map(|stat| {
            let key = ProcessKey {
                pid: stat.pid,
                start_ticks: stat.start_ticks,
            };
            Some((stat, tree_of(key)?))
        })
        .collect();
    let mut seen: HashSet<u32> = queue.iter().map(|(stat, _)| stat.pid).collect();
    while let Some((parent, root)) = queue.pop() {
        for &child in children
            .get(&parent.pid)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            // A child cannot start before its parent: an older process with a parent of
            // this pid had an earlier parent that the pid was reused from.
            if child.start_ticks < parent.start_ticks || !seen.insert(child.pid) {
                continue;
            }
            found.push(Member {
                key: ProcessKey {
                    pid: child.pid,
                    start_ticks: child.start_ticks,
                },
                root,
                comm: child.comm.clone(),
            });
            queue.push((child, root));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, ppid: u32, start_ticks: u64) -> Stat {
        Stat {
            pid,
            comm: format!("p{pid}"),
            state: 'S',
            ppid,
            flags: 0,
            utime: 0,
            stime: 0,
            num_threads: 1,
            start_ticks,
        }
    }

    fn key(pid: u32, start_ticks: u64) -> ProcessKey {
        ProcessKey { pid, start_ticks }
    }

    #[test]
    fn descendants_of_roots_and_members_are_found_with_their_root() {
        let processes = [
            stat(1, 0, 1),
            stat(10, 1, 100), // root
            stat(11, 10, 110),
            stat(12, 11, 120),
            stat(20, 1, 105), // an orphan member, reparented to init
            stat(21, 20, 130),
            stat(30, 1, 90), // unrelated
            stat(31, 30, 95),
        ];
        let root = key(10, 100);
        let mut found = descendants(&processes, |k| {
            (k == root || k == key(20, 105)).then_some(root)
        });
        found.sort_by_key(|m| m.key);
        let keys: Vec<ProcessKey> = found.iter().map(|m| m.key).collect();
        assert_eq!(keys, [key(11, 110), key(12, 120), key(21, 130)]);
        assert!(found.iter().all(|m| m.root == root), "{found:?}");
    }

    #[test]
    fn a_child_older_than_its_parent_belongs_to_a_reused_pid() {
        // pid 10 was reused: 11's parent was an earlier process 10.
        let processes = [stat(10, 1, 500), stat(11, 10, 400), stat(12, 10, 600)];
        let found = descendants(&processes, |k| (k == key(10, 500)).then_some(k));
        let keys: Vec<ProcessKey> = found.iter().map(|m| m.key).collect();
        assert_eq!(keys, [key(12, 600)]);
    }

    #[test]
    fn scan_mode_follows_says_what_it_misses() {
        let membership = Membership::new(ProcRoot::default(), None, "b".into(), "h".into());
        assert_eq!(membership.mode(), MembershipMode::Scan);
        assert!(
            membership
                .status(REFRESH_PERIOD)
                .misses
                .contains("between two scans")
        );
    }

    /// Scan-mode membership over the real /proc, the tree of this test process not yet
    /// followed, and a sleeping child of it (the caller kills it).
    /// Follows `root` and attaches its descendants at once, as the engine does after its
    /// walk off the engine.
    fn follow_now(membership: &mut Membership, root: ProcessKey) -> Changes {
        membership.follow(root);
        let found = membership.view(root).descendants(&ProcRoot::default());
        membership.attach_found(found)
    }

    fn this_process_and_a_child() -> (Membership, ProcessKey, std::process::Child, ProcessKey) {
        let proc = ProcRoot::default();
        let child = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .expect("spawn sleep");
        let me = proc.stat(std::process::id()).unwrap();
        let root = key(me.pid, me.start_ticks);
        let child_key = key(child.id(), proc.stat(child.id()).unwrap().start_ticks);
        let membership = Membership::new(proc, None, "b".into(), "h".into());
        (membership, root, child, child_key)
    }

    #[test]
    fn a_root_is_never_its_own_survivor() {
        // A root that still shows in /proc as running, as an owner whose death the kernel
        // reported may: its tree's survivors are its members only.
        let (mut membership, root, mut child, child_key) = this_process_and_a_child();
        follow_now(&mut membership, root);

        // Answered for a batch of roots, in order: one without a tree has none.
        let survivors = membership.survivors(&[key(1, 0), root]);
        child.kill().unwrap();
        child.wait().unwrap();
        let [none, survivors] = survivors.as_slice() else {
            panic!("one Survivors per root: {survivors:?}");
        };
        assert_eq!(none.total, 0, "a root without a tree: {none:?}");
        let listed: Vec<ProcessKey> = survivors.members.iter().map(Identity::key).collect();
        assert!(
            listed.contains(&child_key),
            "the child survives: {listed:?}"
        );
        assert!(!listed.contains(&root), "the root is listed: {listed:?}");
        assert_eq!(survivors.total as usize, listed.len(), "{survivors:?}");
    }

    #[test]
    fn a_live_child_is_attached_and_a_dead_one_dropped() {
        let (mut membership, root, mut child, child_key) = this_process_and_a_child();

        let changes = follow_now(&mut membership, root);
        assert!(
            changes.added.iter().any(|m| m.key == child_key),
            "the running child joins when its tree is followed: {changes:?}"
        );
        assert_eq!(membership.root_of(child_key), Some(root));
        let live: Vec<ProcessKey> = membership
            .view(root)
            .live_members(None, &ProcRoot::default())
            .iter()
            .map(Identity::key)
            .collect();
        assert!(
            live.contains(&child_key) && live.contains(&root),
            "{live:?}"
        );

        child.kill().unwrap();
        child.wait().unwrap();
        let changes = membership.refresh();
        assert!(changes.removed.contains(&child_key), "{changes:?}");
        assert_eq!(membership.root_of(child_key), None);
        // Other tests of this binary may have children of their own in the tree.
        assert!(
            !membership
                .forget(&[root])
                .entries()
                .any(|e| e.member == child_key)
        );
        assert_eq!(
            membership.root_of(root),
            None,
            "a forgotten tree is not followed"
        );
    }
}
