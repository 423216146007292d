"""The operator's decisions: approve, reject, cancel.

Each is a compare-and-set in one transaction with its event.  An approval is
a hash, not a yes: the operator decides against the hash of what they were
shown, and the stored row must still hash to it, so a row edited in the
database or an approval replaced since the operator looked is refused.
"""

from __future__ import annotations

import time

from .errors import ApprovalError, ApprovalHashMismatch, RunStateError
from .grants import GrantRefused, GrantRequest, GrantScope, grant_scope
from .sanitize import sanitize
from .store import (
    ApprovalRecord,
    ApprovalStatus,
    Connection,
    RunRecord,
    RunStatus,
    Store,
    ledger,
    utc_at,
)

__all__ = [
    "GrantRequest",
    "approve",
    "cancel",
    "check_hash",
    "checked_scope",
    "decided_at",
    "load_waiting",
    "reject",
]


# The steps of a decision, public for the other deciders (passkeys/_decide.py), which add
# their own checks between them inside the same transaction.


def load_waiting(
    connection: Connection, store: Store, run_id: str, approval_id: str | None
) -> ApprovalRecord:
    """The approval run `run_id` waits on (`approval_id`, if given, must be it), pending."""
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


def check_hash(approval: ApprovalRecord, shown_hash: str) -> None:
    """Refuse an approval whose row no longer hashes to itself or is not what was shown."""
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


def decided_at(store: Store) -> str:
    """When a decision is made, as the approval records it."""
    # On the write's clock (the server's on PostgreSQL): a grant's lifetime counts from it.
    return utc_at(store.write_time(time.time()))


def approve(
    store: Store,
    run_id: str,
    *,
    approval_hash: str,
    approval_id: str | None = None,
    by: str = "",
    note: str = "",
    grant_ttl: float | None = None,
    grant: GrantRequest | None = None,
) -> ApprovalRecord:
    """Grant the approval run `run_id` waits on, if it still hashes to `approval_hash`.

    The run stays waiting until its program resumes it; resume executes exactly
    the recorded request.  An expired approval cancels the run instead.  With
    `grant`, a standing grant is given in the same transaction (`grants.py`): its
    scope must be within the operator's maximum and still hash to
    `grant.scope_hash`, or nothing is decided (`GrantRefused`).  (A grant within an
    operator's maximum finds the grants tables there: the maximum is kept in them.)
    """
    now = time.time()
    with store.transaction() as connection:
        approval = load_waiting(connection, store, run_id, approval_id)
        if ledger.expire_approval_if_due(store, connection, approval, now):
            expired = approval.approval_id
        else:
            expired = None
            check_hash(approval, approval_hash)
            scope = None if grant is None else checked_scope(store, approval, grant)
            decided = decided_at(store)
            ledger.grant(
                store, connection, approval, by=by, note=note, decided_at=decided,
                grant_expires_at=(
                    None if grant_ttl is None else store.write_time(now) + grant_ttl
                ),
            )  # fmt: skip
            if scope is not None:
                ledger.give_standing_grant(
                    store, connection, approval, scope.to_new(), by=by,
                    decided_at=decided, now=now,
                )  # fmt: skip
    if expired is not None:
        raise ApprovalError(
            f"approval {expired} expired before it was decided; the run is cancelled"
        )
    return store.get_approval(approval.approval_id)


def checked_scope(store: Store, approval: ApprovalRecord, grant: GrantRequest) -> GrantScope:
    """The scope `grant` asks with `approval`, refused unless it hashes to what was shown."""
    scope = grant_scope(store, approval, grant)
    if grant.scope_hash != scope.scope_hash:
        raise GrantRefused(
            f"the standing grant asked with approval {approval.approval_id} is not the scope "
            "that was shown (the hash differs); look at it again before deciding"
        )
    return scope


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
        approval = load_waiting(connection, store, run_id, approval_id)
        check_hash(approval, approval_hash)
        ledger.reject(store, connection, approval, by=by, note=note, decided_at=decided_at(store))
    return store.get_approval(approval.approval_id)


def cancel(
    store: Store, run_id: str, *, by: str = "", reason: str = "operator_cancelled"
) -> RunRecord:
    """End a run that has not ended; a live loop stops at its next write."""
    with store.transaction() as connection:
        run = store.get_run(run_id)
        if run.status.terminal:
            raise RunStateError(f"run {sanitize(run_id)} already ended ({run.status})")
        ledger.cancel_run(store, connection, run_id, by, reason)
    return store.get_run(run_id)
