//! The requests of the protocol, one type each: [`crate::protocol::Request`] names them
//! by `op`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::action::ActionSpec;
use crate::activity::{StallPolicy, TurnMark};
use crate::identity::Identity;
use crate::session::{OnEnd, OnOom, Phase, Until};

/// Who owns a session being registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OwnerSpec {
    /// `"auto"`: walk up from the caller's PID (from `SO_PEERCRED`) past shells and wrappers.
    Auto(AutoOwner),
    /// A full identity captured earlier, possibly on another host. Tried before `Pid`,
    /// which would otherwise match any object with a `pid`.
    Identity(Identity),
    /// `{"pidfd": I}`: the process behind the `I`-th descriptor passed with this request
    /// line (`SCM_RIGHTS`); the daemon reads its identity from the pidfd itself.
    Pidfd(PidfdOwner),
    /// `{"pid": N}`: this process, whose identity the daemon captures. `N` is read in the
    /// caller's PID namespace.
    Pid(PidOwner),
}

/// `{"pidfd": I}` and nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PidfdOwner {
    pub pidfd: usize,
}

/// `{"pid": N}` and nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PidOwner {
    pub pid: u32,
}

/// The literal string `"auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoOwner {
    Auto,
}

/// Create a session, or give an ACTIVE one a new owner (a new turn).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Register {
    /// Required unless `pending`; a pending registration without one gets a generated id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Root only: register in this user's id namespace (default: the caller's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    pub owner: OwnerSpec,
    /// The real session id is not known yet: `rename` it later, or it expires.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The cleanup policy (default `leave`); set when the session is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_end: Option<OnEnd>,
    /// Milliseconds between SIGTERM and SIGKILL when the session's processes are
    /// terminated (default [`crate::session::DEFAULT_GRACE_MS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_ms: Option<u64>,
    /// When the session ends by itself (default `owner`); set when the session is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Until>,
    /// `owner: "auto"`: further process names to skip as wrappers, for this request
    /// only (added to the daemon's `--wrapper` list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wrappers: Vec<String>,
    /// End actions to run when the session ends, whatever ends it. On a registration of
    /// an ACTIVE session the list replaces the one it had; absent, it is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_end_run: Option<Vec<ActionSpec>>,
    /// How the session's stalls are judged and what they do (absent parts: the daemon's).
    /// On a registration of an ACTIVE session it replaces the one it had; absent, it is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Boxed: most registrations have none, and requests are moved whole.
    pub on_stall: Option<Box<StallPolicy>>,
    /// Give the new session a cgroup of its own with these limits (docs/cgroups.md); a
    /// host without usable cgroup2 registers it without one, with a warning. Set when the
    /// session is created. Boxed: most registrations have none, and a request is no
    /// bigger for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<Box<CgroupLimits>>,
    /// No cgroup for the new session, where the daemon gives every session one by
    /// default (`livenessd --session-cgroup`); refused with `cgroup`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_cgroup: bool,
}

/// A session cgroup's limits (absent: none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CgroupLimits {
    /// `memory.max`, in bytes: the session's processes are OOM-killed inside it beyond.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max: Option<u64>,
    /// `pids.max`: forks beyond fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_max: Option<u64>,
    /// `memory.high`, in bytes: beyond it the session's processes are throttled and
    /// reclaimed hard, never OOM-killed for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_high: Option<u64>,
    /// `cpu.weight`, 1 to 10000 (100 is every cgroup's default): the session's share of
    /// contended CPU time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_weight: Option<u64>,
    /// What an OOM kill inside the session does (default: continue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_oom: Option<OnOom>,
}

impl CgroupLimits {
    /// Each limit set, as [`CgroupLimits::parse`] and the command lines name it, with its
    /// value (sizes in bytes).
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let numbers = [
            ("memory-max", self.memory_max),
            ("memory-high", self.memory_high),
            ("tasks-max", self.tasks_max),
            ("cpu-weight", self.cpu_weight),
        ];
        numbers
            .into_iter()
            .filter_map(|(key, value)| Some((key, value?.to_string())))
            .chain(
                self.on_oom
                    .map(|policy| ("on-oom", crate::wire::wire_name(policy))),
            )
            .collect()
    }

    /// Limits as a command line gives them: empty (a cgroup without limits), or
    /// `memory-max=SIZE,memory-high=SIZE,tasks-max=N,cpu-weight=N,on-oom=continue|end`,
    /// any of them, in any order (`livenessd --session-cgroup`).
    pub fn parse(text: &str) -> Result<CgroupLimits, String> {
        let mut limits = CgroupLimits::default();
        for part in text.split(',').filter(|part| !part.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not KEY=VALUE"))?;
            let count = |range: std::ops::RangeInclusive<u64>| {
                value
                    .parse::<u64>()
                    .ok()
                    .filter(|n| range.contains(n))
                    .ok_or_else(|| {
                        format!(
                            "{key}: {value:?} is not a number from {} to {}",
                            range.start(),
                            range.end()
                        )
                    })
            };
            match key {
                "memory-max" => limits.memory_max = Some(parse_bytes(value)?),
                "memory-high" => limits.memory_high = Some(parse_bytes(value)?),
                "tasks-max" => limits.tasks_max = Some(count(1..=u64::MAX)?),
                "cpu-weight" => limits.cpu_weight = Some(count(1..=10_000)?),
                "on-oom" => {
                    limits.on_oom = Some(match value {
                        "continue" => OnOom::Continue,
                        "end" => OnOom::End,
                        _ => return Err(format!("on-oom: {value:?} is not continue or end")),
                    })
                }
                _ => {
                    return Err(format!(
                        "{key:?} is not one of memory-max, memory-high, tasks-max, cpu-weight, on-oom"
                    ));
                }
            }
        }
        Ok(limits)
    }
}

/// A size in bytes, with an optional binary suffix K, M, G or T (`32M` is 32 MiB).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let digits = text.trim_end_matches(['K', 'M', 'G', 'T', 'k', 'm', 'g', 't']);
    let shift = match &text[digits.len()..] {
        "" => 0,
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        "T" | "t" => 40,
        _ => {
            return Err(format!(
                "{text:?} is not a size (a number, then K, M, G or T)"
            ));
        }
    };
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (a number, then K, M, G or T)"))?;
    number
        .checked_mul(1 << shift)
        .filter(|bytes| *bytes > 0)
        .ok_or_else(|| format!("{text:?} is not a size between 1 byte and 16 EiB"))
}

/// The session's end commands were run by its client (an agent's own end hook): each end
/// action without an outcome gets one, `skipped: done_by_agent`, and is never run. One
/// already running finishes. Allowed on an active or an ended session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionsDone {
    pub session: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
}

/// Give a pending session its real id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rename {
    pub session: String,
    pub to: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
}

/// Record activity: postpones the inactivity timeout of owners that cannot be watched,
/// and declares the agent's phase (from its hooks): a turn's start or end, a tool's start
/// or end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Touch {
    pub session: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<TurnMark>,
    /// A tool starts: its name (at most [`crate::activity::MAX_TOOL_NAME`] bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The tool in flight ended.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tool_end: bool,
}

/// End a session explicitly (reason `stopped`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct End {
    pub session: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Terminate the session's surviving processes, whatever its policy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub terminate: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Get {
    pub session: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
}

/// One page of sessions, oldest first; `next` in the reply continues it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct List {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Sessions per page: at most [`crate::protocol::MAX_LIST_PAGE`], [`crate::protocol::DEFAULT_LIST_PAGE`] if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// The `next` cursor of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// Which ACTIVE session owns this process (it or its nearest registered ancestor)?
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Whose {
    pub pid: u32,
}

/// The live processes of a session's tree: its owner and every descendant since
/// registration, orphans included.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Processes {
    pub session: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Processes per page: at most [`crate::protocol::MAX_LIST_PAGE`], [`crate::protocol::DEFAULT_LIST_PAGE`] if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// The `next` cursor of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// Replay events after `since`, then stream live ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subscribe {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// The store `since` was read from: another store means the cursor is void (`reset`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Root only, with `session`: only that user's session of this id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
}

/// A struct variant (not a unit) so that unknown fields are rejected here too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Status {}

/// Take lock `name` (in the namespace of `session`'s user) for `session`, active or
/// pending. Held by another session: `lock_held` at once, or with `wait`, queue in
/// order and get it when it is released or its holder ends, or `lock_held` after
/// `timeout_ms`. The connection stays open while waiting; closing it leaves the queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockAcquire {
    pub name: String,
    pub session: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wait: bool,
    /// With `wait`: give up after this long. Without: wait as long as it takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// A fleet lock, held in etcd for the whole fleet (`livenessd --etcd`), not this host's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cluster: bool,
}

/// Release lock `name`, held by `session`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockRelease {
    pub name: String,
    pub session: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// A fleet lock (see [`LockAcquire::cluster`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cluster: bool,
}

/// The held locks the caller may see (root: every user's, or user `uid`'s), one page
/// at a time, by uid and name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockList {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Locks per page: at most [`crate::protocol::MAX_LIST_PAGE`], [`crate::protocol::DEFAULT_LIST_PAGE`] if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// The `next` cursor of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// The fleet's hosts and their ACTIVE sessions, read from etcd by a daemon with `--etcd`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fleet {
    /// Only sessions with every one of these labels, and the hosts that have any.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// Follows the fleet's changes: without `since`, the reply carries the view and the
/// changes after it follow; with `since` (a revision of an earlier view or change), the
/// changes after it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetWatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<i64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_the_rest() {
        assert_eq!(parse_bytes("32M"), Ok(32 << 20));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("2g"), Ok(2 << 30));
        for bad in [
            "",
            "M",
            "0",
            "0K",
            "-1M",
            "1.5G",
            "12MB",
            "1 G",
            "99999999T",
            "\u{1b}[31m",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn limits_parse_from_a_list_and_refuse_the_rest() {
        assert_eq!(CgroupLimits::parse(""), Ok(CgroupLimits::default()));
        assert_eq!(
            CgroupLimits::parse(
                "memory-max=4G,tasks-max=512,cpu-weight=50,memory-high=3G,on-oom=end"
            ),
            Ok(CgroupLimits {
                memory_max: Some(4 << 30),
                memory_high: Some(3 << 30),
                tasks_max: Some(512),
                cpu_weight: Some(50),
                on_oom: Some(OnOom::End),
            })
        );
        for bad in [
            "memory-max",
            "memory-max=1G; rm -rf /",
            "tasks-max=0",
            "cpu-weight=10001",
            "on-oom=sometimes",
            "memory_max=1G",
            "swap-max=1G",
        ] {
            assert!(CgroupLimits::parse(bad).is_err(), "{bad:?}");
        }
    }
}
