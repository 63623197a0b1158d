//! The bare pidfd calls, under [`crate::pidref`] and the fingerprint reads of
//! [`crate::identity`]: opening one (the workspace's one `pidfd_open`), whether its process
//! has exited, and its pidfs inode.

use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags};

/// `PIDFS_MAGIC` in `include/uapi/linux/magic.h`: pidfds live in pidfs from Linux 6.9.
const PIDFS_MAGIC: u64 = 0x5049_4446;

/// A pidfd for `pid`, unverified: the workspace's one `pidfd_open(2)`. `ESRCH` also for a
/// number that is no pid. Callers that act on the process open a
/// [`PidRef`](crate::pidref::PidRef) instead; a bare pidfd serves to hold a pid still while
/// facts are read, or to be passed to the daemon.
pub fn open_pidfd(pid: u32) -> Result<OwnedFd, Errno> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or(Errno::SRCH)?;
    rustix::process::pidfd_open(pid, PidfdFlags::empty())
}

/// Whether the process behind a pidfd has exited (the pidfd polls readable then).
pub fn pidfd_exited(pidfd: BorrowedFd<'_>) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &pidfd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match rustix::event::poll(&mut fds, Some(&zero)) {
        Ok(0) => false,
        // Readable, or an error we cannot see past: treat as gone rather than bind it.
        _ => true,
    }
}

/// The pidfs inode of a pidfd: `None` before Linux 6.9, where pidfds are anonymous inodes
/// that all share one number.
pub fn pidfs_ino(pidfd: BorrowedFd<'_>) -> Option<u64> {
    let fs = rustix::fs::fstatfs(pidfd).ok()?;
    if fs.f_type as u64 != PIDFS_MAGIC {
        return None;
    }
    Some(rustix::fs::fstat(pidfd).ok()?.st_ino)
}
