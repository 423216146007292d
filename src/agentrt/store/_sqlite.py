"""SQLite: opening a database file safely, its schema's version, and the store's hooks
for it.

The database is the operator's: whoever can write it can forge an approval.  So a new
file is created owner-only (0600, whatever the umask), a file that group or others can
write is refused, a symbolic link is refused, and a database from a newer build is
refused rather than misread.  An existing file is opened only if it already holds the
agentrt schema (never initialised in place), holds no trigger or view, and passes
SQLite's quick check.  SQLite's errors while opening are said as `StoreError` or
`UnsafeDatabase` in one sentence naming the file.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Final

from ..errors import StoreConflict, StoreError, UnsafeDatabase, newer_build
from ..sanitize import sanitize
from ._anchor import _refuse_if_anchored, _write_anchor
from ._backend import Busy
from ._chain import GENESIS_HASH
from ._records import Connection
from ._schema import _CORE_TABLES, _MIGRATIONS, SCHEMA_VERSION, _split_sql

# A write the database refused for a unique key or a reference, on either backend.
INTEGRITY_ERRORS: Final[tuple[type[Exception], ...]] = (sqlite3.IntegrityError, StoreConflict)
# Any error of the database, on either backend (SQLite's as its driver raises it, and
# PostgreSQL's said as `StoreError` by its adapter): what a caller above the store catches
# to tell a failed store call from its own failures, so that it names no driver.
DATABASE_ERRORS: Final[tuple[type[Exception], ...]] = (sqlite3.Error, StoreError)


# SQLite waits this long for a lock inside one attempt; the store retries
# attempts (releasing its own lock in between, so reads go on) until
# `Store.busy_deadline`, then says so in one sentence.
_BUSY_TIMEOUT_MS: Final = 100


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc)


class SqliteBackend:
    """The store's hooks for SQLite (see `Backend`): one host's database file, judged on
    this host's clock, its head anchor kept beside it."""

    name: Final = "sqlite"
    server_clock: Final = None
    anchor_per_host: Final = False

    def __init__(self, label: str) -> None:
        self._label = label

    def begin(self, connection: Connection) -> float | None:
        """`BEGIN IMMEDIATE`: SQLite's write lock, taken now or `Busy`."""
        try:
            connection.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                raise Busy from None
            raise StoreError(
                f"database {sanitize(self._label)} cannot start a write: {exc}"
            ) from None
        return None

    def is_busy(self, error: Exception) -> bool:
        return isinstance(error, sqlite3.OperationalError) and _is_busy(error)

    def settle(self, connection: Connection) -> None:
        return None  # every statement was answered when it returned

    def ddl(self, statement: str) -> str:
        return statement

    def lost_events(self, anchor: str) -> str:
        return "(a deleted WAL, an older copy restored, or a truncated file)"


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
    probe = sqlite3.connect(
        f"{Path(os.path.abspath(path)).as_uri()}?mode=ro", uri=True, timeout=_BUSY_TIMEOUT_MS / 1000
    )
    try:
        probe.execute("PRAGMA schema_version").fetchone()
    except sqlite3.DatabaseError as exc:
        if _is_busy(exc):
            raise  # another process holds it: not a verdict on the file
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
        if _is_busy(exc):
            raise  # another process holds it: not a verdict on the file
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
        if _is_busy(exc):
            raise  # another process holds it: not a verdict on the file
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
