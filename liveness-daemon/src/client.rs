//! A blocking client for the daemon's socket, used by the `liveness` CLI.
//!
//! One request, one reply line; after `subscribe`, stream lines until the daemon closes.

use std::io::{self, BufRead, BufReader};
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::fdpass::send_with_fds;
use crate::protocol::{PROTOCOL_VERSION, Reply, Request, StreamMessage};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "cannot connect to livenessd at {path}: {source} (is the daemon running? see --socket)"
    )]
    Connect { path: PathBuf, source: io::Error },
    #[error("lost the connection to livenessd: {0}")]
    Io(#[from] io::Error),
    #[error("livenessd closed the connection")]
    Closed,
    #[error("unexpected message from livenessd: {0}")]
    Protocol(String),
}

#[derive(Debug)]
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.into(),
            source,
        })?;
        let writer = stream.try_clone()?;
        Ok(Client {
            reader: BufReader::new(stream),
            writer,
        })
    }

    fn send(&mut self, request: &Request, fds: &[BorrowedFd<'_>]) -> Result<(), ClientError> {
        let mut value =
            serde_json::to_value(request).map_err(|e| ClientError::Protocol(e.to_string()))?;
        if let Value::Object(object) = &mut value {
            object.insert("v".into(), PROTOCOL_VERSION.into());
        }
        let mut line = value.to_string();
        line.push('\n');
        send_with_fds(&mut self.writer, line.as_bytes(), fds)?;
        Ok(())
    }

    fn read_line(&mut self) -> Result<String, ClientError> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(ClientError::Closed);
        }
        Ok(line)
    }

    /// Sends one request and returns its reply (which may be an error reply).
    pub fn call(&mut self, request: &Request) -> Result<Reply, ClientError> {
        self.call_with_fds(request, &[])
    }

    /// [`Client::call`] with descriptors passed along with the request line (a pidfd owner
    /// is `{"pidfd": I}`, the `I`-th of them).
    pub fn call_with_fds(
        &mut self,
        request: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Reply, ClientError> {
        self.send(request, fds)?;
        let line = self.read_line()?;
        match serde_json::from_str(&line) {
            Ok(reply) => Ok(reply),
            // The daemon may stop between a request and its reply.
            Err(_)
                if matches!(
                    serde_json::from_str(&line),
                    Ok(StreamMessage::Goodbye { .. })
                ) =>
            {
                Err(ClientError::Closed)
            }
            Err(e) => Err(ClientError::Protocol(format!("{e}: {}", line.trim()))),
        }
    }

    /// Subscribes after `cursor` (from now on without one), to the events of `session`
    /// (of user `uid`, root only) or all; the reply is the acknowledgement, then
    /// [`Client::next_message`] yields the stream.
    pub fn subscribe(
        &mut self,
        cursor: Option<&Cursor>,
        session: Option<String>,
        uid: Option<u32>,
    ) -> Result<Reply, ClientError> {
        self.call(&Request::Subscribe {
            since: cursor.map(|c| c.seq),
            store_id: cursor.and_then(|c| c.store_id.clone()),
            session,
            uid,
        })
    }

    /// The next stream line, raw and parsed.
    pub fn next_message(&mut self) -> Result<(String, StreamMessage), ClientError> {
        let line = self.read_line()?;
        let message = serde_json::from_str(&line)
            .map_err(|e| ClientError::Protocol(format!("{e}: {}", line.trim())))?;
        Ok((line.trim_end().to_owned(), message))
    }
}

/// Where a consumer stands in the event stream: the seq it handled last, and the store that
/// seq belongs to (unknown for a bare seq, such as `--since`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub seq: u64,
    pub store_id: Option<String>,
}

impl Cursor {
    /// Parses a saved cursor: `SEQ STORE_ID`, or a bare `SEQ` as earlier versions wrote it.
    pub fn parse(text: &str) -> Option<Cursor> {
        let mut words = text.split_whitespace();
        let seq = words.next()?.parse().ok()?;
        let store_id = words.next().map(str::to_owned);
        words.next().is_none().then_some(Cursor { seq, store_id })
    }

    /// Follows one stream message: a handled event moves the cursor to its seq; a `reset`
    /// starts it over in the new store, before the store's first event.
    pub fn follow(&mut self, message: &StreamMessage) {
        match message {
            StreamMessage::Event(event) => self.seq = event.seq,
            StreamMessage::Reset { store_id, .. } => {
                *self = Cursor {
                    seq: 0,
                    store_id: Some(store_id.clone()),
                };
            }
            StreamMessage::Gap { .. }
            | StreamMessage::Lagged { .. }
            | StreamMessage::Goodbye { .. } => {}
        }
    }
}

/// The saved form that [`Cursor::parse`] reads.
impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.store_id {
            Some(store_id) => write!(f, "{} {store_id}", self.seq),
            None => write!(f, "{}", self.seq),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_read_both_forms_and_follow_a_reset() {
        let old = Cursor::parse("42\n").expect("a bare seq, as earlier versions wrote");
        assert_eq!((old.seq, old.store_id.as_deref()), (42, None));
        let mut cursor = Cursor::parse("42 0123abcd\n").expect("seq and store id");
        assert_eq!(cursor.store_id.as_deref(), Some("0123abcd"));
        assert_eq!(Cursor::parse(&cursor.to_string()), Some(cursor.clone()));
        for bad in ["", "x", "-1", "1 a b"] {
            assert_eq!(Cursor::parse(bad), None, "{bad:?} is no cursor");
        }
        cursor.follow(&StreamMessage::Reset {
            since: 42,
            head: 3,
            store_id: "ffee".into(),
        });
        assert_eq!(
            cursor.to_string(),
            "0 ffee",
            "a reset starts over in the new store"
        );
        cursor.follow(&StreamMessage::Lagged { last_delivered: 9 });
        assert_eq!(cursor.seq, 0, "only handled events move the cursor");
    }
}
