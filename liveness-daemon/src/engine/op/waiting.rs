//! How many wait for each lock that has waiters, for `lock_list`: as many as there are
//! open connections waiting at most, whatever the number of locks.

use std::collections::HashMap;

use crate::engine::Refusal;

use super::Op;
use crate::engine::Caller;
use crate::engine::actor::Context;

#[derive(Debug)]
pub struct Waiting;

impl Op for Waiting {
    /// By lock: its user and name.
    type Answer = HashMap<(u32, String), u32>;

    fn apply(self, cx: &mut Context<'_>, _: Caller) -> Result<Self::Answer, Refusal> {
        Ok(cx.lock_waiters())
    }
}
