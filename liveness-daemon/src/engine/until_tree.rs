//! Sessions that last until their tree does (`until: "tree"`). At the owner's death, such a
//! session is not ended while members of its tree live (see
//! [`OwnerDeath::tree_outlives`]): they are watched, through their own entries in the
//! kernel's members map, so that what they fork still joins the tree. At each of their
//! deaths the tree is looked at again: members found meanwhile are watched too, and once
//! none is left, the owner's death is reported again, with the last member's exit facts,
//! and the sessions end with reason `tree_exited` (exactly once: the compare-and-set on the
//! owner's fingerprint). After a restart, the reconcile finds the owner dead and starts
//! over from its persisted members.
//!
//! A session with a cgroup of its own waits for the cgroup's truth too: once no member
//! lives, it still waits until its cgroup holds no process (`populated 0`, which the
//! reclaim thread watches: a process that joined the cgroup by a write, one the tree's
//! view missed). The other sessions of the owner end meanwhile ([`TreeCgroups::Held`]).
//! A member that escaped the cgroup keeps the session waiting through the tree.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::session::Survivors;

use super::facts::Facts;
use super::tree::Trees;
use crate::source::monitor::Monitor;
use crate::store::{OwnerDeath, TreeCgroups};

/// The members watched for the dead owners whose sessions wait for their trees.
#[derive(Debug, Default)]
pub(super) struct TreeWaits {
    /// member -> the dead owner whose tree it is in.
    members: HashMap<ProcessKey, ProcessKey>,
    /// The dead owners waited for.
    owners: HashMap<ProcessKey, Identity>,
    /// The dead owners whose trees' members are gone, each with its death to report again
    /// once the cgroups its sessions wait for are empty, and those cgroups.
    draining: HashMap<ProcessKey, (OwnerDeath, HashSet<PathBuf>)>,
    /// Cgroups to be watched until empty, taken by the engine.
    to_drain: Vec<PathBuf>,
}

impl TreeWaits {
    pub(super) fn waits_for(&self, owner: ProcessKey) -> bool {
        self.owners.contains_key(&owner)
    }

    /// Stops waiting for the tree of `owner` (its sessions ended otherwise). Returns the
    /// members that were watched.
    pub(super) fn stop(&mut self, owner: ProcessKey) -> Vec<ProcessKey> {
        if self.owners.remove(&owner).is_none() {
            return Vec::new();
        }
        self.draining.remove(&owner);
        let watched: Vec<ProcessKey> = self
            .members
            .iter()
            .filter(|(_, waited)| **waited == owner)
            .map(|(member, _)| *member)
            .collect();
        for member in &watched {
            self.members.remove(member);
        }
        watched
    }

    /// The deaths of a batch, with, for each member whose death left its dead owner's tree
    /// empty, that owner's death again, carrying the member's exit facts. Where sessions
    /// of the owner wait for their cgroups (`cgroups` lists them), that death ends the
    /// others, and is reported again once those are empty.
    pub(super) fn tree_deaths(
        &mut self,
        deaths: Vec<OwnerDeath>,
        monitor: &mut Monitor,
        trees: &Trees,
        facts: &Facts,
        cgroups: impl Fn(&Identity) -> Vec<PathBuf>,
    ) -> Vec<OwnerDeath> {
        if self.members.is_empty() {
            return deaths;
        }
        let dying: HashSet<ProcessKey> = deaths.iter().map(|death| death.owner.key()).collect();
        let mut found = Vec::new();
        let mut queue = deaths;
        while let Some(death) = queue.pop() {
            let member = death.owner.key();
            if let Some(owner) = self.members.remove(&member)
                && let Some(identity) = self.owners.get(&owner).cloned()
            {
                let left = self.live_members(&identity, &dying, member, trees, facts);
                if left.is_empty() {
                    self.members.retain(|_, waited| *waited != owner);
                    let over = OwnerDeath {
                        owner: identity,
                        survivors: Some(Survivors::from_alive(Vec::new())),
                        sender_root: None,
                        tree_cgroups: TreeCgroups::Empty,
                        ..death.clone()
                    };
                    let held = cgroups(&over.owner);
                    if held.is_empty() {
                        self.owners.remove(&owner);
                        found.push(over);
                    } else {
                        found.push(self.hold(over, held));
                    }
                } else {
                    queue.extend(self.watch_members(owner, left, monitor, facts));
                }
            }
            found.push(death);
        }
        found
    }

    /// The members of the tree of `owner` alive now, but for `dying` (a batch's deaths,
    /// which `/proc` may still show running) and `member`.
    fn live_members(
        &self,
        owner: &Identity,
        dying: &HashSet<ProcessKey>,
        member: ProcessKey,
        trees: &Trees,
        facts: &Facts,
    ) -> Vec<Identity> {
        let gone = |alive: &Identity| alive.key() == member || dying.contains(&alive.key());
        // Members watched already live until their deaths come, whether or not the tree's
        // view lists them at this moment: only once none is left is the view asked.
        let watched: Vec<Identity> = (self.members.iter())
            .filter(|(_, waited)| **waited == owner.key())
            .map(|(watched, _)| facts.identity_of(*watched))
            .filter(|watched| !gone(watched))
            .collect();
        if !watched.is_empty() {
            return watched;
        }
        let Some(survivors) = trees.survivors_of([owner]).pop().flatten() else {
            return Vec::new();
        };
        let listed = survivors.members.len();
        let left: Vec<Identity> = survivors
            .members
            .into_iter()
            .filter(|alive| !gone(alive))
            .collect();
        if !left.is_empty() || survivors.total as usize <= listed {
            return left;
        }
        // Only the list's bound hid those left: the whole tree, this once.
        let view = trees.view(owner.key());
        let kernel = trees.reader();
        let mut alive = view.live_members(kernel.as_deref(), facts.proc());
        alive.retain(|alive| alive.key() != owner.key() && !gone(alive));
        alive
    }

    /// Watches `members` of the tree of the dead `owner`; returns the deaths of those
    /// already gone.
    fn watch_members(
        &mut self,
        owner: ProcessKey,
        members: Vec<Identity>,
        monitor: &mut Monitor,
        facts: &Facts,
    ) -> Vec<OwnerDeath> {
        let mut gone = Vec::new();
        for member in members {
            let key = member.key();
            if self.members.contains_key(&key) {
                continue;
            }
            self.members.insert(key, owner);
            if let Some(death) = monitor.track_member(key) {
                gone.push(facts.death_of(&death));
            }
        }
        gone
    }

    /// Waits for the cgroups `held` to be empty before the sessions waiting for them end
    /// by `over` (the owner stays waited for); returns the death that ends the owner's
    /// other sessions meanwhile.
    fn hold(&mut self, over: OwnerDeath, held: Vec<PathBuf>) -> OwnerDeath {
        let now = OwnerDeath {
            tree_cgroups: TreeCgroups::Held,
            ..over.clone()
        };
        let owner = over.owner.key();
        self.owners.insert(owner, over.owner.clone());
        self.to_drain.extend(held.iter().cloned());
        self.draining
            .insert(owner, (over, held.into_iter().collect()));
        now
    }

    /// The cgroups to be watched until they are empty, asked for since the last call.
    pub(super) fn take_drains(&mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.to_drain)
    }

    /// The cgroup at `path` holds no process: the deaths of the owners whose sessions
    /// waited for it last.
    pub(super) fn drained(&mut self, path: &Path) -> Vec<OwnerDeath> {
        let mut over = Vec::new();
        self.draining.retain(|owner, (death, held)| {
            held.remove(path);
            if !held.is_empty() {
                return true;
            }
            self.owners.remove(owner);
            over.push(death.clone());
            false
        });
        over
    }

    /// After a batch of deaths: the owners among them whose ACTIVE sessions wait for their
    /// trees (`until_tree` tells; their survivors outlive them) have those members watched.
    /// An owner none of whose members lives has the cgroups of those sessions (`cgroups`)
    /// waited for instead, its death made [`TreeCgroups::Held`]. Returns the deaths of
    /// members already gone.
    pub(super) fn wait_for_trees(
        &mut self,
        deaths: &mut [OwnerDeath],
        until_tree: impl Fn(&Identity) -> bool,
        cgroups: impl Fn(&Identity) -> Vec<PathBuf>,
        monitor: &mut Monitor,
        facts: &Facts,
    ) -> Vec<OwnerDeath> {
        let mut gone = Vec::new();
        for death in deaths {
            if !until_tree(&death.owner) {
                continue;
            }
            if !death.tree_outlives() {
                // A death held or released already is not asked again.
                if death.tree_cgroups != TreeCgroups::Unasked {
                    continue;
                }
                let held = cgroups(&death.owner);
                if !held.is_empty() {
                    let over = OwnerDeath {
                        tree_cgroups: TreeCgroups::Empty,
                        ..death.clone()
                    };
                    *death = self.hold(over, held);
                }
                continue;
            }
            let owner = death.owner.key();
            self.owners.insert(owner, death.owner.clone());
            let members = death
                .survivors
                .as_ref()
                .map(|survivors| survivors.members.clone())
                .unwrap_or_default();
            gone.extend(self.watch_members(owner, members, monitor, facts));
        }
        gone
    }
}
