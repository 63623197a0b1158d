//! Exit source of last resort: re-checks every tracked process in `/proc` at an interval.
//!
//! Needs nothing from the kernel beyond `/proc`, costs no file descriptor per process, and
//! also notices PID reuse; its latency is the interval.
//!
//! Start times count 10 ms ticks, so a process forked into a dead owner's pid within the
//! same tick has the owner's fingerprint. On Linux 6.9+ the poller also remembers each
//! process's pidfs inode (unique per boot) when it starts tracking it and compares it on
//! every sweep, which tells such an impostor apart; on older kernels that window remains.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::task::AbortHandle;
use tokio::time::MissedTickBehavior;
use tracing::debug;

use liveness_common::status::SourceStats;

use super::{EventSink, ExitObservation, ExitSource, SourceEvent, TrackError};
use liveness_common::exit::DetectedBy;
use liveness_common::identity::ProcessKey;
use liveness_proc::identity::{Liveness, ProcRoot};

/// Time between two sweeps unless configured otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// Keys checked between two yields to the runtime. Each check reads a `/proc` file
/// synchronously, so a sweep of 100k keys must not hold a worker thread in one go.
const SWEEP_CHUNK: usize = 256;

/// Polls `/proc` for the death of each tracked process.
pub struct ProcpollSource {
    shared: Arc<Shared>,
    sweeper: AbortHandle,
}

/// What the source shares with its sweeper task.
struct Shared {
    /// Each tracked process with its pidfs inode where the kernel has one.
    tracked: Mutex<HashMap<ProcessKey, Option<u64>>>,
    observed: AtomicU64,
    proc: ProcRoot,
}

impl Shared {
    fn tracked(&self) -> MutexGuard<'_, HashMap<ProcessKey, Option<u64>>> {
        // The critical sections cannot panic halfway, so a poisoned set is still consistent.
        self.tracked.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ProcpollSource {
    /// Starts the sweeper task on the caller's tokio runtime; it checks every tracked key
    /// against `proc` each `interval`.
    ///
    /// # Panics
    /// Outside a tokio runtime, or if `interval` is zero.
    pub fn start(sink: EventSink, interval: Duration, proc: ProcRoot) -> ProcpollSource {
        assert!(
            !interval.is_zero(),
            "the procpoll interval must not be zero"
        );
        let shared = Arc::new(Shared {
            tracked: Mutex::new(HashMap::new()),
            observed: AtomicU64::new(0),
            proc,
        });
        let sweeper = tokio::spawn(sweep_forever(Arc::clone(&shared), sink, interval));
        ProcpollSource {
            shared,
            sweeper: sweeper.abort_handle(),
        }
    }
}

async fn sweep_forever(shared: Arc<Shared>, sink: EventSink, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    // After a slow sweep, wait a full interval rather than sweeping back to back.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        // A snapshot, so `track` and `untrack` never wait for a sweep.
        let keys: Vec<(ProcessKey, Option<u64>)> =
            shared.tracked().iter().map(|(k, ino)| (*k, *ino)).collect();
        for chunk in keys.chunks(SWEEP_CHUNK) {
            for &(key, ino) in chunk {
                let reason = match shared.proc.check_process(key, ino) {
                    Liveness::Alive => continue,
                    Liveness::Unknown(why) => {
                        debug!(%key, "cannot tell whether the process lives, still tracking: {why}");
                        continue;
                    }
                    Liveness::Dead(reason) => reason,
                };
                // Untracked since the snapshot: no longer ours to report.
                let was_tracked = shared.tracked().remove(&key).is_some();
                if !was_tracked {
                    continue;
                }
                let observation = ExitObservation {
                    key,
                    reason,
                    status: None,
                    detected_by: DetectedBy::Procpoll,
                    at: SystemTime::now(),
                    died_at: None,
                    facts: None,
                };
                if sink.send(SourceEvent::Exit(observation)).await.is_err() {
                    debug!("the consumer is gone; procpoll stops");
                    return;
                }
                shared.observed.fetch_add(1, Ordering::Relaxed);
            }
            tokio::task::yield_now().await;
        }
    }
}

impl ExitSource for ProcpollSource {
    fn kind(&self) -> DetectedBy {
        DetectedBy::Procpoll
    }

    fn track(&mut self, key: ProcessKey) -> Result<(), TrackError> {
        // Read outside the lock: it opens a pidfd and reads /proc.
        let ino = self.shared.proc.pidfs_ino_of_key(key);
        self.shared.tracked().insert(key, ino);
        Ok(())
    }

    fn untrack(&mut self, key: ProcessKey) {
        self.shared.tracked().remove(&key);
    }

    fn stats(&self) -> SourceStats {
        SourceStats {
            tracked: self.shared.tracked().len() as u64,
            observed: self.shared.observed.load(Ordering::Relaxed),
            lost: 0,
            refused: 0,
        }
    }
}

impl Drop for ProcpollSource {
    fn drop(&mut self) {
        self.sweeper.abort();
    }
}

impl fmt::Debug for ProcpollSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the key set: it may hold a hundred thousand entries.
        f.debug_struct("ProcpollSource")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;

    use super::*;
    use crate::source::testutil::{PATIENCE, Proc, assert_quiet, next_exit};
    use liveness_common::identity::DeathReason;

    const FAST: Duration = Duration::from_millis(20);

    fn source(proc: ProcRoot) -> (ProcpollSource, mpsc::Receiver<SourceEvent>) {
        let (sink, rx) = mpsc::channel(8);
        (ProcpollSource::start(sink, FAST, proc), rx)
    }

    #[tokio::test]
    async fn reports_an_exit_once() {
        let (mut source, mut rx) = source(ProcRoot::default());
        let mut proc = Proc::sleeper();
        let key = proc.key();
        source.track(key).unwrap();

        proc.kill();
        proc.reap();
        let observation = next_exit(&mut rx).await;
        assert_eq!(
            (observation.key, observation.reason, observation.status),
            (key, DeathReason::Exited, None)
        );
        assert_eq!(observation.detected_by, DetectedBy::Procpoll);
        assert_quiet(&mut rx, "a reported key is no longer tracked").await;
        let stats = source.stats();
        assert_eq!((stats.tracked, stats.observed), (0, 1));
    }

    #[tokio::test]
    async fn reports_a_reused_pid() {
        let (mut source, mut rx) = source(ProcRoot::default());
        let proc = Proc::sleeper();
        let real = proc.key();
        let reused = ProcessKey {
            start_ticks: real.start_ticks + 1,
            ..real
        };
        source.track(real).unwrap();
        source.track(reused).unwrap();

        let observation = next_exit(&mut rx).await;
        assert_eq!(
            (observation.key, observation.reason),
            (reused, DeathReason::PidReused)
        );
        assert_quiet(&mut rx, "the real process still lives").await;
        assert_eq!(source.stats().tracked, 1);
    }

    #[tokio::test]
    async fn untracked_process_death_is_not_reported() {
        let (mut source, mut rx) = source(ProcRoot::default());
        let mut proc = Proc::sleeper();
        let key = proc.key();
        source.track(key).unwrap();
        source.untrack(key);

        proc.kill();
        proc.reap();
        assert_quiet(&mut rx, "the process was untracked before it died").await;
        assert_eq!(source.stats(), SourceStats::default());
    }

    #[tokio::test]
    async fn keeps_tracking_while_liveness_is_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let key = ProcessKey {
            pid: 4242,
            start_ticks: 1000,
        };
        let stat = dir.path().join("4242/stat");
        std::fs::create_dir(dir.path().join("4242")).unwrap();
        std::fs::write(&stat, "garbage").unwrap();
        let (mut source, mut rx) = source(ProcRoot::new(dir.path()));
        source.track(key).unwrap();

        assert_quiet(&mut rx, "an unreadable stat proves nothing").await;
        assert_eq!(source.stats().tracked, 1);

        // Fields 3 to 22 of proc(5): state, ppid, 17 unused, then the start time.
        let other_start = format!("4242 (agent) S 1 {}2000\n", "0 ".repeat(17));
        std::fs::write(&stat, other_start).unwrap();
        let observation = next_exit(&mut rx).await;
        assert_eq!(
            (observation.key, observation.reason),
            (key, DeathReason::PidReused)
        );
    }

    #[tokio::test]
    async fn dropping_the_source_ends_the_sweeper() {
        let (mut source, mut rx) = source(ProcRoot::default());
        let proc = Proc::sleeper();
        source.track(proc.key()).unwrap();
        drop(source);
        // The sweeper holds the only sender, so the channel closes once it is gone.
        match tokio::time::timeout(PATIENCE, rx.recv()).await {
            Ok(None) => {}
            Ok(Some(event)) => panic!("no process died, yet the source sent {event:?}"),
            Err(_) => panic!("the sweeper outlived the source by {PATIENCE:?}"),
        }
    }
}
