//! `rename`: a pending session gets its real id.

use crate::engine::Refusal;
use liveness_common::request::Rename;
use liveness_common::session::Session;

use super::{Op, addressed, stored};
use crate::engine::Caller;
use crate::engine::actor::Context;

impl Op for Rename {
    type Answer = Session;

    fn apply(self, cx: &mut Context<'_>, caller: Caller) -> Result<Session, Refusal> {
        let now = cx.now();
        let found = addressed(cx.store(), caller, &self.session, self.uid)?;
        cx.commit(|store| {
            let event = store.rename(found.creator_uid, &self.session, &self.to, now)?;
            Ok(((), vec![event]))
        })?;
        stored(cx.store(), found.creator_uid, &self.to)
    }

    fn about(session: &Session) -> Option<&Session> {
        Some(session)
    }
}
