"""What Python adds to the generated protocol objects (``types_gen.py``): each class here
comes first among the bases of the generated class of its name."""

from __future__ import annotations

from typing import Optional, Protocol, Sequence

# The fields each method reads, as protocols: the generated classes have them, and this
# module, which they import, needs no import of theirs.


class _Identity(Protocol):
    @property
    def pid(self) -> int: ...
    @property
    def start_ticks(self) -> int: ...
    @property
    def boot_id(self) -> str: ...
    @property
    def pidfs_ino(self) -> Optional[int]: ...


class _ExitStatus(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def code(self) -> Optional[int]: ...
    @property
    def signal(self) -> Optional[int]: ...
    @property
    def core_dumped(self) -> Optional[bool]: ...


class _ActionOutcome(Protocol):
    @property
    def timed_out(self) -> bool: ...
    @property
    def exit(self) -> Optional[_ExitStatus]: ...


class _Session(Protocol):
    @property
    def phase(self) -> str: ...
    @property
    def on_end_run(self) -> Sequence[object]: ...
    @property
    def finalized_ms(self) -> Optional[int]: ...


class Identity:
    def same_process(self: _Identity, other: _Identity) -> bool:
        """Same boot, pid and start time, and the same pidfs inode where both know it."""
        return (
            (self.pid, self.start_ticks, self.boot_id) == (other.pid, other.start_ticks, other.boot_id)
            and (self.pidfs_ino is None or other.pidfs_ino is None or self.pidfs_ino == other.pidfs_ino)
        )


class ExitStatus:
    def __str__(self: _ExitStatus) -> str:
        if self.kind == "exited":
            return f"exited with code {self.code}"
        return f"killed by signal {self.signal}" + (" (core dumped)" if self.core_dumped else "")


class ActionOutcome:
    @property
    def succeeded(self: _ActionOutcome) -> bool:
        """It ran, in time, and exited with status 0."""
        return not self.timed_out and self.exit is not None and self.exit.kind == "exited" and self.exit.code == 0


class Session:
    @property
    def finalized(self: _Session) -> bool:
        """Ended, with each end action's outcome recorded (at once for one without any)."""
        return self.phase == "ended" and (not self.on_end_run or self.finalized_ms is not None)
