//! Closing what clients hand the daemon, where nobody waits for it.
//!
//! The close of a descriptor can block for as long as someone else likes: a TCP socket
//! with `SO_LINGER` and unsent data blocks close(2) until its peer reads or the linger
//! passes; a file on a FUSE mount blocks until its server answers the flush. Linux runs
//! that final release in the thread that dropped the last reference, also when the
//! reference was a descriptor queued, unread, on a socket being closed. So a descriptor a
//! client passed with `SCM_RIGHTS` is never closed on a thread that deaths or other
//! clients wait on: it goes to the closing thread of the uid that sent it (and a
//! connection's reader takes what is still queued before it closes: see
//! [`crate::fdpass::FdReader`]). A close that
//! hangs stalls only the later closes of its own sender, whose connections stop reading
//! while too many of its closes are pending.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Closes of one uid pending before its connections stop reading (and so receiving more).
pub const MAX_PENDING_PER_UID: usize = 32;
/// A closing thread with nothing to close ends after this long.
const IDLE: Duration = Duration::from_secs(10);

/// The closing threads, one per uid with closes pending. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Closer {
    lanes: Arc<Mutex<HashMap<u32, Lane>>>,
}

#[derive(Debug)]
struct Lane {
    queue: mpsc::Sender<OwnedFd>,
    /// Sent and not closed yet; changed only under the lanes' lock, so a lane whose
    /// count is 0 under it has nothing queued and may go.
    pending: usize,
}

impl Closer {
    fn lanes(&self) -> MutexGuard<'_, HashMap<u32, Lane>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes `fd`, which `uid` handed the daemon, on that uid's closing thread.
    pub fn close(&self, uid: u32, fd: OwnedFd) {
        let mut lanes = self.lanes();
        let fd = match lanes.get_mut(&uid) {
            Some(lane) => match lane.queue.send(fd) {
                Ok(()) => {
                    lane.pending += 1;
                    return;
                }
                // Its thread ended without removing the lane: only a panic does that.
                Err(mpsc::SendError(fd)) => fd,
            },
            None => fd,
        };
        let (queue, closes) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name(format!("close-uid-{uid}"))
            .spawn({
                let closer = self.clone();
                move || closer.drain(uid, closes)
            });
        if let Err(e) = spawned {
            drop(lanes);
            tracing::warn!(uid, error = %e, "cannot start a closing thread; closing here");
            drop(fd);
            return;
        }
        // The thread cannot have ended: it takes the lock before leaving.
        let _ = queue.send(fd);
        lanes.insert(uid, Lane { queue, pending: 1 });
    }

    /// Closes not done yet of `uid`.
    pub fn pending(&self, uid: u32) -> usize {
        self.lanes().get(&uid).map_or(0, |lane| lane.pending)
    }

    /// Waits, without holding anything, until `uid` has fewer than
    /// [`MAX_PENDING_PER_UID`] closes pending.
    pub async fn wait_for_room(&self, uid: u32) {
        while self.pending(uid) >= MAX_PENDING_PER_UID {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn drain(&self, uid: u32, closes: mpsc::Receiver<OwnedFd>) {
        loop {
            match closes.recv_timeout(IDLE) {
                Ok(fd) => {
                    drop(fd);
                    if let Some(lane) = self.lanes().get_mut(&uid) {
                        lane.pending -= 1;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let mut lanes = self.lanes();
                    if lanes.get(&uid).is_some_and(|lane| lane.pending == 0) {
                        lanes.remove(&uid);
                        return;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A close that blocks is shown by the integration test with a lingering TCP socket
    /// passed by another uid; here, closes are counted until done and a lane goes away.
    #[test]
    fn closes_are_counted_until_done() {
        let closer = Closer::default();
        let (reader, writer) = rustix::pipe::pipe().unwrap();
        closer.close(7, writer);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while closer.pending(7) > 0 {
            assert!(std::time::Instant::now() < deadline, "never closed");
            std::thread::sleep(Duration::from_millis(5));
        }
        // The write end is closed: the read end sees EOF.
        let mut buf = [0u8; 1];
        assert_eq!(rustix::io::read(&reader, &mut buf).unwrap(), 0);
        assert_eq!(closer.pending(8), 0, "other uids have nothing pending");
    }
}
