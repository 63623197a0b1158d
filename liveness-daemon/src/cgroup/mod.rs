//! Session cgroups (docs/cgroups.md): the cgroup2 hierarchy the daemon finds at start,
//! its own subtree there (made when the first session asks for a cgroup), each session's
//! cgroup under it, made at registration with the session's limits, its counters, its
//! termination, and its removal once empty (`reclaim`).

pub mod moves;
pub mod reclaim;
pub mod systemd;

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::session::{
    CgroupEscape, CgroupUsage, IoUsage, MAX_UNLISTED_NAMED, MemoryEvents, Unlisted,
};
use liveness_common::status::{CgroupManager, CgroupStatus, CgroupTermination};
use liveness_proc::identity::{Liveness, ProcRoot};
use liveness_proc::mountinfo::{Mount, MountinfoError, cgroup2_mounts};
use liveness_proc::pidref::PidRef;

use systemd::Systemd;

use crate::source::cgroups::SessionCgroupNames;

/// The subtree's name, directly under the cgroup2 mount's root: a sibling of systemd's
/// slices where there are some, and never a cgroup with processes of its own, so that its
/// controllers can be enabled (cgroup v2's "no internal processes" rule).
pub const SUBTREE: &str = "liveness.slice";

/// Controllers without which a session's limits cannot be set.
const REQUIRED: [&str; 2] = ["memory", "pids"];
/// Enabled when present: `cpu.stat` has usage without it, `cpu.weight` needs it; `io.stat`
/// needs io.
const OPTIONAL: [&str; 2] = ["cpu", "io"];

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
    Mountinfo(#[from] MountinfoError),
    #[error("cannot create the cgroup {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot remove the cgroup {path}: {source}")]
    Remove { path: PathBuf, source: io::Error },
    #[error(
        "cannot kill the processes of {path} at once: the kernel has neither cgroup.kill (5.14+) nor cgroup.freeze (5.2+)"
    )]
    Unsupported { path: PathBuf },
    #[error("systemd's scope {unit}: {source}")]
    Systemd {
        unit: String,
        source: systemd::SystemdError,
    },
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
    /// `cgroup.freeze` (5.2+): without `cgroup.kill`, a cgroup is frozen while each of
    /// its processes is killed.
    pub freeze: bool,
    /// Set once the subtree is made and its controllers enabled: by the first session
    /// that asks for a cgroup, so that a host where none does is never written.
    prepared: OnceLock<()>,
    pub manager: Manager,
    /// The sessions' cgroups by kernfs id, for the causes of OOM kills inside them.
    pub names: SessionCgroupNames,
}

/// Who makes session cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Manager {
    /// systemd, asked for a transient scope per session.
    Systemd(Systemd),
    /// The daemon, in the file system; `reason`: why not systemd.
    Cgroupfs { reason: String },
}

impl Support {
    /// Finds the cgroup2 hierarchy named by `mountinfo` (the daemon's
    /// `/proc/self/mountinfo`); nothing is written to it (see [`Hierarchy::prepare`]).
    /// Where `systemd` is the init, it makes the cgroups, and a mount read-only to the
    /// daemon (its unit's `ProtectControlGroups=`) is enough: the daemon only reads it.
    pub fn detect(mountinfo: &Path, systemd: Result<Systemd, String>) -> Support {
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
        // The whole hierarchy, writable unless systemd writes it, rather than a bind mount
        // of a part of it.
        let usable = |m: &&Mount| !m.read_only || systemd.is_ok();
        let Some(mount) = mounts
            .iter()
            .find(|m| m.root == "/" && usable(m))
            .or_else(|| mounts.iter().find(usable))
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
        let subtree = mount.join(SUBTREE);
        if subtree.exists() && !subtree.is_dir() {
            let reason = format!("{} is not a directory", subtree.display());
            return unusable(Some(mount), available, reason);
        }
        let Features { kill, peak, freeze } = features(mount, &subtree);
        Support::Usable(Hierarchy {
            mount: mount.to_path_buf(),
            subtree,
            controllers: REQUIRED
                .into_iter()
                .chain(OPTIONAL)
                .filter(|c| available.iter().any(|a| a == c))
                .map(str::to_owned)
                .collect(),
            kill,
            peak,
            freeze,
            prepared: OnceLock::new(),
            manager: match systemd {
                Ok(systemd) => Manager::Systemd(systemd),
                Err(reason) => Manager::Cgroupfs { reason },
            },
            names: SessionCgroupNames::default(),
        })
    }

    pub fn hierarchy(&self) -> Option<&Hierarchy> {
        match self {
            Support::Usable(hierarchy) => Some(hierarchy),
            Support::Unusable { .. } => None,
        }
    }

    /// The hierarchy's names of session cgroups; without one, none that will ever be
    /// named.
    pub fn names(&self) -> SessionCgroupNames {
        self.hierarchy()
            .map(|hierarchy| hierarchy.names.clone())
            .unwrap_or_default()
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
                termination: Some(h.termination()),
                reason: None,
                manager: Some(match h.manager {
                    Manager::Systemd(_) => CgroupManager::Systemd,
                    Manager::Cgroupfs { .. } => CgroupManager::Cgroupfs,
                }),
                manager_reason: Some(match &h.manager {
                    Manager::Systemd(systemd) => format!(
                        "systemd {} is the init and answers on the system bus: each session is a transient scope under {SUBTREE}",
                        systemd.version
                    ),
                    Manager::Cgroupfs { reason } => reason.clone(),
                }),
                default: None,
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
                termination: None,
                reason: Some(reason.clone()),
                manager: None,
                manager_reason: None,
                default: None,
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
    /// systemd, where it makes the session cgroups.
    pub fn systemd(&self) -> Option<&Systemd> {
        match &self.manager {
            Manager::Systemd(systemd) => Some(systemd),
            Manager::Cgroupfs { .. } => None,
        }
    }

    /// Removes an emptied session cgroup: a scope is stopped if systemd has not collected
    /// it yet (without waiting), the daemon's own cgroup removed.
    pub fn release(&self, path: &Path) -> Result<(), CgroupError> {
        match (self.systemd(), systemd::unit_of(path)) {
            (Some(systemd), Some(unit)) => {
                // A scope's cgroup is gone once systemd has collected it: no call then, so a
                // burst of ends does not queue hundreds of stops on a busy systemd.
                if path.exists() {
                    systemd.stop_later(unit);
                }
                Ok(())
            }
            _ => remove(path),
        }
    }

    /// Makes the subtree with the controllers sessions use enabled for its children, in
    /// the mount's root and in the subtree, once.
    pub fn prepare(&self) -> Result<(), CgroupError> {
        if self.prepared.get().is_some() {
            return Ok(());
        }
        let enable = self
            .controllers
            .iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(" ");
        write(&self.mount.join("cgroup.subtree_control"), &enable)?;
        match fs::create_dir(&self.subtree) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(CgroupError::Create {
                    path: self.subtree.clone(),
                    source,
                });
            }
        }
        write(&self.subtree.join("cgroup.subtree_control"), &enable)?;
        let _ = self.prepared.set(());
        Ok(())
    }

    /// The session cgroups under the subtree, if it exists (a start's reconcile).
    pub fn children(&self) -> Result<Vec<PathBuf>, CgroupError> {
        let entries = match fs::read_dir(&self.subtree) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(CgroupError::Read {
                    path: self.subtree.clone(),
                    source,
                });
            }
        };
        let mut children = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| CgroupError::Read {
                path: self.subtree.clone(),
                source,
            })?;
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                children.push(entry.path());
            }
        }
        children.sort();
        Ok(children)
    }

    /// Makes a session's cgroup, named `name` (chosen by the daemon, never a user's
    /// string), with its limits.
    pub fn create(&self, name: &str, limits: &Limits) -> Result<PathBuf, CgroupError> {
        self.prepare()?;
        let path = self.subtree.join(name);
        fs::create_dir(&path).map_err(|source| CgroupError::Create {
            path: path.clone(),
            source,
        })?;
        let written = limits
            .files()
            .try_for_each(|(file, value)| write(&path.join(file), &value.to_string()));
        if let Err(e) = written {
            let _ = remove(&path);
            return Err(e);
        }
        Ok(path)
    }

    /// How [`kill_all`] kills what a cgroup holds on this kernel, or systemd.
    pub fn termination(&self) -> CgroupTermination {
        if matches!(self.manager, Manager::Systemd(_)) {
            CgroupTermination::Unit
        } else if self.kill {
            CgroupTermination::Kill
        } else if self.freeze {
            CgroupTermination::Freeze
        } else {
            CgroupTermination::Signals
        }
    }
}

/// A session's limits, as registered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub memory_max: Option<u64>,
    pub tasks_max: Option<u64>,
    pub memory_high: Option<u64>,
    pub cpu_weight: Option<u64>,
    /// `--on-oom end`: the kernel's OOM killer takes the whole cgroup at once.
    pub oom_group: bool,
}

impl Limits {
    /// The files written in a new session cgroup, with their values.
    fn files(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("memory.max", self.memory_max),
            ("memory.high", self.memory_high),
            ("pids.max", self.tasks_max),
            ("cpu.weight", self.cpu_weight),
            ("memory.oom.group", self.oom_group.then_some(1)),
        ]
        .into_iter()
        .filter_map(|(file, value)| Some((file, value?)))
    }
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

/// A new session's cgroup, for the members its tree had when it was registered: the
/// connection that registered it moves them in once the tree's first walk is done, off the
/// engine (their number is the user's choice), and before its reply.
#[derive(Debug, Clone)]
pub struct Enclosure {
    pub path: PathBuf,
    /// systemd, where it made the cgroup (a scope): it is asked to attach them.
    pub systemd: Option<Systemd>,
    /// A user's registration moves only processes of hers (`None`: root's, any).
    pub uid: Option<u32>,
}

impl Enclosure {
    /// The processes of `members` (a tree's live ones) not in the cgroup yet that may be
    /// moved: for a user, those she may signal herself (kill(2)'s rule: her uid is their
    /// real or saved set-user-ID), so that no registration moves a process of another's.
    pub fn strays(
        &self,
        members: Vec<Identity>,
        proc: &ProcRoot,
    ) -> Result<Vec<ProcessKey>, CgroupError> {
        let inside: std::collections::HashSet<u32> = read(&self.path.join("cgroup.procs"))?
            .lines()
            .filter_map(|pid| pid.trim().parse().ok())
            .collect();
        let hers = |pid: u32| match self.uid {
            None => true,
            Some(uid) => proc.signal_uids(pid).is_ok_and(|ids| ids.contains(&uid)),
        };
        Ok(members
            .into_iter()
            .filter(|member| !inside.contains(&member.pid) && hers(member.pid))
            .map(|member| member.key())
            .collect())
    }

    /// Writes each of `strays` into the cgroup (the daemon's own cgroups), each still the
    /// process it was (alive, its start time) just before; one gone meanwhile is no error.
    pub fn take_in(&self, strays: &[ProcessKey], proc: &ProcRoot) -> Result<(), CgroupError> {
        for key in strays {
            if proc.check_key(*key) == Liveness::Alive {
                adopt(&self.path, key.pid)?;
            }
        }
        Ok(())
    }
}

/// The processes of `members` (an ended session's survivors) still alive and outside the
/// session cgroup at `path` (or the cgroups below it): moved out since they were in it,
/// or never moved in (another user's, one born outside while its tree was moved).
pub fn escapes(path: &Path, members: &[ProcessKey], proc: &ProcRoot) -> Vec<CgroupEscape> {
    members
        .iter()
        .filter_map(|key| escape(path, *key, proc))
        .collect()
}

/// The process `key`, if it is alive and outside the session cgroup at `path` (or the
/// cgroups below it), with its cgroup as its `/proc/<pid>/cgroup` names it. The file is
/// read once, its unified line only: a path a user chose the length of within her own
/// cgroups is read here, so never on the engine.
fn escape(path: &Path, key: ProcessKey, proc: &ProcRoot) -> Option<CgroupEscape> {
    let cgroup = cgroup_of(key, proc)?;
    (!holds(path, &cgroup)).then_some(CgroupEscape {
        pid: key.pid,
        start_ticks: key.start_ticks,
        cgroup,
    })
}

/// The cgroup of the process `key` in the unified hierarchy, as its `/proc/<pid>/cgroup`
/// names it (`/liveness.slice/<name>`, from the root of the hierarchy the daemon found);
/// `None` when it is gone, or its pid is another process's now. Its size is the user's
/// choice (the depth of her own cgroups): never read on the engine.
pub fn cgroup_of(key: ProcessKey, proc: &ProcRoot) -> Option<String> {
    let file = proc.path().join(key.pid.to_string()).join("cgroup");
    let cgroup = fs::read_to_string(file).ok()?;
    let cgroup = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .to_owned();
    // Read before it is checked: a pid taken meanwhile is not named.
    (proc.check_key(key) == Liveness::Alive).then_some(cgroup)
}

/// Whether the session cgroup at `path` (or a cgroup below it) is `cgroup`, named as
/// [`cgroup_of`] names it.
pub fn holds(path: &Path, cgroup: &str) -> bool {
    path.file_name()
        .is_some_and(|name| Path::new(cgroup).starts_with(Path::new("/").join(SUBTREE).join(name)))
}

/// What a cgroup below the root offers on this kernel.
struct Features {
    kill: bool,
    peak: bool,
    freeze: bool,
}

/// `cgroup.kill` (5.14+), `memory.peak` (5.19+) and `cgroup.freeze` (5.2+), as any cgroup
/// below the root shows them (the root has none): the subtree or another child of the
/// mount, else the kernel's release where the mount has no child yet.
fn features(mount: &Path, subtree: &Path) -> Features {
    let child = Some(subtree.to_path_buf())
        .filter(|s| s.is_dir())
        .or_else(|| {
            fs::read_dir(mount)
                .ok()?
                .flatten()
                .map(|e| e.path())
                .find(|p| p.is_dir())
        });
    match child {
        Some(child) => Features {
            kill: child.join("cgroup.kill").exists(),
            peak: child.join("memory.peak").exists(),
            freeze: child.join("cgroup.freeze").exists(),
        },
        None => {
            let release = rustix::system::uname();
            let version = release_version(&release.release().to_string_lossy());
            Features {
                kill: version >= (5, 14),
                peak: version >= (5, 19),
                freeze: version >= (5, 2),
            }
        }
    }
}

/// The major and minor numbers of a kernel release (`6.12.38+deb13-amd64`).
fn release_version(release: &str) -> (u32, u32) {
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse().unwrap_or(0));
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
}

/// Whether the cgroup at `path` has a live process in it or below (`cgroup.events`
/// `populated`); a cgroup already gone has none.
pub fn populated(path: &Path) -> Result<bool, CgroupError> {
    match fs::read_to_string(path.join("cgroup.events")) {
        Ok(text) => Ok(text.lines().any(|l| l == "populated 1")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(CgroupError::Read {
            path: path.join("cgroup.events"),
            source,
        }),
    }
}

/// What the cgroup at `path` counted; a file the kernel does not have is a null.
pub fn usage(path: &Path) -> CgroupUsage {
    let file = |name: &str| fs::read_to_string(path.join(name)).ok();
    let number = |name: &str| file(name).and_then(|t| t.trim().parse().ok());
    CgroupUsage {
        memory_peak: number("memory.peak"),
        memory_events: file("memory.events").map(|text| {
            let key = |k: &str| keyed(&text, k).unwrap_or(0);
            MemoryEvents {
                high: key("high"),
                max: key("max"),
                oom: key("oom"),
                oom_kill: key("oom_kill"),
            }
        }),
        cpu_usec: file("cpu.stat").and_then(|text| keyed(&text, "usage_usec")),
        pids_peak: number("pids.peak"),
        io: file("io.stat").map(|text| io_stat(&text)),
    }
}

/// The value of `key` in a flat-keyed file (`key value` lines).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// `io.stat` (`MAJ:MIN rbytes=… wbytes=… rios=… wios=… …` per device), summed.
fn io_stat(text: &str) -> IoUsage {
    let mut io = IoUsage::default();
    for pair in text.split_whitespace() {
        let Some((key, value)) = pair.split_once('=') else {
            continue;
        };
        let value: u64 = value.parse().unwrap_or(0);
        match key {
            "rbytes" => io.rbytes += value,
            "wbytes" => io.wbytes += value,
            "rios" => io.rios += value,
            "wios" => io.wios += value,
            _ => {}
        }
    }
    io
}

/// Kills every process in the cgroup at `path` (and below) at once, those it is forking
/// included, by `method`: `cgroup.kill` (5.14+), or, before, freezes the cgroup, sends
/// SIGKILL to each process it lists, and thaws it (a frozen process forks nothing, and a
/// fatal signal is delivered to it all the same), or systemd's `KillUnit` of a scope; an
/// error for [`CgroupTermination::Signals`].
pub fn kill_all(
    path: &Path,
    method: CgroupTermination,
    systemd: Option<&Systemd>,
) -> Result<(), CgroupError> {
    match method {
        CgroupTermination::Unit => {
            let unit = systemd::unit_of(path);
            let (Some(systemd), Some(unit)) = (systemd, unit) else {
                return Err(CgroupError::Unsupported {
                    path: path.to_path_buf(),
                });
            };
            systemd
                .kill_blocking(unit)
                .map_err(|source| CgroupError::Systemd {
                    unit: unit.to_owned(),
                    source,
                })
        }
        CgroupTermination::Kill => write(&path.join("cgroup.kill"), "1"),
        CgroupTermination::Freeze => {
            write(&path.join("cgroup.freeze"), "1")?;
            let killed = wait_frozen(path).and_then(|()| kill_each(path));
            // Thawed whatever happened: the killed die as they run again, and a cgroup
            // left frozen would hold the survivors of a failed kill stopped for good.
            let thawed = write(&path.join("cgroup.freeze"), "0");
            killed.and(thawed)
        }
        CgroupTermination::Signals => Err(CgroupError::Unsupported {
            path: path.to_path_buf(),
        }),
    }
}

/// How long a freeze may take before the kill goes on regardless: a process in an
/// uninterruptible sleep freezes only when it wakes, and it gets its SIGKILL then.
const FREEZE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Waits until `cgroup.events` says `frozen 1`, for at most [`FREEZE_WAIT`].
fn wait_frozen(path: &Path) -> Result<(), CgroupError> {
    let events = path.join("cgroup.events");
    let deadline = std::time::Instant::now() + FREEZE_WAIT;
    loop {
        if read(&events)?.lines().any(|l| l == "frozen 1") {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            tracing::warn!(cgroup = %path.display(), "a session cgroup is not frozen after 1 s; its processes are killed regardless");
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// SIGKILL to each process of the frozen cgroup at `path` and of the cgroups below it,
/// each through a pidfd proven to name the process listed (a frozen process cannot exit
/// and free its pid meanwhile, but one already dying can).
fn kill_each(path: &Path) -> Result<(), CgroupError> {
    let proc = ProcRoot::default();
    for pid in pids(path)? {
        // One gone meanwhile is no error.
        let Some(key) = key_of(pid, &proc) else {
            continue;
        };
        if let Ok(process) = PidRef::open(&proc, key, None) {
            let _ = process.signal(rustix::process::Signal::KILL);
        }
    }
    Ok(())
}

/// The pids of the processes the cgroup at `path` and the cgroups below it hold.
pub fn pids(path: &Path) -> Result<Vec<u32>, CgroupError> {
    let mut pids: Vec<u32> = (read(&path.join("cgroup.procs"))?.lines())
        .filter_map(|pid| pid.trim().parse().ok())
        .collect();
    let below = fs::read_dir(path).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    for entry in below.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            pids.extend(self::pids(&entry.path())?);
        }
    }
    Ok(pids)
}

/// The process with `pid` now, as its key; `None` once it is gone.
fn key_of(pid: u32, proc: &ProcRoot) -> Option<ProcessKey> {
    let stat = proc.stat(pid).ok()?;
    Some(ProcessKey {
        pid,
        start_ticks: stat.start_ticks,
    })
}

/// What the cgroup at `path` holds that `survivors` does not list, [`MAX_UNLISTED_NAMED`]
/// of them named; `None` when there is none, or the cgroup cannot be read (gone). Told
/// apart by pid, so that only those not listed are read (a kill may be waiting): a
/// survivor's pid taken by another process within the moment since the end is not told.
pub fn unlisted(path: &Path, survivors: &[ProcessKey], proc: &ProcRoot) -> Option<Unlisted> {
    let listed: HashSet<u32> = survivors.iter().map(|key| key.pid).collect();
    let mut others: Vec<u32> = (pids(path).ok()?.into_iter())
        .filter(|pid| !listed.contains(pid))
        .collect();
    others.sort_unstable();
    let total = u32::try_from(others.len()).unwrap_or(u32::MAX);
    let processes = (others.into_iter())
        .filter_map(|pid| key_of(pid, proc))
        .take(MAX_UNLISTED_NAMED)
        .collect();
    (total > 0).then_some(Unlisted { total, processes })
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
