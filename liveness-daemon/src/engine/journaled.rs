//! What the death path keeps beside the store: the ACTIVE sessions in memory, the journal,
//! the newest seq, and the journaled batches that SQLite does not have yet. A batch of
//! deaths is built from memory, appended to the journal and published; only then is it
//! written to SQLite, with the batches after it in one transaction, once the engine has
//! nothing more pressing (see `Engine::finalize` and `Engine::caught_up`).

use std::path::Path;

use liveness_common::identity::Identity;
use liveness_common::session::{Event, Session};

use crate::store::journal::{Journal, JournalEntry, JournaledEnding, JournaledEvent};
use crate::store::{Active, JournaledDeaths, OwnerDeath, Store, StoreError, journal_deaths};
use liveness_common::status::StoreStatus;

#[derive(Debug)]
pub(super) struct Journaled {
    active: Active,
    journal: Journal,
    /// The seq of the newest event.
    head: u64,
    /// Batches published that SQLite does not have yet (not written yet, or refused),
    /// oldest first.
    unapplied: Vec<JournalEntry>,
    /// The last write of `unapplied` failed for want of space.
    disk_full: bool,
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
            disk_full: false,
        })
    }

    /// The seq of the newest event published.
    pub(super) fn head(&self) -> u64 {
        self.head
    }

    /// Events go on from `head` (a start after a power loss jumps the seqs).
    pub(super) fn set_head(&mut self, head: u64) {
        self.head = head;
    }

    /// The ACTIVE sessions of `owner`, in no order.
    pub(super) fn sessions_of_owner<'a>(
        &'a self,
        owner: &'a Identity,
    ) -> impl Iterator<Item = &'a Session> {
        self.active.owned_by(owner)
    }

    /// The ACTIVE sessions.
    pub(super) fn active_sessions(&self) -> impl Iterator<Item = &Session> {
        self.active.sessions()
    }

    /// Follows a commit made by SQLite: its events, and the rows they name.
    pub(super) fn committed(&mut self, events: &[Event], store: &Store) {
        // SQLite numbers an event after its newest: with a published batch missing there,
        // it would take that batch's seqs again.
        debug_assert!(
            events.first().is_none_or(|event| event.seq > self.head),
            "SQLite committed seq {:?} at or below the published head {}",
            events.first().map(|e| e.seq),
            self.head
        );
        if let Some(last) = events.last() {
            self.head = self.head.max(last.seq);
        }
        if let Err(e) = self.active.sync(events, store) {
            tracing::error!(error = %e, "cannot read back what a commit changed");
        }
    }

    /// Follows a change to an ACTIVE session that has no event, given the session as
    /// written.
    pub(super) fn follow(&mut self, session: Session) {
        self.active.follow(session);
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

    /// Keeps a batch for SQLite; returns the journal's text of its events.
    pub(super) fn push(&mut self, entry: JournalEntry) -> &[JournaledEvent] {
        self.unapplied.push(entry);
        self.unapplied.last().map_or(&[], |entry| &entry.events)
    }

    /// Writes the published batches SQLite does not have, in order, in one transaction.
    /// Returns false when they cannot be (the store is then behind what was published,
    /// and they are kept).
    pub(super) fn apply(&mut self, store: &mut Store) -> bool {
        if let Err(e) = store.apply(&self.unapplied) {
            let e = store.explain(e);
            self.disk_full = matches!(e, StoreError::NoSpace { .. });
            tracing::error!(error = %e, "cannot write published deaths to the database; trying again");
            return false;
        }
        self.unapplied.clear();
        self.disk_full = false;
        if let Err(e) = self.journal.compact() {
            tracing::warn!(error = %e, "cannot empty the journal");
        }
        true
    }

    /// Whether published batches wait for SQLite.
    pub(super) fn behind(&self) -> bool {
        !self.unapplied.is_empty()
    }

    /// How many published batches wait for SQLite.
    pub(super) fn waiting(&self) -> usize {
        self.unapplied.len()
    }

    /// The published endings SQLite does not have yet, oldest first: what a read adds to
    /// the database's rows (see [`JournaledEnding::end`]).
    pub(super) fn waiting_endings(&self) -> impl Iterator<Item = &JournaledEnding> {
        self.unapplied.iter().flat_map(|entry| &entry.endings)
    }

    /// Whether SQLite lacks published batches because the disk is full, and how many
    /// sessions' endings wait for it.
    pub(super) fn store_status(&self) -> StoreStatus {
        StoreStatus {
            disk_full: self.disk_full,
            waiting: self.waiting_endings().count() as u64,
        }
    }

    /// Tests: fail the journal's appends.
    #[cfg(test)]
    pub(super) fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }
}
