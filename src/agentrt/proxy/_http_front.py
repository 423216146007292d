"""The HTTP front: a streamable HTTP session's calls and listings, answered without the
SDK's per-request server machinery (decision 0046).

Once the SDK's server has answered a session's `initialize`, the session's
`tools/call`, `tools/list`, `prompts/list`, `resources/list`,
`resources/templates/list` and `ping` are answered here as the stdio front
answers them (`_dispatch`, decision 0043): the params checked against the
wire type of the handshake era, the handler's params model, `Handlers`' own
method, the result shaped as the SDK shapes it, the JSON-RPC reply written
once.  The session's `_Waiter` for the request carries the reply, so the
POST is answered in one JSON body, or as an event stream when a progress
notification or a question to the host comes first, exactly as for an
answer of the SDK's server.  Every other method still goes to the SDK's
server.  A POST of the 2026-07-28 era has its discover, listings and call
answered by `_modern_http` (`answer_modern`, decision 0052); the rest of the
era goes to the SDK's stateless entry.

What a call needs of its host keeps working (`HTTPContext`): progress under
the host's token on the request's stream, log lines on the session's
standalone stream (where the SDK's session sends them in the handshake
era), the host's `notifications/cancelled` (the request is answered
"Request cancelled", as the SDK answers a request that settled without a
response), and a server's questions (elicitation, sampling, roots), sent on
the request's stream as the front's own requests (id `agentrt-N`) and
answered by the host's POSTed responses to them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import IO, TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from pydantic import ValidationError

from ._dispatch import (
    HostRefused,
    _progress_token,
    answered_plainly,
    front_methods,
    log_params,
    negotiated,
    progress_params,
)
from ._handlers import Handlers

if TYPE_CHECKING:
    from ._streamable import _Request, _Session

__all__ = ["HTTPContext", "HTTPFront", "Handler", "Reply"]

Handler = Callable[[Any, Any], Awaitable[Any]]


class Reply:
    """A JSON-RPC response the front has written: the body of the POST's answer."""

    __slots__ = ("body",)

    def __init__(self, body: bytes) -> None:
        self.body = body


class HTTPHostSession:
    """The host as a call the HTTP front runs sees it: the part of the SDK's
    `ServerSession` the proxy's call path uses."""

    def __init__(
        self, session: _Session, request_id: types.RequestId, token: types.ProgressToken | None
    ) -> None:
        self._session = session
        self._request_id = request_id
        self._progress_token = token
        # The SDK's session sends a request-scoped request through this; so does the proxy.
        self._request_outbound = self

    @property
    def client_params(self) -> types.InitializeRequestParams | None:
        client: types.InitializeRequestParams | None = self._session.client
        return client

    @property
    def client_capabilities(self) -> types.ClientCapabilities | None:
        client = self.client_params
        return client.capabilities if client is not None else None

    @property
    def can_send_request(self) -> bool:
        return True

    async def _send(
        self, message: types.JSONRPCMessage, related: types.RequestId | None = None
    ) -> None:
        metadata = None if related is None else ServerMessageMetadata(related_request_id=related)
        await self._session.route(SessionMessage(message, metadata=metadata))

    async def _notify(
        self, method: str, params: dict[str, Any] | None, related: types.RequestId | None
    ) -> None:
        notification = types.JSONRPCNotification(jsonrpc="2.0", method=method, params=params)
        await self._send(notification, related)

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        if self._progress_token is None:
            return  # the host asked for none (as the SDK's session does)
        params = progress_params(self._progress_token, progress, total, message)
        await self._notify("notifications/progress", params, self._request_id)

    async def send_log_message(
        self,
        level: str,
        data: Any,
        logger: str | None = None,
        related_request_id: types.RequestId | None = None,
    ) -> None:
        # The handshake era's channel: the standalone stream, unless a request is named.
        params = log_params(level, data, logger)
        await self._notify("notifications/message", params, related_request_id)

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: Any = None
    ) -> dict[str, Any]:
        """Ask the host on this request's stream and wait for its POSTed response."""
        session = self._session
        session.asked_count += 1
        asked_id = f"agentrt-{session.asked_count}"
        answers, answer = anyio.create_memory_object_stream[
            types.JSONRPCResponse | types.JSONRPCError
        ](1)
        session.asked[asked_id] = answers
        request = types.JSONRPCRequest(
            jsonrpc="2.0", id=asked_id, method=method, params=dict(params or {}) or None
        )
        try:
            await self._send(request, self._request_id)
            async with answer:
                try:
                    reply = await answer.receive()
                except anyio.EndOfStream:
                    raise HostRefused(f"the host did not answer {method}") from None
        finally:
            session.asked.pop(asked_id, None)
        if isinstance(reply, types.JSONRPCError):
            raise HostRefused(reply.error.message)
        return dict(reply.result)

    # What the host may see of a list changed (`_live.HostListeners`): on the standalone
    # stream, as the SDK's session tells it.
    async def send_tool_list_changed(self) -> None:
        await self._notify("notifications/tools/list_changed", None, None)

    async def send_prompt_list_changed(self) -> None:
        await self._notify("notifications/prompts/list_changed", None, None)

    async def send_resource_list_changed(self) -> None:
        await self._notify("notifications/resources/list_changed", None, None)


class HTTPContext:
    """What a handler reads of the host request it answers: the shape of the SDK's
    `ServerRequestContext`, with the HTTP request (its headers, and the principal the
    doorkeeper left in its scope)."""

    def __init__(
        self, session: _Session, request: types.JSONRPCRequest, http_request: _Request
    ) -> None:
        params = request.params
        self.session = HTTPHostSession(session, request.id, _progress_token(params))
        self.request = http_request
        self.request_id = request.id
        self.method = request.method
        self.params = params
        self.meta = params.get("_meta") if params else None
        self.protocol_version = session.version


class HTTPFront:
    """Answers the common methods of the proxy's HTTP sessions (`_streamable`)."""

    def __init__(
        self,
        methods: Mapping[str, Handler],
        log: IO[str],
        handlers: Handlers | None = None,
    ) -> None:
        # Each method the front answers, and its handler (`_plain` checks its params and
        # shapes its result, the SDK's models what `_plain` leaves them: decision 0061).
        self._methods = dict(methods)
        self._log = log
        # The 2026-07-28 era's single exchanges (`_modern_http`, decision 0052).
        self._handlers = handlers
        self._modern: dict[str, tuple[str, Handler]] | None = None

    @classmethod
    def of(cls, handlers: Handlers, log: IO[str]) -> HTTPFront:
        """The proxy's front: `Handlers`' own answers, as over stdio."""
        return cls(front_methods(handlers), log, handlers)

    # -- the 2026-07-28 era (decision 0052) ----------------------------------------

    async def answer_modern(
        self, scope: Any, body: bytes, receive: Any, send: Any, http_request: _Request
    ) -> bool:
        """Answer a POST of the 2026-07-28 era if it is one of the front's methods; False
        (nothing sent) for the SDK's stateless entry to answer."""
        if self._handlers is None:
            return False
        from . import _modern, _modern_http

        if self._modern is None:
            self._modern = _modern.modern_methods(self._handlers)
        return await _modern_http.answer_post(
            self._modern, self._input_schema, scope, body, receive, send, http_request, self._log
        )

    def _input_schema(self, name: str) -> Any:
        assert self._handlers is not None
        spec = self._handlers.proxy.specs.get(name)
        return None if spec is None else spec.input_schema

    def answers(self, method: str) -> bool:
        return method in self._methods

    def opened(self, session: _Session, initialize: types.JSONRPCRequest) -> None:
        """The SDK's server answered the session's `initialize`: the front takes over its
        common methods, at the version the SDK agreed."""
        try:
            session.client, session.version = negotiated(initialize.params)
        except ValidationError:
            return  # the SDK's server answers this session alone

    def took(self, session: _Session, message: types.JSONRPCMessage) -> bool:
        """Whether a message the host POSTed was the front's: the answer to one of its
        questions, or the cancel of one of its calls."""
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            waiting = session.asked.pop(message.id, None) if isinstance(message.id, str) else None
            if waiting is None:
                return False
            waiting.send_nowait(message)
            waiting.close()
            return True
        if isinstance(message, types.JSONRPCNotification):
            if message.method != "notifications/cancelled":
                return False
            request_id = (message.params or {}).get("requestId")
            scope = session.calls.get(request_id) if isinstance(request_id, int | str) else None
            if scope is None:
                return False
            scope.cancel()
            return True
        return False

    async def answer(
        self, session: _Session, request: types.JSONRPCRequest, http_request: _Request
    ) -> None:
        """Answer one request into the session's waiter for it."""
        scope = anyio.CancelScope()
        session.calls[request.id] = scope
        body: bytes | None = None
        try:
            with scope:
                body = await self._answered(session, request, http_request)
        finally:
            if session.calls.get(request.id) is scope:
                del session.calls[request.id]
        if body is None:
            # Cancelled by the host: answered as the SDK answers a request left unanswered.
            await session.unanswered(request.id)
            return
        waiter = session.waiting.get(str(request.id))
        if waiter is not None:
            await waiter.put(Reply(body))

    async def _answered(
        self, session: _Session, request: types.JSONRPCRequest, http_request: _Request
    ) -> bytes:
        handler = self._methods[request.method]
        context = HTTPContext(session, request, http_request)
        # Checked and shaped in plain JSON where `_plain` decides, as over stdio (0061).
        return await answered_plainly(request, handler, context, self._log)
