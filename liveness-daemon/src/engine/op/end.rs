//! `end`: a session ends because its client says so (reason `stopped`).

use crate::engine::Refusal;
use liveness_common::identity::ProcessKey;
use liveness_common::request;
use liveness_common::session::{EndReason, EventKind, OnEnd, Session, Survivors};

use super::{Op, addressed, stored};
use crate::engine::Caller;
use crate::engine::actor::Context;
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

    fn apply(self, cx: &mut Context<'_>, caller: Caller) -> Result<Session, Refusal> {
        let request::End {
            session,
            uid,
            terminate,
        } = self.request;
        let now = cx.now();
        let existing = addressed(cx.store(), caller, &session, uid)?;
        let survivors = match self.survivors {
            Some((root, survivors)) if root == existing.owner.key() => Some(survivors),
            // Another owner since: its tree is read here, the caller set apart as well.
            _ => cx.survivors(&existing.owner, caller.pid),
        };
        let ending = Ending {
            survivors,
            terminate,
            ..Ending::because(EndReason::Stopped)
        };
        let ended = cx.commit(|store| {
            let events = store.end(existing.creator_uid, &session, None, &ending, now)?;
            // A `terminate` policy reaps on publish already.
            let reap = (terminate && existing.on_end == OnEnd::Leave)
                .then(|| events.iter().find(|e| e.kind == EventKind::Ended))
                .flatten()
                .cloned();
            Ok(((!events.is_empty(), reap), events))
        })?;
        let (ended, reap) = ended;
        if !ended {
            return Err(Refusal::Ended(session));
        }
        if let Some(ended) = reap {
            cx.reap(&ended);
        }
        cx.unwatch(&existing.owner);
        stored(cx.store(), existing.creator_uid, &session)
    }
}
