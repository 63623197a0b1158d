//! File descriptors passed with a request line (`SCM_RIGHTS`): a pidfd naming a session's
//! owner goes in the same `sendmsg` as the line that refers to it.

use std::io::{self, IoSlice, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;

use liveness_common::protocol::MAX_FDS_PER_MESSAGE;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// Writes `bytes` to a blocking stream with `fds` attached to the first of them.
pub fn send_with_fds(
    stream: &mut UnixStream,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    if fds.is_empty() {
        return stream.write_all(bytes);
    }
    let sent = sendmsg_with_fds(stream.as_fd(), bytes, fds)?;
    // The descriptors went with the first byte; the rest is plain data.
    stream.write_all(&bytes[sent..])
}

/// One `sendmsg` of (a first part of) `bytes` with `fds` attached: how many bytes went.
/// A non-blocking socket may say `WouldBlock`.
pub(crate) fn sendmsg_with_fds(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_MESSAGE))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if fds.len() > MAX_FDS_PER_MESSAGE || !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("at most {MAX_FDS_PER_MESSAGE} descriptors go with one request"),
        ));
    }
    loop {
        match rustix::net::sendmsg(
            socket,
            &[IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(sent) => return Ok(sent),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
