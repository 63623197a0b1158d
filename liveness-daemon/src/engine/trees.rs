//! The engine's side of process trees: following an owner's tree while it owns ACTIVE
//! sessions, persisting its members, the survivors of an ending, and `processes`.

use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::protocol::{ErrorBody, MemberProcess, Reply};
use liveness_common::session::{Phase, Session, Survivors};
use liveness_proc::identity::ProcRoot;

use super::Engine;
use super::auth::Caller;
use super::membership::TreeView;
use crate::source::members_map::MembersMap;

impl Engine {
    /// Follows the tree of a live owner of this boot, taking back what an earlier run
    /// persisted.
    pub(super) fn follow_tree(&mut self, owner: &Identity) {
        let root = owner.key();
        let persisted = self.store.members_of(root).unwrap_or_else(|e| {
            tracing::error!(error = %e, %root, "cannot read persisted members");
            Vec::new()
        });
        let changes = self.membership.follow(root, persisted);
        self.save_members(&changes.added, &changes.removed);
    }

    /// Keeps an owner about to be tracked in the tree it is a member of, if any (see
    /// [`super::membership::Membership::merge_member`]).
    pub(super) fn keep_membership(&mut self, owner: &Identity) {
        if let Some(member) = self.membership.merge_member(owner.key()) {
            self.save_members(&[member], &[]);
        }
    }

    /// Stops following the trees of owners no ACTIVE session refers to.
    pub(super) fn forget_trees<'a>(&mut self, owners: impl IntoIterator<Item = &'a Identity>) {
        let roots: Vec<ProcessKey> = owners
            .into_iter()
            .filter(|owner| owner.boot_id == self.local.boot_id)
            .map(Identity::key)
            .collect();
        let removed = self.membership.forget(&roots);
        self.save_members(&[], &removed);
    }

    /// Merges the members the kernel added and drops the dead ones (see
    /// [`super::membership::Membership::refresh`]).
    pub(super) fn refresh_trees(&mut self) {
        let changes = self.membership.refresh();
        self.save_members(&changes.added, &changes.removed);
    }

    fn save_members(
        &mut self,
        added: &[crate::store::Member],
        removed: &[liveness_common::identity::ProcessKey],
    ) {
        if let Err(e) = self.store.save_members(added, removed) {
            // Only a restart's knowledge of orphans depends on it; the daemon goes on.
            tracing::warn!(error = %e, "cannot persist process-tree members");
        }
    }

    /// The survivors of sessions whose owners are `owners`, when they end now: one for
    /// each, in order, `None` for an owner of another boot, whose tree cannot be known.
    pub(super) fn survivors_of<'a>(
        &self,
        owners: impl IntoIterator<Item = &'a Identity>,
    ) -> Vec<Option<Survivors>> {
        let owners: Vec<&Identity> = owners.into_iter().collect();
        let here = |owner: &Identity| owner.boot_id == self.local.boot_id;
        let roots: Vec<ProcessKey> = owners
            .iter()
            .filter(|owner| here(owner))
            .map(|owner| owner.key())
            .collect();
        let mut found = self.membership.survivors(&roots).into_iter();
        owners
            .iter()
            .map(|owner| here(owner).then(|| found.next()).flatten())
            .collect()
    }

    /// What `processes` reads: the session a request names and, for an ACTIVE one of this
    /// boot, its tree as known now. The reading itself is [`processes_of`]'s, off the engine.
    pub(super) fn tree_of(
        &self,
        caller: Caller,
        session: &str,
        uid: Option<u32>,
    ) -> Result<(Session, Option<TreeView>), ErrorBody> {
        let found = self.addressed(caller, session, uid)?;
        let view = (found.owner.boot_id == self.local.boot_id && found.phase == Phase::Active)
            .then(|| self.membership.view(found.owner.key()));
        Ok((found, view))
    }
}

/// The reply to `processes`: the live members of `tree`, which `session` owns, read in
/// `/proc` and through `kernel` (a handle of the members map). Its cost is the tree's, so
/// it never runs on the engine.
pub fn processes_of(
    session: Session,
    tree: Option<TreeView>,
    kernel: Option<&MembersMap>,
    proc: &ProcRoot,
) -> Reply {
    let members = tree.map_or_else(Vec::new, |tree| tree.live_members(kernel, proc));
    let now_ticks = proc.uptime_ticks();
    let processes = members
        .into_iter()
        .filter_map(|identity| {
            let stat = proc.stat(identity.pid).ok()?;
            Some(MemberProcess {
                owner: identity.same_process(&session.owner),
                ppid: stat.ppid,
                cmdline: proc.cmdline(identity.pid).unwrap_or_default(),
                age_ms: now_ticks.saturating_sub(identity.start_ticks) * 10,
                identity,
            })
        })
        .collect();
    Reply {
        processes: Some(processes),
        ..Reply::with_session(session)
    }
}
