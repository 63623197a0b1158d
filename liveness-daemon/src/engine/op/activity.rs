//! What the activity sampler asks of the engine: the ACTIVE sessions to sample, each with
//! a copy of its tree (read off the engine), and the record of a stall episode's start or
//! end, committed and published like every event.

use std::collections::BTreeMap;

use crate::engine::Refusal;
use liveness_common::activity::{Activity, Declared, StallPolicy};
use liveness_common::identity::Identity;
use liveness_common::session::Event;

use super::Op;
use crate::engine::actor::Context;
use crate::engine::{Caller, TreeView};

/// The ACTIVE sessions of this boot, to sample.
#[derive(Debug)]
pub struct Sampling;

/// One session to sample: what it declared, the episode under way, and its tree.
#[derive(Debug)]
pub struct Target {
    pub uid: u32,
    pub id: String,
    pub owner: Identity,
    pub declared: Option<Declared>,
    /// The stall episode under way, as recorded (it outlives a restart).
    pub episode: Option<Activity>,
    pub tree: TreeView,
    /// What a stall does, for its action.
    pub on_stall: Option<StallPolicy>,
    pub labels: BTreeMap<String, String>,
    pub grace_ms: u64,
}

impl Op for Sampling {
    type Answer = Vec<Target>;

    /// Only reads: sampling goes on while the database cannot be written.
    const READS: bool = true;

    /// A copy of each tree is an `Arc`'s: the engine spends a few pointers per session,
    /// and the labels and policy it clones.
    fn apply(self, cx: &mut Context<'_>, _caller: Caller) -> Result<Vec<Target>, Refusal> {
        Ok(cx
            .active_sessions()
            .filter_map(|session| {
                Some(Target {
                    uid: session.creator_uid,
                    id: session.id.clone(),
                    owner: session.owner.clone(),
                    declared: session.declared.clone(),
                    episode: session.activity.clone(),
                    tree: cx.tree(session)?,
                    on_stall: session.on_stall.clone(),
                    labels: session.labels.clone(),
                    grace_ms: session.grace_ms,
                })
            })
            .collect())
    }
}

/// A stall episode starts (a stall state) or ends (any other).
#[derive(Debug)]
pub struct Judged {
    pub uid: u32,
    pub id: String,
    pub activity: Activity,
}

impl Op for Judged {
    /// The event recorded; `None` when the session ended meanwhile.
    type Answer = Option<Event>;

    fn apply(self, cx: &mut Context<'_>, _caller: Caller) -> Result<Option<Event>, Refusal> {
        let now = cx.now();
        cx.commit(|store| {
            let event = store.record_activity(self.uid, &self.id, &self.activity, now)?;
            Ok((event.clone(), event.into_iter().collect()))
        })
    }
}
