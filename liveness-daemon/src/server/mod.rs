//! The Unix socket server: one task per connection, all owned by a `JoinSet`.
//!
//! Each connection is identified by `SO_PEERCRED` and admitted under the per-uid limits
//! ([`Limits`]) before it gets a task; root is always admitted, even when the daemon is
//! out of file descriptors (a spare one is kept for that). A connection reads request
//! lines (bounded by [`MAX_LINE_BYTES`], and by a timeout once a line has begun) and asks
//! the engine, one request of its uid's turns at a time; `list` reads a page from a
//! read-only store connection instead, so that no listing holds the engine. A `subscribe` turns the connection into a
//! stream: replay from a read-only store connection up to the head seq the engine gave,
//! then live events from a bounded queue. A stream that cannot keep up is told `lagged`
//! and closed, so it never slows the engine or anyone else. A `lock_acquire` that waits
//! gives its uid's turn back once the engine has queued it, and leaves the queue when its
//! client hangs up or its `timeout_ms` passes.

use std::fs::File;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::task::JoinSet;

mod locks;
mod reads;
mod reply;

use reads::Answer;
pub use reads::Readers;
use reply::IntoReply;

use crate::closer::{CloseOnDrop, Closer};
use crate::engine::{Ask, Caller, Command, Handle, Op, Published, Subscribe, Subscription};
use crate::fdpass::FdReader;
use crate::limits::{ConnectionSlot, Limits};
use crate::store::{EventFilter, EventPage, EventReader, StoredEvent};
use liveness_common::protocol::{
    ErrorBody, ErrorCode, MAX_LINE_BYTES, Reply, Request, StreamMessage, Subscribed, parse_request,
};
use liveness_common::request;
use liveness_common::status::Limit;

/// A client that does not take a line within this long is disconnected.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Events replayed per store read.
const REPLAY_PAGE: usize = 512;
/// How long shutdown waits for connections to say goodbye.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Write buffer of a stream: a burst of a thousand ended sessions is about 450 KiB of lines,
/// which the default 8 KiB would write in fifty-odd system calls.
const STREAM_BUFFER: usize = 64 * 1024;
/// A line buffer that grew beyond this for one long request is given back after it, so
/// that idle connections do not keep their high-water mark.
const KEPT_LINE_CAPACITY: usize = 4096;
/// How long a connection found after running out of descriptors may take to be accepted.
const SPARE_ACCEPT: Duration = Duration::from_millis(100);
/// How often memory freed by closed connections is handed back to the system.
const TRIM_PERIOD: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("client write timed out")]
    WriteTimeout,
    #[error("client stalled in the middle of a request line")]
    LineTimeout,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

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
    let mut spare = open_spare();
    let mut trim = tokio::time::interval(TRIM_PERIOD);
    trim.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut closed_since_trim = false;
    loop {
        let accepted = tokio::select! {
            () = stopping(&mut shutdown) => break,
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => {
                if spare.is_none() {
                    spare = open_spare();
                }
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
                drop(spare.take());
                let Ok(Ok((stream, _))) =
                    tokio::time::timeout(SPARE_ACCEPT, listener.accept()).await
                else {
                    spare = open_spare();
                    continue;
                };
                if peer(&stream).is_some_and(|caller| caller.uid == 0) {
                    // Root takes the spare; another is opened once a connection closes.
                    stream
                } else {
                    if let Some(caller) = peer(&stream) {
                        limits.refused(Limit::FileDescriptors, caller.uid);
                    }
                    let refusal = ErrorBody::new(
                        ErrorCode::TooManyConnections,
                        "the daemon is out of file descriptors; try again later",
                    );
                    refuse(&stream, refusal);
                    drop(stream);
                    spare = open_spare();
                    continue;
                }
            }
            // Connections aborted before they were accepted, and such: nothing to serve.
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(caller) = peer(&stream) else {
            continue;
        };
        let slot = match limits.admit(caller.uid) {
            Ok(slot) => slot,
            Err(refusal) => {
                refuse(&stream, refusal);
                continue;
            }
        };
        // The last reference to the connection is this copy, closed by the closer: what a
        // client leaves unread in the socket (descriptors among it) is released there.
        let last_close = match rustix::io::fcntl_dupfd_cloexec(&stream, 0) {
            Ok(copy) => Some(closer.on_drop(caller.uid, copy)),
            // Root is served also out of descriptors, and may stall only itself.
            Err(_) if caller.uid == 0 => None,
            Err(_) => {
                limits.refused(Limit::FileDescriptors, caller.uid);
                let refusal = ErrorBody::new(
                    ErrorCode::TooManyConnections,
                    "the daemon is out of file descriptors; try again later",
                );
                refuse(&stream, refusal);
                continue;
            }
        };
        let connection = Connection {
            closer: closer.clone(),
            _last_close: last_close,
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

/// A descriptor kept in reserve (see [`serve`]).
fn open_spare() -> Option<File> {
    File::open("/dev/null").ok()
}

/// Who is at the other end, by `SO_PEERCRED`.
fn peer(stream: &UnixStream) -> Option<Caller> {
    match stream.peer_cred() {
        Ok(cred) => Some(Caller {
            uid: cred.uid(),
            pid: cred.pid().map_or(0, |p| p as u32),
        }),
        Err(e) => {
            tracing::warn!(error = %e, "cannot identify peer; closing");
            None
        }
    }
}

/// Tells a connection that is not admitted why, without waiting for it, and closes it.
fn refuse(stream: &UnixStream, refusal: ErrorBody) {
    let line = serde_json::to_string(&Reply::from(refusal)).unwrap_or_default() + "\n";
    // A new connection's send buffer is empty: one short line fits without blocking.
    let _ = stream.try_write(line.as_bytes());
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

/// Waits for a request line. Waiting for one to begin costs nothing; once it has begun it
/// must end within `timeout`, so that no client pins a half line's buffer for long.
async fn read_request<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    timeout: Duration,
) -> Result<Line, ConnectionError> {
    if line.capacity() > KEPT_LINE_CAPACITY {
        *line = Vec::new();
    }
    if reader.fill_buf().await?.is_empty() {
        return Ok(Line::End);
    }
    tokio::time::timeout(timeout, read_line_bounded(reader, line, MAX_LINE_BYTES))
        .await
        .map_err(|_| ConnectionError::LineTimeout)?
        .map_err(ConnectionError::from)
}

/// Resolves when the client closes its side. A client that sends more is still there
/// (what it sent is read after the current reply): this then never resolves.
async fn client_closed<R: AsyncBufRead + Unpin>(reader: &mut R) {
    if let Ok(buffered) = reader.fill_buf().await
        && !buffered.is_empty()
    {
        std::future::pending::<()>().await;
    }
}

/// Whether a subscriber's cursor is void here: it is above the head, or it names another
/// store. Seqs are never reused within one store, so either means the database was
/// replaced, and skipping every seq up to the cursor would lose events.
fn reset(wanted: &request::Subscribe, head: u64, store_id: &str) -> bool {
    wanted.since.is_some_and(|since| {
        since > head || wanted.store_id.as_deref().is_some_and(|id| id != store_id)
    })
}

/// Asks the engine `op` in one of the caller's turns (`turn`).
async fn ask<O: Op>(
    turn: impl Future<Output = Option<OwnedSemaphorePermit>>,
    engine: &Handle,
    caller: Caller,
    op: O,
) -> Answer
where
    Command: From<Ask<O>>,
    O::Answer: IntoReply,
{
    let _turn = turn.await;
    engine.ask(caller, op).await.into()
}

struct Connection {
    /// Where the descriptors this connection's client passes are closed.
    closer: Closer,
    /// Dropped after the connection's own halves (see [`serve`]).
    _last_close: Option<CloseOnDrop>,
    engine: Handle,
    readers: Readers,
    limits: Arc<Limits>,
    /// This connection's place under its uid's limits, freed when it closes.
    slot: ConnectionSlot,
    shutdown: watch::Receiver<bool>,
}

impl Connection {
    async fn run(self, caller: Caller, stream: UnixStream) {
        let limits = Arc::clone(&self.limits);
        match self.serve(caller, stream).await {
            Err(ConnectionError::LineTimeout) => limits.refused(Limit::LineTimeout, caller.uid),
            Err(e) => {
                tracing::debug!(uid = caller.uid, pid = caller.pid, error = %e, "connection closed");
            }
            Ok(()) => {}
        }
    }

    async fn serve(mut self, caller: Caller, stream: UnixStream) -> Result<(), ConnectionError> {
        let (read, write) = stream.into_split();
        let mut write = BufWriter::new(write);
        // Read with recvmsg: a request may come with a pidfd naming its owner.
        let mut reader = BufReader::new(FdReader::new(read, caller.uid, self.closer.clone()));
        let mut line = Vec::new();
        let line_timeout = self.limits.config().line_timeout;
        // Stream position of the next line, to claim the descriptors sent with each line.
        let mut position = 0u64;
        loop {
            // A client whose passed descriptors take long to close gets no more read.
            self.closer.wait_for_room(caller.uid).await;
            let read = tokio::select! {
                read = read_request(&mut reader, &mut line, line_timeout) => read?,
                () = stopping(&mut self.shutdown) => {
                    return write_json(&mut write, &goodbye()).await;
                }
            };
            let start = position;
            position += match read {
                Line::TooLong(length) => length as u64,
                _ => line.len() as u64,
            };
            // Claimed now even when unused, so a refused line's descriptors are closed.
            let fds = reader.get_mut().take_fds(start..position);
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
            let id = envelope.id;
            // Every request but a subscription is served in one of its uid's turns.
            let (limits, slot) = (&self.limits, &self.slot);
            let turn = || limits.request_turn(slot);
            let (engine, readers) = (&self.engine, &self.readers);
            let answer: Answer = match envelope.request {
                Request::Subscribe(request) => {
                    // Every reply so far was flushed: the buffer being replaced is empty.
                    let write = BufWriter::with_capacity(STREAM_BUFFER, write.into_inner());
                    return self.stream(caller, id, request, reader, write).await;
                }
                Request::List(request) => {
                    let _turn = turn().await;
                    readers.list(id.clone(), caller, request).await
                }
                Request::LockList(request) => {
                    let _turn = turn().await;
                    readers.lock_list(id.clone(), engine, caller, request).await
                }
                Request::Processes(request) => {
                    let _turn = turn().await;
                    readers.processes(id.clone(), engine, caller, request).await
                }
                Request::Whose(request) => {
                    let _turn = turn().await;
                    readers.whose(engine, caller, request).await.into()
                }
                Request::End(request) => {
                    let _turn = turn().await;
                    readers.end(engine, caller, request).await.into()
                }
                Request::LockAcquire(request) => {
                    let turn = turn().await;
                    let shutdown = &mut self.shutdown;
                    let acquired =
                        locks::acquire(engine, caller, request, turn, &mut reader, shutdown);
                    match acquired.await {
                        Some(acquired) => acquired.into(),
                        None => return Ok(()),
                    }
                }
                Request::Register(request) => {
                    let register = crate::engine::Register { request, fds };
                    ask(turn(), engine, caller, register).await
                }
                Request::Rename(request) => ask(turn(), engine, caller, request).await,
                Request::Touch(request) => ask(turn(), engine, caller, request).await,
                Request::Get(request) => ask(turn(), engine, caller, request).await,
                Request::Status(request) => ask(turn(), engine, caller, request).await,
                Request::LockRelease(request) => ask(turn(), engine, caller, request).await,
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

    async fn stream(
        mut self,
        caller: Caller,
        id: Option<serde_json::Value>,
        wanted: request::Subscribe,
        mut reader: BufReader<FdReader>,
        mut write: BufWriter<OwnedWriteHalf>,
    ) -> Result<(), ConnectionError> {
        let creator_uid = match caller.namespace(wanted.uid) {
            Ok(creator_uid) => creator_uid,
            Err(error) => return write_json(&mut write, &Reply { id, ..error.into() }).await,
        };
        let Subscription {
            head,
            store_id,
            mut batches,
        } = match self.engine.ask(caller, Subscribe).await {
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
        let mut last = since;
        if last < head {
            let store = EventReader::open(&self.readers.database).map_err(std::io::Error::other)?;
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
