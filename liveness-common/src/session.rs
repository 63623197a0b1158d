//! Sessions and the events of the stream, as the daemon stores and sends them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::action::{ActionOutcome, ActionRun, ActionSpec, EndFacts};
use crate::activity::{Activity, Declared, StallPolicy};
use crate::cause::{Bytes, Cause, Millis, Usage};
pub use crate::end::{EndReason, MAX_SURVIVORS_LISTED, Survivors};
use crate::exit::{DetectedBy, ExitStatus};
use crate::identity::{Identity, ProcessKey};
use crate::lock::LockChange;

/// Lifecycle phase of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Active,
    Ended,
}

/// A session as stored. JSON field names are public protocol.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub id: String,
    pub owner: Identity,
    pub phase: Phase,
    /// Registered under a placeholder id until the real one is known (renamed with the `rename` request).
    pub pending: bool,
    pub reason: Option<EndReason>,
    pub exit: Option<ExitStatus>,
    /// Why the session ended, from its owner's side; set on every ended session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    /// What the owner (and its tree's members that exited) cost, where the kernel showed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    pub detected_by: Option<DetectedBy>,
    pub creator_uid: u32,
    pub labels: BTreeMap<String, String>,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// Last activity, for the inactivity timeout.
    pub touched_ms: i64,
    pub ended_ms: Option<i64>,
    pub pending_expires_ms: Option<i64>,
    /// Members of the session's process tree still alive when it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub survivors: Option<Survivors>,
    /// What happens to the session's surviving processes when it ends.
    #[serde(default)]
    pub on_end: OnEnd,
    /// When the session ends by itself (`owner` unless registered otherwise).
    #[serde(default, skip_serializing_if = "Until::is_owner")]
    pub until: Until,
    /// How long surviving processes have between SIGTERM and SIGKILL when they are
    /// terminated, in milliseconds.
    #[serde(default = "default_grace_ms")]
    pub grace_ms: u64,
    /// The end actions its creator registered, run when it ends (`on_end_run`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on_end_run: Vec<ActionSpec>,
    /// How its stalls are judged and what they do, as registered (the daemon's defaults
    /// stand for what is absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_stall: Option<StallPolicy>,
    /// The cgroup of its own it was given at registration (docs/cgroups.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<SessionCgroup>,
    /// `get` only: where each end action stands, in the order of `on_end_run`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<ActionState>,
    /// When the last of its end actions had its outcome (`session.finalized`); absent for
    /// a session without end actions, whose end is final.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalized_ms: Option<i64>,
    /// What terminating its surviving processes did, once recorded (the `reaped` of its
    /// `session.reaped`); absent while none was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reaped: Option<Reaped>,
    /// What its agent last declared through `touch` (a turn, a tool); absent if nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<Declared>,
    /// What it is doing, as judged from its tree: in `get` and `list` the last sample's
    /// judgement; as stored, the stall episode under way (`session.stalled` not yet
    /// followed by `session.unstalled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<Activity>,
}

impl Session {
    /// Ended, with every end action's outcome recorded (at once for one without actions).
    pub fn is_finalized(&self) -> bool {
        self.phase == Phase::Ended && (self.on_end_run.is_empty() || self.finalized_ms.is_some())
    }

    /// What one run of one of its end actions is told; `None` while it is still active.
    pub fn end_facts(&self, action: ActionRun) -> Option<EndFacts> {
        Some(EndFacts {
            session: self.id.clone(),
            uid: self.creator_uid,
            labels: self.labels.clone(),
            owner: self.owner.clone(),
            reason: self.reason?,
            exit: self.exit,
            detected_by: self.detected_by,
            ended_ms: self.ended_ms?,
            cause: self.cause.clone(),
            usage: self.usage.clone(),
            survivors: self.survivors.clone(),
            action,
        })
    }
}

/// Where one end action of a session stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionState {
    pub index: u32,
    pub state: ActionPhase,
    /// What it did, once `done`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<ActionOutcome>,
}

/// The life of an end action: `pending` until its session ends and it starts, `running`,
/// then `done` once its outcome is recorded (also when it was skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionPhase {
    Pending,
    Running,
    Done,
}

/// The grace between SIGTERM and SIGKILL when a registration names none.
pub const DEFAULT_GRACE_MS: u64 = 10_000;
/// The longest grace a registration may ask for: a terminated session's processes are
/// gone within this bound.
pub const MAX_GRACE_MS: u64 = 3_600_000;

fn default_grace_ms() -> u64 {
    DEFAULT_GRACE_MS
}

/// The cleanup policy of a session: what happens to its surviving processes at its end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnEnd {
    /// They keep running; the ended event lists them.
    #[default]
    Leave,
    /// They get SIGTERM, then SIGKILL after the grace period (`session.reaped` reports it).
    Terminate,
}

impl OnEnd {
    pub fn is_leave(&self) -> bool {
        *self == OnEnd::Leave
    }
}

/// What an OOM kill inside a session's cgroup does (docs/cgroups.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnOom {
    /// The kernel kills the process it chose, and the session goes on; the cgroup's
    /// `memory.events` counts the kill.
    #[default]
    Continue,
    /// The session is one workload (`memory.oom.group`): an OOM kill takes every process
    /// of its cgroup, owner included, at once, and so ends the session.
    End,
}

/// When a session ends by itself: at its owner's death, or at the last death of its tree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Until {
    /// When its owner exits.
    #[default]
    Owner,
    /// When the last process of its tree (the owner and every process it started since
    /// registration) exits: a launcher that execs, forks and exits stays alive in its tree.
    Tree,
}

impl Until {
    pub fn is_owner(&self) -> bool {
        *self == Until::Owner
    }
}

/// What terminating a session's surviving processes did (`session.reaped`), by pid.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reaped {
    /// Exited after SIGTERM, within the grace period.
    pub terminated: Vec<u32>,
    /// Still running when the grace period ended: SIGKILLed, and gone.
    pub killed: Vec<u32>,
    /// Had already exited before they were signalled (their pid may now be another
    /// process's, which was left alone).
    pub exited: Vec<u32>,
    /// Not signalled, or still alive after SIGKILL, and why.
    pub failed: Vec<ReapFailure>,
    /// The reap was cut short by a stop or a crash of the daemon and run again by its next
    /// start: SIGTERM again, then a whole grace. What the first run ended is in `exited`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resumed: bool,
}

/// A process the reaper could not, or would not, end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReapFailure {
    pub pid: u32,
    pub reason: String,
}

/// Kind of an event; serialized as `session.<kind>` or `lock.<kind>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    #[serde(rename = "session.registered")]
    Registered,
    #[serde(rename = "session.owner_changed")]
    OwnerChanged,
    #[serde(rename = "session.renamed")]
    Renamed,
    #[serde(rename = "session.ended")]
    Ended,
    /// The surviving processes of an ended session were terminated by its policy or on
    /// request.
    #[serde(rename = "session.reaped")]
    Reaped,
    /// One end action of the ended session has its outcome (field `action`).
    #[serde(rename = "session.action")]
    Action,
    /// Every end action of the ended session has its outcome.
    #[serde(rename = "session.finalized")]
    Finalized,
    /// The live session made no progress for its threshold, or spins (field `activity`).
    #[serde(rename = "session.stalled")]
    Stalled,
    /// The stalled session made progress again (field `activity`).
    #[serde(rename = "session.unstalled")]
    Unstalled,
    /// A process of the live session left its cgroup (field `escape`); it is still the
    /// session's by its lineage.
    #[serde(rename = "session.escaped")]
    Escaped,
    /// The event's session was granted a lock.
    #[serde(rename = "lock.acquired")]
    LockAcquired,
    /// The event's session no longer holds a lock.
    #[serde(rename = "lock.released")]
    LockReleased,
}

/// One entry of the event stream, exactly as subscribers receive it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    pub kind: EventKind,
    pub at_ms: i64,
    pub session: String,
    pub owner: Identity,
    /// `session.owner_changed`: the owner that was replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_owner: Option<Identity>,
    /// `session.renamed`: the old (pending) id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_session: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<EndReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitStatus>,
    /// `session.ended`: why, from the owner's side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    /// `session.ended`: what the owner and its tree's exited members cost (eBPF only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detected_by: Option<DetectedBy>,
    /// When a source learned of the death (`at_ms` is when it was committed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_ms: Option<i64>,
    /// When the owner died, by the kernel's clock: only where the source reads it (eBPF).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub died_ms: Option<i64>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The uid that registered the session: non-root subscribers see only their own.
    pub creator_uid: u32,
    /// `session.ended`: the members of the session's process tree still alive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub survivors: Option<Survivors>,
    /// The session's cleanup policy, when it is not `leave`.
    #[serde(default, skip_serializing_if = "OnEnd::is_leave")]
    pub on_end: OnEnd,
    /// `session.reaped`: what terminating the surviving processes did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reaped: Option<Reaped>,
    /// How many end actions the session has: when it is not 0, a `session.finalized`
    /// follows the `session.ended` once each has its outcome.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub actions: u32,
    /// `session.action`: what one end action did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<ActionOutcome>,
    /// `session.stalled` and `session.unstalled`: the judgement and its evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<Activity>,
    /// `lock.acquired` and `lock.released`: which lock, its token, why it was released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<LockChange>,
    /// `session.escaped`: the process that left the session's cgroup, and where to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escape: Option<CgroupEscape>,
    /// `session.ended`, only from a daemon started with `--trace-hops`: where the time
    /// between the death and the event went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hops: Option<Hops>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// `CLOCK_MONOTONIC` nanoseconds at each hop of one death through the daemon. Clients
/// read the last hop (serialization, the socket, their own wake-up) against their own
/// clock reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hops {
    /// The kernel ran the exit (eBPF records only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub died_ns: Option<u64>,
    /// The engine took the death from its source.
    pub read_ns: u64,
    /// The session's end was committed to the database.
    pub committed_ns: u64,
    /// The event was handed to the subscribers' queues.
    pub published_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_come_from_an_ended_session_only() {
        let mut session = Session {
            id: "s".into(),
            owner: Identity {
                pid: 7,
                start_ticks: 1,
                boot_id: "b".into(),
                host: "h".into(),
                pidfs_ino: None,
                comm: "c".into(),
            },
            phase: Phase::Active,
            pending: false,
            reason: None,
            exit: None,
            cause: None,
            usage: None,
            detected_by: None,
            creator_uid: 1000,
            labels: BTreeMap::from([("k".into(), "v".into())]),
            created_ms: 1,
            updated_ms: 1,
            touched_ms: 1,
            ended_ms: None,
            pending_expires_ms: None,
            survivors: None,
            on_end: OnEnd::Leave,
            grace_ms: 1,
            until: Until::Owner,
            on_end_run: Vec::new(),
            on_stall: None,
            cgroup: None,
            actions: Vec::new(),
            finalized_ms: None,
            reaped: None,
            declared: None,
            activity: None,
        };
        let run = ActionRun {
            index: 2,
            resumed: true,
        };
        assert_eq!(session.end_facts(run), None);
        session.phase = Phase::Ended;
        session.reason = Some(EndReason::OwnerExited);
        session.exit = Some(ExitStatus::Exited { code: 3 });
        session.ended_ms = Some(5);
        let facts = session.end_facts(run).unwrap();
        assert_eq!((facts.uid, facts.ended_ms, facts.action), (1000, 5, run));
        let json = serde_json::to_value(&facts).unwrap();
        assert_eq!(json["reason"], "owner_exited");
        assert_eq!(json["exit"]["code"], 3);
        assert_eq!(
            json["action"],
            serde_json::json!({"index": 2, "resumed": true})
        );
        assert!(
            json.get("cause").is_none(),
            "absent facts are left out: {json}"
        );
        // A first run says so, as docs/end-actions.md lists the field.
        let first = session.end_facts(ActionRun::default()).unwrap();
        assert_eq!(
            serde_json::to_value(&first).unwrap()["action"],
            serde_json::json!({"index": 0, "resumed": false})
        );
        assert!(
            include_str!("../../docs/end-actions.md").contains("`action: {index, resumed}`"),
            "docs/end-actions.md lists the action's fields"
        );
    }
}

/// A session's cgroup: where it is, and the limits written there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionCgroup {
    /// Its directory in the cgroup2 hierarchy, as the daemon sees it.
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_max: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_high: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_weight: Option<u64>,
    /// Absent: `continue`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_oom: Option<OnOom>,
    /// What the cgroup counted over the session's life, read once its last member was
    /// gone and before it was removed; absent until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<CgroupUsage>,
    /// Its processes found outside its cgroup (moved out by root, or by a user's own
    /// systemd), each once: as they moved (with eBPF, each with its `session.escaped`),
    /// and the survivors of its end found outside then. Still the session's by their
    /// lineage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escaped: Vec<CgroupEscape>,
    /// The processes its cgroup (or a cgroup below) held when its end reached the cgroup
    /// that are neither its owner nor a survivor its end lists: written into the cgroup,
    /// or missed by the tree's records. The cgroup's truth beside the tree's; absent when
    /// there were none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unlisted: Option<Unlisted>,
}

/// At most this many of a session cgroup's [`Unlisted`] processes are named: each is read
/// before the cgroup's kill at the end may take it, so the kill waits for them.
pub const MAX_UNLISTED_NAMED: usize = 64;

/// The processes a session's cgroup held at its end that are neither its owner nor a
/// survivor its end lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unlisted {
    /// Every one, named or not.
    pub total: u32,
    /// At most [`MAX_UNLISTED_NAMED`] of them, by pid.
    pub processes: Vec<ProcessKey>,
}

/// A member of a session's tree found outside the session's cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupEscape {
    pub pid: u32,
    /// The process's start time (`/proc/<pid>/stat` field 22); 0 in a record written
    /// before it was kept.
    #[serde(default)]
    pub start_ticks: u64,
    /// Where it was, as its `/proc/<pid>/cgroup` names it (`/elsewhere`).
    pub cgroup: String,
}

/// A session cgroup's counters, as the kernel keeps them. A counter the kernel lacks is
/// null (`memory.peak` is 5.19+, `pids.peak` 6.1+; `io.stat` needs the io controller).
/// Memory charged before a process was moved in stays with its old cgroup (cgroup v2).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupUsage {
    /// `memory.peak`, bytes.
    pub memory_peak: Option<u64>,
    /// `memory.events`.
    pub memory_events: Option<MemoryEvents>,
    /// `cpu.stat` `usage_usec`.
    pub cpu_usec: Option<u64>,
    /// `pids.peak`.
    pub pids_peak: Option<u64>,
    /// `io.stat`, summed over its devices.
    pub io: Option<IoUsage>,
}

impl std::fmt::Display for CgroupUsage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.memory_peak {
            Some(peak) => write!(f, "peak memory {}", Bytes(peak))?,
            None => write!(f, "peak memory not kept by this kernel")?,
        }
        if let Some(events) = self.memory_events.filter(|e| e.oom_kill > 0) {
            write!(f, ", {} OOM kill(s)", events.oom_kill)?;
        }
        if let Some(cpu) = self.cpu_usec {
            write!(f, ", CPU {}", Millis(cpu))?;
        }
        if let Some(pids) = self.pids_peak {
            write!(f, ", at most {pids} task(s)")?;
        }
        if let Some(io) = self.io {
            write!(
                f,
                ", read {}, written {}",
                Bytes(io.rbytes),
                Bytes(io.wbytes)
            )?;
        }
        Ok(())
    }
}

/// A session cgroup's `memory.events`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryEvents {
    /// Times `memory.high` was exceeded (reclaim throttled the cgroup).
    pub high: u64,
    /// Times `memory.max` was about to be exceeded.
    pub max: u64,
    /// Times the cgroup ran out of memory.
    pub oom: u64,
    /// Processes of the cgroup the OOM killer killed.
    pub oom_kill: u64,
}

/// A session cgroup's `io.stat`, summed over its devices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoUsage {
    pub rbytes: u64,
    pub wbytes: u64,
    pub rios: u64,
    pub wios: u64,
}
