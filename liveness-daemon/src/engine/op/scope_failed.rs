//! A session whose scope systemd did not start (a dead owner, a refused property, a bus
//! that did not answer): it was stored with the scope's cgroup, which holds nothing of
//! it, so the engine clears it, and `get` shows no cgroup (docs/cgroups.md#systemd).

use std::path::PathBuf;

use liveness_common::session::{Phase, Session};

use super::Op;
use crate::engine::actor::Context;
use crate::engine::{Caller, Refusal};

/// User `uid`'s session `id`, stored with the cgroup `path` of a scope that did not start.
#[derive(Debug)]
pub struct ScopeFailed {
    pub uid: u32,
    pub id: String,
    pub path: PathBuf,
}

impl Op for ScopeFailed {
    /// The session as written, `None` when it no longer has that cgroup.
    type Answer = Option<Session>;

    fn apply(self, cx: &mut Context<'_>, _: Caller) -> Result<Option<Session>, Refusal> {
        let ScopeFailed { uid, id, path } = self;
        let shown = path.display().to_string();
        let cleared = cx.commit(|store| Ok((store.clear_cgroup(uid, &id, &shown)?, Vec::new())))?;
        cx.forget_cgroup(uid, &id, &path);
        if let Some(session) = cleared.as_ref().filter(|s| s.phase == Phase::Active) {
            // An ACTIVE session's cgroup is read from memory at its end.
            cx.follow(session.clone());
        }
        Ok(cleared)
    }
}
