//! What the daemon says about itself in reply to `status`: typed, so that clients read
//! fields, not string indexes into a JSON blob.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::activity::ActivityState;
use crate::exit::DetectedBy;

/// The reply to `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub daemon: DaemonInfo,
    pub uptime_ms: u64,
    /// The last committed event seq.
    pub head_seq: u64,
    /// The database's identity: a different one means a new database (see `reset`).
    pub store_id: String,
    pub active_sessions: u64,
    /// Ended sessions still kept (retention deletes them with their events).
    #[serde(default)]
    pub ended_sessions: u64,
    pub subscribers: u64,
    /// Deaths observed whose commit failed and is retried.
    pub uncommitted_deaths: u64,
    /// Whether the database has everything published.
    #[serde(default)]
    pub store: StoreStatus,
    /// End actions under way.
    #[serde(default)]
    pub actions: ActionsStatus,
    pub monitor: MonitorStatus,
    pub counters: Counters,
    pub limits: LimitsStatus,
    /// How sessions' process trees are followed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub membership: Option<MembershipStatus>,
    /// Live sessions by activity state, as last judged (none before the first sample).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub activity: BTreeMap<ActivityState, u32>,
    /// The mirror of this host's sessions in etcd, with `--etcd` (docs/fleet.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterStatus>,
    /// Whether sessions can have cgroups of their own here (docs/cgroups.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<CgroupStatus>,
}

/// What cgroup support the host offers sessions (`register --cgroup`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupStatus {
    /// Sessions that ask for a cgroup get one.
    pub usable: bool,
    /// The cgroup2 mount found in the daemon's mountinfo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount: Option<String>,
    /// The daemon's subtree, under which sessions' cgroups are made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subtree: Option<String>,
    /// Usable: the controllers enabled for sessions; otherwise those the mount offers.
    #[serde(default)]
    pub controllers: Vec<String>,
    /// `cgroup.kill` exists (5.14+): a session's tree is killed at once.
    #[serde(default)]
    pub kill: bool,
    /// `memory.peak` exists (5.19+).
    #[serde(default)]
    pub peak: bool,
    /// How what a terminated session's cgroup still holds is killed at its grace's end;
    /// absent without usable cgroups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination: Option<CgroupTermination>,
    /// Why sessions get no cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who makes the sessions' cgroups: systemd (transient scopes) or the daemon itself;
    /// absent without usable cgroups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager: Option<CgroupManager>,
    /// Why that one: systemd's version, or why systemd is not asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager_reason: Option<String>,
    /// The cgroup every new session gets unless it asks for its own or for none
    /// (`livenessd --session-cgroup`); absent: only those that ask get one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<crate::request::CgroupLimits>,
}

/// Who makes session cgroups (docs/cgroups.md#systemd).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CgroupManager {
    /// systemd is the init and answers on the system bus: each session cgroup is a
    /// transient scope `liveness-….scope` under `liveness.slice`, asked for with
    /// `StartTransientUnit`.
    Systemd,
    /// The daemon writes the cgroup file system itself.
    Cgroupfs,
}

/// How a session cgroup's processes are killed at once (docs/cgroups.md#termination).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CgroupTermination {
    /// `cgroup.kill` (5.14+): one write, fork loops included.
    Kill,
    /// `cgroup.freeze` (5.2+), SIGKILL to each process of `cgroup.procs`, thaw: a frozen
    /// process cannot fork meanwhile.
    Freeze,
    /// Neither: the reaper's signals alone.
    Signals,
    /// systemd's `KillUnit` with SIGKILL on the session's scope: systemd is the one writer
    /// of its tree (and the daemon's unit sees the cgroup file system read-only).
    Unit,
}

/// Where the mirror of this host in etcd stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// Whether the daemon reaches etcd and holds its host lease.
    pub connected: bool,
    /// The etcd endpoints, as given.
    pub endpoints: Vec<String>,
    pub prefix: String,
    pub host_id: String,
    /// Since when the mirror is in its present state (ms since the epoch).
    pub since_ms: i64,
    /// The last event seq whose writes etcd confirmed, once the mirror has reached it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirrored_seq: Option<u64>,
    /// Events committed here and not yet confirmed by etcd (the head when nothing was).
    pub behind: u64,
    /// Why the mirror is disconnected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Whether the database has every ending published. Endings are published once in the
/// journal; while the database cannot be written (a full disk) they wait there, and reads
/// show them from memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreStatus {
    /// The last write of published endings to the database failed for want of space.
    pub disk_full: bool,
    /// Sessions whose ending is published (and in the journal) but not yet in the database.
    pub waiting: u64,
}

/// Where the end actions under way stand.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionsStatus {
    /// Marked running: started, or starting.
    pub running: u64,
    /// Waiting to start: for a slot of their user (`--action-slots`), or for what is left
    /// of a run cut short to be ended.
    pub waiting: u64,
    /// Finished, with an outcome whose commit failed and is retried.
    pub uncommitted_outcomes: u64,
}

/// How the members of sessions' process trees are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MembershipMode {
    /// The eBPF fork program adds every new process of a tree as it is forked.
    Kernel,
    /// The kernel map filled up, or an owner could not be tracked in the kernel: `/proc`
    /// scans find the members the kernel did not add.
    KernelAndScan,
    /// No eBPF: `/proc` is scanned at registration and at an interval.
    Scan,
}

impl MembershipMode {
    /// What the mode can miss, for status and doctor.
    pub fn misses(self) -> &'static str {
        match self {
            MembershipMode::Kernel => {
                "nothing forked while the daemon runs; processes forked and orphaned while it was stopped"
            }
            MembershipMode::KernelAndScan | MembershipMode::Scan => {
                "a process forked and orphaned (its parent exited) between two scans; a process that an owner or member the kernel does not follow forks with CLONE_PARENT (its parent is then outside the tree, so no walk of /proc reaches it)"
            }
        }
    }
}

/// Status of process-tree membership.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipStatus {
    pub mode: MembershipMode,
    /// Trees followed (tracked owners of ACTIVE sessions).
    pub trees: u64,
    /// Members known to the daemon, owners not included.
    pub members: u64,
    /// How often `/proc` is scanned in the scan modes.
    pub scan_interval_ms: u64,
    /// Capacity of the kernel's members map, with eBPF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_capacity: Option<u32>,
    /// Of `kernel_capacity`, the member entries the kernel map holds now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_used: Option<u64>,
    /// New processes the kernel map had no room for.
    pub kernel_full: u64,
    /// Walks of the kernel's members map since start (two system calls per entry): made by
    /// a refresh or an owner's death only when the kernel added members since the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_walks: Option<u64>,
    /// Since when the kernel's lineages are complete (ms since the epoch): a process forked
    /// since and orphaned before its tree was followed is still placed in it. With pinned
    /// lineage programs, the time they were first attached, by this daemon or an earlier one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage_since_ms: Option<i64>,
    /// The bpffs directory where the lineage programs and their map are pinned: they outlive
    /// the daemon, so orphans made while none runs are placed after it starts again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage_pins: Option<String>,
    /// Why the lineage programs are not pinned: they go with the daemon, and orphans made
    /// while none runs are not placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage_unpinned: Option<String>,
    /// The entries of the pin directory (`--ebpf-pin-dir`): each state directory's lineage
    /// pins, this daemon's and others'.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pin_sets: Vec<PinSetStatus>,
    /// The slots of the kernel map the processes of one uid other than root may hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_share_per_uid: Option<u64>,
    /// The uids that hold their whole share of the kernel map, or were refused a slot for
    /// it: the kernel follows what they fork beyond it only through scans.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub over_share: Vec<UidOverShare>,
    /// What this mode can miss.
    pub misses: String,
}

/// The lineage pins of one state directory, in the pin directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinSetStatus {
    /// The bpffs directory.
    pub path: String,
    /// The state directory of the daemon that pinned them, from their owner record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<String>,
    /// Whether that state directory exists: the pins of one that does not are removed by
    /// the next daemon to start with this pin directory.
    #[serde(default)]
    pub state_dir_exists: bool,
    /// Why the owner is not known: the entry is left as it is (remove it by hand once no
    /// daemon uses it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_owner: Option<String>,
}

/// A uid over its share of the kernel's members map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UidOverShare {
    /// The uid last refused (uids equal modulo 4096 share one budget).
    pub uid: u32,
    /// Member slots its processes hold now.
    pub used: u64,
    /// Its processes refused a slot for the share since the daemon started.
    pub refused: u64,
}

/// Who answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonInfo {
    pub version: String,
    pub protocol: u32,
    pub pid: u32,
    pub socket: String,
    pub state_dir: String,
}

/// A source the user can ask for by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceName {
    Ebpf,
    Pidfd,
    Procpoll,
}

impl SourceName {
    pub const ALL: [SourceName; 3] = [SourceName::Ebpf, SourceName::Pidfd, SourceName::Procpoll];

    fn detected_by(self) -> DetectedBy {
        match self {
            SourceName::Ebpf => DetectedBy::Ebpf,
            SourceName::Pidfd => DetectedBy::Pidfd,
            SourceName::Procpoll => DetectedBy::Procpoll,
        }
    }
}

impl fmt::Display for SourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.detected_by().fmt(f)
    }
}

/// Whether a source is working.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceState {
    /// Watching every tracked process it is meant to watch.
    Active,
    /// Running, but some tracked processes are beyond it (see the reason); others cover them.
    Degraded,
    /// The `/proc` poller, ready to cover what the other sources cannot.
    Standby,
    /// Not running; the reason says why.
    Off,
    /// `liveness doctor`: the source could start in the probing process.
    Available,
}

/// Which exit statuses a source's reports carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusFacts {
    /// Every death, from the kernel's own record.
    Always,
    /// Once the parent has reaped the process (pidfd on Linux 6.15+).
    AfterReap,
    Never,
}

/// What status says about one source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceReport {
    pub name: SourceName,
    pub state: SourceState,
    /// Why the source is off, degraded or on standby.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Which exit statuses its reports carry, while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<StatusFacts>,
    /// eBPF: whether it saw a test child's death at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_test: Option<SelfTest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<SourceStats>,
    /// eBPF: which causes of death its programs see here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub causes: Option<CausesReport>,
}

/// Which causes of death the eBPF programs see. A death they did not see has the cause
/// `unknown`; the reason here says why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CausesReport {
    /// The sender of a killing signal (`signal_generate`).
    pub signals: bool,
    /// The OOM killer's victims (`mark_victim`; the exit's own mark where it is missing).
    pub oom: bool,
    /// Senders and members' usage the kernel's maps had no room for.
    pub lost: u64,
    /// What is not seen, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Status of the whole monitor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonitorStatus {
    pub selection: String,
    pub tracked: u64,
    /// Tracked processes the pidfd source could not take (out of fds), covered by others.
    pub without_pidfd: u64,
    /// Times the kernel reported lost exits and every tracked process was re-checked.
    pub loss_reconciles: u64,
    pub sources: Vec<SourceReport>,
}

/// Counters a source exposes in status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceStats {
    /// Processes being watched right now.
    pub tracked: u64,
    /// Exit observations sent.
    pub observed: u64,
    /// Exits the kernel could not report (eBPF ring buffer full).
    pub lost: u64,
    /// Processes the source could not take (out of descriptors, map full).
    pub refused: u64,
}

/// What the start-up self-test found: a loaded program is no proof that it sees deaths here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SelfTest {
    pub passed: bool,
    pub detail: String,
}

/// Counters for status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub finalized_by: BTreeMap<DetectedBy, u64>,
    pub lagged_subscribers: u64,
    pub largest_batch: usize,
    /// Commits of finalizations and reap outcomes that failed and were retried.
    pub failed_commits: u64,
}

/// Limits in force and what they refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsStatus {
    pub connections: ConnectionsStatus,
    pub sessions: SessionsStatus,
}

/// Connections open and refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionsStatus {
    pub config: LimitsConfig,
    pub connections: OpenConnections,
    /// Requests that waited for a uid's earlier ones.
    pub requests_waited: u64,
    pub refused: BTreeMap<Limit, u64>,
}

/// Connections open now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenConnections {
    pub root: u64,
    pub non_root: u64,
    /// Distinct non-root uids connected.
    pub uids: u64,
}

/// Registrations refused by the per-uid session limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionsStatus {
    /// Non-root uids with active sessions.
    pub uids: u64,
    pub refused: BTreeMap<Limit, u64>,
}

/// The limits, as set by `livenessd` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsConfig {
    /// Open connections of one non-root uid.
    pub connections_per_uid: usize,
    /// Open connections of all non-root uids together.
    pub connections: usize,
    /// Requests of one non-root uid handled at once; more wait their turn.
    pub requests_per_uid: usize,
    /// A request line begun but not finished within this long closes the connection.
    #[serde(rename = "line_timeout_ms", with = "millis")]
    pub line_timeout: Duration,
    /// ACTIVE sessions of one non-root uid.
    pub sessions_per_uid: u64,
    /// Bytes of label keys and values of one session.
    pub label_bytes: u64,
    /// Bytes of label keys and values, and of held lock names, of one non-root uid's
    /// ACTIVE sessions.
    pub label_bytes_per_uid: u64,
    /// Locks held by one non-root uid's sessions.
    #[serde(default = "default_locks_per_uid")]
    pub locks_per_uid: u64,
    /// End actions of one non-root uid without an outcome: those of its ACTIVE sessions,
    /// and those waiting or running after their session ended.
    #[serde(default = "default_actions_per_uid")]
    pub actions_per_uid: u64,
}

fn default_locks_per_uid() -> u64 {
    LimitsConfig::default().locks_per_uid
}

fn default_actions_per_uid() -> u64 {
    LimitsConfig::default().actions_per_uid
}

impl Default for LimitsConfig {
    fn default() -> LimitsConfig {
        LimitsConfig {
            connections_per_uid: 64,
            connections: 1024,
            requests_per_uid: 8,
            line_timeout: Duration::from_secs(10),
            sessions_per_uid: 10_000,
            label_bytes: 4096,
            label_bytes_per_uid: 16 << 20,
            locks_per_uid: 1024,
            actions_per_uid: 1024,
        }
    }
}

/// Which limit refused something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    ConnectionsPerUid,
    Connections,
    /// The daemon ran out of file descriptors: a non-root client was turned away so
    /// that root still gets one.
    FileDescriptors,
    LineTimeout,
    SessionsPerUid,
    LabelBytes,
    LabelBytesPerUid,
    LocksPerUid,
    ActionsPerUid,
}

/// A duration as whole milliseconds on the wire.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(duration.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_each_membership_mode_misses_is_one_line_of_text() {
        for mode in [
            MembershipMode::Kernel,
            MembershipMode::KernelAndScan,
            MembershipMode::Scan,
        ] {
            let misses = mode.misses();
            assert!(
                !misses.is_empty() && !misses.contains("  ") && !misses.contains('\n'),
                "{mode:?}: {misses:?}"
            );
        }
    }
}
