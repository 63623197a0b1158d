//! The cleanup policy: terminating an ended session's surviving processes.
//!
//! A session registered with `on_end: terminate`, or ended with `terminate: true`, has the
//! survivors of its process tree handed to the [`crate::reap::Reaper`] once its end is
//! committed and published, less those the owner still looks after and the process that
//! sent an `end` with its ancestors in the tree (see `Survivors::requested_by`).
//! Each reap runs in a task the engine owns (it waits out a grace period, and the engine
//! must not); its outcome comes back to the engine, which commits the `session.reaped`
//! event and publishes it like any other (a failed commit is kept and retried, see
//! [`super::retry`]).
//!
//! A reap is due from the commit of the end (the store marks it in that transaction) until
//! its outcome is recorded. A stop or a crash in between leaves it due, and the next start
//! runs it again: the survivors the end recorded, each checked against its fingerprint
//! once more, get SIGTERM again and a whole grace. One `session.reaped` is recorded per
//! session, whichever run finishes first.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::{JoinError, JoinSet};

use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::session::{
    DEFAULT_GRACE_MS, EndReason, Event, EventKind, OnEnd, ReapFailure, Reaped,
};
use liveness_proc::identity::{Liveness, ProcRoot};

use super::tree::{TreeView, Trees, descendants};
use crate::fair::offload::offload_for;
use crate::reap::Reaper;
use crate::source::tree_map::TreeMap;
use crate::store::Store;

/// What a reap signals, decided on the engine from what it knows cheaply; what costs as
/// much as the tree (completing a long survivors list, sparing the live owner's children)
/// is read in the reap's task, off the engine.
#[derive(Debug)]
struct ReapPlan {
    owner: Identity,
    /// The ending was not the owner's death: its live descendants are spared.
    owner_may_live: bool,
    /// The survivors the ending listed.
    listed: Vec<Identity>,
    /// The process that asked for the ending and its ancestors in the tree: never signalled.
    requested_by: Vec<Identity>,
    /// The tree as known at the ending, where the list was cut short.
    complete_with: Option<TreeView>,
    /// Why none may be signalled.
    refusal: Option<String>,
}

/// Processes to report as not signalled, and why.
type Refused = (Vec<Identity>, String);

impl ReapPlan {
    fn nothing(owner: Identity) -> ReapPlan {
        ReapPlan {
            owner,
            owner_may_live: false,
            listed: Vec::new(),
            requested_by: Vec::new(),
            complete_with: None,
            refusal: None,
        }
    }

    /// The processes to signal, read through `kernel` (the members map) and `proc`.
    fn targets(self, kernel: Option<&TreeMap>, proc: &ProcRoot) -> Result<Vec<Identity>, Refused> {
        let owner = self.owner;
        let mut members = self.listed;
        if let Some(tree) = self.complete_with {
            let known: HashSet<ProcessKey> = (members.iter().chain(&self.requested_by))
                .map(Identity::key)
                .collect();
            members.extend(
                tree.live_members(kernel, proc)
                    .into_iter()
                    .filter(|member| !known.contains(&member.key())),
            );
        }
        // Survivors never list the owner.
        members.retain(|member| !member.same_process(&owner));
        if let Some(reason) = self.refusal {
            return Err((members, reason));
        }
        if self.owner_may_live
            && proc.check_process(owner.key(), owner.pidfs_ino) == Liveness::Alive
        {
            let root = owner.key();
            match proc.processes() {
                Ok(processes) => {
                    let attached: HashSet<ProcessKey> =
                        descendants(&processes, |key| (key == root).then_some(root))
                            .into_iter()
                            .map(|member| member.key)
                            .collect();
                    members.retain(|member| !attached.contains(&member.key()));
                }
                Err(e) => {
                    let reason = format!(
                        "cannot tell whether it is still a child of the live owner ({e}): left running"
                    );
                    return Err((members, reason));
                }
            }
        }
        Ok(members)
    }
}

/// A finished reap: the ended event it was for, and what it did.
pub(super) type ReapDone = (Event, Reaped);

/// The trees of dead owners as they were at their deaths, which their reaps complete the
/// survivors an ending listed with.
pub(super) type Views = HashMap<ProcessKey, TreeView>;

/// The `session.ended` events among `events` of sessions whose policy is `terminate`.
pub(super) fn terminating(events: &[Event]) -> Vec<Event> {
    events
        .iter()
        .filter(|event| event.kind == EventKind::Ended && event.on_end == OnEnd::Terminate)
        .cloned()
        .collect()
}

/// The reaps under way: each a task that waits out its grace period and returns what it
/// did, for the engine to commit.
#[derive(Debug)]
pub(super) struct Reaps {
    tasks: JoinSet<ReapDone>,
    reaper: Reaper,
    proc: ProcRoot,
    /// This boot: only its processes are signalled.
    boot_id: String,
    /// The kernel's map of tracked trees, where eBPF runs.
    kernel: Option<Arc<TreeMap>>,
}

impl Reaps {
    pub(super) fn new(proc: ProcRoot, boot_id: String, kernel: Option<Arc<TreeMap>>) -> Reaps {
        Reaps {
            tasks: JoinSet::new(),
            reaper: Reaper::new(proc.clone()),
            proc,
            boot_id,
            kernel,
        }
    }

    /// Starts terminating what is left of the process tree of the session `ended` is about,
    /// with the session's grace period (see [`Reaps::plan`] for what is spared).
    pub(super) fn start(&mut self, ended: &Event, store: &Store, tree: Option<TreeView>) {
        self.spawn(ended, false, store, tree);
    }

    /// At start: runs again the reaps that a stop or a crash of the last run cut short;
    /// their ended events.
    pub(super) fn resume(&mut self, store: &mut Store, trees: &Trees) -> Vec<Event> {
        let due = match store.reaps_due() {
            Ok(due) => due,
            Err(e) => {
                tracing::error!(error = %e, "cannot list the reaps a stop cut short; they are not run again");
                return Vec::new();
            }
        };
        if !due.is_empty() {
            tracing::warn!(
                count = due.len(),
                "running again the terminations of sessions' processes that the last run did not finish"
            );
        }
        for ended in &due {
            self.spawn(ended, true, store, Some(trees.view(ended.owner.key())));
        }
        due
    }

    fn spawn(&mut self, ended: &Event, resumed: bool, store: &Store, tree: Option<TreeView>) {
        let grace_ms = match store.get(ended.creator_uid, &ended.session) {
            Ok(Some(session)) => session.grace_ms,
            Ok(None) => DEFAULT_GRACE_MS,
            Err(e) => {
                tracing::error!(error = %e, session = ended.session, "cannot read the session's grace; using the default");
                DEFAULT_GRACE_MS
            }
        };
        let plan = self.plan(ended, store, tree);
        let ended = ended.clone();
        let (reaper, kernel, proc) = (self.reaper.clone(), self.kernel.clone(), self.proc.clone());
        // Through the task set also when nothing is signalled, so that the outcome is
        // published after the ending.
        self.tasks.spawn(async move {
            let uid = ended.creator_uid;
            let targets = offload_for(uid, move || plan.targets(kernel.as_deref(), &proc)).await;
            let reaped = match targets {
                Some(Ok(targets)) => {
                    tracing::info!(
                        session = ended.session,
                        uid = ended.creator_uid,
                        processes = targets.len(),
                        grace_ms,
                        "terminating the session's surviving processes"
                    );
                    reaper
                        .reap(&targets, ended.creator_uid, Duration::from_millis(grace_ms))
                        .await
                }
                Some(Err((targets, reason))) => {
                    tracing::info!(
                        session = ended.session,
                        reason,
                        "not terminating a process tree"
                    );
                    let failed = targets
                        .iter()
                        .map(|target| ReapFailure {
                            pid: target.pid,
                            reason: reason.clone(),
                        })
                        .collect();
                    Reaped {
                        failed,
                        ..Reaped::default()
                    }
                }
                None => Reaped::default(),
            };
            (ended, Reaped { resumed, ..reaped })
        });
    }

    /// What the reap of the ended session may signal, as far as the engine knows it
    /// cheaply (see [`ReapPlan`]).
    ///
    /// The owner is never signalled, nor, while it lives, the processes still descended
    /// from it: a live owner and its children belong to the tool that registered it (an
    /// agent that ends one conversation and goes on with the next, its servers with it);
    /// only what left it (orphaned, reparented) is the ended session's to clean up. A tree
    /// whose owner still owns another ACTIVE session is that session's too, and left
    /// running; for root's policy, only a session of root's counts: a session a user
    /// registers on the owner of root's job is nested in the job, whose processes are the
    /// job's for life, and a user's word never keeps root's policy off them (nor, the
    /// other way, lets the user signal what a session of root's holds).
    fn plan(&self, ended: &Event, store: &Store, tree: Option<TreeView>) -> ReapPlan {
        let owner = ended.owner.clone();
        // The tree of an owner of another boot cannot be known here, nor signalled.
        if owner.boot_id != self.boot_id {
            return ReapPlan::nothing(owner);
        }
        // The survivors the ending read, when it listed them all (the reaper checks each
        // again); a longer list is completed with the tree as known now (after a restart,
        // the listed ones are all there is).
        let listed = ended.survivors.as_ref();
        let complete_with =
            tree.filter(|_| listed.is_none_or(|s| s.members.len() as u64 != u64::from(s.total)));
        // Fails closed: a tree that may be another session's is not signalled.
        let by_root = ended.creator_uid == 0;
        let refusal = match store.active_sessions_of_owner(&owner) {
            Ok(sessions) => sessions
                .iter()
                .find(|sharing| !by_root || sharing.creator_uid == 0)
                .map(|sharing| {
                format!(
                    "it also belongs to the active session {:?}, which has the same owner: left running",
                    sharing.id
                )
            }),
            Err(e) => Some(format!(
                "cannot tell whether an active session shares it ({e}): left running"
            )),
        };
        ReapPlan {
            // One whose death ended the session is dead even while `/proc` still shows it
            // exiting.
            owner_may_live: !matches!(
                ended.reason,
                Some(EndReason::OwnerExited | EndReason::OwnerReused | EndReason::Reboot)
            ),
            listed: listed.map(|s| s.members.clone()).unwrap_or_default(),
            requested_by: listed.map(|s| s.requested_by.clone()).unwrap_or_default(),
            complete_with,
            refusal,
            owner,
        }
    }

    /// The next reap to finish; pending while none runs. Cancel-safe.
    pub(super) async fn finished(&mut self) -> Result<ReapDone, JoinError> {
        match self.tasks.join_next().await {
            Some(done) => done,
            None => std::future::pending().await,
        }
    }

    /// At shutdown: reaps still waiting out a grace period are cancelled. Their processes
    /// had SIGTERM and are left as they are; the reaps stay due in the store, and the next
    /// start runs them again. Returns those that finished just before their abort.
    pub(super) async fn cancel(&mut self) -> Vec<ReapDone> {
        if self.tasks.is_empty() {
            return Vec::new();
        }
        tracing::warn!(
            count = self.tasks.len(),
            "stopping while terminating sessions' processes: the next start terminates them again"
        );
        self.tasks.abort_all();
        let mut finished = Vec::new();
        while let Some(done) = self.tasks.join_next().await {
            finished.extend(done.ok());
        }
        finished
    }
}
