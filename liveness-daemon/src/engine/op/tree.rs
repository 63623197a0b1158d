//! The tree of the session a request names, as known now, for the connection to read what
//! is alive of it off the engine (`processes`, and the survivors of an `end`).

use liveness_common::protocol::ErrorBody;
use liveness_common::session::{Phase, Session};

use super::{Op, addressed};
use crate::engine::{Caller, Engine, TreeView};

#[derive(Debug)]
pub struct Tree {
    pub session: String,
    pub uid: Option<u32>,
}

impl Op for Tree {
    /// The session and, for an ACTIVE one of this boot, its tree.
    type Answer = (Session, Option<TreeView>);

    fn apply(self, engine: &mut Engine, caller: Caller) -> Result<Self::Answer, ErrorBody> {
        let found = addressed(&engine.store, caller, &self.session, self.uid)?;
        let view = (found.owner.boot_id == engine.local.boot_id && found.phase == Phase::Active)
            .then(|| engine.trees.view(found.owner.key()));
        Ok((found, view))
    }
}
