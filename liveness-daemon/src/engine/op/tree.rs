//! The tree of the session a request names, as known now, for the connection to read what
//! is alive of it off the engine (`processes`, and the survivors of an `end`).

use crate::engine::Refusal;
use liveness_common::session::Session;

use super::{Op, addressed};
use crate::engine::actor::Context;
use crate::engine::{Caller, TreeView};

#[derive(Debug)]
pub struct Tree {
    pub session: String,
    pub uid: Option<u32>,
}

impl Op for Tree {
    /// The session and, for an ACTIVE one of this boot, its tree.
    type Answer = (Session, Option<TreeView>);

    fn apply(self, cx: &mut Context<'_>, caller: Caller) -> Result<Self::Answer, Refusal> {
        let found = addressed(cx.store(), caller, &self.session, self.uid)?;
        let view = cx.tree(&found);
        Ok((found, view))
    }
}
