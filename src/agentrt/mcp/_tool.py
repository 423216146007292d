"""`ServerTool`: one of a server's tools as an agentrt tool, under the operator's rule."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final

import anyio

from ..canonical import JSONBoundaryError, canonical_json, parse_json
from ..sanitize import sanitize
from ..tools import ToolCall, ToolResult, ToolSpec
from ._connection_errors import NotSent, ServerErrorResponse
from ._context import CallContext
from ._errors import ServerToolError
from ._upstream import RestartFailed

if TYPE_CHECKING:
    from ..schema import CompiledSchema
    from ._upstream import Upstream

__all__ = ["ServerResult", "ServerTool", "map_result"]

TRUNCATION_MARKER: Final = "\n[truncated]"

_PLACEHOLDERS: Final = {
    "image": "[image omitted]",
    "audio": "[audio omitted]",
    "resource_link": "[resource link omitted]",
    "resource": "[embedded resource omitted]",
}
_OTHER_PLACEHOLDER: Final = "[content omitted]"

# How much of a server's error text is quoted in a tool error.
_ERROR_TEXT_CHARS: Final = 2000


@dataclass(frozen=True, slots=True)
class ServerResult(ToolResult):
    """A server's result: the bounded mapping the gate records, plus the `tools/call`
    result object exactly as parsed, for a caller that forwards it (the proxy)."""

    raw: Mapping[str, Any] = field(default_factory=dict)


class ServerTool:
    """A server's tool behind the operator's rule: hidden parameters refused, fixed ones injected.

    The gate validates the model's arguments against `spec.input_schema`, the
    restricted schema, before `call` runs; `call` then refuses a denied or
    fixed parameter that arrived anyway, injects the fixed values (outside
    the approval hash, which covers what the model sent), and sends the call
    under the rule's timeout.  A server that died is started again first
    (`Upstream.ready`); a call that never reached the server fails with a
    known outcome.  A `CallContext` on the `ToolCall` (handed to `Gate.step`)
    is told the run id, then carries the server's progress, log lines and
    requests during the call back to its caller.
    """

    def __init__(
        self,
        *,
        spec: ToolSpec,
        server: str,
        tool: str,
        upstream: Upstream,
        deny: Sequence[str],
        fixed: Mapping[str, Any],
        max_content_bytes: int,
        title: str | None = None,
        output_schema: Mapping[str, Any] | None = None,
    ) -> None:
        self._spec = spec
        self._server = server
        self._tool = tool
        self._upstream = upstream
        self._deny = tuple(deny)
        self._fixed = dict(fixed)
        self._max_content_bytes = max_content_bytes
        self.title = title
        """The server's `title` for the tool, as listed (None when it gave none)."""
        self.output_schema = output_schema
        """The server's `outputSchema` for the tool, as listed (None when it gave none)."""
        self.ui: dict[str, Any] | None = None
        """The tool's MCP Apps `_meta` entries as listed, once its app passed its pin at load
        (`_apps.py`); None when it has none (or it was not pinned)."""
        # The compiled `outputSchema` (or why it does not compile), built at the first result.
        self._output_check: list[CompiledSchema | str] = []

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    @property
    def upstream(self) -> Upstream:
        """The server's shared session (restarted when it died), for a caller that sends the
        server other requests (the proxy's prompts and resources)."""
        return self._upstream

    @property
    def server_tool_name(self) -> str:
        """The tool's name on its server (the spec carries the final, prefixed name)."""
        return self._tool

    async def call(self, call: ToolCall) -> ToolResult:
        context = call.context if isinstance(call.context, CallContext) else None
        if context is not None and context.on_run is not None:
            context.on_run(call.run_id)
        where = f'server "{sanitize(self._server)}" tool "{sanitize(self._tool)}"'
        try:
            arguments = parse_json(call.args)
        except JSONBoundaryError as exc:
            raise ServerToolError(
                f"{where}: the arguments are not usable JSON: {sanitize(str(exc))}"
            ) from None
        if not isinstance(arguments, dict):
            raise ServerToolError(f"{where}: the arguments must be a JSON object")
        for name in self._deny:
            if name in arguments:
                raise ServerToolError(
                    f'{where}: the parameter "{sanitize(name)}" is denied by the operator\'s rule'
                )
        for name in self._fixed:
            if name in arguments:
                raise ServerToolError(
                    f'{where}: the parameter "{sanitize(name)}" is fixed by the operator\'s rule '
                    "and may not be sent"
                )
        if self._fixed:
            arguments.update(self._fixed)
            arguments_text = canonical_json(arguments)
        else:
            # Without injection the server receives exactly the bytes the model sent.
            arguments_text = call.args
        timeout = self._spec.timeout
        started = anyio.current_time()
        try:
            # The connection bounds the call too; this guard holds even if it did not.
            # (What `anyio.fail_after` does, without its two generator layers.)
            guard = anyio.CancelScope(deadline=started + timeout)
            with guard:
                await self._upstream.ready(context)
                refusal = self._upstream.refusal(self._tool)
                if refusal:
                    raise ServerToolError(
                        f"{where} was not called: since {self._upstream.refused_since}, "
                        f"{sanitize(refusal)}. Nothing ran."
                    )
                remaining = max(timeout - (anyio.current_time() - started), 0.001)
                # The arguments were parsed above and are an object (or canonical_json of one).
                retried: list[str] = []
                result = await self._upstream.connection.call_tool_checked(
                    self._tool, arguments_text, timeout=remaining, context=context,
                    on_retry=retried.append,
                )  # fmt: skip
            if guard.cancelled_caught and anyio.current_time() >= guard.deadline:
                raise TimeoutError
        except (RestartFailed, NotSent) as exc:
            raise ServerToolError(
                f"{where} was not sent: {sanitize(str(exc))}. Nothing ran."
            ) from None
        except TimeoutError:
            raise ServerToolError(
                f"{where} did not answer within {timeout:g}s", outcome_known=False
            ) from None
        except ServerToolError:
            raise
        except ServerErrorResponse as exc:
            # The server answered, with an error: the outcome is known.
            raise ServerToolError(f"{where} failed: {sanitize(str(exc))}") from None
        except Exception as exc:
            raise ServerToolError(
                f"{where} failed: {sanitize(str(exc))}", outcome_known=False
            ) from None
        mapped = map_result(self._server, self._tool, result, self._max_content_bytes)
        if retried:
            # The record says the call was sent twice, and why the first was not run.
            mapped = replace(mapped, summary=f"{mapped.summary}; {retried[0]}")
        broken = self._output_refusal(result)
        if broken is not None:
            return withheld_result(self._server, self._tool, broken)
        return mapped

    def _output_refusal(self, result: Mapping[str, Any]) -> str | None:
        """Why a successful result breaks the tool's own `outputSchema` (None when it
        keeps it, or the tool has none).  The spec says a server MUST conform to it."""
        if self.output_schema is None:
            return None
        if "structuredContent" not in result or result["structuredContent"] is None:
            return "it has an outputSchema but returned no structured content"
        compiled = self._output_compiled()
        if isinstance(compiled, str):
            return compiled
        try:
            structured = json.loads(canonical_json(result["structuredContent"]))
        except (JSONBoundaryError, ValueError, TypeError) as exc:
            return f"its structured content cannot be checked: {sanitize(str(exc))}"
        error = compiled.first_error(structured)
        if error is None:
            return None
        return (
            "it returned structured content that does not match its outputSchema: "
            f"{error[:_ERROR_TEXT_CHARS]}"
        )

    def _output_compiled(self) -> CompiledSchema | str:
        """The tool's `outputSchema`, compiled once, at its first result (loading a server's
        tools needs no validator), with the input schemas' compiler: self-contained, no
        retrieval, patterns under the same time budget.  A schema that does not compile
        is the reason every result of the tool is withheld."""
        if not self._output_check:
            from ..errors import SchemaError
            from ..schema import compile_schema

            assert self.output_schema is not None
            try:
                schema = json.loads(canonical_json(self.output_schema))
                self._output_check.append(compile_schema(schema))
            except (SchemaError, JSONBoundaryError, ValueError, TypeError) as exc:
                self._output_check.append(
                    f"its outputSchema cannot be checked: {sanitize(str(exc))}"
                )
        return self._output_check[0]


def withheld_result(server: str, tool: str, refusal: str) -> ToolResult:
    """A result refused after the tool ran: recorded as executed, and the model told that
    the tool ran and why its result was withheld, so it has no reason to run it again."""
    label = f"{sanitize(server)}/{sanitize(tool)}"
    text = (
        f"RESULT_WITHHELD: the tool {label} ran and its server reported it done, but its "
        f"result was withheld because {refusal}. Do not call it again to repeat the action."
    )
    return ToolResult(content=canonical_json(text), summary=f"{label}: result withheld")


def map_result(server: str, tool: str, result: Any, max_content_bytes: int) -> ToolResult:
    """Map a `tools/call` result object (parsed from the raw bytes) to a `ToolResult`.

    Structured content that fits the cap is kept as canonical JSON (literals
    as sent); otherwise the text blocks, joined with newlines, become one
    JSON string capped at `max_content_bytes` encoded bytes.  `isError` and
    an input-required result raise `ServerToolError` naming the server.
    """
    where = f'server "{sanitize(server)}" tool "{sanitize(tool)}"'
    label = f"{sanitize(server)}/{sanitize(tool)}"
    if not isinstance(result, dict):
        raise ServerToolError(f"{where} returned a result that is not a JSON object")
    if result.get("resultType") == "input_required":
        raise ServerToolError(
            f"{where} asked for more input, which was refused or never given; "
            "the call did not complete"
        )
    blocks = result.get("content")
    text = _join_blocks(blocks if isinstance(blocks, list) else [])
    if result.get("isError") is True:
        quoted = text if len(text) <= _ERROR_TEXT_CHARS else text[:_ERROR_TEXT_CHARS] + "…"
        raise ServerToolError(f"{where} reported an error: {sanitize(quoted)}")
    dropped = ""
    if "structuredContent" in result and result["structuredContent"] is not None:
        structured = canonical_json(result["structuredContent"])
        structured_bytes = len(structured.encode("utf-8"))
        if structured_bytes <= max_content_bytes:
            return ServerResult(
                content=structured, summary=f"{label}: {structured_bytes} bytes", raw=result
            )
        # Cutting structured content would turn an object into a string; drop it instead.
        dropped = f", structured content of {structured_bytes} bytes dropped for the text"
    content, truncated = cap_text(text, max_content_bytes)
    size = len(content.encode("utf-8"))
    summary = f"{label}: {size} bytes{', truncated' if truncated else ''}{dropped}"
    return ServerResult(content=content, summary=summary, raw=result)


def _join_blocks(blocks: list[Any]) -> str:
    parts: list[str] = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        else:
            parts.append(
                _PLACEHOLDERS.get(kind, _OTHER_PLACEHOLDER)
                if isinstance(kind, str)
                else _OTHER_PLACEHOLDER
            )
    return "\n".join(parts)


def cap_text(text: str, max_bytes: int) -> tuple[str, bool]:
    """Encode `text` as a JSON string of at most `max_bytes` UTF-8 bytes.

    Over the cap, the text is cut on a code point boundary and ends in
    `"\\n[truncated]"`; escaping and the marker count inside the cap.
    """
    encoded = canonical_json(text)
    if len(encoded.encode("utf-8")) <= max_bytes:
        return encoded, False
    marker_bytes = len(canonical_json(TRUNCATION_MARKER).encode("utf-8")) - 2
    budget = max_bytes - 2 - marker_bytes  # the two quotes and the marker
    used = 0
    cut = 0
    for char in text:
        # Each code point's escaped form is independent of its neighbours.
        size = len(canonical_json(char).encode("utf-8")) - 2
        if used + size > budget:
            break
        used += size
        cut += 1
    return canonical_json(text[:cut] + TRUNCATION_MARKER), True
