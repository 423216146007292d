"""The operator's decisions: approve, reject, cancel.

Each is a compare-and-set in one transaction with its event.  An approval is
a hash, not a yes: the operator decides against the hash of what they were
shown, and the stored row must still hash to it, so a row edited in the
database or an approval replaced since the operator looked is refused.
"""

from __future__ import annotations

import time
from typing import Any

from .errors import ApprovalError, ApprovalHashMismatch, RunStateError
from .sanitize import sanitize
from .store import (
    ApprovalRecord,
    ApprovalStatus,
    Connection,
    RunRecord,
    RunStatus,
    Store,
    utc_at,
    utc_now,
)

__all__ = ["approve", "cancel", "reject"]


def _load_waiting(
    connection: Connection, store: Store, run_id: str, approval_id: str | None
) -> ApprovalRecord:
    run = store.get_run(run_id)
    if run.status is not RunStatus.WAITING_FOR_APPROVAL:
        raise RunStateError(f"run {sanitize(run_id)} is {run.status}, not waiting for an approval")
    approval = store.latest_approval(run_id)
    if approval is None or approval.status is not ApprovalStatus.PENDING:
        raise ApprovalError(f"run {sanitize(run_id)} has no pending approval")
    if approval_id is not None and approval.approval_id != approval_id:
        raise ApprovalError(
            f"approval {sanitize(approval_id)} is not the one run {sanitize(run_id)} waits on "
            f"({approval.approval_id}); only a step's latest approval can be decided"
        )
    return approval


def _check_hash(approval: ApprovalRecord, shown_hash: str) -> None:
    if approval.recomputed_hash() != approval.approval_hash:
        raise ApprovalHashMismatch(
            f"approval {approval.approval_id} no longer matches its hash; the stored request "
            "was changed and cannot be approved"
        )
    if shown_hash != approval.approval_hash:
        raise ApprovalHashMismatch(
            f"approval {approval.approval_id} is not the request that was shown "
            "(the hash differs); look at it again before deciding"
        )


def _record_decision(
    store: Store,
    connection: Connection,
    approval: ApprovalRecord,
    status: ApprovalStatus,
    event: str,
    by: str,
    note: str,
    **fields: Any,
) -> None:
    """Move a pending approval to the operator's decision, with its event."""
    # On the write's clock (the server's on PostgreSQL): a grant's lifetime counts from it.
    decided_at = utc_at(store.write_time(time.time()))
    _set_approval(connection, approval.approval_id, ApprovalStatus.PENDING, status,
                  decided_by=by, note=note, decided_at=decided_at, **fields)  # fmt: skip
    store.append_event(
        connection, approval.run_id, event,
        {"approval_id": approval.approval_id, "approval_hash": approval.approval_hash,
         "by": by, "note": note},
    )  # fmt: skip


def expire_if_due(
    store: Store, connection: Connection, approval: ApprovalRecord, now: float
) -> bool:
    """Expire a pending approval past its TTL (cancelling the run); True if it expired.

    Judged on the write's time (`Store.write_time`: the server's clock on PostgreSQL).
    """
    now = store.write_time(now)
    if (
        approval.status is ApprovalStatus.PENDING
        and approval.expires_at is not None
        and now >= approval.expires_at
    ):
        _set_approval(
            connection, approval.approval_id, ApprovalStatus.PENDING, ApprovalStatus.EXPIRED
        )
        end_run(store, connection, approval.run_id, RunStatus.CANCELLED, "approval_expired")
        store.append_event(
            connection, approval.run_id, "approval_expired", {"approval_id": approval.approval_id}
        )
        return True
    return False


def _set_approval(
    connection: Connection,
    approval_id: str,
    expected: ApprovalStatus,
    new: ApprovalStatus,
    **fields: Any,
) -> None:
    assignments = ", ".join(f"{name} = ?" for name in fields)
    sql = "UPDATE approvals SET status = ?" + (f", {assignments}" if assignments else "")
    cursor = connection.execute(
        sql + " WHERE approval_id = ? AND status = ?",
        (str(new), *fields.values(), approval_id, str(expected)),
    )
    if cursor.rowcount != 1:
        raise RunStateError(f"approval {sanitize(approval_id)} was decided by someone else first")


def end_run(
    store: Store,
    connection: Connection,
    run_id: str,
    status: RunStatus,
    reason: str,
    result: str | None = None,
) -> None:
    """Move a non-terminal run to a terminal status (compare-and-set), with its event."""
    cursor = connection.execute(
        "UPDATE runs SET status = ?, reason = ?, result = ?, updated_at = ?,"
        " lease_owner = NULL, lease_expires_at = NULL"
        " WHERE run_id = ? AND status IN ('running', 'waiting_for_approval')",
        (str(status), reason, result, utc_now(), run_id),
    )
    if cursor.rowcount != 1:
        raise RunStateError(f"run {sanitize(run_id)} already ended")
    payload: dict[str, Any] = {"status": str(status), "reason": reason}
    if result is not None:
        payload["result"] = result
    store.append_event(connection, run_id, f"run_{status}", payload)


def approve(
    store: Store,
    run_id: str,
    *,
    approval_hash: str,
    approval_id: str | None = None,
    by: str = "",
    note: str = "",
    grant_ttl: float | None = None,
) -> ApprovalRecord:
    """Grant the approval run `run_id` waits on, if it still hashes to `approval_hash`.

    The run stays waiting until its program resumes it; resume executes exactly
    the recorded request.  An expired approval cancels the run instead.
    """
    now = time.time()
    with store.transaction() as connection:
        approval = _load_waiting(connection, store, run_id, approval_id)
        if expire_if_due(store, connection, approval, now):
            expired = approval.approval_id
        else:
            expired = None
            _check_hash(approval, approval_hash)
            _record_decision(
                store, connection, approval, ApprovalStatus.APPROVED, "approval_granted", by, note,
                grant_expires_at=(
                    None if grant_ttl is None else store.write_time(now) + grant_ttl
                ),
            )  # fmt: skip
    if expired is not None:
        raise ApprovalError(
            f"approval {expired} expired before it was decided; the run is cancelled"
        )
    return store.get_approval(approval.approval_id)


def reject(
    store: Store,
    run_id: str,
    *,
    approval_hash: str,
    approval_id: str | None = None,
    by: str = "",
    note: str = "",
) -> ApprovalRecord:
    """Reject the approval run `run_id` waits on; the run is cancelled (`approval_rejected`).

    `note` is what the model is told.
    """
    with store.transaction() as connection:
        approval = _load_waiting(connection, store, run_id, approval_id)
        _check_hash(approval, approval_hash)
        _record_decision(
            store, connection, approval, ApprovalStatus.REJECTED, "approval_rejected", by, note
        )
        connection.execute(
            "UPDATE steps SET status = 'denied', observation_kind = 'denied', content = ?,"
            " finished_at = ? WHERE run_id = ? AND step = ?",
            (note or "the operator rejected this request", utc_now(), run_id, approval.step),
        )
        end_run(store, connection, run_id, RunStatus.CANCELLED, "approval_rejected", None)
    return store.get_approval(approval.approval_id)


def cancel(
    store: Store, run_id: str, *, by: str = "", reason: str = "operator_cancelled"
) -> RunRecord:
    """End a run that has not ended; a live loop stops at its next write."""
    with store.transaction() as connection:
        run = store.get_run(run_id)
        if run.status.terminal:
            raise RunStateError(f"run {sanitize(run_id)} already ended ({run.status})")
        connection.execute(
            "UPDATE approvals SET status = 'superseded'"
            " WHERE run_id = ? AND status IN ('pending', 'approved')",
            (run_id,),
        )
        store.append_event(connection, run_id, "operator_cancelled", {"by": by})
        end_run(store, connection, run_id, RunStatus.CANCELLED, reason)
    return store.get_run(run_id)
