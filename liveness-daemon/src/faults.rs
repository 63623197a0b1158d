//! Points where the fault suite SIGKILLs the daemon, to prove that no moment of the death
//! path loses or duplicates an event, or slows it down, to make a race lose every time.
//! Only in debug builds (what the tests run), and only when `LIVENESS_FAULT` names the
//! point: `after-append` (journaled, not yet published), `after-publish` (published, not
//! yet in SQLite), `mid-replay` (at start, before the journal's replay commits); of end
//! actions: `before-action-start` (its session ended, the action not yet marked running),
//! `after-action-fork` (running, its first process forked but neither recorded nor
//! released to run its program), `after-action-spawn` (running, its first process recorded
//! and released), `before-action-commit` (finished, its outcome not yet committed);
//! delays, `slow-close` (each close of a closing thread waits first) and
//! `action-child-lingers` (each action's child waits a second before it closes the
//! daemon's descriptors, as a child not yet scheduled would); and a state the user may
//! bring about, `action-stopped-before-exec` (each action's child stops itself right after
//! taking on its user's ids, before its program runs, as that user may stop it).

use std::time::Duration;

/// Whether `LIVENESS_FAULT` (one point, or several separated by commas) names `point` in
/// a debug build.
pub fn armed(point: &str) -> bool {
    cfg!(debug_assertions)
        && std::env::var("LIVENESS_FAULT").is_ok_and(|wanted| wanted.split(',').any(|w| w == point))
}

/// Dies by SIGKILL here if `LIVENESS_FAULT` names `point`.
pub fn point(point: &str) {
    if armed(point) {
        tracing::warn!(point, "LIVENESS_FAULT: dying here");
        // SAFETY: raise(3) is a plain system call; a SIGKILL to any thread ends the whole
        // process, as an outside SIGKILL would.
        unsafe { libc::raise(libc::SIGKILL) };
    }
}

/// Waits `pause` here if `LIVENESS_FAULT` names `point`.
pub fn delay(point: &str, pause: Duration) {
    if armed(point) {
        std::thread::sleep(pause);
    }
}
