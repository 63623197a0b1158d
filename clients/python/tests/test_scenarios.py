"""The scenarios of clients/contract/scenarios.md, against the real daemon."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List

import pytest
from conftest import Children, Daemon, kill, require_ebpf, same

import liveness
from liveness import Client, Cursor, Event, Retry, Subscription


def until(events: Subscription, kind: str, session: str, seen: "List[int] | None" = None) -> Event:
    """Reads until an event of ``kind`` for ``session``, noting every seq delivered."""
    for message in events:
        if isinstance(message, Event):
            if seen is not None:
                seen.append(message.seq)
            if message.kind == kind and message.session == session:
                return message
    raise AssertionError("the subscription ended")


def test_owner_killed(daemon: Daemon, children: Children) -> None:
    with Subscription(daemon.socket) as events, Client(daemon.socket) as client:
        owner = children.spawn()
        registered = client.register("killed", owner.pid, labels={"tool": "python"}).session
        assert registered.phase == "active" and registered.owner.pid == owner.pid
        until(events, liveness.SESSION_REGISTERED, "killed")
        kill(owner)
        ended = until(events, liveness.SESSION_ENDED, "killed")
        assert ended.reason == "owner_exited" and ended.labels == {"tool": "python"}
        if require_ebpf() or ended.detected_by == "ebpf":
            assert ended.detected_by == "ebpf"
            assert ended.exit == liveness.ExitStatus("signaled", signal=9, core_dumped=False)
        session = client.get("killed")
        assert (session.reason, session.exit, session.detected_by) == (ended.reason, ended.exit, ended.detected_by)
        assert session.owner.same_process(ended.owner)
        assert same(daemon.cli("get", "--session", "killed"), session.to_json()) is None


def test_operations(daemon: Daemon, children: Children) -> None:
    owner = children.spawn()
    with Client(daemon.socket) as client:
        pending = client.register(owner=owner.pid, pending=True).session
        assert re.fullmatch(r"pending-[0-9a-f]{16}", pending.id) and pending.pending and pending.pending_expires_ms
        renamed = client.rename(pending.id, "conv-1")
        assert (renamed.id, renamed.pending, renamed.pending_expires_ms) == ("conv-1", False, None)
        assert client.touch("conv-1").id == "conv-1"
        declared = client.touch("conv-1", turn="start", tool="Bash").declared
        assert declared is not None and declared.tool == "Bash" and declared.turn_since_ms
        whose = client.whose(owner.pid)
        assert (whose.session.id, whose.owner_pid) == ("conv-1", owner.pid)
        processes = client.processes("conv-1")
        assert [(p.identity.pid, p.owner) for p in processes] == [(owner.pid, True)]
        client.register("plain", owner.pid)
        assert [s.id for s in client.list()] == ["conv-1", "plain"]
        ended = client.end("conv-1")
        assert (ended.phase, ended.reason) == ("ended", "stopped") and ended.ended_ms
        assert [s.id for s in client.list("active")] == ["plain"]
        refusals = [
            (lambda: client.end("conv-1"), liveness.AlreadyEnded),
            (lambda: client.get("nobody"), liveness.NotFound),
            (lambda: client.rename("plain", "other"), liveness.NotPending),
            (lambda: client.register("plain", owner.pid, on_end="terminate"), liveness.InvalidRequest),
        ]
        for call, error in refusals:
            with pytest.raises(error) as refused:
                call()
            assert refused.value.code == error.code and refused.value.message
        with pytest.raises(liveness.NoSuchProcess):
            client.register("gone", 1 << 30)
        assert client.status()["store_id"]


def test_restart_resume(daemon: Daemon, children: Children) -> None:
    seen: List[int] = []
    retry = Retry(first=0.05, max=0.5, give_up_after=60)
    with Subscription(daemon.socket, retry=retry) as events:
        def register(session: str) -> "subprocess.Popen[bytes]":
            owner = children.spawn()
            with Client(daemon.socket) as client:
                client.register(session, owner.pid)
            until(events, liveness.SESSION_REGISTERED, session, seen)
            return owner

        a = register("a")
        first = events.cursor
        assert first is not None
        b = register("b")

        daemon.stop()
        kill(a)
        daemon.start()
        assert until(events, liveness.SESSION_ENDED, "a", seen).detected_by == "reconcile"

        daemon.kill9()
        daemon.start()
        kill(b)
        until(events, liveness.SESSION_ENDED, "b", seen)

    assert seen == sorted(set(seen)), f"seqs out of order or twice: {seen}"
    replayed: List[int] = []
    with Subscription(daemon.socket, first) as replay:
        for event in replay.events():
            replayed.append(event.seq)
            if event.seq >= seen[-1]:
                break
    assert replayed == seen[1:]


def test_lagged(tmp_path: Path, children: Children) -> None:
    daemon = Daemon(tmp_path, "--subscriber-queue", "8")
    try:
        owner = liveness.capture(children.spawn().pid)
        sessions = [f"s{i:04}" for i in range(2000)]
        with Subscription(daemon.socket) as events, Client(daemon.socket) as client:
            # Far more events than the socket's buffers and the queue of 8 hold, while the
            # subscriber reads nothing: the daemon drops it with lagged.
            for session in sessions:
                client.register(session, owner)
            delivered, lagged = [], False
            for message in events:
                lagged |= isinstance(message, liveness.Lagged)
                if isinstance(message, Event):
                    delivered.append(message.session)
                    if len(delivered) == len(sessions):
                        break
        assert lagged, "the subscriber was never told it lagged: the test proves nothing"
        assert delivered == sessions, "missed or twice"
    finally:
        daemon.kill9()


def test_pages(daemon: Daemon, children: Children) -> None:
    owner = liveness.capture(children.spawn().pid)
    names = [f"s{i:04}" for i in range(1001)]  # the daemon's pages hold 1000
    with Client(daemon.socket) as client:
        for name in names:
            client.register(name, owner)
            client.acquire_lock(f"lock-{name}", name)
        assert [s.id for s in client.list()] == names
        assert [(lock.name, lock.session) for lock in client.locks()] == [(f"lock-{n}", n) for n in names]


def test_reset(daemon: Daemon, children: Children) -> None:
    owner = children.spawn()
    with Subscription(daemon.socket) as events:
        with Client(daemon.socket) as client:
            client.register("x", owner.pid)
        until(events, liveness.SESSION_REGISTERED, "x")
        assert events.cursor is not None
        store_a = events.cursor.store_id

        daemon.stop()
        shutil.rmtree(daemon.state)
        daemon.start()
        with Client(daemon.socket) as client:
            client.register("y", owner.pid)
        reset = None
        for message in events:
            if isinstance(message, liveness.Reset):
                reset = message
            elif isinstance(message, Event):
                assert reset is not None and reset.store_id != store_a, "a new store's event came without a reset"
                assert (message.seq, message.session) == (1, "y")
                break
        assert reset is not None and events.cursor == Cursor(1, reset.store_id)


def test_locks(daemon: Daemon, children: Children) -> None:
    owners = {s: children.spawn() for s in ("s1", "s2")}
    with Client(daemon.socket) as client:
        for session, owner in owners.items():
            client.register(session, owner.pid)
        first = client.acquire_lock("build", "s1")
        assert first.session == "s1" and first.token > 0
        assert client.acquire_lock("build", "s1").token == first.token
        with pytest.raises(liveness.InvalidRequest, match="--etcd"):
            client.acquire_lock("build", "s1", cluster=True)
        with pytest.raises(liveness.LockHeld):
            client.acquire_lock("build", "s2")
        start = time.monotonic()
        with pytest.raises(liveness.LockHeld):
            client.acquire_lock("build", "s2", wait=True, timeout=0.3)
        assert time.monotonic() - start >= 0.3

        granted: List[liveness.Lock] = []
        waiter = threading.Thread(target=lambda: granted.append(client.acquire_lock("build", "s2", wait=True)))
        waiter.start()
        while True:
            (held,) = client.locks()
            assert held.session == "s1"
            if held.waiters == 1:
                break
            time.sleep(0.01)
        kill(owners["s1"])
        waiter.join(30)
        (second,) = granted
        assert second.session == "s2" and second.token > first.token
        assert client.release_lock("build", "s2").token == second.token
        with pytest.raises(liveness.NotHeld):
            client.release_lock("build", "s2")
    daemon.stop()
    daemon.start()
    with Client(daemon.socket) as client:
        with client.lock("build", "s2") as after:
            assert after.token > second.token
        assert client.locks() == []


def test_wait(daemon: Daemon, children: Children) -> None:
    owner = children.spawn()
    with Client(daemon.socket) as client:
        client.register("w", owner.pid)
    threading.Timer(0.2, lambda: kill(owner)).start()
    ended = liveness.wait_for_end("w", socket=daemon.socket)
    assert (ended.phase, ended.reason) == ("ended", "owner_exited")


def test_end_actions(daemon: Daemon, children: Children, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    action = liveness.ActionSpec(
        ["sh", "-c", 'echo "$LIVENESS_SESSION" >>"$RAN"; echo failing >&2; exit 3'], env=[f"RAN={ran}"],
    )
    with Subscription(daemon.socket) as events, Client(daemon.socket) as client:
        owner = children.spawn()
        registered = client.register("acted", owner.pid, on_end_run=[action]).session
        assert registered.on_end_run == [action]
        finalized: List[liveness.Session] = []
        waiter = threading.Thread(target=lambda: finalized.append(liveness.wait_for_finalized("acted", socket=daemon.socket)))
        waiter.start()
        time.sleep(0.2)
        kill(owner)
        assert until(events, liveness.SESSION_ENDED, "acted").actions == 1
        event = until(events, liveness.SESSION_ACTION, "acted")
        until(events, liveness.SESSION_FINALIZED, "acted")
        waiter.join(30)
        (session,) = finalized
        assert session.finalized and session.finalized_ms is not None, session
        assert [a.state for a in session.actions] == ["done"]
        outcome = session.actions[0].outcome
        assert outcome is not None and event.action == outcome
        assert (outcome.exit, outcome.stderr_tail, outcome.succeeded) == (
            liveness.ExitStatus("exited", code=3), "failing\n", False)
        assert ran.read_text() == "acted\n", "the action ran once"
        assert same(daemon.cli("get", "--session", "acted"), session.to_json()) is None

        # An agent that ran its end commands itself: the daemon never runs them.
        skipped = tmp_path / "skipped"
        agent = children.spawn()
        client.register("agent-ran", agent.pid, on_end_run=[liveness.ActionSpec(["touch", str(skipped)])])
        done = client.actions_done("agent-ran").session
        assert done.actions[0].outcome is not None and done.actions[0].outcome.skipped == "done_by_agent"
        kill(agent)
        after = liveness.wait_for_finalized("agent-ran", socket=daemon.socket)
        assert after.finalized and after.actions[0].outcome is not None
        assert after.actions[0].outcome.skipped == "done_by_agent"
        assert not skipped.exists(), "the skipped action ran"
        with pytest.raises(liveness.NotFound):
            client.actions_done("nobody")


def test_check(daemon: Daemon, children: Children, tmp_path: Path) -> None:
    strange = tmp_path / "a) (b c"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", strange)
    process = children.spawn(str(strange), "300")
    identity = liveness.capture(process.pid)
    assert identity.comm == "a) (b c"
    assert same(daemon.cli("check", "--pid", str(process.pid)), identity.to_json()) is None

    def agree(what: str, identity: liveness.Identity, state: str, reason: "str | None") -> None:
        verdict = liveness.check(identity)
        cli = daemon.cli("check", "--identity", json.dumps(identity.to_json()))
        assert (verdict.state, verdict.reason) == (state, reason), what
        assert (cli["liveness"], cli.get("reason")) == (state, reason), what

    from dataclasses import replace
    agree("a live process", identity, liveness.ALIVE, None)
    agree("its pid with another start time", replace(identity, start_ticks=identity.start_ticks + 1, pidfs_ino=None),
          liveness.DEAD, liveness.REUSED)
    rebooted = replace(identity, boot_id="00000000-0000-0000-0000-000000000000")
    agree("an earlier boot of this host", rebooted, liveness.DEAD, liveness.REBOOTED)
    agree("a boot of another host", replace(rebooted, host="another-host.invalid"), liveness.UNKNOWN, None)
    kill(process)
    agree("the process killed and reaped", identity, liveness.DEAD, liveness.EXITED)
    with pytest.raises(liveness.NoSuchProcess):
        liveness.capture(process.pid)


def test_time_namespace(children: Children) -> None:
    process = children.spawn()
    outside = liveness.capture(process.pid)
    src = Path(liveness.__file__).parents[1]
    inside = subprocess.run(
        ["unshare", "--time", "--boottime", "1000", "--fork", sys.executable, "-c",
         f"import liveness; print(liveness.capture({process.pid}).start_ticks)"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(src)}, check=True,
    )
    assert int(inside.stdout) == outside.start_ticks, inside.stderr


def test_default_socket(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LIVENESS_SOCKET", "/somewhere/else.sock")
    assert liveness.default_socket() == "/somewhere/else.sock"
    monkeypatch.setenv("LIVENESS_SOCKET", "")
    if os.getuid() == 0:
        assert liveness.default_socket() == liveness.SYSTEM_SOCKET
        return
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert liveness.default_socket() == liveness.SYSTEM_SOCKET
    (tmp_path / "liveness.sock").touch()
    assert liveness.default_socket() == str(tmp_path / "liveness.sock")
