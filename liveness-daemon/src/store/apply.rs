//! A batch of deaths, from the ACTIVE sessions in memory to SQLite: what it changes is
//! built without a read of the database ([`journal_deaths`]), journaled and published, then
//! applied ([`Store::apply`]); at start, the batches a crash left between their append and
//! their commit are applied first ([`Store::replay`]).

use std::collections::HashSet;

use rusqlite::params;

use liveness_common::lock::ReleaseReason;
use liveness_common::session::{EndReason, Event, EventKind, OnEnd, Until};

use super::active::{Active, Owned};
use super::journal::{EventJson, JournalEntry, JournaledEnding, JournaledEvent, JournaledRelease};
use super::lock_rows::lock_event;
use super::prepared::PreparedEnd;
use super::rows::{json_value, name};
use super::{Ending, OwnerDeath, Store, StoreError};

/// A batch of deaths, ready to journal: the entry, and its events (with their seqs) for
/// the subscribers, in the same order.
#[derive(Debug, Default)]
pub struct JournaledDeaths {
    pub entry: JournalEntry,
    pub events: Vec<Event>,
}

/// What the deaths of `deaths` end: each ACTIVE session of each owner, as the database's
/// ending would (ended event, then its locks released in name order), with the seqs after
/// `head`. Reads nothing but `active`.
pub fn journal_deaths(
    active: &Active,
    deaths: &[OwnerDeath],
    now_ms: i64,
    head: u64,
) -> Result<JournaledDeaths, StoreError> {
    let mut batch = JournaledDeaths::default();
    let mut ended = HashSet::new();
    let mut seq = head;
    // The next seq is given to `event`, whose JSON `prepared` writes if it is given.
    let mut push = |batch: &mut JournaledDeaths,
                    mut event: Event,
                    prepared: Option<&PreparedEnd>|
     -> Result<(), StoreError> {
        seq += 1;
        event.seq = seq;
        let body = match prepared {
            Some(prepared) => prepared.fill(&event)?,
            None => EventJson::of(&event)?,
        };
        batch.entry.events.push(JournaledEvent {
            seq,
            kind: name(&event.kind)?,
            session: event.session.clone(),
            creator_uid: event.creator_uid,
            at_ms: event.at_ms,
            body,
        });
        batch.events.push(event);
        Ok(())
    };
    for death in deaths {
        let sender_sessions = death.sender_root.map_or_else(Vec::new, |root| {
            active.sessions_of(root, &death.owner.boot_id)
        });
        let ending = death.ending(sender_sessions);
        let tree_ending = Ending {
            reason: EndReason::TreeExited,
            ..ending.clone()
        };
        for Owned {
            session,
            ended: prepared,
            held,
        } in active.of_owner(&death.owner)
        {
            // A session that lasts until its tree does outlives an owner with survivors.
            let until_tree = session.until == Until::Tree;
            if until_tree && death.tree_holds(session) {
                continue;
            }
            // Two reports of one owner in a batch end its sessions once.
            if !ended.insert((session.creator_uid, session.id.clone())) {
                continue;
            }
            let ending = if until_tree { &tree_ending } else { &ending };
            let event = ending.event(session, now_ms);
            batch.entry.endings.push(JournaledEnding {
                uid: session.creator_uid,
                id: session.id.clone(),
                reason: ending.reason,
                exit: ending.exit,
                detected_by: ending.detected_by,
                ended_ms: now_ms,
                survivors: ending.survivors.clone(),
                cause: event.cause.clone(),
                usage: event.usage.clone(),
                reap: session.on_end == OnEnd::Terminate,
            });
            push(&mut batch, event, prepared)?;
            let mut held = held.to_vec();
            held.sort_unstable_by(|a, b| a.name.cmp(&b.name));
            for lock in held {
                batch.entry.released.push(JournaledRelease {
                    uid: lock.uid,
                    name: lock.name.clone(),
                    session: lock.session.clone(),
                });
                let reason = Some(ReleaseReason::SessionEnded);
                push(
                    &mut batch,
                    lock_event(EventKind::LockReleased, session, &lock, reason, now_ms),
                    None,
                )?;
            }
        }
    }
    Ok(batch)
}

impl Store {
    /// Writes what journaled batches of deaths changed, in order, in one transaction: each
    /// session ended as journaled (if it is still ACTIVE), its reap marked due, its locks
    /// released, its events stored with their seqs. Applying an entry twice changes nothing
    /// more.
    pub fn apply(&mut self, entries: &[JournalEntry]) -> Result<(), StoreError> {
        let tx = self.write_tx()?;
        for entry in entries {
            apply_entry(&tx, entry)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// At start: applies, in order, the journaled batches the store does not have (those
    /// past its head seq). Returns how many.
    pub fn replay(&mut self, entries: &[JournalEntry]) -> Result<usize, StoreError> {
        let head = self.head_seq()?;
        let mut applied = 0;
        for entry in entries {
            if entry.last_seq().is_some_and(|last| last > head) {
                crate::faults::point("mid-replay");
                self.apply(std::slice::from_ref(entry))?;
                applied += 1;
            }
        }
        Ok(applied)
    }
}

/// One entry's changes, within `tx`.
fn apply_entry(tx: &rusqlite::Transaction<'_>, entry: &JournalEntry) -> Result<(), StoreError> {
    for ending in &entry.endings {
        let ended = tx
            .prepare_cached(
                "UPDATE sessions SET phase = 'ended', reason = ?3, exit = ?4, \
                 detected_by = ?5, ended_ms = ?6, updated_ms = ?6, \
                 survivors = COALESCE(?7, survivors), cause = ?8, usage = ?9 \
                 WHERE creator_uid = ?1 AND id = ?2 AND phase = 'active'",
            )?
            .execute(params![
                ending.uid,
                ending.id,
                name(&ending.reason)?,
                json_value(ending.exit.as_ref())?,
                ending.detected_by.map(|d| name(&d)).transpose()?,
                ending.ended_ms,
                json_value(ending.survivors.as_ref())?,
                json_value(ending.cause.as_ref())?,
                json_value(ending.usage.as_ref())?,
            ])?;
        if ended > 0 && ending.reap {
            tx.prepare_cached("INSERT OR REPLACE INTO reaps (uid, session) VALUES (?1, ?2)")?
                .execute(params![ending.uid, ending.id])?;
        }
    }
    for release in &entry.released {
        tx.prepare_cached("DELETE FROM locks WHERE uid = ?1 AND name = ?2 AND session = ?3")?
            .execute(params![release.uid, release.name, release.session])?;
    }
    for event in &entry.events {
        tx.prepare_cached(
            "INSERT OR IGNORE INTO events (seq, kind, session, creator_uid, at_ms, body) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![
            i64::try_from(event.seq).unwrap_or(i64::MAX),
            event.kind,
            event.session,
            event.creator_uid,
            event.at_ms,
            event.body.as_str()
        ])?;
    }
    Ok(())
}
