//! Process trees, the engine's concern: following an owner's tree while it owns ACTIVE
//! sessions ([`known`]), persisting its members, the survivors of an ending, and the views
//! the connections and the reaps read off the engine ([`view`], [`walk`]).
//!
//! What costs as much as a tree (walking `/proc` for an owner's existing descendants,
//! walking the kernel map for what it added to a forgotten tree) runs off the engine, and
//! what it finds comes back as [`TreeWork`], done a slice of [`TREE_SLICE`] at a time, at
//! most one slice every [`TREE_PERIOD`] and only when nothing else is ready: a user's big
//! tree neither holds another user's death nor keeps the engine's thread off the CPU that
//! a death wakes it for. What the work is about is bounded by the machine's processes:
//! what was found for a tree forgotten meanwhile is dropped when it arrives.

use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::session::Survivors;
use liveness_common::status::MembershipStatus;
use liveness_proc::identity::ProcRoot;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::fair::offload::{offload, offload_for};
use crate::source::tree_map::{KernelMember, TreeMap};
use crate::store::{Member, Store};
use known::KnownTrees;
use member::Facts;
use view::{Merge, kernel_added_since, kernel_news};
use walk::{orphaned_before, write_members};

mod known;
mod member;
mod view;
mod walk;

pub(crate) use known::REFRESH_PERIOD;
pub use view::{KernelMembers, TreeView};
pub(crate) use walk::descendants;

/// How long one turn of the engine may spend on tree work: what a death that arrives
/// meanwhile waits at most, besides its own handling.
const TREE_SLICE: Duration = Duration::from_micros(200);
/// One slice of tree work at most this often: the engine's thread spends at most a fifth
/// of its time on it, and stays a thread the scheduler wakes at once.
pub(super) const TREE_PERIOD: Duration = Duration::from_millis(1);

/// An answer that waits for the walk of its session's tree: what sends it.
pub(super) struct Parked(pub(super) Box<dyn FnOnce() + Send>);

impl std::fmt::Debug for Parked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Parked")
    }
}

/// Why a tree is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    /// A session of its owner was registered by `uid`, whose turns the walk of the tree
    /// takes: its size is that user's choice.
    Registration { uid: u32 },
    /// The daemon started, and an ACTIVE session of its owner was in the store.
    Restart,
}

/// A piece of tree bookkeeping found off the engine.
#[derive(Debug)]
pub(super) enum TreeWork {
    /// What a walk found under a tree that began to be followed, with their kernel
    /// entries written already: taken in at once, and the replies that waited for it sent.
    Adopted {
        root: ProcessKey,
        members: Vec<Member>,
    },
    /// A member a refresh found (in the kernel's map, or in `/proc` with its kernel entry
    /// written already).
    Found(Member),
    /// A member of a forgotten tree: its kernel entry and its persisted row go.
    Unlink(KernelMember),
    /// A member of the forgotten tree of `from`, a nested session's owner, that moves to
    /// the tree holding that owner (`member.root`).
    Move { member: Member, from: ProcessKey },
    /// A member a refresh found dead.
    Dead(ProcessKey),
    /// The end of a refresh's findings (see [`Merge`]).
    Merged(Merge),
}

/// The trees of tracked owners, and the tree work under way off the engine.
#[derive(Debug)]
pub(super) struct Trees {
    known: KnownTrees,
    proc: ProcRoot,
    /// This boot: only its owners have trees here.
    boot_id: String,
    /// A handle of the kernel's tree map for reading trees off the engine (connections'
    /// `processes`, reaps).
    reader: Option<Arc<TreeMap>>,
    /// A handle of the kernel's tree map for the walks off the engine to write with.
    writer: Option<Arc<Mutex<TreeMap>>>,
    /// Tree work found off the engine, done a slice at a time.
    work: VecDeque<TreeWork>,
    /// Walks of `/proc` and of the kernel map under way, off the engine.
    walks: JoinSet<Vec<TreeWork>>,
    /// A refresh of the trees is under way (walking, or its findings queued).
    refreshing: bool,
    /// Trees being walked off the engine, with the answers that wait for their walk.
    walking: HashMap<ProcessKey, Vec<Parked>>,
    /// Members to persist at the next refresh (`None`: to forget).
    unsaved: HashMap<ProcessKey, Option<Member>>,
}

impl Trees {
    /// The trees of this boot's owners, fed by `kernel` (the kernel's tree map) where the
    /// eBPF source runs.
    pub(super) fn new(
        proc: ProcRoot,
        kernel: Option<TreeMap>,
        boot_id: String,
        host: String,
    ) -> Trees {
        let known = KnownTrees::new(proc.clone(), kernel, boot_id.clone(), host);
        Trees {
            reader: known.kernel_reader().map(Arc::new),
            writer: known
                .kernel_reader()
                .map(|writer| Arc::new(Mutex::new(writer))),
            known,
            proc,
            boot_id,
            work: VecDeque::new(),
            walks: JoinSet::new(),
            refreshing: false,
            walking: HashMap::new(),
            unsaved: HashMap::new(),
        }
    }

    /// A handle of the kernel's tree map, for reading trees off the engine.
    pub(super) fn reader(&self) -> Option<Arc<TreeMap>> {
        self.reader.clone()
    }

    /// Follows the tree of a live owner of this boot. After a restart, the members an
    /// earlier run persisted (in `store`) are taken back; at a registration, only what the
    /// owner's processes are now (what a session that ended left behind is not the new
    /// one's). Its descendants in `/proc` are found off the engine.
    pub(super) fn follow(&mut self, owner: &Identity, start: Start, store: &Store) {
        let root = owner.key();
        // Followed already (another session of the owner): nothing is new.
        if self.known.follows(root) {
            return;
        }
        self.known.follow(root);
        if start == Start::Restart {
            let persisted = store.members_of(root).unwrap_or_else(|e| {
                tracing::error!(error = %e, %root, "cannot read persisted members");
                Vec::new()
            });
            let changes = self.known.take_back(root, persisted);
            self.save(&changes.added, &changes.removed);
        }
        // Answers about the session wait for the walk (see `Trees::answer`): what the
        // owner forks or orphans once its client has heard back is in the tree.
        self.walking.entry(root).or_default();
        let view = self.known.view(root);
        let (proc, writer) = (self.proc.clone(), self.writer.clone());
        self.walks.spawn(async move {
            let walk = move || {
                let mut members = view.descendants(&proc);
                let mut writer = writer
                    .as_ref()
                    .map(|writer| writer.lock().unwrap_or_else(PoisonError::into_inner));
                // At a restart too: pinned lineage programs recorded what the owner forked
                // and orphaned while no daemon ran.
                if let Some(kernel) = writer.as_deref() {
                    members.extend(orphaned_before(kernel, &proc, root, &members));
                }
                write_members(writer.as_deref_mut(), &proc, &members);
                members
            };
            let found = match start {
                Start::Registration { uid } => offload_for(uid, walk).await,
                Start::Restart => offload(walk).await,
            };
            let members = found.unwrap_or_default();
            vec![TreeWork::Adopted { root, members }]
        });
    }

    /// Checks that the kernel follows the forks of `root`, a live owner just tracked (see
    /// [`KnownTrees::check_rooted`]).
    pub(super) fn check_rooted(&mut self, root: ProcessKey) {
        self.known.check_rooted(root);
    }

    /// Sends an answer at once, or once the walk of the tree of `root` is done, if one is
    /// under way.
    pub(super) fn answer(&mut self, root: Option<ProcessKey>, send: Parked) {
        match root.and_then(|root| self.walking.get_mut(&root)) {
            Some(waiting) => waiting.push(send),
            None => (send.0)(),
        }
    }

    /// Follows the tree of an owner that died while no daemon ran, at start: its
    /// descendants are found now, so that the ending lists them.
    pub(super) fn follow_now(&mut self, owner: &Identity, store: &Store) {
        self.follow(owner, Start::Restart, store);
        let found = self.known.view(owner.key()).descendants(&self.proc);
        let changes = self.known.attach_found(found);
        self.save(&changes.added, &changes.removed);
    }

    /// Whether tree work found off the engine waits to be done.
    pub(super) fn has_work(&self) -> bool {
        !self.work.is_empty()
    }

    /// Does the tree work found off the engine for at most [`TREE_SLICE`].
    pub(super) fn step(&mut self) {
        let deadline = Instant::now() + TREE_SLICE;
        let (mut added, mut removed) = (Vec::new(), Vec::new());
        while Instant::now() < deadline {
            match self.work.pop_front() {
                Some(TreeWork::Found(member)) => {
                    added.extend(self.known.adopt([member]).added);
                }
                Some(TreeWork::Unlink(entry)) => {
                    self.known.unlink(&[entry]);
                    removed.push(entry.member);
                }
                Some(TreeWork::Move { member, from }) => {
                    if self.known.move_member(&member, from) {
                        added.push(member);
                    } else if self.known.known_root_of(member.key, None).is_none() {
                        // Its outer tree is forgotten too.
                        let entry = KernelMember {
                            member: member.key,
                            root: from,
                        };
                        self.known.unlink(&[entry]);
                        removed.push(member.key);
                    }
                }
                Some(TreeWork::Dead(key)) => {
                    if self.known.drop_dead(key) {
                        removed.push(key);
                    }
                }
                Some(TreeWork::Merged(merge)) => {
                    self.known.merged(merge);
                    self.refreshing = false;
                }
                Some(TreeWork::Adopted { root, members }) => self.adopt(root, members),
                None => break,
            }
        }
        self.save(&added, &removed);
    }

    /// What the next walk off the engine found; pending while none is under way.
    /// Cancel-safe.
    pub(super) async fn walked(&mut self) -> Vec<TreeWork> {
        match self.walks.join_next().await {
            Some(found) => found.unwrap_or_default(),
            None => std::future::pending().await,
        }
    }

    /// Takes what a walk off the engine found: a new tree's members at once, the rest
    /// queued (but for trees forgotten meanwhile).
    pub(super) fn found(&mut self, found: Vec<TreeWork>) {
        for work in found {
            match work {
                TreeWork::Adopted { root, members } => self.adopt(root, members),
                // Its entry goes again, unless its tree is followed again by then.
                TreeWork::Found(member) if !self.known.follows(member.root) => {
                    self.work.push_back(TreeWork::Unlink(KernelMember {
                        member: member.key,
                        root: member.root,
                    }));
                }
                work => self.work.push_back(work),
            }
        }
    }

    /// Takes in the members a walk found under `root` and sends the answers that waited.
    /// Their kernel entries are taken out again if the tree was forgotten meanwhile.
    fn adopt(&mut self, root: ProcessKey, members: Vec<Member>) {
        if self.known.follows(root) {
            let changes = self.known.adopt(members);
            self.save(&changes.added, &[]);
        } else {
            let entries = members.iter().map(|member| KernelMember {
                member: member.key,
                root,
            });
            self.work.extend(entries.map(TreeWork::Unlink));
        }
        for send in self.walking.remove(&root).unwrap_or_default() {
            (send.0)();
        }
    }

    /// Waits for the walks under way and does all the tree work left (at shutdown, and in
    /// tests that look at trees at once).
    pub(super) async fn finish(&mut self) {
        while let Some(found) = self.walks.join_next().await {
            self.found(found.unwrap_or_default());
        }
        while self.has_work() {
            self.step();
        }
    }

    /// Keeps an owner about to be tracked in the tree it is a member of, if any (see
    /// [`KnownTrees::merge_member`]).
    pub(super) fn keep_member(&mut self, owner: &Identity) {
        if let Some(member) = self.known.merge_member(owner.key()) {
            self.save(&[member], &[]);
        }
    }

    /// Stops following the trees of owners no ACTIVE session refers to.
    pub(super) fn forget<'a>(&mut self, owners: impl IntoIterator<Item = &'a Identity>) {
        let roots: Vec<ProcessKey> = owners
            .into_iter()
            .filter(|owner| owner.boot_id == self.boot_id)
            .map(Identity::key)
            .collect();
        let forgotten = self.known.forget(&roots);
        // Most trees are their owner alone: with no member known and none added by the
        // kernel since the last merge, there is nothing to take out, and no hand-off to the
        // blocking pool per death.
        let nothing_to_unlink = forgotten.trees.iter().all(|(_, tree)| tree.is_empty())
            && !kernel_added_since(self.reader.as_deref(), forgotten.merged_added);
        if nothing_to_unlink {
            return;
        }
        // Their members are listed, and what the kernel added to them since the last
        // refresh found by a walk of its map, off the engine. Those of a nested session's
        // owner that lives on in another tree move to that tree.
        let (kernel, proc) = (self.reader.clone(), self.proc.clone());
        self.walks.spawn(async move {
            let found = offload(move || {
                let roots: HashSet<ProcessKey> =
                    forgotten.trees.iter().map(|(root, _)| *root).collect();
                // A walk of the map only when the kernel added a member since the trees
                // were merged: most deaths leave nothing the kernel added unmerged, and a
                // walk of a big hash map costs a system call per entry.
                let news = kernel_news(kernel.as_deref(), forgotten.merged_added)
                    .into_iter()
                    .filter(|entry| roots.contains(&entry.root));
                let known = forgotten.trees.iter().flat_map(|(root, tree)| {
                    tree.iter().map(|(key, facts)| (*root, *key, facts.clone()))
                });
                let news = news.map(|entry| {
                    let facts = Facts {
                        comm: String::new(),
                        pidfs_ino: proc.pidfs_ino_of_key(entry.member),
                    };
                    (entry.root, entry.member, facts)
                });
                known
                    .chain(news)
                    .map(|(from, key, facts)| match forgotten.outer.get(&from) {
                        Some(&outer) => TreeWork::Move {
                            member: Member {
                                key,
                                root: outer,
                                comm: facts.comm,
                                pidfs_ino: facts.pidfs_ino,
                            },
                            from,
                        },
                        None => TreeWork::Unlink(KernelMember {
                            member: key,
                            root: from,
                        }),
                    })
                    .collect::<Vec<_>>()
            });
            found.await.unwrap_or_default()
        });
    }

    /// Persists what changed, and starts a refresh of the trees off the engine (see
    /// [`view::RefreshView::read`]), unless one is under way.
    pub(super) fn refresh(&mut self, store: &mut Store) {
        self.persist(store);
        if self.refreshing {
            return;
        }
        let Some(view) = self.known.refresh_view() else {
            self.known.refresh();
            return;
        };
        self.refreshing = true;
        let (writer, proc) = (self.writer.clone(), self.proc.clone());
        self.walks.spawn(async move {
            let read = offload(move || {
                let mut writer = writer
                    .as_ref()
                    .map(|writer| writer.lock().unwrap_or_else(PoisonError::into_inner));
                view.read(writer.as_deref_mut(), &proc)
            });
            let Some(refreshed) = read.await else {
                return vec![TreeWork::Merged(Merge::default())];
            };
            let found = refreshed.found.into_iter().map(TreeWork::Found);
            let dead = refreshed.dead.into_iter().map(TreeWork::Dead);
            found
                .chain(dead)
                .chain([TreeWork::Merged(refreshed.merge)])
                .collect()
        });
    }

    /// A whole refresh at once, at shutdown: what the kernel added, for the next run.
    pub(super) fn refresh_now(&mut self, store: &mut Store) {
        let changes = self.known.refresh();
        self.save(&changes.added, &changes.removed);
        self.persist(store);
    }

    /// Notes members to persist, for [`Trees::persist`]: a commit per change of a big
    /// tree would cost the engine as much as the tree.
    fn save(&mut self, added: &[Member], removed: &[ProcessKey]) {
        for member in added {
            self.unsaved.insert(member.key, Some(member.clone()));
        }
        for key in removed {
            self.unsaved.insert(*key, None);
        }
    }

    /// Persists the members noted since the last time, in one transaction: at each refresh
    /// of the trees, and when the engine stops. A member forked less than a refresh period
    /// before a crash may be unknown to the next start, as one the kernel added since the
    /// last refresh already is.
    pub(super) fn persist(&mut self, store: &mut Store) {
        if self.unsaved.is_empty() {
            return;
        }
        let (mut added, mut removed) = (Vec::new(), Vec::new());
        for (key, member) in self.unsaved.drain() {
            match member {
                Some(member) => added.push(member),
                None => removed.push(key),
            }
        }
        if let Err(e) = store.save_members(&added, &removed) {
            // Only a restart's knowledge of orphans depends on it; the daemon goes on.
            tracing::warn!(error = %e, "cannot persist process-tree members");
        }
    }

    /// At start, once the trees of the ACTIVE owners are followed: the members persisted
    /// for trees whose owner died or moved on while no daemon ran are dropped.
    pub(super) fn keep_only_followed(&mut self, store: &mut Store) {
        let followed: Vec<ProcessKey> = self.known.roots().collect();
        self.persist(store);
        if let Err(e) = store.keep_members_of(&followed) {
            tracing::warn!(error = %e, "cannot drop the members of trees no longer followed");
        }
    }

    /// The survivors of sessions whose owners are `owners`, when they end now: one for
    /// each, in order, `None` for an owner of another boot, whose tree cannot be known.
    pub(super) fn survivors_of<'a>(
        &self,
        owners: impl IntoIterator<Item = &'a Identity>,
    ) -> Vec<Option<Survivors>> {
        let owners: Vec<&Identity> = owners.into_iter().collect();
        let here = |owner: &Identity| owner.boot_id == self.boot_id;
        let roots: Vec<ProcessKey> = owners
            .iter()
            .filter(|owner| here(owner))
            .map(|owner| owner.key())
            .collect();
        let mut found = self.known.survivors(&roots).into_iter();
        owners
            .iter()
            .map(|owner| here(owner).then(|| found.next()).flatten())
            .collect()
    }

    /// The tree of `root` as known now, to read off the engine.
    pub(super) fn view(&self, root: ProcessKey) -> TreeView {
        self.known.view(root)
    }

    /// The tree `key` (read with the pidfs inode `pidfs_ino`) is a member of, or roots, as
    /// merged; else the followed tree the kernel map holds it in as `kernel_root`.
    pub(super) fn root_of(
        &self,
        key: ProcessKey,
        pidfs_ino: Option<u64>,
        kernel_root: Option<ProcessKey>,
    ) -> Option<ProcessKey> {
        self.known
            .known_root_of(key, pidfs_ino)
            .or(kernel_root.filter(|root| self.known.follows(*root)))
    }

    pub(super) fn status(&self) -> MembershipStatus {
        self.known.status(REFRESH_PERIOD)
    }
}
