//! The ledger: the one owner of the store and the journal. It appends deaths, writes the
//! published batches SQLite lacks, commits again what failed, and keeps the accounts that
//! follow every commit (each user's sessions and locks, the counters). The rest of the
//! engine reads the store through it and writes only through its verbs.

use crate::engine::Refusal;
use liveness_common::action::ActionOutcome;
use liveness_common::identity::Identity;
use liveness_common::session::{Event, Phase, Session};
use liveness_common::status::{Counters, SessionsStatus, StoreStatus};

use super::journaled::Journaled;
use super::reaps::ReapDone;
use super::retry::Retries;
use super::{APPLY_DELAY, MAX_UNAPPLIED, RETRY_PERIOD};
use crate::fair::limits::{Limits, SessionUsage};
use crate::store::journal::{JournaledEnding, JournaledEvent};
use crate::store::{ActionKey, JournaledDeaths, ListQuery, OwnerDeath, Store, StoreError};

/// A batch of deaths appended (see [`Ledger::append`]).
#[derive(Debug)]
pub(super) struct Appended<'a> {
    /// Its events, to publish.
    pub(super) events: Vec<Event>,
    /// The journal's text of them, sent to subscribers as it is.
    pub(super) journaled: &'a [JournaledEvent],
    /// So many batches wait for SQLite that this one is written at once.
    pub(super) many_wait: bool,
}

#[derive(Debug)]
pub(super) struct Ledger {
    store: Store,
    /// The ACTIVE sessions in memory, the journal a death is appended to before it is
    /// published, and the batches SQLite does not have yet.
    journaled: Journaled,
    /// Deaths and reap outcomes not yet committed because the store failed; retried every
    /// [`RETRY_PERIOD`]. Nothing reports them again, so they must not be dropped.
    retries: Retries,
    /// All but `lagged_subscribers`, which the fan-out counts.
    counters: Counters,
    /// Active sessions and label bytes per uid, for the registration limits.
    usage: SessionUsage,
    /// When the batches SQLite does not have yet are written (again): `None` when it has
    /// every one.
    apply_at: Option<tokio::time::Instant>,
}

impl Ledger {
    /// Opens the journal and applies what a crash left in it, before anything reads the
    /// store; then begins this run on `boot_id`.
    pub(super) fn open(
        mut store: Store,
        limits: &Limits,
        boot_id: &str,
    ) -> Result<Ledger, StoreError> {
        let mut journaled = Journaled::open(&mut store)?;
        let active = store.list(&ListQuery {
            phase: Some(Phase::Active),
            limit: usize::MAX,
            ..ListQuery::default()
        })?;
        let usage = SessionUsage::new(*limits.config(), active.sessions, store.locks(None)?);
        if store.begin_run(boot_id)? {
            tracing::warn!(
                jump = crate::store::SEQ_JUMP_AFTER_POWER_LOSS,
                "the last run, on another boot, did not stop cleanly: event seqs skip ahead so none is reused"
            );
        }
        journaled.set_head(store.head_seq()?);
        Ok(Ledger {
            store,
            journaled,
            retries: Retries::default(),
            counters: Counters::default(),
            usage,
            apply_at: None,
        })
    }

    /// The store, to read.
    pub(super) fn store(&self) -> &Store {
        &self.store
    }

    /// The store, for the writes the effects make of their own rows (reaps, end actions,
    /// trees' members); a write of sessions goes through [`Ledger::commit`].
    pub(super) fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    /// Makes a write, its error explained (a full disk named as such); the caller
    /// publishes its events.
    pub(super) fn commit<T>(
        &mut self,
        write: impl FnOnce(&mut Store) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        write(&mut self.store).map_err(|e| self.store.explain(e))
    }

    /// The store and the accounts a lock's taking checks and charges.
    pub(super) fn lock_books(&mut self) -> (&mut Store, &mut SessionUsage) {
        (&mut self.store, &mut self.usage)
    }

    /// The seq of the newest event published.
    pub(super) fn head(&self) -> u64 {
        self.journaled.head()
    }

    /// The ACTIVE sessions of `owner`, from memory, in no order.
    pub(super) fn sessions_of_owner<'a>(
        &'a self,
        owner: &'a Identity,
    ) -> impl Iterator<Item = &'a Session> {
        self.journaled.sessions_of_owner(owner)
    }

    /// The ACTIVE sessions, from memory.
    pub(super) fn active_sessions(&self) -> impl Iterator<Item = &Session> {
        self.journaled.active_sessions()
    }

    /// Follows a change to an ACTIVE session that has no event, given the session as
    /// written.
    pub(super) fn follow(&mut self, session: Session) {
        self.journaled.follow(session);
    }

    /// Follows committed events: the newest seq, the ACTIVE sessions in memory, each
    /// user's accounts.
    pub(super) fn committed(&mut self, events: &[Event]) {
        self.journaled.committed(events, &self.store);
        self.account(events);
    }

    /// Charges or credits each user for what committed events changed.
    fn account(&mut self, events: &[Event]) {
        for event in events {
            self.usage.apply(event);
        }
    }

    /// A new session's labels within `uid`'s limits.
    pub(super) fn admit(
        &mut self,
        uid: u32,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), Refusal> {
        Ok(self.usage.check(uid, labels)?)
    }

    /// A session's unfinished end actions going from `before` to `after`, within `uid`'s
    /// limits.
    pub(super) fn admit_actions(
        &mut self,
        uid: u32,
        before: u64,
        after: u64,
    ) -> Result<(), Refusal> {
        Ok(self.usage.check_actions(uid, before, after)?)
    }

    /// Ends the sessions of `deaths`, after those an earlier failed append left, in one
    /// journaled batch: appended to the journal (the durable step), its users' accounts
    /// charged, and kept for SQLite, which gets it after [`APPLY_DELAY`] with the batches
    /// published meanwhile, or sooner (see [`Ledger::catch_up`]). On failure keeps them.
    pub(super) fn append(&mut self, deaths: Vec<OwnerDeath>, now: i64) -> Option<Appended<'_>> {
        let (_, JournaledDeaths { entry, events }) = (self.retries).end(
            deaths,
            &mut self.journaled,
            &self.store,
            &mut self.counters,
            now,
        )?;
        for event in &events {
            if let Some(by) = event.detected_by {
                *self.counters.finalized_by.entry(by).or_default() += 1;
            }
        }
        self.account(&events);
        self.apply_at
            .get_or_insert_with(|| tokio::time::Instant::now() + APPLY_DELAY);
        let many_wait = self.journaled.waiting() >= MAX_UNAPPLIED;
        Some(Appended {
            events,
            journaled: self.journaled.push(entry),
            many_wait,
        })
    }

    /// When the batches SQLite lacks are due to be written.
    pub(super) fn apply_at(&self) -> Option<tokio::time::Instant> {
        self.apply_at
    }

    /// Whether published batches wait for SQLite.
    pub(super) fn behind(&self) -> bool {
        self.journaled.behind()
    }

    /// Writes the published batches SQLite does not have (in one transaction); while they
    /// cannot be written, due again after [`RETRY_PERIOD`]. Returns whether SQLite has them
    /// all.
    pub(super) fn catch_up(&mut self) -> bool {
        if !self.journaled.behind() {
            return true;
        }
        let complete = self.journaled.apply(&mut self.store);
        self.apply_at = (!complete).then(|| tokio::time::Instant::now() + RETRY_PERIOD);
        if !complete {
            self.counters.failed_commits += 1;
        }
        complete
    }

    /// The published endings SQLite does not have yet, oldest first.
    pub(super) fn waiting_endings(&self) -> impl Iterator<Item = &JournaledEnding> {
        self.journaled.waiting_endings()
    }

    /// Commits the outcomes of finished reaps, after those whose commit failed before.
    pub(super) fn record_reaps(
        &mut self,
        done: Vec<ReapDone>,
        ready: bool,
        now: i64,
    ) -> Option<Vec<Event>> {
        (self.retries).record_reaps(done, ready, &mut self.store, &mut self.counters, now)
    }

    /// Commits the outcomes of finished end actions, after those whose commit failed
    /// before.
    pub(super) fn record_actions(
        &mut self,
        done: Vec<(ActionKey, ActionOutcome)>,
        ready: bool,
        now: i64,
    ) -> Option<Vec<Event>> {
        (self.retries).record_actions(done, ready, &mut self.store, &mut self.counters, now)
    }

    /// Whether commits that failed wait to be made again.
    pub(super) fn has_retries(&self) -> bool {
        !self.retries.is_empty()
    }

    /// How many deaths, reap outcomes and action outcomes wait to be committed again.
    pub(super) fn retry_counts(&self) -> (usize, usize, usize) {
        self.retries.counts()
    }

    /// Whether the disk is full, and how many sessions' endings wait for SQLite.
    pub(super) fn store_status(&self) -> StoreStatus {
        self.journaled.store_status()
    }

    /// The counters of commits, without the fan-out's.
    pub(super) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Each user's sessions, labels and locks, against the limits.
    pub(super) fn usage_status(&self) -> SessionsStatus {
        self.usage.status()
    }

    /// Tests: the journal and the counters below the verbs.
    #[cfg(test)]
    pub(super) fn parts(&mut self) -> (&mut Journaled, &mut Counters) {
        (&mut self.journaled, &mut self.counters)
    }
}
