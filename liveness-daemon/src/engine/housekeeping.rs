//! Housekeeping: what ends by time (pending sessions never renamed, owners on other
//! machines not touched within the timeout) and retention.

use std::time::Duration;

use tokio::time::Instant;

use liveness_common::session::{EndReason, Session};

use super::{EngineConfig, PRUNE_PERIOD};
use crate::store::Store;

/// When retention last ran.
#[derive(Debug, Default)]
pub(super) struct Housekeeping {
    last_prune: Option<Instant>,
}

/// How often housekeeping runs: a quarter of the shortest deadline it applies.
pub(super) fn period(config: &EngineConfig) -> Duration {
    let shortest = config.unknown_timeout.min(config.pending_ttl);
    (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(30))
}

impl Housekeeping {
    /// The ACTIVE sessions whose time is up at `now`, and why.
    pub(super) fn due(
        &self,
        store: &Store,
        config: &EngineConfig,
        boot_id: &str,
        now: i64,
    ) -> Vec<(Session, EndReason)> {
        let mut ended = Vec::new();
        match store.expired_pending(now) {
            Ok(expired) => {
                for session in expired {
                    ended.push((session, EndReason::PendingExpired));
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot list expired pending sessions"),
        }
        let cutoff = now - config.unknown_timeout.as_millis() as i64;
        // Every owner of this boot is watched (the /proc poller takes what no other source
        // can), so it ends when it dies; only owners on other machines can time out.
        match store.idle_of_other_boots(cutoff, boot_id) {
            Ok(idle) => ended.extend(idle.into_iter().map(|s| (s, EndReason::Timeout))),
            Err(e) => tracing::error!(error = %e, "cannot list idle sessions"),
        }
        ended
    }

    /// Deletes the events and the ended sessions beyond retention, at most once every
    /// [`PRUNE_PERIOD`].
    pub(super) fn prune(&mut self, store: &mut Store, config: &EngineConfig, now: i64) {
        if self
            .last_prune
            .is_some_and(|at| at.elapsed() < PRUNE_PERIOD)
        {
            return;
        }
        self.last_prune = Some(Instant::now());
        let max_age = config.retain_age.as_millis() as i64;
        match store.prune(config.retain_events, max_age, now) {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "pruned events beyond retention"),
            Err(e) => tracing::error!(error = %e, "cannot prune events"),
        }
        // Ended sessions are kept for `get` as long as their events are; then their ids
        // may be registered again.
        match store.prune_sessions(now - max_age) {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(
                deleted,
                retain_age_s = config.retain_age.as_secs(),
                "pruned ended sessions beyond retention; their ids are free again"
            ),
            Err(e) => tracing::error!(error = %e, "cannot prune ended sessions"),
        }
    }
}
