//! What the wire's [`Reply`] says of each answer: the one place where the daemon's typed
//! answers (the engine's, and the reads served off it) become reply fields.

use liveness_common::fleet::FleetView;
use liveness_common::lock::Lock;
use liveness_common::protocol::{ErrorBody, MemberProcess, Reply};
use liveness_common::session::Session;
use liveness_common::status::Status;

use crate::engine::{Found, Registered};
use crate::store::{LockPage, SessionPage};

/// An answer as a reply to its request.
pub(super) trait IntoReply {
    fn into_reply(self) -> Reply;
}

impl<A: IntoReply> IntoReply for Result<A, ErrorBody> {
    fn into_reply(self) -> Reply {
        match self {
            Ok(answer) => answer.into_reply(),
            Err(error) => error.into(),
        }
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
