"""The README's consumer (examples/consumer.py), run as its own program."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import Children, Daemon, kill

import liveness

HERE = Path(__file__).resolve().parents[1]
EXAMPLE = HERE / "examples/consumer.py"


class Consumer:
    def __init__(self, socket: str, cursor: Path):
        env = {**os.environ, "LIVENESS_SOCKET": socket, "PYTHONPATH": str(HERE / "src")}
        self.process = subprocess.Popen([sys.executable, str(EXAMPLE), str(cursor)], stdout=subprocess.PIPE,
                                        text=True, env=env)
        self.lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def expect(self, line: str) -> None:
        assert self.lines.get(timeout=30) == line

    def quiet(self) -> None:
        """Nothing more is printed within a moment: nothing twice."""
        try:
            extra = self.lines.get(timeout=0.5)
        except queue.Empty:
            return
        raise AssertionError(f"the consumer printed {extra!r} again")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()


def saved(cursor: Path, socket: str) -> None:
    """The consumer handles an event, then saves its cursor: wait for the save of the
    daemon's last event before stopping it, or that event is handled again (at least once)."""
    with liveness.Client(socket) as client:
        head = client.status()["head_seq"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        current = liveness.load_cursor(str(cursor))
        if current is not None and current.seq == head:
            return
        time.sleep(0.02)
    raise AssertionError(f"the consumer did not save seq {head}")


def started(cursor: Path) -> None:
    """A first run saves where it started, once subscribed."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if liveness.load_cursor(str(cursor)) is not None:
            return
        time.sleep(0.02)
    raise AssertionError("the consumer saved no cursor when it started")


def test_consumer_resumes_across_restarts(daemon: Daemon, children: Children, tmp_path: Path) -> None:
    def register(session: str) -> "subprocess.Popen[bytes]":
        owner = children.spawn()
        with liveness.Client(daemon.socket) as client:
            client.register(session, owner.pid)
        return owner

    cursor = tmp_path / "cursor"
    consumer = Consumer(daemon.socket, cursor)
    try:
        # Stopped before its first end, a run is followed by one that handles the ends in
        # between.
        started(cursor)
        consumer.stop()
        kill(register("early"))
        consumer = Consumer(daemon.socket, cursor)
        consumer.expect("early owner_exited")

        a, b = register("a"), register("b")
        kill(a)
        consumer.expect("a owner_exited")

        daemon.stop()
        kill(b)
        daemon.start()
        consumer.expect("b owner_exited")

        saved(cursor, daemon.socket)
        consumer.stop()
        kill(register("c"))
        consumer = Consumer(daemon.socket, cursor)
        consumer.expect("c owner_exited")
        consumer.quiet()
    finally:
        consumer.stop()


def test_the_readme_shows_this_program() -> None:
    code = EXAMPLE.read_text().split('"""\n\n', 1)[1]
    assert code in (HERE / "README.md").read_text()
