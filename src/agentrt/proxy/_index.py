"""The call index: which run answered which request, kept in the runtime's own database.

MCP gives a server no notion of a conversation, so every `tools/call` is a
run of its own.  The index maps a call's key (SHA-256 of the registered tool
name and the canonical arguments) to those runs, so a host's blind retry
finds the earlier run instead of acting twice.  A row is *held* by the proxy
process handling it (renewed while it works); a hold that lapsed means that
process died.  Every decision is taken inside one `BEGIN IMMEDIATE`
transaction (on PostgreSQL, one holding the store's write lock), so two
proxies on one database — on one machine or many — never both start the
same call.  Holds are judged on the store's write clock (the server's, on
PostgreSQL).  The index is a store extension: it writes only its own table, and a
decision reads the runs, steps and approvals it depends on through the store's reads
on its own transaction's connection (`Store.find_run`, `read_latest_approval`,
`read_last_steps`), never through the store's locked read path, so each decision
reads top to bottom in `decide_in`.

A new call's row is written in the same transaction as its run and first
step (`decide_in` inside `Gate.start_and_step`), and its settlement in the
transaction that records the result.  A row whose run does not exist means
*nothing started*: an earlier build wrote the row and the run in two
commits, and a process died, or the disk filled, between them.  Under a live
hold it is a call being started; otherwise the next identical call begins
the run under the row's id.  No decision ever fails for want of a run.

A decision reads only the rows its rules need: the key's unsettled rows and
the settled rows that can still decide a repeat (rejected, expired, or a
mutating call that executed), each through a partial index, so its cost does
not grow with the number of earlier identical calls.
"""

from __future__ import annotations

import enum
import os
import secrets
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..canonical import canonical_bytes, sha256_hex
from ..store import (
    ApprovalRecord,
    ApprovalStatus,
    Connection,
    RunRecord,
    RunStatus,
    Store,
    iso_to_epoch,
)

__all__ = [
    "EXECUTED",
    "MIGRATIONS",
    "Action",
    "CallIndex",
    "CallRow",
    "Settled",
    "Verdict",
    "call_key",
    "new_owner",
]


def new_owner() -> str:
    """A label for this proxy process, the holder of its calls' holds: unique even across
    restarts with the same pid."""
    return f"proxy:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


MIGRATIONS: Final[Sequence[str]] = (
    """
    CREATE TABLE proxy_calls (
        run_id TEXT PRIMARY KEY,
        session TEXT NOT NULL,
        call_key TEXT NOT NULL,
        tool TEXT NOT NULL,
        mutating INTEGER NOT NULL,
        created_at REAL NOT NULL,
        holder TEXT,
        held_until REAL,
        unknown_outcome INTEGER NOT NULL DEFAULT 0,
        settled INTEGER NOT NULL DEFAULT 0,
        outcome TEXT,
        settled_at REAL
    );
    CREATE INDEX proxy_calls_by_key ON proxy_calls (session, call_key, created_at);
    CREATE INDEX proxy_calls_open ON proxy_calls (session, settled, tool)
    """,
    # Only the rows a decision reads, so a lookup costs the same after ten
    # identical calls or ten thousand (the read-only ones never decide a repeat).
    """
    CREATE INDEX proxy_calls_unsettled ON proxy_calls (session, call_key, created_at)
        WHERE settled = 0;
    CREATE INDEX proxy_calls_deciding ON proxy_calls (session, call_key, created_at)
        WHERE settled = 1 AND (outcome IN ('rejected', 'cancelled', 'expired')
            OR (mutating = 1 AND outcome IN ('result', 'tool_error')))
    """,
    # The two full indexes the partial ones replaced: no query reads them any more
    # (every lookup is by run id or through a partial index), and each cost every
    # call a page written in its first commit and, settling, in its second.
    """
    DROP INDEX IF EXISTS proxy_calls_by_key;
    DROP INDEX IF EXISTS proxy_calls_open
    """,
)

# The rows a decision reads, written so SQLite can use the partial indexes above:
# a query uses a partial index only when its WHERE clause implies the index's.
_UNSETTLED_OF_KEY: Final = (
    "SELECT * FROM proxy_calls WHERE session = ? AND call_key = ? AND settled = 0"
    " ORDER BY created_at DESC"
)
_DECIDING_OF_KEY: Final = (
    "SELECT * FROM proxy_calls WHERE session = ? AND call_key = ? AND settled = 1"
    " AND (outcome IN ('rejected', 'cancelled', 'expired')"
    " OR (mutating = 1 AND outcome IN ('result', 'tool_error')))"
    " AND settled_at >= ? ORDER BY created_at DESC LIMIT 1"
)


class Settled(enum.StrEnum):
    """How a call ended.  RESULT and TOOL_ERROR executed with a known outcome
    (the server answered); the others never ran."""

    RESULT = "result"
    TOOL_ERROR = "tool_error"
    DENIED = "denied"
    INVALID = "invalid"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    FAILED = "failed"
    # The state changed after the approval: nothing ran, and an identical call asks anew.
    STALE = "stale"


EXECUTED: Final = frozenset({Settled.RESULT, Settled.TOOL_ERROR})


class Action(enum.StrEnum):
    """What the index tells the proxy to do with a call (the seven rules, in order)."""

    COLLECT = "collect"
    IN_PROGRESS = "in_progress"
    TAKE_OVER = "take_over"
    REJECTED = "rejected"
    EXPIRED = "expired"
    DUPLICATE = "duplicate"
    BLOCKED = "blocked"
    TOO_MANY_PENDING = "too_many_pending"
    NEW = "new"


def call_key(tool: str, args_text_canonical: str) -> str:
    """The key of a call: SHA-256 of the registered tool name and the canonical arguments."""
    return sha256_hex(canonical_bytes({"tool": tool, "args": args_text_canonical}))


@dataclass(frozen=True, slots=True)
class CallRow:
    run_id: str
    session: str
    call_key: str
    tool: str
    mutating: bool
    created_at: float
    holder: str | None
    held_until: float | None
    unknown_outcome: bool
    settled: bool
    outcome: str | None
    settled_at: float | None


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the index says to do with a call, in the order of the proxy's seven rules.

    `TAKE_OVER` and `NEW` come back with the row held by this process.
    """

    action: Action
    row: CallRow | None = None
    approval: ApprovalRecord | None = None


def _row(record: Any) -> CallRow:
    return CallRow(
        run_id=record["run_id"],
        session=record["session"],
        call_key=record["call_key"],
        tool=record["tool"],
        mutating=bool(record["mutating"]),
        created_at=float(record["created_at"]),
        holder=record["holder"],
        held_until=record["held_until"],
        unknown_outcome=bool(record["unknown_outcome"]),
        settled=bool(record["settled"]),
        outcome=record["outcome"],
        settled_at=record["settled_at"],
    )


def outcome_of_ended_run(run: RunRecord, last_step_kind: str | None) -> Settled:
    """The index outcome of a run that ended, read from how it ended."""
    if run.status is RunStatus.COMPLETED:
        return Settled.RESULT
    if run.status is RunStatus.CANCELLED:
        if run.reason == "approval_rejected":
            return Settled.REJECTED
        if run.reason in ("approval_expired", "grant_expired"):
            return Settled.EXPIRED
        if run.reason == Settled.STALE:
            return Settled.STALE
        return Settled.CANCELLED
    if last_step_kind in (Settled.TOOL_ERROR, Settled.DENIED, Settled.INVALID):
        return Settled(last_step_kind)
    return Settled.FAILED


class CallIndex:
    """The proxy's own tables in the runtime's database, and the decisions taken over them.

    Every method is blocking store work: async code calls it through
    `await store.run(...)`, never on the event loop.
    """

    def __init__(self, store: Store, session: str, holder: str, hold_ttl: float) -> None:
        self.store = store
        self.session = session
        self.holder = holder
        self.hold_ttl = hold_ttl
        # The holds of calls this process is working on now: only these are
        # renewed, so a hold whose release failed lapses instead of living on.
        self._live: set[tuple[str, str]] = set()
        self._live_lock = threading.Lock()
        store.migrate_extension("proxy", MIGRATIONS)

    # -- reads ---------------------------------------------------------------

    def _rows(self, connection: Connection, sql: str, parameters: Sequence[Any]) -> list[CallRow]:
        return [_row(record) for record in connection.execute(sql, parameters).fetchall()]

    def _one(self, connection: Connection, run_id: str) -> CallRow:
        return self._rows(connection, "SELECT * FROM proxy_calls WHERE run_id = ?", (run_id,))[0]

    def _run(self, connection: Connection, run_id: str) -> RunRecord | None:
        """The row's run, or None when it was never started (see the module's note)."""
        return self.store.find_run(connection, run_id)

    def get(self, run_id: str, session: str | None = None) -> CallRow | None:
        """The call of `run_id` if it is this session's (or `session`'s: a principal's)."""
        with self.store.transaction() as connection:
            rows = self._rows(
                connection,
                "SELECT * FROM proxy_calls WHERE run_id = ? AND session = ?",
                (run_id, session or self.session),
            )
        return rows[0] if rows else None

    def waiting(self, session: str | None = None) -> list[tuple[CallRow, ApprovalRecord]]:
        """This session's (or `session`'s) calls that wait on an operator's decision,
        oldest first."""
        with self.store.transaction() as connection:
            rows = self._rows(
                connection,
                "SELECT * FROM proxy_calls WHERE session = ? AND settled = 0 ORDER BY created_at",
                (session or self.session,),
            )
            waiting = []
            for row in rows:
                run = self._run(connection, row.run_id)
                approval = self.store.read_waiting_approval(connection, row.run_id)
                if (
                    run is not None
                    and run.status is RunStatus.WAITING_FOR_APPROVAL
                    and approval is not None
                ):
                    waiting.append((row, approval))
        return waiting

    # -- the decision --------------------------------------------------------

    def scope_of(
        self, session: str, key: str, tool: str, mutating: bool, may_need_approval: bool
    ) -> tuple[str, str, str]:
        """What `decide_in` reads and writes for such a call, as a scoped write's scope
        (`Store.write_scoped`, decision 0065): all of the session's calls when it may
        count the session's pending approvals (rule 7); all of the tool's when it is
        mutating (rule 6 reads the tool's unknown outcomes); else only the calls of its
        own request (`key`: rules 1 to 5), so the session's other requests, on any
        proxy, are decided beside it."""
        if may_need_approval:
            return session, "", ""
        if mutating:
            return session, tool, ""
        return session, tool, key

    def decide_in(
        self,
        connection: Connection,
        *,
        run_id: str,
        key: str,
        tool: str,
        mutating: bool,
        repeat_window: float,
        may_need_approval: bool,
        max_pending: int,
        token: str,
        session: str | None = None,
    ) -> Verdict:
        """Apply the seven rules to a call inside the caller's write transaction (the
        gate's, when the proxy starts the run in the same commit); `new` and
        `take_over` hold the row.  Holds are judged on the store's write clock (the
        server's, on PostgreSQL).  `session` (default: the index's) is whose calls the
        rules look at: a principal's own, over HTTP with `"principals"` (issue 35), so
        one person's calls never collect, repeat, block or crowd out another's.

        A read-only call has no repeat rule: a run of it in flight under a
        live hold does not stop an identical one, which gets a run of its own.
        """
        session = session or self.session
        now = self.store.write_time(time.time())
        open_rows: list[tuple[CallRow, RunRecord | None]] = []
        for row in self._rows(connection, _UNSETTLED_OF_KEY, (session, key)):
            run = self._run(connection, row.run_id)
            if run is not None and run.status.terminal:
                # Ended outside any proxy (rejected, expired, cancelled by the operator).
                self._settle_from_run(connection, row, run)
                continue
            open_rows.append((row, run))
        # 1. a run waiting on an approval for this very request
        for row, run in open_rows:
            if run is not None and run.status is RunStatus.WAITING_FOR_APPROVAL:
                approval = self.store.read_latest_approval(connection, row.run_id)
                return Verdict(Action.COLLECT, row, approval)
        # 2. a run executing under a live hold; 3. one a dead process left running
        # (or never started: the row's run then begins under its id)
        for row, run in open_rows:
            if row.holder is not None and (row.held_until or 0) > now and not self._let_go(row):
                if mutating:
                    return Verdict(Action.IN_PROGRESS, row)
                continue
            held = self._hold(connection, row.run_id, now, token)
            return Verdict(Action.TAKE_OVER if run is not None else Action.NEW, held)
        # 4. rejected / cancelled / expired; 5. duplicate — within the window
        # (a window of 0, a rule's "0s", turns both off for the tool)
        for row in (
            self._rows(connection, _DECIDING_OF_KEY, (session, key, now - repeat_window))
            if repeat_window > 0
            else ()
        ):
            if row.outcome in (Settled.REJECTED, Settled.CANCELLED):
                approval = self.store.read_latest_approval(connection, row.run_id)
                return Verdict(Action.REJECTED, row, approval)
            if row.outcome == Settled.EXPIRED:
                return Verdict(Action.EXPIRED, row)
            return Verdict(Action.DUPLICATE, row)
        # 6. another mutating call to this tool has an unknown outcome
        if mutating:
            for row in self._rows(
                connection,
                "SELECT * FROM proxy_calls WHERE session = ? AND settled = 0 AND tool = ?"
                " AND unknown_outcome = 1",
                (session, tool),
            ):
                blocking_run = self._run(connection, row.run_id)
                if blocking_run is not None and not blocking_run.status.terminal:
                    return Verdict(Action.BLOCKED, row)
        if may_need_approval and self._pending_count(connection, session) >= max_pending:
            return Verdict(Action.TOO_MANY_PENDING)
        # 7. a new run: the row is exactly what was inserted (the columns left out
        # take their defaults), so it is not read back.
        row = CallRow(
            run_id=run_id,
            session=session,
            call_key=key,
            tool=tool,
            mutating=mutating,
            created_at=now,
            holder=self._holder(token),
            held_until=now + self.hold_ttl,
            unknown_outcome=False,
            settled=False,
            outcome=None,
            settled_at=None,
        )
        connection.execute(
            "INSERT INTO proxy_calls (run_id, session, call_key, tool, mutating, created_at,"
            " holder, held_until) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (row.run_id, row.session, row.call_key, row.tool, int(row.mutating),
             row.created_at, row.holder, row.held_until),
        )  # fmt: skip
        self._track(run_id, token)
        return Verdict(Action.NEW, row)

    def _pending_count(self, connection: Connection, session: str) -> int:
        count = 0
        for row in self._rows(
            connection,
            "SELECT * FROM proxy_calls WHERE session = ? AND settled = 0",
            (session,),
        ):
            approval = self.store.read_latest_approval(connection, row.run_id)
            if approval is not None and approval.status is ApprovalStatus.PENDING:
                count += 1
        return count

    def _settle_from_run(self, connection: Connection, row: CallRow, run: RunRecord) -> CallRow:
        steps = self.store.read_last_steps(connection, row.run_id, 1)
        kind = steps[0].observation_kind if steps else None
        outcome = outcome_of_ended_run(run, kind)
        settled_at = iso_to_epoch(run.updated_at)
        connection.execute(
            "UPDATE proxy_calls SET settled = 1, outcome = ?, settled_at = ?, holder = NULL,"
            " held_until = NULL WHERE run_id = ?",
            (outcome, settled_at, row.run_id),
        )
        return self._one(connection, row.run_id)

    def _holder(self, token: str) -> str:
        # One holder per call, not per process: two calls of this process must
        # not release (or resume under) each other's hold.
        return f"{self.holder}#{token}"

    def _let_go(self, row: CallRow) -> bool:
        """Whether `row` is held by a call of this process that has ended without its hold
        being cleared (the release could not be written: the database was unreachable).
        Nothing is working on it, so its hold is as good as lapsed."""
        holder = row.holder
        if holder is None or not holder.startswith(self.holder + "#"):
            return False
        with self._live_lock:
            return (row.run_id, holder) not in self._live

    def _track(self, run_id: str, token: str) -> None:
        with self._live_lock:
            self._live.add((run_id, self._holder(token)))

    def _hold(self, connection: Connection, run_id: str, now: float, token: str) -> CallRow:
        connection.execute(
            "UPDATE proxy_calls SET holder = ?, held_until = ? WHERE run_id = ?",
            (self._holder(token), now + self.hold_ttl, run_id),
        )
        self._track(run_id, token)
        return self._one(connection, run_id)

    # -- writes by the process holding a call --------------------------------

    def try_hold(self, run_id: str, token: str) -> bool:
        """Hold a call (to run its approved request) unless a live holder has it,
        this process's other calls included: only one of them may resume it."""
        with self.store.transaction() as connection:
            now = self.store.write_time(time.time())
            cursor = connection.execute(
                "UPDATE proxy_calls SET holder = ?, held_until = ? WHERE run_id = ? AND settled = 0"
                " AND (holder IS NULL OR held_until <= ?)",
                (self._holder(token), now + self.hold_ttl, run_id, now),
            )
            held = bool(cursor.rowcount == 1)
        if held:
            self._track(run_id, token)
        return held

    def release(self, run_id: str, token: str) -> None:
        # Forgotten first: if the write fails, the hold is no longer renewed and lapses.
        with self._live_lock:
            self._live.discard((run_id, self._holder(token)))
        with self.store.transaction() as connection:
            connection.execute(
                "UPDATE proxy_calls SET holder = NULL, held_until = NULL"
                " WHERE run_id = ? AND holder = ?",
                (run_id, self._holder(token)),
            )

    def forget(self, run_id: str, token: str) -> None:
        """Stop renewing the hold of a call whose result's own commit settled its row
        (which cleared the hold with it): nothing is left to write.  Also a call's
        hold left to lapse because the database stayed locked: this process counts it
        lapsed at once (`_let_go`), another once `hold_ttl` has run out."""
        with self._live_lock:
            self._live.discard((run_id, self._holder(token)))

    def renew_holds(self) -> None:
        """Extend the holds of the calls this process is working on; called a few
        times per hold period."""
        with self._live_lock:
            live = sorted(self._live)
        if not live:
            return
        with self.store.transaction() as connection:
            now = self.store.write_time(time.time())
            connection.executemany(
                "UPDATE proxy_calls SET held_until = ?"
                " WHERE run_id = ? AND holder = ? AND settled = 0",
                [(now + self.hold_ttl, run_id, holder) for run_id, holder in live],
            )

    def mark_unknown_outcome(self, run_id: str) -> None:
        with self.store.transaction() as connection:
            connection.execute(
                "UPDATE proxy_calls SET unknown_outcome = 1 WHERE run_id = ?", (run_id,)
            )

    def settle(self, run_id: str, outcome: Settled) -> None:
        with self.store.transaction() as connection:
            self.settle_in(connection, run_id, outcome)

    def settle_in(self, connection: Connection, run_id: str, outcome: Settled) -> None:
        """Settle the call of `run_id` inside the caller's write transaction (the one
        recording the result).  Nothing reads the settled row back: no caller needs it."""
        connection.execute(
            "UPDATE proxy_calls SET settled = 1, outcome = ?, settled_at = ?, holder = NULL,"
            " held_until = NULL WHERE run_id = ?",
            (outcome, self.store.write_time(time.time()), run_id),
        )

    def settle_if_ended(self, run_id: str) -> CallRow | None:
        """Settle a call whose run ended outside this process (rejected, expired, cancelled)."""
        with self.store.transaction() as connection:
            rows = self._rows(connection, "SELECT * FROM proxy_calls WHERE run_id = ?", (run_id,))
            if not rows:
                return None
            row = rows[0]
            run = self._run(connection, run_id)
            if row.settled or run is None or not run.status.terminal:
                return row
            return self._settle_from_run(connection, row, run)
