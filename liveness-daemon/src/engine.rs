//! The engine: one task that owns the store and the exit monitor.
//!
//! Everything that changes state happens here, in order: commit to SQLite, then publish
//! to subscribers, then reply. Because one task does both the committing and the
//! publishing, a subscriber registered at head `seq` H receives exactly the events after H
//! live, and replays the ones up to H from the store: no gap, no duplicate.
//!
//! Exit observations are handled before client commands (`biased` select), so no client,
//! however busy, delays a finalization; a burst of exits is committed in one transaction.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};

use crate::identity::{Identity, IdentityError, Liveness, ProcRoot, ProcessKey};
use crate::limits::{Limits, SessionUsage};
use crate::protocol::{
    ErrorBody, ErrorCode, OwnerSpec, PidOwner, PidfdOwner, Reply, Request, StreamMessage,
};
use crate::source::monitor::{Monitor, MonitorStatus};
use crate::source::{DetectedBy, ExitObservation};
use crate::store::{
    EndReason, Event, ListQuery, NewSession, OwnerDeath, Phase, Session, Store, StoreError,
};

/// Most exits committed in one transaction when they arrive together.
const MAX_BATCH: usize = 1024;
/// How often retention runs.
const PRUNE_PERIOD: Duration = Duration::from_secs(60);
/// How often deaths whose commit failed (a full disk, say) are committed again.
const RETRY_PERIOD: Duration = Duration::from_secs(1);
/// How often the database file is checked to still be the one opened.
const FILE_CHECK_PERIOD: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Sessions whose owner cannot be watched end after this long without `touch`.
    pub unknown_timeout: Duration,
    /// Pending sessions never renamed end after this long.
    pub pending_ttl: Duration,
    pub retain_events: u64,
    pub retain_age: Duration,
    /// Extra process names `owner: "auto"` skips.
    pub wrappers: Vec<String>,
    /// Commit batches queued per subscriber before it counts as lagging and is disconnected.
    pub subscriber_queue: usize,
    pub proc: ProcRoot,
    /// Connection limits, reported in status; the session limits come from their config.
    pub limits: Arc<Limits>,
}

/// A client, as `SO_PEERCRED` identifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    /// In the daemon's PID namespace; 0 when the client is not visible there.
    pub pid: u32,
}

impl Caller {
    fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Non-root callers see and change only the sessions they created.
    fn may_see(&self, session: &Session) -> bool {
        self.is_root() || session.creator_uid == self.uid
    }

    /// The creator filter for listings and streams: none for root.
    pub fn creator_filter(&self) -> Option<u32> {
        (!self.is_root()).then_some(self.uid)
    }

    /// The session-id namespace a request with this `uid` field addresses: a user's own
    /// always; for root, the user it names, or `None` (any user's) without one.
    pub fn namespace(&self, uid: Option<u32>) -> Result<Option<u32>, ErrorBody> {
        match uid {
            Some(uid) if !self.is_root() && uid != self.uid => Err(ErrorBody::new(
                ErrorCode::Forbidden,
                format!(
                    "only root may name another user's sessions with `uid` (you are uid {})",
                    self.uid
                ),
            )),
            Some(uid) => Ok(Some(uid)),
            None => Ok(self.creator_filter()),
        }
    }
}

/// An event as published live: the stream line, serialized once for every subscriber,
/// with what subscribers filter on.
#[derive(Debug)]
pub struct Published {
    pub seq: u64,
    pub session: String,
    pub creator_uid: u32,
    pub line: String,
}

/// The events of one commit. Queues hold batches, so a burst of deaths committed together
/// takes one slot: a subscriber is dropped for not reading, not for a burst.
pub type Batch = Arc<[Published]>;

/// A live subscription: batches after `head` arrive on `batches`; the events up to `head`
/// are in the store. `batches` closes when the subscriber lags or the engine stops.
#[derive(Debug)]
pub struct Subscription {
    pub head: u64,
    /// The store the seqs belong to.
    pub store_id: String,
    pub batches: mpsc::Receiver<Batch>,
}

/// What connections ask of the engine.
#[derive(Debug)]
pub enum Command {
    Request {
        caller: Caller,
        request: Request,
        /// Descriptors passed with the request line (a pidfd owner); closed when dropped.
        fds: Vec<OwnedFd>,
        reply: oneshot::Sender<Reply>,
    },
    Subscribe {
        reply: oneshot::Sender<Subscription>,
    },
}

/// This boot, and the host name as the daemon started under it (a label only).
#[derive(Debug, Clone)]
struct Local {
    boot_id: String,
    host: String,
}

/// Counters for status.
#[derive(Debug, Default, Serialize)]
struct Counters {
    finalized_by: BTreeMap<DetectedBy, u64>,
    lagged_subscribers: u64,
    largest_batch: usize,
    /// Commits of finalizations that failed and were retried.
    failed_commits: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot read this machine's identity: {0}")]
    Local(#[from] IdentityError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug)]
pub struct Engine {
    store: Store,
    monitor: Monitor,
    config: EngineConfig,
    local: Local,
    /// The store's identity, for status and subscriptions.
    store_id: String,
    /// Each subscriber's queue; the connection applies its own filter.
    subscribers: Vec<mpsc::Sender<Batch>>,
    /// Deaths observed but not yet committed because the store failed; retried every
    /// [`RETRY_PERIOD`]. The sources no longer report them, so they must not be dropped.
    uncommitted: Vec<OwnerDeath>,
    counters: Counters,
    /// Active sessions and label bytes per uid, for the registration limits.
    usage: SessionUsage,
    started: Instant,
    last_prune: Option<Instant>,
    /// Facts status reports about the daemon itself (paths, versions).
    about: serde_json::Value,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn ms_of(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn store_error(e: StoreError) -> ErrorBody {
    let code = match &e {
        StoreError::NotFound(_) => ErrorCode::NotFound,
        StoreError::AlreadyEnded(_) => ErrorCode::AlreadyEnded,
        StoreError::AlreadyExists(_) => ErrorCode::AlreadyExists,
        StoreError::NotPending(_) => ErrorCode::NotPending,
        StoreError::InvalidId(_) => ErrorCode::InvalidRequest,
        _ => ErrorCode::Internal,
    };
    if code == ErrorCode::Internal {
        tracing::error!(error = %e, "store failure");
    }
    ErrorBody::new(code, e.to_string())
}

impl Engine {
    pub fn new(
        store: Store,
        monitor: Monitor,
        config: EngineConfig,
        about: serde_json::Value,
    ) -> Result<Engine, EngineError> {
        // The sources match start times exactly: a daemon whose readings are a tick apart
        // from the kernel's would see every owner as already replaced.
        config.proc.exact_start_times()?;
        let local = Local {
            boot_id: config.proc.boot_id()?,
            host: config.proc.host()?,
        };
        let mut store = store;
        let store_id = store.store_id()?;
        let active = store.list(&ListQuery {
            phase: Some(Phase::Active),
            limit: usize::MAX,
            ..ListQuery::default()
        })?;
        let usage = SessionUsage::new(*config.limits.config(), active.sessions);
        if store.begin_run(&local.boot_id)? {
            tracing::warn!(
                jump = crate::store::SEQ_JUMP_AFTER_POWER_LOSS,
                "the last run, on another boot, did not stop cleanly: event seqs skip ahead so none is reused"
            );
        }
        Ok(Engine {
            store,
            monitor,
            config,
            local,
            store_id,
            subscribers: Vec::new(),
            uncommitted: Vec::new(),
            counters: Counters::default(),
            usage,
            started: Instant::now(),
            last_prune: None,
            about,
        })
    }

    /// Runs until `shutdown` turns true, then commits every exit already observed. Fails
    /// when the database file is deleted or replaced under it.
    pub async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), EngineError> {
        self.reconcile_at_start();
        // Expiry and retention are applied before the first client is served, so a replay
        // right after a start already sees the retention window.
        self.housekeeping();
        let period = self.housekeeping_period();
        let mut housekeeping =
            tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut retry = tokio::time::interval(RETRY_PERIOD);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut file_check = tokio::time::interval(FILE_CHECK_PERIOD);
        file_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let outcome = loop {
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => break Ok(()),
                observation = self.monitor.next() => self.finalize_observed(observation),
                command = commands.recv() => match command {
                    Some(command) => self.handle(command),
                    None => break Ok(()),
                },
                _ = retry.tick(), if !self.uncommitted.is_empty() => self.finalize(Vec::new()),
                _ = housekeeping.tick() => self.housekeeping(),
                _ = file_check.tick() => if let Err(e) = self.store.check_file() {
                    break Err(EngineError::Store(e));
                },
            }
        };
        // On failure nothing more is written to a file nobody will open again.
        outcome?;
        // In-flight exits are committed before the daemon goes away.
        while let Some(observation) = self.monitor.try_next() {
            self.finalize_observed(observation);
        }
        self.finalize(Vec::new());
        if !self.uncommitted.is_empty() {
            // Their sessions are still ACTIVE in the store: the next start reconciles them.
            tracing::error!(
                count = self.uncommitted.len(),
                "stopping with finalizations that could not be committed; the next start will reconcile them"
            );
        }
        if let Err(e) = self.store.end_run() {
            tracing::error!(error = %e, "cannot record the clean stop");
        }
        tracing::info!("engine stopped");
        Ok(())
    }

    fn housekeeping_period(&self) -> Duration {
        let shortest = self.config.unknown_timeout.min(self.config.pending_ttl);
        (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(30))
    }

    fn identity_of(&self, key: ProcessKey) -> Identity {
        Identity {
            pid: key.pid,
            start_ticks: key.start_ticks,
            boot_id: self.local.boot_id.clone(),
            host: self.local.host.clone(),
            pidfs_ino: None,
            comm: String::new(),
        }
    }

    /// Reconciles every ACTIVE owner after a start: those that died while the daemon was
    /// down are finalized (`detected_by: reconcile`), the rest are watched.
    fn reconcile_at_start(&mut self) {
        let owners = match self.store.active_owners() {
            Ok(owners) => owners,
            Err(e) => {
                tracing::error!(error = %e, "cannot list active owners; nothing reconciled");
                return;
            }
        };
        let count = owners.len();
        let mut dead = Vec::new();
        for owner in owners {
            if let Some(observation) = self.watch(&owner) {
                dead.push(observation);
            }
        }
        tracing::info!(
            owners = count,
            dead = dead.len(),
            "reconciled active sessions"
        );
        self.finalize(dead);
    }

    /// Starts watching an owner. Returns its death at once when it is already dead.
    ///
    /// The boot id decides: an owner of this boot is watched whatever host name it
    /// carries. An owner of an earlier boot of this machine (one a daemon ran on with this
    /// database, or for older records one with this host name) ended with that boot.
    /// Owners of other machines cannot be watched: only the inactivity timeout ends them.
    fn watch(&mut self, owner: &Identity) -> Option<OwnerDeath> {
        let dead = |reason| OwnerDeath {
            owner: owner.clone(),
            reason,
            exit: None,
            detected_by: DetectedBy::Reconcile,
            observed_ms: now_ms(),
            died_ms: None,
        };
        if owner.boot_id != self.local.boot_id {
            let earlier_boot_here = match self.store.is_known_boot(&owner.boot_id) {
                Ok(known) => known || owner.host == self.local.host,
                Err(e) => {
                    tracing::error!(error = %e, "cannot look up known boots");
                    false
                }
            };
            // The stored fingerprint names the earlier boot: end exactly that owner.
            return earlier_boot_here.then(|| dead(EndReason::Reboot));
        }
        // The sources key processes by pid and start time; where the pidfs inode is known,
        // a process that took the pid within the same tick is told apart here.
        if let Liveness::Dead(reason) = self.config.proc.check_process(owner.key(), owner.pidfs_ino)
        {
            return Some(dead(EndReason::from(reason)));
        }
        let death = self.monitor.track(owner.key())?;
        Some(self.death_of(&death))
    }

    /// The store's view of a death observed on this boot.
    fn death_of(&self, observation: &ExitObservation) -> OwnerDeath {
        OwnerDeath {
            owner: self.identity_of(observation.key),
            reason: EndReason::from(observation.reason),
            exit: observation.status,
            detected_by: observation.detected_by,
            observed_ms: ms_of(observation.at),
            died_ms: observation.died_at.map(ms_of),
        }
    }

    /// Stops watching an owner that no ACTIVE session refers to any more.
    fn unwatch_if_unused(&mut self, owner: &Identity) {
        if owner.boot_id != self.local.boot_id {
            return;
        }
        match self.store.active_sessions_of_owner(owner) {
            Ok(sessions) if sessions.is_empty() => self.monitor.untrack(owner.key()),
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "cannot look up sessions of an owner"),
        }
    }

    fn finalize_observed(&mut self, first: ExitObservation) {
        let mut batch = vec![self.death_of(&first)];
        while batch.len() < MAX_BATCH {
            match self.monitor.try_next() {
                Some(observation) => batch.push(self.death_of(&observation)),
                None => break,
            }
        }
        self.finalize(batch);
    }

    /// Ends every ACTIVE session owned by the dead processes, in one transaction, together
    /// with the deaths an earlier failed commit left over.
    fn finalize(&mut self, mut deaths: Vec<OwnerDeath>) {
        let retrying = !self.uncommitted.is_empty();
        // Older deaths first, so events keep the order in which deaths were seen.
        deaths.splice(0..0, self.uncommitted.drain(..));
        if deaths.is_empty() {
            return;
        }
        self.counters.largest_batch = self.counters.largest_batch.max(deaths.len());
        match self.store.end_many(&deaths, now_ms()) {
            Ok(events) => {
                if retrying {
                    tracing::info!(
                        count = deaths.len(),
                        "committed the finalizations that had failed"
                    );
                }
                for event in &events {
                    if let Some(by) = event.detected_by {
                        *self.counters.finalized_by.entry(by).or_default() += 1;
                    }
                }
                self.publish(events);
            }
            // Nothing is announced that was not committed. The deaths are kept and
            // committed again later; should the daemon stop first, their sessions are still
            // ACTIVE in the store and the next start's reconcile ends them.
            Err(e) => {
                let e = self.store.explain(e);
                if retrying {
                    tracing::debug!(error = %e, count = deaths.len(), "committing finalizations failed again");
                } else {
                    tracing::error!(error = %e, count = deaths.len(), "cannot commit finalizations; retrying every {RETRY_PERIOD:?}");
                }
                self.counters.failed_commits += 1;
                self.uncommitted = deaths;
            }
        }
    }

    /// Sends committed events, as one batch, to every subscriber. A subscriber whose queue
    /// is full is dropped; its connection tells it `lagged`.
    fn publish(&mut self, events: Vec<Event>) {
        let batch: Batch = events
            .into_iter()
            .filter_map(|event| {
                self.usage.apply(&event);
                let (seq, session, creator_uid) =
                    (event.seq, event.session.clone(), event.creator_uid);
                match serde_json::to_string(&StreamMessage::Event(Box::new(event))) {
                    Ok(line) => Some(Published {
                        seq,
                        session,
                        creator_uid,
                        line,
                    }),
                    Err(e) => {
                        tracing::error!(error = %e, seq, "cannot serialize event");
                        None
                    }
                }
            })
            .collect();
        let Some(last) = batch.last().map(|p| p.seq) else {
            return;
        };
        let before = self.subscribers.len();
        let counters = &mut self.counters;
        self.subscribers
            .retain(|queue| match queue.try_send(Arc::clone(&batch)) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    counters.lagged_subscribers += 1;
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
        if self.subscribers.len() < before {
            tracing::debug!(
                seq = last,
                dropped = before - self.subscribers.len(),
                "dropped lagging or closed subscribers"
            );
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Request {
                caller,
                request,
                fds,
                reply,
            } => {
                let answer = self.request(caller, request, &fds);
                // The client may have gone; its reply has nowhere to go.
                let _ = reply.send(answer);
            }
            Command::Subscribe { reply } => {
                let (queue, batches) = mpsc::channel(self.config.subscriber_queue);
                let head = match self.store.head_seq() {
                    Ok(head) => head,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read head seq");
                        return;
                    }
                };
                let subscription = Subscription {
                    head,
                    store_id: self.store_id.clone(),
                    batches,
                };
                if reply.send(subscription).is_ok() {
                    self.subscribers.push(queue);
                }
            }
        }
    }

    fn request(&mut self, caller: Caller, request: Request, fds: &[OwnedFd]) -> Reply {
        let now = now_ms();
        match request {
            Request::Register {
                session,
                uid,
                owner,
                pending,
                labels,
            } => self.register(caller, session, uid, owner, fds, pending, labels, now),
            Request::Rename { session, to, uid } => match self.addressed(caller, &session, uid) {
                Err(error) => error.into(),
                Ok(found) => match self.store.rename(found.creator_uid, &session, &to, now) {
                    Ok(event) => {
                        self.publish(vec![event]);
                        self.get_reply(found.creator_uid, &to)
                    }
                    Err(e) => store_error(e).into(),
                },
            },
            Request::Touch { session, uid } => match self.addressed(caller, &session, uid) {
                Err(error) => error.into(),
                Ok(found) => match self.store.touch(found.creator_uid, &session, now) {
                    Ok(()) => self.get_reply(found.creator_uid, &session),
                    Err(e) => store_error(e).into(),
                },
            },
            Request::End { session, uid } => match self.addressed(caller, &session, uid) {
                Err(error) => error.into(),
                Ok(existing) => {
                    let ended = self.store.end(
                        existing.creator_uid,
                        &session,
                        EndReason::Stopped,
                        None,
                        None,
                        None,
                        None,
                        now,
                    );
                    match ended {
                        Ok(Some(event)) => {
                            self.publish(vec![event]);
                            self.unwatch_if_unused(&existing.owner);
                            self.get_reply(existing.creator_uid, &session)
                        }
                        Ok(None) => Reply::error(
                            ErrorCode::AlreadyEnded,
                            format!("session {session:?} has already ended"),
                        ),
                        Err(e) => store_error(e).into(),
                    }
                }
            },
            Request::Get { session, uid } => match self.addressed(caller, &session, uid) {
                Ok(found) => Reply::with_session(found),
                Err(error) => error.into(),
            },
            Request::Whose { pid } => self.whose(caller, pid),
            Request::Status {} => Reply {
                status: Some(self.status()),
                ..Reply::ok()
            },
            Request::Subscribe { .. } | Request::List { .. } => Reply::error(
                ErrorCode::Internal,
                "subscribe and list are handled by the connection",
            ),
        }
    }

    /// The session a request names (see [`Caller::namespace`]): a user's own of that id;
    /// for root, user `uid`'s, or without `uid` the one user's that has it (`ambiguous`
    /// when several have). Another user's id is simply not in a user's namespace, so
    /// nothing tells a user whether it exists.
    fn addressed(&self, caller: Caller, id: &str, uid: Option<u32>) -> Result<Session, ErrorBody> {
        let not_found = || store_error(StoreError::NotFound(id.to_owned()));
        if let Some(uid) = caller.namespace(uid)? {
            return self
                .store
                .get(uid, id)
                .map_err(store_error)?
                .ok_or_else(not_found);
        }
        let mut found = self.store.find_any_user(id).map_err(store_error)?;
        match found.len() {
            0 => Err(not_found()),
            1 => Ok(found.remove(0)),
            _ => {
                let uids: Vec<String> = found.iter().map(|s| s.creator_uid.to_string()).collect();
                Err(ErrorBody::new(
                    ErrorCode::Ambiguous,
                    format!(
                        "session {id:?} exists for uids {}; name one with `uid` (--uid)",
                        uids.join(", ")
                    ),
                ))
            }
        }
    }

    fn get_reply(&self, uid: u32, id: &str) -> Reply {
        match self.store.get(uid, id) {
            Ok(Some(session)) => Reply::with_session(session),
            Ok(None) => store_error(StoreError::NotFound(id.to_owned())).into(),
            Err(e) => store_error(e).into(),
        }
    }

    /// The identity of the owner a client names. A pid is read in the client's PID
    /// namespace, a pidfd names its process directly; nothing is read in the daemon's
    /// namespace on the client's word.
    fn resolve_owner(
        &self,
        caller: Caller,
        owner: OwnerSpec,
        fds: &[OwnedFd],
    ) -> Result<Identity, ErrorBody> {
        let proc = &self.config.proc;
        let identity = match owner {
            OwnerSpec::Auto(_) => proc
                .resolve_owner(caller.pid, &self.config.wrappers)
                .map_err(owner_error)?,
            OwnerSpec::Pid(PidOwner { pid }) => {
                proc.capture_for(caller.pid, pid).map_err(owner_error)?
            }
            OwnerSpec::Pidfd(PidfdOwner { pidfd }) => {
                let Some(fd) = fds.get(pidfd) else {
                    return Err(ErrorBody::new(
                        ErrorCode::InvalidRequest,
                        format!(
                            "the owner is descriptor {pidfd} of the request line, but {} came with it: send the pidfd with SCM_RIGHTS in the sendmsg that carries the line",
                            fds.len()
                        ),
                    ));
                };
                proc.capture_pidfd(fd.as_fd()).map_err(owner_error)?
            }
            OwnerSpec::Identity(identity) if identity.boot_id == self.local.boot_id => {
                // Captured by the client (`liveness check`), so in its numbering, like
                // any pid it sends. One that is not found there stays as given: its start
                // time then tells whether it names a live process.
                let pid = proc
                    .translate_pid(caller.pid, identity.pid)
                    .unwrap_or(identity.pid);
                self.canonical(Identity { pid, ..identity })?
            }
            OwnerSpec::Identity(identity) => identity,
        };
        // Only root may attach sessions to other users' processes. A process that is gone
        // can no longer be checked, and its session ends at once anyway.
        if !caller.is_root() && identity.boot_id == self.local.boot_id {
            match self.config.proc.uid(identity.pid) {
                Ok(uid) if uid != caller.uid => {
                    return Err(ErrorBody::new(
                        ErrorCode::Forbidden,
                        format!(
                            "process {} belongs to uid {uid}, not to you (uid {})",
                            identity.pid, caller.uid
                        ),
                    ));
                }
                _ => {}
            }
        }
        Ok(identity)
    }

    /// An identity of this boot from a client, as the daemon reads it: a kernel thread is
    /// refused, and where the pidfs inode names the live process, the daemon's own reading
    /// of its start time is kept: a client in a time namespace whose offset is not whole
    /// ticks reads the start time as the kernel's count or one more. An identity of a
    /// process that is gone is kept as given: its session ends at once.
    fn canonical(&self, identity: Identity) -> Result<Identity, ErrorBody> {
        match self.config.proc.capture(identity.pid) {
            Ok(live)
                if live.pidfs_ino.is_some()
                    && live.pidfs_ino == identity.pidfs_ino
                    && identity.start_ticks == live.start_ticks + 1 =>
            {
                Ok(Identity {
                    host: identity.host,
                    ..live
                })
            }
            Err(e @ IdentityError::KernelThread { .. }) => Err(owner_error(e)),
            _ => Ok(identity),
        }
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "the fields of a register request, plus who sent it"
    )]
    fn register(
        &mut self,
        caller: Caller,
        session: Option<String>,
        uid: Option<u32>,
        owner: OwnerSpec,
        fds: &[OwnedFd],
        pending: bool,
        labels: BTreeMap<String, String>,
        now: i64,
    ) -> Reply {
        let id = match (session, pending) {
            (Some(id), _) => id,
            (None, true) => generate_pending_id(),
            (None, false) => {
                return Reply::error(
                    ErrorCode::InvalidRequest,
                    "`session` is required unless `pending` is true",
                );
            }
        };
        // Root registers in its own namespace unless it names a user's.
        let namespace = match caller.namespace(uid) {
            Ok(namespace) => namespace.unwrap_or(caller.uid),
            Err(error) => return error.into(),
        };
        let owner = match self.resolve_owner(caller, owner, fds) {
            Ok(owner) => owner,
            Err(error) => return error.into(),
        };
        let previous = match self.store.get(namespace, &id) {
            Ok(existing) => existing.map(|s| s.owner),
            Err(e) => return store_error(e).into(),
        };
        if previous.is_none()
            && let Err(refused) = self.usage.check(caller.uid, &labels)
        {
            return refused.into();
        }
        let new = NewSession {
            id: id.clone(),
            owner: owner.clone(),
            pending,
            pending_expires_ms: pending.then(|| now + self.config.pending_ttl.as_millis() as i64),
            creator_uid: namespace,
            labels,
        };
        let registered = match self.store.register(new, now) {
            Ok(registered) => registered,
            Err(e) => return store_error(self.store.explain(e)).into(),
        };
        self.publish(registered.event.into_iter().collect());
        if let Some(previous) = previous.filter(|p| !p.same_process(&owner)) {
            self.unwatch_if_unused(&previous);
        }
        if let Some(death) = self.watch(&owner) {
            self.finalize(vec![death]);
        }
        self.get_reply(namespace, &id)
    }

    /// Walks up from `pid` (or, for a thread id, its process) to the nearest process that
    /// owns an ACTIVE session. `pid` is read in the caller's PID namespace.
    fn whose(&self, caller: Caller, pid: u32) -> Reply {
        let local = match self.config.proc.translate_pid(caller.pid, pid) {
            Ok(local) => local,
            Err(e) => return Reply::error(ErrorCode::NotFound, e.to_string()),
        };
        let mut current = self.config.proc.tgid(local).unwrap_or(local);
        // Deep enough for any real process tree, bounded against a corrupt one.
        for _ in 0..256 {
            if current == 0 {
                break;
            }
            let stat = match self.config.proc.stat(current) {
                Ok(stat) => stat,
                Err(IdentityError::NoSuchProcess(p)) if p == local => {
                    return Reply::error(ErrorCode::NotFound, format!("no process with PID {pid}"));
                }
                Err(e) => return Reply::error(ErrorCode::NotFound, e.to_string()),
            };
            let owner = self.identity_of(ProcessKey {
                pid: current,
                start_ticks: stat.start_ticks,
            });
            match self.store.active_sessions_of_owner(&owner) {
                Ok(sessions) => {
                    if let Some(session) = sessions.into_iter().find(|s| caller.may_see(s)) {
                        // In the caller's namespace, like the pid it asked about.
                        let seen = self.config.proc.pid_seen_by(caller.pid, current);
                        return Reply {
                            owner_pid: Some(seen.unwrap_or(0)),
                            ..Reply::with_session(session)
                        };
                    }
                }
                Err(e) => return store_error(e).into(),
            }
            current = stat.ppid;
        }
        Reply::error(
            ErrorCode::NotFound,
            format!("no active session owns PID {pid} or any of its ancestors"),
        )
    }

    fn status(&self) -> serde_json::Value {
        let monitor: MonitorStatus = self.monitor.status();
        let active = self.store.count(Phase::Active).unwrap_or_default();
        serde_json::json!({
            "daemon": self.about,
            "uptime_ms": self.started.elapsed().as_millis() as u64,
            "head_seq": self.store.head_seq().unwrap_or_default(),
            "store_id": self.store_id,
            "active_sessions": active,
            "subscribers": self.subscribers.iter().filter(|q| !q.is_closed()).count(),
            "uncommitted_deaths": self.uncommitted.len(),
            "monitor": monitor,
            "counters": self.counters,
            "limits": {
                "connections": self.config.limits.status(),
                "sessions": self.usage.status(),
            },
        })
    }

    fn housekeeping(&mut self) {
        let now = now_ms();
        let mut ended = Vec::new();
        match self.store.expired_pending(now) {
            Ok(expired) => {
                for session in expired {
                    ended.push((session, EndReason::PendingExpired));
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot list expired pending sessions"),
        }
        let cutoff = now - self.config.unknown_timeout.as_millis() as i64;
        // Every owner of this boot is watched (the /proc poller takes what no other source
        // can), so it ends when it dies; only owners on other machines can time out.
        match self.store.idle_of_other_boots(cutoff, &self.local.boot_id) {
            Ok(idle) => ended.extend(idle.into_iter().map(|s| (s, EndReason::Timeout))),
            Err(e) => tracing::error!(error = %e, "cannot list idle sessions"),
        }
        for (session, reason) in ended {
            match self.store.end(
                session.creator_uid,
                &session.id,
                reason,
                None,
                None,
                None,
                Some(&session.owner),
                now,
            ) {
                Ok(Some(event)) => {
                    self.publish(vec![event]);
                    self.unwatch_if_unused(&session.owner);
                }
                Ok(None) => {}
                Err(e) => tracing::error!(error = %e, session = session.id, "cannot end session"),
            }
        }
        if self
            .last_prune
            .is_none_or(|at| at.elapsed() >= PRUNE_PERIOD)
        {
            self.last_prune = Some(Instant::now());
            let max_age = self.config.retain_age.as_millis() as i64;
            match self.store.prune(self.config.retain_events, max_age, now) {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "pruned events beyond retention"),
                Err(e) => tracing::error!(error = %e, "cannot prune events"),
            }
            // Ended sessions are kept for `get` as long as their events are.
            if let Err(e) = self.store.prune_sessions(now - max_age) {
                tracing::error!(error = %e, "cannot prune ended sessions");
            }
        }
    }
}

/// The reply to an owner that cannot be bound: `invalid_owner` for what can never be
/// watched as a process, `no_owner` for one that does not exist (for this client).
fn owner_error(e: IdentityError) -> ErrorBody {
    let code = match e {
        IdentityError::KernelThread { .. } | IdentityError::NotPidfd(_) => ErrorCode::InvalidOwner,
        _ => ErrorCode::NoOwner,
    };
    ErrorBody::new(code, e.to_string())
}

/// A fresh id for a pending session: random, so ids are never reused across restarts.
fn generate_pending_id() -> String {
    let mut bytes = [0u8; 8];
    if rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).is_err() {
        bytes = now_ms().to_le_bytes();
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("pending-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_names_another_users_namespace() {
        let user = Caller { uid: 1000, pid: 1 };
        let root = Caller { uid: 0, pid: 1 };
        assert_eq!(user.namespace(None), Ok(Some(1000)), "a user's own");
        assert_eq!(user.namespace(Some(1000)), Ok(Some(1000)));
        let refused = user.namespace(Some(2000)).unwrap_err();
        assert_eq!(refused.code, ErrorCode::Forbidden, "{}", refused.message);
        assert_eq!(root.namespace(Some(2000)), Ok(Some(2000)));
        assert_eq!(root.namespace(None), Ok(None), "root: any user's");
    }
}
