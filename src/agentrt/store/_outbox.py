"""The notification outbox: an extension table written in the transaction of the event it
announces, and read by whichever process delivers it.

A store announces nothing until `enable_outbox` gives it a route (the proxy does, when
its configuration has `"notify"`): from then on the ledger, appending an event, asks
the route which targets want it and writes one row per target in the same
transaction (`enqueue`).  The event and the promise to announce it are then one fact:
a process killed after the commit leaves the row, which the next one delivers.  A
store without a route writes nothing more than it always did.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ._records import Connection, Event

if TYPE_CHECKING:
    from ._store import Store

__all__ = [
    "MIGRATIONS",
    "Outbox",
    "OutboxRow",
    "claim_due",
    "enable_outbox",
    "enqueue",
    "mark_delivered",
    "mark_failed",
    "mark_undelivered",
    "outbox_rows",
    "sweep",
]

MIGRATIONS: Final[Sequence[str]] = (
    """
    CREATE TABLE notify_outbox (
        event_seq INTEGER NOT NULL,
        target TEXT NOT NULL,
        topic TEXT NOT NULL,
        run_id TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        next_attempt_at REAL NOT NULL,
        claimed_until REAL,
        last_error TEXT NOT NULL DEFAULT '',
        delivered_at REAL,
        PRIMARY KEY (event_seq, target)
    );
    CREATE INDEX notify_outbox_due ON notify_outbox (next_attempt_at)
        WHERE state = 'pending';
    CREATE TABLE notify_cursor (name TEXT PRIMARY KEY, seq INTEGER NOT NULL)
    """,
)

Route = Callable[[str, Mapping[str, Any]], Sequence[tuple[str, str]]]
"""(event type, payload) → the (target, topic) pairs that announce it."""


@dataclass(frozen=True, slots=True)
class Outbox:
    """Which events a store announces (`route`), to which targets (`targets`: the ones
    this process delivers to; the route names no other)."""

    route: Route
    clock: Callable[[], float]
    targets: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One announcement of one event to one target, as the outbox holds it."""

    event_seq: int
    target: str
    topic: str
    run_id: str
    state: str
    attempts: int
    created_at: float
    next_attempt_at: float
    last_error: str
    delivered_at: float | None


_COLUMNS: Final = (
    "event_seq, target, topic, run_id, state, attempts, created_at, next_attempt_at,"
    " last_error, delivered_at"
)


def _row(row: Sequence[Any]) -> OutboxRow:
    return OutboxRow(
        int(row[0]), str(row[1]), str(row[2]), str(row[3]), str(row[4]), int(row[5]),
        float(row[6]), float(row[7]), str(row[8]), None if row[9] is None else float(row[9]),
    )  # fmt: skip


_ENQUEUE: Final = (
    "INSERT INTO notify_outbox (event_seq, target, topic, run_id, state, created_at,"
    " next_attempt_at) VALUES (?, ?, ?, ?, 'pending', ?, ?)"
    " ON CONFLICT (event_seq, target) DO NOTHING"
)


def enable_outbox(
    store: Store, route: Route, clock: Callable[[], float], targets: Sequence[str]
) -> None:
    """Create the outbox's tables (once) and announce, from now on, what `route` names.

    Each target's sweep cursor starts at the chain's head the first time that target
    is configured: what happened before is not announced to it.
    """
    store.migrate_extension("notify", MIGRATIONS)
    with store.transaction() as connection:
        for target in targets:
            connection.execute(
                "INSERT INTO notify_cursor (name, seq)"
                # (WHERE true: SQLite reads ON CONFLICT after a bare SELECT as a join.)
                " SELECT ?, COALESCE(MAX(seq), 0) FROM events WHERE true"
                " ON CONFLICT (name) DO NOTHING",
                (target,),
            )
    store.outbox = Outbox(route, clock, tuple(targets))


def _enqueue(
    outbox: Outbox,
    connection: Connection,
    seq: int,
    run_id: str,
    type_: str,
    payload: Any,
    wanted: Callable[[str], bool] | None = None,
) -> None:
    pairs = outbox.route(type_, payload)
    if not pairs:
        return
    now = outbox.clock()
    for target, topic in pairs:
        if wanted is None or wanted(target):
            connection.execute(_ENQUEUE, (seq, target, topic, run_id, now, now))


def enqueue(outbox: Outbox, connection: Connection, event: Event) -> None:
    """Inside the event's transaction: one pending row per target that wants `event`."""
    _enqueue(outbox, connection, event.seq, event.run_id, event.type, event.payload)


def _cursors(rows: Sequence[Any], targets: Sequence[str]) -> dict[str, int]:
    found = {str(name): int(seq) for name, seq in rows}
    return {target: found.get(target, 0) for target in targets}


def sweep(store: Store, outbox: Outbox, limit: int = 500) -> int:
    """Rows for the events after each target's cursor that have none (written by a
    process that knows no route), and the cursors moved past them, in one transaction;
    how many events were read.  A read first: most polls find no new event and write
    nothing.  A cursor per target: proxies with other targets sweep for their own."""
    if not outbox.targets:
        return 0
    marks = ", ".join("?" for _ in outbox.targets)
    cursor_sql = f"SELECT name, seq FROM notify_cursor WHERE name IN ({marks})"
    cursors = _cursors(store._query(cursor_sql, outbox.targets), outbox.targets)
    after = min(cursors.values())
    if not store._query("SELECT seq FROM events WHERE seq > ? LIMIT 1", (after,)):
        return 0
    with store.transaction() as connection:
        cursors = _cursors(connection.execute(cursor_sql, outbox.targets).fetchall(),
                           outbox.targets)  # fmt: skip
        after = min(cursors.values())
        events = connection.execute(
            "SELECT seq, run_id, type, payload FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (after, limit),
        ).fetchall()
        for seq, run_id, type_, payload in events:
            position = int(seq)

            def behind(target: str, position: int = position) -> bool:
                return cursors.get(target, position) < position

            _enqueue(outbox, connection, position, str(run_id), str(type_),
                     json.loads(payload), behind)  # fmt: skip
        if events:
            last = int(events[-1][0])
            for target, position in cursors.items():
                if position < last:
                    connection.execute(
                        "UPDATE notify_cursor SET seq = ? WHERE name = ?", (last, target)
                    )
    return len(events)


def claim_due(
    store: Store, targets: Sequence[str], now: float, limit: int, lease: float
) -> list[OutboxRow]:
    """Rows for `targets` due for an attempt, claimed for `lease` seconds (another
    process skips them).  A read first: most polls find nothing due and write nothing.
    """
    if not targets:
        return []
    marks = ", ".join("?" for _ in targets)
    due_sql = (
        f"SELECT {_COLUMNS} FROM notify_outbox WHERE state = 'pending'"
        " AND next_attempt_at <= ? AND (claimed_until IS NULL OR claimed_until <= ?)"
        f" AND target IN ({marks}) ORDER BY event_seq LIMIT ?"
    )
    parameters = (now, now, *targets, limit)
    if not store._query(due_sql, parameters):
        return []
    claimed: list[OutboxRow] = []
    with store.transaction() as connection:
        for raw in connection.execute(due_sql, parameters).fetchall():
            row = _row(raw)
            cursor = connection.execute(
                "UPDATE notify_outbox SET claimed_until = ? WHERE event_seq = ? AND target = ?"
                " AND state = 'pending' AND (claimed_until IS NULL OR claimed_until <= ?)",
                (now + lease, row.event_seq, row.target, now),
            )
            if cursor.rowcount == 1:
                claimed.append(row)
    return claimed


def mark_delivered(store: Store, row: OutboxRow, now: float) -> None:
    with store.transaction() as connection:
        connection.execute(
            "UPDATE notify_outbox SET state = 'delivered', delivered_at = ?,"
            " attempts = attempts + 1, claimed_until = NULL, last_error = ''"
            " WHERE event_seq = ? AND target = ? AND state = 'pending'",
            (now, row.event_seq, row.target),
        )


def mark_failed(store: Store, row: OutboxRow, error: str, next_attempt_at: float) -> None:
    with store.transaction() as connection:
        connection.execute(
            "UPDATE notify_outbox SET attempts = attempts + 1, next_attempt_at = ?,"
            " claimed_until = NULL, last_error = ?"
            " WHERE event_seq = ? AND target = ? AND state = 'pending'",
            (next_attempt_at, error, row.event_seq, row.target),
        )


def mark_undelivered(store: Store, row: OutboxRow, error: str) -> None:
    """Given up: the row stays, `undelivered`, with the last error."""
    with store.transaction() as connection:
        connection.execute(
            "UPDATE notify_outbox SET state = 'undelivered', attempts = attempts + 1,"
            " claimed_until = NULL, last_error = ?"
            " WHERE event_seq = ? AND target = ? AND state = 'pending'",
            (error, row.event_seq, row.target),
        )


def outbox_rows(store: Store, limit: int = 1000) -> list[OutboxRow]:
    """The outbox's rows in event order (for `agentrt`'s operators and the tests)."""
    return [
        _row(raw)
        for raw in store._query(
            f"SELECT {_COLUMNS} FROM notify_outbox ORDER BY event_seq, target LIMIT ?", (limit,)
        )
    ]
