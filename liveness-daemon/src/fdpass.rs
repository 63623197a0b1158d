//! File descriptors passed with request lines (`SCM_RIGHTS`), both ends.
//!
//! A client sends a request line in one `sendmsg` with the descriptors attached (a pidfd
//! naming a session's owner). A `recvmsg` on a Unix stream socket may return earlier
//! plain bytes together with the message that carries descriptors, but it stops right
//! after that message (Linux never reads past descriptors in one call): the last byte a
//! read returns belongs to the message the descriptors came with. The server's reader
//! notes that stream position for each descriptor, and the connection claims the ones
//! noted within a line's bytes for that line's request. Descriptors are held in
//! [`OwnedFd`]s: whatever no request claims is closed, never leaked.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::ops::Range;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::{AsyncRead, Interest, ReadBuf};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedReadHalf;

/// Most descriptors accepted with one message; the kernel closes any beyond (`MSG_CTRUNC`).
pub const MAX_FDS_PER_MESSAGE: usize = 4;
/// Most descriptors a connection holds while their lines are read; older ones are closed
/// first when more arrive, so a client cannot pile up descriptors in the daemon.
pub const MAX_HELD_FDS: usize = 8;

/// The read half of a connection, read with `recvmsg` so passed descriptors are kept.
#[derive(Debug)]
pub struct FdReader {
    half: OwnedReadHalf,
    /// Bytes read so far: the stream position of the next byte.
    position: u64,
    /// Received descriptors with the stream position of the last byte of their read.
    held: VecDeque<(u64, OwnedFd)>,
}

impl FdReader {
    pub fn new(half: OwnedReadHalf) -> FdReader {
        FdReader {
            half,
            position: 0,
            held: VecDeque::new(),
        }
    }

    /// The descriptors that arrived with the bytes `line` (stream positions). Those that
    /// arrived before it belonged to earlier lines that did not use them: they are closed.
    pub fn take_fds(&mut self, line: Range<u64>) -> Vec<OwnedFd> {
        while self.held.front().is_some_and(|(at, _)| *at < line.start) {
            self.held.pop_front();
        }
        let mut taken = Vec::new();
        while self.held.front().is_some_and(|(at, _)| line.contains(at)) {
            taken.extend(self.held.pop_front().map(|(_, fd)| fd));
        }
        taken
    }

    fn keep(&mut self, at: u64, fd: OwnedFd) {
        if self.held.len() == MAX_HELD_FDS {
            tracing::debug!("a client passed more descriptors than it used; closing the oldest");
            self.held.pop_front();
        }
        self.held.push_back((at, fd));
    }
}

/// One `recvmsg`: the bytes read, and the descriptors that came with them.
fn receive(stream: &UnixStream, into: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_MESSAGE))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = rustix::net::recvmsg(
        stream,
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
        loop {
            let stream: &UnixStream = this.half.as_ref();
            ready!(stream.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match stream.try_io(Interest::READABLE, || receive(stream, unfilled)) {
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

/// Writes `bytes` to a blocking stream with `fds` attached to the first of them.
pub fn send_with_fds(
    stream: &mut StdUnixStream,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    if fds.is_empty() {
        return stream.write_all(bytes);
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_MESSAGE))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if fds.len() > MAX_FDS_PER_MESSAGE || !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("at most {MAX_FDS_PER_MESSAGE} descriptors go with one request"),
        ));
    }
    let sent = loop {
        match rustix::net::sendmsg(
            &*stream,
            &[IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(sent) => break sent,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    // The descriptors went with the first byte; the rest is plain data.
    stream.write_all(&bytes[sent..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    use tokio::io::{AsyncBufReadExt, BufReader};

    fn inode(fd: &OwnedFd) -> u64 {
        rustix::fs::fstat(fd).unwrap().st_ino
    }

    #[tokio::test]
    async fn descriptors_belong_to_the_line_they_were_sent_with() {
        let (mut client, server) = StdUnixStream::pair().unwrap();
        server.set_nonblocking(true).unwrap();
        let (read, _write) = UnixStream::from_std(server).unwrap().into_split();
        let mut reader = BufReader::new(FdReader::new(read));
        let first = tempfile::tempfile().unwrap();
        let second = tempfile::tempfile().unwrap();
        let unused = tempfile::tempfile().unwrap();

        send_with_fds(&mut client, b"plain\n", &[]).unwrap();
        send_with_fds(&mut client, b"one\n", &[unused.as_fd()]).unwrap();
        send_with_fds(&mut client, b"two\n", &[first.as_fd(), second.as_fd()]).unwrap();
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
                claimed.push((line, fds.iter().map(inode).collect::<Vec<_>>()));
            }
        }
        let expected = |file: &std::fs::File| file.metadata().unwrap().ino();
        assert_eq!(
            claimed,
            vec![
                ("plain\n".to_owned(), vec![]),
                (
                    "two\n".to_owned(),
                    vec![expected(&first), expected(&second)]
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
    async fn held_descriptors_are_bounded() {
        let (mut client, server) = StdUnixStream::pair().unwrap();
        server.set_nonblocking(true).unwrap();
        let (read, _write) = UnixStream::from_std(server).unwrap().into_split();
        let mut reader = BufReader::new(FdReader::new(read));
        let file = tempfile::tempfile().unwrap();
        for _ in 0..MAX_HELD_FDS + 3 {
            send_with_fds(&mut client, b"x", &[file.as_fd()]).unwrap();
        }
        drop(client);
        let mut all = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut reader, &mut all)
            .await
            .unwrap();
        assert_eq!(all.len(), MAX_HELD_FDS + 3);
        assert_eq!(reader.get_ref().held.len(), MAX_HELD_FDS);
        let too_many = vec![file.as_fd(); MAX_FDS_PER_MESSAGE + 1];
        let (mut client, _server) = StdUnixStream::pair().unwrap();
        assert!(send_with_fds(&mut client, b"x\n", &too_many).is_err());
    }
}
