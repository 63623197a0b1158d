//! The judgement of one session's activity from two samples of its tree: what counts as
//! progress, and the state it leads to. Pure: the sampler reads, this decides, and the
//! tests give it crafted samples and times.
//!
//! Progress is any of: bytes arriving on a member's TCP socket, bytes read or written by a
//! member (files, pipes, sockets), a new process in the tree, a declaration of the agent
//! (`touch`), or CPU above [`CPU_FLOOR_PERMILLE`]. Members that are *long-lived* (not the
//! owner, and started before the turn in flight, or without a declared turn alive for the
//! whole stall threshold: an MCP server, a language server), and the processes they start,
//! never count: their reconnect attempts and timers would hide the stall of the agent they
//! serve.

use std::collections::{HashMap, HashSet};

use liveness_common::activity::{
    Activity, ActivityState, Declared, Evidence, MAX_SOCKETS_LISTED, SocketEvidence, StallReason,
};
use liveness_common::identity::ProcessKey;
use liveness_proc::activity::{Io, Thread};

/// CPU of the tree's members (long-lived ones aside) that counts as progress, in
/// thousandths of one core: below it, a process only wakes for its timers.
pub const CPU_FLOOR_PERMILLE: u32 = 10;
/// CPU the whole tree used, or waited for while runnable, that with nothing else is
/// spinning: 80 % of one core. The wait counts so that a busy loop on a crowded machine,
/// which gets less than it asks for, is spinning all the same.
pub const SPIN_PERMILLE: u32 = 800;
/// Most `wchan` names an activity's evidence lists.
const MAX_WCHANS: usize = 4;

/// The thresholds one session is judged by, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    pub stall_after_ms: i64,
    pub spin_after_ms: i64,
    pub tool_stall_after_ms: i64,
    /// The sampling interval: progress within two of them is `working`.
    pub interval_ms: i64,
}

/// One TCP socket of a member, as sampled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Socket {
    pub inode: u64,
    pub peer: String,
    pub bytes_received: Option<u64>,
    pub idle_ms: Option<u64>,
    /// Received, not yet read by the process.
    pub unread: u64,
}

/// One live process of the tree, as sampled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub key: ProcessKey,
    /// Its parent's pid.
    pub parent: u32,
    /// Milliseconds since it started.
    pub age_ms: i64,
    /// CPU used so far, in milliseconds.
    pub cpu_ms: u64,
    /// How long its threads waited so far, runnable, for a CPU, in milliseconds; `None`
    /// where it was not read.
    pub waited_ms: Option<u64>,
    /// `None` where the counters cannot be read.
    pub io: Option<Io>,
    pub threads: Vec<Thread>,
    pub sockets: Vec<Socket>,
}

/// One sample of a session's tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub at_ms: i64,
    pub owner: ProcessKey,
    pub processes: Vec<Process>,
}

/// What the judge keeps of a session between samples.
#[derive(Debug, Clone)]
pub struct Tracker {
    /// The previous sample, by process: its counters.
    seen: HashMap<ProcessKey, Counters>,
    /// Bytes received so far per socket, by its owner's pid and inode.
    received: HashMap<(u32, u64), u64>,
    last_at_ms: i64,
    last_progress_ms: i64,
    /// The last declaration taken as progress.
    declared_at_ms: i64,
    /// Since when the tree burns the CPU with no other sign of progress.
    spin_since_ms: Option<i64>,
    /// The state and since when it holds (other than for the quiet states, whose since is
    /// the last progress).
    state: Option<(ActivityState, i64)>,
    /// Whether a stall episode is open: its `session.stalled` recorded, its
    /// `session.unstalled` not yet.
    open: bool,
}

/// A process's counters in a sample, kept for the next one.
#[derive(Debug, Clone, Copy)]
struct Counters {
    cpu_ms: u64,
    waited_ms: Option<u64>,
    io: Option<Io>,
}

/// A stall episode that starts or ends with this judgement: record it.
pub type Transition = Option<Activity>;

impl Tracker {
    /// A tracker that starts watching at `now_ms`, with the episode the session has under
    /// way (recorded before a restart): that one is not reported again, and its quiet time
    /// goes on from its last progress. Without one, the last progress is the agent's last
    /// declaration if it came within the last `interval_ms` (a session just registered and
    /// declared: its quiet time counts from then), else now.
    pub fn new(
        now_ms: i64,
        declared: Option<&Declared>,
        episode: Option<&Activity>,
        interval_ms: i64,
    ) -> Tracker {
        let declared_last =
            declared.map_or(now_ms, |d| d.at_ms.clamp(now_ms - interval_ms, now_ms));
        Tracker {
            seen: HashMap::new(),
            received: HashMap::new(),
            last_at_ms: now_ms,
            last_progress_ms: episode.map_or(declared_last, |e| e.since_ms.min(now_ms)),
            declared_at_ms: declared.map_or(i64::MIN, |d| d.at_ms),
            spin_since_ms: episode
                .filter(|e| e.state == ActivityState::Spinning)
                .map(|e| e.since_ms),
            state: None,
            open: episode.is_some_and(|e| e.state.is_stall()),
        }
    }

    /// Judges `sample`, taken after the previous one; returns the activity, and the
    /// episode's start or end to record.
    pub fn judge(
        &mut self,
        sample: &Sample,
        declared: Option<&Declared>,
        limits: &Thresholds,
    ) -> (Activity, Transition) {
        let now = sample.at_ms;
        let first = self.seen.is_empty();
        let span_ms = (now - self.last_at_ms).max(1);
        let turn_since = declared.and_then(|d| d.turn_since_ms);
        // Oldest first, so that a parent is judged before what it started.
        let mut by_age: Vec<&Process> = sample.processes.iter().collect();
        by_age.sort_by_key(|p| std::cmp::Reverse(p.age_ms));
        let mut long_lived = HashSet::new();
        for process in by_age {
            let old = match turn_since {
                Some(since) => process.age_ms > now - since,
                None => process.age_ms > limits.stall_after_ms,
            };
            if process.key != sample.owner && (old || long_lived.contains(&process.parent)) {
                long_lived.insert(process.key.pid);
            }
        }

        let mut evidence = Evidence {
            processes: u32::try_from(sample.processes.len()).unwrap_or(u32::MAX),
            ..Evidence::default()
        };
        let mut cpu_ms = 0u64;
        let mut waited_ms = 0u64;
        let mut long_lived_cpu_ms = 0u64;
        let mut io_progress = false;
        let mut new_process = false;
        let mut bytes_arrived = false;
        let mut wchans = HashSet::new();
        let mut sockets = Vec::new();
        let mut seen = HashMap::with_capacity(sample.processes.len());
        let mut received = HashMap::new();
        for process in &sample.processes {
            let old = self.seen.get(&process.key);
            let lived = long_lived.contains(&process.key.pid);
            new_process |= old.is_none() && !first && !lived;
            let used = old.map_or(0, |old| process.cpu_ms.saturating_sub(old.cpu_ms));
            cpu_ms += used;
            if let (Some(Some(before)), Some(now_waited)) =
                (old.map(|old| old.waited_ms), process.waited_ms)
            {
                waited_ms += now_waited.saturating_sub(before);
            }
            if lived {
                long_lived_cpu_ms += used;
            }
            if let (Some(Some(before)), Some(now_io)) = (old.map(|old| old.io), process.io) {
                let read = now_io.rchar.saturating_sub(before.rchar);
                let written = now_io.wchar.saturating_sub(before.wchar);
                evidence.written_bytes += written;
                io_progress |= !lived && read + written > 0;
            }
            for thread in &process.threads {
                let states = &mut evidence.threads;
                match thread.state {
                    'R' => states.running += 1,
                    'D' => {
                        states.blocked += 1;
                        if let Some(wchan) = &thread.wchan {
                            wchans.insert(wchan.clone());
                        }
                    }
                    'T' | 't' => states.stopped += 1,
                    _ => states.sleeping += 1,
                }
            }
            for socket in &process.sockets {
                let key = (process.key.pid, socket.inode);
                if let Some(total) = socket.bytes_received {
                    let before = self.received.get(&key).copied();
                    bytes_arrived |= !lived && before.is_some_and(|before| total > before);
                    received.insert(key, total);
                }
                sockets.push(SocketEvidence {
                    pid: process.key.pid,
                    peer: socket.peer.clone(),
                    bytes_received: socket.bytes_received,
                    idle_ms: socket.idle_ms,
                    unread: socket.unread,
                });
            }
            seen.insert(
                process.key,
                Counters {
                    cpu_ms: process.cpu_ms,
                    waited_ms: process.waited_ms,
                    io: process.io,
                },
            );
        }
        let permille = |ms: u64| u32::try_from(ms * 1000 / span_ms as u64).unwrap_or(u32::MAX);
        evidence.cpu_permille = permille(cpu_ms);
        evidence.cpu_wait_permille = permille(waited_ms);
        evidence.long_lived_cpu_permille = permille(long_lived_cpu_ms);
        let mut wchans: Vec<String> = wchans.into_iter().collect();
        wchans.sort();
        wchans.truncate(MAX_WCHANS);
        evidence.blocked_in = wchans;
        // The quietest first: the socket a stall waits on.
        sockets.sort_by_key(|s| std::cmp::Reverse(s.idle_ms.unwrap_or(0)));
        sockets.truncate(MAX_SOCKETS_LISTED);
        evidence.sockets = sockets;

        let declared_now = declared.is_some_and(|d| d.at_ms > self.declared_at_ms);
        if let Some(declared) = declared {
            self.declared_at_ms = self.declared_at_ms.max(declared.at_ms);
        }
        let working_cpu = evidence
            .cpu_permille
            .saturating_sub(evidence.long_lived_cpu_permille);
        let other_progress = io_progress || new_process || bytes_arrived || declared_now;
        if other_progress || working_cpu >= CPU_FLOOR_PERMILLE {
            self.last_progress_ms = now;
        }
        // Spinning: most of a core, had or wanted, and nothing else, sample after sample.
        let wanted_cpu = evidence
            .cpu_permille
            .saturating_add(evidence.cpu_wait_permille);
        if !first && wanted_cpu >= SPIN_PERMILLE && !other_progress {
            self.spin_since_ms.get_or_insert(self.last_at_ms);
        } else if !first {
            self.spin_since_ms = None;
        }
        self.seen = seen;
        self.received = received;
        self.last_at_ms = now;

        let quiet_ms = now - self.last_progress_ms;
        let stall_reason = || {
            if evidence.sockets.iter().any(|s| s.unread > 0) {
                StallReason::NotReading
            } else if evidence.threads.blocked > 0 {
                StallReason::Blocked
            } else if !evidence.sockets.is_empty() {
                StallReason::Network
            } else {
                StallReason::NoActivity
            }
        };
        let quiet = |reason| {
            if quiet_ms < 2 * limits.interval_ms {
                (ActivityState::Working, None, None)
            } else if quiet_ms < limits.stall_after_ms {
                (ActivityState::Quiet, None, Some(self.last_progress_ms))
            } else {
                (
                    ActivityState::Stalled,
                    Some(reason),
                    Some(self.last_progress_ms),
                )
            }
        };
        let (state, reason, since) = match (self.spin_since_ms, declared) {
            (Some(since), _) if now - since >= limits.spin_after_ms => {
                (ActivityState::Spinning, Some(StallReason::Cpu), Some(since))
            }
            // Without hooks only strong evidence makes a stall: bytes left unread, or
            // threads stuck in the kernel; an agent waiting for its user looks like any
            // other quiet tree.
            (_, None) => match quiet(stall_reason()) {
                (ActivityState::Stalled, Some(reason), since)
                    if matches!(reason, StallReason::NotReading | StallReason::Blocked) =>
                {
                    (ActivityState::Stalled, Some(reason), since)
                }
                (ActivityState::Stalled, _, since) => (ActivityState::Quiet, None, since),
                judged => judged,
            },
            (_, Some(declared)) if declared.turn_since_ms.is_none() => {
                (ActivityState::Idle, None, None)
            }
            (
                _,
                Some(Declared {
                    tool_since_ms: Some(tool_since),
                    ..
                }),
            ) => {
                if now - tool_since >= limits.tool_stall_after_ms
                    && quiet_ms >= limits.stall_after_ms
                {
                    (
                        ActivityState::Stalled,
                        Some(StallReason::Tool),
                        Some(self.last_progress_ms),
                    )
                } else {
                    (ActivityState::Tool, None, None)
                }
            }
            (_, Some(_)) => quiet(stall_reason()),
        };
        let since = since.unwrap_or_else(|| match self.state {
            Some((held, since)) if held == state => since,
            _ => now,
        });
        self.state = Some((state, since));
        let activity = Activity {
            state,
            reason,
            since_ms: since,
            evidence,
        };
        let transition = (state.is_stall() != self.open).then(|| {
            self.open = state.is_stall();
            activity.clone()
        });
        (activity, transition)
    }

    /// Whether the session is due at every round: unless it waits for its user (sampled
    /// less often), and has declared nothing since (a turn's start makes it due at once).
    pub fn is_due(&self, declared: Option<&Declared>) -> bool {
        !matches!(self.state, Some((ActivityState::Idle, _)))
            || declared.is_some_and(|d| d.at_ms > self.declared_at_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use liveness_common::activity::TurnMark;

    const LIMITS: Thresholds = Thresholds {
        stall_after_ms: 60_000,
        spin_after_ms: 120_000,
        tool_stall_after_ms: 600_000,
        interval_ms: 5_000,
    };
    const OWNER: ProcessKey = ProcessKey {
        pid: 100,
        start_ticks: 1,
    };
    const MCP: ProcessKey = ProcessKey {
        pid: 101,
        start_ticks: 2,
    };

    /// A tree sampled every 5 s: the owner blocked on a socket, and what a test adds.
    struct Run {
        tracker: Tracker,
        at_ms: i64,
        owner_cpu_ms: u64,
        /// `None`: the owner's waits are not read.
        owner_waited_ms: Option<u64>,
        owner_io: Io,
        received: u64,
        unread: u64,
        mcp_cpu_ms: Option<u64>,
        /// Short-lived processes the long-lived child starts, one per sample.
        mcp_forks: bool,
        declared: Option<Declared>,
        states: Vec<(ActivityState, Option<StallReason>)>,
        transitions: Vec<ActivityState>,
    }

    impl Run {
        fn new(declared: Option<Declared>) -> Run {
            Run {
                tracker: Tracker::new(0, declared.as_ref(), None, LIMITS.interval_ms),
                at_ms: 0,
                owner_cpu_ms: 0,
                owner_waited_ms: None,
                owner_io: Io::default(),
                received: 1000,
                unread: 0,
                mcp_cpu_ms: None,
                mcp_forks: false,
                declared,
                states: Vec::new(),
                transitions: Vec::new(),
            }
        }

        /// One sample, after `change` made the interval's activity.
        fn step(&mut self, change: impl FnOnce(&mut Run)) -> ActivityState {
            self.at_ms += 5_000;
            change(self);
            let mut processes = vec![Process {
                key: OWNER,
                parent: 1,
                age_ms: self.at_ms + 10_000,
                cpu_ms: self.owner_cpu_ms,
                waited_ms: self.owner_waited_ms,
                io: Some(self.owner_io),
                threads: vec![Thread {
                    state: 'S',
                    wchan: None,
                }],
                sockets: vec![Socket {
                    inode: 9,
                    peer: "127.0.0.1:443".into(),
                    bytes_received: Some(self.received),
                    idle_ms: Some(0),
                    unread: self.unread,
                }],
            }];
            if let Some(cpu_ms) = self.mcp_cpu_ms {
                processes.push(Process {
                    key: MCP,
                    parent: OWNER.pid,
                    age_ms: self.at_ms + 10_000,
                    cpu_ms,
                    waited_ms: None,
                    io: Some(Io {
                        rchar: cpu_ms,
                        wchar: cpu_ms,
                    }),
                    threads: vec![Thread {
                        state: 'S',
                        wchan: None,
                    }],
                    sockets: Vec::new(),
                });
            }
            if self.mcp_forks {
                processes.push(Process {
                    key: ProcessKey {
                        pid: 1000 + u32::try_from(self.at_ms / 5_000).unwrap(),
                        start_ticks: 3,
                    },
                    parent: MCP.pid,
                    age_ms: 10,
                    cpu_ms: 5,
                    waited_ms: None,
                    io: Some(Io::default()),
                    threads: Vec::new(),
                    sockets: Vec::new(),
                });
            }
            let sample = Sample {
                at_ms: self.at_ms,
                owner: OWNER,
                processes,
            };
            let (activity, transition) =
                self.tracker.judge(&sample, self.declared.as_ref(), &LIMITS);
            self.states.push((activity.state, activity.reason));
            if let Some(transition) = transition {
                self.transitions.push(transition.state);
            }
            activity.state
        }

        fn steps(&mut self, n: usize, change: impl Fn(&mut Run)) -> ActivityState {
            let mut state = ActivityState::Working;
            for _ in 0..n {
                state = self.step(&change);
            }
            state
        }
    }

    fn turn() -> Option<Declared> {
        Some(Declared {
            turn_since_ms: Some(0),
            at_ms: 0,
            ..Declared::default()
        })
    }

    #[test]
    fn a_response_that_stops_arriving_is_a_network_stall_and_bytes_end_it() {
        let mut run = Run::new(turn());
        assert_eq!(
            run.steps(3, |run| run.received += 10),
            ActivityState::Working
        );
        assert_eq!(run.steps(3, |_| {}), ActivityState::Quiet);
        assert_eq!(run.steps(10, |_| {}), ActivityState::Stalled);
        assert_eq!(run.states.last().unwrap().1, Some(StallReason::Network));
        assert_eq!(
            run.transitions,
            [ActivityState::Stalled],
            "one event per episode"
        );
        assert_eq!(run.step(|run| run.received += 1), ActivityState::Working);
        assert_eq!(
            run.transitions,
            [ActivityState::Stalled, ActivityState::Working]
        );
    }

    #[test]
    fn bytes_left_unread_are_not_reading_even_without_hooks() {
        let mut run = Run::new(None);
        run.step(|_| {});
        let state = run.steps(20, |run| run.unread = 300);
        assert_eq!(
            (state, run.states.last().unwrap().1),
            (ActivityState::Stalled, Some(StallReason::NotReading))
        );
    }

    #[test]
    fn a_byte_a_second_is_never_a_stall() {
        let mut run = Run::new(turn());
        run.steps(100, |run| {
            run.received += 5;
            run.owner_io.rchar += 5;
        });
        assert!(run.transitions.is_empty(), "{:?}", run.states);
    }

    #[test]
    fn a_declared_tool_is_tool_and_no_stall_until_its_own_threshold() {
        let mut run = Run::new(turn());
        run.declared = run
            .declared
            .as_ref()
            .map(|d| d.declare(None, Some("Bash"), false, 1));
        assert_eq!(run.steps(30, |_| {}), ActivityState::Tool);
        assert!(run.transitions.is_empty());
        assert_eq!(run.steps(100, |_| {}), ActivityState::Stalled);
        assert_eq!(run.states.last().unwrap().1, Some(StallReason::Tool));
    }

    #[test]
    fn waiting_for_the_user_is_idle_and_never_a_stall() {
        let mut run = Run::new(Some(Declared {
            at_ms: 0,
            ..Declared::default()
        }));
        assert_eq!(run.steps(100, |_| {}), ActivityState::Idle);
        assert!(run.transitions.is_empty());
    }

    #[test]
    fn a_long_lived_childs_trickle_does_not_hide_the_owners_stall() {
        let mut run = Run::new(turn());
        run.mcp_cpu_ms = Some(0);
        // 2 % of a core, and its reconnect attempts' reads and writes.
        let state = run.steps(20, |run| *run.mcp_cpu_ms.as_mut().unwrap() += 100);
        assert_eq!(state, ActivityState::Stalled, "{:?}", run.states);
    }

    #[test]
    fn what_a_long_lived_child_starts_does_not_hide_the_stall_either() {
        let mut run = Run::new(turn());
        run.mcp_cpu_ms = Some(0);
        run.mcp_forks = true;
        let state = run.steps(20, |_| {});
        assert_eq!(state, ActivityState::Stalled, "{:?}", run.states);
    }

    #[test]
    fn an_idle_session_is_due_again_once_its_agent_declares() {
        let mut run = Run::new(Some(Declared {
            at_ms: 0,
            ..Declared::default()
        }));
        assert!(run.tracker.is_due(run.declared.as_ref()), "not judged yet");
        run.step(|_| {});
        assert!(
            !run.tracker.is_due(run.declared.as_ref()),
            "idle: sampled less often"
        );
        let started = run
            .declared
            .as_ref()
            .unwrap()
            .declare(Some(TurnMark::Start), None, false, 7);
        assert!(
            run.tracker.is_due(Some(&started)),
            "a turn starts: due at once"
        );
    }

    #[test]
    fn a_busy_loop_with_no_io_is_spinning() {
        let mut run = Run::new(None);
        let state = run.steps(40, |run| run.owner_cpu_ms += 4_900);
        assert_eq!(
            (state, run.states.last().unwrap().1),
            (ActivityState::Spinning, Some(StallReason::Cpu))
        );
        assert_eq!(run.transitions, [ActivityState::Spinning]);
    }

    /// A busy loop that shares its CPU gets half of it and waits for the rest: spinning.
    /// Half a core without the wait is not.
    #[test]
    fn a_busy_loop_on_a_crowded_cpu_is_spinning_by_what_it_waited() {
        let mut crowded = Run::new(None);
        crowded.owner_waited_ms = Some(0);
        let state = crowded.steps(40, |run| {
            run.owner_cpu_ms += 2_400;
            run.owner_waited_ms = run.owner_waited_ms.map(|ms| ms + 2_500);
        });
        assert_eq!(state, ActivityState::Spinning);

        let mut half = Run::new(None);
        let state = half.steps(40, |run| run.owner_cpu_ms += 2_400);
        assert_ne!(state, ActivityState::Spinning);
        assert!(half.transitions.is_empty(), "{:?}", half.transitions);
    }

    #[test]
    fn a_worker_writing_files_is_working() {
        let mut run = Run::new(turn());
        assert_eq!(
            run.steps(50, |run| run.owner_io.wchar += 4096),
            ActivityState::Working
        );
    }

    #[test]
    fn an_episode_recorded_before_a_restart_is_not_reported_again() {
        let mut run = Run::new(turn());
        run.steps(20, |_| {});
        assert_eq!(run.transitions, [ActivityState::Stalled]);
        let recorded = Activity {
            state: ActivityState::Stalled,
            reason: Some(StallReason::Network),
            since_ms: 0,
            evidence: Evidence::default(),
        };
        run.tracker = Tracker::new(
            run.at_ms,
            run.declared.as_ref(),
            Some(&recorded),
            LIMITS.interval_ms,
        );
        run.transitions.clear();
        assert_eq!(run.steps(5, |_| {}), ActivityState::Stalled);
        assert!(run.transitions.is_empty(), "reported once, not twice");
        run.step(|run| run.received += 1);
        assert_eq!(run.transitions, [ActivityState::Working]);
    }
}
