//! `touch`: activity, which postpones the inactivity timeout of an owner that cannot be
//! watched.

use liveness_common::protocol::ErrorBody;
use liveness_common::request::Touch;
use liveness_common::session::Session;

use super::{Op, addressed, stored};
use crate::engine::{Caller, Engine, store_error};

impl Op for Touch {
    type Answer = Session;

    fn apply(self, engine: &mut Engine, caller: Caller) -> Result<Session, ErrorBody> {
        let now = engine.config.clock.now_ms();
        let found = addressed(&engine.store, caller, &self.session, self.uid)?;
        (engine.store)
            .touch(found.creator_uid, &self.session, now)
            .map_err(store_error)?;
        stored(&engine.store, found.creator_uid, &self.session)
    }

    fn about(session: &Session) -> Option<&Session> {
        Some(session)
    }
}
