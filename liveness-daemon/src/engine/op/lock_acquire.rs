//! `lock_acquire`: the lock, at once, or a place in its queue (see [`crate::engine::locks`]).

use liveness_common::lock::Lock;
use liveness_common::protocol::{ErrorBody, ErrorCode};
use liveness_common::request::LockAcquire;

use super::{Op, addressed};
use crate::engine::locks::{Acquire, Taken, held_error, take};
use crate::engine::{Caller, Engine};

impl Op for LockAcquire {
    type Answer = Acquire;

    fn apply(self, engine: &mut Engine, caller: Caller) -> Result<Acquire, ErrorBody> {
        let LockAcquire {
            name,
            session,
            uid,
            wait,
            timeout_ms,
        } = self;
        if timeout_ms.is_some() && !wait {
            return Err(ErrorBody::new(
                ErrorCode::InvalidRequest,
                "`timeout_ms` applies only to a request that waits: add `wait: true`",
            ));
        }
        let holder = addressed(&engine.store, caller, &session, uid)?;
        let now = engine.config.clock.now_ms();
        let uid = holder.creator_uid;
        let (store, usage) = (&mut engine.store, &mut engine.usage);
        match take(store, usage, uid, &holder.id, &name, now)? {
            Taken::Granted { lock, event } => {
                engine.publish(vec![*event]);
                Ok(Acquire::Held(lock))
            }
            Taken::AlreadyHeld(lock) => {
                let waiters = engine.locks.count(&(uid, name));
                Ok(Acquire::Held(Lock { waiters, ..lock }))
            }
            Taken::HeldByOther(lock) if !wait => Err(held_error(&lock)),
            Taken::HeldByOther(_) => engine
                .locks
                .queue(uid, &name, holder.id)
                .map(Acquire::Queued),
        }
    }
}
