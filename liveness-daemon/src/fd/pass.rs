//! File descriptors passed with request lines (`SCM_RIGHTS`), the daemon's end (the
//! client's is `liveness_client::fdpass`).
//!
//! A client sends a request line in one `sendmsg` with the descriptors attached (a pidfd
//! naming a session's owner). A `recvmsg` on a Unix stream socket may return earlier
//! plain bytes together with the message that carries descriptors, but it stops right
//! after that message (Linux never reads past descriptors in one call): the last byte a
//! read returns belongs to the message the descriptors came with. The server's reader
//! notes that stream position for each descriptor, and the connection claims the ones
//! noted within a line's bytes for that line's request.
//!
//! Only pidfds are kept, and whatever no request claims is closed, never leaked: a pidfd's
//! close cannot block. Anything else is refused at receipt: it is handed to the
//! [`Closer`] at once (its close may block for as long as its sender likes) and the line
//! it came with learns only what it was.

use std::collections::VecDeque;
use std::io::{self, IoSliceMut};
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, Interest, ReadBuf};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::fair::closer::Closer;
use crate::fd::registered::register;

/// Most descriptors a connection holds while their lines are read; older ones are closed
/// first when more arrive, so a client cannot pile up descriptors in the daemon.
pub const MAX_HELD_FDS: usize = 8;

/// A descriptor that came with a request line.
#[derive(Debug)]
pub enum Passed {
    Pidfd(OwnedFd),
    /// Anything else, already on its way to be closed: what it was, for the error.
    Refused(String),
}

/// The read half of a connection, read with `recvmsg` so passed descriptors are kept.
#[derive(Debug)]
pub struct FdReader {
    /// Taken out at drop, to be handed over whole where it can.
    half: ManuallyDrop<Half>,
    /// Bytes read so far: the stream position of the next byte.
    position: u64,
    /// Received descriptors with the stream position of the last byte of their read.
    held: VecDeque<(u64, Passed)>,
    /// Who sent them, and where what is not a pidfd goes.
    uid: u32,
    closer: Closer,
}

/// The socket as the reader waits on it.
#[derive(Debug)]
enum Half {
    /// Half of the connection's stream, registered for reading and for room to write.
    Split(OwnedReadHalf),
    /// A descriptor of the socket registered for reading alone.
    ReadOnly(AsyncFd<OwnedFd>),
}

impl Half {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Half::Split(half) => half.as_ref().as_fd(),
            Half::ReadOnly(registered) => registered.get_ref().as_fd(),
        }
    }
}

impl FdReader {
    pub fn new(half: OwnedReadHalf, uid: u32, closer: Closer) -> FdReader {
        FdReader {
            half: ManuallyDrop::new(Half::Split(half)),
            position: 0,
            held: VecDeque::new(),
            uid,
            closer,
        }
    }

    /// The descriptors that arrived with the bytes `line` (stream positions). Those that
    /// arrived before it belonged to earlier lines that did not use them: they are closed.
    pub fn take_fds(&mut self, line: Range<u64>) -> Vec<Passed> {
        while self.held.front().is_some_and(|(at, _)| *at < line.start) {
            self.held.pop_front();
        }
        let mut taken = Vec::new();
        while self.held.front().is_some_and(|(at, _)| line.contains(at)) {
            taken.extend(self.held.pop_front().map(|(_, fd)| fd));
        }
        taken
    }

    /// Ends the connection's registration for room to write, with `write`, its other half:
    /// the socket then wakes its runtime only for what the client sends, not each time the
    /// client reads what was written (a subscriber, once per event). The reader goes on
    /// where it was; writes go to the descriptor returned, and wait for room on their own.
    pub fn read_only(&mut self, write: OwnedWriteHalf) -> io::Result<OwnedFd> {
        let reading = self.half.fd().try_clone_to_owned()?;
        let writing = self.half.fd().try_clone_to_owned()?;
        let registered = register(reading, Interest::READABLE).map_err(|e| e.into_parts().1)?;
        let split = std::mem::replace(
            &mut self.half,
            ManuallyDrop::new(Half::ReadOnly(registered)),
        );
        drop(ManuallyDrop::into_inner(split));
        // The stream's last half: its registration and its descriptor go, the socket stays
        // (not shut for writing, as dropping the half would).
        write.forget();
        Ok(writing)
    }

    /// Resolves once the client has closed its side, whatever it sent before that and is
    /// still unread: the socket's hang-up, not the end of its bytes.
    pub async fn hung_up(&self) -> io::Result<()> {
        loop {
            match &*self.half {
                Half::Split(half) => {
                    let stream: &UnixStream = half.as_ref();
                    if stream.ready(Interest::READABLE).await?.is_read_closed() {
                        return Ok(());
                    }
                    // Readable with bytes only: wait for the next change.
                    let _ = stream.try_io(Interest::READABLE, || {
                        Err::<(), _>(io::ErrorKind::WouldBlock.into())
                    });
                }
                Half::ReadOnly(registered) => {
                    let mut ready = registered.ready(Interest::READABLE).await?;
                    if ready.ready().is_read_closed() {
                        return Ok(());
                    }
                    ready.clear_ready();
                }
            }
        }
    }

    fn keep(&mut self, at: u64, fd: OwnedFd) {
        if self.held.len() == MAX_HELD_FDS {
            tracing::debug!("a client passed more descriptors than it used; closing the oldest");
            self.held.pop_front();
        }
        let passed = match kind_of(&fd) {
            None => Passed::Pidfd(fd),
            Some(kind) => {
                self.closer.close(self.uid, fd);
                Passed::Refused(kind)
            }
        };
        self.held.push_back((at, passed));
    }
}

impl Drop for FdReader {
    /// Before the connection closes, hands what its client left unread in the socket to
    /// the client's closing thread (see [`close_connection`]).
    fn drop(&mut self) {
        // SAFETY: taken once, here, and not used after.
        match unsafe { ManuallyDrop::take(&mut self.half) } {
            // The reader's own descriptor of the socket: it goes itself.
            Half::ReadOnly(registered) => {
                close_connection(registered.into_inner(), self.uid, &self.closer);
            }
            // Shared with the connection's write half: a descriptor of its own goes.
            Half::Split(half) => {
                let socket = half.as_ref().as_fd();
                if !unread(socket) {
                    return;
                }
                match socket.try_clone_to_owned() {
                    Ok(socket) => self.closer.close_with(self.uid, socket, discard_queued),
                    // Out of descriptors: taken out here, each handed over as it comes (what
                    // the kernel cannot give for want of a descriptor, it releases here).
                    Err(_) => {
                        for fd in queued(socket) {
                            self.closer.close(self.uid, fd);
                        }
                    }
                }
            }
        }
    }
}

/// Closes a connection's `socket` of `uid`: what its client left unread goes with it to the
/// client's closing thread, since a descriptor queued in it would be released by the close,
/// in this thread, and its release may block. There the queue is taken out and closed
/// before the socket.
pub fn close_connection(socket: OwnedFd, uid: u32, closer: &Closer) {
    if unread(socket.as_fd()) {
        closer.close_with(uid, socket, discard_queued);
    }
}

/// Shuts `socket` for reading, so that nothing more is queued on it, and says whether
/// anything is left unread (and so, maybe, descriptors).
fn unread(socket: BorrowedFd<'_>) -> bool {
    // A socket that cannot be shut is not a connected one: nothing can be queued on it.
    if rustix::net::shutdown(socket, rustix::net::Shutdown::Read).is_err() {
        return false;
    }
    // Descriptors always come with bytes: none unread, none queued.
    !rustix::io::ioctl_fionread(socket).is_ok_and(|unread| unread == 0)
}

/// Takes out everything queued on `socket`, shut for reading, closing each descriptor
/// that came with it; then closes the socket.
fn discard_queued(socket: OwnedFd) {
    for fd in queued(socket.as_fd()) {
        drop(fd);
    }
}

/// The descriptors queued on `socket`, shut for reading, taken out one message at a time.
fn queued(socket: BorrowedFd<'_>) -> impl Iterator<Item = OwnedFd> + '_ {
    let mut sink = [0u8; 4096];
    std::iter::from_fn(move || {
        loop {
            match receive(socket, &mut sink) {
                Ok((0, fds)) if fds.is_empty() => return None,
                Ok((_, fds)) => return Some(fds),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
    })
    .flatten()
}

/// `None` for a pidfd, else what the descriptor is. Read from its `/proc/self/fd` link,
/// which asks nothing of the file's file system (an fstat of a FUSE file would wait for its
/// server); pidfds read `anon_inode:[pidfd]`, in pidfs too.
fn kind_of(fd: &OwnedFd) -> Option<String> {
    use std::os::fd::AsRawFd;
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    let Ok(link) = link else {
        return Some("descriptor whose kind cannot be read".into());
    };
    let link = link.to_string_lossy();
    let kind = match link.strip_prefix("anon_inode:") {
        Some("[pidfd]") => return None,
        Some(anon) => anon.trim_matches(['[', ']']),
        None if link.starts_with('/') => "file",
        None => link.split(':').next().unwrap_or_default(),
    };
    Some(kind.to_owned())
}

/// The most descriptors one message can carry (`SCM_MAX_FD`). The control buffer has room
/// for all of them: those that did not fit would be closed by the kernel on return from
/// `recvmsg`, in the thread that called it.
const SCM_MAX_FD: usize = 253;

/// One `recvmsg`: the bytes read, and the descriptors that came with them.
fn receive(socket: impl AsFd, into: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(SCM_MAX_FD))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = rustix::net::recvmsg(
        socket,
        &mut [IoSliceMut::new(into)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
    )?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    Ok((received.bytes, fds))
}

impl AsyncRead for FdReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A client whose passed descriptors take long to close gets no more read.
        ready!(this.closer.poll_room(this.uid, cx));
        loop {
            let unfilled = buf.initialize_unfilled();
            let received = match &*this.half {
                Half::Split(half) => {
                    let stream: &UnixStream = half.as_ref();
                    ready!(stream.poll_read_ready(cx))?;
                    stream.try_io(Interest::READABLE, || receive(stream, unfilled))
                }
                Half::ReadOnly(registered) => {
                    let mut ready = ready!(registered.poll_read_ready(cx))?;
                    match ready.try_io(|socket| receive(socket, unfilled)) {
                        Ok(received) => received,
                        Err(_would_block) => continue,
                    }
                }
            };
            match received {
                Ok((bytes, fds)) => {
                    let at = this.position + (bytes as u64).saturating_sub(1);
                    for fd in fds {
                        this.keep(at, fd);
                    }
                    this.position += bytes as u64;
                    buf.advance(bytes);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use liveness_client::fdpass::send_with_fds;
    use liveness_common::protocol::MAX_FDS_PER_MESSAGE;
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::net::UnixStream as StdUnixStream;
    use std::process::{Child, Command};
    use tokio::io::{AsyncBufReadExt, BufReader};

    fn reader_of(server: StdUnixStream, closer: &Closer) -> BufReader<FdReader> {
        server.set_nonblocking(true).unwrap();
        let (read, _write) = UnixStream::from_std(server).unwrap().into_split();
        BufReader::new(FdReader::new(read, 1000, closer.clone()))
    }

    /// A child that lives until dropped, with a pidfd of it.
    struct Sleeper(Child, OwnedFd);

    impl Sleeper {
        fn spawn() -> Sleeper {
            let child = Command::new("sleep").arg("60").spawn().unwrap();
            let pidfd = liveness_proc::pidfd::open_pidfd(child.id()).unwrap();
            Sleeper(child, pidfd)
        }
    }

    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// The pid a kept pidfd names (its fdinfo's `Pid:`), or what a refused one was.
    fn what(passed: &Passed) -> String {
        match passed {
            Passed::Pidfd(fd) => {
                let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
                    .unwrap();
                let pid = info.lines().find_map(|l| l.strip_prefix("Pid:")).unwrap();
                pid.trim().to_owned()
            }
            Passed::Refused(kind) => format!("refused {kind}"),
        }
    }

    #[tokio::test]
    async fn descriptors_belong_to_the_line_they_were_sent_with() {
        let (mut client, server) = StdUnixStream::pair().unwrap();
        let mut reader = reader_of(server, &Closer::default());
        let (first, second, unused) = (Sleeper::spawn(), Sleeper::spawn(), Sleeper::spawn());

        send_with_fds(&mut client, b"plain\n", &[]).unwrap();
        send_with_fds(&mut client, b"one\n", &[unused.1.as_fd()]).unwrap();
        send_with_fds(&mut client, b"two\n", &[first.1.as_fd(), second.1.as_fd()]).unwrap();
        send_with_fds(&mut client, b"after\n", &[]).unwrap();
        drop(client);

        let mut position = 0u64;
        let mut claimed = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).await.unwrap() == 0 {
                break;
            }
            let start = position;
            position += line.len() as u64;
            // The line "one" does not claim its descriptor: it must be closed, not handed
            // to the next line.
            if line != "one\n" {
                let fds = reader.get_mut().take_fds(start..position);
                claimed.push((line, fds.iter().map(what).collect::<Vec<_>>()));
            }
        }
        assert_eq!(
            claimed,
            vec![
                ("plain\n".to_owned(), vec![]),
                (
                    "two\n".to_owned(),
                    vec![first.0.id().to_string(), second.0.id().to_string()]
                ),
                ("after\n".to_owned(), vec![]),
            ]
        );
        assert!(
            reader.get_ref().held.is_empty(),
            "nothing is kept after the last line"
        );
    }

    #[tokio::test]
    async fn what_is_not_a_pidfd_is_refused_at_receipt_and_closed_elsewhere() {
        let (mut client, server) = StdUnixStream::pair().unwrap();
        let closer = Closer::default();
        let mut reader = reader_of(server, &closer);
        let (pipe_read, pipe_write) = rustix::pipe::pipe().unwrap();
        let file = tempfile::tempfile().unwrap();
        let (socket, _peer) = StdUnixStream::pair().unwrap();
        let fds = [pipe_write.as_fd(), file.as_fd(), socket.as_fd()];
        send_with_fds(&mut client, b"three\n", &fds).unwrap();
        drop(pipe_write);
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        let passed = reader.get_mut().take_fds(0..line.len() as u64);
        let kinds: Vec<String> = passed.iter().map(what).collect();
        assert_eq!(kinds, ["refused pipe", "refused file", "refused socket"]);
        closed_elsewhere(pipe_read).await;
    }

    /// The daemon's copy of a pipe's write end, refused, went to the closer: EOF here.
    async fn closed_elsewhere(pipe_read: OwnedFd) {
        let mut buf = [0u8; 1];
        let read = tokio::task::spawn_blocking(move || rustix::io::read(&pipe_read, &mut buf));
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), read).await;
        assert_eq!(read.expect("closed").unwrap().unwrap(), 0);
    }

    /// What a client left unread, descriptors with it, is closed on its closing thread
    /// once the connection closes.
    #[tokio::test]
    async fn what_a_closed_connection_left_queued_is_closed_elsewhere() {
        let (mut client, server) = StdUnixStream::pair().unwrap();
        let reader = reader_of(server, &Closer::default());
        let (pipe_read, pipe_write) = rustix::pipe::pipe().unwrap();
        send_with_fds(&mut client, b"never read\n", &[pipe_write.as_fd()]).unwrap();
        drop(pipe_write);
        drop(reader);
        closed_elsewhere(pipe_read).await;
    }

    /// While its uid has too many closes pending, a connection reads nothing more, so the
    /// descriptors sent with what it would read stay with the sender.
    #[tokio::test]
    async fn a_reader_waits_while_its_uid_has_too_many_closes_pending() {
        let closer = Closer::default();
        let gate = closer.fill_with_blocked_closes(1000);
        let (mut client, server) = StdUnixStream::pair().unwrap();
        let mut reader = reader_of(server, &closer);
        let (pipe_read, pipe_write) = rustix::pipe::pipe().unwrap();
        send_with_fds(&mut client, b"line\n", &[pipe_write.as_fd()]).unwrap();
        drop(pipe_write);
        let mut line = String::new();
        let waited = std::time::Duration::from_millis(200);
        let early = tokio::time::timeout(waited, reader.read_line(&mut line)).await;
        assert!(
            early.is_err(),
            "read while the closes were pending: {line:?}"
        );
        drop(gate);
        reader.read_line(&mut line).await.unwrap();
        assert_eq!(line, "line\n");
        assert_eq!(reader.get_mut().take_fds(0..5).len(), 1);
        closed_elsewhere(pipe_read).await;
    }

    #[tokio::test]
    async fn a_reader_made_read_only_reads_on_and_its_socket_stays_writable() {
        let (mut client, server) = StdUnixStream::pair().unwrap();
        server.set_nonblocking(true).unwrap();
        let (read, write) = UnixStream::from_std(server).unwrap().into_split();
        let mut reader = BufReader::new(FdReader::new(read, 1000, Closer::default()));
        send_with_fds(&mut client, b"before\nbuffered\n", &[]).unwrap();
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        assert_eq!(line, "before\n");

        let writing = reader.get_mut().read_only(write).unwrap();
        // The write half's end did not shut the socket for writing.
        let flags = rustix::net::SendFlags::empty();
        assert_eq!(rustix::net::send(&writing, b"reply\n", flags).unwrap(), 6);
        let mut reply = [0u8; 6];
        std::io::Read::read_exact(&mut client, &mut reply).unwrap();
        assert_eq!(&reply, b"reply\n");

        let (pipe_read, pipe_write) = rustix::pipe::pipe().unwrap();
        send_with_fds(&mut client, b"pipe\n", &[pipe_write.as_fd()]).unwrap();
        drop((pipe_write, client));
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).await.unwrap() == 0 {
                break;
            }
            lines.push(line);
        }
        assert_eq!(lines, ["buffered\n", "pipe\n"]);
        let passed = reader.get_mut().take_fds(0..u64::MAX);
        assert_eq!(
            passed.iter().map(what).collect::<Vec<_>>(),
            ["refused pipe"]
        );
        closed_elsewhere(pipe_read).await;
    }

    #[tokio::test]
    async fn held_descriptors_are_bounded() {
        let (mut client, server) = StdUnixStream::pair().unwrap();
        let mut reader = reader_of(server, &Closer::default());
        let sleeper = Sleeper::spawn();
        for _ in 0..MAX_HELD_FDS + 3 {
            send_with_fds(&mut client, b"x", &[sleeper.1.as_fd()]).unwrap();
        }
        drop(client);
        let mut all = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut reader, &mut all)
            .await
            .unwrap();
        assert_eq!(all.len(), MAX_HELD_FDS + 3);
        assert_eq!(reader.get_ref().held.len(), MAX_HELD_FDS);
        let too_many = vec![sleeper.1.as_fd(); MAX_FDS_PER_MESSAGE + 1];
        let (mut client, _server) = StdUnixStream::pair().unwrap();
        assert!(send_with_fds(&mut client, b"x\n", &too_many).is_err());
    }
}
