"""The store's records: the statuses, the rows as values, the reports, and the mappers
from a stored row to its record."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from ..canonical import canonical_bytes, parse_json, sha256_hex


class Connection(Protocol):
    """What store work is handed (`Store.write`, `Store.transaction`): a `sqlite3.Connection`,
    or on PostgreSQL an adapter with the same surface (`?` placeholders, rows read by index
    and by name).  SQL is written once, in SQLite's dialect, for both."""

    @property
    def in_transaction(self) -> bool: ...

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Any: ...

    def close(self) -> None: ...


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
    STALE = "stale"


# A stored status to its member by one dict lookup (an enum's own call costs more).
_RUN_STATUSES: Final = {status.value: status for status in RunStatus}
_STEP_STATUSES: Final = {status.value: status for status in StepStatus}


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


@dataclass(frozen=True, slots=True)
class AnchorReport:
    """The database's chain head against the head anchor kept beside it."""

    ok: bool
    anchor_seq: int | None
    anchor_hash: str | None
    head_seq: int
    head_hash: str
    reason: str


@dataclass(frozen=True, slots=True)
class StateReport:
    """Whether every run's and approval's row agrees with its latest state event."""

    ok: bool
    first_bad: str | None
    reason: str
    checked: int


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


def _run_status(value: str) -> RunStatus:
    status = _RUN_STATUSES.get(value)
    return status if status is not None else RunStatus(value)


def _step_status(value: str) -> StepStatus:
    status = _STEP_STATUSES.get(value)
    return status if status is not None else StepStatus(value)


def _row_to_run(row: Any) -> RunRecord:
    metadata = row["metadata"]
    return RunRecord(
        run_id=row["run_id"],
        goal=row["goal"],
        status=_run_status(row["status"]),
        reason=row["reason"],
        result=row["result"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        step_count=row["step_count"],
        consecutive_failures=row["consecutive_failures"],
        lease_owner=row["lease_owner"],
        lease_expires_at=row["lease_expires_at"],
        metadata={} if metadata == "{}" else json.loads(metadata),
        deadline_at=row["deadline_at"],
    )


def _row_to_step(row: Any) -> StepRecord:
    return StepRecord(
        run_id=row["run_id"],
        step=row["step"],
        tool=row["tool"],
        args=row["args"],
        status=_step_status(row["status"]),
        observation_kind=row["observation_kind"],
        content=row["content"],
        summary=row["summary"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
    )


def _row_to_approval(row: Any) -> ApprovalRecord:
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


def _row_to_event(row: Any) -> Event:
    return Event(
        seq=row["seq"],
        run_id=row["run_id"],
        type=row["type"],
        payload=parse_json(row["payload"]),
        created_at=row["created_at"],
        prev_hash=row["prev_hash"],
        hash=row["hash"],
    )
