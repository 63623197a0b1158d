//! Points where the fault suite SIGKILLs the daemon, to prove that no moment of the death
//! path loses or duplicates an event, or slows it down, to make a race lose every time.
//! Only in debug builds (what the tests run), and only when `LIVENESS_FAULT` names the
//! point: `after-append` (journaled, not yet published), `after-publish` (published, not
//! yet in SQLite), `mid-replay` (at start, before the journal's replay commits); of end
//! actions: `before-action-start` (its session ended, the action not yet marked running),
//! `after-action-spawn` (running, its first process recorded), `before-action-commit`
//! (finished, its outcome not yet committed); and a delay, `slow-close` (each close of a
//! closing thread waits first).

use std::time::Duration;

/// Whether `LIVENESS_FAULT` names `point` in a debug build.
fn named(point: &str) -> bool {
    cfg!(debug_assertions) && std::env::var("LIVENESS_FAULT").is_ok_and(|wanted| wanted == point)
}

/// Dies by SIGKILL here if `LIVENESS_FAULT` names `point`.
pub fn point(point: &str) {
    if named(point) {
        tracing::warn!(point, "LIVENESS_FAULT: dying here");
        // SAFETY: kill(2) of this process, to die as an outside SIGKILL would kill it.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

/// Waits `pause` here if `LIVENESS_FAULT` names `point`.
pub fn delay(point: &str, pause: Duration) {
    if named(point) {
        std::thread::sleep(pause);
    }
}
