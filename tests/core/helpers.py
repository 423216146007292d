"""Small real tools and policies the core tests share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from agentrt import (
    Decision,
    PolicyDecision,
    RunView,
    SideEffect,
    StepInput,
    ToolCall,
    ToolRequest,
    ToolResult,
    ToolSpec,
)
from agentrt.policy import ClassPolicy, Outcome

OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path"],
    "additionalProperties": False,
}


class RecordingTool:
    """A tool that records every call it receives and answers with a fixed content."""

    def __init__(
        self,
        name: str,
        side_effect: SideEffect,
        *,
        content: str = '{"ok":true}',
        terminal: bool = False,
        timeout: float = 5.0,
        delay: float = 0.0,
        error: Exception | None = None,
        schema: dict[str, Any] | None = None,
    ) -> None:
        self.spec = ToolSpec(
            name, f"the {name} tool", schema or OBJECT_SCHEMA, side_effect, timeout, terminal
        )
        self.calls: list[ToolCall] = []
        self.content = content
        self.delay = delay
        self.error = error

    async def call(self, call: ToolCall) -> ToolResult:
        self.calls.append(call)
        if self.delay:
            await anyio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return ToolResult(self.content, f"{self.spec.name}: ok")


def approval_policy() -> ClassPolicy:
    """Reads allowed, local mutations need approval, the rest denied."""
    return ClassPolicy(
        {
            SideEffect.READ_ONLY: Outcome.ALLOW,
            SideEffect.LOCAL_MUTATION: Outcome.REQUIRE_APPROVAL,
        }
    )


class SwitchPolicy:
    """A policy whose answer a test can change between evaluations."""

    def __init__(self, decision: PolicyDecision) -> None:
        self.decision = decision
        self.evaluations = 0

    async def evaluate(self, request: ToolRequest, run: RunView) -> PolicyDecision:
        self.evaluations += 1
        return self.decision


class ScriptAgent:
    """An agent that plays back a fixed list of decisions."""

    def __init__(self, decisions: Sequence[Decision]) -> None:
        self.decisions = list(decisions)
        self.inputs: list[StepInput] = []

    async def decide(self, step_input: StepInput) -> Decision:
        self.inputs.append(step_input)
        if not self.decisions:
            return Decision.complete("no more steps")
        return self.decisions.pop(0)
