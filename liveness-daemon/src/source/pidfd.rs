//! Exit source backed by pidfds (Linux 5.3+).
//!
//! A pidfd names one process, not a PID number, so PID reuse cannot fool it, and it becomes
//! readable once the process's last thread has exited. Each tracked process costs one file
//! descriptor (so the open-file limit caps coverage: see [`raise_nofile_limit`]) and one
//! small tokio task parked on the fd's readiness. Every task's [`AbortHandle`] is kept, so
//! `untrack` and drop cancel it: no task outlives the source.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use rustix::io::Errno;
use rustix::process::{Resource, Rlimit};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::runtime::Handle;
use tokio::task::AbortHandle;
use tracing::{debug, warn};

use super::child::ProbeChild;
use liveness_common::status::SourceStats;

use super::{EventSink, ExitObservation, ExitSource, SourceEvent, TrackError};
use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::identity::{DeathReason, ProcessKey};
use liveness_proc::diagnose::{self, Denial};
use liveness_proc::identity::{IdentityError, ProcRoot};
use liveness_proc::pidfd::open_pidfd;
use liveness_proc::pidref::{PidRef, PidRefError};

/// Why the pidfd source cannot run.
#[derive(Debug, thiserror::Error)]
pub enum PidfdError {
    /// `pidfd_open(2)` is unavailable: filtered, missing or refused (see [`Denial`]).
    #[error(transparent)]
    Denied(Denial),
    #[error("pidfd_open fails on the daemon's own PID: {0}")]
    Probe(#[source] io::Error),
}

/// Raises the soft open-file limit as far as the hard limit, since every process the pidfd
/// source tracks holds a file descriptor. Returns the `(soft, hard)` limits now in force;
/// `u64::MAX` stands for unlimited.
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    let Rlimit { current, maximum } = rustix::process::getrlimit(Resource::Nofile);
    let target = match maximum {
        Some(hard) => hard,
        // Even an unlimited hard limit does not let the soft one pass fs.nr_open.
        None => std::fs::read_to_string("/proc/sys/fs/nr_open")?
            .trim()
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
    };
    if current.is_some_and(|soft| soft < target) {
        rustix::process::setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(target),
                maximum,
            },
        )?;
    }
    let now = rustix::process::getrlimit(Resource::Nofile);
    Ok((
        now.current.unwrap_or(u64::MAX),
        now.maximum.unwrap_or(u64::MAX),
    ))
}

/// Descriptors the pidfd source leaves to the rest of the daemon, at most (half the
/// open-file limit when that is small): what clients may hold under the default connection
/// limits, and some for the database, `/proc` reads and the eBPF maps.
const RESERVED_FDS: u64 = crate::fair::limits::CLIENT_FDS + 256;

/// How many pidfds the source may hold under an open-file limit of `soft`: all but
/// [`RESERVED_FDS`], so that running out of descriptors for pidfds never leaves the daemon
/// unable to read `/proc` or accept a client.
fn pidfd_capacity(soft: u64) -> usize {
    let reserved = RESERVED_FDS.min(soft / 2);
    usize::try_from(soft.saturating_sub(reserved)).unwrap_or(usize::MAX)
}

/// Default of [`PidfdConfig::status_wait`].
/// A live parent (a shell, an IDE) reaps within microseconds; an init that reaps orphans
/// lazily may take far longer, and then the death goes on without its status rather than
/// holding up the session's end.
pub const DEFAULT_STATUS_WAIT: Duration = Duration::from_millis(50);

/// Settings of the pidfd source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidfdConfig {
    /// How long a death waits for its parent's reap, where the kernel then gives the exit
    /// status (`PIDFD_INFO_EXIT`); past it the death is reported without one.
    pub status_wait: Duration,
}

impl Default for PidfdConfig {
    fn default() -> Self {
        PidfdConfig {
            status_wait: DEFAULT_STATUS_WAIT,
        }
    }
}

/// Whether this kernel tells a pidfd holder the exit status of a reaped process
/// (`PIDFD_INFO_EXIT`, Linux 6.15): proven on a child of our own rather than guessed from
/// the kernel version.
fn kernel_gives_exit_status() -> bool {
    let probe = || -> io::Result<bool> {
        let mut child = ProbeChild::spawn()?;
        let handle = PidRef::of_child(&ProcRoot::default(), child.pid())
            .map_err(|e| io::Error::other(e.to_string()))?;
        child.reap()?;
        Ok(handle.exit_status()
            == Some(ExitStatus::Exited {
                code: super::child::EXIT_CODE,
            }))
    };
    probe().unwrap_or_else(|e| {
        debug!("cannot probe for pidfd exit statuses: {e}");
        false
    })
}

/// Watches each tracked process through its pidfd.
pub struct PidfdSource {
    shared: Arc<Shared>,
    runtime: Handle,
    proc: ProcRoot,
    /// Most processes watched at once (see [`pidfd_capacity`]).
    capacity: usize,
    refused: u64,
}

/// What the source shares with its watcher tasks.
struct Shared {
    sink: EventSink,
    /// Whether the kernel gives exit statuses through pidfds (see [`kernel_gives_exit_status`]).
    exit_info: bool,
    status_wait: Duration,
    /// The watcher task of each tracked process.
    watchers: Mutex<HashMap<ProcessKey, AbortHandle>>,
    observed: AtomicU64,
}

impl Shared {
    fn watchers(&self) -> MutexGuard<'_, HashMap<ProcessKey, AbortHandle>> {
        // The critical sections cannot panic halfway, so a poisoned map is still consistent.
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl PidfdSource {
    /// Checks that this kernel has pidfds and starts the source. Watcher tasks run on the
    /// caller's tokio runtime. The open-file limit in force now sets how many processes it
    /// watches at once: raise it first (see [`raise_nofile_limit`]).
    ///
    /// # Panics
    /// Outside a tokio runtime, or in one without IO enabled.
    pub fn start(sink: EventSink, config: PidfdConfig) -> Result<PidfdSource, PidfdError> {
        let runtime = Handle::current();
        let probe = match open_pidfd(std::process::id()) {
            Ok(pidfd) => pidfd,
            Err(e) => {
                return Err(
                    match diagnose::explain(&diagnose::PIDFD_OPEN, Some(e.raw_os_error())) {
                        Some(denial) => PidfdError::Denied(denial),
                        None => PidfdError::Probe(e.into()),
                    },
                );
            }
        };
        // Registering the probe proves epoll takes pidfds here (and panics now, not in
        // `track`, if the runtime has no IO driver).
        crate::fd::registered::register(probe, Interest::READABLE)
            .map_err(|e| PidfdError::Probe(e.into()))?;
        Ok(PidfdSource {
            shared: Arc::new(Shared {
                sink,
                exit_info: kernel_gives_exit_status(),
                status_wait: config.status_wait,
                watchers: Mutex::new(HashMap::new()),
                observed: AtomicU64::new(0),
            }),
            runtime,
            proc: ProcRoot::default(),
            capacity: pidfd_capacity(
                rustix::process::getrlimit(Resource::Nofile)
                    .current
                    .unwrap_or(u64::MAX),
            ),
            refused: 0,
        })
    }

    /// Whether deaths this source reports carry their exit status (once reaped).
    pub fn gives_exit_status(&self) -> bool {
        self.shared.exit_info
    }

    /// Opens a pidfd for `key` and proves it names that very process.
    fn open_verified(&self, key: ProcessKey) -> Result<PidRef, TrackError> {
        PidRef::open(&self.proc, key, None).map_err(|e| match e {
            PidRefError::Gone(_) => TrackError::Gone,
            PidRefError::Open {
                errno: errno @ (Errno::MFILE | Errno::NFILE),
                ..
            } => out_of_fds(errno),
            PidRefError::Open { errno, .. } => TrackError::Io(errno.into()),
            // The pidfd may have taken the last descriptor, leaving none to read /proc.
            PidRefError::Unverified {
                source: IdentityError::Read { source, .. },
                ..
            } if is_out_of_fds(&source) => out_of_fds(source),
            e @ PidRefError::Unverified { .. } => TrackError::Io(io::Error::other(e.to_string())),
        })
    }

    fn register(&self, process: PidRef) -> Result<AsyncFd<PidRef>, TrackError> {
        let _runtime = self.runtime.enter();
        crate::fd::registered::register(process, Interest::READABLE).map_err(|e| {
            let e = io::Error::from(e);
            if e.raw_os_error() == Some(libc::ENOSPC) {
                TrackError::Exhausted(format!(
                    "epoll watch limit reached (fs.epoll.max_user_watches): {e}"
                ))
            } else {
                TrackError::Io(e)
            }
        })
    }
}

fn is_out_of_fds(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

fn out_of_fds(e: impl fmt::Display) -> TrackError {
    TrackError::Exhausted(format!("no file descriptors left: {e}"))
}

/// Waits for the process behind `pidfd` to exit and reports it.
async fn watch(shared: Arc<Shared>, key: ProcessKey, mut pidfd: AsyncFd<PidRef>) {
    match pidfd.readable_mut().await {
        Ok(mut exited) => {
            let at = SystemTime::now();
            let mut status = exited.get_inner().exit_status();
            if status.is_none() && shared.exit_info {
                exited.clear_ready();
                drop(exited);
                status = status_after_reap(&mut pidfd, shared.status_wait).await;
            }
            let observation = ExitObservation {
                key,
                reason: DeathReason::Exited,
                status,
                detected_by: DetectedBy::Pidfd,
                at,
                died_at: None,
                facts: None,
            };
            if shared
                .sink
                .send(SourceEvent::Exit(observation))
                .await
                .is_ok()
            {
                shared.observed.fetch_add(1, Ordering::Relaxed);
            } else {
                debug!(%key, "the consumer is gone; exit not reported");
            }
        }
        // Only when the runtime's IO driver shuts down.
        Err(e) => warn!(%key, "cannot wait on the pidfd: {e}"),
    }
    let mut watchers = shared.watchers();
    // After an untrack and a new track of the key, the entry belongs to another task.
    if watchers
        .get(&key)
        .is_some_and(|task| task.id() == tokio::task::id())
    {
        watchers.remove(&key);
    }
}

/// How often the status is asked for again while waiting for the reap, in case the kernel
/// does not wake pidfd pollers when the process is reaped (it does from Linux 6.9).
const REAP_RECHECK: Duration = Duration::from_millis(5);

/// The kernel records a non-child's status only when its parent reaps it, usually within
/// microseconds of the exit (init may take longer for orphans). Waits up to `limit` for
/// that, so the death is reported once with its status rather than without it.
async fn status_after_reap(pidfd: &mut AsyncFd<PidRef>, limit: Duration) -> Option<ExitStatus> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let woken = tokio::select! {
            woken = pidfd.readable_mut() => woken.ok(),
            () = tokio::time::sleep(REAP_RECHECK) => None,
            () = tokio::time::sleep_until(deadline) => None,
        };
        if let Some(mut guard) = woken {
            guard.clear_ready();
        }
        if let Some(status) = pidfd.get_ref().exit_status() {
            return Some(status);
        }
        if tokio::time::Instant::now() >= deadline {
            debug!("no exit status within {limit:?}: the parent has not reaped the process");
            return None;
        }
    }
}

impl ExitSource for PidfdSource {
    fn kind(&self) -> DetectedBy {
        DetectedBy::Pidfd
    }

    fn track(&mut self, key: ProcessKey) -> Result<(), TrackError> {
        let watched = {
            let watchers = self.shared.watchers();
            if watchers.contains_key(&key) {
                return Ok(());
            }
            watchers.len()
        };
        let opened = if watched >= self.capacity {
            Err(TrackError::Exhausted(format!(
                "{watched} pidfds open; the rest of the open-file limit is kept for the daemon"
            )))
        } else {
            self.open_verified(key).and_then(|fd| self.register(fd))
        };
        let pidfd = match opened {
            Ok(pidfd) => pidfd,
            Err(e) => {
                if matches!(e, TrackError::Exhausted(_)) {
                    self.refused += 1;
                }
                return Err(e);
            }
        };
        // Spawned under the lock the task takes to remove its entry, so even a task that
        // finishes at once finds the entry inserted.
        let mut watchers = self.shared.watchers();
        let task = self
            .runtime
            .spawn(watch(Arc::clone(&self.shared), key, pidfd));
        watchers.insert(key, task.abort_handle());
        Ok(())
    }

    fn untrack(&mut self, key: ProcessKey) {
        if let Some(task) = self.shared.watchers().remove(&key) {
            task.abort();
        }
    }

    fn stats(&self) -> SourceStats {
        SourceStats {
            tracked: self.shared.watchers().len() as u64,
            observed: self.shared.observed.load(Ordering::Relaxed),
            lost: 0,
            refused: self.refused,
        }
    }
}

impl Drop for PidfdSource {
    fn drop(&mut self) {
        // An aborted task is dropped by the runtime, closing its pidfd.
        for (_, task) in self.shared.watchers().drain() {
            task.abort();
        }
    }
}

impl fmt::Debug for PidfdSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the watcher map: it may hold tens of thousands of entries.
        f.debug_struct("PidfdSource")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::process::{Command, Stdio};

    use rustix::pipe::PipeFlags;
    use rustix::process::{WaitId, WaitIdOptions};
    use tokio::sync::mpsc;

    use super::*;
    use crate::source::testutil::{PATIENCE, Proc, assert_quiet, next_exit};

    fn source(capacity: usize) -> (PidfdSource, mpsc::Receiver<SourceEvent>) {
        let (sink, rx) = mpsc::channel(capacity);
        let source = PidfdSource::start(sink, PidfdConfig::default())
            .expect("pidfds work on the test machine");
        (source, rx)
    }

    const SIGKILLED: ExitStatus = ExitStatus::Signaled {
        signal: 9,
        core_dumped: false,
    };

    /// The status the source must report for a *reaped* process that ended with `status`.
    fn expected(status: ExitStatus) -> Option<ExitStatus> {
        kernel_gives_exit_status().then_some(status)
    }

    #[test]
    fn the_exit_status_probe_matches_the_kernel_version() {
        let uname = rustix::system::uname();
        let release = uname.release().to_string_lossy();
        let mut numbers = release
            .split(|c: char| !c.is_ascii_digit())
            .map(|n| n.parse::<u32>().unwrap_or(0));
        let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
        assert_eq!(
            kernel_gives_exit_status(),
            version >= (6, 15),
            "PIDFD_INFO_EXIT exists from Linux 6.15; this is {release}"
        );
    }

    /// A process that is not our child is reaped by its own parent, some time after its
    /// pidfd became readable: the report waits for that reap and carries the status.
    #[tokio::test]
    async fn waits_for_a_late_reap_to_report_the_status() {
        let (sink, mut rx) = mpsc::channel(8);
        let mut source = PidfdSource::start(
            sink,
            PidfdConfig {
                status_wait: PATIENCE,
            },
        )
        .unwrap();
        let mut proc = Proc::sleeper();
        let key = proc.key();
        source.track(key).unwrap();
        proc.kill();
        let reaper = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            proc.reap();
        });
        let observation = next_exit(&mut rx).await;
        reaper.join().unwrap();
        assert_eq!(observation.status, expected(SIGKILLED));
    }

    /// A parent that never reaps in time costs the status, never the report.
    #[tokio::test]
    async fn reports_without_a_status_when_nobody_reaps_in_time() {
        let (sink, mut rx) = mpsc::channel(8);
        let mut source = PidfdSource::start(
            sink,
            PidfdConfig {
                status_wait: Duration::from_millis(20),
            },
        )
        .unwrap();
        let mut proc = Proc::sleeper();
        let key = proc.key();
        source.track(key).unwrap();
        proc.kill();
        let observation = next_exit(&mut rx).await;
        assert_eq!((observation.key, observation.status), (key, None));
        proc.reap();
    }

    #[test]
    fn pidfds_leave_descriptors_to_the_daemon() {
        assert_eq!(pidfd_capacity(20_000), 20_000 - RESERVED_FDS as usize);
        assert_eq!(pidfd_capacity(64), 32, "half of a small limit is kept");
        assert_eq!(pidfd_capacity(0), 0);
    }

    #[tokio::test]
    async fn beyond_capacity_is_refused_and_counted() {
        let (mut source, _rx) = source(8);
        source.capacity = 1;
        let procs = [Proc::sleeper(), Proc::sleeper()];
        source.track(procs[0].key()).unwrap();
        match source.track(procs[1].key()) {
            Err(TrackError::Exhausted(why)) => {
                assert!(why.contains("kept for the daemon"), "{why}")
            }
            other => panic!("expected Exhausted, got {other:?}"),
        }
        let stats = source.stats();
        assert_eq!((stats.tracked, stats.refused), (1, 1));
        source
            .track(procs[0].key())
            .expect("a tracked process is tracked again at capacity");
    }

    // The test is the process's parent and reaps it before the watcher task can run: this
    // runtime has one thread, which `reap` blocks. So the kernel holds the status when the
    // pidfd is handled. For a process that is not the daemon's child, the status is there
    // only if its own parent reaped it first; otherwise the observation says `None`.
    #[tokio::test]
    async fn reports_an_exit_code_exactly_once() {
        let (mut source, mut rx) = source(8);
        let mut proc = Proc::exit_on_eof(7);
        let key = proc.key();
        source.track(key).unwrap();
        source
            .track(key)
            .expect("tracking a tracked key again is a no-op");
        assert_eq!(source.stats().tracked, 1);

        proc.close_stdin();
        assert_eq!(proc.reap().code(), Some(7));
        let observation = next_exit(&mut rx).await;
        assert_eq!(observation.key, key);
        assert_eq!(observation.reason, DeathReason::Exited);
        assert_eq!(observation.detected_by, DetectedBy::Pidfd);
        assert_eq!(observation.status, expected(ExitStatus::Exited { code: 7 }));
        assert_quiet(&mut rx, "one exit must be reported once").await;
        assert_eq!(
            source.stats(),
            SourceStats {
                tracked: 0,
                observed: 1,
                lost: 0,
                refused: 0
            }
        );
    }

    #[tokio::test]
    async fn reports_a_sigkill() {
        let (mut source, mut rx) = source(8);
        let mut proc = Proc::sleeper();
        let key = proc.key();
        source.track(key).unwrap();

        proc.kill();
        proc.reap();
        let observation = next_exit(&mut rx).await;
        assert_eq!(observation.key, key);
        assert_eq!(observation.status, expected(SIGKILLED));
    }

    #[tokio::test]
    async fn ignores_processes_it_does_not_track() {
        let (mut source, mut rx) = source(8);
        let tracked = Proc::sleeper();
        source.track(tracked.key()).unwrap();

        let mut other = Proc::exit_on_eof(0);
        other.close_stdin();
        other.reap();
        assert_quiet(&mut rx, "only an untracked process exited").await;
        assert_eq!(source.stats().tracked, 1);
    }

    #[tokio::test]
    async fn untracked_process_death_is_not_reported() {
        let (mut source, mut rx) = source(8);
        let mut proc = Proc::sleeper();
        let key = proc.key();
        source.track(key).unwrap();
        source.untrack(key);
        source.untrack(key);
        assert_eq!(source.stats().tracked, 0);

        proc.kill();
        proc.reap();
        assert_quiet(&mut rx, "the process was untracked before it died").await;
    }

    #[tokio::test]
    async fn refuses_a_pid_whose_start_time_differs() {
        let (mut source, _rx) = source(8);
        let proc = Proc::sleeper();
        let real = proc.key();
        let reused = ProcessKey {
            start_ticks: real.start_ticks + 1,
            ..real
        };
        match source.track(reused) {
            Err(TrackError::Gone) => {}
            other => panic!("a key naming another process must be Gone, got {other:?}"),
        }
        assert_eq!(source.stats(), SourceStats::default());
        source.track(real).expect("the real key is tracked");
    }

    #[tokio::test]
    async fn refuses_a_process_that_already_exited() {
        let (mut source, _rx) = source(8);
        let mut proc = Proc::exit_on_eof(0);
        let key = proc.key();
        proc.close_stdin();
        // Wait for the exit without reaping: the zombie keeps its PID, so pidfd_open works.
        let pid = rustix::process::Pid::from_raw(proc.pid() as i32).unwrap();
        rustix::process::waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
        )
        .unwrap();
        match source.track(key) {
            Err(TrackError::Gone) => {}
            other => panic!("a zombie must be Gone, got {other:?}"),
        }
        assert_eq!(source.stats().tracked, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reports_each_of_200_simultaneous_exits_once() {
        const COUNT: usize = 200;
        // Every shell reads the same pipe and exits at its end of file.
        let (read, write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC).unwrap();
        let mut procs: Vec<Proc> = (0..COUNT)
            .map(|_| {
                Proc::spawn(
                    Command::new("sh")
                        .args(["-c", "read x"])
                        .stdin(Stdio::from(read.try_clone().unwrap())),
                )
            })
            .collect();
        drop(read);
        // Fewer slots than exits: watchers must wait for room, and none may give up.
        let (mut source, mut rx) = source(16);
        let keys: HashSet<ProcessKey> = procs.iter().map(Proc::key).collect();
        for &key in &keys {
            source.track(key).unwrap();
        }
        assert_eq!(source.stats().tracked, COUNT as u64);

        drop(write);
        let mut seen = HashSet::new();
        for _ in 0..COUNT {
            let observation = next_exit(&mut rx).await;
            assert!(
                keys.contains(&observation.key),
                "observed {} which was never tracked",
                observation.key
            );
            assert!(
                seen.insert(observation.key),
                "observed {} twice",
                observation.key
            );
        }
        assert_quiet(&mut rx, "all 200 exits were already reported").await;
        let stats = source.stats();
        assert_eq!((stats.tracked, stats.observed), (0, COUNT as u64));
        for proc in &mut procs {
            proc.reap();
        }
    }

    #[tokio::test]
    async fn dropping_the_source_ends_every_watcher() {
        let (mut source, mut rx) = source(8);
        let procs = [Proc::sleeper(), Proc::sleeper()];
        for proc in &procs {
            source.track(proc.key()).unwrap();
        }
        drop(source);
        // Each watcher holds a sender, so the channel closes only once all are gone.
        match tokio::time::timeout(PATIENCE, rx.recv()).await {
            Ok(None) => {}
            Ok(Some(event)) => panic!("no process died, yet the source sent {event:?}"),
            Err(_) => panic!("watcher tasks outlived the source by {PATIENCE:?}"),
        }
    }

    const EXHAUSTION_CHILD: &str = "LIVENESS_TEST_EXHAUST_FDS";

    /// Lowering RLIMIT_NOFILE here would starve every test running in parallel, so a
    /// re-executed copy of this test binary, running only this test, does the work.
    #[test]
    fn running_out_of_fds_is_refused_and_counted() {
        if std::env::var_os(EXHAUSTION_CHILD).is_some() {
            return exhaust_fds();
        }
        let name = "source::pidfd::tests::running_out_of_fds_is_refused_and_counted";
        let output = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads=1", "--nocapture"])
            .env(EXHAUSTION_CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "the re-executed test failed:\n{stdout}\n{stderr}"
        );
        // A filter that matches nothing succeeds too.
        assert!(
            stdout.contains("1 passed"),
            "the re-executed binary did not run the test:\n{stdout}"
        );
    }

    fn exhaust_fds() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (mut source, _rx) = source(8);
            let proc = Proc::sleeper();
            let key = proc.key();
            let hard = rustix::process::getrlimit(Resource::Nofile).maximum;
            rustix::process::setrlimit(
                Resource::Nofile,
                Rlimit {
                    current: Some(64),
                    maximum: hard,
                },
            )
            .unwrap();
            let mut spare = Vec::new();
            loop {
                match std::fs::File::open("/dev/null") {
                    Ok(file) => spare.push(file),
                    Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
                    Err(e) => panic!("cannot open /dev/null: {e}"),
                }
            }
            assert!(
                spare.len() >= 2,
                "only {} descriptors were free below the lowered limit",
                spare.len()
            );
            let refused = |result: Result<(), TrackError>, what: &str| match result {
                Err(TrackError::Exhausted(why)) if why.contains("no file descriptors left") => {}
                other => panic!("{what}: expected Exhausted, got {other:?}"),
            };

            refused(source.track(key), "no descriptor for the pidfd");
            drop(spare.pop());
            refused(source.track(key), "a pidfd but none left to read /proc");
            assert_eq!(
                source.stats(),
                SourceStats {
                    tracked: 0,
                    observed: 0,
                    lost: 0,
                    refused: 2
                }
            );

            drop(spare.pop());
            source
                .track(key)
                .expect("with two descriptors free, tracking works again");
            assert_eq!(source.stats().tracked, 1);

            // What the daemon does at start lifts the lowered soft limit again.
            let (soft, hard) = raise_nofile_limit().unwrap();
            assert_eq!(soft, hard, "the soft limit must reach the hard one");
            assert!(soft > 64, "the soft limit stayed at {soft}");
            assert_eq!(
                rustix::process::getrlimit(Resource::Nofile).current,
                Some(soft)
            );
        });
    }
}
