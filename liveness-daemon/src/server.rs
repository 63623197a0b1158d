//! The Unix socket server: one task per connection, all owned by a `JoinSet`.
//!
//! A connection reads request lines (bounded by [`MAX_LINE_BYTES`]), identifies its peer
//! by `SO_PEERCRED`, and asks the engine. A `subscribe` turns the connection into a
//! stream: replay from a read-only store connection up to the head seq the engine gave,
//! then live events from a bounded queue. A stream that cannot keep up is told `lagged`
//! and closed, so it never slows the engine or anyone else.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;

use crate::engine::{Caller, Command, Published, Subscription};
use crate::protocol::{
    ErrorCode, MAX_LINE_BYTES, Reply, Request, StreamMessage, Subscribed, parse_request,
};
use crate::store::{EventFilter, EventPage, EventReader, StoredEvent};

/// A client that does not take a line within this long is disconnected.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Events replayed per store read.
const REPLAY_PAGE: usize = 512;
/// How long shutdown waits for connections to say goodbye.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Write buffer of a stream: a burst of a thousand ended sessions is about 450 KiB of lines,
/// which the default 8 KiB would write in fifty-odd system calls.
const STREAM_BUFFER: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("client write timed out")]
    WriteTimeout,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Serves clients until `shutdown` turns true, then says goodbye to each and returns.
pub async fn serve(
    listener: UnixListener,
    engine: mpsc::Sender<Command>,
    database: PathBuf,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = stopping(&mut shutdown) => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let connection = Connection {
                        engine: engine.clone(),
                        database: database.clone(),
                        shutdown: shutdown.clone(),
                    };
                    connections.spawn(connection.run(stream));
                }
                // EMFILE and friends pass; a short pause keeps a storm from spinning.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
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

/// What every connection is told when the daemon stops.
fn goodbye() -> StreamMessage {
    StreamMessage::Goodbye {
        reason: "shutdown".into(),
    }
}

/// What [`read_line_bounded`] found.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// A line (with its newline, unless the input ended without one) is in the buffer.
    Complete,
    /// A line of this many bytes exceeded the limit; it was consumed and dropped.
    TooLong(usize),
    /// The client closed its side.
    End,
}

/// Reads one line of at most `max` bytes into `line`, without ever buffering more.
async fn read_line_bounded<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Line> {
    line.clear();
    let mut dropped = 0usize;
    loop {
        let available = reader.fill_buf().await?;
        let (chunk, complete) = match available.iter().position(|&b| b == b'\n') {
            Some(end) => (&available[..=end], true),
            None => (available, available.is_empty()),
        };
        let used = chunk.len();
        if dropped > 0 || line.len() + used > max {
            dropped += line.len() + used;
            line.clear();
        } else {
            line.extend_from_slice(chunk);
        }
        reader.consume(used);
        if complete {
            return Ok(match (dropped, line.is_empty()) {
                (0, true) => Line::End,
                (0, false) => Line::Complete,
                (length, _) => Line::TooLong(length),
            });
        }
    }
}

/// Writes lines and flushes them, all within [`WRITE_TIMEOUT`].
async fn write_lines<W: AsyncWrite + Unpin, S: AsRef<str>>(
    writer: &mut W,
    lines: &[S],
) -> Result<(), ConnectionError> {
    let write = async {
        for line in lines {
            writer.write_all(line.as_ref().as_bytes()).await?;
            writer.write_all(b"\n").await?;
        }
        writer.flush().await
    };
    tokio::time::timeout(WRITE_TIMEOUT, write)
        .await
        .map_err(|_| ConnectionError::WriteTimeout)??;
    Ok(())
}

async fn write_json<W: AsyncWrite + Unpin>(
    writer: &mut W,
    value: &impl serde::Serialize,
) -> Result<(), ConnectionError> {
    let line = serde_json::to_string(value).map_err(std::io::Error::other)?;
    write_lines(writer, &[line]).await
}

/// Resolves once shutdown is requested (without holding the watch guard across awaits).
async fn stopping(shutdown: &mut watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// What a `subscribe` asked for.
#[derive(Debug)]
struct Wanted {
    since: Option<u64>,
    store_id: Option<String>,
    session: Option<String>,
    uid: Option<u32>,
}

impl Wanted {
    /// Whether the subscriber's cursor is void here: it is above the head, or it names
    /// another store. Seqs are never reused within one store, so either means the database
    /// was replaced, and skipping every seq up to the cursor would lose events.
    fn reset(&self, head: u64, store_id: &str) -> bool {
        self.since.is_some_and(|since| {
            since > head || self.store_id.as_deref().is_some_and(|id| id != store_id)
        })
    }
}

struct Connection {
    engine: mpsc::Sender<Command>,
    database: PathBuf,
    shutdown: watch::Receiver<bool>,
}

impl Connection {
    async fn run(self, stream: UnixStream) {
        let caller = match stream.peer_cred() {
            Ok(cred) => Caller {
                uid: cred.uid(),
                pid: cred.pid().map_or(0, |p| p as u32),
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot identify peer; closing");
                return;
            }
        };
        if let Err(e) = self.serve(caller, stream).await {
            tracing::debug!(uid = caller.uid, pid = caller.pid, error = %e, "connection closed");
        }
    }

    async fn serve(mut self, caller: Caller, stream: UnixStream) -> Result<(), ConnectionError> {
        let (read, write) = stream.into_split();
        let mut write = BufWriter::new(write);
        let mut reader = BufReader::new(read);
        let mut line = Vec::new();
        loop {
            let read = tokio::select! {
                read = read_line_bounded(&mut reader, &mut line, MAX_LINE_BYTES) => read?,
                () = stopping(&mut self.shutdown) => {
                    return write_json(&mut write, &goodbye()).await;
                }
            };
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
                Line::Complete => match parse_request(&line) {
                    Ok(envelope) => envelope,
                    Err(rejected) => {
                        write_json(&mut write, &Reply::from(rejected)).await?;
                        continue;
                    }
                },
            };
            if let Request::Subscribe {
                since,
                store_id,
                session,
                uid,
            } = envelope.request
            {
                let wanted = Wanted {
                    since,
                    store_id,
                    session,
                    uid,
                };
                // Every reply so far was flushed: the buffer being replaced is empty.
                let write = BufWriter::with_capacity(STREAM_BUFFER, write.into_inner());
                return self
                    .stream(caller, envelope.id, wanted, reader, write)
                    .await;
            }
            let (reply_tx, reply_rx) = oneshot::channel();
            let command = Command::Request {
                caller,
                request: envelope.request,
                reply: reply_tx,
            };
            let reply = match self.engine.send(command).await {
                Ok(()) => reply_rx.await.unwrap_or_else(|_| {
                    Reply::error(ErrorCode::ShuttingDown, "the daemon is stopping")
                }),
                Err(_) => Reply::error(ErrorCode::ShuttingDown, "the daemon is stopping"),
            };
            write_json(
                &mut write,
                &Reply {
                    id: envelope.id,
                    ..reply
                },
            )
            .await?;
        }
    }

    async fn stream(
        mut self,
        caller: Caller,
        id: Option<serde_json::Value>,
        wanted: Wanted,
        mut reader: BufReader<OwnedReadHalf>,
        mut write: BufWriter<OwnedWriteHalf>,
    ) -> Result<(), ConnectionError> {
        let creator_uid = match caller.namespace(wanted.uid) {
            Ok(creator_uid) => creator_uid,
            Err(error) => return write_json(&mut write, &Reply { id, ..error.into() }).await,
        };
        let (reply_tx, reply_rx) = oneshot::channel();
        let command = Command::Subscribe { reply: reply_tx };
        let subscription = match self.engine.send(command).await {
            Ok(()) => reply_rx.await.ok(),
            Err(_) => None,
        };
        let Some(Subscription {
            head,
            store_id,
            mut batches,
        }) = subscription
        else {
            let reply = Reply::error(ErrorCode::ShuttingDown, "the daemon is stopping");
            return write_json(&mut write, &Reply { id, ..reply }).await;
        };
        let reset = wanted.reset(head, &store_id);
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
        let mut last = since;
        if last < head {
            let store = EventReader::open(&self.database).map_err(std::io::Error::other)?;
            while last < head {
                let page = store
                    .events_after(last, REPLAY_PAGE, &filter)
                    .map_err(std::io::Error::other)?;
                match page {
                    EventPage::Gap {
                        requested_since,
                        pruned_through,
                    } => {
                        write_json(
                            &mut write,
                            &StreamMessage::Gap {
                                since: requested_since,
                                pruned_through,
                            },
                        )
                        .await?;
                        last = pruned_through;
                    }
                    EventPage::Events(page) => {
                        let Some(newest) = page.last().map(|e| e.seq) else {
                            break;
                        };
                        let lines: Vec<String> = page
                            .iter()
                            .take_while(|e| e.seq <= head)
                            .map(|StoredEvent { body, .. }| format!("{{\"event\":{body}}}"))
                            .collect();
                        write_lines(&mut write, &lines).await?;
                        last = newest.min(head);
                        if newest >= head {
                            break;
                        }
                    }
                }
            }
            last = last.max(head);
        }

        let mut discard = Vec::new();
        loop {
            tokio::select! {
                batch = batches.recv() => match batch {
                    Some(batch) => {
                        let wanted = |p: &&Published| {
                            p.seq > last
                                && filter.session.is_none_or(|s| s == p.session)
                                && filter.creator_uid.is_none_or(|uid| uid == p.creator_uid)
                        };
                        let delivered: Vec<&str> = batch.iter().filter(wanted).map(|p| p.line.as_str()).collect();
                        write_lines(&mut write, &delivered).await?;
                        last = batch.iter().rfind(wanted).map_or(last, |p| p.seq);
                    }
                    // The engine dropped the queue: it was full, or the engine stopped.
                    None => {
                        let message = if *self.shutdown.borrow() {
                            goodbye()
                        } else {
                            StreamMessage::Lagged { last_delivered: last }
                        };
                        return write_json(&mut write, &message).await;
                    }
                },
                () = stopping(&mut self.shutdown) => {
                    return write_json(&mut write, &goodbye()).await;
                }
                // A streaming client only closes; anything it sends is ignored.
                read = read_line_bounded(&mut reader, &mut discard, MAX_LINE_BYTES) => {
                    if read? == Line::End {
                        return Ok(());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Every read of `input` in 4-byte buffer fills: complete lines as text, or the outcome.
    async fn lines(input: &[u8], max: usize) -> Vec<Result<String, Line>> {
        lines_read_by(input, 4, max)
            .await
            .into_iter()
            .map(|read| read.map(|line| String::from_utf8(line).unwrap()))
            .collect()
    }

    /// Every read of `input` in `fill`-byte buffer fills: complete lines, or the outcome.
    async fn lines_read_by(input: &[u8], fill: usize, max: usize) -> Vec<Result<Vec<u8>, Line>> {
        let mut reader = BufReader::with_capacity(fill, input);
        let mut line = Vec::new();
        let mut out = Vec::new();
        loop {
            let read = read_line_bounded(&mut reader, &mut line, max)
                .await
                .unwrap();
            assert!(
                line.len() <= max,
                "buffered {} bytes of at most {max}",
                line.len()
            );
            match read {
                Line::Complete => out.push(Ok(line.clone())),
                Line::End => {
                    out.push(Err(Line::End));
                    return out;
                }
                other => out.push(Err(other)),
            }
        }
    }

    #[tokio::test]
    async fn bounded_lines_skip_only_the_overlong_one() {
        let got = lines(b"ok\n0123456789abc\nnext\nlast", 8).await;
        assert_eq!(
            got,
            vec![
                Ok("ok\n".into()),
                Err(Line::TooLong(14)),
                Ok("next\n".into()),
                Ok("last".into()),
                Err(Line::End)
            ]
        );
        assert_eq!(
            lines(b"0123456789", 8).await,
            vec![Err(Line::TooLong(10)), Err(Line::End)]
        );
        assert_eq!(lines(b"", 8).await, vec![Err(Line::End)]);
    }

    proptest! {
        /// However the input is cut into reads, each line is returned whole when it fits,
        /// reported with its length when it does not, and never buffered beyond the limit.
        #[test]
        fn lines_are_read_whole_or_skipped_whatever_the_reads(
            // Only newlines matter to the reader: runs of one other byte, each perhaps
            // ended by a newline, make every shape of input cheaply.
            runs in prop::collection::vec((0..160usize, any::<u8>(), any::<bool>()), 0..12),
            fill in 1..64usize,
            max in 1..96usize,
        ) {
            let input: Vec<u8> = runs
                .into_iter()
                .flat_map(|(length, byte, newline)| {
                    let byte = if byte == b'\n' { b'x' } else { byte };
                    std::iter::repeat_n(byte, length).chain(newline.then_some(b'\n'))
                })
                .collect();
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let got = runtime.block_on(lines_read_by(&input, fill, max));
            let expected: Vec<Result<Vec<u8>, Line>> = input
                .split_inclusive(|&b| b == b'\n')
                .map(|line| match line.len() {
                    length if length <= max => Ok(line.to_vec()),
                    length => Err(Line::TooLong(length)),
                })
                .chain([Err(Line::End)])
                .collect();
            prop_assert_eq!(got, expected);
        }
    }
}
