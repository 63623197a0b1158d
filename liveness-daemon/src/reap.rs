//! The reaper: terminates what is left of an ended session's processes.
//!
//! Every target is a fingerprint, and is signalled only through a pidfd verified against
//! it: the pidfd is opened first, then the process's start time (and, where the kernel has
//! it, its pidfs inode) is compared, then the pidfd is checked to still show the process
//! running. A pid that passed to another process since the fingerprint was taken therefore
//! never receives a signal. Pid 1 and the daemon itself are never signalled, and a
//! non-root session's processes are signalled only where its uid could signal them itself.
//!
//! That rule is checked again right before every signal, against the ids seen before
//! SIGTERM: a process that runs a set-user-ID program during the grace and takes root's
//! ids (`setresuid(0, 0, 0)`) is no longer one its user could kill, so the root daemon
//! does not SIGKILL it on the user's behalf; it is reported with what changed.
//!
//! A reap's size is its session's choice, so it holds up no one: its reads and signals run
//! off the engine (see [`crate::fair::offload`]), and between its signals it holds a pidfd for
//! only so many of its targets (see [`Budget`]). The others are watched through `/proc` by
//! their fingerprints, and verified through a newly opened pidfd before SIGKILL as they
//! were before SIGTERM.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rustix::io::Errno;
use rustix::process::{Pid, Resource, Signal};
use tokio::io::Interest;
use tokio::time::Instant;

use liveness_common::identity::Identity;
use liveness_common::session::{ReapFailure, Reaped};
use liveness_proc::identity::{IdentityError, Liveness, ProcRoot};
use liveness_proc::pidref::{PidRef, PidRefError};

use crate::fair::offload::offload_for;
use crate::fd::registered::register;

/// How long SIGKILLed processes have to vanish before they are reported as failed: a
/// process in uninterruptible sleep dies only once it wakes.
pub(crate) const KILL_WAIT: Duration = Duration::from_secs(5);
/// Most pidfds one reap holds between its signals.
const PIDFDS_PER_REAP: usize = 256;
/// Most pidfds the reaps of one uid hold together.
const PIDFDS_PER_UID: usize = 512;
/// All reaps together hold at most this fraction of the open-file limit in pidfds: the
/// rest is the exit sources', the clients' and the database's.
const PIDFDS_SHARE_OF_LIMIT: u64 = 8;
/// How often a reap looks up in `/proc` the targets it holds no pidfd for, while it
/// waits for them to exit: this often for each [`PIDFDS_PER_REAP`] of them or fewer, less
/// often for more, so that a look costs at most a few percent of a CPU.
const POLL: Duration = Duration::from_millis(200);

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
    #[error(
        "its ids changed after SIGTERM, from {before} to {now} (a set-user-ID program?): the \
         session's uid {uid} may no longer signal it (kill(2) rules), so it was not sent \
         {signal}; it was left running: end it as root or as its user"
    )]
    IdsChanged {
        uid: u32,
        before: SignalIds,
        now: SignalIds,
        signal: &'static str,
    },
    #[error("cannot open a pidfd for it: {0}")]
    Pidfd(Errno),
    #[error("cannot read its facts: {0}")]
    Proc(#[from] IdentityError),
    #[error("cannot send it {signal}: {errno}")]
    Signal { signal: &'static str, errno: Errno },
    #[error("still running {0:?} after SIGKILL (in uninterruptible sleep?)")]
    Unkillable(Duration),
}

/// What kill(2) compares with an unprivileged sender's uid: the target's real and saved
/// set-user-IDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalIds {
    real: u32,
    saved: u32,
}

impl SignalIds {
    fn permit(self, uid: u32) -> bool {
        uid == self.real || uid == self.saved
    }
}

impl fmt::Display for SignalIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "real uid {} saved uid {}", self.real, self.saved)
    }
}

/// The pidfds reaps may hold between their signals: at most [`PIDFDS_PER_REAP`] for one
/// reap, [`PIDFDS_PER_UID`] for the reaps of one uid, and `total` for all of them.
#[derive(Debug)]
struct Budget {
    total: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_uid: HashMap<u32, usize>,
}

/// The share of the [`Budget`] one reap may fill, given back when it is dropped (also when
/// the reap is cancelled).
#[derive(Debug)]
struct Lease {
    budget: Arc<Budget>,
    uid: u32,
    slots: usize,
}

impl Budget {
    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Up to `wanted` slots for a reap of `uid`: as many as are left.
    fn lease(self: &Arc<Budget>, uid: u32, wanted: usize) -> Lease {
        let mut held = self.held();
        let left = self.total.saturating_sub(held.total);
        let of_uid = held.by_uid.entry(uid).or_default();
        let slots = wanted
            .min(PIDFDS_PER_REAP)
            .min(PIDFDS_PER_UID.saturating_sub(*of_uid))
            .min(left);
        *of_uid += slots;
        held.total += slots;
        Lease {
            budget: Arc::clone(self),
            uid,
            slots,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut held = self.budget.held();
        held.total -= self.slots;
        if let Some(of_uid) = held.by_uid.get_mut(&self.uid) {
            *of_uid -= self.slots;
            if *of_uid == 0 {
                held.by_uid.remove(&self.uid);
            }
        }
    }
}

/// Ends processes by policy. Cheap to clone: each reap runs in a task of its own.
#[derive(Debug, Clone)]
pub struct Reaper {
    proc: ProcRoot,
    own_pid: u32,
    budget: Arc<Budget>,
}

/// A target of a reap, as far as the reap has gone with it.
#[derive(Debug)]
struct Target {
    identity: Identity,
    /// Its ids when it was checked before SIGTERM (a non-root session's targets only).
    ids: Option<SignalIds>,
    /// Held between signals while the reap's lease has room.
    pidfd: Option<PidRef>,
}

/// What one round of signals did: the targets that got the signal, and the pids of those
/// that had exited before it.
type Round = (Vec<Target>, Vec<u32>, Vec<ReapFailure>);

impl Reaper {
    /// A reaper whose reaps together hold at most an eighth of the open-file limit in
    /// force (raise the limit first).
    pub fn new(proc: ProcRoot) -> Reaper {
        let limit = rustix::process::getrlimit(Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        Reaper::with_budget(
            proc,
            usize::try_from(limit / PIDFDS_SHARE_OF_LIMIT).unwrap_or(usize::MAX),
        )
    }

    fn with_budget(proc: ProcRoot, total: usize) -> Reaper {
        Reaper {
            proc,
            own_pid: std::process::id(),
            budget: Arc::new(Budget {
                total,
                held: Mutex::default(),
            }),
        }
    }

    /// Sends SIGTERM to every target that is still the process its fingerprint names and
    /// that a session of `uid` may signal, waits up to `grace` for them to exit, SIGKILLs
    /// the rest that still may be, and says what became of each.
    pub async fn reap(&self, targets: &[Identity], uid: u32, grace: Duration) -> Reaped {
        let lease = self.budget.lease(uid, targets.len());
        let targets: Vec<Target> = targets
            .iter()
            .map(|identity| Target {
                identity: identity.clone(),
                ids: None,
                pidfd: None,
            })
            .collect();
        let mut reaped = Reaped::default();
        let (terminating, exited, failed) = self
            .off_engine(targets, uid, Signal::TERM, lease.slots)
            .await;
        reaped.exited = exited;
        reaped.failed = failed;
        let (terminated, running) = self.wait(terminating, uid, Instant::now() + grace).await;
        reaped.terminated = terminated;
        let (killing, terminated, failed) = self
            .off_engine(running, uid, Signal::KILL, lease.slots)
            .await;
        // These exited between the end of the grace and the check before SIGKILL.
        reaped.terminated.extend(terminated);
        reaped.failed.extend(failed);
        let (killed, unkillable) = self.wait(killing, uid, Instant::now() + KILL_WAIT).await;
        reaped.killed = killed;
        reaped.failed.extend(
            unkillable
                .into_iter()
                .map(|target| failure(target.identity.pid, ReapError::Unkillable(KILL_WAIT))),
        );
        reaped
    }

    /// Sends `signal` to the one process `identity` names, checked as every target of a
    /// reap is: `Ok(false)` when it has exited, `Err` with why it was not signalled.
    pub async fn signal_one(
        &self,
        identity: &Identity,
        uid: u32,
        signal: Signal,
    ) -> Result<bool, String> {
        let target = Target {
            identity: identity.clone(),
            ids: None,
            pidfd: None,
        };
        let (signalled, _, failed) = self.off_engine(vec![target], uid, signal, 0).await;
        match failed.into_iter().next() {
            Some(failure) => Err(failure.reason),
            None => Ok(!signalled.is_empty()),
        }
    }

    /// [`Reaper::signal_round`] on the blocking pool: its reads cost as much as the reap is
    /// big. (A panic there ends the daemon, so there is nothing to report then.)
    async fn off_engine(
        &self,
        targets: Vec<Target>,
        uid: u32,
        signal: Signal,
        slots: usize,
    ) -> Round {
        let reaper = self.clone();
        offload_for(uid, move || {
            reaper.signal_round(targets, uid, signal, slots)
        })
        .await
        .unwrap_or_default()
    }

    /// Checks each target again and sends it `signal`, keeping at most `slots` pidfds.
    fn signal_round(
        &self,
        mut targets: Vec<Target>,
        uid: u32,
        signal: Signal,
        slots: usize,
    ) -> Round {
        // Those holding a pidfd first, so that no more than `slots` are ever held at once.
        targets.sort_by_key(|target| target.pidfd.is_none());
        let mut signalled = Vec::new();
        let mut gone = Vec::new();
        let mut failed = Vec::new();
        let mut held = 0;
        for mut target in targets {
            let pid = target.identity.pid;
            let sent = self
                .verified_pidfd(&mut target, uid, signal)
                .and_then(|pidfd| pidfd.map(|pidfd| self::signal(pidfd, signal)).transpose());
            match sent.map(Option::flatten) {
                Ok(Some(pidfd)) => {
                    if held < slots {
                        held += 1;
                        target.pidfd = Some(pidfd);
                    }
                    signalled.push(target);
                }
                Ok(None) => gone.push(pid),
                Err(e) => failed.push(failure(pid, e)),
            }
        }
        (signalled, gone, failed)
    }

    /// A pidfd of the process `target` names, checked right before `signal`: `None` when
    /// that process has exited (whatever now has its pid). Its ids are recorded at the
    /// first check and compared at the next.
    fn verified_pidfd(
        &self,
        target: &mut Target,
        uid: u32,
        signal: Signal,
    ) -> Result<Option<PidRef>, ReapError> {
        let gone = |e: &IdentityError| matches!(e, IdentityError::NoSuchProcess(_));
        let pidfd = match target.pidfd.take() {
            // Held since the last signal: it names the process whatever its pid became.
            Some(pidfd) => pidfd,
            None => match self.open_verified(&target.identity)? {
                Some(pidfd) => pidfd,
                None => return Ok(None),
            },
        };
        let mut refusal = None;
        if uid != 0 {
            let [real, saved] = match self.proc.signal_uids(target.identity.pid) {
                Err(e) if gone(&e) => return Ok(None),
                other => other?,
            };
            let now = SignalIds { real, saved };
            refusal = match target.ids {
                _ if now.permit(uid) => None,
                None => Some(ReapError::NotPermitted { uid, owner: real }),
                Some(before) => Some(ReapError::IdsChanged {
                    uid,
                    before,
                    now,
                    signal: signal_name(signal),
                }),
            };
            target.ids.get_or_insert(now);
        }
        // Checked after the reads: still running now, so they were this process's (a held
        // pidfd's pid may have passed to another process since the last signal).
        if pidfd.has_exited() {
            return Ok(None);
        }
        match refusal {
            Some(refused) => Err(refused),
            None => Ok(Some(pidfd)),
        }
    }

    /// A new pidfd of the process `target` names, or `None` when that process has exited.
    fn open_verified(&self, target: &Identity) -> Result<Option<PidRef>, ReapError> {
        if target.pid == 1 {
            return Err(ReapError::Init);
        }
        if target.pid == self.own_pid {
            return Err(ReapError::Daemon);
        }
        if i32::try_from(target.pid)
            .ok()
            .and_then(Pid::from_raw)
            .is_none()
        {
            return Err(IdentityError::NoSuchProcess(target.pid).into());
        }
        let process = match PidRef::open(&self.proc, target.key(), target.pidfs_ino) {
            Ok(process) => process,
            Err(PidRefError::Gone(_)) => return Ok(None),
            Err(PidRefError::Open { errno, .. }) => return Err(ReapError::Pidfd(errno)),
            Err(PidRefError::Unverified { source, .. }) => return Err(source.into()),
        };
        if process.is_kernel_thread() {
            return Err(ReapError::KernelThread);
        }
        Ok(Some(process))
    }

    /// Waits until `deadline` for the signalled targets to exit: returns the pids of those
    /// that did, and those still running. The held pidfds are watched; the other targets
    /// are looked up in `/proc` (see [`POLL`]) once the held ones are done, and once more
    /// at the deadline.
    async fn wait(
        &self,
        targets: Vec<Target>,
        uid: u32,
        deadline: Instant,
    ) -> (Vec<u32>, Vec<Target>) {
        let (held, mut unheld): (Vec<Target>, Vec<Target>) = targets
            .into_iter()
            .partition(|target| target.pidfd.is_some());
        // Pids are unique among processes running together.
        let mut by_pid: HashMap<u32, Target> = HashMap::new();
        let watched = held
            .into_iter()
            .filter_map(|mut target| {
                let pidfd = target.pidfd.take()?;
                by_pid.insert(pidfd.pid(), target);
                Some(pidfd)
            })
            .collect();
        let (mut exited, running) = wait_for_exits(watched, deadline).await;
        let mut still: Vec<Target> = running
            .into_iter()
            .filter_map(|pidfd| {
                let mut target = by_pid.remove(&pidfd.pid())?;
                target.pidfd = Some(pidfd);
                Some(target)
            })
            .collect();
        while !unheld.is_empty() {
            let reaper = self.clone();
            let (gone, running): (Vec<Target>, Vec<Target>) = offload_for(uid, move || {
                unheld
                    .into_iter()
                    .partition(|target| reaper.has_exited(&target.identity))
            })
            .await
            .unwrap_or_default();
            exited.extend(gone.iter().map(|target| target.identity.pid));
            unheld = running;
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if !unheld.is_empty() {
                let every = POLL * (1 + unheld.len() / PIDFDS_PER_REAP) as u32;
                tokio::time::sleep_until((now + every).min(deadline)).await;
            }
        }
        still.extend(unheld);
        (exited, still)
    }

    /// Whether the process `identity` names has exited, as `/proc` shows it (a fact that
    /// cannot be read is no exit: it is verified again before the next signal).
    fn has_exited(&self, identity: &Identity) -> bool {
        matches!(
            self.proc.check_process(identity.key(), identity.pidfs_ino),
            Liveness::Dead(_)
        )
    }
}

fn failure(pid: u32, error: ReapError) -> ReapFailure {
    tracing::warn!(pid, %error, "a session's process was not ended");
    ReapFailure {
        pid,
        reason: error.to_string(),
    }
}

fn signal_name(signal: Signal) -> &'static str {
    match signal {
        Signal::KILL => "SIGKILL",
        Signal::TERM => "SIGTERM",
        Signal::STOP => "SIGSTOP",
        _ => "a signal",
    }
}

/// Sends `signal` to a verified process; `None` when it has exited meanwhile.
pub(crate) fn signal(process: PidRef, signal: Signal) -> Result<Option<PidRef>, ReapError> {
    match process.signal(signal) {
        Ok(true) => Ok(Some(process)),
        Ok(false) => Ok(None),
        Err(errno) => Err(ReapError::Signal {
            signal: signal_name(signal),
            errno,
        }),
    }
}

/// Waits until `deadline` for the signalled processes to exit: returns those that did,
/// and those still running.
pub(crate) async fn wait_for_exits(
    signalled: Vec<PidRef>,
    deadline: Instant,
) -> (Vec<u32>, Vec<PidRef>) {
    let mut exited = Vec::new();
    let mut running = Vec::new();
    for pidfd in signalled {
        let pid = pidfd.pid();
        // One deadline for all: waiting on each in turn takes no longer than the grace.
        let pidfd = match register(pidfd, Interest::READABLE) {
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
        if pidfd.has_exited() {
            exited.push(pid);
        } else {
            running.push(pidfd);
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
    async fn targets_beyond_the_pidfds_a_reap_holds_are_verified_again_and_killed() {
        let mut ignoring: Vec<Proc> = (0..3).map(|_| ignores_term()).collect();
        let mut heeds = Proc::sleeper();
        let mut targets: Vec<Identity> = ignoring.iter().map(|p| identity(p.pid())).collect();
        targets.push(identity(heeds.pid()));
        let one_pidfd = Reaper::with_budget(ProcRoot::default(), 1);
        let reaped = one_pidfd
            .reap(&targets, 0, Duration::from_millis(500))
            .await;
        let mut killed = reaped.killed.clone();
        killed.sort_unstable();
        let mut expected: Vec<u32> = ignoring.iter().map(Proc::pid).collect();
        expected.sort_unstable();
        assert_eq!(killed, expected, "{reaped:?}");
        assert_eq!(reaped.terminated, vec![heeds.pid()], "{reaped:?}");
        assert!(reaped.failed.is_empty(), "{reaped:?}");
        for ignores in &mut ignoring {
            assert_eq!(signal_of(ignores), Some(libc::SIGKILL));
        }
        assert_eq!(signal_of(&mut heeds), Some(libc::SIGTERM));
        assert_eq!(one_pidfd.budget.held().total, 0, "the lease was given back");
    }

    #[test]
    fn leases_are_bounded_per_reap_per_uid_and_in_all() {
        let budget = Arc::new(Budget {
            total: PIDFDS_PER_UID + 100,
            held: Mutex::default(),
        });
        let first = budget.lease(1000, 10_000);
        assert_eq!(first.slots, PIDFDS_PER_REAP);
        let small = budget.lease(1000, 3);
        assert_eq!(small.slots, 3, "a reap takes no more than it has targets");
        let second = budget.lease(1000, 10_000);
        assert_eq!(second.slots, PIDFDS_PER_UID - PIDFDS_PER_REAP - 3);
        assert_eq!(
            budget.lease(1000, 10_000).slots,
            0,
            "the uid's share is used up"
        );
        let other = budget.lease(1001, 10_000);
        assert_eq!(other.slots, 100, "what is left of the total");
        drop((first, small, second));
        assert_eq!(budget.lease(1000, 10_000).slots, PIDFDS_PER_REAP);
        drop(other);
        assert_eq!(budget.held().total, 0);
        assert!(budget.held().by_uid.is_empty());
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
