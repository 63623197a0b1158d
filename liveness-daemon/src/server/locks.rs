//! `lock_acquire` on a connection: the engine answers with the lock or a place in its
//! queue; a request that waits does so here. The uid's request turn is given back once
//! the engine has queued it (waiting holds up nothing of the engine's); the timeout runs
//! here; a client that closes its connection leaves the queue, and a grant that reaches it
//! after it gave up is given back, since nobody knows its token.

use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, watch};

use super::framing::Requests;
use super::stopping;
use crate::engine::{Acquire, Caller, Handle, Queued, Refusal};
use crate::fleet::FleetLocks;
use liveness_common::lock::Lock;
use liveness_common::protocol::{ErrorBody, ErrorCode};
use liveness_common::request;

/// Acquires a lock for `caller`, waiting if the request says so; a request that waits gives
/// its uid's `turn` back once it is queued. `None`: the client left while waiting, and there
/// is nobody to answer.
pub(super) async fn acquire(
    engine: &Handle,
    caller: Caller,
    request: request::LockAcquire,
    turn: &mut Option<OwnedSemaphorePermit>,
    requests: &mut Requests,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Result<Lock, ErrorBody>> {
    let (name, timeout_ms) = (request.name.clone(), request.timeout_ms);
    let Queued { mut grant } = match engine.ask(caller, request).await {
        Ok(Acquire::Held(lock)) => return Some(Ok(lock)),
        Ok(Acquire::Queued(queued)) => queued,
        Err(refusal) => return Some(Err(refusal.into())),
    };
    drop(turn.take());
    let deadline = async {
        match timeout_ms {
            Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            None => std::future::pending().await,
        }
    };
    let client_left = tokio::select! {
        biased;
        granted = &mut grant => {
            return Some(granted.unwrap_or(Err(Refusal::Stopping)).map_err(ErrorBody::from));
        }
        () = deadline => false,
        () = requests.closed() => true,
        () = stopping(shutdown) => false,
    };
    // No grant can arrive after this; one that arrived meanwhile is taken.
    grant.close();
    let granted = grant.try_recv().ok();
    if !client_left {
        return Some(match (granted, timeout_ms) {
            (Some(granted), _) => granted.map_err(ErrorBody::from),
            (None, Some(ms)) if !*shutdown.borrow() => Err(ErrorBody::new(
                ErrorCode::LockHeld,
                format!("lock {name:?} is still held after waiting {ms} ms"),
            )),
            (None, _) => Err(Refusal::Stopping.into()),
        });
    }
    // Granted to a client that is gone: nobody knows the token, so it is given back.
    if let Some(Ok(lock)) = granted {
        let release = request::LockRelease {
            name: lock.name,
            session: lock.session,
            uid: Some(lock.uid),
            cluster: false,
        };
        let _ = engine.ask(caller, release).await;
    }
    None
}

/// A fleet lock for `caller` (`cluster`), which etcd holds (see [`crate::fleet::FleetLocks`]).
pub(super) async fn acquire_in_fleet(
    fleet: Option<&FleetLocks>,
    engine: &Handle,
    caller: Caller,
    request: request::LockAcquire,
    requests: &Requests,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Lock, ErrorBody> {
    // Nobody to answer once the client left: whatever is answered then is not read.
    let abandon = async {
        tokio::select! {
            () = requests.closed() => {}
            () = stopping(shutdown) => {}
        }
        ErrorBody::from(Refusal::Stopping)
    };
    in_fleet(fleet)?
        .acquire(engine, caller, request, abandon)
        .await
}

/// Releases a fleet lock (`cluster`).
pub(super) async fn release_in_fleet(
    fleet: Option<&FleetLocks>,
    engine: &Handle,
    caller: Caller,
    request: request::LockRelease,
) -> Result<Lock, ErrorBody> {
    in_fleet(fleet)?.release(engine, caller, request).await
}

fn in_fleet(fleet: Option<&FleetLocks>) -> Result<&FleetLocks, ErrorBody> {
    fleet.ok_or_else(|| {
        ErrorBody::new(
            ErrorCode::InvalidRequest,
            "fleet locks (`cluster`) need a daemon in a fleet: this livenessd runs without \
             --etcd",
        )
    })
}

#[cfg(test)]
mod tests {
    use tokio::net::UnixStream;
    use tokio::sync::{mpsc, oneshot};
    use tokio::time::Instant;

    use super::*;
    use crate::engine::Command;
    use crate::fair::closer::Closer;

    const ALICE: Caller = Caller {
        uid: 1000,
        gid: 1000,
        pid: 10,
    };

    /// What the test's engine was asked to do after queueing the request.
    #[derive(Debug)]
    enum Asked {
        /// The queued request's grant goes here.
        Queued(oneshot::Sender<Result<Lock, Refusal>>),
        /// A lock given back.
        Release,
    }

    /// A client's connection, waiting for locks of an engine that queues every request.
    struct Waiting {
        engine: Handle,
        requests: Requests,
        shutdown: watch::Receiver<bool>,
        _stop: watch::Sender<bool>,
    }

    impl Waiting {
        /// The connection, what the engine was asked, and the client's end of the socket.
        fn new() -> (Waiting, mpsc::UnboundedReceiver<Asked>, UnixStream) {
            let (commands, mut queue) = mpsc::channel(8);
            let (asked, answered) = mpsc::unbounded_channel();
            tokio::spawn(async move {
                while let Some(command) = queue.recv().await {
                    match command {
                        Command::LockAcquire(ask) => {
                            let (grant_tx, grant) = oneshot::channel();
                            let _ = ask.reply.send(Ok(Acquire::Queued(Queued { grant })));
                            let _ = asked.send(Asked::Queued(grant_tx));
                        }
                        Command::LockRelease(_) => {
                            let _ = asked.send(Asked::Release);
                        }
                        other => panic!("not asked of a waiting lock: {other:?}"),
                    }
                }
            });
            let (client, server) = UnixStream::pair().unwrap();
            let (read, _) = server.into_split();
            let (stop, shutdown) = watch::channel(false);
            let waiting = Waiting {
                engine: Handle::new(commands),
                requests: Requests::new(read, ALICE.uid, Closer::default()),
                shutdown,
                _stop: stop,
            };
            (waiting, answered, client)
        }

        async fn acquire(&mut self, timeout_ms: Option<u64>) -> Option<Result<Lock, ErrorBody>> {
            let request = request::LockAcquire {
                name: "build".into(),
                session: "s".into(),
                uid: None,
                wait: true,
                timeout_ms,
                cluster: false,
            };
            let (requests, shutdown) = (&mut self.requests, &mut self.shutdown);
            acquire(&self.engine, ALICE, request, &mut None, requests, shutdown).await
        }
    }

    /// The grant of the request the engine queued next.
    async fn queued(
        asked: &mut mpsc::UnboundedReceiver<Asked>,
    ) -> oneshot::Sender<Result<Lock, Refusal>> {
        match asked.recv().await {
            Some(Asked::Queued(grant)) => grant,
            other => panic!("the request was queued, not {other:?}"),
        }
    }

    fn lock() -> Lock {
        Lock {
            name: "build".into(),
            uid: ALICE.uid,
            session: "s".into(),
            token: 7,
            since_ms: 1,
            waiters: 0,
            cluster: false,
            host: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_gives_up_at_its_timeout_and_leaves_the_queue() {
        let (mut waiting, mut asked, _client) = Waiting::new();
        let started = Instant::now();
        let outcome = waiting.acquire(Some(800)).await;
        let error = outcome.expect("an answer").expect_err("no lock");
        assert_eq!(error.code, ErrorCode::LockHeld, "{}", error.message);
        assert!(error.message.contains("800 ms"), "{}", error.message);
        assert_eq!(started.elapsed(), Duration::from_millis(800));
        assert!(
            queued(&mut asked).await.is_closed(),
            "the waiter left the queue"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_reaches_the_waiter_and_a_hang_up_leaves_the_queue() {
        let (mut waiting, mut asked, client) = Waiting::new();
        let grant = async {
            let grant = queued(&mut asked).await;
            tokio::time::sleep(Duration::from_secs(3600)).await;
            grant.send(Ok(lock())).unwrap();
        };
        let (granted, ()) = tokio::join!(waiting.acquire(None), grant);
        assert_eq!(granted.expect("an answer").expect("the lock"), lock());

        let hang_up = async {
            let grant = queued(&mut asked).await;
            drop(client);
            grant
        };
        let (left, grant) = tokio::join!(waiting.acquire(None), hang_up);
        assert!(left.is_none(), "nobody to answer: {left:?}");
        assert!(grant.is_closed(), "the waiter left the queue");
        assert!(
            asked.try_recv().is_err(),
            "nothing granted, nothing given back"
        );
    }
}
