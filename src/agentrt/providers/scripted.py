"""`ScriptedAgent`: a deterministic agent for the demo and for tests — no model at all."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence

from ..agent import Decision, StepInput

__all__ = ["Script", "ScriptedAgent"]

Script = Sequence[Decision] | Callable[[StepInput], Decision | Awaitable[Decision]]
"""A list of decisions, or a function of what the agent sees (sync or async)."""


class ScriptedAgent:
    """Answers from a script instead of a model.

    With a list, the decision for a step is the one at the index of the number
    of observations so far, so an agent built afresh for a resumed run picks
    up where the script left off; past its end it fails the run.  With a
    function, the function decides from the `StepInput`.
    """

    def __init__(self, steps: Script, *, description: str = "a scripted agent (no model)") -> None:
        if not callable(steps):
            steps = tuple(steps)
            for index, decision in enumerate(steps):
                if not isinstance(decision, Decision):
                    raise TypeError(
                        f"script step {index} is a {type(decision).__name__}, not a Decision"
                    )
        self._steps = steps
        self.description = description

    def __repr__(self) -> str:
        return f"ScriptedAgent({self.description!r})"

    async def decide(self, step_input: StepInput) -> Decision:
        steps = self._steps
        if callable(steps):
            decision = steps(step_input)
            if inspect.isawaitable(decision):
                decision = await decision
            if not isinstance(decision, Decision):
                raise TypeError(
                    f"the script function returned a {type(decision).__name__}, not a Decision"
                )
            return decision
        index = len(step_input.history)
        if index >= len(steps):
            return Decision.fail(f"the script has no step {index + 1} (it has {len(steps)})")
        return steps[index]
