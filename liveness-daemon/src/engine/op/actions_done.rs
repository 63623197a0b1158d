//! `actions_done`: the session's end commands were run by its client (an agent's own end
//! hook); those not started get the outcome `skipped`, and never run.

use liveness_common::request::ActionsDone;

use super::{Op, addressed, stored};
use crate::engine::actor::Context;
use crate::engine::{Caller, Refusal, Registered};
use crate::store::Store;

impl Op for ActionsDone {
    type Answer = Registered;

    fn apply(self, cx: &mut Context<'_>, caller: Caller) -> Result<Registered, Refusal> {
        let now = cx.now();
        let existing = addressed(cx.store(), caller, &self.session, self.uid)?;
        let (uid, id) = (existing.creator_uid, existing.id);
        let running = cx.commit(|store| {
            let (events, running) = store.skip_actions(uid, &id, now)?;
            Ok((running, events))
        })?;
        let mut warnings = Vec::new();
        if running > 0 {
            warnings.push(format!(
                "{running} end action(s) of session {id:?} had started already: they finish and their outcome is recorded"
            ));
        }
        let session = with_actions(cx.store(), stored(cx.store(), uid, &id)?)?;
        Ok(Registered {
            session,
            warnings,
            scope: None,
            enclosure: None,
        })
    }
}

/// The session with where each of its end actions stands (`get` and `actions_done`).
pub(super) fn with_actions(
    store: &Store,
    mut session: liveness_common::session::Session,
) -> Result<liveness_common::session::Session, Refusal> {
    if !session.on_end_run.is_empty() {
        session.actions = store.action_states(session.creator_uid, &session.id)?;
    }
    Ok(session)
}
