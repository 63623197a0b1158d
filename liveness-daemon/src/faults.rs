//! Points where the fault suite SIGKILLs the daemon, to prove that no moment of the death
//! path loses or duplicates an event. Only in debug builds (what the tests run), and only
//! when `LIVENESS_FAULT` names the point: `after-append` (journaled, not yet published),
//! `after-publish` (published, not yet in SQLite), `mid-replay` (at start, before the
//! journal's replay commits).

/// Dies by SIGKILL here if `LIVENESS_FAULT` names `point`.
pub fn point(point: &str) {
    if cfg!(debug_assertions) && std::env::var("LIVENESS_FAULT").is_ok_and(|wanted| wanted == point)
    {
        tracing::warn!(point, "LIVENESS_FAULT: dying here");
        // SAFETY: kill(2) of this process, to die as an outside SIGKILL would kill it.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}
