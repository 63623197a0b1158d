//! What the death path keeps beside the store: the ACTIVE sessions in memory, the journal,
//! the newest seq, and the journaled batches that SQLite does not have yet. A batch of
//! deaths is built from memory, appended to the journal and published; only then is it
//! written to SQLite (see `Engine::finalize`).

use std::path::Path;

use liveness_common::identity::Identity;
use liveness_common::session::{Event, Session};

use super::locks::LockEffect;
use crate::store::journal::{Journal, JournalEntry};
use crate::store::{Active, JournaledDeaths, OwnerDeath, Store, StoreError, journal_deaths};

#[derive(Debug)]
pub(super) struct Journaled {
    active: Active,
    journal: Journal,
    /// The seq of the newest event.
    head: u64,
    /// Batches published whose write to SQLite failed, with what they change for lock
    /// waiters, oldest first.
    unapplied: Vec<(JournalEntry, Vec<LockEffect>)>,
}

impl Journaled {
    /// Opens the journal beside the database and applies to SQLite what a crash left
    /// between an append and its commit; then reads the ACTIVE sessions and the head.
    pub(super) fn open(store: &mut Store) -> Result<Journaled, StoreError> {
        let state_dir = store
            .path()
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let (mut journal, entries) = Journal::open(&state_dir)?;
        let replayed = store.replay(&entries)?;
        if replayed > 0 {
            tracing::warn!(
                batches = replayed,
                "applied the deaths a crash left in the journal, already published, to the database"
            );
        }
        journal.clear()?;
        Ok(Journaled {
            active: Active::load(store)?,
            journal,
            head: store.head_seq()?,
            unapplied: Vec::new(),
        })
    }

    /// Events go on from `head` (a start after a power loss jumps the seqs).
    pub(super) fn set_head(&mut self, head: u64) {
        self.head = head;
    }

    /// Follows a commit made by SQLite: its events, and the rows they name.
    /// The ACTIVE sessions of `owner`.
    pub(super) fn sessions_of_owner(&self, owner: &Identity) -> impl Iterator<Item = &Session> {
        self.active
            .of_owner(owner)
            .into_iter()
            .map(|(session, _)| session)
    }

    pub(super) fn committed(&mut self, events: &[Event], store: &Store) {
        if let Some(last) = events.last() {
            self.head = self.head.max(last.seq);
        }
        if let Err(e) = self.active.sync(events, store) {
            tracing::error!(error = %e, "cannot read back what a commit changed");
        }
    }

    /// Follows a change to an ACTIVE session that has no event.
    pub(super) fn refresh(&mut self, uid: u32, id: &str, store: &Store) {
        if let Err(e) = self.active.refresh(uid, id, store) {
            tracing::error!(error = %e, "cannot read back a registration");
        }
    }

    /// Builds the batch that `deaths` make of the ACTIVE sessions in memory and appends it
    /// to the journal; the sessions it ends are then forgotten here.
    pub(super) fn append(
        &mut self,
        deaths: &[OwnerDeath],
        now: i64,
    ) -> Result<JournaledDeaths, StoreError> {
        let batch = journal_deaths(&self.active, deaths, now, self.head)?;
        if batch.events.is_empty() {
            return Ok(batch);
        }
        self.journal.append(&batch.entry)?;
        if let Some(last) = batch.entry.last_seq() {
            self.head = last;
        }
        for ending in &batch.entry.endings {
            self.active.forget(&(ending.uid, ending.id.clone()));
        }
        Ok(batch)
    }

    /// Writes a published batch to SQLite, after any that failed before, in order. Returns
    /// what they change for lock waiters, of those written; `complete` turns false while
    /// some cannot be (the store is then behind what was published).
    pub(super) fn apply(
        &mut self,
        entry: Option<(JournalEntry, Vec<LockEffect>)>,
        store: &mut Store,
    ) -> Applied {
        self.unapplied.extend(entry);
        let mut effects = Vec::new();
        while let Some((entry, _)) = self.unapplied.first() {
            if let Err(e) = store.apply(entry) {
                let e = store.explain(e);
                tracing::error!(error = %e, "cannot write published deaths to the database; trying again");
                return Applied {
                    effects,
                    complete: false,
                };
            }
            effects.extend(self.unapplied.remove(0).1);
        }
        if let Err(e) = self.journal.compact() {
            tracing::warn!(error = %e, "cannot empty the journal");
        }
        Applied {
            effects,
            complete: true,
        }
    }

    /// Whether published batches wait for SQLite.
    pub(super) fn behind(&self) -> bool {
        !self.unapplied.is_empty()
    }

    /// Tests: fail the journal's appends.
    #[cfg(test)]
    pub(super) fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }
}

/// What [`Journaled::apply`] wrote.
#[derive(Debug)]
pub(super) struct Applied {
    pub(super) effects: Vec<LockEffect>,
    pub(super) complete: bool,
}
