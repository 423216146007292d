"""Every recorded decision checked again against the approvers' registry
(`agentrt verify --approvers`).

Walks the chain once.  Each `approval_granted` must follow `approver_decided` events
for the same approval whose assertions verify with registered keys over the derived
challenge, from at least as many distinct people as its `approval_quorum_reached`
says (at least one), none of them the run's principal; each `approval_rejected` one
such reject.  An assertion used twice is a replay.  A decision written by anyone
without the authenticator — a row flipped by hand and a chain made consistent, or
`approvals.approve()` called as a library — has no assertion that verifies, and is
named here with its approval and run.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Final

from ..sanitize import sanitize
from ..store import ApprovalRecord, Event, Store
from ..store.events import EventType
from ._assertion import Assertion, PasskeyRefused, check_assertion, decision_challenge
from ._decide import APPROVE, REJECT
from ._registry import Registry

__all__ = ["DecisionProblem", "approval_unproven", "audit_decisions"]

_PAGE: Final = 1000
_VERDICT_OF: Final = {
    EventType.APPROVAL_GRANTED.value: APPROVE,
    EventType.APPROVAL_REJECTED.value: REJECT,
}


@dataclass(frozen=True, slots=True)
class DecisionProblem:
    """A decision that no approver's passkey proves: which event, approval and run, and why."""

    seq: int
    run_id: str
    approval_id: str
    reason: str

    def sentence(self) -> str:
        return (
            f"event {self.seq}: approval {sanitize(self.approval_id)} of run "
            f"{sanitize(self.run_id)} {self.reason}"
        )


def _events(store: Store, from_seq: int | None, to_seq: int | None) -> Any:
    seq = 0 if from_seq is None else from_seq - 1
    while True:
        page = store.events_after(seq, limit=_PAGE)
        for event in page:
            if to_seq is not None and event.seq > to_seq:
                return
            yield event
        if len(page) < _PAGE:
            return
        seq = page[-1].seq


def _signed_quorum(payload: dict[str, Any]) -> int:
    required = payload.get("required", 1)
    return required if isinstance(required, int) and not isinstance(required, bool) else 1


def _checked_subject(
    registry: Registry,
    event: Event,
    used: set[bytes],
    principal_subject: str | None,
) -> str:
    """The subject of the approver whose assertion in `event` verifies; PasskeyRefused else.
    The quorum the approver was asked to join is in the challenge: a changed one fails."""
    payload = event.payload
    try:
        assertion = Assertion.from_json(payload.get("assertion"))
    except ValueError as exc:
        raise PasskeyRefused(str(exc)) from None
    if assertion.signature in used:
        raise PasskeyRefused("replays a passkey assertion already recorded for a decision")
    used.add(assertion.signature)
    scope_hash = payload.get("scope_hash")
    challenge = decision_challenge(
        str(payload.get("approval_id")),
        str(payload.get("approval_hash")),
        str(payload.get("verdict")),
        scope_hash if isinstance(scope_hash, str) else None,
        _signed_quorum(payload),
    )
    checked = check_assertion(registry, assertion, challenge)
    if checked.approver.subject != payload.get("subject"):
        raise PasskeyRefused(
            f"names principal {sanitize(str(payload.get('subject')))}, but the passkey is "
            f"approver {sanitize(checked.approver.name)}'s"
        )
    if principal_subject is not None and checked.approver.subject == principal_subject:
        raise PasskeyRefused(
            f"was approved by approver {sanitize(checked.approver.name)}, the principal whose "
            "call it was"
        )
    return checked.approver.subject


def audit_decisions(
    store: Store, registry: Registry, from_seq: int | None = None, to_seq: int | None = None
) -> list[DecisionProblem]:
    """Every decision in the chain (or in `from_seq`..`to_seq`) that no passkey proves."""
    decided: dict[str, list[Event]] = defaultdict(list)
    required: dict[str, int] = {}
    used: set[bytes] = set()
    problems: list[DecisionProblem] = []
    for event in _events(store, from_seq, to_seq):
        approval_id = event.payload.get("approval_id")
        if not isinstance(approval_id, str):
            continue
        if event.type == EventType.APPROVER_DECIDED:
            decided[approval_id].append(event)
        elif event.type == EventType.APPROVAL_QUORUM_REACHED:
            count = event.payload.get("required")
            required[approval_id] = count if isinstance(count, int) else 1
        elif event.type in _VERDICT_OF:
            verdict = _VERDICT_OF[event.type]
            principal = store.principal_of_run(event.run_id)
            subjects: set[str] = set()
            refusal = None
            signed_quorum = 1
            for decision in decided.pop(approval_id, []):
                if decision.payload.get("verdict") != verdict:
                    continue
                signed_quorum = max(signed_quorum, _signed_quorum(decision.payload))
                try:
                    subjects.add(
                        _checked_subject(
                            registry,
                            decision,
                            used,
                            None if principal is None else principal.subject,
                        )
                    )
                except PasskeyRefused as exc:
                    refusal = f"has a decision at event {decision.seq} that fails: {exc}"
            recorded = required.pop(approval_id, 1)
            needed = max(recorded, signed_quorum) if verdict == APPROVE else 1
            word = "granted" if verdict == APPROVE else "rejected"
            if refusal is not None:
                problems.append(DecisionProblem(event.seq, event.run_id, approval_id, refusal))
            elif not subjects:
                problems.append(
                    DecisionProblem(
                        event.seq,
                        event.run_id,
                        approval_id,
                        f"was {word} without any approver's passkey assertion",
                    )
                )
            elif len(subjects) < needed:
                problems.append(
                    DecisionProblem(
                        event.seq,
                        event.run_id,
                        approval_id,
                        f"was {word} by {len(subjects)} approver(s) where its quorum needs "
                        f"{needed}",
                    )
                )
    return problems


def approval_unproven(
    store: Store, registry: Registry, approval: ApprovalRecord, required: int
) -> str | None:
    """Why the granted `approval` is not proven by `required` distinct approvers' passkeys
    (the proxy checks this before it runs an approved call), or None when it is."""
    from ._decide import decisions_of

    principal = store.principal_of_run(approval.run_id)
    subjects: set[str] = set()
    used: set[bytes] = set()
    failures: list[str] = []
    for payload in decisions_of(store, approval):
        if payload.get("verdict") != APPROVE or payload.get("approval_hash") != (
            approval.approval_hash
        ):
            continue
        required = max(required, _signed_quorum(payload))
        event = Event(0, approval.run_id, EventType.APPROVER_DECIDED.value, payload, "", "", "")
        try:
            subjects.add(
                _checked_subject(
                    registry, event, used, None if principal is None else principal.subject
                )
            )
        except PasskeyRefused as exc:
            failures.append(str(exc))
    if len(subjects) >= required:
        return None
    if failures:
        return f"its passkey decision fails: {failures[0]}"
    if not subjects:
        return "no approver's passkey assertion proves it"
    return f"{len(subjects)} approver(s) approved it where its quorum needs {required}"
