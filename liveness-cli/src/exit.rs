//! The exit-code policy: what each outcome and each failure exits with (documented in
//! `--help` and the README).

use std::process::ExitCode;

use liveness_client::ClientError;
use liveness_common::protocol::ErrorCode;
use liveness_proc::identity::IdentityError;

/// Process exit codes of the `liveness` CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Exit {
    /// Alive, or the command succeeded.
    Ok = 0,
    Dead = 1,
    Unknown = 2,
    /// `lock acquire`: another session holds the lock.
    LockHeld = 3,
    /// Bad command line (EX_USAGE).
    Usage = 64,
    /// Bad input data, or a request the daemon refused as invalid (EX_DATAERR).
    DataErr = 65,
    /// No such session or process (EX_NOINPUT).
    NotFound = 66,
    /// The daemon cannot be reached or is stopping (EX_UNAVAILABLE).
    Unavailable = 69,
    /// Something went wrong inside liveness (EX_SOFTWARE).
    Software = 70,
    /// A file or `/proc` entry could not be read or written (EX_IOERR).
    IoErr = 74,
    /// `watch --exec`: the command failed; the cursor stays before its event. Or a limit of
    /// the daemon refused the request: try again later (EX_TEMPFAIL).
    TempFail = 75,
    /// The daemon refused: the session or process belongs to another user (EX_NOPERM).
    NoPerm = 77,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

pub(crate) const EXIT_CODES_HELP: &str = "\
Exit codes:
  0   alive (check) or success
  1   dead: the process exited, its PID was reused, or the machine rebooted
  2   unknown: cannot be decided here (another host, unreadable /proc)
  3   lock acquire, lock run: the lock is held by another session
  64  usage error                 65  invalid input, or refused as invalid
  66  no such session or process  69  daemon unreachable or stopping
  70  internal error              74  I/O error
  75  watch --exec command failed, or a limit was reached (try again later)
  77  permission denied (another user's)";

pub(crate) fn client_error(e: &ClientError) -> Exit {
    eprintln!("liveness: {e}");
    match e {
        ClientError::Connect { .. } | ClientError::Closed | ClientError::GaveUp { .. } => {
            Exit::Unavailable
        }
        ClientError::Io(_) => Exit::IoErr,
        ClientError::Protocol(_) => Exit::Software,
        ClientError::NoSuchProcess(_) => Exit::Dead,
        ClientError::Daemon { code, .. } => refusal_exit(*code),
    }
}

/// The exit code for a refusal by the daemon.
fn refusal_exit(code: ErrorCode) -> Exit {
    match code {
        ErrorCode::NotFound => Exit::NotFound,
        ErrorCode::Forbidden => Exit::NoPerm,
        ErrorCode::ShuttingDown => Exit::Unavailable,
        ErrorCode::Internal => Exit::Software,
        ErrorCode::TooManyConnections | ErrorCode::LimitReached => Exit::TempFail,
        ErrorCode::LockHeld => Exit::LockHeld,
        ErrorCode::InvalidJson
        | ErrorCode::InvalidRequest
        | ErrorCode::LineTooLong
        | ErrorCode::UnsupportedVersion
        | ErrorCode::AlreadyEnded
        | ErrorCode::AlreadyExists
        | ErrorCode::NotPending
        | ErrorCode::NotHeld
        | ErrorCode::Ambiguous
        | ErrorCode::NoOwner
        | ErrorCode::InvalidOwner => Exit::DataErr,
    }
}

pub(crate) fn identity_error(e: &IdentityError) -> Exit {
    eprintln!("liveness: {e}");
    match e {
        IdentityError::NoSuchProcess(_) => Exit::Dead,
        IdentityError::Read { .. } => Exit::IoErr,
        IdentityError::Malformed { .. } => Exit::Unknown,
        IdentityError::NoOwner { .. }
        | IdentityError::Thread { .. }
        | IdentityError::KernelThread { .. }
        | IdentityError::NotPidfd(_) => Exit::DataErr,
        IdentityError::NotVisible | IdentityError::NotInCallerNamespace { .. } => Exit::NotFound,
        IdentityError::AmbiguousStartTime { .. } => Exit::Unknown,
    }
}
