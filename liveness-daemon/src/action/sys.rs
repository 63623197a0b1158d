//! The system calls of running an action, in one place: the steps the child takes between
//! `fork` and `exec`, and the descriptors the parent prepares.
//!
//! Everything the child needs is computed before the fork ([`ChildSetup`]); after it, the
//! child makes only raw system calls on that data and allocates nothing, so a fork from
//! the daemon's many threads cannot deadlock on a lock another thread held.

use std::ffi::{CStr, CString};
use std::fmt;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};

use rustix::fs::{MemfdFlags, SeekFrom};
use rustix::io::Errno;
use rustix::pipe::PipeFlags;
use rustix::process::{Gid, Uid};
use rustix::thread::{CapabilitySet, CapabilitySets};

/// The ids a child takes on before it runs the action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// One step of the child's setup, reported to the parent when it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    Session = 1,
    Groups,
    Gid,
    Uid,
    Keyring,
    Capabilities,
    NoNewPrivs,
    Subreaper,
    Directory,
    Descriptors,
    Released,
    Exec,
}

impl Step {
    const ALL: [Step; 12] = [
        Step::Session,
        Step::Groups,
        Step::Gid,
        Step::Uid,
        Step::Keyring,
        Step::Capabilities,
        Step::NoNewPrivs,
        Step::Subreaper,
        Step::Directory,
        Step::Descriptors,
        Step::Released,
        Step::Exec,
    ];

    fn from_byte(byte: u8) -> Option<Step> {
        Step::ALL.into_iter().find(|step| *step as u8 == byte)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Session => "start a session of its own",
            Step::Groups => "set its supplementary groups",
            Step::Gid => "set its group id",
            Step::Uid => "set its user id",
            Step::Keyring => "join a session keyring of its own",
            Step::Capabilities => "drop its capabilities",
            Step::NoNewPrivs => "set no_new_privs",
            Step::Subreaper => "become the subreaper of its tree",
            Step::Directory => "enter its working directory",
            Step::Descriptors => "close the daemon's descriptors",
            Step::Released => "be released by the daemon, which did not record it first",
            Step::Exec => "execute its program",
        })
    }
}

/// `CLOSE_RANGE_CLOEXEC` (Linux 5.11): mark the range close-on-exec instead of closing it.
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
/// The capability numbers the kernel may know: dropping one it does not know is EINVAL.
const CAPABILITY_NUMBERS: libc::c_ulong = 64;

/// `KEYCTL_JOIN_SESSION_KEYRING` of keyctl(2).
const KEYCTL_JOIN_SESSION_KEYRING: libc::c_ulong = 1;

/// What the child does between `fork` and `exec`, prepared by the parent.
#[derive(Debug)]
pub struct ChildSetup {
    /// `None`: keep the daemon's ids (a per-user daemon runs actions as itself).
    ids: Option<(Uid, Gid, Vec<Gid>)>,
    cwd: CString,
    /// The fault point `action-stopped-before-exec`: the child stops itself right after
    /// taking on the user's ids, as the user may stop it there (debug builds only).
    stop_after_uid: bool,
    /// The fault point `action-child-lingers`: the child waits a second before it closes
    /// the daemon's descriptors, as one not yet scheduled would (debug builds only).
    linger: bool,
}

impl ChildSetup {
    pub fn new(ids: Option<&Ids>, cwd: CString) -> ChildSetup {
        let ids = ids.map(|ids| {
            (
                Uid::from_raw(ids.uid),
                Gid::from_raw(ids.gid),
                ids.groups.iter().copied().map(Gid::from_raw).collect(),
            )
        });
        ChildSetup {
            ids,
            cwd,
            stop_after_uid: crate::faults::armed("action-stopped-before-exec"),
            linger: crate::faults::armed("action-child-lingers"),
        }
    }

    /// Waits a second if the fault point `action-child-lingers` is armed. Async-signal-safe:
    /// the child calls it between fork and exec.
    pub fn linger(&self) {
        if self.linger {
            let second = libc::timespec {
                tv_sec: 1,
                tv_nsec: 0,
            };
            // SAFETY: nanosleep(2) is async-signal-safe; the timespec is on the stack.
            unsafe { libc::nanosleep(&second, std::ptr::null_mut()) };
        }
    }

    /// Runs every step in the child, in order: a session of its own (so no controlling
    /// terminal and its own process group), default signal dispositions and umask 022, the
    /// capability bounding and ambient sets emptied where permitted, the ids, a session
    /// keyring of its own (made as the user, as `pam_keyinit` does, so that it reads none of
    /// the daemon's keys and leaves none for another action), the other capability sets
    /// emptied, `no_new_privs`, subreaper of its tree, the working directory (entered as the
    /// user, so a directory the user cannot enter fails), and every descriptor above stderr
    /// marked close-on-exec. A failed step is written to `report`.
    ///
    /// # Safety
    ///
    /// Only in the child between `fork` and `exec`: it makes only async-signal-safe system
    /// calls and allocates nothing.
    pub unsafe fn apply(&self, report: BorrowedFd<'_>) -> Result<(), ()> {
        let step = |step, call: &mut dyn FnMut() -> rustix::io::Result<()>| {
            call().map_err(|errno| report_step(report, step, errno.raw_os_error()))
        };
        step(Step::Session, &mut || rustix::process::setsid().map(drop))?;
        for signal in 1..=libc::SIGRTMAX() {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                // SAFETY: signal(2) with SIG_DFL is async-signal-safe; numbers the C library
                // keeps for itself are refused, which is harmless.
                unsafe { libc::signal(signal, libc::SIG_DFL) };
            }
        }
        rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
        // Dropping from the bounding set needs CAP_SETPCAP: a daemon without it cannot, and
        // its bounding set is then no wider than what it could pass on anyway.
        for capability in 0..CAPABILITY_NUMBERS {
            // SAFETY: prctl(PR_CAPBSET_DROP) is a plain system call.
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, capability, 0, 0, 0) } != 0
                && Errno::from_raw_os_error(errno()) == Errno::PERM
            {
                break;
            }
        }
        // EINVAL before Linux 4.3, which has no ambient set.
        let _ = rustix::thread::clear_ambient_capability_set();
        if let Some((uid, gid, groups)) = &self.ids {
            // The thread calls change the whole process: after the fork it has one thread.
            step(Step::Groups, &mut || {
                rustix::thread::set_thread_groups(groups)
            })?;
            step(Step::Gid, &mut || {
                rustix::thread::set_thread_res_gid(*gid, *gid, *gid)
            })?;
            step(Step::Uid, &mut || {
                rustix::thread::set_thread_res_uid(*uid, *uid, *uid)
            })?;
        }
        if self.stop_after_uid {
            // SAFETY: raise(3) is async-signal-safe; the child has one thread, so it stops.
            let _ = unsafe { libc::raise(libc::SIGSTOP) };
        }
        step(Step::Keyring, &mut join_session_keyring)?;
        step(Step::Capabilities, &mut || {
            rustix::thread::set_capabilities(
                None,
                CapabilitySets {
                    effective: CapabilitySet::empty(),
                    permitted: CapabilitySet::empty(),
                    inheritable: CapabilitySet::empty(),
                },
            )
        })?;
        step(Step::NoNewPrivs, &mut || {
            rustix::thread::set_no_new_privs(true)
        })?;
        step(Step::Subreaper, &mut || {
            rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        })?;
        step(Step::Directory, &mut || {
            rustix::process::chdir(self.cwd.as_c_str())
        })?;
        step(Step::Descriptors, &mut mark_cloexec_above_stderr)
    }
}

/// Writes the failed `step` and its errno to `report`, for the parent: five bytes, one
/// atomic write (best effort: the parent takes a child gone silent for a failure too).
pub fn report_step(report: BorrowedFd<'_>, step: Step, errno: i32) {
    let mut message = [0u8; 5];
    message[0] = step as u8;
    message[1..].copy_from_slice(&errno.to_le_bytes());
    let _ = rustix::io::write(report, &message);
}

/// A report read from the child: the step that failed and its errno.
pub fn parse_report(message: &[u8]) -> Option<(Step, io::Error)> {
    let step = Step::from_byte(*message.first()?)?;
    let errno = i32::from_le_bytes(message.get(1..5)?.try_into().ok()?);
    Some((step, io::Error::from_raw_os_error(errno)))
}

/// Joins a new anonymous session keyring, owned by the caller's ids (a kernel without
/// keys has no keyring to share: nothing to do there).
fn join_session_keyring() -> rustix::io::Result<()> {
    // SAFETY: keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL) reads no memory of ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_JOIN_SESSION_KEYRING,
            std::ptr::null::<libc::c_char>(),
        )
    };
    match rc {
        0.. => Ok(()),
        _ if errno() == libc::ENOSYS => Ok(()),
        _ => Err(Errno::from_raw_os_error(errno())),
    }
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Marks every descriptor above stderr close-on-exec, so the action gets none of the
/// daemon's, whatever flags they were opened with. Marking rather than closing keeps the
/// report pipe working until the exec.
fn mark_cloexec_above_stderr() -> rustix::io::Result<()> {
    // SAFETY: close_range only changes descriptor flags here.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    // Before Linux 5.11: every possible descriptor, one call each.
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1 << 20)
        .min(1 << 20);
    for fd in 3..limit as RawFd {
        // SAFETY: fcntl on a number that may or may not be open: EBADF when it is not.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        // SAFETY: as above, on an open descriptor.
        if flags >= 0 && unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
            return Err(Errno::from_raw_os_error(errno()));
        }
    }
    Ok(())
}

/// An anonymous file holding `bytes`, positioned at its start: an action's stdin, which it
/// may read at its own pace (or not at all) without ever blocking the daemon.
pub fn memfd_with(name: &CStr, bytes: &[u8]) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC)?;
    let mut written = 0;
    while written < bytes.len() {
        written += rustix::io::write(&fd, &bytes[written..])?;
    }
    rustix::fs::seek(&fd, SeekFrom::Start(0))?;
    Ok(fd)
}

/// A pipe for an action's stderr: the read end non-blocking for the daemon, the write end
/// for the child (the spawn makes it descriptor 2, without close-on-exec).
pub fn stderr_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?;
    rustix::io::ioctl_fionbio(&read, true)?;
    Ok((read, write))
}

/// Reads what is there without blocking: `Ok(0)` at the end, `WouldBlock` when empty.
pub fn read_some(fd: &OwnedFd, buffer: &mut [u8]) -> io::Result<usize> {
    Ok(rustix::io::read(fd, buffer)?)
}
