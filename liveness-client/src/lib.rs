//! A client library for livenessd, the exit-notification daemon.
//!
//! [`Client`] makes one typed call per request of the protocol (`docs/protocol.md`):
//! [`register`](Client::register), [`rename`](Client::rename), [`touch`](Client::touch),
//! [`end`](Client::end), [`get`](Client::get), [`list`](Client::list),
//! [`whose`](Client::whose), [`status`](Client::status),
//! [`lock_acquire`](Client::lock_acquire), [`lock_release`](Client::lock_release),
//! [`lock_list`](Client::lock_list), [`subscribe`](Client::subscribe), and, of a daemon
//! in a fleet, [`fleet`](Client::fleet) and [`fleet_watch`](Client::fleet_watch). A refusal by the daemon is a
//! [`ClientError::Daemon`] carrying its [`ErrorCode`] and message.
//!
//! A [`Subscription`] reconnects to a restarted daemon and resumes after the last event it
//! delivered (bounded by [`Retry`]), so a consumer sees every event once.
//! [`Client::wait_for_end`] builds on it: it subscribes, then looks, then waits.
//!
//! The vocabulary (sessions, events, error codes) is [`liveness_common`]'s. This crate
//! links neither SQLite nor an eBPF loader; the `liveness` CLI is built on it.
//!
//! # Example
//!
//! Register a process as a session's owner, wait for the session to end (across daemon
//! restarts), and print how the owner exited (`examples/wait_for_exit.rs`):
//!
//! ```no_run
#![doc = include_str!("../examples/wait_for_exit.rs")]
//! ```

#![warn(missing_docs)]

mod error;
pub mod fdpass;
#[cfg(feature = "tokio")]
pub mod nonblocking;
mod subscription;
mod wire;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use liveness_common;
use liveness_common::action::ActionSpec;
use liveness_common::activity::StallPolicy;
use liveness_common::fleet::FleetView;
use liveness_common::identity::Identity;
use liveness_common::lock::Lock;
pub use liveness_common::lock::Scope;
pub use liveness_common::protocol::ErrorCode;
use liveness_common::protocol::{Reply, Request, StreamMessage, Subscribed};
use liveness_common::request;
use liveness_common::request::CgroupLimits;
use liveness_common::session::{EventKind, OnEnd, Phase, Session, Until};
use liveness_common::status::Status;

pub use crate::error::ClientError;
use crate::fdpass::send_with_fds;
pub use crate::subscription::{Filter, Item, Line, Retry, Subscription};

/// The socket of the daemon this process would talk to by default: `$LIVENESS_SOCKET`,
/// else the user's own daemon's socket if it exists, else the system daemon's
/// (`/run/liveness/liveness.sock`).
pub fn default_socket() -> PathBuf {
    liveness_proc::paths::Env::from_process().client_socket(|path| path.exists())
}

/// Who owns a session being registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// The caller's first ancestor that is not a shell or wrapper, found by the daemon from
    /// the caller's credentials (what a hook run by a tool's shell wants).
    Auto,
    /// This process, in the caller's PID namespace. It is passed as a pidfd where the
    /// kernel allows (Linux 5.3+), which names the process rather than a reusable number,
    /// and as the number otherwise.
    Pid(u32),
    /// An identity captured earlier, possibly on another host.
    Identity(Identity),
}

/// A `register` request: which session, owned by whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The session id; with `pending` it may be `None` and the daemon makes one up.
    pub session: Option<String>,
    /// The owner.
    pub owner: Owner,
    /// The real id is not known yet: [`Client::rename`] the session later, or it expires.
    pub pending: bool,
    /// Labels stored with the session and its events.
    pub labels: BTreeMap<String, String>,
    /// Root only: register in this user's namespace of session ids.
    pub uid: Option<u32>,
    /// What happens to the session's surviving processes when it ends (daemon default:
    /// [`OnEnd::Leave`]). Set when the session is created.
    pub on_end: Option<OnEnd>,
    /// Between SIGTERM and SIGKILL when they are terminated (daemon default: 10 s).
    pub grace: Option<Duration>,
    /// When the session ends by itself (daemon default: [`Until::Owner`]); with
    /// [`Until::Tree`], at the last exit of its tree. Set when the session is created.
    pub until: Option<Until>,
    /// [`Owner::Auto`]: further process names to skip as wrappers, for this registration
    /// only (added to the daemon's own `--wrapper` list).
    pub wrappers: Vec<String>,
    /// End actions, run as the caller when the session ends, whatever ends it. On a
    /// registration of an ACTIVE session they replace its list; `None` keeps it.
    pub on_end_run: Option<Vec<ActionSpec>>,
    /// How the session's stalls are judged and what they do (daemon defaults: its
    /// `--stall-after` ... and `--on-stall`). Replaces an ACTIVE session's; `None` keeps it.
    pub on_stall: Option<StallPolicy>,
    /// A cgroup of the session's own with these limits (docs/cgroups.md); without usable
    /// cgroup2 the session is registered without one, with a warning. Set when the session
    /// is created.
    pub cgroup: Option<CgroupLimits>,
    /// No cgroup, where the daemon gives every session one by default (its
    /// `--session-cgroup`).
    pub no_cgroup: bool,
}

/// The answer to [`Client::register_with_warnings`].
#[derive(Debug, Clone, PartialEq)]
pub struct Registered {
    /// The session as registered.
    pub session: Session,
    /// What succeeded but looks wrong (an owner that is a launcher, one that has already
    /// exited): worth showing to whoever registered.
    pub warnings: Vec<String>,
}

impl Registration {
    /// Session `session` owned by `owner`, not pending, without labels.
    pub fn new(session: impl Into<String>, owner: Owner) -> Registration {
        Registration {
            session: Some(session.into()),
            owner,
            pending: false,
            labels: BTreeMap::new(),
            uid: None,
            on_end: None,
            grace: None,
            until: None,
            wrappers: Vec::new(),
            on_end_run: None,
            on_stall: None,
            cgroup: None,
            no_cgroup: false,
        }
    }
}

/// The answer to [`Client::whose`].
#[derive(Debug, Clone, PartialEq)]
pub struct Whose {
    /// The active session owning the process or its nearest registered ancestor.
    pub session: Session,
    /// That owner's PID in the caller's namespace (0 when it is outside it).
    pub owner_pid: u32,
}

/// A connection to livenessd: one request, one reply, in order.
///
/// ```no_run
/// use liveness_client::{Client, Owner, Registration};
///
/// let mut client = Client::connect_default()?;
/// let session = client.register(&Registration::new("build-42", Owner::Pid(std::process::id())))?;
/// println!("{} is {:?}", session.id, session.phase);
/// # Ok::<(), liveness_client::ClientError>(())
/// ```
#[derive(Debug)]
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    socket: PathBuf,
    /// When every wait on the daemon gives up ([`Client::connect_until`]).
    deadline: Option<Instant>,
    /// Once the daemon has answered, how long each later request may take
    /// ([`Client::once_answered`]).
    answered: Option<Duration>,
}

/// The connection's socket, for what the kernel knows of it: `SO_PEERCRED` tells which
/// process the daemon is, as this process's PID namespace numbers it.
impl AsFd for Client {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.writer.as_fd()
    }
}

/// The time left until `deadline`; none left is a `TimedOut` error (a zero timeout would
/// mean no timeout to the socket).
fn left(deadline: Instant) -> std::io::Result<Duration> {
    Some(deadline.saturating_duration_since(Instant::now()))
        .filter(|left| !left.is_zero())
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::TimedOut))
}

impl Client {
    /// Connects to the daemon listening on `path`.
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.into(),
            source,
        })?;
        Client::over(stream, path, None)
    }

    /// Connects to the daemon listening on `path`, and gives up on it at `deadline`: the
    /// connection (a frozen daemon's full backlog blocks it) and every request after it
    /// then fail with an I/O error of kind `WouldBlock` or `TimedOut`. For a caller that
    /// must not wait on a frozen daemon longer than it can afford, such as an agent's hook.
    pub fn connect_until(path: &Path, deadline: Instant) -> Result<Client, ClientError> {
        let connect = || -> std::io::Result<UnixStream> {
            use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType, sockopt};
            let socket = rustix::net::socket_with(
                AddressFamily::UNIX,
                SocketType::STREAM,
                SocketFlags::CLOEXEC,
                None,
            )?;
            // Linux bounds a blocking connect on a Unix socket by its send timeout.
            sockopt::set_socket_timeout(&socket, sockopt::Timeout::Send, Some(left(deadline)?))?;
            rustix::net::connect(&socket, &SocketAddrUnix::new(path)?)?;
            Ok(UnixStream::from(socket))
        };
        let stream = connect().map_err(|source| ClientError::Connect {
            path: path.into(),
            source,
        })?;
        Client::over(stream, path, Some(deadline))
    }

    fn over(
        stream: UnixStream,
        path: &Path,
        deadline: Option<Instant>,
    ) -> Result<Client, ClientError> {
        let writer = stream.try_clone()?;
        Ok(Client {
            reader: BufReader::new(stream),
            writer,
            socket: path.into(),
            deadline,
            answered: None,
        })
    }

    /// After a [`Client::connect_until`]: once the daemon has answered a request, each later
    /// one may take `each`. A daemon that answers is alive, and a caller that has begun a
    /// sequence of requests (an end hook telling the daemon that the agent ran its end
    /// commands, then ending the session) is better served by finishing it than by giving
    /// up halfway; one that never answers is still given up on at the first deadline.
    pub fn once_answered(mut self, each: Duration) -> Client {
        self.answered = Some(each);
        self
    }

    /// Connects to the daemon at [`default_socket`].
    pub fn connect_default() -> Result<Client, ClientError> {
        Client::connect(&default_socket())
    }

    /// The socket this client connected to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn send(&mut self, request: &Request, fds: &[BorrowedFd<'_>]) -> Result<(), ClientError> {
        if let Some(deadline) = self.deadline {
            // The request and its reply get what is left of the time: the socket is shared
            // with the reader's, so its timeouts bound both.
            let left = left(deadline)?;
            self.writer.set_write_timeout(Some(left))?;
            self.writer.set_read_timeout(Some(left))?;
        }
        send_with_fds(&mut self.writer, wire::encode(request)?.as_bytes(), fds)?;
        Ok(())
    }

    fn read_line(&mut self) -> Result<String, ClientError> {
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        // Nothing at the end of the connection, or a line it cut short.
        if !line.ends_with('\n') {
            return Err(ClientError::Closed);
        }
        if let Some(each) = self.answered {
            self.deadline = Some(Instant::now() + each);
        }
        Ok(line)
    }

    /// Sends one request and returns its reply; an error reply is [`ClientError::Daemon`].
    ///
    /// The typed calls below are built on it; it serves requests they do not cover.
    pub fn call(&mut self, request: &Request) -> Result<Reply, ClientError> {
        self.call_with_fds(request, &[])
    }

    /// [`Client::call`] with descriptors passed along with the request line (`SCM_RIGHTS`;
    /// a pidfd owner is `{"pidfd": I}`, the `I`-th of them).
    pub fn call_with_fds(
        &mut self,
        request: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Reply, ClientError> {
        self.send(request, fds)?;
        wire::decode_reply(&self.read_line()?)
    }

    /// A call whose reply carries one session.
    fn session_call(&mut self, request: &Request) -> Result<Session, ClientError> {
        self.call(request).and_then(wire::session)
    }

    /// Registers a session and its owner (or gives an active session a new owner).
    ///
    /// An [`Owner::Pid`] is sent as a pidfd where the kernel allows; a process that does
    /// not exist is [`ClientError::NoSuchProcess`] without asking the daemon.
    ///
    /// ```no_run
    /// # use liveness_client::{Client, Owner, Registration};
    /// let mut client = Client::connect_default()?;
    /// let mut registration = Registration::new("agent-7", Owner::Auto);
    /// registration.labels.insert("tool".into(), "editor".into());
    /// let session = client.register(&registration)?;
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn register(&mut self, registration: &Registration) -> Result<Session, ClientError> {
        self.register_with_warnings(registration)
            .map(|registered| registered.session)
    }

    /// [`Client::register`], with the daemon's warnings about the registration.
    pub fn register_with_warnings(
        &mut self,
        registration: &Registration,
    ) -> Result<Registered, ClientError> {
        let (request, pidfd) = wire::register_request(registration)?;
        let fds: Vec<_> = pidfd.iter().map(AsFd::as_fd).collect();
        self.call_with_fds(&request, &fds)
            .and_then(wire::registered)
    }

    /// Registers `session` with `owner: "auto"`: the daemon walks up from this process
    /// past shells and wrappers to the program that owns it (what a hook wants).
    ///
    /// ```no_run
    /// # use liveness_client::Client;
    /// Client::connect_default()?.register_auto("agent-7")?;
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn register_auto(&mut self, session: &str) -> Result<Session, ClientError> {
        self.register(&Registration::new(session, Owner::Auto))
    }

    /// Gives the pending session `session` its real id `to`.
    ///
    /// ```no_run
    /// # use liveness_client::Client;
    /// Client::connect_default()?.rename("pending-1", "agent-7", None)?;
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn rename(
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
    }

    /// Records activity, postponing the inactivity timeout of an owner that cannot be
    /// watched.
    ///
    /// ```no_run
    /// # use liveness_client::Client;
    /// Client::connect_default()?.touch("agent-7", None)?;
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn touch(&mut self, session: &str, uid: Option<u32>) -> Result<Session, ClientError> {
        self.session_call(&Request::Touch(request::Touch {
            session: session.into(),
            uid,
            ..request::Touch::default()
        }))
    }

    /// Records activity and declares the agent's phase, as its hooks see it: a turn's
    /// start or end, a tool's start (`tool`) or end (`tool_end`). The daemon judges a
    /// stall by it (see docs/activity.md).
    ///
    /// ```no_run
    /// # use liveness_client::Client;
    /// use liveness_common::activity::TurnMark;
    /// use liveness_common::request::Touch;
    /// Client::connect_default()?.declare(&Touch {
    ///     session: "agent-7".into(),
    ///     turn: Some(TurnMark::Start),
    ///     ..Touch::default()
    /// })?;
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn declare(&mut self, touch: &request::Touch) -> Result<Session, ClientError> {
        self.session_call(&Request::Touch(touch.clone()))
    }

    /// Ends a session now (reason `stopped`).
    ///
    /// ```no_run
    /// # use liveness_client::Client;
    /// let ended = Client::connect_default()?.end("agent-7", None)?;
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn end(&mut self, session: &str, uid: Option<u32>) -> Result<Session, ClientError> {
        self.session_call(&Request::End(request::End {
            session: session.into(),
            uid,
            terminate: false,
        }))
    }

    /// Says that the session's end commands were run by the caller itself (an agent's own
    /// end hook): its end actions that have not started are recorded as skipped, and
    /// never run.
    pub fn actions_done(
        &mut self,
        session: &str,
        uid: Option<u32>,
    ) -> Result<Session, ClientError> {
        self.session_call(&Request::ActionsDone(request::ActionsDone {
            session: session.into(),
            uid,
        }))
    }

    /// One session (`uid`: root only, the session of that user).
    ///
    /// ```no_run
    /// # use liveness_client::Client;
    /// let session = Client::connect_default()?.get("agent-7", None)?;
    /// println!("{:?} {:?}", session.phase, session.exit);
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn get(&mut self, session: &str, uid: Option<u32>) -> Result<Session, ClientError> {
        self.session_call(&Request::Get(request::Get {
            session: session.into(),
            uid,
        }))
    }

    /// Every session the caller may see (in `phase` if given), oldest first, following
    /// the daemon's pages on this connection.
    ///
    /// ```no_run
    /// # use liveness_client::Client;
    /// use liveness_client::liveness_common::session::Phase;
    /// for session in Client::connect_default()?.list(Some(Phase::Active))? {
    ///     println!("{}", session.id);
    /// }
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn list(&mut self, phase: Option<Phase>) -> Result<Vec<Session>, ClientError> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let reply = self.call(&Request::List(request::List {
                phase,
                limit: None,
                after: after.take(),
            }))?;
            all.extend(reply.sessions.unwrap_or_default());
            match reply.next {
                Some(next) => after = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// The active session that owns process `pid` (in the caller's namespace) or its
    /// nearest registered ancestor; [`ErrorCode::NotFound`] if none does.
    ///
    /// ```no_run
    /// # use liveness_client::Client;
    /// let found = Client::connect_default()?.whose(std::process::id())?;
    /// println!("{} (owner PID {})", found.session.id, found.owner_pid);
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn whose(&mut self, pid: u32) -> Result<Whose, ClientError> {
        self.call(&Request::Whose(request::Whose { pid }))
            .and_then(wire::whose)
    }

    /// The daemon's state: exit sources, counters, versions.
    ///
    /// ```no_run
    /// # use liveness_client::Client;
    /// let status = Client::connect_default()?.status()?;
    /// println!("livenessd {}, head seq {}", status.daemon.version, status.head_seq);
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn status(&mut self) -> Result<Status, ClientError> {
        self.call(&Request::Status(request::Status {}))
            .and_then(wire::status)
    }

    /// Turns this connection into a [`Subscription`] to the events after `cursor` (from
    /// now on without one) that pass `filter`. It reconnects to a restarted daemon as its
    /// [`Retry`] says.
    ///
    /// ```no_run
    /// # use liveness_client::{Client, Cursor, Filter};
    /// let saved = Cursor::parse("41 6f1d0c2e").unwrap();
    /// let events = Client::connect_default()?.subscribe(Some(saved), Filter::default())?;
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn subscribe(
        self,
        cursor: Option<Cursor>,
        filter: Filter,
    ) -> Result<Subscription, ClientError> {
        Subscription::start(self, cursor, filter)
    }

    /// Takes lock `name` for `session` (`uid`: root only, that user's session) and returns
    /// it with its fencing token. Held by another session: [`ErrorCode::LockHeld`] at once,
    /// or with `wait`, after waiting in line for it (up to `timeout`, if given).
    /// [`Scope::Cluster`]: a fleet lock, held in etcd (docs/fleet.md).
    ///
    /// ```no_run
    /// # use liveness_client::{Client, Scope};
    /// let mut client = Client::connect_default()?;
    /// let lock = client.lock_acquire("build", "agent-7", None, true, None, Scope::Host)?;
    /// println!("token {}", lock.token);
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn lock_acquire(
        &mut self,
        name: &str,
        session: &str,
        uid: Option<u32>,
        wait: bool,
        timeout: Option<Duration>,
        scope: Scope,
    ) -> Result<Lock, ClientError> {
        self.call(&wire::lock_acquire_request(
            name, session, uid, wait, timeout, scope,
        ))
        .and_then(wire::lock)
    }

    /// Releases lock `name`, which `session` holds; returns it as it was held.
    ///
    /// ```no_run
    /// # use liveness_client::{Client, Scope};
    /// Client::connect_default()?.lock_release("build", "agent-7", None, Scope::Host)?;
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn lock_release(
        &mut self,
        name: &str,
        session: &str,
        uid: Option<u32>,
        scope: Scope,
    ) -> Result<Lock, ClientError> {
        self.call(&wire::lock_release_request(name, session, uid, scope))
            .and_then(wire::lock)
    }

    /// The held locks the caller may see (`uid`: root only, that user's), with how many
    /// requests wait for each.
    ///
    /// ```no_run
    /// # use liveness_client::Client;
    /// for lock in Client::connect_default()?.lock_list(None)? {
    ///     println!("{} held by {} (token {})", lock.name, lock.session, lock.token);
    /// }
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn lock_list(&mut self, uid: Option<u32>) -> Result<Vec<Lock>, ClientError> {
        let (mut all, mut after) = (Vec::new(), None);
        loop {
            let reply = self.call(&wire::lock_list_request(uid, after))?;
            match wire::locks_page(reply, &mut all)? {
                Some(next) => after = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// The fleet's hosts and their ACTIVE sessions with every one of `labels` (all of
    /// them if empty), read from etcd by a daemon started with `--etcd` (docs/fleet.md).
    ///
    /// ```no_run
    /// # use liveness_client::Client;
    /// for host in Client::connect_default()?.fleet(Default::default())?.hosts {
    ///     println!("{} online={} sessions={}", host.host_id, host.online, host.sessions.len());
    /// }
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn fleet(&mut self, labels: BTreeMap<String, String>) -> Result<FleetView, ClientError> {
        let reply = self.call(&Request::Fleet(request::Fleet { labels }))?;
        reply.fleet.ok_or_else(|| wire::missing("fleet"))
    }

    /// Turns this connection into a [`FleetWatch`]: the fleet's changes after etcd's
    /// revision `since` (an earlier view's or change's), or, without it, the present view
    /// and the changes after it; only those of sessions with every one of `labels`.
    ///
    /// ```no_run
    /// # use liveness_client::Client;
    /// use liveness_client::liveness_common::protocol::StreamMessage;
    /// let mut watch = Client::connect_default()?.fleet_watch(None, Default::default())?;
    /// while let StreamMessage::FleetChange(change) = watch.next_message()? {
    ///     println!("{} {:?} {}", change.revision, change.change, change.host_id);
    /// }
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn fleet_watch(
        mut self,
        since: Option<i64>,
        labels: BTreeMap<String, String>,
    ) -> Result<FleetWatch, ClientError> {
        let reply = self.call(&Request::FleetWatch(request::FleetWatch { since, labels }))?;
        Ok(FleetWatch {
            view: reply.fleet,
            client: self,
        })
    }

    /// Sends a `subscribe` request and returns the acknowledgement; stream lines follow.
    fn subscribe_raw(&mut self, request: &Request) -> Result<Subscribed, ClientError> {
        self.call(request).and_then(wire::acknowledgement)
    }

    /// The next stream line after `subscribe`.
    fn next_message(&mut self) -> Result<StreamMessage, ClientError> {
        wire::decode_message(&self.read_line()?)
    }

    /// The next stream line after `subscribe`, an event left as the daemon sent it.
    fn next_line(&mut self) -> Result<Line, ClientError> {
        wire::decode_line(self.read_line()?)
    }

    /// Blocks until `session` has ended and returns it as ended, surviving daemon restarts
    /// (see [`Retry`]).
    ///
    /// It subscribes to the session's events first and then looks it up, so an end that
    /// happens in between is still seen.
    ///
    /// ```no_run
    /// # use liveness_client::Client;
    /// let ended = Client::connect_default()?.wait_for_end("agent-7", None)?;
    /// println!("{:?}", ended.exit);
    /// # Ok::<(), liveness_client::ClientError>(())
    /// ```
    pub fn wait_for_end(self, session: &str, uid: Option<u32>) -> Result<Session, ClientError> {
        self.wait_until(session, uid, |session| session.phase == Phase::Ended)
    }

    /// Like [`Client::wait_for_end`], until the session is also finalized: each of its end
    /// actions has its outcome (`session.finalized`). A session without end actions is
    /// final once it has ended.
    pub fn wait_for_finalized(
        self,
        session: &str,
        uid: Option<u32>,
    ) -> Result<Session, ClientError> {
        self.wait_until(session, uid, Session::is_finalized)
    }

    /// Follows the session's events until `done` holds of it.
    fn wait_until(
        self,
        session: &str,
        uid: Option<u32>,
        done: fn(&Session) -> bool,
    ) -> Result<Session, ClientError> {
        let socket = self.socket.clone();
        let filter = Filter {
            session: Some(session.to_owned()),
            uid,
        };
        let mut events = self.subscribe(None, filter)?;
        // The daemon may restart at any point: every look-up waits for it as the stream does.
        let retry = Retry::default();
        let current = retry.run(|| Client::connect(&socket)?.get(session, uid))?;
        if done(&current) {
            return Ok(current);
        }
        loop {
            if let Item::Event(event) = events.next_item()?
                && matches!(event.kind, EventKind::Ended | EventKind::Finalized)
            {
                let current = retry.run(|| {
                    Client::connect(&socket)?.get(&event.session, Some(event.creator_uid))
                })?;
                if done(&current) {
                    return Ok(current);
                }
            }
        }
    }
}

/// Where a consumer stands in the event stream: the seq it handled last, and the store that
/// seq belongs to (unknown for a bare seq, such as `--since`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The last event handled.
    pub seq: u64,
    /// The store `seq` belongs to.
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
    fn cursors_read_both_forms() {
        let old = Cursor::parse("42\n").expect("a bare seq, as earlier versions wrote");
        assert_eq!((old.seq, old.store_id.as_deref()), (42, None));
        let cursor = Cursor::parse("42 0123abcd\n").expect("seq and store id");
        assert_eq!(cursor.store_id.as_deref(), Some("0123abcd"));
        assert_eq!(Cursor::parse(&cursor.to_string()), Some(cursor.clone()));
        for bad in ["", "x", "-1", "1 a b"] {
            assert_eq!(Cursor::parse(bad), None, "{bad:?} is no cursor");
        }
    }
}

/// The fleet's changes, as [`Client::fleet_watch`] follows them: `fleet_change` lines,
/// then `goodbye` when the daemon stops or etcd ends the watch (watch again with `since`,
/// the last change's revision).
#[derive(Debug)]
pub struct FleetWatch {
    /// The view the changes follow, when the watch started without `since`.
    pub view: Option<FleetView>,
    client: Client,
}

impl FleetWatch {
    /// The next line: a [`StreamMessage::FleetChange`], or `goodbye`.
    pub fn next_message(&mut self) -> Result<StreamMessage, ClientError> {
        self.client.next_message()
    }
}
