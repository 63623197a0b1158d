//! What an operation may do with the engine, and nothing more: read the store, commit
//! (its events then published in the engine's order), take or wait for a lock, watch an
//! owner or stop watching it, reap what an end leaves. Operations never hold the engine,
//! so the order they run in (commit, publish, effects) stays the engine's own.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use crate::engine::Refusal;
use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::lock::Lock;
use liveness_common::session::{Event, EventKind, Phase, Session, Survivors};
use liveness_common::status::{CgroupStatus, Counters, LimitsStatus, Status};

use super::Engine;
use crate::engine::TreeView;
use crate::engine::facts::Facts;
use crate::engine::fanout::Subscription;
use crate::engine::locks::{Acquire, Taken, take};
use crate::engine::tree::{Parked, Start};
use crate::engine::watch::Link;
use crate::store::journal::JournaledEnding;
use crate::store::{EventFilter, OwnerDeath, Store, StoreError};

/// An operation's way into the engine, for the one operation it runs.
pub struct Context<'a> {
    engine: &'a mut Engine,
}

impl<'a> Context<'a> {
    pub(super) fn new(engine: &'a mut Engine) -> Context<'a> {
        Context { engine }
    }

    /// The engine's configuration, this boot, its clock.
    pub(in crate::engine) fn facts(&self) -> &Facts {
        &self.engine.facts
    }

    /// Now, on the engine's clock.
    pub(in crate::engine) fn now(&self) -> i64 {
        self.engine.facts.now_ms()
    }

    /// The store, to read.
    pub(in crate::engine) fn store(&self) -> &Store {
        self.engine.ledger.store()
    }

    /// The ACTIVE sessions, from memory.
    pub(in crate::engine) fn active_sessions(&self) -> impl Iterator<Item = &Session> {
        self.engine.ledger.active_sessions()
    }

    /// The ACTIVE sessions of `owner`, from memory, in no order.
    pub(in crate::engine) fn sessions_of_owner<'b>(
        &'b self,
        owner: &'b Identity,
    ) -> impl Iterator<Item = &'b Session> {
        self.engine.ledger.sessions_of_owner(owner)
    }

    /// The published endings SQLite does not have yet, oldest first.
    pub(in crate::engine) fn waiting_endings(&self) -> impl Iterator<Item = &JournaledEnding> {
        self.engine.ledger.waiting_endings()
    }

    /// Whether SQLite has every published batch, after writing those it lacks.
    pub(in crate::engine) fn caught_up(&mut self) -> bool {
        self.engine.caught_up()
    }

    /// Makes a write of sessions, to be announced with [`Context::announce`]: what follows
    /// it (watching an owner) comes before its events are published.
    pub(in crate::engine) fn write<T>(
        &mut self,
        write: impl FnOnce(&mut Store) -> Result<(T, Vec<Event>), StoreError>,
    ) -> Result<(T, Vec<Event>), Refusal> {
        let (made, events) = self.engine.ledger.commit(write)?;
        self.engine.ledger.committed(&events);
        Ok((made, events))
    }

    /// Publishes the events of a [`Context::write`] (which ends no session, so no reap
    /// reads a tree), with an owner just registered whose death within a second is warned
    /// of (it may be a launcher). `made`: the cgroup made for user `uid`'s new session
    /// `id`, reclaimed at its end.
    pub(in crate::engine) fn announce(
        &mut self,
        events: Vec<Event>,
        fresh: Option<ProcessKey>,
        made: Option<(u32, String, PathBuf)>,
    ) {
        debug_assert!(events.iter().all(|e| e.kind != EventKind::Ended));
        let now = self.now();
        let views = Default::default();
        (self.engine).announce(events, views, fresh.map(|owner| (owner, now)), made);
    }

    /// Makes a write of sessions and publishes the events it committed.
    pub(in crate::engine) fn commit<T>(
        &mut self,
        write: impl FnOnce(&mut Store) -> Result<(T, Vec<Event>), StoreError>,
    ) -> Result<T, Refusal> {
        let (made, events) = self.engine.ledger.commit(write)?;
        if !events.is_empty() {
            self.engine.publish(events);
        }
        Ok(made)
    }

    /// Follows a change to an ACTIVE session that has no event (the same owner registered
    /// again, with other end actions; a declaration), given the session as written.
    pub(in crate::engine) fn follow(&mut self, session: Session) {
        self.engine.ledger.follow(session);
    }

    /// User `uid`'s session `id` no longer has the cgroup `path`: its end reclaims none.
    pub(in crate::engine) fn forget_cgroup(&mut self, uid: u32, id: &str, path: &std::path::Path) {
        self.engine.effects.cgroups().forget(uid, id, path);
    }

    /// A new session's labels within `uid`'s limits.
    pub(in crate::engine) fn admit(
        &mut self,
        uid: u32,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), Refusal> {
        self.engine.ledger.admit(uid, labels)
    }

    /// A session's unfinished end actions going from `before` to `after`, within `uid`'s
    /// limits.
    pub(in crate::engine) fn admit_actions(
        &mut self,
        uid: u32,
        before: u64,
        after: u64,
    ) -> Result<(), Refusal> {
        self.engine.ledger.admit_actions(uid, before, after)
    }

    /// Lock `name` for user `uid`'s session `session`: at once when it is free (its event
    /// published), else a place in its queue when the request waits.
    pub(in crate::engine) fn lock(
        &mut self,
        uid: u32,
        session: String,
        name: String,
        wait: bool,
    ) -> Result<Acquire, Refusal> {
        let now = self.now();
        let engine = &mut *self.engine;
        let (store, usage) = engine.ledger.lock_books();
        match take(store, usage, uid, &session, &name, now)? {
            Taken::Granted { lock, event } => {
                engine.publish(vec![*event]);
                Ok(Acquire::Held(lock))
            }
            Taken::AlreadyHeld(lock) => {
                let waiters = engine.effects.waiters(&(uid, name));
                Ok(Acquire::Held(Lock { waiters, ..lock }))
            }
            Taken::HeldByOther(held) => (engine.effects).wait_for(uid, &name, session, &held, wait),
        }
    }

    /// How many wait for each lock that has waiters.
    pub(in crate::engine) fn lock_waiters(&self) -> HashMap<(u32, String), u32> {
        self.engine.effects.lock_waiters()
    }

    /// A subscription to the events published from now on; `last`: offered each batch
    /// after the others.
    pub(in crate::engine) fn subscribe(
        &mut self,
        socket: OwnedFd,
        filter: EventFilter,
        last: bool,
    ) -> Subscription {
        // The newest seq published, which SQLite has too: operations run caught up.
        let head = self.engine.ledger.head();
        Subscription {
            head,
            lineage: Arc::clone(&self.engine.facts.lineage),
            outbox: self.engine.fanout.subscribe(socket, filter, head, last),
        }
    }

    /// The tree of an ACTIVE session of this boot, as known now.
    pub(in crate::engine) fn tree(&self, session: &Session) -> Option<TreeView> {
        (self.engine.facts.is_local(&session.owner) && session.phase == Phase::Active)
            .then(|| self.engine.watch.view(session.owner.key()))
    }

    /// The survivors of `owner`'s tree, read now, but the process `caller_pid` and its
    /// ancestors; `None` for an owner of another boot.
    pub(in crate::engine) fn survivors(
        &self,
        owner: &Identity,
        caller_pid: u32,
    ) -> Option<Survivors> {
        (self.engine.watch).survivors(owner, caller_pid, &self.engine.facts)
    }

    /// The owner watched for a link of an ancestry: the root of its tree, or itself; `None`
    /// when no ACTIVE session can be its.
    pub(in crate::engine) fn watched_owner(&self, link: &Link) -> Option<Identity> {
        let owner = self.engine.watch.owner_of(link)?;
        Some(self.engine.facts.identity_of(owner))
    }

    /// Starts watching a registered owner; the death of one already dead, which
    /// [`Context::finalize`] ends once the registration is announced.
    pub(in crate::engine) fn watch(
        &mut self,
        owner: &Identity,
        start: Start,
    ) -> Option<OwnerDeath> {
        let engine = &mut *self.engine;
        (engine.watch).watch(owner, start, &engine.facts, engine.ledger.store())
    }

    /// Ends the sessions of a dead owner: a death's walk.
    pub(in crate::engine) fn finalize(&mut self, death: OwnerDeath) {
        self.engine.finalize(vec![death]);
    }

    /// Stops watching an owner that no ACTIVE session refers to any more.
    pub(in crate::engine) fn unwatch(&mut self, owner: &Identity) {
        self.engine.unwatch_if_unused(owner);
    }

    /// Terminates the survivors an ended session's tree leaves, by its policy.
    pub(in crate::engine) fn reap(&mut self, ended: &Event) {
        let engine = &mut *self.engine;
        let tree = engine.watch.view(ended.owner.key());
        (engine.effects).reap(ended, engine.ledger.store(), Some(tree));
    }

    /// Sends an answer once the tree of `root` has had its first walk.
    pub(in crate::engine) fn answer(&mut self, root: Option<ProcessKey>, send: Parked) {
        self.engine.watch.answer(root, send);
    }

    /// The daemon's view of itself, each owner telling its part.
    pub(in crate::engine) fn status(&self) -> Status {
        let engine = &*self.engine;
        let (ledger, facts) = (&engine.ledger, &engine.facts);
        let store = ledger.store();
        // Sessions whose ending waits for the database are still active there.
        let waiting = ledger.store_status();
        let (deaths, _, actions) = ledger.retry_counts();
        Status {
            daemon: facts.about.clone(),
            uptime_ms: facts.started.elapsed().as_millis() as u64,
            // The newest seq published.
            head_seq: ledger.head(),
            store_id: facts.lineage.id(),
            active_sessions: (store.count(Phase::Active).unwrap_or_default())
                .saturating_sub(waiting.waiting),
            ended_sessions: store.count(Phase::Ended).unwrap_or_default() + waiting.waiting,
            subscribers: engine.fanout.subscribers(),
            uncommitted_deaths: deaths as u64,
            store: waiting,
            actions: engine.effects.actions_status(actions),
            monitor: engine.watch.monitor_status(),
            counters: Counters {
                lagged_subscribers: engine.fanout.lagged(),
                ..ledger.counters().clone()
            },
            limits: LimitsStatus {
                connections: facts.config.limits.status(),
                sessions: ledger.usage_status(),
            },
            membership: Some(engine.watch.membership()),
            // The server adds the activity sampler's and the mirror's, which the engine
            // does not know.
            activity: Default::default(),
            cluster: None,
            cgroup: Some(CgroupStatus {
                default: facts.config.default_cgroup,
                ..facts.config.cgroups.status()
            }),
        }
    }
}
