//! `status`: the daemon's view of itself.

use liveness_common::protocol::ErrorBody;
use liveness_common::request;
use liveness_common::session::Phase;
use liveness_common::status::{LimitsStatus, Status};

use super::Op;
use crate::engine::{Caller, Engine, membership};

impl Op for request::Status {
    type Answer = Status;

    fn apply(self, engine: &mut Engine, _: Caller) -> Result<Status, ErrorBody> {
        let store = &engine.store;
        Ok(Status {
            daemon: engine.about.clone(),
            uptime_ms: engine.started.elapsed().as_millis() as u64,
            head_seq: store.head_seq().unwrap_or_default(),
            store_id: engine.store_id.clone(),
            active_sessions: store.count(Phase::Active).unwrap_or_default(),
            ended_sessions: store.count(Phase::Ended).unwrap_or_default(),
            subscribers: engine.subscribers.iter().filter(|q| !q.is_closed()).count() as u64,
            uncommitted_deaths: engine.uncommitted.deaths.len() as u64,
            monitor: engine.monitor.status(),
            counters: engine.counters.clone(),
            limits: LimitsStatus {
                connections: engine.config.limits.status(),
                sessions: engine.usage.status(),
            },
            membership: Some(engine.membership.status(membership::REFRESH_PERIOD)),
        })
    }
}
