"""The stdio front: the methods every host sends, answered without the SDK's server.

A host opening a proxied server sends `initialize`, `notifications/initialized`,
the listings and then `tools/call`, and nothing else for most sessions.
The front answers those itself over the parsed JSON-RPC, with the same
validation the SDK's server applies and the same answers (`Handlers`' methods,
one answer path for both): read, checked and shaped in plain JSON by `_plain`
where it can prove the SDK's models decide alike, by those models (the wire
types `mcp_types.methods` maps every handshake-era version to) where it
cannot (decision 0061), so the SDK's server (0.6–0.7 s of CPU and 25–30 MiB to import,
decision 0043) is loaded only when a host needs it: any other method, or a
request before the handshake.  A connection opened in the 2026-07-28 era
(Claude Code's) has its discover, listings and calls answered the same way
by `_modern` (decision 0052).  Then the SDK's server is started behind the
front, told the host's `initialize` again (or, in the 2026 era, a
`server/discover` under the host's envelope; its answer is not passed on),
and from then on is handed every message the front does not answer.

A call the front runs keeps what the SDK's request context gave it
(`FrontContext`): the host's progress token, log lines at the level the
host set, the host's cancellation, and a server's questions to the host
(elicitation, sampling, roots), sent as the front's own requests on the
wire and answered by the host's responses to them.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import IO, TYPE_CHECKING, Any, Final

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from ..mcp._handshake import LATEST_HANDSHAKE_VERSION
from . import _plain
from ._handlers import INSTRUCTIONS, NAME, VERSION, Handlers
from ._log import log_line
from ._plain import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    UNDECIDED,
    ErrorReply,
    Message,
    Notification,
    Request,
    RequestId,
    Response,
    agreed_version,
    checked_params,
    model_of,
    shaped_result,
)
from ._revision import PROTOCOL_VERSION_META_KEY
from ._stdio import StdioWire

if TYPE_CHECKING:
    import mcp_types as types
    from mcp.shared.message import SessionMessage
    from pydantic import BaseModel

__all__ = [  # and, built on first use, WIRE_REQUESTS and WIRE_RESULTS
    "SERVER_CAPABILITIES",
    "FrontContext",
    "HostRefused",
    "StdioFront",
    "answered_plainly",
    "dumped",
    "initialize_answer",
    "initialize_result",
    "pong",
]

# What the SDK's server advertises for `Handlers.server()` (a test holds the two equal).
SERVER_CAPABILITIES: Final[dict[str, Any]] = {
    "logging": {},
    "prompts": {"listChanged": True},
    "resources": {"subscribe": True, "listChanged": True},
    "tools": {"listChanged": True},
    "completions": {},
    "extensions": {},
}

# What the front checks each request it answers against, and shapes each result by, at
# every handshake-era version, when `_plain` cannot decide: `mcp_types.methods`'
# CLIENT_REQUESTS and SERVER_RESULTS (a test holds them equal).  Built on first use, with
# the SDK's models (module `__getattr__`: `WIRE_REQUESTS`, `WIRE_RESULTS`).
_wire_maps: dict[str, Any] = {}


def _wire() -> dict[str, Any]:
    if not _wire_maps:
        # The handshake era's wire types (`mcp_types.methods` maps every version before
        # 2026-07-28 to them): importing `methods` would build the 2026 era's too.
        import mcp_types._v2025_11_25 as wire
        from pydantic import TypeAdapter

        _wire_maps["WIRE_REQUESTS"] = {
            "initialize": wire.InitializeRequest,
            "ping": wire.PingRequest,
            "tools/list": wire.ListToolsRequest,
            "tools/call": wire.CallToolRequest,
            "prompts/list": wire.ListPromptsRequest,
            "resources/list": wire.ListResourcesRequest,
            "resources/templates/list": wire.ListResourceTemplatesRequest,
        }
        _wire_maps["WIRE_RESULTS"] = {
            "initialize": wire.InitializeResult,
            "ping": wire.EmptyResult,
            "tools/list": wire.ListToolsResult,
            "tools/call": wire.CallToolResult,
            "prompts/list": wire.ListPromptsResult,
            "resources/list": wire.ListResourcesResult,
            "resources/templates/list": wire.ListResourceTemplatesResult,
        }
        _wire_maps["shapers"] = {
            method: TypeAdapter(model) for method, model in _wire_maps["WIRE_RESULTS"].items()
        }
    return _wire_maps


def __getattr__(name: str) -> Any:
    if name in ("WIRE_REQUESTS", "WIRE_RESULTS"):
        return _wire()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Each method's params model, for what `_plain` leaves to the models (`mcp_types`' names).
_PARAMS_MODELS: Final = {
    "ping": "RequestParams",
    "tools/list": "PaginatedRequestParams",
    "prompts/list": "PaginatedRequestParams",
    "resources/list": "PaginatedRequestParams",
    "resources/templates/list": "PaginatedRequestParams",
    "tools/call": "CallToolRequestParams",
}

# The id of the host's `initialize` told again to an SDK server started late.
_REPLAYED_ID: Final = "agentrt-front-initialize"

_Handler = Callable[[Any, Any], Awaitable[Any]]


def _json(message: Mapping[str, Any]) -> bytes:
    # As pydantic writes the SDK's messages: compact, UTF-8 unescaped.
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _error(request_id: RequestId | None, code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return _json({"jsonrpc": "2.0", "id": request_id, "error": error})


def _check(method: str, params: Mapping[str, Any] | None) -> None:
    """`methods.validate_client_request` at a handshake-era version."""
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": 0, "method": method}
    if params is not None:
        body["params"] = params
    _wire()["WIRE_REQUESTS"][method].model_validate(body, by_name=False)


def _shaped(method: str, result: Any) -> dict[str, Any]:
    """`methods.serialize_server_result` at a handshake-era version."""
    shaper = _wire()["shapers"][method]
    shaped: dict[str, Any] = shaper.dump_python(
        shaper.validate_python(dumped(result), by_name=False),
        by_alias=True,
        mode="json",
        exclude_none=True,
    )
    return shaped


def _has_modern_envelope(params: Mapping[str, Any] | None) -> bool:
    """A request of the 2026-07-28 era: its `_meta` names the protocol version (as the
    SDK's runner decides)."""
    meta = params.get("_meta") if params else None
    return isinstance(meta, Mapping) and PROTOCOL_VERSION_META_KEY in meta


def _progress_token(params: Mapping[str, Any] | None) -> int | str | None:
    match params:
        case {"_meta": {"progressToken": str() | int() as token}} if not isinstance(token, bool):
            return token
        case _:
            return None


def negotiated(params: Mapping[str, Any] | None) -> tuple[types.InitializeRequestParams, str]:
    """The host's `initialize` params and the version agreed, as the SDK's runner agrees it."""
    import mcp_types as types

    init = types.InitializeRequestParams.model_validate(params or {}, by_name=False)
    return init, agreed_version({"protocolVersion": init.protocol_version})


def initialize_result(version: str) -> types.InitializeResult:
    """The proxy's answer to `initialize` at `version`, as the SDK's model."""
    import mcp_types as types

    return types.InitializeResult(
        protocol_version=version,
        capabilities=types.ServerCapabilities.model_validate(SERVER_CAPABILITIES),
        server_info=types.Implementation(name=NAME, version=VERSION),
        instructions=INSTRUCTIONS,
    )


def initialize_answer(
    params: Mapping[str, Any] | None,
) -> tuple[types.InitializeRequestParams, str, dict[str, Any]]:
    """The host's `initialize` answered as the SDK's runner answers it, and the version
    agreed, with the SDK's models.  Raises `ValidationError` for params the SDK refuses."""
    _check("initialize", params)
    client, version = negotiated(params)
    return client, version, _shaped("initialize", initialize_result(version))


class HostRefused(Exception):
    """The host answered one of the front's requests with an error."""


def progress_params(
    token: int | str, progress: float, total: float | None, message: str | None
) -> dict[str, Any]:
    """A `notifications/progress`'s params, as the SDK's session writes them."""
    params: dict[str, Any] = {"progressToken": token, "progress": progress}
    if total is not None:
        params["total"] = total
    if message is not None:
        params["message"] = message
    return params


def log_params(level: str, data: Any, logger: str | None) -> dict[str, Any]:
    """A `notifications/message`'s params, as the SDK's session writes them (the model's
    field order: level, logger, data)."""
    params: dict[str, Any] = {"level": level}
    if logger is not None:
        params["logger"] = logger
    params["data"] = data
    return params


class FrontSession:
    """The host as a call run by the front sees it: the part of the SDK's `ServerSession`
    that the proxy's call path uses."""

    def __init__(self, front: StdioFront, progress_token: int | str | None) -> None:
        self._front = front
        self._progress_token = progress_token
        # The SDK's session sends a request-scoped request through this; so does the proxy.
        self._request_outbound = self

    # The host's `initialize` params as it sent them (the SDK's session holds them as its
    # models; the readers take either: `_apps`, `_client_requests`, `_host_approval`).
    @property
    def client_params(self) -> dict[str, Any] | None:
        return self._front.client

    @property
    def client_capabilities(self) -> dict[str, Any] | None:
        client = self._front.client
        return client.get("capabilities") if client is not None else None

    @property
    def can_send_request(self) -> bool:
        return True

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        if self._progress_token is None:
            return  # the host asked for none (as the SDK's session does)
        params = progress_params(self._progress_token, progress, total, message)
        await self._front.notify("notifications/progress", params)

    async def send_log_message(
        self,
        level: str,
        data: Any,
        logger: str | None = None,
        related_request_id: RequestId | None = None,
    ) -> None:
        # The handshake era sends every level; the host chose one with logging/setLevel.
        await self._front.notify("notifications/message", log_params(level, data, logger))

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: Any = None
    ) -> dict[str, Any]:
        return await self._front.ask(method, params)

    # What the host may see of a list changed (`_live.HostListeners`, which keeps the
    # session of the host's latest listing): told as the SDK's session tells it.
    async def send_tool_list_changed(self) -> None:
        await self._front.notify("notifications/tools/list_changed", None)

    async def send_prompt_list_changed(self) -> None:
        await self._front.notify("notifications/prompts/list_changed", None)

    async def send_resource_list_changed(self) -> None:
        await self._front.notify("notifications/resources/list_changed", None)


class FrontContext:
    """What a handler reads of the host request it answers: the shape of the SDK's
    `ServerRequestContext` that `Handlers` and the call path use."""

    def __init__(self, front: StdioFront, request: Request, version: str) -> None:
        params = request.params
        self.session = FrontSession(front, _progress_token(params))
        self.request = None  # no HTTP request: stdio has one host
        self.request_id = request.id
        self.method = request.method
        self.params = params
        self.meta = params.get("_meta") if params else None
        self.protocol_version = version


class StdioFront:
    """Reads the host's messages off the stdio wire; answers the common methods itself and
    hands the rest to the SDK's server, started the first time one needs it."""

    def __init__(self, handlers: Handlers, wire: StdioWire, log: IO[str]) -> None:
        self.handlers = handlers
        self.wire = wire
        self.log = log
        # The host's `initialize`, once the front answered it, and the version agreed.
        self.client: dict[str, Any] | None = None
        self._initialize: Request | None = None
        self.version: str = LATEST_HANDSHAKE_VERSION
        self._initialized = False  # notifications/initialized seen
        self._first_request_seen = False
        # The connection opened in the 2026-07-28 era: each request carries its envelope.
        self._modern = False
        self._opening: Request | None = None  # its first request
        # The SDK's server serves every message: the connection opened in a way only it
        # answers (the 2026-07-28 era, or a request before the handshake).
        self._sdk_only = False
        self._sdk: MemoryObjectSendStream[SessionMessage | Exception] | None = None
        self._calls: dict[RequestId, anyio.CancelScope] = {}
        self._asked: dict[str, MemoryObjectSendStream[Response | ErrorReply]] = {}
        self._asked_count = 0
        self._group: TaskGroup | None = None
        # What is answered as it is read (a call runs in its own task).
        self._inline = {
            method: handler
            for method, handler in front_methods(handlers).items()
            if method != "tools/call"
        }

    async def serve(self) -> None:
        """Serve until the wire's intake ends (every request read is answered by then)."""
        try:
            async with anyio.create_task_group() as group:
                self._group = group
                async with self.wire.incoming:
                    async for message in self.wire.incoming:
                        await self._take(message)
                if self.handlers.events is not None:
                    # The host is gone: its listen streams end (their results the last frames).
                    self.handlers.events.close()
                if self._sdk is not None:
                    # The SDK's server ends once it has answered what it was handed.
                    await self._sdk.aclose()
        finally:
            for waiting in self._asked.values():
                waiting.close()  # no answer can come any more

    # -- the host's messages ----------------------------------------------------

    async def _take(self, message: Message) -> None:
        if isinstance(message, Request):
            await self._request(message)
        elif isinstance(message, Notification):
            await self._notification(message)
        else:
            waiting = (
                self._asked.pop(str(message.id), None) if isinstance(message.id, str) else None
            )
            if waiting is not None:
                waiting.send_nowait(message)
                waiting.close()
            elif self._sdk is not None:
                await self._to_sdk(message)

    async def _request(self, request: Request) -> None:
        method, params = request.method, request.params
        if not self._first_request_seen:
            self._first_request_seen = True
            # The first request decides the era, as in the SDK's server.
            self._modern = method != "initialize" and _has_modern_envelope(params)
            if self._modern:
                self._opening = request
        if self._modern:
            await self._modern_request(request)
        elif self._sdk_only or (method != "initialize" and _has_modern_envelope(params)):
            await self._to_sdk(request)
        elif method == "initialize" and self._initialize is None:
            await self.wire.send(self._initialized_by(request), request.id)
        elif method == "ping" or (method in self._inline and self._accepted()):
            answer = await self._answer(request, self._inline[method])
            await self.wire.send(answer, request.id)
        elif method == "tools/call" and self._accepted():
            assert self._group is not None
            self._group.start_soon(self._run_call, request, self._answer_call)
        else:
            await self._to_sdk(request)

    async def _modern_request(self, request: Request) -> None:
        """A request of a 2026-07-28 connection: the common methods answered here
        (`_modern`, decision 0052), the rest by the SDK's server."""
        from . import _modern

        if request.method not in _modern.MODERN_METHODS:
            await self._to_sdk(request)
            return
        params_type, handler = _modern.modern_methods(self.handlers)[request.method]

        async def answer(request: Request) -> bytes:
            return await _modern.answered(request, params_type, handler, self.notify, self.log)

        if request.method in ("tools/call", "subscriptions/listen"):
            assert self._group is not None
            self._group.start_soon(self._run_call, request, answer)
        else:
            await self.wire.send(await answer(request), request.id)

    async def _notification(self, notification: Notification) -> None:
        method = notification.method
        if method == "notifications/cancelled":
            request_id = (notification.params or {}).get("requestId")
            scope = self._calls.get(request_id) if isinstance(request_id, (int, str)) else None
            if scope is not None:
                scope.cancel()  # the host gets no answer for it (MCP)
                return
        elif method == "notifications/initialized" and not self._sdk_only:
            self._initialized = True
        if self._sdk is not None or self._sdk_only:
            await self._to_sdk(notification)
        # Otherwise the SDK's server would drop it too: the proxy has no handler for it.

    def _accepted(self) -> bool:
        return self.client is not None or self._initialized

    def _initialized_by(self, request: Request) -> bytes:
        params = request.params
        if checked_params("initialize", params) is UNDECIDED:
            from pydantic import ValidationError

            try:
                _check("initialize", params)
                negotiated(params)
            except ValidationError:
                return _error(request.id, INVALID_PARAMS, "Invalid request parameters", "")
        assert params is not None  # the models refuse an `initialize` without params
        version = agreed_version(params)
        self.client, self.version, self._initialize = params, version, request
        result = _plain.initialize_result(version, INSTRUCTIONS, NAME, VERSION)
        return _json({"jsonrpc": "2.0", "id": request.id, "result": result})

    async def _answer_call(self, request: Request) -> bytes:
        return await self._answer(request, self.handlers._call_tool)

    async def _run_call(
        self,
        request: Request,
        answer: Callable[[Request], Awaitable[bytes]],
    ) -> None:
        scope = anyio.CancelScope()
        self._calls[request.id] = scope
        reply: bytes | None = None
        try:
            with scope:
                reply = await answer(request)
        except anyio.get_cancelled_exc_class():
            # Shut down before it was answered: the host is told, as by the SDK.
            with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
                closed = _error(request.id, CONNECTION_CLOSED, "Connection closed")
                await self.wire.send(closed, request.id)
            raise
        finally:
            if self._calls.get(request.id) is scope:
                del self._calls[request.id]
        if reply is not None:  # None: the host cancelled it, and gets no answer (MCP)
            await self.wire.send(reply, request.id)

    async def _answer(self, request: Request, handler: _Handler) -> bytes:
        """One request answered as the SDK's runner answers it: the params checked for the
        method at the connection's version, the handler's result shaped by that version."""
        context = FrontContext(self, request, self.version)
        return await answered_plainly(request, handler, context, self.log)

    # -- what the front sends the host ------------------------------------------

    async def notify(self, method: str, params: Mapping[str, Any] | None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self.wire.send(_json(message))

    async def ask(self, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
        """Send the host a request of the front's own and wait for its answer."""
        self._asked_count += 1
        request_id = f"agentrt-{self._asked_count}"
        answers, answer = anyio.create_memory_object_stream[Response | ErrorReply](1)
        self._asked[request_id] = answers
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        try:
            await self.wire.send(_json(message))
            async with answer:
                try:
                    reply = await answer.receive()
                except anyio.EndOfStream:
                    raise HostRefused(f"the host did not answer {method}") from None
        finally:
            self._asked.pop(request_id, None)
        if isinstance(reply, ErrorReply):
            raise HostRefused(str(reply.error.get("message")))
        return dict(reply.result)

    # -- the SDK's server, when a host needs it ------------------------------------

    async def _to_sdk(self, message: Message) -> None:
        from mcp.shared.message import SessionMessage

        if self._sdk is None:
            self._sdk = await self._start_sdk()
        await self._sdk.send(SessionMessage(model_of(message)))

    async def _start_sdk(self) -> MemoryObjectSendStream[SessionMessage | Exception]:
        import mcp_types as types
        from mcp.shared.message import SessionMessage

        if self._initialize is None and not self._modern:
            self._sdk_only = True  # the SDK's server then answers the handshake too
        log_line(self.log, "agentrt proxy: loading the MCP SDK's server for this host")
        server = self.handlers.server()
        to_server, received = anyio.create_memory_object_stream[SessionMessage | Exception](16)
        sent, from_server = anyio.create_memory_object_stream[SessionMessage](16)

        async def relay() -> None:
            async with from_server:
                async for item in from_server:
                    message = item.message
                    replayed = isinstance(message, (types.JSONRPCResponse, types.JSONRPCError))
                    if replayed and message.id == _REPLAYED_ID:  # type: ignore[union-attr]
                        continue  # its answer to the `initialize` told again
                    await self.wire.outgoing.send(message)

        assert self._group is not None
        from ._live import initialization_options

        self._group.start_soon(server.run, received, sent, initialization_options(server))
        self._group.start_soon(relay)
        if self._opening is not None:
            # The era is the first request's: a `server/discover` under the opening
            # request's envelope opens the SDK's server in it (its answer is not passed on).
            meta = (self._opening.params or {}).get("_meta")
            discover = Request(_REPLAYED_ID, "server/discover", {"_meta": meta})
            await to_server.send(SessionMessage(model_of(discover)))
        elif self._initialize is not None:
            first = Request(_REPLAYED_ID, "initialize", self._initialize.params)
            await to_server.send(SessionMessage(model_of(first)))
            if self._initialized:
                done = Notification("notifications/initialized")
                await to_server.send(SessionMessage(model_of(done)))
        return to_server


async def answered_plainly(request: Any, handler: _Handler, context: Any, log: IO[str]) -> bytes:
    """`answered` for the stdio front and the HTTP front's 2025 sessions (`request` a
    `_plain.Request` or the SDK's `JSONRPCRequest`): the params checked and the result
    shaped by `_plain` where it decides, by the SDK's models where it does not."""
    typed = checked_params(request.method, request.params)
    if typed is UNDECIDED:
        import mcp_types as types

        typed = _typed_by_models(request, getattr(types, _PARAMS_MODELS[request.method]))
        if isinstance(typed, bytes):
            return typed  # the refusal
    return await _handled(request, handler, context, typed, log)


def _typed_by_models(request: Any, params_type: type[BaseModel]) -> Any:
    """The request's params checked for its method at a handshake-era version and typed, as
    the SDK's runner does; the `-32602` answer (bytes) where the models refuse them."""
    from pydantic import ValidationError

    params = request.params
    try:
        _check(request.method, params)
        return params_type.model_validate({} if params is None else params, by_name=False)
    except ValidationError:
        return _error(request.id, INVALID_PARAMS, "Invalid request parameters", "")


async def _handled(
    request: Any, handler: _Handler, context: Any, typed: Any, log: IO[str]
) -> bytes:
    method = request.method
    try:
        result = await handler(context, typed)
    except Exception as exc:
        log_line(log, f"agentrt proxy: the handler of {method} failed: {exc!r}")
        # The SDK's dispatcher answers an unexpected failure with code 0 and its text.
        return _error(request.id, 0, str(exc))
    shaped = shaped_result(method, result) if isinstance(result, dict) else UNDECIDED
    if shaped is UNDECIDED:
        from pydantic import ValidationError

        try:
            shaped = _shaped(method, result)
        except ValidationError:
            return _error(request.id, INTERNAL_ERROR, "Handler returned an invalid result")
    return _json({"jsonrpc": "2.0", "id": request.id, "result": shaped})


def front_methods(handlers: Handlers) -> dict[str, _Handler]:
    """The methods every front answers itself, and their handlers (a 2026-07-28 front
    adds the era's own: `_modern.modern_methods`)."""
    return {
        "ping": pong,
        "tools/list": handlers._list_tools,
        "tools/call": handlers._call_tool,
        "prompts/list": handlers._list_prompts,
        "resources/list": handlers._list_resources,
        "resources/templates/list": handlers._list_resource_templates,
    }


async def pong(ctx: Any, params: Any) -> dict[str, Any]:
    """`ping`'s handler, every front's: an empty result."""
    return {}


def dumped(result: Any) -> dict[str, Any]:
    """A handler's result as the SDK's runner dumps it before shaping it (every front's)."""
    if result is None:
        return {}
    if isinstance(result, dict):
        return dict(result)
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)  # type: ignore[no-any-return]
