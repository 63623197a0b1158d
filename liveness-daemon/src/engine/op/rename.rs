//! `rename`: a pending session gets its real id.

use liveness_common::protocol::ErrorBody;
use liveness_common::request::Rename;
use liveness_common::session::Session;

use super::{Op, addressed, stored};
use crate::engine::{Caller, Engine, store_error};

impl Op for Rename {
    type Answer = Session;

    fn apply(self, engine: &mut Engine, caller: Caller) -> Result<Session, ErrorBody> {
        let now = engine.config.clock.now_ms();
        let found = addressed(&engine.store, caller, &self.session, self.uid)?;
        let event = (engine.store)
            .rename(found.creator_uid, &self.session, &self.to, now)
            .map_err(store_error)?;
        engine.publish(vec![event]);
        stored(&engine.store, found.creator_uid, &self.to)
    }

    fn about(session: &Session) -> Option<&Session> {
        Some(session)
    }
}
