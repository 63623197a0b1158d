//! The mirror's loop: connect to etcd, take the host lease, catch up from the cursor, then
//! follow the daemon's event stream; on any failure start over after a pause.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity,
    LeaseKeepAliveStream, LeaseKeeper, PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse,
};
use liveness_client::nonblocking::AsyncClient;
use liveness_client::{Cursor, Filter};
use liveness_common::protocol::{ErrorCode, StreamMessage};
use liveness_common::session::{Event, EventKind, Phase, Session};
use liveness_common::status::ClusterStatus;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::{ClusterView, FleetConfig, FleetError, now_ms};

/// How long one etcd request may take before the connection counts as lost.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest pause between two attempts to reach etcd.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);
/// Stream messages read ahead of etcd. When etcd is slower, the reader waits, the daemon's
/// queue for it fills, and the daemon drops it as it drops any lagging subscriber: the
/// reader resumes from its cursor, so the lag costs memory here, never a death's time.
const READ_AHEAD: usize = 1024;
/// Operations per transaction (etcd refuses more than 128).
const TXN_OPS: usize = 64;
/// How long the mirror gathers events before it writes them: a death's other readers (a
/// `watch`, a tool's subscriber) read it first, before etcd's work competes with them for
/// the CPUs, and a burst goes to etcd in a few transactions, not one per event.
const GATHER: Duration = Duration::from_millis(2);

/// Runs the mirror until `stopped`, then revokes the host lease so that the host goes
/// offline at once rather than after its TTL.
pub(crate) async fn run(
    config: FleetConfig,
    socket: PathBuf,
    view: ClusterView,
    mut stopped: watch::Receiver<bool>,
) {
    let mut delay = Duration::from_millis(100);
    loop {
        let attempt = async {
            let mut mirror = Mirror::connect(&config, &socket, &view).await?;
            match mirror.follow(&view).await {
                Err(failure) => Err::<(), _>(failure),
                Ok(never) => match never {},
            }
        };
        let failure = tokio::select! {
            _ = stopped.wait_for(|stop| *stop) => None,
            Err(failure) = attempt => Some(failure),
        };
        let Some(failure) = failure else {
            revoke(&config, &view).await;
            return;
        };
        // Said once per outage and cause, not at every retry.
        let error = failure.to_string();
        if view.was_connected() || view.error().as_ref() != Some(&error) {
            tracing::warn!(%error, "fleet mirror: etcd unreachable, retrying");
        } else {
            tracing::debug!(%error, "fleet mirror: etcd still unreachable");
        }
        if view.was_connected() {
            delay = Duration::from_millis(100);
        }
        view.disconnected(&failure);
        tokio::select! {
            _ = stopped.wait_for(|stop| *stop) => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(MAX_RETRY_DELAY);
    }
}

/// The host lease of the last connection, revoked on a clean stop.
async fn revoke(config: &FleetConfig, view: &ClusterView) {
    let Some(lease) = view.lease() else { return };
    let revoked = async {
        let mut client = Client::connect(&config.endpoints, Some(options(config))).await?;
        client.lease_revoke(lease).await?;
        Ok::<_, etcd_client::Error>(())
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, revoked).await {
        Ok(Ok(())) => tracing::info!("fleet mirror: host lease revoked"),
        Ok(Err(e)) => tracing::warn!(error = %e, "fleet mirror: cannot revoke the host lease"),
        Err(_) => tracing::warn!("fleet mirror: etcd did not answer the lease's revocation"),
    }
}

fn options(config: &FleetConfig) -> ConnectOptions {
    let options = ConnectOptions::new()
        .with_connect_timeout(REQUEST_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT)
        .with_keep_alive(config.ttl / 3, REQUEST_TIMEOUT);
    let options = match &config.tls {
        Some(tls) => {
            let mut trust = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca));
            if let Some((cert, key)) = &tls.identity {
                trust = trust.identity(Identity::from_pem(cert, key));
            }
            options.with_tls(trust)
        }
        None => options,
    };
    match &config.credentials {
        // etcd's tokens expire (5 minutes idle by default): renewed as they do.
        Some(credentials) => options
            .with_user(&credentials.user, &credentials.password)
            .with_auto_token_refresh(true),
        None => options,
    }
}

/// A client of etcd for requests of this daemon's clients, reached at the first and then
/// kept (it reconnects by itself).
pub(super) struct Shared {
    pub(super) config: FleetConfig,
    client: tokio::sync::Mutex<Option<Client>>,
}

impl Shared {
    pub(super) fn new(config: FleetConfig) -> Shared {
        Shared {
            config,
            client: tokio::sync::Mutex::new(None),
        }
    }

    pub(super) async fn client(&self) -> Result<Client, FleetError> {
        let mut client = self.client.lock().await;
        if let Some(client) = &*client {
            return Ok(client.clone());
        }
        let connected = Client::connect(&self.config.endpoints, Some(options(&self.config)));
        Ok(client.insert(timed(connected).await?).clone())
    }
}

/// etcd's client says nothing of itself.
impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// `PREFIX/cursors/HOST_ID`'s value, and what every record carries besides: where in
/// which store the write stems from, so that a replay writes the same and a reader can
/// tell an old record from a new one.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Origin {
    store_id: String,
    seq: u64,
}

/// `PREFIX/sessions/HOST_ID/UID/SESSION`.
#[derive(Debug, Serialize)]
struct SessionRecord<'a> {
    #[serde(flatten)]
    origin: &'a Origin,
    session: &'a Session,
}

/// `PREFIX/ended/HOST_ID/UID/SESSION`: the `session.ended` event.
#[derive(Debug, Serialize)]
struct EndedRecord<'a> {
    #[serde(flatten)]
    origin: &'a Origin,
    event: &'a Event,
}

/// `PREFIX/hosts/HOST_ID`, on the host lease.
#[derive(Debug, Serialize)]
struct HostRecord<'a> {
    host_id: &'a str,
    machine_id: Option<String>,
    boot_id: Option<String>,
    hostname: Option<String>,
    version: &'static str,
    store_id: &'a str,
    active_sessions: usize,
    online_since_ms: i64,
}

/// What [`Mirror::claim_host`] reads of a host key another lease holds.
#[derive(Debug, Deserialize)]
struct HostHeld {
    store_id: String,
    hostname: Option<String>,
}

/// The database part of a store id (`DATABASE.RUN`): the same for every run of one state
/// directory.
fn database(store_id: &str) -> &str {
    store_id.split('.').next().unwrap_or(store_id)
}

/// One connection to etcd and to the daemon's socket.
struct Mirror<'a> {
    config: &'a FleetConfig,
    etcd: Client,
    lease: i64,
    keeper: LeaseKeeper,
    answers: LeaseKeepAliveStream,
    /// For `get` and `list`.
    local: AsyncClient,
    stream: Reader,
    store_id: String,
    /// The session keys this host has in etcd.
    sessions: BTreeSet<String>,
    /// The lease that the ended records written now expire with (see [`Mirror::ended_lease`]).
    retention: Option<(i64, Instant)>,
    online_since_ms: i64,
}

/// The daemon's event stream, read by a task of its own (reading a line is not cancel-safe,
/// so it is never raced against etcd's timers).
struct Reader {
    items: mpsc::Receiver<StreamItem>,
    task: JoinHandle<()>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Reader {
    async fn start(socket: &Path, cursor: Cursor) -> Result<Reader, FleetError> {
        let mut subscription = AsyncClient::connect(socket)
            .await?
            .subscribe(Some(cursor), Filter::default())
            .await?;
        let (sink, items) = mpsc::channel(READ_AHEAD);
        let task = tokio::spawn(async move {
            loop {
                let item = subscription.next_item().await;
                let failed = item.is_err();
                if sink.send(item).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Reader { items, task })
    }
}

/// Bounds an etcd request by [`REQUEST_TIMEOUT`].
pub(super) async fn timed<T>(
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, FleetError> {
    tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .map_err(|_| FleetError::Timeout(REQUEST_TIMEOUT))?
        .map_err(FleetError::from)
}

/// One item of the daemon's event stream.
type StreamItem = Result<StreamMessage, liveness_client::ClientError>;

/// The writes of the events gathered for one transaction, by key: etcd refuses a
/// transaction that names a key twice, and the last event's write of a key is the one
/// that holds (a session registered and ended within one batch is deleted).
#[derive(Debug, Default)]
struct Batch {
    writes: BTreeMap<String, Write>,
    /// The seq of the last event taken.
    seq: Option<u64>,
}

#[derive(Debug)]
enum Write {
    Put { value: Vec<u8>, lease: Option<i64> },
    Delete,
}

impl Batch {
    fn put(&mut self, key: String, value: Vec<u8>, lease: Option<i64>) {
        self.writes.insert(key, Write::Put { value, lease });
    }

    fn delete(&mut self, key: String) {
        self.writes.insert(key, Write::Delete);
    }

    /// Whether one more event (at most three writes) and the cursor might not fit.
    fn is_full(&self) -> bool {
        self.writes.len() + 4 > TXN_OPS
    }
}

impl<'a> Mirror<'a> {
    /// Reaches etcd, takes the host lease, and brings etcd up to this host's state: the
    /// ACTIVE sessions as they are now, and the events since the cursor to follow.
    async fn connect(
        config: &'a FleetConfig,
        socket: &Path,
        view: &ClusterView,
    ) -> Result<Mirror<'a>, FleetError> {
        let mut etcd = timed(Client::connect(&config.endpoints, Some(options(config)))).await?;
        let lease = timed(etcd.lease_grant(config.ttl.as_secs() as i64, None))
            .await?
            .id();
        view.set_lease(lease);
        let (keeper, answers) = timed(etcd.lease_keep_alive(lease)).await?;
        let mut local = AsyncClient::connect(socket).await?;
        let status = local.status().await?;
        let stored = timed(etcd.get(config.cursor_key(), None)).await?;
        // The daemon judges the cursor as any subscriber's: resumed if its store and run
        // are this database's, else `reset` and every event.
        let cursor = match stored.kvs().first() {
            Some(kv) => serde_json::from_slice::<Origin>(kv.value())?,
            None => Origin {
                store_id: status.store_id.clone(),
                seq: 0,
            },
        };
        let since = cursor.seq;
        let stream = Reader::start(
            socket,
            Cursor {
                seq: cursor.seq,
                store_id: Some(cursor.store_id),
            },
        )
        .await?;
        let mut mirror = Mirror {
            config,
            etcd,
            lease,
            keeper,
            answers,
            local,
            stream,
            store_id: status.store_id,
            sessions: BTreeSet::new(),
            retention: None,
            online_since_ms: now_ms(),
        };
        mirror.claim_host().await?;
        mirror.put_seen().await?;
        mirror.resync(status.head_seq).await?;
        view.connected(since);
        tracing::info!(
            endpoints = %config.endpoints.join(","),
            host_id = %config.host_id,
            since,
            head = status.head_seq,
            "fleet mirror: connected to etcd"
        );
        Ok(mirror)
    }

    /// Follows the event stream and keeps the lease alive until something fails.
    async fn follow(&mut self, view: &ClusterView) -> Result<Infallible, FleetError> {
        let period = self.config.ttl / 3;
        let mut tick = tokio::time::interval(period);
        let mut answered = Instant::now();
        let mut host_sessions = self.sessions.len();
        loop {
            tokio::select! {
                item = self.stream.items.recv() => {
                    if let Some(seq) = self.gather(item).await? {
                        view.mirrored(seq);
                    }
                }
                answer = self.answers.message() => match answer? {
                    Some(answer) if answer.ttl() > 0 => answered = Instant::now(),
                    _ => return Err(FleetError::LeaseLost),
                },
                _ = tick.tick() => {
                    if answered.elapsed() > self.config.ttl {
                        return Err(FleetError::LeaseLost);
                    }
                    timed(self.keeper.keep_alive()).await?;
                    self.put_seen().await?;
                    if host_sessions != self.sessions.len() {
                        host_sessions = self.sessions.len();
                        self.put_host().await?;
                    }
                }
            }
        }
    }

    /// Takes `first` and the stream messages that follow within [`GATHER`] (or until a
    /// transaction is full) and writes what they change in one transaction; returns the
    /// seq it brings the mirror to.
    async fn gather(&mut self, first: Option<StreamItem>) -> Result<Option<u64>, FleetError> {
        let mut batch = Batch::default();
        let mut item = first;
        let until = tokio::time::Instant::now() + GATHER;
        loop {
            let Some(message) = item else {
                return Err(FleetError::StreamEnded);
            };
            match message? {
                StreamMessage::Event(event) => self.take(&event, &mut batch).await?,
                // A new database, or events pruned before the mirror read them: what they
                // said of ACTIVE sessions is read again (the ends among them are lost).
                StreamMessage::Reset { store_id, head, .. } => {
                    tracing::warn!(%store_id, "fleet mirror: the database was replaced; resynchronising");
                    self.write(batch).await?;
                    self.store_id = store_id;
                    self.resync(head).await?;
                    return Ok(None);
                }
                StreamMessage::Gap {
                    pruned_through,
                    since,
                } => {
                    tracing::warn!(
                        since,
                        pruned_through,
                        "fleet mirror: events were pruned before etcd had them; resynchronising"
                    );
                    self.write(batch).await?;
                    self.resync(pruned_through).await?;
                    return Ok(Some(pruned_through));
                }
                _ => {}
            }
            if batch.is_full() {
                break;
            }
            match tokio::time::timeout_at(until, self.stream.items.recv()).await {
                Ok(next) => item = next,
                Err(_) => break,
            }
        }
        self.write(batch).await
    }

    /// Writes a batch with the cursor at its last event, in one transaction. A batch that
    /// changes nothing in etcd is not written: the cursor moves with the next write.
    async fn write(&mut self, mut batch: Batch) -> Result<Option<u64>, FleetError> {
        let Some(seq) = batch.seq else {
            return Ok(None);
        };
        if batch.writes.is_empty() {
            return Ok(Some(seq));
        }
        let origin = Origin {
            store_id: self.store_id.clone(),
            seq,
        };
        batch.put(self.config.cursor_key(), serde_json::to_vec(&origin)?, None);
        let ops = (batch.writes.into_iter())
            .map(|(key, write)| match write {
                Write::Put { value, lease } => {
                    let options = lease.map(|lease| PutOptions::new().with_lease(lease));
                    TxnOp::put(key, value, options)
                }
                Write::Delete => TxnOp::delete(key, None),
            })
            .collect::<Vec<_>>();
        timed(self.etcd.txn(Txn::new().and_then(ops))).await?;
        Ok(Some(seq))
    }

    /// Adds what an event changes to the batch, whose seq it becomes.
    async fn take(&mut self, event: &Event, batch: &mut Batch) -> Result<(), FleetError> {
        let origin = Origin {
            store_id: self.store_id.clone(),
            seq: event.seq,
        };
        batch.seq = Some(event.seq);
        let key = self.session_key("sessions", event.creator_uid, &event.session);
        match event.kind {
            EventKind::Ended => {
                let record = serde_json::to_vec(&EndedRecord {
                    origin: &origin,
                    event,
                })?;
                let lease = self.ended_lease().await?;
                let ended = self.session_key("ended", event.creator_uid, &event.session);
                batch.delete(key.clone());
                batch.put(ended, record, Some(lease));
                self.sessions.remove(&key);
            }
            EventKind::Registered
            | EventKind::OwnerChanged
            | EventKind::Renamed
            | EventKind::LockAcquired
            | EventKind::LockReleased => {
                if let Some(previous) = &event.previous_session {
                    let previous = self.session_key("sessions", event.creator_uid, previous);
                    batch.delete(previous.clone());
                    self.sessions.remove(&previous);
                }
                // The session as it is now: a replay never brings back an ended one.
                if let Some(session) = self.active(event).await? {
                    let record = serde_json::to_vec(&SessionRecord {
                        origin: &origin,
                        session: &session,
                    })?;
                    batch.put(key.clone(), record, None);
                    self.sessions.insert(key);
                }
            }
            // Nothing of these is mirrored.
            EventKind::Reaped
            | EventKind::Action
            | EventKind::Finalized
            | EventKind::Stalled
            | EventKind::Unstalled
            | EventKind::Escaped => {}
        }
        Ok(())
    }

    /// The event's session if it is still ACTIVE.
    async fn active(&mut self, event: &Event) -> Result<Option<Session>, FleetError> {
        // Only root names another user's session; a user's daemon sees its own.
        let uid = rustix::process::geteuid()
            .is_root()
            .then_some(event.creator_uid);
        match self.local.get(&event.session, uid).await {
            Ok(session) => Ok((session.phase == Phase::Active).then_some(session)),
            Err(e) if e.code() == Some(ErrorCode::NotFound) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// `PREFIX/KIND/HOST_ID/UID/SESSION`.
    fn session_key(&self, kind: &str, uid: u32, session: &str) -> String {
        format!("{}{uid}/{session}", self.config.host_dir(kind))
    }

    /// Puts every ACTIVE session and deletes the keys of those that are not (any more).
    async fn resync(&mut self, head: u64) -> Result<(), FleetError> {
        let origin = Origin {
            store_id: self.store_id.clone(),
            seq: head,
        };
        let dir = self.config.host_dir("sessions");
        let listed = timed(self.etcd.get(
            dir.clone(),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        ))
        .await?;
        let mut stale: BTreeSet<String> = listed
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect();
        let mut ops = Vec::new();
        self.sessions.clear();
        for session in self.local.list(Some(Phase::Active)).await? {
            let key = self.session_key("sessions", session.creator_uid, &session.id);
            let record = serde_json::to_vec(&SessionRecord {
                origin: &origin,
                session: &session,
            })?;
            stale.remove(&key);
            ops.push(TxnOp::put(key.clone(), record, None));
            self.sessions.insert(key);
        }
        ops.extend(stale.into_iter().map(|key| TxnOp::delete(key, None)));
        while !ops.is_empty() {
            let batch: Vec<TxnOp> = ops.drain(..ops.len().min(TXN_OPS)).collect();
            timed(self.etcd.txn(Txn::new().and_then(batch))).await?;
        }
        Ok(())
    }

    /// The put of the host key, on this connection's lease.
    fn host_put(&self) -> Result<TxnOp, FleetError> {
        let proc = liveness_proc::identity::ProcRoot::default();
        let record = HostRecord {
            host_id: &self.config.host_id,
            machine_id: std::fs::read_to_string("/etc/machine-id")
                .ok()
                .map(|id| id.trim().to_owned()),
            boot_id: proc.boot_id().ok(),
            hostname: proc.host().ok(),
            version: env!("CARGO_PKG_VERSION"),
            store_id: &self.store_id,
            active_sessions: self.sessions.len(),
            online_since_ms: self.online_since_ms,
        };
        Ok(TxnOp::put(
            self.config.host_key(),
            serde_json::to_vec(&record)?,
            Some(PutOptions::new().with_lease(self.lease)),
        ))
    }

    /// Puts the host key on this connection's lease, if no other daemon holds it: two
    /// daemons given one host id would delete each other's sessions. The key of this
    /// database's earlier run (a daemon restarted before its lease ran out) is taken over.
    async fn claim_host(&mut self) -> Result<(), FleetError> {
        let key = self.config.host_key();
        let put = self.host_put()?;
        for _ in 0..2 {
            let absent = Compare::version(key.clone(), CompareOp::Equal, 0);
            let claim = Txn::new()
                .when(vec![absent])
                .and_then(vec![put.clone()])
                .or_else(vec![TxnOp::get(key.clone(), None)]);
            let reply = timed(self.etcd.txn(claim)).await?;
            if reply.succeeded() {
                return Ok(());
            }
            let holder = reply.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(got) => got.kvs().first().cloned(),
                _ => None,
            });
            let Some(holder) = holder else { continue };
            let theirs: HostHeld = serde_json::from_slice(holder.value())?;
            if database(&theirs.store_id) != database(&self.store_id) {
                return Err(FleetError::HostTaken {
                    host_id: self.config.host_id.clone(),
                    hostname: theirs.hostname.unwrap_or_default(),
                });
            }
            timed(self.etcd.lease_revoke(holder.lease())).await?;
        }
        Err(FleetError::LeaseLost)
    }

    /// `PREFIX/seen/HOST_ID`, off the lease: when this host was last seen alive, which
    /// its readers show once it is offline.
    async fn put_seen(&mut self) -> Result<(), FleetError> {
        let seen = serde_json::json!({
            "host_id": self.config.host_id,
            "hostname": liveness_proc::identity::ProcRoot::default().host().ok(),
            "seen_ms": now_ms(),
        });
        let key = format!("{}/seen/{}", self.config.prefix, self.config.host_id);
        timed(self.etcd.put(key, seen.to_string(), None)).await?;
        Ok(())
    }

    /// Rewrites the host key (its session count), while this connection's lease holds it.
    async fn put_host(&mut self) -> Result<(), FleetError> {
        let key = self.config.host_key();
        let put = self.host_put()?;
        let ours = Compare::lease(key, CompareOp::Equal, self.lease);
        let reply = timed(
            self.etcd
                .txn(Txn::new().when(vec![ours]).and_then(vec![put])),
        )
        .await?;
        if !reply.succeeded() {
            return Err(FleetError::LeaseLost);
        }
        Ok(())
    }

    /// The lease the ended records of the present stretch of time expire with: one per
    /// 24th of the retention, living for the retention and that stretch, so that each
    /// record stays at least the retention and at most a 24th more, at one lease (not one
    /// per record) per stretch.
    async fn ended_lease(&mut self) -> Result<i64, FleetError> {
        let stretch = self.config.ended_retention / 24;
        if let Some((lease, granted)) = self.retention
            && granted.elapsed() < stretch
        {
            return Ok(lease);
        }
        let ttl = (self.config.ended_retention + stretch).as_secs().max(1) as i64;
        let lease = timed(self.etcd.lease_grant(ttl, None)).await?.id();
        self.retention = Some((lease, Instant::now()));
        Ok(lease)
    }
}

impl FleetConfig {
    /// `PREFIX/hosts/HOST_ID`.
    fn host_key(&self) -> String {
        format!("{}/hosts/{}", self.prefix, self.host_id)
    }

    /// `PREFIX/cursors/HOST_ID`: the last seq whose writes etcd holds, and its store.
    fn cursor_key(&self) -> String {
        format!("{}/cursors/{}", self.prefix, self.host_id)
    }

    /// `PREFIX/KIND/HOST_ID/`: everything after it is `UID/SESSION`.
    fn host_dir(&self, kind: &str) -> String {
        format!("{}/{kind}/{}/", self.prefix, self.host_id)
    }
}

impl ClusterView {
    fn update<T>(&self, change: impl FnOnce(&mut ClusterStatus, &mut Option<i64>) -> T) -> T {
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (status, lease) = &mut *state;
        change(status, lease)
    }

    fn set_lease(&self, id: i64) {
        self.update(|_, lease| *lease = Some(id));
    }

    fn lease(&self) -> Option<i64> {
        self.update(|_, lease| *lease)
    }

    fn was_connected(&self) -> bool {
        self.update(|status, _| status.connected)
    }

    fn error(&self) -> Option<String> {
        self.update(|status, _| status.error.clone())
    }

    fn connected(&self, mirrored: u64) {
        self.update(|status, _| {
            status.connected = true;
            status.since_ms = now_ms();
            status.mirrored_seq = Some(mirrored);
            status.error = None;
        });
    }

    fn mirrored(&self, seq: u64) {
        self.update(|status, _| status.mirrored_seq = Some(seq));
    }

    fn disconnected(&self, error: &FleetError) {
        self.update(|status, _| {
            if status.connected {
                status.since_ms = now_ms();
            }
            status.connected = false;
            status.error = Some(error.to_string());
        });
    }
}
