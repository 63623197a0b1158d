"""The real livenessd and liveness CLI, built by `cargo build -p liveness-daemon -p
liveness-cli`, for the scenarios of clients/contract/scenarios.md."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[3]


def binary(name: str) -> str:
    path = Path(os.environ.get("LIVENESS_BIN_DIR") or REPO / "target/debug") / name
    if not path.exists():
        pytest.fail(f"{path} is needed: run `cargo build -p liveness-daemon -p liveness-cli` (or set LIVENESS_BIN_DIR)")
    return str(path)


class Daemon:
    """A livenessd on a temporary socket and state directory."""

    def __init__(self, dir: Path, *args: str):
        self.dir, self.args = dir, args
        (dir / "run").mkdir()
        self.socket = str(dir / "run/liveness.sock")
        self.state = str(dir / "state")
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.start()

    def log(self) -> str:
        return (self.dir / "livenessd.log").read_text(errors="replace")

    def start(self) -> None:
        with open(self.dir / "livenessd.log", "ab") as log:
            self.process = subprocess.Popen(
                [binary("livenessd"), "--socket", self.socket, "--state-dir", self.state, *self.args],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                env={**os.environ, "LIVENESS_LOG": "info"},
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"livenessd exited during start:\n{self.log()}")
            with socket.socket(socket.AF_UNIX) as probe:
                if probe.connect_ex(self.socket) == 0:
                    return
            time.sleep(0.02)
        pytest.fail(f"livenessd did not listen within 20 s:\n{self.log()}")

    def _signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"livenessd did not stop within 30 s of {sig}:\n{self.log()}")
        self.process = None

    def stop(self) -> None:
        """A clean stop: SIGTERM, goodbye to every connection."""
        self._signal(signal.SIGTERM)

    def kill9(self) -> None:
        self._signal(signal.SIGKILL)

    def cli(self, *args: str) -> Any:
        """`liveness --socket S --json ARGS...`, its output parsed, whatever its exit code."""
        done = subprocess.run([binary("liveness"), "--socket", self.socket, "--json", *args],
                              capture_output=True, text=True)
        if not done.stdout.strip():
            pytest.fail(f"liveness {args} printed nothing: {done.stderr}")
        return json.loads(done.stdout)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path)
    yield d
    if d.process is not None:
        d.kill9()


class Children:
    """Processes of a test (sleep 300 by default), killed at its end."""

    def __init__(self) -> None:
        self.all: List[subprocess.Popen[bytes]] = []

    def spawn(self, *argv: str) -> subprocess.Popen[bytes]:
        child = subprocess.Popen(list(argv) or ["sleep", "300"])
        self.all.append(child)
        return child


def kill(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL, and reap."""
    child.kill()
    child.wait()


@pytest.fixture
def children() -> Iterator[Children]:
    c = Children()
    yield c
    for child in c.all:
        kill(child)


def require_ebpf() -> bool:
    return os.environ.get("LIVENESS_REQUIRE_EBPF") == "1"


# What the absence of a key means, for keys docs/protocol.md lets a writer leave out; null
# is the absence of every optional key.
DEFAULTS = {"comm": "", "on_end": "leave", "grace_ms": 10000, "labels": {}, "pending": False,
            "terminate": False, "wait": False, "waiters": 0, "warnings": [], "wrappers": []}


def same(written: Any, again: Any, path: str = "") -> Optional[str]:
    """How ``again`` (decoded and encoded by this client) differs from ``written``."""
    if isinstance(written, dict) and isinstance(again, dict):
        for key in sorted(set(written) | set(again)):
            if key in written and key in again:
                problem = same(written[key], again[key], f"{path}.{key}")
                if problem:
                    return problem
            else:
                value = written.get(key, again.get(key))
                if value is not None and DEFAULTS.get(key, object()) != value:
                    side = "lost when read" if key in written else "appears when written"
                    return f"{path}.{key} ({value!r}) is {side}"
        return None
    if isinstance(written, list) and isinstance(again, list) and len(written) == len(again):
        for i, (a, b) in enumerate(zip(written, again)):
            problem = same(a, b, f"{path}[{i}]")
            if problem:
                return problem
        return None
    if written != again or type(written) is not type(again):
        return f"{path} is {written!r} in the document, {again!r} read back"
    return None


def have(tool: str) -> str:
    path = shutil.which(tool)
    assert path, f"{tool} is needed"
    return path
