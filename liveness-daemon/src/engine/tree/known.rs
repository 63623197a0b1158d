//! The process trees as the daemon knows them: which processes belong to which tracked
//! owner.
//!
//! A tree is keyed by its root, the owner's [`ProcessKey`]; its members are the processes
//! descended from the root since it was followed, for life, whatever they were reparented
//! to. The owner's existing descendants are attached from `/proc` when the tree is
//! followed. After that, with eBPF, the kernel adds every new process as it is forked (the
//! kernel's tree map, read here); without it, or for what the kernel map had no room for,
//! a `/proc` scan at an interval attaches the descendants of every known member. A member
//! seen once stays attributed by its fingerprint, so an orphan reparented to init still
//! names its tree.
//!
//! The daemon keeps its own copy of each tree (what it persists across restarts); the
//! kernel map is the live feed that [`KnownTrees::refresh`] merges into it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::session::Survivors;
use liveness_common::status::{MembershipMode, MembershipStatus, PinSetStatus, UidOverShare};
use liveness_proc::identity::{Liveness, ProcRoot};

use super::member::{Facts, Tree};
use super::view::{Local, Merge, RefreshView, TreeView, candidates, kernel_news};
use super::walk::write_member;
use crate::source::tree_map::{KernelMember, TreeMap};
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

/// What [`KnownTrees::forget`] let go of: each forgotten tree with its root (their members'
/// entries are what [`KnownTrees::unlink`] takes out), and for the tree of a nested
/// session's owner, the tree its members move to.
#[derive(Debug, Default)]
pub struct Forgotten {
    pub trees: Vec<(ProcessKey, Arc<Tree>)>,
    pub outer: HashMap<ProcessKey, ProcessKey>,
    /// The kernel's count of added members merged into the trees: the map is walked for
    /// what it added to them since only when the count moved.
    pub merged_added: Option<u64>,
}

/// Sessions nested in each other's trees deeper than this are not followed through.
const MAX_NESTING: usize = 32;

/// What [`KnownTrees::join`] did.
enum Joined {
    No,
    New,
    /// Moved from the tree of this root, which encloses its new tree.
    Moved(ProcessKey),
}

#[derive(Debug)]
pub struct KnownTrees {
    proc: ProcRoot,
    local: Local,
    kernel: Option<TreeMap>,
    /// root -> its members (owners not included), with their command names. Shared with
    /// the [`TreeView`]s handed out, and copied on write only while one is held.
    trees: HashMap<ProcessKey, Arc<Tree>>,
    /// member -> its root. Entries of a forgotten tree stay until [`KnownTrees::unlink`]
    /// takes them out a slice at a time: only those of followed trees count (see
    /// [`KnownTrees::member_of`]).
    root_of: HashMap<ProcessKey, ProcessKey>,
    /// The kernel's count of added members when the last refresh walked the map: while it
    /// stays the same, `trees` holds every member the kernel added.
    merged_added: Option<u64>,
    /// Trees whose root the kernel does not follow (the eBPF source could not track it):
    /// `/proc` scans find their members.
    unrooted: HashSet<ProcessKey>,
    /// Followed roots that were members of a followed tree when they joined it or began to
    /// be followed (nested sessions' owners): the only ones [`KnownTrees::nest`] looks at,
    /// so that a death costs nothing per tree followed. Checked again when read.
    nested: HashSet<ProcessKey>,
    /// Live members the last refresh left without a kernel entry (no slot was free): scans
    /// cover their trees, and each refresh writes them again while slots are free.
    unlinked: usize,
    /// The kernel's count of processes refused a slot when a scan last left no member
    /// without its entry: a refusal since means a scan is due.
    full_merged: u64,
}

impl KnownTrees {
    pub fn new(
        proc: ProcRoot,
        kernel: Option<TreeMap>,
        boot_id: String,
        host: String,
    ) -> KnownTrees {
        KnownTrees {
            proc,
            local: Local { boot_id, host },
            kernel,
            trees: HashMap::new(),
            root_of: HashMap::new(),
            merged_added: None,
            unrooted: HashSet::new(),
            nested: HashSet::new(),
            unlinked: 0,
            full_merged: 0,
        }
    }

    pub fn mode(&self) -> MembershipMode {
        match &self.kernel {
            None => MembershipMode::Scan,
            Some(kernel)
                if self.unlinked > 0
                    || kernel.full_count() != self.full_merged
                    || !self.unrooted.is_empty() =>
            {
                MembershipMode::KernelAndScan
            }
            Some(_) => MembershipMode::Kernel,
        }
    }

    /// Follows the tree of `root` (idempotent). Its members join with
    /// [`KnownTrees::take_back`] (after a restart) and [`KnownTrees::attach_found`] (what
    /// [`TreeView::descendants`] finds off the engine).
    pub fn follow(&mut self, root: ProcessKey) {
        self.trees.entry(root).or_default();
        if self.member_of(root).is_some() {
            self.nested.insert(root);
        }
    }

    /// Takes back the members of `root`'s tree that an earlier run persisted and are still
    /// alive. Returns them, and the persisted members that died.
    pub fn take_back(&mut self, root: ProcessKey, persisted: Vec<Member>) -> Changes {
        let mut changes = Changes::default();
        for member in persisted {
            if self.proc.check_process(member.key, member.pidfs_ino) == Liveness::Alive {
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
    /// [`write_members`](super::walk::write_members)) into their trees, if still followed. Returns those that joined.
    pub fn adopt(&mut self, members: impl IntoIterator<Item = Member>) -> Changes {
        let mut changes = Changes::default();
        for member in members {
            match self.join(&member) {
                Joined::No => continue,
                Joined::New => {}
                Joined::Moved(from) => self.reroot(&member, from),
            }
            changes.added.push(member);
        }
        changes
    }

    /// Adds a member to its tree here only. A member of a tree that encloses its own (the
    /// tree of a nested session's owner) moves to the innermost: it is still in the outer
    /// tree through the inner one.
    fn join(&mut self, member: &Member) -> Joined {
        if member.key == member.root || !self.trees.contains_key(&member.root) {
            return Joined::No;
        }
        let from = match self.member_of(member.key) {
            None => None,
            Some(current) if current != member.root && self.encloses(current, member.root) => {
                Some(current)
            }
            Some(_) => return Joined::No,
        };
        if let Some(tree) = from.and_then(|from| self.trees.get_mut(&from)) {
            Arc::make_mut(tree).remove(&member.key);
        }
        if let Some(tree) = self.trees.get_mut(&member.root) {
            Arc::make_mut(tree).insert(member.key, Facts::of(member));
        }
        self.root_of.insert(member.key, member.root);
        if self.trees.contains_key(&member.key) {
            self.nested.insert(member.key);
        }
        from.map_or(Joined::New, Joined::Moved)
    }

    /// Whether the tree of `outer` holds `inner`, a followed root, as a member: directly, or
    /// through trees nested in between.
    fn encloses(&self, outer: ProcessKey, inner: ProcessKey) -> bool {
        let mut at = inner;
        for _ in 0..MAX_NESTING {
            match self.member_of(at) {
                Some(root) if root == outer => return true,
                Some(root) => at = root,
                None => return false,
            }
        }
        false
    }

    /// The followed roots whose trees are nested in the tree of `root` (their owners are its
    /// members), and `root` itself.
    fn nest(&self, root: ProcessKey) -> Vec<ProcessKey> {
        let mut roots = vec![root];
        roots.extend(self.nested.iter().filter(|&&inner| {
            inner != root && self.trees.contains_key(&inner) && self.encloses(root, inner)
        }));
        roots
    }

    /// Moves a member's kernel entry from the tree of `from` to its tree now.
    fn reroot(&mut self, member: &Member, from: ProcessKey) {
        if let Some(kernel) = &mut self.kernel {
            let entry = KernelMember {
                member: member.key,
                root: from,
            };
            kernel.reroot(entry, member.root);
        }
    }

    /// Takes in a member of the forgotten tree of `from`, a nested session's owner that is a
    /// member of the tree of `member.root`: it stays in the outer tree for life. Returns
    /// whether it joined.
    pub fn move_member(&mut self, member: &Member, from: ProcessKey) -> bool {
        if matches!(self.join(member), Joined::No) {
            return false;
        }
        self.reroot(member, from);
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

    /// Adds a member that existed before its tree was followed to its tree and to the
    /// kernel map (so its own forks join in the kernel); false when it was already known.
    fn attach(&mut self, member: Member) -> bool {
        match self.join(&member) {
            Joined::No => return false,
            Joined::New => {}
            Joined::Moved(from) => {
                self.reroot(&member, from);
                return true;
            }
        }
        let entry = KernelMember {
            member: member.key,
            root: member.root,
        };
        if !self.write_to_kernel(entry)
            && let Some(kernel) = &self.kernel
        {
            kernel.count_refused();
        }
        true
    }

    /// Writes a member's entry to the kernel map, so that its own forks join its tree in
    /// the kernel. False when the map had no slot for it.
    fn write_to_kernel(&mut self, entry: KernelMember) -> bool {
        match &mut self.kernel {
            Some(kernel) => write_member(kernel, &self.proc, entry),
            None => true,
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
            pidfs_ino: self.proc.pidfs_ino_of_key(key),
        };
        (stat.start_ticks == key.start_ticks && self.attach(member.clone())).then_some(member)
    }

    /// The roots of the trees followed.
    pub fn roots(&self) -> impl Iterator<Item = ProcessKey> + '_ {
        self.trees.keys().copied()
    }

    /// Stops following the trees of `roots`. Returns them, for [`KnownTrees::unlink`] to
    /// take their members out here and in the kernel, a slice at a time (with what
    /// [`kernel_news`] finds the kernel added since the last refresh).
    pub fn forget(&mut self, roots: &[ProcessKey]) -> Forgotten {
        let mut forgotten = Forgotten {
            merged_added: self.merged_added,
            ..Forgotten::default()
        };
        for &root in roots {
            if let Some(tree) = self.trees.remove(&root) {
                self.unrooted.remove(&root);
                self.nested.remove(&root);
                forgotten.trees.push((root, tree));
            }
        }
        // A root that is a member of a tree still followed (a nested session) had its
        // entry made its own tree's root while tracked: it goes back to the outer tree, and
        // so does its tree (see `Trees::forget`).
        for &(root, _) in &forgotten.trees {
            if let Some(outer) = self.member_of(root) {
                let entry = KernelMember {
                    member: root,
                    root: outer,
                };
                self.write_to_kernel(entry);
                forgotten.outer.insert(root, outer);
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

    /// What a refresh reads of the trees (see [`RefreshView::read`]), or `None` when it
    /// could find nothing: no tree followed, or every tree its owner alone, with the kernel
    /// following all of them and no member added since the last merge. The copy costs the
    /// engine a few milliseconds a second at 100,000 owners: most of its idle time.
    pub fn refresh_view(&self) -> Option<RefreshView> {
        let nothing_to_read = self.root_of.is_empty()
            && self.mode() == MembershipMode::Kernel
            && self.kernel.as_ref().map(TreeMap::added_count) == self.merged_added;
        if self.trees.is_empty() || nothing_to_read {
            return None;
        }
        let inode = |member: &ProcessKey, root: &ProcessKey| {
            let facts = self.trees.get(root)?.get(member)?;
            facts.pidfs_ino
        };
        Some(RefreshView {
            roots: self.trees.keys().copied().collect(),
            unrooted: self.unrooted.clone(),
            known: self
                .root_of
                .iter()
                .map(|(member, root)| (*member, (*root, inode(member, root))))
                .collect(),
            scan: self.mode() != MembershipMode::Kernel,
            merged_added: self.merged_added,
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

    /// Notes what a refresh merged: the trees hold what the kernel added up to its count,
    /// and how many live members it left without a kernel entry.
    pub fn merged(&mut self, merge: Merge) {
        self.merged_added = merge.added;
        if let Some(full) = merge.full {
            self.unlinked = merge.unlinked;
            if merge.scanned && merge.unlinked == 0 {
                self.full_merged = full;
            }
        }
    }

    /// A whole refresh at once (at shutdown, and in tests): merges what the kernel added,
    /// scans `/proc` where the kernel does not follow every fork, and drops members that
    /// died.
    pub fn refresh(&mut self) -> Changes {
        let Some(view) = self.refresh_view() else {
            let kernel = self.kernel.as_ref();
            self.merged(Merge {
                added: kernel.map(TreeMap::added_count),
                full: kernel.map(TreeMap::full_count),
                unlinked: 0,
                scanned: true,
            });
            return Changes::default();
        };
        let refreshed = view.read(self.kernel.as_mut(), &self.proc);
        let mut changes = self.adopt(refreshed.found);
        for key in refreshed.dead {
            if self.drop_dead(key) {
                changes.removed.push(key);
            }
        }
        self.merged(refreshed.merge);
        changes
    }

    /// The root of the tree `key` belongs to as far as merged (no kernel lookup): itself for
    /// a followed root. A process read with another pidfs inode than the member's took its
    /// pid within its clock tick: it is not the member.
    pub fn known_root_of(&self, key: ProcessKey, pidfs_ino: Option<u64>) -> Option<ProcessKey> {
        if self.trees.contains_key(&key) {
            return Some(key);
        }
        let root = self.member_of(key)?;
        let facts = self.trees.get(&root)?.get(&key)?;
        facts.matches(pidfs_ino).then_some(root)
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

    /// The followed tree the kernel map holds `key` in as a member.
    fn kernel_root_of(&self, key: ProcessKey) -> Option<ProcessKey> {
        self.kernel
            .as_ref()?
            .get(key.pid)
            .filter(|entry| entry.member == key && self.trees.contains_key(&entry.root))
            .map(|entry| entry.root)
    }

    /// What is known of the tree of `root`, the root excluded, with the trees nested in it
    /// (see [`candidates`]).
    fn candidates(
        &self,
        root: ProcessKey,
        kernel: &[KernelMember],
    ) -> BTreeMap<ProcessKey, (Facts, bool)> {
        let (roots, members) = self.nested_members(root);
        candidates(&roots, &members, kernel)
    }

    /// The roots of the trees nested in the tree of `root` (with `root`), and the members of
    /// them all: with the owners of the nested sessions, what they started is in the tree
    /// too, for life.
    fn nested_members(&self, root: ProcessKey) -> (Vec<ProcessKey>, Arc<Tree>) {
        let roots = self.nest(root);
        let tree = |root: &ProcessKey| self.trees.get(root).cloned().unwrap_or_default();
        let members = match roots.as_slice() {
            [only] => tree(only),
            _ => Arc::new(
                roots
                    .iter()
                    .flat_map(|root| {
                        let tree = tree(root);
                        tree.iter()
                            .map(|(key, facts)| (*key, facts.clone()))
                            .collect::<Vec<_>>()
                    })
                    .collect(),
            ),
        };
        (roots, members)
    }

    /// What the kernel map holds beyond what the last refresh merged into `trees`.
    fn kernel_news(&self) -> Vec<KernelMember> {
        kernel_news(self.kernel.as_ref(), self.merged_added)
    }

    fn alive(&self, key: ProcessKey, facts: Facts, in_kernel: bool) -> Option<Identity> {
        self.local.alive(&self.proc, key, facts, in_kernel)
    }

    /// The tree of `root` as known now, to read off the engine (see [`TreeView`]); an
    /// empty one for a root not followed.
    pub fn view(&self, root: ProcessKey) -> TreeView {
        let (roots, members) = self.nested_members(root);
        TreeView {
            root,
            roots,
            members,
            merged_added: self.merged_added,
            local: self.local.clone(),
        }
    }

    /// Another handle on the kernel's members map, for reading [`TreeView`]s.
    pub fn kernel_reader(&self) -> Option<TreeMap> {
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
                    .filter_map(|(key, (facts, in_kernel))| self.alive(key, facts, in_kernel))
                    .collect();
                Survivors::from_alive(alive)
            })
            .collect()
    }

    /// What the mode can miss, and where the kernel has no pidfs, what it can be fooled by.
    fn misses(&self, mode: MembershipMode) -> String {
        let mut misses = mode.misses().to_owned();
        if !self.proc.has_pidfs() {
            misses.push_str(
                "; without pidfs (Linux 6.9+), a process outside the trees that takes a dead member's pid within the member's clock tick (10 ms) is taken for it",
            );
        }
        misses
    }

    pub fn status(&self, scan_interval: Duration) -> MembershipStatus {
        let mode = self.mode();
        let lineage = self.kernel.as_ref().map(TreeMap::lineage);
        MembershipStatus {
            mode,
            trees: self.trees.len() as u64,
            members: self.trees.values().map(|tree| tree.len() as u64).sum(),
            scan_interval_ms: scan_interval.as_millis() as u64,
            kernel_capacity: self.kernel.as_ref().map(TreeMap::capacity),
            kernel_used: self.kernel.as_ref().map(TreeMap::slots_used),
            kernel_full: self.kernel.as_ref().map_or(0, TreeMap::full_count),
            kernel_walks: self.kernel.as_ref().map(TreeMap::walks),
            kernel_share_per_uid: self.kernel.as_ref().map(TreeMap::share),
            lineage_since_ms: lineage.map(|lineage| lineage.since_ms),
            lineage_pins: lineage
                .and_then(|lineage| Some(lineage.pinned.as_ref().ok()?.display().to_string())),
            lineage_unpinned: lineage.and_then(|lineage| lineage.pinned.clone().err()),
            pin_sets: lineage
                .map(|lineage| lineage.pin_sets())
                .unwrap_or_default()
                .into_iter()
                .map(|pins| PinSetStatus {
                    state_dir_exists: pins.owner_exists().unwrap_or(false),
                    path: pins.path.display().to_string(),
                    state_dir: pins
                        .owner
                        .as_ref()
                        .ok()
                        .map(|dir| dir.display().to_string()),
                    unknown_owner: pins.owner.err(),
                })
                .collect(),
            over_share: self
                .kernel
                .as_ref()
                .map(TreeMap::over_share)
                .unwrap_or_default()
                .into_iter()
                .map(|share| UidOverShare {
                    uid: share.uid,
                    used: share.used,
                    refused: share.refused,
                })
                .collect(),
            misses: self.misses(mode),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(pid: u32, start_ticks: u64) -> ProcessKey {
        ProcessKey { pid, start_ticks }
    }

    /// While every tree followed is its owner alone, the kernel follows all of them and
    /// it added no member since the last merge, a refresh has nothing to read, and the
    /// engine copies nothing for it each second; a member the kernel adds makes the next
    /// refresh read again, and so does the tree it joined.
    #[tokio::test]
    async fn a_refresh_reads_nothing_while_each_tree_is_its_owner_alone() {
        use crate::source::ebpf::{EbpfConfig, EbpfSource};
        use crate::source::testutil::{Proc, privileged, wait_until};
        if !privileged("the refresh with the kernel's members map") {
            return;
        }
        let proc = ProcRoot::default();
        let mut source = EbpfSource::start(EbpfConfig::default(), &proc)
            .await
            .expect("the eBPF source");
        let mut kernel = source.take_members().expect("the members map");
        // Forks a sleeper once poked, and ends it when poked again.
        let mut owner = Proc::sh(
            "head -c1 >/dev/null; sleep 30 & head -c1 >/dev/null; kill $!",
            &[],
        );
        let root = owner.key();
        // Its first `head` is forked before its root entry is written: no member yet.
        let children = format!("/proc/{0}/task/{0}/children", root.pid);
        wait_until("the owner forked", || {
            !std::fs::read_to_string(&children)
                .unwrap_or_default()
                .is_empty()
        })
        .await;
        kernel.add_root(root).expect("a root entry");
        let mut known = KnownTrees::new(proc, Some(kernel), "b".into(), "h".into());
        known.follow(root);
        assert!(known.refresh_view().is_some(), "nothing merged yet");
        known.refresh();
        assert_eq!(known.mode(), MembershipMode::Kernel);
        assert!(
            known.refresh_view().is_none(),
            "its owner alone, all merged"
        );

        let added = || known.kernel.as_ref().map(TreeMap::added_count);
        let before = added();
        owner.poke();
        wait_until("the kernel added a member", || added() != before).await;
        assert!(known.refresh_view().is_some(), "the kernel added a member");
        let changes = known.refresh();
        assert!(!changes.added.is_empty(), "{changes:?}");
        assert!(known.refresh_view().is_some(), "a tree with a member");
        owner.poke();
    }

    #[test]
    fn scan_mode_follows_says_what_it_misses() {
        let known = KnownTrees::new(ProcRoot::default(), None, "b".into(), "h".into());
        assert_eq!(known.mode(), MembershipMode::Scan);
        assert!(
            known
                .status(REFRESH_PERIOD)
                .misses
                .contains("between two scans")
        );
    }

    /// Scan-mode known over the real /proc, the tree of this test process not yet
    /// followed, and a sleeping child of it (the caller kills it).
    /// Follows `root` and attaches its descendants at once, as the engine does after its
    /// walk off the engine.
    fn follow_now(known: &mut KnownTrees, root: ProcessKey) -> Changes {
        known.follow(root);
        let found = known.view(root).descendants(&ProcRoot::default());
        known.attach_found(found)
    }

    fn this_process_and_a_child() -> (KnownTrees, ProcessKey, std::process::Child, ProcessKey) {
        let proc = ProcRoot::default();
        let child = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .expect("spawn sleep");
        let me = proc.stat(std::process::id()).unwrap();
        let root = key(me.pid, me.start_ticks);
        let child_key = key(child.id(), proc.stat(child.id()).unwrap().start_ticks);
        let known = KnownTrees::new(proc, None, "b".into(), "h".into());
        (known, root, child, child_key)
    }

    #[test]
    fn a_root_is_never_its_own_survivor() {
        // A root that still shows in /proc as running, as an owner whose death the kernel
        // reported may: its tree's survivors are its members only.
        let (mut known, root, mut child, child_key) = this_process_and_a_child();
        follow_now(&mut known, root);

        // Answered for a batch of roots, in order: one without a tree has none.
        let survivors = known.survivors(&[key(1, 0), root]);
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
        let (mut known, root, mut child, child_key) = this_process_and_a_child();

        let changes = follow_now(&mut known, root);
        assert!(
            changes.added.iter().any(|m| m.key == child_key),
            "the running child joins when its tree is followed: {changes:?}"
        );
        assert_eq!(known.known_root_of(child_key, None), Some(root));
        let live: Vec<ProcessKey> = known
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
        let changes = known.refresh();
        assert!(changes.removed.contains(&child_key), "{changes:?}");
        assert_eq!(known.known_root_of(child_key, None), None);
        // Other tests of this binary may have children of their own in the tree.
        assert!(
            !known
                .forget(&[root])
                .trees
                .iter()
                .any(|(_, tree)| tree.contains_key(&child_key))
        );
        assert_eq!(
            known.known_root_of(root, None),
            None,
            "a forgotten tree is not followed"
        );
    }
}
