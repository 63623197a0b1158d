//! `liveness run` and `liveness lock run`: run a command as the owner of a session that is
//! registered before the command starts, so no death of it can be missed.
//!
//! The child is forked first and waits on a pipe; the session is registered with the
//! child's pid (sent as a pidfd) and, for `lock run`, the lock is taken; only then is the
//! child told to exec CMD, with the token in its environment. Once CMD may run, signals
//! sent to `liveness` (SIGINT, SIGTERM) are passed on to it; those a terminal sends reach
//! CMD directly, as it is in the same process group. Before that they stop `liveness` as
//! usual, and the waiting child, reading the end of the pipe, exits without running CMD.

use std::ffi::{CString, OsString, c_char};
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;

use liveness_client::{Client, Owner, Registration};
use liveness_common::exit::ExitStatus;
use liveness_common::session::{OnEnd, Until};
use liveness_proc::pidref::UnreapedChild;
use rustix::process::Signal;

use crate::args::{LockScope, LockWait, RunArgs};
use crate::context::Context;
use crate::exit::{Exit, Failure};
use crate::output;

impl RunArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        self.run_session(context, None)
    }

    /// Runs CMD as the owner of the session, holding `lock` if given: CMD's status as a shell
    /// reports it, or liveness's own failure before CMD started.
    pub(crate) fn run_session(
        &self,
        context: &Context,
        lock: Option<(&str, LockWait, LockScope)>,
    ) -> Result<ExitCode, Failure> {
        let id = self.session.clone().unwrap_or_else(new_run_id);
        let program = Program::new(&self.command, &id, lock.map(|(name, ..)| name))?;
        let child = program
            .fork()
            .map_err(|e| Failure::new(Exit::Software, format!("cannot start a process: {e}")))?;
        let mut client = context.connect()?;
        let registration = Registration {
            session: Some(id.clone()),
            owner: Owner::Pid(child.process.pid()),
            pending: false,
            labels: self.labels.iter().cloned().collect(),
            uid: None,
            on_end: self.cleanup.on_end.map(OnEnd::from),
            grace: self.cleanup.grace,
            until: self.until.until.map(Until::from),
            wrappers: Vec::new(),
            on_end_run: self.end_actions.specs()?,
            on_stall: self.stall.policy()?,
            cgroup: self.cgroup.limits(),
            no_cgroup: self.cgroup.no_cgroup,
        };
        for warning in client.register_with_warnings(&registration)?.warnings {
            output::warn(&warning, context.json);
        }
        let token = match lock {
            Some((name, wait, scope)) => {
                let scope = scope.scope();
                match client.lock_acquire(name, &id, None, wait.wait, wait.timeout, scope) {
                    Ok(lock) => Some(lock.token),
                    Err(error) => {
                        return Err(never_started(&mut client, &id, &self.command[0], error));
                    }
                }
            }
            None => None,
        };
        drop(client);
        let status = child
            .start(token)
            .map_err(|e| Failure::new(Exit::Software, format!("lost track of the command: {e}")))?;
        // The owner is dead: the daemon ends the session from the death itself, with CMD's exit
        // status, releasing its locks. Waiting for that means the lock is free once run exits.
        // With --until tree, it ends at the last exit of CMD's tree, with that one's status.
        let ended =
            Client::connect(&context.socket).and_then(|client| client.wait_for_end(&id, None));
        let session = match ended {
            Ok(session) => session,
            Err(e) => {
                eprintln!(
                    "liveness: the command ended, but the end of session {id} was not confirmed: {e}"
                );
                return Ok(ExitCode::from(status));
            }
        };
        let last = session.exit.map(shell_status);
        match (session.until, last) {
            (Until::Tree, Some(last)) if last != status => {
                eprintln!(
                    "liveness: {} exited with {status}; the last process of its tree, with {last}",
                    self.command[0].to_string_lossy()
                );
                Ok(ExitCode::from(last))
            }
            _ => Ok(ExitCode::from(status)),
        }
    }
}

/// The failure of a `lock run` whose lock was refused. CMD never ran: the session is ended
/// (`stopped`) before the waiting child is let go, so that it does not read as CMD's exit
/// with the child's refusal code; the message says so, and why.
fn never_started(
    client: &mut liveness_client::Client,
    id: &str,
    command: &OsString,
    error: liveness_client::ClientError,
) -> Failure {
    let ended = match client.end(id, None) {
        Ok(_) => format!("session {id} ended as stopped"),
        Err(end) => format!("session {id} not ended ({end}): it ends when the waiting child exits"),
    };
    let mut failure = crate::lock::refused(error);
    failure.message = format!(
        "{} never started: {}; {ended}",
        command.to_string_lossy(),
        failure.message
    );
    failure
}

/// An exit status as a shell reports it: the code, or 128+N for signal N.
fn shell_status(exit: ExitStatus) -> u8 {
    match exit {
        ExitStatus::Exited { code } => code,
        ExitStatus::Signaled { signal, .. } => 128u8.saturating_add(signal),
    }
}

/// A fresh session id for a run: random, so never one that exists.
fn new_run_id() -> String {
    let mut bytes = [0u8; 8];
    if rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).is_err() {
        bytes = u64::from(std::process::id()).to_le_bytes();
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("run-{hex}")
}

/// Where the token goes in the environment: written by the child, after the fork, into
/// this space left after `LIVENESS_LOCK_TOKEN=` (a u64 has at most 20 digits).
const TOKEN_VAR: &[u8] = b"LIVENESS_LOCK_TOKEN=";
const TOKEN_DIGITS: usize = 20;

/// Everything the child needs to exec CMD, made before the fork: the child only reads a
/// pipe, writes digits into [`TOKEN_VAR`]'s space, and execs (no allocation after fork).
struct Program {
    argv: Vec<CString>,
    env: Vec<Vec<u8>>,
    /// The index in `env` of the token's entry, for `lock run`.
    token_entry: Option<usize>,
    /// Said when CMD cannot be executed, before the reason ([`exec_failure`]).
    failure: Vec<u8>,
    /// The command name CMD will have once exec'd (the kernel's: its file's base name).
    comm: CString,
}

impl Program {
    fn new(command: &[OsString], session: &str, lock: Option<&str>) -> Result<Program, Failure> {
        let argv = command
            .iter()
            .map(|arg| {
                CString::new(arg.as_bytes())
                    .map_err(|_| Failure::new(Exit::Usage, format!("{arg:?} contains a NUL byte")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ours = [
            "LIVENESS_SESSION",
            "LIVENESS_LOCK_NAME",
            "LIVENESS_LOCK_TOKEN",
        ];
        let mut env: Vec<Vec<u8>> = std::env::vars_os()
            .filter(|(key, _)| !ours.iter().any(|ours| key.as_bytes() == ours.as_bytes()))
            .map(|(key, value)| [key.as_bytes(), b"=", value.as_bytes()].concat())
            .filter(|entry| !entry.contains(&0))
            .collect();
        env.push([b"LIVENESS_SESSION=", session.as_bytes()].concat());
        let token_entry = match lock {
            Some(name) => {
                env.push([b"LIVENESS_LOCK_NAME=", name.as_bytes()].concat());
                env.push([TOKEN_VAR, &[0u8; TOKEN_DIGITS]].concat());
                Some(env.len() - 1)
            }
            None => None,
        };
        for entry in &mut env {
            entry.push(0);
        }
        let failure = format!(
            "liveness: cannot execute {}: ",
            command[0].to_string_lossy()
        );
        let program = argv[0].as_bytes();
        let base = program
            .rsplit(|&byte| byte == b'/')
            .next()
            .unwrap_or(program);
        // Never empty: `liveness run -- ./dir/` still names its process.
        let comm = CString::new(if base.is_empty() { program } else { base })
            .unwrap_or_else(|_| argv[0].clone());
        Ok(Program {
            argv,
            env,
            token_entry,
            failure: failure.into_bytes(),
            comm,
        })
    }

    /// Forks the child that will exec CMD once [`Paused::start`] tells it to.
    fn fork(mut self) -> std::io::Result<Paused> {
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let argv: Vec<*const c_char> = self
            .argv
            .iter()
            .map(|arg| arg.as_ptr())
            .chain([std::ptr::null()])
            .collect();
        let token_slot = self
            .token_entry
            .map(|i| self.env[i][TOKEN_VAR.len()..].as_mut_ptr());
        let envp: Vec<*const c_char> = self
            .env
            .iter()
            .map(|entry| entry.as_ptr().cast())
            .chain([std::ptr::null()])
            .collect();
        // The child is registered before it execs CMD: named after CMD from the fork on, it
        // is registered under CMD's name (`make`), which the session keeps after CMD has
        // ended, rather than `liveness`. This (only) thread lends it the name; the name is
        // for people, so failing to set it stops nothing.
        let own_name = rustix::thread::name().ok();
        if own_name.is_some() {
            let _ = rustix::thread::set_name(&self.comm);
        }
        // SAFETY: this process has one thread (the client is blocking, nothing spawned
        // one), so the child may run any code; it still sticks to async-signal-safe calls
        // on memory prepared above, which stays valid as `self` lives on in the child.
        let forked = unsafe { libc::fork() };
        if let Some(own_name) = own_name.filter(|_| forked != 0) {
            let _ = rustix::thread::set_name(&own_name);
        }
        match forked {
            -1 => Err(std::io::Error::last_os_error()),
            0 => {
                let child = Child {
                    go: read.as_raw_fd(),
                    parents_end: write.as_raw_fd(),
                    argv: &argv,
                    envp: &envp,
                    token_slot,
                    failure: &self.failure,
                };
                // SAFETY: in the child of the fork above, with the pointers made for it.
                unsafe { child.exec_when_told() }
            }
            pid => Ok(Paused {
                process: UnreapedChild::new(pid.unsigned_abs())
                    .ok_or_else(|| std::io::Error::other("fork returned no pid"))?,
                go: Some(write),
            }),
        }
    }
}

/// The child's side: what it reads and execs, all prepared before the fork.
struct Child<'a> {
    go: RawFd,
    parents_end: RawFd,
    argv: &'a [*const c_char],
    envp: &'a [*const c_char],
    token_slot: Option<*mut u8>,
    failure: &'a [u8],
}

impl Child<'_> {
    /// Waits for the parent's word: `g` and the token's digits to exec CMD, nothing (the
    /// parent gave up or died) to exit at once.
    ///
    /// # Safety
    /// Only in the child of a fork, with `argv` and `envp` null-terminated arrays of
    /// NUL-terminated strings and `token_slot` (if any) [`TOKEN_DIGITS`] writable bytes
    /// followed by a NUL.
    unsafe fn exec_when_told(&self) -> ! {
        // SAFETY: see the function's contract; only async-signal-safe calls follow.
        unsafe {
            libc::close(self.parents_end);
            let mut word = [0u8; 1 + TOKEN_DIGITS];
            let mut length = 0;
            while length < word.len() {
                let read = libc::read(
                    self.go,
                    word[length..].as_mut_ptr().cast(),
                    word.len() - length,
                );
                match read {
                    0 => break,
                    n if n > 0 => length += n as usize,
                    _ if *libc::__errno_location() == libc::EINTR => {}
                    _ => break,
                }
            }
            if length == 0 || word[0] != b'g' {
                libc::_exit(Exit::Unavailable as i32);
            }
            if let Some(slot) = self.token_slot {
                std::ptr::copy_nonoverlapping(word[1..].as_ptr(), slot, length - 1);
            }
            // Rust ignores SIGPIPE; CMD gets the default disposition, as from a shell.
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::execvpe(self.argv[0], self.argv.as_ptr(), self.envp.as_ptr());
            let (code, reason) = exec_failure(*libc::__errno_location());
            libc::write(2, self.failure.as_ptr().cast(), self.failure.len());
            libc::write(2, reason.as_ptr().cast(), reason.len());
            libc::_exit(code)
        }
    }
}

/// The exit code a shell gives when `execve` fails with `errno` (127: not found, 126:
/// found but not executable), and the reason to print: static text, as the child of a
/// fork allocates nothing.
fn exec_failure(errno: i32) -> (i32, &'static str) {
    match errno {
        libc::ENOENT => (127, "not found\n"),
        libc::EACCES => (126, "permission denied (not an executable file?)\n"),
        libc::ENOEXEC => (126, "not an executable format (a script needs a #! line)\n"),
        _ => (126, "found, but the kernel refused to execute it\n"),
    }
}

/// A forked child waiting for the word to exec CMD. Dropped without [`Paused::start`], it
/// is told nothing, exits, and is reaped.
struct Paused {
    process: UnreapedChild,
    go: Option<OwnedFd>,
}

impl Paused {
    /// Lets the child exec CMD (with `token` in its environment), passes SIGINT and SIGTERM
    /// sent to this process on to it, and returns its status as a shell reports it.
    fn start(mut self, token: Option<u64>) -> std::io::Result<u8> {
        let forwarded = Signals::block()?;
        let word = format!("g{}", token.map(|t| t.to_string()).unwrap_or_default());
        let go = self.go.take().expect("a paused child is started once");
        // A child that cannot read it was killed already: its status is reaped below.
        let _ = std::fs::File::from(go).write_all(word.as_bytes());
        loop {
            if let Some(status) = self.try_reap()? {
                return Ok(status);
            }
            forwarded.forward_next(&self.process)?;
        }
    }

    /// The child's status as a shell reports it, once it has exited.
    fn try_reap(&self) -> std::io::Result<Option<u8>> {
        Ok(self.process.try_reap()?.map(shell_status))
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        if self.go.take().is_some() {
            // Closed unwritten: the child exits at once, and is reaped here.
            let _ = self.process.reap();
        }
    }
}

/// SIGINT, SIGTERM and SIGCHLD, blocked so that they are taken one at a time with
/// `sigwaitinfo` (no handler runs in the middle of anything); unblocked when dropped.
struct Signals {
    set: libc::sigset_t,
    before: libc::sigset_t,
}

impl Signals {
    fn block() -> std::io::Result<Signals> {
        // SAFETY: sigset_t is plain data, initialized by sigemptyset before use.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut before: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGCHLD] {
                libc::sigaddset(&mut set, signal);
            }
            if libc::sigprocmask(libc::SIG_BLOCK, &set, &mut before) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(Signals { set, before })
        }
    }

    /// Waits for the next signal; passes SIGINT and SIGTERM on to `child` unless the kernel
    /// sent them (a terminal's ^C already reached the whole process group).
    fn forward_next(&self, child: &UnreapedChild) -> std::io::Result<()> {
        // SAFETY: siginfo_t is plain data that sigwaitinfo fills in.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: the set was initialized in `block`.
        let signal = unsafe { libc::sigwaitinfo(&self.set, &mut info) };
        if signal == -1 {
            let error = std::io::Error::last_os_error();
            return match error.kind() {
                std::io::ErrorKind::Interrupted => Ok(()),
                _ => Err(error),
            };
        }
        let forwarded = match signal {
            libc::SIGINT => Signal::INT,
            libc::SIGTERM => Signal::TERM,
            _ => return Ok(()),
        };
        if info.si_code != libc::SI_KERNEL {
            let _ = child.signal(forwarded);
        }
        Ok(())
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `block`.
        unsafe { libc::sigprocmask(libc::SIG_SETMASK, &self.before, std::ptr::null_mut()) };
    }
}
