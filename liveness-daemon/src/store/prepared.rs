//! A tracked session's `session.ended` event, written when the session becomes ACTIVE up
//! to what only its death knows: the session's id, owner and labels are kept as JSON, and
//! the death's batch writes the seq, the times, the exit facts, cause, usage and survivors
//! around them (see [`super::apply::journal_deaths`]) rather than the whole event again.
//!
//! [`Ended`] follows [`Event`]'s serde layout (field order, skipped fields) for the fields
//! an ended event has at its death; a test holds it to that: a filled event is byte for
//! byte what serde writes of the event.

use serde::Serialize;
use serde_json::value::{RawValue, to_raw_value};

use liveness_common::cause::{Cause, Usage};
use liveness_common::end::Survivors;
use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::session::{EndReason, Event, EventKind, OnEnd, Session};

use super::journal::EventJson;

/// See the module.
#[derive(Debug)]
pub struct PreparedEnd {
    session: Box<RawValue>,
    owner: Box<RawValue>,
    labels: Box<RawValue>,
}

/// An ended event as serde writes [`Event`], its session's parts already JSON.
#[derive(Serialize)]
struct Ended<'a> {
    seq: u64,
    kind: EventKind,
    at_ms: i64,
    session: &'a RawValue,
    owner: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<EndReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit: Option<ExitStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cause: Option<&'a Cause>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<&'a Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detected_by: Option<DetectedBy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    observed_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    died_ms: Option<i64>,
    labels: &'a RawValue,
    creator_uid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    survivors: Option<&'a Survivors>,
    #[serde(skip_serializing_if = "OnEnd::is_leave")]
    on_end: OnEnd,
    #[serde(skip_serializing_if = "is_zero")]
    actions: u32,
}

impl PreparedEnd {
    /// The parts of `session`'s ended event that its death does not change.
    pub fn of(session: &Session) -> serde_json::Result<PreparedEnd> {
        Ok(PreparedEnd {
            session: to_raw_value(&session.id)?,
            owner: to_raw_value(&session.owner)?,
            labels: to_raw_value(&session.labels)?,
        })
    }

    /// `event`, the ended event of the session this was prepared from as its death's
    /// batch builds it, as JSON. (Hops, which a daemon tracing them adds, come after the
    /// journal: see `engine::hops`.)
    pub fn fill(&self, event: &Event) -> serde_json::Result<EventJson> {
        debug_assert_eq!(event.kind, EventKind::Ended);
        to_raw_value(&Ended {
            seq: event.seq,
            kind: event.kind,
            at_ms: event.at_ms,
            session: &self.session,
            owner: &self.owner,
            reason: event.reason,
            exit: event.exit,
            cause: event.cause.as_ref(),
            usage: event.usage.as_ref(),
            detected_by: event.detected_by,
            observed_ms: event.observed_ms,
            died_ms: event.died_ms,
            labels: &self.labels,
            creator_uid: event.creator_uid,
            survivors: event.survivors.as_ref(),
            on_end: event.on_end,
            actions: event.actions,
        })
        .map(EventJson::from)
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
