//! Activity: whether a live session works, waits for its user, or is stuck — judged from
//! what the kernel shows of its whole tree and what its agent declares.
//!
//! A task samples every ACTIVE session's tree at an interval (`--activity-interval`; a
//! session that waits for its user every fourth), off the death path: the engine only
//! hands out copies of the trees ([`Sampling`]), the reading of `/proc` runs on the
//! blocking pool at the lowest of the daemon's priorities, and only a stall episode's start
//! or end goes back to the engine, to be committed and published ([`Judged`]).
//! [`Activities`] holds each session's last judgement for `get` and `list`. A stall's
//! start may also act (the session's `on_stall`, see [`respond`]).

mod judge;
mod respond;
mod sample;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use liveness_common::activity::{Activity, ActivityState, StallPolicy};
use liveness_common::session::{Phase, Session};
use liveness_proc::identity::ProcRoot;
use liveness_proc::sockets::DiagSockets;

use crate::engine::{Caller, Handle, Judged, KernelMembers, Sampling, Target};
use crate::fair::offload::offload;
use crate::source::tree_map::TreeMap;
use judge::{Thresholds, Tracker};
pub use respond::Responder;
use respond::Stall;

/// A session's key: its creator's uid and its id.
type Key = (u32, String);

/// How often and by what the sessions are judged, and what a stall does, where a session
/// did not choose (`livenessd --activity-interval`, `--stall-after`, `--spin-after`,
/// `--tool-stall-after`, `--on-stall`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityConfig {
    pub interval: Duration,
    pub stall_after: Duration,
    pub spin_after: Duration,
    pub tool_stall_after: Duration,
    /// The action only (its thresholds are the ones above).
    pub on_stall: StallPolicy,
}

impl ActivityConfig {
    /// The thresholds of a session with `policy`: its own where it has them.
    fn thresholds(&self, policy: Option<&StallPolicy>) -> Thresholds {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let own = |pick: fn(&StallPolicy) -> Option<u64>, default: Duration| {
            policy
                .and_then(pick)
                .map_or(ms(default), |own| i64::try_from(own).unwrap_or(i64::MAX))
        };
        Thresholds {
            stall_after_ms: own(|p| p.stall_after_ms, self.stall_after),
            spin_after_ms: own(|p| p.spin_after_ms, self.spin_after),
            tool_stall_after_ms: own(|p| p.tool_stall_after_ms, self.tool_stall_after),
            interval_ms: ms(self.interval),
        }
    }

    /// The action of a session with `policy`: its own, else the daemon's.
    fn action(&self, policy: Option<&StallPolicy>) -> StallPolicy {
        match policy {
            Some(own) if own.action.is_some() => StallPolicy {
                action: own.action,
                signal: own.signal,
                run: own.run.clone(),
                ..StallPolicy::default()
            },
            _ => self.on_stall.clone(),
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
    memo: sample::Memo,
}

/// Samples and judges until `stopped`; `responder` acts on the stalls.
pub async fn run(
    config: ActivityConfig,
    responder: Responder,
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
        let (proc, members, config) = (proc.clone(), members.clone(), config.clone());
        let stopping = stopped.clone();
        let sampled = offload(move || {
            sample_round(
                round,
                targets,
                &config,
                &proc,
                members.as_deref(),
                &stopping,
            )
        })
        .await;
        let (done, episodes) = match sampled {
            Some(Some(done)) => done,
            // Cut short by a stop, which the exit would wait for (the blocking pool).
            Some(None) => return,
            None => {
                tracing::error!("a round of activity sampling panicked; starting afresh");
                round = Round::default();
                continue;
            }
        };
        round = done;
        activities.replace(round.table.clone());
        for (uid, id, activity, stall) in episodes {
            match engine
                .ask(Caller::DAEMON, Judged { uid, id, activity })
                .await
            {
                // Recorded now, so never before: the episode's action runs once.
                Ok(Some(_)) => {
                    if let Some(stall) = stall {
                        responder.respond(stall);
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "cannot record a stall episode"),
            }
        }
    }
}

/// An episode's start or end to record, and for a start, what its action needs.
type Episode = (u32, String, Activity, Option<Stall>);

/// One round: each due session sampled and judged. Returns the round and the episodes that
/// start or end; `None` if the daemon began to stop meanwhile (`stopped`), the round cut
/// short.
fn sample_round(
    mut round: Round,
    targets: Vec<Target>,
    config: &ActivityConfig,
    proc: &ProcRoot,
    members: Option<&TreeMap>,
    stopped: &watch::Receiver<bool>,
) -> Option<(Round, Vec<Episode>)> {
    let now_ms = crate::engine::Clock::System.now_ms();
    let interval_ms = i64::try_from(config.interval.as_millis()).unwrap_or(i64::MAX);
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
    let mut kernel = KernelMembers::new(members);
    for target in targets {
        if *stopped.borrow() {
            return None;
        }
        let key = (target.uid, target.id);
        let mut tracker = round.trackers.remove(&key).unwrap_or_else(|| {
            Tracker::new(
                now_ms,
                target.declared.as_ref(),
                target.episode.as_ref(),
                interval_ms,
            )
        });
        let due =
            tracker.is_due(target.declared.as_ref()) || round.number.is_multiple_of(IDLE_EVERY);
        match round.table.remove(&key) {
            Some(last) if !due => {
                table.insert(key.clone(), last);
            }
            _ => {
                let (sample, live) = sample::read(
                    target.tree.known_members(&mut kernel),
                    target.owner.key(),
                    proc,
                    &mut tcp,
                    &mut round.memo,
                    now_ms,
                    uptime_ticks,
                );
                let thresholds = config.thresholds(target.on_stall.as_ref());
                let (activity, transition) =
                    tracker.judge(&sample, target.declared.as_ref(), &thresholds);
                if let Some(transition) = transition {
                    let stall = transition.state.is_stall().then(|| Stall {
                        uid: key.0,
                        session: key.1.clone(),
                        labels: target.labels,
                        owner: target.owner,
                        members: live,
                        grace: Duration::from_millis(target.grace_ms),
                        policy: config.action(target.on_stall.as_ref()),
                        activity: transition.clone(),
                    });
                    episodes.push((key.0, key.1.clone(), transition, stall));
                }
                table.insert(key.clone(), activity);
            }
        }
        trackers.insert(key, tracker);
    }
    drop(tcp);
    round.memo.next_round();
    round.tcp = Some(diag);
    round.trackers = trackers;
    round.table = table;
    Some((round, episodes))
}
