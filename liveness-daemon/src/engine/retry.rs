//! Commits that failed (a full disk, say) are kept and made again, every [`RETRY_PERIOD`]
//! and with the next commit of their kind: the deaths the sources reported and the outcomes
//! of finished reaps are facts nobody reports twice, so none may be dropped. Nothing is
//! announced before its commit (for deaths, their append to the journal).

use liveness_common::action::ActionOutcome;
use liveness_common::session::Event;
use liveness_common::status::Counters;

use super::RETRY_PERIOD;
use super::journaled::Journaled;
use super::reaps::ReapDone;
use crate::store::{ActionKey, JournaledDeaths, OwnerDeath, Store, StoreError};

/// What is waiting to be committed again, oldest first.
#[derive(Debug, Default)]
pub(super) struct Retries {
    deaths: Vec<OwnerDeath>,
    reaps: Vec<ReapDone>,
    actions: Vec<(ActionKey, ActionOutcome)>,
}

impl Retries {
    pub(super) fn is_empty(&self) -> bool {
        self.deaths.is_empty() && self.reaps.is_empty() && self.actions.is_empty()
    }

    /// How many deaths, reap outcomes and action outcomes wait.
    pub(super) fn counts(&self) -> (usize, usize, usize) {
        (self.deaths.len(), self.reaps.len(), self.actions.len())
    }

    /// Ends the sessions of `deaths`, after those an earlier failed append left, in one
    /// journaled batch. Returns them all with the batch; on failure keeps them. The
    /// journal is appended to, not the store: the store only names a full disk.
    pub(super) fn end(
        &mut self,
        deaths: Vec<OwnerDeath>,
        journaled: &mut Journaled,
        store: &Store,
        counters: &mut Counters,
        now: i64,
    ) -> Option<(Vec<OwnerDeath>, JournaledDeaths)> {
        let batch = self.deaths.len() + deaths.len();
        counters.largest_batch = counters.largest_batch.max(batch);
        let end =
            |deaths: &[OwnerDeath]| (journaled.append(deaths, now)).map_err(|e| store.explain(e));
        commit_or_keep(
            &mut self.deaths,
            deaths,
            true,
            "finalizations",
            counters,
            end,
        )
    }

    /// Records the outcomes of finished reaps, after those an earlier failed commit left.
    /// Returns the events committed; on failure keeps them.
    pub(super) fn record_reaps(
        &mut self,
        done: Vec<ReapDone>,
        ready: bool,
        store: &mut Store,
        counters: &mut Counters,
        now: i64,
    ) -> Option<Vec<Event>> {
        let record =
            |done: &[ReapDone]| (store.record_reaped(done, now)).map_err(|e| store.explain(e));
        commit_or_keep(
            &mut self.reaps,
            done,
            ready,
            "reap outcomes",
            counters,
            record,
        )
        .map(|(_, events)| events)
    }
}

impl Retries {
    /// Records the outcomes of finished end actions, after those an earlier failed commit
    /// left. Returns the events committed; on failure keeps them.
    pub(super) fn record_actions(
        &mut self,
        done: Vec<(ActionKey, ActionOutcome)>,
        ready: bool,
        store: &mut Store,
        counters: &mut Counters,
        now: i64,
    ) -> Option<Vec<Event>> {
        let record = |done: &[(ActionKey, ActionOutcome)]| {
            (store.record_actions(done, now)).map_err(|e| store.explain(e))
        };
        let what = "end action outcomes";
        commit_or_keep(&mut self.actions, done, ready, what, counters, record)
            .map(|(_, events)| events)
    }
}

/// Commits `new` after what an earlier failed commit of the same kind left in `kept`, in
/// one call of `commit`, so that their order holds. Returns them all with what `commit`
/// returned; on failure (its error explained by `commit`) keeps them all to be committed
/// again, counts the failure and returns `None`. While the store is not `ready` (it lacks
/// published batches whose seqs the commit would take again), keeps them without trying.
fn commit_or_keep<T, R>(
    kept: &mut Vec<T>,
    new: Vec<T>,
    ready: bool,
    what: &'static str,
    counters: &mut Counters,
    commit: impl FnOnce(&[T]) -> Result<R, StoreError>,
) -> Option<(Vec<T>, R)> {
    let mut items = std::mem::take(kept);
    let retrying = !items.is_empty();
    items.extend(new);
    if items.is_empty() {
        return None;
    }
    if !ready {
        *kept = items;
        return None;
    }
    match commit(&items) {
        Ok(committed) => {
            if retrying {
                tracing::info!(count = items.len(), what, "committed what had failed");
            }
            Some((items, committed))
        }
        Err(e) => {
            if retrying {
                tracing::debug!(error = %e, count = items.len(), what, "committing failed again");
            } else {
                tracing::error!(error = %e, count = items.len(), what, "cannot commit; retrying every {RETRY_PERIOD:?}");
            }
            counters.failed_commits += 1;
            *kept = items;
            None
        }
    }
}
