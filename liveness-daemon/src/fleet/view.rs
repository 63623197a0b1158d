//! `fleet` and `fleet_watch`: the fleet's hosts and ACTIVE sessions, read from etcd for a
//! client of this daemon (the CLI never links etcd). A fleet is one trust domain, but a
//! user of this host is shown no more of another user's sessions than the fleet needs to
//! see (docs/fleet.md, "Who sees what").

use std::collections::{BTreeMap, HashMap};

use etcd_client::{EventType, GetOptions, KeyValue, WatchOptions, WatchStream};
use liveness_common::fleet::{FleetChange, FleetChangeKind, FleetHost, FleetView, labels_match};
use liveness_common::protocol::{ErrorBody, ErrorCode};
use liveness_common::request;
use liveness_common::session::{Event, Session};
use serde::Deserialize;

use super::mirror::{Shared, timed};
use super::{FleetConfig, FleetError};
use crate::engine::Caller;

/// Reads the fleet from etcd, on a connection of its own made at the first request.
#[derive(Debug, Clone)]
pub(crate) struct FleetReader(std::sync::Arc<Shared>);

/// What a reader takes of `PREFIX/hosts/HOST_ID` and `PREFIX/seen/HOST_ID`.
#[derive(Debug, Deserialize)]
struct HostFacts {
    hostname: Option<String>,
    #[serde(default)]
    online_since_ms: Option<i64>,
    #[serde(default)]
    seen_ms: Option<i64>,
}

/// What a reader takes of `PREFIX/sessions/…` and `PREFIX/ended/…`.
#[derive(Debug, Deserialize)]
struct SessionFacts {
    session: Option<Session>,
    event: Option<Event>,
}

/// A key under the prefix, read: `KIND/HOST_ID[/UID/SESSION]`.
struct Key<'a> {
    kind: &'a str,
    host_id: &'a str,
    /// `UID/SESSION`, for sessions and ends.
    rest: Option<&'a str>,
}

/// Changes are followed as one etcd watch of the whole prefix.
pub(crate) struct Watch {
    stream: WatchStream,
    reader: FleetReader,
    caller: Caller,
    labels: BTreeMap<String, String>,
}

impl FleetReader {
    pub(crate) fn new(config: FleetConfig) -> FleetReader {
        FleetReader(std::sync::Arc::new(Shared::new(config)))
    }

    fn config(&self) -> &FleetConfig {
        &self.0.config
    }

    fn parse_key<'k>(&self, key: &'k [u8]) -> Option<Key<'k>> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(&self.config().prefix)?.strip_prefix('/')?;
        let (kind, rest) = rest.split_once('/')?;
        match rest.split_once('/') {
            Some((host_id, rest)) => Some(Key {
                kind,
                host_id,
                rest: Some(rest),
            }),
            None => Some(Key {
                kind,
                host_id: rest,
                rest: None,
            }),
        }
    }

    /// The fleet at etcd's present revision, with the sessions that have every one of
    /// `labels`.
    pub(crate) async fn view(
        &self,
        caller: Caller,
        request: &request::Fleet,
    ) -> Result<FleetView, ErrorBody> {
        let mut etcd = self.0.client().await?;
        // One revision for the three reads, so that a host and its sessions agree.
        let dir = |kind: &str| format!("{}/{kind}/", self.config().prefix);
        let hosts = timed(etcd.get(dir("hosts"), Some(GetOptions::new().with_prefix()))).await?;
        let revision = hosts.header().map_or(0, |h| h.revision());
        let at = || Some(GetOptions::new().with_prefix().with_revision(revision));
        let seen = timed(etcd.get(dir("seen"), at())).await?;
        let sessions = timed(etcd.get(dir("sessions"), at())).await?;
        let mut by_id: BTreeMap<String, FleetHost> = BTreeMap::new();
        for (kv, online) in
            (seen.kvs().iter().map(|kv| (kv, false))).chain(hosts.kvs().iter().map(|kv| (kv, true)))
        {
            let Some(key) = self.parse_key(kv.key()) else {
                continue;
            };
            let Ok(facts) = serde_json::from_slice::<HostFacts>(kv.value()) else {
                continue;
            };
            let entry = host(&mut by_id, key.host_id);
            entry.online |= online;
            entry.hostname = facts.hostname.or(entry.hostname.take());
            entry.since_ms = if online {
                facts.online_since_ms
            } else {
                facts.seen_ms
            };
        }
        for kv in sessions.kvs() {
            let (Some(key), Some(session)) = (self.parse_key(kv.key()), session_of(kv)) else {
                continue;
            };
            host(&mut by_id, key.host_id).sessions.push(session);
        }
        let mut hosts: Vec<FleetHost> = by_id.into_values().collect();
        for entry in &mut hosts {
            let host_id = entry.host_id.clone();
            entry
                .sessions
                .retain(|session| labels_match(&session.labels, &request.labels));
            for session in &mut entry.sessions {
                self.shown(caller, &host_id, session);
            }
        }
        if !request.labels.is_empty() {
            hosts.retain(|entry| !entry.sessions.is_empty());
        }
        Ok(FleetView { revision, hosts })
    }

    /// A session as `caller` may see it: a user of this host sees its own sessions here
    /// in full, and of every other session (another user's, or of another host, where a
    /// uid names somebody else) what the fleet's view is for (who, where, labels, owner,
    /// phase, activity), not its end actions' commands nor the evidence of its activity.
    fn shown(&self, caller: Caller, host_id: &str, session: &mut Session) {
        let own = host_id == self.config().host_id && session.creator_uid == caller.uid;
        if caller.uid == 0 || own {
            return;
        }
        session.on_end_run.clear();
        session.actions.clear();
        session.cause = None;
        session.usage = None;
        session.survivors = None;
        session.reaped = None;
        if let Some(activity) = &mut session.activity {
            activity.evidence = Default::default();
        }
    }

    /// An end as `caller` may see it (see [`FleetReader::shown`]).
    fn shown_end(&self, caller: Caller, host_id: &str, event: &mut Event) {
        let own = host_id == self.config().host_id && event.creator_uid == caller.uid;
        if caller.uid == 0 || own {
            return;
        }
        event.cause = None;
        event.usage = None;
        event.survivors = None;
        event.reaped = None;
        event.action = None;
        event.hops = None;
        event.activity = None;
    }

    /// Starts following the changes after revision `since`; `compacted` if etcd no
    /// longer has them.
    pub(crate) async fn watch(
        &self,
        caller: Caller,
        since: i64,
        labels: BTreeMap<String, String>,
    ) -> Result<Watch, ErrorBody> {
        let mut etcd = self.0.client().await?;
        let prefix = format!("{}/", self.config().prefix);
        // A read at `since` fails if etcd compacted it away; a watch would only say so
        // after it was created.
        let at = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_limit(1)
            .with_revision(since);
        match timed(etcd.get(prefix.clone(), Some(at))).await {
            Err(FleetError::Etcd(e)) if e.to_string().contains("compacted") => {
                return Err(ErrorBody::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "etcd no longer has the changes after revision {since} (its history \
                         was compacted): watch again without `since`"
                    ),
                ));
            }
            Err(FleetError::Etcd(e)) if e.to_string().contains("future revision") => {
                return Err(ErrorBody::new(
                    ErrorCode::InvalidRequest,
                    format!("revision {since} is ahead of etcd's: give one it sent"),
                ));
            }
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let options = WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_start_revision(since.saturating_add(1));
        let stream = timed(etcd.watch(prefix, Some(options))).await?;
        Ok(Watch {
            stream,
            reader: self.clone(),
            caller,
            labels,
        })
    }
}

/// The host of that id, added offline and empty when first named.
fn host<'a>(by_id: &'a mut BTreeMap<String, FleetHost>, id: &str) -> &'a mut FleetHost {
    by_id.entry(id.to_owned()).or_insert_with(|| FleetHost {
        host_id: id.to_owned(),
        online: false,
        since_ms: None,
        hostname: None,
        sessions: Vec::new(),
    })
}

/// The session a `sessions/` or `ended/` record holds.
fn session_of(kv: &KeyValue) -> Option<Session> {
    serde_json::from_slice::<SessionFacts>(kv.value())
        .ok()?
        .session
}

impl Watch {
    /// The next changes, those of one etcd revision or more, as the caller may see them;
    /// `None` when etcd ended the watch.
    pub(crate) async fn next(&mut self) -> Result<Option<Vec<FleetChange>>, FleetError> {
        loop {
            let Some(answer) = self.stream.message().await? else {
                return Ok(None);
            };
            if answer.canceled() {
                return Ok(None);
            }
            let changes = self.changes(answer.events());
            if !changes.is_empty() {
                return Ok(Some(changes));
            }
        }
    }

    fn changes(&self, events: &[etcd_client::Event]) -> Vec<FleetChange> {
        let reader = &self.reader;
        // The ends recorded in these events, by `HOST_ID/UID/SESSION`: the deletion of
        // the session's key in the same transaction is its end.
        let mut ends: HashMap<(String, String), Event> = HashMap::new();
        for event in events {
            let Some(kv) = event.kv() else { continue };
            if let (EventType::Put, Some(key)) = (event.event_type(), reader.parse_key(kv.key()))
                && key.kind == "ended"
                && let Ok(SessionFacts {
                    event: Some(end), ..
                }) = serde_json::from_slice(kv.value())
            {
                let id = (
                    key.host_id.to_owned(),
                    key.rest.unwrap_or_default().to_owned(),
                );
                ends.insert(id, end);
            }
        }
        let mut changes = Vec::new();
        for event in events {
            let Some(kv) = event.kv() else { continue };
            let Some(key) = reader.parse_key(kv.key()) else {
                continue;
            };
            let change = |change| FleetChange {
                revision: kv.mod_revision(),
                change,
                host_id: key.host_id.to_owned(),
                since_ms: None,
                hostname: None,
                session: None,
                event: None,
            };
            let put = event.event_type() == EventType::Put;
            let mut change = match (key.kind, put) {
                ("hosts", true) => {
                    let facts: Option<HostFacts> = serde_json::from_slice(kv.value()).ok();
                    let facts = facts.map_or((None, None), |f| (f.online_since_ms, f.hostname));
                    FleetChange {
                        since_ms: facts.0,
                        hostname: facts.1,
                        ..change(FleetChangeKind::Online)
                    }
                }
                ("hosts", false) => change(FleetChangeKind::Offline),
                ("sessions", true) => FleetChange {
                    session: session_of(kv),
                    ..change(FleetChangeKind::Session)
                },
                ("sessions", false) => {
                    let id = (
                        key.host_id.to_owned(),
                        key.rest.unwrap_or_default().to_owned(),
                    );
                    let end = ends.remove(&id);
                    let kind = match end {
                        Some(_) => FleetChangeKind::Ended,
                        None => FleetChangeKind::Gone,
                    };
                    FleetChange {
                        session: event.prev_kv().and_then(session_of),
                        event: end,
                        ..change(kind)
                    }
                }
                _ => continue,
            };
            let labels = match (&change.session, &change.event) {
                (Some(session), _) => Some(&session.labels),
                (None, Some(end)) => Some(&end.labels),
                (None, None) => None,
            };
            if labels.is_some_and(|labels| !labels_match(labels, &self.labels)) {
                continue;
            }
            if let Some(session) = &mut change.session {
                reader.shown(self.caller, &change.host_id, session);
            }
            if let Some(end) = &mut change.event {
                reader.shown_end(self.caller, &change.host_id, end);
            }
            changes.push(change);
        }
        changes
    }
}
