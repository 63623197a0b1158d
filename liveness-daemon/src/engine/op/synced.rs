//! A barrier for reads of the database made off the engine (`list`): answered once SQLite
//! has every published batch (see `Command::run`), so that a client that saw an event
//! never lists its session in the state before it. While the batches cannot be written (a
//! full disk), it answers with the endings they hold, for the reader to add to the rows.

use crate::engine::Refusal;

use super::Op;
use crate::engine::Caller;
use crate::engine::actor::Context;
use crate::store::journal::JournaledEnding;

#[derive(Debug)]
pub struct Synced;

impl Op for Synced {
    /// The published endings SQLite does not have: none once it is caught up.
    type Answer = Vec<JournaledEnding>;

    const READS: bool = true;

    fn apply(self, cx: &mut Context<'_>, _: Caller) -> Result<Vec<JournaledEnding>, Refusal> {
        Ok(cx.waiting_endings().cloned().collect())
    }
}
