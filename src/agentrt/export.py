"""The trail leaves the database: committed events after a persisted cursor, and their check.

A `Follower` reads the events of every run in `seq` order from a position
its caller moves only once the events are delivered; with a cursor file the
position survives the process.  `export_line` is the JSON line `agentrt
export` prints for an event, and `verify_lines` is what a consumer runs over
the lines it received: it recomputes every hash with the store's
`event_hash` envelope, so a line that was altered, dropped or reordered on
the way is found.

The guarantee, precisely: every committed event is delivered at least once,
in order.  The cursor is replaced (atomically, and durably) only after a
batch is delivered, so a stop through `stop()`, SIGINT, SIGTERM or a closed
stdout repeats nothing; a kill between delivering a batch and replacing the
cursor (SIGKILL, a power cut) delivers that one batch again on restart.  A
repeated line is byte-identical and carries the same `seq`, so a consumer
that keeps the last `seq` it stored and drops anything at or below it sees
every event exactly once.
"""

from __future__ import annotations

import os
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .canonical import JSONBoundaryError, canonical_json, parse_json
from .errors import AgentrtError
from .sanitize import sanitize
from .store import GENESIS_HASH, Event, Store, event_hash
from .trace import event_json

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_POLL_SECONDS",
    "Cursor",
    "CursorError",
    "ExportedChain",
    "Follower",
    "export_line",
    "read_cursor",
    "verify_lines",
    "write_cursor",
]

DEFAULT_BATCH: Final = 500
"""Events read, delivered and then committed to the cursor at a time (the most a kill repeats)."""
DEFAULT_POLL_SECONDS: Final = 0.5
"""How long `follow` sleeps between looks at a quiet database."""
_MAX_CURSOR_BYTES: Final = 4096


class CursorError(AgentrtError):
    """A cursor file that cannot be used (unsafe, unreadable, or not of this database)."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """The last event delivered: its `seq` and `hash` (the hash ties the cursor to one chain)."""

    seq: int
    hash: str


def read_cursor(path: str | os.PathLike[str]) -> Cursor | None:
    """The cursor stored at `path`, or None when there is no file yet.

    Whoever can write the cursor chooses what is skipped, so a link, a file
    of another user or one group or others can write is refused.
    """
    shown = sanitize(os.fspath(path))
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if Path(path).is_symlink():
            raise CursorError(f"cursor {shown} is a symbolic link; name the file itself") from None
        raise CursorError(f"cursor {shown} cannot be read: {sanitize(str(exc))}") from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise CursorError(f"cursor {shown} is not a regular file")
        if info.st_uid != os.geteuid():
            raise CursorError(f"cursor {shown} is owned by another user (uid {info.st_uid})")
        if stat.S_IMODE(info.st_mode) & (stat.S_IWGRP | stat.S_IWOTH):
            raise CursorError(
                f"cursor {shown} is writable by group or others; whoever writes it chooses "
                "what is skipped: chmod 600 it"
            )
        data = os.read(descriptor, _MAX_CURSOR_BYTES + 1)
    finally:
        os.close(descriptor)
    try:
        value = parse_json(data)
    except JSONBoundaryError as exc:
        raise CursorError(f"cursor {shown} is not JSON: {exc}") from None
    seq, digest = (value.get("seq"), value.get("hash")) if isinstance(value, dict) else (None, None)
    if (
        isinstance(seq, bool)
        or not isinstance(seq, int)
        or seq < 0
        or not isinstance(digest, str)
        or len(digest) != 64
    ):
        raise CursorError(f'cursor {shown} is not {{"seq": N, "hash": "<64 hex>"}}')
    return Cursor(seq, digest)


def write_cursor(path: str | os.PathLike[str], cursor: Cursor) -> None:
    """Replace the cursor file: owner-only, all or nothing, and on disk before this returns.

    The new text goes to a file beside it that is fsynced, renamed over the
    old one, and the directory fsynced, so after a crash the file holds the
    old cursor or the new one, never half of either.
    """
    target = Path(path)
    descriptor, temporary = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
    )
    try:
        try:
            os.fchmod(descriptor, 0o600)
            os.write(descriptor, canonical_json({"seq": cursor.seq, "hash": cursor.hash}).encode())
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(target.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def export_line(event: Event) -> str:
    """The JSON line `agentrt export` prints for `event` (printable ASCII, no newline)."""
    return event_json(event)


class Follower:
    """Committed events after a position, oldest first, for code that ships them elsewhere.

    `batches()` yields lists of events; the caller delivers each and then
    calls `advance(batch)`, which moves the position and, with a
    `cursor_path`, replaces the cursor file.  A batch not advanced past is
    yielded again by the next `Follower` on the same cursor (never twice by
    the same one).  The store is
    only read, so a follower can share a database with a running gate.
    """

    def __init__(
        self,
        store: Store,
        *,
        cursor_path: str | os.PathLike[str] | None = None,
        from_seq: int | None = None,
        batch: int = DEFAULT_BATCH,
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be at least 1")
        self.store = store
        self.cursor_path = Path(cursor_path) if cursor_path is not None else None
        self.batch = batch
        self._stop = threading.Event()
        saved = read_cursor(self.cursor_path) if self.cursor_path is not None else None
        if saved is not None and from_seq is not None:
            raise CursorError(
                f"cursor {sanitize(str(self.cursor_path))} already stands at event {saved.seq}; "
                "remove it to start from another event"
            )
        if saved is not None:
            self._check_belongs(saved)
            self.position = saved
        else:
            start = max(from_seq or 1, 1)
            before = store.event_at(start - 1) if start > 1 else None
            self.position = Cursor(start - 1, before.hash if before else GENESIS_HASH)

    def _check_belongs(self, saved: Cursor) -> None:
        if saved.seq == 0:
            return
        event = self.store.event_at(saved.seq)
        if event is None or event.hash != saved.hash:
            found = "no such event" if event is None else f"hash {event.hash[:16]}…"
            raise CursorError(
                f"cursor {sanitize(str(self.cursor_path))} names event {saved.seq} with hash "
                f"{saved.hash[:16]}…, but the database {sanitize(self.store.path)} has {found}; "
                "it is another database's cursor, or the chain was rewritten"
            )

    def pending(self) -> list[Event]:
        """The next batch after the position (empty when there is nothing new); moves nothing."""
        return self.store.events_after(self.position.seq, self.batch)

    def advance(self, delivered: Sequence[Event]) -> None:
        """Record that `delivered` (the batch just yielded, or its start) reached its consumer."""
        if not delivered:
            return
        last = delivered[-1]
        if last.seq <= self.position.seq:
            return
        cursor = Cursor(last.seq, last.hash)
        if self.cursor_path is not None:
            write_cursor(self.cursor_path, cursor)
        self.position = cursor

    def stop(self) -> None:
        """Ask `batches(follow=True)` to return at its next look (safe from any thread)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait_stopped(self, seconds: float) -> bool:
        """Wait up to `seconds` for `stop()`; whether it came (a pause that a stop cuts short)."""
        return self._stop.wait(seconds)

    def batches(
        self, *, follow: bool = False, poll_seconds: float = DEFAULT_POLL_SECONDS
    ) -> Iterator[list[Event]]:
        """Yield batches until the log is drained (or, with `follow`, until `stop()`).

        A quiet database is looked at every `poll_seconds` (one indexed
        query), never in a hot loop.
        """
        read_seq = self.position.seq
        while not self._stop.is_set():
            # Reading on from the last batch yielded, not from the position: a
            # caller that has not advanced yet is not shown the same batch twice.
            events = self.store.events_after(read_seq, self.batch)
            if events:
                yield events
                read_seq = events[-1].seq
                continue
            if not follow:
                return
            self._stop.wait(poll_seconds)


@dataclass(frozen=True, slots=True)
class ExportedChain:
    """What `verify_lines` found: `ok`, how many lines it checked, the head, the first break."""

    ok: bool
    checked: int
    head_seq: int
    head_hash: str
    first_bad_line: int | None
    reason: str


def _text_field(value: dict[str, object], name: str) -> str:
    field = value.get(name)
    if not isinstance(field, str):
        raise ValueError(f"its {name} is not a string")
    return field


def _line_hash(line: str) -> tuple[int, str, str]:
    """The line's seq, its prev_hash, and the hash recomputed from its fields; else ValueError."""
    value = parse_json(line)
    if not isinstance(value, dict):
        raise ValueError("it is not a JSON object")
    seq = value.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise ValueError("its seq is not an integer")
    if not isinstance(value.get("payload"), dict):
        raise ValueError("its payload is not an object")
    prev_hash = _text_field(value, "prev_hash")
    # The store hashes the payload as it stored it: the canonical JSON of the
    # object, which canonicalising the parsed object gives back exactly.
    recomputed = event_hash(
        prev_hash,
        seq,
        _text_field(value, "run_id"),
        _text_field(value, "type"),
        canonical_json(value["payload"]),
        _text_field(value, "created_at"),
    )
    if recomputed != _text_field(value, "hash"):
        raise _Altered(seq)
    return seq, prev_hash, recomputed


class _Altered(Exception):
    def __init__(self, seq: int) -> None:
        super().__init__(seq)
        self.seq = seq


def verify_lines(lines: Iterable[str], *, prev_hash: str | None = None) -> ExportedChain:
    """Check exported lines as their consumer would: consecutive seqs, each chained and rehashed.

    `prev_hash` is the hash the first line must chain to (the cursor's hash,
    or `GENESIS_HASH` for a trail starting at event 1); None trusts the first
    line's own `prev_hash` and checks everything after it.  Blank lines are
    skipped.
    """
    expected_prev = prev_hash
    expected_seq: int | None = None
    checked, head_seq, head_hash = 0, 0, prev_hash or ""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            seq, line_prev, digest = _line_hash(line)
        except _Altered as altered:
            reason = f"line {number} (event {altered.seq}) does not match its hash (it was changed)"
            return ExportedChain(False, checked, head_seq, head_hash, number, reason)
        except (ValueError, JSONBoundaryError) as exc:
            reason = f"line {number} is not an exported event: {sanitize(str(exc))}"
            return ExportedChain(False, checked, head_seq, head_hash, number, reason)
        if expected_seq is not None and seq != expected_seq:
            reason = f"line {number} is event {seq}, where event {expected_seq} was due"
            return ExportedChain(False, checked, head_seq, head_hash, number, reason)
        if expected_prev is not None and line_prev != expected_prev:
            reason = f"line {number} (event {seq}) does not chain to the event before it"
            return ExportedChain(False, checked, head_seq, head_hash, number, reason)
        checked += 1
        head_seq, head_hash = seq, digest
        expected_seq, expected_prev = seq + 1, digest
    return ExportedChain(True, checked, head_seq, head_hash, None, "intact")
