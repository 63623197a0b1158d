//! A connection's request loop: each line parsed and routed once, to what the connection
//! serves itself (a subscription, reads off the engine, the wait for a lock) or to the
//! engine, in one of its uid's turns; the answer written back with the request's id.

use std::sync::Arc;

use tokio::io::BufWriter;
use tokio::net::UnixStream;
use tokio::sync::watch;

use super::framing::{ConnectionError, Line, Requests, write_json, write_lines};
use super::reads::Answer;
use super::reply::IntoReply;
use super::stream::Stream;
use super::{Readers, fleet, goodbye, locks, stopping};
use crate::cgroup::systemd::ScopeStart;
use crate::engine::{Ask, Caller, Command, Handle, Op, Register, Registered, ScopeFailed};
use crate::fair::closer::Closer;
use crate::fair::limits::{ConnectionSlot, Limits};
use liveness_common::protocol::{ErrorCode, MAX_LINE_BYTES, Reply, Request, parse_request};
use liveness_common::status::Limit;

/// Asks the engine `op`, and answers as the wire has it.
async fn ask<O: Op>(engine: &Handle, caller: Caller, op: O) -> Answer
where
    Command: From<Ask<O>>,
    O::Answer: IntoReply,
{
    engine.ask(caller, op).await.into()
}

/// Asks systemd for a registered session's scope, off the engine's thread. One that does
/// not start leaves the session without a cgroup: the engine clears the one it was stored
/// with, and the reply shows the session as written then.
async fn scope_started(
    engine: &Handle,
    caller: Caller,
    registered: &mut Registered,
    scope: ScopeStart,
) {
    let path = scope.expected().to_path_buf();
    match scope.run().await {
        Ok(warnings) => registered.warnings.extend(warnings),
        Err(warning) => {
            registered.warnings.push(warning);
            let session = &registered.session;
            let failed = ScopeFailed {
                uid: session.creator_uid,
                id: session.id.clone(),
                path,
            };
            match engine.ask(caller, failed).await {
                Ok(Some(session)) => registered.session = session,
                Ok(None) => registered.session.cgroup = None,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot clear the cgroup of a session whose scope did not start")
                }
            }
        }
    }
}

pub(super) struct Connection {
    /// Where the descriptors this connection's client passes are closed.
    pub(super) closer: Closer,
    pub(super) engine: Handle,
    pub(super) readers: Readers,
    pub(super) limits: Arc<Limits>,
    /// This connection's place under its uid's limits, freed when it closes.
    pub(super) slot: ConnectionSlot,
    pub(super) shutdown: watch::Receiver<bool>,
}

impl Connection {
    pub(super) async fn run(mut self, caller: Caller, stream: UnixStream) {
        match self.serve(caller, stream).await {
            Err(ConnectionError::LineTimeout) => {
                self.limits.refused(Limit::LineTimeout, caller.uid);
            }
            Err(e) => {
                tracing::debug!(uid = caller.uid, pid = caller.pid, error = %e, "connection closed");
            }
            Ok(()) => {}
        }
        // Its place counts against its uid until what it passed, or left queued, is closed.
        self.closer.release_after(caller.uid, self.slot);
    }

    async fn serve(&mut self, caller: Caller, stream: UnixStream) -> Result<(), ConnectionError> {
        let (read, write) = stream.into_split();
        let mut write = BufWriter::new(write);
        let mut requests = Requests::new(read, caller.uid, self.closer.clone());
        let line_timeout = self.limits.config().line_timeout;
        loop {
            let (read, fds) = tokio::select! {
                read = requests.next(line_timeout) => read?,
                () = stopping(&mut self.shutdown) => {
                    return write_json(&mut write, &goodbye()).await;
                }
            };
            let line = requests.line();
            let envelope = match read {
                Line::End => return Ok(()),
                Line::TooLong(length) => {
                    let reply = Reply::error(
                        ErrorCode::LineTooLong,
                        format!(
                            "request line of {length} bytes exceeds the limit of {MAX_LINE_BYTES}"
                        ),
                    );
                    write_json(&mut write, &reply).await?;
                    continue;
                }
                Line::Complete if line.iter().all(u8::is_ascii_whitespace) => continue,
                Line::Complete => match parse_request(line) {
                    Ok(envelope) => envelope,
                    Err(rejected) => {
                        write_json(&mut write, &Reply::from(rejected)).await?;
                        continue;
                    }
                },
            };
            let id = envelope.id;
            // Every request but a subscription is served in one of its uid's turns, held
            // until its reply is written (a lock's wait gives it back once queued).
            let mut turn = match &envelope.request {
                Request::Subscribe(_) | Request::FleetWatch(_) => None,
                _ => self.limits.request_turn(&self.slot).await,
            };
            let (engine, readers) = (&self.engine, &self.readers);
            let answer: Answer = match envelope.request {
                Request::Subscribe(request) => {
                    let stream = Stream {
                        engine,
                        database: &readers.database,
                        caller,
                        id,
                        wanted: request,
                    };
                    return stream.run(requests, write, &mut self.shutdown).await;
                }
                Request::FleetWatch(request) => {
                    let (fleet, shutdown) = (readers.fleet.as_ref(), &mut self.shutdown);
                    return fleet::follow(fleet, caller, id, request, requests, write, shutdown)
                        .await;
                }
                Request::Fleet(request) => {
                    (fleet::view(readers.fleet.as_ref(), caller, request).await).into()
                }
                Request::List(request) => readers.list(id.clone(), engine, caller, request).await,
                Request::LockList(request) => {
                    readers.lock_list(id.clone(), engine, caller, request).await
                }
                Request::Processes(request) => {
                    readers.processes(id.clone(), engine, caller, request).await
                }
                Request::Whose(request) => readers.whose(engine, caller, request).await.into(),
                Request::End(request) => readers.end(engine, caller, request).await.into(),
                Request::LockAcquire(request) if request.cluster => {
                    // Waiting holds up nothing of the engine's: the uid's turn is given back.
                    drop(turn.take());
                    let (fleet, shutdown) = (readers.fleet_locks.as_ref(), &mut self.shutdown);
                    let acquired = locks::acquire_in_fleet(
                        fleet, engine, caller, request, &requests, shutdown,
                    );
                    acquired.await.into()
                }
                Request::LockAcquire(request) => {
                    let (turn, shutdown) = (&mut turn, &mut self.shutdown);
                    let acquired =
                        locks::acquire(engine, caller, request, turn, &mut requests, shutdown);
                    match acquired.await {
                        Some(acquired) => acquired.into(),
                        None => return Ok(()),
                    }
                }
                Request::Register(request) => {
                    let register = Register { request, fds };
                    let mut registered = engine.ask(caller, register).await;
                    // systemd is asked here, off the engine's thread; the reply waits for
                    // the scope, so the owner runs in it before its caller is told.
                    if let Ok(registered) = &mut registered {
                        if let Some(scope) = registered.scope.take() {
                            scope_started(engine, caller, registered, scope).await;
                        }
                        // A scope that did not start left the session without a cgroup.
                        if let Some(enclosure) = registered.enclosure.take()
                            && registered.session.cgroup.is_some()
                        {
                            let session = &registered.session;
                            let moved = readers.enclose(engine, caller, session, enclosure);
                            registered.warnings.extend(moved.await);
                        }
                    }
                    registered.into()
                }
                Request::Rename(request) => ask(engine, caller, request).await,
                Request::Touch(request) => ask(engine, caller, request).await,
                Request::Get(request) => {
                    let mut answer = engine.ask(caller, request).await;
                    if let Ok(session) = &mut answer {
                        readers.activities.fill(session);
                    }
                    answer.into()
                }
                Request::Status(request) => {
                    let status = engine.ask(caller, request).await;
                    status
                        .map(|mut status| {
                            status.activity = readers.activities.counts();
                            status.cluster =
                                (readers.cluster.as_ref()).map(|view| view.status(status.head_seq));
                            status
                        })
                        .into()
                }
                Request::LockRelease(request) if request.cluster => {
                    let fleet = readers.fleet_locks.as_ref();
                    locks::release_in_fleet(fleet, engine, caller, request)
                        .await
                        .into()
                }
                Request::LockRelease(request) => ask(engine, caller, request).await,
                Request::ActionsDone(request) => ask(engine, caller, request).await,
            };
            let answer = match answer {
                Answer::Reply(reply) => Answer::Reply(Box::new(Reply { id, ..*reply })),
                line => line,
            };
            match answer {
                Answer::Reply(reply) => write_json(&mut write, &reply).await?,
                Answer::Line(line) => write_lines(&mut write, &[line]).await?,
            }
        }
    }
}
