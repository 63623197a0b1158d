//! The reaper: terminates what is left of an ended session's processes.
//!
//! Every target is a fingerprint, and is signalled only through a pidfd verified against
//! it: the pidfd is opened first, then the process's start time (and, where the kernel has
//! it, its pidfs inode) is compared, then the pidfd is checked to still show the process
//! running. A pid that passed to another process since the fingerprint was taken therefore
//! never receives a signal. Pid 1 and the daemon itself are never signalled, and a
//! non-root session's processes are signalled only where its uid could signal them itself.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, Signal};
use tokio::time::Instant;

use liveness_common::identity::Identity;
use liveness_common::session::{ReapFailure, Reaped};
use liveness_proc::identity::{IdentityError, ProcRoot, pidfd_exited, pidfs_ino};

use crate::source::pidfd::register_readable;

/// How long SIGKILLed processes have to vanish before they are reported as failed: a
/// process in uninterruptible sleep dies only once it wakes.
pub(crate) const KILL_WAIT: Duration = Duration::from_secs(5);

/// Why a process was not ended.
#[derive(Debug, thiserror::Error)]
pub enum ReapError {
    #[error("pid 1 (init) is never signalled")]
    Init,
    #[error("the daemon itself is never signalled")]
    Daemon,
    #[error("a kernel thread is never signalled")]
    KernelThread,
    #[error(
        "it runs as uid {owner}, which the session's uid {uid} may not signal (kill(2) rules); \
         it was left running: end it as root or as its user"
    )]
    NotPermitted { uid: u32, owner: u32 },
    #[error("cannot open a pidfd for it: {0}")]
    Pidfd(Errno),
    #[error("cannot read its facts: {0}")]
    Proc(#[from] IdentityError),
    #[error("cannot send it {signal}: {errno}")]
    Signal { signal: &'static str, errno: Errno },
    #[error("still running {0:?} after SIGKILL (in uninterruptible sleep?)")]
    Unkillable(Duration),
}

/// Ends processes by policy. Cheap to clone: each reap runs in a task of its own.
#[derive(Debug, Clone)]
pub struct Reaper {
    proc: ProcRoot,
    own_pid: u32,
}

/// A process that received a signal, with the pidfd that shows when it is gone.
pub(crate) type Signalled = (u32, OwnedFd);

impl Reaper {
    pub fn new(proc: ProcRoot) -> Reaper {
        Reaper {
            proc,
            own_pid: std::process::id(),
        }
    }

    /// Sends SIGTERM to every target that is still the process its fingerprint names and
    /// that a session of `uid` may signal, waits up to `grace` for them to exit, SIGKILLs
    /// the rest, and says what became of each.
    pub async fn reap(&self, targets: &[Identity], uid: u32, grace: Duration) -> Reaped {
        let mut reaped = Reaped::default();
        let mut terminating = Vec::new();
        for target in targets {
            let signalled = self
                .verified_pidfd(target, uid)
                .and_then(|pidfd| pidfd.map(|pidfd| signal(pidfd, Signal::TERM)).transpose());
            match signalled.map(Option::flatten) {
                Ok(Some(pidfd)) => terminating.push((target.pid, pidfd)),
                Ok(None) => reaped.exited.push(target.pid),
                Err(e) => reaped.failed.push(failure(target.pid, e)),
            }
        }
        let (terminated, running) = wait_for_exits(terminating, Instant::now() + grace).await;
        reaped.terminated = terminated;
        let mut killing = Vec::new();
        for (pid, pidfd) in running {
            match signal(pidfd, Signal::KILL) {
                Ok(Some(pidfd)) => killing.push((pid, pidfd)),
                // It exited between the end of the grace and the SIGKILL.
                Ok(None) => reaped.terminated.push(pid),
                Err(e) => reaped.failed.push(failure(pid, e)),
            }
        }
        let (killed, unkillable) = wait_for_exits(killing, Instant::now() + KILL_WAIT).await;
        reaped.killed = killed;
        reaped.failed.extend(
            unkillable
                .into_iter()
                .map(|(pid, _)| failure(pid, ReapError::Unkillable(KILL_WAIT))),
        );
        reaped
    }

    /// A pidfd of the process `target` names, or `None` when that process has exited
    /// (whatever now has its pid).
    fn verified_pidfd(&self, target: &Identity, uid: u32) -> Result<Option<OwnedFd>, ReapError> {
        if target.pid == 1 {
            return Err(ReapError::Init);
        }
        if target.pid == self.own_pid {
            return Err(ReapError::Daemon);
        }
        let Some(pid) = i32::try_from(target.pid).ok().and_then(Pid::from_raw) else {
            return Err(IdentityError::NoSuchProcess(target.pid).into());
        };
        // Opened before anything is read: while it shows the process running afterwards,
        // the pid cannot have passed to another process in between.
        let pidfd = match rustix::process::pidfd_open(pid, PidfdFlags::empty()) {
            Ok(pidfd) => pidfd,
            Err(Errno::SRCH) => return Ok(None),
            Err(e) => return Err(ReapError::Pidfd(e)),
        };
        let gone = |e: &IdentityError| matches!(e, IdentityError::NoSuchProcess(_));
        let stat = match self.proc.stat(target.pid) {
            Err(e) if gone(&e) => return Ok(None),
            other => other?,
        };
        let inode_differs = target
            .pidfs_ino
            .is_some_and(|known| pidfs_ino(pidfd.as_fd()).is_some_and(|now| now != known));
        if stat.start_ticks != target.start_ticks || stat.has_exited() || inode_differs {
            return Ok(None);
        }
        if stat.is_kernel_thread() {
            return Err(ReapError::KernelThread);
        }
        if uid != 0 {
            let [real, saved] = match self.proc.signal_uids(target.pid) {
                Err(e) if gone(&e) => return Ok(None),
                other => other?,
            };
            if uid != real && uid != saved {
                return Err(ReapError::NotPermitted { uid, owner: real });
            }
        }
        // Checked after the reads: still running now, so they were this process's.
        if pidfd_exited(pidfd.as_fd()) {
            return Ok(None);
        }
        Ok(Some(pidfd))
    }
}

fn failure(pid: u32, error: ReapError) -> ReapFailure {
    tracing::warn!(pid, %error, "a session's process was not ended");
    ReapFailure {
        pid,
        reason: error.to_string(),
    }
}

/// Sends `signal` through a verified pidfd; `None` when the process has exited meanwhile.
pub(crate) fn signal(pidfd: OwnedFd, signal: Signal) -> Result<Option<OwnedFd>, ReapError> {
    match rustix::process::pidfd_send_signal(&pidfd, signal) {
        Ok(()) => Ok(Some(pidfd)),
        Err(Errno::SRCH) => Ok(None),
        Err(errno) => Err(ReapError::Signal {
            signal: if signal == Signal::KILL {
                "SIGKILL"
            } else {
                "SIGTERM"
            },
            errno,
        }),
    }
}

/// Waits until `deadline` for the signalled processes to exit: returns those that did,
/// and those still running.
pub(crate) async fn wait_for_exits(
    signalled: Vec<Signalled>,
    deadline: Instant,
) -> (Vec<u32>, Vec<Signalled>) {
    let mut exited = Vec::new();
    let mut running = Vec::new();
    for (pid, pidfd) in signalled {
        // One deadline for all: waiting on each in turn takes no longer than the grace.
        let pidfd = match register_readable(pidfd) {
            Ok(watched) => {
                let _ = tokio::time::timeout_at(deadline, watched.readable()).await;
                watched.into_inner()
            }
            // No epoll watch to be had (fs.epoll.max_user_watches): look at the deadline.
            Err(e) => {
                let (pidfd, e) = e.into_parts();
                tracing::debug!(pid, error = %e, "cannot watch a pidfd; checking it at the deadline");
                tokio::time::sleep_until(deadline).await;
                pidfd
            }
        };
        if pidfd_exited(pidfd.as_fd()) {
            exited.push(pid);
        } else {
            running.push((pid, pidfd));
        }
    }
    (exited, running)
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    use super::*;
    use crate::source::testutil::{PATIENCE, Proc};

    fn reaper() -> Reaper {
        Reaper::new(ProcRoot::default())
    }

    fn identity(pid: u32) -> Identity {
        ProcRoot::default()
            .capture(pid)
            .unwrap_or_else(|e| panic!("cannot capture test process {pid}: {e}"))
    }

    /// Waits until the process runs `comm`: a shell has then set its traps and exec'd.
    fn wait_for_exec(pid: u32, comm: &str) {
        let started = std::time::Instant::now();
        while ProcRoot::default()
            .stat(pid)
            .map(|s| s.comm)
            .ok()
            .as_deref()
            != Some(comm)
        {
            assert!(
                started.elapsed() < PATIENCE,
                "process {pid} never ran {comm}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `sleep` with SIGTERM ignored: the disposition survives the exec.
    fn ignores_term() -> Proc {
        let proc = Proc::sh("trap '' TERM; exec sleep 1000", &[]);
        wait_for_exec(proc.pid(), "sleep");
        proc
    }

    fn still_running(proc: &mut Proc) -> bool {
        proc.0.try_wait().expect("try_wait").is_none()
    }

    fn signal_of(proc: &mut Proc) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        proc.reap().signal()
    }

    #[tokio::test]
    async fn sigterm_ends_a_process_that_heeds_it() {
        let mut heeds = Proc::sleeper();
        let reaped = reaper().reap(&[identity(heeds.pid())], 0, PATIENCE).await;
        assert_eq!(
            reaped,
            Reaped {
                terminated: vec![heeds.pid()],
                ..Reaped::default()
            }
        );
        assert_eq!(signal_of(&mut heeds), Some(libc::SIGTERM));
    }

    #[tokio::test]
    async fn a_process_that_ignores_sigterm_is_killed_after_the_grace() {
        let mut ignores = ignores_term();
        let mut heeds = Proc::sleeper();
        let targets = [identity(ignores.pid()), identity(heeds.pid())];
        let reaped = reaper().reap(&targets, 0, Duration::from_millis(300)).await;
        assert_eq!(reaped.killed, vec![ignores.pid()], "{reaped:?}");
        assert_eq!(reaped.terminated, vec![heeds.pid()], "{reaped:?}");
        assert!(reaped.failed.is_empty(), "{reaped:?}");
        assert_eq!(signal_of(&mut ignores), Some(libc::SIGKILL));
        assert_eq!(signal_of(&mut heeds), Some(libc::SIGTERM));
    }

    #[tokio::test]
    async fn a_pid_whose_start_time_differs_is_left_alone() {
        let mut bystander = Proc::sleeper();
        let stale = Identity {
            start_ticks: identity(bystander.pid()).start_ticks - 1,
            pidfs_ino: None,
            ..identity(bystander.pid())
        };
        let reaped = reaper().reap(&[stale], 0, PATIENCE).await;
        assert_eq!(
            reaped,
            Reaped {
                exited: vec![bystander.pid()],
                ..Reaped::default()
            },
            "the fingerprint's process is gone; the pid's new process is not it"
        );
        assert!(still_running(&mut bystander), "the bystander was signalled");
    }

    #[tokio::test]
    async fn a_pid_whose_pidfs_inode_differs_is_left_alone() {
        let mut bystander = Proc::sleeper();
        let live = identity(bystander.pid());
        let Some(ino) = live.pidfs_ino else {
            eprintln!("skipped: this kernel has no pidfs inodes (before 6.9)");
            return;
        };
        let other = Identity {
            pidfs_ino: Some(ino + 1),
            ..live
        };
        let reaped = reaper().reap(&[other], 0, PATIENCE).await;
        assert_eq!(reaped.exited, vec![bystander.pid()], "{reaped:?}");
        assert!(still_running(&mut bystander), "the bystander was signalled");
    }

    #[tokio::test]
    async fn pid_1_and_the_daemon_are_refused() {
        let init = identity(1);
        let daemon = identity(std::process::id());
        let reaped = reaper()
            .reap(&[init, daemon], 0, Duration::from_millis(1))
            .await;
        let reasons: Vec<(u32, &str)> = reaped
            .failed
            .iter()
            .map(|f| (f.pid, f.reason.as_str()))
            .collect();
        assert_eq!(
            reasons,
            [
                (1, "pid 1 (init) is never signalled"),
                (std::process::id(), "the daemon itself is never signalled"),
            ],
            "{reaped:?}"
        );
        assert!(reaped.terminated.is_empty() && reaped.killed.is_empty());
    }

    #[tokio::test]
    async fn a_session_uid_signals_only_what_it_could_signal_itself() {
        let me = rustix::process::getuid().as_raw();
        let stranger = if me == 4242 { 4243 } else { 4242 };
        let mut not_theirs = Proc::sleeper();
        let reaped = reaper()
            .reap(&[identity(not_theirs.pid())], stranger, PATIENCE)
            .await;
        let [refused] = &reaped.failed[..] else {
            panic!("the process of uid {me} must be refused to uid {stranger}: {reaped:?}");
        };
        assert_eq!(refused.pid, not_theirs.pid());
        assert!(
            refused.reason.contains(&format!("uid {me}")),
            "{}",
            refused.reason
        );
        assert!(
            still_running(&mut not_theirs),
            "the refused process was signalled"
        );

        // Root runs the permitted case as another user; anyone else as itself.
        let (uid, mut theirs) = if me == 0 {
            let mut command = Command::new("sleep");
            command.arg("1000").stdin(Stdio::null()).uid(65534);
            (65534, Proc::spawn(&mut command))
        } else {
            (me, Proc::sleeper())
        };
        let reaped = reaper()
            .reap(&[identity(theirs.pid())], uid, PATIENCE)
            .await;
        assert_eq!(reaped.terminated, vec![theirs.pid()], "{reaped:?}");
        assert_eq!(signal_of(&mut theirs), Some(libc::SIGTERM));
    }
}
