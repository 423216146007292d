"""The Driver: an agent's loop over a gate, and what the run may spend on its model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .accounting import (
    MeteredAgent,
    ModelLimits,
    PriceTable,
    RunMeter,
    SpendingLimitReached,
    carried_context,
)
from .agent import Agent, Decision, StepInput
from .errors import AgentrtError
from .gate import Gate, StepOutcome
from .sanitize import sanitize
from .store import ApprovalRecord, RunRecord, RunStatus

__all__ = ["Driver", "RunResult"]


@dataclass(frozen=True, slots=True)
class RunResult:
    """Where a run stands when the loop stops: ended, or waiting for an approval."""

    run_id: str
    status: RunStatus
    result: str | None
    reason: str
    approval: ApprovalRecord | None = None


class Driver:
    """Ask the agent, hand its decision to the gate, repeat until the run ends or waits.

    `limits` bound what the run spends on its model — calls, tokens, cost,
    active time — and are checked before each model dispatch (an agent that
    implements `MeteredAgent`, as every model adapter does, is asked through
    a meter that checks them before each attempt and records each one);
    reaching one ends the run with its reason (`model_call_limit`,
    `token_limit`, `cost_limit`, `active_time`).  `prices` prices the calls.
    """

    def __init__(
        self,
        gate: Gate,
        agent: Agent,
        *,
        model: Any = None,
        limits: ModelLimits | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        self.gate = gate
        self.agent = agent
        self.model = model
        self.limits = limits if limits is not None else ModelLimits()
        self.prices = prices if prices is not None else PriceTable()

    async def run(self, goal: str, *, run_id: str | None = None) -> RunResult:
        """Start a run for `goal` and drive it."""
        run_id = await self.gate.start(goal, run_id=run_id)
        return await self._loop(run_id)

    async def resume(self, run_id: str) -> RunResult:
        """Resume a run (after an approval, or after its process died) and keep driving it."""
        outcome = await self.gate.resume(run_id)
        if outcome.status is not RunStatus.RUNNING:
            return await self._result(outcome)
        return await self._loop(run_id)

    async def _result(self, outcome: StepOutcome) -> RunResult:
        store = self.gate.store
        run = await store.run(store.get_run, outcome.run_id)
        return RunResult(run.run_id, run.status, run.result, run.reason, outcome.approval)

    async def _loop(self, run_id: str) -> RunResult:
        store = self.gate.store
        async with self.gate.lease(run_id):
            while True:
                # Store reads run in a worker too: the loop never waits on SQLite.
                run = await store.run(store.get_run, run_id)
                if run.status is not RunStatus.RUNNING:
                    return RunResult(
                        run.run_id, run.status, run.result, run.reason,
                        await store.run(store.waiting_approval, run_id),
                    )  # fmt: skip
                step_input = StepInput(
                    run_id=run_id,
                    goal=run.goal,
                    tools=self.gate.specs,
                    history=await store.run(self.gate.history, run_id),
                    model=self.model,
                    metadata=dict(run.metadata),
                    carried=(
                        await store.run(carried_context, store, run_id)
                        if getattr(self.agent, "carries_context", False)
                        else {}
                    ),
                )
                decision = await self._decide(run, step_input)
                outcome = await self.gate.step(run_id, decision)
                if outcome.status is not RunStatus.RUNNING:
                    return await self._result(outcome)

    async def _decide(self, run: RunRecord, step_input: StepInput) -> Decision:
        store = self.gate.store
        meter = await store.run(
            RunMeter, store, run.run_id, run.step_count + 1, self.limits, self.prices
        )
        try:
            meter.check_time()
            if isinstance(self.agent, MeteredAgent):
                return await self.agent.decide_metered(step_input, meter)
            return await self.agent.decide(step_input)
        except SpendingLimitReached as reached:
            await meter.reached(reached)
            return Decision.fail(reached.reason)
        except AgentrtError:
            raise
        except Exception as exc:
            reason = f"agent_error: {sanitize(str(exc) or type(exc).__name__)[:500]}"
            return Decision.fail(reason)
