"""Opening a store: a SQLite file (checked, created whole, migrated) or a PostgreSQL
database, each refused when its chain is behind its head anchor."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ..errors import StoreBusy, StoreError, UnsafeDatabase, newer_build
from ..sanitize import sanitize
from . import _store
from ._anchor import _anchor_directory, _refuse_if_anchored, postgres_anchor_path
from ._records import AnchorReport
from ._schema import _MIGRATIONS, SCHEMA_VERSION, _split_sql
from ._sqlite import (
    _check_contents,
    _check_directories,
    _check_file,
    _check_header,
    _check_version,
    _connect,
    _create_database,
    _is_busy,
    _migrate,
    _read_version,
    _tighten_sidecars,
)
from ._store import Store
from ._target import is_postgres_url

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _OpeningDeadline:
    """The one busy deadline of opening a database: every step of `open_store` (reading
    the header, the checks, switching to WAL, migrating, checking the anchor) waits out
    another process's lock until it, as a write does, and then says so (`StoreBusy`)."""

    label: str
    seconds: float
    at: float

    @classmethod
    def start(cls, label: str) -> _OpeningDeadline:
        return cls(label, _store._BUSY_DEADLINE_S, time.monotonic() + _store._BUSY_DEADLINE_S)

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def wait_out(self, step: Callable[[], _T]) -> _T:
        """`step()`, tried again in short attempts while the database is busy, until the
        deadline.  A step is one read or one transaction, so trying it again is safe."""
        while True:
            try:
                return step()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise
            if time.monotonic() >= self.at:
                raise StoreBusy(
                    f"database {sanitize(self.label)} stayed locked by another process for "
                    f"{self.seconds:g}s while it was being opened; nothing was written"
                )
            time.sleep(0.005)


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
    deadline = _OpeningDeadline.start(label)
    if not read_only:
        _check_directories(file_path)
    exists = _check_file(file_path)
    if not exists:
        if read_only or not create:
            raise StoreError(f"database {sanitize(label)} does not exist")
        _create_database(file_path, anchor_path)
        _check_file(file_path)
    deadline.wait_out(lambda: _check_header(file_path))
    _tighten_sidecars(file_path)
    if read_only:
        uri = file_path.resolve().as_uri() + "?mode=ro"
        connection = _connect(uri, uri=True, label=label)
        try:
            connection.execute("PRAGMA query_only = ON")
            deadline.wait_out(lambda: _check_contents(connection, label))
            deadline.wait_out(lambda: _check_version(connection, label, allow_older=False))
        except BaseException:
            connection.close()
            raise
        return Store(connection, label, True, anchor_path)
    connection = _connect(label, uri=False)
    try:
        deadline.wait_out(lambda: _check_contents(connection, label))
        deadline.wait_out(lambda: connection.execute("PRAGMA journal_mode = WAL"))
        connection.execute("PRAGMA synchronous = FULL")
        if create:
            if 0 < deadline.wait_out(lambda: _read_version(connection, label)) < SCHEMA_VERSION:
                _refuse_lost(_opening(Store(connection, label, False, anchor_path), deadline))
            deadline.wait_out(lambda: _migrate(connection, label))
        else:
            deadline.wait_out(lambda: _check_version(connection, label, allow_older=False))
    except sqlite3.DatabaseError as exc:
        connection.close()
        raise StoreError(f"database {sanitize(label)} cannot be opened: {exc}") from None
    except BaseException:
        connection.close()
        raise
    _tighten_sidecars(file_path)
    store = _anchored(_opening(Store(connection, label, False, anchor_path), deadline))
    store.busy_deadline = _store._BUSY_DEADLINE_S
    return store


def _opening(store: Store, deadline: _OpeningDeadline) -> Store:
    """`store` waiting out a busy database only for what is left of opening's deadline."""
    store.busy_deadline = deadline.left()
    return store


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


def _open_postgres(url: str, *, read_only: bool, create: bool) -> Store:
    try:
        from . import _postgres
    except ImportError:
        raise StoreError(
            "a postgresql:// database needs psycopg: install agentrt[postgres]"
        ) from None
    connection = _postgres.connect(url, read_only=read_only, lock_timeout_s=_store._BUSY_DEADLINE_S)
    label = connection.label
    backend = _postgres.PostgresBackend(connection)
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
                _refuse_lost(Store(connection, label, False, anchor_path, backend))
            _postgres.migrate(connection, _MIGRATIONS, _split_sql)
    except BaseException:
        connection.close()
        raise
    store = Store(connection, label, read_only, anchor_path, backend)
    return store if read_only else _anchored(store)
