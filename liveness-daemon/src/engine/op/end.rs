//! `end`: a session ends because its client says so (reason `stopped`).

use liveness_common::identity::ProcessKey;
use liveness_common::protocol::{ErrorBody, ErrorCode};
use liveness_common::request;
use liveness_common::session::{EndReason, EventKind, OnEnd, Session, Survivors};

use super::{Op, addressed, stored};
use crate::engine::{Caller, Engine, store_error};
use crate::store::Ending;

/// An `end` request, with the survivors of the owner's tree (named by its root) read off
/// the engine; should the session have another owner by now, they are read here. The
/// process that sent it and its ancestors in the tree are no survivors, and never
/// signalled by the end's reap.
#[derive(Debug)]
pub struct End {
    pub request: request::End,
    pub survivors: Option<(ProcessKey, Survivors)>,
}

impl Op for End {
    type Answer = Session;

    fn apply(self, engine: &mut Engine, caller: Caller) -> Result<Session, ErrorBody> {
        let request::End {
            session,
            uid,
            terminate,
        } = self.request;
        let now = engine.config.clock.now_ms();
        let existing = addressed(&engine.store, caller, &session, uid)?;
        let survivors = match self.survivors {
            Some((root, survivors)) if root == existing.owner.key() => Some(survivors),
            // Another owner since: its tree is read here, the caller set apart as well.
            _ => (existing.owner.boot_id == engine.local.boot_id).then(|| {
                let kernel = engine.trees.reader();
                (engine.trees.view(existing.owner.key())).survivors(
                    kernel.as_deref(),
                    &engine.config.proc,
                    caller.pid,
                )
            }),
        };
        let ending = Ending {
            survivors,
            terminate,
            ..Ending::because(EndReason::Stopped)
        };
        let events = (engine.store)
            .end(existing.creator_uid, &session, None, &ending, now)
            .map_err(store_error)?;
        if events.is_empty() {
            return Err(ErrorBody::new(
                ErrorCode::AlreadyEnded,
                format!("session {session:?} has already ended"),
            ));
        }
        // A `terminate` policy reaps on publish already.
        let reap = (terminate && existing.on_end == OnEnd::Leave)
            .then(|| events.iter().find(|e| e.kind == EventKind::Ended))
            .flatten()
            .cloned();
        engine.publish(events);
        if let Some(ended) = reap {
            engine.reaps.start(&ended, &engine.store, &engine.trees);
        }
        engine.unwatch_if_unused(&existing.owner);
        stored(&engine.store, existing.creator_uid, &session)
    }
}
