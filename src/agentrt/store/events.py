"""The event vocabulary and the run's state machine, written once, as data.

Every event type and end reason agentrt writes is a member here, with the
string it has always had (the chain hashes the string, so a value never
changes).  `TRANSITIONS` says what each state event does to its run and its
approvals: the ledger's compare-and-set statements are built from it
(`ledger.py`), and `Store.verify_state` replays the chain through it, so the
writer and the check cannot drift apart.  A new transition is a row here and
a function in the ledger.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from ._records import ApprovalStatus, RunStatus

__all__ = [
    "ENDS_EXPIRING_GRANT",
    "LIVE",
    "OPEN_APPROVAL",
    "RUN_ENDED",
    "TRANSITIONS",
    "EndReason",
    "EventType",
    "Transition",
    "status_test",
]


class EventType(enum.StrEnum):
    """The type of every event in the chain."""

    # A run's life.
    RUN_STARTED = "run_started"
    RUN_TAKEN_OVER = "run_taken_over"
    RUN_RESUMED = "run_resumed"
    RUN_COMPLETED = "run_completed"
    RUN_FAILED = "run_failed"
    RUN_CANCELLED = "run_cancelled"
    OPERATOR_CANCELLED = "operator_cancelled"
    # A step's.
    STEP_RECORDED = "step_recorded"
    STEP_INVALID = "step_invalid"
    POLICY_DECIDED = "policy_decided"
    STEP_DENIED = "step_denied"
    STEP_INTERRUPTED = "step_interrupted"
    TOOL_STARTED = "tool_started"
    TOOL_FINISHED = "tool_finished"
    TOOL_ERROR = "tool_error"
    # An approval's.
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_GRANTED = "approval_granted"
    APPROVAL_REJECTED = "approval_rejected"
    APPROVAL_EXPIRED = "approval_expired"
    # A precondition's read of the state a request acts on, and an approval whose
    # state changed before it could be spent (`gate/_preconditions.py`).
    STATE_READ = "state_read"
    APPROVAL_STALE = "approval_stale"
    # A cut-off call settled without running again: by a rule's `reconcile` (its state
    # already is the intended result) or by a consumer's reconcile hook (`verdict`).
    STEP_RECONCILED = "step_reconciled"
    # Model accounting (`accounting.py`).
    MODEL_ATTEMPT = "model_attempt"
    MODEL_LIMIT_REACHED = "model_limit_reached"
    # A proxied server's requests to the host (`proxy/_client_requests.py`).
    CLIENT_REQUEST = "client_request"
    CLIENT_REQUEST_ANSWERED = "client_request_answered"
    # The operator cleared a host session's information-flow taint (`proxy/_flows.py`).
    TAINT_CLEARED = "taint_cleared"
    # A request the signed approver channel refused (`approver/`).
    APPROVER_REFUSED = "approver_refused"
    # A standing grant's (`store/_grants.py`): given with an approval, used by a call it
    # covers, revoked by a person, or found past its time.
    STANDING_GRANT_GIVEN = "standing_grant_given"
    STANDING_GRANT_USED = "standing_grant_used"
    STANDING_GRANT_REVOKED = "standing_grant_revoked"
    STANDING_GRANT_EXPIRED = "standing_grant_expired"
    # The chain's own: an operator's signed checkpoint of its head (`retention/`).
    CHECKPOINT = "checkpoint"
    # A prefix of the chain moved into a signed segment file (`store/archive.py`).
    ARCHIVED = "archived"
    # A proxied server's listing, taken again on its `list_changed`, changed what the
    # proxy serves of it: tools refused (changed since pinned) or listed unpinned
    # (`proxy/_live.py`).
    LISTING_CHANGED = "listing_changed"
    # Passkey mode (`passkeys/`): one approver's decision with its WebAuthn assertion, and
    # an approval's quorum of distinct approvers complete (before its `approval_granted`).
    APPROVER_DECIDED = "approver_decided"
    APPROVAL_QUORUM_REACHED = "approval_quorum_reached"


class EndReason(enum.StrEnum):
    """Why a run ended, as agentrt writes it (`runs.reason`, the end event's `reason`).

    An agent's own `Decision.fail(reason)` is recorded as given, so a stored
    reason may also be free text (`agent_error: ...`, a provider's sentence).
    """

    COMPLETED = "completed"
    AGENT_FAILED = "agent_failed"
    # The gate's limits (`Limits`).
    DEADLINE = "deadline"
    STEP_LIMIT = "step_limit"
    FAILURE_LIMIT = "failure_limit"
    LOOP_DETECTED = "loop_detected"
    # The policy's.
    POLICY_ABORT = "policy_abort"
    POLICY_ERROR = "policy_error"
    # The operator's and the clock's, on an approval.
    APPROVAL_REJECTED = "approval_rejected"
    APPROVAL_EXPIRED = "approval_expired"
    GRANT_EXPIRED = "grant_expired"
    OPERATOR_CANCELLED = "operator_cancelled"
    # The model-spending limits (`accounting.SpendingLimitReached`).
    ACTIVE_TIME = "active_time"
    MODEL_CALL_LIMIT = "model_call_limit"
    TOKEN_LIMIT = "token_limit"  # noqa: S105 - a limit's name, not a secret
    COST_LIMIT = "cost_limit"
    # The proxy ends a call's run with the outcome of its one call.
    TOOL_ERROR = "tool_error"
    DENIED = "denied"
    INVALID = "invalid"
    # The state an approval was decided against changed before it ran; a
    # precondition that could not be read.
    STALE = "stale"
    PRECONDITION_UNAVAILABLE = "precondition_unavailable"


LIVE: Final = frozenset({RunStatus.RUNNING, RunStatus.WAITING_FOR_APPROVAL})
"""A run that has not ended: the only statuses a transition may move a run from."""

OPEN_APPROVAL: Final = frozenset({ApprovalStatus.PENDING, ApprovalStatus.APPROVED})
"""An approval that can still be decided or spent: the ones a newer request supersedes."""


@dataclass(frozen=True, slots=True)
class Transition:
    """What one state event does to its run and to its approvals.

    `run_from` are the statuses the run may be in (the ledger's compare-and-set);
    `run_to` is where the event leaves it.  `approval_from` / `approval_to` are
    the same for the approval the event names (its `approval_id`).
    `supersedes_open`: the run's open approvals are superseded first.
    `needs_grant`: the approval must have been granted by an earlier
    `approval_granted` event.
    """

    run_from: frozenset[RunStatus] = frozenset()
    run_to: RunStatus | None = None
    approval_from: ApprovalStatus | None = None
    approval_to: ApprovalStatus | None = None
    supersedes_open: bool = False
    needs_grant: bool = False


# The state events, in the order `verify_state` has always named them.  The other
# events (steps, tools, accounting, a take-over) change no run's or approval's status.
TRANSITIONS: Final[Mapping[EventType, Transition]] = {
    EventType.RUN_STARTED: Transition(run_to=RunStatus.RUNNING),
    EventType.APPROVAL_REQUESTED: Transition(
        run_from=LIVE,
        run_to=RunStatus.WAITING_FOR_APPROVAL,
        approval_to=ApprovalStatus.PENDING,
        supersedes_open=True,
    ),
    EventType.APPROVAL_GRANTED: Transition(
        run_from=frozenset({RunStatus.WAITING_FOR_APPROVAL}),
        approval_from=ApprovalStatus.PENDING,
        approval_to=ApprovalStatus.APPROVED,
    ),
    EventType.APPROVAL_REJECTED: Transition(
        run_from=frozenset({RunStatus.WAITING_FOR_APPROVAL}),
        approval_from=ApprovalStatus.PENDING,
        approval_to=ApprovalStatus.REJECTED,
    ),
    EventType.APPROVAL_EXPIRED: Transition(
        run_from=frozenset({RunStatus.WAITING_FOR_APPROVAL}),
        approval_from=ApprovalStatus.PENDING,
        approval_to=ApprovalStatus.EXPIRED,
    ),
    EventType.RUN_RESUMED: Transition(
        run_from=frozenset({RunStatus.WAITING_FOR_APPROVAL}),
        run_to=RunStatus.RUNNING,
        approval_from=ApprovalStatus.APPROVED,
        approval_to=ApprovalStatus.USED,
        needs_grant=True,
    ),
    EventType.OPERATOR_CANCELLED: Transition(run_from=LIVE, supersedes_open=True),
    EventType.RUN_COMPLETED: Transition(run_from=LIVE, run_to=RunStatus.COMPLETED),
    EventType.RUN_FAILED: Transition(run_from=LIVE, run_to=RunStatus.FAILED),
    EventType.RUN_CANCELLED: Transition(run_from=LIVE, run_to=RunStatus.CANCELLED),
    EventType.APPROVAL_STALE: Transition(
        run_from=frozenset({RunStatus.WAITING_FOR_APPROVAL}),
        approval_from=ApprovalStatus.APPROVED,
        approval_to=ApprovalStatus.STALE,
        needs_grant=True,
    ),
}

RUN_ENDED: Final[Mapping[RunStatus, EventType]] = {
    transition.run_to: event
    for event, transition in TRANSITIONS.items()
    if transition.run_to is not None and transition.run_to.terminal
}
"""The event that ends a run in each terminal status."""

ENDS_EXPIRING_GRANT: Final = frozenset({EndReason.GRANT_EXPIRED})
"""End reasons that also expire the run's granted, unspent approval."""


def status_test(statuses: Iterable[str]) -> str:
    """The SQL test of `status` against `statuses`: `status = 'x'` or `status IN ('x', 'y')`,
    in the order the members are declared (a statement's text never varies)."""
    order = [*RunStatus, *ApprovalStatus]
    wanted = sorted(set(statuses), key=order.index)
    if len(wanted) == 1:
        return f"status = '{wanted[0]}'"
    return "status IN (" + ", ".join(f"'{status}'" for status in wanted) + ")"
