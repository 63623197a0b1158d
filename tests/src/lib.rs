//! The test kit of the integration tests and the benchmark harness (`liveness-bench`): the
//! real binaries, real processes whose death the caller decides ([`spawn_orphan`],
//! [`Orphan`]), `/proc` read with the daemon's own parser ([`proc_root`]), and a real
//! daemon on a private socket and state directory ([`Daemon`], [`Conn`]). It depends on
//! nothing test-only, so the benchmark can link it.
//!
//! Binaries: `LIVENESS_BIN_DIR` names a directory holding `livenessd`, `liveness` and
//! `testproc` (for VMs, where there is no cargo); otherwise they are built once per test
//! binary with the cargo that runs the tests, so a stale binary is never tested.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use liveness_proc::identity::ProcRoot;
use serde_json::Value;

/// How many rounds a fault test repeats: `normal` in an ordinary test run, or
/// `LIVENESS_FAULT_ROUNDS` (which `cargo xtask chaos` sets higher).
pub fn fault_rounds(normal: usize) -> usize {
    match std::env::var("LIVENESS_FAULT_ROUNDS") {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("LIVENESS_FAULT_ROUNDS={text:?} is not a number of rounds")),
        Err(_) => normal,
    }
}

/// Path of one of the project's programs, built fresh: the binaries, and the client
/// crate's examples (which cargo puts under `examples/`).
pub fn binary(name: &str) -> PathBuf {
    static BIN_DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = BIN_DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("LIVENESS_BIN_DIR") {
            return PathBuf::from(dir);
        }
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build.args([
            "build",
            "--quiet",
            "-p",
            "liveness-daemon",
            "-p",
            "liveness-cli",
            "-p",
            "liveness-client",
            "-p",
            "integration-tests",
            "--bins",
            "--examples",
        ]);
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        let status = build
            .status()
            .unwrap_or_else(|e| panic!("cannot run cargo to build the binaries: {e}"));
        assert!(status.success(), "building the binaries failed: {status}");
        // target/<profile>/deps/<test> -> target/<profile>
        let exe = std::env::current_exe().expect("test executable path");
        exe.parent()
            .and_then(Path::parent)
            .expect("target/<profile> directory")
            .to_path_buf()
    });
    let path = dir.join(name);
    if path.exists() {
        return path;
    }
    let example = dir.join("examples").join(name);
    assert!(
        example.exists(),
        "{} is missing (nor is it an example)",
        path.display()
    );
    example
}

/// The project's binaries where another user can run them. A checkout under a private
/// directory (a 0700 home, say) keeps other users out, so the binaries are then hard-linked
/// (or copied) into an opened-up temporary directory, removed on drop.
#[derive(Debug)]
pub struct BinariesForAnyUser {
    dir: Option<tempfile::TempDir>,
}

impl BinariesForAnyUser {
    pub fn new() -> BinariesForAnyUser {
        let original = binary("liveness");
        let searchable = original
            .ancestors()
            .skip(1)
            .all(|dir| std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
        if searchable {
            return BinariesForAnyUser { dir: None };
        }
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        for name in ["liveness", "livenessd"] {
            let (from, to) = (binary(name), dir.path().join(name));
            if std::fs::hard_link(&from, &to).is_err() {
                copy_executable(&from, &to);
            }
        }
        BinariesForAnyUser { dir: Some(dir) }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        match &self.dir {
            Some(dir) => dir.path().join(name),
            None => binary(name),
        }
    }
}

impl Default for BinariesForAnyUser {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs the `liveness` CLI as user `uid` (and its group of the same number) against
/// `daemon`.
pub fn cli_as(binaries: &BinariesForAnyUser, daemon: &Daemon, uid: u32, args: &[&str]) -> Output {
    Command::new(binaries.path("liveness"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(args)
        .uid(uid)
        .gid(uid)
        .output()
        .expect("run liveness as another user")
}

/// The JSON a command printed, failing the test with its output if it is none.
pub fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {:?} stderr {:?}",
            output.stdout,
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// A process owned by `uid` (`sleep 300`) that lives until dropped.
#[derive(Debug)]
pub struct UserProcess(Child);

impl UserProcess {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for UserProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn process_of(uid: u32) -> UserProcess {
    let child = Command::new("sleep")
        .arg("300")
        .uid(uid)
        .gid(uid)
        .spawn()
        .expect("spawn a process as another user");
    UserProcess(child)
}

/// A daemon whose socket other users can reach (the test's temp dir is private by
/// default), and the binaries they can run.
pub fn shared_daemon() -> (Daemon, BinariesForAnyUser) {
    shared_daemon_with(&[])
}

/// [`shared_daemon`] started with `args`.
pub fn shared_daemon_with(args: &[&str]) -> (Daemon, BinariesForAnyUser) {
    let daemon = Daemon::start(args);
    let binaries = BinariesForAnyUser::new();
    for dir in [
        daemon.dir.path().to_path_buf(),
        daemon.socket.parent().unwrap().to_path_buf(),
    ] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    (daemon, binaries)
}

/// Whether privileged tests can run here (root, BTF). When they cannot, prints why and
/// returns false — unless `LIVENESS_REQUIRE_EBPF=1`, where skipping is a failure.
pub fn privileged(test: &str) -> bool {
    let why = if !rustix::process::geteuid().is_root() {
        Some("not running as root")
    } else if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        Some("the kernel has no BTF (/sys/kernel/btf/vmlinux)")
    } else {
        None
    };
    match why {
        None => true,
        Some(why) if std::env::var("LIVENESS_REQUIRE_EBPF").as_deref() == Ok("1") => {
            panic!("{test}: LIVENESS_REQUIRE_EBPF=1 but {why}")
        }
        Some(why) => {
            eprintln!("SKIPPED {test}: {why}");
            false
        }
    }
}

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

/// Copies an executable so that it can be run at once. `cp` writes it, not this process:
/// a process forked meanwhile by another test's thread would inherit a descriptor open for
/// writing the copy, and until that process execs, running the copy fails with ETXTBSY.
pub fn copy_executable(from: &Path, to: &Path) {
    let copied = Command::new("cp")
        .arg(from)
        .arg(to)
        .status()
        .unwrap_or_else(|e| panic!("run cp: {e}"));
    assert!(
        copied.success(),
        "cp {} {}: {copied}",
        from.display(),
        to.display()
    );
}

/// Polls `condition` until it holds or `timeout` passes.
pub fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
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

/// A real `livenessd` on a private socket and state directory.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    /// The `livenessd` binary run.
    program: PathBuf,
    /// `LIVENESS_LOG` of the daemon.
    log_level: &'static str,
    /// A command the daemon runs under (`unshare ...`, a seccomp wrapper), or empty.
    prefix: Vec<String>,
    args: Vec<String>,
}

impl Daemon {
    pub fn start(args: &[&str]) -> Daemon {
        Daemon::start_with_state(None, args)
    }

    /// Like [`Daemon::start`], with the state in `state_dir` (default: in its temp dir).
    pub fn start_with_state(state_dir: Option<PathBuf>, args: &[&str]) -> Daemon {
        Daemon::start_under(&[], state_dir, args)
    }

    /// Like [`Daemon::start_with_state`], run as `PREFIX... livenessd ARGS...`, e.g. inside
    /// new namespaces made by `unshare`. [`Daemon::pid`] is then the prefix's first process.
    pub fn start_under(prefix: &[&str], state_dir: Option<PathBuf>, args: &[&str]) -> Daemon {
        Daemon::start_program(&binary("livenessd"), "debug", prefix, state_dir, args)
    }

    /// Runs `livenessd` from a given path (a release build for a benchmark, say), logging
    /// at `log_level` (debug logging would slow what a benchmark measures).
    pub fn start_release(livenessd: &Path, log_level: &'static str, args: &[&str]) -> Daemon {
        Daemon::start_program(livenessd, log_level, &[], None, args)
    }

    fn start_program(
        livenessd: &Path,
        log_level: &'static str,
        prefix: &[&str],
        state_dir: Option<PathBuf>,
        args: &[&str],
    ) -> Daemon {
        let dir = tempfile::tempdir().expect("temp dir");
        // livenessd creates no socket directory but its default one.
        std::fs::create_dir(dir.path().join("run")).expect("socket dir");
        let socket = dir.path().join("run/liveness.sock");
        let state_dir = state_dir.unwrap_or_else(|| dir.path().join("state"));
        let mut daemon = Daemon {
            child: None,
            dir,
            socket,
            state_dir,
            program: livenessd.to_owned(),
            log_level,
            prefix: prefix.iter().map(|a| (*a).to_owned()).collect(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
        };
        daemon.spawn();
        daemon
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("daemon log file");
        let mut command = match self.prefix.split_first() {
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(&self.program);
                command
            }
            None => Command::new(&self.program),
        };
        let child = command
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state_dir)
            .args(&self.args)
            .env("LIVENESS_LOG", self.log_level)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start livenessd: {e}"));
        self.child = Some(child);
        let ready = eventually(Duration::from_secs(20), || {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("livenessd exited during start ({status}):\n{}", self.log());
            }
            // Ready once open to everyone: the daemon listens a moment before it opens the
            // socket's mode, and tells its supervisor it is ready only after.
            let open = std::fs::metadata(&self.socket)
                .is_ok_and(|socket| socket.permissions().mode() & 0o777 == 0o666);
            open && UnixStream::connect(&self.socket).is_ok()
        });
        assert!(
            ready,
            "livenessd did not listen within 20 s:\n{}",
            self.log()
        );
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("livenessd.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon running").id()
    }

    /// Sends a signal without waiting.
    pub fn signal(&self, signal: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.pid() as i32, signal) };
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("daemon running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// SIGTERM, and the exit status; SIGKILL and a failure if it has not stopped in 30 s.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        self.signal(libc::SIGTERM);
        let mut child = self.child.take().expect("daemon running");
        let mut status = None;
        if !eventually(Duration::from_secs(30), || {
            status = child.try_wait().expect("wait for livenessd");
            status.is_some()
        }) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "livenessd did not stop within 30 s of SIGTERM:\n{}",
                self.log()
            );
        }
        status.expect("exited")
    }

    /// The exit status, once the daemon has exited on its own.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Starts it again on the same socket and state (after `kill9` or `stop`).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the daemon before restarting it");
        self.spawn();
    }

    pub fn connect(&self) -> Conn {
        Conn::connect(&self.socket)
    }

    /// Runs the `liveness` CLI against this daemon.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(binary("liveness"))
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run liveness")
    }

    /// One request on a fresh connection.
    pub fn request(&self, request: Value) -> Value {
        self.connect().request(request)
    }

    /// The exit source `name` as `status` reports it, failing the test if it is not listed.
    pub fn source_status(&self, name: &str) -> Value {
        let reply = self.request(serde_json::json!({"op": "status"}));
        reply["status"]["monitor"]["sources"]
            .as_array()
            .and_then(|sources| sources.iter().find(|source| source["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no {name} source in {reply}"))
    }

    /// The address of `--metrics-listen`, as the daemon logs it.
    pub fn metrics_addr(&self) -> String {
        self.log()
            .lines()
            .find(|line| line.contains("metrics listening"))
            .and_then(|line| line.split("addr=").nth(1))
            .and_then(|addr| addr.split_whitespace().next())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no 'metrics listening' line:\n{}", self.log()))
    }

    /// The session `id`, failing the test if `get` fails.
    pub fn session(&self, id: &str) -> Value {
        let reply = self.request(serde_json::json!({"op": "get", "session": id}));
        assert_eq!(reply["ok"], true, "get {id}: {reply}");
        reply["session"].clone()
    }

    /// The session `id` once it has ended, failing the test if that takes over 15 s.
    pub fn wait_ended(&self, id: &str) -> Value {
        let mut last = Value::Null;
        let ended = eventually(Duration::from_secs(15), || {
            last = self.session(id);
            last["phase"] == "ended"
        });
        assert!(ended, "{id} did not end: {last}\n{}", self.log());
        last
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- livenessd log ---\n{}", self.log());
        }
    }
}

/// Registers `session` with process `pid` as its owner; the registration must succeed.
pub fn register(daemon: &Daemon, session: &str, pid: u32) -> Value {
    let reply = daemon
        .request(serde_json::json!({"op": "register", "session": session, "owner": {"pid": pid}}));
    assert_eq!(reply["ok"], true, "register {session}: {reply}");
    reply["session"].clone()
}

/// Subscribes (replaying after `since` when given) and checks the acknowledgement.
pub fn subscribe(daemon: &Daemon, since: Option<u64>) -> Conn {
    let mut conn = daemon.connect();
    let request = match since {
        Some(since) => serde_json::json!({"op": "subscribe", "since": since}),
        None => serde_json::json!({"op": "subscribe"}),
    };
    let ack = conn.request(request);
    assert_eq!(ack["ok"], true, "subscribe: {ack}");
    conn
}

/// The next event on a subscription, failing on anything else.
pub fn next_event(conn: &mut Conn) -> Value {
    let line = conn
        .next_within(Duration::from_secs(10))
        .expect("an event within the deadline");
    assert!(line.get("event").is_some(), "expected an event, got {line}");
    line["event"].clone()
}

/// A raw protocol connection.
#[derive(Debug)]
pub struct Conn {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Conn {
    pub fn connect(socket: &Path) -> Conn {
        let stream = UnixStream::connect(socket)
            .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        let writer = stream.try_clone().expect("clone stream");
        Conn {
            // Large reads: in a burst the reader must not be what holds up the stream.
            reader: BufReader::with_capacity(256 * 1024, stream),
            writer,
        }
    }

    /// The reader, with the bytes already read past the last reply (stream lines may follow
    /// an acknowledgement in the same read), and the writer: for a caller that reads and
    /// writes on its own terms, such as a pipelining benchmark.
    pub fn into_parts(self) -> (BufReader<UnixStream>, UnixStream) {
        (self.reader, self.writer)
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).expect("write to livenessd");
    }

    pub fn request(&mut self, request: Value) -> Value {
        self.send_raw(format!("{request}\n").as_bytes());
        self.next_line()
            .unwrap_or_else(|| panic!("no reply to {request}"))
    }

    /// The next line, or `None` when the connection closed.
    pub fn next_line(&mut self) -> Option<Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => None,
            Ok(_) => Some(
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad line {line:?}: {e}")),
            ),
            Err(e) => panic!("reading from livenessd: {e}"),
        }
    }

    /// The next line within `timeout`, `None` if nothing arrives.
    pub fn next_within(&mut self, timeout: Duration) -> Option<Value> {
        self.reader
            .get_ref()
            .set_read_timeout(Some(timeout))
            .expect("read timeout");
        let mut line = String::new();
        let read = self.reader.read_line(&mut line);
        self.reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        match read {
            Ok(0) => None,
            Ok(_) => Some(
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad line {line:?}: {e}")),
            ),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("reading from livenessd: {e}"),
        }
    }
}

impl Conn {
    /// The next event of `kind` about `session`, skipping other lines; fails after `within`.
    pub fn next_event_of(&mut self, kind: &str, session: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(line) = self.next_within(left.max(Duration::from_millis(1))) else {
                panic!("no {kind} event for {session} within {within:?}");
            };
            let event = &line["event"];
            if event["kind"] == kind && event["session"] == session {
                return event.clone();
            }
        }
    }
}

/// GET `path` from a metrics listener over plain HTTP, as a scraper does it: the whole
/// response, or a failure after 10 s (a scraper's usual timeout).
pub fn scrape(addr: &str, path: &str) -> String {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the metrics listener");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .unwrap_or_else(|e| panic!("no answer to GET {path} within 10 s: {e}"));
    response
}

/// Lets other users reach the daemon's socket (the test's temp dir is private).
pub fn open_socket_to_everyone(daemon: &Daemon) {
    use std::os::unix::fs::PermissionsExt;
    for dir in [daemon.dir.path(), daemon.socket.parent().unwrap()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// `testproc ARGS...` run as user `uid` (and its group of the same number), with stdin
/// and stdout piped; killed and waited for on drop.
#[derive(Debug)]
pub struct TestprocAs {
    child: Child,
    pub to: Option<ChildStdin>,
    from: BufReader<std::process::ChildStdout>,
}

impl TestprocAs {
    pub fn spawn(uid: u32, args: &[&str]) -> TestprocAs {
        TestprocAs::spawn_niced(uid, 0, args)
    }

    /// [`TestprocAs::spawn`] at niceness `nice`.
    pub fn spawn_niced(uid: u32, nice: i32, args: &[&str]) -> TestprocAs {
        let mut command = Command::new(binary("testproc"));
        // SAFETY: setpriority is async-signal-safe.
        unsafe {
            command.pre_exec(move || {
                libc::setpriority(libc::PRIO_PROCESS, 0, nice);
                Ok(())
            });
        }
        let mut child = command
            .args(args)
            .uid(uid)
            .gid(uid)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run testproc {args:?} as uid {uid}: {e}"));
        TestprocAs {
            to: child.stdin.take(),
            from: BufReader::new(child.stdout.take().expect("stdout")),
            child,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line it prints, or `None` once its stdout closed.
    pub fn read_line(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.from.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line),
        }
    }

    /// The lines it prints from now on, read on a thread of their own, so that a test can
    /// wait for one with a deadline. The process is dropped once its stdout closes.
    pub fn into_lines(mut self) -> std::sync::mpsc::Receiver<String> {
        let (lines, received) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            while let Some(line) = self.read_line() {
                if lines.send(line).is_err() {
                    return;
                }
            }
        });
        received
    }
}

impl Drop for TestprocAs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A raw protocol connection of another uid (`testproc client`, run as that uid).
#[derive(Debug)]
pub struct ClientAs(pub TestprocAs);

impl ClientAs {
    pub fn connect(daemon: &Daemon, uid: u32) -> ClientAs {
        ClientAs(TestprocAs::spawn(
            uid,
            &["client", &daemon.socket.to_string_lossy()],
        ))
    }

    /// Sends a line; a connection the daemon already closed just does not take it.
    pub fn send(&mut self, request: &Value) {
        if let Some(to) = self.0.to.as_mut() {
            let _ = writeln!(to, "{request}");
        }
    }

    /// The next reply or stream line, or `None` once the connection closed.
    pub fn next_line(&mut self) -> Option<Value> {
        let line = self.0.read_line()?;
        Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
    }

    pub fn request(&mut self, request: &Value) -> Option<Value> {
        self.send(request);
        self.next_line()
    }

    /// Waits until `processes` lists `count` processes in `session`'s tree (an owner's
    /// descendants join it off the engine, a slice at a time); fails the test with the
    /// last count otherwise.
    pub fn wait_for_tree(&mut self, session: &str, count: usize, within: Duration) {
        let mut listed = 0;
        let complete = eventually(within, || {
            let reply = self
                .request(&serde_json::json!({"op": "processes", "session": session}))
                .expect("a reply to processes");
            listed = reply["processes"].as_array().map_or(0, Vec::len);
            listed == count
        });
        assert!(
            complete,
            "{listed} processes in the tree of {session}, not {count}"
        );
    }
}
