//! Ending an action's whole process tree when it runs past its timeout.
//!
//! An action is the leader of a process group and session of its own, and the subreaper
//! of its tree: while it runs, a descendant whose parent exits is reparented to it rather
//! than to init, so the tree stays whole under it. At the timeout:
//!
//! 1. the tree is walked from the action (`/proc/<pid>/task/*/children`), each member held
//!    by a pidfd verified against its parent and start time;
//! 2. the process group and every member get SIGTERM, and the grace passes (or all exit);
//! 3. the group and every member still running get SIGSTOP (a stopped process forks no
//!    more), and the walk is repeated from each of them until it finds no one new;
//! 4. the group and every member get SIGKILL.
//!
//! Every signal goes through a pidfd: a member's own, verified when opened, or for the
//! group the leader's (`PIDFD_SIGNAL_PROCESS_GROUP`, Linux 6.9+), which reaches the group
//! that pidfd's process led even after it died and its number went to another process
//! (the group number of a dead leader is never signalled by number). A signal to a process
//! group is atomic with respect to `fork`: a child forked meanwhile is in the group and
//! gets it; before Linux 6.9 the repeated walk of step 3 is all there is. What can
//! escape: a process that left the process group
//! (`setsid`, `setpgid`) *and* left the tree, which after the action itself has exited means
//! one whose parent died and which was reparented to init (or the nearest subreaper above
//! the daemon) before the walk found it; and any process that is not the action's
//! descendant (a service it asked to start, say). Tracking the tree in the kernel, as the
//! daemon's membership does for sessions, would close the first.

use std::collections::HashMap;
use std::time::Duration;

use rustix::process::Signal;
use tokio::time::Instant;

use liveness_common::identity::ProcessKey;
use liveness_proc::identity::ProcRoot;
use liveness_proc::pidref::PidRef;

use crate::reap::{KILL_WAIT, signal, wait_for_exits};

/// Most processes of one action's tree that are tracked: a fork bomb is stopped by the
/// group signals, not walked to the end.
const MAX_MEMBERS: usize = 4096;

/// Ends the tree of the action `group` (which leads its process group too): SIGTERM,
/// `grace`, then SIGKILL for what is left. Returns how many processes had to be SIGKILLed.
pub async fn end_tree(proc: &ProcRoot, group: &PidRef, grace: Duration) -> u32 {
    let mut members: Vec<PidRef> = Vec::new();
    if let Ok(root) = group.try_clone() {
        members.push(root);
    }
    discover(proc, &mut members);
    signal_group(group, Signal::TERM);
    let members = signal_all(members, Signal::TERM);
    let (_, mut running) = wait_for_exits(members, Instant::now() + grace).await;
    signal_group(group, Signal::STOP);
    running = signal_all(running, Signal::STOP);
    loop {
        let known = running.len();
        discover(proc, &mut running);
        if running.len() == known {
            break;
        }
        let found = running.split_off(known);
        running.extend(signal_all(found, Signal::STOP));
    }
    signal_group(group, Signal::KILL);
    let killing = signal_all(running, Signal::KILL);
    let killed = killing.len() as u32;
    let (_, unkillable) = wait_for_exits(killing, Instant::now() + KILL_WAIT).await;
    for process in unkillable {
        tracing::warn!(
            pid = process.pid(),
            "a process of a timed-out action is still running after SIGKILL (in uninterruptible sleep?)"
        );
    }
    killed
}

/// Ends what is left of an earlier run of an action whose first process was `root` (a run
/// a stop or a crash of the daemon cut short), so that it never runs beside its rerun.
/// Returns whether `root` was still running.
pub async fn end_leftover(proc: &ProcRoot, root: ProcessKey, grace: Duration) -> bool {
    let Ok(process) = PidRef::open(proc, root, None) else {
        return false;
    };
    tracing::warn!(
        pid = root.pid,
        "ending what is left of an end action's cut-short run before running it again"
    );
    end_tree(proc, &process, grace).await;
    true
}

/// Sends `signal` to the action's process group, through the pidfd of its leader: never
/// to a group that took the number since (a kernel before 6.9 has no such signal; the
/// members' own pidfds still get it).
fn signal_group(leader: &PidRef, which: Signal) {
    if let Err(e) = leader.signal_group(which) {
        tracing::warn!(error = %e, "cannot signal the process group of a timed-out action");
    }
}

/// Sends `signal` to each member; those that had exited drop out.
fn signal_all(members: Vec<PidRef>, which: Signal) -> Vec<PidRef> {
    members
        .into_iter()
        .filter_map(|process| {
            let pid = process.pid();
            signal(process, which).unwrap_or_else(|e| {
                tracing::warn!(pid, error = %e, "cannot signal a process of a timed-out action");
                None
            })
        })
        .collect()
}

/// Adds every descendant of the running members that is not among them yet.
fn discover(proc: &ProcRoot, members: &mut Vec<PidRef>) {
    // Read once, and only on a kernel without `/proc/<pid>/task/*/children`.
    let mut scanned: Option<HashMap<u32, Vec<u32>>> = None;
    let mut frontier: Vec<u32> = members
        .iter()
        .filter(|process| !process.has_exited())
        .map(PidRef::pid)
        .collect();
    while let Some(parent) = frontier.pop() {
        let children = proc.children(parent).unwrap_or_else(|_| {
            scanned
                .get_or_insert_with(|| by_parent(proc))
                .get(&parent)
                .cloned()
                .unwrap_or_default()
        });
        for child in children {
            if members.len() >= MAX_MEMBERS {
                tracing::warn!(
                    limit = MAX_MEMBERS,
                    "a timed-out action has too many processes to track; the rest get only the process group's signals"
                );
                return;
            }
            if members.iter().any(|process| process.pid() == child) {
                continue;
            }
            if let Some(process) = running_child(proc, parent, child) {
                members.push(process);
                frontier.push(child);
            }
        }
    }
}

/// Every process's children, from one scan of `/proc`.
fn by_parent(proc: &ProcRoot) -> HashMap<u32, Vec<u32>> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for stat in proc.processes().unwrap_or_default() {
        children.entry(stat.ppid).or_default().push(stat.pid);
    }
    children
}

/// `child` while it is still `parent`'s running child: held by a pidfd verified against
/// the start time read with its parent, so a pid that passed to another process in
/// between is never held.
fn running_child(proc: &ProcRoot, parent: u32, child: u32) -> Option<PidRef> {
    let before = proc.stat(child).ok()?;
    if before.ppid != parent || before.has_exited() {
        return None;
    }
    let key = ProcessKey {
        pid: child,
        start_ticks: before.start_ticks,
    };
    PidRef::open(proc, key, None).ok()
}
