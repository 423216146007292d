"""Standing grants: the `grants` extension's tables, records and reads.

A standing grant is a person's "yes for a while" given with an approval: for
one proxy session and one tool, until a time, for at most a number of calls,
optionally only for arguments a CEL condition accepts.  Its rows are an
extension of the store (`migrate_extension("grants", ...)`), applied only
where grants are used, so a database that never saw one has none of its
tables.  The transitions (given, used, revoked, expired) are ledger functions
(`ledger.give_standing_grant` ...); this module holds the schema, the record
and the reads.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ..canonical import parse_json

if TYPE_CHECKING:
    from ._store import Store

__all__ = [
    "GRANT_MIGRATIONS",
    "GrantLimits",
    "GrantStatus",
    "StandingGrant",
    "grant_limits",
    "has_grant_tables",
    "list_standing_grants",
    "live_standing_grants",
    "migrate_grants",
    "set_grant_limits",
    "standing_grant",
]

EXTENSION: Final = "grants"

GRANT_MIGRATIONS: Final[Sequence[str]] = (
    """
    CREATE TABLE standing_grants (
        grant_id TEXT PRIMARY KEY,
        approval_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        session TEXT NOT NULL,
        tool TEXT NOT NULL,
        condition TEXT,
        calls_given INTEGER,
        calls_left INTEGER,
        expires_at REAL NOT NULL,
        scope TEXT NOT NULL,
        scope_hash TEXT NOT NULL,
        status TEXT NOT NULL,
        given_by TEXT NOT NULL DEFAULT '',
        given_at TEXT NOT NULL,
        ended_by TEXT NOT NULL DEFAULT '',
        ended_at TEXT,
        created_seq INTEGER NOT NULL
    );
    CREATE INDEX standing_grants_live ON standing_grants (session, tool)
        WHERE status = 'active';
    CREATE TABLE grant_limits (
        session TEXT PRIMARY KEY,
        max_seconds REAL NOT NULL,
        max_calls INTEGER,
        destructive INTEGER NOT NULL DEFAULT 0,
        set_at REAL NOT NULL
    )
    """,
)


class GrantStatus(enum.StrEnum):
    """Where a standing grant is: covering calls, or ended and why."""

    ACTIVE = "active"
    USED_UP = "used_up"
    REVOKED = "revoked"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class GrantLimits:
    """The operator's maximum for the grants of one proxy session (its `"standing_grants"`):
    the longest a grant may last, the most calls it may cover (None: no count beyond the
    time), and whether it may cover a `destructive` tool."""

    max_seconds: float
    max_calls: int | None = None
    destructive: bool = False


@dataclass(frozen=True, slots=True)
class StandingGrant:
    """One standing grant as stored.  `calls_left` None: any number until `expires_at`
    (epoch seconds, on the write clock)."""

    grant_id: str
    approval_id: str
    run_id: str
    session: str
    tool: str
    condition: str | None
    calls_given: int | None
    calls_left: int | None
    expires_at: float
    scope: dict[str, Any]
    scope_hash: str
    status: GrantStatus
    given_by: str
    given_at: str
    ended_by: str
    ended_at: str | None


def _row_to_grant(row: Any) -> StandingGrant:
    return StandingGrant(
        grant_id=row["grant_id"],
        approval_id=row["approval_id"],
        run_id=row["run_id"],
        session=row["session"],
        tool=row["tool"],
        condition=row["condition"],
        calls_given=row["calls_given"],
        calls_left=row["calls_left"],
        expires_at=float(row["expires_at"]),
        scope=parse_json(row["scope"]),
        scope_hash=row["scope_hash"],
        status=GrantStatus(row["status"]),
        given_by=row["given_by"],
        given_at=row["given_at"],
        ended_by=row["ended_by"],
        ended_at=row["ended_at"],
    )


def has_grant_tables(store: Store) -> bool:
    """Whether this database holds the grants extension (a grant was ever given or allowed)."""
    return store.extension_version(EXTENSION) > 0


def migrate_grants(store: Store) -> None:
    """Apply the grants extension's migrations (a write; nothing when they are applied)."""
    store.migrate_extension(EXTENSION, GRANT_MIGRATIONS)


def set_grant_limits(store: Store, session: str, limits: GrantLimits, now: float) -> None:
    """Record the operator's maximum for `session`'s grants (the proxy, at start-up)."""
    migrate_grants(store)
    with store.transaction() as connection:
        connection.execute(
            "INSERT INTO grant_limits (session, max_seconds, max_calls, destructive, set_at)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (session) DO UPDATE SET"
            " max_seconds = excluded.max_seconds, max_calls = excluded.max_calls,"
            " destructive = excluded.destructive, set_at = excluded.set_at",
            (session, limits.max_seconds, limits.max_calls, int(limits.destructive), now),
        )


def grant_limits(store: Store, session: str) -> GrantLimits | None:
    """The operator's maximum for `session`, or None where no proxy allowed grants."""
    if not has_grant_tables(store):
        return None
    rows = store._query(
        "SELECT max_seconds, max_calls, destructive FROM grant_limits WHERE session = ?",
        (session,),
    )
    if not rows:
        return None
    return GrantLimits(float(rows[0][0]), rows[0][1], bool(rows[0][2]))


def standing_grant(store: Store, grant_id: str) -> StandingGrant | None:
    if not has_grant_tables(store):
        return None
    rows = store._query("SELECT * FROM standing_grants WHERE grant_id = ?", (grant_id,))
    return _row_to_grant(rows[0]) if rows else None


def list_standing_grants(store: Store, *, include_ended: bool = False) -> list[StandingGrant]:
    """Every grant, newest first: the active ones, or with `include_ended` all."""
    if not has_grant_tables(store):
        return []
    where = "" if include_ended else f" WHERE status = '{GrantStatus.ACTIVE}'"
    rows = store._query(f"SELECT * FROM standing_grants{where} ORDER BY created_seq DESC")
    return [_row_to_grant(row) for row in rows]


def live_standing_grants(store: Store, session: str, tool: str) -> list[StandingGrant]:
    """The active grants of `session` for `tool`, oldest first (the first to end is used first).

    Active by status: one whose time ran out is still listed until a call finds it and
    records its expiry (`ledger.expire_standing_grant`)."""
    if not has_grant_tables(store):
        return []
    rows = store._query(
        "SELECT * FROM standing_grants WHERE session = ? AND tool = ?"
        f" AND status = '{GrantStatus.ACTIVE}' ORDER BY created_seq",
        (session, tool),
    )
    return [_row_to_grant(row) for row in rows]
