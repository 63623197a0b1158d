//! What a stall does besides its `session.stalled`: the action of the session's policy, or
//! of the daemon's `--on-stall`. It runs once per episode: only after the episode's start
//! is committed, which a restart never repeats (so a crash between the commit and the
//! action loses that run, and never doubles it). Each runs in a task of its own, never on
//! the engine nor in a sampling round; a user has at most its action slots of them at
//! once, and the others are skipped with a warning (the event still says it all).
//!
//! - `run`: the command runs as the session's creator, like an end action (see
//!   [`crate::action`]), with [`StallFacts`] on its stdin and in `LIVENESS_*` variables.
//! - `signal`: to the owner, through a pidfd verified against its fingerprint, and only
//!   where the creator could signal it itself (see [`crate::reap`]).
//! - `terminate`: the owner and the tree's members as sampled get SIGTERM, then SIGKILL
//!   after the session's grace, by the same rules. The owner's death then ends the
//!   session as any death does, its cause naming the daemon's signal.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustix::process::Signal;

use liveness_common::activity::{Activity, StallAction, StallFacts, StallPolicy};
use liveness_common::identity::Identity;

use crate::action::{ActionRunner, spawn};
use crate::reap::Reaper;

/// One stall episode's start to act on.
#[derive(Debug, Clone)]
pub struct Stall {
    pub uid: u32,
    pub session: String,
    pub labels: BTreeMap<String, String>,
    pub owner: Identity,
    /// The tree's live processes at the sample, the owner among them.
    pub members: Vec<Identity>,
    pub grace: Duration,
    /// The action, and its `signal` or `run`.
    pub policy: StallPolicy,
    pub activity: Activity,
}

/// Runs the stall actions.
#[derive(Debug, Clone)]
pub struct Responder {
    runner: ActionRunner,
    reaper: Reaper,
    per_uid: usize,
    /// The actions running, per uid.
    running: Arc<Mutex<HashMap<u32, usize>>>,
}

impl Responder {
    pub fn new(runner: ActionRunner, reaper: Reaper, per_uid: usize) -> Responder {
        Responder {
            runner,
            reaper,
            per_uid: per_uid.max(1),
            running: Arc::default(),
        }
    }

    /// Starts `stall`'s action in a task of its own (nothing for `notify`).
    pub fn respond(&self, stall: Stall) {
        let action = stall.policy.action.unwrap_or_default();
        if action == StallAction::Notify {
            return;
        }
        let Some(slot) = self.slot(stall.uid) else {
            tracing::warn!(uid = stall.uid, session = %stall.session, ?action, "a stall action is skipped: its user has all its action slots busy");
            return;
        };
        let this = self.clone();
        tokio::spawn(async move {
            let _slot = slot;
            this.act(action, stall).await;
        });
    }

    async fn act(&self, action: StallAction, stall: Stall) {
        let (uid, session) = (stall.uid, stall.session.clone());
        match action {
            StallAction::Notify => {}
            StallAction::Run => {
                let Some(spec) = stall.policy.run.clone() else {
                    return;
                };
                let facts = StallFacts {
                    session: stall.session,
                    uid,
                    labels: stall.labels,
                    owner: stall.owner,
                    activity: stall.activity,
                };
                // Nothing records a stall command's process: it may run at once.
                let outcome = self
                    .runner
                    .run(&spec, &facts, None, |_, release| {
                        if let Err(e) = spawn::release(release) {
                            tracing::warn!(error = %e, "cannot release a stall command");
                        }
                    })
                    .await;
                tracing::info!(uid, %session, exit = ?outcome.exit, timed_out = outcome.timed_out, error = outcome.error.as_deref(), "stall command finished");
            }
            StallAction::Signal => {
                let signal = stall.policy.signal.and_then(Signal::from_named_raw);
                let Some(signal) = signal else {
                    return;
                };
                match self.reaper.signal_one(&stall.owner, uid, signal).await {
                    Ok(true) => {
                        tracing::info!(uid, %session, pid = stall.owner.pid, ?signal, "stalled session's owner signalled");
                    }
                    Ok(false) => {}
                    Err(reason) => {
                        tracing::warn!(uid, %session, pid = stall.owner.pid, reason, "stalled session's owner not signalled");
                    }
                }
            }
            StallAction::Terminate => {
                let reaped = self.reaper.reap(&stall.members, uid, stall.grace).await;
                tracing::info!(uid, %session, terminated = reaped.terminated.len(), killed = reaped.killed.len(), failed = reaped.failed.len(), "stalled session's tree terminated");
            }
        }
    }

    /// One of `uid`'s slots, given back when dropped; `None` when all are taken.
    fn slot(&self, uid: u32) -> Option<Slot> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let count = running.entry(uid).or_default();
        (*count < self.per_uid).then(|| {
            *count += 1;
            Slot {
                uid,
                running: Arc::clone(&self.running),
            }
        })
    }
}

/// A user's action slot, held while its action runs.
struct Slot {
    uid: u32,
    running: Arc<Mutex<HashMap<u32, usize>>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = running.get_mut(&self.uid) {
            *count -= 1;
            if *count == 0 {
                running.remove(&self.uid);
            }
        }
    }
}
