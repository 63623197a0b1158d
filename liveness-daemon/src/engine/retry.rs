//! Commits that failed (a full disk, say) are kept and made again, every [`RETRY_PERIOD`]
//! and with the next commit of their kind: the deaths the sources reported and the outcomes
//! of finished reaps are facts nobody reports twice, so none may be dropped. Nothing is
//! announced before its commit.

use crate::store::{OwnerDeath, StoreError};

use super::reaping::ReapDone;
use super::{Engine, RETRY_PERIOD};

/// What is waiting to be committed again, oldest first.
#[derive(Debug, Default)]
pub(super) struct Uncommitted {
    pub(super) deaths: Vec<OwnerDeath>,
    pub(super) reaps: Vec<ReapDone>,
}

impl Uncommitted {
    pub(super) fn is_empty(&self) -> bool {
        self.deaths.is_empty() && self.reaps.is_empty()
    }
}

impl Engine {
    /// The retry tick: commits again whatever failed.
    pub(super) fn retry_commits(&mut self) {
        self.apply_journaled();
        self.finalize(Vec::new());
        self.record_reaps(Vec::new());
    }

    /// Commits `new` after what an earlier failed commit of the same kind left in
    /// `kept(&mut self.uncommitted)`, in one call of `commit`, so that their order holds.
    /// Returns them all with what `commit` returned; on failure keeps them all to be
    /// committed again, counts the failure and returns `None`.
    pub(super) fn commit_or_keep<T, R>(
        &mut self,
        kept: fn(&mut Uncommitted) -> &mut Vec<T>,
        new: Vec<T>,
        what: &'static str,
        commit: impl FnOnce(&mut Engine, &[T]) -> Result<R, StoreError>,
    ) -> Option<(Vec<T>, R)> {
        let mut items = std::mem::take(kept(&mut self.uncommitted));
        let retrying = !items.is_empty();
        items.extend(new);
        if items.is_empty() {
            return None;
        }
        match commit(self, &items) {
            Ok(committed) => {
                if retrying {
                    tracing::info!(count = items.len(), what, "committed what had failed");
                }
                Some((items, committed))
            }
            Err(e) => {
                let e = self.store.explain(e);
                if retrying {
                    tracing::debug!(error = %e, count = items.len(), what, "committing failed again");
                } else {
                    tracing::error!(error = %e, count = items.len(), what, "cannot commit; retrying every {RETRY_PERIOD:?}");
                }
                self.counters.failed_commits += 1;
                *kept(&mut self.uncommitted) = items;
                None
            }
        }
    }
}
