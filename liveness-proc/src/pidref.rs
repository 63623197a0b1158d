//! One handle on one process, as systemd's `PidRef`: its pid, start time and pidfs inode,
//! and a pidfd opened *before* they were verified.
//!
//! Pid reuse is the project's core correctness risk: a pid names whichever process holds it
//! now. A pidfd names the process that held the pid when it was opened, for ever; so a
//! pidfd opened first and a start time read after, equal to the one expected, prove that
//! the pidfd names the expected process (and, where the kernel has pidfs, its inode proves
//! it even within one clock tick). Every signal, wait, exit status and liveness check of the
//! daemon goes through a [`PidRef`], so "a signal goes only through a verified pidfd" is a
//! property of the type; the bare pidfd calls under it are in [`crate::pidfd`]. The one
//! exception is one's own child before its reap, whose pid cannot pass to another process
//! meanwhile: an [`UnreapedChild`], which needs no pidfd.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::io::Errno;
use rustix::ioctl::{Opcode, Updater, opcode};
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions, WaitOptions};

use liveness_common::exit::ExitStatus;
use liveness_common::identity::ProcessKey;

use crate::identity::{IdentityError, ProcRoot};
use crate::pidfd::{open_pidfd, pidfd_exited, pidfs_ino};

/// Why a process could not be referenced.
#[derive(Debug, thiserror::Error)]
pub enum PidRefError {
    /// It has exited, or its pid now names another process.
    #[error("process {0} is gone (it exited, or its pid now names another process)")]
    Gone(ProcessKey),
    #[error("cannot open a pidfd for pid {pid}: {errno}")]
    Open { pid: u32, errno: Errno },
    #[error("cannot verify that pid {pid} is the process expected: {source}")]
    Unverified { pid: u32, source: IdentityError },
}

/// A process, held by a pidfd proven to name it.
///
/// Invariant: `pidfd` was opened before `key.start_ticks` (and `pidfs_ino`, when known)
/// were found to be its process's, so it names that process and no other, whatever its pid
/// names later.
pub struct PidRef {
    key: ProcessKey,
    pidfs_ino: Option<u64>,
    kernel_thread: bool,
    pidfd: OwnedFd,
}

impl PidRef {
    /// Opens the process `key` names: a pidfd first, then its start time read and compared,
    /// its inode compared with `known_ino` where that is known, and the pidfd checked to
    /// show it still running (a zombie's pid may pass on as soon as it is reaped).
    pub fn open(
        proc: &ProcRoot,
        key: ProcessKey,
        known_ino: Option<u64>,
    ) -> Result<PidRef, PidRefError> {
        let pidfd = open_pidfd(key.pid).map_err(|errno| match errno {
            Errno::SRCH => PidRefError::Gone(key),
            errno => PidRefError::Open {
                pid: key.pid,
                errno,
            },
        })?;
        let stat = match proc.stat(key.pid) {
            Ok(stat) => stat,
            Err(IdentityError::NoSuchProcess(_)) => return Err(PidRefError::Gone(key)),
            Err(source) => {
                return Err(PidRefError::Unverified {
                    pid: key.pid,
                    source,
                });
            }
        };
        let now_ino = pidfs_ino(pidfd.as_fd());
        let inode_differs = known_ino.is_some_and(|known| now_ino.is_some_and(|now| now != known));
        if stat.start_ticks != key.start_ticks
            || stat.has_exited()
            || inode_differs
            || pidfd_exited(pidfd.as_fd())
        {
            return Err(PidRefError::Gone(key));
        }
        Ok(PidRef {
            key,
            pidfs_ino: now_ino,
            kernel_thread: stat.is_kernel_thread(),
            pidfd,
        })
    }

    /// A child of this process that it has not reaped: its pid cannot pass to another
    /// process before the reap, so the pidfd is its child's whatever is read after.
    pub fn of_child(proc: &ProcRoot, pid: u32) -> Result<PidRef, PidRefError> {
        let pidfd = open_pidfd(pid).map_err(|errno| PidRefError::Open { pid, errno })?;
        let stat = proc
            .stat(pid)
            .map_err(|source| PidRefError::Unverified { pid, source })?;
        Ok(PidRef {
            key: ProcessKey {
                pid,
                start_ticks: stat.start_ticks,
            },
            pidfs_ino: pidfs_ino(pidfd.as_fd()),
            kernel_thread: stat.is_kernel_thread(),
            pidfd,
        })
    }

    /// The process's pid and start time.
    pub fn key(&self) -> ProcessKey {
        self.key
    }

    pub fn pid(&self) -> u32 {
        self.key.pid
    }

    /// Its pidfs inode: `None` before Linux 6.9.
    pub fn pidfs_ino(&self) -> Option<u64> {
        self.pidfs_ino
    }

    /// Whether it is a kernel thread, which no signal ends.
    pub fn is_kernel_thread(&self) -> bool {
        self.kernel_thread
    }

    /// Whether it has exited (its last thread is gone; it may still be a zombie).
    pub fn has_exited(&self) -> bool {
        pidfd_exited(self.pidfd.as_fd())
    }

    /// Sends it `signal`: `Ok(false)` when it had exited already.
    pub fn signal(&self, signal: Signal) -> Result<bool, Errno> {
        match rustix::process::pidfd_send_signal(&self.pidfd, signal) {
            Ok(()) => Ok(true),
            Err(Errno::SRCH) => Ok(false),
            Err(errno) => Err(errno),
        }
    }

    /// Sends `signal` to the process group it leads (Linux 6.9+, `PIDFD_SIGNAL_PROCESS_GROUP`):
    /// the group the pidfd holds, even after its leader died, so a group that took the
    /// number since is never reached. `Ok(false)` on a kernel without it, or when the group
    /// has no member left.
    pub fn signal_group(&self, signal: Signal) -> Result<bool, Errno> {
        // SAFETY: pidfd_send_signal with no siginfo reads no memory of ours.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                signal.as_raw(),
                std::ptr::null::<libc::siginfo_t>(),
                PIDFD_SIGNAL_PROCESS_GROUP,
            )
        };
        match rc {
            0.. => Ok(true),
            _ => match Errno::from_raw_os_error(
                std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            ) {
                Errno::INVAL | Errno::SRCH => Ok(false),
                errno => Err(errno),
            },
        }
    }

    /// Another handle on the same process (a new descriptor of the same pidfd).
    pub fn try_clone(&self) -> std::io::Result<PidRef> {
        Ok(PidRef {
            key: self.key,
            pidfs_ino: self.pidfs_ino,
            kernel_thread: self.kernel_thread,
            pidfd: self.pidfd.try_clone()?,
        })
    }

    /// Reaps it, once it has exited, if it is this process's child: how it ended.
    pub fn reap(&self) -> std::io::Result<ExitStatus> {
        let status =
            rustix::process::waitid(WaitId::PidFd(self.pidfd.as_fd()), WaitIdOptions::EXITED)?
                .ok_or_else(|| std::io::Error::other("waitid returned no status"))?;
        match (status.exit_status(), status.terminating_signal()) {
            (Some(code), _) => Ok(ExitStatus::Exited { code: code as u8 }),
            (None, Some(signal)) => Ok(ExitStatus::Signaled {
                signal: signal as u8,
                core_dumped: status.dumped(),
            }),
            (None, None) => Err(std::io::Error::other(
                "waitid returned neither a code nor a signal",
            )),
        }
    }

    /// How it ended, when the kernel tells a pidfd holder that is not its parent:
    /// `PIDFD_INFO_EXIT` needs Linux 6.15, and the kernel records the status only when the
    /// process's parent reaps it, so before the reap the answer is `None`.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        let mut info = PidfdInfo {
            mask: PIDFD_INFO_EXIT,
            _cgroupid: 0,
            _ids: [0; 11],
            exit_code: 0,
        };
        // SAFETY: PIDFD_GET_INFO is the pidfd ioctl that takes a `struct pidfd_info`, and its
        // number encodes `size_of::<PidfdInfo>()`, which bounds what the kernel writes.
        let result = unsafe {
            rustix::ioctl::ioctl(
                &self.pidfd,
                Updater::<PIDFD_GET_INFO, PidfdInfo>::new(&mut info),
            )
        };
        match result {
            Ok(()) if info.mask & PIDFD_INFO_EXIT != 0 => {
                Some(ExitStatus::from_wait_status(info.exit_code as u32))
            }
            Ok(()) => None,
            // ENOTTY or EINVAL before Linux 6.13; ESRCH after the reap on 6.13 and 6.14.
            Err(e) => {
                tracing::debug!("PIDFD_GET_INFO gives no exit status: {e}");
                None
            }
        }
    }
}

/// A child of this process that it has not reaped: until the reap its pid names that child
/// and no other process, so it is signalled and reaped by number. That works where no
/// pidfd can be had (before Linux 5.3, under a seccomp filter that denies `pidfd_open`, out
/// of descriptors); a process that is not one's own unreaped child needs a [`PidRef`].
#[derive(Debug)]
pub struct UnreapedChild {
    pid: Pid,
}

impl UnreapedChild {
    /// `pid`, returned by this process's `fork` and reaped by nothing else: the caller's
    /// promise, on which signalling it by number rests. `None` for a number no pid has.
    pub fn new(pid: u32) -> Option<UnreapedChild> {
        let pid = i32::try_from(pid).ok().and_then(Pid::from_raw)?;
        Some(UnreapedChild { pid })
    }

    pub fn pid(&self) -> u32 {
        self.pid.as_raw_nonzero().get().unsigned_abs()
    }

    /// Sends it `signal` (a zombie takes it and stays as it is).
    pub fn signal(&self, signal: Signal) -> Result<(), Errno> {
        rustix::process::kill_process(self.pid, signal)
    }

    /// Reaps it, waiting for its exit: how it ended.
    pub fn reap(&self) -> std::io::Result<ExitStatus> {
        self.wait(WaitOptions::empty())?
            .ok_or_else(|| std::io::Error::other("waitpid returned no status"))
    }

    /// Reaps it if it has exited, without waiting: how it ended, or `None` while it runs.
    /// Once it returns a status the child is gone, and its pid free for another process.
    pub fn try_reap(&self) -> std::io::Result<Option<ExitStatus>> {
        self.wait(WaitOptions::NOHANG)
    }

    fn wait(&self, options: WaitOptions) -> std::io::Result<Option<ExitStatus>> {
        Ok(rustix::process::waitpid(Some(self.pid), options)?
            .map(|(_, status)| ExitStatus::from_wait_status(status.as_raw() as u32)))
    }
}

/// For epoll: a pidfd turns readable when its process exits.
impl AsFd for PidRef {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }
}

impl AsRawFd for PidRef {
    fn as_raw_fd(&self) -> RawFd {
        self.pidfd.as_raw_fd()
    }
}

impl fmt::Debug for PidRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PidRef")
            .field("key", &self.key)
            .field("pidfs_ino", &self.pidfs_ino)
            .field("pidfd", &self.pidfd.as_raw_fd())
            .finish()
    }
}

/// `struct pidfd_info` of `include/uapi/linux/pidfd.h` as first published (Linux 6.13,
/// `PIDFD_INFO_SIZE_VER0`), with `exit_code` in the spare slot since 6.15. Later kernels
/// append fields; the ioctl number carries our size and the kernel copies only that much,
/// so this prefix works on every kernel that has the ioctl.
#[repr(C)]
struct PidfdInfo {
    mask: u64,
    _cgroupid: u64,
    /// pid, tgid, ppid, then the real, effective, saved and fs uid/gid: unused here.
    _ids: [u32; 11],
    /// A `wait(2)` status word.
    exit_code: i32,
}

const _: () = assert!(size_of::<PidfdInfo>() == 64);
const _: () = assert!(std::mem::offset_of!(PidfdInfo, exit_code) == 60);

const PIDFD_INFO_EXIT: u64 = 1 << 3;
/// `PIDFD_SIGNAL_PROCESS_GROUP` of `include/uapi/linux/pidfd.h` (Linux 6.9).
const PIDFD_SIGNAL_PROCESS_GROUP: libc::c_uint = 1 << 2;
/// `_IOWR(PIDFS_IOCTL_MAGIC, 11, struct pidfd_info)`.
const PIDFD_GET_INFO: Opcode = opcode::read_write::<PidfdInfo>(0xFF, 11);

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::*;

    /// A sleeping child, and its key as `/proc` shows it.
    fn sleeper(proc: &ProcRoot) -> (std::process::Child, ProcessKey) {
        let child = Command::new("sleep")
            .arg("100")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let key = ProcessKey {
            pid,
            start_ticks: proc.stat(pid).unwrap().start_ticks,
        };
        (child, key)
    }

    #[test]
    fn opens_the_process_its_key_names_and_signals_it() {
        let proc = ProcRoot::default();
        let (mut child, key) = sleeper(&proc);
        let handle = PidRef::open(&proc, key, None).unwrap();
        assert_eq!(handle.key(), key);
        assert!(!handle.has_exited());
        assert_eq!(handle.signal(Signal::KILL), Ok(true));
        let _ = child.wait();
        assert!(handle.has_exited());
        assert_eq!(handle.signal(Signal::KILL), Ok(false));
    }

    #[test]
    fn another_start_time_or_inode_is_another_process() {
        let proc = ProcRoot::default();
        let (mut child, key) = sleeper(&proc);
        let earlier = ProcessKey {
            pid: key.pid,
            start_ticks: key.start_ticks.wrapping_sub(1),
        };
        assert!(matches!(
            PidRef::open(&proc, earlier, None),
            Err(PidRefError::Gone(_))
        ));
        if proc.has_pidfs() {
            let ino = PidRef::open(&proc, key, None).unwrap().pidfs_ino().unwrap();
            assert!(matches!(
                PidRef::open(&proc, key, Some(ino + 1)),
                Err(PidRefError::Gone(_))
            ));
        }
        child.kill().unwrap();
        let _ = child.wait();
        assert!(matches!(
            PidRef::open(&proc, key, None),
            Err(PidRefError::Gone(_))
        ));
    }

    #[test]
    fn a_child_is_reaped_through_its_handle() {
        let proc = ProcRoot::default();
        let child = Command::new("sh").args(["-c", "exit 7"]).spawn().unwrap();
        let handle = PidRef::of_child(&proc, child.id()).unwrap();
        while !handle.has_exited() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(handle.reap().unwrap(), ExitStatus::Exited { code: 7 });
        std::mem::forget(child);
    }

    #[test]
    fn an_unreaped_child_is_signalled_and_reaped_by_its_number() {
        let proc = ProcRoot::default();
        let (child, key) = sleeper(&proc);
        let watch = PidRef::open(&proc, key, None).unwrap();
        let unreaped = UnreapedChild::new(child.id()).unwrap();
        std::mem::forget(child);
        assert_eq!(unreaped.try_reap().unwrap(), None, "it still runs");
        unreaped.signal(Signal::KILL).unwrap();
        while !watch.has_exited() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(
            unreaped.try_reap().unwrap(),
            Some(ExitStatus::Signaled {
                signal: libc::SIGKILL as u8,
                core_dumped: false
            })
        );
        assert!(proc.stat(key.pid).is_err(), "reaped, not left a zombie");
        assert!(UnreapedChild::new(0).is_none());
    }

    /// The group a dead leader led is still reached through its pidfd, and only it.
    #[test]
    fn a_group_is_signalled_through_its_dead_leader() {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;

        let proc = ProcRoot::default();
        let mut leader = Command::new("sh")
            .args(["-c", "sleep 100 & echo $!; wait"])
            .process_group(0)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(leader.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let member_pid: u32 = line.trim().parse().unwrap();
        let member = PidRef::open(
            &proc,
            ProcessKey {
                pid: member_pid,
                start_ticks: proc.stat(member_pid).unwrap().start_ticks,
            },
            None,
        )
        .unwrap();
        let (mut outsider, _) = sleeper(&proc);
        let group = PidRef::of_child(&proc, leader.id()).unwrap();
        assert_eq!(group.signal(Signal::KILL), Ok(true));
        leader.wait().unwrap();
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let sent = group.signal_group(Signal::KILL).unwrap();
        if !sent {
            // Linux before 6.9 has no PIDFD_SIGNAL_PROCESS_GROUP.
            eprintln!("no process-group signal through a pidfd on Linux {release}");
            outsider.kill().unwrap();
            member.signal(Signal::KILL).unwrap();
            return;
        }
        let started = std::time::Instant::now();
        while !member.has_exited() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "the group's member outlived its group's SIGKILL"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(
            outsider.try_wait().unwrap(),
            None,
            "a process outside the group got it"
        );
        outsider.kill().unwrap();
        let _ = outsider.wait();
    }

    #[test]
    fn get_info_opcode_is_iowr_ff_11_of_64_bytes() {
        // _IOWR: direction 3 in bits 30-31, size in bits 16-29, type, then number.
        assert_eq!(PIDFD_GET_INFO, (3 << 30) | (64 << 16) | (0xFF << 8) | 11);
    }

    #[test]
    fn no_pid_is_refused() {
        assert_eq!(open_pidfd(0).unwrap_err(), Errno::SRCH);
        assert_eq!(open_pidfd(u32::MAX).unwrap_err(), Errno::SRCH);
    }
}
