//! The exit-code policy: one code per meaning, whatever the command, and `wait`'s own
//! codes (the tables below are printed by `--help` and copied in docs/cli.md, which a test
//! checks), and how a failure is reported: a line on stderr, or with `--json` a JSON
//! object on stderr.

use std::fmt;
use std::process::ExitCode;

use serde::Serialize;

use liveness_client::ClientError;
use liveness_common::exit::ExitStatus;
use liveness_common::protocol::ErrorCode;
use liveness_common::session::{EndReason, Session};
use liveness_proc::identity::IdentityError;

use crate::escape::{for_terminal, json_text};

/// Process exit codes of the `liveness` CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Exit {
    /// Alive, or the command succeeded.
    Ok = 0,
    Dead = 1,
    Unknown = 2,
    /// `lock acquire`, `lock run`: another session holds the lock.
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

/// Every exit code with its name (the `code` of a JSON error) and its meaning: the one
/// table behind `--help`, the JSON errors and docs/cli.md.
pub(crate) const EXIT_CODES: &[(Exit, &str, &str)] = &[
    (Exit::Ok, "ok", "success; check: the process is alive"),
    (
        Exit::Dead,
        "dead",
        "check: dead (exited, PID reused, or the machine rebooted)",
    ),
    (
        Exit::Unknown,
        "unknown",
        "check: cannot be decided here (another host, unreadable /proc)",
    ),
    (
        Exit::LockHeld,
        "lock_held",
        "lock acquire, lock run: another session holds the lock",
    ),
    (Exit::Usage, "usage", "bad command line (see --help)"),
    (
        Exit::DataErr,
        "invalid_input",
        "invalid input, or a request the daemon refused as invalid",
    ),
    (Exit::NotFound, "not_found", "no such session or process"),
    (
        Exit::Unavailable,
        "unavailable",
        "the daemon cannot be reached or is stopping",
    ),
    (
        Exit::Software,
        "internal",
        "internal error (a bug: please report it)",
    ),
    (
        Exit::IoErr,
        "io",
        "a file or /proc entry could not be read or written",
    ),
    (
        Exit::TempFail,
        "try_again",
        "watch --exec: the command failed; or a daemon limit was reached",
    ),
    (
        Exit::NoPerm,
        "forbidden",
        "permission denied: another user's session or process",
    ),
];

impl Exit {
    /// The stable name of this outcome, as JSON errors carry it.
    pub(crate) fn name(self) -> &'static str {
        EXIT_CODES
            .iter()
            .find(|(exit, ..)| *exit == self)
            .map_or("internal", |(_, name, _)| name)
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

/// The exit-code table as `--help` prints it.
pub(crate) fn exit_codes_help() -> String {
    let mut help = String::from("Exit codes (the same for every command):\n");
    for (exit, name, meaning) in EXIT_CODES {
        help.push_str(&format!("  {:<3} {name:<14} {meaning}\n", *exit as u8));
    }
    help.push_str("With --json, a failure is one JSON object on stderr:\n");
    help.push_str(r#"  {"error":{"code":"not_found","exit":66,"message":"..."}}"#);
    help
}

/// How `wait` tells the end of a session, by codes of its own while it succeeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum WaitOutcome {
    Clean = 0,
    Failed = 1,
    Killed = 2,
    /// Ended without its owner's exit: a reboot, a timeout, a pending session's expiry.
    Otherwise = 3,
    /// The owner is gone, but how is unknown: its death was seen without a status.
    Unseen = 4,
}

/// `wait`'s codes and their meaning: the table behind `wait --help` and docs/cli.md.
pub(crate) const WAIT_CODES: &[(WaitOutcome, &str)] = &[
    (
        WaitOutcome::Clean,
        "the owner exited with code 0, or the session was ended with `end`",
    ),
    (WaitOutcome::Failed, "the owner exited with a non-zero code"),
    (WaitOutcome::Killed, "the owner was killed by a signal"),
    (
        WaitOutcome::Otherwise,
        "ended without an exit of its owner: reboot, timeout, pending expired",
    ),
    (
        WaitOutcome::Unseen,
        "the owner is gone, but its status is unknown: its death was seen by /proc polling, \
         by the check after a daemon restart, or by a pidfd before Linux 6.15",
    ),
];

impl WaitOutcome {
    pub(crate) fn of(session: &Session) -> WaitOutcome {
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

/// `wait`'s codes as `wait --help` prints them, meanings wrapped within 80 columns.
pub(crate) fn wait_codes_help() -> String {
    let mut help = String::from("Exit codes of wait:\n");
    for (outcome, meaning) in WAIT_CODES {
        let mut line = format!("  {:<3}", *outcome as u8);
        for word in meaning.split(' ') {
            if line.len() + 1 + word.len() > 80 {
                help.push_str(&line);
                help.push('\n');
                line = " ".repeat(5);
            }
            line.push(' ');
            line.push_str(word);
        }
        help.push_str(&line);
        help.push('\n');
    }
    help.push_str("  64+ the wait itself failed, as for the other commands (66: no such session)");
    help
}

/// A command that could not do its job: the exit code and what to tell the user.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) exit: Exit,
    pub(crate) message: String,
    /// The daemon's own error code when the daemon refused the request.
    pub(crate) daemon_code: Option<ErrorCode>,
}

impl Failure {
    pub(crate) fn new(exit: Exit, message: impl fmt::Display) -> Failure {
        Failure {
            exit,
            message: message.to_string(),
            daemon_code: None,
        }
    }

    /// Prints the failure on stderr: a line of text, or with `json` one JSON object.
    pub(crate) fn report(&self, json: bool) {
        if json {
            let error = JsonError {
                error: JsonErrorBody {
                    code: self.exit.name(),
                    exit: self.exit as u8,
                    message: &self.message,
                    daemon_code: self.daemon_code,
                },
            };
            match serde_json::to_string(&error) {
                Ok(line) => eprintln!("{}", json_text(&line)),
                Err(_) => eprintln!("liveness: {}", for_terminal(&self.message)),
            }
        } else {
            eprintln!("liveness: {}", for_terminal(&self.message));
        }
    }
}

/// `{"error": {...}}`, the shape of every failure under `--json`.
#[derive(Serialize)]
struct JsonError<'a> {
    error: JsonErrorBody<'a>,
}

#[derive(Serialize)]
struct JsonErrorBody<'a> {
    code: &'static str,
    exit: u8,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    daemon_code: Option<ErrorCode>,
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        let exit = match &e {
            ClientError::Connect { .. } | ClientError::Closed | ClientError::GaveUp { .. } => {
                Exit::Unavailable
            }
            ClientError::Io(_) => Exit::IoErr,
            ClientError::Protocol(_) => Exit::Software,
            ClientError::NoSuchProcess(_) => Exit::NotFound,
            ClientError::Daemon { code, .. } => refusal_exit(*code),
        };
        Failure {
            exit,
            message: e.to_string(),
            daemon_code: e.code(),
        }
    }
}

/// The exit code for a refusal by the daemon.
fn refusal_exit(code: ErrorCode) -> Exit {
    match code {
        ErrorCode::NotFound | ErrorCode::NoOwner => Exit::NotFound,
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
        | ErrorCode::InvalidOwner => Exit::DataErr,
    }
}

impl From<IdentityError> for Failure {
    fn from(e: IdentityError) -> Failure {
        let exit = match &e {
            IdentityError::NoSuchProcess(_)
            | IdentityError::NotVisible
            | IdentityError::NotInCallerNamespace { .. }
            | IdentityError::NoOwner { .. } => Exit::NotFound,
            IdentityError::Read { .. } => Exit::IoErr,
            IdentityError::Malformed { .. } | IdentityError::AmbiguousStartTime { .. } => {
                Exit::Unknown
            }
            IdentityError::Thread { .. }
            | IdentityError::KernelThread { .. }
            | IdentityError::NotPidfd(_) => Exit::DataErr,
        };
        Failure::new(exit, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exit_code_has_one_distinct_name() {
        for (i, (exit, name, _)) in EXIT_CODES.iter().enumerate() {
            assert_eq!(exit.name(), *name, "{exit:?}");
            for (other, other_name, _) in &EXIT_CODES[i + 1..] {
                assert!(
                    *other as u8 != *exit as u8 && other_name != name,
                    "{exit:?} and {other:?} share a code or a name"
                );
            }
        }
    }

    /// docs/cli.md has both tables, row for row.
    #[test]
    fn the_docs_list_every_exit_code() {
        let docs = include_str!("../../docs/cli.md");
        for (exit, name, _) in EXIT_CODES {
            let row = format!("| {} | `{name}` |", *exit as u8);
            assert!(docs.contains(&row), "docs/cli.md lacks the row {row:?}");
        }
        for (outcome, meaning) in WAIT_CODES {
            let row = format!("| {} | {meaning} |", *outcome as u8);
            assert!(docs.contains(&row), "docs/cli.md lacks the row {row:?}");
        }
    }
}
