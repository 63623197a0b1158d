//! `lock_acquire`: the lock, at once, or a place in its queue (see [`crate::engine::locks`]).

use crate::engine::Refusal;
use liveness_common::request::LockAcquire;

use super::{Op, addressed};
use crate::engine::actor::Context;
use crate::engine::{Acquire, Caller};

impl Op for LockAcquire {
    type Answer = Acquire;

    fn apply(self, cx: &mut Context<'_>, caller: Caller) -> Result<Acquire, Refusal> {
        let LockAcquire {
            name,
            session,
            uid,
            wait,
            timeout_ms,
            // The server answers fleet locks itself (fleet/locks.rs).
            cluster: _,
        } = self;
        if timeout_ms.is_some() && !wait {
            return Err(Refusal::Invalid(
                "`timeout_ms` applies only to a request that waits: add `wait: true`".into(),
            ));
        }
        let holder = addressed(cx.store(), caller, &session, uid)?;
        cx.lock(holder.creator_uid, holder.id, name, wait)
    }
}
