//! Who gets the CPU first. The engine's thread keeps the daemon's priority; the runtime
//! that serves connections runs a step below it, and work whose size someone else chose
//! (a listing, a big process tree, a `/proc` scan for a reap) runs on the blocking pool
//! below that. Under load, a death is handled before a client's request, and a small
//! request before a big one; nothing is starved, as niceness only weighs shares.
//!
//! Niceness only ever goes up here, which needs no privilege. Linux applies it to the
//! calling thread only.

/// Niceness of the threads that serve connections.
pub const CONNECTIONS_NICE: i32 = 5;
/// Niceness of the threads that do work whose size someone else chose.
const CLIENT_WORK_NICE: i32 = 10;

/// Lowers the calling thread's priority to `nice`.
pub fn lower_this_thread(nice: i32) {
    // `None`: the calling thread.
    let _ = rustix::process::setpriority_process(None, nice);
}

/// Runs `work` on the blocking pool at the lowest of the daemon's priorities. `None` if it
/// panicked.
pub async fn offload<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let work = move || {
        // Once lowered it stays: every task of the blocking pool is such work.
        lower_this_thread(CLIENT_WORK_NICE);
        work()
    };
    tokio::task::spawn_blocking(work).await.ok()
}
