//! What the wire's [`Reply`] says of each answer: the one place where the daemon's typed
//! answers (the engine's, and the reads served off it) become reply fields, and where
//! the engine's refusals get the protocol's error codes.

use liveness_common::fleet::FleetView;
use liveness_common::lock::Lock;
use liveness_common::protocol::{ErrorBody, ErrorCode, MemberProcess, Reply};
use liveness_common::session::Session;
use liveness_common::status::{Limit, Status};
use liveness_proc::identity::IdentityError;

use crate::engine::{Found, Refusal, Registered};
use crate::store::StoreError;
use crate::store::{LockPage, SessionPage};

/// An answer as a reply to its request.
pub(super) trait IntoReply {
    fn into_reply(self) -> Reply;
}

impl<A: IntoReply, E: Into<ErrorBody>> IntoReply for Result<A, E> {
    fn into_reply(self) -> Reply {
        match self {
            Ok(answer) => answer.into_reply(),
            Err(error) => error.into().into(),
        }
    }
}

/// The protocol's code for each refusal; a failure (not a refusal) is logged here, once.
impl From<Refusal> for ErrorBody {
    fn from(refusal: Refusal) -> ErrorBody {
        let code = match &refusal {
            Refusal::Store(e) => match e {
                StoreError::NotFound(_) => ErrorCode::NotFound,
                StoreError::AlreadyEnded(_) => ErrorCode::AlreadyEnded,
                StoreError::AlreadyExists(_) => ErrorCode::AlreadyExists,
                StoreError::NotPending(_) => ErrorCode::NotPending,
                StoreError::InvalidId(_) | StoreError::InvalidLockName(_) => {
                    ErrorCode::InvalidRequest
                }
                StoreError::NotHeld { .. } => ErrorCode::NotHeld,
                StoreError::TooManyLocks(_) => ErrorCode::LimitReached,
                _ => ErrorCode::Internal,
            },
            // What can never be watched as a process, against what does not exist (for
            // this client).
            Refusal::Owner(IdentityError::KernelThread { .. } | IdentityError::NotPidfd(_))
            | Refusal::NotPidfd { .. } => ErrorCode::InvalidOwner,
            Refusal::Owner(_) => ErrorCode::NoOwner,
            Refusal::Limit(e) => match e.limit {
                Limit::Connections | Limit::ConnectionsPerUid => ErrorCode::TooManyConnections,
                _ => ErrorCode::LimitReached,
            },
            Refusal::Invalid(_) => ErrorCode::InvalidRequest,
            Refusal::OthersSessions { .. } | Refusal::OthersProcess { .. } => ErrorCode::Forbidden,
            Refusal::Ambiguous { .. } => ErrorCode::Ambiguous,
            Refusal::Ended(_) | Refusal::EndedWaiting { .. } => ErrorCode::AlreadyEnded,
            Refusal::LockHeld(_) => ErrorCode::LockHeld,
            Refusal::QueueFull { .. } => ErrorCode::LimitReached,
            Refusal::NotFound(_) => ErrorCode::NotFound,
            Refusal::Stopping => ErrorCode::ShuttingDown,
            Refusal::Behind | Refusal::Internal(_) => ErrorCode::Internal,
        };
        if matches!(refusal, Refusal::Store(_) | Refusal::Internal(_))
            && code == ErrorCode::Internal
        {
            tracing::error!(error = %refusal, "the engine failed a request");
        }
        ErrorBody::new(code, refusal.to_string())
    }
}

impl From<Refusal> for Reply {
    fn from(refusal: Refusal) -> Reply {
        ErrorBody::from(refusal).into()
    }
}

/// A reply built already (a refusal before anything was asked).
impl IntoReply for Reply {
    fn into_reply(self) -> Reply {
        self
    }
}

/// `get`, `touch`, `rename`, `end`.
impl IntoReply for Session {
    fn into_reply(self) -> Reply {
        Reply::with_session(self)
    }
}

impl IntoReply for Registered {
    fn into_reply(self) -> Reply {
        Reply {
            warnings: self.warnings,
            ..Reply::with_session(self.session)
        }
    }
}

impl IntoReply for Status {
    fn into_reply(self) -> Reply {
        Reply {
            status: Some(Box::new(self)),
            ..Reply::ok()
        }
    }
}

/// `lock_acquire`, `lock_release`: the lock granted or released.
impl IntoReply for Lock {
    fn into_reply(self) -> Reply {
        Reply {
            lock: Some(self),
            ..Reply::ok()
        }
    }
}

/// `fleet`.
impl IntoReply for FleetView {
    fn into_reply(self) -> Reply {
        Reply {
            fleet: Some(self),
            ..Reply::ok()
        }
    }
}

/// `whose`.
impl IntoReply for Found {
    fn into_reply(self) -> Reply {
        Reply {
            owner_pid: Some(self.owner_pid),
            ..Reply::with_session(self.session)
        }
    }
}

/// `list`.
impl IntoReply for SessionPage {
    fn into_reply(self) -> Reply {
        Reply {
            sessions: Some(self.sessions),
            next: self.next.map(|next| next.to_string()),
            ..Reply::ok()
        }
    }
}

/// `lock_list`, with the waiters counted.
impl IntoReply for LockPage {
    fn into_reply(self) -> Reply {
        Reply {
            locks: Some(self.locks),
            next: self.next,
            ..Reply::ok()
        }
    }
}

/// `processes`: the session and the live processes of its tree.
#[derive(Debug)]
pub(super) struct Processes {
    pub(super) session: Session,
    pub(super) processes: Vec<MemberProcess>,
    /// The cursor of the next page, if any.
    pub(super) next: Option<String>,
}

impl IntoReply for Processes {
    fn into_reply(self) -> Reply {
        Reply {
            processes: Some(self.processes),
            next: self.next,
            ..Reply::with_session(self.session)
        }
    }
}
