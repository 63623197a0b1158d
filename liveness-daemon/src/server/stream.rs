//! A subscription: the connection turns into a stream. The events up to the head seq the
//! engine gave are replayed from a read-only store connection, then live events follow
//! from a bounded queue, both through the one filter the subscriber asked for. A stream
//! that cannot keep up is told `lagged` and closed, so it never slows the engine or
//! anyone else.

use std::path::Path;

use tokio::io::BufWriter;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::watch;

use super::framing::{ConnectionError, Line, Requests, write_json, write_lines};
use super::{goodbye, stopping};
use crate::engine::{Caller, Handle, Published, Subscribe, Subscription};
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
        let Subscription {
            head,
            store_id,
            mut batches,
        } = match engine.ask(caller, Subscribe).await {
            Ok(subscription) => subscription,
            Err(error) => return write_json(&mut write, &Reply { id, ..error.into() }).await,
        };
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

        let filter = EventFilter {
            session: wanted.session.as_deref(),
            creator_uid,
        };
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
        let mut last = head;

        loop {
            tokio::select! {
                batch = batches.recv() => match batch {
                    Some(batch) => {
                        let wanted = |p: &&Published| {
                            p.seq > last && filter.admits(&p.session, p.creator_uid)
                        };
                        let delivered: Vec<&str> = batch.iter().filter(wanted).map(|p| p.line.as_str()).collect();
                        write_lines(&mut write, &delivered).await?;
                        last = batch.iter().rfind(wanted).map_or(last, |p| p.seq);
                    }
                    // The engine dropped the queue: it was full, or the engine stopped.
                    None => {
                        let message = if *shutdown.borrow() {
                            goodbye()
                        } else {
                            StreamMessage::Lagged { last_delivered: last }
                        };
                        return write_json(&mut write, &message).await;
                    }
                },
                () = stopping(shutdown) => {
                    return write_json(&mut write, &goodbye()).await;
                }
                // A streaming client only closes; anything it sends is ignored.
                read = requests.skip() => {
                    if read? == Line::End {
                        return Ok(());
                    }
                }
            }
        }
    }
}
