//! End actions (invariant 13): the commands a session's creator registered, run once its
//! end is committed and published, whatever ended it.
//!
//! A user has a few slots (`--action-slots`); its actions beyond them wait in its queue,
//! in the order their sessions ended, as a key and a few numbers each, so that many
//! waiting actions cost little. Each action in a slot is a task on the runtime that serves
//! connections, never on the engine's: it asks the engine to mark it `running` (a commit,
//! before anything is spawned), runs as the creator (see [`crate::action`]), and hands its
//! outcome back; the engine commits the `session.action` event (with `session.finalized`
//! after the last) and publishes it like any other. The engine never waits on an action.
//!
//! Once: an action whose outcome is committed never runs again. Its first process is
//! recorded (pid and start time, committed) before it is released to run its program: a
//! process the daemon could not record runs nothing (see [`crate::action::spawn`]). One
//! marked `running` when the daemon stopped or crashed runs again at the next start, marked
//! `resumed`, after what is left of the earlier run (its recorded first process, verified
//! by its start time, and its tree) has been ended, so that the two never run side by
//! side. A clean stop ends the
//! running actions' trees itself and leaves them `running`. The actions of a session whose
//! end was committed but whose actions never started (a crash in between, or a death found
//! by the reconcile at start) start at the next start.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::{Id, JoinError, JoinSet};

use liveness_common::action::{ActionOutcome, ActionRun};
use liveness_common::identity::ProcessKey;
use liveness_common::session::{Event, EventKind, Session};
use liveness_common::status::ActionsStatus;
use liveness_proc::identity::ProcRoot;

use crate::action::tree::end_leftover;
use crate::action::{ActionRunner, RunOptions};
use crate::store::{ActionKey, DueAction, Store};

/// How end actions run: the daemon's `--action-slots` and `--action-grace`, and where.
#[derive(Debug, Clone)]
pub struct ActionConfig {
    /// Most actions of one user running at once.
    pub per_uid: usize,
    /// Between SIGTERM and SIGKILL when an action's tree is ended.
    pub kill_grace: Duration,
    /// The runtime the runs go to; the current one when `None` (tests).
    pub runtime: Option<tokio::runtime::Handle>,
    /// Where the actions' processes are read: the engine's `/proc` when `None` (a test
    /// whose engine reads a made-up one still runs real actions).
    pub proc: Option<ProcRoot>,
}

impl Default for ActionConfig {
    fn default() -> ActionConfig {
        ActionConfig {
            per_uid: crate::action::runner::DEFAULT_ACTIONS_PER_UID,
            kill_grace: crate::action::runner::DEFAULT_KILL_GRACE,
            runtime: None,
            proc: None,
        }
    }
}

/// A finished run: which action, and what it did (`None`: it was not run after all, as it
/// had an outcome by the time its slot came, or could not be marked running).
pub(super) type ActionDone = (ActionKey, Option<ActionOutcome>);

/// What a run tells the engine on its way.
#[derive(Debug)]
pub(super) enum Progress {
    /// It has its slot: mark it `running`, and say whether to run it.
    Begin {
        key: ActionKey,
        reply: oneshot::Sender<Begun>,
    },
    /// Its first process exists: record it, then let it run (`release`).
    Spawned {
        key: ActionKey,
        root: ProcessKey,
        release: OwnedFd,
    },
}

/// The engine's answer to [`Progress::Begin`].
#[derive(Debug)]
pub(super) enum Begun {
    /// Marked `running`: run it, with the facts of its ended session.
    Run(Box<Session>),
    /// It has an outcome already, or its session is gone.
    Skip,
    /// The store could not mark it: ask again later.
    Later,
}

/// What [`Actions::next`] found.
#[derive(Debug)]
pub(super) enum Next {
    Progress(Progress),
    Finished(Result<ActionDone, JoinError>),
}

/// The end actions under way.
#[derive(Debug)]
pub(super) struct Actions {
    runner: ActionRunner,
    runtime: Option<tokio::runtime::Handle>,
    /// Most tasks of one uid at once: its slots.
    per_uid: usize,
    tasks: JoinSet<ActionDone>,
    /// The action of each task, to free its slot however the task ends (a panic too).
    task_keys: HashMap<Id, ActionKey>,
    /// Tasks of each uid with at least one; never more than `per_uid`.
    slots_taken: HashMap<u32, usize>,
    /// Actions of each uid with one waiting, waiting for a slot, oldest first.
    waiting: HashMap<u32, VecDeque<DueAction>>,
    progress_tx: mpsc::UnboundedSender<Progress>,
    progress: mpsc::UnboundedReceiver<Progress>,
    /// The actions with a task or waiting for one, so that none ever gets two.
    live: HashSet<ActionKey>,
    /// Those of them marked running.
    begun: HashSet<ActionKey>,
    /// The first process of each running action, for a stop to end.
    running: HashMap<ActionKey, ProcessKey>,
    /// Ended sessions whose actions start once SQLite has their end, by uid and id.
    queued: Vec<(u32, String)>,
}

/// The `session.ended` events among `events` of sessions with end actions.
pub(super) fn with_actions(events: &[Event]) -> impl Iterator<Item = (u32, String)> + '_ {
    events
        .iter()
        .filter(|event| event.kind == EventKind::Ended && event.actions > 0)
        .map(|event| (event.creator_uid, event.session.clone()))
}

impl Actions {
    pub(super) fn new(config: &ActionConfig, proc: ProcRoot) -> Actions {
        let options = RunOptions {
            proc: config.proc.clone().unwrap_or(proc),
            kill_grace: config.kill_grace,
        };
        let (progress_tx, progress) = mpsc::unbounded_channel();
        Actions {
            runner: ActionRunner::new(options),
            runtime: config.runtime.clone(),
            per_uid: config.per_uid.max(1),
            tasks: JoinSet::new(),
            task_keys: HashMap::new(),
            slots_taken: HashMap::new(),
            waiting: HashMap::new(),
            progress_tx,
            progress,
            live: HashSet::new(),
            begun: HashSet::new(),
            running: HashMap::new(),
            queued: Vec::new(),
        }
    }

    /// Queues the actions of sessions that just ended, for [`Actions::start_queued`].
    pub(super) fn ended(&mut self, sessions: impl IntoIterator<Item = (u32, String)>) {
        self.queued.extend(sessions);
    }

    /// Whether sessions wait for their actions to start.
    pub(super) fn has_queued(&self) -> bool {
        !self.queued.is_empty()
    }

    /// Starts the actions of the queued sessions, now that SQLite has their ends. Returns
    /// the `session.finalized` events of those with none left to run (each was skipped
    /// before the end), committed.
    pub(super) fn start_queued(&mut self, store: &mut Store, now_ms: i64) -> Vec<Event> {
        let mut finalized = Vec::new();
        let mut failed = Vec::new();
        for (uid, id) in std::mem::take(&mut self.queued) {
            let started = store.actions_due(Some((uid, &id))).and_then(|due| {
                if due.is_empty() {
                    finalized.extend(store.finalize_if_done(uid, &id, now_ms)?);
                }
                due.into_iter().for_each(|due| self.spawn(due));
                Ok(())
            });
            if let Err(e) = started {
                let e = store.explain(e);
                tracing::error!(error = %e, session = id, "cannot start a session's end actions; trying again");
                failed.push((uid, id));
            }
        }
        // Kept for the retry tick.
        self.queued = failed;
        finalized
    }

    /// At start: runs the actions of ended sessions that have no outcome, those a stop or
    /// a crash cut short again (`resumed`).
    pub(super) fn resume(&mut self, store: &Store) {
        let due = match store.actions_due(None) {
            Ok(due) => due,
            Err(e) => {
                tracing::error!(error = %e, "cannot list the end actions left to run; they are not run");
                return;
            }
        };
        if !due.is_empty() {
            let resumed = due.iter().filter(|due| due.resumed).count();
            tracing::warn!(
                count = due.len(),
                resumed,
                "running the end actions of sessions that ended while the daemon was down or stopping"
            );
        }
        due.into_iter().for_each(|due| self.spawn(due));
    }

    /// Starts `due` in a slot of its uid, or queues it behind the others of that uid.
    fn spawn(&mut self, due: DueAction) {
        if !self.live.insert(due.key.clone()) {
            return;
        }
        let uid = due.key.uid;
        let taken = self.slots_taken.entry(uid).or_default();
        if *taken < self.per_uid {
            *taken += 1;
            self.start(due);
        } else {
            self.waiting.entry(uid).or_default().push_back(due);
        }
    }

    /// A task of `uid` ended: the next action it has waiting takes its slot.
    fn slot_freed(&mut self, uid: u32) {
        let next = self.waiting.get_mut(&uid).and_then(VecDeque::pop_front);
        if self.waiting.get(&uid).is_some_and(VecDeque::is_empty) {
            self.waiting.remove(&uid);
        }
        match next {
            Some(due) => self.start(due),
            None => {
                if let Some(taken) = self.slots_taken.get_mut(&uid) {
                    *taken -= 1;
                    if *taken == 0 {
                        self.slots_taken.remove(&uid);
                    }
                }
            }
        }
    }

    /// Runs `due` in a slot its uid has taken.
    fn start(&mut self, due: DueAction) {
        let DueAction {
            key,
            gid,
            resumed,
            root,
        } = due;
        let task_key = key.clone();
        let runner = self.runner.clone();
        let progress = self.progress_tx.clone();
        let run = async move {
            let options = runner.options();
            if let Some(root) = root {
                end_leftover(&options.proc, root, options.kill_grace).await;
            }
            let begun = loop {
                let (reply, begun) = oneshot::channel();
                let begin = Progress::Begin {
                    key: key.clone(),
                    reply,
                };
                if progress.send(begin).is_err() {
                    break None;
                }
                match begun.await {
                    Ok(Begun::Run(session)) => break Some(session),
                    Ok(Begun::Skip) | Err(_) => break None,
                    Ok(Begun::Later) => tokio::time::sleep(super::RETRY_PERIOD).await,
                }
            };
            let run = ActionRun {
                index: key.index,
                resumed,
            };
            let Some(session) = begun else {
                return (key, None);
            };
            let Some(facts) = session.end_facts(run) else {
                return (key, None);
            };
            let Some(spec) = session.on_end_run.get(key.index as usize) else {
                return (key, None);
            };
            let spawned = |root, release| {
                let _ = progress.send(Progress::Spawned {
                    key: key.clone(),
                    root,
                    release,
                });
            };
            let outcome = runner.run(spec, &facts, gid, spawned).await;
            (key, Some(outcome))
        };
        let task = match &self.runtime {
            Some(runtime) => self.tasks.spawn_on(run, runtime),
            None => self.tasks.spawn(run),
        };
        self.task_keys.insert(task.id(), task_key);
    }

    /// What a run says next, or the next run to finish; pending while none runs.
    /// Cancel-safe.
    pub(super) async fn next(&mut self) -> Next {
        // Progress first: what a run said before it finished is taken before its end.
        tokio::select! {
            biased;
            Some(progress) = self.progress.recv() => Next::Progress(progress),
            Some(joined) = self.tasks.join_next_with_id() => {
                let (id, done) = match joined {
                    Ok((id, done)) => (id, Ok(done)),
                    Err(e) => (e.id(), Err(e)),
                };
                if let Some(key) = self.task_keys.remove(&id) {
                    self.slot_freed(key.uid);
                    // A run that panicked says nothing more (its row stays for the next
                    // start); one that finished is done once its outcome is taken.
                    if done.is_err() {
                        self.done(&key);
                    }
                }
                Next::Finished(done)
            }
        }
    }

    /// A run was marked running: it has its slot.
    pub(super) fn begun(&mut self, key: ActionKey) {
        self.begun.insert(key);
    }

    /// How many run and wait, with `uncommitted` outcomes, for `status`.
    pub(super) fn status(&self, uncommitted: usize) -> ActionsStatus {
        ActionsStatus {
            running: self.begun.len() as u64,
            waiting: self.live.len().saturating_sub(self.begun.len()) as u64,
            uncommitted_outcomes: uncommitted as u64,
        }
    }

    /// A run's first process exists.
    pub(super) fn spawned(&mut self, key: ActionKey, root: ProcessKey) {
        self.running.insert(key, root);
    }

    /// A run is over (its outcome is being recorded, or it did not run after all): its
    /// process is no longer a stop's to end, and the action may get a task again.
    pub(super) fn done(&mut self, key: &ActionKey) {
        self.running.remove(key);
        self.live.remove(key);
        self.begun.remove(key);
    }

    /// At shutdown: the runs are cut short and what they started is ended (their rows stay
    /// `running`, so the next start runs them again). Returns those that finished first.
    pub(super) async fn stop(&mut self) -> Vec<(ActionKey, ActionOutcome)> {
        if self.tasks.is_empty() {
            return Vec::new();
        }
        tracing::warn!(
            count = self.tasks.len(),
            "stopping while end actions run: they are ended now and run again at the next start"
        );
        self.tasks.abort_all();
        let mut finished = Vec::new();
        while let Some(done) = self.tasks.join_next().await {
            if let Ok((key, Some(outcome))) = done {
                finished.push((key, outcome));
            }
        }
        // A run may have started its process after the engine last read what the runs
        // said (the stop is served first): that process is ended too.
        while let Ok(progress) = self.progress.try_recv() {
            // Its release is dropped unwritten: that process exits without running.
            if let Progress::Spawned { key, root, .. } = progress {
                self.running.insert(key, root);
            }
        }
        for (key, _) in &finished {
            self.running.remove(key);
        }
        let options = self.runner.options().clone();
        let ending = self.running.drain().map(|(_, root)| {
            let options = options.clone();
            async move { end_leftover(&options.proc, root, options.kill_grace).await }
        });
        let mut ends = JoinSet::new();
        for end in ending {
            ends.spawn(end);
        }
        ends.join_all().await;
        finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(uid: u32, index: u32) -> DueAction {
        DueAction {
            key: ActionKey {
                uid,
                session: "s".into(),
                index,
            },
            gid: None,
            resumed: false,
            root: None,
        }
    }

    /// Answers every run's Begin with `Skip` until `count` runs finished; returns those,
    /// checking that the tasks never outnumber `most`.
    async fn skip(actions: &mut Actions, count: usize, most: usize) -> Vec<ActionKey> {
        let mut finished = Vec::new();
        while finished.len() < count {
            match actions.next().await {
                Next::Progress(Progress::Begin { key: _, reply }) => {
                    reply.send(Begun::Skip).expect("the run waits");
                }
                Next::Finished(Ok((key, None))) => {
                    actions.done(&key);
                    finished.push(key);
                }
                other => panic!("runs ask to begin, then finish: {other:?}"),
            }
            assert!(actions.tasks.len() <= most, "{} tasks", actions.tasks.len());
        }
        finished
    }

    /// Actions beyond a user's slots wait in its queue, not as tasks: however many wait,
    /// a user has at most its slots' worth of tasks, and another user's actions start
    /// beside them.
    #[tokio::test]
    async fn actions_beyond_the_slots_wait_without_a_task() {
        let config = ActionConfig {
            per_uid: 2,
            ..ActionConfig::default()
        };
        let mut actions = Actions::new(&config, ProcRoot::default());
        for index in 0..1_000 {
            actions.spawn(due(1000, index));
        }
        actions.spawn(due(1000, 0));
        actions.spawn(due(1001, 0));
        assert_eq!(actions.tasks.len(), 3, "two of 1000's, one of 1001's");
        assert_eq!(actions.waiting[&1000].len(), 998);
        assert_eq!(
            actions.status(0).waiting,
            1_001,
            "queued ones count as waiting"
        );
        // Each finished run makes room for the next of its user, oldest first.
        let finished = skip(&mut actions, 6, 3).await;
        let of_1000: HashSet<u32> = finished
            .iter()
            .filter(|key| key.uid == 1000)
            .map(|key| key.index)
            .collect();
        let started = 2 + of_1000.len() as u32;
        assert!(of_1000.iter().all(|index| *index < started), "{finished:?}");
        assert_eq!(actions.waiting[&1000].len(), 1_000 - started as usize);
        let mut rest = skip(&mut actions, 2, 3).await;
        rest.extend(finished);
        assert!(rest.iter().any(|key| key.uid == 1001), "{rest:?}");
        assert!(!actions.waiting.contains_key(&1001));
        assert_eq!(actions.tasks.len(), 2, "1001 has none left");
    }
}
