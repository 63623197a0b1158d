//! Fleet locks (`lock_acquire` and `lock_release` with `cluster`), held in etcd as etcd's
//! own `concurrency` mutex holds them (docs/fleet.md): each waiter puts a key of its own,
//! `PREFIX/locks/NAME/LEASE`, on the lease of its session; the key of lowest create
//! revision holds the lock, and that revision is the fencing token; a waiter waits for the
//! deletion of the key created just before its own.
//!
//! A session that takes fleet locks gets one lease, renewed here while it holds or waits.
//! Its end on this host (the committed `session.ended` event, read from the daemon's own
//! stream like any subscriber's) revokes the lease, which frees its locks for the other
//! hosts a round trip later; the engine never waits on etcd. A daemon that dies stops
//! renewing, and etcd frees the locks after the TTL. A lease whose renewal etcd has not
//! confirmed within the TTL is given up here: the daemon then claims none of its locks.
//!
//! Each grant is also a row of the daemon's database (with its lease), committed with its
//! `lock.acquired` event once etcd granted it; each release, whatever its cause, removes the
//! row with a `lock.released` event. A daemon restarted (stopped or killed) re-attaches
//! from those rows the leases etcd still has, for sessions still ACTIVE; of a lease that
//! expired meanwhile, the rows are released as `lease_lost`, which tells the holder.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse,
};
use liveness_client::nonblocking::AsyncClient;
use liveness_client::{ClientError, Filter};
use liveness_common::lock::{Lock, ReleaseReason};
use liveness_common::protocol::{ErrorBody, ErrorCode, StreamMessage};
use liveness_common::request;
use liveness_common::session::{EventKind, Phase};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::mirror::{REQUEST_TIMEOUT, Shared, timed};
use super::{FleetConfig, FleetError, lock_segment, now_ms};
use crate::engine::{Caller, FleetGranted, FleetHeld, FleetReleased, Handle, Refusal};
use crate::store::StoreError;

/// A session, as the daemon knows it: its creator's uid and its id.
type SessionKey = (u32, String);

/// The fleet locks of this host's sessions.
#[derive(Clone)]
pub(crate) struct FleetLocks(Arc<Inner>);

/// etcd's client says nothing of itself.
impl std::fmt::Debug for FleetLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetLocks")
            .field("config", &self.0.etcd.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    /// Reached at the first fleet lock.
    etcd: Shared,
    /// Where grants and releases are recorded.
    engine: Handle,
    /// Sessions whose fleet locks, held before the daemon's restart, are not re-attached
    /// yet: they neither take nor release one until then.
    restoring: Mutex<HashSet<SessionKey>>,
    /// Held while a lease is granted, so that two requests of one session share one.
    grants: tokio::sync::Mutex<()>,
    /// The lease of each session that holds or waits for fleet locks.
    sessions: Mutex<HashMap<SessionKey, Holder>>,
    /// Told when `sessions` gains one: the follower subscribes to the daemon's events only
    /// while there is a lease to revoke.
    joined: tokio::sync::Notify,
}

#[derive(Debug)]
struct Holder {
    lease: i64,
    /// Until when etcd surely keeps the lease: when its last confirmed renewal was sent,
    /// plus the TTL.
    valid_until: Instant,
    /// The locks granted, by name.
    held: BTreeMap<String, Lock>,
    /// Acquisitions under way.
    acquiring: u32,
    renew: JoinHandle<()>,
}

/// `PREFIX/locks/NAME/LEASE`'s value: who holds or waits.
#[derive(Debug, Serialize, Deserialize)]
struct Waiter {
    host_id: String,
    uid: u32,
    session: String,
    since_ms: i64,
}

impl FleetLocks {
    /// The fleet locks, and the task that revokes a session's lease when it ends (on a
    /// thread of its own, as the mirror, at the connections' priority).
    pub(crate) fn start(
        config: FleetConfig,
        engine: Handle,
        socket: PathBuf,
        mut stopped: watch::Receiver<bool>,
    ) -> FleetLocks {
        let locks = FleetLocks(Arc::new(Inner {
            etcd: Shared::new(config),
            engine,
            restoring: Mutex::new(HashSet::new()),
            grants: tokio::sync::Mutex::new(()),
            sessions: Mutex::new(HashMap::new()),
            joined: tokio::sync::Notify::new(),
        }));
        let follower = locks.clone();
        // Not below the connections: a waiter on another host waits for its revocations,
        // and its etcd client, shared with the connections, is driven from its runtime.
        super::spawn_below(
            "the fleet locks' follower",
            crate::fair::offload::CONNECTIONS_NICE,
            async move {
                // Re-attached first: an end the stream then brings finds the lease here.
                follower.reattach(&mut stopped).await;
                follower.follow_ends(socket, stopped).await;
            },
        );
        locks
    }

    /// Takes lock `request.name` for the session, waiting in line if asked; `abandon`
    /// resolves when nobody waits for the answer any more (the client left, the daemon
    /// stops), with what to answer then.
    pub(crate) async fn acquire(
        &self,
        engine: &Handle,
        caller: Caller,
        request: request::LockAcquire,
        abandon: impl Future<Output = ErrorBody>,
    ) -> Result<Lock, ErrorBody> {
        if request.timeout_ms.is_some() && !request.wait {
            return Err(ErrorBody::new(
                ErrorCode::InvalidRequest,
                "`timeout_ms` applies only to a request that waits: add `wait: true`",
            ));
        }
        crate::store::validate_lock_name(&request.name)
            .map_err(|e| ErrorBody::new(ErrorCode::InvalidRequest, e.to_string()))?;
        let holder = self
            .session(engine, caller, &request.session, request.uid)
            .await?;
        let lease = self.lease(&holder).await?;
        let key = self.key(&request.name, lease);
        let mut queued = false;
        let attempt = async {
            // The session may have ended before its lease was known here, its end read
            // and passed by: asked again now, an end is either seen here or revokes the
            // lease.
            self.session(engine, caller, &holder.1, Some(holder.0))
                .await?;
            let (token, fresh) = self.queue(&holder, &key, lease).await?;
            queued = fresh;
            self.wait_turn(&holder, &key, token, &request).await
        };
        let acquired = tokio::select! {
            acquired = attempt => acquired,
            error = abandon => Err(error),
        };
        let claimed = self.settle(&holder, lease, acquired.as_ref().ok());
        match (acquired, claimed) {
            (Ok(lock), true) => {
                let granted = FleetGranted {
                    lock: lock.clone(),
                    lease,
                };
                match self.0.engine.ask(Caller::DAEMON, granted).await {
                    Ok(()) => Ok(lock),
                    // Its session ended meanwhile, or holds too many: not claimed.
                    Err(error) => {
                        self.unclaim(&holder, &request.name);
                        self.delete(&key).await;
                        self.drop_idle(&holder).await;
                        Err(error.into())
                    }
                }
            }
            (Ok(_), false) => {
                self.delete(&key).await;
                Err(lease_lost(&request.name))
            }
            (Err(error), _) => {
                // A key this request did not put is another request's of the session.
                if queued {
                    self.delete(&key).await;
                }
                self.drop_idle(&holder).await;
                Err(error)
            }
        }
    }

    /// Releases lock `request.name`, held by the session.
    pub(crate) async fn release(
        &self,
        engine: &Handle,
        caller: Caller,
        request: request::LockRelease,
    ) -> Result<Lock, ErrorBody> {
        let holder = self
            .session(engine, caller, &request.session, request.uid)
            .await?;
        self.restored(&holder)?;
        let not_held = || {
            ErrorBody::new(
                ErrorCode::NotHeld,
                format!(
                    "session {:?} does not hold fleet lock {:?}",
                    holder.1, request.name
                ),
            )
        };
        let (lease, lock) = {
            let sessions = self.0.sessions.lock().unwrap_or_else(|e| e.into_inner());
            let held = sessions
                .get(&holder)
                .filter(|h| h.valid_until > Instant::now());
            held.and_then(|h| Some((h.lease, h.held.get(&request.name)?.clone())))
                .ok_or_else(not_held)?
        };
        let key = self.key(&request.name, lease);
        // Deleted only if it is still this grant's key: a lease lost meanwhile took it.
        let ours = Compare::create_revision(key.clone(), CompareOp::Equal, lock.token as i64);
        let delete = Txn::new()
            .when(vec![ours])
            .and_then(vec![TxnOp::delete(key, None)]);
        let deleted = timed(self.etcd().await?.txn(delete)).await?.succeeded();
        self.unclaim(&holder, &request.name);
        let reason = if deleted {
            ReleaseReason::Released
        } else {
            ReleaseReason::LeaseLost
        };
        self.released(&holder, Some(&lock), reason).await;
        self.drop_idle(&holder).await;
        if !deleted {
            return Err(not_held());
        }
        Ok(lock)
    }

    /// Forgets the grant of lock `name` to the session.
    fn unclaim(&self, holder: &SessionKey, name: &str) {
        let mut sessions = self.0.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = sessions.get_mut(holder) {
            h.held.remove(name);
        }
    }

    /// Records the release of the session's fleet lock `only`, or of all of them.
    async fn released(&self, holder: &SessionKey, only: Option<&Lock>, reason: ReleaseReason) {
        let released = FleetReleased {
            uid: holder.0,
            session: holder.1.clone(),
            only: only.map(|lock| (lock.name.clone(), lock.token)),
            reason,
        };
        if let Err(e) = self.0.engine.ask(Caller::DAEMON, released).await {
            tracing::warn!(session = %holder.1, uid = holder.0, error = %e, "fleet lock: cannot record a release");
        }
    }

    /// Refuses to act for a session whose locks from before the restart are not
    /// re-attached yet (etcd not reached since).
    fn restored(&self, holder: &SessionKey) -> Result<(), ErrorBody> {
        let restoring = self.0.restoring.lock().unwrap_or_else(|e| e.into_inner());
        if restoring.contains(holder) {
            return Err(ErrorBody::new(
                ErrorCode::Internal,
                format!(
                    "session {:?} held fleet locks before the daemon restarted, and etcd has \
                     not been reached since to re-attach them: try again",
                    holder.1
                ),
            ));
        }
        Ok(())
    }

    /// At start: the fleet locks this host's sessions held when the daemon stopped or died
    /// (the database's rows). A session still ACTIVE whose lease etcd still has keeps the
    /// locks whose keys are still on it: its lease is renewed from now on. The other rows
    /// are released, as `lease_lost` (the holder is told: the lock may be another's now) or
    /// `session_ended` (and the lease revoked). Tries until etcd answers or the daemon
    /// stops.
    async fn reattach(&self, stopped: &mut watch::Receiver<bool>) {
        let rows = match self.0.engine.ask(Caller::DAEMON, FleetHeld).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "fleet lock: cannot read the fleet locks held before the start");
                return;
            }
        };
        let mut leases: BTreeMap<(SessionKey, i64), Vec<Lock>> = BTreeMap::new();
        for (lock, lease) in rows {
            let holder = (lock.uid, lock.session.clone());
            leases.entry((holder, lease)).or_default().push(lock);
        }
        (self.0.restoring.lock().unwrap_or_else(|e| e.into_inner()))
            .extend(leases.keys().map(|(holder, _)| holder.clone()));
        for ((holder, lease), locks) in leases {
            let mut delay = Duration::from_millis(100);
            loop {
                let attached = tokio::select! {
                    _ = stopped.wait_for(|stop| *stop) => return,
                    attached = self.reattach_lease(&holder, lease, &locks) => attached,
                };
                let Err(e) = attached else { break };
                tracing::debug!(error = %e, "fleet lock: cannot re-attach a lease yet; retrying");
                tokio::select! {
                    _ = stopped.wait_for(|stop| *stop) => return,
                    () = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            (self.0.restoring.lock().unwrap_or_else(|e| e.into_inner())).remove(&holder);
        }
    }

    /// Re-attaches one session's lease and its locks, or releases them (see
    /// [`FleetLocks::reattach`]).
    async fn reattach_lease(
        &self,
        holder: &SessionKey,
        lease: i64,
        locks: &[Lock],
    ) -> Result<(), FleetError> {
        let get = request::Get {
            session: holder.1.clone(),
            uid: Some(holder.0),
        };
        let active = match self.0.engine.ask(Caller::DAEMON, get).await {
            Ok(session) => session.phase == Phase::Active,
            Err(Refusal::Store(StoreError::NotFound(_))) => false,
            Err(e) => {
                tracing::warn!(session = %holder.1, error = %e, "fleet lock: cannot read a holder after the start");
                return Ok(());
            }
        };
        let mut etcd = self.etcd().await?;
        // A session holds one lease: another one's rows are of a lease it lost.
        let known =
            (self.0.sessions.lock().unwrap_or_else(|e| e.into_inner())).contains_key(holder);
        if !active || known {
            if let Err(e) = timed(etcd.lease_revoke(lease)).await {
                tracing::debug!(lease, error = %e, "fleet lock: a lease from before the start is gone already");
            }
            let reason = if active {
                ReleaseReason::LeaseLost
            } else {
                ReleaseReason::SessionEnded
            };
            self.released(holder, None, reason).await;
            return Ok(());
        }
        let sent = Instant::now();
        let left = timed(etcd.lease_time_to_live(lease, None)).await?.ttl();
        let mut held = BTreeMap::new();
        for lock in locks {
            let own = match left {
                ..=0 => None,
                _ => Some(timed(etcd.get(self.key(&lock.name, lease), None)).await?),
            };
            let kept = own.is_some_and(|own| {
                (own.kvs().first()).is_some_and(|kv| kv.create_revision() as u64 == lock.token)
            });
            if kept {
                held.insert(lock.name.clone(), lock.clone());
            } else {
                tracing::warn!(session = %holder.1, uid = holder.0, lock = %lock.name, "fleet lock: the lease expired while the daemon was down; the lock is lost");
                self.released(holder, Some(lock), ReleaseReason::LeaseLost)
                    .await;
            }
        }
        if held.is_empty() {
            if left > 0 {
                let _ = timed(etcd.lease_revoke(lease)).await;
            }
            return Ok(());
        }
        tracing::info!(session = %holder.1, uid = holder.0, lease, locks = held.len(), "fleet lock: re-attached a lease held before the start");
        let renew = tokio::spawn(self.clone().renew(etcd, holder.clone(), lease));
        let attached = Holder {
            lease,
            valid_until: sent + Duration::from_secs(left as u64),
            held,
            acquiring: 0,
            renew,
        };
        (self.0.sessions.lock().unwrap_or_else(|e| e.into_inner()))
            .insert(holder.clone(), attached);
        Ok(())
    }

    /// The session a request names, if the caller may act for it and it is ACTIVE.
    async fn session(
        &self,
        engine: &Handle,
        caller: Caller,
        session: &str,
        uid: Option<u32>,
    ) -> Result<SessionKey, ErrorBody> {
        let get = request::Get {
            session: session.to_owned(),
            uid,
        };
        let session = engine.ask(caller, get).await?;
        if session.phase != Phase::Active {
            return Err(ErrorBody::new(
                ErrorCode::AlreadyEnded,
                format!("session {:?} has ended", session.id),
            ));
        }
        Ok((session.creator_uid, session.id))
    }

    async fn etcd(&self) -> Result<Client, FleetError> {
        self.0.etcd.client().await
    }

    /// The session's lease, granted (and renewed from then on) at its first fleet lock;
    /// counts an acquisition under way, so that the lease outlives it.
    async fn lease(&self, holder: &SessionKey) -> Result<i64, ErrorBody> {
        self.restored(holder)?;
        let _granting = self.0.grants.lock().await;
        if let Some(h) = (self.0.sessions.lock().unwrap_or_else(|e| e.into_inner())).get_mut(holder)
        {
            h.acquiring += 1;
            return Ok(h.lease);
        }
        let mut etcd = self.etcd().await?;
        let ttl = self.0.etcd.config.ttl;
        let sent = Instant::now();
        let lease = timed(etcd.lease_grant(ttl.as_secs() as i64, None))
            .await?
            .id();
        let renew = tokio::spawn(self.clone().renew(etcd, holder.clone(), lease));
        let granted = Holder {
            lease,
            valid_until: sent + ttl,
            held: BTreeMap::new(),
            acquiring: 1,
            renew,
        };
        (self.0.sessions.lock().unwrap_or_else(|e| e.into_inner())).insert(holder.clone(), granted);
        self.0.joined.notify_one();
        Ok(lease)
    }

    /// `PREFIX/locks/NAME/LEASE`: the key of the session whose lease it is.
    fn key(&self, name: &str, lease: i64) -> String {
        format!("{}{lease:x}", self.dir(name))
    }

    /// `PREFIX/locks/NAME/`.
    fn dir(&self, name: &str) -> String {
        format!(
            "{}/locks/{}/",
            self.0.etcd.config.prefix,
            lock_segment(name)
        )
    }

    /// Puts the session's key in line, on its lease: its create revision is its place and
    /// its token. `true` if this request put it (the session may hold the lock, or wait for
    /// it on another connection, already).
    async fn queue(
        &self,
        holder: &SessionKey,
        key: &str,
        lease: i64,
    ) -> Result<(i64, bool), ErrorBody> {
        let waiter = serde_json::to_vec(&Waiter {
            host_id: self.0.etcd.config.host_id.clone(),
            uid: holder.0,
            session: holder.1.clone(),
            since_ms: now_ms(),
        })
        .map_err(FleetError::from)?;
        let absent = Compare::create_revision(key, CompareOp::Equal, 0);
        let put = TxnOp::put(key, waiter, Some(PutOptions::new().with_lease(lease)));
        let queue = Txn::new()
            .when(vec![absent])
            .and_then(vec![put])
            .or_else(vec![TxnOp::get(key, None)]);
        let queued = timed(self.etcd().await?.txn(queue)).await?;
        let token = match queued.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(got)) => got.kvs().first().map(|kv| kv.create_revision()),
            _ => queued.header().map(|header| header.revision()),
        };
        Ok((token.ok_or(FleetError::LeaseLost)?, queued.succeeded()))
    }

    /// Waits until every key put in line before `key` is gone: each time for the deletion
    /// of the one just before it (released, its session ended, its lease expired), as
    /// etcd's `concurrency` mutex does.
    async fn wait_turn(
        &self,
        holder: &SessionKey,
        key: &str,
        token: i64,
        request: &request::LockAcquire,
    ) -> Result<Lock, ErrorBody> {
        let mut etcd = self.etcd().await?;
        let dir = self.dir(&request.name);
        let waited = async {
            loop {
                let before = GetOptions::new()
                    .with_prefix()
                    .with_max_create_revision(token - 1)
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_limit(1);
                let ahead = timed(etcd.get(dir.clone(), Some(before))).await?;
                let Some(previous) = ahead.kvs().first() else {
                    return Ok(());
                };
                if !request.wait {
                    return Err(self.held_by(&mut etcd, &dir, &request.name).await);
                }
                // The key before and this one's own: a lease that ends (the session
                // ended, etcd lost it) takes the request out of line at once. Watched from
                // now, not from the get's revision: a watch that starts in the past (any
                // write since the get: another host's mirror) waits for etcd's catch-up
                // pass, every 100 ms, before it sees anything new. What went between the
                // get and the watches is read again once both are in place.
                let mut stream = timed(etcd.watch(previous.key(), None)).await?;
                timed(stream.watch(key, None)).await?;
                let mut created = 0;
                loop {
                    let Some(answer) = stream.message().await.map_err(FleetError::from)? else {
                        return Err(FleetError::LeaseLost.into());
                    };
                    if answer.canceled() {
                        return Err(FleetError::LeaseLost.into());
                    }
                    let deleted: Vec<&[u8]> = answer
                        .events()
                        .iter()
                        .filter(|e| e.event_type() == EventType::Delete)
                        .filter_map(|e| Some(e.kv()?.key()))
                        .collect();
                    if deleted.contains(&key.as_bytes()) {
                        return Err(lease_lost(&request.name));
                    }
                    if !deleted.is_empty() {
                        break;
                    }
                    created += usize::from(answer.created());
                    if created == 2 {
                        let count = |k: Vec<u8>| {
                            let mut etcd = etcd.clone();
                            async move {
                                let only = GetOptions::new().with_count_only();
                                timed(etcd.get(k, Some(only))).await.map(|r| r.count())
                            }
                        };
                        if count(key.into()).await? == 0 {
                            return Err(lease_lost(&request.name));
                        }
                        if count(previous.key().to_vec()).await? == 0 {
                            break;
                        }
                    }
                }
            }
        };
        let deadline = async {
            match request.timeout_ms {
                Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            waited = waited => waited?,
            () = deadline => {
                return Err(ErrorBody::new(
                    ErrorCode::LockHeld,
                    format!(
                        "fleet lock {:?} is still held after waiting {} ms",
                        request.name,
                        request.timeout_ms.unwrap_or_default()
                    ),
                ));
            }
        }
        // Nobody is before it; its own key must still be there (a lease lost while waiting
        // took it), and then nobody can come before it any more: later keys come later.
        let own = timed(etcd.get(key, None)).await?;
        let Some(own) = own.kvs().first().filter(|kv| kv.create_revision() == token) else {
            return Err(lease_lost(&request.name));
        };
        let since_ms =
            serde_json::from_slice::<Waiter>(own.value()).map_or_else(|_| now_ms(), |w| w.since_ms);
        Ok(Lock {
            name: request.name.clone(),
            uid: holder.0,
            session: holder.1.clone(),
            token: token as u64,
            since_ms,
            waiters: 0,
            cluster: true,
            host: Some(self.0.etcd.config.host_id.clone()),
        })
    }

    /// `lock_held`, naming the holder: its host, user and session.
    async fn held_by(&self, etcd: &mut Client, dir: &str, name: &str) -> ErrorBody {
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let holder = match timed(etcd.get(dir, Some(first))).await {
            Ok(got) => got.kvs().first().and_then(|kv| {
                let waiter: Waiter = serde_json::from_slice(kv.value()).ok()?;
                Some(format!(
                    " by session {:?} of uid {} on host {:?} (token {})",
                    waiter.session,
                    waiter.uid,
                    waiter.host_id,
                    kv.create_revision()
                ))
            }),
            Err(_) => None,
        };
        ErrorBody::new(
            ErrorCode::LockHeld,
            format!("fleet lock {name:?} is held{}", holder.unwrap_or_default()),
        )
    }

    /// Ends an acquisition on `lease`: records the grant if the lease is still surely
    /// alive. `false`: granted, but the lease ended or may have expired meanwhile, so the
    /// grant is not claimed.
    fn settle(&self, holder: &SessionKey, lease: i64, granted: Option<&Lock>) -> bool {
        let mut sessions = self.0.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let Some(h) = sessions.get_mut(holder).filter(|h| h.lease == lease) else {
            return false;
        };
        h.acquiring -= 1;
        match granted {
            Some(lock) if h.valid_until > Instant::now() => {
                h.held.insert(lock.name.clone(), lock.clone());
                true
            }
            _ => false,
        }
    }

    /// Revokes the session's lease if it neither holds nor waits for a fleet lock.
    async fn drop_idle(&self, holder: &SessionKey) {
        let idle = {
            let mut sessions = self.0.sessions.lock().unwrap_or_else(|e| e.into_inner());
            match sessions.get(holder) {
                Some(h) if h.held.is_empty() && h.acquiring == 0 => sessions.remove(holder),
                _ => None,
            }
        };
        if let Some(idle) = idle {
            self.revoke(idle).await;
        }
    }

    /// Deletes a key of this host's, at most once and without waiting long: its lease
    /// frees it anyway.
    async fn delete(&self, key: &str) {
        if let Ok(mut etcd) = self.etcd().await
            && let Err(e) = timed(etcd.delete(key, None)).await
        {
            tracing::warn!(%key, error = %e, "fleet lock: cannot delete a waiter's key; its lease frees it");
        }
    }

    /// Stops renewing a lease and revokes it; etcd frees it after the TTL if it cannot be
    /// reached now.
    async fn revoke(&self, holder: Holder) {
        holder.renew.abort();
        let revoked = async { timed(self.etcd().await?.lease_revoke(holder.lease)).await };
        if let Err(e) = revoked.await {
            tracing::warn!(lease = holder.lease, error = %e, "fleet lock: cannot revoke a session's lease; its TTL frees it");
        }
    }

    /// Forgets the session's lease (its locks are no longer claimed), revokes it, and
    /// records the release of its locks.
    async fn end(&self, holder: &SessionKey) {
        let ended = (self.0.sessions.lock().unwrap_or_else(|e| e.into_inner())).remove(holder);
        if let Some(ended) = ended {
            tracing::debug!(session = %holder.1, uid = holder.0, "fleet lock: the session ended; revoking its lease");
            let held = !ended.held.is_empty();
            self.revoke(ended).await;
            if held {
                self.released(holder, None, ReleaseReason::SessionEnded)
                    .await;
            }
        }
    }

    /// Renews a session's lease every third of the TTL. A renewal not confirmed before the
    /// lease could have expired gives it up: the daemon claims none of its locks then.
    async fn renew(self, mut etcd: Client, holder: SessionKey, lease: i64) {
        let ttl = self.0.etcd.config.ttl;
        let mut tick = tokio::time::interval(ttl / 3);
        let mut keeper = None;
        loop {
            tick.tick().await;
            let sent = Instant::now();
            let renewed = async {
                let (keeper, answers) = match &mut keeper {
                    Some(pair) => pair,
                    None => keeper.insert(timed(etcd.lease_keep_alive(lease)).await?),
                };
                timed(keeper.keep_alive()).await?;
                let answer = tokio::time::timeout(REQUEST_TIMEOUT, answers.message())
                    .await
                    .map_err(|_| FleetError::Timeout(REQUEST_TIMEOUT))??;
                Ok::<_, FleetError>(answer.is_some_and(|a| a.ttl() > 0))
            };
            let renewed = renewed.await;
            let lost = {
                let mut sessions = self.0.sessions.lock().unwrap_or_else(|e| e.into_inner());
                let Some(h) = sessions.get_mut(&holder).filter(|h| h.lease == lease) else {
                    return;
                };
                match renewed {
                    Ok(true) => {
                        h.valid_until = sent + ttl;
                        false
                    }
                    Ok(false) => {
                        tracing::warn!(session = %holder.1, uid = holder.0, "fleet lock: etcd let the session's lease expire; its fleet locks are lost");
                        sessions.remove(&holder);
                        true
                    }
                    Err(e) if h.valid_until <= Instant::now() => {
                        tracing::warn!(session = %holder.1, uid = holder.0, error = %e, "fleet lock: etcd unreachable for the lease's TTL; its fleet locks are given up");
                        sessions.remove(&holder);
                        true
                    }
                    Err(e) => {
                        keeper = None;
                        tracing::debug!(error = %e, "fleet lock: a lease's renewal failed; retrying");
                        false
                    }
                }
            };
            if lost {
                // The holder is told: `lock.released` with `lease_lost`.
                self.released(&holder, None, ReleaseReason::LeaseLost).await;
                return;
            }
        }
    }

    /// Follows the daemon's own event stream: each `session.ended` revokes that session's
    /// lease. After a (re)connection, the sessions with a lease that ended meanwhile are
    /// found by asking the daemon. While no session has a lease, it is not subscribed: the
    /// host's deaths then wake nothing here.
    async fn follow_ends(self, socket: PathBuf, mut stopped: watch::Receiver<bool>) {
        loop {
            let followed = tokio::select! {
                _ = stopped.wait_for(|stop| *stop) => return,
                followed = async {
                    self.until_a_lease().await;
                    self.follow_ends_once(&socket).await
                } => followed,
            };
            let Err(failed) = followed else {
                continue;
            };
            tracing::debug!(error = %failed, "fleet lock: the daemon's event stream was lost; resubscribing");
            tokio::select! {
                _ = stopped.wait_for(|stop| *stop) => return,
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }

    /// Returns once a session has a lease.
    async fn until_a_lease(&self) {
        loop {
            // Made before the look: a lease granted after it leaves a permit.
            let joined = self.0.joined.notified();
            if !self.no_lease() {
                return;
            }
            joined.await;
        }
    }

    fn no_lease(&self) -> bool {
        (self.0.sessions.lock().unwrap_or_else(|e| e.into_inner())).is_empty()
    }

    /// Follows the stream until no session has a lease any more (`Ok`), or it is lost.
    async fn follow_ends_once(&self, socket: &Path) -> Result<(), ClientError> {
        let mut subscription = AsyncClient::connect(socket)
            .await?
            .subscribe(None, Filter::default())
            .await?;
        // Subscribed first: an end is either in the stream or found here.
        self.end_gone(socket).await?;
        while !self.no_lease() {
            let StreamMessage::Event(event) = subscription.next_item().await? else {
                continue;
            };
            let holder = (event.creator_uid, event.session.clone());
            match (event.kind, event.previous_session) {
                (EventKind::Ended, _) => self.end(&holder).await,
                (EventKind::Renamed, Some(previous)) => {
                    self.renamed((event.creator_uid, previous), holder)
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Revokes the leases of sessions that are not ACTIVE any more.
    async fn end_gone(&self, socket: &Path) -> Result<(), ClientError> {
        let holders: Vec<SessionKey> = (self.0.sessions.lock().unwrap_or_else(|e| e.into_inner()))
            .keys()
            .cloned()
            .collect();
        let mut local = AsyncClient::connect(socket).await?;
        for holder in holders {
            // Only root names another user's session; a user's daemon has its own only.
            let uid = rustix::process::geteuid().is_root().then_some(holder.0);
            let ended = match local.get(&holder.1, uid).await {
                Ok(session) => session.phase != Phase::Active,
                Err(e) if e.code() == Some(ErrorCode::NotFound) => true,
                Err(e) => return Err(e),
            };
            if ended {
                self.end(&holder).await;
            }
        }
        Ok(())
    }

    /// A renamed session keeps its lease.
    fn renamed(&self, from: SessionKey, to: SessionKey) {
        let mut sessions = self.0.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = sessions.remove(&from) {
            sessions.insert(to, h);
        }
    }
}

/// A grant that cannot be claimed: its key went with the session's lease (the session
/// ended, or etcd did not confirm the lease in time).
fn lease_lost(name: &str) -> ErrorBody {
    ErrorBody::new(
        ErrorCode::Internal,
        format!(
            "fleet lock {name:?}: the session's lease ended before the grant (its session \
             ended, or etcd did not confirm the lease in time)"
        ),
    )
}
