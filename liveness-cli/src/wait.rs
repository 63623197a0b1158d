//! `liveness wait`: block until a session ends; the exit code tells how.

use std::process::ExitCode;

use crate::args::WaitArgs;
use crate::context::Context;
use crate::exit::{Failure, WaitOutcome};
use crate::pids::Numbering;
use crate::render::print_session;

impl WaitArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let client = context.connect()?;
        let pids = Numbering::of(&client);
        let (id, uid) = (&self.session.session, self.session.uid);
        let session = if self.finalized {
            client.wait_for_finalized(id, uid)?
        } else {
            client.wait_for_end(id, uid)?
        };
        print_session(&session, context.json, &pids);
        Ok(ExitCode::from(WaitOutcome::of(&session) as u8))
    }
}
