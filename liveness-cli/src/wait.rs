//! `liveness wait`: block until a session ends; the exit code tells how.

use std::process::ExitCode;

use liveness_common::exit::ExitStatus;
use liveness_common::session::{EndReason, Session};

use crate::args::WaitArgs;
use crate::context::Context;
use crate::exit::Failure;
use crate::pids::Numbering;
use crate::render::print_session;

/// How `wait` reports the end of a session (see `args::WAIT_HELP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum WaitOutcome {
    Clean = 0,
    Failed = 1,
    Killed = 2,
    /// Ended without its owner's exit: a reboot, a timeout, a pending session's expiry.
    Otherwise = 3,
    /// The owner is gone, but how is unknown: its death was seen without a status.
    Unseen = 4,
}

impl WaitOutcome {
    fn of(session: &Session) -> WaitOutcome {
        match (session.reason, session.exit) {
            (Some(EndReason::Stopped), _) | (_, Some(ExitStatus::Exited { code: 0 })) => {
                WaitOutcome::Clean
            }
            (_, Some(ExitStatus::Exited { .. })) => WaitOutcome::Failed,
            (_, Some(ExitStatus::Signaled { .. })) => WaitOutcome::Killed,
            (Some(EndReason::OwnerExited | EndReason::OwnerReused), None) => WaitOutcome::Unseen,
            _ => WaitOutcome::Otherwise,
        }
    }
}

impl WaitArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let client = context.connect()?;
        let pids = Numbering::of(&client);
        let session = client.wait_for_end(&self.session.session, self.session.uid)?;
        print_session(&session, context.json, &pids);
        Ok(ExitCode::from(WaitOutcome::of(&session) as u8))
    }
}
