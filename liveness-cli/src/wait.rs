//! `liveness wait`: block until a session ends; the exit code tells how.

use std::process::ExitCode;

use liveness_client::Client;
use liveness_common::exit::ExitStatus;
use liveness_common::session::{EndReason, Session};

use crate::Context;
use crate::args::SessionArgs;
use crate::exit::Failure;
use crate::render::print_session;

pub(crate) const WAIT_HELP: &str = "\
Exit codes of wait:
  0   the owner exited with code 0, or the session was ended with `end`
  1   the owner exited with a non-zero code
  2   the owner was killed by a signal
  3   ended otherwise: PID reused, reboot, timeout, pending expired, or status unknown
  64+ the wait itself failed, as for the other commands (66: no such session)";

/// How `wait` reports the end of a session (see `WAIT_HELP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum WaitOutcome {
    Clean = 0,
    Failed = 1,
    Killed = 2,
    Otherwise = 3,
}

impl WaitOutcome {
    fn of(session: &Session) -> WaitOutcome {
        match (session.reason, session.exit) {
            (Some(EndReason::Stopped), _) | (_, Some(ExitStatus::Exited { code: 0 })) => {
                WaitOutcome::Clean
            }
            (_, Some(ExitStatus::Exited { .. })) => WaitOutcome::Failed,
            (_, Some(ExitStatus::Signaled { .. })) => WaitOutcome::Killed,
            _ => WaitOutcome::Otherwise,
        }
    }
}

pub(crate) fn wait(context: &Context, args: &SessionArgs) -> Result<ExitCode, Failure> {
    let session = Client::connect(&context.socket)
        .and_then(|client| client.wait_for_end(&args.session, args.uid))?;
    print_session(&session, context.json);
    Ok(ExitCode::from(WaitOutcome::of(&session) as u8))
}
