//! The engine's side of process trees: following an owner's tree while it owns ACTIVE
//! sessions, persisting its members, the survivors of an ending, and `processes`.

use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::protocol::{MemberProcess, Reply};
use liveness_common::session::Survivors;

use super::Engine;
use super::auth::Caller;

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

    /// `processes`: the live members of an ACTIVE session's tree.
    pub(super) fn processes(&self, caller: Caller, session: &str, uid: Option<u32>) -> Reply {
        let found = match self.addressed(caller, session, uid) {
            Ok(found) => found,
            Err(error) => return error.into(),
        };
        let members = if found.owner.boot_id == self.local.boot_id
            && found.phase == liveness_common::session::Phase::Active
        {
            self.membership.live_members(found.owner.key())
        } else {
            Vec::new()
        };
        let now_ticks = self.config.proc.uptime_ticks();
        let processes = members
            .into_iter()
            .filter_map(|identity| {
                let stat = self.config.proc.stat(identity.pid).ok()?;
                Some(MemberProcess {
                    owner: identity.same_process(&found.owner),
                    ppid: stat.ppid,
                    cmdline: self.config.proc.cmdline(identity.pid).unwrap_or_default(),
                    age_ms: now_ticks.saturating_sub(identity.start_ticks) * 10,
                    identity,
                })
            })
            .collect();
        Reply {
            processes: Some(processes),
            ..Reply::with_session(found)
        }
    }
}
