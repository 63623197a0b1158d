//! The fan-out: where committed events go. Each batch is serialized once and offered to
//! every subscriber, then counted for the metrics, then logged once the engine would
//! otherwise wait; with `--trace-hops`, a death's hops are stamped on its way.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use liveness_common::identity::ProcessKey;
use liveness_common::session::Event;

use super::end_metrics::EndMetrics;
use super::eventlog;
use super::hops::{self, HopTrace};
use super::outbox::Outbox;
use super::owner_checks::FreshOwners;
use super::subscribers::{Published, Subscribers};
use crate::source::ExitObservation;
use crate::store::journal::JournaledEvent;
use crate::store::{EventFilter, Lineage};

/// A live subscription: events after `head` go to `outbox`; those up to `head` are in
/// the store.
#[derive(Debug)]
pub struct Subscription {
    pub head: u64,
    /// The store and the run the seqs belong to.
    pub lineage: Arc<Lineage>,
    pub outbox: Arc<Outbox>,
}

/// A stream line of one event, as [`liveness_common::protocol::StreamMessage::Event`]
/// writes it, around the event's JSON.
fn stream_line(json: &str) -> Arc<str> {
    let mut line = String::with_capacity(json.len() + 11);
    line.push_str(r#"{"event":"#);
    line.push_str(json);
    line.push_str("}\n");
    Arc::from(line)
}

#[derive(Debug)]
pub(super) struct FanOut {
    subscribers: Subscribers,
    /// Subscribers dropped because their queue was full.
    lagged: u64,
    /// Ends of sessions by reason and source, and their latency, for `--metrics-listen`.
    end_metrics: EndMetrics,
    /// Published events not logged yet: their lines are written once the subscribers'
    /// connections have had their turn (see [`eventlog::Deferred`]).
    unlogged: eventlog::Deferred,
    /// Owners registered within the last second, to warn of those that die at once.
    fresh_owners: FreshOwners,
    /// With `--trace-hops` only.
    hops: Option<HopTrace>,
}

impl FanOut {
    /// Subscribers queue at most `subscriber_queue` batches each.
    pub(super) fn new(subscriber_queue: usize, trace_hops: bool) -> FanOut {
        FanOut {
            subscribers: Subscribers::new(subscriber_queue),
            lagged: 0,
            end_metrics: EndMetrics::default(),
            unlogged: eventlog::Deferred::default(),
            fresh_owners: FreshOwners::default(),
            hops: trace_hops.then(HopTrace::default),
        }
    }

    /// A new subscriber on `socket`: the events `filter` admits after `head`; `last`:
    /// offered each batch after the others.
    pub(super) fn subscribe(
        &mut self,
        socket: OwnedFd,
        filter: EventFilter,
        head: u64,
        last: bool,
    ) -> Arc<Outbox> {
        self.subscribers.subscribe(socket, filter, head, last)
    }

    /// The subscribers still connected.
    pub(super) fn subscribers(&self) -> u64 {
        self.subscribers.count()
    }

    /// Subscribers dropped for lagging, since the start.
    pub(super) fn lagged(&self) -> u64 {
        self.lagged
    }

    /// The counts of session ends (shared with the metrics listener).
    pub(super) fn end_metrics(&self) -> EndMetrics {
        self.end_metrics.clone()
    }

    /// Notes that the engine has just taken this death from its source (`--trace-hops`).
    pub(super) fn read(&mut self, observation: &ExitObservation) {
        if let Some(hops) = &mut self.hops {
            hops.read(observation);
        }
    }

    /// An owner just registered, whose death within a second is warned of.
    pub(super) fn registered(&mut self, owner: ProcessKey, now_ms: i64) {
        self.fresh_owners.registered(owner, now_ms);
    }

    /// Writes committed events, as one batch, to every subscriber (see `outbox`). A
    /// subscriber whose queue is full is dropped; its connection tells it `lagged`. The
    /// metrics come after, and the log lines only once the engine would otherwise wait
    /// (see `eventlog`). `journaled` holds the JSON the journal has of the events, when
    /// they were journaled: it is sent as it is.
    pub(super) fn broadcast(&mut self, mut events: Vec<Event>, journaled: &[JournaledEvent]) {
        // The ended events of the deaths read so far, just committed (`--trace-hops`).
        if let Some(hops) = &mut self.hops {
            hops.committed(&mut events);
        }
        let batch: Vec<Published> = events
            .iter_mut()
            .enumerate()
            .filter_map(|(n, event)| {
                hops::published(event);
                // Unless the event was stamped with its hops since.
                let line = match journaled.get(n).filter(|_| event.hops.is_none()) {
                    Some(journaled) => Ok(stream_line(journaled.body.as_str())),
                    None => serde_json::to_string(event).map(|json| stream_line(&json)),
                };
                match line {
                    Ok(line) => Some(Published {
                        seq: event.seq,
                        session: event.session.clone(),
                        creator_uid: event.creator_uid,
                        line,
                    }),
                    Err(e) => {
                        tracing::error!(error = %e, seq = event.seq, "cannot serialize event");
                        None
                    }
                }
            })
            .collect();
        self.lagged += self.subscribers.send(&batch);
        for event in &events {
            self.end_metrics.record(event);
        }
        self.unlogged.push(events, &mut self.fresh_owners);
    }

    /// Whether log lines wait to be written.
    pub(super) fn has_unlogged(&self) -> bool {
        !self.unlogged.is_empty()
    }

    /// Writes the log lines of the events published so far.
    pub(super) fn flush(&mut self) {
        self.unlogged.flush(&mut self.fresh_owners);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use liveness_common::protocol::StreamMessage;

    #[test]
    fn a_stream_line_is_the_stream_message() {
        // Built from JSON so that fields added later need no change here.
        let event: Event = serde_json::from_value(serde_json::json!({
            "seq": 7, "kind": "session.ended", "at_ms": 1, "session": "s",
            "owner": {"pid": 1, "start_ticks": 2, "boot_id": "b", "host": "h", "comm": "c"},
            "reason": "owner_exited", "detected_by": "ebpf", "labels": {"k": "v"},
            "creator_uid": 0,
        }))
        .unwrap();
        let json = serde_json::to_string(&event).unwrap();
        assert_eq!(
            &*stream_line(&json),
            serde_json::to_string(&StreamMessage::Event(Box::new(event))).unwrap() + "\n"
        );
    }
}
