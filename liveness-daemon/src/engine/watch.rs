//! The watch: the exit monitor, the process trees of tracked owners, and the members
//! watched for sessions that last until their trees do. It starts and stops watching
//! owners, and readies a batch of deaths for the ledger: the deaths their trees' last
//! members stand for, each owner's survivors, the trees waited for.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use liveness_common::exit::DetectedBy;
use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::session::{EndReason, Event, OnEnd, Survivors, Until};
use liveness_common::status::{MembershipStatus, MonitorStatus};
use liveness_proc::identity::Liveness;

use super::facts::Facts;
use super::ledger::Ledger;
use super::reaps::{Views, terminating};
use super::tree::{Parked, Start, TreeView, TreeWork, Trees};
use super::until_tree::TreeWaits;
use crate::source::ExitObservation;
use crate::source::monitor::Monitor;
use crate::source::tree_map::TreeMap;
use crate::store::{OwnerDeath, Store, TreeCgroups};

/// One ancestor: its key, its pidfs inode (where the kernel has pidfs), and the tree the
/// kernel's members map holds it in (forked since the engine last merged the map).
#[derive(Debug, Clone, Copy)]
pub struct Link {
    pub key: ProcessKey,
    pub pidfs_ino: Option<u64>,
    pub kernel_root: Option<ProcessKey>,
}

#[derive(Debug)]
pub(super) struct Watch {
    monitor: Monitor,
    /// The process trees of tracked owners.
    trees: Trees,
    /// The members watched for sessions that last until their tree does.
    waits: TreeWaits,
    /// Dead owners whose trees are let go of after the death's sends (see
    /// [`Watch::let_go`]): letting go reads the kernel map's counter.
    unfollowed: Vec<Identity>,
}

/// A batch of deaths readied for the ledger (see [`Watch::prepare`]).
pub(super) struct Prepared {
    /// With their survivors, and the deaths of owners whose trees' last members died.
    pub(super) deaths: Vec<OwnerDeath>,
    /// Members of waited-for trees found already dead: a batch of their own, after.
    pub(super) gone: Vec<OwnerDeath>,
    /// The trees of the dead owners whose survivors are terminated by policy, as they were
    /// (the trees are no longer followed).
    pub(super) views: Views,
}

impl Watch {
    pub(super) fn new(mut monitor: Monitor, facts: &Facts) -> Watch {
        let trees = Trees::new(
            facts.config.proc.clone(),
            monitor.take_tree_map(),
            facts.boot_id.clone(),
            facts.host.clone(),
        );
        Watch {
            monitor,
            trees,
            waits: TreeWaits::default(),
            unfollowed: Vec::new(),
        }
    }

    /// The exit sources that run.
    pub(super) fn active_sources(&self) -> Vec<DetectedBy> {
        self.monitor.active_sources()
    }

    /// A handle of the kernel's tree map, for connections to read trees with.
    pub(super) fn tree_reader(&self) -> Option<Arc<TreeMap>> {
        self.trees.reader()
    }

    /// The trees, for the reaps of the sessions that end (their survivors).
    pub(super) fn trees(&self) -> &Trees {
        &self.trees
    }

    pub(super) fn monitor_status(&self) -> MonitorStatus {
        self.monitor.status()
    }

    pub(super) fn membership(&self) -> MembershipStatus {
        self.trees.status()
    }

    /// A death already reported, without waiting.
    pub(super) fn try_next(&mut self) -> Option<ExitObservation> {
        self.monitor.try_next()
    }

    /// What the engine's loop waits for here: the next death, the next walk of a tree
    /// done off the engine.
    pub(super) fn wakes(
        &mut self,
    ) -> (
        impl Future<Output = ExitObservation> + '_,
        impl Future<Output = Vec<TreeWork>> + '_,
    ) {
        (self.monitor.next(), self.trees.walked())
    }

    /// Whether tree work waits for its slices.
    pub(super) fn has_tree_work(&self) -> bool {
        self.trees.has_work()
    }

    /// One slice of tree work.
    pub(super) fn tree_slice(&mut self) {
        self.trees.step();
    }

    /// Takes in what a walk off the engine found.
    pub(super) fn walked(&mut self, found: Vec<TreeWork>) {
        self.trees.found(found);
    }

    /// Merges the kernel's members map and persists the trees' members.
    pub(super) fn refresh(&mut self, store: &mut Store) {
        self.trees.refresh(store);
    }

    /// Whether the trees of dead owners wait to be let go of.
    pub(super) fn has_unfollowed(&self) -> bool {
        !self.unfollowed.is_empty()
    }

    /// Stops following the trees that [`Watch::prepare`] left to let go of. The engine
    /// calls it once it is idle or before anything else reads the trees, so that a death's
    /// events are sent before this work.
    pub(super) fn let_go(&mut self) {
        if !self.unfollowed.is_empty() {
            self.trees.forget(&std::mem::take(&mut self.unfollowed));
        }
    }

    /// At a stop: what the kernel added since the last refresh, for the next run.
    pub(super) async fn finish(&mut self, store: &mut Store) {
        self.let_go();
        self.trees.finish().await;
        self.trees.refresh_now(store);
    }

    /// Sends an answer once the tree of `root` has had its first walk.
    pub(super) fn answer(&mut self, root: Option<ProcessKey>, send: Parked) {
        self.trees.answer(root, send);
    }

    /// The tree of `root`, as known now.
    pub(super) fn view(&self, root: ProcessKey) -> TreeView {
        self.trees.view(root)
    }

    /// The trees of the owners of these ended sessions whose survivors are terminated by
    /// policy, as they are now.
    pub(super) fn views_for(&self, events: &[Event]) -> Views {
        (terminating(events).iter())
            .map(|ended| (ended.owner.key(), self.trees.view(ended.owner.key())))
            .collect()
    }

    /// The survivors of `owner`'s tree, read now, but the process `caller_pid` and its
    /// ancestors; `None` for an owner of another boot.
    pub(super) fn survivors(
        &self,
        owner: &Identity,
        caller_pid: u32,
        facts: &Facts,
    ) -> Option<Survivors> {
        facts.is_local(owner).then(|| {
            let kernel = self.trees.reader();
            (self.trees.view(owner.key())).survivors(kernel.as_deref(), facts.proc(), caller_pid)
        })
    }

    /// The survivors of `owner`'s tree, as known here.
    pub(super) fn survivors_of(&self, owner: &Identity) -> Option<Survivors> {
        self.trees.survivors_of([owner]).pop().flatten()
    }

    /// The owner watched for a link of an ancestry: the root of its tree, or itself; `None`
    /// when no ACTIVE session can be its.
    pub(super) fn owner_of(&self, link: &Link) -> Option<ProcessKey> {
        // Trees first: a member's parent may be init, or a process of another tree.
        let owner = (self.trees)
            .root_of(link.key, link.pidfs_ino, link.kernel_root)
            .unwrap_or(link.key);
        // Every owner of an ACTIVE session of this boot is tracked; a dead owner whose
        // sessions wait for its tree has them still.
        (self.monitor.is_tracked(owner) || self.waits.waits_for(owner)).then_some(owner)
    }

    /// At a start, for the owners that died while the daemon was down: their trees from
    /// their persisted members still alive; the trees of no ACTIVE owner are dropped.
    pub(super) fn follow_dead(&mut self, dead: &[OwnerDeath], facts: &Facts, store: &mut Store) {
        for death in dead {
            if facts.is_local(&death.owner) {
                self.trees.follow_now(&death.owner, store);
            }
        }
        self.trees.keep_only_followed(store);
    }

    /// Starts watching an owner. Returns its death at once when it is already dead.
    ///
    /// The boot id decides: an owner of this boot is watched whatever host name it
    /// carries. An owner of an earlier boot of this machine (one a daemon ran on with this
    /// database, or for older records one with this host name) ended with that boot.
    /// Owners of other machines cannot be watched: only the inactivity timeout ends them.
    pub(super) fn watch(
        &mut self,
        owner: &Identity,
        start: Start,
        facts: &Facts,
        store: &Store,
    ) -> Option<OwnerDeath> {
        let dead = |reason| OwnerDeath {
            owner: owner.clone(),
            reason,
            exit: None,
            detected_by: DetectedBy::Reconcile,
            observed_ms: facts.now_ms(),
            died_ms: None,
            survivors: None,
            cause: None,
            usage: None,
            sender_root: None,
            tree_cgroups: TreeCgroups::Unasked,
        };
        if !facts.is_local(owner) {
            let earlier_boot_here = match store.is_known_boot(&owner.boot_id) {
                Ok(known) => known || owner.host == facts.host,
                Err(e) => {
                    tracing::error!(error = %e, "cannot look up known boots");
                    false
                }
            };
            // The stored fingerprint names the earlier boot: end exactly that owner.
            return earlier_boot_here.then(|| dead(EndReason::Reboot));
        }
        // The sources key processes by pid and start time; where the pidfs inode is known,
        // a process that took the pid within the same tick is told apart here.
        if let Liveness::Dead(reason) = facts.proc().check_process(owner.key(), owner.pidfs_ino) {
            return Some(dead(EndReason::from(reason)));
        }
        self.trees.keep_member(owner);
        match self.monitor.track(owner.key()) {
            Some(death) => Some(facts.death_of(&death)),
            None => {
                self.trees.follow(owner, start, store);
                self.trees.check_rooted(owner.key());
                None
            }
        }
    }

    /// Stops watching an owner that no ACTIVE session refers to any more.
    pub(super) fn unwatch_if_unused(&mut self, owner: &Identity, facts: &Facts, ledger: &Ledger) {
        if !facts.is_local(owner) {
            return;
        }
        // From memory, which has every committed change: reading the owner's sessions from
        // SQLite at each end costs as much as it has sessions.
        if ledger.sessions_of_owner(owner).next().is_some() {
            return;
        }
        self.monitor.untrack(owner.key());
        for member in self.waits.stop(owner.key()) {
            // Unless it owns sessions of its own.
            let member = facts.identity_of(member);
            if ledger.sessions_of_owner(&member).next().is_none() {
                self.monitor.untrack(member.key());
            }
        }
        self.trees.forget([owner]);
    }

    /// The cgroups that sessions waiting for their trees wait for, asked for since the last
    /// call: each to be watched until it is empty.
    pub(super) fn take_drains(&mut self) -> Vec<PathBuf> {
        self.waits.take_drains()
    }

    /// The cgroup at `path` holds no process: the deaths that end the sessions that waited
    /// for it last.
    pub(super) fn drained(&mut self, path: &Path) -> Vec<OwnerDeath> {
        self.waits.drained(path)
    }

    /// Readies a batch of deaths for the ledger: members of trees that sessions wait for
    /// stand for their owners once the last one dies; each owner's survivors are read from
    /// memory (once, at the death: a retried commit keeps those of that moment); the owners
    /// whose sessions last until their trees do have their members watched from now on.
    /// The others' trees are let go of (see [`Watch::let_go`]): every session of theirs
    /// ends with this batch, and a reap reads the copy of its tree taken here.
    pub(super) fn prepare(
        &mut self,
        deaths: Vec<OwnerDeath>,
        facts: &Facts,
        ledger: &Ledger,
    ) -> Prepared {
        // An earlier batch's trees first: a tree is never read after its owner's end.
        self.let_go();
        let (monitor, trees) = (&mut self.monitor, &self.trees);
        // The cgroups of an owner's sessions that last until their trees do.
        let cgroups = |owner: &Identity| -> Vec<PathBuf> {
            (ledger.sessions_of_owner(owner))
                .filter(|session| session.until == Until::Tree)
                .filter_map(|session| Some(PathBuf::from(&session.cgroup.as_ref()?.path)))
                .collect()
        };
        let mut deaths = (self.waits).tree_deaths(deaths, monitor, trees, facts, cgroups);
        let owners = deaths
            .iter()
            .filter(|death| death.survivors.is_none())
            .map(|death| &death.owner);
        let mut found = self.trees.survivors_of(owners).into_iter();
        for death in deaths.iter_mut().filter(|death| death.survivors.is_none()) {
            death.survivors = found.next().flatten();
        }
        let until_tree = |owner: &Identity| {
            (ledger.sessions_of_owner(owner)).any(|session| session.until == Until::Tree)
        };
        let monitor = &mut self.monitor;
        let gone = (self.waits).wait_for_trees(&mut deaths, until_tree, cgroups, monitor, facts);
        let ended: Vec<&OwnerDeath> = deaths
            .iter()
            .filter(|death| !self.waits.waits_for(death.owner.key()))
            .collect();
        // Only a reap that the ending's list of survivors leaves incomplete reads its tree.
        let views = ended
            .iter()
            .filter(|death| {
                (death.survivors.as_ref())
                    .is_none_or(|s| s.members.len() as u64 != u64::from(s.total))
            })
            .filter(|death| {
                (ledger.sessions_of_owner(&death.owner))
                    .any(|session| session.on_end == OnEnd::Terminate)
            })
            .map(|death| (death.owner.key(), self.trees.view(death.owner.key())))
            .collect();
        (self.unfollowed).extend(ended.iter().map(|death| death.owner.clone()));
        Prepared {
            deaths,
            gone,
            views,
        }
    }
}
