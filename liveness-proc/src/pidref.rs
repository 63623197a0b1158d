//! One handle on one process, as systemd's `PidRef`: its pid, start time and pidfs inode,
//! and a pidfd opened *before* they were verified.
//!
//! Pid reuse is the project's core correctness risk: a pid names whichever process holds it
//! now. A pidfd names the process that held the pid when it was opened, for ever; so a
//! pidfd opened first and a start time read after, equal to the one expected, prove that
//! the pidfd names the expected process (and, where the kernel has pidfs, its inode proves
//! it even within one clock tick). Every signal, wait, exit status and liveness check of the
//! daemon goes through a [`PidRef`], so "a signal goes only through a verified pidfd" is a
//! property of the type; the bare pidfd calls under it are in [`crate::pidfd`].

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::io::Errno;
use rustix::ioctl::{Opcode, Updater, opcode};
use rustix::process::{Signal, WaitId, WaitIdOptions};

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
            pidfd,
        })
    }

    /// A child of this process that it has not reaped: its pid cannot pass to another
    /// process before the reap, so the pidfd is its child's whatever is read after.
    pub fn of_child(proc: &ProcRoot, pid: u32) -> Result<PidRef, PidRefError> {
        let pidfd = open_pidfd(pid).map_err(|errno| PidRefError::Open { pid, errno })?;
        let start_ticks = proc
            .stat(pid)
            .map_err(|source| PidRefError::Unverified { pid, source })?
            .start_ticks;
        Ok(PidRef {
            key: ProcessKey { pid, start_ticks },
            pidfs_ino: pidfs_ino(pidfd.as_fd()),
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
