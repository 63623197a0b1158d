"""A connection to livenessd: one request, one reply, in order."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket as _socket
import threading
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence

from .errors import ConnectError, ConnectionLost, NoSuchProcess, daemon_error
from .types import (
    AUTO,
    ActionSpec,
    Identity,
    Lock,
    Owner,
    OwnerSpec,
    Process,
    Reply,
    Request,
    Session,
)

PROTOCOL_VERSION = 1
SYSTEM_SOCKET = "/run/liveness/liveness.sock"
"""Where the system daemon (the systemd unit, run as root) listens."""


def default_socket() -> str:
    """The socket a client talks to when none is named, by the liveness CLI's rules:
    ``$LIVENESS_SOCKET``; for root, the system socket; for another user, the user's own
    daemon's socket (``$XDG_RUNTIME_DIR/liveness.sock``, or ``liveness.sock`` in the user's
    state directory) if it exists, else the system socket."""
    env = os.environ.get
    if env("LIVENESS_SOCKET"):
        return env("LIVENESS_SOCKET", "")
    if os.getuid() == 0:
        return SYSTEM_SOCKET
    if env("XDG_RUNTIME_DIR"):
        own: Optional[str] = os.path.join(env("XDG_RUNTIME_DIR", ""), "liveness.sock")
    elif env("LIVENESS_STATE_DIR"):
        own = os.path.join(env("LIVENESS_STATE_DIR", ""), "liveness.sock")
    elif env("XDG_STATE_HOME"):
        own = os.path.join(env("XDG_STATE_HOME", ""), "liveness", "liveness.sock")
    elif env("HOME"):
        own = os.path.join(env("HOME", ""), ".local/state/liveness", "liveness.sock")
    else:
        own = None
    return own if own and os.path.exists(own) else SYSTEM_SOCKET


@dataclass(frozen=True)
class Registered:
    """The answer to :meth:`Client.register`."""

    session: Session
    warnings: List[str]
    """What succeeded but looks wrong (a launcher as owner, an owner already gone)."""


@dataclass(frozen=True)
class Whose:
    """The answer to :meth:`Client.whose`."""

    session: Session
    owner_pid: int
    """The owner's pid in the caller's PID namespace (0 when it is outside it)."""


def _pidfd(pid: int) -> Optional[int]:
    """A pidfd for ``pid``; ``None`` where pidfds do not apply (a kernel before 5.3, a
    seccomp filter, a thread id): the daemon is then given the number and says what is
    wrong with it."""
    if pid <= 0:
        raise NoSuchProcess(f"no process {pid}")
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise NoSuchProcess(f"no process {pid}: it has exited, or is not in this PID namespace") from None
    except OSError:
        return None


class Client:
    """A connection to livenessd; a context manager that closes it.

    Calls are served one at a time, in order (a lock guards the connection, so threads may
    share a client). A call that fails on the connection drops it; the next one connects
    again. ``timeout`` (seconds) bounds each call, except a waiting lock acquire.
    """

    def __init__(self, socket: Optional[str] = None, timeout: Optional[float] = None):
        self.socket = socket or default_socket()
        self.timeout = timeout
        self._lock = threading.Lock()
        self._sock: Optional[_socket.socket] = None
        self._reader: Any = None
        self._connect()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._reader.close()
            self._sock.close()
            self._sock = None

    def _connect(self) -> None:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket)
        except OSError as e:
            sock.close()
            raise ConnectError(self.socket, e) from None
        self._sock, self._reader = sock, sock.makefile("rb")

    def read_line(self) -> Dict[str, Any]:
        """The next line from the daemon, parsed."""
        try:
            line = self._reader.readline()
        except OSError as e:
            raise ConnectionLost(f"lost the connection to livenessd: {e}") from None
        if not line.endswith(b"\n"):  # nothing, or a line the connection's end cut short
            raise ConnectionLost("livenessd closed the connection")
        value = json.loads(line)
        if not isinstance(value, dict):
            raise ConnectionLost(f"unexpected line from livenessd: {line!r}")
        return value

    def call(self, request: Request, fds: Sequence[int] = ()) -> Reply:
        """Sends one request (with descriptors passed along, SCM_RIGHTS) and returns its
        reply; a refusal raises the :class:`~liveness.DaemonError` of its code."""
        with self._lock:
            if self._sock is None:
                self._connect()
            assert self._sock is not None
            line = json.dumps({**request.to_json(), "v": PROTOCOL_VERSION}).encode() + b"\n"
            try:
                try:
                    if fds:
                        _socket.send_fds(self._sock, [line], list(fds))
                    else:
                        self._sock.sendall(line)
                except OSError as e:
                    raise ConnectionLost(f"lost the connection to livenessd: {e}") from None
                value = self.read_line()
            except BaseException:
                self.close()
                raise
        if "ok" not in value:  # a goodbye: the daemon is stopping
            self.close()
            raise ConnectionLost("livenessd is stopping")
        reply = Reply.from_json(value)
        if not reply.ok:
            assert reply.error is not None
            raise daemon_error(reply.error.code, reply.error.message)
        return reply

    def _session(self, request: Request) -> Session:
        reply = self.call(request)
        assert reply.session is not None, f"the reply to {request.op} has no session"
        return reply.session

    def register(
        self,
        session: Optional[str] = None,
        owner: Owner = AUTO,
        *,
        pending: bool = False,
        labels: Optional[Dict[str, str]] = None,
        uid: Optional[int] = None,
        on_end: Optional[str] = None,
        grace_ms: Optional[int] = None,
        until: Optional[str] = None,
        wrappers: Sequence[str] = (),
        on_end_run: Optional[Sequence[ActionSpec]] = None,
    ) -> Registered:
        """Creates a session, or gives an active one a new owner (a new turn).

        ``owner`` is ``AUTO``, a pid (sent as a pidfd where the kernel allows, which names
        the process itself rather than a number that could be reused), or an
        :class:`Identity`. An owner that had already died ends the session at once: check
        ``session.phase``.

        ``on_end_run`` are commands the daemon runs, as the caller, once the session ends,
        however it ends (docs/end-actions.md). On an active session a list (empty too)
        replaces the one it had; None keeps it. ``until="tree"`` makes the session end at
        the last exit of its process tree rather than at its owner's.
        """
        pidfd = None
        if isinstance(owner, Identity):
            spec = OwnerSpec(identity=owner)
        elif owner == AUTO:
            spec = OwnerSpec(auto=True)
        elif isinstance(owner, int) and not isinstance(owner, bool):
            pidfd = _pidfd(owner)
            spec = OwnerSpec(pid=owner) if pidfd is None else OwnerSpec(pidfd=0)
        else:
            raise TypeError(f"{owner!r} is no owner: pass AUTO, a pid or an Identity")
        request = Request(
            op="register", session=session, uid=uid, owner=spec, pending=pending,
            labels=dict(labels or {}), on_end=on_end, grace_ms=grace_ms, until=until,
            wrappers=list(wrappers),
            on_end_run=None if on_end_run is None else list(on_end_run),
        )
        try:
            reply = self.call(request, [pidfd] if pidfd is not None else [])
        finally:
            if pidfd is not None:
                os.close(pidfd)
        assert reply.session is not None
        return Registered(reply.session, reply.warnings)

    def actions_done(self, session: str, *, uid: Optional[int] = None) -> Registered:
        """The session's end commands were run by the caller itself (an agent whose own end
        hook ran): each end action that has not started is recorded as skipped
        (``done_by_agent``) and never runs; those that had started run to their end, and
        ``warnings`` says so. The session comes back with ``actions`` set."""
        reply = self.call(Request(op="actions_done", session=session, uid=uid))
        assert reply.session is not None, "the reply to actions_done has no session"
        return Registered(reply.session, reply.warnings)

    def rename(self, session: str, to: str, *, uid: Optional[int] = None) -> Session:
        """Gives the pending session ``session`` its real id ``to``."""
        return self._session(Request(op="rename", session=session, to=to, uid=uid))

    def touch(
        self,
        session: str,
        *,
        uid: Optional[int] = None,
        turn: Optional[str] = None,
        tool: Optional[str] = None,
        tool_end: bool = False,
    ) -> Session:
        """Records activity: postpones the inactivity timeout of an owner of another host.

        ``turn`` (``"start"`` or ``"end"``), ``tool`` (a tool starts, by its name) and
        ``tool_end`` also declare the agent's phase, which the daemon judges a stall by
        (docs/activity.md)."""
        return self._session(
            Request(op="touch", session=session, uid=uid, turn=turn, tool=tool, tool_end=tool_end)
        )

    def end(self, session: str, *, uid: Optional[int] = None, terminate: bool = False) -> Session:
        """Ends a session now (reason ``stopped``); ``terminate`` also terminates its
        surviving processes, whatever its cleanup policy."""
        return self._session(Request(op="end", session=session, uid=uid, terminate=terminate))

    def get(self, session: str, *, uid: Optional[int] = None) -> Session:
        return self._session(Request(op="get", session=session, uid=uid))

    def _pages(self, request: Request) -> Iterator[Reply]:
        """The replies to ``request`` and to the same for each next page."""
        while True:
            reply = self.call(request)
            yield reply
            if reply.next is None:
                return
            request = dataclasses.replace(request, after=reply.next)

    def list(self, phase: Optional[str] = None) -> List[Session]:
        """Every session the caller may see (``"active"``, ``"ended"`` or both), oldest
        first, following the daemon's pages."""
        return [s for reply in self._pages(Request(op="list", phase=phase)) for s in reply.sessions or []]

    def whose(self, pid: int) -> Whose:
        """The active session that owns process ``pid`` (in the caller's PID namespace) or
        its nearest ancestor that owns one; :class:`NotFound` if none does."""
        reply = self.call(Request(op="whose", pid=pid))
        assert reply.session is not None
        owner_pid = reply.owner_pid if reply.owner_pid is not None else reply.session.owner.pid
        return Whose(reply.session, owner_pid)

    def processes(self, session: str, *, uid: Optional[int] = None) -> List[Process]:
        """The live processes of an active session's tree, the owner included, following
        the daemon's pages."""
        request = Request(op="processes", session=session, uid=uid)
        return [p for reply in self._pages(request) for p in reply.processes or []]

    def status(self) -> Dict[str, Any]:
        """What the daemon says about itself; informational, and its shape may grow."""
        return self.call(Request(op="status")).status or {}

    def acquire_lock(
        self, name: str, session: str, *, uid: Optional[int] = None,
        wait: bool = False, timeout: Optional[float] = None, cluster: bool = False,
    ) -> Lock:
        """Takes lock ``name`` for ``session`` and returns it with its fencing token. Held
        by another session: :class:`LockHeld` at once, or with ``wait`` after waiting in
        line until it is granted or ``timeout`` seconds pass. A waiting acquire has a
        connection of its own, so that other calls go on meanwhile. With ``cluster``, a
        fleet lock: one for every host whose daemon runs with ``--etcd`` (docs/fleet.md)."""
        timeout_ms = None if timeout is None else max(1, round(timeout * 1000))
        request = Request(
            op="lock_acquire", name=name, session=session, uid=uid, wait=wait, timeout_ms=timeout_ms, cluster=cluster
        )
        if not wait:
            reply = self.call(request)
        else:
            with Client(self.socket) as waiter:
                reply = waiter.call(request)
        assert reply.lock is not None
        return reply.lock

    def release_lock(self, name: str, session: str, *, uid: Optional[int] = None, cluster: bool = False) -> Lock:
        """Releases lock ``name``, which ``session`` holds; :class:`NotHeld` otherwise. With
        ``cluster``, the fleet lock of that name."""
        reply = self.call(Request(op="lock_release", name=name, session=session, uid=uid, cluster=cluster))
        assert reply.lock is not None
        return reply.lock

    def locks(self, *, uid: Optional[int] = None) -> List[Lock]:
        """The held locks the caller may see, by uid then name, following the daemon's pages."""
        return [lock for reply in self._pages(Request(op="lock_list", uid=uid)) for lock in reply.locks or []]

    @contextlib.contextmanager
    def lock(self, name: str, session: str, **acquire: Any) -> Iterator[Lock]:
        """Holds lock ``name`` for ``session`` within a ``with`` block (keywords as for
        :meth:`acquire_lock`); its session's end releases it as well."""
        held = self.acquire_lock(name, session, **acquire)
        try:
            yield held
        finally:
            self.release_lock(name, session, uid=acquire.get("uid"))
