//! Housekeeping: pending expiry, unknown-owner timeouts, retries, retention.

use std::time::{Duration, Instant};

use liveness_common::session::EndReason;

use super::{Engine, PRUNE_PERIOD};
use crate::store::Ending;

impl Engine {
    pub(super) fn housekeeping_period(&self) -> Duration {
        let shortest = self.config.unknown_timeout.min(self.config.pending_ttl);
        (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(30))
    }

    pub(super) fn housekeeping(&mut self) {
        let now = self.config.clock.now_ms();
        let mut ended = Vec::new();
        match self.store.expired_pending(now) {
            Ok(expired) => {
                for session in expired {
                    ended.push((session, EndReason::PendingExpired));
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot list expired pending sessions"),
        }
        let cutoff = now - self.config.unknown_timeout.as_millis() as i64;
        // Every owner of this boot is watched (the /proc poller takes what no other source
        // can), so it ends when it dies; only owners on other machines can time out.
        match self.store.idle_of_other_boots(cutoff, &self.local.boot_id) {
            Ok(idle) => ended.extend(idle.into_iter().map(|s| (s, EndReason::Timeout))),
            Err(e) => tracing::error!(error = %e, "cannot list idle sessions"),
        }
        for (session, reason) in ended {
            let ending = Ending {
                survivors: self.survivors_of([&session.owner]).pop().flatten(),
                ..Ending::because(reason)
            };
            let owner = Some(&session.owner);
            match (self.store).end(session.creator_uid, &session.id, owner, &ending, now) {
                Ok(events) if events.is_empty() => {}
                Ok(events) => {
                    self.publish(events);
                    self.unwatch_if_unused(&session.owner);
                }
                Err(e) => tracing::error!(error = %e, session = session.id, "cannot end session"),
            }
        }
        if self
            .last_prune
            .is_none_or(|at| at.elapsed() >= PRUNE_PERIOD)
        {
            self.last_prune = Some(Instant::now());
            let max_age = self.config.retain_age.as_millis() as i64;
            match self.store.prune(self.config.retain_events, max_age, now) {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "pruned events beyond retention"),
                Err(e) => tracing::error!(error = %e, "cannot prune events"),
            }
            // Ended sessions are kept for `get` as long as their events are; then their
            // ids may be registered again.
            match self.store.prune_sessions(now - max_age) {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(
                    deleted,
                    retain_age_s = self.config.retain_age.as_secs(),
                    "pruned ended sessions beyond retention; their ids are free again"
                ),
                Err(e) => tracing::error!(error = %e, "cannot prune ended sessions"),
            }
        }
    }
}
