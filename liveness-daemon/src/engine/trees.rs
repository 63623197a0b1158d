//! The engine's side of process trees: following an owner's tree while it owns ACTIVE
//! sessions, persisting its members, the survivors of an ending, and `processes`.
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

use std::collections::HashSet;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use super::Engine;
use super::membership::{kernel_entries_of, write_members};
use crate::offload::offload;
use crate::source::members_map::KernelMember;
use crate::store::Member;

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
    /// A session of its owner was registered.
    Registration,
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
    /// A process found in `/proc` under a followed tree.
    Attach(Member),
    /// A member of a forgotten tree: its kernel entry and its persisted row go.
    Unlink(KernelMember),
    /// A member a refresh found dead.
    Dead(ProcessKey),
    /// The end of a refresh's findings: the trees hold what the kernel added up to this
    /// count.
    Merged(Option<u64>),
}

impl Engine {
    /// Follows the tree of a live owner of this boot. After a restart, the members an
    /// earlier run persisted are taken back; at a registration, only what the owner's
    /// processes are now (what a session that ended left behind is not the new one's).
    /// Its descendants in `/proc` are found off the engine.
    pub(super) fn follow_tree(&mut self, owner: &Identity, start: Start) {
        let root = owner.key();
        // Followed already (another session of the owner): nothing is new.
        if self.membership.follows(root) {
            return;
        }
        self.membership.follow(root);
        if start == Start::Restart {
            let persisted = self.store.members_of(root).unwrap_or_else(|e| {
                tracing::error!(error = %e, %root, "cannot read persisted members");
                Vec::new()
            });
            let changes = self.membership.take_back(root, persisted);
            self.save_members(&changes.added, &changes.removed);
        }
        // Replies about the session wait for the walk (see `Engine::answer`): what the
        // owner forks or orphans once its client has heard back is in the tree.
        self.walking.entry(root).or_default();
        let view = self.membership.view(root);
        let (proc, writer) = (self.config.proc.clone(), self.members_writer.clone());
        self.tree_walks.spawn(async move {
            let found = offload(move || {
                let members = view.descendants(&proc);
                let mut writer = writer
                    .as_ref()
                    .map(|writer| writer.lock().unwrap_or_else(PoisonError::into_inner));
                write_members(writer.as_deref_mut(), &proc, &members);
                members
            });
            let members = found.await.unwrap_or_default();
            vec![TreeWork::Adopted { root, members }]
        });
    }

    /// Sends an answer (runs `send`) at once, or once the walk of the tree of `root` is
    /// done, if one is under way.
    pub(super) fn answer(&mut self, root: Option<ProcessKey>, send: Parked) {
        match root.and_then(|root| self.walking.get_mut(&root)) {
            Some(waiting) => waiting.push(send),
            None => (send.0)(),
        }
    }

    /// Follows the tree of an owner that died while no daemon ran, at start: its
    /// descendants are found now, so that the ending lists them.
    pub(super) fn follow_tree_now(&mut self, owner: &Identity) {
        self.follow_tree(owner, Start::Restart);
        let found = self
            .membership
            .view(owner.key())
            .descendants(&self.config.proc);
        let changes = self.membership.attach_found(found);
        self.save_members(&changes.added, &changes.removed);
    }

    /// Does the tree work found off the engine for at most [`TREE_SLICE`].
    pub(super) fn tree_step(&mut self) {
        let deadline = Instant::now() + TREE_SLICE;
        let (mut added, mut removed) = (Vec::new(), Vec::new());
        while Instant::now() < deadline {
            match self.tree_work.pop_front() {
                Some(TreeWork::Attach(member)) => {
                    added.extend(self.membership.attach_found([member]).added);
                }
                Some(TreeWork::Unlink(entry)) => {
                    self.membership.unlink(&[entry]);
                    removed.push(entry.member);
                }
                Some(TreeWork::Dead(key)) => {
                    if self.membership.drop_dead(key) {
                        removed.push(key);
                    }
                }
                Some(TreeWork::Merged(added)) => {
                    self.membership.merged(added);
                    self.refreshing = false;
                }
                Some(TreeWork::Adopted { root, members }) => self.adopt(root, members),
                None => break,
            }
        }
        self.save_members(&added, &removed);
    }

    /// Takes what a walk off the engine found: a new tree's members at once, the rest
    /// queued (but for trees forgotten meanwhile).
    pub(super) fn found(&mut self, found: Vec<TreeWork>) {
        for work in found {
            match work {
                TreeWork::Adopted { root, members } => self.adopt(root, members),
                TreeWork::Attach(member) if !self.membership.follows(member.root) => {}
                work => self.tree_work.push_back(work),
            }
        }
    }

    /// Takes in the members a walk found under `root` and sends the replies that waited.
    /// Their kernel entries are taken out again if the tree was forgotten meanwhile.
    fn adopt(&mut self, root: ProcessKey, members: Vec<Member>) {
        if self.membership.follows(root) {
            let changes = self.membership.adopt(members);
            self.save_members(&changes.added, &[]);
        } else {
            let entries = members.iter().map(|member| KernelMember {
                member: member.key,
                root,
            });
            self.tree_work.extend(entries.map(TreeWork::Unlink));
        }
        for send in self.walking.remove(&root).unwrap_or_default() {
            (send.0)();
        }
    }

    /// Waits for the walks under way and does all the tree work left (at shutdown, and in
    /// tests that look at trees at once).
    pub(super) async fn finish_tree_work(&mut self) {
        while let Some(found) = self.tree_walks.join_next().await {
            self.found(found.unwrap_or_default());
        }
        while !self.tree_work.is_empty() {
            self.tree_step();
        }
    }

    /// Keeps an owner about to be tracked in the tree it is a member of, if any (see
    /// [`super::membership::Membership::merge_member`]).
    pub(super) fn keep_membership(&mut self, owner: &Identity) {
        if let Some(member) = self.membership.merge_member(owner.key()) {
            self.save_members(&[member], &[]);
        }
    }

    /// Stops following the trees of owners no ACTIVE session refers to.
    pub(super) fn forget_trees<'a>(&mut self, owners: impl IntoIterator<Item = &'a Identity>) {
        let roots: Vec<ProcessKey> = owners
            .into_iter()
            .filter(|owner| owner.boot_id == self.local.boot_id)
            .map(Identity::key)
            .collect();
        let forgotten = self.membership.forget(&roots);
        if forgotten.trees.is_empty() {
            return;
        }
        // Their members are listed, and what the kernel added to them since the last
        // refresh found by a walk of its map, off the engine.
        let kernel = self.members_reader.clone();
        self.tree_walks.spawn(async move {
            let found = offload(move || {
                let roots: HashSet<ProcessKey> =
                    forgotten.trees.iter().map(|(root, _)| *root).collect();
                let news = kernel.map(|kernel| kernel_entries_of(&kernel, &roots));
                forgotten
                    .entries()
                    .chain(news.into_iter().flatten())
                    .map(TreeWork::Unlink)
                    .collect::<Vec<_>>()
            });
            found.await.unwrap_or_default()
        });
    }

    /// Starts a refresh of the trees off the engine (see
    /// [`super::membership::RefreshView::read`]), unless one is under way.
    pub(super) fn refresh_trees(&mut self) {
        self.persist_members();
        if self.refreshing {
            return;
        }
        let Some(view) = self.membership.refresh_view() else {
            self.membership.refresh();
            return;
        };
        self.refreshing = true;
        let (kernel, proc) = (self.members_reader.clone(), self.config.proc.clone());
        self.tree_walks.spawn(async move {
            let read = offload(move || view.read(kernel.as_deref(), &proc)).await;
            let Some(refreshed) = read else {
                return vec![TreeWork::Merged(None)];
            };
            let found = refreshed.found.into_iter().map(TreeWork::Attach);
            let dead = refreshed.dead.into_iter().map(TreeWork::Dead);
            found
                .chain(dead)
                .chain([TreeWork::Merged(refreshed.merged_added)])
                .collect()
        });
    }

    /// A whole refresh at once, at shutdown: what the kernel added, for the next run.
    pub(super) fn refresh_trees_now(&mut self) {
        let changes = self.membership.refresh();
        self.save_members(&changes.added, &changes.removed);
        self.persist_members();
    }

    /// Notes members to persist, for [`Engine::persist_members`]: a commit per change of
    /// a big tree would cost the engine as much as the tree.
    fn save_members(&mut self, added: &[Member], removed: &[ProcessKey]) {
        for member in added {
            self.unsaved_members
                .insert(member.key, Some(member.clone()));
        }
        for key in removed {
            self.unsaved_members.insert(*key, None);
        }
    }

    /// Persists the members noted since the last time, in one transaction: at each refresh
    /// of the trees, and when the engine stops. A member forked less than a refresh period
    /// before a crash may be unknown to the next start, as one the kernel added since the
    /// last refresh already is.
    pub(super) fn persist_members(&mut self) {
        if self.unsaved_members.is_empty() {
            return;
        }
        let (mut added, mut removed) = (Vec::new(), Vec::new());
        for (key, member) in self.unsaved_members.drain() {
            match member {
                Some(member) => added.push(member),
                None => removed.push(key),
            }
        }
        if let Err(e) = self.store.save_members(&added, &removed) {
            // Only a restart's knowledge of orphans depends on it; the daemon goes on.
            tracing::warn!(error = %e, "cannot persist process-tree members");
        }
    }

    /// The survivors of sessions whose owners are `owners`, when they end now: one for
    /// each, in order, `None` for an owner of another boot, whose tree cannot be known.
    pub(super) fn survivors_of<'a>(
        &self,
        owners: impl IntoIterator<Item = &'a Identity>,
    ) -> Vec<Option<Survivors>> {
        let owners: Vec<&Identity> = owners.into_iter().collect();
        let here = |owner: &Identity| owner.boot_id == self.local.boot_id;
        let roots: Vec<ProcessKey> = owners
            .iter()
            .filter(|owner| here(owner))
            .map(|owner| owner.key())
            .collect();
        let mut found = self.membership.survivors(&roots).into_iter();
        owners
            .iter()
            .map(|owner| here(owner).then(|| found.next()).flatten())
            .collect()
    }
}
