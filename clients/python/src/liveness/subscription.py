"""The event stream, followed across connections: the consumer's loop of
docs/protocol.md §6, built in."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, TypeVar

from .client import Client
from .errors import GaveUp, LivenessError, transient
from .types import SESSION_ENDED, SESSION_FINALIZED, Event, Gap, Goodbye, Lagged, Message, Request, Reset, Session, decode_message

T = TypeVar("T")


@dataclass(frozen=True)
class Cursor:
    """Where a consumer stands: the last event it handled, and the store (database) that
    seq belongs to (``None`` for a bare seq)."""

    seq: int
    store_id: Optional[str] = None

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """Reads ``SEQ STORE_ID``, or a bare ``SEQ`` (the format of ``liveness watch --cursor``)."""
        words = text.split()
        if not 1 <= len(words) <= 2 or not words[0].isdigit():
            raise ValueError(f"{text!r} is no cursor (want 'SEQ STORE_ID')")
        return cls(int(words[0]), words[1] if len(words) == 2 else None)

    def __str__(self) -> str:
        return f"{self.seq} {self.store_id}" if self.store_id else str(self.seq)


def load_cursor(path: str) -> Optional[Cursor]:
    """The cursor saved in ``path``; ``None`` when there is none yet (a first run)."""
    try:
        with open(path) as f:
            return Cursor.parse(f.read())
    except FileNotFoundError:
        return None


def save_cursor(path: str, cursor: Cursor) -> None:
    """Writes ``cursor`` to ``path`` atomically (a temporary file renamed over it)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{cursor}\n")
    os.replace(tmp, path)


@dataclass(frozen=True)
class Retry:
    """How a subscription reaches a daemon that went away: waits of ``first`` seconds,
    doubling up to ``max``, for up to ``give_up_after`` seconds (then :class:`GaveUp`).
    The default covers a daemon restarted by its service manager."""

    first: float = 0.1
    max: float = 2.0
    give_up_after: float = 30.0

    def run(self, attempt: Callable[[], T]) -> T:
        """``attempt()`` until it succeeds or fails for good."""
        start, delay = time.monotonic(), self.first
        while True:
            try:
                return attempt()
            except LivenessError as e:
                if not transient(e):
                    raise
                if time.monotonic() - start + delay > self.give_up_after:
                    raise GaveUp(f"livenessd did not come back within {self.give_up_after} s: {e}") from e
            time.sleep(delay)
            delay = min(delay * 2, self.max)


class Subscription:
    """The events after a cursor (from now on without one), delivered once each across
    daemon restarts; an iterator of :data:`~liveness.Message` and a context manager.

    When a connection ends (a ``goodbye``, a ``lagged``, a killed daemon) it subscribes
    again after the last delivered event, retrying as its :class:`Retry` says; the daemon
    replays what was committed meanwhile, and events at or before the cursor are dropped.
    It delivers, besides events, ``Reset`` (the cursor was of another database:
    resynchronize; every event of the new one follows), ``Gap`` (events were pruned before
    they were read: resynchronize), ``Lagged`` and ``Goodbye`` (it resumes by itself).
    Save :attr:`cursor` after handling each event to resume a later subscription.
    """

    def __init__(
        self,
        socket: Optional[str] = None,
        cursor: Optional[Cursor] = None,
        *,
        session: Optional[str] = None,
        uid: Optional[int] = None,
        retry: Retry = Retry(),
    ):
        self.socket, self.session, self.uid, self.retry = socket, session, uid, retry
        self._cursor = cursor
        self._client: Optional[Client] = None
        self._reconnect()

    @property
    def cursor(self) -> Optional[Cursor]:
        """The last delivered event and its store."""
        return self._cursor

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _subscribe(self) -> None:
        client = Client(self.socket)
        try:
            cursor = self._cursor
            reply = client.call(Request(
                op="subscribe", since=cursor.seq if cursor else None,
                store_id=cursor.store_id if cursor else None, session=self.session, uid=self.uid,
            ))
        except BaseException:
            client.close()
            raise
        assert reply.subscribed is not None
        if self._cursor is None:
            self._cursor = Cursor(reply.subscribed.since)
        # The store id names the daemon's current run: a cursor it kept is valid in it, and
        # a state restored from a copy made before this run voids it.
        self._cursor = Cursor(self._cursor.seq, reply.subscribed.store_id)
        self._client = client

    def _reconnect(self) -> None:
        self.retry.run(self._subscribe)

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        while True:
            if self._client is None:
                self._reconnect()
            assert self._client is not None and self._cursor is not None
            try:
                message = decode_message(self._client.read_line())
            except LivenessError as e:
                self.close()
                if transient(e):
                    continue  # a daemon killed without a goodbye: resume after the cursor
                raise
            if isinstance(message, Event):
                if message.seq <= self._cursor.seq:
                    continue  # delivered before this connection
                self._cursor = Cursor(message.seq, self._cursor.store_id)
            elif isinstance(message, Reset):
                self._cursor = Cursor(0, message.store_id)
            elif isinstance(message, Gap):
                self._cursor = Cursor(max(self._cursor.seq, message.pruned_through), self._cursor.store_id)
            elif isinstance(message, (Lagged, Goodbye)):
                self.close()  # the daemon closes the stream; the next read resumes
            else:
                continue  # a line of a newer protocol
            return message

    def events(self) -> Iterator[Event]:
        """The events alone (the other messages are followed, not delivered)."""
        for message in self:
            if isinstance(message, Event):
                yield message


def subscribe(
    cursor: Optional[Cursor] = None, *, socket: Optional[str] = None,
    session: Optional[str] = None, uid: Optional[int] = None,
) -> Subscription:
    """A :class:`Subscription` to the daemon at ``socket`` (the default socket if none)."""
    return Subscription(socket, cursor, session=session, uid=uid)


def wait_for_end(session: str, *, socket: Optional[str] = None, uid: Optional[int] = None) -> Session:
    """Blocks until ``session`` has ended and returns it ended, across daemon restarts. It
    subscribes first and then looks the session up, so an end in between is still seen."""
    return _wait_for(session, socket, uid, lambda s: s.phase == "ended", lambda e: e.kind == SESSION_ENDED)


def wait_for_finalized(session: str, *, socket: Optional[str] = None, uid: Optional[int] = None) -> Session:
    """Blocks until ``session`` has ended and each of its end actions has its outcome (at
    once after the end for a session without end actions), and returns it with its
    ``actions``, across daemon restarts."""
    return _wait_for(
        session, socket, uid, lambda s: s.finalized,
        lambda e: e.kind == SESSION_FINALIZED or (e.kind == SESSION_ENDED and e.actions == 0),
    )


def _wait_for(
    session: str, socket: Optional[str], uid: Optional[int],
    done: Callable[[Session], bool], last: Callable[[Event], bool],
) -> Session:
    """Subscribes to ``session``'s events, then gets it: until it is ``done``, the first
    event that is ``last`` makes it get the session again."""
    with Subscription(socket, session=session, uid=uid) as events:
        def get(id: str, uid: Optional[int]) -> Session:
            def attempt() -> Session:
                with Client(events.socket) as client:
                    return client.get(id, uid=uid)
            return events.retry.run(attempt)

        current = get(session, uid)
        if done(current):
            return current
        for event in events.events():
            if last(event):
                return get(event.session, event.creator_uid)
    raise AssertionError("a subscription never ends by itself")
