//! Running one end action to its outcome.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

use liveness_common::action::{ActionOutcome, ActionSpec, EndFacts, STDERR_TAIL_BYTES};
use liveness_common::exit::ExitStatus;
use liveness_common::identity::ProcessKey;
use liveness_proc::identity::ProcRoot;
use liveness_proc::pidfd::pidfd_exited;

use super::ActionError;
use super::env::environment;
use super::sys::{self, ChildSetup};
use super::tail::Tail;
use super::tree::end_tree;
use super::user::RunAs;
use crate::fd::registered::register;

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

    /// Runs the action as the creator (`facts.uid`, looked up now: the databases may have
    /// changed since the registration; `registered_gid` is the group it registered with,
    /// for a uid they do not know). `spawned` is told its first process.
    pub async fn run(
        &self,
        spec: &ActionSpec,
        facts: &EndFacts,
        registered_gid: Option<u32>,
        on_spawn: impl FnOnce(ProcessKey) + Send,
    ) -> ActionOutcome {
        match RunAs::lookup(facts.uid, registered_gid) {
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
/// `on_spawn` is told its first process once it exists.
pub async fn run_action(
    spec: &ActionSpec,
    facts: &EndFacts,
    user: &RunAs,
    options: &RunOptions,
    on_spawn: impl FnOnce(ProcessKey) + Send,
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
            index: facts.action.index,
            started_ms,
            duration_ms: duration_ms(clock.elapsed()),
            exit: Some(exit),
            timed_out,
            killed,
            stderr_tail: tail.text(),
            stderr_bytes: tail.total(),
            error: None,
            resumed: facts.action.resumed,
            skipped: None,
        },
        Err(e) => failed(facts, started_ms, clock.elapsed(), &e),
    };
    tracing::info!(
        session = %facts.session,
        uid = user.uid,
        index = outcome.index,
        exit = ?outcome.exit,
        timed_out = outcome.timed_out,
        error = outcome.error.as_deref(),
        "end action finished"
    );
    outcome
}

/// The outcome of an action that could not run.
fn failed(facts: &EndFacts, started_ms: i64, took: Duration, error: &ActionError) -> ActionOutcome {
    ActionOutcome {
        index: facts.action.index,
        started_ms,
        duration_ms: duration_ms(took),
        error: Some(error.to_string()),
        resumed: facts.action.resumed,
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
    facts: &EndFacts,
    user: &RunAs,
    options: &RunOptions,
    tail: &mut Tail,
    on_spawn: impl FnOnce(ProcessKey) + Send,
) -> Result<Ran, ActionError> {
    let ids = user.ids_for(rustix::process::geteuid().as_raw())?;
    let cwd = spec
        .cwd
        .as_ref()
        .map_or_else(|| user.home.clone(), PathBuf::from);
    let program = spec.argv.first().cloned().unwrap_or_default();
    let prepare = |e: std::io::Error| ActionError::Prepare(e);
    let cwd_c = CString::new(cwd.as_os_str().as_bytes())
        .map_err(|e| prepare(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
    let (setup, report) = ChildSetup::new(ids.as_ref(), cwd_c).map_err(prepare)?;
    let mut stdin = serde_json::to_vec(facts).map_err(|e| prepare(e.into()))?;
    stdin.push(b'\n');
    let stdin = sys::memfd_with(c"liveness-end-facts", &stdin).map_err(prepare)?;
    let (stderr, stderr_write) = sys::stderr_pipe().map_err(prepare)?;
    // SAFETY: the AsyncFd owns the read end, which stays open until both are dropped.
    let stderr = unsafe { AsyncFd::register_with_interest(stderr, Interest::READABLE) }
        .map_err(|e| prepare(e.into()))?;

    let mut command = Command::new(&program);
    command
        .args(spec.argv.iter().skip(1))
        .env_clear()
        .envs(environment(spec, facts, user))
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::null())
        .stderr(Stdio::from(stderr_write));
    // SAFETY: `apply` makes only async-signal-safe calls and allocates nothing, as a
    // pre_exec closure in a multi-threaded process must.
    unsafe { command.pre_exec(move || setup.apply()) };
    let spawned = command.spawn();
    // The parent's copies of the child's stdin and stderr, and of the step report's write
    // end: stderr ends when the action's processes close it.
    drop(command);
    let child = spawned.map_err(|source| match report.failed_step() {
        Some(step) => ActionError::Setup {
            step,
            uid: user.uid,
            cwd: cwd.clone(),
            source,
        },
        None => ActionError::Exec {
            program: program.clone(),
            source,
        },
    })?;
    let root = child.id();
    let pidfd = match sys::pidfd_of(root) {
        Ok(pidfd) => pidfd,
        Err(e) => {
            // Without a pidfd it cannot be bounded: end it now rather than run it blind.
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
            return Err(ActionError::Wait(e));
        }
    };
    tracing::debug!(session = %facts.session, pid = root, uid = user.uid, ?program, "end action started");
    // Not reaped yet, so the pid is still this child's.
    if let Ok(stat) = options.proc.stat(root) {
        on_spawn(ProcessKey {
            pid: root,
            start_ticks: stat.start_ticks,
        });
    }

    let timed_out = tokio::select! {
        () = exited(&pidfd) => false,
        () = tokio::time::sleep(spec.timeout()) => true,
        () = collect(&stderr, tail) => unreachable!("collect never returns"),
    };
    let killed = if timed_out {
        tracing::warn!(session = %facts.session, pid = root, timeout = ?spec.timeout(), "end action timed out; ending its process tree");
        let killed = end_tree(&options.proc, root, &pidfd, options.kill_grace).await;
        exited(&pidfd).await;
        killed
    } else {
        0
    };
    drain(stderr.get_ref(), tail);
    let exit = sys::reap(&pidfd).map_err(ActionError::Wait)?;
    Ok(Ran {
        exit,
        timed_out,
        killed,
    })
}

/// Returns when the process behind `pidfd` has exited (it is not reaped).
async fn exited(pidfd: &OwnedFd) {
    let watched = pidfd
        .try_clone()
        .map_err(|e| e.to_string())
        .and_then(|pidfd| register(pidfd, Interest::READABLE).map_err(|e| e.to_string()));
    match watched {
        Ok(watched) => {
            let _ = watched.readable().await;
        }
        Err(error) => {
            tracing::debug!(error, "cannot watch an action's pidfd; polling it");
            while !pidfd_exited(pidfd.as_fd()) {
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
