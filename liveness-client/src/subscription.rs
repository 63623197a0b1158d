//! A subscription that outlives its connection: it reconnects to a restarted daemon and
//! resumes after the last event it delivered.

use std::path::PathBuf;
use std::thread::sleep;
use std::time::{Duration, Instant};

use liveness_common::protocol::{Request, StreamMessage, Subscribed};
use liveness_common::request;

use crate::{Client, ClientError, Cursor};

/// What a [`Subscription`] yields: the daemon's stream messages, events at most once.
pub type Item = StreamMessage;

/// What [`Subscription::next_line`] yields: an event as the very line the daemon sent, for
/// a consumer that passes events on rather than reading them, or any other message, read.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// An event.
    Event {
        /// Its seq, for the cursor.
        seq: u64,
        /// Its line exactly as the daemon sent it, newline included.
        line: String,
    },
    /// Any other stream message.
    Other(Item),
}

/// What following a stream message needs to know of it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum View<'a> {
    Event { seq: u64 },
    Other(&'a StreamMessage),
}

/// A stream message in either form a subscription yields.
pub(crate) trait Message {
    fn view(&self) -> View<'_>;
}

impl Message for StreamMessage {
    fn view(&self) -> View<'_> {
        match self {
            StreamMessage::Event(event) => View::Event { seq: event.seq },
            other => View::Other(other),
        }
    }
}

impl Message for Line {
    fn view(&self) -> View<'_> {
        match self {
            Line::Event { seq, .. } => View::Event { seq: *seq },
            Line::Other(message) => message.view(),
        }
    }
}

/// How long, and how often, a [`Subscription`] tries to reach a daemon that went away.
///
/// The first retry waits `first_delay`, each next one twice as long up to `max_delay`;
/// after `give_up_after` without a connection the subscription fails with
/// [`ClientError::GaveUp`]. The default (0.1 s doubling to 2 s, for up to 30 s) covers a
/// daemon restarted by its service manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// The wait before the first reconnection attempt.
    pub first_delay: Duration,
    /// The longest wait between two attempts.
    pub max_delay: Duration,
    /// How long to keep trying before giving up.
    pub give_up_after: Duration,
}

impl Default for Retry {
    fn default() -> Retry {
        Retry {
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            give_up_after: Duration::from_secs(30),
        }
    }
}

impl Retry {
    /// Calls `attempt` until it succeeds, fails for good, or the time is up.
    pub(crate) fn run<T>(
        &self,
        mut attempt: impl FnMut() -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let mut backoff = Backoff::new(*self);
        loop {
            match attempt() {
                Err(e) => sleep(backoff.after(e)?),
                result => return result,
            }
        }
    }
}

/// The waits of one round of retries: [`Backoff::after`] a failed attempt says how long to
/// wait before the next, or gives up.
#[derive(Debug)]
pub(crate) struct Backoff {
    retry: Retry,
    start: Instant,
    delay: Duration,
}

impl Backoff {
    pub(crate) fn new(retry: Retry) -> Backoff {
        Backoff {
            retry,
            start: Instant::now(),
            delay: retry.first_delay,
        }
    }

    /// The wait after an attempt that failed with `error`, or the error to fail with: it
    /// as it is if a restart cannot explain it, [`ClientError::GaveUp`] when time is up.
    pub(crate) fn after(&mut self, error: ClientError) -> Result<Duration, ClientError> {
        if !error.is_transient() {
            return Err(error);
        }
        if self.start.elapsed() + self.delay > self.retry.give_up_after {
            return Err(ClientError::GaveUp {
                seconds: self.retry.give_up_after.as_secs(),
                last: Box::new(error),
            });
        }
        let delay = self.delay;
        self.delay = (delay * 2).min(self.retry.max_delay);
        Ok(delay)
    }
}

/// Which events a subscription receives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this session's events (all sessions the caller may see if `None`).
    pub session: Option<String>,
    /// Root only, with `session`: the session of this user.
    pub uid: Option<u32>,
}

/// Where a subscription stands, shared by the blocking and the async one: what to
/// subscribe with, and what each stream message does to it.
#[derive(Debug, Clone)]
pub(crate) struct Position {
    pub(crate) filter: Filter,
    /// `None` only before the first acknowledgement of a subscription started from now.
    pub(crate) cursor: Option<Cursor>,
}

/// What a subscription does with a stream message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// An event delivered before: drop it.
    Skip,
    /// Hand it to the consumer.
    Deliver,
    /// Hand it to the consumer; the connection is over, subscribe again on the next call.
    DeliverAndReconnect,
}

impl Position {
    /// The `subscribe` request that continues after the cursor.
    pub(crate) fn request(&self) -> Request {
        Request::Subscribe(request::Subscribe {
            since: self.cursor.as_ref().map(|c| c.seq),
            store_id: self.cursor.as_ref().and_then(|c| c.store_id.clone()),
            session: self.filter.session.clone(),
            uid: self.filter.uid,
        })
    }

    /// From the acknowledgement on, the position is in the daemon's store and its current
    /// run, which the store id names: a cursor that the daemon kept moves to it, so that a
    /// restore of the daemon's state from a copy made before this run voids it.
    pub(crate) fn acknowledged(&mut self, subscribed: Subscribed) {
        let cursor = self.cursor.get_or_insert(Cursor {
            seq: subscribed.since,
            store_id: None,
        });
        cursor.store_id = Some(subscribed.store_id);
    }

    /// Handles the result of reading the next stream line: what to hand the consumer
    /// (`None`: read again) and whether the connection goes on (a lost one, `goodbye` and
    /// `lagged` end it; the next read subscribes again after the cursor).
    pub(crate) fn take<M: Message>(
        &mut self,
        read: Result<M, ClientError>,
    ) -> (Option<Result<M, ClientError>>, bool) {
        match read {
            // A daemon killed without a goodbye: resume after the last event.
            Err(e) if e.is_transient() => (None, false),
            Err(e) => (Some(Err(e)), true),
            Ok(message) => match self.follow(&message) {
                Step::Skip => (None, true),
                Step::Deliver => (Some(Ok(message)), true),
                Step::DeliverAndReconnect => (Some(Ok(message)), false),
            },
        }
    }

    fn follow(&mut self, message: &impl Message) -> Step {
        let cursor = self.cursor.get_or_insert(Cursor {
            seq: 0,
            store_id: None,
        });
        let message = match message.view() {
            View::Event { seq } if seq <= cursor.seq => return Step::Skip,
            View::Event { seq } => {
                cursor.seq = seq;
                return Step::Deliver;
            }
            View::Other(message) => message,
        };
        match message {
            // Seen as View::Event above.
            StreamMessage::Event(_) => Step::Deliver,
            StreamMessage::Reset { store_id, .. } => {
                *cursor = Cursor {
                    seq: 0,
                    store_id: Some(store_id.clone()),
                };
                Step::Deliver
            }
            StreamMessage::Lagged { .. } | StreamMessage::Goodbye { .. } => {
                Step::DeliverAndReconnect
            }
            // Not of a subscription's stream; delivered as sent.
            StreamMessage::Gap { .. } | StreamMessage::FleetChange(_) => Step::Deliver,
        }
    }
}

/// A stream of events that survives daemon restarts.
///
/// It subscribes after its cursor, follows every event it delivers, and when the
/// connection is lost (a `goodbye`, a closed socket, `lagged`) subscribes again after the
/// last delivered event, retrying as its [`Retry`] says. The daemon replays from the
/// cursor, so nothing committed in between is missed, and events at or before the cursor
/// are dropped, so none is delivered twice.
///
/// It yields the stream's own messages ([`Item`]): events, and, for the consumer to
/// report, `gap` (events pruned before they were read), `lagged` (the subscription
/// resumes after it by itself), `reset` (another database: the cursor starts over in it)
/// and `goodbye` (the daemon stopped: the next call reconnects).
///
/// ```no_run
/// use liveness_client::{Client, Filter, Item};
///
/// let mut events = Client::connect_default()?.subscribe(None, Filter::default())?;
/// loop {
///     match events.next_item()? {
///         Item::Event(event) => println!("#{} {} {:?}", event.seq, event.session, event.kind),
///         other => eprintln!("{other:?}"),
///     }
/// }
/// # Ok::<(), liveness_client::ClientError>(())
/// ```
#[derive(Debug)]
pub struct Subscription {
    /// The connection, `None` after it was lost until the next call reconnects.
    client: Option<Client>,
    socket: PathBuf,
    position: Position,
    retry: Retry,
}

impl Subscription {
    /// Subscribes on `client`'s connection (which it takes over) after `cursor`, or from
    /// now on without one.
    pub(crate) fn start(
        client: Client,
        cursor: Option<Cursor>,
        filter: Filter,
    ) -> Result<Subscription, ClientError> {
        let mut subscription = Subscription {
            client: None,
            socket: client.socket.clone(),
            position: Position { filter, cursor },
            retry: Retry::default(),
        };
        match subscription.subscribe_on(client) {
            // The daemon went away between connecting and subscribing: it may be restarting.
            Err(e) if e.is_transient() => subscription.reconnect()?,
            result => result?,
        }
        Ok(subscription)
    }

    /// Sets how reconnections are retried (the default is [`Retry::default`]).
    pub fn with_retry(mut self, retry: Retry) -> Subscription {
        self.retry = retry;
        self
    }

    /// The last delivered event and its store: save it to resume a later subscription
    /// ([`Client::subscribe`]) where this one stopped.
    pub fn cursor(&self) -> Option<&Cursor> {
        self.position.cursor.as_ref()
    }

    /// The filter this subscription was made with.
    pub fn filter(&self) -> &Filter {
        &self.position.filter
    }

    fn subscribe_on(&mut self, mut client: Client) -> Result<(), ClientError> {
        let subscribed = client.subscribe_raw(&self.position.request())?;
        self.position.acknowledged(subscribed);
        self.client = Some(client);
        Ok(())
    }

    fn reconnect(&mut self) -> Result<(), ClientError> {
        let retry = self.retry;
        retry.run(|| {
            let client = Client::connect(&self.socket)?;
            self.subscribe_on(client)
        })
    }

    /// The next message, reconnecting first if the connection was lost.
    ///
    /// Fails when the daemon refuses the subscription, sends something unreadable, or
    /// stays away longer than the [`Retry`] bound.
    pub fn next_item(&mut self) -> Result<Item, ClientError> {
        self.next_with(Client::next_message)
    }

    /// The next message as [`Subscription::next_item`] gives it, except that an event is
    /// not parsed beyond its seq: it comes as the daemon's own line, to be passed on as it
    /// is (`liveness watch --json` prints it).
    pub fn next_line(&mut self) -> Result<Line, ClientError> {
        self.next_with(Client::next_line)
    }

    fn next_with<M: Message>(
        &mut self,
        read: fn(&mut Client) -> Result<M, ClientError>,
    ) -> Result<M, ClientError> {
        loop {
            let client = match &mut self.client {
                Some(client) => client,
                None => {
                    self.reconnect()?;
                    continue;
                }
            };
            let (item, connected) = self.position.take(read(client));
            if !connected {
                self.client = None;
            }
            if let Some(item) = item {
                return item;
            }
        }
    }
}

impl Iterator for Subscription {
    type Item = Result<Item, ClientError>;

    /// [`Subscription::next_item`]; the iteration never ends on its own.
    fn next(&mut self) -> Option<Self::Item> {
        Some(self.next_item())
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;

    use serde_json::{Value, json};

    use super::*;

    fn event(seq: u64) -> Value {
        json!({"event": {
            "seq": seq, "kind": "session.ended", "at_ms": 0, "session": "s",
            "owner": {"pid": 1, "start_ticks": 1, "boot_id": "b", "host": "h", "comm": "c"},
            "creator_uid": 0,
        }})
    }

    /// A daemon stand-in: each connection reads the subscribe line, checks its cursor,
    /// acknowledges it, sends `lines`, then `cut` (the start of a line it gives up on).
    fn serve(listener: &UnixListener, since: Option<u64>, lines: &[Value], cut: &str) {
        let (stream, _) = listener.accept().expect("accept");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut request = String::new();
        reader.read_line(&mut request).expect("read the request");
        let request: Value = serde_json::from_str(&request).expect("request JSON");
        assert_eq!(request["op"], "subscribe", "{request}");
        assert_eq!(request["since"].as_u64(), since, "resumes after: {request}");
        let mut out = &stream;
        let ack = json!({"ok": true, "subscribed": {"since": since.unwrap_or(0), "head": 0, "store_id": "st"}});
        for line in std::iter::once(&ack).chain(lines) {
            writeln!(out, "{line}").expect("write");
        }
        out.write_all(cut.as_bytes()).expect("write");
    }

    /// A stand-in daemon that serves one connection per `(since, lines, cut)`, in turn,
    /// and a subscription to it from now on; the directory holds its socket.
    fn subscribed(
        connections: Vec<(Option<u64>, Vec<Value>, &'static str)>,
    ) -> (Subscription, std::thread::JoinHandle<()>, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("sock");
        let listener = UnixListener::bind(&socket).expect("bind");
        let daemon = std::thread::spawn(move || {
            for (since, lines, cut) in connections {
                serve(&listener, since, &lines, cut);
            }
        });
        let subscription = Client::connect(&socket)
            .expect("connect")
            .subscribe(None, Filter::default())
            .expect("subscribe");
        (subscription, daemon, dir)
    }

    #[test]
    fn resumes_after_a_goodbye_and_a_lost_connection_without_repeating_events() {
        let (mut subscription, daemon, _dir) = subscribed(vec![
            (
                None,
                vec![event(1), event(2), json!({"goodbye": {"reason": "stop"}})],
                "",
            ),
            // The replay overlaps what was delivered; then the connection drops in the
            // middle of a line, as the daemon's does when a client stops reading.
            (Some(2), vec![event(2), event(3)], r#"{"event":{"seq":4,"#),
            (Some(3), vec![event(3), event(4)], ""),
        ]);
        let mut seen = Vec::new();
        while seen.len() < 5 {
            match subscription.next_item().expect("next") {
                Item::Event(event) => seen.push(format!("event {}", event.seq)),
                other => seen.push(format!("{other:?}")),
            }
        }
        daemon.join().expect("the stand-in daemon's assertions");
        assert_eq!(
            seen,
            [
                "event 1",
                "event 2",
                "Goodbye { reason: \"stop\" }",
                "event 3",
                "event 4"
            ],
            "every event once, in order, across two reconnections, the line cut short dropped"
        );
        assert_eq!(
            subscription.cursor().map(ToString::to_string).as_deref(),
            Some("4 st")
        );
    }

    #[test]
    fn lines_are_the_daemons_own_and_resume_without_repeating_events() {
        let (mut subscription, daemon, _dir) = subscribed(vec![
            (
                None,
                vec![event(1), json!({"goodbye": {"reason": "stop"}})],
                "",
            ),
            (Some(1), vec![event(1), event(2)], ""),
        ]);
        let lines: Vec<Line> = (0..3)
            .map(|_| subscription.next_line().expect("next"))
            .collect();
        daemon.join().expect("the stand-in daemon's assertions");
        let sent = |seq| Line::Event {
            seq,
            line: format!("{}\n", event(seq)),
        };
        assert_eq!(
            lines,
            [
                sent(1),
                Line::Other(Item::Goodbye {
                    reason: "stop".into()
                }),
                sent(2)
            ],
            "each event once, as the bytes sent, across a reconnection"
        );
        assert_eq!(subscription.cursor().map(|c| c.seq), Some(2));
    }

    #[test]
    fn a_reset_starts_the_cursor_over_and_lagged_ends_the_connection() {
        let mut position = Position {
            filter: Filter::default(),
            cursor: Cursor::parse("7 old"),
        };
        let message = |value: Value| serde_json::from_value::<StreamMessage>(value).unwrap();
        let (_, connected) = position.take(Ok(message(event(7))));
        assert_eq!(
            position.cursor.as_ref().unwrap().seq,
            7,
            "a repeat is dropped"
        );
        assert!(connected);
        let reset = json!({"reset": {"since": 7, "head": 2, "store_id": "new"}});
        let (item, _) = position.take(Ok(message(reset)));
        assert!(matches!(item, Some(Ok(Item::Reset { .. }))), "{item:?}");
        assert_eq!(
            position.cursor.as_ref().map(ToString::to_string).as_deref(),
            Some("0 new"),
            "the cursor starts over in the new store"
        );
        let (item, _) = position.take(Ok(message(event(1))));
        assert!(
            matches!(item, Some(Ok(Item::Event(_)))),
            "the new store's first event is delivered though its seq is below the old cursor"
        );
        let (item, connected) =
            position.take(Ok(message(json!({"lagged": {"last_delivered": 1}}))));
        assert!(
            matches!(item, Some(Ok(Item::Lagged { last_delivered: 1 }))),
            "{item:?}"
        );
        assert!(!connected, "after lagged the subscription subscribes again");
        assert_eq!(
            position.request(),
            Request::Subscribe(request::Subscribe {
                since: Some(1),
                store_id: Some("new".into()),
                session: None,
                uid: None
            }),
            "it resumes after the last delivered event"
        );
    }
}
