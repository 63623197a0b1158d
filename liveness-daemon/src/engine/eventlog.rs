//! One info line per session registered, ended and reaped, with structured fields
//! (kept as journal fields when the daemon logs to journald): who, whose, why, seen by
//! which source, and how long from the death to the commit.
//!
//! The lines are written after the subscribers' connections have had their turn, not
//! between the commit and their wake-up: the engine and the connections share the
//! runtime's workers, so a log write (to a file, to journald) before its yield delayed
//! every stream reader by its cost.

use liveness_common::session::{Event, EventKind};
use liveness_common::wire::wire_name;

use super::owner_checks::FreshOwners;

/// From the owner's death (the kernel's time where the source reads it, else when a
/// source saw it) to the commit of its end, in milliseconds.
pub(super) fn end_latency_ms(event: &Event) -> Option<i64> {
    event
        .died_ms
        .or(event.observed_ms)
        .map(|died| (event.at_ms - died).max(0))
}

/// Most events held back before their lines are written at once. Enough for a burst of
/// ten thousand ends to reach the stream before any of its lines is written (about 6 MB
/// held for that long); a larger burst writes them as it goes.
const MAX_DEFERRED: usize = 16_384;

/// Published events whose lines are still to be written.
#[derive(Debug, Default)]
pub(super) struct Deferred(Vec<Event>);

impl Deferred {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn push(&mut self, events: Vec<Event>, fresh_owners: &mut FreshOwners) {
        self.0.extend(events);
        if self.0.len() >= MAX_DEFERRED {
            self.flush(fresh_owners);
        }
    }

    pub(super) fn flush(&mut self, fresh_owners: &mut FreshOwners) {
        for event in self.0.drain(..) {
            log(&event, fresh_owners);
        }
    }
}

/// Logs a committed event, and warns of an owner that died within a second of its
/// registration (a launcher or a hook's own process, most likely, not the real owner).
fn log(event: &Event, fresh_owners: &mut FreshOwners) {
    let owner = &event.owner;
    if event.kind == EventKind::Ended
        && let Some(lived_ms) = event
            .died_ms
            .or(event.observed_ms)
            .and_then(|died| fresh_owners.died_young(owner.key(), died))
    {
        tracing::warn!(
            session = %event.session,
            owner_pid = owner.pid,
            owner_comm = %owner.comm,
            lived_ms,
            "the owner exited within a second of its registration: was it a launcher or the \
             hook itself rather than the program the session is about? (see resolve-owner, --wrapper)"
        );
    }
    match event.kind {
        EventKind::Registered => tracing::info!(
            session = %event.session,
            uid = event.creator_uid,
            owner_pid = owner.pid,
            owner_comm = %owner.comm,
            owner_start_ticks = owner.start_ticks,
            seq = event.seq,
            "session registered"
        ),
        EventKind::Ended => tracing::info!(
            session = %event.session,
            uid = event.creator_uid,
            owner_pid = owner.pid,
            owner_comm = %owner.comm,
            reason = %wire_name(event.reason),
            source = %wire_name(event.detected_by),
            exit = %event.exit.map(|e| e.to_string()).unwrap_or_default(),
            latency_ms = end_latency_ms(event),
            seq = event.seq,
            "session ended"
        ),
        EventKind::Reaped => {
            let reaped = event.reaped.clone().unwrap_or_default();
            tracing::info!(
                session = %event.session,
                uid = event.creator_uid,
                terminated = reaped.terminated.len(),
                killed = reaped.killed.len(),
                exited = reaped.exited.len(),
                failed = reaped.failed.len(),
                seq = event.seq,
                "session's processes reaped"
            );
        }
        EventKind::Finalized => tracing::info!(
            session = %event.session,
            uid = event.creator_uid,
            seq = event.seq,
            "session finalized: each end action has its outcome"
        ),
        EventKind::Stalled | EventKind::Unstalled => {
            let activity = event.activity.as_ref();
            tracing::info!(
                session = %event.session,
                uid = event.creator_uid,
                state = %wire_name(activity.map(|a| a.state)),
                reason = %wire_name(activity.and_then(|a| a.reason)),
                seq = event.seq,
                "{}",
                if event.kind == EventKind::Stalled { "session stalled" } else { "session unstalled" }
            );
        }
        EventKind::Escaped => {
            let escape = event.escape.as_ref();
            tracing::info!(
                session = %event.session,
                uid = event.creator_uid,
                pid = escape.map(|e| e.pid),
                cgroup = escape.map(|e| e.cgroup.as_str()),
                seq = event.seq,
                "a process of the session left its cgroup"
            );
        }
        // The runner logs what an action did when it finishes.
        EventKind::Action
        | EventKind::OwnerChanged
        | EventKind::Renamed
        | EventKind::LockAcquired
        | EventKind::LockReleased => tracing::debug!(
            session = %event.session,
            kind = %wire_name(event.kind),
            owner_pid = owner.pid,
            seq = event.seq,
            "session changed"
        ),
    }
}
