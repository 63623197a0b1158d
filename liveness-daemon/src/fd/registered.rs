//! Descriptors the daemon owns, registered with the current runtime's epoll.

use std::os::fd::{AsRawFd, OwnedFd};

use liveness_proc::pidref::PidRef;
use tokio::io::Interest;
use tokio::io::unix::{AsyncFd, AsyncFdRegisterError};

/// A holder that owns its descriptor: open, and the same one, for as long as it lives.
pub(crate) trait OwnsFd: AsRawFd {}

impl OwnsFd for OwnedFd {}

/// Its pidfd is opened with it and never replaced.
impl OwnsFd for PidRef {}

/// Registers `fd` for `interest` alone; on failure the error gives it back.
pub(crate) fn register<T: OwnsFd>(
    fd: T,
    interest: Interest,
) -> Result<AsyncFd<T>, AsyncFdRegisterError<T>> {
    // SAFETY: the AsyncFd owns the holder, which keeps its descriptor open and its number
    // the same until both are dropped together (`OwnsFd`).
    unsafe { AsyncFd::register_with_interest(fd, interest) }
}
