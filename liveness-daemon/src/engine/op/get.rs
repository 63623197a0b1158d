//! `get`: a session as stored.

use liveness_common::protocol::ErrorBody;
use liveness_common::request::Get;
use liveness_common::session::Session;

use super::actions_done::with_actions;
use super::{Op, addressed};
use crate::engine::{Caller, Engine};

impl Op for Get {
    type Answer = Session;

    fn apply(self, engine: &mut Engine, caller: Caller) -> Result<Session, ErrorBody> {
        let session = addressed(&engine.store, caller, &self.session, self.uid)?;
        with_actions(engine, session)
    }

    fn about(session: &Session) -> Option<&Session> {
        Some(session)
    }
}
