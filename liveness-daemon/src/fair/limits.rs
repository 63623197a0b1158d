//! Fair limits per uid, so that no user can starve another (or root) of the daemon.
//!
//! Connections, requests in flight and half-sent lines are limited where connections are
//! served ([`Limits`], shared by the server's tasks); active sessions and label bytes are
//! limited where sessions are registered ([`SessionUsage`], owned by the engine). Root is
//! never limited: it always has headroom to connect, register and see its sessions end.
//! Each limit that refuses something logs one line, then at most one a minute with how
//! many refusals it did not log.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use liveness_common::lock::Lock;
use liveness_common::session::{Event, EventKind, Session};
use liveness_common::status::{
    ConnectionsStatus, Limit, LimitsConfig, OpenConnections, SessionsStatus,
};

/// How often one limit may log that it refused something.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Descriptors clients may hold with the default limits: each connection's socket, and
/// up to three for a read-only database connection (file, WAL, shared memory) while it
/// replays or lists; root's connections come out of the same headroom.
pub const CLIENT_FDS: u64 = 4 * 1024 + 256;

/// What a refusal by `limit` means, for the log.
fn what(limit: Limit) -> &'static str {
    match limit {
        Limit::ConnectionsPerUid => "a uid reached its connection limit",
        Limit::Connections => "non-root connections reached their total limit",
        Limit::FileDescriptors => "out of file descriptors; only root is served",
        Limit::LineTimeout => "a client stalled in the middle of a request line",
        Limit::SessionsPerUid => "a uid reached its active session limit",
        Limit::LabelBytes => "a registration carried too many label bytes",
        Limit::LabelBytesPerUid => "a uid reached its label byte limit",
        Limit::LocksPerUid => "a uid reached its lock limit",
        Limit::ActionsPerUid => "a uid reached its limit of unfinished end actions",
    }
}

/// Counts refusals and logs each limit at most once per [`LOG_EVERY`].
/// A limit that refuses a connection, a registration, an end action or a lock: which
/// one, and what the user is told.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct Exceeded {
    pub limit: Limit,
    message: String,
}

#[derive(Debug, Default)]
struct Refusals {
    counts: BTreeMap<Limit, u64>,
    /// When each limit last logged, and how many refusals it has not logged since.
    logged: HashMap<Limit, (Instant, u64)>,
}

impl Refusals {
    fn count(&mut self, limit: Limit, uid: u32) {
        *self.counts.entry(limit).or_default() += 1;
        let now = Instant::now();
        match self.logged.get_mut(&limit) {
            Some((at, unlogged)) if now.duration_since(*at) < LOG_EVERY => *unlogged += 1,
            Some((at, unlogged)) => {
                tracing::warn!(
                    ?limit,
                    uid,
                    also_refused = *unlogged,
                    "limit reached: {}",
                    what(limit)
                );
                (*at, *unlogged) = (now, 0);
            }
            None => {
                tracing::warn!(
                    ?limit,
                    uid,
                    "limit reached: {} (logged at most once a minute)",
                    what(limit)
                );
                self.logged.insert(limit, (now, 0));
            }
        }
    }
}

/// What the server's connections share: open connections and requests in flight per uid.
#[derive(Debug)]
pub struct Limits {
    config: LimitsConfig,
    state: Mutex<ConnectionState>,
}

#[derive(Debug, Default)]
struct ConnectionState {
    /// Open connections and the request turns of each uid with at least one connection;
    /// an entry goes when its last connection does, so a flood leaves nothing behind.
    uids: HashMap<u32, UidConnections>,
    non_root: usize,
    root: usize,
    /// Requests that waited for a turn because their uid had others in flight.
    requests_waited: u64,
    refusals: Refusals,
}

#[derive(Debug)]
struct UidConnections {
    open: usize,
    turns: Arc<Semaphore>,
}

/// An admitted connection; dropping it frees its place.
#[derive(Debug)]
pub struct ConnectionSlot {
    limits: Arc<Limits>,
    uid: u32,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut state = self.limits.state();
        if self.uid == 0 {
            state.root -= 1;
            return;
        }
        state.non_root -= 1;
        if let Some(entry) = state.uids.get_mut(&self.uid) {
            entry.open -= 1;
            if entry.open == 0 {
                state.uids.remove(&self.uid);
            }
        }
    }
}

impl Limits {
    pub fn new(config: LimitsConfig) -> Arc<Limits> {
        Arc::new(Limits {
            config,
            state: Mutex::new(ConnectionState::default()),
        })
    }

    pub fn config(&self) -> &LimitsConfig {
        &self.config
    }

    fn state(&self) -> MutexGuard<'_, ConnectionState> {
        // No critical section can panic halfway: a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a connection of `uid`, or says which limit refuses it (and counts that).
    pub fn admit(self: &Arc<Self>, uid: u32) -> Result<ConnectionSlot, Exceeded> {
        let mut state = self.state();
        if uid == 0 {
            state.root += 1;
            return Ok(ConnectionSlot {
                limits: Arc::clone(self),
                uid,
            });
        }
        let open = state.uids.get(&uid).map_or(0, |u| u.open);
        let refused = if open >= self.config.connections_per_uid {
            Some((
                Limit::ConnectionsPerUid,
                format!(
                    "uid {uid} already has {open} connections, the most allowed per user; close some"
                ),
            ))
        } else if state.non_root >= self.config.connections {
            Some((
                Limit::Connections,
                format!(
                    "the daemon already serves {} connections of other users, the most allowed; try again later",
                    state.non_root
                ),
            ))
        } else {
            None
        };
        if let Some((limit, message)) = refused {
            state.refusals.count(limit, uid);
            return Err(Exceeded { limit, message });
        }
        state.non_root += 1;
        let turns = self.config.requests_per_uid.max(1);
        state
            .uids
            .entry(uid)
            .or_insert_with(|| UidConnections {
                open: 0,
                turns: Arc::new(Semaphore::new(turns)),
            })
            .open += 1;
        Ok(ConnectionSlot {
            limits: Arc::clone(self),
            uid,
        })
    }

    /// Counts a refusal made elsewhere (out of descriptors, a stalled line).
    pub fn refused(&self, limit: Limit, uid: u32) {
        self.state().refusals.count(limit, uid);
    }

    /// Waits for a turn to send a request of the slot's uid to the engine; root never waits.
    pub async fn request_turn(&self, slot: &ConnectionSlot) -> Option<OwnedSemaphorePermit> {
        let turns = {
            let state = self.state();
            Arc::clone(&state.uids.get(&slot.uid)?.turns)
        };
        if let Ok(permit) = Arc::clone(&turns).try_acquire_owned() {
            return Some(permit);
        }
        self.state().requests_waited += 1;
        // The semaphore is never closed.
        turns.acquire_owned().await.ok()
    }

    /// The `connections` part of `status.limits`.
    pub fn status(&self) -> ConnectionsStatus {
        let state = self.state();
        ConnectionsStatus {
            config: self.config,
            connections: OpenConnections {
                root: state.root as u64,
                non_root: state.non_root as u64,
                uids: state.uids.len() as u64,
            },
            requests_waited: state.requests_waited,
            refused: state.refusals.counts.clone(),
        }
    }
}

/// Active sessions and label bytes of each non-root uid, kept by the engine from the
/// events it commits (so every way a session starts or ends is counted once).
#[derive(Debug)]
pub struct SessionUsage {
    config: LimitsConfig,
    uids: HashMap<u32, Usage>,
    refusals: Refusals,
}

#[derive(Debug, Default, Clone, Copy)]
struct Usage {
    sessions: u64,
    /// Of labels and of held lock names.
    label_bytes: u64,
    locks: u64,
}

/// Bytes a session's labels count for: keys and values.
pub fn label_bytes(labels: &BTreeMap<String, String>) -> u64 {
    labels.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum()
}

impl SessionUsage {
    /// Starts from the ACTIVE sessions and the held locks in the store.
    pub fn new(
        config: LimitsConfig,
        active: impl IntoIterator<Item = Session>,
        held: impl IntoIterator<Item = Lock>,
    ) -> SessionUsage {
        let mut usage = SessionUsage {
            config,
            uids: HashMap::new(),
            refusals: Refusals::default(),
        };
        for session in active {
            usage.add(session.creator_uid, label_bytes(&session.labels), 1, 0);
        }
        for lock in held {
            usage.add(lock.uid, lock.name.len() as u64, 0, 1);
        }
        usage
    }

    /// Adds (or, with a negative count, takes away) sessions or locks and their bytes.
    fn add(&mut self, uid: u32, bytes: u64, sessions: i64, locks: i64) {
        if uid == 0 {
            return;
        }
        let usage = self.uids.entry(uid).or_default();
        usage.sessions = usage.sessions.saturating_add_signed(sessions);
        usage.locks = usage.locks.saturating_add_signed(locks);
        if sessions + locks >= 0 {
            usage.label_bytes = usage.label_bytes.saturating_add(bytes);
        } else {
            usage.label_bytes = usage.label_bytes.saturating_sub(bytes);
        }
        if usage.sessions == 0 && usage.locks == 0 {
            self.uids.remove(&uid);
        }
    }

    /// Whether `uid` may be granted one more lock, named `name`; a refusal is counted by
    /// [`SessionUsage::refused`] when it is the answer.
    pub fn check_lock(&self, uid: u32, name: &str) -> Result<(), Exceeded> {
        if uid == 0 {
            return Ok(());
        }
        let usage = self.uids.get(&uid).copied().unwrap_or_default();
        if usage.locks >= self.config.locks_per_uid {
            let message = format!(
                "uid {uid}'s sessions hold {} locks, the most allowed per user; release some first",
                usage.locks
            );
            return Err(Exceeded {
                limit: Limit::LocksPerUid,
                message,
            });
        }
        let bytes = name.len() as u64;
        if usage.label_bytes + bytes > self.config.label_bytes_per_uid {
            let message = format!(
                "uid {uid}'s active sessions already hold {} bytes of labels and lock names; {bytes} more would exceed the limit of {} per user",
                usage.label_bytes, self.config.label_bytes_per_uid
            );
            return Err(Exceeded {
                limit: Limit::LabelBytesPerUid,
                message,
            });
        }
        Ok(())
    }

    /// Counts a refusal by `limit`.
    pub fn refused(&mut self, limit: Limit, uid: u32) {
        self.refusals.count(limit, uid);
    }

    /// A refusal by `limit`, counted.
    fn refuse(&mut self, limit: Limit, uid: u32, message: String) -> Exceeded {
        self.refused(limit, uid);
        Exceeded { limit, message }
    }

    /// Whether `uid` may register one more session with `labels`.
    pub fn check(&mut self, uid: u32, labels: &BTreeMap<String, String>) -> Result<(), Exceeded> {
        let bytes = label_bytes(labels);
        if bytes > self.config.label_bytes {
            return Err(self.refuse(
                Limit::LabelBytes,
                uid,
                format!(
                    "labels of {bytes} bytes exceed the limit of {} per session",
                    self.config.label_bytes
                ),
            ));
        }
        if uid == 0 {
            return Ok(());
        }
        let usage = self.uids.get(&uid).copied().unwrap_or_default();
        if usage.sessions >= self.config.sessions_per_uid {
            return Err(self.refuse(
                Limit::SessionsPerUid,
                uid,
                format!(
                    "uid {uid} already has {} active sessions, the most allowed per user; end some first",
                    usage.sessions
                ),
            ));
        }
        if usage.label_bytes + bytes > self.config.label_bytes_per_uid {
            return Err(self.refuse(
                Limit::LabelBytesPerUid,
                uid,
                format!(
                    "uid {uid}'s active sessions already hold {} label bytes; {bytes} more would exceed the limit of {} per user",
                    usage.label_bytes, self.config.label_bytes_per_uid
                ),
            ));
        }
        Ok(())
    }

    /// Whether `uid`, with `before` end actions without an outcome, may have `after`; a
    /// registration that does not add any is never refused.
    pub fn check_actions(&mut self, uid: u32, before: u64, after: u64) -> Result<(), Exceeded> {
        let limit = self.config.actions_per_uid;
        if uid == 0 || after <= before || after <= limit {
            return Ok(());
        }
        Err(self.refuse(
            Limit::ActionsPerUid,
            uid,
            format!(
                "uid {uid} has {before} end actions without an outcome (of its active sessions, or waiting or running after their end); {} more would exceed the limit of {limit} per user: wait for some to finish",
                after - before
            ),
        ))
    }

    /// Accounts for a committed event.
    pub fn apply(&mut self, event: &Event) {
        let bytes = label_bytes(&event.labels);
        let lock_bytes = event.lock.as_ref().map_or(0, |lock| lock.name.len() as u64);
        // A fleet lock's row is bounded per session by the store, not counted here.
        if event.lock.as_ref().is_some_and(|lock| lock.cluster) {
            return;
        }
        match event.kind {
            EventKind::Registered => self.add(event.creator_uid, bytes, 1, 0),
            EventKind::Ended => self.add(event.creator_uid, bytes, -1, 0),
            EventKind::LockAcquired => self.add(event.creator_uid, lock_bytes, 0, 1),
            EventKind::LockReleased => self.add(event.creator_uid, lock_bytes, 0, -1),
            EventKind::OwnerChanged
            | EventKind::Renamed
            | EventKind::Reaped
            | EventKind::Action
            | EventKind::Finalized
            | EventKind::Stalled
            | EventKind::Unstalled
            | EventKind::Escaped => {}
        }
    }

    /// The `sessions` part of `status.limits`.
    pub fn status(&self) -> SessionsStatus {
        SessionsStatus {
            uids: self.uids.len() as u64,
            refused: self.refusals.counts.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LimitsConfig {
        LimitsConfig {
            connections_per_uid: 2,
            connections: 3,
            sessions_per_uid: 2,
            label_bytes: 10,
            label_bytes_per_uid: 15,
            ..LimitsConfig::default()
        }
    }

    #[test]
    fn connections_are_limited_per_uid_and_in_total_but_never_for_root() {
        let limits = Limits::new(config());
        let a1 = limits.admit(1000).expect("first of uid 1000");
        let _a2 = limits.admit(1000).expect("second of uid 1000");
        let refused = limits.admit(1000).expect_err("third of uid 1000");
        assert_eq!(refused.limit, Limit::ConnectionsPerUid);
        let _b1 = limits.admit(1001).expect("uid 1001 has its own share");
        let total = limits.admit(1002).expect_err("the total is reached");
        assert!(total.message.contains("other users"), "{}", total.message);
        let roots: Vec<_> = (0..10).map(|_| limits.admit(0).expect("root")).collect();
        drop(a1);
        let _a3 = limits
            .admit(1000)
            .expect("a closed connection frees its place");
        let status = limits.status();
        assert_eq!(status.connections.root, roots.len() as u64);
        assert_eq!(status.connections.non_root, 3);
        assert_eq!(
            status.refused.get(&Limit::ConnectionsPerUid),
            Some(&1),
            "{status:?}"
        );
        assert_eq!(
            status.refused.get(&Limit::Connections),
            Some(&1),
            "{status:?}"
        );
    }

    #[test]
    fn a_uid_with_no_connection_left_leaves_nothing_behind() {
        let limits = Limits::new(config());
        let slots: Vec<_> = [1, 2, 3].map(|uid| limits.admit(uid).unwrap()).into();
        drop(slots);
        assert_eq!(limits.status().connections.uids, 0);
        assert!(limits.state().uids.is_empty());
    }

    #[tokio::test]
    async fn requests_of_one_uid_take_turns() {
        let limits = Limits::new(LimitsConfig {
            requests_per_uid: 1,
            ..config()
        });
        let slot = limits.admit(1000).unwrap();
        let first = limits.request_turn(&slot).await.expect("a turn");
        let waiting = tokio::time::timeout(Duration::from_millis(50), limits.request_turn(&slot));
        assert!(waiting.await.is_err(), "a second request must wait");
        drop(first);
        assert!(limits.request_turn(&slot).await.is_some());
        assert_eq!(limits.status().requests_waited, 1);
        let root = limits.admit(0).unwrap();
        assert!(
            limits.request_turn(&root).await.is_none(),
            "root never waits"
        );
    }

    fn labels(bytes: usize) -> BTreeMap<String, String> {
        BTreeMap::from([("k".to_owned(), "v".repeat(bytes - 1))])
    }

    fn event(kind: EventKind, uid: u32, bytes: usize) -> Event {
        serde_json::from_value(serde_json::json!({
            "seq": 1,
            "kind": kind,
            "at_ms": 0,
            "session": "s",
            "owner": {"pid": 1, "start_ticks": 1, "boot_id": "b", "host": "h"},
            "labels": labels(bytes),
            "creator_uid": uid,
        }))
        .expect("a well-formed event")
    }

    #[test]
    fn unfinished_actions_are_limited_per_uid_but_never_shrinking_nor_for_root() {
        let mut usage = SessionUsage::new(
            LimitsConfig {
                actions_per_uid: 4,
                ..config()
            },
            [],
            [],
        );
        usage.check_actions(1000, 0, 4).expect("up to the limit");
        let refused = usage.check_actions(1000, 4, 5).expect_err("over it");
        assert_eq!(refused.limit, Limit::ActionsPerUid);
        assert!(refused.message.contains("1 more"), "{}", refused.message);
        usage
            .check_actions(1000, 9, 7)
            .expect("fewer than before, though over a lowered limit");
        usage.check_actions(0, 0, 100).expect("root is not limited");
        assert_eq!(usage.status().refused[&Limit::ActionsPerUid], 1);
    }

    #[test]
    fn sessions_and_label_bytes_are_limited_per_uid() {
        let mut usage = SessionUsage::new(config(), [], []);
        let refused = usage
            .check(1000, &labels(11))
            .expect_err("too many label bytes");
        assert_eq!(refused.limit, Limit::LabelBytes);
        assert!(
            refused.message.contains("per session"),
            "{}",
            refused.message
        );
        usage.check(1000, &labels(10)).expect("within the limit");
        usage.apply(&event(EventKind::Registered, 1000, 10));
        let refused = usage.check(1000, &labels(6)).expect_err("per uid bytes");
        assert!(refused.message.contains("per user"), "{}", refused.message);
        usage.apply(&event(EventKind::Registered, 1000, 1));
        let refused = usage.check(1000, &labels(1)).expect_err("per uid sessions");
        assert!(
            refused.message.contains("active sessions"),
            "{}",
            refused.message
        );
        usage
            .check(1001, &labels(10))
            .expect("another uid has its own share");
        usage
            .check(0, &labels(10))
            .expect("root is not limited by count");
        usage.apply(&event(EventKind::Ended, 1000, 10));
        usage
            .check(1000, &labels(4))
            .expect("an ended session frees its share");
        usage.apply(&event(EventKind::Ended, 1000, 1));
        assert!(
            usage.uids.is_empty(),
            "nothing is kept for a uid with no session"
        );
        let status = usage.status();
        for limit in [
            Limit::SessionsPerUid,
            Limit::LabelBytes,
            Limit::LabelBytesPerUid,
        ] {
            assert_eq!(
                status.refused.get(&limit),
                Some(&1),
                "{limit:?}: {status:?}"
            );
        }
    }
}
