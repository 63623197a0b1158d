//! `lock_acquire` on a connection: the engine answers with the lock or a place in its
//! queue; a request that waits does so here. The uid's request turn is given back once
//! the engine has queued it (waiting holds up nothing of the engine's); the timeout runs
//! here; a client that closes its connection leaves the queue, and a grant that reaches it
//! after it gave up is given back, since nobody knows its token.

use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, watch};

use super::framing::Requests;
use super::stopping;
use crate::engine::{Acquire, Caller, Handle, Queued, stopping as shutting_down};
use liveness_common::lock::Lock;
use liveness_common::protocol::{ErrorBody, ErrorCode};
use liveness_common::request;

/// Acquires a lock for `caller`, waiting if the request says so. `None`: the client left
/// while waiting, and there is nobody to answer.
pub(super) async fn acquire(
    engine: &Handle,
    caller: Caller,
    request: request::LockAcquire,
    turn: Option<OwnedSemaphorePermit>,
    requests: &mut Requests,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Result<Lock, ErrorBody>> {
    let (name, timeout_ms) = (request.name.clone(), request.timeout_ms);
    let Queued { mut grant } = match engine.ask(caller, request).await {
        Ok(Acquire::Held(lock)) => return Some(Ok(lock)),
        Ok(Acquire::Queued(queued)) => queued,
        Err(error) => return Some(Err(error)),
    };
    drop(turn);
    let deadline = async {
        match timeout_ms {
            Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            None => std::future::pending().await,
        }
    };
    let client_left = tokio::select! {
        biased;
        granted = &mut grant => return Some(granted.unwrap_or_else(|_| Err(shutting_down()))),
        () = deadline => false,
        () = requests.closed() => true,
        () = stopping(shutdown) => false,
    };
    // No grant can arrive after this; one that arrived meanwhile is taken.
    grant.close();
    let granted = grant.try_recv().ok();
    if !client_left {
        return Some(granted.unwrap_or_else(|| match timeout_ms {
            Some(ms) if !*shutdown.borrow() => Err(ErrorBody::new(
                ErrorCode::LockHeld,
                format!("lock {name:?} is still held after waiting {ms} ms"),
            )),
            _ => Err(shutting_down()),
        }));
    }
    // Granted to a client that is gone: nobody knows the token, so it is given back.
    if let Some(Ok(lock)) = granted {
        let release = request::LockRelease {
            name: lock.name,
            session: lock.session,
            uid: Some(lock.uid),
        };
        let _ = engine.ask(caller, release).await;
    }
    None
}
