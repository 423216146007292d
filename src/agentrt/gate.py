"""The gate: the one place where a tool request is recorded, checked, decided,
executed and recorded again.

A program with its own loop proposes each decision with `Gate.step`; the
`Driver` is that loop around an agent.  Every state change is a
compare-and-set inside the transaction that writes its event, so two
processes racing for one run cannot both act, and an operator's cancel
stops a live loop at its next write.

Store work runs in a worker thread (`Store.write` / `Store.run`): the loop
only awaits it, so a busy database never stops heartbeats.  A result is
recorded only under the lease acquisition that started its call (a
per-acquisition token, compared and set), and a result that cannot be
recorded raises `ResultNotRecorded` rather than being lost.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import anyio
from anyio.abc import TaskGroup

from . import ledger
from .agent import Decision, DecisionKind, Observation
from .canonical import JSONBoundaryError, canonical_json, parse_json
from .errors import (
    ApprovalError,
    ApprovalHashMismatch,
    RegistrationError,
    ResultNotRecorded,
    RunStateError,
    StoreBusy,
    StoreError,
)
from .events import EndReason
from .policy import DefaultPolicy, Outcome, Policy, PolicyDecision, RunView, ToolRequest
from .sanitize import sanitize
from .store import (
    ApprovalRecord,
    ApprovalStatus,
    Connection,
    Event,
    RunRecord,
    RunStatus,
    StepRecord,
    StepStatus,
    Store,
    approval_hash,
    iso_to_epoch,
    utc_now,
)
from .tools import CheckedTool, SideEffect, Tool, ToolCall, ToolResult, ToolSpec, check_tool

__all__ = ["INTERRUPTED_SIDE_EFFECT", "Gate", "Limits", "StepOutcome"]

INTERRUPTED_SIDE_EFFECT: Final = "interrupted_side_effect"
_A = TypeVar("_A")
_MAX_ERROR_CHARS: Final = 2_000


@dataclass(frozen=True, slots=True)
class Limits:
    """Run limits, checked before the next action starts.  Durations in seconds; None is off."""

    max_steps: int = 50
    max_consecutive_failures: int = 3
    loop_window: int = 3
    deadline: float | None = None
    approval_ttl: float | None = None
    grant_ttl: float | None = None


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What one gate operation left behind."""

    run_id: str
    status: RunStatus
    observation: Observation | None = None
    approval: ApprovalRecord | None = None
    result: str | None = None
    reason: str = ""


def _owner_label() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _error_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if len(text) > _MAX_ERROR_CHARS:
        text = text[:_MAX_ERROR_CHARS] + "…"
    return text


@dataclass(frozen=True, slots=True)
class _RunView:
    """A run as a transaction of this gate read it: the row and its last steps."""

    run: RunRecord
    recent: tuple[StepRecord, ...]


class _StaleView(Exception):
    """A step was decided on a cached view of its run that another writer has since moved."""


class _LeaseKept:
    """Keeps a run's lease renewed while a call that may outlast half of it runs.

    On asyncio the renewing task starts only when its first renewal falls due,
    a third of the lease into the call, and a timer stands in for it until then:
    a call that returns sooner (nearly every call) costs no task, no task group
    and no cancellation.  On another event loop the renewing task runs for the
    whole call, as a task group's child.  Either way it has ended before the
    call's result is recorded, and a renewal that failed has not failed the
    call (`Gate._heartbeat` tries again at the next beat).
    """

    __slots__ = ("_gate", "_group", "_run_id", "_scope", "_task", "_timer")

    def __init__(self, gate: Gate, run_id: str) -> None:
        self._gate = gate
        self._run_id = run_id
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._scope: anyio.CancelScope | None = None
        self._group: TaskGroup | None = None

    async def __aenter__(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._group = anyio.create_task_group()
            await self._group.__aenter__()
            self._group.start_soon(self._gate._heartbeat, self._run_id)
            return
        self._timer = loop.call_later(self._gate.lease_ttl / 3, self._start, loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._task = loop.create_task(self._renew())

    async def _renew(self) -> None:
        with anyio.CancelScope() as self._scope:
            await self._gate._heartbeat(self._run_id, due_now=True)

    async def __aexit__(self, *exc_info: object) -> None:
        # Returns None: the call's own exception, if any, goes on unwrapped.
        if self._group is not None:
            self._group.cancel_scope.cancel()
            await self._group.__aexit__(None, None, None)
            return
        if self._timer is not None:
            self._timer.cancel()
        task = self._task
        if task is None:
            return
        if self._scope is not None:
            self._scope.cancel()
        else:
            task.cancel()  # started, not yet running: nothing of it ran
        with anyio.CancelScope(shield=True):
            await asyncio.wait({task})
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


class Gate:
    """Record → validate → policy → execute → record, for a fixed set of tools."""

    def __init__(
        self,
        store: Store,
        tools: Iterable[Tool],
        *,
        policy: Policy | None = None,
        limits: Limits | None = None,
        observers: Sequence[Callable[[Event], object]] = (),
        owner: str | None = None,
        lease_ttl: float = 30.0,
    ) -> None:
        self.store = store
        self.policy: Policy = policy if policy is not None else DefaultPolicy()
        self.limits = limits if limits is not None else Limits()
        self.observers = tuple(observers)
        self.owner = owner or _owner_label()
        if not lease_ttl > 0:
            raise ValueError("lease_ttl must be positive")
        self.lease_ttl = float(lease_ttl)
        # The token of each lease this gate acquired; a take-over mints a new
        # one, so this gate's late writes under the old one are refused.
        self._lease_tokens: dict[str, str] = {}
        # Runs whose lease this gate let go of without the database knowing (its
        # release could not be written): nothing here works on them any more, so
        # this gate may take them over before the stale lease runs out.
        self._let_go: set[str] = set()
        # Each running run as this gate's own last write left it (the row and
        # its last steps, read inside that write), so the next step need not
        # read it again before its policy decides.  Only a hint: the step's
        # transaction compares it with the row, and a step decided on a view
        # that moved is decided again on a fresh one (`_StaleView`).
        self._views: dict[str, _RunView] = {}
        self._tools: dict[str, CheckedTool] = {}
        for tool in tools:
            registered = check_tool(tool)
            if registered.spec.name in self._tools:
                raise RegistrationError(f'tool name "{registered.spec.name}" is registered twice')
            self._tools[registered.spec.name] = registered

    @property
    def specs(self) -> list[ToolSpec]:
        """The specs the agent is shown, in registration order."""
        return [registered.spec for registered in self._tools.values()]

    # -- bookkeeping ---------------------------------------------------------

    def _notify(self) -> None:
        for event in self.store.take_committed_events():
            for observer in self.observers:
                try:
                    observer(event)
                except Exception:  # noqa: S112 - an observer must never break a run
                    continue

    def _acquire_lease(
        self,
        connection: Connection,
        run: RunRecord,
        now: float,
        *,
        take_over: bool = False,
        current_token: object = ledger.UNREAD,
        recording: tuple[int, str] | None = None,
    ) -> str:
        """Inside a write transaction: take (or extend) the run's lease; return its token.

        `run` is the row as read in this transaction; `current_token` its lease
        token, read with it (`_take_running`) or, by default, read here.
        `recording` is `(step_count, updated_at)` of a step being recorded, set
        by the same update.

        The token stays while this gate keeps holding the lease; a lease taken
        anew (or `take_over`, after a process died) gets a fresh one.  Leases are
        judged on the store's write clock (the server's, on PostgreSQL).
        """
        held = ledger.acquire_lease(
            self.store, connection, run, now, owner=self.owner, ttl=self.lease_ttl,
            held=self._lease_tokens.get(run.run_id), take_over=take_over,
            current_token=current_token, recording=recording,
        )  # fmt: skip
        self._lease_tokens[run.run_id] = held
        self._let_go.discard(run.run_id)  # this gate works on it again
        return held

    def renew_lease(self, run_id: str) -> bool:
        """Extend this gate's lease on a run; False if it no longer holds it (blocking)."""
        token = self._lease_tokens.get(run_id)
        if token is None:
            return False
        with self.store.transaction() as connection:
            return ledger.renew_lease(
                self.store, connection, run_id, owner=self.owner, token=token, ttl=self.lease_ttl
            )

    @asynccontextmanager
    async def lease(self, run_id: str) -> AsyncIterator[None]:
        """Hold the run's lease (renewed in the background) for a loop around it.

        On the way out the lease is released, so another process may resume
        the run at once rather than after the lease's time runs out.
        """
        await self.store.write(self._take_lease, run_id, time.time())
        failure: BaseException | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(self._heartbeat, run_id)
            try:
                yield
            except BaseException as exc:
                # Re-raised below, outside the task group, so the caller sees
                # the loop's own exception rather than an ExceptionGroup.
                failure = exc
            finally:
                group.cancel_scope.cancel()
        with anyio.CancelScope(shield=True):
            await self._release_lease(run_id)
        if failure is not None:
            raise failure

    def _take_lease(self, connection: Connection, run_id: str, now: float) -> None:
        run = self.store.get_run(run_id)
        if not run.status.terminal:
            self._acquire_lease(connection, run, now)

    async def _release_lease(self, run_id: str) -> None:
        token = self._lease_tokens.pop(run_id, None)
        if token is None:
            return
        try:
            await self.store.write(self._clear_lease, run_id, token)
        except (sqlite3.Error, StoreError):
            self._let_go.add(run_id)  # the lease then simply expires (or is taken over here)

    def _clear_lease(self, connection: Connection, run_id: str, token: str) -> None:
        ledger.release_lease(connection, run_id, owner=self.owner, token=token)

    async def _heartbeat(self, run_id: str, *, due_now: bool = False) -> None:
        """Renew the run's lease every third of its time (the first renewal at once
        when `due_now`) until a renewal finds it no longer this gate's.

        A renewal that fails, for whatever reason, is tried again at the next
        beat and never fails the call it keeps: the tool's own outcome is what
        gets recorded, and the result's compare-and-set on the lease token
        still decides whether this gate holds the run when it is written.
        """
        while True:
            if not due_now:
                await anyio.sleep(self.lease_ttl / 3)
            due_now = False
            try:
                if not await self.store.run(self.renew_lease, run_id):
                    return
            except Exception:  # noqa: S112 - bookkeeping must never falsify the call's outcome
                continue

    def history(self, run_id: str) -> list[Observation]:
        """The observations of the run's steps so far, oldest first."""
        observations = []
        for step in self.store.list_steps(run_id, limit=1_000_000):
            if step.observation_kind is None:
                continue
            observations.append(
                Observation(
                    step.step, step.tool, step.args, step.observation_kind, step.content or ""
                )
            )
        return observations

    def _run_view(self, run: RunRecord) -> RunView:
        return RunView(
            run_id=run.run_id,
            goal=run.goal,
            step_count=run.step_count,
            consecutive_failures=run.consecutive_failures,
            metadata=dict(run.metadata),
        )

    # -- starting and ending -------------------------------------------------

    async def start(
        self, goal: str, *, run_id: str | None = None, metadata: Mapping[str, str] | None = None
    ) -> str:
        """Record a new run and return its id."""
        run_id = run_id or uuid.uuid4().hex
        now = time.time()
        created = utc_now()
        deadline_at = None if self.limits.deadline is None else now + self.limits.deadline
        self._views[run_id] = await self.store.write(
            self._insert_run, run_id, goal, created, metadata, deadline_at
        )
        self._notify()
        return run_id

    async def start_and_step(
        self,
        goal: str,
        decision: Decision,
        *,
        run_id: str,
        metadata: Mapping[str, str] | None = None,
        admit: Callable[[Connection], tuple[bool, _A]],
        on_end: Callable[[Connection, RunStatus], None] | None = None,
    ) -> tuple[_A, StepOutcome | None]:
        """Start a run and take its first step in as few commits as the step needs.

        For an allowed call: the caller's `admit`, the run, the step, its policy
        decision and the `executing` mark are one transaction; the result, the
        run's end (a terminal tool) and the caller's `on_end(connection, status)`
        the second.  `admit(connection)` runs first in the first transaction and
        says whether the run starts at all: if not, its own writes commit,
        nothing of the run is written, and `(value, None)` comes back.  The
        policy decides before that transaction, on the run as it would start
        (no steps yet).  A decision that is not a valid call of a registered
        tool starts the run, then is stepped as `step` would.
        """
        now = time.time()
        created = utc_now()
        deadline_at = None if self.limits.deadline is None else now + self.limits.deadline
        registered, arguments, problem = self._check_request(decision.tool, decision.args)
        plain = (
            decision.kind is not DecisionKind.TOOL_CALL
            or problem is not None
            or registered is None
            or self.limits.max_steps < 1
            or (deadline_at is not None and now >= deadline_at)
        )
        if plain:
            admitted, value, view = await self.store.write(
                self._admit_and_insert, admit, run_id, goal, created, metadata, deadline_at
            )
            self._notify()
            if not admitted:
                return value, None
            if view is not None:
                self._views[run_id] = view
            return value, await self.step(run_id, decision)
        assert registered is not None
        request = ToolRequest(registered.spec, decision.args, arguments, run_id, 1)
        decided = await self._evaluate(request, RunView(run_id, goal, 0, 0, dict(metadata or {})))
        admitted, value, recorded = await self.store.write(
            self._admit_and_record, admit, run_id, goal, created, metadata, deadline_at,
            registered.spec.name, decision.args, decided, now,
        )  # fmt: skip
        self._notify()
        if not admitted:
            return value, None
        approval, token = recorded
        outcome = await self._carry_out(
            run_id, 1, registered, decision.args, decided, approval, token, on_end
        )
        return value, self._settled(outcome)

    def _admit_and_insert(
        self,
        connection: Connection,
        admit: Callable[[Connection], tuple[bool, _A]],
        run_id: str,
        goal: str,
        created: str,
        metadata: Mapping[str, str] | None,
        deadline_at: float | None,
    ) -> tuple[bool, _A, _RunView | None]:
        admitted, value = admit(connection)
        if not admitted:
            return False, value, None
        return (
            True,
            value,
            self._insert_run(connection, run_id, goal, created, metadata, deadline_at),
        )

    def _admit_and_record(
        self,
        connection: Connection,
        admit: Callable[[Connection], tuple[bool, _A]],
        run_id: str,
        goal: str,
        created: str,
        metadata: Mapping[str, str] | None,
        deadline_at: float | None,
        name: str,
        args: str,
        decided: PolicyDecision,
        now: float,
    ) -> tuple[bool, _A, tuple[ApprovalRecord | None, str]]:
        admitted, value = admit(connection)
        if not admitted:
            return False, value, (None, "")
        started = utc_now()
        view = self._insert_run(
            connection, run_id, goal, created, metadata, deadline_at, leased=started
        )
        return (
            True,
            value,
            self._record_step(connection, view.run, 1, name, args, decided, now, leased=started),
        )

    def _insert_run(
        self,
        connection: Connection,
        run_id: str,
        goal: str,
        created: str,
        metadata: Mapping[str, str] | None,
        deadline_at: float | None,
        *,
        leased: str | None = None,
    ) -> _RunView:
        """Insert a running run.  `leased` (its first step's start time): the run is
        inserted holding this gate's lease with that step counted, as `_acquire_lease`
        would leave it, so the step's record needs no update of the row."""
        run, token = ledger.start_run(
            self.store, connection, run_id, goal, [spec.name for spec in self.specs], metadata,
            created, deadline_at,
            None if leased is None else ledger.NewLease(self.owner, self.lease_ttl, leased),
        )  # fmt: skip
        if token is not None:
            self._lease_tokens[run_id] = token
        return _RunView(run, ())

    def _read_view(self, run_id: str) -> _RunView:
        """The run and the last steps loop detection looks at (blocking: run it off the loop)."""
        run = self.store.get_run(run_id)
        return _RunView(run, self._recent_steps(run))

    def _recent_steps(self, run: RunRecord) -> tuple[StepRecord, ...]:
        window = self.limits.loop_window
        if window <= 0 or run.step_count < window:
            return ()
        return tuple(self.store.last_steps(run.run_id, window))

    def _limit_reached(self, view: _RunView, now: float) -> str | None:
        run = view.run
        if run.deadline_at is not None and now >= run.deadline_at:
            return "deadline"
        if run.step_count >= self.limits.max_steps:
            return "step_limit"
        if run.consecutive_failures >= self.limits.max_consecutive_failures:
            return "failure_limit"
        window = self.limits.loop_window
        if window > 0 and run.step_count >= window:
            recent = view.recent
            if (
                len(recent) == window
                and all(step.status is StepStatus.SUCCEEDED for step in recent)
                and len({(step.tool, step.args, step.content) for step in recent}) == 1
            ):
                return "loop_detected"
        return None

    # -- the sequence --------------------------------------------------------

    async def step(self, run_id: str, decision: Decision) -> StepOutcome:
        """Propose the agent's next decision for a running run and carry it out."""
        view = self._views.pop(run_id, None)
        if view is not None:
            try:
                return self._settled(await self._step(view, decision))
            except _StaleView:
                pass  # another writer moved the run: decide again on what it holds now
        view = await self.store.run(self._read_view, run_id)
        try:
            return self._settled(await self._step(view, decision))
        except _StaleView:
            raise RunStateError(
                f"run {sanitize(run_id)} moved on while this step was decided"
            ) from None

    def _settled(self, outcome: StepOutcome) -> StepOutcome:
        # A run that ended or waits holds no lease: forget its token, so a
        # long-lived gate (the proxy's: one run per call) keeps none per run.
        if outcome.status is not RunStatus.RUNNING:
            self._lease_tokens.pop(outcome.run_id, None)
            self._views.pop(outcome.run_id, None)
        return outcome

    async def _step(self, view: _RunView, decision: Decision) -> StepOutcome:
        now = time.time()
        run = view.run
        run_id = run.run_id
        if run.status is not RunStatus.RUNNING:
            raise RunStateError(f"run {sanitize(run_id)} is {run.status}, not running")
        if decision.kind is DecisionKind.COMPLETE:
            return await self._finish(run, RunStatus.COMPLETED, "completed", decision.result)
        if decision.kind is DecisionKind.FAIL:
            return await self._finish(
                run, RunStatus.FAILED, decision.reason or "agent_failed", None
            )
        limit = self._limit_reached(view, now)
        if limit is not None:
            return await self._finish(run, RunStatus.FAILED, limit, None, decided_on=run)

        step_number = run.step_count + 1
        tool_name, args = decision.tool, decision.args
        registered, arguments, problem = self._check_request(tool_name, args)
        stored_args = args.encode("utf-8", "backslashreplace").decode("utf-8")

        if problem is not None or registered is None:
            outcome = await self.store.write(
                self._record_invalid, run, step_number, tool_name, stored_args, problem or ""
            )
            self._notify()
            return outcome

        request = ToolRequest(registered.spec, args, arguments, run_id, step_number)
        decision_made = await self._evaluate(request, run)
        return await self._apply_decision(
            run, step_number, registered, request, decision_made, view.recent
        )

    def _check_request(
        self, tool_name: str, args: str
    ) -> tuple[CheckedTool | None, Any, str | None]:
        """The registered tool, the parsed arguments, and what is wrong with them if anything."""
        registered = self._tools.get(tool_name)
        if registered is None:
            return None, None, f"unknown tool {sanitize(repr(tool_name))}"
        try:
            arguments = parse_json(args)
        except JSONBoundaryError as exc:
            return registered, None, f"the arguments are not valid JSON: {exc}"
        error = registered.schema.first_error(arguments)
        if error is not None:
            return registered, arguments, f"the arguments do not match the schema: {error}"
        return registered, arguments, None

    async def _evaluate(self, request: ToolRequest, run: RunRecord | RunView) -> PolicyDecision:
        view = run if isinstance(run, RunView) else self._run_view(run)
        try:
            decided = await self.policy.evaluate(request, view)
        except Exception as exc:
            # Fail closed: a policy that cannot decide never lets a request through.
            return PolicyDecision.abort(f"policy_error: {_error_text(exc)}")
        if not isinstance(decided, PolicyDecision) or not isinstance(decided.outcome, Outcome):
            return PolicyDecision.abort("policy_error: the policy returned no PolicyDecision")
        return decided

    def _record_invalid(
        self,
        connection: Connection,
        run: RunRecord,
        step_number: int,
        tool: str,
        args: str,
        problem: str,
    ) -> StepOutcome:
        started = utc_now()
        fresh = self._take_running(connection, run.run_id, run)
        if fresh.step_count + 1 != step_number:
            raise RunStateError(f"run {sanitize(run.run_id)} moved on while this step was checked")
        ledger.record_invalid_step(
            self.store, connection, run.run_id, step_number, tool, args, problem, started
        )
        observation = Observation(step_number, tool, args, "invalid", problem)
        return StepOutcome(run.run_id, RunStatus.RUNNING, observation, reason="invalid")

    def _take_running(
        self,
        connection: Connection,
        run_id: str,
        decided_on: RunRecord | None = None,
        *,
        recording: tuple[int, str] | None = None,
    ) -> RunRecord:
        """Inside a write transaction: the run, still running, with this gate's lease on it.

        `decided_on` is the view the caller decided with: if the run has moved
        since (another step recorded), `_StaleView` has the caller decide again.
        `recording` is `(step, started_at)` of the step the caller records: the
        lease's update also counts it on the run.  The row returned is as read,
        before that update.
        """
        fresh, token = self.store.read_run(connection, run_id)
        if fresh.status is not RunStatus.RUNNING:
            raise RunStateError(f"run {sanitize(run_id)} is {fresh.status}, not running")
        if decided_on is not None and (fresh.step_count, fresh.consecutive_failures) != (
            decided_on.step_count,
            decided_on.consecutive_failures,
        ):
            raise _StaleView(run_id)
        if recording is not None and fresh.step_count + 1 != recording[0]:
            # Another step was recorded while the policy decided this one.
            raise RunStateError(f"run {sanitize(run_id)} moved on while its policy decided")
        self._acquire_lease(
            connection, fresh, time.time(), current_token=token, recording=recording
        )
        return fresh

    async def _apply_decision(
        self,
        run: RunRecord,
        step_number: int,
        registered: CheckedTool,
        request: ToolRequest,
        decided: PolicyDecision,
        recent: tuple[StepRecord, ...],
    ) -> StepOutcome:
        now = time.time()
        name, args = registered.spec.name, request.args
        approval, token = await self.store.write(
            self._record_step, run, step_number, name, args, decided, now
        )
        self._notify()
        return await self._carry_out(
            run.run_id, step_number, registered, args, decided, approval, token, recent=recent
        )

    async def _carry_out(
        self,
        run_id: str,
        step_number: int,
        registered: CheckedTool,
        args: str,
        decided: PolicyDecision,
        approval: ApprovalRecord | None,
        token: str,
        on_end: Callable[[Connection, RunStatus], None] | None = None,
        *,
        recent: tuple[StepRecord, ...] | None = None,
    ) -> StepOutcome:
        """What follows a recorded step: its observation, its approval, or its call.

        `recent` is the run's last steps before this one, as the step was decided
        on them (the view's), or None when unknown."""
        name = registered.spec.name
        if decided.outcome is Outcome.DENY:
            observation = Observation(
                step_number, name, args, "denied", decided.reason or "denied by policy"
            )
            return StepOutcome(run_id, RunStatus.RUNNING, observation, reason="denied")
        if decided.outcome is Outcome.ABORT:
            return StepOutcome(run_id, RunStatus.FAILED, reason=decided.reason)
        if approval is not None:
            return StepOutcome(
                run_id, RunStatus.WAITING_FOR_APPROVAL, approval=approval,
                reason="waiting_for_approval",
            )  # fmt: skip
        return await self._execute(
            run_id, step_number, registered, args, token, on_end, recent=recent
        )

    def _record_step(
        self,
        connection: Connection,
        run: RunRecord,
        step_number: int,
        name: str,
        args: str,
        decided: PolicyDecision,
        now: float,
        *,
        leased: str | None = None,
    ) -> tuple[ApprovalRecord | None, str]:
        """The request, its policy decision, and (if allowed) the `executing` mark: one commit.

        `leased`: this transaction inserted `run` a moment ago, holding the lease with
        this step counted (`_insert_run`), the step starting then: nothing to read or
        update on the run (nothing else can have written it since)."""
        approval: ApprovalRecord | None = None
        if leased is not None:
            started = leased
        else:
            started = utc_now()
            self._take_running(connection, run.run_id, run, recording=(step_number, started))
        token = self._lease_tokens[run.run_id]
        ledger.record_step(
            self.store, connection, run.run_id, step_number, name, args, started,
            self._naming_policy({"step": step_number, "outcome": str(decided.outcome),
                                 "reason": decided.reason}),
            executing=decided.outcome is Outcome.ALLOW,
        )  # fmt: skip
        if decided.outcome is Outcome.DENY:
            ledger.deny_step(self.store, connection, run.run_id, step_number,
                             decided.reason or "denied by policy")  # fmt: skip
        elif decided.outcome is Outcome.ABORT:
            ledger.deny_step(self.store, connection, run.run_id, step_number,
                             decided.reason or "aborted by policy")  # fmt: skip
            ledger.end_run(self.store, connection, run.run_id, RunStatus.FAILED,
                           EndReason.POLICY_ERROR if decided.reason.startswith("policy_error")
                           else EndReason.POLICY_ABORT)  # fmt: skip
        elif decided.outcome is Outcome.REQUIRE_APPROVAL:
            approval = self._request_approval(
                connection, run.run_id, step_number, name, args, decided, now
            )
        return approval, token

    def _request_approval(
        self,
        connection: Connection,
        run_id: str,
        step: int,
        tool: str,
        args: str,
        decided: PolicyDecision,
        now: float,
    ) -> ApprovalRecord:
        request = self._approval_request(run_id, step, tool, args, decided)
        return ledger.request_approval(self.store, connection, request, now)

    def _approval_request(
        self, run_id: str, step: int, tool: str, args: str, decided: PolicyDecision
    ) -> ledger.ApprovalRequest:
        return ledger.ApprovalRequest(
            run_id,
            step,
            tool,
            args,
            decided.kind or "approval",
            decided.capability,
            decided.presentation,
            decided.reason,
            self.limits.approval_ttl,
        )

    async def _execute(
        self,
        run_id: str,
        step: int,
        registered: CheckedTool,
        args: str,
        token: str,
        on_end: Callable[[Connection, RunStatus], None] | None = None,
        *,
        recent: tuple[StepRecord, ...] | None = None,
    ) -> StepOutcome:
        spec = registered.spec
        call = ToolCall(args=args, tool=spec.name, run_id=run_id, step=step)
        error: str | None = None
        result: ToolResult | None = None
        try:
            # (What `anyio.fail_after` does, without its two generator layers.)
            scope = anyio.CancelScope(deadline=anyio.current_time() + spec.timeout)
            if spec.timeout <= self.lease_ttl / 2:
                # The lease was taken for lease_ttl just before this call, and
                # the call ends at its timeout with half the lease left: no
                # renewal can be missed, so nothing renews it.
                with scope:
                    result = await registered.tool.call(call)
            else:
                async with _LeaseKept(self, run_id):
                    with scope:
                        result = await registered.tool.call(call)
            if scope.cancelled_caught and anyio.current_time() >= scope.deadline:
                raise TimeoutError
        except TimeoutError:
            error = f"the tool {spec.name} timed out after {spec.timeout:g}s"
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            error = f"the tool {spec.name} failed: {_error_text(exc)}"
        if error is None and result is not None:
            if not isinstance(result, ToolResult) or not isinstance(result.content, str):
                error = f"the tool {spec.name} returned no ToolResult"
            else:
                try:
                    parse_json(result.content)
                except JSONBoundaryError as exc:
                    error = f"the tool {spec.name} returned content that is not valid JSON: {exc}"
        return await self._record_result(
            run_id, step, spec, args, result, error, token, on_end, recent
        )

    async def _record_result(
        self,
        run_id: str,
        step: int,
        spec: ToolSpec,
        args: str,
        result: ToolResult | None,
        error: str | None,
        token: str,
        on_end: Callable[[Connection, RunStatus], None] | None = None,
        recent: tuple[StepRecord, ...] | None = None,
    ) -> StepOutcome:
        """Record what the tool returned; the tool was called, so this fact is never lost.

        If the record fails (the lease was taken over, the disk is full, any
        store error) the step stays `executing` — recovery then treats it as
        interrupted — and `ResultNotRecorded` tells the caller the outcome is
        unknown.
        """
        try:
            status, run_result, view = await self.store.write(
                self._write_result, run_id, step, spec, args, result, error, token, on_end,
                recent,
            )  # fmt: skip
        except Exception as exc:
            if isinstance(exc, StoreBusy):
                # The database stayed locked for the whole busy deadline; a
                # release would hold the caller (and its answer) as long again.
                # The lease simply expires, and recovery finds the step executing.
                self._lease_tokens.pop(run_id, None)
                self._let_go.add(run_id)
            else:
                with anyio.CancelScope(shield=True):
                    await self._release_lease(run_id)
            raise ResultNotRecorded(run_id, step, exc) from exc
        if view is not None:
            self._views[run_id] = view
        self._notify()
        kind = "tool_error" if error is not None else "result"
        content = error if error is not None else (result.content if result else "")
        observation = Observation(step, spec.name, args, kind, content)
        return StepOutcome(run_id, status, observation, result=run_result, reason=kind)

    def _write_result(
        self,
        connection: Connection,
        run_id: str,
        step: int,
        spec: ToolSpec,
        args: str,
        result: ToolResult | None,
        error: str | None,
        token: str,
        on_end: Callable[[Connection, RunStatus], None] | None = None,
        recent: tuple[StepRecord, ...] | None = None,
    ) -> tuple[RunStatus, str | None, _RunView | None]:
        """Record the result; return the run's status, its result if it ended, and its
        view for the next step (from what this transaction read and wrote).

        `recent` is the run's last steps before this one as the step was decided
        on them; with it the view's steps need no read.
        """
        if error is not None:
            raw_content = (
                result.content if result is not None and isinstance(result.content, str) else ""
            )
            call = ledger.CallResult(run_id, step, spec.name, spec.terminal, True, error,
                                     raw_content[:_MAX_ERROR_CHARS] or None)  # fmt: skip
        else:
            assert result is not None
            call = ledger.CallResult(run_id, step, spec.name, spec.terminal, False,
                                     result.content, result.summary)  # fmt: skip
        recorded = ledger.record_result(self.store, connection, call, token)
        status, run, run_result = recorded.status, recorded.run, recorded.result
        if on_end is not None:
            on_end(connection, status)
        if status is not RunStatus.RUNNING or run is None:
            return status, run_result, None
        this_step = StepRecord(
            run_id, step, spec.name, args, StepStatus.SUCCEEDED if error is None else
            StepStatus.FAILED, "result" if error is None else "tool_error", call.content,
            call.summary, recorded.started_at, recorded.finished_at,
        )  # fmt: skip
        return status, run_result, _RunView(run, self._steps_after(run, recent, this_step))

    def _steps_after(
        self, run: RunRecord, recent: tuple[StepRecord, ...] | None, this_step: StepRecord
    ) -> tuple[StepRecord, ...]:
        """The last steps loop detection looks at, once `this_step` was recorded.

        From the steps the step was decided on when they were the full window
        before it (the view was checked against the row when the step was
        recorded, and a finished step's row does not change), else read.
        """
        window = self.limits.loop_window
        if window <= 0 or run.step_count < window:
            return ()
        if (
            recent is not None
            and len(recent) == window
            and recent[-1].step == this_step.step - 1
            and run.step_count == this_step.step
        ):
            return (*recent[1:], this_step)
        return self._recent_steps(run)

    async def _finish(
        self,
        run: RunRecord,
        status: RunStatus,
        reason: str,
        result: str | None,
        *,
        decided_on: RunRecord | None = None,
    ) -> StepOutcome:
        await self.store.write(self._end_running, run.run_id, status, reason, result, decided_on)
        self._notify()
        return StepOutcome(run.run_id, status, result=result, reason=reason)

    def _end_running(
        self,
        connection: Connection,
        run_id: str,
        status: RunStatus,
        reason: str,
        result: str | None,
        decided_on: RunRecord | None,
    ) -> None:
        self._take_running(connection, run_id, decided_on)
        ledger.end_run(self.store, connection, run_id, status, reason, result)

    # -- resuming ------------------------------------------------------------

    async def resume(self, run_id: str) -> StepOutcome:
        """Continue a run after an approval decision or after its process died.

        A waiting run whose latest approval was granted: the policy is asked
        again, and if it still allows, exactly the recorded request executes.
        A run whose process died mid-tool: a read-only step is marked
        interrupted; any other step pauses on an `interrupted_side_effect`
        approval, since the first attempt may have taken effect.
        """
        # The run and the time that judges its approval's expiry, in one trip to the store.
        run, now = await self.store.run(self._run_and_clock, run_id)
        if run.status.terminal:
            raise RunStateError(f"run {sanitize(run_id)} already ended ({run.status})")
        if run.status is RunStatus.RUNNING:
            return self._settled(await self._resume_running(run, now))
        return self._settled(await self._resume_waiting(run, now))

    def _run_and_clock(self, run_id: str) -> tuple[RunRecord, float]:
        return self.store.get_run(run_id), self.store.clock()

    async def _resume_running(self, run: RunRecord, now: float) -> StepOutcome:
        step_record, current, approval = await self.store.write(self._take_over, run, now)
        self._notify()
        if step_record is None:
            return StepOutcome(run.run_id, RunStatus.RUNNING, reason="taken_over")
        if current is RunStatus.WAITING_FOR_APPROVAL:
            return StepOutcome(
                run.run_id, current, approval=approval, reason=INTERRUPTED_SIDE_EFFECT
            )
        observation = Observation(
            step_record.step, step_record.tool, step_record.args, "interrupted",
            "the tool was interrupted before it returned; it may be called again",
        )  # fmt: skip
        return StepOutcome(run.run_id, RunStatus.RUNNING, observation, reason="interrupted")

    def _take_over(
        self, connection: Connection, run: RunRecord, now: float
    ) -> tuple[StepRecord | None, RunStatus, ApprovalRecord | None]:
        """Take over a running run whose process died: its `executing` step is interrupted."""
        ledger.expect_status(connection, run.run_id)
        fresh = self.store.get_run(run.run_id)
        now = self.store.write_time(now)
        if (
            fresh.lease_owner == self.owner
            and (fresh.lease_expires_at or 0.0) > now
            and run.run_id not in self._let_go
        ):
            raise RunStateError(f"run {sanitize(run.run_id)} is already being run by this gate")
        # A fresh token even for this gate's own lapsed lease: the call that held
        # the old one may still return, and must not record its result now.
        self._acquire_lease(connection, fresh, now, take_over=True)
        executing = ledger.executing_step(connection, run.run_id)
        if executing is None:
            ledger.record_take_over(self.store, connection, run.run_id, self.owner)
            return None, RunStatus.RUNNING, None
        step_record = self.store.get_step(run.run_id, executing)
        assert step_record is not None
        self._interrupt(connection, run.run_id, step_record, now)
        current = self.store.get_run(run.run_id).status
        return step_record, current, self.store.waiting_approval(run.run_id)

    def _interrupt(self, connection: Connection, run_id: str, step: StepRecord, now: float) -> None:
        registered = self._tools.get(step.tool)
        read_only = registered is not None and registered.spec.side_effect is SideEffect.READ_ONLY
        ledger.interrupt_step(
            self.store, connection, run_id, step.step, step.tool, may_repeat=read_only
        )
        if read_only:
            return
        side_effect = str(registered.spec.side_effect) if registered else "unknown"
        decided = PolicyDecision.require_approval(
            kind=INTERRUPTED_SIDE_EFFECT,
            capability={"tool": step.tool, "step": step.step, "side_effect": side_effect},
            presentation={
                "tool": step.tool,
                "side_effect": side_effect,
                "warning": "the process running this tool died before it returned; "
                "the first attempt may have taken effect. Approving runs the same request again.",
                "arguments": step.args,
            },
            reason="a mutating tool was interrupted",
        )
        self._request_approval(connection, run_id, step.step, step.tool, step.args, decided, now)

    async def _resume_waiting(self, run: RunRecord, now: float) -> StepOutcome:
        approval = await self.store.run(self.store.latest_approval, run.run_id)
        if approval is None:
            raise RunStateError(f"run {sanitize(run.run_id)} waits on no approval")
        if approval.status is ApprovalStatus.PENDING:
            expired = await self.store.write(self._expire_if_due, approval, now)
            self._notify()
            if expired:
                return StepOutcome(run.run_id, RunStatus.CANCELLED, reason="approval_expired")
            return StepOutcome(
                run.run_id, RunStatus.WAITING_FOR_APPROVAL, approval=approval,
                reason="waiting_for_approval",
            )  # fmt: skip
        if approval.status is not ApprovalStatus.APPROVED:
            raise RunStateError(
                f"run {sanitize(run.run_id)}: approval {approval.approval_id} is {approval.status}"
            )
        if approval.recomputed_hash() != approval.approval_hash:
            raise ApprovalHashMismatch(
                f"approval {approval.approval_id} no longer matches its hash; the stored "
                "request was changed and will not run"
            )
        if await self.store.run(self.store.grant_event, approval) is None:
            # The row says approved, but no operator's decision is in the chain:
            # the row was changed behind the events.
            raise ApprovalError(
                f"approval {sanitize(approval.approval_id)} is marked approved but no "
                "approval_granted event grants it; it was not approved through agentrt and "
                "will not run"
            )
        grant_deadline: float | None = approval.grant_expires_at
        if grant_deadline is None and self.limits.grant_ttl is not None:
            decided_at = approval.decided_at
            grant_deadline = (
                iso_to_epoch(decided_at) if decided_at else now
            ) + self.limits.grant_ttl
        if grant_deadline is not None and now >= grant_deadline:
            await self.store.write(self._expire_grant, approval)
            self._notify()
            return StepOutcome(run.run_id, RunStatus.CANCELLED, reason="grant_expired")

        registered = self._tools.get(approval.tool)
        if registered is None:
            raise RunStateError(
                f"run {sanitize(run.run_id)} waits on tool {sanitize(approval.tool)}, "
                "which this gate does not have"
            )
        # Re-evaluate: the operator's yes does not outrank a policy that now says no.
        arguments = parse_json(approval.args)
        request = ToolRequest(registered.spec, approval.args, arguments, run.run_id, approval.step)
        decided = await self._evaluate(request, run)
        if decided.outcome is Outcome.REQUIRE_APPROVAL and approval.kind != INTERRUPTED_SIDE_EFFECT:
            fresh_hash = approval_hash(
                decided.kind or "approval",
                parse_json(canonical_json(decided.capability)),
                parse_json(canonical_json(decided.presentation)),
                approval.tool,
                approval.args,
            )
            if fresh_hash != approval.approval_hash:
                new_approval = await self.store.write(self._supersede, approval, decided, now)
                self._notify()
                return StepOutcome(
                    run.run_id, RunStatus.WAITING_FOR_APPROVAL, approval=new_approval,
                    reason="approval_superseded",
                )  # fmt: skip

        token = await self.store.write(self._use_approval, approval, decided)
        self._notify()
        if decided.outcome is Outcome.DENY:
            observation = Observation(approval.step, approval.tool, approval.args, "denied",
                                      decided.reason or "denied by policy")  # fmt: skip
            return StepOutcome(run.run_id, RunStatus.RUNNING, observation, reason="denied")
        if decided.outcome is Outcome.ABORT:
            return StepOutcome(run.run_id, RunStatus.FAILED, reason=decided.reason)
        return await self._execute(run.run_id, approval.step, registered, approval.args, token)

    def _expire_if_due(self, connection: Connection, approval: ApprovalRecord, now: float) -> bool:
        return ledger.expire_approval_if_due(self.store, connection, approval, now)

    def _expire_grant(self, connection: Connection, approval: ApprovalRecord) -> None:
        ledger.expire_grant(self.store, connection, approval)

    def _supersede(
        self,
        connection: Connection,
        approval: ApprovalRecord,
        decided: PolicyDecision,
        now: float,
    ) -> ApprovalRecord:
        """The policy now asks for a different approval: it replaces the granted one."""
        return ledger.supersede(
            self.store, connection, self._approval_request(approval.run_id, approval.step,
            approval.tool, approval.args, decided), now,
        )  # fmt: skip

    def _naming_policy(self, payload: dict[str, Any]) -> dict[str, Any]:
        """`payload` of an event that records a policy's outcome, naming which rules decided
        (the policy's declared identity, `policy_id`) when the policy has one."""
        if isinstance(policy_id := getattr(self.policy, "id", None), str):
            payload["policy_id"] = policy_id
        return payload

    def _use_approval(
        self, connection: Connection, approval: ApprovalRecord, decided: PolicyDecision
    ) -> str:
        """Spend a granted approval (once: compare-and-set) and carry out the policy's outcome."""
        fresh = ledger.use_approval(
            self.store, connection, approval,
            self._naming_policy({"outcome": str(decided.outcome)}),
        )  # fmt: skip
        # Now, not when resume began: the policy may have taken a while, and the
        # call that follows relies on a lease taken just before it.
        token = self._acquire_lease(connection, fresh, time.time())
        if decided.outcome is Outcome.DENY:
            ledger.deny_step(self.store, connection, approval.run_id, approval.step,
                             decided.reason or "denied by policy")  # fmt: skip
        elif decided.outcome is Outcome.ABORT:
            ledger.deny_step(self.store, connection, approval.run_id, approval.step,
                             decided.reason or "aborted by policy")  # fmt: skip
            ledger.end_run(self.store, connection, approval.run_id, RunStatus.FAILED,
                           EndReason.POLICY_ABORT)  # fmt: skip
        else:
            ledger.mark_executing(
                self.store, connection, approval.run_id, approval.step, approval.tool
            )
        return token
