//! `lock_release`: only the holding session releases, and only its user (or root) names
//! that session.

use liveness_common::lock::Lock;
use liveness_common::protocol::ErrorBody;
use liveness_common::request::LockRelease;

use super::{Op, addressed};
use crate::engine::{Caller, Engine, store_error};

impl Op for LockRelease {
    type Answer = Lock;

    fn apply(self, engine: &mut Engine, caller: Caller) -> Result<Lock, ErrorBody> {
        let holder = addressed(&engine.store, caller, &self.session, self.uid)?;
        let now = engine.config.clock.now_ms();
        let (lock, event) = (engine.store)
            .release_lock(holder.creator_uid, &holder.id, &self.name, now)
            .map_err(|e| store_error(engine.store.explain(e)))?;
        engine.publish(vec![event]);
        Ok(lock)
    }
}
