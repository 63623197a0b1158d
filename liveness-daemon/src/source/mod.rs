//! Exit sources: the mechanisms that learn a tracked process has died.
//!
//! Each source implements [`ExitSource`]. The eBPF source is read where deaths are handled:
//! the engine's own task drains its ring buffer (see [`monitor`]), and a full ring makes
//! the kernel count the loss, which the engine answers by reconciling. The pidfd and
//! `/proc` sources send [`SourceEvent`]s into one bounded channel and *wait* when it is full
//! (backpressure). So nothing is dropped silently anywhere.

use std::fmt;
use std::io;
use std::time::SystemTime;

use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::status::SourceStats;
use liveness_ebpf::KernelFacts;

use liveness_common::identity::{DeathReason, ProcessKey};

pub mod cgroups;
pub mod child;
pub mod ebpf;
#[cfg(test)]
pub(crate) mod fake;
pub mod lineage_pin;
mod map_batch;
pub mod monitor;
pub mod pidfd;
pub mod procpoll;
pub mod shared_array;
#[cfg(test)]
pub(crate) mod testutil;
pub mod tree_map;

/// One source's report that a tracked process died.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitObservation {
    pub key: ProcessKey,
    pub reason: DeathReason,
    /// The wait status, when the source can know it.
    pub status: Option<ExitStatus>,
    pub detected_by: DetectedBy,
    /// When the source observed the death.
    pub at: SystemTime,
    /// When the process died by the kernel's clock, where the source reads it (eBPF).
    pub died_at: Option<SystemTime>,
    /// Why it died and what it cost, where the kernel showed it (eBPF). Boxed: most
    /// observations carry none, and events move through channels by value.
    pub facts: Option<Box<KernelFacts>>,
}

/// What sources send to their consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceEvent {
    Exit(ExitObservation),
    /// The kernel dropped exit reports; `total` is the source's cumulative loss count.
    /// Tracked processes must be re-checked, since any of their deaths may be among them.
    Lost {
        detected_by: DetectedBy,
        total: u64,
    },
}

/// Sending side of the channel every source reports into.
pub type EventSink = tokio::sync::mpsc::Sender<SourceEvent>;

/// Why a source cannot watch one process.
#[derive(Debug, thiserror::Error)]
pub enum TrackError {
    /// The process is already gone: the caller treats it as dead.
    #[error("the process is already gone")]
    Gone,
    /// The source is out of a resource (file descriptors, map slots); another source must
    /// cover the process.
    #[error("out of capacity: {0}")]
    Exhausted(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A mechanism that watches tracked processes and reports their deaths.
///
/// Contract: after `track` returns `Ok`, every later death of that process is reported
/// (at least once) until `untrack`. A death *before* `track` returned may be missed; the
/// caller closes that window by re-checking `/proc` after `track`.
pub trait ExitSource: Send + fmt::Debug {
    fn kind(&self) -> DetectedBy;
    fn track(&mut self, key: ProcessKey) -> Result<(), TrackError>;
    /// Like `track`, for a member of a tracked process's tree: it stays a member, so that
    /// what it forks still joins that tree.
    fn track_member(&mut self, key: ProcessKey) -> Result<(), TrackError> {
        self.track(key)
    }
    /// Stops watching; a no-op for a process that is not tracked.
    fn untrack(&mut self, key: ProcessKey);
    fn stats(&self) -> SourceStats;
}
