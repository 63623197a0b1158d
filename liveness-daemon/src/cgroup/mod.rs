//! Session cgroups (docs/cgroups.md): the cgroup2 hierarchy the daemon finds at start,
//! its own subtree there, and each session's cgroup under it, made at registration with
//! the session's limits.

pub mod mountinfo;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use liveness_common::status::CgroupStatus;

use mountinfo::cgroup2_mounts;

/// The subtree's name, directly under the cgroup2 mount's root: a sibling of systemd's
/// slices where there are some, and never a cgroup with processes of its own, so that its
/// controllers can be enabled (cgroup v2's "no internal processes" rule).
pub const SUBTREE: &str = "liveness.slice";

/// Controllers without which a session's limits cannot be set.
const REQUIRED: [&str; 2] = ["memory", "pids"];
/// Enabled when present: `cpu.stat` has usage without it, `cpu.weight` needs it.
const OPTIONAL: [&str; 1] = ["cpu"];

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("cannot write {value:?} to {path}: {source}")]
    Write {
        path: PathBuf,
        value: String,
        source: io::Error,
    },
    #[error(transparent)]
    Mountinfo(#[from] mountinfo::MountinfoError),
    #[error("cannot create the cgroup {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot remove the cgroup {path}: {source}")]
    Remove { path: PathBuf, source: io::Error },
}

/// What the host offers, found once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    Usable(Hierarchy),
    Unusable {
        /// The cgroup2 mount looked at, if there is one.
        mount: Option<PathBuf>,
        controllers: Vec<String>,
        reason: String,
    },
}

/// A cgroup2 hierarchy with the controllers sessions need, and the daemon's subtree in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub mount: PathBuf,
    pub subtree: PathBuf,
    /// The controllers enabled for session cgroups.
    pub controllers: Vec<String>,
    /// `cgroup.kill` (5.14+): a whole cgroup killed at once, fork loops included.
    pub kill: bool,
    /// `memory.peak` (5.19+).
    pub peak: bool,
}

impl Support {
    /// Finds the cgroup2 hierarchy named by `mountinfo` (the daemon's
    /// `/proc/self/mountinfo`) and makes the subtree in it.
    pub fn detect(mountinfo: &Path) -> Support {
        let unusable =
            |mount: Option<&Path>, controllers: Vec<String>, reason: String| Support::Unusable {
                mount: mount.map(Path::to_path_buf),
                controllers,
                reason,
            };
        let text = match read(mountinfo) {
            Ok(text) => text,
            Err(e) => return unusable(None, vec![], e.to_string()),
        };
        let mounts = match cgroup2_mounts(&text) {
            Ok(mounts) => mounts,
            Err(e) => return unusable(None, vec![], e.to_string()),
        };
        // The whole hierarchy, writable, rather than a bind mount of a part of it.
        let Some(mount) = mounts
            .iter()
            .find(|m| m.root == "/" && !m.read_only)
            .or_else(|| mounts.iter().find(|m| !m.read_only))
        else {
            let reason = match mounts.first() {
                Some(m) => format!(
                    "the cgroup2 file system at {} is mounted read-only",
                    m.mount_point.display()
                ),
                None => format!(
                    "no cgroup2 file system is mounted ({})",
                    mountinfo.display()
                ),
            };
            return unusable(
                mounts.first().map(|m| m.mount_point.as_path()),
                vec![],
                reason,
            );
        };
        let mount = mount.mount_point.as_path();
        let available = match read(&mount.join("cgroup.controllers")) {
            Ok(text) => text
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>(),
            Err(e) => return unusable(Some(mount), vec![], e.to_string()),
        };
        let missing: Vec<&str> = REQUIRED
            .into_iter()
            .filter(|c| !available.iter().any(|a| a == c))
            .collect();
        if !missing.is_empty() {
            let reason = format!(
                "the cgroup2 hierarchy at {} has no {} controller (it offers {}): a hybrid host binds them to cgroup v1",
                mount.display(),
                missing.join(" or "),
                if available.is_empty() {
                    "none".to_owned()
                } else {
                    available.join(" ")
                }
            );
            return unusable(Some(mount), available, reason);
        }
        match Hierarchy::make(mount, &available) {
            Ok(hierarchy) => Support::Usable(hierarchy),
            Err(e) => unusable(Some(mount), available, e.to_string()),
        }
    }

    pub fn hierarchy(&self) -> Option<&Hierarchy> {
        match self {
            Support::Usable(hierarchy) => Some(hierarchy),
            Support::Unusable { .. } => None,
        }
    }

    /// For `status` and `doctor`.
    pub fn status(&self) -> CgroupStatus {
        match self {
            Support::Usable(h) => CgroupStatus {
                usable: true,
                mount: Some(h.mount.display().to_string()),
                subtree: Some(h.subtree.display().to_string()),
                controllers: h.controllers.clone(),
                kill: h.kill,
                peak: h.peak,
                reason: None,
            },
            Support::Unusable {
                mount,
                controllers,
                reason,
            } => CgroupStatus {
                usable: false,
                mount: mount.as_ref().map(|m| m.display().to_string()),
                subtree: None,
                controllers: controllers.clone(),
                kill: false,
                peak: false,
                reason: Some(reason.clone()),
            },
        }
    }

    /// The warning of a registration that asked for a cgroup on a host without one.
    pub fn unusable_warning(&self) -> Option<String> {
        match self {
            Support::Usable(_) => None,
            Support::Unusable { reason, .. } => Some(format!(
                "the session has no cgroup (no limits, no cgroup accounting): {reason}"
            )),
        }
    }
}

impl Hierarchy {
    /// Makes the subtree under `mount` with the controllers sessions use enabled for its
    /// children.
    fn make(mount: &Path, available: &[String]) -> Result<Hierarchy, CgroupError> {
        let controllers: Vec<String> = REQUIRED
            .into_iter()
            .chain(OPTIONAL)
            .filter(|c| available.iter().any(|a| a == c))
            .map(str::to_owned)
            .collect();
        let enable = controllers
            .iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(" ");
        write(&mount.join("cgroup.subtree_control"), &enable)?;
        let subtree = mount.join(SUBTREE);
        match fs::create_dir(&subtree) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(CgroupError::Create {
                    path: subtree,
                    source,
                });
            }
        }
        write(&subtree.join("cgroup.subtree_control"), &enable)?;
        Ok(Hierarchy {
            mount: mount.to_path_buf(),
            kill: subtree.join("cgroup.kill").exists(),
            peak: subtree.join("memory.peak").exists(),
            subtree,
            controllers,
        })
    }

    /// Makes a session's cgroup, named `name` (chosen by the daemon, never a user's
    /// string), with its limits.
    pub fn create(&self, name: &str, limits: &Limits) -> Result<PathBuf, CgroupError> {
        let path = self.subtree.join(name);
        fs::create_dir(&path).map_err(|source| CgroupError::Create {
            path: path.clone(),
            source,
        })?;
        let written = (limits.memory_max.map(|m| ("memory.max", m)).into_iter())
            .chain(limits.tasks_max.map(|t| ("pids.max", t)))
            .try_for_each(|(file, value)| write(&path.join(file), &value.to_string()));
        if let Err(e) = written {
            let _ = remove(&path);
            return Err(e);
        }
        Ok(path)
    }
}

/// A session's limits, as registered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub memory_max: Option<u64>,
    pub tasks_max: Option<u64>,
}

/// Moves `pid` into the cgroup at `path`. A process that has exited meanwhile is not an
/// error (ESRCH).
pub fn adopt(path: &Path, pid: u32) -> Result<(), CgroupError> {
    match write(&path.join("cgroup.procs"), &pid.to_string()) {
        Err(CgroupError::Write { source, .. })
            if source.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// Removes an empty session cgroup; one already gone is not an error.
pub fn remove(path: &Path) -> Result<(), CgroupError> {
    match fs::remove_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other.map_err(|source| CgroupError::Remove {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn read(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests;
