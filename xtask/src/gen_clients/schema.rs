//! The wire types the clients mirror, described once: each field's name, type and how it
//! is present, each enum's values. [`super::check`] holds this description against the
//! serde types of `liveness-common` (through `probe`), so that it cannot drift from them;
//! the emitters write each client's types from it.

use liveness_common::{
    action, activity, cause, end, exit, fleet, identity, lock, protocol, session, status,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::probe::{Probe, probe, probe_variant};

/// A field's type on the wire.
#[derive(Debug, Clone, Copy)]
pub enum Ty {
    Bool,
    U8,
    U32,
    U64,
    I64,
    Str,
    List(&'static Ty),
    /// An object with string keys.
    Map(&'static Ty),
    /// A struct, a tagged union or an enum of this schema, by name.
    Named(&'static str),
}

/// How a field is written, and read when absent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Presence {
    /// Always written; reading fails without it.
    Required,
    /// Written as `null` when it does not apply (`Option` without `skip_serializing_if`).
    Nullable,
    /// Left out when it does not apply.
    Optional,
    /// Read as `value` (JSON) when absent; with `omit`, left out when it holds it.
    Default { value: &'static str, omit: bool },
}

#[derive(Debug)]
pub struct Field {
    pub name: &'static str,
    pub ty: Ty,
    pub presence: Presence,
    pub doc: &'static str,
}

#[derive(Debug)]
pub struct Struct {
    pub name: &'static str,
    pub doc: &'static str,
    pub fields: &'static [Field],
    /// Refuses fields it does not know (`deny_unknown_fields`).
    pub strict: bool,
    pub probe: Probe,
}

/// An object tagged by `kind`, whose other fields depend on it.
#[derive(Debug)]
pub struct Union {
    pub name: &'static str,
    pub doc: &'static str,
    /// The enum of its kinds, in [`ENUMS`].
    pub kinds: &'static str,
    pub variants: &'static [Variant],
    pub probe: Probe,
}

#[derive(Debug)]
pub struct Variant {
    pub kind: &'static str,
    pub fields: &'static [Field],
}

/// A closed set of strings.
#[derive(Debug)]
pub struct Enum {
    pub name: &'static str,
    pub doc: &'static str,
    /// The Go type's name, where it differs.
    pub go_name: &'static str,
    /// What the Go constants' names start with (`Kind` + `Ended`).
    pub go_prefix: &'static str,
    /// The name of the list of every value (Go `Codes`, TypeScript and Python `ERROR_CODES`).
    pub list: &'static str,
    /// A newer daemon may send values this client does not know: they are read as
    /// strings. A closed enum's field refuses them.
    pub open: bool,
    /// TypeScript and Python also name each value (`SESSION_ENDED`); Go always does.
    pub consts: bool,
    /// (Rust variant, wire value, doc).
    pub values: &'static [(&'static str, &'static str, &'static str)],
    /// The serde type, for enums that have one of their own (a union's kinds do not).
    pub probe: Option<Probe>,
}

impl Enum {
    pub fn go_type(&self) -> &'static str {
        if self.go_name.is_empty() {
            self.name
        } else {
            self.go_name
        }
    }
}

pub enum Item {
    Enum(&'static Enum),
    Struct(&'static Struct),
    Union(&'static Union),
}

/// Every type, each after those it names (TypeScript constants must come before their use).
pub const ITEMS: &[Item] = &[
    Item::Enum(&PHASE),
    Item::Enum(&ON_END),
    Item::Enum(&UNTIL),
    Item::Enum(&END_REASON),
    Item::Enum(&DETECTED_BY),
    Item::Enum(&ACTION_PHASE),
    Item::Enum(&SKIPPED),
    Item::Enum(&RELEASE_REASON),
    Item::Enum(&KERNEL_REASON),
    Item::Enum(&OOM_SCOPE),
    Item::Enum(&EVENT_KIND),
    Item::Enum(&ERROR_CODE),
    Item::Enum(&EXIT_KIND),
    Item::Enum(&CAUSE_KIND),
    Item::Enum(&MEMBERSHIP_MODE),
    Item::Enum(&SOURCE_NAME),
    Item::Enum(&SOURCE_STATE),
    Item::Enum(&STATUS_FACTS),
    Item::Enum(&LIMIT),
    Item::Enum(&ACTIVITY_STATE),
    Item::Enum(&STALL_REASON),
    Item::Enum(&STALL_ACTION),
    Item::Enum(&FLEET_CHANGE_KIND),
    Item::Struct(&IDENTITY),
    Item::Union(&EXIT_STATUS),
    Item::Struct(&SENDER),
    Item::Union(&CAUSE),
    Item::Struct(&MEMBERS_USAGE),
    Item::Struct(&USAGE),
    Item::Struct(&SURVIVORS),
    Item::Struct(&ACTION_SPEC),
    Item::Struct(&ACTION_OUTCOME),
    Item::Struct(&ACTION_STATE),
    Item::Struct(&STALL_POLICY),
    Item::Struct(&MEMORY_EVENTS),
    Item::Struct(&IO_USAGE),
    Item::Struct(&CGROUP_USAGE),
    Item::Enum(&ON_OOM),
    Item::Struct(&CGROUP_ESCAPE),
    Item::Struct(&PROCESS_KEY),
    Item::Struct(&UNLISTED),
    Item::Struct(&SESSION_CGROUP),
    // Before the session, which holds one: the TypeScript codecs are constants, each made
    // from those it names.
    Item::Struct(&REAP_FAILURE),
    Item::Struct(&REAPED),
    Item::Struct(&DECLARED),
    Item::Struct(&THREAD_STATES),
    Item::Struct(&SOCKET_EVIDENCE),
    Item::Struct(&EVIDENCE),
    Item::Struct(&ACTIVITY),
    Item::Struct(&SESSION),
    Item::Struct(&LOCK_CHANGE),
    Item::Struct(&HOPS),
    Item::Struct(&EVENT),
    Item::Struct(&LOCK),
    Item::Struct(&PROCESS),
    Item::Struct(&SUBSCRIBED),
    Item::Struct(&GAP),
    Item::Struct(&LAGGED),
    Item::Struct(&GOODBYE),
    Item::Struct(&FLEET_HOST),
    Item::Struct(&FLEET_VIEW),
    Item::Struct(&FLEET_CHANGE),
];

pub fn enum_named(name: &str) -> Option<&'static Enum> {
    ITEMS.iter().find_map(|item| match item {
        Item::Enum(e) if e.name == name => Some(*e),
        _ => None,
    })
}

const fn probe_of<T: Serialize + DeserializeOwned>() -> Probe {
    Probe(probe::<T>)
}

const fn field(name: &'static str, ty: Ty, presence: Presence, doc: &'static str) -> Field {
    Field {
        name,
        ty,
        presence,
        doc,
    }
}

use Presence::{Nullable, Optional, Required};
use Ty::{Bool, I64, List, Map, Named, Str, U8, U32, U64};

const fn default(value: &'static str) -> Presence {
    Presence::Default { value, omit: false }
}

const fn omitted(value: &'static str) -> Presence {
    Presence::Default { value, omit: true }
}

pub const PHASE: Enum = Enum {
    name: "Phase",
    doc: "A session's lifecycle phase.",
    go_name: "",
    go_prefix: "",
    list: "Phases",
    open: false,
    consts: false,
    values: &[("Active", "active", ""), ("Ended", "ended", "")],
    probe: Some(probe_of::<session::Phase>()),
};

pub const ON_END: Enum = Enum {
    name: "OnEnd",
    doc: "A session's cleanup policy: what happens to its surviving processes at its end.",
    go_name: "",
    go_prefix: "",
    list: "OnEnds",
    open: false,
    consts: false,
    values: &[
        (
            "Leave",
            "leave",
            "They keep running; the ended event lists them.",
        ),
        (
            "Terminate",
            "terminate",
            "They get SIGTERM, then SIGKILL after the grace period (session.reaped).",
        ),
    ],
    probe: Some(probe_of::<session::OnEnd>()),
};

pub const UNTIL: Enum = Enum {
    name: "Until",
    doc: "When a session ends by itself: at its owner's exit, or at the last exit of its tree.",
    go_name: "",
    go_prefix: "Until",
    list: "Untils",
    open: false,
    consts: false,
    values: &[
        ("Owner", "owner", "When its owner exits."),
        (
            "Tree",
            "tree",
            "When the last process of its tree (the owner and every process it started since registration) exits.",
        ),
    ],
    probe: Some(probe_of::<session::Until>()),
};

pub const END_REASON: Enum = Enum {
    name: "EndReason",
    doc: "Why a session ended.",
    go_name: "",
    go_prefix: "End",
    list: "EndReasons",
    open: true,
    consts: false,
    values: &[
        ("OwnerExited", "owner_exited", ""),
        (
            "OwnerReused",
            "owner_reused",
            "The owner's PID now belongs to another process: the owner died unseen.",
        ),
        ("Reboot", "reboot", ""),
        ("Stopped", "stopped", "A client stopped it explicitly."),
        (
            "Timeout",
            "timeout",
            "No activity within the inactivity timeout.",
        ),
        (
            "PendingExpired",
            "pending_expired",
            "A pending session was never renamed to its real id in time.",
        ),
        (
            "TreeExited",
            "tree_exited",
            "A session registered until \"tree\": the last process of its tree exited.",
        ),
    ],
    probe: Some(probe_of::<end::EndReason>()),
};

pub const DETECTED_BY: Enum = Enum {
    name: "DetectedBy",
    doc: "What noticed a death.",
    go_name: "",
    go_prefix: "By",
    list: "Detectors",
    open: true,
    consts: false,
    values: &[
        ("Ebpf", "ebpf", ""),
        ("Pidfd", "pidfd", ""),
        ("Procpoll", "procpoll", ""),
        (
            "Reconcile",
            "reconcile",
            "A re-check of /proc after a restart or a kernel-side loss, not a live source.",
        ),
    ],
    probe: Some(probe_of::<exit::DetectedBy>()),
};

pub const ACTION_PHASE: Enum = Enum {
    name: "ActionPhase",
    doc: "Where an end action stands: pending until its session ends and it starts, running, then done once its outcome is recorded.",
    go_name: "",
    go_prefix: "Action",
    list: "ActionPhases",
    open: false,
    consts: false,
    values: &[
        ("Pending", "pending", ""),
        ("Running", "running", ""),
        ("Done", "done", ""),
    ],
    probe: Some(probe_of::<session::ActionPhase>()),
};

pub const SKIPPED: Enum = Enum {
    name: "Skipped",
    doc: "Why an end action was not run.",
    go_name: "",
    go_prefix: "Skipped",
    list: "SkipReasons",
    open: true,
    consts: false,
    values: &[(
        "DoneByAgent",
        "done_by_agent",
        "The client said the session's end commands were run already (actions_done).",
    )],
    probe: Some(probe_of::<action::Skipped>()),
};

pub const RELEASE_REASON: Enum = Enum {
    name: "ReleaseReason",
    doc: "Why a lock was released.",
    go_name: "",
    go_prefix: "Release",
    list: "ReleaseReasons",
    open: true,
    consts: false,
    values: &[
        ("Released", "released", "Its session released it."),
        ("SessionEnded", "session_ended", "Its session ended."),
        (
            "LeaseLost",
            "lease_lost",
            "A fleet lock's session lease ended without it (etcd did not confirm it within its TTL): the lock may be another's now.",
        ),
    ],
    probe: Some(probe_of::<lock::ReleaseReason>()),
};

pub const KERNEL_REASON: Enum = Enum {
    name: "KernelReason",
    doc: "Why the kernel raised a signal by itself.",
    go_name: "",
    go_prefix: "Kernel",
    list: "KernelReasons",
    open: true,
    consts: false,
    values: &[
        (
            "Fault",
            "fault",
            "A fault: a bad memory access, an illegal instruction, a division by zero, a breakpoint.",
        ),
        (
            "BadSystemCall",
            "bad_system_call",
            "A system call that seccomp forbids.",
        ),
        ("CpuLimit", "cpu_limit", "RLIMIT_CPU."),
        ("FileSizeLimit", "file_size_limit", "RLIMIT_FSIZE."),
        (
            "BrokenPipe",
            "broken_pipe",
            "A write to a pipe or socket nobody reads.",
        ),
        (
            "Terminal",
            "terminal",
            "The terminal's interrupt or quit key.",
        ),
        ("Timer", "timer", "A timer the process set."),
        (
            "ParentDied",
            "parent_died",
            "Its parent died, and it had asked for this signal then (PR_SET_PDEATHSIG).",
        ),
        (
            "OrphanedGroup",
            "orphaned_group",
            "Its process group was orphaned with stopped members.",
        ),
        ("Other", "other", "Another reason."),
    ],
    probe: Some(probe_of::<cause::KernelReason>()),
};

pub const OOM_SCOPE: Enum = Enum {
    name: "OomScope",
    doc: "What ran out of memory.",
    go_name: "",
    go_prefix: "Oom",
    list: "OomScopes",
    open: true,
    consts: false,
    values: &[
        (
            "Cgroup",
            "cgroup",
            "A memory cgroup of the owner was at its limit.",
        ),
        ("Global", "global", "None was: the whole machine ran out."),
        (
            "Unknown",
            "unknown",
            "The kill was seen, not the limits at its moment.",
        ),
    ],
    probe: Some(probe_of::<cause::OomScope>()),
};

pub const EVENT_KIND: Enum = Enum {
    name: "EventKind",
    doc: "The kind of an event. A newer daemon may send others: ignore kinds you do not know.",
    go_name: "",
    go_prefix: "Kind",
    list: "EventKinds",
    open: true,
    consts: true,
    values: &[
        ("Registered", "session.registered", ""),
        ("OwnerChanged", "session.owner_changed", ""),
        ("Renamed", "session.renamed", ""),
        ("Ended", "session.ended", ""),
        (
            "Reaped",
            "session.reaped",
            "The surviving processes of an ended session were terminated.",
        ),
        (
            "Action",
            "session.action",
            "One end action of the ended session has its outcome (field action).",
        ),
        (
            "Finalized",
            "session.finalized",
            "Every end action of the ended session has its outcome.",
        ),
        (
            "Stalled",
            "session.stalled",
            "The live session made no progress for its threshold, or spins (field activity).",
        ),
        (
            "Unstalled",
            "session.unstalled",
            "The stalled session made progress again (field activity).",
        ),
        (
            "Escaped",
            "session.escaped",
            "A process of the live session left its cgroup (field escape); still the session's by its lineage.",
        ),
        (
            "LockAcquired",
            "lock.acquired",
            "The event's session was granted a lock.",
        ),
        (
            "LockReleased",
            "lock.released",
            "The event's session no longer holds a lock.",
        ),
    ],
    probe: Some(probe_of::<session::EventKind>()),
};

pub const ERROR_CODE: Enum = Enum {
    name: "ErrorCode",
    doc: "The machine-readable reason of a refusal (docs/protocol.md §4). A newer daemon may send codes this client does not name; they arrive as they are.",
    go_name: "Code",
    go_prefix: "Code",
    list: "ErrorCodes",
    open: true,
    consts: false,
    values: &[
        ("InvalidJson", "invalid_json", ""),
        ("InvalidRequest", "invalid_request", ""),
        ("LineTooLong", "line_too_long", ""),
        ("UnsupportedVersion", "unsupported_version", ""),
        ("NotFound", "not_found", ""),
        ("Forbidden", "forbidden", ""),
        (
            "Ambiguous",
            "ambiguous",
            "Root named a session id that several users have: add uid.",
        ),
        ("AlreadyEnded", "already_ended", ""),
        ("AlreadyExists", "already_exists", ""),
        ("NotPending", "not_pending", ""),
        (
            "NoOwner",
            "no_owner",
            "The owner process does not exist or cannot be resolved.",
        ),
        (
            "InvalidOwner",
            "invalid_owner",
            "The owner can never be watched as a process.",
        ),
        ("ShuttingDown", "shutting_down", ""),
        (
            "TooManyConnections",
            "too_many_connections",
            "A connection limit refused the connection.",
        ),
        (
            "LimitReached",
            "limit_reached",
            "A per-uid or per-session limit refused a registration, or a lock's queue is full.",
        ),
        (
            "LockHeld",
            "lock_held",
            "The lock is held by another session.",
        ),
        (
            "NotHeld",
            "not_held",
            "The session does not hold that lock.",
        ),
        ("Internal", "internal", ""),
    ],
    probe: Some(probe_of::<protocol::ErrorCode>()),
};

pub const EXIT_KIND: Enum = Enum {
    name: "ExitKind",
    doc: "The kind of an ExitStatus.",
    go_name: "",
    go_prefix: "",
    list: "ExitKinds",
    open: false,
    consts: false,
    values: &[
        ("Exited", "exited", "exit(code) or a return from main."),
        ("Signaled", "signaled", "Terminated by a signal."),
    ],
    probe: None,
};

pub const CAUSE_KIND: Enum = Enum {
    name: "CauseKind",
    doc: "The kind of a Cause.",
    go_name: "",
    go_prefix: "Cause",
    list: "CauseKinds",
    open: true,
    consts: false,
    values: &[
        ("Exit", "exit", "The owner exited by itself."),
        ("Signal", "signal", "A signal killed the owner."),
        ("Oom", "oom", "The kernel's OOM killer chose the owner."),
        (
            "Hangup",
            "hangup",
            "The kernel sent SIGHUP: the owner's terminal hung up.",
        ),
        (
            "Unknown",
            "unknown",
            "The death was seen by a source that cannot tell why, or not seen at all.",
        ),
        (
            "NoDeath",
            "none",
            "The owner did not die: the session was stopped, timed out or expired.",
        ),
    ],
    probe: None,
};

pub const MEMBERSHIP_MODE: Enum = Enum {
    name: "MembershipMode",
    doc: "How the members of sessions' process trees are found (status: membership.mode).",
    go_name: "",
    go_prefix: "Membership",
    list: "MembershipModes",
    open: true,
    consts: false,
    values: &[
        (
            "Kernel",
            "kernel",
            "The eBPF fork program adds every new process of a tree as it is forked.",
        ),
        (
            "KernelAndScan",
            "kernel_and_scan",
            "The kernel, and /proc scans for the members it did not add.",
        ),
        (
            "Scan",
            "scan",
            "No eBPF: /proc is scanned at registration and at an interval.",
        ),
    ],
    probe: Some(probe_of::<status::MembershipMode>()),
};

pub const SOURCE_NAME: Enum = Enum {
    name: "SourceName",
    doc: "An exit source (status: monitor.sources[].name).",
    go_name: "",
    go_prefix: "Source",
    list: "SourceNames",
    open: true,
    consts: false,
    values: &[
        ("Ebpf", "ebpf", ""),
        ("Pidfd", "pidfd", ""),
        ("Procpoll", "procpoll", ""),
    ],
    probe: Some(probe_of::<status::SourceName>()),
};

pub const SOURCE_STATE: Enum = Enum {
    name: "SourceState",
    doc: "Whether an exit source is working (status: monitor.sources[].state).",
    go_name: "",
    go_prefix: "SourceState",
    list: "SourceStates",
    open: true,
    consts: false,
    values: &[
        (
            "Active",
            "active",
            "Watching every tracked process it is meant to watch.",
        ),
        (
            "Degraded",
            "degraded",
            "Running, but some tracked processes are beyond it; others cover them.",
        ),
        (
            "Standby",
            "standby",
            "The /proc poller, ready to cover what the other sources cannot.",
        ),
        ("Off", "off", "Not running; the reason says why."),
        (
            "Available",
            "available",
            "liveness doctor: the source could start in the probing process.",
        ),
    ],
    probe: Some(probe_of::<status::SourceState>()),
};

pub const STATUS_FACTS: Enum = Enum {
    name: "StatusFacts",
    doc: "Which exit statuses a source's reports carry (status: monitor.sources[].exit_status).",
    go_name: "",
    go_prefix: "Facts",
    list: "StatusFactsValues",
    open: true,
    consts: false,
    values: &[
        (
            "Always",
            "always",
            "Every death, from the kernel's own record.",
        ),
        (
            "AfterReap",
            "after_reap",
            "Once the parent has reaped the process (pidfd on Linux 6.15+).",
        ),
        ("Never", "never", ""),
    ],
    probe: Some(probe_of::<status::StatusFacts>()),
};

pub const LIMIT: Enum = Enum {
    name: "Limit",
    doc: "Which limit refused something (status: limits.*.refused).",
    go_name: "",
    go_prefix: "Limit",
    list: "Limits",
    open: true,
    consts: false,
    values: &[
        ("ConnectionsPerUid", "connections_per_uid", ""),
        ("Connections", "connections", ""),
        (
            "FileDescriptors",
            "file_descriptors",
            "The daemon ran out of file descriptors: a non-root client was turned away so that root still gets one.",
        ),
        ("LineTimeout", "line_timeout", ""),
        ("SessionsPerUid", "sessions_per_uid", ""),
        ("LabelBytes", "label_bytes", ""),
        ("LabelBytesPerUid", "label_bytes_per_uid", ""),
        ("LocksPerUid", "locks_per_uid", ""),
        ("ActionsPerUid", "actions_per_uid", ""),
    ],
    probe: Some(probe_of::<status::Limit>()),
};

pub const IDENTITY: Struct = Struct {
    name: "Identity",
    doc: "A process's fingerprint: equal fingerprints name the same process, and a pid whose start time (or pidfs inode) differs is another process. See docs/protocol.md §2 \"Identity\".",
    strict: true,
    probe: probe_of::<identity::Identity>(),
    fields: &[
        field(
            "pid",
            U32,
            Required,
            "The process id, in the PID namespace of whoever captured it.",
        ),
        field(
            "start_ticks",
            U64,
            Required,
            "Start time in clock ticks after boot, as the initial time namespace counts it (/proc/<pid>/stat field 22).",
        ),
        field(
            "boot_id",
            Str,
            Required,
            "/proc/sys/kernel/random/boot_id of the boot the process runs in.",
        ),
        field(
            "host",
            Str,
            Required,
            "The host name when captured: a label, never compared.",
        ),
        field(
            "pidfs_ino",
            U64,
            Optional,
            "The pidfs inode of the process (Linux 6.9+), where known.",
        ),
        field(
            "comm",
            Str,
            default("\"\""),
            "The command name when captured: display only.",
        ),
    ],
};

pub const EXIT_STATUS: Union = Union {
    name: "ExitStatus",
    doc: "How a process ended, as wait(2) would tell its parent.",
    kinds: "ExitKind",
    probe: probe_of::<exit::ExitStatus>(),
    variants: &[
        Variant {
            kind: "exited",
            fields: &[field("code", U8, Required, "")],
        },
        Variant {
            kind: "signaled",
            fields: &[
                field("signal", U8, Required, ""),
                field("core_dumped", Bool, Required, ""),
            ],
        },
    ],
};

pub const SENDER: Struct = Struct {
    name: "Sender",
    doc: "The process that sent a killing signal, as it was when it sent it.",
    strict: false,
    probe: probe_of::<cause::Sender>(),
    fields: &[
        field("pid", U32, Required, ""),
        field("start_ticks", U64, Required, ""),
        field("comm", Str, Required, ""),
        field("uid", U32, Required, "Its real uid."),
        field(
            "session",
            Str,
            Optional,
            "The session the sender belonged to, only where every reader of the ending may see that session.",
        ),
    ],
};

pub const CAUSE: Union = Union {
    name: "Cause",
    doc: "Why a session ended, from its owner's side (docs/protocol.md §2 \"Cause\").",
    kinds: "CauseKind",
    probe: probe_of::<cause::Cause>(),
    variants: &[
        Variant {
            kind: "exit",
            fields: &[field("code", U8, Required, "exit: the exit code.")],
        },
        Variant {
            kind: "signal",
            fields: &[
                field("signal", U8, Required, "signal: the signal's number."),
                field(
                    "sender",
                    Named("Sender"),
                    Optional,
                    "signal: the process that sent it, where it was seen.",
                ),
                field(
                    "kernel",
                    Named("KernelReason"),
                    Optional,
                    "signal: why the kernel raised it itself.",
                ),
            ],
        },
        Variant {
            kind: "oom",
            fields: &[
                field("scope", Named("OomScope"), Required, "oom: what ran out."),
                field(
                    "cgroup",
                    Str,
                    Optional,
                    "oom: the memory cgroup whose limit was reached.",
                ),
            ],
        },
        Variant {
            kind: "hangup",
            fields: &[],
        },
        Variant {
            kind: "unknown",
            fields: &[field(
                "reason",
                Str,
                Required,
                "unknown: why the cause is not known.",
            )],
        },
        Variant {
            kind: "none",
            fields: &[],
        },
    ],
};

pub const MEMBERS_USAGE: Struct = Struct {
    name: "MembersUsage",
    doc: "The usage of a tree's members that exited while tracked: CPU summed, the largest peak.",
    strict: false,
    probe: probe_of::<cause::MembersUsage>(),
    fields: &[
        field("exited", U32, Required, ""),
        field("cpu_user_us", U64, Required, ""),
        field("cpu_system_us", U64, Required, ""),
        field("peak_rss_bytes", U64, Required, ""),
    ],
};

pub const USAGE: Struct = Struct {
    name: "Usage",
    doc: "What an owner cost, from the kernel at its exit (docs/protocol.md §2 \"Usage\").",
    strict: false,
    probe: probe_of::<cause::Usage>(),
    fields: &[
        field("cpu_user_us", U64, Required, ""),
        field("cpu_system_us", U64, Required, ""),
        field("peak_rss_bytes", U64, Required, ""),
        field(
            "members",
            Named("MembersUsage"),
            Required,
            "The members of the owner's tree that exited while it was tracked; those still running at its end are not counted.",
        ),
    ],
};

pub const SURVIVORS: Struct = Struct {
    name: "Survivors",
    doc: "The members of a session's process tree alive at its end.",
    strict: false,
    probe: probe_of::<end::Survivors>(),
    fields: &[
        field("total", U32, Required, "Every survivor, listed or not."),
        field(
            "members",
            List(&Named("Identity")),
            Required,
            "At most 1000 of them, by pid.",
        ),
        field(
            "requested_by",
            List(&Named("Identity")),
            omitted("[]"),
            "For an end requested from inside the tree: the process that requested it, then its ancestors up to the first that is no member. Not survivors (not counted in total), never signalled.",
        ),
    ],
};

pub const ACTION_SPEC: Struct = Struct {
    name: "ActionSpec",
    doc: "One end action: a command the daemon runs, as the session's creator, when the session ends, however it ends (docs/end-actions.md §1). Make it idempotent: a run cut short by a stop or a crash of the daemon runs again.",
    strict: true,
    probe: probe_of::<action::ActionSpec>(),
    fields: &[
        field(
            "argv",
            List(&Str),
            Required,
            "The program and its arguments, run without a shell; a name without / is looked up in the action's PATH.",
        ),
        field(
            "env",
            List(&Str),
            omitted("[]"),
            "NAME=value entries added to the action's clean environment.",
        ),
        field(
            "timeout_ms",
            U64,
            Optional,
            "How long it may run (the daemon's default: 60 s; at most an hour).",
        ),
        field(
            "cwd",
            Str,
            Optional,
            "Its absolute working directory (default: the user's home).",
        ),
    ],
};

pub const ACTION_OUTCOME: Struct = Struct {
    name: "ActionOutcome",
    doc: "What one run of an end action did (session.action events, and get).",
    strict: false,
    probe: probe_of::<action::ActionOutcome>(),
    fields: &[
        field(
            "index",
            U32,
            Required,
            "The action's place in the session's on_end_run.",
        ),
        field(
            "started_ms",
            I64,
            Required,
            "When it was started (ms since the epoch).",
        ),
        field("duration_ms", U64, Required, ""),
        field(
            "exit",
            Named("ExitStatus"),
            Optional,
            "How its first process ended; absent when it never ran (error says why).",
        ),
        field(
            "timed_out",
            Bool,
            omitted("false"),
            "It ran past its timeout, and its process tree was ended.",
        ),
        field(
            "killed",
            U32,
            omitted("0"),
            "Processes of its tree that needed SIGKILL after the timeout.",
        ),
        field(
            "stderr_tail",
            Str,
            omitted("\"\""),
            "The last 4 KiB of its stderr.",
        ),
        field(
            "stderr_bytes",
            U64,
            omitted("0"),
            "How many bytes it wrote to stderr in all.",
        ),
        field(
            "error",
            Str,
            Optional,
            "Why it could not be run (its working directory, its user, its program).",
        ),
        field(
            "failed_to_start",
            Bool,
            omitted("false"),
            "Its program never ran: it could not be prepared or executed, or it neither ran it nor exited within the start bound (stopped before its exec) and was killed; error says which.",
        ),
        field(
            "resumed",
            Bool,
            omitted("false"),
            "This run repeats one cut short by a stop or a crash of the daemon.",
        ),
        field(
            "skipped",
            Named("Skipped"),
            Optional,
            "Why it was not run (done_by_agent: the client ran the end commands itself).",
        ),
    ],
};

pub const ACTION_STATE: Struct = Struct {
    name: "ActionState",
    doc: "Where one end action of a session stands.",
    strict: false,
    probe: probe_of::<session::ActionState>(),
    fields: &[
        field("index", U32, Required, ""),
        field("state", Named("ActionPhase"), Required, ""),
        field(
            "outcome",
            Named("ActionOutcome"),
            Optional,
            "What it did, once done.",
        ),
    ],
};

pub const SESSION: Struct = Struct {
    name: "Session",
    doc: "A session as the daemon stores it (docs/protocol.md §2 \"Session\").",
    strict: false,
    probe: probe_of::<session::Session>(),
    fields: &[
        field("id", Str, Required, ""),
        field("owner", Named("Identity"), Required, ""),
        field("phase", Named("Phase"), Required, ""),
        field(
            "pending",
            Bool,
            Required,
            "Registered under a placeholder id until the real one is known (rename).",
        ),
        field(
            "reason",
            Named("EndReason"),
            Nullable,
            "Why it ended; none while active.",
        ),
        field(
            "exit",
            Named("ExitStatus"),
            Nullable,
            "The owner's exit status, when a source knew it.",
        ),
        field(
            "cause",
            Named("Cause"),
            Optional,
            "Why it ended, from its owner's side; set on every ended session.",
        ),
        field(
            "usage",
            Named("Usage"),
            Optional,
            "What the owner cost, where the kernel showed it (eBPF).",
        ),
        field(
            "detected_by",
            Named("DetectedBy"),
            Nullable,
            "What noticed the owner's death; none when no death ended it.",
        ),
        field(
            "creator_uid",
            U32,
            Required,
            "The user who registered it, the one who may see and change it.",
        ),
        field("labels", Map(&Str), Required, ""),
        field("created_ms", I64, Required, ""),
        field("updated_ms", I64, Required, ""),
        field(
            "touched_ms",
            I64,
            Required,
            "The last activity; the inactivity timeout counts from it.",
        ),
        field(
            "ended_ms",
            I64,
            Nullable,
            "When it ended; none while active.",
        ),
        field(
            "pending_expires_ms",
            I64,
            Nullable,
            "When a pending session expires unless renamed.",
        ),
        field(
            "survivors",
            Named("Survivors"),
            Optional,
            "The members of its process tree still alive when it ended.",
        ),
        field(
            "on_end",
            Named("OnEnd"),
            default("\"leave\""),
            "What happens to its surviving processes when it ends.",
        ),
        field(
            "until",
            Named("Until"),
            omitted("\"owner\""),
            "When it ends by itself.",
        ),
        field(
            "grace_ms",
            U64,
            default("10000"),
            "The time between SIGTERM and SIGKILL when its survivors are terminated.",
        ),
        field(
            "on_end_run",
            List(&Named("ActionSpec")),
            omitted("[]"),
            "The end actions its creator registered (docs/end-actions.md).",
        ),
        field(
            "on_stall",
            Named("StallPolicy"),
            Optional,
            "How its stalls are judged and what they do, as registered; the daemon's defaults stand for what is absent (docs/activity.md).",
        ),
        field(
            "cgroup",
            Named("SessionCgroup"),
            Optional,
            "The cgroup of its own it was given at registration (docs/cgroups.md).",
        ),
        field(
            "actions",
            List(&Named("ActionState")),
            omitted("[]"),
            "Where each end action stands, in the order of on_end_run: from get and actions_done only.",
        ),
        field(
            "finalized_ms",
            I64,
            Optional,
            "When the last end action had its outcome; none until then, and for a session without end actions, whose end is final.",
        ),
        field(
            "reaped",
            Named("Reaped"),
            Optional,
            "What terminating its surviving processes did, once recorded (as its session.reaped said); none before, and for a session whose processes were left.",
        ),
        field(
            "declared",
            Named("Declared"),
            Optional,
            "What its agent last declared through touch (a turn, a tool); none if nothing.",
        ),
        field(
            "activity",
            Named("Activity"),
            Optional,
            "In get and list, what it is doing as last judged; otherwise the stall episode under way when recorded (docs/activity.md).",
        ),
    ],
};

pub const ACTIVITY_STATE: Enum = Enum {
    name: "ActivityState",
    doc: "What a live session is doing, as judged from its tree (docs/activity.md).",
    go_name: "",
    go_prefix: "Activity",
    list: "ActivityStates",
    open: true,
    consts: false,
    values: &[
        ("Working", "working", "Progress within the threshold."),
        ("Tool", "tool", "A declared tool in flight."),
        ("Idle", "idle", "No turn in flight: waiting for its user."),
        (
            "Quiet",
            "quiet",
            "A turn in flight, no progress, below the stall threshold.",
        ),
        (
            "Stalled",
            "stalled",
            "A turn in flight and no progress for the stall threshold.",
        ),
        (
            "Spinning",
            "spinning",
            "Burning the CPU with no I/O and no new process.",
        ),
    ],
    probe: Some(probe_of::<activity::ActivityState>()),
};

pub const STALL_REASON: Enum = Enum {
    name: "StallReason",
    doc: "Why a session is stalled (or spinning: cpu).",
    go_name: "",
    go_prefix: "Stall",
    list: "StallReasons",
    open: true,
    consts: false,
    values: &[
        ("Network", "network", "Sockets open, nothing arriving."),
        (
            "NotReading",
            "not_reading",
            "Bytes wait unread in a socket's receive queue.",
        ),
        ("Blocked", "blocked", "Threads in uninterruptible sleep."),
        (
            "Tool",
            "tool",
            "A declared tool ran past its own threshold.",
        ),
        ("NoActivity", "no_activity", "Nothing at all happens."),
        ("Cpu", "cpu", "The tree burns the CPU with no I/O."),
    ],
    probe: Some(probe_of::<activity::StallReason>()),
};

pub const STALL_ACTION: Enum = Enum {
    name: "StallAction",
    doc: "What a stall episode's start does besides its session.stalled event.",
    go_name: "",
    go_prefix: "Stall",
    list: "StallActions",
    open: false,
    consts: false,
    values: &[
        ("Notify", "notify", "The event only."),
        (
            "Run",
            "run",
            "Runs the policy's command as the session's creator.",
        ),
        (
            "Signal",
            "signal",
            "Sends the policy's signal to the owner.",
        ),
        (
            "Terminate",
            "terminate",
            "SIGTERM to the session's tree, SIGKILL after its grace.",
        ),
    ],
    probe: Some(probe_of::<activity::StallAction>()),
};

pub const ON_OOM: Enum = Enum {
    name: "OnOom",
    doc: "What an OOM kill inside a session's cgroup does (docs/cgroups.md).",
    go_name: "",
    go_prefix: "OnOom",
    list: "OnOoms",
    open: false,
    consts: false,
    values: &[
        (
            "Continue",
            "continue",
            "The kernel's victim dies, the session goes on; memory.events counts the kill.",
        ),
        (
            "End",
            "end",
            "memory.oom.group: the kill takes every process of the cgroup, the owner included, which ends the session.",
        ),
    ],
    probe: Some(probe_of::<session::OnOom>()),
};

pub const SESSION_CGROUP: Struct = Struct {
    name: "SessionCgroup",
    doc: "A session's own cgroup and the limits written there (docs/cgroups.md).",
    strict: false,
    probe: probe_of::<session::SessionCgroup>(),
    fields: &[
        field(
            "path",
            Str,
            Required,
            "Its directory in the cgroup2 hierarchy, as the daemon sees it.",
        ),
        field("memory_max", U64, Optional, "memory.max, in bytes."),
        field("tasks_max", U64, Optional, "pids.max."),
        field("memory_high", U64, Optional, "memory.high, in bytes."),
        field("cpu_weight", U64, Optional, "cpu.weight, 1 to 10000."),
        field(
            "on_oom",
            Named("OnOom"),
            Optional,
            "What an OOM kill inside the session does; absent: continue.",
        ),
        field(
            "usage",
            Named("CgroupUsage"),
            Optional,
            "What the cgroup counted, read once its last member was gone and before it was removed; none until then.",
        ),
        field(
            "escaped",
            List(&Named("CgroupEscape")),
            omitted("[]"),
            "Its processes found outside its cgroup, each once: as they moved (with eBPF, each with its session.escaped), and the survivors of its end found outside then. Still the session's by their lineage.",
        ),
        field(
            "unlisted",
            Named("Unlisted"),
            Optional,
            "The processes its cgroup (or a cgroup below) held when its end reached the cgroup that are neither its owner nor a survivor the end lists: written into the cgroup, or missed by the tree's records. Absent when there were none.",
        ),
    ],
};

pub const PROCESS_KEY: Struct = Struct {
    name: "ProcessKey",
    doc: "A process of the local boot: its pid and its start time, immune to pid reuse.",
    strict: false,
    probe: probe_of::<identity::ProcessKey>(),
    fields: &[
        field("pid", U32, Required, "Its pid."),
        field(
            "start_ticks",
            U64,
            Required,
            "Its start time (/proc/<pid>/stat field 22).",
        ),
    ],
};

pub const UNLISTED: Struct = Struct {
    name: "Unlisted",
    doc: "The processes a session's cgroup held at its end that are neither its owner nor a survivor its end lists.",
    strict: false,
    probe: probe_of::<session::Unlisted>(),
    fields: &[
        field("total", U32, Required, "Every one, named or not."),
        field(
            "processes",
            List(&Named("ProcessKey")),
            Required,
            "At most 64 of them, by pid.",
        ),
    ],
};

pub const CGROUP_ESCAPE: Struct = Struct {
    name: "CgroupEscape",
    doc: "A member of a session's tree found outside the session's cgroup.",
    strict: false,
    probe: probe_of::<session::CgroupEscape>(),
    fields: &[
        field("pid", U32, Required, "Its pid."),
        field(
            "start_ticks",
            U64,
            default("0"),
            "Its start time (/proc/<pid>/stat field 22); 0 in a record written before it was kept.",
        ),
        field(
            "cgroup",
            Str,
            Required,
            "Where it was, as its /proc/<pid>/cgroup names it.",
        ),
    ],
};

pub const CGROUP_USAGE: Struct = Struct {
    name: "CgroupUsage",
    doc: "A session cgroup's counters; null where the kernel has no such file (memory.peak 5.19+, pids.peak 6.1+, io.stat with the io controller).",
    strict: false,
    probe: probe_of::<session::CgroupUsage>(),
    fields: &[
        field("memory_peak", U64, Nullable, "memory.peak, bytes."),
        field(
            "memory_events",
            Named("MemoryEvents"),
            Nullable,
            "memory.events.",
        ),
        field("cpu_usec", U64, Nullable, "cpu.stat usage_usec."),
        field("pids_peak", U64, Nullable, "pids.peak."),
        field(
            "io",
            Named("IoUsage"),
            Nullable,
            "io.stat, summed over devices.",
        ),
    ],
};

pub const MEMORY_EVENTS: Struct = Struct {
    name: "MemoryEvents",
    doc: "A session cgroup's memory.events.",
    strict: false,
    probe: probe_of::<session::MemoryEvents>(),
    fields: &[
        field("high", U64, Required, "Times memory.high was exceeded."),
        field(
            "max",
            U64,
            Required,
            "Times memory.max was about to be exceeded.",
        ),
        field("oom", U64, Required, "Times the cgroup ran out of memory."),
        field(
            "oom_kill",
            U64,
            Required,
            "Processes the OOM killer killed there.",
        ),
    ],
};

pub const IO_USAGE: Struct = Struct {
    name: "IoUsage",
    doc: "A session cgroup's io.stat, summed over its devices.",
    strict: false,
    probe: probe_of::<session::IoUsage>(),
    fields: &[
        field("rbytes", U64, Required, ""),
        field("wbytes", U64, Required, ""),
        field("rios", U64, Required, ""),
        field("wios", U64, Required, ""),
    ],
};

pub const STALL_POLICY: Struct = Struct {
    name: "StallPolicy",
    doc: "How a session's stalls are judged and what they do; absent parts are the daemon's.",
    strict: true,
    probe: probe_of::<activity::StallPolicy>(),
    fields: &[
        field("stall_after_ms", U64, Optional, ""),
        field("spin_after_ms", U64, Optional, ""),
        field("tool_stall_after_ms", U64, Optional, ""),
        field("action", Named("StallAction"), Optional, "Default notify."),
        field("signal", I64, Optional, "With action signal: its number."),
        field(
            "run",
            Named("ActionSpec"),
            Optional,
            "With action run: the command.",
        ),
    ],
};

pub const DECLARED: Struct = Struct {
    name: "Declared",
    doc: "What a session's agent last declared through touch.",
    strict: false,
    probe: probe_of::<activity::Declared>(),
    fields: &[
        field(
            "turn_since_ms",
            I64,
            Optional,
            "When the turn in flight started; none when no turn is in flight.",
        ),
        field("tool", Str, Optional, "The tool in flight."),
        field("tool_since_ms", I64, Optional, ""),
        field("at_ms", I64, Required, "The last declaration."),
    ],
};

pub const THREAD_STATES: Struct = Struct {
    name: "ThreadStates",
    doc: "Threads of a tree by state.",
    strict: false,
    probe: probe_of::<activity::ThreadStates>(),
    fields: &[
        field("running", U32, Required, ""),
        field("sleeping", U32, Required, ""),
        field("blocked", U32, Required, ""),
        field("stopped", U32, Required, ""),
    ],
};

pub const SOCKET_EVIDENCE: Struct = Struct {
    name: "SocketEvidence",
    doc: "One TCP socket a member of the tree holds.",
    strict: false,
    probe: probe_of::<activity::SocketEvidence>(),
    fields: &[
        field("pid", U32, Required, ""),
        field("peer", Str, Required, ""),
        field(
            "bytes_received",
            U64,
            Optional,
            "Bytes received over its life.",
        ),
        field(
            "idle_ms",
            U64,
            Optional,
            "Milliseconds since data last arrived.",
        ),
        field("unread", U64, Required, "Bytes received and not yet read."),
    ],
};

pub const EVIDENCE: Struct = Struct {
    name: "Evidence",
    doc: "What the kernel showed of a session's tree at the last sample.",
    strict: false,
    probe: probe_of::<activity::Evidence>(),
    fields: &[
        field("processes", U32, Required, "Live processes of the tree."),
        field(
            "cpu_permille",
            U32,
            Required,
            "CPU of the tree over the last interval, in thousandths of one core.",
        ),
        field(
            "cpu_wait_permille",
            U32,
            omitted("0"),
            "How long its threads waited, runnable, for a CPU over the last interval.",
        ),
        field(
            "long_lived_cpu_permille",
            U32,
            omitted("0"),
            "Of which its long-lived members', which is not progress.",
        ),
        field("threads", Named("ThreadStates"), Required, ""),
        field(
            "blocked_in",
            List(&Str),
            omitted("[]"),
            "Where the blocked threads wait (wchan).",
        ),
        field(
            "written_bytes",
            U64,
            Required,
            "Bytes written over the last interval.",
        ),
        field(
            "sockets",
            List(&Named("SocketEvidence")),
            omitted("[]"),
            "The tree's TCP sockets, the quietest first.",
        ),
    ],
};

pub const ACTIVITY: Struct = Struct {
    name: "Activity",
    doc: "A live session's activity: its state, why, since when, and the evidence (docs/activity.md).",
    strict: false,
    probe: probe_of::<activity::Activity>(),
    fields: &[
        field("state", Named("ActivityState"), Required, ""),
        field("reason", Named("StallReason"), Optional, ""),
        field(
            "since_ms",
            I64,
            Required,
            "When the state began; for quiet, stalled and spinning, the last progress.",
        ),
        field("evidence", Named("Evidence"), Required, ""),
    ],
};

pub const REAP_FAILURE: Struct = Struct {
    name: "ReapFailure",
    doc: "A process the daemon could not, or would not, end.",
    strict: false,
    probe: probe_of::<session::ReapFailure>(),
    fields: &[
        field("pid", U32, Required, ""),
        field("reason", Str, Required, ""),
    ],
};

pub const REAPED: Struct = Struct {
    name: "Reaped",
    doc: "What terminating a session's surviving processes did, by pid.",
    strict: false,
    probe: probe_of::<session::Reaped>(),
    fields: &[
        field(
            "terminated",
            List(&U32),
            Required,
            "Exited after SIGTERM, within the grace period.",
        ),
        field(
            "killed",
            List(&U32),
            Required,
            "Still running when the grace period ended: SIGKILLed.",
        ),
        field(
            "exited",
            List(&U32),
            Required,
            "Had already exited before they were signalled.",
        ),
        field(
            "failed",
            List(&Named("ReapFailure")),
            Required,
            "Not signalled, or still alive after SIGKILL, and why.",
        ),
        field(
            "resumed",
            Bool,
            omitted("false"),
            "The reap was cut short by a stop or a crash of the daemon and run again.",
        ),
    ],
};

pub const LOCK_CHANGE: Struct = Struct {
    name: "LockChange",
    doc: "The lock a lock.acquired or lock.released event is about.",
    strict: false,
    probe: probe_of::<lock::LockChange>(),
    fields: &[
        field("name", Str, Required, ""),
        field("token", U64, Required, ""),
        field("cluster", Bool, omitted("false"), "A fleet lock's."),
        field(
            "reason",
            Named("ReleaseReason"),
            Optional,
            "Why it was released, on lock.released only.",
        ),
    ],
};

pub const HOPS: Struct = Struct {
    name: "Hops",
    doc: "CLOCK_MONOTONIC nanoseconds of a death's way through a daemon started with --trace-hops.",
    strict: false,
    probe: probe_of::<session::Hops>(),
    fields: &[
        field(
            "died_ns",
            U64,
            Optional,
            "The kernel ran the exit (eBPF only).",
        ),
        field(
            "read_ns",
            U64,
            Required,
            "The engine took the death from its source.",
        ),
        field(
            "committed_ns",
            U64,
            Required,
            "The session's end was committed.",
        ),
        field(
            "published_ns",
            U64,
            Required,
            "The event was handed to the subscribers' queues.",
        ),
    ],
};

pub const EVENT: Struct = Struct {
    name: "Event",
    doc: "One entry of the event stream (docs/protocol.md §5).",
    strict: false,
    probe: probe_of::<session::Event>(),
    fields: &[
        field("seq", U64, Required, ""),
        field("kind", Named("EventKind"), Required, ""),
        field("at_ms", I64, Required, ""),
        field("session", Str, Required, ""),
        field("owner", Named("Identity"), Required, ""),
        field(
            "previous_owner",
            Named("Identity"),
            Optional,
            "session.owner_changed: the owner that was replaced.",
        ),
        field(
            "previous_session",
            Str,
            Optional,
            "session.renamed: the old (pending) id.",
        ),
        field("reason", Named("EndReason"), Optional, ""),
        field("exit", Named("ExitStatus"), Optional, ""),
        field(
            "cause",
            Named("Cause"),
            Optional,
            "session.ended: why, from the owner's side.",
        ),
        field(
            "usage",
            Named("Usage"),
            Optional,
            "session.ended: what the owner and its tree's exited members cost (eBPF only).",
        ),
        field("detected_by", Named("DetectedBy"), Optional, ""),
        field(
            "observed_ms",
            I64,
            Optional,
            "When a source learned of the death (at_ms is when it was committed).",
        ),
        field(
            "died_ms",
            I64,
            Optional,
            "When the owner died, by the kernel's clock (eBPF only).",
        ),
        field("labels", Map(&Str), default("{}"), ""),
        field(
            "creator_uid",
            U32,
            Required,
            "The uid that registered the session.",
        ),
        field(
            "survivors",
            Named("Survivors"),
            Optional,
            "session.ended: the members of the session's process tree still alive.",
        ),
        field(
            "on_end",
            Named("OnEnd"),
            omitted("\"leave\""),
            "The session's cleanup policy.",
        ),
        field(
            "reaped",
            Named("Reaped"),
            Optional,
            "session.reaped: what terminating the surviving processes did.",
        ),
        field(
            "actions",
            U32,
            omitted("0"),
            "How many end actions the session has: when not 0, a session.finalized follows its session.ended.",
        ),
        field(
            "action",
            Named("ActionOutcome"),
            Optional,
            "session.action: what one end action did.",
        ),
        field(
            "activity",
            Named("Activity"),
            Optional,
            "session.stalled and session.unstalled: the judgement and its evidence.",
        ),
        field(
            "lock",
            Named("LockChange"),
            Optional,
            "lock.acquired and lock.released: which lock.",
        ),
        field(
            "escape",
            Named("CgroupEscape"),
            Optional,
            "session.escaped: the process that left the session's cgroup, and where to.",
        ),
        field(
            "hops",
            Named("Hops"),
            Optional,
            "session.ended, from a daemon started with --trace-hops only.",
        ),
    ],
};

pub const LOCK: Struct = Struct {
    name: "Lock",
    doc: "A held lock with its fencing token (docs/protocol.md §12).",
    strict: false,
    probe: probe_of::<lock::Lock>(),
    fields: &[
        field("name", Str, Required, ""),
        field(
            "uid",
            U32,
            Required,
            "The namespace of the name: the uid of the holding session's creator.",
        ),
        field("session", Str, Required, "The holding session."),
        field(
            "token",
            U64,
            Required,
            "Greater than that of every earlier grant of the lock: pass it to what the lock protects, and have that refuse a lower one.",
        ),
        field("since_ms", I64, Required, "When it was granted."),
        field("waiters", U32, default("0"), "Requests waiting for it."),
        field(
            "cluster",
            Bool,
            omitted("false"),
            "A fleet lock (livenessd --etcd), held in etcd for every host; its token is etcd's revision of the grant.",
        ),
        field(
            "host",
            Str,
            Optional,
            "A fleet lock's: the host id of the daemon its session is on.",
        ),
    ],
};

pub const PROCESS: Struct = Struct {
    name: "Process",
    doc: "One live process of a session's tree, as processes lists it.",
    strict: false,
    probe: probe_of::<protocol::MemberProcess>(),
    fields: &[
        field("identity", Named("Identity"), Required, ""),
        field(
            "owner",
            Bool,
            Required,
            "True for the session's owner, the tree's root.",
        ),
        field(
            "ppid",
            U32,
            Required,
            "The current parent, in the daemon's PID namespace.",
        ),
        field(
            "cmdline",
            List(&Str),
            Required,
            "The arguments; empty where they cannot be read.",
        ),
        field(
            "age_ms",
            U64,
            Required,
            "Milliseconds since the process started.",
        ),
    ],
};

pub const SUBSCRIBED: Struct = Struct {
    name: "Subscribed",
    doc: "A subscription's acknowledgement (events after since up to head are replayed first), and the body of a reset.",
    strict: false,
    probe: probe_of::<protocol::Subscribed>(),
    fields: &[
        field("since", U64, Required, ""),
        field("head", U64, Required, ""),
        field(
            "store_id",
            Str,
            Required,
            "The identity of the store the seqs belong to.",
        ),
    ],
};

fn stream_gap(value: &Value) -> Result<super::probe::Probed, String> {
    probe_variant::<protocol::StreamMessage>("gap", value)
}

fn stream_lagged(value: &Value) -> Result<super::probe::Probed, String> {
    probe_variant::<protocol::StreamMessage>("lagged", value)
}

fn stream_goodbye(value: &Value) -> Result<super::probe::Probed, String> {
    probe_variant::<protocol::StreamMessage>("goodbye", value)
}

pub const GAP: Struct = Struct {
    name: "Gap",
    doc: "Events after since up to pruned_through fell out of the retention window before they were read.",
    strict: false,
    probe: Probe(stream_gap),
    fields: &[
        field("since", U64, Required, ""),
        field("pruned_through", U64, Required, ""),
    ],
};

pub const LAGGED: Struct = Struct {
    name: "Lagged",
    doc: "The subscriber fell behind its queue and the daemon closed the stream; resume after last_delivered.",
    strict: false,
    probe: Probe(stream_lagged),
    fields: &[field("last_delivered", U64, Required, "")],
};

pub const GOODBYE: Struct = Struct {
    name: "Goodbye",
    doc: "The daemon is stopping.",
    strict: false,
    probe: Probe(stream_goodbye),
    fields: &[field("reason", Str, Required, "")],
};

pub const FLEET_CHANGE_KIND: Enum = Enum {
    name: "FleetChangeKind",
    doc: "What changed in the fleet (fleet_watch).",
    go_name: "",
    go_prefix: "Fleet",
    list: "FleetChangeKinds",
    open: true,
    consts: false,
    values: &[
        (
            "Online",
            "online",
            "The host's daemon took its lease or rewrote its host record.",
        ),
        ("Offline", "offline", "The host's lease ended."),
        ("Session", "session", "A session was written."),
        (
            "Ended",
            "ended",
            "A session ended on its host: event is the end.",
        ),
        (
            "Gone",
            "gone",
            "A session's key was removed without an end recorded with it.",
        ),
    ],
    probe: Some(probe_of::<fleet::FleetChangeKind>()),
};

pub const FLEET_HOST: Struct = Struct {
    name: "FleetHost",
    doc: "One host of the fleet and its ACTIVE sessions, as etcd holds them.",
    strict: false,
    probe: probe_of::<fleet::FleetHost>(),
    fields: &[
        field("host_id", Str, Required, ""),
        field("online", Bool, Required, "Its daemon holds its host lease."),
        field(
            "since_ms",
            I64,
            Optional,
            "Online: since when. Offline: when its daemon was last seen alive.",
        ),
        field("hostname", Str, Optional, ""),
        field(
            "sessions",
            List(&Named("Session")),
            Required,
            "Its ACTIVE sessions as it last wrote them.",
        ),
    ],
};

pub const FLEET_VIEW: Struct = Struct {
    name: "FleetView",
    doc: "Every host of the fleet at one etcd revision (fleet).",
    strict: false,
    probe: probe_of::<fleet::FleetView>(),
    fields: &[
        field(
            "revision",
            I64,
            Required,
            "etcd's revision of the view: fleet_watch since it follows every change after.",
        ),
        field("hosts", List(&Named("FleetHost")), Required, "By host id."),
    ],
};

pub const FLEET_CHANGE: Struct = Struct {
    name: "FleetChange",
    doc: "A change of the fleet, a line of fleet_watch.",
    strict: false,
    probe: probe_of::<fleet::FleetChange>(),
    fields: &[
        field(
            "revision",
            I64,
            Required,
            "etcd's revision of the change; resume after it with since.",
        ),
        field("change", Named("FleetChangeKind"), Required, ""),
        field("host_id", Str, Required, ""),
        field("since_ms", I64, Optional, "online: since when."),
        field("hostname", Str, Optional, "online."),
        field(
            "session",
            Named("Session"),
            Optional,
            "session: as written; ended, gone: as last known.",
        ),
        field(
            "event",
            Named("Event"),
            Optional,
            "ended: the session.ended event.",
        ),
    ],
};
