"""Resuming: a run continued after an operator's decision on its approval (granted,
spent once, superseded when the policy now asks something else, expired), or taken
over after the process running it died (its interrupted call held for an operator
when it may have taken effect)."""

from __future__ import annotations

import dataclasses
import time

from ..agent import Observation
from ..canonical import canonical_json, parse_json
from ..errors import ApprovalError, ApprovalHashMismatch, RunStateError
from ..policy import Outcome, PolicyDecision, ToolRequest
from ..sanitize import sanitize
from ..store import (
    ApprovalRecord,
    ApprovalStatus,
    Connection,
    RunRecord,
    RunStatus,
    StepRecord,
    StepStatus,
    approval_hash,
    iso_to_epoch,
    ledger,
)
from ..store.events import EndReason
from ..tools import SideEffect, ToolCall
from ._preconditions import (
    PRECONDITION_UNAVAILABLE,
    StateCheck,
    approved_state,
    bind_state,
    has_precondition,
    read_state,
    stale_text,
    unavailable_text,
)
from ._reconcile import Interrupted, Reconciler, Reconciliation, Verdict, ask_reconciler
from ._stepping import Stepping
from ._values import INTERRUPTED_SIDE_EFFECT, Call, StepOutcome

__all__ = ["Resuming"]


class Resuming(Stepping):
    """The gate's resuming (the public `Gate` builds on it)."""

    reconcile: Reconciler | None = None
    """The consumer's hook on a cut-off mutation (`Gate(reconcile=…)`; `_reconcile.py`)."""

    async def resume(self, run_id: str, *, context: object | None = None) -> StepOutcome:
        """Continue a run after an approval decision or after its process died.

        A waiting run whose latest approval was granted: the policy is asked
        again, and if it still allows, exactly the recorded request executes.
        A run whose process died mid-tool: a read-only step is marked
        interrupted; any other step pauses on an `interrupted_side_effect`
        approval, since the first attempt may have taken effect.  `context` reaches
        the tool of an approved request as `step` hands it.
        """
        # The run and the time that judges its approval's expiry, in one trip to the store.
        run, now = await self.store.run(self._run_and_clock, run_id)
        if run.status.terminal:
            raise RunStateError(f"run {sanitize(run_id)} already ended ({run.status})")
        if run.status is RunStatus.RUNNING:
            return self._settled(await self._resume_running(run, now))
        return self._settled(await self._resume_waiting(run, now, context))

    async def _reconciled(self, run: RunRecord, now: float) -> tuple[int, Reconciliation] | None:
        """The consumer's verdict on the step a dead process left executing, when a
        reconcile hook is set, the step is a mutation, and its lease has lapsed."""
        if self.reconcile is None:
            return None
        if run.lease_owner not in (None, self.owner) and (run.lease_expires_at or 0.0) > now:
            return None  # its process may be alive: the take-over refuses, and asks nothing
        steps = await self.store.run(self.store.list_steps, run.run_id)
        executing = next((s for s in steps if s.status is StepStatus.EXECUTING), None)
        if executing is None:
            return None
        registered = self._tools.get(executing.tool)
        if registered is None or registered.spec.side_effect is SideEffect.READ_ONLY:
            return None
        interrupted = Interrupted(run.run_id, executing.step, executing.tool, executing.args)
        answer = await ask_reconciler(self.reconcile, interrupted, registered.spec.timeout)
        return executing.step, answer

    def _run_and_clock(self, run_id: str) -> tuple[RunRecord, float]:
        return self.store.get_run(run_id), self.store.clock()

    async def _resume_running(self, run: RunRecord, now: float) -> StepOutcome:
        verdict = await self._reconciled(run, now)
        step_record, current, approval = await self.store.write(self._take_over, run, now, verdict)
        self._notify()
        if step_record is None:
            return StepOutcome(run.run_id, RunStatus.RUNNING, reason="taken_over")
        if verdict is not None and verdict[0] == step_record.step:
            settled = verdict[1]
            if settled.verdict is Verdict.RAN and settled.result is not None:
                observation = Observation(
                    step_record.step, step_record.tool, step_record.args, "result",
                    settled.result.content,
                )  # fmt: skip
                return StepOutcome(run.run_id, current, observation, reason="reconciled")
            if settled.verdict is Verdict.DID_NOT_RUN:
                observation = Observation(
                    step_record.step, step_record.tool, step_record.args, "interrupted",
                    "the tool was interrupted before it returned, and the consumer's check "
                    "found it did not take effect; it may be called again",
                )  # fmt: skip
                return StepOutcome(run.run_id, current, observation, reason="reconciled")
        if current is RunStatus.WAITING_FOR_APPROVAL:
            if approval is not None:
                approval = await self._bind_interrupted(approval, now)
            return StepOutcome(
                run.run_id, current, approval=approval, reason=INTERRUPTED_SIDE_EFFECT
            )
        observation = Observation(
            step_record.step, step_record.tool, step_record.args, "interrupted",
            "the tool was interrupted before it returned; it may be called again",
        )  # fmt: skip
        return StepOutcome(run.run_id, RunStatus.RUNNING, observation, reason="interrupted")

    def _take_over(
        self,
        connection: Connection,
        run: RunRecord,
        now: float,
        verdict: tuple[int, Reconciliation] | None = None,
    ) -> tuple[StepRecord | None, RunStatus, ApprovalRecord | None]:
        """Take over a running run whose process died: its `executing` step is interrupted,
        or settled by the consumer's `verdict` on that very step."""
        ledger.expect_status(connection, run.run_id)
        fresh = self.store.get_run(run.run_id)
        now = self.store.write_time(now)
        if (
            fresh.lease_owner == self.owner
            and (fresh.lease_expires_at or 0.0) > now
            and not self._leases.let_go_of(run.run_id)
        ):
            raise RunStateError(f"run {sanitize(run.run_id)} is already being run by this gate")
        # A fresh token even for this gate's own lapsed lease: the call that held
        # the old one may still return, and must not record its result now.
        self._leases.acquire(connection, fresh, now, take_over=True)
        executing = ledger.executing_step(connection, run.run_id)
        if executing is None:
            ledger.record_take_over(self.store, connection, run.run_id, self.owner)
            return None, RunStatus.RUNNING, None
        step_record = self.store.get_step(run.run_id, executing)
        assert step_record is not None
        if verdict is not None and verdict[0] == executing:
            settled = verdict[1]
            registered = self._tools.get(step_record.tool)
            result = settled.result
            ledger.reconcile_interrupted(
                self.store, connection, run.run_id, executing, step_record.tool,
                verdict=str(settled.verdict), note=settled.note,
                content=result.content if result is not None else None,
                summary=f"reconciled: {result.summary}" if result and result.summary else None,
                terminal=registered is not None and registered.spec.terminal,
            )  # fmt: skip
            if settled.verdict is not Verdict.UNKNOWN:
                return step_record, self.store.get_run(run.run_id).status, None
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
        request = self._approval_request(run_id, step.step, step.tool, step.args, decided)
        ledger.request_approval(self.store, connection, request, now)

    async def _resume_waiting(
        self, run: RunRecord, now: float, context: object | None
    ) -> StepOutcome:
        approval = await self.store.run(self.store.latest_approval, run.run_id)
        if approval is None:
            raise RunStateError(f"run {sanitize(run.run_id)} waits on no approval")
        if approval.status is ApprovalStatus.PENDING:
            expired = await self.store.write(self._expire_if_due, approval, now)
            self._notify()
            if expired:
                return StepOutcome(
                    run.run_id, RunStatus.CANCELLED, reason=EndReason.APPROVAL_EXPIRED.value
                )
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
            return StepOutcome(
                run.run_id, RunStatus.CANCELLED, reason=EndReason.GRANT_EXPIRED.value
            )

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
        state: StateCheck | None = None
        bound_to = approved_state(approval.capability)
        if bound_to is not None:
            # The person approved this request against a state: read it again, and
            # run nothing unless it is still that state.
            state = await read_state(registered, ToolCall(
                args=approval.args, tool=approval.tool, run_id=run.run_id, step=approval.step,
                context=context,
            ))  # fmt: skip
            if state.error is not None:
                await self.store.write(self._record_state, approval, state)
                self._notify()
                observation = Observation(approval.step, approval.tool, approval.args, "denied",
                                          unavailable_text(approval.tool, state.error))  # fmt: skip
                return StepOutcome(
                    run.run_id, RunStatus.WAITING_FOR_APPROVAL, observation, approval=approval,
                    reason=PRECONDITION_UNAVAILABLE,
                )  # fmt: skip
            if state.digest != bound_to:
                await self.store.write(self._stale, approval, state)
                self._notify()
                observation = Observation(approval.step, approval.tool, approval.args, "denied",
                                          stale_text(approval.tool))  # fmt: skip
                return StepOutcome(
                    run.run_id, RunStatus.CANCELLED, observation, reason=EndReason.STALE.value
                )
            if decided.outcome is Outcome.REQUIRE_APPROVAL:
                decided = bind_state(decided, state)
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

        token = await self.store.write(self._use_approval, approval, decided, state)
        self._notify()
        if decided.outcome is Outcome.DENY:
            observation = Observation(approval.step, approval.tool, approval.args, "denied",
                                      decided.reason or "denied by policy")  # fmt: skip
            return StepOutcome(run.run_id, RunStatus.RUNNING, observation, reason="denied")
        if decided.outcome is Outcome.ABORT:
            return StepOutcome(run.run_id, RunStatus.FAILED, reason=decided.reason)
        return await self._execute(
            Call(run.run_id, approval.step, registered, approval.args, token, context=context)
        )

    async def _bind_interrupted(self, approval: ApprovalRecord, now: float) -> ApprovalRecord:
        """An interrupted call of a tool with a precondition: its approval is asked again
        bound to the state as it is now (what the dead attempt left), shown against the
        state its own approval bound and the intended result.  A read that fails leaves
        the approval unbound, recorded; a person still decides."""
        registered = self._tools.get(approval.tool)
        if registered is None or not has_precondition(registered):
            return approval
        state = await read_state(registered, ToolCall(
            args=approval.args, tool=approval.tool, run_id=approval.run_id, step=approval.step,
        ))  # fmt: skip
        if state.error is not None:
            await self.store.write(self._record_state, approval, state)
            self._notify()
            return approval
        earlier = await self.store.run(self._spent_on, approval)
        if earlier is not None:
            state = dataclasses.replace(state, approved=approved_state(earlier.capability))
        decided = bind_state(
            PolicyDecision.require_approval(
                approval.kind, approval.capability, approval.presentation,
                "a mutating tool was interrupted",
            ),
            state,
        )  # fmt: skip
        bound = await self.store.write(self._supersede_bound, approval, decided, state, now)
        self._notify()
        return bound

    def _spent_on(self, approval: ApprovalRecord) -> ApprovalRecord | None:
        """The approval spent on this very step before (its `run_resumed`), if it bound a state."""
        for event in reversed(self.store.list_events(approval.run_id, limit=10_000)):
            spent = event.payload.get("approval_id")
            if event.type != "run_resumed" or not isinstance(spent, str):
                continue
            earlier = self.store.get_approval(spent)
            if (earlier.step, earlier.tool, earlier.args) == (
                approval.step,
                approval.tool,
                approval.args,
            ) and approved_state(earlier.capability) is not None:
                return earlier
            return None
        return None

    def _supersede_bound(
        self,
        connection: Connection,
        approval: ApprovalRecord,
        decided: PolicyDecision,
        state: StateCheck,
        now: float,
    ) -> ApprovalRecord:
        self._record_state(connection, approval, state)
        return self._supersede(connection, approval, decided, now)

    def _record_state(
        self, connection: Connection, approval: ApprovalRecord, state: StateCheck
    ) -> None:
        ledger.record_state_read(self.store, connection, approval.run_id, approval.step,
                                 state.record())  # fmt: skip

    def _stale(self, connection: Connection, approval: ApprovalRecord, state: StateCheck) -> None:
        """The state changed since the approval: record the read, and end the run `stale`."""
        self._record_state(connection, approval, state)
        assert state.digest is not None
        ledger.stale_approval(self.store, connection, approval, state.digest,
                              stale_text(approval.tool))  # fmt: skip

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

    def _use_approval(
        self,
        connection: Connection,
        approval: ApprovalRecord,
        decided: PolicyDecision,
        state: StateCheck | None = None,
    ) -> str:
        """Spend a granted approval (once: compare-and-set) and carry out the policy's outcome."""
        if state is not None:
            self._record_state(connection, approval, state)
        fresh = ledger.use_approval(
            self.store, connection, approval,
            self._naming_policy({"outcome": str(decided.outcome)}, decided),
        )  # fmt: skip
        # Now, not when resume began: the policy may have taken a while, and the
        # call that follows relies on a lease taken just before it.
        token = self._leases.acquire(connection, fresh, time.time())
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
