//! A barrier for reads of the database made off the engine (`list`): answered only once
//! SQLite has every published batch (see `Command::run`), so that a client that saw an
//! event never lists its session in the state before it.

use liveness_common::protocol::ErrorBody;

use super::Op;
use crate::engine::{Caller, Engine};

#[derive(Debug)]
pub struct Synced;

impl Op for Synced {
    type Answer = ();

    fn apply(self, _: &mut Engine, _: Caller) -> Result<(), ErrorBody> {
        Ok(())
    }
}
