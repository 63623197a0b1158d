"""A client of livenessd, the Linux exit-notification daemon.

Tell the daemon which process owns which session (:meth:`Client.register`), learn when it
dies (:class:`Subscription`, :func:`wait_for_end`), have commands run at its end
(``Client.register(on_end_run=...)``, :func:`wait_for_finalized`), hold locks released when
their session ends (:meth:`Client.acquire_lock`), and read or judge a process's fingerprint
without a daemon (:func:`capture`, :func:`check`). The protocol is docs/protocol.md; the standard
library is all it needs.
"""

from .client import PROTOCOL_VERSION, SYSTEM_SOCKET, Client, Registered, Whose, default_socket
from .errors import *  # noqa: F401,F403 (every error class, one per daemon code)
from .errors import BY_CODE, ConnectError, ConnectionLost, DaemonError, GaveUp, LivenessError, NoSuchProcess
from .proc import ALIVE, DEAD, EXITED, REBOOTED, REUSED, UNKNOWN, Liveness, capture, check
from .subscription import Cursor, Retry, Subscription, load_cursor, save_cursor, subscribe, wait_for_end, wait_for_finalized
from .types import (
    AUTO,
    LOCK_ACQUIRED,
    LOCK_RELEASED,
    SESSION_ACTION,
    SESSION_ENDED,
    SESSION_FINALIZED,
    SESSION_OWNER_CHANGED,
    SESSION_REAPED,
    SESSION_REGISTERED,
    SESSION_RENAMED,
    ActionOutcome,
    ActionSpec,
    ActionState,
    Cause,
    Event,
    ExitStatus,
    Gap,
    Goodbye,
    Identity,
    Lagged,
    Lock,
    Message,
    Process,
    Reset,
    Sender,
    Session,
    Survivors,
    Usage,
)

__all__ = [
    "AUTO", "ALIVE", "ActionOutcome", "ActionSpec", "ActionState", "BY_CODE", "Cause", "Client", "ConnectError", "ConnectionLost", "Cursor", "DEAD", "DaemonError",
    "EXITED", "Event", "ExitStatus", "GaveUp", "Gap", "Goodbye", "Identity", "LOCK_ACQUIRED", "LOCK_RELEASED",
    "Lagged", "LivenessError", "Liveness", "Lock", "Message", "NoSuchProcess", "PROTOCOL_VERSION", "Process",
    "REBOOTED", "REUSED", "Registered", "Reset", "Retry", "Sender", "SESSION_ACTION", "SESSION_ENDED", "SESSION_FINALIZED", "SESSION_OWNER_CHANGED",
    "SESSION_REAPED", "SESSION_REGISTERED", "SESSION_RENAMED", "SYSTEM_SOCKET", "Session", "Subscription",
    "Survivors", "UNKNOWN", "Usage", "Whose", "capture", "check", "default_socket", "load_cursor", "save_cursor",
    "subscribe", "wait_for_end", "wait_for_finalized",
] + [cls.__name__ for cls in BY_CODE.values()]
