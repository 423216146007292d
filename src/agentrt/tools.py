"""What a tool is: its spec, the call it receives and the result it returns."""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from .errors import RegistrationError, SchemaError
from .sanitize import sanitize

if TYPE_CHECKING:
    from .schema import CompiledSchema

__all__ = [
    "TOOL_NAME_PATTERN",
    "CheckedTool",
    "SideEffect",
    "StateRead",
    "Tool",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "check_tool",
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
    """One execution of a tool: the validated arguments as JSON text, and where it belongs.

    `context` is whatever the caller of `Gate.step` (or `start_and_step`, `resume`)
    handed it for this call, passed through untouched: the gate never reads it.  An
    MCP server's tool takes an `agentrt.mcp.CallContext` there (its progress, log
    lines and requests relayed to a host); other tools may ignore it.
    """

    args: str
    tool: str = ""
    run_id: str = ""
    step: int = 0
    attempt: int = 1
    metadata: Mapping[str, str] = field(default_factory=dict)
    context: object | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool's answer: `content` is one JSON value as text; `summary` is short text for traces."""

    content: str
    summary: str = ""


@dataclass(frozen=True, slots=True)
class StateRead:
    """The state a request would act on, as a tool's `fingerprint(call)` read it.

    A tool may provide `async def fingerprint(self, call: ToolCall) -> StateRead`:
    the gate then reads the state when it asks for an approval, binds its
    SHA-256 into the approval, and reads it again before the approved call runs
    (a different state: nothing runs, the run ends `stale`).  `content` is the
    state as text, or None when there is none yet (a file that does not exist);
    `tool` and `args` name the read that produced it, for the record and the
    approval's view.  Raising from `fingerprint` fails closed: nothing runs.
    """

    content: str | None
    tool: str = ""
    args: str = "{}"


@runtime_checkable
class Tool(Protocol):
    """A consumer's (or an MCP server's) tool.  Raising from `call` is a tool error."""

    @property
    def spec(self) -> ToolSpec: ...

    async def call(self, call: ToolCall) -> ToolResult: ...


@dataclass(frozen=True, slots=True)
class CheckedTool:
    """A tool `check_tool` accepted: its spec, and its input schema compiled."""

    tool: Tool
    spec: ToolSpec
    schema: CompiledSchema


def check_tool(tool: Any) -> CheckedTool:
    """Check that `tool` can be registered (a well-formed `ToolSpec`, a `call` method, an
    input schema that compiles); `RegistrationError` or `SchemaError` naming what is wrong."""
    spec = getattr(tool, "spec", None)
    if not isinstance(spec, ToolSpec):
        raise RegistrationError(f"{type(tool).__name__} has no ToolSpec `spec`")
    name = spec.name
    if not isinstance(name, str) or not TOOL_NAME_PATTERN.match(name):
        raise RegistrationError(
            f"tool name {sanitize(repr(name))} does not match ^[a-zA-Z0-9_-]{{1,64}}$"
        )
    if not isinstance(spec.description, str) or not spec.description.strip():
        raise RegistrationError(f'tool "{name}" has no description')
    if not isinstance(spec.side_effect, SideEffect):
        raise RegistrationError(f'tool "{name}" has no side-effect class')
    timeout = spec.timeout
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise RegistrationError(f'tool "{name}" needs a positive timeout in seconds')
    if not isinstance(spec.input_schema, Mapping):
        raise RegistrationError(f'tool "{name}" has no input schema object')
    if spec.input_schema.get("type") != "object":
        raise RegistrationError(f'tool "{name}": the input schema must describe an object')
    if not callable(getattr(tool, "call", None)):
        raise RegistrationError(f'tool "{name}" has no call method')
    # Here, not at the top: every module names the tool types, and most never check one
    # (the command's `runs`, a proxy before its servers start), so JSON Schema waits.
    from .schema import compile_schema

    try:
        compiled = compile_schema(spec.input_schema)
    except SchemaError as exc:
        raise SchemaError(f'tool "{name}": {exc}') from None
    return CheckedTool(tool, spec, compiled)
