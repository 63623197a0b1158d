//! A subscription to the events published from now on: the connection replays the ones
//! up to the head from the store, then the engine writes the rest to its socket (see
//! [`crate::engine::outbox`]).

use std::os::fd::OwnedFd;
use std::sync::Arc;

use liveness_common::protocol::ErrorBody;

use super::Op;
use crate::engine::Caller;
use crate::engine::actor::Context;
use crate::engine::outbox::Outbox;
use crate::store::{EventFilter, Lineage};

/// Subscribes the connection whose socket `socket` is another descriptor of.
#[derive(Debug)]
pub struct Subscribe {
    pub socket: OwnedFd,
    pub filter: EventFilter,
}

/// A live subscription: events after `head` go to `outbox`; those up to `head` are in
/// the store.
#[derive(Debug)]
pub struct Subscription {
    pub head: u64,
    /// The store and the run the seqs belong to.
    pub lineage: Arc<Lineage>,
    pub outbox: Arc<Outbox>,
}

impl Op for Subscribe {
    type Answer = Subscription;

    fn apply(self, cx: &mut Context<'_>, _: Caller) -> Result<Subscription, ErrorBody> {
        Ok(cx.subscribe(self.socket, self.filter))
    }
}
