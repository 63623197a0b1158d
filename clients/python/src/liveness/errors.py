"""Errors: the daemon's refusals, one class per code, and the client's own."""

from __future__ import annotations

from typing import Dict, Type


class LivenessError(Exception):
    """Every error of this package."""


class ConnectError(LivenessError):
    """The daemon's socket could not be reached."""

    def __init__(self, socket: str, reason: BaseException):
        super().__init__(
            f"cannot connect to livenessd at {socket}: {reason} (is the daemon running? set LIVENESS_SOCKET)"
        )
        self.socket = socket


class ConnectionLost(LivenessError):
    """The daemon closed the connection, or it broke (the daemon may be restarting)."""


class NoSuchProcess(LivenessError):
    """The process named does not exist (in this PID namespace), or has exited."""


class GaveUp(LivenessError):
    """A subscription could not reach the daemon again within its retry bound."""


class DaemonError(LivenessError):
    """The daemon refused a request: ``code`` for programs, ``message`` for people.

    Each code has its subclass (``NotFound``, ``LockHeld``, ...); a code this client does
    not know arrives as a plain ``DaemonError``.
    """

    code = ""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class InvalidJson(DaemonError):
    code = "invalid_json"


class InvalidRequest(DaemonError):
    code = "invalid_request"


class LineTooLong(DaemonError):
    code = "line_too_long"


class UnsupportedVersion(DaemonError):
    code = "unsupported_version"


class NotFound(DaemonError):
    code = "not_found"


class Forbidden(DaemonError):
    code = "forbidden"


class Ambiguous(DaemonError):
    code = "ambiguous"


class AlreadyEnded(DaemonError):
    code = "already_ended"


class AlreadyExists(DaemonError):
    code = "already_exists"


class NotPending(DaemonError):
    code = "not_pending"


class NoOwner(DaemonError):
    code = "no_owner"


class InvalidOwner(DaemonError):
    code = "invalid_owner"


class ShuttingDown(DaemonError):
    code = "shutting_down"


class TooManyConnections(DaemonError):
    code = "too_many_connections"


class LimitReached(DaemonError):
    code = "limit_reached"


class LockHeld(DaemonError):
    code = "lock_held"


class NotHeld(DaemonError):
    code = "not_held"


class Internal(DaemonError):
    code = "internal"


BY_CODE: Dict[str, Type[DaemonError]] = {cls.code: cls for cls in DaemonError.__subclasses__()}
"""Every code this client names, in the order of docs/protocol.md §4, and its class."""


def daemon_error(code: str, message: str) -> DaemonError:
    cls = BY_CODE.get(code)
    return cls(message) if cls else DaemonError(message, code)


def transient(error: BaseException) -> bool:
    """Whether a daemon that is restarting could explain ``error``."""
    return isinstance(error, (ConnectError, ConnectionLost, ShuttingDown, TooManyConnections))
