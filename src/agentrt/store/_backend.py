"""The backend: what differs between SQLite and PostgreSQL beneath the store's SQL, as a
few hooks the store calls (as DBOS's SQLite and PostgreSQL system databases override
only hooks).  SQL is written once, in SQLite's dialect, for both."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ._records import Connection

__all__ = ["Backend", "Busy", "Scope", "ScopedBackend"]


Scope = tuple[str, str, str]
"""What a scoped write reads and writes (decision 0065): `(session, tool, key)`, a
proxy session's calls of one request (`key`, of that `tool`); with `key` "", all of
the tool's calls in the session; with `tool` "" too, all of the session's.  Scopes of
disjoint rows run beside one another; a scope waits for those it covers or is
covered by."""


class Busy(Exception):
    """A backend's `begin` found the database locked by another writer: try again."""


class Backend(Protocol):
    """What differs between SQLite and PostgreSQL beneath the store's SQL, as hooks the
    store calls: `_sqlite.SqliteBackend` and `_postgres.PostgresBackend`."""

    @property
    def name(self) -> str:
        """`"sqlite"` or `"postgresql"`."""
        ...

    @property
    def server_clock(self) -> str | None:
        """A read of the database server's clock (epoch seconds), or None where this
        host's clock judges."""
        ...

    @property
    def anchor_per_host(self) -> bool:
        """Whether each host keeps its own head anchor (a host without one is no fault
        of the database's)."""
        ...

    def begin(self, connection: Connection) -> float | None:
        """Start a write transaction holding the database's write lock; the server's time
        then, or None.  Raises `Busy` when another writer holds the lock."""
        ...

    def is_busy(self, error: Exception) -> bool:
        """Whether a read failed only because another writer held the database."""
        ...

    def settle(self, connection: Connection) -> None:
        """Wait for every statement sent so far in the write to be answered, raising the
        error of one that failed (PostgreSQL sends a write's statements without waiting
        for each answer; SQLite has nothing to wait for)."""
        ...

    def ddl(self, statement: str) -> str:
        """A migration's statement (written in SQLite's dialect) as this database takes it."""
        ...

    def lost_events(self, anchor: str) -> str:
        """How committed events are lost from this kind of database, as an error says it
        (`anchor`: where the head anchor is)."""
        ...


class ScopedBackend(Backend, Protocol):
    """A backend on which writes may be scoped (PostgreSQL, decision 0065): a write
    scoped to a session runs beside other sessions' scoped writes, and only its events
    take the chain's lock.  SQLite has one writer and no scoped writes."""

    def begin_scoped(
        self, connection: Connection, scope: Scope, others: Sequence[Scope] = ()
    ) -> tuple[float | None, set[Scope]]:
        """`Backend.begin` for a write scoped to `scope`: the write lock shared and the
        scope's own, then `others` tried without waiting, in the same round trip; the
        server's time then, and those of `others` the write now holds."""
        ...

    def try_scopes(self, connection: Connection, scopes: Sequence[Scope]) -> set[Scope]:
        """Inside a scoped write, of `scopes` those whose locks it now holds, never
        waiting for one another write holds."""
        ...

    def take_chain(self, connection: Connection) -> Any:
        """Inside a scoped write, send the chain's lock (held to the COMMIT) without
        waiting; a cursor whose row, once answered, has the server's time it was held."""
        ...

    def draw_run_order(self, connection: Connection, run_id: str) -> None:
        """Inside a scoped write, after `take_chain`: send the creation order of run
        `run_id` (its `created_seq`, the next under the chain's lock) without waiting."""
        ...

    def append_at_head(self, connection: Connection, events: Sequence[Sequence[Any]]) -> list[Any]:
        """Inside a scoped write, after `take_chain`: append `events` (run id, type,
        payload, time, `envelope_parts`) after the chain's head, read and hashed by the
        database, without waiting; cursors whose rows, once answered, are each event's
        seq, prev hash and hash."""
        ...

    def commit_tail(self, connection: Connection) -> None:
        """COMMIT a scoped write whose tail is still unanswered: the statements sent
        without waiting go out with it, answered in one round trip (a refused one fails
        the COMMIT, and nothing of the write is kept)."""
        ...
