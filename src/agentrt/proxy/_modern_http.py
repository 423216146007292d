"""A 2026-07-28 POST answered by the HTTP front, without the SDK's per-request server path
(decision 0052).

Over streamable HTTP every request of the era is a single exchange: no
session, one JSON-RPC request in, one answer out.  The SDK's stateless entry
(`mcp.server._streamable_http_modern.handle_modern_request`) builds a
connection, a dispatch context and a server runner for each; `answer_post`
answers the front's methods (`_modern.MODERN_METHODS`) as that entry does,
step for step, with the SDK's own pure checks (`mcp.shared.inbound`: the
envelope ladder with the routing headers, `Mcp-Param-*` headers) and
`_modern.answer` for the request itself; and what the entry writes, it
writes: a JSON body with the status its table gives the error code, or —
when the call sends a notification first (progress, a log line the request
asked for) or runs past the keep-alive interval — an event stream with the
SDK's headers, pings and frames.  The host's disconnect cancels the call.

Whatever it does not take (another method, a notification, a body the
entry would refuse, a tool whose schema names an `x-mcp-header`) is left to
the SDK's entry: `answer_post` returns False before it has sent anything.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from typing import IO, Any, Final

import anyio
import mcp_types as types
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    InboundLadderRejection,
    classify_inbound_request,
    find_duplicated_routing_header,
)
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from . import _modern

__all__ = ["answer_post"]

# The SDK's entry's keep-alive: an answer not ready by then is sent as an event stream.
_SSE_PING_INTERVAL: Final = 15.0
_SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
]

Methods = Mapping[str, tuple[str, Callable[[Any, Any], Any]]]


def _dumps(message: Mapping[str, Any]) -> str:
    # As the SDK's entry writes a message: compact, ASCII-escaped.
    return json.dumps(message, separators=(",", ":"))


def _event(message: Mapping[str, Any]) -> bytes:
    return f"event: message\r\ndata: {_dumps(message)}\r\n\r\n".encode()


def _accepts(headers: Headers) -> tuple[bool, bool]:
    """`mcp.server.streamable_http.check_accept_headers`."""
    kinds = [part.strip().split(";")[0].strip().lower()
             for part in headers.get("accept", "").split(",")]  # fmt: skip
    wildcard = "*/*" in kinds
    return (
        wildcard or any(kind in ("application/json", "application/*") for kind in kinds),
        wildcard or any(kind in ("text/event-stream", "text/*") for kind in kinds),
    )


def _names_a_header(schema: Any) -> bool:
    """Whether a tool's input schema says `x-mcp-header` anywhere (then the SDK's entry
    checks the call's `Mcp-Param-*` headers against it)."""
    if isinstance(schema, Mapping):
        return "x-mcp-header" in schema or any(_names_a_header(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_names_a_header(item) for item in schema)
    return False


async def answer_post(
    methods: Methods,
    schema_of: Callable[[str], Any],
    scope: Scope,
    body: bytes,
    receive: Receive,
    send: Send,
    http_request: Any,
    log: IO[str],
) -> bool:
    """Answer one POST of the 2026-07-28 era if it is the front's; False (nothing sent)
    if the SDK's entry is to answer it."""
    headers = Headers(scope=scope)
    if scope["method"] != "POST":
        return False
    if not headers.get("content-type", "").lower().startswith("application/json"):
        return False
    has_json, has_sse = _accepts(headers)
    if not (has_json and has_sse):
        return False
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError):
        return False
    if not isinstance(decoded, dict) or "id" not in decoded:
        return False
    if decoded.get("method") not in methods:
        return False
    try:
        request = types.JSONRPCRequest.model_validate(decoded)
    except ValidationError:
        return False
    if find_duplicated_routing_header(headers.items()) is not None:
        return False
    route = classify_inbound_request(decoded, headers=dict(headers))
    if isinstance(route, InboundLadderRejection):
        return False
    if request.method == "tools/call":
        params = request.params or {}
        name = params.get("name")
        if isinstance(name, str) and _names_a_header(schema_of(name)):
            return False
    params_type, handler = methods[request.method]
    envelope = _modern.Envelope(
        route.protocol_version, route.client_info, route.client_capabilities
    )
    await _exchange(request, envelope, params_type, handler, receive, send, http_request, log)
    return True


async def _exchange(
    request: types.JSONRPCRequest,
    route: _modern.Envelope,
    params_type: str,
    handler: Callable[[Any, Any], Any],
    receive: Receive,
    send: Send,
    http_request: Any,
    log: IO[str],
) -> None:
    """The SDK's entry's event-stream mode: the answer as JSON if it comes first, else an
    event stream from the first notification (or the keep-alive interval) on."""
    sink, events = anyio.create_memory_object_stream[bytes](0)
    answered: list[dict[str, Any]] = []

    async def notify(method: str, params: Mapping[str, Any] | None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = dict(params)
        # The answer's stream closed: dropped, as by the SDK.
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await sink.send(_event(message))

    async def run() -> None:
        async with sink:
            answered.append(
                await _modern.answer(
                    request, route, params_type, handler, notify, log, http_request
                )
            )

    async def watch_disconnect(scope: anyio.CancelScope) -> None:
        while (await receive()).get("type") != "http.disconnect":
            pass
        scope.cancel()

    async with events, anyio.create_task_group() as group:
        group.start_soon(run)
        group.start_soon(watch_disconnect, group.cancel_scope)
        event: bytes | None = None
        done = False
        with anyio.move_on_after(_SSE_PING_INTERVAL):
            try:
                event = await events.receive()
            except anyio.EndOfStream:
                done = True
        if done:
            await _write(answered[0], send)
        else:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            while not done:
                chunk = event or b": ping\r\n\r\n"
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                event = None
                with anyio.move_on_after(_SSE_PING_INTERVAL):
                    try:
                        event = await events.receive()
                    except anyio.EndOfStream:
                        done = True
            final = _event(answered[0])
            await send({"type": "http.response.body", "body": final, "more_body": False})
        group.cancel_scope.cancel()


async def _write(message: Mapping[str, Any], send: Send) -> None:
    """A JSON answer with the status the SDK's table gives its error code (200 otherwise),
    written as starlette's `Response` writes it."""
    error = message.get("error")
    status = ERROR_CODE_HTTP_STATUS.get(error["code"], 200) if isinstance(error, dict) else 200
    body = _dumps(message).encode("utf-8")
    headers = [
        (b"content-length", str(len(body)).encode("latin-1")),
        (b"content-type", b"application/json"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
