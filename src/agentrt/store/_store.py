"""The store: one database's connection under one lock, its transactions, and the
`Store` object that gathers the store's parts (its reads, the chain, the head anchor, the
extensions' tables), each in a module of its own.

Store work is synchronous, on one connection under the store's lock; async code runs it
off the event loop with `Store.run` (a worker thread) and `Store.write` (the store's one
writer thread, `_group_commit`), so neither an fsync nor a busy wait ever stalls the
loop.  What differs between SQLite and PostgreSQL is a handful of hooks (`Backend`).
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Concatenate, Final, ParamSpec, TypeVar, cast

import anyio.to_thread

from ..errors import StoreBusy, StoreError
from ..sanitize import sanitize
from ._anchor import _AnchorFile, _Anchoring
from ._backend import Backend, Busy, Scope, ScopedBackend
from ._chain import Deferred, Tail, _Chain
from ._group_commit import _MAX_BATCH, _Unit, _Writer
from ._outbox import Outbox
from ._reads import _Reads
from ._records import Connection, Event
from ._schema import _Extensions
from ._sqlite import SqliteBackend

_T = TypeVar("_T")
_P = ParamSpec("_P")


# The store retries a busy database (releasing its own lock in between, so reads go on)
# until `Store.busy_deadline`, then says so in one sentence.
_BUSY_DEADLINE_S: Final = 30.0


class Store(_Reads, _Chain, _Anchoring, _Extensions):
    """One database of runs, steps, approvals and events (SQLite, or PostgreSQL for a
    `postgresql://` URL).  Use `open_store`."""

    def __init__(
        self,
        connection: Connection,
        path: str,
        read_only: bool,
        anchor_path: str | None = None,
        backend: Backend | None = None,
    ) -> None:
        self._connection = connection
        # What differs between SQLite (the default) and PostgreSQL, as hooks.
        self._backend: Backend = SqliteBackend(path) if backend is None else backend
        # The same backend where writes may be scoped (PostgreSQL), else None.
        self._scoped: ScopedBackend | None = (
            cast(ScopedBackend, self._backend) if getattr(self._backend, "scopes", False) else None
        )
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
        # In a scoped batch, what its units appended, in order, to be written at its end
        # under the chain's lock (`_write_deferred`); None outside one.
        self._deferred: list[Deferred] | None = None
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
        self.write_lock_wait_s = 0.0
        """Seconds this store's writes waited for the write lock (the store's own lock,
        then the database's: `BEGIN IMMEDIATE`, or PostgreSQL's advisory lock)."""
        self.write_lock_held_s = 0.0
        """Seconds this store's writes held the database's write lock: from taking it
        to the end of their transaction (on PostgreSQL, until the lock is released)."""
        self._lock_taken = 0.0
        self.chain_lock_wait_s = 0.0
        """Seconds scoped writes waited for the chain's lock (PostgreSQL, decision 0065)."""
        self.chain_lock_held_s = 0.0
        """Seconds scoped writes held the chain's lock: from taking it to their COMMIT."""
        self.outbox: Outbox | None = None
        """Which events this store announces (`_outbox.enable_outbox`); None: none."""

    # -- off the event loop --------------------------------------------------

    async def run(self, function: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run blocking store work (a transaction, a read) in a worker thread.

        An fsync or a busy wait on a locked database then stalls only that
        worker, never the event loop (heartbeats keep beating).  The store's
        lock still serialises the work on its one connection.  A cancelled
        caller waits for the work to finish, so nobody is ever told less than
        what the database holds.
        """
        return await anyio.to_thread.run_sync(functools.partial(function, *args, **kwargs))

    async def write(
        self,
        function: Callable[Concatenate[Connection, _P], _T],
        /,
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _T:
        """Run `function(connection, *args)` as one atomic unit, answered once it is durable.

        The store's writer thread gathers the units of concurrent callers into
        one transaction (group commit), each unit in its own savepoint: a unit
        that raises rolls back only its own writes (and its events) and its
        caller gets the exception; the others commit.  The call returns only
        after the COMMIT holding the unit returned (and the head anchor was
        written), so what the caller is told is on disk.  A cancelled caller
        waits for its unit to be settled, as with `run`.
        """
        if kwargs:  # (none on the hot paths: a unit is called with its positional arguments)
            function = functools.partial(function, **kwargs)
        return await self._submit(_Unit(function, args))  # type: ignore[no-any-return]

    async def write_scoped(
        self,
        scope: Scope,
        function: Callable[Concatenate[Connection, _P], _T],
        /,
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _T:
        """`write`, for a unit that reads and writes only the rows of one scope and
        appends its events through the ledger (decision 0065): `(session, tool, key)`,
        a proxy session's calls of one request, their runs and steps; `(session, tool,
        "")`, all of the session's calls of one tool; `(session, "", "")`, all of the
        session's (`CallIndex.scope_of` says which a call takes).

        On PostgreSQL such units of different scopes run beside one another, from
        several proxies at once: each write takes the write lock shared and its scope's
        locks (a key's beside the session's other keys, a whole session's beside other
        sessions), and its events are written at its end, under the chain's lock, in
        one order.  Every other write takes the write lock whole, as before, so it sees
        no scoped write half done.  On SQLite (one writer) it is `write`.
        """
        if kwargs:
            function = functools.partial(function, **kwargs)
        unit = _Unit(function, args, scope if self._scoped is not None else None)
        return await self._submit(unit)  # type: ignore[no-any-return]

    async def _submit(self, unit: _Unit) -> Any:
        if self.read_only:
            raise StoreError(f"database {sanitize(self.path)} is open read-only")
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
        return unit.value

    def _writer_thread(self) -> _Writer:
        with self._writer_guard:
            if self._writer is None:
                self._writer = _Writer(self)
            return self._writer

    # -- the backend's clock ------------------------------------------------

    @property
    def backend(self) -> str:
        """`"postgresql"` or `"sqlite"`."""
        return self._backend.name

    def clock(self) -> float:
        """Now, as approvals are judged outside a write: on PostgreSQL the server's clock
        (one round trip), on SQLite this host's.  Blocking on PostgreSQL: call it in
        `Store.run`."""
        server_clock = self._backend.server_clock
        if server_clock is None:
            return time.time()
        return float(self._query(server_clock)[0][0])

    def write_time(self, now: float) -> float:
        """The time that judges leases, holds and approvals inside a write: on PostgreSQL
        the server's clock when the transaction took the write lock (so hosts whose
        clocks disagree still agree on who holds a run and what expired), on SQLite
        `now` (one host's clock)."""
        return now if self._server_now is None else self._server_now

    # -- transactions --------------------------------------------------------

    def _commit_batch(
        self,
        units: list[_Unit],
        joining: Callable[[int], list[_Unit]] | None = None,
        give_back: Callable[[list[_Unit]], None] | None = None,
    ) -> None:
        """On the writer thread: one transaction over `units`, each in a savepoint.

        Once the write lock is held, `joining(room)` gives the units queued while it
        was waited for (at most `room`), and they join this transaction: `units` is
        extended in place.  Every unit's outcome is set before this returns; none is
        released (`_Unit.release`) until COMMIT returned and the anchor was written.

        A scoped batch (its first unit scoped, decision 0065) holds its first unit's
        scope and takes the others' where no other write holds them; a unit whose
        scope it cannot take leaves `units` and goes to `give_back`, for a later batch.
        Its units' events are written at its end, under the chain's lock.
        """
        scope = units[0].scope
        # The other units' scopes, tried in the round trip that takes the first's.
        others = _other_scopes(units, {scope}) if scope is not None else []
        try:
            # Each unit waits out a busy database one deadline from its submission,
            # not from when an earlier batch's wait for the lock gave up.
            granted = self._begin(
                min(unit.submitted for unit in units) + self.busy_deadline, scope, others
            )
        except BaseException as exc:
            for unit in units:
                unit.error = exc
            return
        if joining is not None:
            # Writes that queued while another writer held the lock share this hold of
            # it (decision 0055): one BEGIN, lock and COMMIT for all of them.
            units.extend(joining(_MAX_BATCH - len(units)))
        connection = self._connection
        try:
            if scope is not None:
                self._take_scopes(connection, {scope, *granted}, others, units, give_back)
            # A unit alone in its batch needs no savepoint: the transaction is its own.
            alone = len(units) == 1
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
                deferred = 0 if self._deferred is None else len(self._deferred)
                if not alone:
                    connection.execute("SAVEPOINT unit")
                try:
                    unit.value = unit.function(connection, *unit.args)
                    # Each unit's statements answered within it, so a refused one is its own.
                    self._backend.settle(connection)
                except BaseException as exc:
                    unit.error = exc
                    self._pending_events = []
                    self._head = head
                    if self._deferred is not None:
                        del self._deferred[deferred:]
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
            tail = None
            if self._deferred is not None and connection.in_transaction:
                tail = self._write_deferred(connection)
            if connection.in_transaction:
                if tail is not None and not tail.answered:
                    assert self._scoped is not None
                    self._scoped.commit_tail(connection)
                else:
                    connection.execute("COMMIT")
                self.commits += 1
                if tail is not None:
                    committed.extend(tail.events())
                    self._count_chain(tail)
            elif alone:
                pass  # its unit failed and rolled the transaction back
            else:
                lost = StoreError(
                    f"database {sanitize(self.path)} rolled back a write after an error in "
                    "another one; nothing of it was written"
                )
                # The kept units, and those never run after the transaction ended.
                for unit in units:
                    if unit.error is None:
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
            self._deferred = None
            self.write_lock_held_s += time.perf_counter() - self._lock_taken
            self._lock.release()
        if committed:
            with self._events_lock:
                self._committed_events.extend(committed)
            self._advance_anchor(committed[-1].seq, committed[-1].hash)

    def _take_scopes(
        self,
        connection: Connection,
        held: set[Scope],
        tried: list[Scope],
        units: list[_Unit],
        give_back: Callable[[list[_Unit]], None] | None,
    ) -> None:
        """In a scoped batch holding the scopes `held` (its first unit's, and those of
        `tried`, the scopes its BEGIN tried, that it was granted): take the scopes of the
        units that joined since where no other write holds them (never waiting: two
        writes never wait on each other's scopes), and give back, in order, the units
        whose scopes it could not take."""
        assert self._scoped is not None
        self._deferred = []
        joined = _other_scopes(units, {*held, *tried})
        if joined:
            held |= self._scoped.try_scopes(connection, joined)
        refused = [unit for unit in units if unit.scope not in held]
        if refused:
            units[:] = [unit for unit in units if unit.scope in held]
            if give_back is None:
                raise AssertionError("a scoped batch's refused units need somewhere to go")
            give_back(refused)

    def _write_deferred(self, connection: Connection) -> Tail | None:
        """At a scoped batch's end: its events (and the creation order of the runs it
        started) after the chain's head, under the chain's lock, answered with the
        COMMIT (`_Chain._write_tail`)."""
        assert self._scoped is not None and self._deferred is not None
        deferred, self._deferred = self._deferred, None
        if not deferred:
            return None
        return self._write_tail(connection, self._scoped, deferred)

    def _count_chain(self, tail: Tail) -> None:
        """The chain's lock's wait and hold for the metrics, on the server's time of its
        grant (this host's clock and the server's agree where the two share a host, as
        in the benchmarks; elsewhere the split between wait and hold is approximate)."""
        ended = time.time()
        granted = min(max(tail.held_since(), tail.asked), ended)
        self.chain_lock_wait_s += granted - tail.asked
        self.chain_lock_held_s += ended - granted

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

    def _begin(
        self,
        deadline: float | None = None,
        scope: Scope | None = None,
        others: Sequence[Scope] = (),
    ) -> set[Scope]:
        """Take the store's lock and begin a write holding the database's write lock (the
        backend's `begin`), waiting out a busy database in short attempts (the lock
        released between them) until `deadline` (monotonic; `busy_deadline` from now by
        default).

        On SQLite that is `BEGIN IMMEDIATE`; on PostgreSQL `BEGIN` and the write lock
        every writer takes first (the server itself waits for it up to the deadline),
        with the server's time then, which judges the write (`write_time`).  A scoped
        write (`scope`) tries the scopes of `others` too: those it holds are returned.
        """
        if deadline is None:
            deadline = time.monotonic() + self.busy_deadline
        asked = time.perf_counter()
        while True:
            self._acquire_lock()
            try:
                granted: set[Scope] = set()
                if scope is None:
                    self._server_now = self._backend.begin(self._connection)
                else:
                    assert self._scoped is not None
                    self._server_now, granted = self._scoped.begin_scoped(
                        self._connection, scope, others
                    )
                self._lock_taken = time.perf_counter()
                self.write_lock_wait_s += self._lock_taken - asked
                return granted
            except Busy:
                self._lock.release()
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
                self._backend.settle(connection)
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
            self.write_lock_held_s += time.perf_counter() - self._lock_taken
            self._lock.release()

    def take_committed_events(self) -> list[Event]:
        """Events appended by transactions that have committed since the last call."""
        with self._events_lock:
            events, self._committed_events = self._committed_events, []
            return events

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

    # -- the locked read path (the reads not handed a write's connection) ------

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
            except Exception as exc:
                # Inside a transaction the lock is ours: busy cannot happen there.
                if not self._backend.is_busy(exc) or self._connection.in_transaction:
                    raise
            finally:
                self._lock.release()
            if time.monotonic() >= deadline:
                raise StoreBusy(
                    f"database {sanitize(self.path)} stayed locked for {self.busy_deadline:g}s"
                )
            time.sleep(0.005)


def _other_scopes(units: list[_Unit], known: set[Scope]) -> list[Scope]:
    """The scopes of `units` not in `known`, each once, in order."""
    return sorted({unit.scope for unit in units if unit.scope is not None} - known)
