//! Closing what clients hand the daemon, where nobody waits for it.
//!
//! The close of a descriptor can block for as long as someone else likes: a TCP socket
//! with `SO_LINGER` and unsent data blocks close(2) until its peer reads or the linger
//! passes; a file on a FUSE mount blocks until its server answers the flush. Linux runs
//! that final release in the thread that dropped the last reference, also when the
//! reference was a descriptor queued, unread, on a socket being closed. So a descriptor a
//! client passed with `SCM_RIGHTS` is never closed on a thread that deaths or other
//! clients wait on: it goes to the closing thread of the uid that sent it, and so does a
//! closed connection with bytes still unread, whose queued descriptors that thread takes
//! out and closes (see [`crate::fd::pass::FdReader`]).
//!
//! A close that hangs stalls only the later work of its own sender's thread. What that
//! sender can make the daemon hold meanwhile is bounded: its connections stop reading (and
//! so receiving descriptors) while [`MAX_PENDING_PER_UID`] of its closes are pending, and a
//! closed connection's place under the sender's connection limit is given back only after
//! what it left is closed ([`Closer::release_after`]).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Closes of one uid pending before its connections stop reading (and so receiving more).
pub const MAX_PENDING_PER_UID: usize = 32;
/// A closing thread with nothing to close ends after this long.
const IDLE: Duration = Duration::from_secs(10);
/// How long each job waits under the `slow-close` fault (tests): a close that lags behind
/// the thread that handed it over.
const SLOW_CLOSE: Duration = Duration::from_millis(50);

/// The closing threads, one per uid with closes pending. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Closer {
    lanes: Arc<Mutex<HashMap<u32, Lane>>>,
}

/// What a closing thread does next.
enum Job {
    /// Ends a descriptor the daemon holds: `close` is given it (a plain drop, or a drain
    /// of what is queued on a socket first).
    Close(OwnedFd, fn(OwnedFd)),
    /// Drops what was kept until the closes queued before it were done.
    Release(Box<dyn Send>),
}

#[derive(Debug)]
struct Lane {
    queue: mpsc::Sender<Job>,
    /// [`Job::Close`]s sent and not done yet; changed only under the lanes' lock, so a lane
    /// whose count is 0 under it has no close queued.
    pending: usize,
    /// Jobs sent and not done yet: a lane goes only when it has none.
    queued: usize,
    /// Readers of the uid that wait for `pending` to drop below the bound.
    waiting: Vec<Waker>,
}

impl Closer {
    fn lanes(&self) -> MutexGuard<'_, HashMap<u32, Lane>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes `fd`, which `uid` handed the daemon, on that uid's closing thread.
    pub fn close(&self, uid: u32, fd: OwnedFd) {
        self.close_with(uid, fd, drop);
    }

    /// Ends `fd`, which `uid` handed the daemon, with `close` on that uid's closing thread.
    pub fn close_with(&self, uid: u32, fd: OwnedFd, close: fn(OwnedFd)) {
        self.send(uid, Job::Close(fd, close));
    }

    /// Drops `kept` once the closes `uid` has pending now are done; at once when none are.
    pub fn release_after(&self, uid: u32, kept: impl Send + 'static) {
        let lanes = self.lanes();
        if lanes.get(&uid).is_none_or(|lane| lane.pending == 0) {
            drop(lanes);
            drop(kept);
            return;
        }
        drop(lanes);
        self.send(uid, Job::Release(Box::new(kept)));
    }

    fn send(&self, uid: u32, job: Job) {
        let closes = usize::from(matches!(job, Job::Close(..)));
        let mut lanes = self.lanes();
        let job = match lanes.get_mut(&uid) {
            Some(lane) => match lane.queue.send(job) {
                Ok(()) => {
                    lane.pending += closes;
                    lane.queued += 1;
                    return;
                }
                // Its thread ended without removing the lane: only a panic does that.
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        let (queue, jobs) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name(format!("close-uid-{uid}"))
            .spawn({
                let closer = self.clone();
                move || closer.work(uid, jobs)
            });
        if let Err(e) = spawned {
            drop(lanes);
            // Left open: a close here could block whoever else this thread serves.
            tracing::error!(uid, error = %e, "cannot start a closing thread; a descriptor a client passed is left open");
            std::mem::forget(job);
            return;
        }
        // The thread cannot have ended: it takes the lock before leaving.
        let _ = queue.send(job);
        let lane = Lane {
            queue,
            pending: closes,
            queued: 1,
            waiting: Vec::new(),
        };
        if let Some(old) = lanes.insert(uid, lane) {
            old.waiting.into_iter().for_each(Waker::wake);
        }
    }

    /// Ready while `uid` has fewer than [`MAX_PENDING_PER_UID`] closes pending; else the
    /// task is woken once it has.
    pub fn poll_room(&self, uid: u32, cx: &mut Context<'_>) -> Poll<()> {
        let mut lanes = self.lanes();
        match lanes.get_mut(&uid) {
            Some(lane) if lane.pending >= MAX_PENDING_PER_UID => {
                if !lane.waiting.iter().any(|w| w.will_wake(cx.waker())) {
                    lane.waiting.push(cx.waker().clone());
                }
                Poll::Pending
            }
            _ => Poll::Ready(()),
        }
    }

    fn work(&self, uid: u32, jobs: mpsc::Receiver<Job>) {
        loop {
            match jobs.recv_timeout(IDLE) {
                Ok(job) => {
                    let closes = usize::from(matches!(job, Job::Close(..)));
                    crate::faults::delay("slow-close", SLOW_CLOSE);
                    job.run();
                    let mut lanes = self.lanes();
                    let Some(lane) = lanes.get_mut(&uid) else {
                        continue;
                    };
                    lane.pending -= closes;
                    lane.queued -= 1;
                    let room = lane.pending < MAX_PENDING_PER_UID;
                    let waiting = if room {
                        std::mem::take(&mut lane.waiting)
                    } else {
                        Vec::new()
                    };
                    drop(lanes);
                    waiting.into_iter().for_each(Waker::wake);
                }
                Err(RecvTimeoutError::Timeout) => {
                    let mut lanes = self.lanes();
                    if lanes.get(&uid).is_some_and(|lane| lane.queued == 0) {
                        lanes.remove(&uid);
                        return;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

impl Job {
    fn run(self) {
        match self {
            Job::Close(fd, close) => close(fd),
            Job::Release(kept) => drop(kept),
        }
    }
}

#[cfg(test)]
impl Closer {
    /// Gives `uid` [`MAX_PENDING_PER_UID`] closes pending, the first blocked until the
    /// descriptor returned is closed.
    pub(crate) fn fill_with_blocked_closes(&self, uid: u32) -> OwnedFd {
        fn blocking_close(gate: OwnedFd) {
            let mut buf = [0u8; 1];
            let _ = rustix::io::read(&gate, &mut buf);
        }
        let (gate_read, gate_write) = rustix::pipe::pipe().unwrap();
        self.close_with(uid, gate_read, blocking_close);
        for _ in 1..MAX_PENDING_PER_UID {
            let (_, write) = rustix::pipe::pipe().unwrap();
            self.close(uid, write);
        }
        gate_write
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    impl Closer {
        fn pending(&self, uid: u32) -> usize {
            self.lanes().get(&uid).map_or(0, |lane| lane.pending)
        }
    }

    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A close that blocks is shown by the integration tests with a lingering TCP socket
    /// passed by another uid; here, closes are counted until done and a lane goes away.
    #[test]
    fn closes_are_counted_until_done() {
        let closer = Closer::default();
        let (reader, writer) = rustix::pipe::pipe().unwrap();
        closer.close(7, writer);
        wait_until("closed", || closer.pending(7) == 0);
        // The write end is closed: the read end sees EOF.
        let mut buf = [0u8; 1];
        assert_eq!(rustix::io::read(&reader, &mut buf).unwrap(), 0);
        assert_eq!(closer.pending(8), 0, "other uids have nothing pending");
    }

    /// Set when dropped.
    struct Flag(Arc<AtomicBool>);

    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// With closes pending, readers of the uid wait for room and what is kept until they
    /// are done is kept; a blocked close holds up only its own uid.
    #[test]
    fn readers_wait_and_releases_follow_the_closes_before_them() {
        let closer = Closer::default();
        let gate = closer.fill_with_blocked_closes(7);
        let woken = Arc::new(AtomicBool::new(false));
        let waker = Waker::from(Arc::new(WakeFlag(Arc::clone(&woken))));
        let mut cx = Context::from_waker(&waker);
        assert_eq!(closer.poll_room(7, &mut cx), Poll::Pending);
        assert_eq!(closer.poll_room(8, &mut cx), Poll::Ready(()));
        let released = Arc::new(AtomicBool::new(false));
        closer.release_after(7, Flag(Arc::clone(&released)));
        let at_once = Arc::new(AtomicBool::new(false));
        closer.release_after(8, Flag(Arc::clone(&at_once)));
        assert!(
            at_once.load(Ordering::SeqCst),
            "nothing pending: released at once"
        );
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !released.load(Ordering::SeqCst),
            "kept while a close blocks"
        );
        assert!(!woken.load(Ordering::SeqCst));
        drop(gate);
        wait_until("released", || released.load(Ordering::SeqCst));
        assert!(woken.load(Ordering::SeqCst), "the waiting reader is woken");
        assert_eq!(closer.poll_room(7, &mut cx), Poll::Ready(()));
        assert_eq!(closer.pending(7), 0);
    }

    struct WakeFlag(Arc<AtomicBool>);

    impl std::task::Wake for WakeFlag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}
