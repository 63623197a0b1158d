//! `SessionCgroups`: the cgroups of ACTIVE sessions, in memory, each handed to the
//! reclaimer when its session's `session.ended` is published (a lookup only when some
//! session has a cgroup: the ends of the others cost nothing more), and at start what a
//! crash left: the cgroups of sessions that ended meanwhile or that the store does not
//! know. The engine stores what an emptied cgroup counted with its session, then removes
//! it (docs/cgroups.md).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use liveness_common::identity::Identity;
use liveness_common::session::{DEFAULT_GRACE_MS, Event, EventKind, Session};

use liveness_common::status::CgroupTermination;

use crate::cgroup::Support;
use crate::cgroup::reclaim::{Job, Reclaimer, Report};
use crate::cgroup::systemd::{Systemd, unit_of};
use crate::source::cgroups::SessionCgroupNames;
use crate::store::Store;

#[derive(Debug, Default)]
pub(super) struct SessionCgroups {
    /// By the session's creator uid and id.
    active: HashMap<(u32, String), PathBuf>,
    /// The ended sessions whose cgroups are being reclaimed, by creator uid and id.
    ending: HashMap<(u32, String), PathBuf>,
    reclaimer: Reclaimer,
    /// How this host kills a cgroup's processes at once, learnt at start (`None`: no
    /// usable cgroups).
    termination: Option<CgroupTermination>,
    /// systemd, where it makes the cgroups.
    systemd: Option<Systemd>,
    /// The ended sessions whose reaps a start runs again, until their cgroups are found
    /// by its reconcile and killed at their grace's end.
    resumed: Vec<Event>,
    /// The cgroups named for OOM causes: from a session's first cgroup until its
    /// reclaim's report.
    names: SessionCgroupNames,
}

impl SessionCgroups {
    /// No session cgroups yet; those made are named in `names`.
    pub(super) fn new(names: SessionCgroupNames) -> SessionCgroups {
        SessionCgroups {
            names,
            ..SessionCgroups::default()
        }
    }

    /// A session that has a cgroup, registered or found ACTIVE at start; a scope is
    /// followed from now on, since systemd removes it once empty.
    pub(super) fn active(&mut self, uid: u32, id: String, path: PathBuf) {
        // Made already, or found at start; a scope is named once systemd made it.
        self.names.name(&path);
        if unit_of(&path).is_some() {
            self.reclaimer.follow(path.clone());
        }
        self.active.insert((uid, id), path);
    }

    /// User `uid`'s session `id` no longer has the cgroup `path` (its scope did not
    /// start): nothing is reclaimed for it at its end. A scope followed meanwhile is given
    /// up by the reclaimer when it does not appear.
    pub(super) fn forget(&mut self, uid: u32, id: &str, path: &Path) {
        let key = (uid, id.to_owned());
        if self.active.get(&key).is_some_and(|p| p == path) {
            self.active.remove(&key);
        }
    }

    /// Whether `path` is handed to the reclaimer, or waits for it.
    #[cfg(test)]
    pub(super) fn is_reclaiming(&self, path: &Path) -> bool {
        self.reclaimer.is_queued(path) || self.ending.values().any(|p| p == path)
    }

    /// Hands the cgroups of the sessions these events ended to the reclaimer, and follows
    /// renamed pending sessions.
    pub(super) fn set_off(&mut self, events: &[Event]) {
        if self.active.is_empty() {
            return;
        }
        for event in events {
            let key = (event.creator_uid, event.session.clone());
            match event.kind {
                EventKind::Ended => {
                    if let Some(path) = self.active.remove(&key) {
                        self.ending.insert(key.clone(), path.clone());
                        // The owner too: alive at an end by request, it is of the tree,
                        // and may have escaped the cgroup as a member may.
                        let survivors = (event.survivors.iter())
                            .flat_map(|s| s.members.iter().chain(&s.requested_by))
                            .chain([&event.owner])
                            .map(Identity::key)
                            .collect();
                        self.reclaimer.queue(Job {
                            session: Some(key),
                            path,
                            survivors,
                        });
                    }
                }
                EventKind::Renamed => {
                    let Some(previous) = &event.previous_session else {
                        continue;
                    };
                    if let Some(path) = self.active.remove(&(event.creator_uid, previous.clone())) {
                        self.active.insert(key, path);
                    }
                }
                _ => {}
            }
        }
    }

    /// An ended session's processes are terminated (its policy, or `end` with
    /// `terminate`): what its cgroup still holds once its grace is over is killed there at
    /// once, the owner included, unless the process that asked for the end is in the
    /// session's tree (the reaper alone then, which spares it).
    pub(super) fn terminate(&mut self, ended: &Event, store: &Store) {
        let key = (ended.creator_uid, ended.session.clone());
        let (Some(path), Some(method)) = (self.ending.get(&key), self.termination) else {
            return;
        };
        if ended
            .survivors
            .as_ref()
            .is_some_and(|s| !s.requested_by.is_empty())
        {
            return;
        }
        let grace_ms = match store.get(ended.creator_uid, &ended.session) {
            Ok(Some(session)) => session.grace_ms,
            _ => DEFAULT_GRACE_MS,
        };
        let systemd = self.systemd.clone();
        let grace = Duration::from_millis(grace_ms);
        (self.reclaimer).kill_after(path.clone(), grace, method, systemd);
    }

    /// At start: the ended sessions whose reaps run again (see [`SessionCgroups::reconcile`]).
    pub(super) fn resumed(&mut self, ended: Vec<Event>) {
        self.resumed = ended;
    }

    /// At start, once the sessions ended while the daemon was away have been handed over:
    /// every other cgroup under the subtree that no ACTIVE session has is reclaimed, with
    /// its counters stored for an ended session that lacks them. Where systemd makes
    /// them, such a scope (each scope of `liveness.slice` has its cgroup there) is also
    /// killed: no unit outlives its session. The cgroup of a session whose reap runs
    /// again is killed at its grace's end, as at the end itself.
    /// The host's way to kill a cgroup's processes is learnt here.
    pub(super) fn reconcile(&mut self, support: &Support, store: &Store) {
        let resumed = std::mem::take(&mut self.resumed);
        let Some(hierarchy) = support.hierarchy() else {
            return;
        };
        self.termination = Some(hierarchy.termination());
        self.systemd = hierarchy.systemd().cloned();
        let mut children = match hierarchy.children() {
            Ok(children) => children,
            Err(e) => {
                tracing::error!(error = %e, "cannot list the session cgroups; none reconciled");
                return;
            }
        };
        // The scopes systemd listed at start, whose cgroups are under the subtree too
        // (`Slice=liveness.slice`): a scope is found by asking systemd, not only by its
        // directory.
        let scopes = self.systemd.iter().flat_map(|systemd| &systemd.scopes);
        children.extend(scopes.map(|unit| hierarchy.subtree.join(unit)));
        children.sort();
        children.dedup();
        let active: HashSet<&PathBuf> = self.active.values().collect();
        let left: Vec<PathBuf> = children
            .into_iter()
            .filter(|path| !active.contains(path) && !self.reclaimer.is_queued(path))
            .collect();
        if left.is_empty() {
            return;
        }
        let ended = match store.ended_cgroups() {
            Ok(ended) => ended,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the ended sessions' cgroups; none reconciled");
                return;
            }
        };
        let ended: HashMap<PathBuf, (u32, String, bool)> = ended
            .into_iter()
            .map(|(uid, id, cgroup)| {
                (
                    PathBuf::from(cgroup.path),
                    (uid, id, cgroup.usage.is_some()),
                )
            })
            .collect();
        tracing::info!(
            cgroups = left.len(),
            "reclaiming session cgroups left behind"
        );
        for path in left {
            let session = match ended.get(&path) {
                Some((uid, id, false)) => Some((*uid, id.clone())),
                // Counted already, or the store does not know it: only removed once empty.
                _ => None,
            };
            let scope = unit_of(&path).is_some();
            if let Some(key) = &session {
                self.ending.insert(key.clone(), path.clone());
            }
            self.reclaimer.queue(Job {
                session,
                path: path.clone(),
                survivors: Vec::new(),
            });
            if let (true, Some(systemd)) = (scope, &self.systemd) {
                let method = CgroupTermination::Unit;
                (self.reclaimer).kill_after(path, Duration::ZERO, method, Some(systemd.clone()));
            }
        }
        for ended in &resumed {
            self.terminate(ended, store);
        }
    }

    /// The ACTIVE sessions' cgroups, at start.
    pub(super) fn resume<'a>(&mut self, sessions: impl Iterator<Item = &'a Session>) {
        for session in sessions {
            if let Some(cgroup) = &session.cgroup {
                self.active(
                    session.creator_uid,
                    session.id.clone(),
                    PathBuf::from(&cgroup.path),
                );
            }
        }
    }

    /// Has the reclaimer say when the cgroup at `path` holds no process; false if it
    /// cannot be asked.
    pub(super) fn drain(&mut self, path: PathBuf) -> bool {
        self.reclaimer.drain(path)
    }

    /// The reclaimer's next report: a cgroup found empty, its counters read, or drained.
    pub(super) async fn next(&mut self) -> Report {
        let report = self.reclaimer.next().await;
        if let Report::Emptied(emptied) = &report {
            // The ring has its processes' exits by now: each was written before it emptied.
            self.names.forget(&emptied.job.path);
            if let Some(key) = &emptied.job.session {
                self.ending.remove(key);
            }
        }
        report
    }
}
