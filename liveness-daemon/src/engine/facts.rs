//! What the engine knows of itself and never changes while it runs: its configuration,
//! this boot and host, the store's lineage, when it started and what status says of it.

use std::sync::Arc;
use std::time::Instant;

use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::session::EndReason;
use liveness_common::status::DaemonInfo;
use liveness_proc::identity::ProcRoot;

use super::{EngineConfig, ms_of};
use crate::source::ExitObservation;
use crate::store::{Lineage, OwnerDeath, TreeCgroups};

#[derive(Debug)]
pub struct Facts {
    pub(super) config: EngineConfig,
    /// This boot, and the host name as the daemon started under it (a label only).
    pub(super) boot_id: String,
    pub(super) host: String,
    /// The store and this run, for status and the cursors of subscriptions.
    pub(super) lineage: Arc<Lineage>,
    pub(super) started: Instant,
    /// Facts status reports about the daemon itself (paths, versions).
    pub(super) about: DaemonInfo,
}

impl Facts {
    /// Milliseconds since the Unix epoch, on the engine's clock.
    pub(super) fn now_ms(&self) -> i64 {
        self.config.clock.now_ms()
    }

    pub(super) fn proc(&self) -> &ProcRoot {
        &self.config.proc
    }

    /// Whether `owner` is a process of this boot.
    pub(super) fn is_local(&self, owner: &Identity) -> bool {
        owner.boot_id == self.boot_id
    }

    /// The identity of a process of this boot, as far as its key tells.
    pub(super) fn identity_of(&self, key: ProcessKey) -> Identity {
        Identity {
            pid: key.pid,
            start_ticks: key.start_ticks,
            boot_id: self.boot_id.clone(),
            host: self.host.clone(),
            pidfs_ino: None,
            comm: String::new(),
        }
    }

    /// The store's view of a death observed on this boot.
    pub(super) fn death_of(&self, observation: &ExitObservation) -> OwnerDeath {
        let facts = observation.facts.as_ref();
        OwnerDeath {
            owner: self.identity_of(observation.key),
            reason: EndReason::from(observation.reason),
            exit: observation.status,
            detected_by: observation.detected_by,
            observed_ms: ms_of(observation.at),
            died_ms: observation.died_at.map(ms_of),
            survivors: None,
            cause: facts.map(|facts| facts.cause.clone()),
            usage: facts.map(|facts| facts.usage.clone()),
            sender_root: facts.and_then(|facts| facts.sender_root),
            tree_cgroups: TreeCgroups::Unasked,
        }
    }
}
