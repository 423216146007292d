"""A decision in passkey mode: one approver's verified assertion, separation of duties,
and the quorum.

The same compare-and-set as `approvals.approve`/`reject` (the approval must still be
pending and hash to what was shown), with three more checks in the same transaction:
the assertion verifies with a registered approver's key over this decision's
challenge; that approver is not the principal whose call it is; and one person
counts once in a quorum.  Each verified decision is an `approver_decided` event;
the approval is granted (after `approval_quorum_reached`) only when `required`
distinct people approved.  One approver's reject rejects.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Final

from .. import approvals
from ..errors import ApprovalError
from ..grants import GrantRequest
from ..sanitize import sanitize
from ..store import ApprovalRecord, Connection, Store, ledger
from ..store.events import EventType
from ._assertion import Assertion, PasskeyRefused, check_assertion, decision_challenge
from ._mode import QuorumRule
from ._registry import Registry

__all__ = ["APPROVE", "REJECT", "PasskeyDecision", "QuorumRule", "decide", "decisions_of"]

APPROVE: Final = "approve"
REJECT: Final = "reject"


@dataclass(frozen=True, slots=True)
class PasskeyDecision:
    """What one approver's decision did: the approval, who decided, and how many more
    approvers it still needs (0 once granted or rejected)."""

    approval: ApprovalRecord
    approver: str
    verdict: str
    approvers: tuple[str, ...]
    required: int

    @property
    def waiting_for(self) -> int:
        return max(0, self.required - len(self.approvers)) if self.verdict == APPROVE else 0


def decisions_of(store: Store, approval: ApprovalRecord) -> list[dict[str, Any]]:
    """The `approver_decided` payloads recorded for `approval`, oldest first."""
    found = []
    offset = 0
    while True:
        page = store.list_events(approval.run_id, limit=1000, offset=offset)
        for event in page:
            if (
                event.type == EventType.APPROVER_DECIDED
                and event.payload.get("approval_id") == approval.approval_id
            ):
                found.append(event.payload)
        if len(page) < 1000:
            return found
        offset += len(page)


def _separate(
    store: Store, connection: Connection, approval: ApprovalRecord, subject: str, name: str
) -> None:
    principal = store.read_principal_of_run(connection, approval.run_id)
    if principal is not None and principal.subject == subject:
        raise PasskeyRefused(
            f"approver {sanitize(name)} is the principal {sanitize(subject)} whose call run "
            f"{sanitize(approval.run_id)} holds; a principal can never approve its own call"
        )


def decide(
    store: Store,
    registry: Registry,
    run_id: str,
    *,
    approval_id: str,
    approval_hash: str,
    verdict: str,
    assertion: Assertion,
    origin: str | None,
    quorum: QuorumRule,
    note: str = "",
    grant: GrantRequest | None = None,
) -> PasskeyDecision:
    """Record one approver's passkey decision on the approval run `run_id` waits on; grant
    it once its quorum holds, reject it at once on a reject.  Refusals decide nothing."""
    if verdict not in (APPROVE, REJECT):
        raise ApprovalError(f"verdict {sanitize(verdict)} is neither approve nor reject")
    if verdict == REJECT and grant is not None:
        raise ApprovalError("a standing grant is given only with an approval")
    now = time.time()
    expired = None
    with store.transaction() as connection:
        approval = approvals.load_waiting(connection, store, run_id, approval_id)
        if ledger.expire_approval_if_due(store, connection, approval, now):
            expired = approval.approval_id
        else:
            outcome = _decide_pending(
                store, connection, registry, approval, approval_hash, verdict, assertion,
                origin, quorum, note, grant, now,
            )  # fmt: skip
    if expired is not None:
        raise ApprovalError(
            f"approval {expired} expired before it was decided; the run is cancelled"
        )
    return outcome


def _decide_pending(
    store: Store,
    connection: Connection,
    registry: Registry,
    approval: ApprovalRecord,
    approval_hash: str,
    verdict: str,
    assertion: Assertion,
    origin: str | None,
    quorum: QuorumRule,
    note: str,
    grant: GrantRequest | None,
    now: float,
) -> PasskeyDecision:
    approvals.check_hash(approval, approval_hash)
    scope = None if grant is None else approvals.checked_scope(store, approval, grant)
    scope_hash = None if scope is None else scope.scope_hash
    required = quorum.required(approval)
    challenge = decision_challenge(
        approval.approval_id, approval.approval_hash, verdict, scope_hash, required
    )
    earlier = decisions_of(store, approval)
    last_count = max(
        (
            int(str(payload.get("sign_count", 0)))
            for payload in earlier
            if isinstance(payload.get("assertion"), dict)
            and payload["assertion"].get("credential_id") == assertion.to_json()["credential_id"]
        ),
        default=0,
    )
    checked = check_assertion(registry, assertion, challenge, origin=origin, sign_count=last_count)
    approver = checked.approver
    _separate(store, connection, approval, approver.subject, approver.name)
    approved_by = {
        str(payload["subject"]): str(payload["approver"])
        for payload in earlier
        if payload.get("verdict") == APPROVE
    }
    if verdict == APPROVE and approver.subject in approved_by:
        raise PasskeyRefused(
            f"approver {sanitize(approver.name)} (principal {sanitize(approver.subject)}) has "
            f"already approved approval {approval.approval_id}; a quorum counts each person once"
        )
    ledger.record_approver_decision(
        store, connection, approval, approver=approver.name, subject=approver.subject,
        verdict=verdict, scope_hash=scope_hash, assertion=assertion.to_json(),
        sign_count=checked.sign_count, required=required,
    )  # fmt: skip
    decided_at = approvals.decided_at(store)
    if verdict == REJECT:
        ledger.reject(
            store, connection, approval, by=approver.name, note=note, decided_at=decided_at
        )
        return PasskeyDecision(approval, approver.name, verdict, (approver.name,), required)
    approved_by[approver.subject] = approver.name
    names = tuple(approved_by.values())
    if len(names) >= required:
        ledger.record_quorum_reached(
            store, connection, approval, approvers=names, required=required
        )
        ledger.grant(
            store, connection, approval, by=", ".join(names), note=note, decided_at=decided_at,
            grant_expires_at=None,
        )  # fmt: skip
        if scope is not None:
            ledger.give_standing_grant(
                store, connection, approval, scope.to_new(), by=", ".join(names),
                decided_at=decided_at, now=now,
            )  # fmt: skip
    return PasskeyDecision(approval, approver.name, verdict, names, required)
