//! What a live session is doing: the phase its agent declares (`touch` from its hooks) and
//! what the daemon judges from its process tree (`working`, `stalled`, `spinning`, ...).

use serde::{Deserialize, Serialize};

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
}
