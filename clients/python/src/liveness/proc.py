"""A process's fingerprint from /proc, and the verdict on one, without a daemon: what
``liveness check`` does, read the same way (docs/protocol.md §2 "Identity")."""

from __future__ import annotations

import ctypes
import functools
import os
import select
import time
from dataclasses import dataclass
from typing import Optional

from .errors import LivenessError, NoSuchProcess
from .types import Identity

ALIVE, DEAD, UNKNOWN = "alive", "dead", "unknown"
"""The states of :func:`check`, as ``liveness check --json`` names them."""

EXITED, REUSED, REBOOTED = "exited", "owner_reused", "rebooted"
"""The reasons of a ``dead`` verdict."""

_PF_KTHREAD = 0x00200000
_PIDFS_MAGIC = 0x50494446  # pidfds live in pidfs from Linux 6.9, whose inodes name processes
_NANOS_PER_TICK = 10_000_000  # /proc start times count USER_HZ (100) ticks


@dataclass(frozen=True)
class Liveness:
    """The verdict of :func:`check`: ``state`` is ``alive``, ``dead`` or ``unknown``;
    ``reason`` says why a process is dead (``exited``, ``owner_reused``, ``rebooted``);
    ``detail`` says it in words, and why a verdict is unknown."""

    state: str
    reason: Optional[str] = None
    detail: str = ""


@dataclass(frozen=True)
class _Stat:
    comm: str
    state: str
    flags: int
    num_threads: int
    start_ticks: int

    def exited(self) -> bool:
        """A zombie or dying leader whose process counts no other thread."""
        return self.state in "ZX" and self.num_threads <= 1


def _parse_stat(data: bytes) -> _Stat:
    # The comm sits between the first '(' and the last ')': it may hold spaces and parens.
    open_, close = data.find(b"("), data.rfind(b")")
    if open_ < 0 or close < open_:
        raise ValueError("no (comm)")
    fields = data[close + 1:].split()  # proc(5) field n is fields[n - 3]
    if len(fields) < 20 or len(fields[0]) != 1:
        raise ValueError("too few fields")
    return _Stat(
        comm=data[open_ + 1:close].decode(errors="replace"),
        state=fields[0].decode(),
        flags=int(fields[9 - 3]),
        num_threads=int(fields[20 - 3]),
        start_ticks=int(fields[22 - 3]),
    )


def _read_stat(pid: int) -> _Stat:
    """``/proc/<pid>/stat``, its start time normalised to the initial time namespace."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        raise NoSuchProcess(f"no process {pid}") from None
    try:
        stat = _parse_stat(data)
    except ValueError as e:
        raise LivenessError(f"malformed /proc/{pid}/stat: {e}") from None
    return _Stat(stat.comm, stat.state, stat.flags, stat.num_threads, _normalize(stat.start_ticks))


def _read(path: str) -> str:
    with open(path) as f:
        text = f.read().strip()
    if not text:
        raise LivenessError(f"{path} is empty")
    return text


@functools.lru_cache(maxsize=None)
def _offset_nanos() -> int:
    """This reader's time namespace's boottime offset, which /proc adds to start times
    (unless this kernel shows them without it, as Linux 5.10 does)."""
    offset = 0
    try:
        with open("/proc/self/timens_offsets") as f:
            for line in f:
                words = line.split()
                if len(words) == 3 and words[0] == "boottime":
                    offset = int(words[1]) * 1_000_000_000 + int(words[2])
    except OSError:
        return 0
    return offset if offset and _start_times_include(offset) else 0


def _start_times_include(offset: int) -> bool:
    """Asks the kernel, not its version: a child forked now has a start time close to this
    namespace's CLOCK_BOOTTIME only when /proc adds the offset. Offsets under a second
    count as included: a probe cannot tell them from its own delay."""
    child = os.fork()
    if child == 0:
        os._exit(0)
    try:
        with open(f"/proc/{child}/stat", "rb") as f:
            started = _parse_stat(f.read()).start_ticks
        now = time.clock_gettime_ns(time.CLOCK_BOOTTIME) // _NANOS_PER_TICK
    except (OSError, ValueError):
        return True  # cannot tell: assume so, as the daemon does
    finally:
        os.waitpid(child, 0)
    return abs(now - started) < max(abs(offset // _NANOS_PER_TICK) // 2, 100)


def _normalize(ticks: int) -> int:
    return max(ticks - _offset_nanos() // _NANOS_PER_TICK, 0)


def _whole_ticks() -> bool:
    return _offset_nanos() % _NANOS_PER_TICK == 0


def _ambiguous() -> str:
    return (f"start times read in this time namespace are ambiguous by one tick (its boottime offset, "
            f"{_offset_nanos()} ns, is not a multiple of 10 ms) and this kernel has no pidfs inode to decide: "
            "capture identities outside this time namespace, or register the owner by pid")


class _Statfs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 120)]


@functools.lru_cache(maxsize=None)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _pidfs_ino(pidfd: int) -> Optional[int]:
    """The pidfs inode of a pidfd; ``None`` before Linux 6.9, where every pidfd is one
    anonymous inode."""
    buf = _Statfs()
    if _libc().fstatfs(pidfd, ctypes.byref(buf)) != 0 or buf.f_type != _PIDFS_MAGIC:
        return None
    return os.fstat(pidfd).st_ino


def _open_pidfd(pid: int) -> Optional[int]:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise NoSuchProcess(f"no process {pid}") from None
    except OSError:
        return None  # no pidfds here (before Linux 5.3, a seccomp filter)


def _pidfd_exited(pidfd: int) -> bool:
    """Whether the pidfd's process has exited (its pidfd is readable)."""
    poll = select.poll()
    poll.register(pidfd, select.POLLIN)
    return bool(poll.poll(0))


def capture(pid: int) -> Identity:
    """The identity of a running process: what ``liveness check --pid PID --json`` prints.

    A pidfd is held across the reads where the kernel allows, so the pid cannot change
    hands unseen, and its pidfs inode (Linux 6.9+) joins the fingerprint. A process that
    is gone, or a zombie, raises :class:`NoSuchProcess`.
    """
    if pid <= 0:
        raise NoSuchProcess(f"no process {pid}")
    pidfd = _open_pidfd(pid)
    try:
        stat = _read_stat(pid)
        if stat.exited():
            raise NoSuchProcess(f"no process {pid}: it is a zombie")
        if stat.flags & _PF_KTHREAD:
            raise LivenessError(f"PID {pid} ({stat.comm}) is a kernel thread, which never exits like a process")
        tgid = next(int(line.split()[1]) for line in _read(f"/proc/{pid}/status").splitlines()
                    if line.startswith("Tgid:"))
        if tgid != pid:
            raise LivenessError(f"{pid} is a thread of process {tgid}, not a process")
        ino = None
        if pidfd is not None:
            # Read after the stat: still running now, so the stat was this process's.
            if _pidfd_exited(pidfd):
                raise NoSuchProcess(f"no process {pid}: it exited while it was read")
            ino = _pidfs_ino(pidfd)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    if ino is None and not _whole_ticks():
        raise LivenessError(_ambiguous())
    return Identity(
        pid=pid, start_ticks=stat.start_ticks, boot_id=_read("/proc/sys/kernel/random/boot_id"),
        host=_read("/proc/sys/kernel/hostname"), pidfs_ino=ino, comm=stat.comm,
    )


def check(identity: Identity) -> Liveness:
    """Judges an identity against this machine, as ``liveness check --identity`` does.

    Dead needs proof: the pid is gone or a zombie, its start time or pidfs inode differs,
    or the boot is an earlier one of this host. A fact that cannot be read, or a boot of
    another machine, is unknown.
    """
    try:
        boot = _read("/proc/sys/kernel/random/boot_id")
        if boot == identity.boot_id:
            return _check_process(identity)
        host = _read("/proc/sys/kernel/hostname")
    except (OSError, LivenessError) as e:
        return Liveness(UNKNOWN, detail=str(e))
    if host == identity.host:
        return Liveness(DEAD, REBOOTED, "the machine rebooted since the identity was captured")
    return Liveness(UNKNOWN, detail=(
        f"the identity is of another boot on host {identity.host!r} (this is {host!r}): "
        "another machine, or this one before a reboot and a rename"))


def _check_process(identity: Identity) -> Liveness:
    reused = Liveness(DEAD, REUSED, "the PID now belongs to a different process")
    exited = Liveness(DEAD, EXITED, "the process exited")
    # Opened before the stat is read, for the same reason as in capture.
    held = None
    if identity.pidfs_ino is not None:
        try:
            held = _open_pidfd(identity.pid)
        except NoSuchProcess:
            return exited
    try:
        try:
            stat = _read_stat(identity.pid)
        except NoSuchProcess:
            return exited
        if stat.start_ticks != identity.start_ticks:
            # In a time namespace whose offset is not whole ticks, a reading may be one
            # tick off: then only the pidfs inode can decide.
            if _whole_ticks() or abs(stat.start_ticks - identity.start_ticks) > 1:
                return reused
            if held is None:
                return Liveness(UNKNOWN, detail=_ambiguous())
        if stat.exited():
            return exited
        if held is not None:
            now = _pidfs_ino(held)
            if now is not None and now != identity.pidfs_ino:
                return reused
        return Liveness(ALIVE, detail="the process is running")
    finally:
        if held is not None:
            os.close(held)
