//! What can go wrong talking to livenessd.

use std::io;
use std::path::PathBuf;

use liveness_common::protocol::ErrorCode;

/// An error of a call or a subscription.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be connected to.
    #[error(
        "cannot connect to livenessd at {path}: {source} (is the daemon running? see --socket)"
    )]
    Connect {
        /// The socket tried.
        path: PathBuf,
        /// Why the connection failed.
        source: io::Error,
    },
    /// A read or write on an established connection failed.
    #[error("lost the connection to livenessd: {0}")]
    Io(#[from] io::Error),
    /// The daemon closed the connection before replying.
    #[error("livenessd closed the connection")]
    Closed,
    /// The daemon sent something this client does not understand.
    #[error("unexpected message from livenessd: {0}")]
    Protocol(String),
    /// The daemon refused the request: `code` says why to a program, `message` to a person.
    #[error("{message}")]
    Daemon {
        /// The machine-readable reason.
        code: ErrorCode,
        /// What went wrong and what to do, from the daemon.
        message: String,
    },
    /// The process named as an owner does not exist (checked by opening its pidfd).
    #[error("no process {0}: it has exited, or it is not in this PID namespace")]
    NoSuchProcess(u32),
    /// A subscription lost the daemon and could not reach it again within its
    /// [`Retry`](crate::Retry) bound.
    #[error("livenessd did not come back within {seconds} s: {last}")]
    GaveUp {
        /// How long reconnecting was tried.
        seconds: u64,
        /// The last attempt's error.
        last: Box<ClientError>,
    },
}

impl ClientError {
    /// The daemon's error code, if the daemon refused the request.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Daemon { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether a daemon that is restarting could explain the error: the connection was
    /// refused or lost, or the daemon said it is shutting down.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. }
                | ClientError::Io(_)
                | ClientError::Closed
                | ClientError::Daemon {
                    code: ErrorCode::ShuttingDown | ErrorCode::TooManyConnections,
                    ..
                }
        )
    }
}
