"""The store's PostgreSQL backend: a connection with the surface the store's SQL uses.

The gate, the proxy's call index, the approvals and the accounting write their
SQL once, in SQLite's dialect (`?` placeholders, rows read by index and by
name).  `PostgresConnection` gives them that surface over psycopg 3, so the
SQL is shared and the dialect differences live here: placeholders, column
types in migrations, the schema version, the write lock and the clock.

Writers serialise on one advisory transaction lock (`WRITE_LOCK`), taken at
the start of every write transaction, as SQLite's `BEGIN IMMEDIATE` takes
its write lock: the chain head is read and extended under it, and every
check-then-write decision (a lease, a compare-and-set, the call index's
rules) sees every earlier commit, whichever host made it (but for scoped
writes, below).  Times that judge
a lease or a hold are the database server's (`clock_timestamp()`, read in the
same statement that took the lock), so hosts whose clocks disagree still
agree on who holds what.

Every other writer waits while one holds that lock, so a write holds it for as
few round trips as it can (decision 0044): its statements go out in psycopg's
pipeline mode, BEGIN and the lock together; the chain's appends and a unit's
savepoints are not waited for one by one but answered together at the end of
the unit (`settle`) or with the next statement that is; any other statement
is answered before `execute` returns, as without a pipeline, so a caller that
catches its error or reads its result sees what it always saw.  The
statements sent, and their order, are the same.  Their values are bound on the
server, and a statement sent a few times on a connection is prepared there
(decision 0060): the server parses and plans it once, not once per call; one
whose rows are every column of a table (`SELECT *`, `RETURNING *`) never is,
since a column another process adds would make PostgreSQL refuse it.

A write that is not scoped does all of its work holding that lock: nothing else
writes meanwhile.  A scoped write (`Store.write_scoped`, decision 0065: a proxy's
call decided, its run started and its step recorded; its result) takes the lock
*shared*, then its scope's locks (`_scope_locks`: its session's, a tool's and a
request's within it, exclusive at the scope's own level and shared above), and
does its reads and row writes beside other scopes' writes; its events wait for
the chain's lock (`CHAIN_LOCK`), taken at its end and held to its COMMIT, under
which the head is read and the events written, so the chain stays one order,
gap-free, in commit order.  Locks are taken in one order (the write lock, a
session's, a tool's, a request's, the chain's) and the only other scopes a write
takes are taken without waiting (`try_scopes`), so no two writes wait on each
other.

Credentials come only from libpq's environment (`PGPASSWORD`, a pgpass file,
a service): a URL holding a password is refused, so no password is ever
written into an event, a log or an error.  This module imports psycopg; the
store imports this module only for a `postgresql://` URL.  `PostgresBackend` holds
the store's hooks for PostgreSQL (`_backend.Backend`).
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import psycopg
import psycopg.conninfo
import psycopg.errors
import psycopg.rows

from ..errors import StoreBusy, StoreConflict, StoreError, UnsafeDatabase, newer_build
from ..sanitize import sanitize
from ._backend import Scope
from ._chain import GENESIS_HASH
from ._records import Connection

__all__ = [
    "CHAIN_LOCK",
    "KEY_SPACE",
    "SESSION_SPACE",
    "WRITE_LOCK",
    "PostgresBackend",
    "PostgresConnection",
    "connect",
    "redacted",
]

# The key of the advisory lock every write transaction takes first (any
# 64-bit number nothing else in the database uses: "agentrt" in ASCII).
WRITE_LOCK: Final = 0x6167656E747274

# The statement that takes it, with the server's time then.
_TAKE_WRITE_LOCK: Final = (
    "SELECT pg_advisory_xact_lock(?), EXTRACT(EPOCH FROM clock_timestamp())::float8"
)

# A scoped write (decision 0065) takes the same key *shared*: scoped writes run beside
# one another, and every other write (taking it exclusive, as every earlier build did)
# excludes them all.  Then its scope's locks, a hierarchy (`_scope_locks`): its session's
# (in a key space of its own, the two 32-bit keys' form), a tool's and a request's
# within it (`KEY_SPACE`), each exclusive at the scope's own level and shared above it;
# and, for its events, the chain's lock last, held to its COMMIT.
_SHARE_WRITE_LOCK: Final = "SELECT pg_advisory_xact_lock_shared(?)"
SESSION_SPACE: Final = 0x61677274  # "agrt": the sessions' locks
KEY_SPACE: Final = 0x6167726B  # "agrk": the locks of a tool, or a request, of a session
_CLOCK: Final = "EXTRACT(EPOCH FROM clock_timestamp())::float8"
_TRY_SCOPES: Final = (
    "SELECT session, tool, key, CASE"
    " WHEN tool = '' THEN pg_try_advisory_xact_lock(?, hashtext(session))"
    " WHEN key = '' THEN pg_try_advisory_xact_lock_shared(?, hashtext(session))"
    " AND pg_try_advisory_xact_lock(?, hashtext(session || '/' || tool))"
    " ELSE pg_try_advisory_xact_lock_shared(?, hashtext(session))"
    " AND pg_try_advisory_xact_lock_shared(?, hashtext(session || '/' || tool))"
    " AND pg_try_advisory_xact_lock(?, hashtext(session || '/' || tool || '/' || key)) END"
    " FROM unnest(?::text[], ?::text[], ?::text[]) AS scope (session, tool, key)"
)
CHAIN_LOCK: Final = 0x6167656E746368  # "agentch"
_TAKE_CHAIN_LOCK: Final = f"SELECT pg_advisory_xact_lock(?), {_CLOCK}"
# A run's creation order, drawn under the chain's lock (so two scoped writes started
# beside one another never draw the same number).
_DRAW_RUN_ORDER: Final = (
    "UPDATE runs SET created_seq = (SELECT COALESCE(MAX(created_seq), 0) + 1 FROM runs)"
    " WHERE run_id = ?"
)
# A scoped write's event, appended after the chain's head (the newest event, one probe of
# the primary key's index from its end, or the genesis hash for an empty chain) with the
# head's seq and hash spliced into its envelope and hashed on the server: no round trip to
# read the head (`append_at_head`).
_APPEND_AT_HEAD: Final = (
    "INSERT INTO events (seq, run_id, type, payload, created_at, prev_hash, hash)"
    " SELECT head.seq + 1, ?, ?, ?, ?, head.hash, encode(sha256(convert_to("
    "? || head.hash || ? || (head.seq + 1)::text || ?, 'UTF8')), 'hex')"
    " FROM (SELECT COALESCE(last.seq, 0) AS seq, COALESCE(last.hash, ?) AS hash"
    " FROM (SELECT 1) AS one LEFT JOIN LATERAL"
    " (SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1) AS last ON true) AS head"
    " RETURNING seq, prev_hash, hash"
)

# A statement whose rows are every column of a table is never prepared
# (`PostgresConnection._send`).
_EVERY_COLUMN: Final = re.compile(r"\b(?:SELECT|RETURNING) \*")


@functools.lru_cache(maxsize=1024)
def _prepare(sql: str) -> bool | None:
    """psycopg's `prepare` for a statement: None (after a few uses), or never."""
    return False if _EVERY_COLUMN.search(sql) else None


def _scope_locks(scope: Scope) -> tuple[str, tuple[Any, ...]]:
    """The one statement a scoped write's BEGIN sends for `scope`: the write lock shared,
    then the session's, the tool's and the request's locks down to the scope's own level,
    shared above it and exclusive at it (so a write of a whole session waits for every
    write of its tools and requests, and one of a tool for its requests'), with the
    server's time once all are held.  Each lock is taken in a subquery of the next, so
    the server takes them in that order, always (a subquery whose output is a volatile
    function's is scanned, not flattened, and is read before its parent's row is made)."""
    session, tool, key = scope
    names = [session] + ([f"{session}/{tool}"] if tool else [])
    names += [f"{session}/{tool}/{key}"] if tool and key else []
    sql = "SELECT pg_advisory_xact_lock_shared(?) AS held"
    parameters: list[Any] = [WRITE_LOCK]
    for level, name in enumerate(names):
        space = SESSION_SPACE if level == 0 else KEY_SPACE
        taken = (
            f"pg_advisory_xact_lock(?, hashtext(?)), {_CLOCK}"
            if level == len(names) - 1
            else "pg_advisory_xact_lock_shared(?, hashtext(?)) AS held"
        )
        sql = f"SELECT {taken} FROM ({sql}) AS x{level}"
        parameters = [space, name, *parameters]  # (the outermost statement's come first)
    return sql, tuple(parameters)


def _trying(scopes: Sequence[Scope]) -> tuple[str, tuple[Any, ...]]:
    """The statement that tries the locks of `scopes` (`PostgresConnection.try_scopes`)."""
    return _TRY_SCOPES, (
        SESSION_SPACE, SESSION_SPACE, KEY_SPACE, SESSION_SPACE, KEY_SPACE, KEY_SPACE,
        *([scope[level] for scope in scopes] for level in range(3)),
    )  # fmt: skip


def _granted(rows: Sequence[Any]) -> set[Scope]:
    return {(row[0], row[1], row[2]) for row in rows if row[3]}


# Whether this libpq has pipeline mode (14 and later; psycopg's binary wheels have it).
_PIPELINE: Final = psycopg.capabilities.has_pipeline()

# Statements of a write not waited for one by one: the chain's appends (answered
# together at the end of the unit, `settle`, or before the COMMIT: nobody catches their
# error, a refused one fails the unit or the write) and a unit's savepoints (answered
# with the next statement that is).  A scoped write's tail is sent the same way, by name
# (`send_unanswered`).
_APPEND: Final = "INSERT INTO events "
_BOOKKEEPING: Final = ("SAVEPOINT ", "RELEASE ", "ROLLBACK TO ")

# The server ended the session (`pg_terminate_backend`, a shutdown): the connection is as
# good as broken, even when this answer is read before the socket's end is.
_SESSION_ENDED: Final = (psycopg.errors.AdminShutdown, psycopg.errors.CrashShutdown)

# PostgreSQL's REAL and INTEGER are 4 bytes: an epoch time in a REAL would lose
# its seconds, so the shared migrations' types are widened here.
_WIDER_TYPES: Final = (
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
)


def redacted(url: str) -> str:
    """The URL as it may be shown: user, host, port and database, never a password."""
    try:
        parts = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://(a URL that does not parse)"
    user = f"{parts['user']}@" if parts.get("user") else ""
    host = str(parts.get("host") or "")
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{host}{port}/{parts.get('dbname') or ''}"


def _parameters(url: str) -> dict[str, Any]:
    try:
        parts = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        raise StoreError(
            f"database URL {redacted(url)} does not parse as a PostgreSQL connection URL"
        ) from None
    if parts.get("password"):
        raise StoreError(
            f"database URL {redacted(url)} holds a password; agentrt never takes one from a "
            "URL (it would be shown and logged): give it through PGPASSWORD, a pgpass file "
            "or a libpq service instead"
        )
    return parts


@functools.lru_cache(maxsize=1024)
def _translate(sql: str) -> str:
    """SQLite's `?` placeholders as psycopg's `%s` (and a literal `%` doubled), outside
    quoted text; only for a statement with parameters (one without is sent as it is)."""
    out: list[str] = []
    quote: str | None = None
    for character in sql:
        if quote is not None:
            if character == quote:
                quote = None
            out.append("%%" if character == "%" else character)
        elif character in ("'", '"'):
            quote = character
            out.append(character)
        elif character == "?":
            out.append("%s")
        elif character == "%":
            out.append("%%")
        else:
            out.append(character)
    return "".join(out)


def widen_types(statement: str) -> str:
    """A shared migration's statement with PostgreSQL's 8-byte types."""
    for pattern, replacement in _WIDER_TYPES:
        statement = pattern.sub(replacement, statement)
    return statement


class Row(tuple[Any, ...]):
    """A result row readable by index and by column name, as `sqlite3.Row` is."""

    __slots__ = ()
    _index: dict[str, int]

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


@functools.lru_cache(maxsize=256)
def _row_class(names: tuple[str, ...]) -> type[Row]:
    return type("Row", (Row,), {"__slots__": (), "_index": {n: i for i, n in enumerate(names)}})


def _row_factory(cursor: Any) -> Any:
    description = cursor.description
    if description is None:
        return tuple
    row_class = _row_class(tuple(column.name for column in description))
    return row_class


class Cursor:
    """The part of `sqlite3.Cursor` the store's SQL uses: rows, iteration, rowcount.

    A statement of a write is sent without waiting for its answer (`PostgresConnection`);
    the first look at its rows or its row count waits for it (and for every statement
    sent before it), so a caller that reads a result sees the same as if each statement
    had been waited for."""

    __slots__ = ("_cursor", "_owner")

    def __init__(
        self,
        cursor: psycopg.Cursor[Any] | None,
        owner: PostgresConnection | None = None,
    ) -> None:
        # None: a statement nothing was sent for (a ROLLBACK of what the server ended).
        self._cursor = cursor
        self._owner = owner  # set while the statement's answer may still be on its way

    def _answered(self) -> psycopg.Cursor[Any] | None:
        cursor, owner = self._cursor, self._owner
        if cursor is not None and owner is not None and cursor.pgresult is None:
            owner.sync()
        self._owner = None
        return cursor

    @property
    def rowcount(self) -> int:
        cursor = self._answered()
        return -1 if cursor is None else cursor.rowcount

    def fetchone(self) -> Any:
        cursor = self._answered()
        if cursor is None or cursor.description is None:
            return None
        return cursor.fetchone()

    def fetchall(self) -> list[Any]:
        cursor = self._answered()
        if cursor is None or cursor.description is None:
            return []
        return cursor.fetchall()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())


class PostgresConnection:
    """One psycopg connection in autocommit mode (the store sends BEGIN and COMMIT itself),
    with `sqlite3.Connection`'s `execute`, `executemany`, `in_transaction` and `close`.

    A unique-key violation is raised as `StoreConflict`, a lock wait past the
    deadline as `StoreBusy`, any other database error as `StoreError`, each
    naming the database by its redacted URL.

    A connection that breaks (the server restarted, the session was ended) is
    opened again, with the same settings, at the next statement that may be
    sent again safely: a `BEGIN`, or a read outside a write — a statement that
    broke is then sent once more on the new connection.  A write the break
    cut is never continued on another connection: its statements fail with
    one sentence until the store rolls it back (nothing of it was written:
    the server ends an open transaction with its session), and a COMMIT whose
    answer the break took is reported as unknown, not as failed.
    """

    def __init__(
        self,
        connection: psycopg.Connection[Any],
        label: str,
        *,
        parameters: dict[str, Any],
        settings: Sequence[str],
    ) -> None:
        self._connection = connection
        self.label = label
        # How to open it again, until it is closed on purpose.
        self._parameters = parameters
        self._settings = tuple(settings)
        self._closed = False
        self._writing = False  # between a BEGIN this sent and its COMMIT or ROLLBACK
        self._cut = False  # the connection broke inside a write not yet rolled back
        # A write's statements go out in pipeline mode (`begin_write`): sent without
        # waiting for each answer, answered together when a result is read, at
        # `settle`, and at the COMMIT.
        self._pipeline: psycopg.Pipeline | None = None
        self._pipeline_scope: contextlib.AbstractContextManager[psycopg.Pipeline] | None = None
        self._unanswered = 0  # statements sent since the last wait for answers

    @property
    def in_transaction(self) -> bool:
        if self._cut:
            return True  # until the store rolls back the write the break cut
        if self._connection.broken or self._connection.closed:
            return False  # the server ended whatever was open with the session
        if self._pipeline is not None:
            return True  # a write this began, not ended yet
        return self._connection.info.transaction_status != psycopg.pq.TransactionStatus.IDLE

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Cursor:
        if self._cut or (self._writing and self._connection.broken):
            # The break came inside a write: nothing of it stands on the server, and no
            # statement of it (a COMMIT least of all) may go on on another connection.
            self._writing = False
            self._drop_pipeline()
            if sql == "ROLLBACK":
                self._cut = False
                return Cursor(None)
            if sql != "BEGIN":
                self._cut = True
                raise self._cut_write()
            self._cut = False
        if self._pipeline is not None:
            return self._pipelined(sql, parameters)
        if sql == "COMMIT" and self._failed():
            # PostgreSQL answers COMMIT of a failed transaction by rolling it back,
            # silently: say so instead of letting a caller believe it was written.
            self.rollback_quietly()
            raise StoreError(
                f"database {self.label} rolled back a transaction after an error in it; "
                "nothing of it was written"
            )
        if self._connection.broken or self._connection.closed:
            self._reopen()
        writing = self._writing
        try:
            cursor = self._send(sql, parameters)
        except psycopg.Error as exc:
            if not self._connection.broken:
                raise self._mapped(exc) from None
            self._writing = False
            if sql == "COMMIT":
                raise StoreError(
                    f"the connection to database {self.label} broke before its COMMIT was "
                    "answered; whether the write was kept is unknown"
                ) from None
            if writing:
                self._cut = True
                raise self._cut_write() from None
            # A BEGIN or a read outside a write did nothing yet: send it again, once.
            self._reopen()
            try:
                cursor = self._send(sql, parameters)
            except psycopg.Error as again:
                raise self._mapped(again) from None
        if sql == "BEGIN":
            self._writing = True
        elif sql in ("COMMIT", "ROLLBACK"):
            self._writing = False
        return Cursor(cursor)

    # -- a write in pipeline mode ---------------------------------------------

    def _pipelined(self, sql: str, parameters: Sequence[Any]) -> Cursor:
        """Send one statement of the write without waiting for its answer."""
        if sql in ("COMMIT", "ROLLBACK"):
            return self._end_write(sql)
        try:
            cursor = self._send(sql, parameters)
        except psycopg.Error as exc:
            raise self._refused_in_pipeline(exc) from None
        if sql.startswith(_APPEND):
            self._unanswered += 1  # answered by the unit's `settle`, or a later read
        elif not sql.startswith(_BOOKKEEPING):
            # Any other statement is answered before it returns, as outside a pipeline:
            # a caller may catch its error (a duplicate run id) or act on its effect.
            self.sync()
        return Cursor(cursor, self)

    def settle(self) -> None:
        """Wait for the answers to every statement of the write sent so far, raising the
        error of one the server refused (mapped as `execute` maps it)."""
        if self._unanswered:
            self.sync()

    def sync(self) -> None:
        """`settle`, even when only a savepoint's statement is unanswered."""
        pipeline = self._pipeline
        if pipeline is None:
            return
        try:
            pipeline.sync()
        except psycopg.Error as exc:
            raise self._refused_in_pipeline(exc) from None
        self._unanswered = 0

    def _refused_in_pipeline(self, exc: psycopg.Error) -> StoreError:
        """The error to raise for `exc`, met while the write's statements were answered;
        the pipeline is left ready for the write's ROLLBACK (or ROLLBACK TO)."""
        ended = isinstance(exc, _SESSION_ENDED)
        if self._connection.broken or ended:
            self._drop_pipeline()
            if ended:  # (its answer read before the end of the socket: closed here)
                self._connection.close()
            self._writing, self._cut = False, True
            return self._cut_write()
        pipeline = self._pipeline
        if pipeline is not None:
            # The server skipped what followed the refused statement up to the next
            # sync: read those answers too, so the write can be rolled back.
            with contextlib.suppress(psycopg.Error):
                pipeline.sync()
        self._unanswered = 0
        return self._mapped(exc)

    def _end_write(self, sql: str, *, settle: bool = True) -> Cursor:
        """COMMIT or ROLLBACK the write and leave pipeline mode."""
        if sql == "COMMIT" and settle:
            # Make sure every statement of the write was kept before asking for the
            # COMMIT, so a break while it is answered leaves only its own fate unknown
            # (but not after a scoped write's tail, `commit_unanswered`: all in one).
            self.settle()
        scope = self._pipeline_scope
        cursor: psycopg.Cursor[Any] | None = None
        try:
            cursor = self._send(sql, ())
            if scope is not None:
                scope.__exit__(None, None, None)  # one sync: every answer, then pipeline off
        except psycopg.Error as exc:
            broken = self._connection.broken
            self._forget_pipeline()
            self._writing = False
            if sql == "ROLLBACK":
                if not broken:
                    self._connection.close()  # the server ends the write with the session
                return Cursor(None)
            if broken:
                raise StoreError(
                    f"the connection to database {self.label} broke before its COMMIT was "
                    "answered; whether the write was kept is unknown"
                ) from None
            self._connection.close()  # the write is not kept; a new session for the next
            raise self._mapped(exc) from None
        self._forget_pipeline()
        self._writing = False
        if sql == "COMMIT" and cursor is not None and cursor.statusmessage == "ROLLBACK":
            # PostgreSQL answers COMMIT of a failed transaction by rolling it back,
            # silently: say so instead of letting a caller believe it was written.
            raise StoreError(
                f"database {self.label} rolled back a transaction after an error in it; "
                "nothing of it was written"
            )
        return Cursor(cursor)

    def _enter_pipeline(self) -> None:
        scope = self._connection.pipeline()
        self._pipeline = scope.__enter__()
        self._pipeline_scope = scope
        self._unanswered = 0

    def _forget_pipeline(self) -> None:
        self._pipeline = self._pipeline_scope = None
        self._unanswered = 0

    def _drop_pipeline(self) -> None:
        """Leave pipeline mode on a connection that broke (nothing can be answered)."""
        scope = self._pipeline_scope
        self._forget_pipeline()
        if scope is not None:
            with contextlib.suppress(Exception):
                scope.__exit__(None, None, None)

    def _send(self, sql: str, parameters: Sequence[Any]) -> psycopg.Cursor[Any]:
        cursor = self._connection.cursor()
        if parameters:
            # A statement sent a few times is prepared (psycopg's `prepare_threshold`), but
            # not one whose rows are every column of a table: another process adding a
            # column (a newer build's migration) would make PostgreSQL refuse it ("cached
            # plan must not change result type"), where the same text unprepared reads on.
            cursor.execute(_translate(sql), tuple(parameters), prepare=_prepare(sql))
        else:
            cursor.execute(sql)
        return cursor

    def _cut_write(self) -> StoreError:
        return StoreError(
            f"the connection to database {self.label} broke during a write; "
            "nothing of it was written"
        )

    def _reopen(self) -> None:
        """Replace a broken connection with a new one with the same settings."""
        if self._closed:
            raise StoreError(f"database {self.label} is closed")
        fresh = _open(self._parameters, self.label)
        try:
            for setting in self._settings:
                fresh.execute(setting)
        except psycopg.Error as exc:
            fresh.close()
            raise self._mapped(exc) from None
        self._connection = fresh
        self._writing = False

    def _failed(self) -> bool:
        return self._connection.info.transaction_status == psycopg.pq.TransactionStatus.INERROR

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        # psycopg sends the rows in one pipeline: one round trip, not one per row.
        # (Only ever inside a write: a break cuts it, as in `execute`.)
        if self._cut or (self._writing and self._connection.broken):
            self._writing, self._cut = False, True
            self._drop_pipeline()
            raise self._cut_write()
        try:
            self._connection.cursor().executemany(_translate(sql), [tuple(row) for row in rows])
        except psycopg.Error as exc:
            if self._pipeline is not None:
                raise self._refused_in_pipeline(exc) from None
            if self._connection.broken and self._writing:
                self._writing, self._cut = False, True
                raise self._cut_write() from None
            raise self._mapped(exc) from None
        if self._pipeline is not None:
            self._unanswered += 1

    def _mapped(self, exc: psycopg.Error) -> StoreError:
        detail = sanitize(
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        )
        if isinstance(exc, psycopg.errors.IntegrityError):
            return StoreConflict(f"database {self.label} refused a write: {detail}")
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return StoreBusy(
                f"database {self.label} stayed locked by another writer; nothing was written"
            )
        return StoreError(f"database {self.label}: {detail}")

    def begin_write(
        self, scope: Scope | None = None, others: Sequence[Scope] = ()
    ) -> tuple[float, set[Scope]]:
        """Start a write transaction holding the write lock, its statements in pipeline
        mode from here to its COMMIT or ROLLBACK; return the server's time then, and the
        scopes of `others` it holds.

        With a `scope` (decision 0065) the write lock is taken shared, then the scope's
        own locks (`_scope_locks`): the write runs beside other scopes' writes, and its
        events wait for the chain's lock (`take_chain`); `others`, the scopes of the
        batch's other units, are then tried without waiting.  BEGIN and the locks go out
        together, one round trip.  A connection found broken by them is opened again and
        they are sent once more (nothing was written yet).
        """
        if not _PIPELINE:
            return self._begin_waiting_each(scope, others)
        if self._cut or (self._writing and self._connection.broken):
            self._drop_pipeline()
            self._writing = self._cut = False
        for last in (False, True):
            if self._connection.broken or self._connection.closed:
                self._reopen()
            try:
                self._enter_pipeline()
                self._send("BEGIN", ())
                tried = None
                granted: set[Scope] = set()
                if scope is None:
                    cursor = self._send(_TAKE_WRITE_LOCK, (WRITE_LOCK,))
                else:
                    cursor = self._send(*_scope_locks(scope))
                    if others:
                        tried = self._send(*_trying(others))
                assert self._pipeline is not None
                self._pipeline.sync()
                row = cursor.fetchone()
                if tried is not None:
                    granted = _granted(tried.fetchall())
            except psycopg.Error as exc:
                broken = self._connection.broken
                if broken:
                    self._drop_pipeline()
                    if not last:
                        continue
                    raise self._mapped(exc) from None
                error = self._refused_in_pipeline(exc)
                self.rollback_quietly()
                raise error from None
            except BaseException:
                self.rollback_quietly()
                raise
            if row is None:
                self.rollback_quietly()
                raise StoreError(f"database {self.label} did not answer for its write lock")
            self._writing = True
            return float(row[1]), granted
        raise AssertionError("unreachable")  # (the loop returns or raises)

    def _begin_waiting_each(
        self, scope: Scope | None, others: Sequence[Scope]
    ) -> tuple[float, set[Scope]]:
        """`begin_write` where libpq has no pipeline mode (before 14): every statement of
        the write waited for, one by one."""
        self.execute("BEGIN")
        granted: set[Scope] = set()
        try:
            if scope is None:
                row = self.execute(_TAKE_WRITE_LOCK, (WRITE_LOCK,)).fetchone()
            else:
                row = self.execute(*_scope_locks(scope)).fetchone()
                if others:
                    granted = self.try_scopes(others)
        except BaseException:
            self.rollback_quietly()
            raise
        return float(row[1]), granted

    def try_scopes(self, scopes: Sequence[Scope]) -> set[Scope]:
        """Inside a scoped write, take the locks of more `scopes` where no other write
        holds them, never waiting (so no two writes can wait on each other's scopes);
        the scopes now held."""
        return _granted(self.execute(*_trying(scopes)).fetchall())

    def send_unanswered(self, sql: str, parameters: Sequence[Any] = ()) -> Cursor:
        """Inside a write: send a statement without waiting for its answer (answered by
        `settle`, a later read, or the COMMIT); outside pipeline mode, as `execute`."""
        if self._pipeline is None:
            return self.execute(sql, parameters)
        try:
            cursor = self._send(sql, parameters)
        except psycopg.Error as exc:
            raise self._refused_in_pipeline(exc) from None
        self._unanswered += 1
        return Cursor(cursor, self)

    def take_chain(self) -> Cursor:
        """Inside a scoped write: send the chain's lock (held to the COMMIT) without
        waiting for it; the server's time once it is held, read after the COMMIT."""
        return self.send_unanswered(_TAKE_CHAIN_LOCK, (CHAIN_LOCK,))

    def draw_run_order(self, run_id: str) -> None:
        """Inside a scoped write holding (or waiting for) the chain's lock: send run
        `run_id`'s creation order, the next under the lock, without waiting."""
        self.send_unanswered(_DRAW_RUN_ORDER, (run_id,))

    def append_at_head(self, events: Sequence[Sequence[Any]]) -> list[Cursor]:
        """Inside a scoped write holding (or waiting for) the chain's lock: append
        `events` (run id, type, payload, time, and the envelope's three parts around the
        head's hash and seq, `envelope_parts`) after the chain's head, read and hashed on
        the server by each statement itself, sent without waiting (decision 0065).  Each
        cursor gives the event's seq, prev hash and hash once answered.

        The head is read inside each `INSERT`, a statement sent after the lock's: under
        READ COMMITTED a statement sees the commits made before it started, and one that
        waited for the lock would not see those made while it waited (decision 0058)."""
        return [self.send_unanswered(_APPEND_AT_HEAD, (*event, GENESIS_HASH)) for event in events]

    def commit_unanswered(self) -> Cursor:
        """COMMIT a write whose last statements were sent without waiting (a scoped
        write's tail): they go out with the COMMIT, all answered in one round trip (a
        refused one fails the COMMIT, and nothing of the write is kept)."""
        if self._pipeline is None or self._cut or self._connection.broken:
            return self.execute("COMMIT")  # (which says what became of the write)
        return self._end_write("COMMIT", settle=False)

    def rollback_quietly(self) -> None:
        self._cut = self._writing = False
        if self._pipeline is not None:
            self._end_write("ROLLBACK")
            return
        if self.in_transaction:
            try:
                self._connection.execute("ROLLBACK")
            except psycopg.Error:
                return

    def close(self) -> None:
        self._closed = True  # on purpose: never opened again
        self._connection.close()


class PostgresBackend:
    """The store's hooks for PostgreSQL (see `Backend`): the write lock and the clock are
    the server's, and each host keeps its own head anchor for the database."""

    name: Final = "postgresql"
    server_clock: Final = "SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8"
    anchor_per_host: Final = True

    def __init__(self, connection: PostgresConnection) -> None:
        self._connection = connection

    # Writes may be scoped: scoped ones run beside one another (decision 0065).
    scopes: Final = True

    def begin(self, connection: Connection) -> float | None:
        """`BEGIN` and the write lock, waited for by the server (a wait past the lock
        timeout is `StoreBusy`); the server's time then."""
        return self._connection.begin_write()[0]  # the store's connection

    def begin_scoped(
        self, connection: Connection, scope: Scope, others: Sequence[Scope] = ()
    ) -> tuple[float | None, set[Scope]]:
        """`begin` with the write lock shared and the scope's own, `others` tried."""
        return self._connection.begin_write(scope, others)

    def try_scopes(self, connection: Connection, scopes: Sequence[Scope]) -> set[Scope]:
        """Of `scopes`, those whose locks this scoped write now holds (never waiting)."""
        return self._connection.try_scopes(scopes)

    def take_chain(self, connection: Connection) -> Cursor:
        """The chain's lock, sent without waiting: where a scoped write's tail begins."""
        return self._connection.take_chain()

    def draw_run_order(self, connection: Connection, run_id: str) -> None:
        """A run's creation order, under the chain's lock, sent without waiting."""
        self._connection.draw_run_order(run_id)

    def append_at_head(
        self, connection: Connection, events: Sequence[Sequence[Any]]
    ) -> list[Cursor]:
        """A scoped write's events, after the chain's head, hashed on the server."""
        return self._connection.append_at_head(events)

    def commit_tail(self, connection: Connection) -> None:
        """COMMIT with the tail's statements, one round trip."""
        self._connection.commit_unanswered()

    def is_busy(self, error: Exception) -> bool:
        return False  # the server waits; the adapter says a wait too long as StoreBusy

    def settle(self, connection: Connection) -> None:
        """Wait for the answers to the write's statements sent so far (`PostgresConnection`)."""
        self._connection.settle()

    def ddl(self, statement: str) -> str:
        return widen_types(statement)

    def lost_events(self, anchor: str) -> str:
        return (
            f"(an older backup restored, or the database emptied or recreated; "
            f"if it was reset on purpose, remove {anchor} to start afresh)"
        )


def _open(parameters: dict[str, Any], label: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(
            **parameters,
            autocommit=True,
            row_factory=_row_factory,
            application_name="agentrt",
        )
    except psycopg.OperationalError as exc:
        # libpq's message names host, port and user, never the password.
        detail = sanitize(str(exc).strip().splitlines()[0] if str(exc).strip() else "no answer")
        raise StoreError(f"database {label} cannot be reached: {detail}") from None


def connect(url: str, *, read_only: bool, lock_timeout_s: float) -> PostgresConnection:
    """Connect to the database at `url` (credentials from libpq's environment only)."""
    parameters = _parameters(url)
    label = redacted(url)
    settings = [f"SET lock_timeout = '{int(lock_timeout_s * 1000)}ms'", "SET TIME ZONE 'UTC'"]
    if read_only:
        settings.append("SET default_transaction_read_only = on")
    connection = _open(parameters, label)
    adapter = PostgresConnection(connection, label, parameters=parameters, settings=settings)
    try:
        for setting in settings:
            adapter.execute(setting)
    except BaseException:
        connection.close()
        raise
    return adapter


# -- the schema ---------------------------------------------------------------

# Created before the shared migrations; holds the core schema's version (SQLite
# keeps it in `PRAGMA user_version`).
_VERSION_TABLE: Final = "agentrt_schema"

# What PostgreSQL adds to the shared schema, forward-only like it: events can
# be appended, never changed or removed, whoever asks (even the tables' owner,
# who could only drop the trigger on purpose).
POSTGRES_MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (
        """
        CREATE FUNCTION agentrt_events_append_only() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'agentrt events are append-only: % on events refused', TG_OP
                USING ERRCODE = 'insufficient_privilege';
        END
        $$
        """,
        "CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events"
        " FOR EACH ROW EXECUTE FUNCTION agentrt_events_append_only()",
        "CREATE TRIGGER events_never_truncated BEFORE TRUNCATE ON events"
        " FOR EACH STATEMENT EXECUTE FUNCTION agentrt_events_append_only()",
    ),
)
_POSTGRES_EXTENSION: Final = "postgresql"


def read_version(connection: PostgresConnection) -> int | None:
    """The core schema version, None when the database holds no agentrt schema."""
    exists = connection.execute("SELECT to_regclass(?)", (_VERSION_TABLE,)).fetchone()
    if exists[0] is None:
        return None
    row = connection.execute(f"SELECT version FROM {_VERSION_TABLE}").fetchone()
    return 0 if row is None else int(row[0])


def extras_current(connection: PostgresConnection) -> bool:
    """Whether PostgreSQL's own additions (the append-only trigger) are this build's."""
    row = connection.execute(
        "SELECT version FROM extensions WHERE name = ?", (_POSTGRES_EXTENSION,)
    ).fetchone()
    return row is not None and int(row[0]) == len(POSTGRES_MIGRATIONS)


def check_contents(connection: PostgresConnection, version: int | None) -> None:
    """Refuse a database that holds tables but not the agentrt schema."""
    if version is not None:
        return
    row = connection.execute(
        "SELECT COUNT(*) FROM pg_catalog.pg_tables WHERE schemaname = current_schema()"
    ).fetchone()
    if int(row[0]) > 0:
        raise StoreError(
            f"{connection.label} holds tables but not the agentrt schema; agentrt will not "
            "write into it: give it a database of its own"
        )


def migrate(connection: PostgresConnection, core_migrations: Sequence[str], split: Any) -> None:
    """Bring the schema to this build's version, under the write lock (several processes
    may start at once); a database from a newer build is refused."""
    connection.begin_write()
    try:
        connection.execute(f"CREATE TABLE IF NOT EXISTS {_VERSION_TABLE} (version BIGINT NOT NULL)")
        version = read_version(connection) or 0
        if version > len(core_migrations):
            raise newer_build(connection.label, version, len(core_migrations))
        for script in core_migrations[version:]:
            for statement in split(script):
                connection.execute(widen_types(statement))
        if version < len(core_migrations):
            connection.execute(f"DELETE FROM {_VERSION_TABLE}")
            connection.execute(
                f"INSERT INTO {_VERSION_TABLE} (version) VALUES (?)", (len(core_migrations),)
            )
        row = connection.execute(
            "SELECT version FROM extensions WHERE name = ?", (_POSTGRES_EXTENSION,)
        ).fetchone()
        done = 0 if row is None else int(row[0])
        if done > len(POSTGRES_MIGRATIONS):
            raise UnsafeDatabase(
                f"database {connection.label} has PostgreSQL schema {done} from a newer build"
            )
        for statements in POSTGRES_MIGRATIONS[done:]:
            for statement in statements:
                connection.execute(statement)
        if done < len(POSTGRES_MIGRATIONS):
            connection.execute(
                "INSERT INTO extensions (name, version) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET version = excluded.version",
                (_POSTGRES_EXTENSION, len(POSTGRES_MIGRATIONS)),
            )
        connection.execute("COMMIT")
    except BaseException:
        connection.rollback_quietly()
        raise
