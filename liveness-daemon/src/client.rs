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

    /// Subscribes; the reply is the acknowledgement, then [`Client::next_message`] yields the stream.
    pub fn subscribe(
        &mut self,
        since: Option<u64>,
        session: Option<String>,
    ) -> Result<Reply, ClientError> {
        self.call(&Request::Subscribe { since, session })
    }

    /// The next stream line, raw and parsed.
    pub fn next_message(&mut self) -> Result<(String, StreamMessage), ClientError> {
        let line = self.read_line()?;
        let message = serde_json::from_str(&line)
            .map_err(|e| ClientError::Protocol(format!("{e}: {}", line.trim())))?;
        Ok((line.trim_end().to_owned(), message))
    }
}
