//! Lines to and from the daemon, shared by the blocking and the async client: encoding a
//! request, decoding a reply or a stream message, and taking the typed answer out of a
//! reply.

use std::os::fd::OwnedFd;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use liveness_common::lock::{Lock, Scope};
use liveness_common::protocol::{
    AutoOwner, OwnerSpec, PROTOCOL_VERSION, PidOwner, PidfdOwner, Reply, Request, StreamMessage,
    Subscribed,
};
use liveness_common::request;
use liveness_common::session::Session;
use liveness_common::status::Status;

use crate::{ClientError, Line, Owner, Registered, Registration, Whose};

/// A request as one line, newline included, with the protocol version.
pub(crate) fn encode(request: &Request) -> Result<String, ClientError> {
    let mut value =
        serde_json::to_value(request).map_err(|e| ClientError::Protocol(e.to_string()))?;
    if let Value::Object(object) = &mut value {
        object.insert("v".into(), PROTOCOL_VERSION.into());
    }
    let mut line = value.to_string();
    line.push('\n');
    Ok(line)
}

/// A reply line; an error reply is [`ClientError::Daemon`].
pub(crate) fn decode_reply(line: &str) -> Result<Reply, ClientError> {
    let reply: Reply = match serde_json::from_str(line) {
        Ok(reply) => reply,
        // The daemon may stop between a request and its reply.
        Err(_)
            if matches!(
                serde_json::from_str(line),
                Ok(StreamMessage::Goodbye { .. })
            ) =>
        {
            return Err(ClientError::Closed);
        }
        Err(e) => return Err(ClientError::Protocol(format!("{e}: {}", line.trim()))),
    };
    match (reply.ok, reply.error.clone()) {
        (true, _) => Ok(reply),
        (false, Some(error)) => Err(ClientError::Daemon {
            code: error.code,
            message: error.message,
        }),
        (false, None) => Err(ClientError::Protocol(format!(
            "an error reply without an error: {}",
            line.trim()
        ))),
    }
}

/// A line of the stream that follows a `subscribe` reply.
pub(crate) fn decode_message(line: &str) -> Result<StreamMessage, ClientError> {
    serde_json::from_str(line).map_err(|e| ClientError::Protocol(format!("{e}: {}", line.trim())))
}

/// A line of the stream, an event read only as far as its seq: the rest of it is skipped
/// (though checked to be JSON), and the line kept as it came.
pub(crate) fn decode_line(line: String) -> Result<Line, ClientError> {
    #[derive(Deserialize)]
    struct EventLine {
        event: Seq,
    }
    #[derive(Deserialize)]
    struct Seq {
        seq: u64,
    }
    match serde_json::from_str::<EventLine>(&line) {
        Ok(EventLine { event: Seq { seq } }) => Ok(Line::Event { seq, line }),
        Err(_) => decode_message(&line).map(Line::Other),
    }
}

pub(crate) fn missing(what: &str) -> ClientError {
    ClientError::Protocol(format!("the daemon's reply has no {what}"))
}

pub(crate) fn session(reply: Reply) -> Result<Session, ClientError> {
    reply.session.ok_or_else(|| missing("session"))
}

/// A `lock_acquire` request; `timeout` only with `wait`.
pub(crate) fn lock_acquire_request(
    name: &str,
    session: &str,
    uid: Option<u32>,
    wait: bool,
    timeout: Option<Duration>,
    scope: Scope,
) -> Request {
    Request::LockAcquire(request::LockAcquire {
        name: name.into(),
        session: session.into(),
        uid,
        wait,
        timeout_ms: timeout.map(|t| t.as_millis().try_into().unwrap_or(u64::MAX)),
        cluster: scope == Scope::Cluster,
    })
}

pub(crate) fn lock_release_request(
    name: &str,
    session: &str,
    uid: Option<u32>,
    scope: Scope,
) -> Request {
    Request::LockRelease(request::LockRelease {
        name: name.into(),
        session: session.into(),
        uid,
        cluster: scope == Scope::Cluster,
    })
}

pub(crate) fn registered(mut reply: Reply) -> Result<Registered, ClientError> {
    let warnings = std::mem::take(&mut reply.warnings);
    Ok(Registered {
        session: session(reply)?,
        warnings,
    })
}

pub(crate) fn lock(reply: Reply) -> Result<Lock, ClientError> {
    reply.lock.ok_or_else(|| missing("lock"))
}

/// A page of `lock_list`: after the `next` of the previous one, the default page size.
pub(crate) fn lock_list_request(uid: Option<u32>, after: Option<String>) -> Request {
    Request::LockList(request::LockList {
        uid,
        limit: None,
        after,
    })
}

/// The locks of a `lock_list` page, appended to `all`, and the cursor of the next page.
pub(crate) fn locks_page(reply: Reply, all: &mut Vec<Lock>) -> Result<Option<String>, ClientError> {
    all.extend(reply.locks.ok_or_else(|| missing("locks"))?);
    Ok(reply.next)
}

pub(crate) fn whose(reply: Reply) -> Result<Whose, ClientError> {
    let owner_pid = reply.owner_pid;
    let session = session(reply)?;
    Ok(Whose {
        owner_pid: owner_pid.unwrap_or(session.owner.pid),
        session,
    })
}

pub(crate) fn status(reply: Reply) -> Result<Status, ClientError> {
    reply.status.map(|s| *s).ok_or_else(|| missing("status"))
}

pub(crate) fn acknowledgement(reply: Reply) -> Result<Subscribed, ClientError> {
    reply
        .subscribed
        .ok_or_else(|| missing("acknowledgement of subscribe"))
}

/// The `register` request, and the pidfd to pass with it for an [`Owner::Pid`].
pub(crate) fn register_request(
    registration: &Registration,
) -> Result<(Request, Option<OwnedFd>), ClientError> {
    let (owner, pidfd) = match &registration.owner {
        Owner::Auto => (OwnerSpec::Auto(AutoOwner::Auto), None),
        Owner::Identity(identity) => (OwnerSpec::Identity(identity.clone()), None),
        Owner::Pid(pid) => match open_pidfd(*pid)? {
            Some(pidfd) => (OwnerSpec::Pidfd(PidfdOwner { pidfd: 0 }), Some(pidfd)),
            None => (OwnerSpec::Pid(PidOwner { pid: *pid }), None),
        },
    };
    let request = Request::Register(request::Register {
        session: registration.session.clone(),
        uid: registration.uid,
        owner,
        pending: registration.pending,
        labels: registration.labels.clone(),
        on_end: registration.on_end,
        grace_ms: registration
            .grace
            .map(|grace| u64::try_from(grace.as_millis()).unwrap_or(u64::MAX)),
        until: registration.until,
        wrappers: registration.wrappers.clone(),
        on_end_run: registration.on_end_run.clone(),
        on_stall: registration.on_stall.clone().map(Box::new),
        cgroup: registration.cgroup.map(Box::new),
        no_cgroup: registration.no_cgroup,
    });
    Ok((request, pidfd))
}

/// A pidfd for `pid` in this process's namespace; `None` where pidfds do not apply (a
/// kernel before 5.3, a seccomp filter, a thread id): the daemon is then given the number
/// and says what is wrong with it.
fn open_pidfd(pid: u32) -> Result<Option<OwnedFd>, ClientError> {
    match liveness_proc::pidfd::open_pidfd(pid) {
        Ok(pidfd) => Ok(Some(pidfd)),
        Err(rustix::io::Errno::SRCH) => Err(ClientError::NoSuchProcess(pid)),
        Err(_) => Ok(None),
    }
}
