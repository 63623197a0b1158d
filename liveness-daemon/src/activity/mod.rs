//! Activity: whether a live session works, waits for its user, or is stuck — judged from
//! what the kernel shows of its whole tree and what its agent declares.
//!
//! A task samples every ACTIVE session's tree at an interval (`--activity-interval`; a
//! session that waits for its user every fourth), off the death path: the engine only
//! hands out copies of the trees ([`Sampling`]), the reading of `/proc` runs on the
//! blocking pool at the lowest of the daemon's priorities, and only a stall episode's start
//! or end goes back to the engine, to be committed and published ([`Judged`]).
//! [`Activities`] holds each session's last judgement for `get` and `list`.

mod judge;
mod sample;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use liveness_common::activity::{Activity, ActivityState};
use liveness_common::session::{Phase, Session};
use liveness_proc::identity::ProcRoot;
use liveness_proc::sockets::DiagSockets;

use crate::engine::{Caller, Handle, Judged, Sampling, Target};
use crate::fair::offload::offload;
use crate::source::tree_map::TreeMap;
use judge::{Thresholds, Tracker};

/// A session's key: its creator's uid and its id.
type Key = (u32, String);

/// How often and by what the sessions are judged (`livenessd --activity-interval`,
/// `--stall-after`, `--spin-after`, `--tool-stall-after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivityConfig {
    pub interval: Duration,
    pub stall_after: Duration,
    pub spin_after: Duration,
    pub tool_stall_after: Duration,
}

impl ActivityConfig {
    fn thresholds(&self) -> Thresholds {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Thresholds {
            stall_after_ms: ms(self.stall_after),
            spin_after_ms: ms(self.spin_after),
            tool_stall_after_ms: ms(self.tool_stall_after),
            interval_ms: ms(self.interval),
        }
    }
}

/// A session that waits for its user is sampled once in this many rounds.
const IDLE_EVERY: u32 = 4;

/// Each ACTIVE session's last judgement. Written by the sampler only, once a round, whole;
/// read by the connections that answer `get` and `list`.
#[derive(Debug, Clone, Default)]
pub struct Activities(Arc<RwLock<HashMap<Key, Activity>>>);

impl Activities {
    /// Gives an ACTIVE session its last judgement; one not judged yet keeps what is stored
    /// (the episode under way, if any).
    pub fn fill(&self, session: &mut Session) {
        if session.phase != Phase::Active {
            return;
        }
        let table = self.0.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(activity) = table.get(&(session.creator_uid, session.id.clone())) {
            session.activity = Some(activity.clone());
        }
    }

    /// How many live sessions are in each state.
    pub fn counts(&self) -> BTreeMap<ActivityState, u32> {
        let table = self.0.read().unwrap_or_else(PoisonError::into_inner);
        let mut counts = BTreeMap::new();
        for activity in table.values() {
            *counts.entry(activity.state).or_default() += 1;
        }
        counts
    }

    fn replace(&self, table: HashMap<Key, Activity>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = table;
    }
}

/// What the sampler keeps between rounds.
#[derive(Debug, Default)]
struct Round {
    trackers: HashMap<Key, Tracker>,
    table: HashMap<Key, Activity>,
    number: u32,
    /// The sock_diag sockets, one per network namespace, made at the first round.
    tcp: Option<DiagSockets>,
}

/// Samples and judges until `stopped`.
pub async fn run(
    config: ActivityConfig,
    engine: Handle,
    proc: ProcRoot,
    members: Option<Arc<TreeMap>>,
    activities: Activities,
    mut stopped: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut round = Round::default();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stopped.changed() => return,
        }
        let Ok(targets) = engine.ask(Caller::DAEMON, Sampling).await else {
            return;
        };
        let (proc, members) = (proc.clone(), members.clone());
        let Some((done, episodes)) =
            offload(move || sample_round(round, targets, &config, &proc, members.as_deref())).await
        else {
            tracing::error!("a round of activity sampling panicked; starting afresh");
            round = Round::default();
            continue;
        };
        round = done;
        activities.replace(round.table.clone());
        for (uid, id, activity) in episodes {
            if let Err(e) = engine
                .ask(Caller::DAEMON, Judged { uid, id, activity })
                .await
            {
                tracing::warn!(error = %e.message, "cannot record a stall episode");
            }
        }
    }
}

/// One round: each due session sampled and judged. Returns the round and the episodes that
/// start or end.
fn sample_round(
    mut round: Round,
    targets: Vec<Target>,
    config: &ActivityConfig,
    proc: &ProcRoot,
    members: Option<&TreeMap>,
) -> (Round, Vec<(u32, String, Activity)>) {
    let thresholds = config.thresholds();
    let now_ms = crate::engine::Clock::System.now_ms();
    round.number = round.number.wrapping_add(1);
    let mut trackers = HashMap::with_capacity(targets.len());
    let mut table = HashMap::with_capacity(targets.len());
    let mut episodes = Vec::new();
    let uptime_ticks = proc.uptime_ticks();
    let mut diag = round
        .tcp
        .take()
        .unwrap_or_else(|| DiagSockets::new(proc.clone()));
    let mut tcp = diag.round();
    for target in targets {
        let key = (target.uid, target.id);
        let mut tracker = round.trackers.remove(&key).unwrap_or_else(|| {
            Tracker::new(now_ms, target.declared.as_ref(), target.episode.as_ref())
        });
        let due =
            tracker.is_due(target.declared.as_ref()) || round.number.is_multiple_of(IDLE_EVERY);
        match round.table.remove(&key) {
            Some(last) if !due => {
                table.insert(key.clone(), last);
            }
            _ => {
                let live = target.tree.live_members(members, proc);
                let sample = sample::read(
                    &live,
                    target.owner.key(),
                    proc,
                    &mut tcp,
                    now_ms,
                    uptime_ticks,
                );
                let (activity, transition) =
                    tracker.judge(&sample, target.declared.as_ref(), &thresholds);
                if let Some(transition) = transition {
                    episodes.push((key.0, key.1.clone(), transition));
                }
                table.insert(key.clone(), activity);
            }
        }
        trackers.insert(key, tracker);
    }
    drop(tcp);
    round.tcp = Some(diag);
    round.trackers = trackers;
    round.table = table;
    (round, episodes)
}
