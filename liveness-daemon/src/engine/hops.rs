//! `--trace-hops`: the monotonic time of each hop a death takes through the engine, put on
//! its `session.ended` event so that a benchmark can tell where the time went.

use std::collections::HashMap;
use std::time::SystemTime;

use crate::source::ExitObservation;
use crate::source::ebpf::monotonic_ns;
use liveness_common::identity::ProcessKey;
use liveness_common::session::{Event, EventKind, Hops};

/// Deaths taken from the sources and not yet committed, by owner.
#[derive(Debug, Default)]
pub(super) struct HopTrace {
    read: HashMap<ProcessKey, (Option<u64>, u64)>,
}

impl HopTrace {
    /// Notes that the engine has just taken this death from its source.
    pub(super) fn read(&mut self, observation: &ExitObservation) {
        let (wall, read_ns) = (SystemTime::now(), monotonic_ns());
        // The source gives the kernel's time as a wall time; the clocks were read
        // nanoseconds apart, so the difference carries over to the monotonic clock.
        let died_ns = observation
            .died_at
            .and_then(|died| wall.duration_since(died).ok())
            .map(|ago| read_ns.saturating_sub(ago.as_nanos() as u64));
        self.read.insert(observation.key, (died_ns, read_ns));
    }

    /// Stamps the just-committed ended events of the deaths read so far.
    pub(super) fn committed(&mut self, events: &mut [Event]) {
        let committed_ns = monotonic_ns();
        for event in events.iter_mut().filter(|e| e.kind == EventKind::Ended) {
            if let Some(&(died_ns, read_ns)) = self.read.get(&event.owner.key()) {
                event.hops = Some(Hops {
                    died_ns,
                    read_ns,
                    committed_ns,
                    published_ns: 0,
                });
            }
        }
        // Deaths of owners without a session leave nothing behind.
        self.read.clear();
    }
}

/// Stamps an event the moment before it is serialized for the subscribers.
pub(super) fn published(event: &mut Event) {
    if let Some(hops) = event.hops.as_mut() {
        hops.published_ns = monotonic_ns();
    }
}
