"""The Driver: an agent's loop over a gate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .agent import Agent, Decision, StepInput
from .errors import AgentrtError
from .gate import Gate, StepOutcome
from .sanitize import sanitize
from .store import ApprovalRecord, RunStatus

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
    """Ask the agent, hand its decision to the gate, repeat until the run ends or waits."""

    def __init__(self, gate: Gate, agent: Agent, *, model: Any = None) -> None:
        self.gate = gate
        self.agent = agent
        self.model = model

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
                )
                try:
                    decision = await self.agent.decide(step_input)
                except AgentrtError:
                    raise
                except Exception as exc:
                    reason = f"agent_error: {sanitize(str(exc) or type(exc).__name__)[:500]}"
                    decision = Decision.fail(reason)
                outcome = await self.gate.step(run_id, decision)
                if outcome.status is not RunStatus.RUNNING:
                    return await self._result(outcome)
