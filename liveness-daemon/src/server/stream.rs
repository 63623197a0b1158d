//! A subscription: the connection turns into a stream. The events up to the head seq the
//! engine gave are replayed from a read-only store connection; then the engine writes live
//! events to the socket itself (see [`crate::engine::Outbox`]), and the connection only
//! writes what the socket did not take at once. Both go through the one filter the
//! subscriber asked for. A stream that cannot keep up is told `lagged` and closed, so it
//! never slows the engine or anyone else.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use tokio::io::unix::AsyncFd;
use tokio::io::{BufWriter, Interest};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::watch;
use tokio::time::Instant;

use super::framing::{ConnectionError, Line, Requests, WRITE_TIMEOUT, write_json, write_lines};
use super::{goodbye, stopping};
use crate::deadline::sleep_until;
use crate::engine::{Caller, Ended, Flushed, Handle, Outbox, Subscribe, Subscription};
use crate::fd::registered::register;
use crate::store::{EventFilter, EventReader, Lineage};
use liveness_common::protocol::{Reply, StreamMessage, Subscribed};
use liveness_common::request;

/// Events replayed per store read.
const REPLAY_PAGE: usize = 512;
/// Write buffer of a stream: a burst of a thousand ended sessions is about 450 KiB of lines,
/// which the default 8 KiB would write in fifty-odd system calls.
const STREAM_BUFFER: usize = 64 * 1024;

/// A `subscribe` request on its connection.
#[derive(Debug)]
pub(super) struct Stream<'a> {
    pub(super) engine: &'a Handle,
    /// The database replayed from.
    pub(super) database: &'a Path,
    pub(super) caller: Caller,
    /// The request's id, for the acknowledgement.
    pub(super) id: Option<serde_json::Value>,
    pub(super) wanted: request::Subscribe,
}

/// Whether a subscriber's cursor is void here: it is above the head, it names another
/// store, or a run that did not give out its seq here (see [`Lineage::holds`]). Each means
/// the database was replaced or restored from an older copy, and skipping every seq up to
/// the cursor would lose events.
fn reset(wanted: &request::Subscribe, head: u64, lineage: &Lineage) -> bool {
    wanted.since.is_some_and(|since| {
        since > head || (wanted.store_id.as_deref()).is_some_and(|id| !lineage.holds(id, since))
    })
}

impl Stream<'_> {
    /// Streams until the client leaves, lags, or the daemon stops. Every reply before
    /// the subscription was flushed from `write`.
    pub(super) async fn run(
        self,
        mut requests: Requests,
        write: BufWriter<OwnedWriteHalf>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), ConnectionError> {
        let Stream {
            engine,
            database,
            caller,
            id,
            wanted,
        } = self;
        // The buffer being replaced is empty.
        let mut write = BufWriter::with_capacity(STREAM_BUFFER, write.into_inner());
        let creator_uid = match caller.namespace(wanted.uid) {
            Ok(creator_uid) => creator_uid,
            Err(error) => return write_json(&mut write, &Reply { id, ..error.into() }).await,
        };
        let filter = EventFilter {
            session: wanted.session.clone(),
            creator_uid,
        };
        let socket = write.get_ref().as_ref().as_fd().try_clone_to_owned()?;
        let subscribe = Subscribe {
            socket,
            filter: filter.clone(),
        };
        let Subscription {
            head,
            lineage,
            outbox,
        } = match engine.ask(caller, subscribe).await {
            Ok(subscription) => subscription,
            Err(error) => return write_json(&mut write, &Reply { id, ..error.into() }).await,
        };
        // However this ends, the engine stops writing to the socket and lets it go.
        let _closed = HangUpOnDrop(&outbox);
        let reset = reset(&wanted, head, &lineage);
        let store_id = lineage.id();
        // Without `since`, the stream starts now: nothing is replayed. After a reset,
        // everything is.
        let since = match (reset, wanted.since) {
            (true, _) => 0,
            (false, since) => since.unwrap_or(head),
        };
        let ack = Reply {
            id,
            subscribed: Some(Subscribed {
                since,
                head,
                store_id: store_id.clone(),
            }),
            ..Reply::ok()
        };
        write_json(&mut write, &ack).await?;
        if reset {
            let message = StreamMessage::Reset {
                since: wanted.since.unwrap_or_default(),
                head,
                store_id,
            };
            write_json(&mut write, &message).await?;
        }

        if since < head {
            let store = EventReader::open(database).map_err(std::io::Error::other)?;
            let mut after = Some(since);
            while let Some(from) = after {
                let page = store
                    .replay(from, head, &filter, REPLAY_PAGE)
                    .map_err(std::io::Error::other)?;
                write_lines(&mut write, &page.lines).await?;
                after = page.next;
            }
        }
        let socket = requests.read_only(write.into_inner())?;
        outbox.go_live(head);
        live(&outbox, socket, requests, shutdown).await
    }
}

/// Ends the subscription when the stream's task ends, whichever way.
struct HangUpOnDrop<'a>(&'a Outbox);

impl Drop for HangUpOnDrop<'_> {
    fn drop(&mut self) {
        self.0.hang_up();
    }
}

/// The live part of a stream: writes what the socket did not take from the engine, until
/// the client leaves, lags, or the daemon stops. The connection waits for room to write
/// only while lines wait (see [`Requests::read_only`]): a subscriber that keeps up never
/// wakes it. Once the subscription has ended (lagged, or the daemon stopping), what it
/// still owes, a line begun included, is written within [`WRITE_TIMEOUT`] or the
/// connection is dropped: a client that stops reading holds it no longer.
async fn live(
    outbox: &Outbox,
    socket: OwnedFd,
    mut requests: Requests,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    let mut room: Option<AsyncFd<OwnedFd>> = None;
    let mut closing = false;
    let mut owed_by: Option<Instant> = None;
    loop {
        let flushed = tokio::select! {
            // Also while the socket is full: the engine ending the subscription as lagged
            // says so only through this wake.
            () = outbox.wait() => outbox.flush(),
            flushed = flush_with_room(outbox, room.as_ref()) => flushed?,
            () = stopping(shutdown), if !closing => {
                outbox.close();
                closing = true;
                outbox.flush()
            }
            () = sleep_until(owed_by) => {
                return Err(ConnectionError::WriteTimeout);
            }
            // A streaming client only closes; anything it sends is ignored.
            read = requests.skip() => if read? == Line::End {
                return Ok(());
            } else {
                continue;
            },
        };
        match flushed {
            Flushed::Done => room = None,
            Flushed::More => {
                if room.is_none() {
                    let fd = socket.try_clone()?;
                    room = Some(register(fd, Interest::WRITABLE).map_err(|e| e.into_parts().1)?);
                }
                if owed_by.is_none() && !outbox.is_open() {
                    owed_by = Some(Instant::now() + WRITE_TIMEOUT);
                }
            }
            Flushed::Ended(Ended::Gone) => return Ok(()),
            Flushed::Ended(Ended::Closed) => return write_last(socket, &goodbye()).await,
            Flushed::Ended(Ended::Lagged) => {
                let last_delivered = outbox.delivered();
                let lagged = StreamMessage::Lagged { last_delivered };
                return write_last(socket, &lagged).await;
            }
        }
    }
}

/// Writes what is queued each time the socket has room, until it takes it all or the
/// subscription ends; never resolves without `room`.
async fn flush_with_room(
    outbox: &Outbox,
    room: Option<&AsyncFd<OwnedFd>>,
) -> std::io::Result<Flushed> {
    let Some(room) = room else {
        return std::future::pending().await;
    };
    loop {
        let mut ready = room.writable().await?;
        // A full socket clears the readiness.
        if let Ok(flushed) = ready.try_io(|_| match outbox.flush() {
            Flushed::More => Err(std::io::ErrorKind::WouldBlock.into()),
            flushed => Ok(flushed),
        }) {
            return flushed;
        }
    }
}

/// The stream's last line, within [`WRITE_TIMEOUT`].
async fn write_last(
    socket: OwnedFd,
    message: &impl serde::Serialize,
) -> Result<(), ConnectionError> {
    let socket = std::os::unix::net::UnixStream::from(socket);
    socket.set_nonblocking(true)?;
    write_json(&mut UnixStream::from_std(socket)?, message).await
}
