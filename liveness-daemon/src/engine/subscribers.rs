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
    /// Offered each batch after those without it.
    last: bool,
}

/// Invariant: `subscribers` holds those with `last` after those without, each group in the
/// order they subscribed.
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

    /// A new subscriber on `socket`: the events `filter` admits after `after`; `last`:
    /// offered each batch after the others.
    pub(super) fn subscribe(
        &mut self,
        socket: OwnedFd,
        filter: EventFilter,
        after: u64,
        last: bool,
    ) -> Arc<Outbox> {
        // Those that ended since the last batch go now: subscribing in a loop with nothing
        // published grows the list no further than the open ones.
        self.subscribers
            .retain(|subscriber| subscriber.outbox.is_open());
        let outbox = Outbox::new(socket, self.capacity);
        let at = (self.subscribers.iter())
            .position(|subscriber| subscriber.last && !last)
            .unwrap_or(self.subscribers.len());
        self.subscribers.insert(
            at,
            Subscriber {
                outbox: Arc::clone(&outbox),
                filter,
                after,
                last,
            },
        );
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

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use super::*;

    /// The daemon's own readers stay behind every client, however they interleave.
    #[test]
    fn the_daemons_own_subscribers_are_offered_each_batch_last() {
        let mut subscribers = Subscribers::new(8);
        let mut peers = Vec::new();
        for last in [true, false, true, false, false] {
            let (ours, theirs) = UnixStream::pair().unwrap();
            peers.push(theirs);
            subscribers.subscribe(ours.into(), EventFilter::default(), 0, last);
        }
        let order: Vec<bool> = subscribers.subscribers.iter().map(|s| s.last).collect();
        assert_eq!(order, [false, false, false, true, true]);
    }
}
