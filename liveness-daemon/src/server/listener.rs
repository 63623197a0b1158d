//! The listening socket: accepts connections, admits each under its uid's limits, and
//! gives it a task; root is always admitted, even when the daemon is out of file
//! descriptors (a spare one is kept for that). At shutdown every connection is told
//! `goodbye`, those still in the listen backlog too.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::connection::Connection;
use super::{Readers, goodbye, stopping};
use crate::engine::{Caller, Handle, Refusal};
use crate::fair::closer::Closer;
use crate::fair::limits::Limits;
use crate::fd::pass::close_connection;
use liveness_common::protocol::{ErrorBody, ErrorCode, Reply};
use liveness_common::status::Limit;

/// How long shutdown waits for connections to say goodbye.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// How long the accept loop waits, out of descriptors and without its reserve, before it
/// looks again.
const SPARE_RETRY: Duration = Duration::from_millis(10);
/// How long a connection found after running out of descriptors may take to be accepted.
const SPARE_ACCEPT: Duration = Duration::from_millis(100);
/// How often memory freed by closed connections is handed back to the system.
const TRIM_PERIOD: Duration = Duration::from_secs(5);

/// Serves clients until `shutdown` turns true, then says goodbye to each and returns.
pub async fn serve(
    listener: UnixListener,
    engine: Handle,
    readers: Readers,
    limits: Arc<Limits>,
    mut shutdown: watch::Receiver<bool>,
) {
    let closer = Closer::default();
    let mut connections = JoinSet::new();
    // Held so that, out of descriptors, closing it makes room to accept root.
    let spare = Spare::default();
    let mut trim = tokio::time::interval(TRIM_PERIOD);
    trim.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut closed_since_trim = false;
    loop {
        // Out of descriptors the reserve may not be back yet (another thread took the
        // descriptor it had freed): it is taken again before anyone is accepted with the
        // next descriptor that frees up.
        spare.refill();
        let accepted = tokio::select! {
            () = stopping(&mut shutdown) => break,
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => {
                closed_since_trim = true;
                continue;
            }
            _ = trim.tick(), if closed_since_trim => {
                give_back_memory();
                closed_since_trim = false;
                continue;
            }
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                let Some(reserve) = spare.take() else {
                    // Wait for a descriptor to free up rather than spin on the full table.
                    tokio::time::sleep(SPARE_RETRY).await;
                    continue;
                };
                drop(reserve);
                let Ok(Ok((stream, _))) =
                    tokio::time::timeout(SPARE_ACCEPT, listener.accept()).await
                else {
                    continue;
                };
                stream
            }
            // Connections aborted before they were accepted, and such: nothing to serve.
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let caller = peer(&stream);
        // Without a reserve (it went to this connection, or is not back yet) only root is
        // served: whoever else took the last descriptor would leave none for root.
        if !spare.refill() && caller.is_none_or(|caller| caller.uid != 0) {
            let uid = caller.map_or(u32::MAX, |caller| caller.uid);
            if caller.is_some() {
                limits.refused(Limit::FileDescriptors, uid);
            }
            let refusal = ErrorBody::new(
                ErrorCode::TooManyConnections,
                "the daemon is out of file descriptors; try again later",
            );
            refuse(stream, uid, &closer, refusal);
            // The descriptor its close frees becomes the reserve right there, on the
            // closing thread, before any other thread of the daemon can open it.
            closer.release_after(uid, Refill(spare.clone()));
            continue;
        }
        // An urgent byte (MSG_OOB) comes in line: out of line, a read would discard it,
        // and the descriptors sent with it would be released in that read, here.
        let _ = rustix::net::sockopt::set_socket_oobinline(&stream, true);
        let Some(caller) = caller else {
            continue;
        };
        let slot = match limits.admit(caller.uid) {
            Ok(slot) => slot,
            Err(refusal) => {
                refuse(stream, caller.uid, &closer, Refusal::from(refusal).into());
                continue;
            }
        };
        let connection = Connection {
            closer: closer.clone(),
            engine: engine.clone(),
            readers: readers.clone(),
            limits: Arc::clone(&limits),
            slot,
            shutdown: shutdown.clone(),
        };
        connections.spawn(connection.run(caller, stream));
    }
    say_goodbye_to_backlog(listener);
    let all_closed = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(CLOSE_GRACE, all_closed).await.is_err() {
        tracing::warn!(
            remaining = connections.len(),
            "closing connections that did not finish"
        );
        connections.shutdown().await;
    }
}

/// Clients that connected but were not accepted yet would see their connection reset when
/// the listener closes; they are accepted now and told `goodbye` like everyone else.
fn say_goodbye_to_backlog(listener: UnixListener) {
    // Serializing an enum holding a string cannot fail.
    let line = serde_json::to_string(&goodbye()).unwrap_or_default() + "\n";
    let listener = match listener.into_std() {
        Ok(listener) => listener,
        Err(e) => {
            tracing::warn!(error = %e, "cannot drain the listen backlog");
            return;
        }
    };
    // Tokio left the listener non-blocking, so this stops at the end of the backlog.
    while let Ok((mut stream, _)) = listener.accept() {
        // A new connection's send buffer is empty: one short line fits without blocking.
        if let Err(e) = std::io::Write::write_all(&mut stream, line.as_bytes()) {
            tracing::debug!(error = %e, "cannot say goodbye to a pending client");
        }
    }
}

/// Returns the free memory of every allocator arena to the system. Without it, the
/// buffers of a flood of connections stay in the process after they are freed (measured:
/// 2,000 connections with a 60 KB half line each left 140 MB behind).
fn give_back_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory; it is safe to call at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A descriptor kept in reserve (see [`serve`]), shared with the closing threads that free
/// the descriptors it is opened again with.
#[derive(Debug, Clone, Default)]
struct Spare(Arc<Mutex<Option<File>>>);

impl Spare {
    fn held(&self) -> MutexGuard<'_, Option<File>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens the reserve if it is not held; whether it is held now.
    fn refill(&self) -> bool {
        let mut held = self.held();
        if held.is_none() {
            *held = File::open("/dev/null").ok();
        }
        held.is_some()
    }

    fn take(&self) -> Option<File> {
        self.held().take()
    }
}

/// Opens the reserve again when dropped (after the closes queued before it).
struct Refill(Spare);

impl Drop for Refill {
    fn drop(&mut self) {
        self.0.refill();
    }
}

/// Who is at the other end, by `SO_PEERCRED`.
fn peer(stream: &UnixStream) -> Option<Caller> {
    match stream.peer_cred() {
        Ok(cred) => Some(Caller {
            uid: cred.uid(),
            gid: cred.gid(),
            pid: cred.pid().map_or(0, |p| p as u32),
        }),
        Err(e) => {
            tracing::warn!(error = %e, "cannot identify peer; closing");
            None
        }
    }
}

/// Tells a connection of `uid` that is not admitted why, without waiting for it, and closes
/// it, what it already sent going to the uid's closing thread.
fn refuse(stream: UnixStream, uid: u32, closer: &Closer, refusal: ErrorBody) {
    let line = serde_json::to_string(&Reply::from(refusal)).unwrap_or_default() + "\n";
    // A new connection's send buffer is empty: one short line fits without blocking.
    let _ = stream.try_write(line.as_bytes());
    if let Ok(stream) = stream.into_std() {
        close_connection(OwnedFd::from(stream), uid, closer);
    }
}
