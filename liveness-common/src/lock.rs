//! Locks held by sessions: what `lock_acquire`, `lock_release` and `lock_list` report, and
//! what `lock.acquired` / `lock.released` events say.

use serde::{Deserialize, Serialize};

/// A held lock. A lock's name belongs to the namespace of the session that holds it (its
/// creator's uid), like session ids: two users' locks of one name are two locks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lock {
    pub name: String,
    /// The namespace the name is in: the uid of the holding session's creator.
    pub uid: u32,
    /// The holding session.
    pub session: String,
    /// The fencing token of this grant: greater than that of every earlier grant of the
    /// lock, across releases, restarts and retention.
    pub token: u64,
    /// When it was granted.
    pub since_ms: i64,
    /// Requests waiting for it, in line to get it in order.
    #[serde(default)]
    pub waiters: u32,
    /// A fleet lock (`livenessd --etcd`), held in etcd for every host: its token is etcd's
    /// revision of the grant.
    #[serde(default, skip_serializing_if = "is_false")]
    pub cluster: bool,
    /// A fleet lock's: the host id of the daemon its session is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !b
}

/// Where a lock lives: on this host (the daemon's database), or in etcd for the whole
/// fleet (`livenessd --etcd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    #[default]
    Host,
    Cluster,
}

/// Why a lock was released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseReason {
    /// Its session released it (`lock_release`).
    Released,
    /// Its session ended, for any reason: the release is in the same transaction (a
    /// fleet lock's, as its daemon reads the end and revokes the session's lease).
    SessionEnded,
    /// A fleet lock's session lease ended without it: etcd did not confirm its renewal
    /// within the TTL (etcd unreachable, or the daemon down that long), so the lock may be
    /// another session's now.
    LeaseLost,
}

/// The lock a `lock.acquired` or `lock.released` event is about (its session is the event's
/// `session`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockChange {
    pub name: String,
    pub token: u64,
    /// A fleet lock's (see [`Lock::cluster`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub cluster: bool,
    /// `lock.released` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<ReleaseReason>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_reasons_are_snake_case() {
        let change = LockChange {
            name: "build".into(),
            token: 3,
            cluster: false,
            reason: Some(ReleaseReason::SessionEnded),
        };
        assert_eq!(
            serde_json::to_string(&change).unwrap(),
            r#"{"name":"build","token":3,"reason":"session_ended"}"#
        );
    }
}
