"""The proxy's streamable HTTP sessions: a request is answered in JSON unless it needs a stream.

The specification lets a server answer each POST carrying a request either
with `application/json` (the response alone) or with a `text/event-stream`
that carries the request's notifications and the server's own requests
first; a client must accept both.  The SDK (2.3) makes that choice once per
session manager, before the request runs.  Here it is made per request, by
what the request sends: its answer waits for the first message the server
has for it; when that is the response, it goes back as one JSON body; when
it is a progress notification, a log line or a request to the host (an
elicitation), the answer becomes an event stream carrying it and everything
after it, the response last.  A request that sends nothing for 15 seconds
becomes a stream too, with a comment every 15 seconds, as the SDK's streams
are kept alive.  `initialize` and every POST that is not a request are the
SDK's to answer, unchanged.

A JSON answer saves the SSE machinery (sse-starlette's tasks, a memory
stream per event) and, with the SDK's own client, a TCP connection per call:
that client closes an SSE response once it has read the result, before the
stream's end, so the connection cannot be reused; a JSON body is read whole
and its connection kept.

Private SDK code this depends on (checked against mcp 2.3.0):
`StreamableHTTPSessionManager._admit_session` (replaced, to build this
transport, with `_server_instances` and `_session_owners`), and in
`StreamableHTTPServerTransport` the request-stream table `_request_streams`,
`_read_stream_writer`, `_message_metadata`, `_validate_accept_header`,
`_check_content_type`, `_validate_request_headers`,
`_terminate_unanswered_request`, `_clean_up_memory_streams`,
`_create_json_response` and `_create_error_response`.  The SDK's message
router is used unchanged: it queues every message related to a request on
that request's stream, where the answer takes them.
"""

from __future__ import annotations

from functools import partial
from http import HTTPStatus
from typing import Any, Final
from uuid import uuid4

import anyio
import pydantic_core
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.lowlevel import Server as LowLevelServer
from mcp.server.streamable_http import (
    MCP_SESSION_ID_HEADER,
    REQUEST_STREAM_BUFFER_SIZE,
    EventMessage,
    StreamableHTTPServerTransport,
)
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import SessionMessage
from mcp_types import (
    INTERNAL_ERROR,
    JSONRPCError,
    JSONRPCRequest,
    JSONRPCResponse,
    jsonrpc_message_adapter,
)
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

__all__ = ["streamable_http_app"]

# How long a request may go without a message before its answer becomes an event stream
# with a comment every so often: sse-starlette's ping interval, which the SDK's streams use,
# so that a host or an intermediary reading with an idle timeout still sees bytes.
_KEEP_ALIVE_SECONDS: Final = 15.0
_PING: Final = b": ping\r\n\r\n"


class _Transport(StreamableHTTPServerTransport):
    """One session's transport: the SDK's, except how a request after `initialize` is answered."""

    async def _handle_post_request(
        self, scope: Scope, request: Request, receive: Receive, send: Send
    ) -> None:
        # Read once: starlette keeps the body, so the SDK's own handling reads it again free.
        message = _request_in(await request.body())
        if message is None or message.method == "initialize":
            # A notification, a response, a malformed body, or the request that opens the
            # session: the SDK answers them all (202, its errors, the session's id).
            await super()._handle_post_request(scope, request, receive, send)
            return
        await self._answer(message, scope, request, receive, send)

    async def _answer(
        self, message: JSONRPCRequest, scope: Scope, request: Request, receive: Receive, send: Send
    ) -> None:
        # The checks the SDK makes of any request POST, in its order and with its answers.
        if not await self._validate_accept_header(request, scope, send):
            return
        if not self._check_content_type(request):
            await self._create_error_response(
                "Unsupported Media Type: Content-Type must be application/json",
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            )(scope, receive, send)
            return
        if not await self._validate_request_headers(request, send):
            return
        writer = self._read_stream_writer
        if writer is None:  # connect() not entered: the session is not serving
            await self._create_error_response(
                "Session is not serving", HTTPStatus.INTERNAL_SERVER_ERROR, INTERNAL_ERROR
            )(scope, receive, send)
            return
        request_id = str(message.id)
        # The SDK's message router queues here everything related to this request: its
        # progress, its log lines, the server's requests to the host, and its response.
        self._request_streams[request_id] = anyio.create_memory_object_stream[EventMessage](
            REQUEST_STREAM_BUFFER_SIZE
        )
        reader = self._request_streams[request_id][1]
        metadata = self._message_metadata(
            request, on_request_unanswered=partial(self._terminate_unanswered_request, message.id)
        )
        try:
            await writer.send(SessionMessage(message, metadata=metadata))
            first = await _next(reader)
            if first is not None and isinstance(first.message, JSONRPCResponse | JSONRPCError):
                await self._create_json_response(first.message)(scope, receive, send)
            else:
                await self._stream(first, reader, send)
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            # The session ended (DELETE, expiry) before anything was sent for this request.
            await self._create_error_response(
                "Session terminated before the request completed",
                HTTPStatus.INTERNAL_SERVER_ERROR,
                INTERNAL_ERROR,
            )(scope, receive, send)
        finally:
            await self._clean_up_memory_streams(request_id)

    async def _stream(
        self,
        first: EventMessage | None,
        reader: MemoryObjectReceiveStream[EventMessage],
        send: Send,
    ) -> None:
        """Answer on an event stream: `first` (None: nothing yet, a keep-alive), then every
        message for the request until its response."""
        headers = [(b"content-type", b"text/event-stream"),
                   (b"cache-control", b"no-cache, no-transform"),
                   (b"connection", b"keep-alive"), (b"x-accel-buffering", b"no")]  # fmt: skip
        if self.mcp_session_id:
            headers.append((MCP_SESSION_ID_HEADER.encode(), self.mcp_session_id.encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        event = first
        while True:
            if event is None:
                await send({"type": "http.response.body", "body": _PING, "more_body": True})
            else:
                data = event.message.model_dump_json(by_alias=True, exclude_unset=True)
                frame = b"event: message\r\ndata: " + data.encode() + b"\r\n\r\n"
                final = isinstance(event.message, JSONRPCResponse | JSONRPCError)
                await send({"type": "http.response.body", "body": frame, "more_body": not final})
                if final:
                    return
            try:
                event = await _next(reader)
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                # The session ended mid-call: end the stream, as the SDK's does.
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return


async def _next(reader: MemoryObjectReceiveStream[EventMessage]) -> EventMessage | None:
    """The request's next message, or None when none came for `_KEEP_ALIVE_SECONDS`."""
    with anyio.move_on_after(_KEEP_ALIVE_SECONDS):
        return await reader.receive()
    return None


def _request_in(body: bytes) -> JSONRPCRequest | None:
    """The JSON-RPC request a POST body carries; None for anything else (the SDK answers it)."""
    try:
        # Parsed as the SDK's transport parses it, so both accept the same bodies.
        raw = pydantic_core.from_json(body)
        message = jsonrpc_message_adapter.validate_python(raw, by_name=False)
    except (ValueError, ValidationError):
        return None
    return message if isinstance(message, JSONRPCRequest) else None


class _Sessions(StreamableHTTPSessionManager):
    """The SDK's session manager, building `_Transport`s."""

    def _admit_session(self, requestor: AuthorizationContext | None) -> _Transport | None:
        # As the SDK's (mcp 2.3.0), with this module's transport.
        if self.max_sessions is not None and len(self._server_instances) >= self.max_sessions:
            return None
        transport = _Transport(
            mcp_session_id=uuid4().hex,
            is_json_response_enabled=False,
            event_store=self.event_store,
            security_settings=self.security_settings,
            retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout,
        )
        session_id = transport.mcp_session_id
        assert session_id is not None
        if requestor is not None:
            self._session_owners[session_id] = requestor
        self._server_instances[session_id] = transport
        return transport


def streamable_http_app(
    server: LowLevelServer[Any], security: TransportSecuritySettings
) -> Starlette:
    """The ASGI app serving `server` on /mcp, as `server.streamable_http_app` builds it."""
    sessions = _Sessions(server, security_settings=security)
    return Starlette(
        routes=[Route("/mcp", endpoint=StreamableHTTPASGIApp(sessions))],
        lifespan=lambda app: sessions.run(),
    )
