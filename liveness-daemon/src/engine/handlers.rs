//! Request handlers: register, rename, touch, end, get, status.

use std::collections::BTreeMap;
use std::os::fd::AsFd;

use crate::fdpass::Passed;

use crate::store::{Ending, NewSession, StoreError};
use liveness_common::identity::{Identity, ProcessKey};
use liveness_common::protocol::{
    ErrorBody, ErrorCode, OwnerSpec, PidOwner, PidfdOwner, Reply, Request,
};
use liveness_common::request;
use liveness_common::session::{EndReason, EventKind, OnEnd, Phase, Session, Survivors};
use liveness_common::status::{LimitsStatus, Status};
use liveness_proc::identity::IdentityError;

use super::auth::Caller;
use super::owner_checks::Requested;
use super::reaping::AskedPolicy;
use super::{Engine, now_ms, store_error};

impl Engine {
    pub(super) fn request(&mut self, caller: Caller, request: Request, fds: &[Passed]) -> Reply {
        let now = self.config.clock.now_ms();
        match request {
            Request::Register(request::Register {
                session,
                uid,
                owner,
                pending,
                labels,
                wrappers,
                on_end,
                grace_ms,
            }) => {
                let owner = Requested {
                    spec: owner,
                    wrappers,
                };
                let policy = AskedPolicy { on_end, grace_ms };
                self.register(
                    caller, session, uid, owner, fds, pending, labels, policy, now,
                )
            }
            Request::Rename(request::Rename { session, to, uid }) => {
                match self.addressed(caller, &session, uid) {
                    Err(error) => error.into(),
                    Ok(found) => match self.store.rename(found.creator_uid, &session, &to, now) {
                        Ok(event) => {
                            self.publish(vec![event]);
                            self.get_reply(found.creator_uid, &to)
                        }
                        Err(e) => store_error(e).into(),
                    },
                }
            }
            Request::Touch(request::Touch { session, uid }) => {
                match self.addressed(caller, &session, uid) {
                    Err(error) => error.into(),
                    Ok(found) => match self.store.touch(found.creator_uid, &session, now) {
                        Ok(()) => self.get_reply(found.creator_uid, &session),
                        Err(e) => store_error(e).into(),
                    },
                }
            }
            Request::Get(request::Get { session, uid }) => {
                match self.addressed(caller, &session, uid) {
                    Ok(found) => Reply::with_session(found),
                    Err(error) => error.into(),
                }
            }
            Request::Status(request::Status {}) => Reply {
                status: Some(Box::new(self.status())),
                ..Reply::ok()
            },
            Request::LockRelease(request::LockRelease { name, session, uid }) => {
                self.lock_release(caller, &name, &session, uid)
            }
            Request::Subscribe(request::Subscribe { .. })
            | Request::List(request::List { .. })
            | Request::LockList(request::LockList { .. })
            | Request::Processes(request::Processes { .. })
            | Request::Whose(request::Whose { .. })
            | Request::End(request::End { .. }) => Reply::error(
                ErrorCode::Internal,
                "subscribe, list, lock_list, processes, whose and end are handled by the connection",
            ),
            Request::LockAcquire(request::LockAcquire { .. }) => Reply::error(
                ErrorCode::Internal,
                "lock_acquire is handled with its reply channel, as it may wait",
            ),
        }
    }

    /// `end`: `survivors` were read off the engine from the tree of the root they name;
    /// should the session have another owner by now, they are read here.
    pub(super) fn end(
        &mut self,
        caller: Caller,
        session: &str,
        uid: Option<u32>,
        terminate: bool,
        survivors: Option<(ProcessKey, Survivors)>,
    ) -> Reply {
        let now = self.config.clock.now_ms();
        let existing = match self.addressed(caller, session, uid) {
            Ok(existing) => existing,
            Err(error) => return error.into(),
        };
        let survivors = match survivors {
            Some((root, survivors)) if root == existing.owner.key() => Some(survivors),
            _ => self.survivors_of([&existing.owner]).pop().flatten(),
        };
        let ending = Ending {
            survivors,
            terminate,
            ..Ending::because(EndReason::Stopped)
        };
        let ended = self
            .store
            .end(existing.creator_uid, session, None, &ending, now);
        match ended {
            Ok(events) if !events.is_empty() => {
                // A `terminate` policy reaps on publish already.
                let reap = (terminate && existing.on_end == OnEnd::Leave)
                    .then(|| events.iter().find(|e| e.kind == EventKind::Ended))
                    .flatten()
                    .cloned();
                self.publish(events);
                if let Some(ended) = reap {
                    self.start_reap(&ended);
                }
                self.unwatch_if_unused(&existing.owner);
                self.get_reply(existing.creator_uid, session)
            }
            Ok(_) => Reply::error(
                ErrorCode::AlreadyEnded,
                format!("session {session:?} has already ended"),
            ),
            Err(e) => store_error(e).into(),
        }
    }

    /// The session a request names (see [`Caller::namespace`]): a user's own of that id;
    /// for root, user `uid`'s, or without `uid` the one user's that has it (`ambiguous`
    /// when several have). Another user's id is simply not in a user's namespace, so
    /// nothing tells a user whether it exists.
    pub(super) fn addressed(
        &self,
        caller: Caller,
        id: &str,
        uid: Option<u32>,
    ) -> Result<Session, ErrorBody> {
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

    pub(super) fn get_reply(&self, uid: u32, id: &str) -> Reply {
        match self.store.get(uid, id) {
            Ok(Some(session)) => Reply::with_session(session),
            Ok(None) => store_error(StoreError::NotFound(id.to_owned())).into(),
            Err(e) => store_error(e).into(),
        }
    }

    /// The identity of the owner a client names. A pid is read in the client's PID
    /// namespace, a pidfd names its process directly; nothing is read in the daemon's
    /// namespace on the client's word.
    pub(super) fn resolve_owner(
        &self,
        caller: Caller,
        owner: Requested,
        fds: &[Passed],
    ) -> Result<Identity, ErrorBody> {
        let proc = &self.config.proc;
        let identity = match owner.spec {
            OwnerSpec::Auto(_) => {
                let mut wrappers = owner.wrappers;
                wrappers.extend(self.config.wrappers.iter().cloned());
                proc.resolve_owner(caller.pid, &wrappers)
                    .map_err(owner_error)?
            }
            OwnerSpec::Pid(PidOwner { pid }) => {
                proc.capture_for(caller.pid, pid).map_err(owner_error)?
            }
            OwnerSpec::Pidfd(PidfdOwner { pidfd }) => match fds.get(pidfd) {
                Some(Passed::Pidfd(fd)) => proc.capture_pidfd(fd.as_fd()).map_err(owner_error)?,
                Some(Passed::Refused(kind)) => {
                    return Err(ErrorBody::new(
                        ErrorCode::InvalidOwner,
                        format!(
                            "descriptor {pidfd} of the request line is a {kind}, not a pidfd: send one from pidfd_open(2)"
                        ),
                    ));
                }
                None => {
                    return Err(ErrorBody::new(
                        ErrorCode::InvalidRequest,
                        format!(
                            "the owner is descriptor {pidfd} of the request line, but {} came with it: send the pidfd with SCM_RIGHTS in the sendmsg that carries the line",
                            fds.len()
                        ),
                    ));
                }
            },
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
    pub(super) fn canonical(&self, identity: Identity) -> Result<Identity, ErrorBody> {
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
    pub(super) fn register(
        &mut self,
        caller: Caller,
        session: Option<String>,
        uid: Option<u32>,
        owner: Requested,
        fds: &[Passed],
        pending: bool,
        labels: BTreeMap<String, String>,
        policy: AskedPolicy,
        now: i64,
    ) -> Reply {
        let auto = matches!(owner.spec, OwnerSpec::Auto(_));
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
        let (on_end, grace_ms) = match policy.resolve() {
            Ok(resolved) => resolved,
            Err(error) => return error.into(),
        };
        let owner = match self.resolve_owner(caller, owner, fds) {
            Ok(owner) => owner,
            Err(error) => return error.into(),
        };
        let previous = match self.store.get(namespace, &id) {
            Ok(Some(existing)) => match policy.check_unchanged(&existing) {
                Ok(()) => Some(existing.owner),
                Err(error) => return error.into(),
            },
            Ok(None) => None,
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
            on_end,
            grace_ms,
        };
        let registered = match self.store.register(new, now) {
            Ok(registered) => registered,
            Err(e) => return store_error(self.store.explain(e)).into(),
        };
        self.publish(registered.event.into_iter().collect());
        if let Some(previous) = previous.filter(|p| !p.same_process(&owner)) {
            self.unwatch_if_unused(&previous);
        }
        let mut warnings = Vec::new();
        if auto && let Some(warning) = self.launcher_warning(&owner) {
            warnings.push(warning);
        }
        match self.watch(&owner, super::trees::Start::Registration) {
            Some(death) => {
                warnings.push(format!(
                    "the owner {}[{}] has already exited: the session ended at once",
                    owner.comm, owner.pid
                ));
                self.finalize(vec![death]);
            }
            None => self.fresh_owners.registered(owner.key(), now),
        }
        Reply {
            warnings,
            ..self.get_reply(namespace, &id)
        }
    }

    pub(super) fn status(&self) -> Status {
        Status {
            daemon: self.about.clone(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            head_seq: self.store.head_seq().unwrap_or_default(),
            store_id: self.store_id.clone(),
            active_sessions: self.store.count(Phase::Active).unwrap_or_default(),
            ended_sessions: self.store.count(Phase::Ended).unwrap_or_default(),
            subscribers: self.subscribers.iter().filter(|q| !q.is_closed()).count() as u64,
            uncommitted_deaths: self.uncommitted.deaths.len() as u64,
            monitor: self.monitor.status(),
            counters: self.counters.clone(),
            limits: LimitsStatus {
                connections: self.config.limits.status(),
                sessions: self.usage.status(),
            },
            membership: Some(self.membership.status(super::membership::REFRESH_PERIOD)),
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
