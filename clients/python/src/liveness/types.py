"""The protocol's objects (docs/protocol.md §2, §5, §12, §14), as dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from ._codec import Wire, decode, encode

DEFAULT_GRACE_MS = 10_000

# Event kinds. A newer daemon may send others: ignore kinds you do not know.
SESSION_REGISTERED = "session.registered"
SESSION_OWNER_CHANGED = "session.owner_changed"
SESSION_RENAMED = "session.renamed"
SESSION_ENDED = "session.ended"
SESSION_REAPED = "session.reaped"
SESSION_ACTION = "session.action"
"""One end action of the ended session has its outcome (``Event.action``)."""
SESSION_FINALIZED = "session.finalized"
"""Every end action of the ended session has its outcome."""
LOCK_ACQUIRED = "lock.acquired"
LOCK_RELEASED = "lock.released"


@dataclass(frozen=True)
class Identity(Wire):
    """A process's fingerprint: a pid whose start time (or pidfs inode) differs is another
    process. ``host`` and ``comm`` are labels, never compared."""

    pid: int
    start_ticks: int
    boot_id: str
    host: str
    pidfs_ino: Optional[int] = None
    comm: str = ""

    STRICT = True

    def same_process(self, other: Identity) -> bool:
        """Same boot, pid and start time, and the same pidfs inode where both know it."""
        return (
            (self.pid, self.start_ticks, self.boot_id) == (other.pid, other.start_ticks, other.boot_id)
            and (self.pidfs_ino is None or other.pidfs_ino is None or self.pidfs_ino == other.pidfs_ino)
        )


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended, as wait(2) would tell its parent: ``kind`` is ``"exited"``
    (with ``code``) or ``"signaled"`` (with ``signal`` and ``core_dumped``)."""

    kind: str
    code: Optional[int] = None
    signal: Optional[int] = None
    core_dumped: bool = False

    @classmethod
    def from_json(cls, value: Any) -> ExitStatus:
        kind = value.get("kind") if isinstance(value, dict) else None
        if kind == "exited":
            return cls(kind, code=decode(int, value.get("code"), "code"))
        if kind == "signaled":
            return cls(kind, signal=decode(int, value.get("signal"), "signal"),
                       core_dumped=decode(bool, value.get("core_dumped"), "core_dumped"))
        raise ValueError(f"an exit status of unknown kind: {value!r}")

    def to_json(self) -> Dict[str, Any]:
        if self.kind == "exited":
            return {"kind": "exited", "code": self.code}
        return {"kind": "signaled", "signal": self.signal, "core_dumped": self.core_dumped}

    def __str__(self) -> str:
        if self.kind == "exited":
            return f"exited with code {self.code}"
        return f"killed by signal {self.signal}" + (" (core dumped)" if self.core_dumped else "")


@dataclass(frozen=True)
class Sender(Wire):
    """The process that sent a killing signal, as it was when it sent it; ``session`` only
    where every reader of the ending may see that session."""

    pid: int
    start_ticks: int
    comm: str
    uid: int
    session: Optional[str] = None


@dataclass(frozen=True)
class Cause(Wire):
    """Why a session ended, from its owner's side (docs/protocol.md §2 "Cause"): ``kind`` is
    ``exit`` (``code``), ``signal`` (``signal``, and ``sender`` or ``kernel``), ``oom``
    (``scope``, ``cgroup``), ``hangup``, ``unknown`` (``reason``) or ``none``."""

    kind: str
    code: Optional[int] = None
    signal: Optional[int] = None
    sender: Optional[Sender] = None
    kernel: Optional[str] = None
    scope: Optional[str] = None
    cgroup: Optional[str] = None
    reason: Optional[str] = None


@dataclass(frozen=True)
class MembersUsage(Wire):
    """The members of a tree that exited while tracked: CPU summed, the largest peak."""

    exited: int
    cpu_user_us: int
    cpu_system_us: int
    peak_rss_bytes: int


@dataclass(frozen=True)
class Usage(Wire):
    """What an owner cost, from the kernel at its exit (docs/protocol.md §2 "Usage")."""

    cpu_user_us: int
    cpu_system_us: int
    peak_rss_bytes: int
    members: MembersUsage


@dataclass(frozen=True)
class Survivors(Wire):
    """The members of a session's tree alive at its end: ``total``, and at most 1000 by pid."""

    total: int
    members: List[Identity]


@dataclass(frozen=True)
class ActionSpec(Wire):
    """One end action: a command the daemon runs, as the session's creator, when the
    session ends, however it ends (docs/end-actions.md §1). Make it idempotent: a run cut
    short by a stop or a crash of the daemon runs again.

    ``argv`` runs without a shell (a name without ``/`` is looked up in ``PATH``); ``env``
    holds ``NAME=value`` entries added to a clean environment; ``timeout_ms`` defaults to
    the daemon's 60 s (at most an hour); ``cwd`` (absolute) to the user's home."""

    OMIT_DEFAULT = frozenset({"env"})
    STRICT = True

    argv: List[str]
    env: List[str] = field(default_factory=list)
    timeout_ms: Optional[int] = None
    cwd: Optional[str] = None


@dataclass(frozen=True)
class ActionOutcome(Wire):
    """What one run of an end action did (``session.action`` events, and ``get``).

    ``exit`` is how its first process ended (None when it never ran: ``error`` says why);
    ``timed_out``: it ran past its timeout and its tree was ended (``killed`` of them with
    SIGKILL); ``stderr_tail`` is the last 4 KiB of its stderr, ``stderr_bytes`` all it
    wrote there; ``failed_to_start``: its program never ran (``error`` says why: a setup
    step, the program, or a process stopped before its exec past the start bound);
    ``resumed``: it repeats a run cut short by a stop or a crash of the daemon; ``skipped`` says why it was not run (``done_by_agent``: see
    :meth:`Client.actions_done`)."""

    OMIT_DEFAULT = frozenset(
        {"timed_out", "killed", "stderr_tail", "stderr_bytes", "failed_to_start", "resumed"}
    )

    index: int
    started_ms: int
    duration_ms: int
    exit: Optional[ExitStatus] = None
    timed_out: bool = False
    killed: int = 0
    stderr_tail: str = ""
    stderr_bytes: int = 0
    error: Optional[str] = None
    failed_to_start: bool = False
    resumed: bool = False
    skipped: Optional[str] = None

    @property
    def succeeded(self) -> bool:
        """It ran, in time, and exited with status 0."""
        return not self.timed_out and self.exit is not None and self.exit.kind == "exited" and self.exit.code == 0


@dataclass(frozen=True)
class ActionState(Wire):
    """Where one end action stands: ``pending`` until the session ends and it starts,
    ``running``, then ``done`` with its ``outcome``."""

    index: int
    state: str
    outcome: Optional[ActionOutcome] = None


@dataclass(frozen=True)
class Session(Wire):
    """A session as the daemon stores it (docs/protocol.md §2 "Session").

    ``on_end_run`` are its end actions; ``actions`` (from ``get`` and ``actions_done``
    only) where each stands; ``finalized_ms`` when the last one had its outcome."""

    NULLABLE = frozenset({"reason", "exit", "detected_by", "ended_ms", "pending_expires_ms"})
    OMIT_DEFAULT = frozenset({"on_end_run", "actions", "until"})

    id: str
    owner: Identity
    phase: str
    pending: bool
    reason: Optional[str]
    exit: Optional[ExitStatus]
    detected_by: Optional[str]
    creator_uid: int
    labels: Dict[str, str]
    created_ms: int
    updated_ms: int
    touched_ms: int
    ended_ms: Optional[int]
    pending_expires_ms: Optional[int]
    survivors: Optional[Survivors] = None
    on_end: str = "leave"
    grace_ms: int = DEFAULT_GRACE_MS
    #: When it ends by itself: "owner" (the default), or "tree" (the last exit of its tree).
    until: str = "owner"
    cause: Optional[Cause] = None
    usage: Optional[Usage] = None
    on_end_run: List[ActionSpec] = field(default_factory=list)
    actions: List[ActionState] = field(default_factory=list)
    finalized_ms: Optional[int] = None

    @property
    def finalized(self) -> bool:
        """Ended, with each end action's outcome recorded (at once for one without any)."""
        return self.phase == "ended" and (not self.on_end_run or self.finalized_ms is not None)


@dataclass(frozen=True)
class ReapFailure(Wire):
    pid: int
    reason: str


@dataclass(frozen=True)
class Reaped(Wire):
    """What terminating a session's surviving processes did, by pid."""

    OMIT_DEFAULT = frozenset({"resumed"})

    terminated: List[int]
    killed: List[int]
    exited: List[int]
    failed: List[ReapFailure]
    resumed: bool = False


@dataclass(frozen=True)
class LockChange(Wire):
    """The lock of a ``lock.acquired`` or ``lock.released`` event."""

    name: str
    token: int
    reason: Optional[str] = None


@dataclass(frozen=True)
class Hops(Wire):
    """CLOCK_MONOTONIC nanoseconds of a death through a daemon run with --trace-hops."""

    read_ns: int
    committed_ns: int
    published_ns: int
    died_ns: Optional[int] = None


@dataclass(frozen=True)
class Event(Wire):
    """One entry of the event stream (docs/protocol.md §5). ``actions`` counts the
    session's end actions (when not 0, a ``session.finalized`` follows its
    ``session.ended``); ``action`` is what one did (``session.action``)."""

    OMIT_DEFAULT = frozenset({"on_end", "actions"})

    seq: int
    kind: str
    at_ms: int
    session: str
    owner: Identity
    creator_uid: int
    labels: Dict[str, str] = field(default_factory=dict)
    previous_owner: Optional[Identity] = None
    previous_session: Optional[str] = None
    reason: Optional[str] = None
    exit: Optional[ExitStatus] = None
    detected_by: Optional[str] = None
    observed_ms: Optional[int] = None
    died_ms: Optional[int] = None
    survivors: Optional[Survivors] = None
    on_end: str = "leave"
    cause: Optional[Cause] = None
    usage: Optional[Usage] = None
    reaped: Optional[Reaped] = None
    actions: int = 0
    action: Optional[ActionOutcome] = None
    lock: Optional[LockChange] = None
    hops: Optional[Hops] = None


@dataclass(frozen=True)
class Lock(Wire):
    """A held lock; ``token`` only grows: pass it on, and refuse lower ones."""

    name: str
    uid: int
    session: str
    token: int
    since_ms: int
    waiters: int = 0


@dataclass(frozen=True)
class Process(Wire):
    """A live process of a session's tree, as ``processes`` lists it."""

    identity: Identity
    owner: bool
    ppid: int
    cmdline: List[str]
    age_ms: int


@dataclass(frozen=True)
class Subscribed(Wire):
    """A subscription's acknowledgement, and the body of a ``reset``."""

    since: int
    head: int
    store_id: str


@dataclass(frozen=True)
class Reset(Subscribed):
    """The cursor was of another database: every event of this one follows, from the
    first; the cursor starts over in ``store_id``."""


@dataclass(frozen=True)
class Gap(Wire):
    """Events ``since+1 .. pruned_through`` were deleted by retention before they were read."""

    since: int
    pruned_through: int


@dataclass(frozen=True)
class Lagged(Wire):
    """The subscriber fell behind; the daemon closed the stream (the subscription resumes)."""

    last_delivered: int


@dataclass(frozen=True)
class Goodbye(Wire):
    """The daemon is stopping (the subscription resumes once it is back)."""

    reason: str


Message = Union[Event, Reset, Gap, Lagged, Goodbye]
"""A line of the event stream."""

_MESSAGES = {"event": Event, "reset": Reset, "gap": Gap, "lagged": Lagged, "goodbye": Goodbye}


def decode_message(value: Any) -> Optional[Message]:
    """A stream line; ``None`` for a line of a newer protocol, to be ignored."""
    for key, cls in _MESSAGES.items():
        if isinstance(value, dict) and key in value:
            return cls.from_json(value[key])  # type: ignore[no-any-return]
    return None


def encode_message(message: Message) -> Dict[str, Any]:
    key = {cls: key for key, cls in _MESSAGES.items()}[type(message)]
    return {key: encode(message)}


@dataclass(frozen=True)
class ErrorBody(Wire):
    code: str
    message: str


@dataclass(frozen=True)
class Reply(Wire):
    """One reply; which keys are set depends on the request."""

    OMIT_DEFAULT = frozenset({"warnings"})

    ok: bool
    id: Any = None
    error: Optional[ErrorBody] = None
    session: Optional[Session] = None
    sessions: Optional[List[Session]] = None
    next: Optional[str] = None
    owner_pid: Optional[int] = None
    status: Optional[Dict[str, Any]] = None
    subscribed: Optional[Subscribed] = None
    warnings: List[str] = field(default_factory=list)
    lock: Optional[Lock] = None
    locks: Optional[List[Lock]] = None
    processes: Optional[List[Process]] = None


AUTO = "auto"
"""``owner="auto"``: the daemon walks up from the connecting process past shells and
wrappers to the first other program (a Python program that connects is itself that one)."""

Owner = Union[str, int, Identity]
"""Who owns a session being registered: ``AUTO``, a pid (sent as a pidfd where the kernel
allows), or an :class:`Identity` captured earlier."""


@dataclass(frozen=True)
class OwnerSpec:
    """An owner as the wire spells it: ``"auto"``, ``{"pid": N}``, ``{"pidfd": I}`` or an
    identity."""

    auto: bool = False
    pid: Optional[int] = None
    pidfd: Optional[int] = None
    identity: Optional[Identity] = None

    @classmethod
    def from_json(cls, value: Any) -> OwnerSpec:
        if value == "auto":
            return cls(auto=True)
        if isinstance(value, dict) and "start_ticks" in value:
            return cls(identity=Identity.from_json(value))
        if isinstance(value, dict) and set(value) in ({"pid"}, {"pidfd"}):
            return cls(**{k: decode(int, v, k) for k, v in value.items()})
        raise ValueError(f"{value!r} is no owner")

    def to_json(self) -> Any:
        if self.auto:
            return "auto"
        if self.identity is not None:
            return self.identity.to_json()
        return {"pid": self.pid} if self.pid is not None else {"pidfd": self.pidfd}


@dataclass(frozen=True)
class Request(Wire):
    """One request; which fields are set depends on ``op``. Refuses fields it does not know."""

    OMIT_DEFAULT = frozenset({"pending", "labels", "wrappers", "terminate", "wait"})
    STRICT = True

    op: str
    v: Optional[int] = None
    id: Any = None
    session: Optional[str] = None
    uid: Optional[int] = None
    owner: Optional[OwnerSpec] = None
    pending: bool = False
    labels: Dict[str, str] = field(default_factory=dict)
    on_end: Optional[str] = None
    grace_ms: Optional[int] = None
    until: Optional[str] = None
    wrappers: List[str] = field(default_factory=list)
    to: Optional[str] = None
    terminate: bool = False
    phase: Optional[str] = None
    limit: Optional[int] = None
    after: Optional[str] = None
    pid: Optional[int] = None
    since: Optional[int] = None
    store_id: Optional[str] = None
    name: Optional[str] = None
    wait: bool = False
    timeout_ms: Optional[int] = None
    on_end_run: Optional[List[ActionSpec]] = None
