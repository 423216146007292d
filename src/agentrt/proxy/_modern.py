"""The 2026-07-28 era answered by the stdio front, without the SDK's server (decision 0052).

A host on the 2026-07-28 revision sends no `initialize`: every request
carries its own envelope in `_meta` (protocol version, client capabilities,
client info).  Claude Code opens every stdio server this way
(`server/discover`, then the listings and `tools/call`).  `answered` answers
such a request as the SDK's modern stream answers it (`mcp.server.runner`:
`_serve_modern_stream`, `ServerRunner._on_request` and `_serialize`), step
for step and with the same codes and messages:

- the envelope checked by the SDK's ladder (`mcp.shared.inbound.
  classify_inbound_request` without headers, as over stdio; copied in
  `_classify`, because importing any `mcp.*` module loads the whole SDK —
  a test holds the two equal over the envelopes that matter);
- the request checked against the era's wire type (`mcp_types.methods`,
  the SDK's own per-version checks: 0.1 s of CPU and 3 MiB to import, loaded
  only for a connection of this era), then the handler's params model;
- `Handlers`' own method run with a context of the envelope's identity
  (`ModernContext`: the host's capabilities, its progress token, log lines
  only at the level its request asked for, no requests to the host: a
  server's question rides the call's `input_required` result);
- the result shaped by the era's wire type, `resultType` filled in, the
  `serverInfo` stamp put in `_meta`.

A `subscriptions/listen` stream is served by the proxy's own `HostEvents`
(`_listen.py`, which the SDK's server is handed too), run as a call is run, so
the host's `notifications/cancelled` ends it.

Every other method of the era (`prompts/get`,
`resources/read`, `completion/complete`, an `initialize` on such a
connection) still goes to the SDK's server.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Final, Protocol, get_args

import mcp_types as types
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

from ._dispatch import (
    HostRefused,
    _error,
    _json,
    _progress_token,
    dumped,
    log_params,
    pong,
    progress_params,
)
from ._handlers import INSTRUCTIONS, NAME, VERSION, Handlers
from ._listen import ListenRefused
from ._log import log_line

if TYPE_CHECKING:
    from types import ModuleType

__all__ = [
    "MODERN_METHODS",
    "Envelope",
    "ModernContext",
    "Notify",
    "answer",
    "answered",
    "discover",
    "modern_methods",
]

_Handler = Callable[[Any, Any], Awaitable[Any]]

# The wire's levels, lowest first (`mcp.server.connection`'s order).
_LOG_LEVELS: Final = get_args(types.LoggingLevel)

# What the SDK's server stamps on every result of the era (`Server.server_info_stamp`).
_SERVER_INFO: Final = {"name": NAME, "version": VERSION}

MODERN_METHODS: Final = frozenset(
    {
        "server/discover",
        "ping",
        "tools/list",
        "tools/call",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
        "subscriptions/listen",
    }
)
"""The methods of a 2026-07-28 connection the front answers (`ping` is no method of the
era: answered, as by the SDK, with `Method not found`)."""


class Notify(Protocol):
    async def __call__(self, method: str, params: Mapping[str, Any] | None) -> None: ...


def _wire() -> ModuleType:
    """`mcp_types.methods`: imported when a connection of the era first needs it."""
    import mcp_types.methods as wire

    return wire


@dataclass(frozen=True, slots=True)
class Envelope:
    """A request's envelope that passed the ladder (the SDK's `InboundModernRoute`)."""

    protocol_version: str
    client_info: Any
    client_capabilities: Any


@dataclass(frozen=True, slots=True)
class _Rejected:
    code: int
    message: str
    data: Any = None


def _classify(params: Mapping[str, Any] | None) -> Envelope | _Rejected:
    """`mcp.shared.inbound.classify_inbound_request` for a request without headers."""
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    if not isinstance(meta, Mapping):
        return _Rejected(
            types.INVALID_PARAMS,
            "params._meta must be an object carrying the required "
            f"{types.PROTOCOL_VERSION_META_KEY!r} and {types.CLIENT_CAPABILITIES_META_KEY!r} "
            "envelope keys",
        )
    required = (types.PROTOCOL_VERSION_META_KEY, types.CLIENT_CAPABILITIES_META_KEY)
    if missing := [key for key in required if key not in meta]:
        return _Rejected(
            types.INVALID_PARAMS,
            f"params._meta is missing the required envelope key(s): {', '.join(missing)}",
        )
    version = meta[types.PROTOCOL_VERSION_META_KEY]
    if not isinstance(version, str):
        return _Rejected(
            types.INVALID_PARAMS, "the protocol-version envelope value must be a string"
        )
    if version not in MODERN_PROTOCOL_VERSIONS:
        data = {"supported": list(MODERN_PROTOCOL_VERSIONS), "requested": version}
        return _Rejected(types.UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version", data)
    return Envelope(
        version, meta.get(types.CLIENT_INFO_META_KEY), meta[types.CLIENT_CAPABILITIES_META_KEY]
    )


def _typed(model: type[BaseModel], raw: Any) -> Any:
    """An envelope value as the SDK's `Connection.from_envelope` reads it: mis-shaped is absent."""
    try:
        return model.model_validate(raw, by_name=False)
    except ValidationError:
        return None


class ModernSession:
    """The host of one 2026-07-28 request as a call run by the front sees it: the part of
    the SDK's `ServerSession` (over a born-ready `Connection.from_envelope`) the proxy's
    call path uses."""

    def __init__(
        self, route: Envelope, meta: Any, progress_token: types.ProgressToken | None, notify: Notify
    ) -> None:
        self._notify = notify
        self._progress_token = progress_token
        info = _typed(types.Implementation, route.client_info)
        capabilities = _typed(types.ClientCapabilities, route.client_capabilities)
        self.client_capabilities: types.ClientCapabilities | None = capabilities
        self.client_params: types.InitializeRequestParams | None = None
        if info is not None and capabilities is not None:
            self.client_params = types.InitializeRequestParams(
                protocol_version=route.protocol_version, capabilities=capabilities, client_info=info
            )
        # Log lines only at or above the level this request asked for (none if it asked none).
        asked = meta.get(types.LOG_LEVEL_META_KEY) if isinstance(meta, Mapping) else None
        self._log_levels = _LOG_LEVELS[_LOG_LEVELS.index(asked) :] if asked in _LOG_LEVELS else ()
        self._request_outbound = self

    @property
    def can_send_request(self) -> bool:
        return False  # the era has no requests to the host

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        if self._progress_token is None:
            return
        params = progress_params(self._progress_token, progress, total, message)
        await self._notify("notifications/progress", params)

    async def send_log_message(
        self,
        level: str,
        data: Any,
        logger: str | None = None,
        related_request_id: types.RequestId | None = None,
    ) -> None:
        if level in self._log_levels:
            await self._notify("notifications/message", log_params(level, data, logger))

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: Any = None
    ) -> dict[str, Any]:
        # As the SDK's `NoBackChannelError`: the question rides the call's result instead.
        raise HostRefused(f"a host on the 2026-07-28 revision cannot be sent {method}")

    async def send_notification(self, notification: Any, related_request_id: Any = None) -> None:
        """A frame of a `subscriptions/listen` stream (`_listen.py`), as the SDK writes it."""
        params = notification.params
        dumped = (
            None
            if params is None
            else params.model_dump(by_alias=True, mode="json", exclude_none=True)
        )
        await self._notify(notification.method, dumped)

    # A list change: in this era told only on a `subscriptions/listen` stream the host
    # opened, so dropped here, as the SDK's connection channel (`NotifyOnlyOutbound`)
    # drops it; the host stays a listener, as with the SDK's session.
    async def send_tool_list_changed(self) -> None:
        return None

    async def send_prompt_list_changed(self) -> None:
        return None

    async def send_resource_list_changed(self) -> None:
        return None


class ModernContext:
    """What a handler reads of a 2026-07-28 request: the shape of the SDK's
    `ServerRequestContext` built from the request's envelope."""

    def __init__(self, request: Any, route: Envelope, notify: Notify, http_request: Any) -> None:
        params = request.params
        self.meta = params.get("_meta") if params else None
        self.session = ModernSession(route, self.meta, _progress_token(params), notify)
        self.request = http_request
        self.request_id = request.id
        self.method = request.method
        self.params = params
        self.protocol_version = route.protocol_version


def modern_methods(handlers: Handlers) -> dict[str, tuple[type[BaseModel], _Handler]]:
    """Each method the front answers in the era: its params model and its handler."""
    paginated = types.PaginatedRequestParams
    return {
        "server/discover": (types.RequestParams, discover),
        "ping": (types.RequestParams, pong),
        "tools/list": (paginated, handlers._list_tools),
        "tools/call": (types.CallToolRequestParams, handlers._call_tool),
        "prompts/list": (paginated, handlers._list_prompts),
        "resources/list": (paginated, handlers._list_resources),
        "resources/templates/list": (paginated, handlers._list_resource_templates),
        "subscriptions/listen": (
            types.SubscriptionsListenRequestParams,
            handlers._host_events().listen,
        ),
    }


async def discover(ctx: Any, params: Any) -> types.DiscoverResult:
    """`server/discover` as the SDK's server answers it for `Handlers.server()`: what it
    serves at the era (list changes told on listen streams; logging and completions)."""
    capabilities = {
        "prompts": {"listChanged": True},
        "resources": {"subscribe": True, "listChanged": True},
        "tools": {"listChanged": True},
        "logging": {},
        "completions": {},
    }
    return types.DiscoverResult(
        supported_versions=list(MODERN_PROTOCOL_VERSIONS),
        capabilities=types.ServerCapabilities.model_validate(capabilities),
        instructions=INSTRUCTIONS,
    )


class _Refused(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


async def answered(
    request: Any,  # `_plain.Request` (stdio) or `types.JSONRPCRequest` (HTTP)
    params_type: type[BaseModel],
    handler: _Handler,
    notify: Notify,
    log: IO[str],
) -> bytes:
    """One 2026-07-28 request answered as the SDK's modern stream answers it."""
    route = _classify(request.params)
    if isinstance(route, _Rejected):
        return _error(request.id, route.code, route.message, route.data)
    return _json(await answer(request, route, params_type, handler, notify, log))


async def answer(
    request: Any,
    route: Envelope,
    params_type: type[BaseModel],
    handler: _Handler,
    notify: Notify,
    log: IO[str],
    http_request: Any = None,
) -> dict[str, Any]:
    """The JSON-RPC answer to a 2026-07-28 request whose envelope passed the ladder, as
    `ServerRunner._on_request` and the modern entries' error mapping make it."""
    method, params = request.method, request.params
    version = route.protocol_version
    wire = _wire()
    try:
        try:
            wire.validate_client_request(method, version, params)
        except KeyError:
            raise _Refused(types.METHOD_NOT_FOUND, "Method not found", method) from None
        typed = params_type.model_validate({} if params is None else params, by_name=False)
        context = ModernContext(request, route, notify, http_request)
        result = await handler(context, typed)
        shaped = _shaped(wire, method, version, result)
    except (_Refused, ListenRefused) as refused:
        return _failed(request.id, refused.code, refused.message, refused.data)
    except ValidationError:
        return _failed(request.id, types.INVALID_PARAMS, "Invalid request parameters", "")
    except Exception as exc:
        error = _sdk_error(exc)
        if error is not None:
            return _failed(request.id, *error)
        log_line(log, f"agentrt proxy: the handler of {method} failed: {exc!r}")
        # The SDK's modern entries answer an unexpected failure with a generic error.
        return _failed(request.id, types.INTERNAL_ERROR, "Internal server error")
    return {"jsonrpc": "2.0", "id": request.id, "result": shaped}


def _failed(
    request_id: types.RequestId, code: int, message: str, data: Any = None
) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def _sdk_error(exc: Exception) -> tuple[int, str, Any] | None:
    """An `MCPError` a handler raised (loaded only if the SDK is): its code, message, data."""
    exceptions = sys.modules.get("mcp.shared.exceptions")
    if exceptions is None or not isinstance(exc, exceptions.MCPError):
        return None
    error = exc.error
    return error.code, error.message, error.data


def _shaped(wire: ModuleType, method: str, version: str, result: Any) -> dict[str, Any]:
    """`ServerRunner._serialize` at a 2026-07-28 version (the proxy sets no cache hints
    on the server: its lists carry their own, decision 0038)."""
    shaped = dumped(result)
    result_type = shaped.get("resultType")
    if not isinstance(result_type, str) or result_type in types.CORE_RESULT_TYPES:
        try:
            shaped = wire.serialize_server_result(method, version, shaped)
        except ValidationError:
            raise _Refused(types.INTERNAL_ERROR, "Handler returned an invalid result") from None
    if shaped.get("resultType") is None:
        shaped["resultType"] = "complete"
    meta = shaped.get("_meta")
    if meta is None:
        shaped["_meta"] = {types.SERVER_INFO_META_KEY: dict(_SERVER_INFO)}
    elif isinstance(meta, dict) and meta.get(types.SERVER_INFO_META_KEY) is None:
        shaped["_meta"] = {**meta, types.SERVER_INFO_META_KEY: dict(_SERVER_INFO)}
    return shaped
