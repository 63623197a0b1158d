//! The TCP sockets a process holds, as the kernel tells them: which sockets it holds
//! (`/proc/<pid>/fd` links `socket:[INODE]`), and for each, from `NETLINK_SOCK_DIAG`
//! (`inet_diag`, with `struct tcp_info`), its addresses, state, queues, byte counters and
//! how long ago data last came and went.
//!
//! sock_diag answers for the network namespace its netlink socket was made in.
//! [`DiagSockets`] keeps one netlink socket open per namespace, keyed by the namespace's
//! inode; one for another process's namespace is made on a short-lived thread that enters
//! it (`setns`), which needs `CAP_SYS_ADMIN`: the caller's own threads never change
//! namespace. Sampling goes by [`Round`]: within one, each namespace is dumped once, at
//! the first question about one of its processes, and that dump serves all of them.
//!
//! Everything here blocks (briefly: the kernel answers a dump at once, and a reply later
//! than 5 s is an error): call it from a sampling thread, never from the death path.
//!
//! ```no_run
//! use liveness_proc::identity::ProcRoot;
//! use liveness_proc::sockets::{DiagSockets, TcpState};
//!
//! let mut sockets = DiagSockets::new(ProcRoot::default());
//! // Each sampling tick: one round, asked about every process of interest.
//! let mut round = sockets.round();
//! for pid in [4242, 4243] {
//!     for socket in round.process_tcp(pid)? {
//!         if socket.state == TcpState::Established {
//!             println!(
//!                 "{} -> {}: {} bytes unread, last data {:?} ms ago",
//!                 socket.local, socket.peer, socket.rqueue, socket.info.last_data_recv_ms
//!             );
//!         }
//!     }
//! }
//! # Ok::<(), liveness_proc::sockets::SocketsError>(())
//! ```
//!
//! The few netlink structs are packed and read by hand, at the offsets of
//! `linux/netlink.h`, `linux/inet_diag.h` and `linux/tcp.h` (named beside each constant).
//! The parsing is pure ([`parse_reply`]) and checks every length before it reads: a
//! truncated or garbled reply is an error, never a read past its end.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType, netlink};

use crate::identity::ProcRoot;

/// `sizeof(struct nlmsghdr)`: `u32 len, u16 type, u16 flags, u32 seq, u32 pid`.
const NLMSG_HDRLEN: usize = 16;
/// Message types of `linux/netlink.h`.
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// `linux/sock_diag.h`: the request and reply type of an `inet_diag_req_v2` dump.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
/// `NLM_F_ROOT | NLM_F_MATCH`.
const NLM_F_DUMP: u16 = 0x300;
/// `sizeof(struct inet_diag_req_v2)`: family, protocol, extensions, pad, states (u32), and
/// a `struct inet_diag_sockid` of 48 bytes, zero to ask for every socket.
const INET_DIAG_REQ_V2_LEN: usize = 56;
/// A dump request: its netlink header and its `inet_diag_req_v2`.
const DUMP_REQUEST_LEN: usize = NLMSG_HDRLEN + INET_DIAG_REQ_V2_LEN;
/// `sizeof(struct inet_diag_msg)`: family, state, timer, retrans (u8 each); the sockid
/// (ports `be16` at 4 and 6, addresses `be32[4]` at 8 and 24, interface at 40, cookie at
/// 44); expires, rqueue, wqueue, uid, inode (u32 each, at 52..72).
const INET_DIAG_MSG_LEN: usize = 72;
/// The attribute of an `inet_diag_msg` that holds `struct tcp_info`.
const INET_DIAG_INFO: u16 = 2;
/// Attribute types carry two flag bits (`NLA_F_NESTED`, `NLA_F_NET_BYTEORDER`).
const NLA_TYPE_MASK: u16 = 0x3fff;
/// Sockets no process holds (inode 0) are asked of the kernel not at all: TIME_WAIT, and
/// connection requests (SYN_RECV, NEW_SYN_RECV), which can be most of a busy host's.
const STATES: u32 = !((1 << 6) | (1 << 3) | (1 << 12));
/// A dump's reply parts are at most 32 KiB (`netlink_recvmsg` caps them so); more is room.
const RECV_BYTES: usize = 64 * 1024;
/// The kernel answers a dump at once; a reply this late means something is wrong, and a
/// sampler must not wait forever on it.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum SocketsError {
    #[error("no process with PID {0}")]
    NoSuchProcess(u32),
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error(
        "cannot enter network namespace {namespace}: that needs CAP_SYS_ADMIN, which this process lacks; only the sockets of its own network namespace can be read"
    )]
    NamespaceDenied { namespace: u64 },
    #[error("cannot enter network namespace {namespace}: {source}")]
    Enter { namespace: u64, source: io::Error },
    #[error("sock_diag netlink socket: {what}: {source}")]
    Netlink {
        what: &'static str,
        source: io::Error,
    },
    #[error(
        "this kernel has no TCP sock_diag (the tcp_diag module is neither built in nor loaded)"
    )]
    NoTcpDiag,
    #[error("the kernel refused the TCP socket dump: {0}")]
    Refused(io::Error),
    #[error("malformed sock_diag reply: {0}")]
    Malformed(&'static str),
}

/// A TCP state, as `include/net/tcp_states.h` numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpState {
    Established,
    SynSent,
    SynRecv,
    FinWait1,
    FinWait2,
    TimeWait,
    Close,
    CloseWait,
    LastAck,
    Listen,
    Closing,
    NewSynRecv,
    /// A number this code does not know (`TCP_BOUND_INACTIVE`, 6.10+, and any later one).
    Other(u8),
}

impl TcpState {
    fn from_kernel(state: u8) -> TcpState {
        match state {
            1 => TcpState::Established,
            2 => TcpState::SynSent,
            3 => TcpState::SynRecv,
            4 => TcpState::FinWait1,
            5 => TcpState::FinWait2,
            6 => TcpState::TimeWait,
            7 => TcpState::Close,
            8 => TcpState::CloseWait,
            9 => TcpState::LastAck,
            10 => TcpState::Listen,
            11 => TcpState::Closing,
            12 => TcpState::NewSynRecv,
            other => TcpState::Other(other),
        }
    }
}

/// The fields of `struct tcp_info` read here. The struct grew over the kernel's life; a
/// field the kernel's copy is too short to hold is `None` (`bytes_acked` came in 4.1,
/// `bytes_received` in 4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpInfo {
    /// `tcpi_bytes_received`: payload bytes received (and acknowledged) since the start.
    pub bytes_received: Option<u64>,
    /// `tcpi_bytes_acked`: payload bytes sent and acknowledged by the peer.
    pub bytes_acked: Option<u64>,
    /// `tcpi_last_data_recv`: milliseconds since data last arrived.
    pub last_data_recv_ms: Option<u32>,
    /// `tcpi_last_data_sent`: milliseconds since data was last sent.
    pub last_data_sent_ms: Option<u32>,
}

/// Offsets in `struct tcp_info` (`linux/tcp.h`).
const TCPI_LAST_DATA_SENT: usize = 44;
const TCPI_LAST_DATA_RECV: usize = 52;
const TCPI_BYTES_ACKED: usize = 120;
const TCPI_BYTES_RECEIVED: usize = 128;

impl TcpInfo {
    /// Reads the fields the kernel's copy (`bytes`, as long as it gave it) holds.
    pub fn parse(bytes: &[u8]) -> TcpInfo {
        TcpInfo {
            bytes_received: ne_u64(bytes, TCPI_BYTES_RECEIVED),
            bytes_acked: ne_u64(bytes, TCPI_BYTES_ACKED),
            last_data_recv_ms: ne_u32(bytes, TCPI_LAST_DATA_RECV),
            last_data_sent_ms: ne_u32(bytes, TCPI_LAST_DATA_SENT),
        }
    }
}

/// One TCP socket, as one dump saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpSocket {
    /// The socket's inode: `socket:[INODE]` in its holders' `/proc/<pid>/fd`.
    pub inode: u64,
    pub local: SocketAddr,
    /// The unspecified address and port 0 for a listener.
    pub peer: SocketAddr,
    pub state: TcpState,
    /// `idiag_rqueue`: when established, the bytes received that the process has not read
    /// yet; when listening, the connections waiting to be accepted.
    pub rqueue: u32,
    /// `idiag_wqueue`: when established, the bytes written and not yet acknowledged; when
    /// listening, the backlog.
    pub wqueue: u32,
    /// All `None` when the kernel sent no `tcp_info`.
    pub info: TcpInfo,
}

/// The TCP sockets (IPv4 and IPv6) of one network namespace that some process holds, by
/// inode, as one dump saw them.
#[derive(Debug)]
pub struct TcpDump {
    namespace: u64,
    sockets: HashMap<u64, TcpSocket>,
}

impl TcpDump {
    /// The inode of the network namespace dumped.
    pub fn namespace(&self) -> u64 {
        self.namespace
    }

    pub fn get(&self, inode: u64) -> Option<&TcpSocket> {
        self.sockets.get(&inode)
    }
}

/// The inode of `target` when it is a socket link's (`socket:[INODE]`), as in
/// `/proc/<pid>/fd`. A file that merely has such a name reads as a path, never bare.
pub fn parse_socket_link(target: &[u8]) -> Option<u64> {
    let digits = target.strip_prefix(b"socket:[")?.strip_suffix(b"]")?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The inodes of the sockets (of every kind) process `pid` holds, from the links in
/// `<proc>/<pid>/fd`, sorted and each once. A descriptor closed during the walk is left out.
/// The table read is the one the process's leader shares with its threads.
pub fn socket_inodes(proc: &ProcRoot, pid: u32) -> Result<Vec<u64>, SocketsError> {
    let dir = proc.path().join(format!("{pid}/fd"));
    let gone = |source: io::Error, path: PathBuf| match source.raw_os_error() {
        Some(libc::ENOENT | libc::ESRCH) => SocketsError::NoSuchProcess(pid),
        _ => SocketsError::Read { path, source },
    };
    let entries = std::fs::read_dir(&dir).map_err(|e| gone(e, dir.clone()))?;
    let mut inodes = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| gone(e, dir.clone()))?;
        if let Ok(target) = std::fs::read_link(entry.path())
            && let Some(inode) = parse_socket_link(target.as_os_str().as_bytes())
        {
            inodes.push(inode);
        }
    }
    inodes.sort_unstable();
    inodes.dedup();
    Ok(inodes)
}

/// Netlink sockets for sock_diag, one per network namespace, kept open from round to
/// round. A socket keeps its namespace alive, so its inode cannot name another namespace
/// while it is a key here; a namespace none of whose processes was asked about in a round
/// has its socket closed when the next round begins.
#[derive(Debug)]
pub struct DiagSockets {
    proc: ProcRoot,
    open: HashMap<u64, DiagSocket>,
    used: HashSet<u64>,
}

impl DiagSockets {
    /// Reads processes and their namespaces through `proc` (the live `/proc`: a crafted
    /// tree has no namespaces to enter).
    pub fn new(proc: ProcRoot) -> DiagSockets {
        DiagSockets {
            proc,
            open: HashMap::new(),
            used: HashSet::new(),
        }
    }

    /// Begins a sampling round: until it is dropped, each namespace is dumped at most once.
    pub fn round(&mut self) -> Round<'_> {
        let used = std::mem::take(&mut self.used);
        self.open.retain(|namespace, _| used.contains(namespace));
        Round {
            sockets: self,
            dumps: HashMap::new(),
            denied: HashSet::new(),
        }
    }
}

/// One sampling round: the dumps taken in it, one per namespace.
#[derive(Debug)]
pub struct Round<'a> {
    sockets: &'a mut DiagSockets,
    dumps: HashMap<u64, TcpDump>,
    /// Namespaces this process may not enter: asked again in this round, they are refused
    /// without another thread.
    denied: HashSet<u64>,
}

impl Round<'_> {
    /// The TCP sockets process `pid` holds: its socket inodes found in its network
    /// namespace's dump (the round's, taken now if it is the namespace's first question).
    pub fn process_tcp(&mut self, pid: u32) -> Result<Vec<TcpSocket>, SocketsError> {
        let inodes = socket_inodes(&self.sockets.proc, pid)?;
        self.tcp_of(pid, &inodes)
    }

    /// The TCP sockets among `inodes`, which [`socket_inodes`] found `pid` holding: only
    /// this round's dump of its namespace is read.
    pub fn tcp_of(&mut self, pid: u32, inodes: &[u64]) -> Result<Vec<TcpSocket>, SocketsError> {
        // Most processes hold no socket: their namespace need not even be looked up.
        if inodes.is_empty() {
            return Ok(Vec::new());
        }
        let dump = self.dump_of(pid)?;
        Ok(inodes
            .iter()
            .filter_map(|inode| dump.get(*inode).cloned())
            .collect())
    }

    /// The dump of the network namespace process `pid` is in, taken in this round.
    /// Another namespace than the calling thread's is entered by a short-lived thread,
    /// which needs `CAP_SYS_ADMIN` ([`SocketsError::NamespaceDenied`] without it).
    pub fn dump_of(&mut self, pid: u32) -> Result<&TcpDump, SocketsError> {
        let proc = &self.sockets.proc;
        let (handle, namespace) = open_namespace(proc, pid)?;
        if self.dumps.contains_key(&namespace) {
            return Ok(&self.dumps[&namespace]);
        }
        if self.denied.contains(&namespace) {
            return Err(SocketsError::NamespaceDenied { namespace });
        }
        self.sockets.used.insert(namespace);
        let socket = match self.sockets.open.entry(namespace) {
            std::collections::hash_map::Entry::Occupied(open) => open.into_mut(),
            std::collections::hash_map::Entry::Vacant(vacant) => {
                let own = proc.path().join("thread-self/ns/net");
                let own = std::fs::metadata(&own)
                    .map_err(|source| SocketsError::Read { path: own, source })?
                    .ino();
                let fd = if own == namespace {
                    open_netlink()
                } else {
                    open_netlink_in(handle, namespace)
                };
                match fd {
                    Ok(fd) => vacant.insert(DiagSocket { fd, seq: 0 }),
                    Err(e) => {
                        if matches!(e, SocketsError::NamespaceDenied { .. }) {
                            self.denied.insert(namespace);
                        }
                        return Err(e);
                    }
                }
            }
        };
        match socket.dump_tcp() {
            Ok(sockets) => Ok(self.dumps.entry(namespace).or_insert(TcpDump {
                namespace,
                sockets: sockets.into_iter().map(|s| (s.inode, s)).collect(),
            })),
            Err(e) => {
                // What is left of a failed dump may still be queued: never read it as the
                // next one's.
                self.sockets.open.remove(&namespace);
                Err(e)
            }
        }
    }
}

/// The network namespace of process `pid` (`<proc>/<pid>/ns/net`) opened, and its inode.
fn open_namespace(proc: &ProcRoot, pid: u32) -> Result<(OwnedFd, u64), SocketsError> {
    let path = proc.path().join(format!("{pid}/ns/net"));
    let file = std::fs::File::open(&path).map_err(|source| match source.raw_os_error() {
        Some(libc::ENOENT | libc::ESRCH) => SocketsError::NoSuchProcess(pid),
        _ => SocketsError::Read {
            path: path.clone(),
            source,
        },
    })?;
    let inode = file
        .metadata()
        .map_err(|source| SocketsError::Read { path, source })?
        .ino();
    Ok((file.into(), inode))
}

/// A sock_diag netlink socket in the calling thread's network namespace.
fn open_netlink() -> Result<OwnedFd, SocketsError> {
    let netlink_error = |what| {
        move |e: Errno| SocketsError::Netlink {
            what,
            source: e.into(),
        }
    };
    let fd = rustix::net::socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        Some(netlink::SOCK_DIAG),
    )
    .map_err(netlink_error("socket"))?;
    // Connected to the kernel (port 0), the socket takes messages from it alone: any
    // process of the namespace could otherwise write forged replies to its port.
    rustix::net::connect(&fd, &netlink::SocketAddrNetlink::new(0, 0))
        .map_err(netlink_error("connect"))?;
    rustix::net::sockopt::set_socket_timeout(
        &fd,
        rustix::net::sockopt::Timeout::Recv,
        Some(REPLY_TIMEOUT),
    )
    .map_err(netlink_error("setsockopt(SO_RCVTIMEO)"))?;
    Ok(fd)
}

/// A sock_diag netlink socket in the network namespace `handle` names, made on a thread of
/// its own that enters it and ends: the namespace change ends with it.
fn open_netlink_in(handle: OwnedFd, namespace: u64) -> Result<OwnedFd, SocketsError> {
    let entering = std::thread::Builder::new()
        .name("sock-diag-setns".into())
        .spawn(move || {
            rustix::thread::move_into_link_name_space(
                handle.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .map_err(|e| match e {
                Errno::PERM => SocketsError::NamespaceDenied { namespace },
                e => SocketsError::Enter {
                    namespace,
                    source: e.into(),
                },
            })?;
            open_netlink()
        })
        .map_err(|source| SocketsError::Enter { namespace, source })?;
    entering
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// One open netlink socket and the sequence number of its last request.
#[derive(Debug)]
struct DiagSocket {
    fd: OwnedFd,
    seq: u32,
}

impl DiagSocket {
    /// Every TCP socket of the namespace that a process holds, IPv4 then IPv6.
    fn dump_tcp(&mut self) -> Result<Vec<TcpSocket>, SocketsError> {
        let mut sockets = Vec::new();
        let mut buf = vec![0u8; RECV_BYTES];
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            self.seq = self.seq.wrapping_add(1);
            let request = dump_request(family, self.seq);
            let sent = retry_eintr(|| rustix::net::send(&self.fd, &request, SendFlags::empty()))
                .map_err(|e| SocketsError::Netlink {
                    what: "send",
                    source: e.into(),
                })?;
            if sent != request.len() {
                return Err(SocketsError::Netlink {
                    what: "send",
                    source: io::Error::new(io::ErrorKind::WriteZero, "request cut short"),
                });
            }
            loop {
                // TRUNC: the length returned is the datagram's whole, so a cut one shows.
                let (_, len) =
                    retry_eintr(|| rustix::net::recv(&self.fd, &mut buf[..], RecvFlags::TRUNC))
                        .map_err(|e| SocketsError::Netlink {
                            what: "recv",
                            source: e.into(),
                        })?;
                if len > buf.len() {
                    return Err(SocketsError::Malformed("a reply larger than the buffer"));
                }
                if parse_reply(&buf[..len], self.seq, &mut sockets)? == Part::Done {
                    break;
                }
            }
        }
        Ok(sockets)
    }
}

fn retry_eintr<T>(mut call: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
    loop {
        match call() {
            Err(Errno::INTR) => continue,
            other => return other,
        }
    }
}

/// An `inet_diag_req_v2` dump request for the TCP sockets of `family` (`AF_INET` or
/// `AF_INET6`) that a process may hold, asking for `tcp_info`.
pub fn dump_request(family: u8, seq: u32) -> [u8; DUMP_REQUEST_LEN] {
    let mut request = [0u8; DUMP_REQUEST_LEN];
    request[0..4].copy_from_slice(&(DUMP_REQUEST_LEN as u32).to_ne_bytes());
    request[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    request[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    request[8..12].copy_from_slice(&seq.to_ne_bytes());
    // nlmsg_pid 0: the kernel fills in the socket's port.
    let body = &mut request[NLMSG_HDRLEN..];
    body[0] = family;
    body[1] = libc::IPPROTO_TCP as u8;
    // idiag_ext: a bit per extension, bit n - 1 for extension n.
    body[2] = 1 << (INET_DIAG_INFO - 1);
    body[4..8].copy_from_slice(&STATES.to_ne_bytes());
    request
}

/// Whether a dump goes on after one received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    More,
    Done,
}

/// Reads one datagram of a dump answering request `seq`, adding the sockets it holds (but
/// those no process holds, inode 0) to `into`. A message cut short, of another request, of
/// an unknown type or with a length that does not fit is [`SocketsError::Malformed`]; the
/// kernel's `NLMSG_ERROR` (or a `NLMSG_DONE` carrying an error) is its error.
pub fn parse_reply(
    datagram: &[u8],
    seq: u32,
    into: &mut Vec<TcpSocket>,
) -> Result<Part, SocketsError> {
    if datagram.is_empty() {
        return Err(SocketsError::Malformed("an empty datagram"));
    }
    let mut rest = datagram;
    while !rest.is_empty() {
        if rest.len() < NLMSG_HDRLEN {
            return Err(SocketsError::Malformed("a netlink header cut short"));
        }
        let len = ne_u32(rest, 0).unwrap_or_default() as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            return Err(SocketsError::Malformed(
                "a netlink message length that does not fit",
            ));
        }
        let kind = ne_u16(rest, 4).unwrap_or_default();
        if ne_u32(rest, 8) != Some(seq) {
            return Err(SocketsError::Malformed("a reply to another request"));
        }
        let payload = &rest[NLMSG_HDRLEN..len];
        match kind {
            NLMSG_DONE => {
                // Its payload is the dump's own error, 0 when it went well.
                return match ne_i32(payload, 0) {
                    Some(errno) if errno < 0 => Err(kernel_error(errno)),
                    _ => Ok(Part::Done),
                };
            }
            NLMSG_ERROR => match ne_i32(payload, 0) {
                None => return Err(SocketsError::Malformed("an error message cut short")),
                // An acknowledgement, which a dump does not ask for.
                Some(0) => {}
                Some(errno) => return Err(kernel_error(errno)),
            },
            NLMSG_NOOP => {}
            SOCK_DIAG_BY_FAMILY => {
                let socket = parse_diag_msg(payload)?;
                if socket.inode != 0 {
                    into.push(socket);
                }
            }
            _ => return Err(SocketsError::Malformed("an unexpected message type")),
        }
        // Messages are padded to 4 bytes; the last one's padding may be left off.
        rest = rest.get(align4(len)..).unwrap_or_default();
    }
    Ok(Part::More)
}

fn kernel_error(negative_errno: i32) -> SocketsError {
    let errno = negative_errno.saturating_neg();
    if errno == libc::ENOENT {
        // sock_diag has no handler for the family, and could not load one.
        SocketsError::NoTcpDiag
    } else {
        SocketsError::Refused(io::Error::from_raw_os_error(errno))
    }
}

/// One `inet_diag_msg` and its attributes.
fn parse_diag_msg(payload: &[u8]) -> Result<TcpSocket, SocketsError> {
    if payload.len() < INET_DIAG_MSG_LEN {
        return Err(SocketsError::Malformed("an inet_diag_msg cut short"));
    }
    let port = |at: usize| u16::from_be_bytes([payload[at], payload[at + 1]]);
    let interface = ne_u32(payload, 40).unwrap_or_default();
    let address = |at: usize, port: u16| -> Result<SocketAddr, SocketsError> {
        match i32::from(payload[0]) {
            libc::AF_INET => {
                let octets: [u8; 4] = payload[at..at + 4].try_into().unwrap_or_default();
                Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(octets)), port))
            }
            libc::AF_INET6 => {
                let octets: [u8; 16] = payload[at..at + 16].try_into().unwrap_or_default();
                let ip = Ipv6Addr::from(octets);
                // As getsockname(2) does: a scope only for a link-local address.
                let scope = if ip.is_unicast_link_local() {
                    interface
                } else {
                    0
                };
                Ok(SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope)))
            }
            _ => Err(SocketsError::Malformed("a family neither IPv4 nor IPv6")),
        }
    };
    let mut info = TcpInfo::default();
    let mut attributes = &payload[INET_DIAG_MSG_LEN..];
    while !attributes.is_empty() {
        let len = ne_u16(attributes, 0).map_or(0, usize::from);
        if len < 4 || len > attributes.len() {
            return Err(SocketsError::Malformed(
                "an attribute length that does not fit",
            ));
        }
        if ne_u16(attributes, 2).unwrap_or_default() & NLA_TYPE_MASK == INET_DIAG_INFO {
            info = TcpInfo::parse(&attributes[4..len]);
        }
        attributes = attributes.get(align4(len)..).unwrap_or_default();
    }
    Ok(TcpSocket {
        inode: u64::from(ne_u32(payload, 68).unwrap_or_default()),
        local: address(8, port(4))?,
        peer: address(24, port(6))?,
        state: TcpState::from_kernel(payload[1]),
        rqueue: ne_u32(payload, 56).unwrap_or_default(),
        wqueue: ne_u32(payload, 60).unwrap_or_default(),
        info,
    })
}

fn align4(len: usize) -> usize {
    len.saturating_add(3) & !3
}

fn ne_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn ne_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn ne_i32(bytes: &[u8], at: usize) -> Option<i32> {
    ne_u32(bytes, at).map(|v| v as i32)
}

fn ne_u64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::time::Instant;

    use super::*;
    use crate::fake::FakeProc;

    const SEQ: u32 = 42;

    /// A netlink message of type `kind` answering `seq`, padded to 4 bytes.
    fn message(kind: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&((NLMSG_HDRLEN + payload.len()) as u32).to_ne_bytes());
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(&0x2u16.to_ne_bytes()); // NLM_F_MULTI
        bytes.extend_from_slice(&seq.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        bytes.extend_from_slice(payload);
        bytes.resize(align4(bytes.len()), 0);
        bytes
    }

    /// A `tcp_info` of `len` bytes (the kernel's full one is 232 on 6.x) whose fields read
    /// here hold distinct values.
    fn tcp_info(len: usize) -> Vec<u8> {
        let mut info = vec![0u8; 232];
        info[TCPI_LAST_DATA_SENT..][..4].copy_from_slice(&11u32.to_ne_bytes());
        info[TCPI_LAST_DATA_RECV..][..4].copy_from_slice(&22u32.to_ne_bytes());
        info[TCPI_BYTES_ACKED..][..8].copy_from_slice(&333u64.to_ne_bytes());
        info[TCPI_BYTES_RECEIVED..][..8].copy_from_slice(&4444u64.to_ne_bytes());
        info.truncate(len);
        info
    }

    /// An `inet_diag_msg` of an established IPv4 socket 10.0.0.1:1234 -> 10.0.0.2:443 with
    /// inode `inode`, rqueue 5, wqueue 6, and an `INET_DIAG_INFO` attribute of `info`.
    fn diag_msg(family: u8, inode: u32, info: Option<&[u8]>) -> Vec<u8> {
        let mut msg = vec![0u8; INET_DIAG_MSG_LEN];
        msg[0] = family;
        msg[1] = 1;
        msg[4..6].copy_from_slice(&1234u16.to_be_bytes());
        msg[6..8].copy_from_slice(&443u16.to_be_bytes());
        if i32::from(family) == libc::AF_INET6 {
            msg[8..24].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
            msg[24..40].copy_from_slice(&"fe80::1".parse::<Ipv6Addr>().unwrap().octets());
            msg[40..44].copy_from_slice(&3u32.to_ne_bytes());
        } else {
            msg[8..12].copy_from_slice(&[10, 0, 0, 1]);
            msg[24..28].copy_from_slice(&[10, 0, 0, 2]);
        }
        msg[56..60].copy_from_slice(&5u32.to_ne_bytes());
        msg[60..64].copy_from_slice(&6u32.to_ne_bytes());
        msg[68..72].copy_from_slice(&inode.to_ne_bytes());
        if let Some(info) = info {
            msg.extend_from_slice(&((4 + info.len()) as u16).to_ne_bytes());
            msg.extend_from_slice(&INET_DIAG_INFO.to_ne_bytes());
            msg.extend_from_slice(info);
            msg.resize(align4(msg.len()), 0);
        }
        msg
    }

    fn v4(inode: u32, info: Option<&[u8]>) -> Vec<u8> {
        message(
            SOCK_DIAG_BY_FAMILY,
            SEQ,
            &diag_msg(libc::AF_INET as u8, inode, info),
        )
    }

    fn done() -> Vec<u8> {
        message(NLMSG_DONE, SEQ, &0i32.to_ne_bytes())
    }

    fn parse(datagram: &[u8]) -> Result<(Part, Vec<TcpSocket>), SocketsError> {
        let mut sockets = Vec::new();
        let part = parse_reply(datagram, SEQ, &mut sockets)?;
        Ok((part, sockets))
    }

    #[test]
    fn a_request_is_an_inet_diag_req_v2_dump_asking_for_tcp_info() {
        let request = dump_request(libc::AF_INET6 as u8, 7);
        assert_eq!(request.len(), 72);
        assert_eq!(ne_u32(&request, 0), Some(72));
        assert_eq!(ne_u16(&request, 4), Some(SOCK_DIAG_BY_FAMILY));
        assert_eq!(
            ne_u16(&request, 6),
            Some(0x301),
            "NLM_F_REQUEST | NLM_F_DUMP"
        );
        assert_eq!(ne_u32(&request, 8), Some(7));
        assert_eq!(&request[16..20], &[libc::AF_INET6 as u8, 6, 0b10, 0]);
        let states = ne_u32(&request, 20).unwrap();
        assert_eq!(states & (1 << 1), 1 << 1, "ESTABLISHED asked");
        assert_eq!(states & (1 << 10), 1 << 10, "LISTEN asked");
        assert_eq!(states & (1 << 6), 0, "TIME_WAIT (no owner) left out");
        assert!(request[24..].iter().all(|&b| b == 0), "every socket");
    }

    #[test]
    fn a_reply_in_parts_reads_every_socket_until_done() {
        let info = tcp_info(232);
        let mut first = v4(100, Some(&info));
        first.extend(message(
            SOCK_DIAG_BY_FAMILY,
            SEQ,
            &diag_msg(libc::AF_INET6 as u8, 101, None),
        ));
        // A socket no process holds any more is left out.
        first.extend(v4(0, Some(&info)));
        let (part, sockets) = parse(&first).unwrap();
        assert_eq!(part, Part::More);
        assert_eq!(
            sockets[0],
            TcpSocket {
                inode: 100,
                local: "10.0.0.1:1234".parse().unwrap(),
                peer: "10.0.0.2:443".parse().unwrap(),
                state: TcpState::Established,
                rqueue: 5,
                wqueue: 6,
                info: TcpInfo {
                    bytes_received: Some(4444),
                    bytes_acked: Some(333),
                    last_data_recv_ms: Some(22),
                    last_data_sent_ms: Some(11),
                },
            }
        );
        assert_eq!(sockets[1].inode, 101);
        assert_eq!(sockets[1].local, "[::1]:1234".parse().unwrap());
        assert_eq!(
            sockets[1].peer,
            SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 443, 0, 3)),
            "a link-local peer keeps its interface"
        );
        assert_eq!(sockets[1].info, TcpInfo::default(), "no tcp_info sent");
        assert_eq!(sockets.len(), 2);

        let mut last = v4(102, None);
        last.extend(done());
        let (part, sockets) = parse(&last).unwrap();
        assert_eq!((part, sockets.len()), (Part::Done, 1));
    }

    #[test]
    fn a_shorter_tcp_info_gives_none_for_what_it_lacks() {
        // 4.0's tcp_info ended after tcpi_max_pacing_rate (120 bytes): no byte counters.
        let old = TcpInfo::parse(&tcp_info(120));
        assert_eq!(
            old,
            TcpInfo {
                bytes_received: None,
                bytes_acked: None,
                last_data_recv_ms: Some(22),
                last_data_sent_ms: Some(11),
            }
        );
        // 4.1's: bytes_acked, not yet bytes_received.
        let acked = TcpInfo::parse(&tcp_info(128));
        assert_eq!((acked.bytes_acked, acked.bytes_received), (Some(333), None));
        let cut = TcpInfo::parse(&tcp_info(55));
        assert_eq!(
            (cut.last_data_sent_ms, cut.last_data_recv_ms),
            (Some(11), None),
            "a field cut in the middle is not read"
        );
        assert_eq!(TcpInfo::parse(&[]), TcpInfo::default());
        // A longer struct than known (a newer kernel) reads the same.
        let mut newer = tcp_info(232);
        newer.extend([0xff; 64]);
        assert_eq!(TcpInfo::parse(&newer), TcpInfo::parse(&tcp_info(232)));
    }

    #[test]
    fn the_kernels_errors_are_errors() {
        let error = |errno: i32| {
            let mut payload = (-errno).to_ne_bytes().to_vec();
            payload.extend(message(SOCK_DIAG_BY_FAMILY, SEQ, &[]));
            message(NLMSG_ERROR, SEQ, &payload)
        };
        assert!(matches!(
            parse(&error(libc::ENOENT)),
            Err(SocketsError::NoTcpDiag)
        ));
        match parse(&error(libc::EPERM)) {
            Err(SocketsError::Refused(e)) => assert_eq!(e.raw_os_error(), Some(libc::EPERM)),
            other => panic!("{other:?}"),
        }
        // An error after sockets: the dump failed, whatever came before.
        let mut late = v4(100, None);
        late.extend(error(libc::EBUSY));
        assert!(matches!(parse(&late), Err(SocketsError::Refused(_))));
        // A dump that ended in an error says so in its NLMSG_DONE.
        let failed_done = message(NLMSG_DONE, SEQ, &(-libc::ENOMEM).to_ne_bytes());
        assert!(matches!(parse(&failed_done), Err(SocketsError::Refused(_))));
        // A bare NLMSG_DONE (no payload) ends the dump.
        assert_eq!(parse(&message(NLMSG_DONE, SEQ, &[])).unwrap().0, Part::Done);
    }

    #[test]
    fn garbage_and_cut_replies_are_rejected_not_read_past_their_end() {
        let info = tcp_info(232);
        let mut whole = v4(100, Some(&info));
        let boundary = whole.len();
        whole.extend(done());
        // Every cut: at the message boundary it is a part that goes on; elsewhere, an error.
        for cut in 0..whole.len() {
            let result = parse(&whole[..cut]);
            if cut == boundary {
                assert_eq!(result.unwrap().0, Part::More);
            } else {
                assert!(
                    matches!(result, Err(SocketsError::Malformed(_))),
                    "cut at {cut}: {result:?}"
                );
            }
        }
        let malformed = |bytes: &[u8]| matches!(parse(bytes), Err(SocketsError::Malformed(_)));
        // A length below the header's would loop forever if taken.
        let mut short = v4(100, None);
        short[0..4].copy_from_slice(&8u32.to_ne_bytes());
        assert!(malformed(&short));
        let mut zero = v4(100, None);
        zero[0..4].copy_from_slice(&0u32.to_ne_bytes());
        assert!(malformed(&zero));
        let mut long = v4(100, None);
        long[0..4].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(malformed(&long));
        // An attribute of length 0 would loop forever too; one longer than its message
        // would be read past it.
        for bad in [0u16, 3, 237] {
            let mut attribute = v4(100, Some(&info));
            let at = NLMSG_HDRLEN + INET_DIAG_MSG_LEN;
            attribute[at..at + 2].copy_from_slice(&bad.to_ne_bytes());
            assert!(malformed(&attribute), "attribute length {bad}");
        }
        assert!(malformed(&message(SOCK_DIAG_BY_FAMILY, SEQ, &[0; 71])));
        assert!(
            malformed(&message(
                SOCK_DIAG_BY_FAMILY,
                SEQ,
                &diag_msg(libc::AF_UNIX as u8, 100, None)
            )),
            "not an inet family"
        );
        assert!(malformed(&message(99, SEQ, &[])), "an unknown type");
        assert!(
            malformed(&message(
                SOCK_DIAG_BY_FAMILY,
                SEQ + 1,
                &diag_msg(2, 1, None)
            )),
            "another request's"
        );
        assert!(malformed(&message(NLMSG_ERROR, SEQ, &[0, 0])));
        assert!(malformed(&[]));

        // Bytes flipped at random never make the parser panic or loop.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut random = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let mut bytes = whole.clone();
            for _ in 0..1 + random() % 4 {
                let at = (random() % bytes.len() as u64) as usize;
                bytes[at] = random() as u8;
            }
            let _ = parse(&bytes);
        }
    }

    #[test]
    fn socket_links_are_exactly_socket_colon_bracket_inode() {
        assert_eq!(parse_socket_link(b"socket:[12345]"), Some(12345));
        for not in [
            &b"pipe:[12345]"[..],
            b"anon_inode:[eventfd]",
            b"/tmp/socket:[12345]",
            b"socket:[]",
            b"socket:[12a]",
            b"socket:[-1]",
            b"socket:[12345]x",
            b"socket:[99999999999999999999999]",
        ] {
            assert_eq!(
                parse_socket_link(not),
                None,
                "{}",
                String::from_utf8_lossy(not)
            );
        }
    }

    /// The inode of an open socket, as fstat tells it.
    fn inode(fd: &impl AsFd) -> u64 {
        rustix::fs::fstat(fd).unwrap().st_ino
    }

    #[test]
    fn a_crafted_proc_tree_lists_its_socket_links_only() {
        let fake = FakeProc::new().with(42, "agent", 1);
        let fd = fake.path().join("42/fd");
        std::fs::create_dir_all(&fd).unwrap();
        for (n, target) in [
            ("0", "/dev/null"),
            ("3", "socket:[900]"),
            ("4", "socket:[77]"),
            ("5", "socket:[900]"),
            ("6", "pipe:[901]"),
            // A file a user named like a socket: its link is a path.
            ("7", "/home/u/socket:[555]"),
        ] {
            std::os::unix::fs::symlink(target, fd.join(n)).unwrap();
        }
        assert_eq!(socket_inodes(&fake.root(), 42).unwrap(), vec![77, 900]);
        assert!(matches!(
            socket_inodes(&fake.root(), 43),
            Err(SocketsError::NoSuchProcess(43))
        ));
    }

    #[test]
    fn the_inodes_are_those_of_proc_self_fd_and_a_file_named_like_a_socket_is_none() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ino = inode(&listener);
        let link = std::fs::read_link(format!("/proc/self/fd/{}", listener.as_raw_fd())).unwrap();
        assert_eq!(link.to_str(), Some(format!("socket:[{ino}]").as_str()));
        let dir = tempfile::tempdir().unwrap();
        let stranger = TcpListener::bind("127.0.0.1:0").unwrap();
        let planted = dir.path().join(format!("socket:[{}]", inode(&stranger)));
        drop(stranger);
        let _file = std::fs::File::create(&planted).unwrap();
        let inodes = socket_inodes(&ProcRoot::default(), std::process::id()).unwrap();
        assert!(inodes.contains(&ino));
        assert!(
            !inodes.contains(&parse_socket_link(planted.file_name().unwrap().as_bytes()).unwrap()),
            "a file held open under a socket's name is no socket"
        );
    }

    /// Waits up to 5 s for the socket with `inode` that process `pid` holds to be as
    /// `wanted` says, sampling in a new round each time; the last sample either way.
    fn sample_until(
        diag: &mut DiagSockets,
        inode: u64,
        wanted: impl Fn(&TcpSocket) -> bool,
    ) -> TcpSocket {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let socket = diag
                .round()
                .process_tcp(std::process::id())
                .unwrap()
                .into_iter()
                .find(|s| s.inode == inode)
                .expect("the socket among its process's");
            if wanted(&socket) || Instant::now() > deadline {
                return socket;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A connection over loopback at `address`: the server sends N bytes, which the client
    /// reads only later.
    fn a_connection_shows_bytes_queues_and_idle_time(address: &str) {
        const N: usize = 10_000;
        let listener = TcpListener::bind(address).unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let (client_ino, server_ino) = (inode(&client), inode(&server));
        let mut diag = DiagSockets::new(ProcRoot::default());

        let before = sample_until(&mut diag, client_ino, |_| true);
        assert_eq!(before.state, TcpState::Established);
        assert_eq!(before.local, client.local_addr().unwrap());
        assert_eq!(before.peer, client.peer_addr().unwrap());
        assert_eq!(before.rqueue, 0);
        let received = before
            .info
            .bytes_received
            .expect("5.10+ has bytes_received");
        let sent = sample_until(&mut diag, server_ino, |_| true);
        let acked = sent.info.bytes_acked.expect("5.10+ has bytes_acked");

        server.write_all(&[7u8; N]).unwrap();
        let arrived = sample_until(&mut diag, client_ino, |s| s.rqueue as usize == N);
        assert_eq!(arrived.rqueue as usize, N, "unread bytes wait in the queue");
        assert_eq!(arrived.info.bytes_received, Some(received + N as u64));
        let server_side = sample_until(&mut diag, server_ino, |s| {
            s.info.bytes_acked == Some(acked + N as u64)
        });
        assert_eq!(server_side.info.bytes_acked, Some(acked + N as u64));
        assert_eq!(server_side.wqueue, 0, "all acknowledged");

        let quiet = arrived.info.last_data_recv_ms.unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let later = sample_until(&mut diag, client_ino, |_| true);
        assert!(
            later.info.last_data_recv_ms.unwrap() >= quiet + 250,
            "{quiet} ms, then {:?} 300 ms later",
            later.info.last_data_recv_ms
        );
        assert_eq!(later.info.bytes_received, Some(received + N as u64));
        assert_eq!(later.rqueue as usize, N);

        client.read_exact(&mut [0u8; N]).unwrap();
        let read = sample_until(&mut diag, client_ino, |s| s.rqueue == 0);
        assert_eq!(read.rqueue, 0, "read: nothing waits");
        assert_eq!(read.info.bytes_received, Some(received + N as u64));
    }

    #[test]
    fn a_loopback_connection_shows_bytes_queues_and_idle_time() {
        a_connection_shows_bytes_queues_and_idle_time("127.0.0.1:0");
    }

    #[test]
    fn an_ipv6_loopback_connection_shows_bytes_queues_and_idle_time() {
        a_connection_shows_bytes_queues_and_idle_time("[::1]:0");
    }

    #[test]
    fn a_round_dumps_a_namespace_once_and_the_next_round_again() {
        let mut diag = DiagSockets::new(ProcRoot::default());
        let early = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut round = diag.round();
        let first = round.process_tcp(std::process::id()).unwrap();
        assert!(first.iter().any(|s| s.inode == inode(&early)));
        let late = TcpListener::bind("127.0.0.1:0").unwrap();
        let again = round.process_tcp(std::process::id()).unwrap();
        assert!(
            !again.iter().any(|s| s.inode == inode(&late)),
            "the round's one dump was taken before the socket was"
        );
        drop(round);
        let next = diag.round().process_tcp(std::process::id()).unwrap();
        assert!(next.iter().any(|s| s.inode == inode(&late)));
        assert_eq!(diag.open.len(), 1, "one netlink socket, kept");
    }

    #[test]
    fn another_netlink_socket_cannot_slip_a_reply_into_a_dump() {
        let mut diag = DiagSockets::new(ProcRoot::default());
        diag.round().dump_of(std::process::id()).unwrap();
        let ours = diag.open.values().next().unwrap();
        let port =
            netlink::SocketAddrNetlink::try_from(rustix::net::getsockname(&ours.fd).unwrap())
                .unwrap()
                .pid();
        // Any process of the namespace may write to a netlink port it names: here one sends
        // a socket nobody holds as the answer to the next request (its number is
        // predictable), and the dump's end.
        let next = ours.seq.wrapping_add(1);
        let forged_inode = 4_000_000_000;
        let mut forged = message(
            SOCK_DIAG_BY_FAMILY,
            next,
            &diag_msg(libc::AF_INET as u8, forged_inode, None),
        );
        forged.extend(message(NLMSG_DONE, next, &0i32.to_ne_bytes()));
        let forger = rustix::net::socket(
            AddressFamily::NETLINK,
            SocketType::RAW,
            Some(netlink::SOCK_DIAG),
        )
        .unwrap();
        let sent = rustix::net::sendto(
            &forger,
            &forged,
            SendFlags::empty(),
            &netlink::SocketAddrNetlink::new(port, 0),
        );
        assert_eq!(sent, Err(Errno::CONNREFUSED), "only the kernel may answer");
        let mut round = diag.round();
        let dump = round.dump_of(std::process::id()).unwrap();
        assert!(dump.get(u64::from(forged_inode)).is_none());
    }

    #[test]
    fn a_process_that_exited_is_no_such_process() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let mut diag = DiagSockets::new(ProcRoot::default());
        let mut round = diag.round();
        assert!(matches!(
            round.process_tcp(pid),
            Err(SocketsError::NoSuchProcess(p)) if p == pid
        ));
        assert!(matches!(
            round.dump_of(pid),
            Err(SocketsError::NoSuchProcess(p)) if p == pid
        ));
    }

    /// A child in a network namespace of its own, listening on a port there; killed and
    /// reaped when dropped.
    struct NetnsListener {
        pid: u32,
    }

    impl NetnsListener {
        fn start() -> NetnsListener {
            let (ready_read, ready_write) = rustix::pipe::pipe().unwrap();
            // SAFETY: the child makes only async-signal-safe system calls until it dies.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
            if pid == 0 {
                // SAFETY: plain system calls on the child's own descriptors and a local
                // address; the child never returns into the test harness.
                unsafe {
                    if libc::unshare(libc::CLONE_NEWNET) != 0 {
                        libc::_exit(1);
                    }
                    let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                    let mut any: libc::sockaddr_in = std::mem::zeroed();
                    any.sin_family = libc::AF_INET as libc::sa_family_t;
                    let bound = libc::bind(
                        fd,
                        (&raw const any).cast(),
                        size_of::<libc::sockaddr_in>() as libc::socklen_t,
                    );
                    if fd < 0 || bound != 0 || libc::listen(fd, 1) != 0 {
                        libc::_exit(2);
                    }
                    libc::write(ready_write.as_raw_fd(), b"r".as_ptr().cast(), 1);
                    loop {
                        libc::pause();
                    }
                }
            }
            drop(ready_write);
            let mut ready = [0u8];
            let n = rustix::io::read(&ready_read, &mut ready).unwrap();
            let listener = NetnsListener { pid: pid as u32 };
            assert_eq!(n, 1, "the child died before it listened");
            listener
        }
    }

    impl Drop for NetnsListener {
        fn drop(&mut self) {
            // SAFETY: our own child, killed and reaped into a local.
            unsafe {
                libc::kill(self.pid as i32, libc::SIGKILL);
                libc::waitpid(self.pid as i32, std::ptr::null_mut(), 0);
            }
        }
    }

    /// The network namespace of the calling thread.
    fn thread_namespace() -> u64 {
        std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino()
    }

    #[test]
    fn a_process_in_another_network_namespace_is_dumped_through_its_own() {
        let child = NetnsListener::start();
        let ours = thread_namespace();
        let mut diag = DiagSockets::new(ProcRoot::default());
        let mut round = diag.round();
        let theirs = round.process_tcp(child.pid).unwrap();
        assert_eq!(theirs.len(), 1, "{theirs:?}");
        let listening = &theirs[0];
        assert_eq!(listening.state, TcpState::Listen);
        assert!(listening.local.ip().is_unspecified());
        assert!(
            socket_inodes(&ProcRoot::default(), child.pid)
                .unwrap()
                .contains(&listening.inode)
        );
        let namespace = round.dump_of(child.pid).unwrap().namespace();
        assert_ne!(namespace, ours);
        let host = round.dump_of(std::process::id()).unwrap();
        assert_eq!(host.namespace(), ours);
        assert!(
            host.get(listening.inode).is_none(),
            "another namespace's socket is not in the host's dump"
        );
        assert_eq!(thread_namespace(), ours, "the caller stayed where it was");
        drop(round);
        assert_eq!(diag.open.len(), 2, "a netlink socket per namespace");
        diag.round().process_tcp(std::process::id()).unwrap();
        diag.round();
        assert_eq!(
            diag.open.len(),
            1,
            "the namespace not asked about in the last round is let go"
        );
    }

    #[test]
    fn without_cap_sys_admin_another_namespace_is_refused_and_ones_own_still_read() {
        let child = NetnsListener::start();
        let child_pid = child.pid;
        // Capabilities are a thread's: this one drops CAP_SYS_ADMIN, as a daemon that has
        // only CAP_BPF lacks it; the thread that would enter inherits that.
        std::thread::spawn(move || {
            use rustix::thread::{CapabilitySet, capabilities, set_capabilities};
            let mut sets = capabilities(None).unwrap();
            sets.effective.remove(CapabilitySet::SYS_ADMIN);
            set_capabilities(None, sets).unwrap();
            let mut diag = DiagSockets::new(ProcRoot::default());
            let mut round = diag.round();
            for _ in 0..2 {
                match round.process_tcp(child_pid) {
                    Err(e @ SocketsError::NamespaceDenied { .. }) => {
                        assert!(e.to_string().contains("CAP_SYS_ADMIN"), "{e}")
                    }
                    other => panic!("{other:?}"),
                }
            }
            let own = round.process_tcp(std::process::id()).unwrap();
            assert!(own.iter().all(|s| s.inode != 0));
        })
        .join()
        .unwrap();
        drop(child);
    }
}
