"""The proxy's streamable HTTP sessions: a call that can send nothing else is answered in JSON.

The specification lets a server answer each POST carrying a request either
with `application/json` (the response alone) or with a `text/event-stream`
that may carry the request's notifications and the server's own requests
first; a client must accept both.  The SDK (2.3) makes that choice once per
session manager.  Here it is made per request: a `tools/call` is answered in
one JSON body when nothing else can be due to the host while it runs
(`QuietCalls`), every other request as the SDK answers it, on an SSE stream.

A JSON answer saves the SSE machinery (sse-starlette's tasks, a memory
stream per event) and, with the SDK's own client, a TCP connection per call:
that client closes an SSE response once it has read the result, before the
stream's end, so the connection cannot be reused; a JSON body is read whole
and its connection kept.

Private SDK code this depends on (checked against mcp 2.3.0):
`StreamableHTTPSessionManager._admit_session` (replaced, to build this
transport), and in `StreamableHTTPServerTransport` the request-stream table
`_request_streams`, `_read_stream_writer`, `_validate_accept_header`,
`_check_content_type`, `_validate_request_headers`,
`_terminate_unanswered_request`, `_clean_up_memory_streams`,
`_create_json_response` and `_create_error_response`.  The SDK's message
router is used unchanged: it queues every message related to a request on
that request's stream, where the JSON answer takes the response.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from functools import partial
from http import HTTPStatus
from typing import Any, Final
from uuid import uuid4

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.lowlevel import Server as LowLevelServer
from mcp.server.streamable_http import (
    REQUEST_STREAM_BUFFER_SIZE,
    EventMessage,
    StreamableHTTPServerTransport,
)
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import ServerMessageMetadata, SessionMessage
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

from .config import UpstreamConfig

__all__ = ["QuietCalls", "streamable_http_app"]

logger = logging.getLogger(__name__)

# The server-to-client requests a host can be asked during a call, by capability.
_ASKING_KINDS: Final = ("sampling", "elicitation", "roots")


class QuietCalls:
    """Which host requests can be answered in one JSON body: a `tools/call` during which
    nothing else can be sent to its host.

    That is a call without a `progressToken` (no progress is due), while no host has set a
    logging level (no server log is forwarded), to a tool whose server may not ask this
    host anything (the operator's `client_requests` rule refuses every kind the host
    declared).  Anything else is answered on an SSE stream, which can carry those first.
    """

    def __init__(
        self, server_of: Mapping[str, UpstreamConfig], log_level: Callable[[], str | None]
    ) -> None:
        self.server_of = server_of
        self.log_level = log_level

    def answer_alone(self, request: JSONRPCRequest, capabilities: Mapping[str, Any]) -> bool:
        if request.method != "tools/call" or self.log_level() is not None:
            return False
        params = request.params if isinstance(request.params, dict) else {}
        meta = params.get("_meta")
        if isinstance(meta, dict) and meta.get("progressToken") is not None:
            return False
        name = params.get("name")
        upstream = self.server_of.get(name) if isinstance(name, str) else None
        if upstream is None:
            return True  # the proxy's own tool, or none: answered without any server
        return not any(
            upstream.forwards(kind) != "refuse" and capabilities.get(kind) is not None
            for kind in _ASKING_KINDS
        )


class _Transport(StreamableHTTPServerTransport):
    """One session's transport: the SDK's, except that a quiet call is answered in JSON."""

    def __init__(self, quiet: QuietCalls, **settings: Any) -> None:
        super().__init__(**settings)
        self.quiet = quiet
        # What the host declared in its initialize request (never changes in a session).
        self.host_capabilities: Mapping[str, Any] = {}

    async def _handle_post_request(
        self, scope: Scope, request: Request, receive: Receive, send: Send
    ) -> None:
        # Read once: starlette keeps the body, so the SDK's own handling reads it again free.
        message = _request_in(await request.body())
        if message is not None and message.method == "initialize":
            capabilities = (message.params or {}).get("capabilities")
            if isinstance(capabilities, dict):
                self.host_capabilities = capabilities
        if message is None or not self.quiet.answer_alone(message, self.host_capabilities):
            await super()._handle_post_request(scope, request, receive, send)
            return
        await self._answer_alone(message, scope, request, receive, send)

    async def _answer_alone(
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
        self._request_streams[request_id] = anyio.create_memory_object_stream[EventMessage](
            REQUEST_STREAM_BUFFER_SIZE
        )
        reader = self._request_streams[request_id][1]
        # No back channel: should the server ask the host anything after all, the SDK
        # refuses it (NoBackChannelError) instead of writing it where no one reads.
        metadata = ServerMessageMetadata(
            request_context=request,
            can_send_request=False,
            on_request_unanswered=partial(self._terminate_unanswered_request, message.id),
        )
        try:
            await writer.send(SessionMessage(message, metadata=metadata))
            while True:
                event = await reader.receive()
                if isinstance(event.message, JSONRPCResponse | JSONRPCError):
                    break
                # A notification for a call that expected none (a level set meanwhile):
                # a JSON body has no place for it, as in the SDK's JSON mode.
                logger.debug("dropped a message related to request %s", request_id)
            response = self._create_json_response(event.message)
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            response = self._create_error_response(
                "Session terminated before the request completed",
                HTTPStatus.INTERNAL_SERVER_ERROR,
                INTERNAL_ERROR,
            )
        finally:
            await self._clean_up_memory_streams(request_id)
        await response(scope, receive, send)


def _request_in(body: bytes) -> JSONRPCRequest | None:
    """The JSON-RPC request a POST body carries; None for anything else (the SDK answers it)."""
    try:
        message = jsonrpc_message_adapter.validate_python(json.loads(body), by_name=False)
    except (ValueError, RecursionError, ValidationError):
        return None
    return message if isinstance(message, JSONRPCRequest) else None


class _Sessions(StreamableHTTPSessionManager):
    """The SDK's session manager, building `_Transport`s."""

    def __init__(self, app: LowLevelServer[Any], quiet: QuietCalls, **settings: Any) -> None:
        super().__init__(app, **settings)
        self.quiet = quiet

    def _admit_session(self, requestor: AuthorizationContext | None) -> _Transport | None:
        # As the SDK's (mcp 2.3.0), with this module's transport.
        if self.max_sessions is not None and len(self._server_instances) >= self.max_sessions:
            return None
        transport = _Transport(
            self.quiet,
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
    server: LowLevelServer[Any], quiet: QuietCalls, security: TransportSecuritySettings
) -> Starlette:
    """The ASGI app serving `server` on /mcp, as `server.streamable_http_app` builds it."""
    sessions = _Sessions(server, quiet, security_settings=security)
    return Starlette(
        routes=[Route("/mcp", endpoint=StreamableHTTPASGIApp(sessions))],
        lifespan=lambda app: sessions.run(),
    )
