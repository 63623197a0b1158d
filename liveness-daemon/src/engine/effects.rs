//! The effects: what committed events set off after they are published. Requests waiting
//! for a lock are told or granted, the survivors of ended sessions are terminated by their
//! policy, their end actions run: each once SQLite has the events (a reap's plan and an end
//! action read them there, a grant is written there). Their cgroups are reclaimed once
//! empty.

use std::collections::HashMap;

use crate::engine::Refusal;
use liveness_common::action::ActionOutcome;
use liveness_common::identity::ProcessKey;
use liveness_common::lock::Lock;
use liveness_common::session::Event;
use liveness_common::status::ActionsStatus;
use tokio::task::JoinError;

use super::EngineConfig;
use super::actions::{Actions, Next, with_actions};
use super::cgroups::SessionCgroups;
use super::ledger::Ledger;
use super::locks::{Acquire, Granted, LockEffect, LockKey, Locks, held_error};
use super::reaps::{ReapDone, Reaps, Views, terminating};
use super::tree::Trees;
use crate::cgroup::reclaim::Report;
use crate::engine::TreeView;
use crate::source::tree_map::TreeMap;
use crate::store::{ActionKey, Store};
use std::sync::Arc;

#[derive(Debug)]
pub(super) struct Effects {
    /// Requests waiting for a lock.
    locks: Locks,
    /// Sessions' surviving processes being terminated.
    reaps: Reaps,
    /// End actions running.
    actions: Actions,
    /// Set off by published events, until SQLite has them: what they change for the lock
    /// waiters, in event order, and the ends whose survivors are terminated by their
    /// policy, with their trees as they were at the death.
    unsettled_locks: Vec<LockEffect>,
    unsettled_reaps: Vec<(Event, Option<TreeView>)>,
    /// The trees of dead owners whose deaths could not be appended yet: their reaps read
    /// them once the deaths are.
    kept: Views,
    /// The cgroups of ACTIVE sessions, and those being reclaimed.
    cgroups: SessionCgroups,
}

/// A reap or an end action that has news.
// One lives on the stack for a turn of the loop: no reason to box the big outcomes.
#[allow(clippy::large_enum_variant)]
pub(super) enum Done {
    Reap(Result<ReapDone, JoinError>),
    Action(Next),
    Cgroup(Report),
}

impl Effects {
    pub(super) fn new(
        config: &EngineConfig,
        boot_id: &str,
        kernel: Option<Arc<TreeMap>>,
    ) -> Effects {
        Effects {
            locks: Locks::default(),
            reaps: Reaps::new(config.proc.clone(), boot_id.to_owned(), kernel),
            actions: Actions::new(&config.actions, config.proc.clone()),
            unsettled_locks: Vec::new(),
            unsettled_reaps: Vec::new(),
            kept: Views::new(),
            cgroups: SessionCgroups::new(config.cgroups.names()),
        }
    }

    /// Takes in published events, with the trees of their dead owners that the reaps
    /// read: what they set off waits until SQLite has them (see [`Effects::settle`]).
    /// Returns whether anything does, so that SQLite gets them at once.
    pub(super) fn set_off(&mut self, events: &[Event], views: Views) -> bool {
        let locks = self.locks.effects_of(events);
        let acting = with_actions(events).next().is_some();
        self.actions.ended(with_actions(events));
        self.cgroups.set_off(events);
        for ended in terminating(events) {
            let key = ended.owner.key();
            let view = (views.get(&key).cloned()).or_else(|| self.kept.get(&key).cloned());
            self.unsettled_reaps.push((ended, view));
        }
        for event in events {
            self.kept.remove(&event.owner.key());
        }
        let set_off = acting || !locks.is_empty() || !self.unsettled_reaps.is_empty();
        self.unsettled_locks.extend(locks);
        set_off
    }

    /// Keeps the trees of dead owners whose deaths wait to be appended.
    pub(super) fn keep(&mut self, views: Views) {
        self.kept.extend(views);
    }

    /// What the published events set off, now that SQLite has them: the lock waiters'
    /// changes (returned: the engine publishes each grant before it is sent), the reaps
    /// started.
    pub(super) fn settle(&mut self, store: &Store) -> Vec<LockEffect> {
        for (ended, view) in std::mem::take(&mut self.unsettled_reaps) {
            self.reap(&ended, store, view);
        }
        std::mem::take(&mut self.unsettled_locks)
    }

    /// Starts terminating the survivors of an ended session, as its tree (`tree`: as it
    /// was at the death) knows them, and what its cgroup holds at its grace's end.
    pub(super) fn reap(&mut self, ended: &Event, store: &Store, tree: Option<TreeView>) {
        self.reaps.start(ended, store, tree);
        self.cgroups.terminate(ended, store);
    }

    /// At start: runs again the reaps and the end actions a stop or a crash cut short; a
    /// resumed reap kills by its session's cgroup too, once the cgroups are reconciled.
    pub(super) fn resume(&mut self, store: &mut Store, trees: &Trees) {
        let resumed = self.reaps.resume(store, trees);
        self.cgroups.resumed(resumed);
        self.actions.resume(store);
    }

    /// The next reap that finished, or news of an end action (reaps first).
    pub(super) async fn next(&mut self) -> Done {
        tokio::select! {
            biased;
            done = self.reaps.finished() => Done::Reap(done),
            next = self.actions.next() => Done::Action(next),
            report = self.cgroups.next() => Done::Cgroup(report),
        }
    }

    /// The session cgroups, to follow registrations and reconcile at start.
    pub(super) fn cgroups(&mut self) -> &mut SessionCgroups {
        &mut self.cgroups
    }

    /// Whether end actions wait for a slot.
    pub(super) fn has_queued(&self) -> bool {
        self.actions.has_queued()
    }

    /// Starts the queued end actions that have a slot; returns the events of those
    /// finalized at once.
    pub(super) fn start_actions(&mut self, store: &mut Store, now_ms: i64) -> Vec<Event> {
        self.actions.start_queued(store, now_ms)
    }

    /// An end action's run is marked `running`.
    pub(super) fn begun(&mut self, key: ActionKey) {
        self.actions.begun(key);
    }

    /// An end action's run has its first process.
    pub(super) fn spawned(&mut self, key: ActionKey, root: ProcessKey) {
        self.actions.spawned(key, root);
    }

    /// An end action's run is over.
    pub(super) fn done(&mut self, key: &ActionKey) {
        self.actions.done(key);
    }

    /// Where the end actions stand, with `uncommitted` outcomes waiting for the store.
    pub(super) fn actions_status(&self, uncommitted: usize) -> ActionsStatus {
        self.actions.status(uncommitted)
    }

    /// Applies what a committed event changes for the lock waiters, a grant taken in the
    /// ledger's books (see [`Locks::follow`]).
    pub(super) fn follow(
        &mut self,
        effect: LockEffect,
        ledger: &mut Ledger,
        now: i64,
    ) -> Option<Granted> {
        let (store, usage) = ledger.lock_books();
        self.locks.follow(effect, store, usage, now)
    }

    /// Sends a published grant; a waiter gone meanwhile has it released in the store (see
    /// [`Locks::deliver`]).
    pub(super) fn deliver(
        &mut self,
        granted: Granted,
        ledger: &mut Ledger,
        now: i64,
    ) -> Option<Event> {
        self.locks.deliver(granted, ledger.store_mut(), now)
    }

    /// How many wait for `key` on open connections.
    pub(super) fn waiters(&self, key: &LockKey) -> u32 {
        self.locks.count(key)
    }

    /// A request for lock `name`, which another session of user `uid` holds (`held`):
    /// `lock_held` at once, or, when it waits, `session` last in the lock's queue.
    pub(super) fn wait_for(
        &mut self,
        uid: u32,
        name: &str,
        session: String,
        held: &Lock,
        wait: bool,
    ) -> Result<Acquire, Refusal> {
        if !wait {
            return Err(held_error(held));
        }
        self.locks.queue(uid, name, session).map(Acquire::Queued)
    }

    /// How many wait for each lock that has waiters.
    pub(super) fn lock_waiters(&self) -> HashMap<LockKey, u32> {
        self.locks.waiting()
    }

    /// At a stop: ends the reaps under way; returns those that finished meanwhile.
    pub(super) async fn cancel_reaps(&mut self) -> Vec<ReapDone> {
        self.reaps.cancel().await
    }

    /// At a stop: ends the end actions under way; returns those that finished meanwhile.
    pub(super) async fn stop_actions(&mut self) -> Vec<(ActionKey, ActionOutcome)> {
        self.actions.stop().await
    }

    /// Tests: the end actions below the verbs.
    #[cfg(test)]
    pub(super) fn actions(&mut self) -> &mut Actions {
        &mut self.actions
    }
}
