"""The MCP server the host talks to: the loaded tools, `gate_status`, and the lifecycle.

Each `tools/call` is handed to `Calls` in a task the proxy owns, not the
host's request: a host that cancels a call stops waiting for it, but the
upstream call finishes and is recorded, and an identical call then gets it
as `DUPLICATE`.  On stdin close, SIGINT or SIGTERM the proxy takes no more
calls, lets the ones in flight finish, be recorded and be answered, closes
its upstream servers and exits 0.  Once stdin has ended, a signal (the
official TypeScript client sends SIGTERM two seconds later) changes
nothing; a second signal says the host is about to kill the proxy, which
then kills its upstream servers at once, so each call in flight is recorded
as its server's crash would be, and answered (decision 0024).  The signals
stay caught until the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import getpass
import os
import signal
import socket
import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import IO, Any, Final, NoReturn, TypeVar

import anyio
import anyio.to_thread
import mcp_types as types
from anyio.abc import TaskGroup
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server as LowLevelServer
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from ..canonical import canonical_json, plain_json
from ..errors import AgentrtError, RunNotFound, StoreError
from ..gate import Gate, Limits
from ..mcp import Connection, Report, load, read_manifest
from ..mcp._connection import UPSTREAM_ASK, UPSTREAM_LOG
from ..mcp._offers import Offers, load_offers
from ..mcp._tool import UPSTREAM_PROGRESS, ServerTool
from ..policy import Outcome
from ..sanitize import sanitize
from ..store import ApprovalStatus, Store, open_store
from ..telemetry import TraceExporter, settings_from, start_exporter
from ..tools import SideEffect, Tool
from ._answers import Answer, bounded
from ._calls import CALL_RUN, Calls, WatchedTool, new_owner, proxy_policy
from ._client_requests import asker_for
from ._forward import Forwarded
from ._http import is_loopback, listen, serve_http, split_http
from ._index import CallIndex, CallRow, Settled
from ._input_required import HostCall, Question, Suspended
from ._offers import Offered, OfferTool, hidden_name
from ._stdio import StdioWire, stdio_wire
from .config import (
    DEFAULT_SERVER_TIMEOUT,
    ConfigError,
    ProxyConfig,
    UpstreamConfig,
    load_config,
)

__all__ = ["STATUS_TOOL", "serve", "serve_config"]

STATUS_TOOL: Final = "gate_status"
_STATUS_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "approval_id": {
            "type": "string",
            "description": "The approval id a PENDING_APPROVAL answer named (optional).",
        }
    },
    "additionalProperties": False,
}
_STATUS_DESCRIPTION: Final = (
    "Say which of this session's requests wait for a person's approval, or, given an "
    "approval_id, what became of that request. It only reads; it never runs, approves or "
    "changes anything."
)

Scope = Callable[[], Awaitable[None]]
# What one round of a host's call ends in: the gate's answer, or a server's question.
_Round = Answer | Question
_T = TypeVar("_T")

_LOG_LEVELS: Final = (
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
)


@dataclass
class _InFlight:
    """Calls the proxy is still working on, so shutdown can wait for them."""

    count: int = 0
    idle: anyio.Event = field(default_factory=anyio.Event)

    def enter(self) -> None:
        self.count += 1

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0:
            self.idle.set()

    async def wait(self) -> None:
        while self.count:
            self.idle = anyio.Event()
            await self.idle.wait()


def _log(stream: IO[str], line: str) -> None:
    stream.write(line + "\n")
    stream.flush()


Loaded = tuple[Tool, UpstreamConfig]


async def _load_upstreams(
    config: ProxyConfig,
    log: IO[str],
    servers_of: dict[str, str] | None = None,
    offered: Offered | None = None,
) -> tuple[list[Loaded], list[Connection]]:
    """Load every upstream; one that fails is reported and left out, the others serve.

    `servers_of`, when given, is filled with each served tool's server name;
    `offered` with the prompts, resources and templates that passed their pins."""
    tools: list[Loaded] = []
    connections: list[Connection] = []
    taken: dict[str, str] = {STATUS_TOOL: "the proxy itself"}
    outcomes: list[tuple[list[Tool], Report] | Exception | None] = [None] * len(config.servers)
    for upstream in config.servers:
        if upstream.server.command is not None and upstream.server.sandbox is None:
            _log(
                log,
                f"agentrt proxy: warning: server {sanitize(upstream.server.name)} has no "
                "sandbox, so it runs with every file and network this user can reach",
            )

    offer_results: list[Offers | None] = [None] * len(config.servers)

    async def load_one(position: int, upstream: UpstreamConfig) -> None:
        try:
            manifest = read_manifest(upstream.manifest_path)
            outcome = await load(upstream.server, manifest, upstream.rules)
            outcomes[position] = outcome
        except (AgentrtError, OSError, ValueError) as exc:
            outcomes[position] = exc
            return
        loaded, report = outcome
        server_tools = [tool for tool in loaded if isinstance(tool, ServerTool)]
        if offered is None or report.connection is None or not server_tools:
            return
        offer_results[position] = await load_offers(
            report.connection,
            manifest,
            prompts=upstream.prompts,
            timeout=upstream.server.connect_timeout,
        )
        offered.upstreams[upstream.server.name] = server_tools[0].upstream

    # Together, so the host waits for the slowest server, not for the sum of them.
    async with anyio.create_task_group() as group:
        for position, upstream in enumerate(config.servers):
            group.start_soon(load_one, position, upstream)
    # In the configuration's order, so a name two servers offer goes to the first listed.
    offer_lines: list[list[str]] = []
    for upstream, offers in zip(config.servers, offer_results, strict=True):
        if offered is None or offers is None:
            offer_lines.append([])
        else:
            offer_lines.append(_take_offers(offered, upstream.server.name, offers))
    for position, (upstream, outcome) in enumerate(zip(config.servers, outcomes, strict=True)):
        name = sanitize(upstream.server.name)
        if not isinstance(outcome, tuple):
            _log(log, f"agentrt proxy: server {name} did not load: {sanitize(str(outcome))}")
            continue
        loaded, report = outcome
        if report.connection is not None:
            connections.append(report.connection)
        for line in str(report).splitlines() + offer_lines[position]:
            _log(log, f"agentrt proxy: {line}")
        for tool in loaded:
            holder = taken.get(tool.spec.name)
            if holder is not None:
                # A second tool of one name would shadow the first; neither is guessed at.
                _log(
                    log,
                    f"agentrt proxy: server {name}: refused {tool.spec.name}: the name is "
                    f"already taken by {sanitize(holder)}; give it a rename rule",
                )
                continue
            taken[tool.spec.name] = f'server "{upstream.server.name}"'
            if servers_of is not None:
                servers_of[tool.spec.name] = upstream.server.name
            tools.append((tool, upstream))
    return tools, connections


class Proxy:
    """The proxy's state for one process: store, index, gate and the host-facing server."""

    def __init__(
        self,
        config: ProxyConfig,
        store: Store,
        tools: list[Loaded],
        log: IO[str],
        offered: Offered | None = None,
    ) -> None:
        self.config = config
        self.offered = offered if offered is not None else Offered()
        # Each served tool's server, for the operator's client_requests rule of its call.
        self.server_of: dict[str, UpstreamConfig] = {tool.spec.name: up for tool, up in tools}
        # How long a suspended call waits for a stateless host's answer: the call's timeout.
        self.timeouts = {tool.spec.name: tool.spec.timeout for tool, _ in tools}
        # The request states issued to stateless hosts, each naming a suspended call.
        self.suspended = Suspended()
        # Each loaded server's session, for the requests that are not calls (logging/setLevel).
        self.upstreams = {
            up.server.name: tool.upstream for tool, up in tools if isinstance(tool, ServerTool)
        }
        # Hosts subscribed to each resource URI (notifications/resources/updated): by the
        # host's MCP session id over HTTP (one stdio host), its latest session object.
        self.subscribers: dict[str, dict[str, Any]] = {}
        self.store = store
        self.log = log
        owner = new_owner()
        self.index = CallIndex(store, config.session, owner, config.lease_ttl)
        cut_off: set[tuple[str, int]] = set()
        sent: set[str] = set()
        forwarded: dict[str, Forwarded] = {}
        repeat_windows: dict[str, float] = {}
        # The server's own `title` and `outputSchema`, listed for results forwarded as sent.
        self.listed: dict[str, tuple[str | None, dict[str, Any] | None]] = {}
        watched: list[Tool] = []
        for tool, upstream in tools:
            name = tool.spec.name
            as_sent = upstream.results == "as_sent"
            on_server = tool.server_tool_name if isinstance(tool, ServerTool) else name
            extra = upstream.tool_rules.get(on_server)
            if extra is not None and extra.repeat_window is not None:
                repeat_windows[name] = extra.repeat_window
            if isinstance(tool, ServerTool):
                schema = plain_json(tool.output_schema) if as_sent and tool.output_schema else None
                self.listed[name] = (tool.title, schema)
            watched.append(
                WatchedTool(
                    tool,
                    cut_off,
                    sent,
                    forwarded=forwarded if as_sent else None,
                    max_result_bytes=upstream.max_result_bytes if as_sent else None,
                )
            )
        # prompts/get and resources/read of each server that offers them: read-only gate tools
        # the host never sees, so each one is recorded and decided like a call.
        self.hidden: set[str] = set()
        resource_rules: dict[str, tuple[tuple[str, Outcome], ...]] = {}
        taken = {tool.spec.name for tool in watched}
        for position, upstream in enumerate(config.servers):
            name = upstream.server.name
            offering = self.offered.upstreams.get(name)
            if offering is None or not self.offered.offers_anything(name):
                continue
            get_name = hidden_name("prompt", name, position)
            read_name = hidden_name("resource", name, position)
            if get_name in taken or read_name in taken:
                _log(log, f"agentrt proxy: server {sanitize(name)}: its prompts and resources "
                     "are not offered: a tool already has the proxy's name for them")  # fmt: skip
                self.offered.drop(name)
                continue
            self.offered.tools[name] = (get_name, read_name)
            for tool_name, method in ((get_name, "prompts/get"), (read_name, "resources/read")):
                watched.append(
                    OfferTool(
                        name=tool_name,
                        method=method,
                        server=name,
                        upstream=offering,
                        timeout=upstream.server.default_timeout or DEFAULT_SERVER_TIMEOUT,
                        max_result_bytes=upstream.max_result_bytes,
                        forwarded=forwarded,
                    )
                )
                self.hidden.add(tool_name)
            resource_rules[read_name] = upstream.resource_rules
            offering.connection.on_notification = self._upstream_notified
        # Conditions, each rule's `outcome` and `fixed` values, and the policy's identity.
        self.policy = proxy_policy(config, store)
        self.policy.resource_rules = resource_rules
        self.gate = Gate(
            store,
            watched,
            policy=self.policy,
            limits=Limits(approval_ttl=config.approval_ttl, grant_ttl=config.grant_ttl),
            owner=owner,
            lease_ttl=config.lease_ttl,
        )
        self.calls = Calls(
            gate=self.gate,
            index=self.index,
            policy=self.policy,
            cut_off=cut_off,
            sent=sent,
            session=config.session,
            database=str(config.database),
            hold=config.hold,
            repeat_window=config.repeat_window,
            max_pending=config.max_pending,
            log=log,
            repeat_windows=repeat_windows,
            forwarded=forwarded,
        )
        self.in_flight = _InFlight()
        self.work: TaskGroup | None = None
        self._call_tasks: set[asyncio.Task[None]] = set()
        # The level a host set with logging/setLevel; None forwards no server logging.
        self.log_level: str | None = None

    # -- the host-facing server ----------------------------------------------

    def server(self) -> LowLevelServer[Any]:
        with warnings.catch_warnings():
            # Logging is deprecated in the 2026-07-28 revision; 2025 hosts still set a level.
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            return self._server()

    def _server(self) -> LowLevelServer[Any]:
        return LowLevelServer(
            "agentrt-proxy",
            version="0.1.0",
            instructions=(
                "Tools here pass through a gate: some calls wait for a person's approval. "
                "Read each answer's first word; follow what it says."
            ),
            on_list_tools=self._list_tools,
            # A raw input-required result: the SDK's typed requests would drop what the
            # server sent (an elicitation's legacy enumNames).
            on_call_tool=self._call_tool,  # type: ignore[arg-type]
            # Hosts ask for these whatever the capabilities say; with nothing pinned, "none".
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_resource_templates,
            on_read_resource=self._read_resource,
            on_subscribe_resource=self._subscribe,
            on_unsubscribe_resource=self._unsubscribe,
            on_list_prompts=self._list_prompts,
            on_get_prompt=self._get_prompt,
            on_completion=self._complete,
            on_set_logging_level=self._set_logging_level,
        )

    async def _set_logging_level(
        self, ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        # One level for the process: the servers' logging is forwarded from then on.
        self.log_level = str(params.level)
        for upstream in self.upstreams.values():
            capabilities = upstream.connection.capabilities
            if isinstance(capabilities, dict) and "logging" in capabilities:
                # Each server then filters at the source too; one that refuses changes nothing.
                with contextlib.suppress(Exception):
                    await upstream.connection.request(
                        "logging/setLevel", {"level": self.log_level}, timeout=5.0
                    )
        return types.EmptyResult()

    # -- prompts, resources, completion ----------------------------------------

    async def _list_prompts(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        return types.ListPromptsResult(
            prompts=[types.Prompt.model_validate(raw) for raw, _ in self.offered.prompts.values()]
        )

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(
            resources=[types.Resource.model_validate(raw) for raw, _ in self.offered.resources]
        )

    async def _list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate.model_validate(raw) for raw, _ in self.offered.templates
            ]
        )

    async def _get_prompt(
        self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        entry = self.offered.prompts.get(params.name)
        if entry is None:
            raise MCPError(-32602, f"there is no prompt {bounded(params.name, 80)}")
        arguments: dict[str, Any] = {"name": params.name}
        if params.arguments is not None:
            arguments["arguments"] = dict(params.arguments)
        answer = await self._gated(ctx, self.offered.tools[entry[1]][0], arguments, params.meta)
        return types.GetPromptResult.model_validate(_offer_result(answer))

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        server = self.offered.server_of_uri(uri)
        if server is None or server not in self.offered.tools:
            raise MCPError(-32002, f"there is no resource {bounded(uri, 200)}")
        answer = await self._gated(ctx, self.offered.tools[server][1], {"uri": uri}, params.meta)
        return types.ReadResourceResult.model_validate(_offer_result(answer))

    async def _subscribe(
        self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        uri = str(params.uri)
        # Subscribed first: a server may send the first update before it answers.
        subscribed = self.subscribers.setdefault(uri, {})
        key = _host_key(ctx)
        subscribed[key] = ctx.session
        try:
            await self._forward_subscription("resources/subscribe", uri)
        except MCPError:
            subscribed.pop(key, None)
            raise
        return types.EmptyResult()

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        uri = str(params.uri)
        self.subscribers.get(uri, {}).pop(_host_key(ctx), None)
        if not self.subscribers.get(uri):
            self.subscribers.pop(uri, None)
            await self._forward_subscription("resources/unsubscribe", uri)
        return types.EmptyResult()

    async def _forward_subscription(self, method: str, uri: str) -> None:
        server = self.offered.server_of_uri(uri)
        upstream = self.offered.upstreams.get(server) if server is not None else None
        if upstream is None:
            raise MCPError(-32002, f"there is no resource {bounded(uri, 200)}")
        try:
            await upstream.ready()
            await upstream.connection.request(method, {"uri": uri}, timeout=10.0)
        except Exception as exc:
            raise MCPError(-32603, f"{method} failed: {bounded(str(exc), 300)}") from None

    async def _upstream_notified(self, method: str, params: dict[str, Any]) -> None:
        """A server's notification other than progress and logging: a resource update goes
        to the host sessions subscribed to it; the rest is dropped."""
        uri = params.get("uri")
        if method != "notifications/resources/updated" or not isinstance(uri, str):
            return
        for key, session in list(self.subscribers.get(uri, {}).items()):
            try:
                await session.send_resource_updated(uri)
            except Exception:
                self.subscribers.get(uri, {}).pop(key, None)  # that host went away

    async def _complete(
        self, ctx: ServerRequestContext[Any], params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        ref = params.ref
        if isinstance(ref, types.PromptReference):
            entry = self.offered.prompts.get(ref.name)
            server = entry[1] if entry is not None else None
        else:
            server = self.offered.server_of_uri(ref.uri)
        upstream = self.offered.upstreams.get(server) if server is not None else None
        capabilities = upstream.connection.capabilities if upstream is not None else None
        if (
            upstream is None
            or not isinstance(capabilities, dict)
            or "completions" not in (capabilities)
        ):
            return types.CompleteResult(completion=types.Completion(values=[]))
        request = params.model_dump(by_alias=True, mode="json", exclude_none=True)
        try:
            await upstream.ready()
            result = await upstream.connection.request("completion/complete", request, timeout=10.0)
            return types.CompleteResult.model_validate(plain_json(result))
        except Exception as exc:
            raise MCPError(-32603, f"completion failed: {bounded(str(exc), 300)}") from None

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        # The hints a host sees are the operator's classification, never the server's claims.
        tools = [
            types.Tool(
                name=spec.name,
                title=self.listed.get(spec.name, (None, None))[0],
                description=spec.description,
                input_schema=plain_json(spec.input_schema),
                output_schema=self.listed.get(spec.name, (None, None))[1],
                annotations=types.ToolAnnotations(
                    read_only_hint=spec.side_effect is SideEffect.READ_ONLY,
                    destructive_hint=spec.side_effect is SideEffect.DESTRUCTIVE,
                ),
            )
            for spec in self.calls.specs
            if spec.name not in self.hidden
        ]
        tools.append(
            types.Tool(
                name=STATUS_TOOL,
                description=_STATUS_DESCRIPTION,
                input_schema=dict(_STATUS_SCHEMA),
                annotations=types.ToolAnnotations(read_only_hint=True),
            )
        )
        return types.ListToolsResult(tools=tools)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | dict[str, Any]:
        raw = ctx.params or {}
        call: HostCall | None = None
        outcome: _Round
        if raw.get("requestState") is not None or raw.get("inputResponses") is not None:
            # A retry answering a server's question resumes the call its state names; it
            # never starts one.
            resumed = self._resume(params.name, params.arguments, raw)
            if isinstance(resumed, HostCall):
                call, resumed.ctx = resumed, ctx
            else:
                outcome = resumed
        elif params.name == STATUS_TOOL:
            outcome = await self.status(params.arguments)
        elif params.name in self.hidden:
            # The proxy's own names for prompts/get and resources/read are not tools.
            outcome = Answer.invalid(params.name, "there is no tool with this name")
        else:
            started = self._start(ctx, params.name, params.arguments, params.meta)
            if isinstance(started, HostCall):
                call = started
            else:
                outcome = started
        if call is not None:
            outcome = await self._attended(call, call.next_round)
            if isinstance(outcome, Question):
                return self._input_required(call, outcome)
        assert isinstance(outcome, Answer)
        return self._tool_result(params.name, outcome)

    def _resume(self, tool: str, arguments: dict[str, Any] | None, raw: Any) -> HostCall | Answer:
        """The suspended call a retry's state names, its answer delivered; else the refusal."""
        state = raw.get("requestState")
        if state is None:
            return Answer("inputResponses without the requestState they answer resume "
                          "nothing; nothing was run.", True)  # fmt: skip
        resumed = self.suspended.resume(state, tool, arguments, raw.get("inputResponses"))
        if isinstance(resumed, str):
            return Answer(resumed, True)
        return resumed

    def _input_required(self, call: HostCall, question: Question) -> dict[str, Any]:
        """The host's call answered with the server's question and the state of its retry."""
        state = self.suspended.issue(
            call, question, self.timeouts.get(call.tool, DEFAULT_SERVER_TIMEOUT)
        )
        return {
            "resultType": "input_required",
            "inputRequests": {question.key: question.wire()},
            "requestState": state,
        }

    def _tool_result(self, name: str, answer: Answer) -> types.CallToolResult:
        result = (
            types.CallToolResult.model_validate(answer.result_object)
            if answer.result_object is not None
            else types.CallToolResult(
                content=[types.TextContent(type="text", text=answer.text)],
                is_error=answer.is_error,
            )
        )
        if self.listed.get(name, (None, None))[1] is not None and result.structured_content is None:
            # Both official clients refuse a success without the structured content an
            # outputSchema promises; the gate's own prose (PENDING_APPROVAL, …) has none.
            result.is_error = True
        return result

    async def _gated(
        self,
        ctx: ServerRequestContext[Any],
        tool: str,
        arguments: dict[str, Any] | None,
        request_meta: Any,
    ) -> Answer:
        """A prompt's get or a resource's read: its server is never asked anything."""
        call = self._start(ctx, tool, arguments, request_meta)
        if isinstance(call, Answer):
            return call
        return await self._attended(call, call.answer)

    async def _attended(self, call: HostCall, wait: Callable[[], Awaitable[_T]]) -> _T:
        """Wait for `call`'s next round with the host request of `call.ctx` waiting on it;
        a host that goes away (or is handed a question) no longer waits."""
        call.waiting = True
        try:
            return await wait()
        finally:
            call.waiting = False

    def _start(
        self,
        ctx: ServerRequestContext[Any],
        tool: str,
        arguments: dict[str, Any] | None,
        request_meta: Any,
    ) -> HostCall | Answer:
        """Hand the call to the gate in a task the proxy owns; its answer arrives on the
        returned `HostCall`."""
        if self.calls.closing.is_set() or self.work is None:
            return Answer.unrecorded()
        call = HostCall(ctx, tool, arguments)
        meta = request_meta or {}
        wants_progress = meta.get("progress_token", meta.get("progressToken")) is not None

        async def progress(elapsed: float, message: str) -> None:
            if not call.waiting:
                return
            # A host that went away must not break the call it left behind.
            with contextlib.suppress(Exception):
                await call.ctx.session.report_progress(elapsed, None, message)

        async def upstream_progress(value: float, total: float | None, text: str | None) -> None:
            # The server's progress for this call, under the host's own token.
            if call.waiting and wants_progress:
                with contextlib.suppress(Exception):
                    await call.ctx.session.report_progress(
                        value, total, sanitize(text)[:500] if text is not None else None
                    )

        async def upstream_log(level: str, logger: str | None, data: Any) -> None:
            # Only at or above the level the host set; sanitized, like any server text.
            # A server's log lines are the host session's, not this call's: whichever call
            # reads them passes them on, a call its host gave up on included (it goes on,
            # and may be the one reading the server's stdout for the others).
            wanted = self.log_level
            if wanted is None or level not in _LOG_LEVELS:
                return
            if _LOG_LEVELS.index(level) < _LOG_LEVELS.index(wanted):
                return
            text = data if isinstance(data, str) else canonical_json(data)
            with contextlib.suppress(Exception):
                await call.ctx.session.send_log_message(
                    level,  # type: ignore[arg-type]
                    bounded(text, 2000),
                    logger=bounded(logger, 100) if logger is not None else None,
                )

        runs: list[str] = []
        upstream = self.server_of.get(tool)

        async def work() -> None:
            UPSTREAM_PROGRESS.set(upstream_progress if wants_progress else None)
            UPSTREAM_LOG.set(upstream_log)
            CALL_RUN.set(runs)
            if upstream is not None:
                UPSTREAM_ASK.set(
                    asker_for(
                        upstream,
                        call,
                        self.store,
                        runs,
                        self.timeouts.get(tool, DEFAULT_SERVER_TIMEOUT),
                    )
                )
            answer = Answer.unavailable("the gate could not complete this call.")
            try:
                answer = await self.calls.handle(tool, arguments, progress, request_meta)
            except Exception as exc:
                _log(self.log, f"agentrt proxy: a call to {sanitize(tool)} failed: "
                     f"{sanitize(str(exc))}")  # fmt: skip
            finally:
                self.in_flight.leave()
                call.finish(answer)

        self.in_flight.enter()
        # A bare asyncio task, not a child of `work`: `running` waits for every call
        # through `in_flight` before the group ends, and `work` catches its own failures,
        # so the group's bookkeeping bought nothing for ~3% of a proxied call's CPU.
        task = asyncio.get_running_loop().create_task(work())
        self._call_tasks.add(task)
        task.add_done_callback(self._call_tasks.discard)
        return call

    # -- gate_status ---------------------------------------------------------

    async def status(self, arguments: dict[str, Any] | None) -> Answer:
        """Answer from the database alone: never executes, decides or writes a run.

        Never raises: a store that cannot be read is told as such, and no
        answer names a run, a path or the database.
        """
        try:
            return await self.store.run(self._read_status, arguments)
        except Exception as exc:
            _log(self.log, f"agentrt proxy: gate_status could not read the database: "
                 f"{sanitize(str(exc))}")  # fmt: skip
            return Answer.status_unavailable()

    def _read_status(self, arguments: dict[str, Any] | None) -> Answer:
        arguments = arguments or {}
        unknown = sorted(set(arguments) - {"approval_id"})
        if unknown:
            return Answer.invalid(STATUS_TOOL, f"unknown argument {unknown[0]!r}")
        approval_id = arguments.get("approval_id")
        if approval_id is None:
            waiting = self.index.waiting()
            if not waiting:
                return Answer("No request of this session waits for a person's approval.", False)
            lines = [f"{len(waiting)} request(s) wait for a person's decision:"]
            for row, waits in waiting:
                lines.append(
                    f"- approval {waits.approval_id}: {row.tool} "
                    f"({_status_word(waits.kind)}), waiting since {waits.created_at}"
                )
            return Answer("\n".join(lines), False)
        if not isinstance(approval_id, str):
            return Answer.invalid(STATUS_TOOL, "approval_id must be a string")
        try:
            approval = self.store.get_approval(approval_id)
        except RunNotFound:
            approval = None
        if approval is None or self.index.get(approval.run_id) is None:
            # Another session's approvals are not this model's business.
            return Answer(
                f"There is no approval {bounded(approval_id, 80)} in this session.", False
            )
        described = {
            ApprovalStatus.PENDING: "is waiting for a person's decision",
            ApprovalStatus.APPROVED: (
                "was approved and has not run yet: it runs on the next call of the tool with "
                "exactly the same arguments"
            ),
            ApprovalStatus.USED: _what_ran(self.index.get(approval.run_id)),
            ApprovalStatus.REJECTED: "was rejected",
            ApprovalStatus.EXPIRED: "expired before anyone decided; the call did not run",
            ApprovalStatus.SUPERSEDED: "was replaced by a newer request for the same call",
        }[approval.status]
        note = (
            f' The reviewer said: "{bounded(approval.note)}".'
            if approval.status is ApprovalStatus.REJECTED and approval.note
            else ""
        )
        return Answer(
            f"Approval {approval.approval_id} for {approval.tool} {described}.{note}", False
        )

    # -- lifecycle -----------------------------------------------------------

    async def _renew_holds(self) -> None:
        while True:
            await anyio.sleep(self.config.lease_ttl / 3)
            with contextlib.suppress(Exception):
                await self.store.run(self.index.renew_holds)
            await self.calls.repair()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Renew the holds while serving; on exit take no more calls and wait for those in
        flight, and for their tasks to end."""
        async with anyio.create_task_group() as work:
            self.work = work
            work.start_soon(self._renew_holds)
            try:
                yield
            finally:
                self.calls.closing.set()
                with anyio.CancelScope(shield=True):
                    await self.in_flight.wait()
                    if self._call_tasks:
                        await asyncio.wait(set(self._call_tasks))
                work.cancel_scope.cancel()


def _take_offers(offered: Offered, name: str, offers: Offers) -> list[str]:
    """Add one server's checked prompts, resources and templates to `offered`; the lines
    to log (its refusals, and what the SDK could not list or another server took first)."""
    lines = list(offers.lines)
    sections = (
        (offers.prompts, types.Prompt, "prompt"),
        (offers.resources, types.Resource, "resource"),
        (offers.resource_templates, types.ResourceTemplate, "resource template"),
    )
    for listed, model, noun in sections:
        for raw in listed:
            plain = plain_json(raw)
            shown = sanitize(str(raw.get("name", "")))
            try:
                # What the SDK cannot list to the host is refused alone, not the whole list.
                model.model_validate(plain)
            except ValueError as exc:
                lines.append(
                    f"{sanitize(name)}: refused {noun} {shown}: the host could not be sent it "
                    f"({sanitize(str(exc).splitlines()[0])})"
                )
                continue
            if noun == "prompt":
                holder = offered.prompts.get(str(raw["name"]))
                if holder is not None:
                    lines.append(
                        f"{sanitize(name)}: refused prompt {shown}: the name is already "
                        f'offered by server "{sanitize(holder[1])}"'
                    )
                    continue
                offered.prompts[str(raw["name"])] = (plain, name)
            elif noun == "resource":
                offered.resources.append((plain, name))
            else:
                offered.templates.append((plain, name))
    return lines


def _host_key(ctx: ServerRequestContext[Any]) -> str:
    """Which host a request came from: its MCP session id over HTTP; stdio has one host."""
    headers = getattr(ctx.request, "headers", None)
    session_id = headers.get("mcp-session-id") if headers is not None else None
    return str(session_id) if session_id else "stdio"


def _offer_result(answer: Answer) -> dict[str, Any]:
    """A prompt's or resource's result as forwarded, or the gate's refusal as an error."""
    if answer.result_object is not None:
        return answer.result_object
    # DENIED, PENDING_APPROVAL, TOOL_ERROR, ...: the same prose a tool call gets, as an error.
    raise MCPError(-32603, answer.text)


def _what_ran(row: CallRow | None) -> str:
    """What the executed step recorded, for an approval that was used."""
    outcome = row.outcome if row is not None else None
    if outcome == Settled.RESULT:
        return "was approved and the call ran: the server returned a result"
    if outcome == Settled.TOOL_ERROR:
        return "was approved and the call ran: the server reported an error"
    if outcome == Settled.DENIED:
        return "was approved, but the policy denied the call when it was to run; it did not run"
    if outcome == Settled.INVALID:
        return "was approved, but the call was refused as invalid; it did not run"
    if row is not None and row.unknown_outcome:
        return (
            "was approved and the call was sent, but its outcome is unknown; a person decides "
            "what happens next"
        )
    return "was approved and the call is running or its outcome is not recorded yet"


def _status_word(kind: str) -> str:
    if kind == "interrupted_side_effect":
        return "an earlier attempt was cut off"
    if kind == "unknown_outcome":
        return "an earlier attempt's outcome is unknown"
    return "needs approval"


@dataclass
class _Shutdown:
    """How the proxy stops: asked to (stdin's end or a first signal: calls in flight
    finish), or hurried (a signal after the first: its host is about to kill it)."""

    stopping: anyio.Event = field(default_factory=anyio.Event)
    hurried: bool = False
    # The upstream sessions, once loaded.
    connections: list[Connection] = field(default_factory=list)

    async def hurry(self) -> None:
        """Kill every upstream server now, so each call in flight ends as a server's crash
        ends it: recorded, as an unknown outcome when it changes something, and answered,
        within the host's grace rather than cut off by its SIGKILL with nothing recorded."""
        self.hurried = True
        async with anyio.create_task_group() as group:
            for connection in self.connections:
                group.start_soon(functools.partial(connection.aclose, polite=False))


async def _watch_signals(shutdown: _Shutdown, log: IO[str], *, keep_caught: bool) -> None:
    """On SIGINT or SIGTERM, stop taking calls; those in flight finish, are recorded and
    answered.  A later signal hurries the shutdown (`_Shutdown.hurry`).  On the way out
    the signals are left ignored (`keep_caught`: the process is about to exit, and a
    host's second signal must not kill it while it does), or as they were found."""
    caught = (signal.SIGINT, signal.SIGTERM)
    found = {number: signal.getsignal(number) for number in caught}
    try:
        with anyio.open_signal_receiver(*caught) as signals:
            async for received in signals:
                name = signal.Signals(received).name
                if not shutdown.stopping.is_set():
                    _log(log, f"agentrt proxy: {name}: finishing calls in flight")
                    shutdown.stopping.set()
                elif not shutdown.hurried:
                    _log(log, f"agentrt proxy: {name} during shutdown: stopping the upstream "
                         "servers now; calls in flight end with an unknown outcome")  # fmt: skip
                    await shutdown.hurry()
    finally:
        # Leaving the receiver put the default action back (death by the signal).
        for number, handler in found.items():
            if keep_caught:
                signal.signal(number, signal.SIG_IGN)
            else:
                signal.signal(number, handler if handler is not None else signal.SIG_DFL)


async def _serve_stdio(
    server: LowLevelServer[Any], proxy: Proxy, log: IO[str], stopping: anyio.Event
) -> None:
    def settled() -> bool:
        return proxy.in_flight.count == 0

    async def stop_when_asked(wire: StdioWire) -> None:
        await stopping.wait()
        wire.stop()

    async with (
        stdio_wire(proxy.calls.closing.set, settled, log) as wire,
        anyio.create_task_group() as group,
    ):
        group.start_soon(stop_when_asked, wire)
        await server.run(wire.incoming, wire.outgoing, server.create_initialization_options())
        group.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def _serving_inbox(
    config: ProxyConfig,
    proxy: Proxy,
    tools: list[Tool],
    servers_of: dict[str, str],
    log: IO[str],
) -> AsyncIterator[None]:
    """The approval inbox beside the proxy, when the configuration asks for one."""
    if config.inbox is None:
        yield
        return
    from ..inbox import ToolInfo, notify_waiting, parse_listen, read_or_create_token, running_inbox

    settings = config.inbox
    token_file = settings.token_file
    token = read_or_create_token(token_file) if token_file is not None else None
    described = {
        tool.spec.name: ToolInfo(servers_of.get(tool.spec.name, ""), tool.spec.description)
        for tool in tools
    }
    # A connection of its own: the page's reads never wait on the proxy's lock.
    with open_store(config.database, create=False) as inbox_store:
        async with running_inbox(
            inbox_store, parse_listen(settings.listen), token=token,
            login=_login_name(), tools=described,
        ) as running:  # fmt: skip
            proxy.calls.inbox_address = running.address
            if settings.notify:
                proxy.calls.on_waiting = lambda approval: notify_waiting(approval, running.address)
            if token_file is not None:
                _log(log, f"agentrt proxy: inbox at {running.address} (token in {token_file})")
            else:
                # The only line that carries the token; approvals' lines never do.
                _log(log, f"agentrt proxy: inbox: {running.address_with_token}")
            try:
                yield
            finally:
                proxy.calls.inbox_address = None
                proxy.calls.on_waiting = None


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return ""


async def serve_config(
    config: ProxyConfig,
    *,
    http: str | None = None,
    allow_remote: bool = False,
    token: str | None = None,
    log: IO[str] | None = None,
) -> int:
    """Serve `config` until the host leaves or a signal arrives; returns the exit status."""
    return await _serve(config, http=http, allow_remote=allow_remote, token=token, log=log)


async def _serve(
    config: ProxyConfig,
    *,
    http: str | None,
    allow_remote: bool,
    token: str | None,
    log: IO[str] | None,
    keep_signals_caught: bool = False,
) -> int:
    stream = log if log is not None else sys.stderr
    address: tuple[str, int] | None = None
    listener: socket.socket | None = None
    if http is not None:
        address = split_http(http)
        if not is_loopback(address[0]) and not (allow_remote and token):
            raise ConfigError(
                f"--http {sanitize(http)} is not a loopback address; serving other hosts "
                "needs --allow-remote and a --token"
            )
        listener = listen(address[0], address[1])
    try:
        return await _serve_config(
            config, address, listener, token, stream, keep_signals_caught=keep_signals_caught
        )
    finally:
        if listener is not None:
            listener.close()


async def _serve_config(
    config: ProxyConfig,
    address: tuple[str, int] | None,
    listener: socket.socket | None,
    token: str | None,
    stream: IO[str],
    *,
    keep_signals_caught: bool,
) -> int:
    store = open_store(config.database)
    shutdown = _Shutdown()
    stopping = shutdown.stopping
    failure: Exception | None = None
    telemetry: TraceExporter | None = None
    # Caught from here to the end: a signal while calls finish must not kill them.
    async with anyio.create_task_group() as signals:
        signals.start_soon(
            functools.partial(_watch_signals, shutdown, stream, keep_caught=keep_signals_caught)
        )
        try:
            servers_of: dict[str, str] = {}
            offered = Offered()
            tools, shutdown.connections = await _load_upstreams(config, stream, servers_of, offered)
            telemetry = start_exporter(
                config.database,
                settings_from(
                    {"otlp_endpoint": config.telemetry.otlp_endpoint,
                     "content": config.telemetry.content},
                    default_service="agentrt-proxy",
                ),
                side_effects={tool.spec.name: str(tool.spec.side_effect) for tool, _ in tools},
                log=stream,
            )  # fmt: skip
            proxy = Proxy(config, store, tools, stream, offered)
            server = proxy.server()
            async with (
                proxy.running(),
                _serving_inbox(config, proxy, [tool for tool, _ in tools], servers_of, stream),
            ):
                if address is not None and listener is not None:
                    await serve_http(
                        server, address[0], address[1], token, stream, stopping, listener
                    )
                else:
                    await _serve_stdio(server, proxy, stream, stopping)
        except Exception as exc:
            # Re-raised below, outside the task group, so `serve` sees the
            # error itself (a refused database, say) rather than an ExceptionGroup.
            failure = exc
        finally:
            with anyio.CancelScope(shield=True):
                if telemetry is not None:
                    # What was committed before the stop still gets its spans.
                    await anyio.to_thread.run_sync(telemetry.stop)
                for connection in shutdown.connections:
                    with contextlib.suppress(Exception):
                        await connection.aclose(polite=not shutdown.hurried)
            store.close()
            signals.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return 0


def exit_process(status: int) -> NoReturn:
    """End the `agentrt proxy` process with `status` once `serve` returned: its work is
    recorded and its upstream servers are stopped, so only the interpreter's teardown is
    left, which frees every module (0.4-0.9 s measured on a busy machine) and would
    outlast a host's grace (Claude Code sends SIGKILL 0.5 s after its SIGINT)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop, which the proxy runs on wherever it is installed (a core
    dependency on every platform but Windows): 8 % fewer instructions per proxied call
    than on the standard library's (decision 0023).  None, the standard library's, elsewhere."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def serve(
    config_path: str,
    *,
    http: str | None = None,
    allow_remote: bool = False,
    token: str | None = None,
) -> int:
    """`agentrt proxy --config FILE`: load the configuration and serve until the host leaves.

    Loopback only unless `allow_remote` with a `token`.  Returns the exit
    status: 0 after a clean shutdown, 1 when the configuration is refused,
    2 when the database cannot be used (the reason is written to stderr).
    """
    try:
        config = load_config(config_path)
        return anyio.run(
            lambda: _serve(
                config, http=http, allow_remote=allow_remote, token=token, log=None,
                keep_signals_caught=True,
            ),
            backend_options={"loop_factory": event_loop_factory()},
        )  # fmt: skip
    except StoreError as exc:
        # An unusable database is exit 2, as for every other subcommand.
        _log(sys.stderr, f"agentrt proxy: {exc}")
        return 2
    except (ConfigError, AgentrtError) as exc:
        _log(sys.stderr, f"agentrt proxy: {exc}")
        return 1
    except OSError as exc:
        _log(sys.stderr, f"agentrt proxy: {sanitize(str(exc))}")
        return 1
