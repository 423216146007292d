"""The agent seam: what the Driver asks an agent, and what an agent may answer."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .tools import ToolSpec

__all__ = ["Agent", "Decision", "DecisionKind", "Observation", "StepInput"]


class DecisionKind(enum.StrEnum):
    TOOL_CALL = "tool_call"
    COMPLETE = "complete"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Decision:
    """What an agent decided: call a tool with raw JSON `args`, complete with a result, or fail."""

    kind: DecisionKind
    tool: str = ""
    args: str = ""
    result: str = ""
    reason: str = ""

    @classmethod
    def tool_call(cls, tool: str, args: str) -> Decision:
        return cls(DecisionKind.TOOL_CALL, tool=tool, args=args)

    @classmethod
    def complete(cls, result: str) -> Decision:
        return cls(DecisionKind.COMPLETE, result=result)

    @classmethod
    def fail(cls, reason: str) -> Decision:
        return cls(DecisionKind.FAIL, reason=reason)


@dataclass(frozen=True, slots=True)
class Observation:
    """What the agent is told about one step: `kind` is `result`, `tool_error`,
    `invalid`, `denied` or `interrupted`; `content` is JSON text or prose."""

    step: int
    tool: str
    args: str
    kind: str
    content: str


@dataclass(frozen=True, slots=True)
class StepInput:
    """Everything an agent sees before deciding its next step."""

    run_id: str
    goal: str
    tools: Sequence[ToolSpec]
    history: Sequence[Observation]
    model: Any = None
    metadata: dict[str, str] = field(default_factory=dict)
    carried: dict[int, str] = field(default_factory=dict)
    """What a model adapter kept of the answer that decided each earlier step (by step; JSON
    text it wrote), for an agent whose `carries_context` is true: e.g. Anthropic's thinking
    blocks, which must go back with the tool call they led to."""


@runtime_checkable
class Agent(Protocol):
    """Decides the next step; the model lives behind this seam."""

    async def decide(self, step_input: StepInput) -> Decision: ...
