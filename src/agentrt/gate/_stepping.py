"""Stepping: a run started, each decision validated, put to the policy, executed and
recorded.  Every write is a ledger transition (`agentrt.store.ledger`); this room decides
which, and carries out the call between the two commits of an allowed step."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio

from ..agent import Decision, DecisionKind, Observation
from ..canonical import JSONBoundaryError, parse_json
from ..errors import ResultNotRecorded, RunStateError, StoreBusy
from ..policy import Outcome, Policy, PolicyDecision, RunView, ToolRequest
from ..sanitize import sanitize
from ..store import (
    ApprovalRecord,
    ApprovalStatus,
    Connection,
    Event,
    Principal,
    RunRecord,
    RunStatus,
    StepRecord,
    StepStatus,
    Store,
    ledger,
    utc_now,
)
from ..store.events import EndReason
from ..tools import CheckedTool, ToolCall, ToolResult
from ._leases import Leases
from ._preconditions import (
    PRECONDITION_UNAVAILABLE,
    RECONCILED,
    RECONCILED_CONTENT,
    StateCheck,
    approved_content,
    approved_state,
    bind_state,
    has_precondition,
    read_state,
    unavailable_text,
)
from ._values import (
    MAX_ERROR_CHARS,
    Call,
    Limits,
    NewRun,
    OnEnd,
    RunSnapshot,
    StaleSnapshot,
    StepOutcome,
    error_text,
)

__all__ = ["Stepping"]

_A = TypeVar("_A")


class Stepping:
    """The gate's stepping (the public `Gate` builds on it)."""

    store: Store
    policy: Policy
    limits: Limits
    observers: tuple[Callable[[Event], object], ...]
    owner: str
    lease_ttl: float
    _leases: Leases
    # Each running run as this gate's own last write left it (the row and its last
    # steps, read inside that write), so the next step need not read it again
    # before its policy decides.  Only a hint: the step's transaction compares it
    # with the row, and a step decided on a snapshot that moved is decided again on
    # a fresh one (`StaleSnapshot`).
    _views: dict[str, RunSnapshot]
    _tools: dict[str, CheckedTool]

    def _notify(self) -> None:
        for event in self.store.take_committed_events():
            for observer in self.observers:
                try:
                    observer(event)
                except Exception:  # noqa: S112 - an observer must never break a run
                    continue

    @property
    def _tool_names(self) -> Sequence[str]:
        return [registered.spec.name for registered in self._tools.values()]

    def _run_view(self, run: RunRecord) -> RunView:
        return RunView(
            run_id=run.run_id,
            goal=run.goal,
            step_count=run.step_count,
            consecutive_failures=run.consecutive_failures,
            metadata=dict(run.metadata),
        )

    def _naming_policy(
        self, payload: dict[str, Any], decided: PolicyDecision | None = None
    ) -> dict[str, Any]:
        """`payload` of an event that records a policy's outcome, naming which rules decided
        (the policy's declared identity, `policy_id`) when the policy has one, and what
        else the decision asked to be recorded (`PolicyDecision.record`)."""
        if isinstance(policy_id := getattr(self.policy, "id", None), str):
            payload["policy_id"] = policy_id
        if decided is not None and decided.record:
            for name, value in decided.record.items():
                payload.setdefault(name, value)  # never over what the gate writes itself
        return payload

    def _new_run(
        self,
        goal: str,
        run_id: str,
        metadata: Mapping[str, str] | None,
        now: float,
        principal: Principal | None = None,
    ) -> NewRun:
        deadline_at = None if self.limits.deadline is None else now + self.limits.deadline
        return NewRun(run_id, goal, utc_now(), dict(metadata or {}), deadline_at, principal)

    # -- starting ------------------------------------------------------------

    async def start(
        self,
        goal: str,
        *,
        run_id: str | None = None,
        metadata: Mapping[str, str] | None = None,
        principal: Principal | None = None,
    ) -> str:
        """Record a new run and return its id (and who it is for, when `principal` is given)."""
        run_id = run_id or uuid.uuid4().hex
        new = self._new_run(goal, run_id, metadata, time.time(), principal)
        self._views[run_id] = await self.store.write(self._insert_run, new)
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
        on_end: OnEnd | None = None,
        context: object | None = None,
        principal: Principal | None = None,
        scope: tuple[str, str, str] | None = None,
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
        tool starts the run, then is stepped as `step` would.  `context` is
        handed to the tool as `step` hands it; `principal` is who the run is for.

        `scope` (`Store.write_scoped`'s, from the proxy's call index): `admit` reads
        and writes only that scope's rows, so a step that is allowed or denied outright
        (no claim, no state read, no approval) and its result are scoped writes
        (decision 0065), which run beside other scopes' on PostgreSQL.
        """
        now = time.time()
        new = self._new_run(goal, run_id, metadata, now, principal)
        registered, arguments, problem = self._check_request(decision.tool, decision.args)
        plain = (
            decision.kind is not DecisionKind.TOOL_CALL
            or problem is not None
            or registered is None
            or self.limits.max_steps < 1
            or (new.deadline_at is not None and now >= new.deadline_at)
        )
        if plain:
            admitted, value, view = await self.store.write(self._admit_and_insert, admit, new)
            self._notify()
            if not admitted:
                return value, None
            if view is not None:
                self._views[run_id] = view
            return value, await self.step(run_id, decision, context=context)
        assert registered is not None
        request = ToolRequest(registered.spec, decision.args, arguments, run_id, 1)
        decided = await self._evaluate(
            request, RunView(run_id, goal, 0, 0, dict(new.metadata), new.principal)
        )
        state: StateCheck | None = None
        if decided.outcome is Outcome.REQUIRE_APPROVAL and has_precondition(registered):
            decided, state = await self._with_state(registered, decided, run_id, 1,
                                                    decision.args, context)  # fmt: skip
        if scope is not None and not _scoped_step(decided, state):
            scope = None
        if scope is None:
            admitted, value, recorded = await self.store.write(
                self._admit_and_record, admit, new, registered.spec.name, decision.args,
                decided, now, state,
            )  # fmt: skip
        else:
            admitted, value, recorded = await self.store.write_scoped(
                scope, self._admit_and_record, admit, new, registered.spec.name, decision.args,
                decided, now, state,
            )  # fmt: skip
        self._notify()
        if not admitted:
            return value, None
        approval, token = recorded
        call = Call(run_id, 1, registered, decision.args, token, on_end, context=context,
                    scope=scope)  # fmt: skip
        return value, self._settled(await self._carry_out(call, decided, approval, state))

    def _admit_and_insert(
        self, connection: Connection, admit: Callable[[Connection], tuple[bool, _A]], new: NewRun
    ) -> tuple[bool, _A, RunSnapshot | None]:
        admitted, value = admit(connection)
        if not admitted:
            return False, value, None
        return True, value, self._insert_run(connection, new)

    def _admit_and_record(
        self,
        connection: Connection,
        admit: Callable[[Connection], tuple[bool, _A]],
        new: NewRun,
        name: str,
        args: str,
        decided: PolicyDecision,
        now: float,
        state: StateCheck | None = None,
    ) -> tuple[bool, _A, tuple[ApprovalRecord | None, str]]:
        admitted, value = admit(connection)
        if not admitted:
            return False, value, (None, "")
        started = utc_now()
        view = self._insert_run(connection, new, leased=started)
        return (
            True,
            value,
            self._record_step(
                connection, view.run, 1, name, args, decided, now, state, leased=started
            ),
        )

    def _insert_run(
        self, connection: Connection, new: NewRun, *, leased: str | None = None
    ) -> RunSnapshot:
        """Insert a running run.  `leased` (its first step's start time): the run is
        inserted holding this gate's lease with that step counted, as `Leases.acquire`
        would leave it, so the step's record needs no update of the row."""
        run, token = ledger.start_run(
            self.store, connection, new.run_id, new.goal, self._tool_names, new.metadata,
            new.created, new.deadline_at,
            None if leased is None else ledger.NewLease(self.owner, self.lease_ttl, leased),
            new.principal,
        )  # fmt: skip
        if token is not None:
            self._leases.adopt(new.run_id, token)
        return RunSnapshot(run, ())

    # -- the sequence --------------------------------------------------------

    def _read_view(self, run_id: str) -> RunSnapshot:
        """The run and the last steps loop detection looks at (blocking: run it off the loop)."""
        run = self.store.get_run(run_id)
        return RunSnapshot(run, self._recent_steps(run))

    def _recent_steps(self, run: RunRecord) -> tuple[StepRecord, ...]:
        window = self.limits.loop_window
        if window <= 0 or run.step_count < window:
            return ()
        return tuple(self.store.last_steps(run.run_id, window))

    def _limit_reached(self, view: RunSnapshot, now: float) -> str | None:
        run = view.run
        if run.deadline_at is not None and now >= run.deadline_at:
            return EndReason.DEADLINE
        if run.step_count >= self.limits.max_steps:
            return EndReason.STEP_LIMIT
        if run.consecutive_failures >= self.limits.max_consecutive_failures:
            return EndReason.FAILURE_LIMIT
        window = self.limits.loop_window
        if window > 0 and run.step_count >= window:
            recent = view.recent
            if (
                len(recent) == window
                and all(step.status is StepStatus.SUCCEEDED for step in recent)
                and len({(step.tool, step.args, step.content) for step in recent}) == 1
            ):
                return EndReason.LOOP_DETECTED
        return None

    async def step(
        self, run_id: str, decision: Decision, *, context: object | None = None
    ) -> StepOutcome:
        """Propose the agent's next decision for a running run and carry it out.

        `context` (the caller's per-call channels, e.g. an `agentrt.mcp.CallContext`)
        reaches the tool on its `ToolCall`; the gate passes it on without reading it."""
        view = self._views.pop(run_id, None)
        if view is not None:
            try:
                return self._settled(await self._step(view, decision, context))
            except StaleSnapshot:
                pass  # another writer moved the run: decide again on what it holds now
        view = await self.store.run(self._read_view, run_id)
        try:
            return self._settled(await self._step(view, decision, context))
        except StaleSnapshot:
            raise RunStateError(
                f"run {sanitize(run_id)} moved on while this step was decided"
            ) from None

    def _settled(self, outcome: StepOutcome) -> StepOutcome:
        # A run that ended or waits holds no lease: forget its token, so a
        # long-lived gate (the proxy's: one run per call) keeps none per run.
        if outcome.status is not RunStatus.RUNNING:
            self._leases.forget(outcome.run_id)
            self._views.pop(outcome.run_id, None)
        return outcome

    async def _step(
        self, view: RunSnapshot, decision: Decision, context: object | None
    ) -> StepOutcome:
        now = time.time()
        run = view.run
        run_id = run.run_id
        if run.status is not RunStatus.RUNNING:
            raise RunStateError(f"run {sanitize(run_id)} is {run.status}, not running")
        if decision.kind is DecisionKind.COMPLETE:
            return await self._finish(
                run, RunStatus.COMPLETED, EndReason.COMPLETED, decision.result
            )
        if decision.kind is DecisionKind.FAIL:
            return await self._finish(
                run, RunStatus.FAILED, decision.reason or EndReason.AGENT_FAILED, None
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
        decided = await self._evaluate(request, run)
        state: StateCheck | None = None
        if decided.outcome is Outcome.REQUIRE_APPROVAL and has_precondition(registered):
            decided, state = await self._with_state(registered, decided, run_id, step_number,
                                                    args, context)  # fmt: skip
        approval, token = await self.store.write(
            self._record_step, run, step_number, registered.spec.name, args, decided, time.time(),
            state,
        )  # fmt: skip
        self._notify()
        call = Call(
            run_id, step_number, registered, args, token, recent=view.recent, context=context
        )
        return await self._carry_out(call, decided, approval, state)

    async def _with_state(
        self,
        registered: CheckedTool,
        decided: PolicyDecision,
        run_id: str,
        step: int,
        args: str,
        context: object | None,
    ) -> tuple[PolicyDecision, StateCheck]:
        """An approval of a tool with a precondition is decided against the state it
        will act on: read it now and bind it in (a read that fails offers no approval).
        (Called only then: an allowed call's path makes no extra await.)"""
        name = registered.spec.name
        call = ToolCall(args=args, tool=name, run_id=run_id, step=step, context=context)
        state = await read_state(registered, call)
        if state.error is not None or state.read is None:
            return decided, state
        # Only a later step can repeat an approved one (a first step has nothing before it).
        earlier = None if step == 1 else await self.store.run(
            self._approved_before, run_id, name, args
        )  # fmt: skip
        if earlier is not None:
            # The same request was approved and started before (its outcome unknown): the
            # view compares against that state, and the tool may judge it already done.
            state = dataclasses.replace(state, approved=approved_state(earlier.capability))
            reconciled = getattr(registered.tool, "reconciled", None)
            if callable(reconciled) and reconciled(
                call, state.read, approved_content(earlier.presentation)
            ):
                return decided, dataclasses.replace(state, reconciled=True)
        return bind_state(decided, state), state

    def _approved_before(self, run_id: str, tool: str, args: str) -> ApprovalRecord | None:
        """The run's latest approval if it was spent on this very request with a state."""
        approval = self.store.latest_approval(run_id)
        if (
            approval is not None
            and approval.status is ApprovalStatus.USED
            and (approval.tool, approval.args) == (tool, args)
            and approved_state(approval.capability) is not None
        ):
            return approval
        return None

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
            return PolicyDecision.abort(f"policy_error: {error_text(exc)}")
        if not isinstance(decided, PolicyDecision) or not isinstance(decided.outcome, Outcome):
            return PolicyDecision.abort("policy_error: the policy returned no PolicyDecision")
        return decided

    def _take_running(
        self,
        connection: Connection,
        run_id: str,
        decided_on: RunRecord | None = None,
        *,
        recording: tuple[int, str] | None = None,
    ) -> RunRecord:
        """Inside a write transaction: the run, still running, with this gate's lease on it.

        `decided_on` is the snapshot the caller decided with: if the run has moved
        since (another step recorded), `StaleSnapshot` has the caller decide again.
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
            raise StaleSnapshot(run_id)
        if recording is not None and fresh.step_count + 1 != recording[0]:
            # Another step was recorded while the policy decided this one.
            raise RunStateError(f"run {sanitize(run_id)} moved on while its policy decided")
        self._leases.acquire(
            connection, fresh, time.time(), current_token=token, recording=recording
        )
        return fresh

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

    def _record_step(
        self,
        connection: Connection,
        run: RunRecord,
        step_number: int,
        name: str,
        args: str,
        decided: PolicyDecision,
        now: float,
        state: StateCheck | None = None,
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
        token = self._leases.token(run.run_id)
        ledger.record_step(
            self.store, connection, run.run_id, step_number, name, args, started,
            self._naming_policy({"step": step_number, "outcome": str(decided.outcome),
                                 "reason": decided.reason}, decided),
            executing=decided.outcome is Outcome.ALLOW,
        )  # fmt: skip
        if decided.outcome is Outcome.ALLOW and decided.claim is not None:
            decided.claim(connection, run.run_id, step_number)
        if decided.outcome is Outcome.DENY:
            ledger.deny_step(self.store, connection, run.run_id, step_number,
                             decided.reason or "denied by policy")  # fmt: skip
        elif decided.outcome is Outcome.ABORT:
            ledger.deny_step(self.store, connection, run.run_id, step_number,
                             decided.reason or "aborted by policy")  # fmt: skip
            ledger.end_run(self.store, connection, run.run_id, RunStatus.FAILED,
                           EndReason.POLICY_ERROR if decided.reason.startswith("policy_error")
                           else EndReason.POLICY_ABORT)  # fmt: skip
        elif state is not None and state.reconciled:
            ledger.record_state_read(self.store, connection, run.run_id, step_number,
                                     state.record())  # fmt: skip
            terminal = self._tools[name].spec.terminal
            ledger.reconcile_step(self.store, connection, run.run_id, step_number, name,
                                  RECONCILED_CONTENT, terminal=terminal)  # fmt: skip
        elif state is not None and state.error is not None:
            # Fail closed: no approval is offered for a state nobody could read.
            ledger.record_state_read(self.store, connection, run.run_id, step_number,
                                     state.record())  # fmt: skip
            ledger.deny_step(self.store, connection, run.run_id, step_number,
                             unavailable_text(name, state.error))  # fmt: skip
        elif decided.outcome is Outcome.REQUIRE_APPROVAL:
            if state is not None:
                ledger.record_state_read(self.store, connection, run.run_id, step_number,
                                         state.record())  # fmt: skip
            approval = ledger.request_approval(
                self.store, connection,
                self._approval_request(run.run_id, step_number, name, args, decided), now,
            )  # fmt: skip
        return approval, token

    def _approval_request(
        self, run_id: str, step: int, tool: str, args: str, decided: PolicyDecision
    ) -> ledger.ApprovalRequest:
        return ledger.ApprovalRequest(
            run_id, step, tool, args, decided.kind or "approval", decided.capability,
            decided.presentation, decided.reason, self.limits.approval_ttl,
        )  # fmt: skip

    # -- carrying out a recorded step -----------------------------------------

    async def _carry_out(
        self,
        call: Call,
        decided: PolicyDecision,
        approval: ApprovalRecord | None,
        state: StateCheck | None = None,
    ) -> StepOutcome:
        """What follows a recorded step: its observation, its approval, or its call."""
        if state is not None and state.reconciled:
            observation = Observation(
                call.step, call.tool.spec.name, call.args, "result", RECONCILED_CONTENT
            )
            if call.tool.spec.terminal:
                return StepOutcome(call.run_id, RunStatus.COMPLETED, observation,
                                   result=RECONCILED_CONTENT, reason=RECONCILED)  # fmt: skip
            return StepOutcome(call.run_id, RunStatus.RUNNING, observation, reason=RECONCILED)
        if state is not None and state.error is not None:
            observation = Observation(
                call.step, call.tool.spec.name, call.args, "denied",
                unavailable_text(call.tool.spec.name, state.error),
            )  # fmt: skip
            return StepOutcome(
                call.run_id, RunStatus.RUNNING, observation, reason=PRECONDITION_UNAVAILABLE
            )
        if decided.outcome is Outcome.DENY:
            observation = Observation(
                call.step, call.tool.spec.name, call.args, "denied",
                decided.reason or "denied by policy",
            )  # fmt: skip
            return StepOutcome(call.run_id, RunStatus.RUNNING, observation, reason="denied")
        if decided.outcome is Outcome.ABORT:
            return StepOutcome(call.run_id, RunStatus.FAILED, reason=decided.reason)
        if approval is not None:
            return StepOutcome(
                call.run_id, RunStatus.WAITING_FOR_APPROVAL, approval=approval,
                reason="waiting_for_approval",
            )  # fmt: skip
        return await self._execute(call)

    async def _execute(self, call: Call) -> StepOutcome:
        spec = call.tool.spec
        request = ToolCall(
            args=call.args, tool=spec.name, run_id=call.run_id, step=call.step, context=call.context
        )
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
                    result = await call.tool.tool.call(request)
            else:
                async with self._leases.kept(call.run_id):
                    with scope:
                        result = await call.tool.tool.call(request)
            if scope.cancelled_caught and anyio.current_time() >= scope.deadline:
                raise TimeoutError
        except TimeoutError:
            error = f"the tool {spec.name} timed out after {spec.timeout:g}s"
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            error = f"the tool {spec.name} failed: {error_text(exc)}"
        if error is None and result is not None:
            if not isinstance(result, ToolResult) or not isinstance(result.content, str):
                error = f"the tool {spec.name} returned no ToolResult"
            else:
                try:
                    parse_json(result.content)
                except JSONBoundaryError as exc:
                    error = f"the tool {spec.name} returned content that is not valid JSON: {exc}"
        return await self._record_result(call, result, error)

    async def _record_result(
        self, call: Call, result: ToolResult | None, error: str | None
    ) -> StepOutcome:
        """Record what the tool returned; the tool was called, so this fact is never lost.

        If the record fails (the lease was taken over, the disk is full, any
        store error) the step stays `executing` — recovery then treats it as
        interrupted — and `ResultNotRecorded` tells the caller the outcome is
        unknown.
        """
        run_id = call.run_id
        try:
            if call.scope is None:
                status, run_result, view = await self.store.write(
                    self._write_result, call, result, error
                )
            else:
                status, run_result, view = await self.store.write_scoped(
                    call.scope, self._write_result, call, result, error
                )
        except Exception as exc:
            if isinstance(exc, StoreBusy):
                # The database stayed locked for the whole busy deadline; a
                # release would hold the caller (and its answer) as long again.
                # The lease simply expires, and recovery finds the step executing.
                self._leases.abandon(run_id)
            else:
                with anyio.CancelScope(shield=True):
                    await self._leases.release(run_id)
            raise ResultNotRecorded(run_id, call.step, exc) from exc
        if view is not None:
            self._views[run_id] = view
        self._notify()
        kind = "tool_error" if error is not None else "result"
        content = error if error is not None else (result.content if result else "")
        observation = Observation(call.step, call.tool.spec.name, call.args, kind, content)
        return StepOutcome(run_id, status, observation, result=run_result, reason=kind)

    def _write_result(
        self, connection: Connection, call: Call, result: ToolResult | None, error: str | None
    ) -> tuple[RunStatus, str | None, RunSnapshot | None]:
        """Record the result (`ledger.record_result`: only under the call's own lease
        acquisition); return the run's status, its result if it ended, and its snapshot
        for the next step (from what this transaction read and wrote)."""
        spec = call.tool.spec
        if error is not None:
            raw_content = (
                result.content if result is not None and isinstance(result.content, str) else ""
            )
            returned = ledger.CallResult(call.run_id, call.step, spec.name, spec.terminal, True,
                                         error, raw_content[:MAX_ERROR_CHARS] or None)  # fmt: skip
        else:
            assert result is not None
            returned = ledger.CallResult(call.run_id, call.step, spec.name, spec.terminal, False,
                                         result.content, result.summary)  # fmt: skip
        recorded = ledger.record_result(self.store, connection, returned, call.token)
        status, run = recorded.status, recorded.run
        if call.on_end is not None:
            call.on_end(connection, status)
        if status is not RunStatus.RUNNING or run is None:
            return status, recorded.result, None
        this_step = StepRecord(
            call.run_id, call.step, spec.name, call.args,
            StepStatus.FAILED if returned.failed else StepStatus.SUCCEEDED,
            "tool_error" if returned.failed else "result", returned.content, returned.summary,
            recorded.started_at, recorded.finished_at,
        )  # fmt: skip
        return status, recorded.result, RunSnapshot(run, self._steps_after(run, call, this_step))

    def _steps_after(
        self, run: RunRecord, call: Call, this_step: StepRecord
    ) -> tuple[StepRecord, ...]:
        """The last steps loop detection looks at, once `this_step` was recorded.

        From the steps the call was decided on when they were the full window
        before it (the snapshot was checked against the row when the step was
        recorded, and a finished step's row does not change), else read.
        """
        window = self.limits.loop_window
        if window <= 0 or run.step_count < window:
            return ()
        recent = call.recent
        if (
            recent is not None
            and len(recent) == window
            and recent[-1].step == this_step.step - 1
            and run.step_count == this_step.step
        ):
            return (*recent[1:], this_step)
        return self._recent_steps(run)

    # -- ending --------------------------------------------------------------

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
        return StepOutcome(run.run_id, status, result=result, reason=str(reason))

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


def _scoped_step(decided: PolicyDecision, state: StateCheck | None) -> bool:
    """Whether a first step's record reads and writes only its session's rows: allowed
    or denied outright, with no claim (a grant's use, a flow's taint: rows any session
    may share), no state read and no approval (whose creation order is the store's)."""
    return (
        decided.outcome in (Outcome.ALLOW, Outcome.DENY)
        and decided.claim is None
        and (state is None)
    )
