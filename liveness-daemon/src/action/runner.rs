//! Running one action (a session's end action, or its stall command) to its outcome.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

use liveness_common::action::{ActionOutcome, ActionSpec, STDERR_TAIL_BYTES};
use liveness_common::exit::ExitStatus;
use liveness_common::identity::ProcessKey;
use liveness_proc::identity::ProcRoot;
use liveness_proc::pidref::PidRef;

use super::ActionError;
use super::env::{Facts, environment};
use super::spawn::{self, Forked, Program};
use super::sys::{self, ChildSetup, Step};
use super::tail::Tail;
use super::tree::end_tree;
use super::user::RunAs;
use crate::fd::registered::register;

/// Longest an action's process may take from its fork to running its program (never more
/// than the action's timeout): one that neither runs it nor exits by then (stopped before
/// its exec by its user, or stuck setting up) is killed, and the action failed to start.
/// Its steps are a few system calls and one commit; seconds cover a loaded machine.
pub const START_BOUND: Duration = Duration::from_secs(5);
/// How long a timed-out action's processes have between SIGTERM and SIGKILL.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);
/// Most actions of one user running at once; the others wait for a slot (kept by the
/// engine's end actions).
pub const DEFAULT_ACTIONS_PER_UID: usize = 4;
/// How often the exit of an action is checked when its pidfd cannot be watched (out of
/// epoll watches).
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Most bytes read from stderr after the action exited: what it wrote before fits in a pipe
/// (at most 1 MiB even when resized).
const MAX_DRAIN_BYTES: usize = 1 << 20;

/// What every run shares: how to read `/proc`, and the grace of a timed-out tree.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub proc: ProcRoot,
    pub kill_grace: Duration,
}

/// Runs end actions as their creators.
#[derive(Debug, Clone)]
pub struct ActionRunner {
    options: RunOptions,
}

impl ActionRunner {
    pub fn new(options: RunOptions) -> ActionRunner {
        ActionRunner { options }
    }

    /// Runs the action as the creator (`facts.uid()`, looked up now: the databases may have
    /// changed since the registration; `registered_gid` is the group it registered with,
    /// for a uid they do not know). `on_spawn` is told its first process, and the release
    /// to hand to [`spawn::release`] once it is recorded: the process runs nothing before.
    pub async fn run(
        &self,
        spec: &ActionSpec,
        facts: &impl Facts,
        registered_gid: Option<u32>,
        on_spawn: impl FnOnce(ProcessKey, OwnedFd) + Send,
    ) -> ActionOutcome {
        match RunAs::lookup(facts.uid(), registered_gid) {
            Ok(user) => run_action(spec, facts, &user, &self.options, on_spawn).await,
            Err(e) => failed(facts, now_ms(), Duration::ZERO, &e),
        }
    }

    /// The options every run shares.
    pub fn options(&self) -> &RunOptions {
        &self.options
    }
}

/// Runs `spec` as `user` with `facts` on its stdin and in its environment, until it exits
/// or its timeout ends its tree; never fails: what went wrong is in the outcome's `error`.
/// `on_spawn` is told its first process once it exists, with its release.
pub async fn run_action(
    spec: &ActionSpec,
    facts: &impl Facts,
    user: &RunAs,
    options: &RunOptions,
    on_spawn: impl FnOnce(ProcessKey, OwnedFd) + Send,
) -> ActionOutcome {
    let started_ms = now_ms();
    let clock = Instant::now();
    let mut tail = Tail::new(STDERR_TAIL_BYTES);
    let ran = run(spec, facts, user, options, &mut tail, on_spawn).await;
    let outcome = match ran {
        Ok(Ran {
            exit,
            timed_out,
            killed,
        }) => ActionOutcome {
            index: facts.run().index,
            started_ms,
            duration_ms: duration_ms(clock.elapsed()),
            exit: Some(exit),
            timed_out,
            killed,
            stderr_tail: tail.text(),
            stderr_bytes: tail.total(),
            error: None,
            failed_to_start: false,
            resumed: facts.run().resumed,
            skipped: None,
        },
        Err(e) => failed(facts, started_ms, clock.elapsed(), &e),
    };
    tracing::info!(
        session = %facts.session(),
        uid = user.uid,
        index = outcome.index,
        exit = ?outcome.exit,
        timed_out = outcome.timed_out,
        error = outcome.error.as_deref(),
        "action finished"
    );
    outcome
}

/// The outcome of an action that could not run.
fn failed(
    facts: &impl Facts,
    started_ms: i64,
    took: Duration,
    error: &ActionError,
) -> ActionOutcome {
    ActionOutcome {
        index: facts.run().index,
        started_ms,
        duration_ms: duration_ms(took),
        error: Some(error.to_string()),
        failed_to_start: error.before_start(),
        resumed: facts.run().resumed,
        ..ActionOutcome::default()
    }
}

/// What became of an action that started.
struct Ran {
    exit: ExitStatus,
    timed_out: bool,
    killed: u32,
}

async fn run(
    spec: &ActionSpec,
    facts: &impl Facts,
    user: &RunAs,
    options: &RunOptions,
    tail: &mut Tail,
    on_spawn: impl FnOnce(ProcessKey, OwnedFd) + Send,
) -> Result<Ran, ActionError> {
    // The timeout counts from here: a start that takes long takes from it.
    let clock = Instant::now();
    let deadline = clock + spec.timeout();
    let bound = START_BOUND.min(spec.timeout());
    let ids = user.ids_for(rustix::process::geteuid().as_raw())?;
    let cwd = spec
        .cwd
        .as_ref()
        .map_or_else(|| user.home.clone(), PathBuf::from);
    let program = spec.argv.first().cloned().unwrap_or_default();
    let prepare = |e: std::io::Error| ActionError::Prepare(e);
    let cwd_c = CString::new(cwd.as_os_str().as_bytes())
        .map_err(|e| prepare(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
    let setup = ChildSetup::new(ids.as_ref(), cwd_c);
    let exec = Program::new(&spec.argv, &environment(spec, facts, user)).map_err(prepare)?;
    let mut stdin = serde_json::to_vec(facts).map_err(|e| prepare(e.into()))?;
    stdin.push(b'\n');
    let stdin = sys::memfd_with(c"liveness-end-facts", &stdin).map_err(prepare)?;
    let (stderr, stderr_write) = sys::stderr_pipe().map_err(prepare)?;
    // SAFETY: the AsyncFd owns the read end, which stays open until both are dropped.
    let stderr = unsafe { AsyncFd::register_with_interest(stderr, Interest::READABLE) }
        .map_err(|e| prepare(e.into()))?;
    let Forked {
        process,
        report,
        release,
    } = spawn::fork(&options.proc, &setup, &exec, stdin, stderr_write).map_err(prepare)?;
    crate::faults::point("after-action-fork");
    let root = process.pid();
    // It runs nothing until recorded.
    on_spawn(process.key(), release);
    let started = tokio::time::timeout_at(clock + bound, exec_report(report)).await;
    let failed = match started {
        Ok(None) => None,
        Ok(Some((Step::Released, _))) => Some(ActionError::NotRecorded),
        Ok(Some((Step::Exec, source))) => Some(ActionError::Exec {
            program: program.clone(),
            source,
        }),
        Ok(Some((step, source))) => Some(ActionError::Setup {
            step,
            uid: user.uid,
            cwd: cwd.clone(),
            source,
        }),
        Err(_) => {
            tracing::warn!(session = %facts.session(), pid = root, uid = user.uid, ?bound, "an action's process did not run its program in time (stopped before its exec?); killing it");
            Some(ActionError::StartBound(bound))
        }
    };
    if let Some(error) = failed {
        kill_and_reap(&process).await;
        return Err(error);
    }
    tracing::debug!(session = %facts.session(), pid = root, uid = user.uid, ?program, "action started");

    let timed_out = tokio::select! {
        () = exited(&process) => false,
        () = tokio::time::sleep_until(deadline) => true,
        () = collect(&stderr, tail) => unreachable!("collect never returns"),
    };
    let killed = if timed_out {
        tracing::warn!(session = %facts.session(), pid = root, timeout = ?spec.timeout(), "action timed out; ending its process tree");
        let killed = end_tree(&options.proc, &process, options.kill_grace).await;
        exited(&process).await;
        killed
    } else {
        0
    };
    drain(stderr.get_ref(), tail);
    let exit = process.reap().map_err(ActionError::Wait)?;
    Ok(Ran {
        exit,
        timed_out,
        killed,
    })
}

/// What the child reported before its program ran: `None` once it runs it (or the child
/// is gone without a word), else the step that failed.
async fn exec_report(report: OwnedFd) -> Option<(Step, std::io::Error)> {
    let report = match register(report, Interest::READABLE) {
        Ok(report) => report,
        // No epoll watch to be had: look every so often.
        Err(e) => return poll_report(&e.into_parts().0).await,
    };
    let mut message = Vec::with_capacity(8);
    loop {
        let Ok(mut ready) = report.readable().await else {
            return None;
        };
        let mut buffer = [0u8; 8];
        match ready.try_io(|fd| sys::read_some(fd.get_ref(), &mut buffer)) {
            Ok(Ok(0)) | Ok(Err(_)) => return sys::parse_report(&message),
            Ok(Ok(read)) => message.extend_from_slice(&buffer[..read]),
            Err(_would_block) => {}
        }
    }
}

/// [`exec_report`] without epoll.
async fn poll_report(report: &OwnedFd) -> Option<(Step, std::io::Error)> {
    let mut message = Vec::with_capacity(8);
    let mut buffer = [0u8; 8];
    loop {
        match sys::read_some(report, &mut buffer) {
            Ok(0) => return sys::parse_report(&message),
            Ok(read) => message.extend_from_slice(&buffer[..read]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                tokio::time::sleep(POLL_INTERVAL).await;
            }
            Err(_) => return sys::parse_report(&message),
        }
    }
}

/// Kills the child `process` (which never ran its program) and reaps it.
async fn kill_and_reap(process: &PidRef) {
    let _ = process.signal(rustix::process::Signal::KILL);
    exited(process).await;
    let _ = process.reap();
}

/// Returns when `process` has exited (it is not reaped).
async fn exited(process: &PidRef) {
    let watched = process
        .try_clone()
        .map_err(|e| e.to_string())
        .and_then(|pidfd| register(pidfd, Interest::READABLE).map_err(|e| e.to_string()));
    match watched {
        Ok(watched) => {
            let _ = watched.readable().await;
        }
        Err(error) => {
            tracing::debug!(error, "cannot watch an action's pidfd; polling it");
            while !process.has_exited() {
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        }
    }
}

/// Keeps the tail of stderr until its end; then waits forever (the action's exit ends it).
async fn collect(stderr: &AsyncFd<OwnedFd>, tail: &mut Tail) {
    let mut buffer = [0u8; 8192];
    loop {
        let Ok(mut ready) = stderr.readable().await else {
            break;
        };
        match ready.try_io(|fd| sys::read_some(fd.get_ref(), &mut buffer)) {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(read)) => tail.push(&buffer[..read]),
            Err(_would_block) => {}
        }
    }
    std::future::pending().await
}

/// Takes what the action left in its stderr pipe, without waiting for processes it left
/// behind that still hold the pipe open, nor reading for ever from one that keeps writing.
fn drain(stderr: &OwnedFd, tail: &mut Tail) {
    let mut buffer = [0u8; 8192];
    let mut left = MAX_DRAIN_BYTES;
    while let Ok(read @ 1..) = sys::read_some(stderr, &mut buffer) {
        tail.push(&buffer[..read]);
        left = left.saturating_sub(read);
        if left == 0 {
            break;
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
