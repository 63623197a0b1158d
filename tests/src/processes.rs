//! Real processes whose death the test decides ([`spawn_orphan`], [`Orphan`], [`Family`]),
//! and `/proc` read with the daemon's own parser ([`proc_root`]).

use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;

use liveness_proc::identity::ProcRoot;

use crate::binary;

/// `/proc` as the daemon reads it, with the daemon's own `/proc/<pid>/stat` parser.
pub fn proc_root() -> &'static ProcRoot {
    static PROC: OnceLock<ProcRoot> = OnceLock::new();
    PROC.get_or_init(ProcRoot::default)
}

/// Start time of a process in clock ticks (`/proc/<pid>/stat` field 22), as the daemon
/// records it.
pub fn start_ticks(pid: u32) -> Option<u64> {
    proc_root().stat(pid).ok().map(|stat| stat.start_ticks)
}

/// `/proc/<pid>/stat` state letter, if the process exists.
pub fn state(pid: u32) -> Option<char> {
    proc_root().stat(pid).ok().map(|stat| stat.state)
}

/// Makes a process that is not the caller's child: a middle process, in a new session so
/// that the caller's terminal signals miss it, forks `orphan` and exits at once, so the
/// orphan is reparented to init or the nearest subreaper. Returns once the middle process
/// is reaped. Between the forks only async-signal-safe calls are made, so a multi-threaded
/// caller may use it, as long as `orphan` keeps to such calls too. If `orphan` returns,
/// the orphan exits with status 0.
pub fn spawn_orphan(orphan: impl FnOnce()) -> std::io::Result<()> {
    // SAFETY: the child makes only async-signal-safe calls (setsid, fork, _exit) before
    // `orphan`, whose contract says the same.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => {
            // SAFETY: as above.
            unsafe { libc::setsid() };
            // SAFETY: as above; the middle process only forks and exits.
            match unsafe { libc::fork() } {
                0 => {
                    orphan();
                    // SAFETY: _exit, not exit: the caller's atexit handlers and buffers are
                    // not the orphan's to run or flush.
                    unsafe { libc::_exit(0) }
                }
                // SAFETY: _exit ends the middle process without running the caller's
                // destructors, which belong to the caller.
                -1 => unsafe { libc::_exit(1) },
                // SAFETY: as above.
                _ => unsafe { libc::_exit(0) },
            }
        }
        middle => {
            let mut status = 0;
            // SAFETY: reaping the middle process just forked.
            unsafe { libc::waitpid(middle, &mut status, 0) };
            if status == 0 {
                Ok(())
            } else {
                Err(std::io::Error::other(format!(
                    "the middle process of a double fork failed to fork (wait status {status:#x})"
                )))
            }
        }
    }
}

/// A process that is not the test's child and dies only when the test says so.
#[derive(Debug)]
pub struct Orphan {
    pub pid: u32,
    pub start_ticks: u64,
    control: Option<ChildStdin>,
}

impl Orphan {
    /// `testproc orphan MODE...` (see `src/bin/testproc.rs` for the modes).
    pub fn spawn(mode: &[&str]) -> Orphan {
        let mut child = Command::new(binary("testproc"))
            .arg("orphan")
            .args(mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn testproc: {e}"));
        let control = child.stdin.take();
        let pid = read_pid(&mut child);
        Orphan {
            pid,
            start_ticks: wait_start_ticks(pid),
            control,
        }
    }

    /// Writes a line to the process (the trigger of the `exec` modes).
    pub fn poke(&mut self) {
        let control = self.control.as_mut().expect("control pipe already closed");
        control
            .write_all(b"go\n")
            .expect("write to the control pipe");
    }

    /// Closes the control pipe: the process dies as its mode says.
    pub fn release(&mut self) {
        self.control = None;
    }
}

impl Drop for Orphan {
    fn drop(&mut self) {
        kill_if_same(self.pid, self.start_ticks);
    }
}

/// A process named by its fingerprint, which the test may check and kill without ever
/// touching another process that took its pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    pub pid: u32,
    pub start_ticks: u64,
}

impl Fingerprint {
    pub fn of(pid: u32) -> Fingerprint {
        Fingerprint {
            pid,
            start_ticks: wait_start_ticks(pid),
        }
    }

    /// Still this process, and not a zombie (an orphan's is reaped whenever init gets to it).
    pub fn is_running(&self) -> bool {
        proc_root()
            .stat(self.pid)
            .is_ok_and(|stat| stat.start_ticks == self.start_ticks && !stat.has_exited())
    }

    pub fn kill(&self) {
        kill_if_same(self.pid, self.start_ticks);
    }
}

/// `testproc family`: an owner whose descendants become orphans, as a session's process
/// tree does (see `src/bin/testproc.rs`). Every process of it is killed on drop.
#[derive(Debug)]
pub struct Family {
    owner: Child,
    commands: ChildStdin,
    replies: BufReader<std::process::ChildStdout>,
    /// The descendant it had from the start, under a middle process until [`Family::release`].
    pub before: Fingerprint,
    members: Vec<Fingerprint>,
}

impl Family {
    pub fn spawn() -> Family {
        let mut owner = Command::new(binary("testproc"))
            .arg("family")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn testproc family: {e}"));
        let commands = owner.stdin.take().expect("stdin");
        let mut replies = BufReader::new(owner.stdout.take().expect("stdout"));
        let before = Fingerprint::of(read_pid_line(&mut replies));
        Family {
            owner,
            commands,
            replies,
            before,
            members: vec![before],
        }
    }

    pub fn pid(&self) -> u32 {
        self.owner.id()
    }

    fn ask(&mut self, command: &str) -> u32 {
        writeln!(self.commands, "{command}").expect("write to testproc family");
        let pid = read_pid_line(&mut self.replies);
        if command == "release" {
            return pid;
        }
        let member = Fingerprint::of(pid);
        self.members.push(member);
        pid
    }

    /// Ends the middle process above [`Family::before`], which is reparented to init (or
    /// the nearest subreaper) before this returns.
    pub fn release(&mut self) {
        self.ask("release");
    }

    /// A new descendant, orphaned at once.
    pub fn orphan(&mut self) -> Fingerprint {
        Fingerprint::of(self.ask("orphan"))
    }

    /// A new orphaned descendant that ignores SIGTERM.
    pub fn stubborn(&mut self) -> Fingerprint {
        Fingerprint::of(self.ask("stubborn"))
    }

    /// A new orphaned descendant that runs as user and group `uid` (the owner must be root).
    pub fn orphan_as(&mut self, uid: u32) -> Fingerprint {
        Fingerprint::of(self.ask(&format!("as {uid}")))
    }

    /// SIGKILLs the owner and reaps it; its descendants live on.
    pub fn kill_owner(&mut self) {
        let _ = self.owner.kill();
        let _ = self.owner.wait();
    }

    /// Reaps the owner once it has died (of a signal the test did not send itself).
    pub fn reap_owner(&mut self) -> std::process::ExitStatus {
        self.owner.wait().expect("reap testproc family")
    }
}

impl Drop for Family {
    fn drop(&mut self) {
        self.kill_owner();
        for member in &self.members {
            member.kill();
        }
    }
}

fn read_pid_line(from: &mut impl BufRead) -> u32 {
    let mut line = String::new();
    from.read_line(&mut line).expect("read a PID from testproc");
    line.trim()
        .parse()
        .unwrap_or_else(|_| panic!("testproc printed {line:?}, not a PID"))
}

/// Many orphans sharing one control pipe: they all die at once when it closes.
#[derive(Debug)]
pub struct OrphanGroup {
    pub members: Vec<(u32, u64)>,
    control: Option<OwnedFd>,
}

impl OrphanGroup {
    pub fn spawn(count: usize, mode: &[&str]) -> OrphanGroup {
        let (read, write) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe");
        let members = (0..count)
            .map(|_| {
                let mut child = Command::new(binary("testproc"))
                    .arg("orphan")
                    .args(mode)
                    .stdin(Stdio::from(read.try_clone().expect("dup")))
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap_or_else(|e| panic!("cannot spawn testproc: {e}"));
                let pid = read_pid(&mut child);
                (pid, wait_start_ticks(pid))
            })
            .collect();
        OrphanGroup {
            members,
            control: Some(write),
        }
    }

    pub fn release(&mut self) {
        self.control = None;
    }
}

impl Drop for OrphanGroup {
    fn drop(&mut self) {
        for &(pid, start) in &self.members {
            kill_if_same(pid, start);
        }
    }
}

fn read_pid(child: &mut Child) -> u32 {
    let pid = read_pid_line(&mut BufReader::new(child.stdout.take().expect("stdout")));
    let status = child.wait().expect("reap the middle process");
    assert!(status.success(), "testproc orphan failed: {status}");
    pid
}

fn wait_start_ticks(pid: u32) -> u64 {
    start_ticks(pid).unwrap_or_else(|| panic!("orphan {pid} vanished before it was released"))
}

fn kill_if_same(pid: u32, start: u64) {
    if start_ticks(pid) == Some(start) {
        // SAFETY: signalling a process we started, checked by its start time.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
}
