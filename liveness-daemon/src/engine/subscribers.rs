//! The subscribers: each published batch is offered to every one, through the filter it
//! asked for, and written to its socket at once when nothing of it waits (see
//! [`Outbox`]). A subscriber whose queue outgrows its bound is dropped (its connection
//! tells it `lagged`), so that none slows the engine.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::outbox::{Ended, Outbox};
use crate::store::EventFilter;

/// An event as published live: the stream line (with its newline), serialized once for
/// every subscriber, with what subscribers filter on.
#[derive(Debug)]
pub(super) struct Published {
    pub(super) seq: u64,
    pub(super) session: String,
    pub(super) creator_uid: u32,
    pub(super) line: Arc<str>,
}

#[derive(Debug)]
struct Subscriber {
    outbox: Arc<Outbox>,
    filter: EventFilter,
    /// Events up to this seq are in its replay.
    after: u64,
}

#[derive(Debug)]
pub(super) struct Subscribers {
    subscribers: Vec<Subscriber>,
    /// Batches queued per subscriber before it counts as lagging.
    capacity: usize,
}

impl Subscribers {
    pub(super) fn new(capacity: usize) -> Subscribers {
        Subscribers {
            subscribers: Vec::new(),
            capacity,
        }
    }

    /// A new subscriber on `socket`: the events `filter` admits after `after`.
    pub(super) fn subscribe(
        &mut self,
        socket: OwnedFd,
        filter: EventFilter,
        after: u64,
    ) -> Arc<Outbox> {
        // Those that ended since the last batch go now: subscribing in a loop with nothing
        // published grows the list no further than the open ones.
        self.subscribers
            .retain(|subscriber| subscriber.outbox.is_open());
        let outbox = Outbox::new(socket, self.capacity);
        self.subscribers.push(Subscriber {
            outbox: Arc::clone(&outbox),
            filter,
            after,
        });
        outbox
    }

    /// The subscribers still connected.
    pub(super) fn count(&self) -> u64 {
        self.subscribers
            .iter()
            .filter(|subscriber| subscriber.outbox.is_open())
            .count() as u64
    }

    /// Offers a batch to every subscriber. Returns how many were dropped for lagging.
    pub(super) fn send(&mut self, batch: &[Published]) -> u64 {
        let Some(last) = batch.last().map(|p| p.seq) else {
            return 0;
        };
        let before = self.subscribers.len();
        let mut lagged = 0;
        self.subscribers.retain(|subscriber| {
            let lines = batch
                .iter()
                .filter(|p| {
                    p.seq > subscriber.after && subscriber.filter.admits(&p.session, p.creator_uid)
                })
                .map(|p| (p.seq, &p.line));
            match subscriber.outbox.offer(lines) {
                Ok(()) => true,
                Err(Ended::Lagged) => {
                    lagged += 1;
                    false
                }
                Err(Ended::Gone | Ended::Closed) => false,
            }
        });
        if self.subscribers.len() < before {
            tracing::debug!(
                seq = last,
                dropped = before - self.subscribers.len(),
                "dropped lagging or closed subscribers"
            );
        }
        lagged
    }
}
