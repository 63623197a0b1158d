//! A subscription to the events published from now on: the connection replays the ones
//! up to the head from the store, then the engine writes the rest to its socket (see
//! [`crate::engine::outbox`]).

use std::os::fd::OwnedFd;

use crate::engine::Refusal;

use super::Op;
use crate::engine::Caller;
use crate::engine::actor::Context;
use crate::engine::fanout::Subscription;
use crate::store::EventFilter;

/// Subscribes the connection whose socket `socket` is another descriptor of.
#[derive(Debug)]
pub struct Subscribe {
    pub socket: OwnedFd,
    pub filter: EventFilter,
}

impl Op for Subscribe {
    type Answer = Subscription;

    fn apply(self, cx: &mut Context<'_>, caller: Caller) -> Result<Subscription, Refusal> {
        // The daemon's own readers (the fleet mirror, the fleet locks' follower) are
        // offered each batch after every client: a death's delivery never waits for their
        // sockets' wake-ups.
        let own = caller.pid == std::process::id();
        Ok(cx.subscribe(self.socket, self.filter, own))
    }
}
