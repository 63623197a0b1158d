//! A share of the engine per user. Each operation of a user other than root is charged
//! [`CHARGE_FACTOR`] times the time the engine spent on it; a user whose charges run more
//! than [`BURST`] ahead of the clock waits before its next operation is sent. A flood of
//! requests from one user (locks taken and given back, registrations) so holds the engine
//! about half of the time, and a death arriving meanwhile finds it free at least as often
//! as busy; a user's occasional request never waits.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Engine time a user may use at once before its operations are spaced out.
const BURST: Duration = Duration::from_millis(5);
/// What an operation is charged, as a multiple of its own time in the engine: the engine
/// spends about as much again around each (its turn of the loop, the answer, the log line
/// of what it changed), so a user flooding the engine holds it about half of the time.
const CHARGE_FACTOR: u32 = 4;
/// Users kept before those whose charges are all past are forgotten.
const FORGET_AFTER: usize = 1024;

/// See the module.
#[derive(Debug, Default)]
pub struct Pacing {
    /// Per uid, when its charges are paid off at the rate of the clock.
    paid_at: Mutex<HashMap<u32, Instant>>,
}

impl Pacing {
    fn paid_at(&self) -> MutexGuard<'_, HashMap<u32, Instant>> {
        self.paid_at.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until `uid` may send the engine another command.
    pub async fn wait(&self, uid: u32) {
        loop {
            let ready_at = self.paid_at().get(&uid).map(|&paid| paid - BURST);
            match ready_at {
                Some(at) if at > Instant::now() => tokio::time::sleep_until(at).await,
                _ => return,
            }
        }
    }

    /// Charges `uid` with `took` of the engine's time.
    pub fn charge(&self, uid: u32, took: Duration) {
        let now = Instant::now();
        let mut paid_at = self.paid_at();
        let paid = paid_at.entry(uid).or_insert(now);
        *paid = (*paid).max(now) + took * CHARGE_FACTOR;
        if paid_at.len() > FORGET_AFTER {
            paid_at.retain(|_, paid| *paid > now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A user may use [`BURST`] at once; past it, it waits what it used beyond.
    #[tokio::test(start_paused = true)]
    async fn a_user_past_its_burst_waits_and_others_do_not() {
        let pacing = Pacing::default();
        pacing.charge(1000, BURST / CHARGE_FACTOR);
        let started = Instant::now();
        pacing.wait(1000).await;
        assert_eq!(started.elapsed(), Duration::ZERO, "within its burst");
        pacing.charge(1000, Duration::from_millis(1));
        pacing.wait(1000).await;
        assert_eq!(started.elapsed(), Duration::from_millis(4));
        pacing.wait(1001).await;
        assert_eq!(started.elapsed(), Duration::from_millis(4), "another user");
    }
}
