//! The async client (cargo feature `tokio`): the calls of [`Client`](crate::Client) and the
//! reconnecting [`Subscription`](crate::Subscription), over `tokio::net::UnixStream`.
//!
//! ```no_run
//! # async fn run() -> Result<(), liveness_client::ClientError> {
//! use liveness_client::nonblocking::AsyncClient;
//!
//! let ended = AsyncClient::connect_default().await?.wait_for_end("agent-7", None).await?;
//! println!("{:?}", ended.exit);
//! # Ok(())
//! # }
//! ```

use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Interest};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use liveness_common::lock::{Lock, Scope};
use liveness_common::protocol::{Reply, Request};
use liveness_common::request;
use liveness_common::session::{EventKind, Phase, Session};
use liveness_common::status::Status;

use crate::fdpass::sendmsg_with_fds;
use crate::subscription::{Backoff, Position};
use crate::{ClientError, Cursor, Filter, Item, Registration, Retry, Whose, default_socket, wire};

/// An async connection to livenessd: one request, one reply, in order. The calls are those
/// of [`Client`](crate::Client), documented there.
///
/// ```no_run
/// # async fn run() -> Result<(), liveness_client::ClientError> {
/// use liveness_client::nonblocking::AsyncClient;
///
/// let session = AsyncClient::connect_default().await?.register_auto("agent-7").await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct AsyncClient {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    socket: PathBuf,
}

impl AsyncClient {
    /// Connects to the daemon listening on `path`.
    pub async fn connect(path: &Path) -> Result<AsyncClient, ClientError> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| ClientError::Connect {
                path: path.into(),
                source,
            })?;
        let (reader, writer) = stream.into_split();
        Ok(AsyncClient {
            reader: BufReader::new(reader),
            writer,
            socket: path.into(),
        })
    }

    /// Connects to the daemon at [`default_socket`].
    pub async fn connect_default() -> Result<AsyncClient, ClientError> {
        AsyncClient::connect(&default_socket()).await
    }

    /// The socket this client connected to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn read_line(&mut self) -> Result<String, ClientError> {
        let mut line = String::new();
        self.reader.read_line(&mut line).await?;
        // Nothing at the end of the connection, or a line it cut short.
        if !line.ends_with('\n') {
            return Err(ClientError::Closed);
        }
        Ok(line)
    }

    /// Sends one request and returns its reply; an error reply is [`ClientError::Daemon`].
    pub async fn call(&mut self, request: &Request) -> Result<Reply, ClientError> {
        self.call_with_fds(request, &[]).await
    }

    /// [`AsyncClient::call`] with descriptors passed along with the request line.
    pub async fn call_with_fds(
        &mut self,
        request: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Reply, ClientError> {
        let line = wire::encode(request)?;
        let mut sent = 0;
        if !fds.is_empty() {
            let stream: &UnixStream = self.writer.as_ref();
            sent = stream
                .async_io(Interest::WRITABLE, || {
                    sendmsg_with_fds(stream.as_fd(), line.as_bytes(), fds)
                })
                .await?;
        }
        // The descriptors went with the first bytes; the rest is plain data.
        self.writer.write_all(&line.as_bytes()[sent..]).await?;
        wire::decode_reply(&self.read_line().await?)
    }

    async fn session_call(&mut self, request: &Request) -> Result<Session, ClientError> {
        self.call(request).await.and_then(wire::session)
    }

    /// [`Client::register`](crate::Client::register).
    pub async fn register(&mut self, registration: &Registration) -> Result<Session, ClientError> {
        let (request, pidfd) = wire::register_request(registration)?;
        let fds: Vec<_> = pidfd.iter().map(AsFd::as_fd).collect();
        self.call_with_fds(&request, &fds)
            .await
            .and_then(wire::session)
    }

    /// [`Client::register_auto`](crate::Client::register_auto).
    pub async fn register_auto(&mut self, session: &str) -> Result<Session, ClientError> {
        self.register(&Registration::new(session, crate::Owner::Auto))
            .await
    }

    /// [`Client::rename`](crate::Client::rename).
    pub async fn rename(
        &mut self,
        session: &str,
        to: &str,
        uid: Option<u32>,
    ) -> Result<Session, ClientError> {
        self.session_call(&Request::Rename(request::Rename {
            session: session.into(),
            to: to.into(),
            uid,
        }))
        .await
    }

    /// [`Client::touch`](crate::Client::touch).
    pub async fn touch(&mut self, session: &str, uid: Option<u32>) -> Result<Session, ClientError> {
        self.session_call(&Request::Touch(request::Touch {
            session: session.into(),
            uid,
            ..request::Touch::default()
        }))
        .await
    }

    /// [`Client::declare`](crate::Client::declare).
    pub async fn declare(&mut self, touch: &request::Touch) -> Result<Session, ClientError> {
        self.session_call(&Request::Touch(touch.clone())).await
    }

    /// [`Client::actions_done`](crate::Client::actions_done).
    pub async fn actions_done(
        &mut self,
        session: &str,
        uid: Option<u32>,
    ) -> Result<Session, ClientError> {
        self.session_call(&Request::ActionsDone(request::ActionsDone {
            session: session.into(),
            uid,
        }))
        .await
    }

    /// [`Client::end`](crate::Client::end).
    pub async fn end(&mut self, session: &str, uid: Option<u32>) -> Result<Session, ClientError> {
        self.session_call(&Request::End(request::End {
            session: session.into(),
            uid,
            terminate: false,
        }))
        .await
    }

    /// [`Client::get`](crate::Client::get).
    pub async fn get(&mut self, session: &str, uid: Option<u32>) -> Result<Session, ClientError> {
        self.session_call(&Request::Get(request::Get {
            session: session.into(),
            uid,
        }))
        .await
    }

    /// [`Client::list`](crate::Client::list): every page.
    pub async fn list(&mut self, phase: Option<Phase>) -> Result<Vec<Session>, ClientError> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let reply = self
                .call(&Request::List(request::List {
                    phase,
                    limit: None,
                    after: after.take(),
                }))
                .await?;
            all.extend(reply.sessions.unwrap_or_default());
            match reply.next {
                Some(next) => after = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// [`Client::whose`](crate::Client::whose).
    pub async fn whose(&mut self, pid: u32) -> Result<Whose, ClientError> {
        self.call(&Request::Whose(request::Whose { pid }))
            .await
            .and_then(wire::whose)
    }

    /// [`Client::status`](crate::Client::status).
    pub async fn status(&mut self) -> Result<Status, ClientError> {
        self.call(&Request::Status(request::Status {}))
            .await
            .and_then(wire::status)
    }

    /// [`Client::lock_acquire`](crate::Client::lock_acquire): with `wait`, the future
    /// resolves when the lock is granted. A request cancelled by dropping the future is
    /// still in line: drop the client too (closing its connection takes it out of line)
    /// rather than send another request on it.
    pub async fn lock_acquire(
        &mut self,
        name: &str,
        session: &str,
        uid: Option<u32>,
        wait: bool,
        timeout: Option<Duration>,
        scope: Scope,
    ) -> Result<Lock, ClientError> {
        let request = wire::lock_acquire_request(name, session, uid, wait, timeout, scope);
        self.call(&request).await.and_then(wire::lock)
    }

    /// [`Client::lock_release`](crate::Client::lock_release).
    pub async fn lock_release(
        &mut self,
        name: &str,
        session: &str,
        uid: Option<u32>,
        scope: Scope,
    ) -> Result<Lock, ClientError> {
        let request = wire::lock_release_request(name, session, uid, scope);
        self.call(&request).await.and_then(wire::lock)
    }

    /// [`Client::lock_list`](crate::Client::lock_list).
    pub async fn lock_list(&mut self, uid: Option<u32>) -> Result<Vec<Lock>, ClientError> {
        let (mut all, mut after) = (Vec::new(), None);
        loop {
            let reply = self.call(&wire::lock_list_request(uid, after)).await?;
            match wire::locks_page(reply, &mut all)? {
                Some(next) => after = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// [`Client::subscribe`](crate::Client::subscribe): a subscription that reconnects and
    /// resumes as [`Subscription`](crate::Subscription) does.
    pub async fn subscribe(
        self,
        cursor: Option<Cursor>,
        filter: Filter,
    ) -> Result<AsyncSubscription, ClientError> {
        let mut subscription = AsyncSubscription {
            client: None,
            socket: self.socket.clone(),
            position: Position { filter, cursor },
            retry: Retry::default(),
        };
        match subscription.subscribe_on(self).await {
            // The daemon went away between connecting and subscribing: it may be restarting.
            Err(e) if e.is_transient() => subscription.reconnect().await?,
            result => result?,
        }
        Ok(subscription)
    }

    /// [`Client::wait_for_end`](crate::Client::wait_for_end): subscribe, look, wait;
    /// daemon restarts are survived.
    pub async fn wait_for_end(
        self,
        session: &str,
        uid: Option<u32>,
    ) -> Result<Session, ClientError> {
        let socket = self.socket.clone();
        let filter = Filter {
            session: Some(session.to_owned()),
            uid,
        };
        let mut events = self.subscribe(None, filter).await?;
        let current = get_retrying(&socket, session, uid).await?;
        if current.phase == Phase::Ended {
            return Ok(current);
        }
        loop {
            if let Item::Event(event) = events.next_item().await?
                && event.kind == EventKind::Ended
            {
                return get_retrying(&socket, &event.session, Some(event.creator_uid)).await;
            }
        }
    }
}

/// `get` on a fresh connection, waiting for a restarting daemon as [`Retry::default`] says.
async fn get_retrying(
    socket: &Path,
    session: &str,
    uid: Option<u32>,
) -> Result<Session, ClientError> {
    let mut backoff = Backoff::new(Retry::default());
    loop {
        let attempt = async { AsyncClient::connect(socket).await?.get(session, uid).await };
        match attempt.await {
            Err(e) => tokio::time::sleep(backoff.after(e)?).await,
            result => return result,
        }
    }
}

/// The async [`Subscription`](crate::Subscription): every event once, across daemon
/// restarts, bounded by its [`Retry`].
#[derive(Debug)]
pub struct AsyncSubscription {
    client: Option<AsyncClient>,
    socket: PathBuf,
    position: Position,
    retry: Retry,
}

impl AsyncSubscription {
    /// Sets how reconnections are retried (the default is [`Retry::default`]).
    pub fn with_retry(mut self, retry: Retry) -> AsyncSubscription {
        self.retry = retry;
        self
    }

    /// The last delivered event and its store.
    pub fn cursor(&self) -> Option<&Cursor> {
        self.position.cursor.as_ref()
    }

    async fn subscribe_on(&mut self, mut client: AsyncClient) -> Result<(), ClientError> {
        let reply = client.call(&self.position.request()).await?;
        self.position.acknowledged(wire::acknowledgement(reply)?);
        self.client = Some(client);
        Ok(())
    }

    async fn reconnect(&mut self) -> Result<(), ClientError> {
        let mut backoff = Backoff::new(self.retry);
        loop {
            let attempt = match AsyncClient::connect(&self.socket).await {
                Ok(client) => self.subscribe_on(client).await,
                Err(e) => Err(e),
            };
            match attempt {
                Err(e) => tokio::time::sleep(backoff.after(e)?).await,
                Ok(()) => return Ok(()),
            }
        }
    }

    /// [`Subscription::next_item`](crate::Subscription::next_item).
    pub async fn next_item(&mut self) -> Result<Item, ClientError> {
        loop {
            let Some(client) = &mut self.client else {
                self.reconnect().await?;
                continue;
            };
            let read = match client.read_line().await {
                Ok(line) => wire::decode_message(&line),
                Err(e) => Err(e),
            };
            let (item, connected) = self.position.take(read);
            if !connected {
                self.client = None;
            }
            if let Some(item) = item {
                return item;
            }
        }
    }
}
