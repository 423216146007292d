"""The schema: the core tables' forward-only migrations, and the extensions' own."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from ..errors import UnsafeDatabase
from ..sanitize import sanitize
from ._records import Connection

if TYPE_CHECKING:
    from ._backend import Backend


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


_CORE_TABLES: Final = frozenset({"runs", "steps", "approvals", "events", "extensions"})


def _split_sql(script: str) -> list[str]:
    return [statement.strip() for statement in script.split(";") if statement.strip()]


class _Extensions:
    """The tables a module of the store adds (the proxy's call index, the accounting),
    each migrated forward-only under its own name (a mixin of `Store`)."""

    # The store's, set by `Store.__init__`.
    path: str
    _connection: Connection
    _lock: threading.RLock
    _backend: Backend

    def transaction(self) -> contextlib.AbstractContextManager[Connection]:
        raise NotImplementedError  # `Store.transaction`

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
                    connection.execute(self._backend.ddl(statement))
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
