"""The store's reads: runs, steps, approvals and events as records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from ..errors import RunNotFound
from ..sanitize import sanitize
from ._principals import PRINCIPAL_OF_RUN, Principal, principal_from_row, read_principal
from ._records import (
    ApprovalRecord,
    ApprovalStatus,
    Connection,
    Event,
    RunRecord,
    StepRecord,
    _row_to_approval,
    _row_to_event,
    _row_to_run,
    _row_to_step,
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

# The reads made both under the store's lock and inside a write: one text for both.
_RUN: Final = "SELECT * FROM runs WHERE run_id = ?"
_LAST_STEPS: Final = "SELECT * FROM steps WHERE run_id = ? ORDER BY step DESC LIMIT ?"
_LATEST_APPROVAL: Final = (
    "SELECT * FROM approvals WHERE run_id = ? ORDER BY created_seq DESC LIMIT 1"
)


class _Reads:
    """The store's reads (a mixin of `Store`): each on the store's connection under its lock,
    waiting out a busy database (`Store._query`), except those handed a connection, which
    read inside a write on the write's own connection."""

    # The store's, set by `Store.__init__`.
    path: str

    def _query(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError  # `Store._query`

    def get_run(self, run_id: str) -> RunRecord:
        rows = self._query(_RUN, (run_id,))
        if not rows:
            raise RunNotFound(f"no run {sanitize(run_id)} in {sanitize(self.path)}")
        return _row_to_run(rows[0])

    def read_run(self, connection: Connection, run_id: str) -> tuple[RunRecord, str | None]:
        """Inside a write: the run and its lease token, in one read of its row."""
        row = connection.execute(_RUN, (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"no run {sanitize(run_id)} in {sanitize(self.path)}")
        return _row_to_run(row), row["lease_token"]

    def find_run(self, connection: Connection, run_id: str) -> RunRecord | None:
        """Inside a write: the run, or None when there is none."""
        row = connection.execute(_RUN, (run_id,)).fetchone()
        return None if row is None else _row_to_run(row)

    def read_last_steps(self, connection: Connection, run_id: str, count: int) -> list[StepRecord]:
        """Inside a write: `last_steps`."""
        rows = connection.execute(_LAST_STEPS, (run_id, count)).fetchall()
        return [_row_to_step(row) for row in reversed(rows)]

    def read_latest_approval(self, connection: Connection, run_id: str) -> ApprovalRecord | None:
        """Inside a write: `latest_approval`."""
        row = connection.execute(_LATEST_APPROVAL, (run_id,)).fetchone()
        return None if row is None else _row_to_approval(row)

    def read_waiting_approval(self, connection: Connection, run_id: str) -> ApprovalRecord | None:
        """Inside a write: `waiting_approval`."""
        return _waiting(self.read_latest_approval(connection, run_id))

    def principal_of_run(self, run_id: str) -> Principal | None:
        """Who `run_id` is for (its `run_started` event's principal), or None when it has
        none: a run of the library, a stdio proxy, or a proxy behind the shared token."""
        rows = self._query(PRINCIPAL_OF_RUN, (run_id,))
        if not rows:
            return None
        return principal_from_row(rows[0])

    def read_principal_of_run(self, connection: Connection, run_id: str) -> Principal | None:
        """Inside a write: `principal_of_run` on the write's own connection."""
        return read_principal(connection, run_id)

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
        rows = self._query(_LAST_STEPS, (run_id, count))
        return [_row_to_step(row) for row in reversed(rows)]

    def latest_approval(self, run_id: str) -> ApprovalRecord | None:
        """The run's most recent approval, whatever its status (only it can grant)."""
        rows = self._query(_LATEST_APPROVAL, (run_id,))
        return _row_to_approval(rows[0]) if rows else None

    def waiting_approval(self, run_id: str) -> ApprovalRecord | None:
        """The approval the run waits on (pending or approved, not yet used), if any."""
        return _waiting(self.latest_approval(run_id))

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

    def checkpoint_events(self) -> list[Event]:
        """The chain's `checkpoint` events, oldest first (run id "": they belong to no run,
        so the events-by-run index finds them without reading the runs' events)."""
        rows = self._query(
            "SELECT * FROM events WHERE run_id = '' AND type = 'checkpoint' ORDER BY seq"
        )
        return [_row_to_event(row) for row in rows]

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


def _waiting(approval: ApprovalRecord | None) -> ApprovalRecord | None:
    """The run's latest approval if the run waits on it (pending, or approved not yet used)."""
    if approval is None or approval.status not in (
        ApprovalStatus.PENDING,
        ApprovalStatus.APPROVED,
    ):
        return None
    return approval
