//! The fleet's view, as `fleet` and `fleet_watch` report it from etcd (`livenessd --etcd`,
//! docs/fleet.md): each host, online or not, with the ACTIVE sessions it last wrote.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::session::{Event, Session};

/// Every host of the fleet at one etcd revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetView {
    /// etcd's revision the view was read at: `fleet_watch` with `since` set to it follows
    /// every change after it.
    pub revision: i64,
    /// By host id.
    pub hosts: Vec<FleetHost>,
}

/// One host and its ACTIVE sessions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetHost {
    pub host_id: String,
    /// Its daemon holds its host lease.
    pub online: bool,
    /// Online: since when. Offline: when its daemon was last seen alive (it went offline
    /// at most the TTL later). Absent when never seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Its ACTIVE sessions as it last wrote them (an offline host's as last known), by uid
    /// and id.
    pub sessions: Vec<Session>,
}

/// What changed in the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FleetChangeKind {
    /// The host's daemon took its lease or rewrote its host record.
    Online,
    /// Its lease ended: the daemon stopped, died, or lost etcd for the TTL.
    Offline,
    /// A session was written: registered, a new owner, renamed, a lock taken.
    Session,
    /// A session ended on its host: `session` as it was last known, `event` the end.
    Ended,
    /// A session's key was removed without an end recorded with it (a rename's old id,
    /// or a key found stale when its host caught up).
    Gone,
}

/// A line of `fleet_watch`: `{"fleet_change": FleetChange}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetChange {
    /// etcd's revision of the change; the changes of one revision are sent together.
    pub revision: i64,
    pub change: FleetChangeKind,
    pub host_id: String,
    /// `online`: since when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    /// `online`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// `session`: as written; `ended`, `gone`: as it was last known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<Session>,
    /// `ended`: the `session.ended` event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<Event>,
}

/// Whether `labels` has every one of `wanted` (an empty `wanted` matches all).
pub fn labels_match(labels: &BTreeMap<String, String>, wanted: &BTreeMap<String, String>) -> bool {
    wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}
