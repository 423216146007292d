"""Reading the state a call acts on, through a rule's precondition: the read goes
through the proxy's policy like any call, under the read tool's own timeout, and a
failure fails closed (the gate offers no approval, runs nothing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import anyio

from ..canonical import canonical_json, parse_json
from ..mcp._errors import ServerToolError
from ..mcp._tool import ServerResult, ServerTool
from ..policy import Outcome, Policy, RunView, ToolRequest
from ..sanitize import sanitize
from ..tools import CheckedTool, StateRead, Tool, ToolCall, ToolResult, ToolSpec, check_tool
from ._calls import WatchedTool
from ._precondition_rule import Precondition, PreconditionError
from .config import ConfigError, UpstreamConfig

__all__ = ["StatefulTool", "precondition_reader"]

_POLICY_MARGIN: Final = 5.0


class StatefulTool(WatchedTool):
    """A watched tool whose rule has a precondition: it can read the state a call acts on.

    `policy` is set once the proxy's policy exists; until then every read fails closed.
    """

    def __init__(
        self,
        inner: Tool,
        precondition: Precondition,
        reader: Tool,
        *,
        reconcile: bool = False,
        **watched: Any,
    ) -> None:
        super().__init__(inner, **watched)
        self.precondition = precondition
        self.reconcile = reconcile
        self._reader: CheckedTool = check_tool(reader)
        self.policy: Policy | None = None

    @property
    def fingerprint_timeout(self) -> float:
        """The gate's backstop: the read's own timeout bounds it (and its error names the
        read tool), not the possibly shorter write's; the margin covers asking the policy."""
        return self._reader.spec.timeout + _POLICY_MARGIN

    def reconciled(self, call: ToolCall, current: StateRead, approved: str | None) -> bool:
        """Whether `current` already is what `call` would make it, its earlier approved
        attempt having taken effect (only under a rule with `"reconcile": true`)."""
        if not self.reconcile or current.content is None:
            return False
        # Here, not at the top: a proxy that serves no inbox never imports it otherwise.
        from ..inbox.review import intended_content

        intended = intended_content(parse_json(call.args), approved)
        return intended is not None and intended == current.content

    @property
    def reader_spec(self) -> ToolSpec:
        return self._reader.spec

    async def fingerprint(self, call: ToolCall) -> StateRead:
        spec = self._reader.spec
        name = spec.name
        arguments = self.precondition.read_arguments(parse_json(call.args))
        args = canonical_json(arguments)
        problem = self._reader.schema.first_error(parse_json(args))
        if problem is not None:
            raise PreconditionError(f"the precondition {name}'s arguments do not fit it: {problem}")
        if self.policy is None:
            raise PreconditionError(f"the precondition {name} has no policy to decide it yet")
        request = ToolRequest(spec, args, parse_json(args), call.run_id, call.step)
        decided = await self.policy.evaluate(
            request, RunView(call.run_id, "precondition", 0, 0, {})
        )
        if decided.outcome is not Outcome.ALLOW:
            raise PreconditionError(
                f"the policy does not allow the precondition {name} "
                f"({decided.outcome}: {sanitize(decided.reason)})"
            )
        read = ToolCall(args=args, tool=name, run_id=call.run_id, step=call.step)
        try:
            with anyio.fail_after(spec.timeout):
                result = await self._reader.tool.call(read)
        except TimeoutError:
            raise PreconditionError(
                f"the precondition {name} did not answer within {spec.timeout:g}s"
            ) from None
        except ServerToolError as exc:
            absent_when = self.precondition.absent_when
            if absent_when is not None and absent_when in str(exc):
                return StateRead(None, name, args)
            raise PreconditionError(f"the precondition {name} failed: {exc}") from None
        return StateRead(_state_text(result), name, args)


def _state_text(result: ToolResult) -> str:
    """The state as the server sent it: its text blocks whole (not the recorded result,
    which is bounded), else the recorded content."""
    if isinstance(result, ServerResult):
        blocks = result.raw.get("content")
        if isinstance(blocks, list):
            texts = [
                block["text"]
                for block in blocks
                if isinstance(block, dict) and isinstance(block.get("text"), str)
            ]
            if texts:
                return "\n".join(texts)
    return result.content


def precondition_reader(
    tools: Sequence[tuple[Tool, UpstreamConfig]],
    upstream: UpstreamConfig,
    precondition: Precondition,
) -> Tool:
    """The loaded tool of `upstream` a precondition reads with; `ConfigError` if the server
    did not offer it (the rules name it, but a rule does not make a tool exist)."""
    for tool, owner in tools:
        if (
            owner is upstream
            and isinstance(tool, ServerTool)
            and tool.server_tool_name == precondition.tool
        ):
            return tool
    raise ConfigError(
        f'server "{sanitize(upstream.server.name)}" has no loaded tool '
        f'"{sanitize(precondition.tool)}" for a precondition to read with'
    )
