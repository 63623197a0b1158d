//! The rows of fleet locks (see `crate::fleet`), asked for by the daemon's own fleet
//! locks once etcd has answered: a grant, a release, and the list a restarted daemon
//! re-attaches leases from. Their events are published as a host lock's are.

use liveness_common::lock::{Lock, ReleaseReason};

use super::Op;
use crate::engine::actor::Context;
use crate::engine::{Caller, Refusal};

/// Fleet lock `lock` was granted on etcd lease `lease`.
#[derive(Debug)]
pub struct FleetGranted {
    pub lock: Lock,
    pub lease: i64,
}

impl Op for FleetGranted {
    type Answer = ();

    fn apply(self, cx: &mut Context<'_>, _: Caller) -> Result<(), Refusal> {
        let now = cx.now();
        cx.commit(|store| Ok(((), store.grant_fleet_lock(&self.lock, self.lease, now)?)))
    }
}

/// The session's fleet lock `only` (name and token), or all of them, are no longer held.
#[derive(Debug)]
pub struct FleetReleased {
    pub uid: u32,
    pub session: String,
    pub only: Option<(String, u64)>,
    pub reason: ReleaseReason,
}

impl Op for FleetReleased {
    type Answer = ();

    fn apply(self, cx: &mut Context<'_>, _: Caller) -> Result<(), Refusal> {
        let now = cx.now();
        let only = self
            .only
            .as_ref()
            .map(|(name, token)| (name.as_str(), *token));
        cx.commit(|store| {
            let events =
                store.release_fleet_locks(self.uid, &self.session, only, self.reason, now)?;
            Ok(((), events))
        })
    }
}

/// Every fleet lock held here, with its lease.
#[derive(Debug)]
pub struct FleetHeld;

impl Op for FleetHeld {
    type Answer = Vec<(Lock, i64)>;

    fn apply(self, cx: &mut Context<'_>, _: Caller) -> Result<Vec<(Lock, i64)>, Refusal> {
        Ok(cx.store().fleet_locks()?)
    }
}
