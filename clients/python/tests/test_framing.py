"""A line cut short by the end of its connection is a lost connection, not a line: the
daemon cuts one short when it gives up on a subscriber that stopped reading in its middle,
and the subscription resumes after the last whole event. A stand-in daemon on a socket
sends exactly those bytes."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional

from liveness import Subscription


def event(seq: int) -> Dict[str, Any]:
    owner = {"pid": 1, "start_ticks": 1, "boot_id": "b", "host": "h", "comm": "c"}
    return {"event": {"seq": seq, "kind": "session.ended", "at_ms": 0, "session": "s", "owner": owner, "creator_uid": 0}}


def test_a_line_cut_short_resumes_the_subscription(tmp_path: Path) -> None:
    path = str(tmp_path / "sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen()
    asked: List[Optional[int]] = []

    def serve() -> None:
        for lines, cut in [([event(1)], b'{"event":{"seq":2,'), ([event(2)], b"")]:
            conn, _ = listener.accept()
            with conn, conn.makefile("rb") as reader:
                since = json.loads(reader.readline()).get("since")
                asked.append(since)
                ack = {"ok": True, "subscribed": {"since": since or 0, "head": 0, "store_id": "st"}}
                conn.sendall(b"".join(json.dumps(line).encode() + b"\n" for line in [ack, *lines]) + cut)

    daemon = threading.Thread(target=serve)
    daemon.start()
    with Subscription(path) as subscription:
        events = subscription.events()
        got = [next(events).seq, next(events).seq]
    daemon.join()
    listener.close()
    assert got == [1, 2], "each event once, the line cut short dropped"
    assert asked == [None, 1], "resumed after the last whole event"
