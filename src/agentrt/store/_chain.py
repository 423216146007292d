"""The chain: each event's hash covers the previous event's hash and its own canonical
content, so `verify_chain` finds the first event that was altered, removed or inserted
after the fact; `verify_state` checks the tables against the events."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from ..canonical import canonical_json, json_string, parse_json, sha256_hex
from ..errors import StoreError
from ..sanitize import sanitize
from ._backend import ScopedBackend
from ._outbox import Outbox, enqueue
from ._records import ChainReport, Connection, Event, StateReport
from ._times import utc_now

GENESIS_HASH: Final = "0" * 64


def event_hash(
    prev_hash: str, seq: int, run_id: str, type_: str, payload_text: str, created_at: str
) -> str:
    """SHA-256 of the canonical envelope of one event, over its payload text as stored.

    The envelope is the canonical JSON of `{created_at, payload, prev_hash,
    run_id, seq, type}` with the stored payload text spliced in verbatim, so any
    change to the stored bytes (even whitespace) breaks the chain, and nothing
    is parsed or re-encoded to hash it.
    """
    before, between, after = envelope_parts(run_id, type_, payload_text, created_at)
    return sha256_hex((before + prev_hash + between + str(seq) + after).encode("utf-8"))


def envelope_parts(
    run_id: str, type_: str, payload_text: str, created_at: str
) -> tuple[str, str, str]:
    """The event's envelope (`event_hash`) around the two fields only the chain's head
    gives, its prev hash and its seq: `before + prev_hash + between + str(seq) + after`
    (a prev hash is hex, its JSON string the hex quoted).  PostgreSQL's scoped writes
    splice the head in on the server (decision 0065)."""
    before = (
        '{"created_at":' + json_string(created_at)
        + ',"payload":' + payload_text
        + ',"prev_hash":"'
    )  # fmt: skip
    between = '","run_id":' + json_string(run_id) + ',"seq":'
    return before, between, ',"type":' + json_string(type_) + "}"


class _LaterEvent(NamedTuple):
    """An event a scoped write made, written at the write's end (`Deferred`)."""

    run_id: str
    type_: str
    payload: dict[str, Any]
    payload_text: str


# What a scoped write leaves for its end, under the chain's lock (decision 0065): an
# event, or (a plain string) a run whose creation order is drawn there.
Deferred = _LaterEvent | str


class Tail:
    """A scoped write's tail (`_Chain._write_tail`): its events as the database appended
    them, read once answered (after the COMMIT, or before it with an outbox)."""

    __slots__ = ("_cursors", "_events", "_lock", "_made", "asked")

    def __init__(
        self,
        asked: float,
        lock: Any,
        made: list[tuple[_LaterEvent, str]],
        cursors: list[Any],
    ) -> None:
        self.asked = asked  # this host's clock when the chain's lock was asked for
        self._lock = lock
        self._made = made
        self._cursors = cursors
        self._events: list[Event] | None = None

    @property
    def answered(self) -> bool:
        """Whether its statements were answered before the COMMIT (with an outbox)."""
        return self._events is not None

    def events(self) -> list[Event]:
        """The events, with the seq, prev hash and hash the database gave each."""
        if self._events is None:
            self._events = []
            for (item, created), cursor in zip(self._made, self._cursors, strict=True):
                seq, prev_hash, digest = cursor.fetchone()
                self._events.append(Event(int(seq), item.run_id, item.type_, item.payload,
                                          created, str(prev_hash), str(digest)))  # fmt: skip
        return self._events

    def held_since(self) -> float:
        """The database server's time when the chain's lock was granted."""
        return float(self._lock.fetchone()[1])


class _Chain:
    """The store's part that extends and checks the chain (a mixin of `Store`)."""

    # The store's, set by `Store.__init__`.
    _connection: Connection
    _lock: threading.RLock
    _pending_events: list[Event]
    _head: tuple[int, str] | None
    _deferred: list[Deferred] | None
    outbox: Outbox | None

    @property
    def deferring(self) -> bool:
        """Whether the write in progress is scoped: its events (through `defer_event`)
        and its runs' creation order (`defer_run_order`) are written at its end."""
        return self._deferred is not None

    def defer_event(self, run_id: str, type_: str, payload: Mapping[str, Any]) -> None:
        """In a scoped write, the event `append_event` would append, written at the
        write's end in the order made (and its outbox announcement, if the store has an
        outbox).  Its time is taken then, under the chain's lock, so the chain stays in
        time order (the archive's cut bisects on it); its payload's canonical JSON now."""
        assert self._deferred is not None
        self._deferred.append(_LaterEvent(run_id, type_, dict(payload), canonical_json(payload)))

    def defer_run_order(self, run_id: str) -> None:
        """In a scoped write, the creation order of the run just inserted (its
        `created_seq` written 0 meanwhile, seen by no other transaction), drawn at the
        write's end."""
        assert self._deferred is not None
        self._deferred.append(run_id)

    def append_event(
        self, connection: Connection, run_id: str, type_: str, payload: Mapping[str, Any]
    ) -> Event:
        """Append one event to the chain; call inside `transaction()` or a `write` unit."""
        if self._deferred is not None:
            raise StoreError(
                "a scoped write appends its events through the ledger, at its end; "
                f"event {sanitize(type_)} was not written"
            )
        return self._append_now(
            connection, run_id, type_, payload, canonical_json(payload), utc_now()
        )

    def _write_tail(
        self, connection: Connection, scoped: ScopedBackend, deferred: list[Deferred]
    ) -> Tail:
        """At a scoped write's end: the chain's lock, the creation order of the runs it
        started, and its events after the chain's head, each stamped with its time now
        (so the chain stays in time order: the archive's cut bisects on it), all sent
        without waiting and answered with the COMMIT; with an outbox, answered first, so
        each event's announcement is written in the same transaction (`Tail.answered`
        says which: the COMMIT to send is then the ordinary one)."""
        lock = scoped.take_chain(connection)
        asked = time.time()
        events: list[tuple[_LaterEvent, str]] = []
        for item in deferred:
            if isinstance(item, str):
                scoped.draw_run_order(connection, item)
            else:
                events.append((item, utc_now()))
        rows = [
            (item.run_id, item.type_, item.payload_text, created,
             *envelope_parts(item.run_id, item.type_, item.payload_text, created))
            for item, created in events
        ]  # fmt: skip
        tail = Tail(asked, lock, events, scoped.append_at_head(connection, rows))
        outbox = self.outbox
        if outbox is not None:
            for event in tail.events():
                enqueue(outbox, connection, event)
        return tail

    def _append_now(
        self,
        connection: Connection,
        run_id: str,
        type_: str,
        payload: Mapping[str, Any],
        payload_text: str,
        created_at: str,
    ) -> Event:
        head = self._head
        if head is None:
            row = connection.execute(
                "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1"
            ).fetchone()
            head = (row[0], row[1]) if row else (0, GENESIS_HASH)
        seq, prev_hash = head[0] + 1, head[1]
        digest = event_hash(prev_hash, seq, run_id, type_, payload_text, created_at)
        connection.execute(
            "INSERT INTO events (seq, run_id, type, payload, created_at, prev_hash, hash)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (seq, run_id, type_, payload_text, created_at, prev_hash, digest),
        )
        event = Event(seq, run_id, type_, dict(payload), created_at, prev_hash, digest)
        self._pending_events.append(event)
        self._head = (seq, digest)
        return event

    def verify_chain(self, from_seq: int | None = None, to_seq: int | None = None) -> ChainReport:
        """Recompute the hash chain over [from_seq, to_seq] and report the first break.

        Without `from_seq`, from the chain's first event, or, after an archive
        (`store/archive.py`), from the database's first event, chained to the last
        archived event as the last `archived` event's manifest records it.
        """
        start = max(from_seq or 1, 1)
        origin = None
        if from_seq is None:
            from .archive import chain_origin  # (built on this module)

            found = chain_origin(self)  # type: ignore[arg-type]
            if not isinstance(found, str) and found[0] > 0:
                origin, start = found, found[0] + 1
        with self._lock:
            if origin is not None:
                prev_hash: str | None = origin[1]
            elif start > 1:
                previous = self._connection.execute(
                    "SELECT hash FROM events WHERE seq = ?", (start - 1,)
                ).fetchone()
                prev_hash = previous[0] if previous else None
            else:
                prev_hash = GENESIS_HASH
            # The upper bound only when there is one (an untyped NULL does not bind on
            # PostgreSQL's server).
            bounded = to_seq is not None
            cursor = self._connection.execute(
                "SELECT * FROM events WHERE seq >= ?"
                + (" AND seq <= ?" if bounded else "")
                + " ORDER BY seq",
                (start, to_seq) if bounded else (start,),
            )
            expected_seq = start
            head_seq, head_hash, checked = start - 1, prev_hash or "", 0
            for row in cursor:
                seq = row["seq"]
                if seq != expected_seq:
                    return ChainReport(
                        False, head_seq, head_hash, expected_seq,
                        f"event {expected_seq} is missing", checked,
                    )  # fmt: skip
                if prev_hash is not None and row["prev_hash"] != prev_hash:
                    return ChainReport(
                        False, head_seq, head_hash, seq,
                        f"event {seq} does not chain to event {seq - 1}", checked,
                    )  # fmt: skip
                payload_text = row["payload"]
                try:
                    if not isinstance(payload_text, str):
                        raise ValueError("not text")
                    parse_json(payload_text)
                except ValueError:
                    return ChainReport(
                        False, head_seq, head_hash, seq,
                        f"event {seq} has a payload that is not valid JSON", checked,
                    )  # fmt: skip
                digest = event_hash(
                    row["prev_hash"], seq, str(row["run_id"]), str(row["type"]), payload_text,
                    str(row["created_at"]),
                )  # fmt: skip
                if digest != row["hash"]:
                    return ChainReport(
                        False, head_seq, head_hash, seq,
                        f"event {seq} does not match its hash (its content was changed)", checked,
                    )  # fmt: skip
                prev_hash = row["hash"]
                head_seq, head_hash = seq, row["hash"]
                expected_seq += 1
                checked += 1
        return ChainReport(True, head_seq, head_hash, None, "intact", checked)

    def verify_state(self) -> StateReport:
        """Check the tables against the events: every run's and approval's status is
        the one its latest state event leaves, and every `run_resumed` on an
        approval follows that approval's `approval_granted`.

        The chain proves the events were not changed; this proves the rows the
        gate acts on were not changed behind them (an approval set to
        `approved` by hand, a cancelled run set back to running).
        """
        # The replay is the ledger's, driven by the table of transitions it writes by
        # (`events.TRANSITIONS`); imported here because the ledger is built on this module.
        from .ledger import verify_state

        with self._lock:
            return verify_state(self._connection)


def _disagreement(
    kind: str, key: str, status: str, derived: tuple[str, int, str] | None
) -> str | None:
    if derived is None:
        return f"{kind} {sanitize(key)} ({sanitize(str(status))}) has no event that created it"
    if derived[0] == status:
        return None
    return (
        f"{kind} {sanitize(key)} is {sanitize(str(status))} but its latest state event "
        f"(event {derived[1]}, {derived[2]}) leaves it {derived[0]}"
    )
