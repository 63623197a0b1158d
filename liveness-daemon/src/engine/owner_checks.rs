//! Registrations that succeed but look wrong: an owner that is a launcher (`timeout`,
//! `npx`...) rather than the program it runs, or one that dies within a second of its
//! registration (unless the registering process started it itself: then it knows). The
//! first is a warning in the reply; the second a warning in the log, since the reply has
//! gone by then.

use std::collections::VecDeque;

use liveness_common::identity::{Identity, ProcessKey};
use liveness_proc::identity::{KNOWN_LAUNCHERS, ProcRoot};

/// An owner that dies sooner than this after its registration was probably not the
/// program the session is about.
const YOUNG_MS: i64 = 1000;

/// Owners registered within the last second, oldest first. Bounded: beyond `CAPACITY`
/// registrations a second the oldest are forgotten (only a warning is lost).
#[derive(Debug, Default)]
pub(super) struct FreshOwners {
    recent: VecDeque<(ProcessKey, i64)>,
}

impl FreshOwners {
    const CAPACITY: usize = 4096;

    pub(super) fn registered(&mut self, owner: ProcessKey, now_ms: i64) {
        self.forget_before(now_ms - YOUNG_MS);
        if self.recent.len() == Self::CAPACITY {
            self.recent.pop_front();
        }
        self.recent.push_back((owner, now_ms));
    }

    /// How long after its registration `owner` died, if that was within the first second.
    pub(super) fn died_young(&mut self, owner: ProcessKey, died_ms: i64) -> Option<i64> {
        let index = self.recent.iter().position(|(key, _)| *key == owner)?;
        let (_, registered_ms) = self.recent.remove(index)?;
        let lived = died_ms - registered_ms;
        (lived < YOUNG_MS).then_some(lived.max(0))
    }

    fn forget_before(&mut self, cutoff_ms: i64) {
        while self.recent.front().is_some_and(|(_, at)| *at < cutoff_ms) {
            self.recent.pop_front();
        }
    }
}

/// A warning when `owner: "auto"` stopped at a known launcher.
pub(super) fn launcher_warning(proc: &ProcRoot, owner: &Identity) -> Option<String> {
    let program = proc.program_name(owner.pid);
    let name = [Some(owner.comm.as_str()), program.as_deref()]
        .into_iter()
        .flatten()
        .find(|name| KNOWN_LAUNCHERS.contains(name))?;
    Some(format!(
        "the owner found is {name}[{}], a launcher: the session ends when it exits. If it \
         runs the real owner, skip it with `--wrapper {name}` (or `livenessd --wrapper {name}`)",
        owner.pid
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(pid: u32) -> ProcessKey {
        ProcessKey {
            pid,
            start_ticks: 7,
        }
    }

    #[test]
    fn an_owner_dying_within_a_second_of_registration_is_young() {
        let mut fresh = FreshOwners::default();
        fresh.registered(key(1), 10_000);
        fresh.registered(key(2), 10_000);
        assert_eq!(fresh.died_young(key(1), 10_300), Some(300));
        assert_eq!(fresh.died_young(key(1), 10_400), None, "reported once");
        assert_eq!(fresh.died_young(key(2), 11_500), None, "lived 1.5 s");
        assert_eq!(fresh.died_young(key(3), 10_001), None, "never registered");
    }

    #[test]
    fn old_registrations_are_forgotten_and_the_list_is_bounded() {
        let mut fresh = FreshOwners::default();
        fresh.registered(key(1), 0);
        fresh.registered(key(2), 5_000);
        assert_eq!(fresh.recent.len(), 1, "the first is over a second old");
        for pid in 0..(FreshOwners::CAPACITY as u32 + 10) {
            fresh.registered(key(100 + pid), 5_000);
        }
        assert_eq!(fresh.recent.len(), FreshOwners::CAPACITY);
    }
}
