"""The ledger: every change of a run, a step or an approval, with its event.

One function per transition, each called inside a write (`Store.write`,
`Store.transaction`) with the store and its connection, each a
compare-and-set that names the state it expects, each appending its event in
the same transaction.  The statuses a transition moves a run or an approval
from are read from `events.TRANSITIONS`, the table `verify_state` replays, so
what is written and what is checked are one rule.  Nothing above the store
writes SQL: the gate and the operator's decisions (`approvals.py`) call these.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..canonical import canonical_json, parse_json
from ..errors import LeaseLost, RunLeased, RunStateError
from ..sanitize import sanitize
from ._chain import GENESIS_HASH, _disagreement
from ._outbox import enqueue
from ._principals import PRINCIPAL_FIELD, Principal
from ._records import (
    ApprovalRecord,
    ApprovalStatus,
    Connection,
    Event,
    RunRecord,
    RunStatus,
    StateReport,
    StepStatus,
    _row_to_run,
    _run_status,
    approval_hash,
)
from ._sqlite import INTEGRITY_ERRORS
from ._store import Store
from ._times import epoch_to_iso, utc_now
from .events import (
    ENDS_EXPIRING_GRANT,
    OPEN_APPROVAL,
    RUN_ENDED,
    TRANSITIONS,
    EndReason,
    EventType,
    Transition,
    status_test,
)

__all__ = [
    "SERVER_EVENTS_PREFIX",
    "TAINT_EVENTS_PREFIX",
    "UNREAD",
    "ApprovalRequest",
    "CallResult",
    "NewLease",
    "NewStandingGrant",
    "RecordedResult",
    "acquire_lease",
    "cancel_run",
    "clear_taint",
    "deny_step",
    "end_run",
    "executing_step",
    "expect_status",
    "expire_approval_if_due",
    "expire_grant",
    "expire_standing_grant",
    "give_standing_grant",
    "grant",
    "interrupt_step",
    "mark_executing",
    "reconcile_step",
    "record_approver_refusal",
    "record_checkpoint",
    "record_invalid_step",
    "record_listing_change",
    "record_result",
    "record_state_read",
    "record_step",
    "record_take_over",
    "reject",
    "release_lease",
    "renew_lease",
    "request_approval",
    "revoke_standing_grant",
    "stale_approval",
    "start_run",
    "supersede",
    "use_approval",
    "use_standing_grant",
    "verify_state",
]

UNREAD: Final = object()
"""`acquire_lease`'s `current_token` when the caller has not read it with the run."""

_INTERRUPTED: Final = "the tool was interrupted before it returned; it may be called again"


def _append(
    store: Store, connection: Connection, run_id: str, event: EventType, payload: Mapping[str, Any]
) -> None:
    # The plain string, as every event was always written: the chain hashes it.
    if store.deferring:
        # A scoped write's events (and their announcements) are written at its end.
        store.defer_event(run_id, event.value, payload)
        return
    appended = store.append_event(connection, run_id, event.value, payload)
    if store.outbox is not None:
        # Its announcement in the same transaction: one fact, never lost (`_outbox.py`).
        enqueue(store.outbox, connection, appended)


def _run_from(event: EventType) -> str:
    return status_test(TRANSITIONS[event].run_from)


# The compare-and-set statements, their expected states taken from the table.
_END_RUN: Final = (
    "UPDATE runs SET status = ?, reason = ?, result = ?, updated_at = ?,"
    " lease_owner = NULL, lease_expires_at = NULL"
    f" WHERE run_id = ? AND {_run_from(EventType.RUN_CANCELLED)}"
)
_RUN_WAITS: Final = (
    f"UPDATE runs SET status = '{TRANSITIONS[EventType.APPROVAL_REQUESTED].run_to}',"
    " updated_at = ?, lease_owner = NULL, lease_expires_at = NULL"
    f" WHERE run_id = ? AND {_run_from(EventType.APPROVAL_REQUESTED)}"
)
_RUN_RESUMES: Final = (
    f"UPDATE runs SET status = '{TRANSITIONS[EventType.RUN_RESUMED].run_to}', updated_at = ?"
    f" WHERE run_id = ? AND {_run_from(EventType.RUN_RESUMED)}"
)
_SUPERSEDE_OPEN: Final = (
    f"UPDATE approvals SET status = '{ApprovalStatus.SUPERSEDED}'"
    f" WHERE run_id = ? AND {status_test(OPEN_APPROVAL)}"
)
_SPEND_APPROVAL: Final = (
    f"UPDATE approvals SET status = '{TRANSITIONS[EventType.RUN_RESUMED].approval_to}'"
    " WHERE approval_id = ?"
    f" AND status = '{TRANSITIONS[EventType.RUN_RESUMED].approval_from}'"
)
_TAKE_LEASE: Final = (
    "UPDATE runs SET lease_owner = ?, lease_expires_at = ?, lease_token = ?"
    " WHERE run_id = ?"
    " AND (lease_owner IS NULL OR lease_owner = ? OR lease_expires_at <= ?)"
)
_TAKE_LEASE_COUNTING: Final = (
    "UPDATE runs SET lease_owner = ?, lease_expires_at = ?, lease_token = ?,"
    " step_count = ?, updated_at = ? WHERE run_id = ?"
    " AND (lease_owner IS NULL OR lease_owner = ? OR lease_expires_at <= ?)"
)
_SET_STEP: Final = (
    "UPDATE steps SET status = ?, observation_kind = ?, content = ?, summary = ?,"
    " finished_at = ? WHERE run_id = ? AND step = ?"
)
# A result, counted on the run only under the lease acquisition that started its call.
_COUNT_SUCCESS: Final = (
    "UPDATE runs SET consecutive_failures = 0, updated_at = ?"
    " WHERE run_id = ? AND lease_token = ? RETURNING "
)
_COUNT_FAILURE: Final = (
    "UPDATE runs SET consecutive_failures = consecutive_failures + 1, updated_at = ?"
    " WHERE run_id = ? AND lease_token = ? RETURNING "
)
_FINISH_EXECUTING: Final = (
    "UPDATE steps SET status = ?, observation_kind = ?, content = ?, summary = ?,"
    " finished_at = ? WHERE run_id = ? AND step = ? AND status = 'executing'"
    " RETURNING started_at"
)


# -- reads inside a write ------------------------------------------------------


def lease_token(connection: Connection, run_id: str) -> str | None:
    """The token of the lease acquisition the run is under, if any."""
    row = connection.execute("SELECT lease_token FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else row[0]  # type: ignore[no-any-return]


def expect_status(
    connection: Connection, run_id: str, status: RunStatus = RunStatus.RUNNING
) -> None:
    """Refuse (`RunStateError`) unless the run is in `status`."""
    row = connection.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    if row is None or row[0] != status:
        actual = row[0] if row else "missing"
        raise RunStateError(f"run {sanitize(run_id)} is {actual}, not {status}")


def executing_step(connection: Connection, run_id: str) -> int | None:
    """The run's step whose tool was started and has not been recorded, if any."""
    row = connection.execute(
        "SELECT step FROM steps WHERE run_id = ? AND status = 'executing'", (run_id,)
    ).fetchone()
    return None if row is None else int(row[0])


# -- runs ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewLease:
    """A run inserted already leased to `owner`, with its first step (started at
    `started_at`) counted, as `acquire_lease` would leave it."""

    owner: str
    ttl: float
    started_at: str


_START_RUN: Final = (
    "INSERT INTO runs (run_id, goal, status, created_at, updated_at, metadata,"
    " deadline_at, step_count, lease_owner, lease_expires_at, lease_token,"
    " created_seq) VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?,"
    " (SELECT COALESCE(MAX(created_seq), 0) + 1 FROM runs))"
)
_START_RUN_ORDER_LATER: Final = (
    "INSERT INTO runs (run_id, goal, status, created_at, updated_at, metadata,"
    " deadline_at, step_count, lease_owner, lease_expires_at, lease_token,"
    " created_seq) VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, 0)"
)


def start_run(
    store: Store,
    connection: Connection,
    run_id: str,
    goal: str,
    tools: Sequence[str],
    metadata: Mapping[str, str] | None,
    created: str,
    deadline_at: float | None,
    lease: NewLease | None = None,
    principal: Principal | None = None,
) -> tuple[RunRecord, str | None]:
    """Insert a running run (`run_started`); the row as written and its lease token.

    `principal` (who the run is for, issue 35) is recorded in the event only when given,
    so a run without one is written exactly as before."""
    owner = token = expires = None
    updated, steps = created, 0
    if lease is not None:
        owner, token = lease.owner, uuid.uuid4().hex
        expires = store.write_time(time.time()) + lease.ttl
        updated, steps = lease.started_at, 1
    later = store.deferring
    try:
        # Its creation order in the same statement (one read of the index's last entry),
        # or, in a scoped write, drawn at its end under the chain's lock.
        connection.execute(
            _START_RUN_ORDER_LATER if later else _START_RUN,
            (run_id, goal, created, updated, canonical_json(dict(metadata or {})),
             deadline_at, steps, owner, expires, token),
        )  # fmt: skip
    except INTEGRITY_ERRORS:
        raise RunStateError(f"run {sanitize(run_id)} already exists") from None
    if later:
        store.defer_run_order(run_id)
    started: dict[str, Any] = {"goal": goal, "tools": list(tools), "metadata": dict(metadata or {})}
    if principal is not None:
        started[PRINCIPAL_FIELD] = principal.as_payload()
    _append(store, connection, run_id, EventType.RUN_STARTED, started)
    # The row as this statement wrote it (what a read of it would give), not read back.
    run = RunRecord(
        run_id=run_id, goal=goal, status=RunStatus.RUNNING, reason="", result=None,
        created_at=created, updated_at=updated, step_count=steps, consecutive_failures=0,
        lease_owner=owner, lease_expires_at=expires, metadata=dict(metadata or {}),
        deadline_at=deadline_at,
    )  # fmt: skip
    return run, token


def end_run(
    store: Store,
    connection: Connection,
    run_id: str,
    status: RunStatus,
    reason: str,
    result: str | None = None,
) -> None:
    """Move a run that has not ended to a terminal status, with its `run_<status>` event."""
    reason = str(reason)  # an `EndReason` is stored and hashed as its plain string
    cursor = connection.execute(_END_RUN, (str(status), reason, result, utc_now(), run_id))
    if cursor.rowcount != 1:
        raise RunStateError(f"run {sanitize(run_id)} already ended")
    payload: dict[str, Any] = {"status": str(status), "reason": reason}
    if result is not None:
        payload["result"] = result
    _append(store, connection, run_id, RUN_ENDED[status], payload)


def cancel_run(store: Store, connection: Connection, run_id: str, by: str, reason: str) -> None:
    """The operator ends a run: its open approvals are superseded (`operator_cancelled`)."""
    connection.execute(_SUPERSEDE_OPEN, (run_id,))
    _append(store, connection, run_id, EventType.OPERATOR_CANCELLED, {"by": by})
    end_run(store, connection, run_id, RunStatus.CANCELLED, reason)


def record_take_over(store: Store, connection: Connection, run_id: str, owner: str) -> None:
    """A run whose process died, nothing of it executing, is now `owner`'s."""
    _append(store, connection, run_id, EventType.RUN_TAKEN_OVER, {"owner": owner})


# -- leases --------------------------------------------------------------------


def acquire_lease(
    store: Store,
    connection: Connection,
    run: RunRecord,
    now: float,
    *,
    owner: str,
    ttl: float,
    held: str | None,
    take_over: bool = False,
    current_token: object = UNREAD,
    recording: tuple[int, str] | None = None,
) -> str:
    """Take (or extend) the run's lease for `owner`; return the acquisition's token.

    `run` is the row as read in this transaction; `current_token` its lease
    token, read with it, or by default read here.  `held` is the token `owner`
    holds for the run: it is kept while `owner` still holds the lease, and a
    lease taken anew (or `take_over`, after a process died) gets a fresh one,
    so a call started under the old one cannot record its result.
    `recording` is `(step_count, updated_at)` of a step being recorded, set by
    the same update.  Judged on the store's write clock (the server's, on
    PostgreSQL).
    """
    now = store.write_time(now)
    if (
        run.lease_owner is not None
        and run.lease_owner != owner
        and run.lease_expires_at is not None
        and run.lease_expires_at > now
    ):
        raise RunLeased(run.run_id, run.lease_owner, epoch_to_iso(run.lease_expires_at))
    if current_token is UNREAD:
        current_token = lease_token(connection, run.run_id)
    if take_over or held is None or (run.lease_owner, current_token) != (owner, held):
        held = uuid.uuid4().hex
    if recording is None:
        cursor = connection.execute(_TAKE_LEASE, (owner, now + ttl, held, run.run_id, owner, now))
    else:
        cursor = connection.execute(
            _TAKE_LEASE_COUNTING, (owner, now + ttl, held, *recording, run.run_id, owner, now)
        )
    if cursor.rowcount != 1:
        raise RunStateError(f"run {sanitize(run.run_id)} was taken by another process")
    return held


def renew_lease(
    store: Store, connection: Connection, run_id: str, *, owner: str, token: str, ttl: float
) -> bool:
    """Extend `owner`'s lease acquisition `token`; False if the run is no longer under it."""
    now = store.write_time(time.time())
    cursor = connection.execute(
        "UPDATE runs SET lease_expires_at = ?"
        " WHERE run_id = ? AND lease_owner = ? AND lease_token = ?",
        (now + ttl, run_id, owner, token),
    )
    return bool(cursor.rowcount == 1)


def release_lease(connection: Connection, run_id: str, *, owner: str, token: str) -> None:
    """Let go of the run, if it is still under `owner`'s acquisition `token`."""
    connection.execute(
        "UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL"
        " WHERE run_id = ? AND lease_owner = ? AND lease_token = ?",
        (run_id, owner, token),
    )


# -- steps ---------------------------------------------------------------------


def record_invalid_step(
    store: Store,
    connection: Connection,
    run_id: str,
    step: int,
    tool: str,
    args: str,
    problem: str,
    started: str,
) -> None:
    """A request that is not a valid call of a registered tool: counted as a failure."""
    connection.execute(
        "INSERT INTO steps (run_id, step, tool, args, status, observation_kind, content,"
        " started_at, finished_at) VALUES (?, ?, ?, ?, 'invalid', 'invalid', ?, ?, ?)",
        (run_id, step, tool, args, problem, started, started),
    )
    connection.execute(
        "UPDATE runs SET step_count = ?, consecutive_failures = consecutive_failures + 1,"
        " updated_at = ? WHERE run_id = ?",
        (step, started, run_id),
    )
    _append(
        store, connection, run_id, EventType.STEP_INVALID,
        {"step": step, "tool": tool, "args": args, "problem": problem},
    )  # fmt: skip


def record_step(
    store: Store,
    connection: Connection,
    run_id: str,
    step: int,
    tool: str,
    args: str,
    started: str,
    decision: Mapping[str, Any],
    *,
    executing: bool,
) -> None:
    """A request and its policy's decision (`decision`: the `policy_decided` payload).

    An allowed step (`executing`) goes straight to `executing`, with its
    `tool_started`: `recorded` would be visible to nobody, inside this
    transaction.  Any other outcome is the caller's next transition.
    """
    connection.execute(
        "INSERT INTO steps (run_id, step, tool, args, status, started_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (run_id, step, tool, args,
         StepStatus.EXECUTING.value if executing else StepStatus.RECORDED.value, started),
    )  # fmt: skip
    _append(store, connection, run_id, EventType.STEP_RECORDED,
            {"step": step, "tool": tool, "args": args})  # fmt: skip
    _append(store, connection, run_id, EventType.POLICY_DECIDED, decision)
    if executing:
        _append(store, connection, run_id, EventType.TOOL_STARTED, {"step": step, "tool": tool})


def deny_step(store: Store, connection: Connection, run_id: str, step: int, reason: str) -> None:
    """The policy (or the operator) said no to a recorded step; nothing ran."""
    connection.execute(
        _SET_STEP,
        (str(StepStatus.DENIED), "denied", reason, None, utc_now(), run_id, step),
    )
    _append(store, connection, run_id, EventType.STEP_DENIED, {"step": step, "reason": reason})


def mark_executing(store: Store, connection: Connection, run_id: str, step: int, tool: str) -> None:
    """A granted step's tool is about to be called."""
    connection.execute(
        "UPDATE steps SET status = 'executing' WHERE run_id = ? AND step = ?", (run_id, step)
    )
    _append(store, connection, run_id, EventType.TOOL_STARTED, {"step": step, "tool": tool})


def interrupt_step(
    store: Store, connection: Connection, run_id: str, step: int, tool: str, *, may_repeat: bool
) -> None:
    """A step whose process died while its tool ran.  `may_repeat` (a read): the step
    is over, interrupted; otherwise it stays for the approval the caller requests next."""
    if may_repeat:
        connection.execute(
            _SET_STEP,
            (str(StepStatus.INTERRUPTED), "interrupted", _INTERRUPTED, None, utc_now(), run_id,
             step),
        )  # fmt: skip
    _append(store, connection, run_id, EventType.STEP_INTERRUPTED, {"step": step, "tool": tool})


def reconcile_interrupted(
    store: Store,
    connection: Connection,
    run_id: str,
    step: int,
    tool: str,
    *,
    verdict: str,
    note: str,
    content: str | None = None,
    summary: str | None = None,
    terminal: bool = False,
) -> None:
    """A consumer's verdict on a step whose process died mid-tool (`step_reconciled`).

    `ran`: the step succeeds with the result the consumer shows (a terminal
    tool's run completes with it); `did_not_run`: the step ends interrupted and
    may be asked again; `unknown`: only the event, and the caller pauses the run
    on an `interrupted_side_effect` approval as without a verdict.
    """
    payload: dict[str, object] = {"step": step, "tool": tool, "verdict": verdict, "note": note}
    if verdict == "ran":
        assert content is not None
        connection.execute(
            _SET_STEP,
            (str(StepStatus.SUCCEEDED), "result", content, summary or "reconciled: it ran",
             utc_now(), run_id, step),
        )  # fmt: skip
        connection.execute(
            "UPDATE runs SET consecutive_failures = 0, updated_at = ? WHERE run_id = ?",
            (utc_now(), run_id),
        )
        payload["content"] = content
    elif verdict == "did_not_run":
        connection.execute(
            _SET_STEP,
            (str(StepStatus.INTERRUPTED), "interrupted", _DID_NOT_RUN, None, utc_now(), run_id,
             step),
        )  # fmt: skip
    _append(store, connection, run_id, EventType.STEP_RECONCILED, payload)
    if verdict == "ran" and terminal:
        end_run(store, connection, run_id, RunStatus.COMPLETED, EndReason.COMPLETED, content)


_DID_NOT_RUN: Final = (
    "the tool was interrupted before it returned, and the consumer's check found it did not "
    "take effect; it may be called again"
)


@dataclass(frozen=True, slots=True)
class CallResult:
    """What one call of a tool returned, as its step records it.

    `content` is the result's content, or the error that stands for it
    (`failed`); `summary` the result's summary, or the start of what a failed
    tool returned.  A `terminal` tool's success ends the run with its content.
    """

    run_id: str
    step: int
    tool: str
    terminal: bool
    failed: bool
    content: str
    summary: str | None


@dataclass(frozen=True, slots=True)
class RecordedResult:
    """What recording a result left: the run's status, its row as the count left it
    (None for a terminal tool, or once the run ended), the step's start and finish
    times, and the run's result if it ended with this step."""

    status: RunStatus
    run: RunRecord | None
    started_at: str
    finished_at: str
    result: str | None


def record_result(
    store: Store, connection: Connection, call: CallResult, token: str
) -> RecordedResult:
    """Record a tool's result, if the lease acquisition that started its call (`token`)
    still holds the run and the step is still executing; `LeaseLost` otherwise.

    This is the one rule of who may record a result: each update names what it
    expects (the acquisition's token, the step executing) and returns the row it
    left.  A miss means another gate took the run over while the tool ran, and
    decided what this step is: the result then belongs to nobody, and the caller's
    unit rolls back whole.  A terminal tool's success ends the run.
    """
    finished = utc_now()
    counting = _COUNT_FAILURE if call.failed else _COUNT_SUCCESS
    run: RunRecord | None = None
    status: RunStatus | None = None
    if call.terminal:
        # Its success ends the run (after its error the next step reads the run
        # afresh): no view of the run is built, so only its status is returned.
        row = connection.execute(counting + "status", (finished, call.run_id, token)).fetchone()
        status = None if row is None else _run_status(row[0])
    else:
        row = connection.execute(counting + "*", (finished, call.run_id, token)).fetchone()
        if row is not None:
            run = _row_to_run(row)
            status = run.status
    started_at: str | None = None
    if status is not None:
        step_status = StepStatus.FAILED if call.failed else StepStatus.SUCCEEDED
        found = connection.execute(
            _FINISH_EXECUTING,
            (str(step_status), "tool_error" if call.failed else "result", call.content,
             call.summary, finished, call.run_id, call.step),
        ).fetchone()  # fmt: skip
        started_at = None if found is None else str(found[0])
    if status is None or started_at is None:
        raise LeaseLost(
            f"run {sanitize(call.run_id)} was taken over while step {call.step} ran; "
            "its result belongs to nobody now"
        )
    if call.failed:
        _append(store, connection, call.run_id, EventType.TOOL_ERROR,
                {"step": call.step, "tool": call.tool, "error": call.content})  # fmt: skip
    else:
        _append(
            store, connection, call.run_id, EventType.TOOL_FINISHED,
            {"step": call.step, "tool": call.tool, "content": call.content,
             "summary": call.summary},
        )  # fmt: skip
    result: str | None = None
    if status is RunStatus.RUNNING and call.terminal and not call.failed:
        result = call.content
        end_run(store, connection, call.run_id, RunStatus.COMPLETED, EndReason.COMPLETED, result)
        status = RunStatus.COMPLETED
    return RecordedResult(status, run, started_at, finished, result)


# -- approvals -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A step held for an operator: what they are asked (`kind`, `capability`,
    `presentation`, hashed with the exact request) and why; `ttl` in seconds, or None."""

    run_id: str
    step: int
    tool: str
    args: str
    kind: str
    capability: Any
    presentation: Any
    reason: str
    ttl: float | None


def request_approval(
    store: Store, connection: Connection, request: ApprovalRequest, now: float
) -> ApprovalRecord:
    """Hold the run on a new approval: the run's open ones are superseded, the step
    waits, the run waits and lets go of its lease (`approval_requested`)."""
    run_id, step = request.run_id, request.step
    # Round-trip through canonical JSON so the stored and hashed forms are one.
    capability = parse_json(canonical_json(request.capability))
    presentation = parse_json(canonical_json(request.presentation))
    digest = approval_hash(request.kind, capability, presentation, request.tool, request.args)
    approval_id = uuid.uuid4().hex[:16]
    expires_at = None if request.ttl is None else store.write_time(now) + request.ttl
    seq_row = connection.execute("SELECT COALESCE(MAX(created_seq), 0) FROM approvals").fetchone()
    connection.execute(_SUPERSEDE_OPEN, (run_id,))
    connection.execute(
        "INSERT INTO approvals (approval_id, run_id, step, kind, capability, presentation,"
        " tool, args, approval_hash, status, created_at, expires_at, created_seq)"
        f" VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, '{ApprovalStatus.PENDING}', ?, ?, ?)",
        (approval_id, run_id, step, request.kind, canonical_json(capability),
         canonical_json(presentation), request.tool, request.args, digest, utc_now(),
         expires_at, seq_row[0] + 1),
    )  # fmt: skip
    connection.execute(
        "UPDATE steps SET status = 'waiting' WHERE run_id = ? AND step = ?", (run_id, step)
    )
    cursor = connection.execute(_RUN_WAITS, (utc_now(), run_id))
    if cursor.rowcount != 1:
        raise RunStateError(f"run {sanitize(run_id)} ended while asking for approval")
    _append(
        store, connection, run_id, EventType.APPROVAL_REQUESTED,
        {"approval_id": approval_id, "step": step, "kind": request.kind, "tool": request.tool,
         "args": request.args, "capability": capability, "presentation": presentation,
         "approval_hash": digest, "reason": request.reason},
    )  # fmt: skip
    return store.get_approval(approval_id)


def supersede(
    store: Store, connection: Connection, request: ApprovalRequest, now: float
) -> ApprovalRecord:
    """The policy now asks for a different approval than the one granted: it replaces it."""
    expect_status(connection, request.run_id, RunStatus.WAITING_FOR_APPROVAL)
    return request_approval(store, connection, request, now)


def _decide_approval(
    connection: Connection, approval_id: str, event: EventType, **fields: Any
) -> None:
    """Move an approval as `event`'s row of the table says, setting `fields` with it."""
    transition: Transition = TRANSITIONS[event]
    assert transition.approval_from is not None and transition.approval_to is not None
    assignments = ", ".join(f"{name} = ?" for name in fields)
    sql = "UPDATE approvals SET status = ?" + (f", {assignments}" if assignments else "")
    cursor = connection.execute(
        sql + " WHERE approval_id = ? AND status = ?",
        (str(transition.approval_to), *fields.values(), approval_id,
         str(transition.approval_from)),
    )  # fmt: skip
    if cursor.rowcount != 1:
        raise RunStateError(f"approval {sanitize(approval_id)} was decided by someone else first")


def _operator_decided(
    store: Store,
    connection: Connection,
    approval: ApprovalRecord,
    event: EventType,
    by: str,
    note: str,
    decided_at: str,
    **fields: Any,
) -> None:
    _decide_approval(connection, approval.approval_id, event,
                     decided_by=by, note=note, decided_at=decided_at, **fields)  # fmt: skip
    _append(
        store, connection, approval.run_id, event,
        {"approval_id": approval.approval_id, "approval_hash": approval.approval_hash,
         "by": by, "note": note},
    )  # fmt: skip


def grant(
    store: Store,
    connection: Connection,
    approval: ApprovalRecord,
    *,
    by: str,
    note: str,
    decided_at: str,
    grant_expires_at: float | None,
) -> None:
    """The operator grants a pending approval (`approval_granted`); the run stays waiting."""
    _operator_decided(store, connection, approval, EventType.APPROVAL_GRANTED, by, note,
                      decided_at, grant_expires_at=grant_expires_at)  # fmt: skip


def reject(
    store: Store,
    connection: Connection,
    approval: ApprovalRecord,
    *,
    by: str,
    note: str,
    decided_at: str,
) -> None:
    """The operator rejects a pending approval: its step is denied, the run cancelled."""
    _operator_decided(
        store, connection, approval, EventType.APPROVAL_REJECTED, by, note, decided_at
    )
    connection.execute(
        "UPDATE steps SET status = 'denied', observation_kind = 'denied', content = ?,"
        " finished_at = ? WHERE run_id = ? AND step = ?",
        (note or "the operator rejected this request", utc_now(), approval.run_id,
         approval.step),
    )  # fmt: skip
    end_run(store, connection, approval.run_id, RunStatus.CANCELLED,
            EndReason.APPROVAL_REJECTED, None)  # fmt: skip


def expire_approval_if_due(
    store: Store, connection: Connection, approval: ApprovalRecord, now: float
) -> bool:
    """Expire a pending approval past its TTL, cancelling the run; True if it expired.

    Judged on the write's time (`Store.write_time`: the server's clock on PostgreSQL).
    """
    now = store.write_time(now)
    if (
        approval.status is ApprovalStatus.PENDING
        and approval.expires_at is not None
        and now >= approval.expires_at
    ):
        _decide_approval(connection, approval.approval_id, EventType.APPROVAL_EXPIRED)
        end_run(store, connection, approval.run_id, RunStatus.CANCELLED,
                EndReason.APPROVAL_EXPIRED)  # fmt: skip
        _append(store, connection, approval.run_id, EventType.APPROVAL_EXPIRED,
                {"approval_id": approval.approval_id})  # fmt: skip
        return True
    return False


def expire_grant(store: Store, connection: Connection, approval: ApprovalRecord) -> None:
    """A granted approval was not spent in time: it expires and the run is cancelled."""
    connection.execute(
        "UPDATE approvals SET status = 'expired' WHERE approval_id = ? AND status = ?",
        (approval.approval_id, str(ApprovalStatus.APPROVED)),
    )
    end_run(store, connection, approval.run_id, RunStatus.CANCELLED, EndReason.GRANT_EXPIRED)


def use_approval(
    store: Store, connection: Connection, approval: ApprovalRecord, decision: Mapping[str, Any]
) -> RunRecord:
    """Spend a granted approval (once: compare-and-set) and set its run running again
    (`run_resumed`, `decision` its policy's part of the payload); the run as it is now."""
    expect_status(connection, approval.run_id, RunStatus.WAITING_FOR_APPROVAL)
    cursor = connection.execute(_SPEND_APPROVAL, (approval.approval_id,))
    if cursor.rowcount != 1:
        raise RunStateError(f"approval {approval.approval_id} was used by another resume first")
    connection.execute(_RUN_RESUMES, (utc_now(), approval.run_id))
    _append(store, connection, approval.run_id, EventType.RUN_RESUMED,
            {"approval_id": approval.approval_id, **decision})  # fmt: skip
    return store.get_run(approval.run_id)


# -- preconditions --------------------------------------------------------------


def record_state_read(
    store: Store, connection: Connection, run_id: str, step: int, read: Mapping[str, Any]
) -> None:
    """A precondition read the state step `step` would act on (`read`: the read tool, its
    arguments, and the state's digest, or the error that stopped the read)."""
    _append(store, connection, run_id, EventType.STATE_READ, {"step": step, **read})


def stale_approval(
    store: Store,
    connection: Connection,
    approval: ApprovalRecord,
    current_state: str,
    reason: str,
) -> None:
    """A granted approval whose state changed before it was spent: it is not spent, its
    step is denied with `reason` (nothing ran), and the run ends `stale`."""
    expect_status(connection, approval.run_id, RunStatus.WAITING_FOR_APPROVAL)
    _decide_approval(connection, approval.approval_id, EventType.APPROVAL_STALE)
    _append(
        store, connection, approval.run_id, EventType.APPROVAL_STALE,
        {"approval_id": approval.approval_id, "approval_hash": approval.approval_hash,
         "current_state": current_state},
    )  # fmt: skip
    deny_step(store, connection, approval.run_id, approval.step, reason)
    end_run(store, connection, approval.run_id, RunStatus.CANCELLED, EndReason.STALE)


def reconcile_step(
    store: Store,
    connection: Connection,
    run_id: str,
    step: int,
    tool: str,
    content: str,
    *,
    terminal: bool,
) -> None:
    """A retried request whose state already is its intended result: the step succeeds
    without running (`step_reconciled`); a terminal tool's run completes with it."""
    connection.execute(
        _SET_STEP,
        (str(StepStatus.SUCCEEDED), "result", content, "reconciled", utc_now(), run_id, step),
    )
    connection.execute(
        "UPDATE runs SET consecutive_failures = 0, updated_at = ? WHERE run_id = ?",
        (utc_now(), run_id),
    )
    _append(store, connection, run_id, EventType.STEP_RECONCILED,
            {"step": step, "tool": tool, "content": content})  # fmt: skip
    if terminal:
        end_run(store, connection, run_id, RunStatus.COMPLETED, EndReason.COMPLETED, content)


# -- the approver channel ------------------------------------------------------


def record_approver_refusal(
    store: Store, connection: Connection, run_id: str, refusal: Mapping[str, Any]
) -> None:
    """A request the signed approver channel refused (`approver_refused`): its status,
    code, reason, method and path, as the channel bounded them; never its body.
    `run_id` is the path's run for a request that verified, else empty."""
    _append(store, connection, run_id, EventType.APPROVER_REFUSED, refusal)


# -- the chain's own events ------------------------------------------------------

_LAST_CHECKPOINT: Final = (
    "SELECT payload FROM events WHERE run_id = '' AND type = 'checkpoint' ORDER BY seq DESC LIMIT 1"
)
_HEAD: Final = "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1"


def record_checkpoint(
    store: Store,
    connection: Connection,
    seal: Callable[[int, str, Mapping[str, Any] | None], Mapping[str, Any]],
) -> Event:
    """Append a `checkpoint` event sealing the chain's head as this transaction sees it.

    `seal(head_seq, head_hash, previous)` returns the event's payload (the signed
    statement, `retention/`); `previous` is the payload of the chain's latest
    checkpoint event, or None.  The head is read inside the write, so no event can
    slip between what is signed and the checkpoint event that follows it.
    """
    row = connection.execute(_HEAD).fetchone()
    head_seq, head_hash = (int(row[0]), str(row[1])) if row else (0, GENESIS_HASH)
    previous_row = connection.execute(_LAST_CHECKPOINT).fetchone()
    previous = None if previous_row is None else parse_json(previous_row[0])
    return store.append_event(
        connection, "", EventType.CHECKPOINT.value, seal(head_seq, head_hash, previous)
    )


# -- the check -----------------------------------------------------------------

_STATE_EVENTS: Final = (
    "SELECT seq, run_id, type, payload FROM events WHERE type IN ("
    + ", ".join(f"'{event}'" for event in TRANSITIONS)
    + ") ORDER BY seq"
)


# -- information-flow taint -------------------------------------------------------


TAINT_EVENTS_PREFIX: Final = "taint:"
"""The chain's name for a host session's events: `taint:<session>` in place of a run id."""


def clear_taint(
    store: Store,
    connection: Connection,
    host_session: str,
    labels: Sequence[str],
    by: str,
    note: str,
) -> None:
    """The operator cleared `host_session`'s taint (`labels`, what it held); the caller
    deleted the taint's rows in this transaction."""
    _append(
        store, connection, TAINT_EVENTS_PREFIX + host_session, EventType.TAINT_CLEARED,
        {"session": host_session, "labels": list(labels), "by": by, "note": note},
    )  # fmt: skip


def verify_state(connection: Connection) -> StateReport:
    """Replay the state events through `TRANSITIONS` and compare every run's and
    approval's row with the status its latest state event leaves it in; every
    spent approval must have been granted by an `approval_granted` event.

    The chain proves the events were not changed; this proves the rows the
    gate acts on were not changed behind them (an approval set to `approved`
    by hand, a cancelled run set back to running).  Call it holding the store.
    """
    runs: dict[str, tuple[str, int, str]] = {}
    approvals: dict[str, tuple[str, int, str]] = {}
    open_approvals: dict[str, list[str]] = {}
    granted: set[str] = set()
    checked = 0
    for seq, run_id, type_, payload_text in connection.execute(_STATE_EVENTS):
        checked += 1
        payload = json.loads(payload_text)
        transition = TRANSITIONS[EventType(type_)]
        active = open_approvals.setdefault(run_id, [])
        approval_id = str(payload.get("approval_id", ""))
        if transition.needs_grant and approval_id not in granted:
            return StateReport(
                False, f"event {seq}",
                f"event {seq} resumes run {sanitize(run_id)} on approval "
                f"{sanitize(approval_id)}, which no approval_granted event granted",
                checked,
            )  # fmt: skip
        if transition.supersedes_open:
            for earlier in active:
                approvals[earlier] = (ApprovalStatus.SUPERSEDED, seq, type_)
            active.clear()
        decided = transition.approval_to
        if decided is not None:
            approvals[approval_id] = (decided, seq, type_)
            if decided is ApprovalStatus.PENDING:
                active.append(approval_id)
            elif decided is ApprovalStatus.APPROVED:
                granted.add(approval_id)
            elif approval_id in active:
                active.remove(approval_id)
        if transition.run_to is not None:
            runs[run_id] = (transition.run_to, seq, type_)
            if transition.run_to.terminal and payload.get("reason") in ENDS_EXPIRING_GRANT:
                for earlier in active:
                    if approvals.get(earlier, ("",))[0] == ApprovalStatus.APPROVED:
                        approvals[earlier] = (ApprovalStatus.EXPIRED, seq, type_)
    for row in connection.execute("SELECT run_id, status FROM runs ORDER BY created_seq"):
        problem = _disagreement("run", row[0], row[1], runs.get(row[0]))
        if problem is not None:
            return StateReport(False, f"run {sanitize(row[0])}", problem, checked)
    for row in connection.execute("SELECT approval_id, status FROM approvals ORDER BY created_seq"):
        problem = _disagreement("approval", row[0], row[1], approvals.get(row[0]))
        if problem is not None:
            return StateReport(False, f"approval {sanitize(row[0])}", problem, checked)
    return StateReport(True, None, "every run and approval matches its events", checked)


# -- standing grants (the `grants` extension, `_grants.py`) ---------------------


@dataclass(frozen=True, slots=True)
class NewStandingGrant:
    """A standing grant as a person gives it with their approval: its scope (what was
    shown, hashed as `scope_hash`), the session and tool it covers, its condition, its
    count of calls (None: no count) and how long it lasts from the decision."""

    session: str
    tool: str
    condition: str | None
    calls: int | None
    seconds: float
    scope: Mapping[str, Any]
    scope_hash: str


def give_standing_grant(
    store: Store,
    connection: Connection,
    approval: ApprovalRecord,
    grant: NewStandingGrant,
    *,
    by: str,
    decided_at: str,
    now: float,
) -> str:
    """Record a standing grant given with `approval` (`standing_grant_given`, in the run of
    the approval, in the transaction of the approval's own grant); its id."""
    grant_id = "g" + uuid.uuid4().hex[:15]
    expires_at = store.write_time(now) + grant.seconds
    seq_row = connection.execute(
        "SELECT COALESCE(MAX(created_seq), 0) FROM standing_grants"
    ).fetchone()
    connection.execute(
        "INSERT INTO standing_grants (grant_id, approval_id, run_id, session, tool, condition,"
        " calls_given, calls_left, expires_at, scope, scope_hash, status, given_by, given_at,"
        " created_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, ?, ?)",
        (grant_id, approval.approval_id, approval.run_id, grant.session, grant.tool,
         grant.condition, grant.calls, grant.calls, expires_at, canonical_json(dict(grant.scope)),
         grant.scope_hash, by, decided_at, seq_row[0] + 1),
    )  # fmt: skip
    _append(
        store, connection, approval.run_id, EventType.STANDING_GRANT_GIVEN,
        {"grant_id": grant_id, "approval_id": approval.approval_id,
         "scope": dict(grant.scope), "scope_hash": grant.scope_hash,
         "expires_at": epoch_to_iso(expires_at), "by": by},
    )  # fmt: skip
    return grant_id


def use_standing_grant(
    store: Store, connection: Connection, grant_id: str, run_id: str, step: int, tool: str
) -> None:
    """A call the grant covers was let through: one of its calls is spent (compare-and-set on
    it being active, in time and not used up), in the transaction that records the call's
    step (`standing_grant_used`).  A grant that ended meanwhile raises `RunStateError`, and
    the step's transaction rolls back whole."""
    now = store.write_time(time.time())
    row = connection.execute(
        "UPDATE standing_grants SET calls_left = calls_left - 1,"
        " status = CASE WHEN calls_left = 1 THEN 'used_up' ELSE status END"
        " WHERE grant_id = ? AND status = 'active' AND expires_at > ?"
        " AND (calls_left IS NULL OR calls_left > 0) RETURNING calls_left, status",
        (grant_id, now),
    ).fetchone()
    if row is None:
        raise RunStateError(f"standing grant {sanitize(grant_id)} ended before this call used it")
    _append(store, connection, run_id, EventType.STANDING_GRANT_USED,
            {"grant_id": grant_id, "step": step, "tool": tool, "calls_left": row[0]})  # fmt: skip


def revoke_standing_grant(
    store: Store, connection: Connection, grant_id: str, run_id: str, *, by: str
) -> bool:
    """End an active grant at once (`standing_grant_revoked`); False if it had already ended."""
    cursor = connection.execute(
        "UPDATE standing_grants SET status = 'revoked', ended_by = ?, ended_at = ?"
        " WHERE grant_id = ? AND status = 'active'",
        (by, utc_now(), grant_id),
    )
    if cursor.rowcount != 1:
        return False
    _append(store, connection, run_id, EventType.STANDING_GRANT_REVOKED,
            {"grant_id": grant_id, "by": by})  # fmt: skip
    return True


def expire_standing_grant(store: Store, connection: Connection, grant_id: str, run_id: str) -> bool:
    """Record that an active grant's time ran out (`standing_grant_expired`); False if it is
    not active or still in time."""
    now = store.write_time(time.time())
    cursor = connection.execute(
        "UPDATE standing_grants SET status = 'expired', ended_at = ?"
        " WHERE grant_id = ? AND status = 'active' AND expires_at <= ?",
        (utc_now(), grant_id, now),
    )
    if cursor.rowcount != 1:
        return False
    _append(store, connection, run_id, EventType.STANDING_GRANT_EXPIRED, {"grant_id": grant_id})
    return True


# -- a proxied server's live listing -------------------------------------------


SERVER_EVENTS_PREFIX: Final = "server:"
"""The chain's name for a proxied server's events: `server:<name>` in place of a run id."""


def record_listing_change(
    store: Store,
    connection: Connection,
    server: str,
    session: str,
    refused: Mapping[str, str],
    unpinned: Sequence[str],
) -> None:
    """Server `server`'s new listing changed what the proxy of `session` serves of it:
    `refused` is each loaded tool now refused with its reason, `unpinned` each tool it
    lists that nothing pinned (neither is served)."""
    _append(
        store, connection, SERVER_EVENTS_PREFIX + server, EventType.LISTING_CHANGED,
        {"server": server, "session": session, "refused": dict(refused),
         "unpinned": list(unpinned)},
    )  # fmt: skip


def record_approver_decision(
    store: Store,
    connection: Connection,
    approval: ApprovalRecord,
    *,
    approver: str,
    subject: str,
    verdict: str,
    scope_hash: str | None,
    assertion: Mapping[str, str],
    sign_count: int,
    required: int,
) -> None:
    """One approver's verified passkey decision on a pending approval (`approver_decided`),
    its assertion kept whole so `agentrt verify --approvers` can check it again."""
    payload: dict[str, Any] = {
        "approval_id": approval.approval_id,
        "approval_hash": approval.approval_hash,
        "verdict": verdict,
        "approver": approver,
        "subject": subject,
        "assertion": dict(assertion),
        "sign_count": sign_count,
        "required": required,
    }
    if scope_hash is not None:
        payload["scope_hash"] = scope_hash
    _append(store, connection, approval.run_id, EventType.APPROVER_DECIDED, payload)


def record_quorum_reached(
    store: Store,
    connection: Connection,
    approval: ApprovalRecord,
    *,
    approvers: Sequence[str],
    required: int,
) -> None:
    """An approval's quorum of distinct approvers is complete (`approval_quorum_reached`);
    its `approval_granted` follows in the same transaction."""
    _append(
        store, connection, approval.run_id, EventType.APPROVAL_QUORUM_REACHED,
        {"approval_id": approval.approval_id, "approval_hash": approval.approval_hash,
         "approvers": list(approvers), "required": required},
    )  # fmt: skip
