//! A subscriber's outbox. Once its replay is done, the engine writes each event's line to
//! the subscriber's socket itself, in the turn that published it, when nothing is queued
//! ahead of it: a death reaches the subscriber with one `send(2)` and no hand-off to
//! another thread. What the socket does not take at once is queued in order, and the
//! subscriber's connection writes it when the socket is writable; a queue that outgrows
//! its bound ends the subscription as lagged.
//!
//! Two threads write to one socket, so every write happens under the outbox's lock: the
//! engine's while the queue is empty, the connection's otherwise. Neither blocks in the
//! kernel (`MSG_DONTWAIT`), so the lock is held for one bounded copy at most.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rustix::io::Errno;
use rustix::net::SendFlags;
use tokio::sync::Notify;

/// How a subscription ended, for its connection to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Its queue outgrew its bound.
    Lagged,
    /// The socket failed: the subscriber went away.
    Gone,
    /// Its connection closed it (the daemon is stopping, or the client hung up).
    Closed,
}

/// What a [`Outbox::flush`] left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flushed {
    /// Nothing queued.
    Done,
    /// The socket is full and lines wait.
    More,
    /// The subscription has ended and everything it still owed is written.
    Ended(Ended),
}

#[derive(Debug, Default)]
struct State {
    /// Another descriptor of the connection's socket, which is non-blocking; `None` once
    /// the connection is gone (see [`Outbox::hang_up`]).
    socket: Option<OwnedFd>,
    /// The replay is done: the engine may write.
    live: bool,
    /// Lines not written yet (each with its seq and its newline); the front one from
    /// `written` on.
    queue: VecDeque<(u64, Arc<str>)>,
    written: usize,
    /// Batches offered since the queue was last empty, towards the bound.
    queued_batches: usize,
    /// The seq of the last line written whole.
    delivered: u64,
    ended: Option<Ended>,
}

/// See the module.
#[derive(Debug)]
pub struct Outbox {
    state: Mutex<State>,
    /// Wakes the connection when lines are queued or the subscription ended.
    wake: Notify,
    /// Batches that may wait in the queue.
    max_batches: usize,
}

impl Outbox {
    /// An outbox for `socket`, not live until [`Outbox::go_live`].
    pub(super) fn new(socket: OwnedFd, max_batches: usize) -> Arc<Outbox> {
        Arc::new(Outbox {
            state: Mutex::new(State {
                socket: Some(socket),
                ..State::default()
            }),
            wake: Notify::new(),
            max_batches: max_batches.max(1),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The engine: writes the lines of one published batch meant for this subscriber, or
    /// queues them behind what is queued. Fails once the subscription has ended.
    pub(super) fn offer<'a>(
        &self,
        lines: impl IntoIterator<Item = (u64, &'a Arc<str>)>,
    ) -> Result<(), Ended> {
        let mut state = self.state();
        if let Some(ended) = state.ended {
            return Err(ended);
        }
        let was_empty = state.queue.is_empty();
        let lines = lines.into_iter().map(|(seq, line)| (seq, Arc::clone(line)));
        state.queue.extend(lines);
        if state.queue.is_empty() {
            return Ok(());
        }
        if was_empty && state.live && !self.write_queued(&mut state) {
            return state.ended.map_or(Ok(()), Err);
        }
        state.queued_batches += 1;
        if state.queued_batches > self.max_batches {
            state.ended = Some(Ended::Lagged);
            // A line begun is finished, so that the stream stays whole for its last word.
            let begun = usize::from(state.written > 0);
            state.queue.truncate(begun);
        }
        let ended = state.ended;
        drop(state);
        self.wake.notify_one();
        ended.map_or(Ok(()), Err)
    }

    /// Writes queued lines until the socket takes no more. True when some are left.
    fn write_queued(&self, state: &mut State) -> bool {
        while let Some((seq, line)) = state.queue.front() {
            let Some(socket) = &state.socket else {
                state.queue.clear();
                return false;
            };
            let bytes = &line.as_bytes()[state.written..];
            match rustix::net::send(
                socket.as_fd(),
                bytes,
                SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
            ) {
                Ok(sent) if sent == bytes.len() => {
                    state.delivered = *seq;
                    state.queue.pop_front();
                    state.written = 0;
                }
                Ok(sent) => state.written += sent,
                Err(Errno::AGAIN) => return true,
                Err(Errno::INTR) => {}
                Err(_) => {
                    state.ended = Some(Ended::Gone);
                    state.queue.clear();
                    return false;
                }
            }
        }
        state.queued_batches = 0;
        false
    }

    /// The connection: the replay, up to `replayed` (the head seq), is written; lines
    /// offered meanwhile are written now or queued for [`Outbox::flush`], and from now on
    /// the engine writes as they come.
    pub fn go_live(&self, replayed: u64) {
        let mut state = self.state();
        state.live = true;
        state.delivered = replayed;
        if state.ended.is_none() && self.write_queued(&mut state) {
            drop(state);
            self.wake.notify_one();
        }
    }

    /// The connection: waits until lines are queued or the subscription ended.
    pub async fn wait(&self) {
        self.wake.notified().await;
    }

    /// The connection: writes what is queued (with the socket writable, or after a
    /// [`Outbox::wait`]).
    pub fn flush(&self) -> Flushed {
        let mut state = self.state();
        if self.write_queued(&mut state) {
            Flushed::More
        } else {
            state.ended.map_or(Flushed::Done, Flushed::Ended)
        }
    }

    /// The connection: ends the subscription; what is queued is still written by
    /// [`Outbox::flush`], and the engine drops it at its next batch.
    pub fn close(&self) {
        self.state().ended.get_or_insert(Ended::Closed);
    }

    /// The connection is gone: the subscription ends, and the socket is closed here now
    /// rather than when the engine next publishes (it would hold one descriptor for each
    /// subscription closed meanwhile).
    pub fn hang_up(&self) {
        let mut state = self.state();
        state.ended.get_or_insert(Ended::Closed);
        state.queue.clear();
        state.socket = None;
    }

    /// The seq of the last event line written whole (or of the replay's end).
    pub fn delivered(&self) -> u64 {
        self.state().delivered
    }

    /// Whether the subscription goes on.
    pub fn is_open(&self) -> bool {
        self.state().ended.is_none()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    use super::*;

    fn pair(max_batches: usize) -> (Arc<Outbox>, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        theirs.set_nonblocking(true).unwrap();
        (Outbox::new(OwnedFd::from(ours), max_batches), theirs)
    }

    fn line(seq: u64, text: &str) -> (u64, Arc<str>) {
        (seq, Arc::from(format!("{text}\n")))
    }

    fn offer(outbox: &Outbox, lines: &[(u64, Arc<str>)]) -> Result<(), Ended> {
        outbox.offer(lines.iter().map(|(seq, line)| (*seq, line)))
    }

    fn read_available(theirs: &mut UnixStream) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        while let Ok(n @ 1..) = theirs.read(&mut buf) {
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8(got).unwrap()
    }

    #[test]
    fn lines_offered_before_the_replay_ends_come_after_it_in_order() {
        let (outbox, mut theirs) = pair(8);
        offer(&outbox, &[line(5, "5"), line(6, "6")]).unwrap();
        assert_eq!(read_available(&mut theirs), "", "nothing before going live");
        outbox.go_live(4);
        offer(&outbox, &[line(7, "7")]).unwrap();
        assert_eq!(read_available(&mut theirs), "5\n6\n7\n");
        assert_eq!(outbox.delivered(), 7);
    }

    #[test]
    fn a_full_socket_queues_and_the_connection_writes_the_rest_in_order() {
        let (outbox, mut theirs) = pair(1_000_000);
        outbox.go_live(0);
        let big = line(1, &"x".repeat(10_000));
        let mut offered = 0;
        while outbox.flush() == Flushed::Done {
            offer(&outbox, std::slice::from_ref(&big)).unwrap();
            offered += 1;
        }
        // Behind the queue: never written before what is queued.
        offer(&outbox, &[line(2, "last")]).unwrap();
        let mut got = String::new();
        loop {
            got.push_str(&read_available(&mut theirs));
            match outbox.flush() {
                Flushed::More => continue,
                Flushed::Done => break,
                Flushed::Ended(ended) => panic!("{ended:?}"),
            }
        }
        got.push_str(&read_available(&mut theirs));
        assert_eq!(got.len(), offered * big.1.len() + "last\n".len());
        assert!(got.ends_with("xxxx\nlast\n"));
        assert_eq!(outbox.delivered(), 2);
    }

    #[test]
    fn a_queue_past_its_bound_ends_as_lagged_after_the_line_it_began() {
        let (outbox, mut theirs) = pair(3);
        outbox.go_live(0);
        let big = line(1, &"y".repeat(300_000));
        offer(&outbox, std::slice::from_ref(&big)).unwrap();
        for seq in 2..=3 {
            offer(&outbox, &[line(seq, "queued")]).unwrap();
        }
        assert_eq!(
            offer(&outbox, &[line(4, "one too many")]),
            Err(Ended::Lagged)
        );
        assert_eq!(offer(&outbox, &[line(5, "after")]), Err(Ended::Lagged));
        let mut got = String::new();
        loop {
            got.push_str(&read_available(&mut theirs));
            match outbox.flush() {
                Flushed::More => continue,
                Flushed::Ended(ended) => {
                    assert_eq!(ended, Ended::Lagged);
                    break;
                }
                Flushed::Done => panic!("a lagged outbox flushed as open"),
            }
        }
        got.push_str(&read_available(&mut theirs));
        assert_eq!(
            got,
            format!("{}\n", "y".repeat(300_000)),
            "the begun line, whole, and no more"
        );
        assert_eq!(
            outbox.delivered(),
            1,
            "the lagged message names the last whole line"
        );
    }

    #[test]
    fn a_subscriber_that_went_away_ends_the_subscription() {
        let (outbox, theirs) = pair(8);
        outbox.go_live(0);
        drop(theirs);
        assert_eq!(offer(&outbox, &[line(1, "1")]), Err(Ended::Gone));
        assert_eq!(outbox.flush(), Flushed::Ended(Ended::Gone));
        assert!(!outbox.is_open());
    }

    #[test]
    fn a_hung_up_outbox_lets_its_socket_go_at_once() {
        let (outbox, mut theirs) = pair(8);
        outbox.go_live(0);
        offer(&outbox, &[line(1, "1")]).unwrap();
        outbox.hang_up();
        let mut rest = String::new();
        theirs.set_nonblocking(false).unwrap();
        theirs.read_to_string(&mut rest).unwrap();
        assert_eq!(
            rest, "1\n",
            "the socket is closed while the engine still holds the outbox"
        );
        assert_eq!(offer(&outbox, &[line(2, "2")]), Err(Ended::Closed));
        assert!(!outbox.is_open());
    }

    #[test]
    fn a_closed_subscription_still_writes_what_it_queued_then_refuses() {
        let (outbox, mut theirs) = pair(8);
        offer(&outbox, &[line(1, "1")]).unwrap();
        outbox.close();
        assert_eq!(offer(&outbox, &[line(2, "2")]), Err(Ended::Closed));
        assert_eq!(outbox.flush(), Flushed::Ended(Ended::Closed));
        assert_eq!(read_available(&mut theirs), "1\n");
    }
}
