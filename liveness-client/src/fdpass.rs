//! File descriptors passed with a request line (`SCM_RIGHTS`): a pidfd naming a session's
//! owner goes in the same `sendmsg` as the line that refers to it.

use std::io::{self, IoSlice, Write};
use std::mem::MaybeUninit;
use std::os::fd::BorrowedFd;
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
