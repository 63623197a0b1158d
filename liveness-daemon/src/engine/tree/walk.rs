//! Walks of `/proc` and of the kernel's tree map: the descendants of processes, and the
//! kernel entries written for members found.

use std::collections::{HashMap, HashSet};

use liveness_proc::identity::{Liveness, ProcRoot, Stat};

use crate::source::tree_map::{KernelMember, TreeMap};
use crate::store::Member;
use liveness_common::identity::ProcessKey;

/// `starts` and every process descended from them, found through the kernel's lists of
/// children: proportional to the tree, not to the machine's processes. `None` where the
/// kernel has no such lists.
pub(super) fn subtree(proc: &ProcRoot, starts: &[ProcessKey]) -> Option<Vec<Stat>> {
    let mut found = Vec::new();
    let mut queue: Vec<u32> = starts.iter().map(|key| key.pid).collect();
    let mut seen: HashSet<u32> = queue.iter().copied().collect();
    while let Some(pid) = queue.pop() {
        let Ok(stat) = proc.stat(pid) else {
            continue;
        };
        match proc.children(pid) {
            Ok(children) => {
                queue.extend(children.into_iter().filter(|child| seen.insert(*child)));
            }
            Err(liveness_proc::identity::IdentityError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound && proc.stat(pid).is_ok() =>
            {
                return None;
            }
            // Gone meanwhile.
            Err(_) => {}
        }
        found.push(stat);
    }
    Some(found)
}

/// Writes a member's entry to the kernel map, so that its own forks join its tree in the
/// kernel. False when the map had no slot for it (then scans cover its tree).
pub(super) fn write_member(kernel: &mut TreeMap, proc: &ProcRoot, entry: KernelMember) -> bool {
    // Its real uid is the one whose share of the map it takes, as the fork program charges
    // a fork to its forker's. Unreadable: it exited, and needs no entry.
    let Ok(uid) = proc.uid(entry.member.pid) else {
        return true;
    };
    match kernel.insert(entry, uid) {
        // A process that exited before its entry was written (a zombie still shows in
        // /proc) had nothing for its exit to remove: the entry would outlive it, and the
        // map's word is that its members are alive. Checked after the write, so an exit
        // after the check finds the entry and removes it.
        Ok(true) if proc.check_key(entry.member) != Liveness::Alive => {
            kernel.remove(entry);
            true
        }
        Ok(_) => true,
        Err(error) => {
            tracing::debug!(%error, member = %entry.member, "cannot add a member to the kernel map");
            false
        }
    }
}

/// Writes the kernel entries of members that existed before their tree was followed (the
/// kernel saw none of their forks), off the engine: the engine then only
/// [`KnownTrees::adopt`](super::known::KnownTrees::adopt)s them. Each one refused a slot is
/// counted.
pub(super) fn write_members(kernel: Option<&mut TreeMap>, proc: &ProcRoot, members: &[Member]) {
    if let Some(kernel) = kernel {
        for member in members {
            let entry = KernelMember {
                member: member.key,
                root: member.root,
            };
            if !write_member(kernel, proc, entry) {
                kernel.count_refused();
            }
        }
    }
}

/// The live processes that the kernel's lineages name as started by `root` and `found`
/// lacks: those orphaned before its tree was followed, which no walk of `/proc` from the
/// tree reaches.
pub(super) fn orphaned_before(
    kernel: &TreeMap,
    proc: &ProcRoot,
    root: ProcessKey,
    found: &[Member],
) -> Vec<Member> {
    let known: HashSet<ProcessKey> = found.iter().map(|member| member.key).collect();
    let orphans = kernel
        .started_by(root)
        .into_iter()
        .filter(|key| !known.contains(key))
        .filter_map(|key| {
            let stat = proc.stat(key.pid).ok()?;
            (stat.start_ticks == key.start_ticks && !stat.has_exited()).then_some(Member {
                key,
                root,
                comm: stat.comm,
                pidfs_ino: None,
            })
        })
        .collect();
    with_inodes(proc, orphans)
}

/// The processes descended from a process that `tree_of` places in a tree, each with that
/// tree's root. A process whose parent is unknown to `processes` (it exited) is found only
/// through a known ancestor, which is why members are remembered by fingerprint.
pub(crate) fn descendants(
    processes: &[Stat],
    tree_of: impl Fn(ProcessKey) -> Option<ProcessKey>,
) -> Vec<Member> {
    let mut children: HashMap<u32, Vec<&Stat>> = HashMap::new();
    for stat in processes {
        children.entry(stat.ppid).or_default().push(stat);
    }
    let mut found = Vec::new();
    let mut queue: Vec<(&Stat, ProcessKey)> = processes
        .iter()
        .filter_map(|stat| {
            let key = ProcessKey {
                pid: stat.pid,
                start_ticks: stat.start_ticks,
            };
            Some((stat, tree_of(key)?))
        })
        .collect();
    let mut seen: HashSet<u32> = queue.iter().map(|(stat, _)| stat.pid).collect();
    while let Some((parent, root)) = queue.pop() {
        for &child in children
            .get(&parent.pid)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            // A child cannot start before its parent: an older process with a parent of
            // this pid had an earlier parent that the pid was reused from.
            if child.start_ticks < parent.start_ticks || !seen.insert(child.pid) {
                continue;
            }
            found.push(Member {
                key: ProcessKey {
                    pid: child.pid,
                    start_ticks: child.start_ticks,
                },
                root,
                comm: child.comm.clone(),
                pidfs_ino: None,
            });
            queue.push((child, root));
        }
    }
    found
}

/// Members found in `/proc`, each with its pidfs inode, read now: one that exited since is
/// left out.
pub(super) fn with_inodes(proc: &ProcRoot, found: Vec<Member>) -> Vec<Member> {
    if !proc.has_pidfs() {
        return found;
    }
    found
        .into_iter()
        .filter_map(|member| {
            let pidfs_ino = Some(proc.pidfs_ino_of_key(member.key)?);
            Some(Member {
                pidfs_ino,
                ..member
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, ppid: u32, start_ticks: u64) -> Stat {
        Stat {
            pid,
            comm: format!("p{pid}"),
            state: 'S',
            ppid,
            flags: 0,
            utime: 0,
            stime: 0,
            num_threads: 1,
            start_ticks,
        }
    }

    fn key(pid: u32, start_ticks: u64) -> ProcessKey {
        ProcessKey { pid, start_ticks }
    }

    #[test]
    fn descendants_of_roots_and_members_are_found_with_their_root() {
        let processes = [
            stat(1, 0, 1),
            stat(10, 1, 100), // root
            stat(11, 10, 110),
            stat(12, 11, 120),
            stat(20, 1, 105), // an orphan member, reparented to init
            stat(21, 20, 130),
            stat(30, 1, 90), // unrelated
            stat(31, 30, 95),
        ];
        let root = key(10, 100);
        let mut found = descendants(&processes, |k| {
            (k == root || k == key(20, 105)).then_some(root)
        });
        found.sort_by_key(|m| m.key);
        let keys: Vec<ProcessKey> = found.iter().map(|m| m.key).collect();
        assert_eq!(keys, [key(11, 110), key(12, 120), key(21, 130)]);
        assert!(found.iter().all(|m| m.root == root), "{found:?}");
    }

    #[test]
    fn a_child_older_than_its_parent_belongs_to_a_reused_pid() {
        // pid 10 was reused: 11's parent was an earlier process 10.
        let processes = [stat(10, 1, 500), stat(11, 10, 400), stat(12, 10, 600)];
        let found = descendants(&processes, |k| (k == key(10, 500)).then_some(k));
        let keys: Vec<ProcessKey> = found.iter().map(|m| m.key).collect();
        assert_eq!(keys, [key(12, 600)]);
    }
}
