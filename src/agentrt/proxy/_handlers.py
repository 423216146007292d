"""The MCP requests a host sends the proxy, each answered through the gate or refused.

`tools/list` offers the loaded tools (with the operator's classification as
their hints) and `gate_status`; `tools/call` hands a call to the proxy's own
task (`Proxy.start`) and waits for its answer, or for a server's question to
hand the host (`input_required`); `prompts/get` and `resources/read` are
gated like calls, under tool names the host never sees; subscriptions,
completion and the logging level are forwarded to the server they concern.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from .._version import VERSION as AGENTRT_VERSION
from ..canonical import plain_json
from ..tools import SideEffect
from ._answers import Answer, admits_waiting, bounded
from ._apps import host_renders_apps, is_app_uri
from ._input_required import HostCall, Question
from ._plain import UNDECIDED, call_result, listed_plainly, listed_tool, monolith_call_result
from ._proxy import Proxy, principal_of_request
from ._resource import same_principal
from ._revision import cache_hints
from ._status import STATUS_TOOL
from .config import DEFAULT_SERVER_TIMEOUT

if TYPE_CHECKING:
    # The SDK's models and server are imported only when a host needs them (`_dispatch`,
    # decisions 0043 and 0061): the front's methods answer in plain JSON.
    import mcp_types as types
    from mcp.server.context import ServerRequestContext
    from mcp.server.lowlevel import Server as LowLevelServer

    from ._listen import HostEvents

__all__ = ["INSTRUCTIONS", "NAME", "VERSION", "Handlers"]

# What the host reads in `initialize`: the SDK's answer and the stdio front's are the same.
NAME: Final = "agentrt-proxy"
VERSION: Final = AGENTRT_VERSION
INSTRUCTIONS: Final = (
    "Tools here pass through a gate: some calls wait for a person's approval. "
    "Read each answer's first word; follow what it says."
)

# What one round of a host's call ends in: the gate's answer, or a server's question.
_Round = Answer | Question
_T = TypeVar("_T")


class Handlers:
    """The host-facing MCP server's request handlers, over one `Proxy`."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        # Hosts subscribed to each resource URI (notifications/resources/updated): by the
        # host's MCP session id over HTTP (one stdio host), its latest session object.
        self.subscribers: dict[str, dict[str, Any]] = {}
        # 2026 hosts' listen streams (`_listen.py`), and the servers' subscriptions they hold:
        # made when a host first listens (`_host_events`), by the front or the SDK.s server.
        self.events: HostEvents | None = None
        for name in proxy.offered.tools:
            # A server offering prompts or resources may tell of a resource's update.
            proxy.offered.upstreams[name].connection.on_notification = self._upstream_notified

    def _host_events(self) -> HostEvents:
        if self.events is None:
            from ._listen import HostEvents

            self.events = HostEvents(
                self._forward_subscription, lambda uri: bool(self.subscribers.get(uri))
            )
            # A list change the proxy tells its hosts (`_live.py`) reaches their streams too.
            self.proxy.listeners.streams = self.events.list_changed
        return self.events

    def server(self) -> LowLevelServer[Any]:
        from mcp.shared.exceptions import MCPDeprecationWarning

        with warnings.catch_warnings():
            # Logging is deprecated in the 2026-07-28 revision; 2025 hosts still set a level.
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            return self._server()

    def _server(self) -> LowLevelServer[Any]:
        from mcp.server.lowlevel import Server as LowLevelServer

        return LowLevelServer(
            NAME,
            version=VERSION,
            instructions=INSTRUCTIONS,
            # The listings answer with the models' dumps (`_plain`, decision 0061): the
            # SDK's runner takes a dict result as it takes a model's dump.
            on_list_tools=self._list_tools,  # type: ignore[arg-type]
            # A raw input-required result: the SDK's typed requests would drop what the
            # server sent (an elicitation's legacy enumNames).
            on_call_tool=self._call_tool,  # type: ignore[arg-type]
            # Hosts ask for these whatever the capabilities say; with nothing pinned, "none".
            on_list_resources=self._list_resources,  # type: ignore[arg-type]
            on_list_resource_templates=self._list_resource_templates,  # type: ignore[arg-type]
            on_read_resource=self._read_resource,
            on_subscribe_resource=self._subscribe,
            on_unsubscribe_resource=self._unsubscribe,
            # Its result the model's dump, its frames the models the SDK's session takes.
            on_subscriptions_listen=self._host_events().listen,  # type: ignore[arg-type]
            on_list_prompts=self._list_prompts,  # type: ignore[arg-type]
            on_get_prompt=self._get_prompt,
            on_completion=self._complete,
            on_set_logging_level=self._set_logging_level,
        )

    async def _set_logging_level(
        self, ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        import mcp_types as types

        # One level for the process: the servers' logging is forwarded from then on.
        self.proxy.log_level = str(params.level)
        for upstream in self.proxy.upstreams.values():
            capabilities = upstream.connection.capabilities
            if isinstance(capabilities, dict) and "logging" in capabilities:
                # Each server then filters at the source too; one that refuses changes nothing.
                with contextlib.suppress(Exception):
                    await upstream.connection.request(
                        "logging/setLevel", {"level": self.proxy.log_level}, timeout=5.0
                    )
        return types.EmptyResult()

    # -- prompts, resources, completion ----------------------------------------

    async def _list_prompts(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult | dict[str, Any]:
        self.proxy.listeners.listened(_host_key(ctx), ctx.session)
        if not self.proxy.offered.prompts:
            return _empty_list("prompts")
        raws = [raw for raw, _ in self.proxy.offered.prompts.values()]
        plainly = listed_plainly("prompts", raws)
        if plainly is not None:  # the models are not imported (issue 36)
            return {**_LIST_HINTS, "prompts": plainly, "resultType": "complete"}
        import mcp_types as types

        return types.ListPromptsResult(
            prompts=[
                types.Prompt.model_validate(raw) for raw, _ in self.proxy.offered.prompts.values()
            ],
            **cache_hints(),
        )

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult | dict[str, Any]:
        apps = host_renders_apps(ctx)
        self.proxy.listeners.listened(_host_key(ctx), ctx.session)
        if not self.proxy.offered.resources:
            return _empty_list("resources")
        raws = [
            raw
            for raw, _ in self.proxy.offered.resources
            if apps or not is_app_uri(str(raw.get("uri", "")))
        ]
        plainly = listed_plainly("resources", raws)
        if plainly is not None:
            return {**_LIST_HINTS, "resources": plainly, "resultType": "complete"}
        import mcp_types as types

        return types.ListResourcesResult(
            resources=[types.Resource.model_validate(raw) for raw in raws],
            **cache_hints(),
        )

    async def _list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult | dict[str, Any]:
        if not self.proxy.offered.templates:
            return _empty_list("resourceTemplates")
        raws = [raw for raw, _ in self.proxy.offered.templates]
        plainly = listed_plainly("resourceTemplates", raws)
        if plainly is not None:
            return {**_LIST_HINTS, "resourceTemplates": plainly, "resultType": "complete"}
        import mcp_types as types

        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate.model_validate(raw)
                for raw, _ in self.proxy.offered.templates
            ],
            **cache_hints(),
        )

    async def _get_prompt(
        self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        import mcp_types as types

        entry = self.proxy.offered.prompts.get(params.name)
        if entry is None:
            raise _error(-32602, f"there is no prompt {bounded(params.name, 80)}")
        arguments: dict[str, Any] = {"name": params.name}
        if params.arguments is not None:
            arguments["arguments"] = dict(params.arguments)
        answer = await self._gated(
            ctx, self.proxy.offered.tools[entry[1]][0], arguments, params.meta
        )
        return types.GetPromptResult.model_validate(_offer_result(answer))

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        import mcp_types as types

        uri = str(params.uri)
        server = self.proxy.offered.server_of_uri(uri)
        if server is None or server not in self.proxy.offered.tools:
            raise _error(-32002, f"there is no resource {bounded(uri, 200)}")
        if is_app_uri(uri) and not host_renders_apps(ctx):
            # An app is offered only to a host that said it renders apps (`_apps.py`).
            raise _error(-32002, f"there is no resource {bounded(uri, 200)}")
        answer = await self._gated(
            ctx, self.proxy.offered.tools[server][1], {"uri": uri}, params.meta
        )
        return types.ReadResourceResult.model_validate(_offer_result(answer))

    async def _subscribe(
        self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        import mcp_types as types

        uri = str(params.uri)
        # Subscribed first: a server may send the first update before it answers.
        subscribed = self.subscribers.setdefault(uri, {})
        key = _host_key(ctx)
        subscribed[key] = ctx.session
        from mcp.shared.exceptions import MCPError

        try:
            await self._forward_subscription("resources/subscribe", uri)
        except MCPError:
            subscribed.pop(key, None)
            raise
        return types.EmptyResult()

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        import mcp_types as types

        uri = str(params.uri)
        self.subscribers.get(uri, {}).pop(_host_key(ctx), None)
        if not self.subscribers.get(uri):
            self.subscribers.pop(uri, None)
            if self.events is None or not self.events.listening.get(uri):
                await self._forward_subscription("resources/unsubscribe", uri)
        return types.EmptyResult()

    async def _forward_subscription(self, method: str, uri: str) -> None:
        server = self.proxy.offered.server_of_uri(uri)
        upstream = self.proxy.offered.upstreams.get(server) if server is not None else None
        if upstream is None:
            raise _error(-32002, f"there is no resource {bounded(uri, 200)}")
        try:
            await upstream.ready()
            await upstream.connection.request(method, {"uri": uri}, timeout=10.0)
        except Exception as exc:
            raise _error(-32603, f"{method} failed: {bounded(str(exc), 300)}") from None

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
        if self.events is not None:
            await self.events.resource_updated(uri)

    async def _complete(
        self, ctx: ServerRequestContext[Any], params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        import mcp_types as types

        ref = params.ref
        if isinstance(ref, types.PromptReference):
            entry = self.proxy.offered.prompts.get(ref.name)
            server = entry[1] if entry is not None else None
        else:
            server = self.proxy.offered.server_of_uri(ref.uri)
        upstream = self.proxy.offered.upstreams.get(server) if server is not None else None
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
            raise _error(-32603, f"completion failed: {bounded(str(exc), 300)}") from None

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> dict[str, Any]:
        """The listing as the SDK's `ListToolsResult` dumps it (`_plain`: a test holds the
        two equal), built without the models."""
        # A host that listed the tools is told when the list it may see changes.
        self.proxy.listeners.listened(_host_key(ctx), ctx.session)
        # The hints a host sees are the operator's classification, never the server's claims.
        ui = self.proxy.ui if host_renders_apps(ctx) else {}
        tools: list[dict[str, Any]] = []
        for spec in self.proxy.specs.values():
            if spec.name in self.proxy.hidden or not self.proxy.serves(spec.name):
                continue
            title, output_schema = self.proxy.listed.get(spec.name, (None, None))
            tools.append(
                listed_tool(
                    spec.name,
                    title,
                    spec.description,
                    plain_json(spec.input_schema),
                    output_schema,
                    read_only=spec.side_effect is SideEffect.READ_ONLY,
                    destructive=spec.side_effect is SideEffect.DESTRUCTIVE,
                    meta=ui.get(spec.name),
                )
            )
        tools.append(self.proxy.status.listed())
        # The first call then finds its path imported (decision 0066).
        self.proxy.listed_once()
        return {**_LIST_HINTS, "tools": tools, "resultType": "complete"}

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> dict[str, Any]:
        raw = ctx.params or {}
        call: HostCall | None = None
        outcome: _Round
        if raw.get("requestState") is not None or raw.get("inputResponses") is not None:
            # A retry answering a server's question resumes the call its state names; it
            # never starts one.
            resumed = self._resume(params.name, params.arguments, raw, ctx)
            if isinstance(resumed, HostCall):
                call, resumed.ctx = resumed, ctx
            else:
                outcome = resumed
        elif params.name == STATUS_TOOL:
            path = await self.proxy.calling()
            outcome = await self.proxy.status.answer(
                params.arguments, path.calls.index_session(principal_of_request(ctx))
            )
        elif params.name in self.proxy.hidden:
            # The proxy's own names for prompts/get and resources/read are not tools.
            outcome = Answer.invalid(params.name, "there is no tool with this name")
        else:
            started = self.proxy.start(ctx, params.name, params.arguments, params.meta)
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

    def _resume(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        raw: Any,
        ctx: ServerRequestContext[Any],
    ) -> HostCall | Answer:
        """The suspended call a retry's state names, its answer delivered; else the refusal.
        Only the principal who made the call may resume it (none, without principals)."""
        state = raw.get("requestState")
        if state is None:
            return Answer("inputResponses without the requestState they answer resume "
                          "nothing; nothing was run.", True)  # fmt: skip
        caller = principal_of_request(ctx)
        resumed = self.proxy.suspended.resume(
            state, tool, arguments, raw.get("inputResponses"),
            lambda call: same_principal(principal_of_request(call.ctx), caller),
        )  # fmt: skip
        if isinstance(resumed, str):
            return Answer(resumed, True)
        return resumed

    def _input_required(self, call: HostCall, question: Question) -> dict[str, Any]:
        """The host's call answered with the server's question and the state of its retry."""
        state = self.proxy.suspended.issue(
            call, question, self.proxy.timeouts.get(call.tool, DEFAULT_SERVER_TIMEOUT)
        )
        return {
            "resultType": "input_required",
            "inputRequests": {question.key: question.wire()},
            "requestState": state,
        }

    def _tool_result(self, name: str, answer: Answer) -> dict[str, Any]:
        """The host's call result as the SDK's `CallToolResult` dumps it (`_plain`: a test
        holds the two equal); a forwarded result of other than text blocks through the
        model itself."""
        structured: dict[str, Any] | None = None
        meta: dict[str, Any] | None = None
        if answer.result_object is None:
            content: list[dict[str, Any]] = [{"type": "text", "text": answer.text}]
            is_error = answer.is_error
        else:
            forwarded = monolith_call_result(answer.result_object)
            if forwarded is UNDECIDED:
                import mcp_types as types

                model = types.CallToolResult.model_validate(answer.result_object)
                forwarded = model.model_dump(by_alias=True, mode="json", exclude_none=True)
            assert isinstance(forwarded, dict)
            content, is_error = forwarded["content"], forwarded["isError"]
            structured, meta = forwarded.get("structuredContent"), forwarded.get("_meta")
        listed = self.proxy.listed.get(name, (None, None))[1]
        waiting = answer.waiting_structure()
        if waiting is not None and admits_waiting(listed):
            # The listing admits the gate's own waiting answer: a host shows it as waiting.
            structured = waiting
        if listed is not None and structured is None:
            # Both official clients refuse a success without the structured content an
            # outputSchema promises; the gate's own prose (a cut result, …) has none.
            is_error = True
        return call_result(content, is_error, structured, meta)

    async def _gated(
        self,
        ctx: ServerRequestContext[Any],
        tool: str,
        arguments: dict[str, Any] | None,
        request_meta: Any,
    ) -> Answer:
        """A prompt's get or a resource's read: its server is never asked anything."""
        call = self.proxy.start(ctx, tool, arguments, request_meta)
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


# Every list's cache hints (decision 0038), as the models name them on the wire.
_HINTS: Final = cache_hints()
_LIST_HINTS: Final = {"ttlMs": _HINTS["ttl_ms"], "cacheScope": _HINTS["cache_scope"]}


def _empty_list(key: str) -> dict[str, Any]:
    """An empty listing as the SDK's `List…Result` dumps it."""
    return {**_LIST_HINTS, key: [], "resultType": "complete"}


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
    raise _error(-32603, answer.text)


def _error(code: int, message: str) -> Exception:
    """The SDK's `MCPError`: the methods raising it are reached only through the SDK's
    server, loaded by then; imported here so that this module does not load it."""
    from mcp.shared.exceptions import MCPError as Error

    return Error(code, message)
