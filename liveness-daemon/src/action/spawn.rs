//! Starting an action's process without ever waiting on it.
//!
//! Once the child has taken on its user's ids, that user may stop it (SIGSTOP) before it
//! runs its program; a spawn that waits for the exec to report would then be held for as
//! long as the user likes. So the fork here returns at once, with a pidfd taken before
//! anything else could reap the child, and the child's progress is read later, without
//! blocking, from a close-on-exec pipe: end of file once the program runs, or the
//! [`Step`](super::sys::Step) that failed and its errno. The runner bounds that wait
//! ([`START_BOUND`](super::runner::START_BOUND)) and kills a child that overstays it.
//!
//! The child also waits, still as root (so that no user can stop it there), until the
//! daemon has recorded it: the parent writes a byte to the child's release pipe once its
//! pid and start time are committed. A daemon that dies first closes the pipe unwritten,
//! and the child exits without running anything: a restart finds either the recorded
//! process or the certainty that none ran.
//!
//! Everything the child uses is made before the fork (paths, argument and environment
//! arrays); after it, the child makes only raw system calls and allocates nothing.

use std::ffi::{CString, c_char};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Mutex, PoisonError};

use rustix::io::Errno;
use rustix::pipe::PipeFlags;

use liveness_proc::identity::ProcRoot;
use liveness_proc::pidref::{PidRef, UnreapedChild};

use super::sys::{self, ChildSetup, Step};

/// Held from the making of a child's private pipes to their close in the parent, so that
/// no other action's child, forked meanwhile, inherits them: one stopped before its exec
/// would hold them open, and this child's exec report would never end.
static FORK: Mutex<()> = Mutex::new(());

/// The program of an action and its environment, ready for `execve`.
#[derive(Debug)]
pub struct Program {
    /// Paths to try in turn, as `execvp` would: the program itself when it names a path,
    /// else the program in each directory of the action's `PATH`.
    candidates: Vec<CString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

impl Program {
    pub fn new(argv: &[String], env: &[(String, String)]) -> io::Result<Program> {
        let c = |text: String| {
            CString::new(text).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
        };
        let program = argv.first().cloned().unwrap_or_default();
        let path = env
            .iter()
            .rev()
            .find(|(name, _)| name == "PATH")
            .map_or("", |(_, value)| value.as_str());
        let candidates = if program.contains('/') || program.is_empty() {
            vec![c(program)?]
        } else {
            path.split(':')
                .map(|dir| {
                    let dir = if dir.is_empty() { "." } else { dir };
                    c(format!("{}/{program}", dir.trim_end_matches('/')))
                })
                .collect::<io::Result<_>>()?
        };
        Ok(Program {
            candidates,
            argv: argv.iter().cloned().map(c).collect::<io::Result<_>>()?,
            envp: env
                .iter()
                .map(|(name, value)| c(format!("{name}={value}")))
                .collect::<io::Result<_>>()?,
        })
    }
}

/// A child forked and not yet released to run its program.
#[derive(Debug)]
pub struct Forked {
    /// Taken before the fork returned to anyone else: always this child's.
    pub process: PidRef,
    /// Non-blocking: the child's report, at end of file once its program runs.
    pub report: OwnedFd,
    /// A byte written here lets the child go on ([`release`]); closed unwritten, the child
    /// exits without running anything.
    pub release: OwnedFd,
}

/// Lets a forked child go on to run its program, once it is recorded.
pub fn release(release: OwnedFd) -> io::Result<()> {
    // The pipe is new and holds nothing: a byte always fits, and the write never blocks.
    rustix::io::write(&release, &[1])?;
    Ok(())
}

/// Forks the child that will run `program` after `setup`, with `stdin` as its stdin,
/// nothing as its stdout and `stderr` as its stderr.
pub fn fork(
    proc: &ProcRoot,
    setup: &ChildSetup,
    program: &Program,
    stdin: OwnedFd,
    stderr: OwnedFd,
) -> io::Result<Forked> {
    let argv = pointers(&program.argv);
    let envp = pointers(&program.envp);
    let guard = FORK.lock().unwrap_or_else(PoisonError::into_inner);
    let null = rustix::fs::open(
        c"/dev/null",
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let (report, report_write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?;
    rustix::io::ioctl_fionbio(&report, true)?;
    let (gate, release) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?;
    let child = Child {
        setup,
        program,
        argv: &argv,
        envp: &envp,
        stdin: stdin.as_fd(),
        stdout: null.as_fd(),
        stderr: stderr.as_fd(),
        gate: gate.as_fd(),
        report: report_write.as_fd(),
    };
    // SAFETY: the child runs only `Child::run`, which makes async-signal-safe system calls
    // on data made before the fork and never returns.
    let pid = match unsafe { libc::fork() } {
        -1 => return Err(io::Error::last_os_error()),
        // SAFETY: in the child right after the fork, as `run` requires.
        0 => unsafe { child.run() },
        pid => pid,
    };
    drop(guard);
    let process = match PidRef::of_child(proc, pid.unsigned_abs()) {
        Ok(process) => process,
        Err(e) => {
            // Out of descriptors, say: it cannot be bounded, so it never runs. It waits at
            // its release (as root, so no user can have stopped it): the wait is short.
            if let Some(child) = UnreapedChild::new(pid.unsigned_abs()) {
                let _ = child.signal(rustix::process::Signal::KILL);
                let _ = child.reap();
            }
            return Err(io::Error::other(e));
        }
    };
    Ok(Forked {
        process,
        report,
        release,
    })
}

/// A null-terminated array of pointers into `strings`, for `execve`.
fn pointers(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// What the child holds between `fork` and `exec`.
struct Child<'a> {
    setup: &'a ChildSetup,
    program: &'a Program,
    argv: &'a [*const c_char],
    envp: &'a [*const c_char],
    stdin: BorrowedFd<'a>,
    stdout: BorrowedFd<'a>,
    stderr: BorrowedFd<'a>,
    gate: BorrowedFd<'a>,
    report: BorrowedFd<'a>,
}

impl Child<'_> {
    /// # Safety
    ///
    /// Only in the child right after `fork`.
    unsafe fn run(&self) -> ! {
        // The daemon's descriptors (its state lock, database, socket, eBPF maps, the
        // release end of the gate) are closed at once, not at the exec: a child waiting at
        // its gate after the daemon died would otherwise hold the state lock, and the
        // restarted daemon would find "another livenessd" there. (A daemon killed before
        // this child is scheduled still leaves it the lock a moment: the restart waits for
        // it, see `daemon::places::lock_state_dir`.)
        self.setup.linger();
        self.close_all_but_own();
        if !self.released() {
            sys::report_step(self.report, Step::Released, 0);
            // SAFETY: _exit(2) is async-signal-safe.
            unsafe { libc::_exit(127) };
        }
        // SAFETY: an empty mask made on the stack, and sigprocmask, are async-signal-safe.
        unsafe {
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        }
        for (from, to) in [(self.stdin, 0), (self.stdout, 1), (self.stderr, 2)] {
            // dup2 onto itself keeps close-on-exec: cleared by hand then.
            let done = if from.as_raw_fd() == to {
                // SAFETY: fcntl of a descriptor this process holds.
                unsafe { libc::fcntl(to, libc::F_SETFD, 0) }
            } else {
                // SAFETY: dup2 of descriptors this process holds.
                unsafe { libc::dup2(from.as_raw_fd(), to) }
            };
            if done < 0 {
                sys::report_step(self.report, Step::Descriptors, errno());
                // SAFETY: as above.
                unsafe { libc::_exit(127) };
            }
        }
        // SAFETY: in the child between fork and exec, as `apply` requires.
        if unsafe { self.setup.apply(self.report) }.is_ok() {
            let error = self.exec();
            sys::report_step(self.report, Step::Exec, error);
        }
        // SAFETY: as above.
        unsafe { libc::_exit(127) }
    }

    /// Closes every descriptor but the five this child uses (`close_range` between them;
    /// Linux 5.9+).
    fn close_all_but_own(&self) {
        let mut own = [self.stdin, self.stdout, self.stderr, self.gate, self.report]
            .map(|fd| fd.as_raw_fd() as libc::c_uint);
        own.sort_unstable();
        let mut first: libc::c_uint = 0;
        for fd in own.into_iter().chain([libc::c_uint::MAX]) {
            if fd > first {
                // SAFETY: a raw system call on descriptor numbers, async-signal-safe; the
                // descriptors closed are this child's copies.
                unsafe { libc::syscall(libc::SYS_close_range, first, fd - 1, 0) };
            }
            first = fd.saturating_add(1);
        }
    }

    /// Waits for the parent's byte: `false` when the parent closed the gate without it.
    fn released(&self) -> bool {
        let mut byte = [0u8];
        loop {
            match rustix::io::read(self.gate, &mut byte) {
                Ok(1) => return true,
                Err(Errno::INTR) => continue,
                _ => return false,
            }
        }
    }

    /// Tries each candidate path as `execvp` does; returns the errno to report.
    fn exec(&self) -> i32 {
        let mut error = libc::ENOENT;
        let mut denied = false;
        for path in &self.program.candidates {
            // SAFETY: null-terminated arrays of pointers to strings that outlive the call.
            unsafe { libc::execve(path.as_ptr(), self.argv.as_ptr(), self.envp.as_ptr()) };
            error = errno();
            match error {
                libc::EACCES => denied = true,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => return error,
            }
        }
        if denied { libc::EACCES } else { error }
    }
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
