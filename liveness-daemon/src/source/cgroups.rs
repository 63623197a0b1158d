//! The path of the memory cgroup an OOM kill answered, from the id the eBPF program read
//! (its kernfs node's id, which is the inode number of its directory): the directory with
//! that inode in the hierarchy that holds the memory controller, cgroup v1's `memory` or the
//! unified v2 one.

use std::collections::{BTreeMap, VecDeque};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use liveness_proc::mountinfo::{Mount, mounts};

/// Directories looked at, at most, before giving up: the walk runs on the death path.
const MAX_WALK: usize = 20_000;

/// The sessions' own cgroups by kernfs id, from when they are made (or found at start) until
/// they are reclaimed: systemd removes an emptied scope at once, often before an OOM kill
/// inside it is read from the ring, and a walk would then find nothing.
///
/// One per daemon, made with its cgroup [`Hierarchy`](crate::cgroup::Hierarchy): the engine
/// names a session's cgroup when it has one and forgets it once reclaimed, a scope's start
/// names the scope systemd made, and the eBPF ring's reader looks ids up. Clones share it.
#[derive(Debug, Clone, Default)]
pub struct SessionCgroupNames(Arc<Mutex<BTreeMap<u64, PathBuf>>>);

impl SessionCgroupNames {
    fn names(&self) -> MutexGuard<'_, BTreeMap<u64, PathBuf>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Names the session cgroup at `path` (its directory, which exists) for
    /// [`SessionCgroupNames::memory_cgroup_path`].
    pub fn name(&self, path: &Path) {
        if let Ok(meta) = std::fs::metadata(path) {
            self.names().insert(meta.ino(), path.to_path_buf());
        }
    }

    /// The session cgroup at `path` is reclaimed: its id names nothing any more.
    pub fn forget(&self, path: &Path) {
        self.names().retain(|_, named| named != path);
    }

    /// The path of the memory cgroup with kernfs id `id`, as `/proc/<pid>/cgroup` would
    /// show it: a session's own as named, another found by a walk. `None` when it is gone
    /// (removed after the kill) or not found within [`MAX_WALK`].
    pub fn memory_cgroup_path(&self, id: u64) -> Option<String> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let (mount_point, root) = memory_hierarchy(&mountinfo)?;
        let named = (self.names().get(&id))
            .and_then(|path| Some(path.strip_prefix(&mount_point).ok()?.to_path_buf()));
        let relative = named.or_else(|| find_inode(&mount_point, id))?;
        Some(join(&root, &relative))
    }
}

/// The same names, as a hierarchy detected twice has.
impl PartialEq for SessionCgroupNames {
    fn eq(&self, other: &Self) -> bool {
        if Arc::ptr_eq(&self.0, &other.0) {
            return true;
        }
        let mine = self.names().clone();
        mine == *other.names()
    }
}

impl Eq for SessionCgroupNames {}

/// The mount point and the mounted root of the hierarchy with the memory controller: the v1
/// `memory` hierarchy when one is mounted (a hybrid machine), else the unified one.
fn memory_hierarchy(mountinfo: &str) -> Option<(PathBuf, String)> {
    let mounts = mounts(mountinfo).ok()?;
    let v1 = |m: &&Mount| m.fstype == "cgroup" && m.super_options.iter().any(|o| o == "memory");
    (mounts.iter().find(v1))
        .or_else(|| mounts.iter().find(|m| m.fstype == "cgroup2"))
        .map(|m| (m.mount_point.clone(), m.root.clone()))
}

/// The directory below `top` whose inode is `inode`, relative to `top`, breadth first.
fn find_inode(top: &Path, inode: u64) -> Option<PathBuf> {
    let mut queue = VecDeque::from([PathBuf::new()]);
    let mut seen = 0;
    while let Some(relative) = queue.pop_front() {
        let dir = top.join(&relative);
        if std::fs::metadata(&dir).ok()?.ino() == inode {
            return Some(relative);
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > MAX_WALK {
                return None;
            }
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                queue.push_back(relative.join(entry.file_name()));
            }
        }
    }
    None
}

fn join(root: &str, relative: &Path) -> String {
    let relative = relative.to_string_lossy();
    match (root.trim_end_matches('/'), relative.as_ref()) {
        ("", "") => "/".to_owned(),
        (root, "") => root.to_owned(),
        (root, relative) => format!("{root}/{relative}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v1_memory_hierarchy_wins_over_the_unified_one() {
        let hybrid = "\
35 25 0:30 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
36 25 0:31 / /sys/fs/cgroup/memory rw,nosuid shared:9 - cgroup cgroup rw,memory
37 25 0:32 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
";
        assert_eq!(
            memory_hierarchy(hybrid),
            Some(("/sys/fs/cgroup/memory".into(), "/".into()))
        );
        let unified = "30 25 0:26 /user.slice /mnt/my\\040cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            memory_hierarchy(unified),
            Some(("/mnt/my cg".into(), "/user.slice".into()))
        );
        assert_eq!(
            memory_hierarchy("1 2 0:3 / / rw - ext4 /dev/sda rw\n"),
            None
        );
    }

    /// A session cgroup removed before its OOM kill is read (systemd collects an emptied
    /// scope at once) is still named by its id, until it is forgotten.
    #[test]
    fn a_named_session_cgroup_is_found_after_its_removal() {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let (mount_point, root) = memory_hierarchy(&mountinfo).expect("a memory hierarchy");
        let name = format!("liveness-test-{}", std::process::id());
        let path = mount_point.join(&name);
        if let Err(e) = std::fs::create_dir(&path) {
            // Not root, or a read-only hierarchy: nothing to name.
            eprintln!("skipped: cannot make {}: {e}", path.display());
            return;
        }
        let id = std::fs::metadata(&path).unwrap().ino();
        let names = SessionCgroupNames::default();
        names.name(&path);
        std::fs::remove_dir(&path).unwrap();
        let expected = join(&root, Path::new(&name));
        assert_eq!(names.clone().memory_cgroup_path(id), Some(expected));
        names.forget(&path);
        assert_eq!(names.memory_cgroup_path(id), None);
    }

    #[test]
    fn a_directory_is_found_by_its_inode() {
        let top = tempfile::tempdir().unwrap();
        let leaf = top.path().join("a/b");
        std::fs::create_dir_all(&leaf).unwrap();
        let inode = std::fs::metadata(&leaf).unwrap().ino();
        let found = find_inode(top.path(), inode).unwrap();
        assert_eq!(join("/", &found), "/a/b");
        assert_eq!(join("/user.slice", &found), "/user.slice/a/b");
        assert_eq!(
            join(
                "/",
                &find_inode(top.path(), std::fs::metadata(top.path()).unwrap().ino()).unwrap()
            ),
            "/"
        );
        assert_eq!(find_inode(top.path(), u64::MAX), None);
    }
}
