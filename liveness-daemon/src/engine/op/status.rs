//! `status`: the daemon's view of itself.

use crate::engine::Refusal;
use liveness_common::request;
use liveness_common::status::Status;

use super::Op;
use crate::engine::Caller;
use crate::engine::actor::Context;

impl Op for request::Status {
    type Answer = Status;

    const READS: bool = true;

    fn apply(self, cx: &mut Context<'_>, _: Caller) -> Result<Status, Refusal> {
        Ok(cx.status())
    }
}
