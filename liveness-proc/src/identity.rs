//! Owner identity: which process a session belongs to, as a fingerprint that survives PID
//! reuse and reboots, and the liveness check against it.
//!
//! A bare PID names whatever process holds that number *now*. An [`Identity`] names one
//! process for its whole life: `{pid, start_ticks, boot_id}`, plus the pidfs inode where
//! the kernel has one (6.9+), which tells apart two processes started in the same 10 ms
//! tick. The host name is carried as a label only: the boot id already names this kernel
//! and this boot, and a host name changes under a running process. Start times are
//! normalised by the reader's time namespace ([`BoottimeOffset`]), so an identity means the
//! same in every namespace. Everything is read through a [`ProcRoot`] so tests can feed
//! crafted `/proc` trees.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use liveness_common::identity::{DeathReason, Identity, ProcessKey};

use crate::namespace::{BoottimeOffset, NANOS_PER_TICK, parse_nspid, parse_pidfd_fdinfo};
use crate::pidfd::{open_pidfd, pidfd_exited, pidfs_ino};

/// Process names that are never an owner: shells and launchers that sit between a hook
/// and the program that really owns the session.
pub const DEFAULT_SKIPPED_COMMS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "fish", "ksh", "ash", "env", "liveness",
];

/// Launchers: programs that run another program and are not the owner a session wants.
/// `owner: "auto"` does not skip them (a launcher may be the real owner), but a
/// registration whose owner is one gets a warning that names `--wrapper`.
pub const KNOWN_LAUNCHERS: &[&str] = &[
    "timeout", "nohup", "setsid", "sudo", "su", "doas", "runuser", "npx", "npm", "pnpm", "yarn",
    "uv", "uvx", "pipx", "xargs", "stdbuf", "nice", "ionice", "taskset", "flock", "strace",
];

/// Processes that adopt orphans (init and common subreapers). Reaching one while resolving
/// an owner means the real owner is gone or was never an ancestor.
const REAPER_COMMS: &[&str] = &[
    "systemd",
    "init",
    "tini",
    "dumb-init",
    "catatonit",
    "s6-svscan",
];

/// Multi-call binaries: one executable that is `sh`, `env` and more, by the name it was
/// started as. Where `/bin/sh` is a link to busybox, a shell's executable is busybox.
const MULTI_CALL_BINARIES: &[&str] = &["busybox", "toybox"];

/// How far [`resolve_owner`] walks up before giving up.
pub const MAX_RESOLVE_DEPTH: usize = 16;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("no process with PID {0}")]
    NoSuchProcess(u32),
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("malformed {path}: {what}")]
    Malformed { path: PathBuf, what: &'static str },
    #[error("{tid} is a thread of process {tgid}, not a process")]
    Thread { tid: u32, tgid: u32 },
    #[error("PID {pid} has no owner: {why}")]
    NoOwner { pid: u32, why: String },
    #[error(
        "PID {pid} ({comm}) is a kernel thread, which never exits like a process: name the program that owns the session"
    )]
    KernelThread { pid: u32, comm: String },
    #[error(
        "the process is not visible in the daemon's PID namespace: run the daemon in the host PID namespace, or the client in the daemon's"
    )]
    NotVisible,
    #[error(
        "no process has PID {pid} in your PID namespace: pass the owner as a pidfd (`liveness register --owner-pid` does where the kernel allows), or run the command in the owner's namespace"
    )]
    NotInCallerNamespace { pid: u32 },
    #[error(
        "start times read in this time namespace are ambiguous by one tick (its boottime offset, {offset_nanos} ns, is not a multiple of 10 ms) and this kernel has no pidfs inode to decide: capture identities outside this time namespace, or register the owner by pid"
    )]
    AmbiguousStartTime { offset_nanos: i64 },
    #[error("not a pidfd: {0}")]
    NotPidfd(String),
}

/// The answer of [`ProcRoot::check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    Dead(DeathReason),
    /// Cannot be decided here (another host, unreadable facts). Never finalizes by itself.
    Unknown(String),
}

/// One parsed `/proc/<pid>/stat` line: only the fields liveness uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub pid: u32,
    pub comm: String,
    pub state: char,
    pub ppid: u32,
    /// Kernel flags (field 9): `PF_KTHREAD` marks kernel threads.
    pub flags: u32,
    /// CPU time in user and kernel mode, in clock ticks (fields 14 and 15).
    pub utime: u64,
    pub stime: u64,
    /// Threads of the process still counted by the kernel (field 20).
    pub num_threads: u32,
    /// Field 22 as read: [`ProcRoot::stat`] returns it normalised to the initial time
    /// namespace.
    pub start_ticks: u64,
}

/// `PF_EXITING` in `include/linux/sched.h`: set as a thread enters `do_exit`.
const PF_EXITING: u32 = 0x0000_0004;
/// `PF_KTHREAD` in `include/linux/sched.h`.
const PF_KTHREAD: u32 = 0x0020_0000;

impl Stat {
    /// Parses a stat line. The comm sits between the first `(` and the *last* `)`: it may
    /// itself contain spaces, parentheses and newlines.
    pub fn parse(text: &[u8]) -> Result<Stat, &'static str> {
        let open = text
            .iter()
            .position(|&b| b == b'(')
            .ok_or("no '(' before the command name")?;
        let close = text
            .iter()
            .rposition(|&b| b == b')')
            .ok_or("no ')' after the command name")?;
        if close < open {
            return Err("')' before '('");
        }
        let pid = std::str::from_utf8(&text[..open])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or("PID is not a number")?;
        let comm = String::from_utf8_lossy(&text[open + 1..close]).into_owned();
        let rest = std::str::from_utf8(&text[close + 1..]).map_err(|_| "fields are not UTF-8")?;
        // Fields after the comm, numbered as in proc(5): 3 = state, 4 = ppid, 9 = flags,
        // 14 = utime, 15 = stime, 20 = num_threads, 22 = starttime.
        let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).copied().ok_or("too few fields");
        let mut state_chars = field(3)?.chars();
        let state = match (state_chars.next(), state_chars.next()) {
            (Some(c), None) => c,
            _ => return Err("state is not one character"),
        };
        let ppid = field(4)?.parse().map_err(|_| "PPID is not a number")?;
        let flags = field(9)?.parse().map_err(|_| "flags are not a number")?;
        let utime = field(14)?.parse().map_err(|_| "utime is not a number")?;
        let stime = field(15)?.parse().map_err(|_| "stime is not a number")?;
        let num_threads = field(20)?
            .parse()
            .map_err(|_| "thread count is not a number")?;
        let start_ticks = field(22)?
            .parse()
            .map_err(|_| "start time is not a number")?;
        Ok(Stat {
            pid,
            comm,
            state,
            ppid,
            flags,
            utime,
            stime,
            num_threads,
            start_ticks,
        })
    }

    /// CPU time used so far (user + kernel), in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        self.utime + self.stime
    }

    pub fn is_kernel_thread(&self) -> bool {
        self.flags & PF_KTHREAD != 0
    }

    /// A zombie (`Z`) or dying (`X`) process has exited and awaits its parent's reap — but
    /// the state shown is the *leader's*: after the main thread exits, the leader is a zombie
    /// while other threads run on, and the process still counts more than one thread.
    pub fn has_exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X') && self.num_threads <= 1
    }

    /// The leader has entered `do_exit` (the whole process, or the main thread alone),
    /// and the process has not [exited](Stat::has_exited) yet.
    pub fn is_exiting(&self) -> bool {
        self.flags & PF_EXITING != 0 && !self.has_exited()
    }
}

/// Most bytes of a process's arguments read (`cmdline`): one can hold megabytes, and a
/// reply lists thousands of processes.
pub const MAX_CMDLINE_BYTES: usize = 4096;

/// Where process facts are read from: `/proc` normally, a crafted tree in tests.
#[derive(Debug, Clone)]
pub struct ProcRoot {
    root: PathBuf,
    /// The reader's boottime offset (`<root>/self/timens_offsets`), read once.
    offset: BoottimeOffset,
    /// Whether pids name live processes of this kernel, so pidfds can be opened for them
    /// (not for a crafted tree).
    live: bool,
}

impl Default for ProcRoot {
    fn default() -> Self {
        let mut proc = ProcRoot::new("/proc");
        proc.live = true;
        if proc.offset != BoottimeOffset::default() && !proc.start_times_include_offset() {
            // The readings are already the kernel's own (Linux 5.10 reads them so).
            proc.offset = BoottimeOffset::default();
        }
        proc
    }
}

impl ProcRoot {
    /// A proc tree at `root`. Its `self/timens_offsets` gives the reader's time namespace
    /// offset; without that file (kernels without time namespaces) there is none.
    pub fn new(root: impl Into<PathBuf>) -> ProcRoot {
        let root = root.into();
        let path = root.join("self/timens_offsets");
        let offset = match std::fs::read_to_string(&path) {
            Ok(text) => BoottimeOffset::parse(&text).unwrap_or_else(|what| {
                tracing::warn!(path = %path.display(), what, "ignoring a malformed time namespace offset");
                BoottimeOffset::default()
            }),
            Err(_) => BoottimeOffset::default(),
        };
        ProcRoot {
            root,
            offset,
            live: false,
        }
    }

    /// Whether this kernel adds the reader's boottime offset to `/proc/<pid>/stat` start
    /// times: Linux 6.1 does, 5.10 does not. Asked of the kernel, not of its version: a
    /// child forked now started now, so its start time as read here is close to this time
    /// namespace's `CLOCK_BOOTTIME` (which every kernel with time namespaces offsets) only
    /// when the reading includes the offset too. Offsets under a second are taken as
    /// included: a probe cannot tell them from the fork's own delay.
    fn start_times_include_offset(&self) -> bool {
        let offset_ticks = self.offset.nanos.div_euclid(NANOS_PER_TICK);
        let probe = || -> Result<i64, IdentityError> {
            // SAFETY: the child only calls _exit, which is async-signal-safe.
            let child = match unsafe { libc::fork() } {
                -1 => {
                    return Err(IdentityError::Read {
                        path: PathBuf::from("fork(2)"),
                        source: io::Error::last_os_error(),
                    });
                }
                // SAFETY: _exit is async-signal-safe and never returns.
                0 => unsafe { libc::_exit(0) },
                child => child as u32,
            };
            let read = self.read(&format!("{child}/stat"));
            let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
            // SAFETY: reaps our own child into a local.
            unsafe { libc::waitpid(child as i32, std::ptr::null_mut(), 0) };
            let started = Stat::parse(&read?)
                .map_err(|what| IdentityError::Malformed {
                    path: self.root.join(format!("{child}/stat")),
                    what,
                })?
                .start_ticks as i64;
            let now_ticks =
                now.tv_sec * (1_000_000_000 / NANOS_PER_TICK) + now.tv_nsec / NANOS_PER_TICK;
            Ok(now_ticks - started)
        };
        match probe() {
            // Read with the offset, the child's start lags "now" by almost nothing; read
            // without it, by the whole offset.
            Ok(lag) => lag.abs() < (offset_ticks.abs() / 2).max(100),
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell whether /proc start times include the time namespace offset; assuming they do");
                true
            }
        }
    }

    /// Fails when start times read here cannot be normalised exactly (a time namespace
    /// whose boottime offset is not a whole number of ticks).
    pub fn exact_start_times(&self) -> Result<(), IdentityError> {
        if self.offset.is_whole_ticks() {
            Ok(())
        } else {
            Err(IdentityError::AmbiguousStartTime {
                offset_nanos: self.offset.nanos,
            })
        }
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    pub(crate) fn read(&self, rel: &str) -> Result<Vec<u8>, IdentityError> {
        let path = self.root.join(rel);
        std::fs::read(&path).map_err(|source| IdentityError::Read { path, source })
    }

    /// The first `max` bytes of a file, and whether there were more.
    fn read_at_most(&self, rel: &str, max: usize) -> Result<(Vec<u8>, bool), IdentityError> {
        use std::io::Read;
        let path = self.root.join(rel);
        let mut bytes = Vec::new();
        std::fs::File::open(&path)
            .and_then(|file| file.take(max as u64 + 1).read_to_end(&mut bytes))
            .map_err(|source| IdentityError::Read { path, source })?;
        let more = bytes.len() > max;
        bytes.truncate(max);
        Ok((bytes, more))
    }

    fn read_trimmed(&self, rel: &str) -> Result<String, IdentityError> {
        let bytes = self.read(rel)?;
        let text = String::from_utf8_lossy(&bytes).trim().to_owned();
        if text.is_empty() {
            return Err(IdentityError::Malformed {
                path: self.root.join(rel),
                what: "empty",
            });
        }
        Ok(text)
    }

    /// This boot's id.
    pub fn boot_id(&self) -> Result<String, IdentityError> {
        self.read_trimmed("sys/kernel/random/boot_id")
    }

    /// This host's name, as the kernel of the reader's UTS namespace knows it.
    pub fn host(&self) -> Result<String, IdentityError> {
        self.read_trimmed("sys/kernel/hostname")
    }

    /// Reads and parses `<root>/<pid>/stat`. A missing PID is [`IdentityError::NoSuchProcess`].
    pub fn stat(&self, pid: u32) -> Result<Stat, IdentityError> {
        let rel = format!("{pid}/stat");
        let bytes = match self.read(&rel) {
            Err(IdentityError::Read { source, .. })
                if matches!(source.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) =>
            {
                return Err(IdentityError::NoSuchProcess(pid));
            }
            other => other?,
        };
        let mut stat = Stat::parse(&bytes).map_err(|what| IdentityError::Malformed {
            path: self.root.join(&rel),
            what,
        })?;
        stat.start_ticks = self.offset.normalize(stat.start_ticks);
        if stat.pid != pid {
            return Err(IdentityError::Malformed {
                path: self.root.join(rel),
                what: "PID differs",
            });
        }
        Ok(stat)
    }

    /// `/proc/<pid>/status`; a missing PID is [`IdentityError::NoSuchProcess`].
    fn status(&self, pid: u32) -> Result<String, IdentityError> {
        match self.read(&format!("{pid}/status")) {
            Err(IdentityError::Read { source, .. })
                if matches!(source.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) =>
            {
                Err(IdentityError::NoSuchProcess(pid))
            }
            other => Ok(String::from_utf8_lossy(&other?).into_owned()),
        }
    }

    /// The first number of a `/proc/<pid>/status` line such as `Uid:` or `Tgid:`.
    fn status_field(&self, pid: u32, field: &'static str) -> Result<u32, IdentityError> {
        let rel = format!("{pid}/status");
        self.status(pid)?
            .lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|values| values.split_ascii_whitespace().next())
            .and_then(|first| first.parse().ok())
            .ok_or(IdentityError::Malformed {
                path: self.root.join(rel),
                what: field,
            })
    }

    /// The program a process runs: the file name of its executable or, for a multi-call
    /// binary such as busybox, the name it was started as (`argv[0]`). `None` when the
    /// executable cannot be read (that needs the rights to ptrace the process: a user's own
    /// processes, or root).
    pub fn program_name(&self, pid: u32) -> Option<String> {
        let exe = std::fs::read_link(self.root.join(format!("{pid}/exe"))).ok()?;
        let exe = exe.file_name()?.to_string_lossy().into_owned();
        if !MULTI_CALL_BINARIES.contains(&exe.as_str()) {
            return Some(exe);
        }
        let (cmdline, _) = self
            .read_at_most(&format!("{pid}/cmdline"), MAX_CMDLINE_BYTES)
            .ok()?;
        let argv0 = cmdline.split(|&b| b == 0).next()?;
        let called = Path::new(std::ffi::OsStr::from_bytes(argv0)).file_name()?;
        Some(called.to_string_lossy().into_owned())
    }

    /// Clock ticks since boot now, on the scale of start times: process ages are this
    /// minus their start time. Read in this reader's time namespace and normalised like
    /// start times.
    pub fn uptime_ticks(&self) -> u64 {
        let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        let per_second = (1_000_000_000 / NANOS_PER_TICK) as u64;
        let ticks = now.tv_sec as u64 * per_second + now.tv_nsec as u64 / NANOS_PER_TICK as u64;
        self.offset.normalize(ticks)
    }

    /// Every process now in this proc tree (not threads, which `/proc` does not list),
    /// with its parent and start time. Processes that vanish during the walk are skipped.
    pub fn processes(&self) -> Result<Vec<Stat>, IdentityError> {
        let entries = std::fs::read_dir(&self.root).map_err(|source| IdentityError::Read {
            path: self.root.clone(),
            source,
        })?;
        Ok(entries
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| self.stat(pid).ok())
            .collect())
    }

    /// The processes whose parent is `pid`, from `/proc/<pid>/task/*/children`
    /// (`CONFIG_PROC_CHILDREN`): a walk of one process tree without reading every process.
    /// A kernel without those files gives a `Read` error of kind `NotFound`.
    pub fn children(&self, pid: u32) -> Result<Vec<u32>, IdentityError> {
        let tasks = self.root.join(format!("{pid}/task"));
        let entries = std::fs::read_dir(&tasks).map_err(|source| IdentityError::Read {
            path: tasks.clone(),
            source,
        })?;
        let mut children = Vec::new();
        for task in entries.filter_map(Result::ok) {
            let path = task.path().join("children");
            match std::fs::read_to_string(&path) {
                Ok(text) => children.extend(
                    text.split_ascii_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok()),
                ),
                // The thread exited meanwhile; its children were the process's anyway.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(source) => return Err(IdentityError::Read { path, source }),
            }
        }
        Ok(children)
    }

    /// A process's arguments, lossily decoded; empty for a kernel thread or a zombie. At
    /// most [`MAX_CMDLINE_BYTES`] of them are read: a longer list is cut, its last argument
    /// ending in `…`.
    pub fn cmdline(&self, pid: u32) -> Result<Vec<String>, IdentityError> {
        let (bytes, cut) = self.read_at_most(&format!("{pid}/cmdline"), MAX_CMDLINE_BYTES)?;
        let mut args: Vec<String> = bytes
            .split(|&b| b == 0)
            .filter(|arg| !arg.is_empty())
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect();
        if let (true, Some(last)) = (cut, args.last_mut()) {
            last.push('…');
        }
        Ok(args)
    }

    /// The real user id of a process.
    pub fn uid(&self, pid: u32) -> Result<u32, IdentityError> {
        self.status_field(pid, "Uid")
    }

    /// The real and saved set-user-IDs of a process: those an unprivileged sender's real or
    /// effective uid must match for the kernel to let it signal the process (kill(2)).
    pub fn signal_uids(&self, pid: u32) -> Result<[u32; 2], IdentityError> {
        let status = self.status(pid)?;
        let ids: Vec<u32> = status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .map(|ids| {
                ids.split_ascii_whitespace()
                    .filter_map(|id| id.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        match ids[..] {
            [real, _effective, saved, ..] => Ok([real, saved]),
            _ => Err(IdentityError::Malformed {
                path: self.root.join(format!("{pid}/status")),
                what: "Uid",
            }),
        }
    }

    /// The process a thread id belongs to (itself for a process id). `/proc/<tid>` exists
    /// for every thread, though only processes are listed.
    pub fn tgid(&self, pid: u32) -> Result<u32, IdentityError> {
        self.status_field(pid, "Tgid")
    }

    /// A pidfd for a live process of this kernel, `None` for a crafted tree or where the
    /// kernel has no `pidfd_open` (before 5.3) or the process is gone.
    fn open_pidfd(&self, pid: u32) -> Option<OwnedFd> {
        if !self.live {
            return None;
        }
        open_pidfd(pid).ok()
    }

    /// Whether this is the live `/proc` of a kernel whose pidfds live in pidfs (Linux 6.9+):
    /// there each process has an inode of its own, which tells it from another that took
    /// its pid within its clock tick (and so has its start time too).
    pub fn has_pidfs(&self) -> bool {
        static PIDFS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        self.live
            && *PIDFS.get_or_init(|| {
                self.open_pidfd(std::process::id())
                    .is_some_and(|pidfd| pidfs_ino(pidfd.as_fd()).is_some())
            })
    }

    /// Captures the identity of a live process. Fails rather than returning a partial
    /// identity; a zombie has already exited and has no identity worth owning anything.
    ///
    /// Where the kernel allows, a pidfd is opened first and held across the reads: while
    /// it shows the process alive afterwards, the pid cannot have changed hands in between,
    /// and its pidfs inode joins the fingerprint.
    pub fn capture(&self, pid: u32) -> Result<Identity, IdentityError> {
        let pidfd = self.open_pidfd(pid);
        self.capture_held(pid, pidfd.as_ref().map(AsFd::as_fd))
    }

    /// Captures the identity of the process behind a pidfd (received from a client, say).
    /// The pid is the pidfd's own (fdinfo `Pid:`), in the namespace of this proc tree: no
    /// pid is ever taken on trust.
    pub fn capture_pidfd(&self, pidfd: BorrowedFd<'_>) -> Result<Identity, IdentityError> {
        let rel = format!("self/fdinfo/{}", pidfd.as_raw_fd());
        let text = String::from_utf8_lossy(&self.read(&rel)?).into_owned();
        let info =
            parse_pidfd_fdinfo(&text).map_err(|what| IdentityError::NotPidfd(what.into()))?;
        match info.pid {
            None => Err(IdentityError::NoSuchProcess(
                info.nspid.last().copied().unwrap_or(0),
            )),
            Some(0) => Err(IdentityError::NotVisible),
            Some(pid) => self.capture_held(pid, Some(pidfd)),
        }
    }

    fn capture_held(
        &self,
        pid: u32,
        pidfd: Option<BorrowedFd<'_>>,
    ) -> Result<Identity, IdentityError> {
        let stat = self.stat(pid)?;
        if stat.has_exited() {
            return Err(IdentityError::NoSuchProcess(pid));
        }
        if stat.is_kernel_thread() {
            return Err(IdentityError::KernelThread {
                pid,
                comm: stat.comm,
            });
        }
        // Exit sources watch processes: a thread's id would never be reported dead.
        let tgid = self.tgid(pid)?;
        if tgid != pid {
            return Err(IdentityError::Thread { tid: pid, tgid });
        }
        let pidfs_ino = match pidfd {
            Some(pidfd) => {
                // Read after the stat: still running now, so the stat was this process's.
                if pidfd_exited(pidfd) {
                    return Err(IdentityError::NoSuchProcess(pid));
                }
                pidfs_ino(pidfd)
            }
            None => None,
        };
        if pidfs_ino.is_none() {
            self.exact_start_times()?;
        }
        Ok(Identity {
            pid,
            start_ticks: stat.start_ticks,
            boot_id: self.boot_id()?,
            host: self.host()?,
            pidfs_ino,
            comm: stat.comm,
        })
    }

    /// Is the process named by `identity` still alive?
    ///
    /// Dead needs proof: the PID is gone or a zombie, its start time or pidfs inode
    /// differs, or the boot differs. The boot id decides "this kernel, this boot"; the
    /// host name is only a label, consulted when the boot differs to tell a reboot of this
    /// host (dead) from another machine (unknown). An unreadable fact is Unknown (fail
    /// closed).
    pub fn check(&self, identity: &Identity) -> Liveness {
        match self.boot_id() {
            Ok(boot) if boot == identity.boot_id => {
                self.check_process(identity.key(), identity.pidfs_ino)
            }
            Ok(_) => match self.host() {
                Ok(host) if host == identity.host => Liveness::Dead(DeathReason::Rebooted),
                Ok(host) => Liveness::Unknown(format!(
                    "the identity is of another boot on host {:?} (this is {host:?}): another machine, or this one before a reboot and a rename",
                    identity.host
                )),
                Err(e) => Liveness::Unknown(e.to_string()),
            },
            Err(e) => Liveness::Unknown(e.to_string()),
        }
    }

    /// [`ProcRoot::check`] for a process already known to be of this boot.
    pub fn check_key(&self, key: ProcessKey) -> Liveness {
        self.check_process(key, None)
    }

    /// [`ProcRoot::check_key`], and where `pidfs_ino` is known and the kernel has pidfs,
    /// the inode too: a process that took the pid within the same clock tick has the
    /// owner's start time but not its inode.
    pub fn check_process(&self, key: ProcessKey, known_ino: Option<u64>) -> Liveness {
        // Opened before the stat is read, for the same reason as in `capture`.
        let held = known_ino.and_then(|ino| Some((ino, self.open_pidfd(key.pid)?)));
        self.judge(key, self.stat(key.pid).as_ref(), held)
    }

    /// [`ProcRoot::check_key`], and whether the process, found alive, is
    /// [exiting](Stat::is_exiting): both from one reading of its stat.
    pub fn check_key_exiting(&self, key: ProcessKey) -> (Liveness, bool) {
        let stat = self.stat(key.pid);
        let liveness = self.judge(key, stat.as_ref(), None);
        let exiting = liveness == Liveness::Alive && stat.is_ok_and(|stat| stat.is_exiting());
        (liveness, exiting)
    }

    /// Whether the process `key` names is alive, from its stat (and its pidfd, held from
    /// before the stat was read, with the pidfs inode known for it).
    fn judge(
        &self,
        key: ProcessKey,
        stat: Result<&Stat, &IdentityError>,
        held: Option<(u64, OwnedFd)>,
    ) -> Liveness {
        let stat = match stat {
            Err(IdentityError::NoSuchProcess(_)) => return Liveness::Dead(DeathReason::Exited),
            Err(e) => return Liveness::Unknown(e.to_string()),
            Ok(stat) => stat,
        };
        if stat.start_ticks != key.start_ticks {
            // Read in a time namespace whose offset is not whole ticks, a reading may be one
            // tick above the kernel's count: then only the pidfs inode can decide.
            let within_a_tick = stat.start_ticks.abs_diff(key.start_ticks) <= 1;
            if self.offset.is_whole_ticks() || !within_a_tick {
                return Liveness::Dead(DeathReason::PidReused);
            }
            if held.is_none() {
                return Liveness::Unknown(
                    IdentityError::AmbiguousStartTime {
                        offset_nanos: self.offset.nanos,
                    }
                    .to_string(),
                );
            }
        }
        if stat.has_exited() {
            return Liveness::Dead(DeathReason::Exited);
        }
        // An inode was only recorded where pidfds live in pidfs (this boot, this kernel).
        let now = |pidfd: &OwnedFd| rustix::fs::fstat(pidfd).ok().map(|st| st.st_ino);
        match held.map(|(ino, pidfd)| (ino, now(&pidfd))) {
            Some((ino, Some(now))) if now != ino => Liveness::Dead(DeathReason::PidReused),
            _ => Liveness::Alive,
        }
    }

    /// The pidfs inode of the process `key` names, when it is alive and the kernel has
    /// pidfs (6.9+).
    pub fn pidfs_ino_of_key(&self, key: ProcessKey) -> Option<u64> {
        let pidfd = self.open_pidfd(key.pid)?;
        let stat = self.stat(key.pid).ok()?;
        if stat.start_ticks != key.start_ticks || pidfd_exited(pidfd.as_fd()) {
            return None;
        }
        pidfs_ino(pidfd.as_fd())
    }

    /// The PID namespace of a process (`<pid>/ns/pid`, or `self/ns/pid` for `None`), by
    /// its nsfs inode.
    fn pid_namespace(&self, pid: Option<u32>) -> Result<u64, IdentityError> {
        let rel = pid.map_or_else(|| "self/ns/pid".to_owned(), |pid| format!("{pid}/ns/pid"));
        let path = self.root.join(rel);
        match std::fs::metadata(&path) {
            Ok(meta) => Ok(meta.ino()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                Err(IdentityError::NoSuchProcess(pid.unwrap_or(0)))
            }
            Err(source) => Err(IdentityError::Read { path, source }),
        }
    }

    /// The pid in this proc tree's namespace of the process that the client `peer` (a pid
    /// of this tree, from `SO_PEERCRED`) calls `pid` in its own PID namespace.
    ///
    /// A client in this namespace needs no translation. A client in a child namespace is
    /// translated through `NSpid:`, considering only processes of the client's own
    /// namespace; `peer` 0 (the client is not visible here) is refused.
    pub fn translate_pid(&self, peer: u32, pid: u32) -> Result<u32, IdentityError> {
        if peer == 0 {
            return Err(IdentityError::NotVisible);
        }
        let peer_ns = self.pid_namespace(Some(peer))?;
        if peer_ns == self.pid_namespace(None)? {
            return Ok(pid);
        }
        // The client's depth below this namespace: its NSpid has one entry per level.
        let depth = parse_nspid(&self.status(peer)?).len();
        let entries = std::fs::read_dir(&self.root).map_err(|source| IdentityError::Read {
            path: self.root.clone(),
            source,
        })?;
        for entry in entries.flatten() {
            let Some(candidate) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(status) = self.status(candidate) else {
                continue;
            };
            let nspid = parse_nspid(&status);
            if nspid.len() == depth
                && nspid.last() == Some(&pid)
                && self.pid_namespace(Some(candidate)).ok() == Some(peer_ns)
            {
                return Ok(candidate);
            }
        }
        Err(IdentityError::NotInCallerNamespace { pid })
    }

    /// The pid by which the client `peer` knows the process `local` (a pid of this tree):
    /// the reverse of [`ProcRoot::translate_pid`]. `None` when the process is outside the
    /// client's namespace, as an ancestor of the client's container is.
    pub fn pid_seen_by(&self, peer: u32, local: u32) -> Option<u32> {
        if peer == 0 {
            return None;
        }
        if self.pid_namespace(Some(peer)).ok()? == self.pid_namespace(None).ok()? {
            return Some(local);
        }
        let depth = parse_nspid(&self.status(peer).ok()?).len();
        parse_nspid(&self.status(local).ok()?)
            .get(depth.checked_sub(1)?)
            .copied()
    }

    /// [`ProcRoot::capture`] of the process the client `peer` calls `pid`: translated
    /// through the client's PID namespace, and checked again after the capture, so a pid
    /// that changed hands in between is never bound.
    pub fn capture_for(&self, peer: u32, pid: u32) -> Result<Identity, IdentityError> {
        let local = self.translate_pid(peer, pid)?;
        let identity = self.capture(local)?;
        if local != pid && self.translate_pid(peer, pid)? != local {
            return Err(IdentityError::NotInCallerNamespace { pid });
        }
        match self.check_process(identity.key(), identity.pidfs_ino) {
            Liveness::Alive => Ok(identity),
            _ => Err(IdentityError::NoSuchProcess(pid)),
        }
    }

    /// Walks up from `pid` to the first ancestor (or `pid` itself) that is not a shell,
    /// launcher or one of `extra_wrappers`, and captures its identity.
    ///
    /// Reaching init, a known subreaper, the top of the tree or [`MAX_RESOLVE_DEPTH`] is an
    /// error: guessing an owner would attach the session to the wrong process.
    pub fn resolve_owner(
        &self,
        pid: u32,
        extra_wrappers: &[String],
    ) -> Result<Identity, IdentityError> {
        let listed = |name: &str| {
            DEFAULT_SKIPPED_COMMS.contains(&name) || extra_wrappers.iter().any(|w| w == name)
        };
        // A script run through its `#!` line is named after the script, not its shell;
        // the program still is the shell.
        let skipped = |pid: u32, comm: &str| {
            listed(comm)
                || self
                    .program_name(pid)
                    .is_some_and(|program| listed(&program))
        };
        let mut current = pid;
        let mut chain = Vec::new();
        for _ in 0..MAX_RESOLVE_DEPTH {
            if current == 0 {
                return Err(IdentityError::NotVisible);
            }
            if current <= 1 {
                return Err(IdentityError::NoOwner {
                    pid,
                    why: format!("reached init through {}", chain.join(" <- ")),
                });
            }
            let stat = self.stat(current)?;
            if REAPER_COMMS.contains(&stat.comm.as_str()) {
                return Err(IdentityError::NoOwner {
                    pid,
                    why: format!(
                        "reached the reaper {}[{current}] through {}",
                        stat.comm,
                        chain.join(" <- ")
                    ),
                });
            }
            if !skipped(current, &stat.comm) {
                return self.capture(current);
            }
            chain.push(format!("{}[{current}]", stat.comm));
            current = stat.ppid;
        }
        Err(IdentityError::NoOwner {
            pid,
            why: format!(
                "no owner within {MAX_RESOLVE_DEPTH} ancestors: {}",
                chain.join(" <- ")
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeProc, stat_line, stat_line_threads};

    #[test]
    fn parses_comm_with_parentheses_spaces_and_newlines() {
        for comm in ["a) (b", "x y z", "))", "new\nline", "(", ""] {
            let stat = Stat::parse(stat_line(42, comm, 'R', 7, 123456).as_bytes()).unwrap();
            assert_eq!(
                stat,
                Stat {
                    pid: 42,
                    comm: comm.to_owned(),
                    state: 'R',
                    ppid: 7,
                    flags: 0,
                    utime: 3,
                    stime: 4,
                    num_threads: 1,
                    start_ticks: 123456
                }
            );
            assert_eq!(stat.cpu_ticks(), 7, "cpu_ticks is utime + stime");
        }
    }

    #[test]
    fn a_leader_in_do_exit_is_exiting_until_it_has_exited() {
        let stat = |state, flags, num_threads| Stat {
            state,
            flags,
            num_threads,
            ..Stat::parse(stat_line(42, "x", 'R', 1, 99).as_bytes()).unwrap()
        };
        assert!(stat('R', PF_EXITING, 1).is_exiting());
        assert!(stat('D', PF_EXITING | 0x40, 1).is_exiting());
        // Its other threads still being torn down, or running on after the main one.
        assert!(stat('Z', PF_EXITING, 3).is_exiting());
        assert!(!stat('Z', PF_EXITING, 1).is_exiting(), "exited");
        assert!(!stat('R', 0x40, 1).is_exiting());
    }

    #[test]
    fn rejects_truncated_and_garbage_stat() {
        let full = stat_line(42, "cat", 'S', 1, 99);
        let truncated = &full[..full.len() - 30];
        assert_eq!(Stat::parse(truncated.as_bytes()), Err("too few fields"));
        assert_eq!(Stat::parse(b""), Err("no '(' before the command name"));
        assert_eq!(
            Stat::parse(b"42 (cat S 1"),
            Err("no ')' after the command name")
        );
        assert_eq!(Stat::parse(b"x (cat) S 1"), Err("PID is not a number"));
        assert_eq!(Stat::parse(b"42 )cat( S"), Err("')' before '('"));
        let bad_start = full.replace(" 99 ", " 9x ");
        assert_eq!(
            Stat::parse(bad_start.as_bytes()),
            Err("start time is not a number")
        );
        assert_eq!(
            Stat::parse(b"42 (cat) SS 1"),
            Err("state is not one character")
        );
    }

    #[test]
    fn capture_reads_every_fact_or_fails_whole() {
        let proc = FakeProc::new().with(10, "agent (v2)", 1);
        let id = proc.root().capture(10).unwrap();
        assert_eq!(
            id,
            Identity {
                pid: 10,
                start_ticks: 1010,
                boot_id: "boot-a".into(),
                host: "devbox".into(),
                pidfs_ino: None,
                comm: "agent (v2)".into()
            }
        );
        assert!(matches!(
            proc.root().capture(11),
            Err(IdentityError::NoSuchProcess(11))
        ));

        let garbage = FakeProc::new().with_raw(12, b"12 (x) S");
        assert!(matches!(
            garbage.root().capture(12),
            Err(IdentityError::Malformed { .. })
        ));

        let zombie = FakeProc::new().with_raw(13, stat_line(13, "z", 'Z', 1, 5).as_bytes());
        assert!(matches!(
            zombie.root().capture(13),
            Err(IdentityError::NoSuchProcess(13))
        ));

        let thread = FakeProc::new().with(15, "worker", 1);
        std::fs::write(thread.path().join("15/status"), "Tgid:\t10\nUid:\t0\n").unwrap();
        assert!(matches!(
            thread.root().capture(15),
            Err(IdentityError::Thread { tid: 15, tgid: 10 })
        ));

        let no_boot = FakeProc::new().with(14, "a", 1);
        std::fs::remove_file(no_boot.path().join("sys/kernel/random/boot_id")).unwrap();
        assert!(matches!(
            no_boot.root().capture(14),
            Err(IdentityError::Read { .. })
        ));
    }

    #[test]
    fn check_distinguishes_alive_dead_and_unknown() {
        let proc = FakeProc::new()
            .with(20, "agent", 1)
            .with_raw(21, stat_line(21, "z", 'Z', 1, 1021).as_bytes());
        let root = proc.root();
        let id = root.capture(20).unwrap();
        assert_eq!(root.check(&id), Liveness::Alive);

        let reused = Identity {
            start_ticks: 1,
            ..id.clone()
        };
        assert_eq!(root.check(&reused), Liveness::Dead(DeathReason::PidReused));
        let gone = Identity {
            pid: 99,
            ..id.clone()
        };
        assert_eq!(root.check(&gone), Liveness::Dead(DeathReason::Exited));
        let zombie = Identity {
            pid: 21,
            start_ticks: 1021,
            ..id.clone()
        };
        assert_eq!(root.check(&zombie), Liveness::Dead(DeathReason::Exited));
        // The main thread exited (the leader shows Z) while another thread runs: alive.
        let leader_gone = FakeProc::new().with_raw(
            22,
            stat_line_threads(22, "agent", 'Z', 1, 1022, 2).as_bytes(),
        );
        let threaded = Identity {
            pid: 22,
            start_ticks: 1022,
            ..id.clone()
        };
        assert_eq!(leader_gone.root().check(&threaded), Liveness::Alive);
        let other_boot = Identity {
            boot_id: "boot-b".into(),
            ..id.clone()
        };
        assert_eq!(
            root.check(&other_boot),
            Liveness::Dead(DeathReason::Rebooted)
        );
        let other_host = Identity {
            host: "elsewhere".into(),
            boot_id: "boot-b".into(),
            ..id.clone()
        };
        assert!(matches!(root.check(&other_host), Liveness::Unknown(_)));
        let renamed_host = Identity {
            host: "before-rename".into(),
            ..id.clone()
        };
        assert_eq!(
            root.check(&renamed_host),
            Liveness::Alive,
            "the host name is a label: this boot's process is checked whatever it says"
        );

        std::fs::write(proc.path().join("20/stat"), b"garbage").unwrap();
        assert!(matches!(root.check(&id), Liveness::Unknown(_)));
    }

    #[test]
    fn uid_is_the_real_uid_from_status() {
        let proc = FakeProc::new().with(70, "agent", 1);
        let status = proc.path().join("70/status");
        std::fs::write(
            &status,
            "Name:\tagent\nTgid:\t70\nUid:\t1000\t0\t0\t0\nGid:\t5\n",
        )
        .unwrap();
        assert_eq!(proc.root().uid(70).unwrap(), 1000);
        assert_eq!(
            proc.root().signal_uids(70).unwrap(),
            [1000, 0],
            "real and saved, not effective or fs"
        );
        assert_eq!(proc.root().tgid(70).unwrap(), 70);
        std::fs::write(&status, "Name:\tagent\nUidx:\t5\n").unwrap();
        assert!(matches!(
            proc.root().uid(70),
            Err(IdentityError::Malformed { .. })
        ));
        assert!(matches!(
            proc.root().signal_uids(70),
            Err(IdentityError::Malformed { .. })
        ));
        assert!(matches!(
            proc.root().uid(71),
            Err(IdentityError::NoSuchProcess(71))
        ));
    }

    #[test]
    fn same_process_ignores_comm_only() {
        let proc = FakeProc::new().with(20, "agent", 1);
        let id = proc.root().capture(20).unwrap();
        assert!(id.same_process(&Identity {
            comm: "after-exec".into(),
            ..id.clone()
        }));
        assert!(!id.same_process(&Identity {
            start_ticks: 2,
            ..id.clone()
        }));
        assert!(!id.same_process(&Identity {
            boot_id: "b".into(),
            ..id.clone()
        }));
        assert!(
            id.same_process(&Identity {
                host: "h".into(),
                ..id.clone()
            }),
            "the host name is a label"
        );
        let with_ino = Identity {
            pidfs_ino: Some(7),
            ..id.clone()
        };
        assert!(
            with_ino.same_process(&id),
            "an unknown inode does not differ"
        );
        assert!(!with_ino.same_process(&Identity {
            pidfs_ino: Some(8),
            ..id.clone()
        }));
    }

    #[test]
    fn pids_of_a_client_in_a_child_namespace_are_translated() {
        let proc = FakeProc::new()
            .with(100, "runc", 1)
            .with(200, "sh", 100)
            .with(201, "agent", 200)
            .with(300, "other", 1)
            .with(2, "kthreadd", 0);
        let dir = proc.path();
        let status = |pid: u32, nspid: &str| {
            let text = format!("Name:\tx\nTgid:\t{pid}\nNSpid:\t{nspid}\n");
            std::fs::write(dir.join(format!("{pid}/status")), text).unwrap();
        };
        status(200, "200\t1");
        status(201, "201\t2");
        // Pid 2 of a sibling container: same depth, another namespace.
        status(300, "300\t2");
        let ns = |pid: &str, link_to: Option<&str>| {
            std::fs::create_dir_all(dir.join(pid).join("ns")).unwrap();
            let path = dir.join(pid).join("ns/pid");
            match link_to {
                None => std::fs::write(path, "").unwrap(),
                Some(other) => std::fs::hard_link(dir.join(other).join("ns/pid"), path).unwrap(),
            }
        };
        ns("self", None);
        ns("1", Some("self"));
        ns("100", Some("self"));
        ns("2", Some("self"));
        ns("200", None);
        ns("201", Some("200"));
        ns("300", None);
        let root = proc.root();
        assert_eq!(
            root.translate_pid(201, 2).unwrap(),
            201,
            "not the host's pid 2"
        );
        assert_eq!(root.translate_pid(201, 1).unwrap(), 200);
        assert_eq!(
            root.translate_pid(100, 2).unwrap(),
            2,
            "same namespace: as is"
        );
        assert!(matches!(
            root.translate_pid(201, 7),
            Err(IdentityError::NotInCallerNamespace { pid: 7 })
        ));
        assert!(matches!(
            root.translate_pid(0, 2),
            Err(IdentityError::NotVisible)
        ));
        assert_eq!(root.pid_seen_by(201, 201), Some(2));
        assert_eq!(root.pid_seen_by(201, 100), None, "outside the container");
        assert_eq!(root.pid_seen_by(100, 201), Some(201));
    }

    #[test]
    fn kernel_threads_are_refused() {
        let mut line = stat_line(2, "kthreadd", 'S', 0, 0);
        // Field 9 (flags) is the seventh after the comm.
        let fields: Vec<&str> = line.split(' ').collect();
        let mut fields: Vec<String> = fields.iter().map(|f| (*f).to_owned()).collect();
        fields[8] = (PF_KTHREAD | 0x40).to_string();
        line = fields.join(" ");
        let proc = FakeProc::new().with_raw(2, line.as_bytes());
        assert!(proc.root().stat(2).unwrap().is_kernel_thread());
        assert!(matches!(
            proc.root().capture(2),
            Err(IdentityError::KernelThread { pid: 2, .. })
        ));
    }

    #[test]
    fn start_times_are_normalised_by_the_readers_time_namespace() {
        let proc = FakeProc::new().with(20, "agent", 1);
        std::fs::create_dir_all(proc.path().join("self")).unwrap();
        std::fs::write(
            proc.path().join("self/timens_offsets"),
            "monotonic 0 0\nboottime 1000 0\n",
        )
        .unwrap();
        // The fake stat says 1020 ticks; read in a namespace 1000 s ahead it would say
        // 101020, which must mean the same process.
        std::fs::write(
            proc.path().join("20/stat"),
            stat_line(20, "agent", 'S', 1, 1020 + 100_000),
        )
        .unwrap();
        let root = proc.root();
        assert_eq!(root.capture(20).unwrap().start_ticks, 1020);

        std::fs::write(
            proc.path().join("self/timens_offsets"),
            "boottime 0 5000000\n",
        )
        .unwrap();
        let ambiguous = proc.root();
        assert!(matches!(
            ambiguous.capture(20),
            Err(IdentityError::AmbiguousStartTime {
                offset_nanos: 5_000_000
            })
        ));
        // Read here, the start time is 101020: a tick off is no proof of reuse, two are.
        let key = |start_ticks| ProcessKey {
            pid: 20,
            start_ticks,
        };
        assert!(matches!(
            ambiguous.check_key(key(101_019)),
            Liveness::Unknown(_)
        ));
        assert_eq!(ambiguous.check_key(key(101_020)), Liveness::Alive);
        assert_eq!(
            ambiguous.check_key(key(101_018)),
            Liveness::Dead(DeathReason::PidReused)
        );
    }

    #[test]
    fn resolve_owner_skips_scripts_run_by_a_shell() {
        let proc = FakeProc::new()
            .with(30, "agent", 1)
            .with(31, "session-start.s", 30)
            .with(32, "liveness", 31);
        std::os::unix::fs::symlink("/usr/bin/dash", proc.path().join("31/exe")).unwrap();
        std::os::unix::fs::symlink("/usr/bin/python3.11", proc.path().join("30/exe")).unwrap();
        assert_eq!(proc.root().resolve_owner(32, &[]).unwrap().pid, 30);
        assert_eq!(proc.root().program_name(31).as_deref(), Some("dash"));
        assert_eq!(
            proc.root().program_name(32),
            None,
            "no exe link: judged by comm alone"
        );
    }

    #[test]
    fn arguments_past_the_bound_are_cut_and_say_so() {
        let proc = FakeProc::new().with(40, "big", 1).with(41, "small", 1);
        let long = "y".repeat(MAX_CMDLINE_BYTES);
        std::fs::write(
            proc.path().join("40/cmdline"),
            format!("prog\0{long}\0more\0"),
        )
        .unwrap();
        std::fs::write(proc.path().join("41/cmdline"), b"prog\0arg\0").unwrap();
        let cut = proc.root().cmdline(40).unwrap();
        assert_eq!(cut.len(), 2, "the argument past the bound is not read");
        assert_eq!(cut[0], "prog");
        assert!(cut[1].ends_with('…'), "the cut argument says so");
        assert_eq!(
            cut.join("\0").trim_end_matches('…').len(),
            MAX_CMDLINE_BYTES,
            "exactly the bound is read"
        );
        assert_eq!(proc.root().cmdline(41).unwrap(), ["prog", "arg"]);
    }

    #[test]
    fn resolve_owner_knows_shells_that_are_busybox() {
        let proc = FakeProc::new()
            .with(30, "agent", 1)
            .with(31, "session-start.s", 30)
            .with(32, "liveness", 31)
            .with(33, "not-a-shell", 1);
        for pid in [31, 33] {
            std::os::unix::fs::symlink("/bin/busybox", proc.path().join(format!("{pid}/exe")))
                .unwrap();
        }
        // The kernel runs `#!/bin/sh` scripts as `/bin/sh SCRIPT`.
        std::fs::write(
            proc.path().join("31/cmdline"),
            b"/bin/sh\0/hooks/session-start.sh\0",
        )
        .unwrap();
        std::fs::write(proc.path().join("33/cmdline"), b"/bin/busybox\0httpd\0").unwrap();
        assert_eq!(proc.root().program_name(31).as_deref(), Some("sh"));
        assert_eq!(proc.root().resolve_owner(32, &[]).unwrap().pid, 30);
        assert_eq!(
            proc.root().program_name(33).as_deref(),
            Some("busybox"),
            "busybox called by its own name is no shell"
        );
    }

    #[test]
    fn resolve_owner_skips_shells_and_wrappers() {
        let proc = FakeProc::new()
            .with(30, "agent", 1)
            .with(31, "wrap", 30)
            .with(32, "bash", 31)
            .with(33, "env", 32)
            .with(34, "sh", 33);
        let root = proc.root();
        assert_eq!(root.resolve_owner(34, &[]).unwrap().pid, 31);
        assert_eq!(root.resolve_owner(34, &["wrap".into()]).unwrap().pid, 30);
        assert_eq!(
            root.resolve_owner(30, &[]).unwrap().pid,
            30,
            "a non-shell owns itself"
        );
    }

    #[test]
    fn resolve_owner_refuses_to_guess() {
        let to_init = FakeProc::new().with(40, "bash", 1);
        assert!(matches!(
            to_init.root().resolve_owner(40, &[]),
            Err(IdentityError::NoOwner { .. })
        ));

        let to_reaper = FakeProc::new().with(50, "systemd", 1).with(51, "sh", 50);
        assert!(matches!(
            to_reaper.root().resolve_owner(51, &[]),
            Err(IdentityError::NoOwner { .. })
        ));

        let mut deep = FakeProc::new().with(100, "agent", 1);
        for pid in 101..=100 + MAX_RESOLVE_DEPTH as u32 {
            deep = deep.with(pid, "sh", pid - 1);
        }
        let top = 100 + MAX_RESOLVE_DEPTH as u32;
        assert!(matches!(
            deep.root().resolve_owner(top, &[]),
            Err(IdentityError::NoOwner { .. })
        ));
        assert_eq!(
            deep.root().resolve_owner(top - 1, &[]).unwrap().pid,
            100,
            "16 levels suffice"
        );

        let broken = FakeProc::new().with(60, "sh", 61);
        assert!(matches!(
            broken.root().resolve_owner(60, &[]),
            Err(IdentityError::NoSuchProcess(61))
        ));
    }
}
