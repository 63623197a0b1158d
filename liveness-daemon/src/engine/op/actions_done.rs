//! `actions_done`: the session's end commands were run by its client (an agent's own end
//! hook); those not started get the outcome `skipped`, and never run.

use liveness_common::protocol::ErrorBody;
use liveness_common::request::ActionsDone;

use super::{Op, addressed, stored};
use crate::engine::{Caller, Engine, Registered, store_error};

impl Op for ActionsDone {
    type Answer = Registered;

    fn apply(self, engine: &mut Engine, caller: Caller) -> Result<Registered, ErrorBody> {
        let now = engine.config.clock.now_ms();
        let existing = addressed(&engine.store, caller, &self.session, self.uid)?;
        let (uid, id) = (existing.creator_uid, existing.id);
        let (events, running) = (engine.store)
            .skip_actions(uid, &id, now)
            .map_err(|e| store_error(engine.store.explain(e)))?;
        engine.publish(events);
        let mut warnings = Vec::new();
        if running > 0 {
            warnings.push(format!(
                "{running} end action(s) of session {id:?} had started already: they finish and their outcome is recorded"
            ));
        }
        let session = with_actions(engine, stored(&engine.store, uid, &id)?)?;
        Ok(Registered { session, warnings })
    }
}

/// The session with where each of its end actions stands (`get` and `actions_done`).
pub(super) fn with_actions(
    engine: &Engine,
    mut session: liveness_common::session::Session,
) -> Result<liveness_common::session::Session, ErrorBody> {
    if !session.on_end_run.is_empty() {
        session.actions = (engine.store)
            .action_states(session.creator_uid, &session.id)
            .map_err(store_error)?;
    }
    Ok(session)
}
