//! The actor loop: exits first, then commands; commit, then publish, then reply.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::source::ExitObservation;
use crate::store::OwnerDeath;
use liveness_common::cause::SenderSession;
use liveness_common::exit::DetectedBy;
use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::protocol::Request;
use liveness_common::request;
use liveness_common::session::{EndReason, Event};
use liveness_proc::identity::Liveness;

use super::locks::{AcquireRequest, LockEffect};
use super::reaping::terminating;
use super::trees::Start;
use super::{
    Batch, Command, Engine, EngineError, FILE_CHECK_PERIOD, MAX_BATCH, Published, RETRY_PERIOD,
    Subscription, membership, ms_of,
};

/// A stream line of one event, as [`liveness_common::protocol::StreamMessage::Event`]
/// writes it, from a borrowed event.
#[derive(serde::Serialize)]
struct EventLine<'a> {
    event: &'a Event,
}

impl Engine {
    /// Runs until `shutdown` turns true, then commits every exit already observed. Fails
    /// when the database file is deleted or replaced under it.
    pub async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), EngineError> {
        let _checkpointer = crate::store::Checkpointer::start(self.store.path())
            .inspect_err(|e| tracing::error!(error = %e, "cannot start the WAL checkpoint; the WAL grows until the next start"))
            .ok();
        self.reconcile_at_start();
        // Expiry and retention are applied before the first client is served, so a replay
        // right after a start already sees the retention window.
        self.housekeeping();
        let period = self.housekeeping_period();
        let mut housekeeping =
            tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut retry = tokio::time::interval(RETRY_PERIOD);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut trees = tokio::time::interval(membership::REFRESH_PERIOD);
        trees.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut tree_slices = tokio::time::interval(super::trees::TREE_PERIOD);
        tree_slices.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut file_check = tokio::time::interval(FILE_CHECK_PERIOD);
        file_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let outcome = loop {
            // Deaths already in the ring are read first, without waiting for readiness: a
            // thread kept busy by commands would otherwise only learn of it when its runtime
            // next polls for events.
            if let Some(observation) = self.monitor.try_next() {
                self.finalize_observed(observation);
            }
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => break Ok(()),
                observation = self.monitor.next() => self.finalize_observed(observation),
                command = commands.recv() => match command {
                    Some(command) => self.handle(command),
                    None => break Ok(()),
                },
                Some(done) = self.reaps.join_next(), if !self.reaps.is_empty() => self.finish_reap(done),
                _ = retry.tick(), if !self.uncommitted.is_empty() => self.retry_commits(),
                _ = housekeeping.tick() => self.housekeeping(),
                _ = trees.tick() => self.refresh_trees(),
                Some(found) = self.tree_walks.join_next(), if !self.tree_walks.is_empty() => {
                    self.found(found.unwrap_or_default());
                }
                _ = file_check.tick() => if let Err(e) = self.store.check_file() {
                    break Err(EngineError::Store(e));
                },
                _ = tree_slices.tick(), if !self.tree_work.is_empty() => self.tree_step(),
                // Last: only when nothing else is ready, and after one yield, so that the
                // connections woken by a publish write to their sockets first.
                () = tokio::task::yield_now(), if !self.unlogged.is_empty() => {
                    self.unlogged.flush(&mut self.fresh_owners);
                }
            }
        };
        self.unlogged.flush(&mut self.fresh_owners);
        // On failure nothing more is written to a file nobody will open again.
        outcome?;
        // In-flight exits are committed before the daemon goes away.
        while let Some(observation) = self.monitor.try_next() {
            self.finalize_observed(observation);
        }
        self.finalize(Vec::new());
        self.unlogged.flush(&mut self.fresh_owners);
        // What the kernel added since the last refresh, for the next run.
        self.finish_tree_work().await;
        self.refresh_trees_now();
        self.cancel_reaps().await;
        if !self.uncommitted.is_empty() {
            // Their sessions are still ACTIVE in the store, or their reaps still due: the
            // next start reconciles them, and runs the reaps again.
            tracing::error!(
                deaths = self.uncommitted.deaths.len(),
                reaps = self.uncommitted.reaps.len(),
                "stopping with finalizations or reap outcomes that could not be committed; the next start will reconcile them and run the reaps again"
            );
        }
        if let Err(e) = self.store.end_run() {
            tracing::error!(error = %e, "cannot record the clean stop");
        }
        tracing::info!("engine stopped");
        Ok(())
    }

    pub(super) fn identity_of(&self, key: ProcessKey) -> Identity {
        Identity {
            pid: key.pid,
            start_ticks: key.start_ticks,
            boot_id: self.local.boot_id.clone(),
            host: self.local.host.clone(),
            pidfs_ino: None,
            comm: String::new(),
        }
    }

    /// Reconciles every ACTIVE owner after a start: those that died while the daemon was
    /// down are finalized (`detected_by: reconcile`), the rest are watched. Reaps that a
    /// stop or a crash cut short run again first, so that the reaps of sessions ended here
    /// are not started twice.
    pub(super) fn reconcile_at_start(&mut self) {
        self.resume_reaps();
        let owners = match self.store.active_owners() {
            Ok(owners) => owners,
            Err(e) => {
                tracing::error!(error = %e, "cannot list active owners; nothing reconciled");
                return;
            }
        };
        let count = owners.len();
        let mut dead = Vec::new();
        for owner in owners {
            if let Some(observation) = self.watch(&owner, Start::Restart) {
                dead.push(observation);
            }
        }
        tracing::info!(
            owners = count,
            dead = dead.len(),
            "reconciled active sessions"
        );
        // The trees of owners that died meanwhile, from their persisted members still
        // alive: their survivors are reported, and terminated by policy, like any others.
        for death in &dead {
            if death.owner.boot_id == self.local.boot_id {
                self.follow_tree_now(&death.owner);
            }
        }
        // Members persisted for trees whose owner died or moved on while no daemon ran.
        let followed: Vec<ProcessKey> = self.membership.roots().collect();
        self.persist_members();
        if let Err(e) = self.store.keep_members_of(&followed) {
            tracing::warn!(error = %e, "cannot drop the members of trees no longer followed");
        }
        self.finalize(dead);
    }

    /// Starts watching an owner. Returns its death at once when it is already dead.
    ///
    /// The boot id decides: an owner of this boot is watched whatever host name it
    /// carries. An owner of an earlier boot of this machine (one a daemon ran on with this
    /// database, or for older records one with this host name) ended with that boot.
    /// Owners of other machines cannot be watched: only the inactivity timeout ends them.
    pub(super) fn watch(&mut self, owner: &Identity, start: Start) -> Option<OwnerDeath> {
        let dead = |reason| OwnerDeath {
            owner: owner.clone(),
            reason,
            exit: None,
            detected_by: DetectedBy::Reconcile,
            observed_ms: self.config.clock.now_ms(),
            died_ms: None,
            survivors: None,
            cause: None,
            usage: None,
            sender_session: None,
        };
        if owner.boot_id != self.local.boot_id {
            let earlier_boot_here = match self.store.is_known_boot(&owner.boot_id) {
                Ok(known) => known || owner.host == self.local.host,
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
        if let Liveness::Dead(reason) = self.config.proc.check_process(owner.key(), owner.pidfs_ino)
        {
            return Some(dead(EndReason::from(reason)));
        }
        self.keep_membership(owner);
        match self.monitor.track(owner.key()) {
            Some(death) => Some(self.death_of(&death)),
            None => {
                self.follow_tree(owner, start);
                self.membership.check_rooted(owner.key());
                None
            }
        }
    }

    /// The store's view of a death observed on this boot.
    pub(super) fn death_of(&self, observation: &ExitObservation) -> OwnerDeath {
        let facts = observation.facts.as_ref();
        OwnerDeath {
            owner: self.identity_of(observation.key),
            reason: EndReason::from(observation.reason),
            exit: observation.status,
            detected_by: observation.detected_by,
            observed_ms: ms_of(observation.at),
            died_ms: observation.died_at.map(ms_of),
            survivors: None,
            cause: facts.map(|facts| facts.cause.clone()),
            usage: facts.map(|facts| facts.usage.clone()),
            sender_session: facts
                .and_then(|facts| facts.sender_root)
                .and_then(|root| self.session_rooted_at(root)),
        }
    }

    /// The session whose owner is `root`, which a signal's sender belonged to (as `root`
    /// itself or a member of its tree) when it sent the signal.
    fn session_rooted_at(&self, root: ProcessKey) -> Option<SenderSession> {
        match self.store.active_sessions_of_owner(&self.identity_of(root)) {
            Ok(sessions) => sessions.into_iter().next().map(|session| SenderSession {
                id: session.id,
                creator_uid: session.creator_uid,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot look up the session of a signal's sender");
                None
            }
        }
    }

    /// Stops watching an owner that no ACTIVE session refers to any more.
    pub(super) fn unwatch_if_unused(&mut self, owner: &Identity) {
        if owner.boot_id != self.local.boot_id {
            return;
        }
        match self.store.active_sessions_of_owner(owner) {
            Ok(sessions) if sessions.is_empty() => {
                self.monitor.untrack(owner.key());
                self.forget_trees([owner]);
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "cannot look up sessions of an owner"),
        }
    }

    pub(super) fn finalize_observed(&mut self, first: ExitObservation) {
        let mut batch = Vec::new();
        let mut next = Some(first);
        while let Some(observation) = next {
            if let Some(hops) = &mut self.hops {
                hops.read(&observation);
            }
            batch.push(self.death_of(&observation));
            next = (batch.len() < MAX_BATCH)
                .then(|| self.monitor.try_next())
                .flatten();
        }
        self.finalize(batch);
    }

    /// Ends every ACTIVE session owned by the dead processes, in one transaction, together
    /// with the deaths an earlier failed commit left over.
    pub(super) fn finalize(&mut self, mut deaths: Vec<OwnerDeath>) {
        // Computed once, at the death: a retried commit keeps the survivors of that moment.
        let owners = deaths
            .iter()
            .filter(|death| death.survivors.is_none())
            .map(|death| &death.owner);
        let mut found = self.survivors_of(owners).into_iter();
        for death in deaths.iter_mut().filter(|death| death.survivors.is_none()) {
            death.survivors = found.next().flatten();
        }
        // Older deaths first, so events keep the order in which deaths were seen. Nothing
        // is announced that was not committed; should the daemon stop before a retry
        // succeeds, the sessions are still ACTIVE in the store and the next start's
        // reconcile ends them.
        let committed = self.commit_or_keep(
            |uncommitted| &mut uncommitted.deaths,
            deaths,
            "finalizations",
            |engine, deaths| {
                engine.counters.largest_batch = engine.counters.largest_batch.max(deaths.len());
                let now = engine.config.clock.now_ms();
                engine.store.end_many(deaths, now)
            },
        );
        let Some((deaths, mut events)) = committed else {
            return;
        };
        if let Some(hops) = &mut self.hops {
            hops.committed(&mut events);
        }
        for event in &events {
            if let Some(by) = event.detected_by {
                *self.counters.finalized_by.entry(by).or_default() += 1;
            }
        }
        self.publish(events);
        // Every session of a dead owner has ended: nobody follows its tree now.
        self.forget_trees(deaths.iter().map(|death| &death.owner));
    }

    /// Announces committed events, then applies what they change for requests waiting for
    /// a lock (a freed lock is granted here, its event published after these), and starts
    /// terminating the survivors of sessions whose policy says so.
    pub(super) fn publish(&mut self, events: Vec<Event>) {
        // Without waiters nothing can change for them: a burst of ends costs nothing more.
        let effects = if self.waiters.is_empty() {
            Vec::new()
        } else {
            LockEffect::of(&events)
        };
        let to_reap = terminating(&events);
        self.broadcast(events);
        self.follow_locks(effects);
        // Once the subscribers have the endings, while the sessions' trees are still known.
        for ended in &to_reap {
            self.start_reap(ended);
        }
    }

    /// Sends committed events, as one batch, to every subscriber. A subscriber whose queue
    /// is full is dropped; its connection tells it `lagged`. The metrics come after, and
    /// the log lines only once the woken connections have written (see `eventlog`).
    fn broadcast(&mut self, mut events: Vec<Event>) {
        let batch: Batch = events
            .iter_mut()
            .filter_map(|event| {
                self.usage.apply(event);
                super::hops::published(event);
                match serde_json::to_string(&EventLine { event }) {
                    Ok(line) => Some(Published {
                        seq: event.seq,
                        session: event.session.clone(),
                        creator_uid: event.creator_uid,
                        line,
                    }),
                    Err(e) => {
                        tracing::error!(error = %e, seq = event.seq, "cannot serialize event");
                        None
                    }
                }
            })
            .collect();
        self.send(&batch);
        for event in &events {
            self.end_metrics.record(event);
        }
        self.unlogged.push(events, &mut self.fresh_owners);
    }

    fn send(&mut self, batch: &Batch) {
        let Some(last) = batch.last().map(|p| p.seq) else {
            return;
        };
        let before = self.subscribers.len();
        let counters = &mut self.counters;
        self.subscribers
            .retain(|queue| match queue.try_send(Arc::clone(batch)) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    counters.lagged_subscribers += 1;
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
        if self.subscribers.len() < before {
            tracing::debug!(
                seq = last,
                dropped = before - self.subscribers.len(),
                "dropped lagging or closed subscribers"
            );
        }
    }

    pub(super) fn handle(&mut self, command: Command) {
        match command {
            Command::Request {
                caller,
                request,
                fds,
                reply,
            } => match *request {
                Request::LockAcquire(request::LockAcquire {
                    name,
                    session,
                    uid,
                    wait,
                    timeout_ms,
                }) => {
                    let request = AcquireRequest {
                        name,
                        session,
                        uid,
                        wait,
                        timeout_ms,
                    };
                    self.lock_acquire(caller, request, reply);
                }
                request => {
                    let answer = self.request(caller, request, &fds);
                    self.answer(reply, answer);
                }
            },
            Command::Tree {
                caller,
                session,
                uid,
                reply,
            } => {
                let _ = reply.send(self.tree_of(caller, &session, uid));
            }
            Command::Whose {
                caller,
                pid,
                ancestry,
                reply,
            } => {
                let _ = reply.send(self.whose(caller, pid, &ancestry));
            }
            Command::End {
                caller,
                session,
                uid,
                terminate,
                survivors,
                reply,
            } => {
                let _ = reply.send(self.end(caller, &session, uid, terminate, survivors));
            }
            Command::Waiting { reply } => {
                let _ = reply.send(self.waiting());
            }
            Command::Subscribe { reply } => {
                let (queue, batches) = mpsc::channel(self.config.subscriber_queue);
                let head = match self.store.head_seq() {
                    Ok(head) => head,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read head seq");
                        return;
                    }
                };
                let subscription = Subscription {
                    head,
                    store_id: self.store_id.clone(),
                    batches,
                };
                if reply.send(subscription).is_ok() {
                    self.subscribers.push(queue);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use liveness_common::protocol::StreamMessage;

    #[test]
    fn a_borrowed_event_line_is_the_stream_message() {
        // Built from JSON so that fields added later need no change here.
        let event: Event = serde_json::from_value(serde_json::json!({
            "seq": 7, "kind": "session.ended", "at_ms": 1, "session": "s",
            "owner": {"pid": 1, "start_ticks": 2, "boot_id": "b", "host": "h", "comm": "c"},
            "reason": "owner_exited", "detected_by": "ebpf", "labels": {"k": "v"},
            "creator_uid": 0,
        }))
        .unwrap();
        assert_eq!(
            serde_json::to_string(&EventLine { event: &event }).unwrap(),
            serde_json::to_string(&StreamMessage::Event(Box::new(event))).unwrap()
        );
    }
}
