//! Real processes and channel helpers for the sources' tests.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::sync::mpsc::Receiver;

use super::{ExitObservation, SourceEvent};
use liveness_common::identity::ProcessKey;
use liveness_proc::identity::ProcRoot;

/// How long a test waits for an observation that must come. Generous: machines are noisy,
/// and a correct run never waits this long.
pub const PATIENCE: Duration = Duration::from_secs(10);
/// How long a test listens to be convinced that nothing comes.
pub const QUIET: Duration = Duration::from_millis(300);

/// A child process that is SIGKILLed and reaped on drop, so a failing test leaves none behind.
#[derive(Debug)]
pub struct Proc(pub Child);

impl Proc {
    /// Without the test run's output: a descendant that outlived its test would hold it
    /// open, and whoever reads the run's output to its end would wait for it.
    pub fn spawn(command: &mut Command) -> Proc {
        Proc(
            command
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot spawn {command:?}: {e}")),
        )
    }

    /// A process that lives until it is killed.
    pub fn sleeper() -> Proc {
        Proc::spawn(Command::new("sleep").arg("1000").stdin(Stdio::null()))
    }

    /// `sh -c script` with `args` as `$1`..., and a piped stdin the script can block on.
    pub fn sh(script: &str, args: &[&str]) -> Proc {
        Proc::spawn(
            Command::new("sh")
                .args(["-c", script, "sh"])
                .args(args)
                .stdin(Stdio::piped()),
        )
    }

    /// A shell that exits with `code` once its stdin is closed ([`Proc::close_stdin`]), so
    /// the test decides when it dies.
    pub fn exit_on_eof(code: u8) -> Proc {
        Proc::sh("read x; exit \"$1\"", &[&code.to_string()])
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// The process's real fingerprint, read from `/proc`.
    pub fn key(&self) -> ProcessKey {
        let pid = self.pid();
        let stat = ProcRoot::default()
            .stat(pid)
            .unwrap_or_else(|e| panic!("cannot read the stat of test process {pid}: {e}"));
        ProcessKey {
            pid,
            start_ticks: stat.start_ticks,
        }
    }

    /// Writes one byte to the process's stdin.
    pub fn poke(&mut self) {
        let stdin = self
            .0
            .stdin
            .as_mut()
            .expect("the process was spawned with piped stdin");
        std::io::Write::write_all(stdin, b"x")
            .unwrap_or_else(|e| panic!("cannot write to test process {}: {e}", self.0.id()));
    }

    pub fn close_stdin(&mut self) {
        drop(
            self.0
                .stdin
                .take()
                .expect("the process was spawned with piped stdin"),
        );
    }

    pub fn kill(&mut self) {
        self.0
            .kill()
            .unwrap_or_else(|e| panic!("cannot kill test process {}: {e}", self.pid()));
    }

    /// Waits for the process to exit and reaps it.
    pub fn reap(&mut self) -> std::process::ExitStatus {
        self.0
            .wait()
            .unwrap_or_else(|e| panic!("cannot reap test process {}: {e}", self.pid()))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Both are no-ops for a process the test already reaped.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The next event, which must be an exit observation arriving within [`PATIENCE`].
pub async fn next_exit(rx: &mut Receiver<SourceEvent>) -> ExitObservation {
    match tokio::time::timeout(PATIENCE, rx.recv()).await {
        Ok(Some(SourceEvent::Exit(observation))) => observation,
        Ok(Some(other)) => panic!("expected an exit observation, got {other:?}"),
        Ok(None) => panic!("the source closed its channel"),
        Err(_) => panic!("no exit observation within {PATIENCE:?}"),
    }
}

/// Polls `condition` until it holds; fails after [`PATIENCE`], saying `what` never came.
pub async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Panics if any event arrives within [`QUIET`]; `why` says why none should.
pub async fn assert_quiet(rx: &mut Receiver<SourceEvent>, why: &str) {
    if let Ok(event) = tokio::time::timeout(QUIET, rx.recv()).await {
        panic!("{why}, yet the source sent {event:?}");
    }
}

/// Whether eBPF tests can run here (root, BTF); says why not, and with
/// `LIVENESS_REQUIRE_EBPF=1` fails instead of skipping.
pub fn privileged(test: &str) -> bool {
    let btf = std::path::Path::new("/sys/kernel/btf/vmlinux").exists();
    required(
        test,
        not_root().or((!btf).then_some("the kernel lacks BTF")),
    )
}

/// Whether tests that need root (a second uid, capabilities) can run here; skips or, with
/// `LIVENESS_REQUIRE_EBPF=1` (privileged tests must run), fails when not.
pub fn root(test: &str) -> bool {
    required(test, not_root())
}

fn not_root() -> Option<&'static str> {
    (!rustix::process::geteuid().is_root()).then_some("not running as root")
}

fn required(test: &str, missing: Option<&str>) -> bool {
    let Some(why) = missing else {
        return true;
    };
    if std::env::var_os("LIVENESS_REQUIRE_EBPF").is_some_and(|v| v == "1") {
        panic!("{test}: LIVENESS_REQUIRE_EBPF=1 but {why}");
    }
    eprintln!("skipping {test}: {why}");
    false
}
