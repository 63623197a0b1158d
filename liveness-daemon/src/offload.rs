//! Work whose size someone else chose (a listing, a big process tree, a `/proc` scan for a
//! reap), run where it holds up neither the engine nor the runtime's workers.

/// Niceness of the threads that do such work: under load, the engine and small requests
/// get the CPU first.
const NICE: i32 = 10;

/// Runs `work` on the blocking pool at a lower priority. `None` if it panicked.
pub async fn offload<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let work = move || {
        // Linux sets the niceness of the calling thread only; once lowered it stays, and
        // every task of the blocking pool is such work.
        let _ = rustix::process::setpriority_process(None, NICE);
        work()
    };
    tokio::task::spawn_blocking(work).await.ok()
}
