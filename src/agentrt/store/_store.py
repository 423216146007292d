"""The store: runs, steps, approvals and a hash-chained event log, in SQLite.

(Or in PostgreSQL, for a `postgresql://` URL: the same SQL through an adapter
with the same connection surface, `_postgres.py`; decision 0015.  What
follows describes SQLite; the PostgreSQL differences are in that module.)

Tables are the state; events are the explanation.  Every state change is
written in the same transaction as its event, and each event's hash covers the
previous event's hash and its own canonical content, so `verify_chain` finds
the first event that was altered, removed or inserted after the fact.

The database is the operator's: whoever can write it can forge an approval.
So a new file is created owner-only (0600, whatever the umask), a file that
group or others can write is refused, a symbolic link is refused, and a
database from a newer build is refused rather than misread.

A database that is not ours, or lost what it held, is refused too: an
existing file is opened only if it already holds the agentrt schema (never
initialised in place), holds no trigger or view, and passes SQLite's quick
check; and a **head anchor** beside it (`<db>.anchor`: the last committed
event's seq and hash) refuses a database whose chain is behind it — a WAL
deleted after a crash, an old copy restored, a truncated file.  (On
PostgreSQL each host keeps its own anchor for the database, in its state
directory: `postgres_anchor_path`.)

Store work is synchronous, on one connection under the store's lock; async
code runs it off the event loop with `Store.run` (a worker thread) and
`Store.write` (the store's one writer thread), so neither an fsync nor a busy
wait ever stalls the loop.  The writer **commits in groups**: the `write`
units of concurrent callers share one SQLite transaction, each in its own
savepoint (a failing unit rolls back only itself), and every caller is
answered only after that transaction's COMMIT returned and the anchor was
written — so nothing a caller is told is ahead of the disk.  A busy database
is waited on in short steps until a deadline (`StoreBusy`), never for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import json
import os
import queue
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

import anyio.to_thread

from ..canonical import canonical_bytes, canonical_json, json_string, parse_json, sha256_hex
from ..errors import (
    RunNotFound,
    StoreBusy,
    StoreConflict,
    StoreError,
    UnsafeDatabase,
    newer_build,
)
from ..sanitize import sanitize

if TYPE_CHECKING:
    from ._postgres import PostgresConnection

__all__ = [
    "GENESIS_HASH",
    "INTEGRITY_ERRORS",
    "SCHEMA_VERSION",
    "AnchorReport",
    "ApprovalRecord",
    "ApprovalStatus",
    "ChainReport",
    "Connection",
    "Event",
    "RunRecord",
    "RunStatus",
    "StateReport",
    "StepRecord",
    "StepStatus",
    "Store",
    "approval_hash",
    "epoch_to_iso",
    "is_postgres_url",
    "iso_to_epoch",
    "open_store",
    "utc_now",
]

GENESIS_HASH: Final = "0" * 64

_T = TypeVar("_T")

# A write the database refused for a unique key or a reference, on either backend.
INTEGRITY_ERRORS: Final[tuple[type[Exception], ...]] = (sqlite3.IntegrityError, StoreConflict)


class Connection(Protocol):
    """What store work is handed (`Store.write`, `Store.transaction`): a `sqlite3.Connection`,
    or on PostgreSQL an adapter with the same surface (`?` placeholders, rows read by index
    and by name).  SQL is written once, in SQLite's dialect, for both."""

    @property
    def in_transaction(self) -> bool: ...

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Any: ...

    def close(self) -> None: ...


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


class StepStatus(enum.StrEnum):
    RECORDED = "recorded"
    INVALID = "invalid"
    DENIED = "denied"
    WAITING = "waiting"
    EXECUTING = "executing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class ApprovalStatus(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"
    USED = "used"


# A stored status to its member by one dict lookup (an enum's own call costs more).
_RUN_STATUSES: Final = {status.value: status for status in RunStatus}
_STEP_STATUSES: Final = {status.value: status for status in StepStatus}


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    goal: str
    status: RunStatus
    reason: str
    result: str | None
    created_at: str
    updated_at: str
    step_count: int
    consecutive_failures: int
    lease_owner: str | None
    lease_expires_at: float | None
    metadata: dict[str, str]
    deadline_at: float | None


@dataclass(frozen=True, slots=True)
class StepRecord:
    run_id: str
    step: int
    tool: str
    args: str
    status: StepStatus
    observation_kind: str | None
    content: str | None
    summary: str | None
    started_at: str
    finished_at: str | None


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    approval_id: str
    run_id: str
    step: int
    kind: str
    capability: Any
    presentation: Any
    tool: str
    args: str
    approval_hash: str
    status: ApprovalStatus
    decided_by: str
    note: str
    created_at: str
    decided_at: str | None
    expires_at: float | None
    grant_expires_at: float | None

    def recomputed_hash(self) -> str:
        """The hash of this row as stored now; differs from `approval_hash` if it was altered."""
        return approval_hash(self.kind, self.capability, self.presentation, self.tool, self.args)


@dataclass(frozen=True, slots=True)
class Event:
    seq: int
    run_id: str
    type: str
    payload: dict[str, Any]
    created_at: str
    prev_hash: str
    hash: str


@dataclass(frozen=True, slots=True)
class ChainReport:
    ok: bool
    head_seq: int
    head_hash: str
    first_bad_seq: int | None
    reason: str
    checked: int


@dataclass(frozen=True, slots=True)
class AnchorReport:
    """The database's chain head against the head anchor kept beside it."""

    ok: bool
    anchor_seq: int | None
    anchor_hash: str | None
    head_seq: int
    head_hash: str
    reason: str


@dataclass(frozen=True, slots=True)
class StateReport:
    """Whether every run's and approval's row agrees with its latest state event."""

    ok: bool
    first_bad: str | None
    reason: str
    checked: int


def is_postgres_url(target: object) -> bool:
    """Whether a database target is a PostgreSQL URL rather than a file path."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


# The text of the current second, kept: `utc_now` runs several times a step.
_utc_second: tuple[int, str] = (-1, "")


def utc_now() -> str:
    """The current UTC time as ISO 8601 with microseconds (`2026-12-01T16:41:50.521022Z`)."""
    return _utc_text(time.time_ns() // 1_000)


def utc_at(epoch: float) -> str:
    """`epoch` as `utc_now` writes the time: UTC ISO 8601 with microseconds."""
    return _utc_text(round(epoch * 1_000_000))


def _utc_text(microseconds: int) -> str:
    global _utc_second
    second, micros = divmod(microseconds, 1_000_000)
    cached = _utc_second
    if cached[0] != second:
        cached = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        _utc_second = cached  # one tuple, replaced whole: safe across threads
    return f"{cached[1]}.{micros:06d}Z"


def epoch_to_iso(epoch: float) -> str:
    """Epoch seconds (how leases and expiries are kept) as UTC ISO 8601, to the second."""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def iso_to_epoch(text: str) -> float:
    """A time the store wrote with `utc_now` as epoch seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def approval_hash(kind: str, capability: Any, presentation: Any, tool: str, args: str) -> str:
    """SHA-256 over the canonical form of kind, capability, presentation and the exact request."""
    return sha256_hex(
        canonical_bytes(
            {
                "kind": kind,
                "capability": capability,
                "presentation": presentation,
                "request": {"tool": tool, "args": args},
            }
        )
    )


def event_hash(
    prev_hash: str, seq: int, run_id: str, type_: str, payload_text: str, created_at: str
) -> str:
    """SHA-256 of the canonical envelope of one event, over its payload text as stored.

    The envelope is the canonical JSON of `{created_at, payload, prev_hash,
    run_id, seq, type}` with the stored payload text spliced in verbatim, so any
    change to the stored bytes (even whitespace) breaks the chain, and nothing
    is parsed or re-encoded to hash it.
    """
    envelope = (
        '{"created_at":' + json_string(created_at)
        + ',"payload":' + payload_text
        + ',"prev_hash":' + json_string(prev_hash)
        + ',"run_id":' + json_string(run_id)
        + ',"seq":' + str(seq)
        + ',"type":' + json_string(type_)
        + "}"
    )  # fmt: skip
    return sha256_hex(envelope.encode("utf-8"))


# Forward-only: a migration is never edited once released; a new one is appended.
_MIGRATIONS: Final[tuple[str, ...]] = (
    """
    CREATE TABLE runs (
        run_id TEXT PRIMARY KEY,
        goal TEXT NOT NULL,
        status TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        result TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        step_count INTEGER NOT NULL DEFAULT 0,
        consecutive_failures INTEGER NOT NULL DEFAULT 0,
        lease_owner TEXT,
        lease_expires_at REAL,
        metadata TEXT NOT NULL DEFAULT '{}',
        deadline_at REAL,
        created_seq INTEGER NOT NULL
    );
    CREATE INDEX runs_by_creation ON runs (created_seq);
    CREATE INDEX runs_by_status ON runs (status);
    CREATE TABLE steps (
        run_id TEXT NOT NULL REFERENCES runs (run_id),
        step INTEGER NOT NULL,
        tool TEXT NOT NULL,
        args TEXT NOT NULL,
        status TEXT NOT NULL,
        observation_kind TEXT,
        content TEXT,
        summary TEXT,
        started_at TEXT NOT NULL,
        finished_at TEXT,
        PRIMARY KEY (run_id, step)
    );
    CREATE TABLE approvals (
        approval_id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs (run_id),
        step INTEGER NOT NULL,
        kind TEXT NOT NULL,
        capability TEXT NOT NULL,
        presentation TEXT NOT NULL,
        tool TEXT NOT NULL,
        args TEXT NOT NULL,
        approval_hash TEXT NOT NULL,
        status TEXT NOT NULL,
        decided_by TEXT NOT NULL DEFAULT '',
        note TEXT NOT NULL DEFAULT '',
        created_at TEXT NOT NULL,
        decided_at TEXT,
        expires_at REAL,
        grant_expires_at REAL,
        created_seq INTEGER NOT NULL
    );
    CREATE INDEX approvals_by_run ON approvals (run_id, created_seq);
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        type TEXT NOT NULL,
        payload TEXT NOT NULL,
        created_at TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL
    );
    CREATE INDEX events_by_run ON events (run_id, seq);
    CREATE TABLE extensions (name TEXT PRIMARY KEY, version INTEGER NOT NULL);
    """,
    # A per-acquisition lease token: only the holder of the acquisition that
    # started a call may record its result (the owner label alone repeats).
    """
    ALTER TABLE runs ADD COLUMN lease_token TEXT;
    """,
    # No query has ever read it (runs are listed by creation, waiting ones first, an
    # expression no index serves; every other lookup is by run id), and it cost every
    # call a page written in each of its two commits.
    """
    DROP INDEX IF EXISTS runs_by_status;
    """,
    # The runs waiting for a person, which every listing shows first: a page of runs is
    # then read through this index and `runs_by_creation`, not by sorting every run.  A
    # call's run is in it only while it waits, so an allowed call never writes it.
    """
    CREATE INDEX IF NOT EXISTS runs_waiting ON runs (created_seq)
        WHERE status = 'waiting_for_approval';
    """,
)
SCHEMA_VERSION: Final = len(_MIGRATIONS)

# SQLite waits this long for a lock inside one attempt; the store retries
# attempts (releasing its own lock in between, so reads go on) until
# `Store.busy_deadline`, then says so in one sentence.
_BUSY_TIMEOUT_MS: Final = 100
_BUSY_DEADLINE_S: Final = 30.0
_CORE_TABLES: Final = frozenset({"runs", "steps", "approvals", "events", "extensions"})


def _check_file(path: Path) -> bool:
    """Refuse a link or a file others can write; return whether the file exists."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeDatabase(
            f"database {sanitize(str(path))} is a symbolic link; "
            "open the file it points to directly"
        )
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeDatabase(f"database {sanitize(str(path))} is not a regular file")
    if info.st_uid != os.geteuid():
        # Its owner is someone else who can write it, and so forge an approval.
        raise UnsafeDatabase(
            f"database {sanitize(str(path))} is owned by another user (uid {info.st_uid}); "
            "anyone who can write it can forge an approval"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeDatabase(
            f"database {sanitize(str(path))} is writable by group or others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}); anyone who can write it can forge an "
            f"approval: chmod 600 it"
        )
    return True


def _create_private(path: Path) -> None:
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    descriptor = os.open(path, flags, 0o600)
    try:
        # The umask may have removed bits we asked for, never added any; fchmod
        # makes the mode exact whatever the umask.
        os.fchmod(descriptor, 0o600)
    finally:
        os.close(descriptor)


def _tighten_sidecars(path: Path) -> None:
    for suffix in ("-wal", "-shm", "-journal"):
        sidecar = Path(str(path) + suffix)
        try:
            info = os.lstat(sidecar)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            raise UnsafeDatabase(f"{sanitize(str(sidecar))} is a symbolic link")
        if info.st_uid != os.geteuid():
            raise UnsafeDatabase(f"{sanitize(str(sidecar))} is owned by another user")
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.chmod(sidecar, 0o600)


def _run_status(value: str) -> RunStatus:
    status = _RUN_STATUSES.get(value)
    return status if status is not None else RunStatus(value)


def _step_status(value: str) -> StepStatus:
    status = _STEP_STATUSES.get(value)
    return status if status is not None else StepStatus(value)


@functools.cache
def _counting(failed: bool, returning: str) -> str:
    streak = "consecutive_failures + 1" if failed else "0"
    return (
        f"UPDATE runs SET consecutive_failures = {streak}, updated_at = ?"
        f" WHERE run_id = ? AND lease_token = ? RETURNING {returning}"
    )


# A page of `ORDER BY (status = 'waiting_for_approval') DESC, created_seq DESC LIMIT ?
# OFFSET ?`, in one statement (one snapshot) that reads only the rows up to the page: the
# waiting runs of the page through `runs_waiting`, then the others from where the page
# reaches them (the offset less the waiting ones) through `runs_by_creation`.  Sorting every
# run took 0.1-0.8 s a page at 300,000 runs; this takes about a millisecond for the first.
_WAITING_COUNT: Final = "(SELECT COUNT(*) FROM runs WHERE status = 'waiting_for_approval')"
_LIST_RUNS: Final = (
    "SELECT * FROM (SELECT *, 1 AS waiting_first FROM runs"
    " WHERE status = 'waiting_for_approval' ORDER BY created_seq DESC LIMIT ? OFFSET ?) AS w"
    " UNION ALL SELECT * FROM (SELECT *, 0 AS waiting_first FROM runs"
    " WHERE status != 'waiting_for_approval' ORDER BY created_seq DESC LIMIT ?"
    f" OFFSET (CASE WHEN ? > {_WAITING_COUNT} THEN ? - {_WAITING_COUNT} ELSE 0 END)) AS r"
    " ORDER BY waiting_first DESC, created_seq DESC LIMIT ?"
)


def _row_to_run(row: Any) -> RunRecord:
    metadata = row["metadata"]
    return RunRecord(
        run_id=row["run_id"],
        goal=row["goal"],
        status=_run_status(row["status"]),
        reason=row["reason"],
        result=row["result"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        step_count=row["step_count"],
        consecutive_failures=row["consecutive_failures"],
        lease_owner=row["lease_owner"],
        lease_expires_at=row["lease_expires_at"],
        metadata={} if metadata == "{}" else json.loads(metadata),
        deadline_at=row["deadline_at"],
    )


def _row_to_step(row: Any) -> StepRecord:
    return StepRecord(
        run_id=row["run_id"],
        step=row["step"],
        tool=row["tool"],
        args=row["args"],
        status=_step_status(row["status"]),
        observation_kind=row["observation_kind"],
        content=row["content"],
        summary=row["summary"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
    )


def _row_to_approval(row: Any) -> ApprovalRecord:
    return ApprovalRecord(
        approval_id=row["approval_id"],
        run_id=row["run_id"],
        step=row["step"],
        kind=row["kind"],
        capability=parse_json(row["capability"]),
        presentation=parse_json(row["presentation"]),
        tool=row["tool"],
        args=row["args"],
        approval_hash=row["approval_hash"],
        status=ApprovalStatus(row["status"]),
        decided_by=row["decided_by"],
        note=row["note"],
        created_at=row["created_at"],
        decided_at=row["decided_at"],
        expires_at=row["expires_at"],
        grant_expires_at=row["grant_expires_at"],
    )


def _row_to_event(row: Any) -> Event:
    return Event(
        seq=row["seq"],
        run_id=row["run_id"],
        type=row["type"],
        payload=parse_json(row["payload"]),
        created_at=row["created_at"],
        prev_hash=row["prev_hash"],
        hash=row["hash"],
    )


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc)


class Store:
    """One database of runs, steps, approvals and events (SQLite, or PostgreSQL for a
    `postgresql://` URL).  Use `open_store`."""

    def __init__(
        self,
        connection: Connection,
        path: str,
        read_only: bool,
        anchor_path: str | None = None,
        postgres: PostgresConnection | None = None,
    ) -> None:
        self._connection = connection
        # The PostgreSQL adapter (the same object as _connection), None on SQLite.
        self._postgres = postgres
        # On PostgreSQL, the server's time when the write transaction in progress took
        # the write lock: leases and holds are judged on it (`write_time`).
        self._server_now: float | None = None
        self._lock = threading.RLock()
        self.path = path
        self.read_only = read_only
        self.anchor_path = anchor_path
        self.busy_deadline = _BUSY_DEADLINE_S
        # Events of the transaction (or savepoint) in progress: only the thread
        # holding _lock touches them.  Moved to _committed_events after COMMIT.
        self._pending_events: list[Event] = []
        # The chain head (seq, hash) as this transaction left it, read from the
        # database once per transaction: BEGIN IMMEDIATE holds the write lock and
        # `append_event` is the only writer of events, so it cannot move under us.
        self._head: tuple[int, str] | None = None
        self._events_lock = threading.Lock()
        self._committed_events: list[Event] = []
        self._writer: _Writer | None = None
        self._writer_guard = threading.Lock()
        self._anchor: _AnchorFile | None = None
        self._waiters_guard = threading.Lock()
        self._lock_waiters = 0
        self.commits = 0
        """COMMITs this store's connection has made (each one fsync of the WAL)."""

    # -- off the event loop --------------------------------------------------

    async def run(self, function: Callable[..., _T], *args: Any) -> _T:
        """Run blocking store work (a transaction, a read) in a worker thread.

        An fsync or a busy wait on a locked database then stalls only that
        worker, never the event loop (heartbeats keep beating).  The store's
        lock still serialises the work on its one connection.  A cancelled
        caller waits for the work to finish, so nobody is ever told less than
        what the database holds.
        """
        return await anyio.to_thread.run_sync(functools.partial(function, *args))

    async def write(self, function: Callable[..., _T], *args: Any) -> _T:
        """Run `function(connection, *args)` as one atomic unit, answered once it is durable.

        The store's writer thread gathers the units of concurrent callers into
        one transaction (group commit), each unit in its own savepoint: a unit
        that raises rolls back only its own writes (and its events) and its
        caller gets the exception; the others commit.  The call returns only
        after the COMMIT holding the unit returned (and the head anchor was
        written), so what the caller is told is on disk.  A cancelled caller
        waits for its unit to be settled, as with `run`.
        """
        if self.read_only:
            raise StoreError(f"database {sanitize(self.path)} is open read-only")
        unit = _Unit(function, args)
        future = unit._future
        with anyio.CancelScope(shield=True):
            # Submitted last, just before this task yields: the writer wakes needing
            # the interpreter lock, and the loop lets go of it only once it waits.
            self._writer_thread().submit(unit)
            if future is not None:
                await future  # (what `settled` awaits, one coroutine frame fewer)
            else:
                await unit.settled()
        if unit.error is not None:
            raise unit.error
        return unit.value  # type: ignore[no-any-return]

    def _writer_thread(self) -> _Writer:
        with self._writer_guard:
            if self._writer is None:
                self._writer = _Writer(self)
            return self._writer

    @property
    def backend(self) -> str:
        """`"postgresql"` or `"sqlite"`."""
        return "sqlite" if self._postgres is None else "postgresql"

    def clock(self) -> float:
        """Now, as approvals are judged outside a write: on PostgreSQL the server's clock
        (one round trip), on SQLite this host's.  Blocking on PostgreSQL: call it in
        `Store.run`."""
        if self._postgres is None:
            return time.time()
        return float(self._query("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8")[0][0])

    def write_time(self, now: float) -> float:
        """The time that judges leases, holds and approvals inside a write: on PostgreSQL
        the server's clock when the transaction took the write lock (so hosts whose
        clocks disagree still agree on who holds a run and what expired), on SQLite
        `now` (one host's clock)."""
        return now if self._server_now is None else self._server_now

    def _commit_batch(self, units: list[_Unit]) -> None:
        """On the writer thread: one transaction over `units`, each in a savepoint.

        Every unit's outcome is set before this returns; none is released
        (`_Unit.release`) until COMMIT returned and the anchor was written.
        """
        try:
            self._begin()
        except BaseException as exc:
            for unit in units:
                unit.error = exc
            return
        connection = self._connection
        # A unit alone in its batch needs no savepoint: the transaction is its own.
        alone = len(units) == 1
        try:
            self._head = None
            committed: list[Event] = []
            kept: list[_Unit] = []
            for unit in units:
                if not connection.in_transaction:
                    # An earlier failure made SQLite roll the whole transaction
                    # back (disk full, I/O error): nothing of this batch stands.
                    break
                head = self._head
                self._pending_events = []
                if not alone:
                    connection.execute("SAVEPOINT unit")
                try:
                    unit.value = unit.function(connection, *unit.args)
                except BaseException as exc:
                    unit.error = exc
                    self._pending_events = []
                    self._head = head
                    if connection.in_transaction:
                        if alone:
                            connection.execute("ROLLBACK")
                        else:
                            connection.execute("ROLLBACK TO unit")
                            connection.execute("RELEASE unit")
                    continue
                if not alone:
                    connection.execute("RELEASE unit")
                committed.extend(self._pending_events)
                kept.append(unit)
            self._pending_events = []
            if connection.in_transaction:
                connection.execute("COMMIT")
                self.commits += 1
            elif alone:
                pass  # its unit failed and rolled the transaction back
            else:
                lost = StoreError(
                    f"database {sanitize(self.path)} rolled back a write after an error in "
                    "another one; nothing of it was written"
                )
                for unit in kept:
                    unit.error, unit.value = lost, None
                committed = []
                kept = []
        except BaseException as exc:
            self._pending_events = []
            if connection.in_transaction:
                with contextlib.suppress(sqlite3.Error, StoreError):
                    connection.execute("ROLLBACK")
            for unit in units:
                if unit.error is None:
                    unit.error, unit.value = exc, None
            return
        finally:
            self._head = None
            self._server_now = None
            self._lock.release()
        if committed:
            with self._events_lock:
                self._committed_events.extend(committed)
            self._advance_anchor(committed[-1].seq, committed[-1].hash)

    # -- transactions --------------------------------------------------------

    def _acquire_lock(self) -> None:
        """Take the store's lock, counted while waiting, so the writer thread can
        give way between batches (`_Writer._loop`) instead of taking it straight
        back: Python's locks do not hand over to a waiter."""
        if self._lock.acquire(blocking=False):
            return
        with self._waiters_guard:
            self._lock_waiters += 1
        try:
            self._lock.acquire()
        finally:
            with self._waiters_guard:
                self._lock_waiters -= 1

    def _begin(self) -> None:
        """Take the store's lock and `BEGIN IMMEDIATE`, waiting out a busy database in
        short attempts (the lock released between them) until `busy_deadline`.

        On PostgreSQL: `BEGIN` and the write lock every writer takes first (the
        server waits for it up to the deadline), with the server's time then.
        """
        if self._postgres is not None:
            self._acquire_lock()
            try:
                self._server_now = self._postgres.begin_write()
            except BaseException:
                self._lock.release()
                raise
            return
        deadline = time.monotonic() + self.busy_deadline
        while True:
            self._acquire_lock()
            try:
                self._connection.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                self._lock.release()
                if not _is_busy(exc):
                    raise StoreError(
                        f"database {sanitize(self.path)} cannot start a write: {exc}"
                    ) from None
            except BaseException:
                self._lock.release()
                raise
            if time.monotonic() >= deadline:
                raise StoreBusy(
                    f"database {sanitize(self.path)} stayed locked by another writer for "
                    f"{self.busy_deadline:g}s; nothing was written"
                )
            time.sleep(0.005)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A write transaction (`BEGIN IMMEDIATE`): committed on success, rolled back on error."""
        if self.read_only:
            raise StoreError(f"database {sanitize(self.path)} is open read-only")
        self._begin()
        try:
            connection = self._connection
            self._pending_events = []
            self._head = None
            try:
                yield connection
                connection.execute("COMMIT")
                self.commits += 1
            except BaseException:
                self._pending_events = []
                if connection.in_transaction:
                    # The connection rolls back on its own when it cannot.
                    with contextlib.suppress(sqlite3.Error, StoreError):
                        connection.execute("ROLLBACK")
                raise
            events, self._pending_events = self._pending_events, []
            if events:
                with self._events_lock:
                    self._committed_events.extend(events)
                self._advance_anchor(events[-1].seq, events[-1].hash)
        finally:
            self._head = None
            self._server_now = None
            self._lock.release()

    def take_committed_events(self) -> list[Event]:
        """Events appended by transactions that have committed since the last call."""
        with self._events_lock:
            events, self._committed_events = self._committed_events, []
            return events

    # -- the head anchor -----------------------------------------------------

    def _advance_anchor(self, seq: int, digest: str) -> None:
        """Record a committed head in the anchor, unless it already holds a later one.

        Called after COMMIT, so the anchor is never ahead of what the database
        durably holds.  A failure here only leaves the anchor behind (less to
        compare with, never a false refusal), so it is not the caller's error.
        """
        if self.anchor_path is None:
            return
        if self._anchor is None:
            self._anchor = _AnchorFile(self.anchor_path)
        self._anchor.advance(seq, digest)

    def head(self) -> tuple[int, str]:
        """The last event's seq and hash: `(0, GENESIS_HASH)` for an empty chain."""
        rows = self._query("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")
        return (int(rows[0][0]), str(rows[0][1])) if rows else (0, GENESIS_HASH)

    def check_anchor(self) -> AnchorReport:
        """Compare the chain with the anchor beside the database: is anything lost?"""
        head_seq, head_hash = self.head()
        if self.anchor_path is None:
            return AnchorReport(True, None, None, head_seq, head_hash, "in memory: no anchor")
        anchor = _read_anchor(self.anchor_path)
        label = sanitize(self.path)
        where = sanitize(self.anchor_path)
        if anchor is None and self._postgres is not None:
            # Each host keeps its own: one that never wrote here has none, and that is
            # no fault of the database's.
            return AnchorReport(
                True, None, None, head_seq, head_hash,
                f"no head anchor on this host ({where}): a restored older backup is not "
                "detected here",
            )  # fmt: skip
        if anchor is None:
            return AnchorReport(
                False, None, None, head_seq, head_hash,
                f"database {label} has no head anchor ({where}), so lost commits cannot be "
                "detected; copy the anchor with the database",
            )  # fmt: skip
        seq, digest = anchor
        if head_seq < seq:
            how = (
                "(a deleted WAL, an older copy restored, or a truncated file)"
                if self._postgres is None
                else f"(an older backup restored, or the database emptied or recreated; "
                f"if it was reset on purpose, remove {where} to start afresh)"
            )
            return AnchorReport(
                False, seq, digest, head_seq, head_hash,
                f"database {label} ends at event {head_seq} ({head_hash[:16]}) but its anchor "
                f"records event {seq} ({digest[:16]}): committed events were lost {how}, and "
                "calls that ran could run again",
            )  # fmt: skip
        stored = (
            GENESIS_HASH
            if seq == 0
            else next(
                (row[0] for row in self._query("SELECT hash FROM events WHERE seq = ?", (seq,))),
                None,
            )
        )
        if stored != digest:
            return AnchorReport(
                False, seq, digest, head_seq, head_hash,
                f"database {label} has hash {str(stored)[:16]} at event {seq} but its anchor "
                f"records {digest[:16]}: the chain was replaced",
            )  # fmt: skip
        return AnchorReport(True, seq, digest, head_seq, head_hash, "the chain reaches its anchor")

    def write_anchor(self) -> None:
        """Anchor the current head (a database opened for the first time by this build)."""
        if self.anchor_path is None or self.read_only:
            return
        seq, digest = self.head()
        _write_anchor(self.anchor_path, seq, digest)

    def append_event(
        self, connection: Connection, run_id: str, type_: str, payload: Mapping[str, Any]
    ) -> Event:
        """Append one event to the chain; call inside `transaction()` or a `write` unit."""
        head = self._head
        if head is None:
            row = connection.execute(
                "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1"
            ).fetchone()
            head = (row[0], row[1]) if row else (0, GENESIS_HASH)
        seq, prev_hash = head[0] + 1, head[1]
        created_at = utc_now()
        payload_text = canonical_json(payload)
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

    def migrate_extension(self, name: str, migrations: Sequence[str]) -> None:
        """Apply a module's own forward-only migrations (e.g. the proxy's call index)."""
        with self.transaction() as connection:
            row = connection.execute(
                "SELECT version FROM extensions WHERE name = ?", (name,)
            ).fetchone()
            version = row[0] if row else 0
            if version > len(migrations):
                raise UnsafeDatabase(
                    f"database {sanitize(self.path)} has {name} tables from a newer build "
                    f"(version {version}, this build knows {len(migrations)})"
                )
            if version == len(migrations):
                return  # nothing to write (a role without DDL rights opens it too)
            for script in migrations[version:]:
                for statement in _split_sql(script):
                    connection.execute(self._ddl(statement))
            connection.execute(
                "INSERT INTO extensions (name, version) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET version = excluded.version",
                (name, len(migrations)),
            )

    def _ddl(self, statement: str) -> str:
        if self._postgres is None:
            return statement
        from ._postgres import widen_types

        return widen_types(statement)

    def extension_version(self, name: str) -> int:
        with self._lock:
            row = self._connection.execute(
                "SELECT version FROM extensions WHERE name = ?", (name,)
            ).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        """Settle every `write` already submitted, stop the writer, close the connection."""
        with self._writer_guard:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.stop()
        with self._lock:
            self._connection.close()
            if self._anchor is not None:
                self._anchor.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- reads ---------------------------------------------------------------

    def query(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        """Rows of one read (readable by index and by column name), on the store's
        connection under its lock: for the store's own modules (accounting), never a write."""
        return self._query(sql, parameters)

    def _query(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        deadline = time.monotonic() + self.busy_deadline
        while True:
            self._acquire_lock()
            try:
                rows: list[Any] = self._connection.execute(sql, parameters).fetchall()
                return rows
            except sqlite3.OperationalError as exc:
                # Inside a transaction the lock is ours: busy cannot happen there.
                if not _is_busy(exc) or self._connection.in_transaction:
                    raise
            finally:
                self._lock.release()
            if time.monotonic() >= deadline:
                raise StoreBusy(
                    f"database {sanitize(self.path)} stayed locked for {self.busy_deadline:g}s"
                )
            time.sleep(0.005)

    def get_run(self, run_id: str) -> RunRecord:
        rows = self._query("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        if not rows:
            raise RunNotFound(f"no run {sanitize(run_id)} in {sanitize(self.path)}")
        return _row_to_run(rows[0])

    def read_run(self, connection: Connection, run_id: str) -> tuple[RunRecord, str | None]:
        """Inside a write: the run and its lease token, in one read of its row."""
        row = connection.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"no run {sanitize(run_id)} in {sanitize(self.path)}")
        return _row_to_run(row), row["lease_token"]

    def count_result(
        self, connection: Connection, run_id: str, token: str, *, failed: bool, at: str
    ) -> RunRecord | None:
        """Inside a write: count a step's result on the run (its failure streak, its
        update time), compared and set on the lease token that started the call;
        the row as this left it, or None if the run is no longer under `token`."""
        row = connection.execute(_counting(failed, "*"), (at, run_id, token)).fetchone()
        return None if row is None else _row_to_run(row)

    def count_last_result(
        self, connection: Connection, run_id: str, token: str, *, failed: bool, at: str
    ) -> RunStatus | None:
        """`count_result` for a terminal tool's step, from which no view of the run is
        built: the run's status as this left it, the only field its caller reads, or None."""
        row = connection.execute(_counting(failed, "status"), (at, run_id, token)).fetchone()
        return None if row is None else _run_status(row[0])

    def list_runs(self, limit: int = 50, offset: int = 0) -> list[RunRecord]:
        """Runs newest first, those waiting for an approval in front."""
        rows = self._query(_LIST_RUNS, (limit, offset, limit, offset, offset, limit))
        return [_row_to_run(row) for row in rows]

    def count_runs(self) -> int:
        return int(self._query("SELECT COUNT(*) FROM runs")[0][0])

    def list_steps(self, run_id: str, limit: int = 100, offset: int = 0) -> list[StepRecord]:
        rows = self._query(
            "SELECT * FROM steps WHERE run_id = ? ORDER BY step LIMIT ? OFFSET ?",
            (run_id, limit, offset),
        )
        return [_row_to_step(row) for row in rows]

    def count_steps(self, run_id: str) -> int:
        return int(self._query("SELECT COUNT(*) FROM steps WHERE run_id = ?", (run_id,))[0][0])

    def get_step(self, run_id: str, step: int) -> StepRecord | None:
        rows = self._query("SELECT * FROM steps WHERE run_id = ? AND step = ?", (run_id, step))
        return _row_to_step(rows[0]) if rows else None

    def last_steps(self, run_id: str, count: int) -> list[StepRecord]:
        rows = self._query(
            "SELECT * FROM steps WHERE run_id = ? ORDER BY step DESC LIMIT ?", (run_id, count)
        )
        return [_row_to_step(row) for row in reversed(rows)]

    def latest_approval(self, run_id: str) -> ApprovalRecord | None:
        """The run's most recent approval, whatever its status (only it can grant)."""
        rows = self._query(
            "SELECT * FROM approvals WHERE run_id = ? ORDER BY created_seq DESC LIMIT 1",
            (run_id,),
        )
        return _row_to_approval(rows[0]) if rows else None

    def waiting_approval(self, run_id: str) -> ApprovalRecord | None:
        """The approval the run waits on (pending or approved, not yet used), if any."""
        approval = self.latest_approval(run_id)
        if approval is None or approval.status not in (
            ApprovalStatus.PENDING,
            ApprovalStatus.APPROVED,
        ):
            return None
        return approval

    def get_approval(self, approval_id: str) -> ApprovalRecord:
        rows = self._query("SELECT * FROM approvals WHERE approval_id = ?", (approval_id,))
        if not rows:
            raise RunNotFound(f"no approval {sanitize(approval_id)} in {sanitize(self.path)}")
        return _row_to_approval(rows[0])

    def count_pending_approvals(self) -> int:
        return int(self._query("SELECT COUNT(*) FROM approvals WHERE status = 'pending'")[0][0])

    def list_events(self, run_id: str, limit: int = 1000, offset: int = 0) -> list[Event]:
        rows = self._query(
            "SELECT * FROM events WHERE run_id = ? ORDER BY seq LIMIT ? OFFSET ?",
            (run_id, limit, offset),
        )
        return [_row_to_event(row) for row in rows]

    def count_events(self, run_id: str) -> int:
        return int(self._query("SELECT COUNT(*) FROM events WHERE run_id = ?", (run_id,))[0][0])

    def verify_chain(self, from_seq: int | None = None, to_seq: int | None = None) -> ChainReport:
        """Recompute the hash chain over [from_seq, to_seq] and report the first break."""
        start = max(from_seq or 1, 1)
        with self._lock:
            if start > 1:
                previous = self._connection.execute(
                    "SELECT hash FROM events WHERE seq = ?", (start - 1,)
                ).fetchone()
                prev_hash = previous[0] if previous else None
            else:
                prev_hash = GENESIS_HASH
            cursor = self._connection.execute(
                "SELECT * FROM events WHERE seq >= ? AND (? IS NULL OR seq <= ?) ORDER BY seq",
                (start, to_seq, to_seq),
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

    def events_after(self, seq: int, limit: int = 1000) -> list[Event]:
        """Events of every run with a seq above `seq`, oldest first, at most `limit` of them."""
        rows = self._query("SELECT * FROM events WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit))
        return [_row_to_event(row) for row in rows]

    def head_seq(self) -> int:
        """The seq of the newest event (0 when there is none)."""
        return int(self._query("SELECT COALESCE(MAX(seq), 0) FROM events")[0][0])

    def event_at(self, seq: int) -> Event | None:
        rows = self._query("SELECT * FROM events WHERE seq = ?", (seq,))
        return _row_to_event(rows[0]) if rows else None

    def grant_event(self, approval: ApprovalRecord) -> Event | None:
        """The `approval_granted` event that granted this approval (its id and hash), if any."""
        for row in self._query(
            "SELECT * FROM events WHERE run_id = ? AND type = 'approval_granted' ORDER BY seq",
            (approval.run_id,),
        ):
            event = _row_to_event(row)
            if (
                event.payload.get("approval_id") == approval.approval_id
                and event.payload.get("approval_hash") == approval.approval_hash
            ):
                return event
        return None

    def verify_state(self) -> StateReport:
        """Check the tables against the events: every run's and approval's status is
        the one its latest state event leaves, and every `run_resumed` on an
        approval follows that approval's `approval_granted`.

        The chain proves the events were not changed; this proves the rows the
        gate acts on were not changed behind them (an approval set to
        `approved` by hand, a cancelled run set back to running).
        """
        runs: dict[str, tuple[str, int, str]] = {}
        approvals: dict[str, tuple[str, int, str]] = {}
        open_approvals: dict[str, list[str]] = {}
        granted: set[str] = set()
        checked = 0
        with self._lock:
            cursor = self._connection.execute(
                "SELECT seq, run_id, type, payload FROM events WHERE type IN ("
                "'run_started', 'approval_requested', 'approval_granted', 'approval_rejected',"
                " 'approval_expired', 'run_resumed', 'operator_cancelled', 'run_completed',"
                " 'run_failed', 'run_cancelled') ORDER BY seq"
            )
            for seq, run_id, type_, payload_text in cursor:
                checked += 1
                payload = json.loads(payload_text)
                active = open_approvals.setdefault(run_id, [])
                approval_id = str(payload.get("approval_id", ""))
                if type_ == "run_started":
                    runs[run_id] = ("running", seq, type_)
                elif type_ == "approval_requested":
                    for earlier in active:
                        approvals[earlier] = ("superseded", seq, type_)
                    active[:] = [approval_id]
                    approvals[approval_id] = ("pending", seq, type_)
                    runs[run_id] = ("waiting_for_approval", seq, type_)
                elif type_ == "approval_granted":
                    approvals[approval_id] = ("approved", seq, type_)
                    granted.add(approval_id)
                elif type_ in ("approval_rejected", "approval_expired"):
                    approvals[approval_id] = (type_.removeprefix("approval_"), seq, type_)
                    if approval_id in active:
                        active.remove(approval_id)
                elif type_ == "run_resumed":
                    if approval_id not in granted:
                        return StateReport(
                            False, f"event {seq}",
                            f"event {seq} resumes run {sanitize(run_id)} on approval "
                            f"{sanitize(approval_id)}, which no approval_granted event granted",
                            checked,
                        )  # fmt: skip
                    approvals[approval_id] = ("used", seq, type_)
                    if approval_id in active:
                        active.remove(approval_id)
                    runs[run_id] = ("running", seq, type_)
                elif type_ == "operator_cancelled":
                    for earlier in active:
                        approvals[earlier] = ("superseded", seq, type_)
                    active.clear()
                else:
                    runs[run_id] = (type_.removeprefix("run_"), seq, type_)
                    if payload.get("reason") == "grant_expired":
                        for earlier in active:
                            if approvals.get(earlier, ("",))[0] == "approved":
                                approvals[earlier] = ("expired", seq, type_)
            for row in self._connection.execute(
                "SELECT run_id, status FROM runs ORDER BY created_seq"
            ):
                problem = _disagreement("run", row[0], row[1], runs.get(row[0]))
                if problem is not None:
                    return StateReport(False, f"run {sanitize(row[0])}", problem, checked)
            for row in self._connection.execute(
                "SELECT approval_id, status FROM approvals ORDER BY created_seq"
            ):
                problem = _disagreement("approval", row[0], row[1], approvals.get(row[0]))
                if problem is not None:
                    return StateReport(False, f"approval {sanitize(row[0])}", problem, checked)
        return StateReport(True, None, "every run and approval matches its events", checked)


class _Unit:
    """One caller's `Store.write`: the function, then its outcome once its batch settled."""

    __slots__ = ("_done", "_future", "_loop", "args", "error", "function", "value")

    def __init__(self, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.function = function
        self.args = args
        self.value: Any = None
        self.error: BaseException | None = None
        # On asyncio the writer wakes the caller's loop directly, through a bare
        # future (no thread per waiter, no event object between them); on another
        # backend the caller waits in a worker thread.
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        if self._loop is not None:
            self._future: asyncio.Future[None] | None = self._loop.create_future()
            self._done: threading.Event | None = None
        else:
            self._future = None
            self._done = threading.Event()

    def release(self) -> None:
        """Called by the writer once the unit's outcome is final and durable."""
        if self._done is not None:
            self._done.set()
        elif self._loop is not None and self._future is not None:
            with contextlib.suppress(RuntimeError):  # the caller's loop already closed
                self._loop.call_soon_threadsafe(_resolve, self._future)

    async def settled(self) -> None:
        if self._future is not None:
            await self._future
        elif self._done is not None:
            await anyio.to_thread.run_sync(self._done.wait)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# Enough to share one fsync among many callers, few enough that one batch's
# savepoints keep the write lock only briefly.
_MAX_BATCH: Final = 256


class _Writer:
    """The store's one writer thread: takes the queued `write` units, commits them in
    groups, and answers their callers after each group's COMMIT."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._queue: queue.SimpleQueue[_Unit | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._loop, name=f"agentrt-writer {store.path}", daemon=True
        )
        self.batches = 0
        self._thread.start()

    def submit(self, unit: _Unit) -> None:
        self._queue.put(unit)

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _loop(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                return
            units = [first]
            # Whatever queued while the last batch committed joins this one:
            # nobody waits for a timer, and under load every fsync is shared.
            # (This thread is the queue's only reader: not empty means a get succeeds.)
            while len(units) < _MAX_BATCH and not self._queue.empty():
                unit = self._queue.get_nowait()
                if unit is None:
                    stopping = True
                    break
                units.append(unit)
            # Readers and sync transactions waiting for the store's lock go first.
            for _ in range(20):
                if not self._store._lock_waiters:
                    break
                time.sleep(0.0001)
            try:
                self._store._commit_batch(units)
            except BaseException as exc:  # never leave a caller waiting
                for unit in units:
                    if unit.error is None:
                        unit.error, unit.value = exc, None
            self.batches += 1
            for unit in units:  # last: each wakes a caller, who wants the lock next
                unit.release()


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


def _read_anchor(path: str) -> tuple[int, str] | None:
    """The anchor's (seq, hash), None if there is none; refuses one others could have written."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafeDatabase(f"head anchor {sanitize(path)} cannot be read: {exc}") from None
    try:
        info = os.fstat(descriptor)
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnsafeDatabase(
                f"head anchor {sanitize(path)} is owned or writable by someone else"
            )
        data = os.read(descriptor, 4096)
    finally:
        os.close(descriptor)
    return _parse_anchor(data, path)


def _parse_anchor(data: bytes, path: str) -> tuple[int, str] | None:
    if not data.strip():
        return None  # a power cut between its creation and its data: as if missing
    try:
        record = json.loads(data)
        seq, digest = record["seq"], record["hash"]
        if not isinstance(seq, int) or seq < 0 or not isinstance(digest, str) or len(digest) != 64:
            raise ValueError("bad fields")
    except (ValueError, KeyError, TypeError):
        raise UnsafeDatabase(
            f"head anchor {sanitize(path)} is not an agentrt anchor; remove it to start "
            "anchoring afresh"
        ) from None
    return seq, digest


def _write_anchor(path: str, seq: int, digest: str) -> None:
    """Replace the anchor atomically: write a private file beside it, rename it over.

    Neither the file nor the directory is fsynced, which keeps an anchor
    write to a few tens of microseconds after each commit rather than a
    second fsync (measured in docs/decisions/0002).  Nothing is lost by it:
    the anchor is written after COMMIT, whose own fsync made the database
    hold what it names, so a power cut can leave the anchor behind the
    database, or empty (read as missing, and rewritten), never ahead of it.
    A process crash loses nothing, the page cache keeps it.  (After each
    commit the anchor is rewritten in place instead, by `_AnchorFile`.)
    """
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    descriptor = os.open(temporary, flags, 0o600)
    try:
        os.fchmod(descriptor, 0o600)
        os.write(descriptor, _anchor_record(seq, digest))
    finally:
        os.close(descriptor)
    os.replace(temporary, path)


# Every anchor record has this length (JSON padded with spaces), so rewriting it
# in place always covers the whole previous one.
_ANCHOR_BYTES: Final = 128


def _anchor_record(seq: int, digest: str) -> bytes:
    # json.dumps({"seq": seq, "hash": digest}) for an int and a hex digest, by hand
    # (written after every commit).
    if not (type(seq) is int and len(digest) == 64 and digest.isalnum() and digest.isascii()):
        return json.dumps({"seq": seq, "hash": digest}).ljust(_ANCHOR_BYTES).encode("ascii")
    return f'{{"seq": {seq}, "hash": "{digest}"}}'.ljust(_ANCHOR_BYTES).encode("ascii")


class _AnchorFile:
    """The head anchor, kept open and rewritten in place after each commit.

    A rename per commit cost ~0.5 ms here (more than the commit's own fsync
    on this disk); one `pwrite` of a fixed-length record within one sector
    costs a few microseconds.  A process crash cannot tear it (the page cache
    holds the whole write); a power cut leaves the old record or the new one
    (one sector), or, at worst, a record read as missing — never one ahead of
    the database, since it is written after COMMIT.  If the file is replaced
    or removed (another build renames over it), it is opened afresh.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._descriptor: int | None = None
        self._inode: tuple[int, int] | None = None
        # The record this object last wrote and its seq: a file still holding
        # exactly those bytes need not be parsed again.
        self._written: tuple[bytes, int] | None = None

    def _open(self) -> int:
        try:
            info = os.stat(self.path, follow_symlinks=False)
            current: tuple[int, int] | None = (info.st_dev, info.st_ino)
        except FileNotFoundError:
            current = None
        if self._descriptor is not None and current == self._inode:
            return self._descriptor
        self.close()
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        descriptor = os.open(self.path, flags, 0o600)
        info = os.fstat(descriptor)
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            os.close(descriptor)
            raise UnsafeDatabase(
                f"head anchor {sanitize(self.path)} is owned or writable by someone else"
            )
        self._descriptor, self._inode = descriptor, (info.st_dev, info.st_ino)
        return descriptor

    def advance(self, seq: int, digest: str) -> None:
        """Record a committed head unless the anchor already holds a later one
        (several processes may share the database)."""
        try:
            descriptor = self._open()
            data = os.pread(descriptor, 4096, 0)
            written = self._written
            if written is not None and data == written[0]:
                current_seq: int | None = written[1]
            else:
                current = _parse_anchor(data, self.path)
                current_seq = None if current is None else current[0]
            if current_seq is not None and current_seq >= seq:
                return
            record = _anchor_record(seq, digest)
            os.pwrite(descriptor, record, 0)
            self._written = (record, seq)
        except (OSError, StoreError):
            return  # the anchor only lags: less to compare with, never a false refusal

    def close(self) -> None:
        if self._descriptor is not None:
            with contextlib.suppress(OSError):
                os.close(self._descriptor)
        self._descriptor = self._inode = None
        self._written = None


def _split_sql(script: str) -> list[str]:
    return [statement.strip() for statement in script.split(";") if statement.strip()]


def open_store(
    path: str | os.PathLike[str], *, read_only: bool = False, create: bool = True
) -> Store:
    """Open (or create) the database at `path`; `":memory:"` for a private in-memory one.

    `create=False` opens an existing database only: a missing file is refused
    and the schema is never migrated.  `read_only=True` implies `create=False`
    and never writes.  Only a path that does not exist is created; an existing
    file is opened only if it is an undamaged agentrt database.  Raises
    `UnsafeDatabase` for a symbolic link, a file group or others can write, a
    directory others could delete it from, a database from a newer build, one
    holding triggers or views, a damaged one, or one whose chain is behind its
    head anchor (opening for writing; `check_anchor` reports it when reading).

    A `postgresql://` URL opens that PostgreSQL database instead (psycopg 3,
    the `agentrt[postgres]` extra): credentials come from libpq's environment
    (`PGPASSWORD`, a pgpass file, a service), and a URL holding a password is
    refused.  See docs/postgresql.md.
    """
    if is_postgres_url(path):
        return _open_postgres(str(path), read_only=read_only, create=create)
    if str(path) == ":memory:":
        connection = _connect(":memory:", uri=False)
        _migrate(connection, ":memory:")
        return Store(connection, ":memory:", read_only=False)
    file_path = Path(path)
    label = str(file_path)
    anchor_path = label + ".anchor"
    if not read_only:
        _check_directories(file_path)
    exists = _check_file(file_path)
    if not exists:
        if read_only or not create:
            raise StoreError(f"database {sanitize(label)} does not exist")
        _create_database(file_path, anchor_path)
        _check_file(file_path)
    _check_header(file_path)
    _tighten_sidecars(file_path)
    if read_only:
        uri = file_path.resolve().as_uri() + "?mode=ro"
        connection = _connect(uri, uri=True, label=label)
        try:
            connection.execute("PRAGMA query_only = ON")
            _check_contents(connection, label)
            _check_version(connection, label, allow_older=False)
        except BaseException:
            connection.close()
            raise
        return Store(connection, label, True, anchor_path)
    connection = _connect(label, uri=False)
    try:
        _check_contents(connection, label)
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = FULL")
        if create:
            if 0 < _read_version(connection, label) < SCHEMA_VERSION:
                _refuse_lost(Store(connection, label, False, anchor_path))
            _migrate(connection, label)
        else:
            _check_version(connection, label, allow_older=False)
    except sqlite3.DatabaseError as exc:
        connection.close()
        raise StoreError(f"database {sanitize(label)} cannot be opened: {exc}") from None
    except BaseException:
        connection.close()
        raise
    _tighten_sidecars(file_path)
    return _anchored(Store(connection, label, False, anchor_path))


def _refuse_lost(store: Store) -> AnchorReport:
    """The chain against its head anchor; refused when it falls short (committed events
    lost: an older backup restored).  Called before an older schema is migrated too, so
    such a backup is left exactly as it was found."""
    report = store.check_anchor()
    if report.anchor_seq is not None and not report.ok:
        raise UnsafeDatabase(report.reason)
    return report


def _anchored(store: Store) -> Store:
    """A store opened for writing, once its chain reaches its head anchor (a first
    opening writes the anchor); closed and refused when committed events were lost."""
    try:
        if _refuse_lost(store).anchor_seq is None:
            store.write_anchor()
    except BaseException:
        store.close()
        raise
    return store


def postgres_anchor_path(label: str) -> str:
    """This host's head anchor for the PostgreSQL database named `label` (its redacted URL):
    in `AGENTRT_ANCHOR_DIR`, else `$XDG_STATE_HOME/agentrt/anchors` (~/.local/state)."""
    directory = os.environ.get("AGENTRT_ANCHOR_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"),
        "agentrt",
        "anchors",
    )
    return os.path.join(directory, sha256_hex(label.encode("utf-8"))[:32] + ".anchor")


def _anchor_directory(anchor_path: str, label: str) -> None:
    """Create the directory of this host's anchors if missing: it and every directory
    made on the way to it private to this user (0700, whatever the umask, as the XDG
    base directory specification asks), so no one else can swap an anchor."""
    directory = os.path.dirname(anchor_path)
    missing: list[str] = []
    path = directory
    while path and not os.path.isdir(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    try:
        for path in reversed(missing):
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                if path != directory or os.path.isdir(path):
                    continue  # made meanwhile; or a file on the way, which the next names
                raise
            os.chmod(path, 0o700)  # the umask may have taken bits away
    except OSError as exc:
        raise StoreError(
            f"database {sanitize(label)}: the head anchor directory {sanitize(directory)} "
            f"cannot be created ({exc.strerror}); set AGENTRT_ANCHOR_DIR to a directory of "
            "this user's"
        ) from None


def _open_postgres(url: str, *, read_only: bool, create: bool) -> Store:
    try:
        from . import _postgres
    except ImportError:
        raise StoreError(
            "a postgresql:// database needs psycopg: install agentrt[postgres]"
        ) from None
    connection = _postgres.connect(url, read_only=read_only, lock_timeout_s=_BUSY_DEADLINE_S)
    label = connection.label
    # This host's head anchor for it (decision 0015, amended): checked like SQLite's.
    anchor_path = postgres_anchor_path(label)
    try:
        if not read_only:
            _anchor_directory(anchor_path, label)  # before anything is written
        version = _postgres.read_version(connection)
        _postgres.check_contents(connection, version)
        current = version == SCHEMA_VERSION and _postgres.extras_current(connection)
        if version is not None and version > SCHEMA_VERSION:
            raise newer_build(label, version, SCHEMA_VERSION)
        if not current:
            if read_only or not create:
                if version is None:
                    raise StoreError(f"database {label} holds no agentrt schema")
                raise StoreError(
                    f"database {label} has schema {version}; open it once with the program "
                    f"that owns it (or `agentrt proxy`) to migrate it to {SCHEMA_VERSION}"
                )
            if version is None:
                _refuse_if_anchored(
                    anchor_path, label, "holds no agentrt schema", "emptied or recreated"
                )
            else:
                _refuse_lost(Store(connection, label, False, anchor_path, postgres=connection))
            _postgres.migrate(connection, _MIGRATIONS, _split_sql)
    except BaseException:
        connection.close()
        raise
    store = Store(connection, label, read_only, anchor_path, postgres=connection)
    return store if read_only else _anchored(store)


def _refuse_if_anchored(anchor_path: str, label: str, state: str, lost: str) -> None:
    """Refuse to create a database (`label` `state`: missing, or without a schema) whose
    anchor says one held committed events there."""
    anchored = _read_anchor(anchor_path)
    if anchored is not None and anchored[0] > 0:
        where = sanitize(anchor_path)
        raise UnsafeDatabase(
            f"database {sanitize(label)} {state} but its anchor ({where}) records event "
            f"{anchored[0]}: the database was {lost}, and calls that ran could run again; if "
            f"it was reset on purpose, remove {where} to start afresh"
        )


def _check_directories(path: Path) -> None:
    """Refuse a database another user could delete or replace (and so have its calls run
    again): every directory above it must be ours or root's, and one that group or
    others can write must carry the sticky bit (as /tmp does)."""
    # The directories the file really lives in: a linked directory is judged by its target.
    directory = path.absolute().parent.resolve()
    for ancestor in (directory, *directory.parents):
        try:
            info = os.stat(ancestor)
        except OSError as exc:
            raise StoreError(f"directory {sanitize(str(ancestor))} cannot be read: {exc}") from None
        if info.st_uid not in (os.geteuid(), 0):
            raise UnsafeDatabase(
                f"directory {sanitize(str(ancestor))} above database {sanitize(str(path))} "
                f"is owned by another user (uid {info.st_uid}), who could delete the database "
                "and have its calls run again"
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            raise UnsafeDatabase(
                f"directory {sanitize(str(ancestor))} above database {sanitize(str(path))} is "
                f"writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}) without "
                "the sticky bit; anyone who can write it could delete the database and have "
                "its calls run again: chmod go-w it"
            )


def _create_database(path: Path, anchor_path: str) -> None:
    """Create a new database whole: initialise a private file beside it, then link it into
    place, so a crash never leaves a half-made file at `path` (which would be refused)."""
    _refuse_if_anchored(anchor_path, str(path), "does not exist", "lost")
    temporary = Path(f"{path}.{os.getpid()}.{threading.get_ident()}.init")
    temporary.unlink(missing_ok=True)
    _create_private(temporary)
    try:
        connection = _connect(str(temporary), uri=False)
        try:
            _migrate(connection, str(path))
        finally:
            connection.close()
        try:
            os.link(temporary, path)
        except FileExistsError:
            return  # another process created it first; it is opened as it stands
        _write_anchor(anchor_path, 0, GENESIS_HASH)
    finally:
        temporary.unlink(missing_ok=True)


def _check_header(path: Path) -> None:
    """Refuse an empty file or one that is not SQLite, without opening it ourselves.

    The file is never opened and closed with a plain `open()`: closing any
    descriptor of a file drops every POSIX lock this process holds on it, so
    a second store opened in a process that already has one (the proxy and
    its inbox) would strip the first connection of its locks, and another
    process could then delete the WAL under it.  SQLite's own open keeps the
    locks (it shares one descriptor per file within a process).
    """
    if path.stat().st_size == 0:
        raise StoreError(
            f"database {sanitize(str(path))} is an empty file, not an agentrt database; "
            "agentrt creates only a path that does not exist: remove it or choose another path"
        )
    probe = sqlite3.connect(f"{Path(os.path.abspath(path)).as_uri()}?mode=ro", uri=True)
    try:
        probe.execute("PRAGMA schema_version").fetchone()
    except sqlite3.DatabaseError:
        raise StoreError(
            f"{sanitize(str(path))} is not a SQLite database, so not an agentrt one; "
            "agentrt will not write into it"
        ) from None
    finally:
        probe.close()


def _check_contents(connection: sqlite3.Connection, label: str) -> None:
    """Refuse a file that is not an agentrt database, holds a trigger or a view, or is damaged."""
    try:
        version = int(connection.execute("PRAGMA user_version").fetchone()[0])
        objects = connection.execute("SELECT type, name FROM sqlite_master").fetchall()
        problems = [row[0] for row in connection.execute("PRAGMA quick_check(1)").fetchall()]
    except sqlite3.DatabaseError as exc:
        raise UnsafeDatabase(
            f"database {sanitize(label)} cannot be read ({exc}): it is damaged or not an "
            "agentrt database; restore it from a copy"
        ) from None
    if problems != ["ok"]:
        raise UnsafeDatabase(
            f"database {sanitize(label)} is damaged (SQLite's check: "
            f"{sanitize(str(problems[0]))[:200]}); restore it from a copy"
        )
    tables = {str(row[1]) for row in objects if row[0] == "table"}
    if version == 0 or not tables >= _CORE_TABLES:
        raise StoreError(
            f"{sanitize(label)} is a SQLite database but not an agentrt one (no agentrt "
            "schema); agentrt will not write into it"
        )
    for kind, name in objects:
        if kind in ("trigger", "view"):
            # Nothing of ours creates one; a trigger could rewrite what the gate records.
            raise UnsafeDatabase(
                f"database {sanitize(label)} holds a {kind} {sanitize(repr(str(name)))}; "
                "agentrt databases hold none, and it could change what the gate records"
            )


def _connect(target: str, *, uri: bool, label: str | None = None) -> sqlite3.Connection:
    try:
        connection = sqlite3.connect(
            target, uri=uri, isolation_level=None, check_same_thread=False, timeout=0.1
        )
    except sqlite3.Error as exc:
        raise StoreError(f"database {sanitize(label or target)} cannot be opened: {exc}") from None
    connection.row_factory = sqlite3.Row
    connection.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
    # Schema-defined functions and views never run with our privileges, and
    # SQLite's defensive mode (Python 3.12+) forbids writing the schema itself.
    connection.execute("PRAGMA trusted_schema = OFF")
    setconfig = getattr(connection, "setconfig", None)
    defensive = getattr(sqlite3, "SQLITE_DBCONFIG_DEFENSIVE", None)
    if setconfig is not None and defensive is not None:
        setconfig(defensive, True)
    connection.execute("PRAGMA foreign_keys = ON")
    return connection


def _read_version(connection: sqlite3.Connection, label: str) -> int:
    try:
        return int(connection.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{sanitize(label)} is not an agentrt database: {exc}") from None


def _check_version(connection: sqlite3.Connection, label: str, *, allow_older: bool) -> None:
    version = _read_version(connection, label)
    if version > SCHEMA_VERSION:
        raise newer_build(sanitize(label), version, SCHEMA_VERSION)
    if version < SCHEMA_VERSION and not allow_older:
        if version == 0:
            raise StoreError(f"{sanitize(label)} is not an agentrt database (no schema)")
        raise StoreError(
            f"database {sanitize(label)} has schema {version}; open it once with the program "
            f"that owns it (or `agentrt proxy`/`agentrt demo`) to migrate it to {SCHEMA_VERSION}"
        )


def _migrate(connection: sqlite3.Connection, label: str) -> None:
    connection.execute("BEGIN IMMEDIATE")
    try:
        version = _read_version(connection, label)
        if version > SCHEMA_VERSION:
            raise newer_build(sanitize(label), version, SCHEMA_VERSION)
        for script in _MIGRATIONS[version:]:
            for statement in _split_sql(script):
                connection.execute(statement)
        if version < SCHEMA_VERSION:
            connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
