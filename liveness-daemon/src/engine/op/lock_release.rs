//! `lock_release`: only the holding session releases, and only its user (or root) names
//! that session.

use crate::engine::Refusal;
use liveness_common::lock::Lock;
use liveness_common::request::LockRelease;

use super::{Op, addressed};
use crate::engine::Caller;
use crate::engine::actor::Context;

impl Op for LockRelease {
    type Answer = Lock;

    fn apply(self, cx: &mut Context<'_>, caller: Caller) -> Result<Lock, Refusal> {
        let holder = addressed(cx.store(), caller, &self.session, self.uid)?;
        let now = cx.now();
        cx.commit(|store| {
            let (lock, event) =
                store.release_lock(holder.creator_uid, &holder.id, &self.name, now)?;
            Ok((lock, vec![event]))
        })
    }
}
