//! An exit source in memory, for the engine's tests: [`FakeExits::die`] reports the death
//! of a tracked process, with the exit status a kernel source would read, without a
//! process, a file or a wait.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::identity::{DeathReason, ProcessKey};
use liveness_common::status::SourceStats;
use liveness_ebpf::KernelFacts;

use super::{EventSink, ExitObservation, ExitSource, SourceEvent, TrackError};

/// The processes the source watches, shared with the test's handle.
type Tracked = Arc<Mutex<HashSet<ProcessKey>>>;

/// The source, as the monitor holds it.
#[derive(Debug)]
pub(crate) struct FakeSource {
    tracked: Tracked,
}

/// The test's handle: where deaths are decided.
#[derive(Debug, Clone)]
pub(crate) struct FakeExits {
    tracked: Tracked,
    sink: EventSink,
}

impl FakeSource {
    /// A source reporting into `sink`, and the handle that makes its processes die.
    pub(crate) fn new(sink: EventSink) -> (FakeSource, FakeExits) {
        let tracked = Tracked::default();
        let exits = FakeExits {
            tracked: Arc::clone(&tracked),
            sink,
        };
        (FakeSource { tracked }, exits)
    }
}

impl ExitSource for FakeSource {
    fn kind(&self) -> DetectedBy {
        DetectedBy::Ebpf
    }

    fn track(&mut self, key: ProcessKey) -> Result<(), TrackError> {
        lock(&self.tracked).insert(key);
        Ok(())
    }

    fn untrack(&mut self, key: ProcessKey) {
        lock(&self.tracked).remove(&key);
    }

    fn stats(&self) -> SourceStats {
        SourceStats::default()
    }
}

impl FakeExits {
    /// Process `key` exits with `status`: reported as the kernel would, if it is watched.
    /// Returns whether it was.
    pub(crate) fn die(&self, key: ProcessKey, status: ExitStatus) -> bool {
        self.die_seen(key, status, None)
    }

    /// The same, with what the kernel's programs saw of why it died and what it cost.
    pub(crate) fn die_seen(
        &self,
        key: ProcessKey,
        status: ExitStatus,
        facts: Option<KernelFacts>,
    ) -> bool {
        if !lock(&self.tracked).remove(&key) {
            return false;
        }
        let now = SystemTime::now();
        let observation = ExitObservation {
            key,
            reason: DeathReason::Exited,
            status: Some(status),
            detected_by: DetectedBy::Ebpf,
            at: now,
            died_at: Some(now),
            facts: facts.map(Box::new),
        };
        self.sink
            .try_send(SourceEvent::Exit(observation))
            .expect("room in the monitor's queue");
        true
    }
}

fn lock(tracked: &Tracked) -> std::sync::MutexGuard<'_, HashSet<ProcessKey>> {
    tracked.lock().unwrap_or_else(PoisonError::into_inner)
}
