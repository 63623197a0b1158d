//! A real `livenessd` on a private socket and state directory, and the requests most
//! tests start with.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::{BinariesForAnyUser, Conn, binary, eventually};

/// A daemon whose socket other users can reach (the test's temp dir is private by
/// default), and the binaries they can run.
pub fn shared_daemon() -> (Daemon, BinariesForAnyUser) {
    shared_daemon_with(&[])
}

/// [`shared_daemon`] started with `args`.
pub fn shared_daemon_with(args: &[&str]) -> (Daemon, BinariesForAnyUser) {
    let daemon = Daemon::start(args);
    open_socket_to_everyone(&daemon);
    (daemon, BinariesForAnyUser::new())
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

    /// Waits a moment, then checks that session `id` is still active (`when` says after
    /// what, for the failure's message).
    pub fn still_active(&self, id: &str, when: &str) {
        std::thread::sleep(Duration::from_millis(300));
        let session = self.session(id);
        assert_eq!(session["phase"], "active", "{id} {when}: {session}");
    }

    /// The session `id` (of user `uid`, for root) once it is finalized: ended, and each of
    /// its end actions with its outcome; fails the test if that takes over 20 s.
    pub fn wait_finalized(&self, id: &str, uid: Option<u32>) -> Value {
        let mut last = Value::Null;
        let done = eventually(Duration::from_secs(20), || {
            let mut request = serde_json::json!({"op": "get", "session": id});
            if let Some(uid) = uid {
                request["uid"] = uid.into();
            }
            last = self.request(request)["session"].clone();
            last["finalized_ms"].is_i64()
        });
        assert!(done, "{id} was not finalized: {last}\n{}", self.log());
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

/// GET `path` from a metrics listener over plain HTTP, as a scraper does it: the whole
/// response, or a failure after 10 s (a scraper's usual timeout).
pub fn scrape(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
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
    for dir in [daemon.dir.path(), daemon.socket.parent().unwrap()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// Runs `livenessd` on `state_dir`, expecting it to refuse to start; returns its stderr.
pub fn refused_start(state_dir: &Path, extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let stderr_path = dir.path().join("stderr");
    let mut child = Command::new(binary("livenessd"))
        .arg("--socket")
        .arg(dir.path().join("liveness.sock"))
        .arg("--state-dir")
        .arg(state_dir)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).expect("create the stderr file"))
        .spawn()
        .expect("run livenessd");
    // A daemon that starts does not exit by itself: stopped, it fails the test, not hangs it.
    let mut status = None;
    eventually(Duration::from_secs(30), || {
        status = child.try_wait().expect("wait for livenessd");
        status.is_some()
    });
    if status.is_none() {
        let _ = child.kill();
        status = child.wait().ok();
    }
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(1),
        "it started: {stderr}"
    );
    stderr
}
