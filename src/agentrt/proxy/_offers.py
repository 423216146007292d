"""A server's prompts and resources through the gate: each `prompts/get` and
`resources/read` is a read-only call of its own run, recorded and decided.

The proxy gives each server that offers prompts or resources two gate tools
the host never sees (they are not listed and `tools/call` refuses their
names): one sends `prompts/get`, one `resources/read`.  A host's request is
handed to `Calls` like a tool call, so it is recorded with its arguments
(the prompt's name and arguments, the resource's URI), passes the policy (a
`resource_rules` entry may deny or hold a URI pattern), and the step's
result records the size and SHA-256 of exactly what the host is sent.  A
result over the server's `max_result_bytes` is refused, not cut: half a
resource or half a prompt reads as a whole one.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..canonical import (
    JSONBoundaryError,
    canonical_bytes,
    canonical_json,
    parse_json,
    plain_json,
    sha256_hex,
)
from ..mcp import CallContext
from ..mcp._apps import app_content_hash
from ..mcp._errors import ServerToolError
from ..mcp._upstream import RestartFailed, Upstream
from ..policy import Outcome
from ..sanitize import sanitize
from ..tools import TOOL_NAME_PATTERN, SideEffect, ToolCall, ToolResult, ToolSpec
from ._forward import Forwarded

__all__ = ["OfferTool", "Offered", "hidden_name", "resource_outcome"]

PROMPT_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "arguments": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["name"],
    "additionalProperties": False,
}
READ_SCHEMA: Final = {
    "type": "object",
    "properties": {"uri": {"type": "string"}},
    "required": ["uri"],
    "additionalProperties": False,
}


def hidden_name(kind: str, server: str, position: int) -> str:
    """The gate's name for a server's `prompts/get` or `resources/read` (never listed)."""
    name = f"{kind}--{server}"
    return name if TOOL_NAME_PATTERN.match(name) else f"{kind}--{position}"


class OfferTool:
    """`prompts/get` or `resources/read` on one server, as a read-only gate tool."""

    def __init__(
        self,
        *,
        name: str,
        method: str,
        server: str,
        upstream: Upstream,
        timeout: float,
        max_result_bytes: int,
        forwarded: dict[str, Forwarded],
        apps: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        schema = PROMPT_SCHEMA if method == "prompts/get" else READ_SCHEMA
        self._spec = ToolSpec(
            name=name,
            description=f"{method} on server {server} (recorded by the proxy; not a tool)",
            input_schema=schema,
            side_effect=SideEffect.READ_ONLY,
            timeout=timeout,
            terminal=True,
        )
        self._method = method
        self._server = server
        self._upstream = upstream
        self._max_result_bytes = max_result_bytes
        self._forwarded = forwarded
        # MCP Apps pinned: URI → (server, content hash); a read of one is held to its pin.
        self._apps = apps if apps is not None else {}

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    async def call(self, call: ToolCall) -> ToolResult:
        where = f'server "{sanitize(self._server)}" {self._method}'
        try:
            params = parse_json(call.args)
        except JSONBoundaryError as exc:
            raise ServerToolError(f"{where}: the request is not usable JSON: {exc}") from None
        try:
            context = call.context if isinstance(call.context, CallContext) else None
            await self._upstream.ready(context)
            request = plain_json(params)
            if context is not None and context.trace:
                request["_meta"] = dict(context.trace)  # the host's trace, carried upstream
            result = await self._upstream.connection.request(
                self._method, request, timeout=self._spec.timeout, context=context
            )
        except RestartFailed as exc:
            raise ServerToolError(f"{where} was not sent: {sanitize(str(exc))}") from None
        except Exception as exc:
            raise ServerToolError(f"{where} failed: {sanitize(str(exc))}") from None
        if not isinstance(result, dict):
            raise ServerToolError(f"{where} returned a result that is not a JSON object")
        data = canonical_bytes(result)
        size = len(data)
        if size > self._max_result_bytes:
            raise ServerToolError(
                f"{where} returned {size} bytes, more than the server's max_result_bytes "
                f"({self._max_result_bytes}); nothing was forwarded"
            )
        app = self._apps.get(str(params.get("uri"))) if self._method == "resources/read" else None
        if app is not None and app[0] == self._server and app_content_hash(result) != app[1]:
            # Changed between pin and now, or between listing and read: the host renders
            # exactly what the operator pinned, or nothing.
            raise ServerToolError(
                f"{where}: the app {sanitize(str(params.get('uri')))[:200]} changed since it "
                "was pinned (its contents' SHA-256 differs); nothing was forwarded"
            )
        digest = sha256_hex(data)
        forwarded = Forwarded(plain_json(result), size, digest)
        self._forwarded[call.run_id] = forwarded
        subject = params.get("name") if self._method == "prompts/get" else params.get("uri")
        summary = f"{sanitize(self._server)} {self._method} {sanitize(str(subject))[:200]}: "
        return ToolResult(
            content=canonical_json({"bytes": size, "sha256": digest}),
            summary=summary + forwarded.summary(),
        )


@dataclass(slots=True)
class Offered:
    """What the host is offered besides tools: each prompt, resource and template as
    listed (plain JSON), with the server that offers it and its two gate tools' names."""

    prompts: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)
    resources: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    templates: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    # server → (prompts/get tool, resources/read tool)
    tools: dict[str, tuple[str, str]] = field(default_factory=dict)
    upstreams: dict[str, Upstream] = field(default_factory=dict)
    # MCP Apps pinned: each `ui://` URI → (its server, its content hash); `proxy/_apps.py`.
    apps: dict[str, tuple[str, str]] = field(default_factory=dict)

    def offers_anything(self, server: str) -> bool:
        """Whether `server` has a prompt, a resource or a template offered to the host."""
        return any(
            entry[1] == server
            for entry in [*self.prompts.values(), *self.resources, *self.templates]
        ) or any(owner == server for owner, _ in self.apps.values())

    def drop(self, server: str) -> None:
        """Offer nothing of `server` (its gate tools could not be named)."""
        self.prompts = {name: entry for name, entry in self.prompts.items() if entry[1] != server}
        self.resources = [entry for entry in self.resources if entry[1] != server]
        self.templates = [entry for entry in self.templates if entry[1] != server]
        self.upstreams.pop(server, None)
        self.apps = {uri: app for uri, app in self.apps.items() if app[0] != server}

    def server_of_uri(self, uri: str) -> str | None:
        """The server offering a resource: by its listed URI, else the one template whose
        fixed prefix it starts with, else the only server offering resources."""
        if uri in self.apps:
            return self.apps[uri][0]
        for raw, server in self.resources:
            if raw.get("uri") == uri:
                return server
        matching = {
            server
            for raw, server in self.templates
            if uri.startswith(str(raw.get("uriTemplate", "")).partition("{")[0])
        }
        if len(matching) == 1:
            return matching.pop()
        offering = {server for _, server in self.resources} | {s for _, s in self.templates}
        return offering.pop() if len(offering) == 1 else None


def resource_outcome(rules: tuple[tuple[str, Outcome], ...], uri: str) -> Outcome | None:
    """The first `resource_rules` entry whose glob matches the URI decides; None: the class."""
    for pattern, outcome in rules:
        if fnmatch.fnmatchcase(uri, pattern):
            return outcome
    return None


def uri_of(arguments: Mapping[str, Any]) -> str:
    uri = arguments.get("uri")
    return uri if isinstance(uri, str) else ""
