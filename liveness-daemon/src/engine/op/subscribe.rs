//! A subscription to the events committed from now on: the connection replays the ones
//! up to the head from the store, and streams the rest from its queue.

use tokio::sync::mpsc;

use liveness_common::protocol::ErrorBody;

use super::Op;
use crate::engine::{Batch, Caller, Engine, store_error};

#[derive(Debug)]
pub struct Subscribe;

/// A live subscription: batches after `head` arrive on `batches`; the events up to `head`
/// are in the store. `batches` closes when the subscriber lags or the engine stops.
#[derive(Debug)]
pub struct Subscription {
    pub head: u64,
    /// The store the seqs belong to.
    pub store_id: String,
    pub batches: mpsc::Receiver<Batch>,
}

impl Op for Subscribe {
    type Answer = Subscription;

    fn apply(self, engine: &mut Engine, _: Caller) -> Result<Subscription, ErrorBody> {
        let head = engine.store.head_seq().map_err(store_error)?;
        Ok(Subscription {
            head,
            store_id: engine.store_id.clone(),
            batches: engine.subscribers.subscribe(),
        })
    }
}
