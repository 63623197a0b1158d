//! `get`: a session as stored.

use crate::engine::Refusal;
use liveness_common::request::Get;
use liveness_common::session::Session;

use super::actions_done::with_actions;
use super::{Op, addressed};
use crate::engine::Caller;
use crate::engine::actor::Context;

impl Op for Get {
    type Answer = Session;

    const READS: bool = true;

    fn apply(self, cx: &mut Context<'_>, caller: Caller) -> Result<Session, Refusal> {
        let mut session = addressed(cx.store(), caller, &self.session, self.uid)?;
        if let Some(ending) =
            (cx.waiting_endings()).find(|ending| ending.ends(session.creator_uid, &session.id))
        {
            ending.end(&mut session);
        }
        with_actions(cx.store(), session)
    }

    fn about(session: &Session) -> Option<&Session> {
        Some(session)
    }
}
