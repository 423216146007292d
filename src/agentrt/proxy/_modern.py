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
  the SDK's own per-version checks), then the handler's params model: in
  plain JSON by `_modern_plain` for the shapes it proves the models treat
  alike, by the models for any other (decision 0062: the models cost 0.5 s
  of CPU to import, which a host of this era otherwise waited for);
- `Handlers`' own method run with a context of the envelope's identity
  (`ModernContext`: the host's capabilities, its progress token, log lines
  only at the level its request asked for, no requests to the host: a
  server's question rides the call's `input_required` result);
- the result shaped by the era's wire type (`_modern_plain` first, as
  above), `resultType` filled in, the `serverInfo` stamp put in `_meta`.

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
from typing import IO, TYPE_CHECKING, Any, Final, Protocol

from . import _modern_plain as plain
from ._dispatch import (
    HostRefused,
    _error,
    _json,
    _progress_token,
    dumped,
    front_methods,
    log_params,
    progress_params,
)
from ._handlers import INSTRUCTIONS, NAME, VERSION, Handlers
from ._listen import ListenRefused
from ._log import log_line
from ._plain import INTERNAL_ERROR, INVALID_PARAMS, UNDECIDED

if TYPE_CHECKING:
    from types import ModuleType

    import mcp_types as types

__all__ = [
    "MODERN_METHODS",
    "PARAMS_MODELS",
    "Envelope",
    "ModernContext",
    "Notify",
    "answer",
    "answered",
    "discover",
    "modern_methods",
]

_Handler = Callable[[Any, Any], Awaitable[Any]]

# What the SDK's server stamps on every result of the era (`Server.server_info_stamp`).
_SERVER_INFO: Final = {"name": NAME, "version": VERSION}

# The era's result types the core vocabulary owns (`mcp_types.CORE_RESULT_TYPES`).
_CORE_RESULT_TYPES: Final = frozenset({"complete", "input_required"})


class Notify(Protocol):
    async def __call__(self, method: str, params: Mapping[str, Any] | None) -> None: ...


def _wire() -> ModuleType:
    """`mcp_types.methods`: imported when a request of the era is one only the models may
    judge (`_modern_plain` decides the others)."""
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
            INVALID_PARAMS,
            "params._meta must be an object carrying the required "
            f"{plain.PROTOCOL_VERSION_META_KEY!r} and {plain.CLIENT_CAPABILITIES_META_KEY!r} "
            "envelope keys",
        )
    required = (plain.PROTOCOL_VERSION_META_KEY, plain.CLIENT_CAPABILITIES_META_KEY)
    if missing := [key for key in required if key not in meta]:
        return _Rejected(
            INVALID_PARAMS,
            f"params._meta is missing the required envelope key(s): {', '.join(missing)}",
        )
    version = meta[plain.PROTOCOL_VERSION_META_KEY]
    if not isinstance(version, str):
        return _Rejected(INVALID_PARAMS, "the protocol-version envelope value must be a string")
    if version not in plain.MODERN_PROTOCOL_VERSIONS:
        data = {"supported": list(plain.MODERN_PROTOCOL_VERSIONS), "requested": version}
        return _Rejected(plain.UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version", data)
    return Envelope(
        version, meta.get(plain.CLIENT_INFO_META_KEY), meta[plain.CLIENT_CAPABILITIES_META_KEY]
    )


def _typed(model_name: str, raw: Any) -> Any:
    """An envelope value as the SDK's `Connection.from_envelope` reads it (the model named):
    mis-shaped is absent."""
    import mcp_types as types
    from pydantic import ValidationError

    try:
        return getattr(types, model_name).model_validate(raw, by_name=False)
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
        # The envelope's identity as the host sent it where both eras' models take it as it
        # is, else as the models read it (the readers take either: `_plain.field`).
        info = plain.client_info(route.client_info)
        capabilities = plain.client_capabilities(route.client_capabilities)
        self.client_capabilities: Any = capabilities
        self.client_params: Any = None
        if info is UNDECIDED or capabilities is UNDECIDED:
            self._typed_identity(route)
        elif info is not None:
            self.client_params = {
                "protocolVersion": route.protocol_version,
                "capabilities": capabilities,
                "clientInfo": info,
            }
        # Log lines only at or above the level this request asked for (none if it asked none).
        asked = meta.get(plain.LOG_LEVEL_META_KEY) if isinstance(meta, Mapping) else None
        levels = plain.LOG_LEVELS
        self._log_levels = levels[levels.index(asked) :] if asked in levels else ()
        self._request_outbound = self

    def _typed_identity(self, route: Envelope) -> None:
        info = _typed("Implementation", route.client_info)
        capabilities = _typed("ClientCapabilities", route.client_capabilities)
        self.client_capabilities = capabilities
        if info is not None and capabilities is not None:
            import mcp_types as types

            self.client_params = types.InitializeRequestParams(
                protocol_version=route.protocol_version, capabilities=capabilities, client_info=info
            )

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

    async def send_frame(self, method: str, params: dict[str, Any]) -> None:
        """A frame of a `subscriptions/listen` stream (`_listen.py`), as the SDK writes it."""
        await self._notify(method, params)

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


# Each method's params model (`mcp_types`' names), for what `_modern_plain` leaves to the
# models.
PARAMS_MODELS: Final = {
    "server/discover": "RequestParams",
    "ping": "RequestParams",
    "tools/list": "PaginatedRequestParams",
    "tools/call": "CallToolRequestParams",
    "prompts/list": "PaginatedRequestParams",
    "resources/list": "PaginatedRequestParams",
    "resources/templates/list": "PaginatedRequestParams",
    "subscriptions/listen": "SubscriptionsListenRequestParams",
}


MODERN_METHODS: Final = frozenset(PARAMS_MODELS)
"""The methods of a 2026-07-28 connection the front answers (`ping` is no method of the
era: answered, as by the SDK, with `Method not found`)."""


def modern_methods(handlers: Handlers) -> dict[str, tuple[str, _Handler]]:
    """Each method the front answers in the era: the name of its params model and its
    handler."""
    answering: dict[str, _Handler] = {
        **front_methods(handlers),
        "server/discover": discover,
        "subscriptions/listen": handlers._host_events().listen,
    }
    return {method: (PARAMS_MODELS[method], handler) for method, handler in answering.items()}


async def discover(ctx: Any, params: Any) -> dict[str, Any]:
    """`server/discover` as the SDK's server answers it for `Handlers.server()`: what it
    serves at the era (list changes told on listen streams; logging and completions)."""
    return plain.discover_result(INSTRUCTIONS)


class _Refused(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


async def answered(
    request: Any,  # `_plain.Request` (stdio) or `types.JSONRPCRequest` (HTTP)
    params_type: str,
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
    params_type: str,
    handler: _Handler,
    notify: Notify,
    log: IO[str],
    http_request: Any = None,
) -> dict[str, Any]:
    """The JSON-RPC answer to a 2026-07-28 request whose envelope passed the ladder, as
    `ServerRunner._on_request` and the modern entries' error mapping make it: the request
    checked and the result shaped by `_modern_plain` where it decides, by the era's models
    (`params_type` names the handler's) where it does not."""
    method, params = request.method, request.params
    try:
        if method in plain.NOT_OF_THE_ERA:
            raise _Refused(plain.METHOD_NOT_FOUND, "Method not found", method)
        typed = plain.checked_request(method, params)
        if typed is UNDECIDED:
            typed = _typed_by_models(method, route.protocol_version, params, params_type)
        context = ModernContext(request, route, notify, http_request)
        result = await handler(context, typed)
        shaped = _shaped(method, route.protocol_version, result)
    except (_Refused, ListenRefused) as refused:
        return _failed(request.id, refused.code, refused.message, refused.data)
    except Exception as exc:
        if _is_validation_error(exc):
            return _failed(request.id, INVALID_PARAMS, "Invalid request parameters", "")
        error = _sdk_error(exc)
        if error is not None:
            return _failed(request.id, *error)
        log_line(log, f"agentrt proxy: the handler of {method} failed: {exc!r}")
        # The SDK's modern entries answer an unexpected failure with a generic error.
        return _failed(request.id, INTERNAL_ERROR, "Internal server error")
    return {"jsonrpc": "2.0", "id": request.id, "result": shaped}


def _typed_by_models(method: str, version: str, params: Any, params_type: str) -> Any:
    """The request checked against the era's wire type, then typed by its handler's params
    model, as the SDK's runner does (a `ValidationError` where they refuse it)."""
    import mcp_types as types

    try:
        _wire().validate_client_request(method, version, params)
    except KeyError:
        raise _Refused(plain.METHOD_NOT_FOUND, "Method not found", method) from None
    model = getattr(types, params_type)
    return model.model_validate({} if params is None else params, by_name=False)


def _is_validation_error(exc: Exception) -> bool:
    """Whether `exc` is pydantic's `ValidationError` (loaded only if pydantic is)."""
    core = sys.modules.get("pydantic_core")
    return core is not None and isinstance(exc, core.ValidationError)


def _failed(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
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


def _shaped(method: str, version: str, result: Any) -> dict[str, Any]:
    """`ServerRunner._serialize` at a 2026-07-28 version (the proxy sets no cache hints
    on the server: its lists carry their own, decision 0038)."""
    shaped = dumped(result)
    result_type = shaped.get("resultType")
    if not isinstance(result_type, str) or result_type in _CORE_RESULT_TYPES:
        surface = plain.shaped_result(method, shaped)
        if surface is UNDECIDED:
            try:
                surface = _wire().serialize_server_result(method, version, shaped)
            except Exception as exc:
                if _is_validation_error(exc):
                    raise _Refused(INTERNAL_ERROR, "Handler returned an invalid result") from None
                raise
        assert isinstance(surface, dict)
        shaped = surface
    if shaped.get("resultType") is None:
        shaped["resultType"] = "complete"
    stamp = plain.SERVER_INFO_META_KEY
    meta = shaped.get("_meta")
    if meta is None:
        shaped["_meta"] = {stamp: dict(_SERVER_INFO)}
    elif isinstance(meta, dict) and meta.get(stamp) is None:
        shaped["_meta"] = {**meta, stamp: dict(_SERVER_INFO)}
    return shaped
