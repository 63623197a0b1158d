//! `get`: a session as stored.

use liveness_common::protocol::ErrorBody;
use liveness_common::request::Get;
use liveness_common::session::Session;

use super::actions_done::with_actions;
use super::{Op, addressed};
use crate::engine::{Caller, Engine};

impl Op for Get {
    type Answer = Session;

    const READS: bool = true;

    fn apply(self, engine: &mut Engine, caller: Caller) -> Result<Session, ErrorBody> {
        let mut session = addressed(&engine.store, caller, &self.session, self.uid)?;
        if let Some(ending) = (engine.journaled.waiting_endings())
            .find(|ending| ending.ends(session.creator_uid, &session.id))
        {
            ending.end(&mut session);
        }
        with_actions(engine, session)
    }

    fn about(session: &Session) -> Option<&Session> {
        Some(session)
    }
}
