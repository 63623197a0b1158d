//! The engine: one task that owns the store and the exit monitor.
//!
//! Everything that changes state happens here, in order: commit to SQLite, then publish
//! to subscribers, then reply. Because one task does both the committing and the
//! publishing, a subscriber registered at head `seq` H receives exactly the events after H
//! live, and replays the ones up to H from the store: no gap, no duplicate.
//!
//! Exit observations are handled before client commands (`biased` select), so no client,
//! however busy, delays a finalization; a burst of exits is committed in one transaction.
//!
//! What clients ask is one [`Op`] each, in [`op`], applied to a [`actor::Context`], never
//! to the engine. The order ([`actor`]) runs over owners that hold their state: the
//! [`ledger`] (store, journal, retries, accounts), the [`watch`] (monitor, trees), the
//! [`effects`] (locks, reaps, end actions), the [`fanout`] (subscribers, metrics, log
//! lines), the [`facts`], and [`housekeeping`].

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::fair::limits::Limits;
use crate::store::StoreError;
use liveness_proc::identity::{IdentityError, ProcRoot};

mod actions;
mod actor;
mod auth;
mod cgroups;
mod effects;
mod end_metrics;
mod eventlog;
mod facts;
mod fanout;
mod hops;
mod housekeeping;
mod journaled;
mod ledger;
mod locks;
mod op;
mod outbox;
mod owner_checks;
mod reaps;
mod refusal;
mod retry;
mod subscribers;
mod tree;
mod until_tree;
mod watch;

pub use actions::ActionConfig;
pub use actor::Engine;
pub use auth::Caller;
pub use end_metrics::EndMetrics;
pub use fanout::Subscription;
pub use locks::{Acquire, Queued};
pub use op::{
    Ask, Command, End, Found, Handle, Judged, Moved, Op, Register, Registered, Sampling,
    ScopeFailed, Subscribe, Synced, Target, Tree, Waiting, Whose, ancestry,
};
#[cfg(feature = "fleet")]
pub use op::{FleetGranted, FleetHeld, FleetReleased};
pub use outbox::{Ended, Flushed, Outbox};
pub use refusal::Refusal;
pub use tree::{KernelMembers, TreeView};
pub use watch::Link;

/// Most exits committed in one transaction when they arrive together.
const MAX_BATCH: usize = 1024;
/// Most published batches of deaths waiting for their SQLite write (see [`APPLY_DELAY`]):
/// a flood of deaths is written in steps this big.
const MAX_UNAPPLIED: usize = 64;
/// How long a published batch waits for its SQLite write when nothing needs it there
/// sooner: deaths within it share one transaction, whose commit costs about as much as a
/// whole death otherwise. A request that reads SQLite writes them first; the journal has
/// them meanwhile, so waiting longer costs memory (bounded by [`MAX_UNAPPLIED`]), not
/// safety.
const APPLY_DELAY: Duration = Duration::from_secs(1);
/// How often retention runs.
const PRUNE_PERIOD: Duration = Duration::from_secs(60);
/// How often deaths whose commit failed (a full disk, say) are committed again.
const RETRY_PERIOD: Duration = Duration::from_secs(1);
/// How often the database file is checked to still be the one opened.
const FILE_CHECK_PERIOD: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Sessions whose owner cannot be watched end after this long without `touch`.
    pub unknown_timeout: Duration,
    /// Pending sessions never renamed end after this long.
    pub pending_ttl: Duration,
    pub retain_events: u64,
    pub retain_age: Duration,
    /// Extra process names `owner: "auto"` skips.
    pub wrappers: Vec<String>,
    /// Commit batches queued per subscriber before it counts as lagging and is disconnected.
    pub subscriber_queue: usize,
    pub proc: ProcRoot,
    /// Connection limits, reported in status; the session limits come from their config.
    pub limits: Arc<Limits>,
    /// The wall clock sessions and events record, and expiry and timeouts read.
    pub clock: Clock,
    /// Put each death's hop timestamps on its ended event (`--trace-hops`).
    pub trace_hops: bool,
    /// How end actions run.
    pub actions: ActionConfig,
    /// The cgroup2 hierarchy sessions' cgroups are made in, or why there is none.
    pub cgroups: Arc<crate::cgroup::Support>,
    /// The cgroup a new session gets when it asks for none of its own and does not
    /// refuse one (`--session-cgroup`).
    pub default_cgroup: Option<liveness_common::request::CgroupLimits>,
}

/// Where the engine reads the wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub enum Clock {
    /// The system clock.
    #[default]
    System,
    /// `wall_ms` at tokio's instant `at`, moving with tokio's clock: a paused runtime
    /// advanced by hand drives expiry and timeouts without waiting for them (tests).
    #[cfg(test)]
    Tokio {
        wall_ms: i64,
        at: tokio::time::Instant,
    },
}

impl Clock {
    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        match self {
            Clock::System => now_ms(),
            #[cfg(test)]
            Clock::Tokio { wall_ms, at } => wall_ms + at.elapsed().as_millis() as i64,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot read this machine's identity: {0}")]
    Local(#[from] IdentityError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn ms_of(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
