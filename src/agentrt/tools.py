"""What a tool is: its spec, the call it receives and the result it returns."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, runtime_checkable

__all__ = [
    "TOOL_NAME_PATTERN",
    "SideEffect",
    "Tool",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
]

TOOL_NAME_PATTERN: Final = re.compile(r"^[a-zA-Z0-9_-]{1,64}\Z")
"""The strictest tool-name form the model providers accept (`\\Z`, not `$`, which would
also let a name end in a newline)."""


class SideEffect(enum.StrEnum):
    """What running a tool may do to the world; the operator decides, never the tool's author."""

    READ_ONLY = "read_only"
    LOCAL_MUTATION = "local_mutation"
    REMOTE_MUTATION = "remote_mutation"
    DESTRUCTIVE = "destructive"


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """Everything the runtime needs to govern a tool.

    `input_schema` is a JSON Schema for an object, as parsed JSON (use
    `agentrt.canonical.parse_json` to keep number literals).  `timeout` is in
    seconds.  A `terminal` tool's success completes the run with its result.
    """

    name: str
    description: str
    input_schema: Mapping[str, Any]
    side_effect: SideEffect
    timeout: float
    terminal: bool = False


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One execution of a tool: the validated arguments as JSON text, and where it belongs."""

    args: str
    tool: str = ""
    run_id: str = ""
    step: int = 0
    attempt: int = 1
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool's answer: `content` is one JSON value as text; `summary` is short text for traces."""

    content: str
    summary: str = ""


@runtime_checkable
class Tool(Protocol):
    """A consumer's (or an MCP server's) tool.  Raising from `call` is a tool error."""

    @property
    def spec(self) -> ToolSpec: ...

    async def call(self, call: ToolCall) -> ToolResult: ...
