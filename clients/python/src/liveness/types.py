"""The protocol's objects (docs/protocol.md §2, §5, §12, §14), as dataclasses: generated
into ``types_gen.py`` from the daemon's own types (``cargo xtask gen-clients``), with their
methods in ``_methods.py``; this module adds the stream lines, replies and requests as this
client reads and writes them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from ._codec import Wire, decode, encode
from .types_gen import *  # noqa: F401,F403 (every generated type and constant)
from .types_gen import ActionSpec, Event, FleetChange, FleetView, Gap, Goodbye, Identity, Lagged, Lock, Process, Session, Subscribed

DEFAULT_GRACE_MS = 10_000


@dataclass(frozen=True)
class Reset(Subscribed):
    """The cursor was of another database: every event of this one follows, from the
    first; the cursor starts over in ``store_id``."""


Message = Union[Event, Reset, Gap, Lagged, Goodbye, FleetChange]
"""A line of the event stream (``FleetChange``: of ``fleet_watch``)."""

_MESSAGES = {
    "event": Event,
    "reset": Reset,
    "gap": Gap,
    "lagged": Lagged,
    "goodbye": Goodbye,
    "fleet_change": FleetChange,
}


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
    fleet: Optional[FleetView] = None


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

    OMIT_DEFAULT = frozenset({"pending", "labels", "wrappers", "terminate", "wait", "tool_end", "cluster"})
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
    turn: Optional[str] = None
    tool: Optional[str] = None
    tool_end: bool = False
    cluster: bool = False
