//! A subscription: the connection turns into a stream. The events up to the head seq the
//! engine gave are replayed from a read-only store connection; then the engine writes live
//! events to the socket itself (see [`crate::engine::Outbox`]), and the connection only
//! writes what the socket did not take at once. Both go through the one filter the
//! subscriber asked for. A stream that cannot keep up is told `lagged` and closed, so it
//! never slows the engine or anyone else.

use std::os::fd::AsFd;
use std::path::Path;

use tokio::io::{BufWriter, Interest};
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::watch;

use super::framing::{ConnectionError, Line, Requests, WRITE_TIMEOUT, write_json, write_lines};
use super::{goodbye, stopping};
use crate::engine::{Caller, Ended, Flushed, Handle, Outbox, Subscribe, Subscription};
use crate::store::{EventFilter, EventReader};
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

/// Whether a subscriber's cursor is void here: it is above the head, or it names another
/// store. Seqs are never reused within one store, so either means the database was
/// replaced, and skipping every seq up to the cursor would lose events.
fn reset(wanted: &request::Subscribe, head: u64, store_id: &str) -> bool {
    wanted.since.is_some_and(|since| {
        since > head || wanted.store_id.as_deref().is_some_and(|id| id != store_id)
    })
}

impl Stream<'_> {
    /// Streams until the client leaves, lags, or the daemon stops. Every reply before
    /// the subscription was flushed from `write`.
    pub(super) async fn run(
        self,
        requests: Requests,
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
            store_id,
            outbox,
        } = match engine.ask(caller, subscribe).await {
            Ok(subscription) => subscription,
            Err(error) => return write_json(&mut write, &Reply { id, ..error.into() }).await,
        };
        // However this ends, the engine stops writing to the socket.
        let _closed = CloseOnDrop(&outbox);
        let reset = reset(&wanted, head, &store_id);
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
        outbox.go_live(head);
        live(&outbox, &mut write, requests, shutdown).await
    }
}

/// Ends the subscription when the stream's task ends, whichever way.
struct CloseOnDrop<'a>(&'a Outbox);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// The live part of a stream: writes what the socket did not take from the engine, until
/// the client leaves, lags, or the daemon stops.
async fn live(
    outbox: &Outbox,
    write: &mut BufWriter<OwnedWriteHalf>,
    mut requests: Requests,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    let (mut pending, mut closing) = (false, false);
    loop {
        tokio::select! {
            () = outbox.wait(), if !pending => {}
            writable = write.get_ref().as_ref().writable(), if pending => writable?,
            () = stopping(shutdown), if !closing => {
                outbox.close();
                closing = true;
            }
            // Stopping, what is queued is written before the goodbye, unless the client
            // does not read it in time.
            () = tokio::time::sleep(WRITE_TIMEOUT), if closing && pending => {
                return Err(ConnectionError::WriteTimeout);
            }
            // A streaming client only closes; anything it sends is ignored.
            read = requests.skip() => if read? == Line::End {
                return Ok(());
            },
        }
        // Through tokio, so that a full socket clears its readiness.
        let flushed =
            write
                .get_ref()
                .as_ref()
                .try_io(Interest::WRITABLE, || match outbox.flush() {
                    Flushed::More => Err(std::io::ErrorKind::WouldBlock.into()),
                    flushed => Ok(flushed),
                });
        pending = match flushed {
            Ok(Flushed::Done) => false,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => true,
            Err(e) => return Err(e.into()),
            Ok(Flushed::More) => true,
            Ok(Flushed::Ended(Ended::Gone)) => return Ok(()),
            Ok(Flushed::Ended(Ended::Closed)) => return write_json(write, &goodbye()).await,
            Ok(Flushed::Ended(Ended::Lagged)) => {
                let last_delivered = outbox.delivered();
                return write_json(write, &StreamMessage::Lagged { last_delivered }).await;
            }
        };
    }
}
