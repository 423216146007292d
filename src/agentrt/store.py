"""The SQLite store: runs, steps, approvals and a hash-chained event log.

Tables are the state; events are the explanation.  Every state change is
written in the same transaction as its event, and each event's hash covers the
previous event's hash and its own canonical content, so `verify_chain` finds
the first event that was altered, removed or inserted after the fact.

The database is the operator's: whoever can write it can forge an approval.
So a new file is created owner-only (0600, whatever the umask), a file that
group or others can write is refused, a symbolic link is refused, and a
database from a newer build is refused rather than misread.
"""

from __future__ import annotations

import enum
import functools
import json
import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypeVar

import anyio.to_thread

from .canonical import canonical_bytes, canonical_json, parse_json, sha256_hex
from .errors import RunNotFound, StoreError, UnsafeDatabase
from .sanitize import sanitize

__all__ = [
    "GENESIS_HASH",
    "SCHEMA_VERSION",
    "ApprovalRecord",
    "ApprovalStatus",
    "ChainReport",
    "Event",
    "RunRecord",
    "RunStatus",
    "StepRecord",
    "StepStatus",
    "Store",
    "approval_hash",
    "epoch_to_iso",
    "iso_to_epoch",
    "open_store",
    "utc_now",
]

GENESIS_HASH: Final = "0" * 64

_T = TypeVar("_T")


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


def utc_now() -> str:
    """The current UTC time as ISO 8601 with microseconds."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


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
        '{"created_at":' + canonical_json(created_at)
        + ',"payload":' + payload_text
        + ',"prev_hash":' + canonical_json(prev_hash)
        + ',"run_id":' + canonical_json(run_id)
        + ',"seq":' + str(seq)
        + ',"type":' + canonical_json(type_)
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
)
SCHEMA_VERSION: Final = len(_MIGRATIONS)

_BUSY_TIMEOUT_MS: Final = 10_000


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


def _row_to_run(row: sqlite3.Row) -> RunRecord:
    return RunRecord(
        run_id=row["run_id"],
        goal=row["goal"],
        status=RunStatus(row["status"]),
        reason=row["reason"],
        result=row["result"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        step_count=row["step_count"],
        consecutive_failures=row["consecutive_failures"],
        lease_owner=row["lease_owner"],
        lease_expires_at=row["lease_expires_at"],
        metadata=json.loads(row["metadata"]),
        deadline_at=row["deadline_at"],
    )


def _row_to_step(row: sqlite3.Row) -> StepRecord:
    return StepRecord(
        run_id=row["run_id"],
        step=row["step"],
        tool=row["tool"],
        args=row["args"],
        status=StepStatus(row["status"]),
        observation_kind=row["observation_kind"],
        content=row["content"],
        summary=row["summary"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
    )


def _row_to_approval(row: sqlite3.Row) -> ApprovalRecord:
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


def _row_to_event(row: sqlite3.Row) -> Event:
    return Event(
        seq=row["seq"],
        run_id=row["run_id"],
        type=row["type"],
        payload=parse_json(row["payload"]),
        created_at=row["created_at"],
        prev_hash=row["prev_hash"],
        hash=row["hash"],
    )


class Store:
    """One SQLite database of runs, steps, approvals and events.  Use `open_store`."""

    def __init__(self, connection: sqlite3.Connection, path: str, read_only: bool) -> None:
        self._connection = connection
        self._lock = threading.RLock()
        self.path = path
        self.read_only = read_only
        self._pending_events: list[Event] = []

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

    # -- transactions --------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (`BEGIN IMMEDIATE`): committed on success, rolled back on error."""
        if self.read_only:
            raise StoreError(f"database {sanitize(self.path)} is open read-only")
        with self._lock:
            connection = self._connection
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield connection
            except BaseException:
                connection.execute("ROLLBACK")
                self._pending_events.clear()
                raise
            connection.execute("COMMIT")

    def take_committed_events(self) -> list[Event]:
        """Events appended by transactions that have committed since the last call."""
        with self._lock:
            events, self._pending_events = self._pending_events, []
            return events

    def append_event(
        self, connection: sqlite3.Connection, run_id: str, type_: str, payload: Mapping[str, Any]
    ) -> Event:
        """Append one event to the chain; call inside `transaction()`."""
        row = connection.execute(
            "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        seq, prev_hash = (row[0] + 1, row[1]) if row else (1, GENESIS_HASH)
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
            for script in migrations[version:]:
                for statement in _split_sql(script):
                    connection.execute(statement)
            connection.execute(
                "INSERT INTO extensions (name, version) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET version = excluded.version",
                (name, len(migrations)),
            )

    def extension_version(self, name: str) -> int:
        with self._lock:
            row = self._connection.execute(
                "SELECT version FROM extensions WHERE name = ?", (name,)
            ).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- reads ---------------------------------------------------------------

    def _query(self, sql: str, parameters: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._connection.execute(sql, parameters).fetchall()

    def get_run(self, run_id: str) -> RunRecord:
        rows = self._query("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        if not rows:
            raise RunNotFound(f"no run {sanitize(run_id)} in {sanitize(self.path)}")
        return _row_to_run(rows[0])

    def list_runs(self, limit: int = 50, offset: int = 0) -> list[RunRecord]:
        """Runs newest first, those waiting for an approval in front."""
        rows = self._query(
            "SELECT * FROM runs ORDER BY (status = 'waiting_for_approval') DESC,"
            " created_seq DESC LIMIT ? OFFSET ?",
            (limit, offset),
        )
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


def _split_sql(script: str) -> list[str]:
    return [statement.strip() for statement in script.split(";") if statement.strip()]


def open_store(
    path: str | os.PathLike[str], *, read_only: bool = False, create: bool = True
) -> Store:
    """Open (or create) the database at `path`; `":memory:"` for a private in-memory one.

    `create=False` opens an existing database only: a missing file is refused
    and the schema is never migrated.  `read_only=True` implies `create=False`
    and never writes.  Raises `UnsafeDatabase` for a symbolic link, a file
    group or others can write, or a database from a newer build.
    """
    if str(path) == ":memory:":
        connection = _connect(":memory:", uri=False)
        _migrate(connection, ":memory:")
        return Store(connection, ":memory:", read_only=False)
    file_path = Path(path)
    exists = _check_file(file_path)
    if not exists:
        if read_only or not create:
            raise StoreError(f"database {sanitize(str(file_path))} does not exist")
        _create_private(file_path)
    _check_file(file_path)
    _tighten_sidecars(file_path)
    if read_only:
        uri = file_path.resolve().as_uri() + "?mode=ro"
        connection = _connect(uri, uri=True)
        connection.execute("PRAGMA query_only = ON")
        _check_version(connection, str(file_path), allow_older=False)
        return Store(connection, str(file_path), read_only=True)
    connection = _connect(str(file_path), uri=False)
    try:
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = FULL")
        if create:
            _migrate(connection, str(file_path))
        else:
            _check_version(connection, str(file_path), allow_older=False)
    except BaseException:
        connection.close()
        raise
    _tighten_sidecars(file_path)
    return Store(connection, str(file_path), read_only=False)


def _connect(target: str, *, uri: bool) -> sqlite3.Connection:
    try:
        connection = sqlite3.connect(
            target, uri=uri, isolation_level=None, check_same_thread=False, timeout=10.0
        )
    except sqlite3.Error as exc:
        raise StoreError(f"database {sanitize(target)} cannot be opened: {exc}") from None
    connection.row_factory = sqlite3.Row
    connection.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
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
        raise UnsafeDatabase(
            f"database {sanitize(label)} is from a newer build of agentrt (schema {version}, "
            f"this build knows {SCHEMA_VERSION}); upgrade agentrt to open it"
        )
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
            raise UnsafeDatabase(
                f"database {sanitize(label)} is from a newer build of agentrt (schema {version}, "
                f"this build knows {SCHEMA_VERSION}); upgrade agentrt to open it"
            )
        for script in _MIGRATIONS[version:]:
            for statement in _split_sql(script):
                connection.execute(statement)
        if version < SCHEMA_VERSION:
            connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
