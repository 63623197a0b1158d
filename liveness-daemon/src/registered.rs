//! Descriptors the daemon owns, registered with the current runtime's epoll.

use std::os::fd::OwnedFd;

use tokio::io::Interest;
use tokio::io::unix::{AsyncFd, AsyncFdRegisterError};

/// Registers `fd` for `interest` alone; on failure the error gives it back.
pub(crate) fn register(
    fd: OwnedFd,
    interest: Interest,
) -> Result<AsyncFd<OwnedFd>, AsyncFdRegisterError<OwnedFd>> {
    // SAFETY: the AsyncFd owns the OwnedFd, which stays open and keeps its number until
    // both are dropped together.
    unsafe { AsyncFd::register_with_interest(fd, interest) }
}
