//! The wire protocol: newline-delimited JSON over a Unix stream socket.
//!
//! Every request is one JSON object on one line, with an `op`, an optional protocol
//! version `v` and an optional `id` echoed in the reply. Every reply is one line with
//! `"ok": true|false`. A `subscribe` reply is followed by stream lines (`reset`, `event`,
//! `gap`, `lagged`, `goodbye`). The full description, with examples, is `docs/protocol.md`.

use serde::{Deserialize, Serialize};

use crate::request;
pub use crate::request::{AutoOwner, OwnerSpec, PidOwner, PidfdOwner};
use serde_json::Value;

use crate::fleet::{FleetChange, FleetView};
use crate::identity::Identity;
use crate::lock::Lock;
use crate::session::{Event, Session};
use crate::status::Status;

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// Longest request line accepted, newline included. Longer lines get an error and are skipped.
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// Most descriptors passed with one request line; the kernel closes any beyond
/// (`MSG_CTRUNC`).
pub const MAX_FDS_PER_MESSAGE: usize = 4;
/// Sessions in a `list` page when the request sets no `limit`.
pub const DEFAULT_LIST_PAGE: usize = 1000;
/// Most sessions in one `list` page, so that no listing holds a reader for long.
pub const MAX_LIST_PAGE: usize = 10_000;

/// One request, discriminated by `op`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Register(request::Register),
    Rename(request::Rename),
    Touch(request::Touch),
    End(request::End),
    Get(request::Get),
    List(request::List),
    Whose(request::Whose),
    Processes(request::Processes),
    Subscribe(request::Subscribe),
    Status(request::Status),
    LockAcquire(request::LockAcquire),
    LockRelease(request::LockRelease),
    LockList(request::LockList),
    ActionsDone(request::ActionsDone),
    Fleet(request::Fleet),
    FleetWatch(request::FleetWatch),
}

/// Machine-readable error codes; the message says the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidJson,
    InvalidRequest,
    LineTooLong,
    UnsupportedVersion,
    NotFound,
    Forbidden,
    /// Root named a session id that several users have: add `uid`.
    Ambiguous,
    AlreadyEnded,
    AlreadyExists,
    NotPending,
    /// The owner process does not exist or cannot be resolved.
    NoOwner,
    /// The owner can never be watched as a process (a kernel thread, a descriptor that is
    /// not a pidfd).
    InvalidOwner,
    ShuttingDown,
    /// A connection limit refused the connection; the daemon closes it.
    TooManyConnections,
    /// A per-uid or per-session limit refused a registration, or a lock's queue is full.
    LimitReached,
    /// The lock is held by another session (and the request did not wait, or its
    /// `timeout_ms` passed).
    LockHeld,
    /// The session does not hold that lock.
    NotHeld,
    Internal,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            code,
            message: message.into(),
        }
    }
}

impl From<ErrorBody> for Reply {
    fn from(error: ErrorBody) -> Reply {
        Reply {
            ok: false,
            error: Some(error),
            ..Reply::ok()
        }
    }
}

/// A request line that was refused before reaching the engine, with its `id` if readable.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub id: Option<Value>,
    pub error: ErrorBody,
}

impl From<Rejected> for Reply {
    fn from(rejected: Rejected) -> Reply {
        Reply {
            id: rejected.id,
            ..Reply::from(rejected.error)
        }
    }
}

/// A reply to one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<Session>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<Vec<Session>>,
    /// `list`: the cursor of the next page (`after`), absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// `whose`: the PID of the registered owner that was found among the ancestors, in the
    /// caller's PID namespace (0 when the owner is outside it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Box<Status>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscribed: Option<Subscribed>,
    /// `register`: what succeeded but looks wrong (an owner that is a launcher, one that
    /// has already exited), for the client to show.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// `lock_acquire`, `lock_release`: the lock granted or released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<Lock>,
    /// `lock_list`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locks: Option<Vec<Lock>>,
    /// `processes`: the session's live members, by pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<Vec<MemberProcess>>,
    /// `fleet`, and `fleet_watch` without `since`: the fleet's hosts and sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetView>,
}

/// One live process of a session's tree, as `processes` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberProcess {
    pub identity: Identity,
    /// True for the session's owner, the tree's root.
    pub owner: bool,
    /// The current parent, in the daemon's PID namespace (1 or a subreaper for an orphan).
    pub ppid: u32,
    /// The arguments; empty where they cannot be read.
    pub cmdline: Vec<String>,
    /// Milliseconds since the process started.
    pub age_ms: u64,
}

impl Reply {
    pub fn ok() -> Reply {
        Reply {
            ok: true,
            id: None,
            error: None,
            session: None,
            sessions: None,
            next: None,
            owner_pid: None,
            status: None,
            subscribed: None,
            processes: None,
            warnings: Vec::new(),
            lock: None,
            locks: None,
            fleet: None,
        }
    }

    pub fn error(code: ErrorCode, message: impl Into<String>) -> Reply {
        Reply {
            ok: false,
            error: Some(ErrorBody {
                code,
                message: message.into(),
            }),
            ..Reply::ok()
        }
    }

    pub fn with_session(session: Session) -> Reply {
        Reply {
            session: Some(session),
            ..Reply::ok()
        }
    }
}

/// Acknowledges a subscription: events after `since` up to `head` are replayed first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscribed {
    pub since: u64,
    pub head: u64,
    /// The identity of the store the seqs belong to (see [`StreamMessage::Reset`]).
    pub store_id: String,
}

/// Lines that follow a `subscribe` reply (and `goodbye` on any connection at shutdown).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamMessage {
    /// The cursor `since` does not belong to this store (it is above the head, or the
    /// subscriber named another `store_id`): the database was replaced. Every retained
    /// event follows, from the first; the consumer's cursor starts over in `store_id`.
    Reset {
        since: u64,
        head: u64,
        store_id: String,
    },
    Event(Box<Event>),
    /// Events after `since` up to `pruned_through` fell out of the retention window and are
    /// gone; the stream goes on with the oldest retained event.
    Gap {
        since: u64,
        pruned_through: u64,
    },
    /// The subscriber fell behind its queue and is disconnected; resume with
    /// `since = last_delivered`.
    Lagged {
        last_delivered: u64,
    },
    /// `fleet_watch`: a change of the fleet.
    FleetChange(Box<FleetChange>),
    /// The daemon is stopping.
    Goodbye {
        reason: String,
    },
}

/// A parsed request line.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    pub id: Option<Value>,
    pub request: Request,
}

/// Parses one request line. The error reply carries the request's `id` when one was readable.
pub fn parse_request(line: &[u8]) -> Result<Envelope, Rejected> {
    let reject = |id: Option<Value>, code, message: String| Rejected {
        id,
        error: ErrorBody::new(code, message),
    };
    let mut object = match serde_json::from_slice::<Value>(line) {
        Ok(Value::Object(object)) => object,
        Ok(_) => {
            return Err(reject(
                None,
                ErrorCode::InvalidRequest,
                "a request must be a JSON object".into(),
            ));
        }
        Err(e) => {
            return Err(reject(
                None,
                ErrorCode::InvalidJson,
                format!("invalid JSON: {e}"),
            ));
        }
    };
    let id = object.remove("id");
    match object.remove("v") {
        None => {}
        Some(Value::Number(n)) if n.as_u64() == Some(u64::from(PROTOCOL_VERSION)) => {}
        Some(other) => {
            let message = format!(
                "protocol version {other} is not supported; this daemon speaks {PROTOCOL_VERSION}"
            );
            return Err(reject(id, ErrorCode::UnsupportedVersion, message));
        }
    }
    match serde_json::from_value::<Request>(Value::Object(object)) {
        Ok(request) => Ok(Envelope { id, request }),
        Err(e) => Err(reject(id, ErrorCode::InvalidRequest, e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::session::OnEnd;

    fn parse(line: &str) -> Result<Envelope, Rejected> {
        parse_request(line.as_bytes())
    }

    fn error_of(line: &str) -> (ErrorCode, String) {
        let error = parse(line).unwrap_err().error;
        (error.code, error.message)
    }

    #[test]
    fn parses_every_owner_form() {
        let auto = parse(r#"{"op":"register","session":"s1","owner":"auto"}"#).unwrap();
        assert!(matches!(
            auto.request,
            Request::Register(request::Register {
                owner: OwnerSpec::Auto(AutoOwner::Auto),
                ..
            })
        ));
        let pid =
            parse(r#"{"op":"register","session":"s1","owner":{"pid":42},"v":1,"id":7}"#).unwrap();
        assert!(matches!(
            pid.request,
            Request::Register(request::Register {
                owner: OwnerSpec::Pid(PidOwner { pid: 42 }),
                ..
            })
        ));
        assert_eq!(pid.id, Some(Value::from(7)));
        let pidfd = parse(r#"{"op":"register","session":"s1","owner":{"pidfd":0}}"#).unwrap();
        assert!(matches!(
            pidfd.request,
            Request::Register(request::Register {
                owner: OwnerSpec::Pidfd(PidfdOwner { pidfd: 0 }),
                ..
            })
        ));
        let full = parse(
            r#"{"op":"register","pending":true,"owner":{"pid":1,"start_ticks":2,"boot_id":"b","host":"h"}}"#,
        )
        .unwrap();
        let Request::Register(request::Register {
            owner: OwnerSpec::Identity(identity),
            pending: true,
            ..
        }) = full.request
        else {
            panic!("a full identity must parse as one: {full:?}");
        };
        assert_eq!(
            (identity.pid, identity.start_ticks, identity.host.as_str()),
            (1, 2, "h")
        );
    }

    #[test]
    fn rejects_bad_input_naming_the_problem() {
        assert_eq!(error_of("{not json").0, ErrorCode::InvalidJson);
        assert_eq!(error_of("[1]").0, ErrorCode::InvalidRequest);
        let (code, message) = error_of(r#"{"op":"explode"}"#);
        assert_eq!(code, ErrorCode::InvalidRequest);
        assert!(message.contains("explode"), "{message}");
        let (code, message) = error_of(r#"{"op":"get","sesion":"x"}"#);
        assert_eq!(code, ErrorCode::InvalidRequest);
        assert!(message.contains("sesion"), "{message}");
        let (_, message) = error_of(r#"{"op":"status","verbose":true}"#);
        assert!(message.contains("verbose"), "{message}");
        let (code, _) =
            error_of(r#"{"op":"register","session":"s","owner":{"pid":1,"start_ticks":2}}"#);
        assert_eq!(
            code,
            ErrorCode::InvalidRequest,
            "half an identity is neither form"
        );
        let (_, message) = error_of(r#"{"op":"whose","pid":"12"}"#);
        assert!(message.contains("invalid type"), "{message}");
        let (_, message) = error_of(r#"{"op":"register","session":"s","owner":"manual"}"#);
        assert!(
            message.contains("OwnerSpec") || message.contains("did not match"),
            "{message}"
        );
        let reply = Reply::from(parse(r#"{"op":"status","v":2,"id":"abc"}"#).unwrap_err());
        assert_eq!(
            reply.error.map(|e| e.code),
            Some(ErrorCode::UnsupportedVersion)
        );
        assert_eq!(
            reply.id,
            Some(Value::from("abc")),
            "the id is echoed even on errors"
        );
    }

    #[test]
    fn cleanup_policy_fields_parse_and_bad_ones_are_named() {
        let register = parse(
            r#"{"op":"register","session":"s","owner":"auto","on_end":"terminate","grace_ms":1500}"#,
        )
        .unwrap();
        assert!(
            matches!(
                register.request,
                Request::Register(request::Register {
                    on_end: Some(OnEnd::Terminate),
                    grace_ms: Some(1500),
                    ..
                })
            ),
            "{register:?}"
        );
        let end = parse(r#"{"op":"end","session":"s","terminate":true}"#).unwrap();
        assert!(
            matches!(
                end.request,
                Request::End(request::End {
                    terminate: true,
                    ..
                })
            ),
            "{end:?}"
        );
        let (code, message) =
            error_of(r#"{"op":"register","session":"s","owner":"auto","on_end":"kill"}"#);
        assert_eq!(code, ErrorCode::InvalidRequest);
        assert!(
            message.contains("kill") && message.contains("terminate"),
            "the error names the bad value and the valid ones: {message}"
        );
        let (_, message) =
            error_of(r#"{"op":"register","session":"s","owner":"auto","grace_ms":"1s"}"#);
        assert!(message.contains("invalid type"), "{message}");
    }

    #[test]
    fn stream_messages_are_tagged_by_kind() {
        let line = serde_json::to_string(&StreamMessage::Lagged { last_delivered: 9 }).unwrap();
        assert_eq!(line, r#"{"lagged":{"last_delivered":9}}"#);
        let line = serde_json::to_string(&StreamMessage::Gap {
            since: 1,
            pruned_through: 5,
        })
        .unwrap();
        assert_eq!(line, r#"{"gap":{"since":1,"pruned_through":5}}"#);
    }

    /// Requests of every kind, valid, for the fuzz to start from and mutate.
    const SAMPLE_REQUESTS: &[&str] = &[
        r#"{"v":1,"id":1,"op":"register","session":"s1","owner":"auto","labels":{"k":"v"}}"#,
        r#"{"op":"register","pending":true,"owner":{"pid":42}}"#,
        r#"{"op":"register","session":"s","uid":7,"owner":{"pid":1,"start_ticks":2,"boot_id":"b","host":"h"}}"#,
        r#"{"op":"rename","session":"pending-1","to":"real","uid":0}"#,
        r#"{"op":"touch","session":"s1"}"#,
        r#"{"op":"end","session":"s1","id":"x"}"#,
        r#"{"op":"end","session":"s1","terminate":true}"#,
        r#"{"op":"register","session":"s2","owner":"auto","on_end":"terminate","grace_ms":1000}"#,
        r#"{"op":"get","session":"s1","uid":1000}"#,
        r#"{"op":"list","phase":"active"}"#,
        r#"{"op":"whose","pid":1}"#,
        r#"{"op":"subscribe","since":3,"store_id":"ab","session":"s","uid":2}"#,
        r#"{"op":"status","v":1}"#,
        r#"{"op":"register","session":"s3","owner":"auto","on_end_run":[{"argv":["true"],"timeout_ms":5}]}"#,
        r#"{"op":"actions_done","session":"s3"}"#,
    ];

    /// A request line, a valid one with some bytes overwritten, or any bytes at all.
    fn request_lines() -> impl Strategy<Value = Vec<u8>> {
        let mutated = (
            prop::sample::select(SAMPLE_REQUESTS),
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        )
            .prop_map(|(sample, edits)| {
                let mut line = sample.as_bytes().to_vec();
                for (at, byte) in edits {
                    let at = at.index(line.len());
                    line[at] = byte;
                }
                line
            });
        prop_oneof![
            mutated,
            prop::collection::vec(any::<u8>(), 0..256),
            "[ -~]{0,128}".prop_map(String::into_bytes),
        ]
    }

    proptest! {
        /// Whatever arrives, the parser does not panic; what it refuses gets an error reply
        /// that is valid JSON with `ok: false`; what it accepts means the same once written
        /// back, so nothing is accepted by accident of the parser.
        #[test]
        fn every_line_is_parsed_or_refused_with_a_json_error(line in request_lines()) {
            match parse_request(&line) {
                Err(rejected) => {
                    let reply = serde_json::to_string(&Reply::from(rejected)).unwrap();
                    let reply: Value = serde_json::from_str(&reply).unwrap();
                    prop_assert_eq!(&reply["ok"], &Value::Bool(false));
                    prop_assert!(reply["error"]["code"].is_string(), "{}", reply);
                }
                Ok(envelope) => {
                    let mut again = serde_json::to_value(&envelope.request).unwrap();
                    if let Some(id) = &envelope.id {
                        again["id"] = id.clone();
                    }
                    let again = parse_request(again.to_string().as_bytes());
                    prop_assert_eq!(again, Ok(envelope));
                }
            }
        }
    }
}
