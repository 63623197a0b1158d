"""The fixtures: every marked JSON block of docs/protocol.md, read from that file (see
clients/contract/scenarios.md), decoded into this client's types and encoded again."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Callable, Dict, List, Tuple

from conftest import REPO, same

import liveness
from liveness.types import Cause, Event, ExitStatus, Identity, Lock, Reply, Request, Session, Survivors, Usage, decode_message, encode_message

DOC = REPO / "docs/protocol.md"
MARKER = "<!-- contract: "


def fixtures() -> List[Tuple[int, str, str]]:
    """(line, kind, text) of every marked document; an unmarked json block fails."""
    lines = DOC.read_text().split("\n")
    out = []
    i = 0
    while i < len(lines):
        if lines[i] != "```json":
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marker = lines[i - 1]
        assert marker.startswith(MARKER) and marker.endswith(" -->"), f"{DOC}:{i + 1}: a json block without a marker"
        kind = marker[len(MARKER):-len(" -->")]
        if kind.endswith(" lines"):
            out += [(j + 1, kind[:-len(" lines")], lines[j]) for j in range(i + 1, end) if lines[j].strip()]
        else:
            out.append((i + 2, kind, "\n".join(lines[i + 1:end])))
        i = end + 1
    return out


def wire(value: Dict[str, Any]) -> Any:
    """A line as a client reads it: a request has "op", a reply "ok", else a stream message."""
    if "op" in value:
        return Request.from_json(value).to_json()
    if "ok" in value:
        return Reply.from_json(value).to_json()
    message = decode_message(value)
    assert message is not None, f"no stream message: {value}"
    return encode_message(message)


KINDS: Dict[str, Callable[[Any], Any]] = {
    "identity": lambda v: Identity.from_json(v).to_json(),
    "exit_status": lambda v: ExitStatus.from_json(v).to_json(),
    "cause": lambda v: Cause.from_json(v).to_json(),
    "usage": lambda v: Usage.from_json(v).to_json(),
    "session": lambda v: Session.from_json(v).to_json(),
    "event": lambda v: Event.from_json(v).to_json(),
    "lock": lambda v: Lock.from_json(v).to_json(),
    "survivors": lambda v: Survivors.from_json(v).to_json(),
    "wire": wire,
    "doctor": lambda v: v,  # the CLI's output, checked against the daemon's types in Rust
}


def test_every_fixture_decodes_and_says_the_same_again() -> None:
    all = fixtures()
    assert len(all) >= 40
    failures = []
    for line, kind, text in all:
        value = json.loads(text)
        try:
            problem = same(value, KINDS[kind](value))
        except (ValueError, KeyError, TypeError, AssertionError) as e:
            problem = f"{type(e).__name__}: {e}"
        if problem:
            failures.append(f"{DOC}:{line} ({kind}): {problem}")
    assert not failures, "\n".join(failures)
    assert Counter(kind for _, kind, _ in all)["wire"] > 30


def test_every_documented_error_code_has_its_class() -> None:
    lines = DOC.read_text().split("\n")
    start = lines.index(MARKER + "error_codes -->") + 1
    documented = []
    for row in lines[start:]:
        if not row.startswith("|"):
            break
        cell = row.split("|")[1].strip()
        if cell.startswith("`") and cell.endswith("`"):
            documented.append(cell.strip("`"))
    assert documented == list(liveness.BY_CODE) == list(liveness.types.ERROR_CODES)
    for code, cls in liveness.BY_CODE.items():
        assert issubclass(cls, liveness.DaemonError) and cls("m").code == code


def test_closed_kinds_refuse_what_they_do_not_know_and_open_ones_keep_it() -> None:
    for bad in ({"kind": "vanished"}, {"kind": "exited"}, {"kind": "signaled", "signal": 9}, "exited", None):
        try:
            ExitStatus.from_json(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was read as an exit status")
    newer = {"kind": "frozen", "reason": "a newer daemon's cause"}
    assert Cause.from_json(newer).to_json() == newer
    assert Cause.from_json({"kind": "exit", "code": 0}).to_json() == {"kind": "exit", "code": 0}
    session = Session.from_json(json.loads(next(text for _, kind, text in fixtures() if kind == "session")))
    for field, value in (("phase", "paused"), ("until", "forever"), ("on_end", "explode")):
        try:
            Session.from_json({**session.to_json(), field: value})
        except ValueError:
            continue
        raise AssertionError(f"{field}={value!r} was read")
    assert Session.from_json({**session.to_json(), "reason": "a_newer_reason"}).reason == "a_newer_reason"
