//! `status`: the daemon's view of itself.

use liveness_common::protocol::ErrorBody;
use liveness_common::request;
use liveness_common::session::Phase;
use liveness_common::status::{LimitsStatus, Status};

use super::Op;
use crate::engine::{Caller, Engine};

impl Op for request::Status {
    type Answer = Status;

    const READS: bool = true;

    fn apply(self, engine: &mut Engine, _: Caller) -> Result<Status, ErrorBody> {
        let store = &engine.store;
        // Sessions whose ending waits for the database are still active there.
        let waiting = engine.journaled.store_status();
        Ok(Status {
            daemon: engine.about.clone(),
            uptime_ms: engine.started.elapsed().as_millis() as u64,
            // The newest seq published.
            head_seq: engine.journaled.head(),
            store_id: engine.lineage.id(),
            active_sessions: (store.count(Phase::Active).unwrap_or_default())
                .saturating_sub(waiting.waiting),
            ended_sessions: store.count(Phase::Ended).unwrap_or_default() + waiting.waiting,
            subscribers: engine.subscribers.count(),
            uncommitted_deaths: engine.retries.counts().0 as u64,
            store: waiting,
            actions: engine.actions.status(engine.retries.counts().2),
            monitor: engine.monitor.status(),
            counters: engine.counters.clone(),
            limits: LimitsStatus {
                connections: engine.config.limits.status(),
                sessions: engine.usage.status(),
            },
            membership: Some(engine.trees.status()),
        })
    }
}
