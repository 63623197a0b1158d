//! What a live session is doing: the phase its agent declares (`touch` from its hooks) and
//! what the daemon judges from its process tree (`working`, `stalled`, `spinning`, ...).

use serde::{Deserialize, Serialize};

use crate::action::ActionSpec;

/// The longest tool name `touch` accepts.
pub const MAX_TOOL_NAME: usize = 128;
/// The most sockets an activity's evidence lists.
pub const MAX_SOCKETS_LISTED: usize = 8;

/// A turn's start or end, as an agent's hook declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnMark {
    Start,
    End,
}

/// What the session's agent last declared, kept with the session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Declared {
    /// When the turn in flight started; absent when none is (the agent waits for its user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_since_ms: Option<i64>,
    /// The tool in flight, and since when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_since_ms: Option<i64>,
    /// The last declaration.
    pub at_ms: i64,
}

impl Declared {
    /// `self` after a declaration at `now_ms`. A tool's start implies a turn in flight (an
    /// agent may have tool hooks only); a turn's end ends its tool.
    pub fn declare(
        &self,
        turn: Option<TurnMark>,
        tool: Option<&str>,
        tool_end: bool,
        now_ms: i64,
    ) -> Declared {
        let mut next = Declared {
            at_ms: now_ms,
            ..self.clone()
        };
        match turn {
            Some(TurnMark::Start) => {
                next.turn_since_ms = Some(now_ms);
                next.tool = None;
                next.tool_since_ms = None;
            }
            Some(TurnMark::End) => {
                next.turn_since_ms = None;
                next.tool = None;
                next.tool_since_ms = None;
            }
            None => {}
        }
        if let Some(tool) = tool {
            next.turn_since_ms.get_or_insert(now_ms);
            next.tool = Some(tool.to_owned());
            next.tool_since_ms = Some(now_ms);
        }
        if tool_end {
            next.tool = None;
            next.tool_since_ms = None;
        }
        next
    }
}

/// What the daemon judges a live session to be doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActivityState {
    /// Progress within the threshold: bytes arrive, files are written, processes start,
    /// the agent declares, or its members other than long-lived ones use the CPU.
    Working,
    /// A declared tool is in flight and its tree alive: never a stall before
    /// `--tool-stall-after`.
    Tool,
    /// No turn in flight: the agent waits for its user. Never a stall.
    Idle,
    /// A turn in flight, no progress, for less than the stall threshold.
    Quiet,
    /// A turn in flight and no progress for the stall threshold.
    Stalled,
    /// The tree burns most of a core with no I/O, no bytes, no new process.
    Spinning,
}

impl ActivityState {
    /// Whether the state is an episode that `session.stalled` reports.
    pub fn is_stall(self) -> bool {
        matches!(self, ActivityState::Stalled | ActivityState::Spinning)
    }
}

/// Why a session is stalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StallReason {
    /// Sockets open, nothing arriving.
    Network,
    /// Bytes wait in a socket's receive queue that does not drain: the agent stopped reading.
    NotReading,
    /// Threads in uninterruptible sleep (D state).
    Blocked,
    /// A declared tool ran past `--tool-stall-after`.
    Tool,
    /// Nothing at all happens.
    NoActivity,
    /// The tree burns the CPU with no I/O (the reason of `spinning`).
    Cpu,
}

/// A session's activity: its state, why, since when, and what it was judged from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Activity {
    pub state: ActivityState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<StallReason>,
    /// When the state began; for `quiet`, `stalled` and `spinning`, the last progress.
    pub since_ms: i64,
    pub evidence: Evidence,
}

/// What the kernel showed of a session's tree at the last sample.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// Live processes of the tree.
    pub processes: u32,
    /// CPU of the tree over the last interval, in thousandths of one core.
    pub cpu_permille: u32,
    /// How long the tree's threads waited, runnable, for a CPU over the last interval, in
    /// thousandths of one core: what a crowded machine kept from it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu_wait_permille: u32,
    /// Of that, the part of its long-lived members (started before the turn, such as MCP
    /// servers), which is not progress.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub long_lived_cpu_permille: u32,
    /// Threads by state: running, sleeping, in uninterruptible sleep, stopped.
    pub threads: ThreadStates,
    /// Where the blocked threads wait (`wchan`), when the kernel says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked_in: Vec<String>,
    /// Bytes written to files and pipes over the last interval.
    pub written_bytes: u64,
    /// The tree's TCP sockets, the quietest first, at most [`MAX_SOCKETS_LISTED`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sockets: Vec<SocketEvidence>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Threads of a tree by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadStates {
    pub running: u32,
    pub sleeping: u32,
    pub blocked: u32,
    pub stopped: u32,
}

/// One TCP socket a member holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketEvidence {
    pub pid: u32,
    pub peer: String,
    /// Bytes received over its life, where the kernel counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_received: Option<u64>,
    /// Milliseconds since data last arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_ms: Option<u64>,
    /// Bytes received and not yet read by the process.
    pub unread: u64,
}

/// What a stall's `run` command is told: the JSON on its stdin, and the source of its
/// `LIVENESS_*` variables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StallFacts {
    pub session: String,
    /// The session's creator: the user the command runs as.
    pub uid: u32,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    pub owner: crate::identity::Identity,
    /// The judgement that started the episode (`session.stalled`'s `activity`).
    pub activity: Activity,
}

/// The shortest threshold a session may be judged by: below a few sampling intervals, a
/// stall cannot be told from a pause.
pub const MIN_THRESHOLD_MS: u64 = 1_000;
/// The longest: thirty days.
pub const MAX_THRESHOLD_MS: u64 = 30 * 24 * 3_600_000;

/// What a stall episode's start does besides its `session.stalled` event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StallAction {
    /// The event only.
    #[default]
    Notify,
    /// Runs the policy's `run` command as the session's creator, the judgement on stdin.
    Run,
    /// Sends the policy's `signal` to the owner.
    Signal,
    /// Ends the session's tree: SIGTERM, then SIGKILL after the session's grace.
    Terminate,
}

/// How a session's stalls are judged and what they do; registered with the session. An
/// absent threshold or action is the daemon's (`livenessd --stall-after`, `--on-stall` ...).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StallPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_after_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spin_after_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_stall_after_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<StallAction>,
    /// `signal`: the signal's number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// `run`: the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<ActionSpec>,
}

impl StallPolicy {
    /// Whether the policy holds together: thresholds in range, and `signal` and `run` given
    /// with their action only.
    pub fn validate(&self) -> Result<(), String> {
        for (name, value) in [
            ("stall_after_ms", self.stall_after_ms),
            ("spin_after_ms", self.spin_after_ms),
            ("tool_stall_after_ms", self.tool_stall_after_ms),
        ] {
            if let Some(ms) = value.filter(|ms| !(MIN_THRESHOLD_MS..=MAX_THRESHOLD_MS).contains(ms))
            {
                return Err(format!(
                    "on_stall.{name} {ms} is out of range: from {MIN_THRESHOLD_MS} ms to 30 days"
                ));
            }
        }
        let action = self.action.unwrap_or_default();
        match (action, self.signal, &self.run) {
            (StallAction::Signal, Some(signal), None) if (1..=31).contains(&signal) => Ok(()),
            (StallAction::Signal, Some(signal), None) => Err(format!(
                "on_stall.signal {signal} is not a signal number (1 to 31)"
            )),
            (StallAction::Signal, None, _) => Err("on_stall action `signal` needs `signal`".into()),
            (StallAction::Run, None, Some(spec)) => {
                spec.validate().map_err(|e| format!("on_stall.run: {e}"))
            }
            (StallAction::Run, _, None) => Err("on_stall action `run` needs `run`".into()),
            (StallAction::Notify | StallAction::Terminate, None, None) => Ok(()),
            (action, _, _) => Err(format!(
                "on_stall action `{}` takes neither `signal` nor `run` but its own",
                crate::wire::wire_name(action)
            )),
        }
    }

    /// The action of `--on-stall`: `notify`, `terminate`, `signal:SIG` (a name such as
    /// `TERM` or `SIGINT`, or a number) or `run:CMD` (through `sh -c`, in `cwd`).
    pub fn parse_action(text: &str, cwd: Option<String>) -> Result<StallPolicy, String> {
        let action = |action| StallPolicy {
            action: Some(action),
            ..StallPolicy::default()
        };
        let policy = match text.split_once(':') {
            None if text == "notify" => action(StallAction::Notify),
            None if text == "terminate" => action(StallAction::Terminate),
            Some(("signal", name)) => StallPolicy {
                signal: Some(signal_number(name)?),
                ..action(StallAction::Signal)
            },
            Some(("run", command)) if command.trim().is_empty() => {
                return Err("run:CMD needs a command".into());
            }
            Some(("run", command)) => StallPolicy {
                run: Some(ActionSpec {
                    cwd,
                    ..ActionSpec::new(["/bin/sh", "-c", command])
                }),
                ..action(StallAction::Run)
            },
            _ => {
                return Err(format!(
                    "{text:?} is not a stall action: notify, terminate, signal:SIG or run:CMD"
                ));
            }
        };
        policy.validate()?;
        Ok(policy)
    }
}

/// The number of a signal named as `kill -s` takes it (`TERM`, `SIGTERM`, `15`).
fn signal_number(name: &str) -> Result<i32, String> {
    const NAMES: [(&str, i32); 12] = [
        ("HUP", 1),
        ("INT", 2),
        ("QUIT", 3),
        ("ABRT", 6),
        ("KILL", 9),
        ("USR1", 10),
        ("USR2", 12),
        ("ALRM", 14),
        ("TERM", 15),
        ("CONT", 18),
        ("STOP", 19),
        ("WINCH", 28),
    ];
    if let Ok(number) = name.parse::<i32>() {
        return Ok(number);
    }
    let bare = name.strip_prefix("SIG").unwrap_or(name);
    NAMES
        .iter()
        .find(|(known, _)| known.eq_ignore_ascii_case(bare))
        .map(|(_, number)| *number)
        .ok_or_else(|| format!("{name:?} is not a signal: a name such as TERM or INT, or a number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_implies_a_turn_and_a_turn_end_ends_its_tool() {
        let none = Declared::default();
        let tool = none.declare(None, Some("Bash"), false, 10);
        assert_eq!(
            (tool.turn_since_ms, tool.tool.as_deref(), tool.tool_since_ms),
            (Some(10), Some("Bash"), Some(10))
        );
        let done = tool.declare(None, None, true, 20);
        assert_eq!((done.turn_since_ms, done.tool), (Some(10), None));
        let ended = tool.declare(Some(TurnMark::End), None, false, 30);
        assert_eq!(
            (ended.turn_since_ms, ended.tool.as_deref(), ended.at_ms),
            (None, None, 30)
        );
        let again = ended.declare(Some(TurnMark::Start), None, false, 40);
        assert_eq!(again.turn_since_ms, Some(40));
    }

    #[test]
    fn stall_actions_parse_and_bad_ones_are_refused() {
        let signal = StallPolicy::parse_action("signal:SIGINT", None).unwrap();
        assert_eq!(
            (signal.action, signal.signal),
            (Some(StallAction::Signal), Some(2))
        );
        assert_eq!(
            StallPolicy::parse_action("signal:term", None)
                .unwrap()
                .signal,
            Some(15)
        );
        let run = StallPolicy::parse_action("run:echo a:b", Some("/tmp".into())).unwrap();
        let spec = run.run.unwrap();
        assert_eq!(
            (spec.argv[2].as_str(), spec.cwd.as_deref()),
            ("echo a:b", Some("/tmp"))
        );
        assert_eq!(
            StallPolicy::parse_action("terminate", None).unwrap().action,
            Some(StallAction::Terminate)
        );
        for bad in [
            "kill",
            "signal:",
            "signal:NOPE",
            "signal:0",
            "signal:34",
            "run:",
            "notify:x",
        ] {
            assert!(StallPolicy::parse_action(bad, None).is_err(), "{bad}");
        }
        let mismatched = StallPolicy {
            action: Some(StallAction::Terminate),
            signal: Some(9),
            ..StallPolicy::default()
        };
        assert!(mismatched.validate().is_err());
        let short = StallPolicy {
            stall_after_ms: Some(10),
            ..StallPolicy::default()
        };
        assert!(short.validate().unwrap_err().contains("stall_after_ms"));
    }
}
