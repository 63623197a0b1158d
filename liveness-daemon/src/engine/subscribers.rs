//! The subscribers' queues: each published batch is offered to every one, and a subscriber
//! whose queue is full is dropped (its connection tells it `lagged`), so that none slows
//! the engine.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::Batch;

#[derive(Debug)]
pub(super) struct Subscribers {
    queues: Vec<mpsc::Sender<Batch>>,
    /// Commit batches queued per subscriber before it counts as lagging.
    capacity: usize,
}

impl Subscribers {
    pub(super) fn new(capacity: usize) -> Subscribers {
        Subscribers {
            queues: Vec::new(),
            capacity,
        }
    }

    /// A new subscriber's queue: the batches published from now on.
    pub(super) fn subscribe(&mut self) -> mpsc::Receiver<Batch> {
        let (queue, batches) = mpsc::channel(self.capacity);
        self.queues.push(queue);
        batches
    }

    /// The subscribers still connected.
    pub(super) fn count(&self) -> u64 {
        self.queues.iter().filter(|q| !q.is_closed()).count() as u64
    }

    /// Sends a batch to every subscriber. Returns how many were dropped for lagging.
    pub(super) fn send(&mut self, batch: &Batch) -> u64 {
        let Some(last) = batch.last().map(|p| p.seq) else {
            return 0;
        };
        let before = self.queues.len();
        let mut lagged = 0;
        self.queues
            .retain(|queue| match queue.try_send(Arc::clone(batch)) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    lagged += 1;
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
        if self.queues.len() < before {
            tracing::debug!(
                seq = last,
                dropped = before - self.queues.len(),
                "dropped lagging or closed subscribers"
            );
        }
        lagged
    }
}
