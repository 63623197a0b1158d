//! `touch`: activity, which postpones the inactivity timeout of an owner that cannot be
//! watched.

use liveness_common::protocol::ErrorBody;
use liveness_common::request::Touch;
use liveness_common::session::Session;

use super::{Op, addressed, stored};
use crate::engine::Caller;
use crate::engine::actor::Context;

impl Op for Touch {
    type Answer = Session;

    fn apply(self, cx: &mut Context<'_>, caller: Caller) -> Result<Session, ErrorBody> {
        let now = cx.now();
        let found = addressed(cx.store(), caller, &self.session, self.uid)?;
        // Activity has no event.
        cx.commit(|store| {
            store.touch(found.creator_uid, &self.session, now)?;
            Ok(((), Vec::new()))
        })?;
        stored(cx.store(), found.creator_uid, &self.session)
    }

    fn about(session: &Session) -> Option<&Session> {
        Some(session)
    }
}
