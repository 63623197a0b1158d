//! Who gets the CPU first. The engine's thread keeps the daemon's priority and asks for
//! short time slices, so that the scheduler lets it preempt at once when a death wakes it;
//! the runtime that serves connections runs a step below it; work whose size someone else
//! chose (a listing, a big process tree, a `/proc` scan for a reap) runs on the blocking
//! pool a step below that. Under load a death is handled before a client's request, and a
//! small request before a big one. (Not `SCHED_IDLE`: a thread of it that hands a result
//! back to the runtime, under the runtime's locks, can wait for the CPU long enough to
//! hold up the threads that serve connections.)
//!
//! A user's requests take turns on the pool (`offload_for`): however many it sends, one
//! uid's work holds at most half of the CPUs, so that the rest stays free for deaths and
//! for other users.
//!
//! These only ever lower a thread's claim, which needs no privilege; Linux applies them to
//! the calling thread only. Where the kernel refuses one, the thread runs as it was.

use std::sync::{Arc, LazyLock};

use crate::fair::turns::UidTurns;

/// Niceness of the threads that serve connections.
pub const CONNECTIONS_NICE: i32 = 5;
/// Niceness of the threads that do work whose size someone else chose (and of the fleet
/// mirror, whose work etcd's speed and the events' number decide).
pub const CLIENT_WORK_NICE: i32 = 10;
/// The time slice the engine's thread asks for (Linux 6.12+ honours it for normal tasks:
/// a waking task with a shorter slice preempts the running one).
const ENGINE_SLICE_NS: u64 = 100_000;

/// Lowers the calling thread's priority to `nice`.
pub fn lower_this_thread(nice: i32) {
    // `None`: the calling thread.
    let _ = rustix::process::setpriority_process(None, nice);
}

/// Asks short time slices for the calling thread, the engine's (see the module).
pub fn short_slices() {
    /// `struct sched_attr` of `sched_setattr(2)`, its first version.
    #[repr(C)]
    struct SchedAttr {
        size: u32,
        policy: u32,
        flags: u64,
        nice: i32,
        priority: u32,
        runtime: u64,
        deadline: u64,
        period: u64,
    }
    let attr = SchedAttr {
        size: size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice: rustix::process::getpriority_process(None).unwrap_or(0),
        priority: 0,
        runtime: ENGINE_SLICE_NS,
        deadline: 0,
        period: 0,
    };
    // SAFETY: sched_setattr reads `size` bytes of a valid `sched_attr` for thread 0, the
    // caller; it changes nothing else.
    unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) };
}

/// Runs `work` a client of `uid` asked for on the blocking pool, when that uid has a turn
/// free (see the module). `None` if it panicked.
pub async fn offload_for<T: Send + 'static>(
    uid: u32,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    static TURNS: LazyLock<Arc<UidTurns>> = LazyLock::new(|| {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        UidTurns::new(cpus / 2)
    });
    let _turn = TURNS.take(uid).await;
    offload(work).await
}

/// Runs `work` on the blocking pool, at the lowest of the daemon's priorities. `None` if
/// it panicked.
pub async fn offload<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let work = move || {
        // Once set it stays: every task of the blocking pool is such work.
        lower_this_thread(CLIENT_WORK_NICE);
        work()
    };
    tokio::task::spawn_blocking(work).await.ok()
}
