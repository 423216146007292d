"""Archiving: moving a prefix of the chain out of the database, as one transition.

Where the prefix may end (`plan_cut`): before the first event of any run that is not
settled (waiting, running, or with a proxied call whose outcome is not settled), no
later than the head the last signed checkpoint sealed, and never inside a run — a run is
archived whole or not at all (decision 0033), so the tables left behind always agree
with the events left behind.  `archive_prefix` deletes the prefix's events and its runs'
rows (steps, approvals, their model attempts and proxy index rows) in the transaction
that appends the `archived` event carrying the segment's signed manifest, so an archive
is either wholly done or not at all.  Writing the segment files is `retention/`'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..errors import StoreError
from ..sanitize import sanitize
from ._chain import GENESIS_HASH
from ._records import Connection, Event, RunStatus, _row_to_event
from ._store import Store
from .events import EventType, status_test

__all__ = [
    "ArchiveCut",
    "ArchiveRaced",
    "NothingToArchive",
    "archive_prefix",
    "archived_events",
    "chain_origin",
    "first_seq",
    "plan_cut",
    "raw_events",
    "shrink",
]

_TERMINAL: Final = [status for status in RunStatus if status.terminal]
# A run's first event, found through the events-by-run index.
_FIRST_EVENT: Final = "(SELECT MIN(seq) FROM events WHERE events.run_id = runs.run_id)"
_UNSETTLED_RUN: Final = f"SELECT MIN({_FIRST_EVENT}) FROM runs WHERE NOT " + status_test(_TERMINAL)
_UNSETTLED_CALL: Final = (
    f"SELECT MIN({_FIRST_EVENT}) FROM proxy_calls JOIN runs ON runs.run_id = proxy_calls.run_id"
    " WHERE proxy_calls.settled = 0 OR proxy_calls.unknown_outcome = 1"
    " OR proxy_calls.created_at >= ?"
)
_RAW_EVENTS: Final = (
    "SELECT seq, run_id, type, payload, created_at, prev_hash, hash FROM events"
    " WHERE seq >= ? AND seq <= ? ORDER BY seq"
)
_RUN_LAST_SEQ: Final = "SELECT MAX(seq) FROM events WHERE run_id = ?"


@dataclass(frozen=True, slots=True)
class NothingToArchive:
    """Why no prefix can be archived: `blocked` when old events are held back (by a run
    not settled, the unsigned tail, the proxy's index), not merely none old enough."""

    reason: str
    blocked: bool


class ArchiveRaced(StoreError):
    """The database moved under an archive (another archiver, a restore): nothing was done."""


@dataclass(frozen=True, slots=True)
class ArchiveCut:
    """A prefix of the chain that may be archived: events `first_seq`..`last_seq`, the hash
    `first` chains to, the last one's hash, and why it ends where it does."""

    first_seq: int
    last_seq: int
    prev_hash: str
    last_hash: str
    limited_by: str

    @property
    def count(self) -> int:
        return self.last_seq - self.first_seq + 1


def first_seq(store: Store) -> int:
    """The seq of the first event the database still holds (1 before any archive; the
    head + 1 of an empty chain)."""
    rows = store.query("SELECT MIN(seq), MAX(seq) FROM events")
    if rows[0][0] is None:
        return 1
    return int(rows[0][0])


def archived_events(store: Store) -> list[Event]:
    """The `archived` events the database still holds, oldest first."""
    rows = store.query("SELECT * FROM events WHERE run_id = '' AND type = 'archived' ORDER BY seq")
    return [_row_to_event(row) for row in rows]


def chain_origin(store: Store) -> tuple[int, str] | str:
    """Where the database's part of the chain begins: `(0, GENESIS_HASH)` before any
    archive, else the last archived event's seq and hash, as the last `archived` event's
    manifest records them and the database's first event chains to; or a sentence saying
    why the database's first event follows nothing it accounts for."""
    first = first_seq(store)
    if first == 1 or store.head_seq() < first:
        return 0, GENESIS_HASH
    recorded = archived_events(store)
    event = store.event_at(first)
    if recorded and event is not None:
        statement = recorded[-1].payload.get("statement", {})
        if statement.get("last_seq") == first - 1 and statement.get("last_hash") == (
            event.prev_hash
        ):
            return first - 1, event.prev_hash
    return (
        f"events 1..{first - 1} are missing from the database and no archived event accounts "
        "for them"
    )


def _created_at(store: Store, seq: int) -> str:
    event = store.event_at(seq)
    if event is None:
        raise StoreError(f"database {sanitize(store.path)} is missing event {seq}")
    return event.created_at


def plan_cut(
    store: Store, before: str, sealed_seq: int, index_since: float
) -> ArchiveCut | NothingToArchive:
    """The longest prefix of events all written before `before` (an ISO time, as the store
    writes them) that may be archived, ending no later than `sealed_seq` (the head the
    last signed checkpoint sealed) and before any proxied call the proxy's index may still
    read (unsettled, or made since `index_since`, epoch seconds: its repeat and hold
    windows); or a sentence saying why nothing can be.

    Reads what it archives and a handful of index lookups, not the history after it.
    """
    first = first_seq(store)
    head = store.head_seq()
    if head < first:
        return NothingToArchive("the database holds no events", blocked=False)
    # The events are appended in time order: the last one written before `before`, by
    # bisection on the primary key.
    low, high = first - 1, head
    while low < high:
        middle = (low + high + 1) // 2
        if _created_at(store, middle) < before:
            low = middle
        else:
            high = middle - 1
    cut, limited_by = low, f"the events written before {before}"
    if cut < first:
        return NothingToArchive(
            f"no event the database holds was written before {before}", blocked=False
        )
    if sealed_seq < cut:
        cut, limited_by = sealed_seq, f"the last signed checkpoint (event {sealed_seq})"
    for sql, parameters, what in _blockers(store, index_since):
        row = store.query(sql, parameters)[0][0]
        if row is not None and int(row) - 1 < cut:
            cut = int(row) - 1
            limited_by = f"{what} (its first event is {int(row)})"
    if cut < first:
        return NothingToArchive(f"nothing before {limited_by} can be archived", blocked=True)
    cut, limited_by = _whole_runs(store, first, cut, limited_by)
    if cut < first:
        return NothingToArchive(f"nothing before {limited_by} can be archived", blocked=True)
    first_event, last_event = store.event_at(first), store.event_at(cut)
    assert first_event is not None and last_event is not None
    return ArchiveCut(first, cut, first_event.prev_hash, last_event.hash, limited_by)


def _blockers(store: Store, index_since: float) -> list[tuple[str, tuple[Any, ...], str]]:
    blockers: list[tuple[str, tuple[Any, ...], str]] = [
        (_UNSETTLED_RUN, (), "a run that is not settled")
    ]
    if store.extension_version("proxy") > 0:
        blockers.append(
            (
                _UNSETTLED_CALL,
                (index_since,),
                "a proxied call the proxy's index may still read (unsettled, or inside "
                "--index-window)",
            )
        )
    return blockers


def _whole_runs(store: Store, first: int, cut: int, limited_by: str) -> tuple[int, str]:
    """Lower `cut` until no run has events on both sides of it."""
    first_of: dict[str, int] = {}
    for row in store.query(
        "SELECT run_id, MIN(seq) FROM events WHERE seq >= ? AND seq <= ? AND run_id <> ''"
        " GROUP BY run_id",
        (first, cut),
    ):
        first_of[str(row[0])] = int(row[1])
    last_of = {run_id: int(store.query(_RUN_LAST_SEQ, (run_id,))[0][0]) for run_id in first_of}
    while True:
        straddling = [
            first_of[run_id] for run_id in first_of if first_of[run_id] <= cut < last_of[run_id]
        ]
        if not straddling:
            return cut, limited_by
        cut = min(straddling) - 1
        limited_by = f"a run that goes on after the cut (its first event is {cut + 1})"


def raw_events(store: Store, first: int, last: int, batch: int = 5000) -> Iterator[dict[str, Any]]:
    """Events `first`..`last` as stored (the payload's text verbatim, so a segment's lines
    hash as the chain did), oldest first, read in batches."""
    start = first
    while start <= last:
        end = min(last, start + batch - 1)
        for row in store.query(_RAW_EVENTS, (start, end)):
            yield {
                "seq": int(row[0]),
                "run_id": str(row[1]),
                "type": str(row[2]),
                "payload": str(row[3]),
                "created_at": str(row[4]),
                "prev_hash": str(row[5]),
                "hash": str(row[6]),
            }
        start = end + 1


def archive_prefix(
    store: Store, connection: Connection, cut: ArchiveCut, manifest: Mapping[str, Any]
) -> Event:
    """Delete events `cut.first_seq`..`cut.last_seq` and the rows of the runs wholly inside
    them, and append the `archived` event carrying `manifest`, in the caller's write.

    Raises `ArchiveRaced` (and the caller's transaction rolls back, so nothing is done)
    unless the database still begins at `cut.first_seq` and holds `cut.last_hash` at
    `cut.last_seq`: a second archiver, or a database restored meanwhile, changes nothing.
    """
    row = connection.execute("SELECT MIN(seq) FROM events").fetchone()
    held = connection.execute("SELECT hash FROM events WHERE seq = ?", (cut.last_seq,)).fetchone()
    if row is None or row[0] != cut.first_seq or held is None or held[0] != cut.last_hash:
        raise ArchiveRaced(
            f"database {sanitize(store.path)} no longer begins with the events being archived "
            f"({cut.first_seq}..{cut.last_seq}): another archive ran, or it was restored; "
            "nothing was archived"
        )
    if cut.first_seq == 1 and cut.prev_hash != GENESIS_HASH:
        raise ArchiveRaced(f"database {sanitize(store.path)}: event 1 does not begin the chain")
    dependent = ["approvals", "steps"]
    if store.extension_version("models") > 0:
        dependent.append("model_attempts")
    if store.extension_version("proxy") > 0:
        dependent.append("proxy_calls")
    # The runs with events inside the prefix lie wholly inside it (`plan_cut`).
    inside = (
        "run_id IN (SELECT DISTINCT run_id FROM events"
        " WHERE seq >= ? AND seq <= ? AND run_id <> '')"
    )
    bounds = (cut.first_seq, cut.last_seq)
    for table in [*dependent, "runs"]:
        connection.execute(f"DELETE FROM {table} WHERE {inside}", bounds)
    postgres = store.backend == "postgresql"
    if postgres:
        # The events are append-only on PostgreSQL (a trigger); the owner lifts it for this
        # transaction alone (the lock ALTER TABLE takes keeps every other writer out).
        connection.execute("ALTER TABLE events DISABLE TRIGGER events_append_only")
    connection.execute(
        "DELETE FROM events WHERE seq >= ? AND seq <= ?", (cut.first_seq, cut.last_seq)
    )
    if postgres:
        connection.execute("ALTER TABLE events ENABLE TRIGGER events_append_only")
    return store.append_event(connection, "", EventType.ARCHIVED.value, manifest)


def shrink(store: Store) -> None:
    """Give the space archived events held back to the file system (SQLite: incremental
    vacuum; switched on, with one full VACUUM, the first time).  PostgreSQL's autovacuum
    reuses the space on its own."""
    if store.backend != "sqlite" or store.read_only:
        return
    mode = int(store.query("PRAGMA auto_vacuum")[0][0])
    if mode != 2:
        store.query("PRAGMA auto_vacuum = INCREMENTAL")
        store.query("VACUUM")
    store.query("PRAGMA incremental_vacuum")
