//! The engine's loop and its order: exits first, then commands; commit, then publish,
//! then the effects (lock grants, reaps), then reply. The engine's owners are its fields,
//! private to this module: operations reach them through a [`Context`] only.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, watch};

use crate::cgroup::reclaim::Report;
use crate::deadline::sleep_until;
use crate::source::ExitObservation;
use crate::store::{ActionKey, Begin, Ending, OwnerDeath};
use liveness_common::action::ActionOutcome;
use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::session::{EndReason, Event, Session};

use super::actions::{Begun, Next, Progress};
use super::effects::Done;
use super::effects::Effects;
use super::facts::Facts;
use super::fanout::FanOut;
use super::housekeeping::Housekeeping;
use super::ledger::{Appended, Ledger};
use super::locks::LockEffect;
use super::reaps::{ReapDone, Views};
use super::tree::{REFRESH_PERIOD, Start, TREE_PERIOD, TreeWork};
use super::watch::{Prepared, Watch};
use super::{EndMetrics, EngineConfig};
use crate::source::monitor::Monitor;
use crate::source::tree_map::TreeMap;
use crate::store::Store;
use liveness_common::status::DaemonInfo;

mod context;
#[cfg(test)]
mod tests;

use super::{Command, EngineError, FILE_CHECK_PERIOD, MAX_BATCH, RETRY_PERIOD, housekeeping};
pub use context::Context;

/// The engine: the order of what happens (commit, then publish, then the effects), over
/// owners that each hold their state.
#[derive(Debug)]
pub struct Engine {
    /// The store, the journal, the commits to make again, the accounts.
    ledger: Ledger,
    /// Where committed events go: subscribers, metrics, log lines, hops.
    fanout: FanOut,
    facts: Facts,
    /// The exit monitor and the trees of tracked owners.
    watch: Watch,
    /// Lock waiters, reaps and end actions.
    effects: Effects,
    housekeeping: Housekeeping,
}

impl Engine {
    pub fn new(
        store: Store,
        monitor: Monitor,
        config: EngineConfig,
        about: DaemonInfo,
    ) -> Result<Engine, EngineError> {
        // The sources match start times exactly: a daemon whose readings are a tick apart
        // from the kernel's would see every owner as already replaced.
        config.proc.exact_start_times()?;
        let boot_id = config.proc.boot_id()?;
        let host = config.proc.host()?;
        // Before anything reads the store: what a crash left in the journal goes in first.
        let ledger = Ledger::open(store, &config.limits, &boot_id)?;
        let lineage = Arc::new(ledger.store().lineage()?);
        let facts = Facts {
            config,
            boot_id,
            host,
            lineage,
            started: Instant::now(),
            about,
        };
        let watch = Watch::new(monitor, &facts);
        Ok(Engine {
            effects: Effects::new(&facts.config, &facts.boot_id, watch.tree_reader()),
            watch,
            fanout: FanOut::new(facts.config.subscriber_queue, facts.config.trace_hops),
            ledger,
            facts,
            housekeeping: Housekeeping::default(),
        })
    }

    /// The exit sources that run.
    pub fn active_sources(&self) -> Vec<liveness_common::exit::DetectedBy> {
        self.watch.active_sources()
    }

    /// A handle of the kernel's tree map, for connections to read trees with.
    pub fn tree_reader(&self) -> Option<Arc<TreeMap>> {
        self.watch.tree_reader()
    }

    /// The counts of session ends the engine keeps for the metrics listener (shared).
    pub fn end_metrics(&self) -> EndMetrics {
        self.fanout.end_metrics()
    }
}

/// What woke the engine's loop.
// One lives on the stack for a turn of the loop: no reason to box the big outcomes.
#[allow(clippy::large_enum_variant)]
enum Wake {
    Death(ExitObservation),
    Command(Command),
    Reap(Result<ReapDone, tokio::task::JoinError>),
    Action(Next),
    Cgroup(crate::cgroup::reclaim::Report),
    Retry,
    Housekeeping,
    TreeRefresh,
    TreeWalked(Vec<TreeWork>),
    FileCheck,
    TreeSlice,
    Apply,
    Idle,
}

/// A tokio interval of `period` whose missed ticks are delayed, not burst.
fn every(period: std::time::Duration) -> tokio::time::Interval {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval
}

impl Engine {
    /// Runs until `shutdown` turns true, then commits every exit already observed. Fails
    /// when the database file is deleted or replaced under it.
    pub async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), EngineError> {
        let _checkpointer = crate::store::Checkpointer::start(self.ledger.store().path())
            .inspect_err(|e| tracing::error!(error = %e, "cannot start the WAL checkpoint; the WAL grows until the next start"))
            .ok();
        self.reconcile_at_start();
        // Expiry and retention are applied before the first client is served, so a replay
        // right after a start already sees the retention window.
        self.housekeeping();
        let period = housekeeping::period(&self.facts.config);
        let mut housekeeping =
            tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut retry = every(RETRY_PERIOD);
        let mut trees = every(REFRESH_PERIOD);
        let mut tree_slices = every(TREE_PERIOD);
        let mut file_check = every(FILE_CHECK_PERIOD);
        let outcome = loop {
            // Deaths already in the ring are read first, without waiting for readiness: a
            // thread kept busy by commands would otherwise only learn of it when its runtime
            // next polls for events.
            if let Some(observation) = self.watch.try_next() {
                self.finalize_observed(observation);
            }
            let apply_at = self.ledger.apply_at();
            let retrying = self.ledger.has_retries() || self.effects.has_queued();
            let tree_work = self.watch.has_tree_work();
            let idle_work = self.has_idle_work();
            let (death, walked) = self.watch.wakes();
            let wake = tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => break Ok(()),
                observation = death => Wake::Death(observation),
                command = commands.recv() => match command {
                    Some(command) => Wake::Command(command),
                    None => break Ok(()),
                },
                done = self.effects.next() => match done {
                    Done::Reap(done) => Wake::Reap(done),
                    Done::Action(next) => Wake::Action(next),
                    Done::Cgroup(emptied) => Wake::Cgroup(emptied),
                },
                _ = retry.tick(), if retrying => Wake::Retry,
                _ = housekeeping.tick() => Wake::Housekeeping,
                _ = trees.tick() => Wake::TreeRefresh,
                found = walked => Wake::TreeWalked(found),
                _ = file_check.tick() => Wake::FileCheck,
                _ = tree_slices.tick(), if tree_work => Wake::TreeSlice,
                () = sleep_until(apply_at), if apply_at.is_some() => Wake::Apply,
                // Last: only when nothing else is ready, after one yield, so that a death
                // that comes meanwhile is not written behind log lines or the letting go
                // of dead owners' trees.
                () = tokio::task::yield_now(), if idle_work => Wake::Idle,
            };
            // Everything but a death, idle work and the file's check reads or writes
            // SQLite, which must first have what was published (and the seqs it used), and
            // may read the trees, which must no longer hold the dead owners'.
            if !matches!(wake, Wake::Death(_) | Wake::Idle | Wake::FileCheck) {
                self.watch.let_go();
                self.caught_up();
            }
            match wake {
                Wake::Death(observation) => self.finalize_observed(observation),
                Wake::Command(command) => command.run(&mut Context::new(&mut self)),
                Wake::Reap(Ok(done)) => self.record_reaps(vec![done]),
                // Still due in the store: the next start runs it again.
                Wake::Reap(Err(e)) => tracing::error!(error = %e, "a reap task failed"),
                Wake::Action(Next::Progress(progress)) => self.action_progress(progress),
                Wake::Action(Next::Finished(Ok((key, Some(outcome))))) => {
                    self.record_actions(vec![(key, outcome)]);
                }
                Wake::Action(Next::Finished(Ok((key, None)))) => self.effects.done(&key),
                // Still `running` in the store: the next start runs it again.
                Wake::Action(Next::Finished(Err(e))) => {
                    tracing::error!(error = %e, "an end action's task failed");
                }
                Wake::Cgroup(report) => self.cgroup_report(report),
                Wake::Retry => self.retry_commits(),
                Wake::Housekeeping => self.housekeeping(),
                Wake::TreeRefresh => self.watch.refresh(self.ledger.store_mut()),
                Wake::TreeWalked(found) => self.watch.walked(found),
                Wake::FileCheck => {
                    if let Err(e) = self.ledger.store().check_file() {
                        break Err(EngineError::Store(e));
                    }
                }
                Wake::TreeSlice => self.watch.tree_slice(),
                // Written by `caught_up` above.
                Wake::Apply => {}
                Wake::Idle => {
                    self.fanout.flush();
                    self.watch.let_go();
                }
            }
        };
        self.fanout.flush();
        // On failure nothing more is written to a file nobody will open again.
        outcome?;
        // In-flight exits are committed before the daemon goes away.
        while let Some(observation) = self.watch.try_next() {
            self.finalize_observed(observation);
        }
        self.finalize(Vec::new());
        self.caught_up();
        self.fanout.flush();
        // What the kernel added since the last refresh, for the next run.
        self.watch.finish(self.ledger.store_mut()).await;
        // A reap or an action that finished just before its abort is recorded after all.
        let finished = self.effects.cancel_reaps().await;
        self.record_reaps(finished);
        let finished = self.effects.stop_actions().await;
        self.record_actions(finished);
        if self.ledger.has_retries() {
            // Their sessions are still ACTIVE in the store, their reaps still due, their
            // actions still running: the next start reconciles them and runs them again.
            let (deaths, reaps, actions) = self.ledger.retry_counts();
            tracing::error!(
                deaths,
                reaps,
                actions,
                "stopping with finalizations, reap or end action outcomes that could not be committed; the next start will reconcile them and run them again"
            );
        }
        if let Err(e) = self.ledger.commit(|store| store.end_run()) {
            tracing::error!(error = %e, "cannot record the clean stop");
        }
        tracing::info!("engine stopped");
        Ok(())
    }

    /// Whether work waits that only follows a death's sends: log lines, dead owners' trees.
    fn has_idle_work(&self) -> bool {
        self.fanout.has_unlogged() || self.watch.has_unfollowed()
    }

    /// Reconciles every ACTIVE owner after a start: those that died while the daemon was
    /// down are finalized (`detected_by: reconcile`), the rest are watched. Reaps that a
    /// stop or a crash cut short run again first, so that the reaps of sessions ended here
    /// are not started twice.
    pub(super) fn reconcile_at_start(&mut self) {
        (self.effects).resume(self.ledger.store_mut(), self.watch.trees());
        // Before the deaths below are published: their sessions' cgroups are reclaimed.
        (self.effects.cgroups()).resume(self.ledger.active_sessions());
        let owners = match self.ledger.store().active_owners() {
            Ok(owners) => owners,
            Err(e) => {
                tracing::error!(error = %e, "cannot list active owners; nothing reconciled");
                return;
            }
        };
        let count = owners.len();
        let mut dead = Vec::new();
        for owner in owners {
            let (facts, store) = (&self.facts, self.ledger.store());
            if let Some(observation) = self.watch.watch(&owner, Start::Restart, facts, store) {
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
        (self.watch).follow_dead(&dead, &self.facts, self.ledger.store_mut());
        self.finalize(dead);
        // Housekeeping and the first requests follow at once: they read these ends.
        self.caught_up();
        (self.effects.cgroups()).reconcile(&self.facts.config.cgroups, self.ledger.store());
    }

    /// The reclaimer's news: a cgroup emptied and counted, or one that sessions waiting
    /// for their trees waited for holds no process any more (they end).
    pub(super) fn cgroup_report(&mut self, report: Report) {
        match report {
            Report::Emptied(emptied) => self.cgroup_emptied(*emptied),
            Report::Drained(path) => {
                let over = self.watch.drained(&path);
                if !over.is_empty() {
                    self.finalize(over);
                }
            }
        }
    }

    /// A session cgroup found empty: what it counted, its session's escapes and what it
    /// held besides the survivors are stored with its session, then it is removed. Should either fail, the cgroup stays for the next start's reconcile.
    fn cgroup_emptied(&mut self, emptied: crate::cgroup::reclaim::Emptied) {
        let crate::cgroup::reclaim::Emptied {
            job,
            usage,
            escaped,
            unlisted,
        } = emptied;
        if let Some((uid, id)) = &job.session
            && let Err(e) = (self.ledger)
                .commit(|store| store.cgroup_usage(*uid, id, &usage, &escaped, unlisted.as_ref()))
        {
            tracing::error!(error = %e, session = id, "cannot store what a session's cgroup counted; it is kept until the next start");
            return;
        }
        let released = match self.facts.config.cgroups.hierarchy() {
            Some(hierarchy) => hierarchy.release(&job.path),
            None => crate::cgroup::remove(&job.path),
        };
        if let Err(e) = released {
            tracing::warn!(error = %e, "cannot remove an emptied session cgroup; the next start tries again");
        }
    }

    /// Stops watching an owner that no ACTIVE session refers to any more.
    pub(super) fn unwatch_if_unused(&mut self, owner: &Identity) {
        (self.watch).unwatch_if_unused(owner, &self.facts, &self.ledger);
    }

    pub(super) fn finalize_observed(&mut self, first: ExitObservation) {
        let mut batch = Vec::new();
        let mut next = Some(first);
        while let Some(observation) = next {
            self.fanout.read(&observation);
            batch.push(self.facts.death_of(&observation));
            next = (batch.len() < MAX_BATCH)
                .then(|| self.watch.try_next())
                .flatten();
        }
        self.finalize(batch);
    }

    /// Ends every ACTIVE session owned by the dead processes, in one transaction, together
    /// with the deaths an earlier failed commit left over. Each owner is visited once, in
    /// this order: the watch, the ledger, the effects, the fan-out (docs/architecture.md).
    pub(super) fn finalize(&mut self, deaths: Vec<OwnerDeath>) {
        // Members of trees that sessions wait for stand for their owners at the last one's
        // death; sessions that last until their trees do are not ended by these deaths:
        // their trees' members are watched from now on, and stay followed.
        let Prepared {
            deaths,
            gone,
            views,
        } = (self.watch).prepare(deaths, &self.facts, &self.ledger);
        // Older deaths first, so events keep the order in which deaths were seen. Nothing
        // is announced that was not appended; should the daemon stop before a retry
        // succeeds, the sessions are still ACTIVE in the store and the next start's
        // reconcile ends them.
        let now = self.facts.now_ms();
        let settle = match self.ledger.append(deaths, now) {
            Some(Appended {
                events,
                journaled,
                many_wait,
            }) => {
                crate::faults::point("after-append");
                let set_off = self.effects.set_off(&events, views);
                self.fanout.broadcast(events, journaled);
                crate::faults::point("after-publish");
                set_off || many_wait
            }
            None => {
                self.effects.keep(views);
                false
            }
        };
        // SQLite gets the batch later, with the batches published meanwhile in one
        // transaction (and before any request that reads SQLite); at once when what it
        // set off reads it there (a reap's plan, an end action, a lock's grant).
        if settle {
            self.settle();
        }
        let mut gone = gone;
        for path in self.watch.take_drains() {
            if !self.effects.cgroups().drain(path.clone()) {
                // Nothing can watch the cgroup: the tree's members were all to wait for.
                gone.extend(self.watch.drained(&path));
            }
        }
        if !gone.is_empty() {
            self.finalize(gone);
        }
    }

    /// Settles what was published: SQLite gets the batches it lacks, then the effects
    /// they set off follow (grants, reaps, end actions).
    fn settle(&mut self) {
        self.caught_up();
        self.start_actions();
    }

    /// Whether SQLite has every published batch, after writing those it does not have (in
    /// one transaction) and setting off what they set off: what they freed is granted,
    /// their reaps start. While they cannot be written, tries again every [`RETRY_PERIOD`].
    pub(super) fn caught_up(&mut self) -> bool {
        let complete = self.ledger.catch_up();
        if complete {
            let locks = self.effects.settle(self.ledger.store());
            self.follow_locks(locks);
        }
        complete
    }

    /// Starts the end actions of the sessions that ended, once SQLite has their ends (a
    /// batch it could not write yet holds them back until it can).
    fn start_actions(&mut self) {
        if self.ledger.behind() {
            return;
        }
        let now = self.facts.now_ms();
        let finalized = self.effects.start_actions(self.ledger.store_mut(), now);
        if !finalized.is_empty() {
            self.publish(finalized);
        }
    }

    /// A run of an end action has its slot (it is marked `running` before it is spawned),
    /// or has spawned its first process.
    pub(super) fn action_progress(&mut self, progress: Progress) {
        match progress {
            Progress::Begin { key, reply } => {
                crate::faults::point("before-action-start");
                let begun = match self.ledger.commit(|store| store.run_action(&key)) {
                    Ok(Begin::Run(session)) => {
                        self.effects.begun(key.clone());
                        Begun::Run(session)
                    }
                    Ok(Begin::Skip) => Begun::Skip,
                    Err(e) => {
                        tracing::error!(error = %e, session = key.session, index = key.index, "cannot mark an end action as running; trying again");
                        Begun::Later
                    }
                };
                // The run may have been cut short meanwhile.
                let _ = reply.send(begun);
            }
            Progress::Spawned { key, root, release } => {
                match self.ledger.commit(|store| store.action_spawned(&key, root)) {
                    Ok(true) => {
                        if let Err(e) = crate::action::spawn::release(release) {
                            tracing::error!(error = %e, session = key.session, "cannot release an end action's process");
                        }
                        self.effects.spawned(key, root);
                    }
                    // Dropped unwritten, the release lets the process exit without running.
                    Ok(false) => {}
                    Err(e) => {
                        tracing::error!(error = %e, session = key.session, "cannot record an end action's process; it is not run");
                    }
                }
                crate::faults::point("after-action-spawn");
            }
        }
    }

    /// Commits and publishes the `session.action` events (and `session.finalized`) of
    /// finished end actions, after those whose commit failed before.
    pub(super) fn record_actions(&mut self, done: Vec<(ActionKey, ActionOutcome)>) {
        for (key, _) in &done {
            self.effects.done(key);
        }
        if !done.is_empty() {
            crate::faults::point("before-action-commit");
        }
        // Their events take the seqs after the published batches: SQLite must have those.
        let ready = self.caught_up();
        let now = self.facts.now_ms();
        if let Some(events) = self.ledger.record_actions(done, ready, now) {
            self.publish(events);
        }
    }

    /// Commits and publishes the `session.reaped` events of finished reaps, after those
    /// whose commit failed before.
    pub(super) fn record_reaps(&mut self, done: Vec<ReapDone>) {
        let ready = self.caught_up();
        let now = self.facts.now_ms();
        if let Some(events) = self.ledger.record_reaps(done, ready, now) {
            self.publish(events);
        }
    }

    /// The retry tick: writes and commits again whatever failed.
    pub(super) fn retry_commits(&mut self) {
        self.finalize(Vec::new());
        self.caught_up();
        self.record_reaps(Vec::new());
        self.record_actions(Vec::new());
        self.start_actions();
    }

    /// Ends what housekeeping finds due, and applies retention.
    pub(super) fn housekeeping(&mut self) {
        let now = self.facts.now_ms();
        let facts = &self.facts;
        let due = (self.housekeeping).due(self.ledger.store(), &facts.config, &facts.boot_id, now);
        for (session, reason) in due {
            self.end_due(&session, reason, now);
        }
        self.housekeeping
            .prune(self.ledger.store_mut(), &self.facts.config, now);
    }

    /// Ends a session housekeeping found due, if it still has the owner it had then.
    fn end_due(&mut self, session: &Session, reason: EndReason, now: i64) {
        let ending = Ending {
            survivors: self.watch.survivors_of(&session.owner),
            ..Ending::because(reason)
        };
        let owner = Some(&session.owner);
        let ended = (self.ledger)
            .commit(|store| store.end(session.creator_uid, &session.id, owner, &ending, now));
        match ended {
            Ok(events) if events.is_empty() => {}
            Ok(events) => {
                self.publish(events);
                self.unwatch_if_unused(&session.owner);
            }
            Err(e) => tracing::error!(error = %e, session = session.id, "cannot end session"),
        }
    }

    /// Announces events committed to SQLite, then settles what they set off: what they
    /// change for requests waiting for a lock (a freed lock is granted here, its event
    /// published before its grant is sent), the survivors of sessions whose policy says so
    /// terminated, end actions started.
    pub(super) fn publish(&mut self, events: Vec<Event>) {
        self.ledger.committed(&events);
        let views = self.watch.views_for(&events);
        self.announce(events, views, None, None);
    }

    /// [`Engine::publish`] after the ledger's and the watch's parts: `views` are the trees
    /// the reaps of the sessions the events end read. With an owner just registered (and
    /// when) whose death within a second is warned of, and the cgroup made for a new
    /// session (its user, its id), reclaimed at its end.
    pub(super) fn announce(
        &mut self,
        events: Vec<Event>,
        views: Views,
        fresh: Option<(ProcessKey, i64)>,
        made: Option<(u32, String, PathBuf)>,
    ) {
        if let Some((uid, id, path)) = made {
            self.effects.cgroups().active(uid, id, path);
        }
        self.effects.set_off(&events, views);
        if let Some((owner, now_ms)) = fresh {
            self.fanout.registered(owner, now_ms);
        }
        self.fanout.broadcast(events, &[]);
        self.settle();
    }

    /// Grants what `effects` freed, to the waiters first in line.
    fn follow_locks(&mut self, effects: Vec<LockEffect>) {
        for effect in effects {
            let now = self.facts.now_ms();
            let Some(granted) = self.effects.follow(effect, &mut self.ledger, now) else {
                continue;
            };
            // Published before the grant is sent: the connection may have closed just now,
            // and then the grant is undone by a release, which is published too.
            self.publish(vec![granted.event.clone()]);
            if let Some(release) = self.effects.deliver(granted, &mut self.ledger, now) {
                self.publish(vec![release]);
            }
        }
    }
}
