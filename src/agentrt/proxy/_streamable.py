"""The proxy's streamable HTTP sessions: one ASGI callable between uvicorn and the SDK `Server`.

Each session (opened by `initialize`, named by its `Mcp-Session-Id`) runs the
SDK's low-level `Server.run` in a task of its own, on a memory stream for
what the host sends and an `_Outbox` for what the server sends.  The outbox
routes each outgoing message as it is written, as the SDK's transport's
message router does, with no task of its own: a response to the POST that
asked for it (by its id), a message related to a request (its metadata's
`related_request_id`) to that request's POST, anything else to the session's
standalone GET stream; a message nobody waits for is dropped, as the SDK
drops it.  A request's POST waits on a `_Waiter` (a small deque), not on a
memory stream and a task of its own.

A request is answered in one `application/json` body when the first message
the server has for it is its response; when it is a progress notification,
a log line or a request to the host (an elicitation), the answer becomes an
event stream carrying it and everything after it, the response last.  A
request that sends nothing for 15 seconds becomes a stream too, with a
comment every 15 seconds, as the SDK's streams are kept alive
(decision 0019).  The statuses, headers and error bodies are the SDK's
(mcp 2.3) for the 2025 revisions; a request naming a protocol version the
handshake does not know (the 2026-07-28 revision's per-request exchanges)
goes to the SDK's own stateless session manager, through its public
`handle_request` (decision 0020), unless the HTTP front answers it as that
manager would (its discover, listings and calls: decision 0052).

What may reach the listener at all (the loopback guard, the bearer token,
the body cap and the screening of every POST body) is `_http.Doorkeeper`'s,
checked first in the same callable.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from functools import partial
from typing import IO, Any, Final
from uuid import uuid4

import anyio
import pydantic_core
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.lowlevel import Server as LowLevelServer
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    ErrorData,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCRequest,
    JSONRPCResponse,
    RequestId,
    jsonrpc_message_adapter,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from pydantic import ValidationError
from starlette.datastructures import Headers

from ..sanitize import sanitize
from ._http_front import HTTPFront, Reply
from ._resource import PRINCIPAL_SCOPE_KEY, same_principal
from ._revision import header_mismatch

__all__ = ["StreamableHTTP"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
# The requests `Doorkeeper` lets through, with the POST body it read (b"" for the others).
Admit = Callable[[Scope, Receive, Send], Awaitable[bytes | None]]

# How long a request may go without a message before its answer becomes an event stream
# with a comment every so often: sse-starlette's ping interval, which the SDK's streams use,
# so that a host or an intermediary reading with an idle timeout still sees bytes.
_KEEP_ALIVE_SECONDS: Final = 15.0
_PING: Final = b": ping\r\n\r\n"
# Messages queued for one request (or the standalone stream) before the server's next write
# for it waits for the host to read: the SDK's REQUEST_STREAM_BUFFER_SIZE.
_QUEUED: Final = 16
# The SDK manager's default cap on open sessions; one more is answered 503.
_MAX_SESSIONS: Final = 10_000
# The SDK manager's default: a session with no request in flight (no answer being served,
# no standalone stream open) for this long ends, so a host that vanished without a DELETE
# does not keep its session (and the server task behind it) forever.
_IDLE_SECONDS: Final = 30 * 60.0
# The SDK's code for a request that settled without a response (REQUEST_CANCELLED).
_REQUEST_CANCELLED: Final = -32800

_JSON: Final = (b"content-type", b"application/json")
_TEXT: Final = (b"content-type", b"text/plain; charset=utf-8")
_SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
]


class _Ended(Exception):
    """The session ended (DELETE, shutdown) or the host left while a request waited."""


def _settle(arrived: asyncio.Future[None]) -> None:
    if not arrived.done():
        arrived.set_result(None)


class _Waiter:
    """What the server has sent for one request (or the standalone stream), in order; a
    `Reply` is a response the front wrote already.

    A take that must wait waits on a bare future of the loop with a timer for the
    keep-alive (not an event and a cancel scope with a deadline: this is every request's
    path, decision 0054)."""

    __slots__ = ("_arrived", "_room", "closed", "messages")

    def __init__(self) -> None:
        self.messages: deque[JSONRPCMessage | Reply] = deque()
        self.closed = False
        self._arrived: asyncio.Future[None] | None = None
        self._room: anyio.Event | None = None

    async def put(self, message: JSONRPCMessage | Reply) -> None:
        while len(self.messages) >= _QUEUED and not self.closed:
            if self._room is None:
                self._room = anyio.Event()
            await self._room.wait()
        if self.closed:
            return
        self.messages.append(message)
        if self._arrived is not None:
            _settle(self._arrived)

    async def take(self) -> JSONRPCMessage | Reply | None:
        """The next message; None when none came for `_KEEP_ALIVE_SECONDS`."""
        if not self.messages and not self.closed:
            loop = asyncio.get_running_loop()
            arrived = self._arrived = loop.create_future()
            keep_alive = loop.call_later(_KEEP_ALIVE_SECONDS, _settle, arrived)
            try:
                await arrived
            finally:
                keep_alive.cancel()
                self._arrived = None
        if not self.messages:
            if self.closed:
                raise _Ended
            return None
        message = self.messages.popleft()
        if self._room is not None:
            self._room.set()
            self._room = None
        return message

    def close(self) -> None:
        self.closed = True
        if self._arrived is not None:
            _settle(self._arrived)
        if self._room is not None:
            self._room.set()


class _Request:
    """What a handler sees of the HTTP request (`ctx.request`): its headers, as the SDK's
    starlette `Request` gives them; the proxy tells hosts apart by `mcp-session-id`."""

    __slots__ = ("_scope",)

    def __init__(self, scope: Scope) -> None:
        self._scope = scope

    @property
    def headers(self) -> Headers:
        return Headers(scope=self._scope)

    @property
    def scope(self) -> Scope:
        """The ASGI scope, as starlette's `Request.scope`: the doorkeeper's principal is in it."""
        return self._scope


class _Session:
    """One host's session: the server's intake, and who waits for what it sends."""

    def __init__(self, session_id: str, principal: object = None) -> None:
        self.id = session_id
        # Who opened it (with `"principals"`): only they may use it, so one person's host
        # never reads another's answers by presenting their session id.
        self.principal = principal
        self.id_header = (b"mcp-session-id", session_id.encode("ascii"))
        self.intake: MemoryObjectSendStream[SessionMessage | Exception]
        self.received: MemoryObjectReceiveStream[SessionMessage | Exception]
        self.intake, self.received = anyio.create_memory_object_stream[SessionMessage | Exception](
            _QUEUED
        )
        self.waiting: dict[str, _Waiter] = {}
        self.standalone: _Waiter | None = None
        self.ended = False
        # Requests of this session being served now, and since when none has been.
        self.busy = 0
        self.idle_since = time.monotonic()
        # The host's `initialize` once the SDK's server answered it, and the version agreed:
        # from then on the front answers the session's calls and listings (`HTTPFront`).
        self.client: Any = None
        self.version: str = LATEST_HANDSHAKE_VERSION
        # The front's calls in flight (cancelled by the host's notifications/cancelled) and
        # its own requests to the host waiting for the host's response.
        self.calls: dict[RequestId, anyio.CancelScope] = {}
        self.asked: dict[str, MemoryObjectSendStream[JSONRPCResponse | JSONRPCError]] = {}
        self.asked_count = 0

    async def route(self, session_message: SessionMessage) -> None:
        """Hand one message from the server to whoever waits for it, as the SDK's router does."""
        message = session_message.message
        metadata = session_message.metadata
        waiter: _Waiter | None
        if isinstance(message, JSONRPCResponse | JSONRPCError) and message.id is not None:
            waiter = self.waiting.get(str(message.id))
        elif (
            isinstance(metadata, ServerMessageMetadata) and metadata.related_request_id is not None
        ):
            waiter = self.waiting.get(str(metadata.related_request_id))
        else:
            # Null-id errors, and notifications and requests related to no request.
            waiter = self.standalone
        if waiter is not None:
            await waiter.put(message)

    async def unanswered(self, request_id: RequestId) -> None:
        """A request settled without a response (cancelled): end its answer, as the SDK does."""
        error = ErrorData(code=_REQUEST_CANCELLED, message="Request cancelled")
        await self.route(SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id, error=error)))

    def end(self) -> None:
        """No more requests: every answer still waiting ends, and the server's intake closes."""
        self.ended = True
        for scope in self.calls.values():
            scope.cancel()
        for asked in self.asked.values():
            asked.close()
        for waiter in self.waiting.values():
            waiter.close()
        if self.standalone is not None:
            self.standalone.close()
        self.intake.close()


class _Outbox:
    """The write stream `Server.run` writes to: each message is routed as it is written."""

    __slots__ = ("_session",)

    def __init__(self, session: _Session) -> None:
        self._session = session

    async def send(self, item: SessionMessage, /) -> None:
        await self._session.route(item)

    async def aclose(self) -> None:
        return None

    async def __aenter__(self) -> _Outbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None


def _error_body(message: str, code: int = INVALID_REQUEST) -> bytes:
    """A JSON-RPC error without a request id, as the SDK's transport answers refusals."""
    error = JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=code, message=message))
    return error.model_dump_json(by_alias=True, exclude_unset=True).encode("utf-8")


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    headers.append((b"content-length", str(len(body)).encode("ascii")))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _refuse(
    send: Send,
    status: int,
    message: str,
    session: _Session | None = None,
    code: int = INVALID_REQUEST,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    headers = [_JSON, *extra]
    if session is not None:
        headers.append(session.id_header)
    await _respond(send, status, _error_body(message, code), headers)


def _accepts(headers: Headers) -> tuple[bool, bool]:
    """Whether Accept allows JSON and an event stream, with the SDK's wildcard handling."""
    types = [part.strip().split(";")[0].strip().lower()
             for part in headers.get("accept", "").split(",")]  # fmt: skip
    wildcard = "*/*" in types
    return (
        wildcard or any(t in ("application/json", "application/*") for t in types),
        wildcard or any(t in ("text/event-stream", "text/*") for t in types),
    )


def _is_json(headers: Headers) -> bool:
    content_type = headers.get("content-type", "")
    return any(part.strip() == "application/json" for part in content_type.split(";")[0].split(","))


def _dumped(message: JSONRPCMessage | Reply) -> bytes:
    if isinstance(message, Reply):
        return message.body
    return message.model_dump_json(by_alias=True, exclude_unset=True).encode("utf-8")


def _event(message: JSONRPCMessage | Reply) -> bytes:
    return b"event: message\r\ndata: " + _dumped(message) + b"\r\n\r\n"


def _final(message: JSONRPCMessage | Reply) -> bool:
    return isinstance(message, JSONRPCResponse | JSONRPCError | Reply)


async def _watch_disconnect(receive: Receive, waiter: _Waiter) -> None:
    """End a stream's waiting when its host goes away (uvicorn says so only to `receive`)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    waiter.close()


class StreamableHTTP:
    """The ASGI app serving `server` on /mcp; `running()` must be entered around serving."""

    def __init__(
        self,
        server: LowLevelServer[Any],
        admit: Admit,
        log: IO[str],
        idle_seconds: float = _IDLE_SECONDS,
        front: HTTPFront | None = None,
    ) -> None:
        self._server = server
        # Answers a session's calls and listings without the SDK's server (decision 0046).
        self._front = front
        self._idle_seconds = idle_seconds
        self._admit = admit
        self._log = log
        self._sessions: dict[str, _Session] = {}
        self._group: TaskGroup | None = None
        # The front's answers being worked out: tasks of the loop's own (decision 0054).
        self._answering: set[asyncio.Task[None]] = set()
        self._draining = False
        # The 2026-07-28 revision's single exchanges: no session, the SDK's own entry.
        self._modern = StreamableHTTPSessionManager(
            server,
            stateless=True,
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Sessions run inside; on leaving, every session still open ends."""
        async with self._modern.run(), anyio.create_task_group() as group:
            self._group = group
            group.start_soon(self._end_idle_sessions)
            try:
                yield
            finally:
                for session in list(self._sessions.values()):
                    session.end()
                self._sessions.clear()
                for task in self._answering:
                    task.cancel()
                group.cancel_scope.cancel()
                self._group = None

    async def _end_idle_sessions(self) -> None:
        while True:
            await anyio.sleep(min(60.0, self._idle_seconds / 4))
            now = time.monotonic()
            for session in list(self._sessions.values()):
                if session.busy == 0 and now - session.idle_since >= self._idle_seconds:
                    del self._sessions[session.id]
                    session.end()
                    self._log.write(
                        f"agentrt proxy: ended HTTP session {session.id[:8]}… after "
                        f"{self._idle_seconds:g} s without a request\n"
                    )
                    self._log.flush()

    def drain(self) -> None:
        """The proxy is stopping: standalone streams end (so the server can stop waiting for
        their connections); requests in flight still get their answers."""
        self._draining = True
        for session in self._sessions.values():
            if session.standalone is not None:
                session.standalone.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await self._admit(scope, receive, send)
        if body is None:
            return  # answered by the doorkeeper
        if scope["path"] != "/mcp":
            await _respond(send, 404, b"Not Found", [_TEXT])
            return
        headers = Headers(scope=scope)
        if scope["method"] == "POST":
            mismatch = header_mismatch(scope["headers"], body)
            if mismatch is not None:
                await _respond(send, 400, mismatch, [_JSON])
                return
        version = headers.get("mcp-protocol-version")
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            # The front's methods of the era are its own (decision 0052); the rest the SDK's.
            front = self._front
            if front is None or not await front.answer_modern(
                scope, body, receive, send, _Request(scope)
            ):
                await self._modern.handle_request(scope, _replay(body, receive), send)
            return
        session_id = headers.get("mcp-session-id")
        session: _Session | None = None
        if session_id is not None:
            session = self._sessions.get(session_id)
            if session is None or not _same_principal(session.principal, scope):
                await _refuse(send, 404, "Session not found")
                return
            session.busy += 1
        try:
            await self._serve_method(scope, headers, body, session, send, receive)
        finally:
            if session is not None:
                session.busy -= 1
                session.idle_since = time.monotonic()

    async def _serve_method(
        self,
        scope: Scope,
        headers: Headers,
        body: bytes,
        session: _Session | None,
        send: Send,
        receive: Receive,
    ) -> None:
        method = scope["method"]
        if method == "POST":
            if not headers.get("content-type", "").lower().startswith("application/json"):
                body_text = b"Invalid Content-Type header"
                await _respond(send, 400, body_text, [_TEXT])
                return
            await self._post(scope, headers, body, session, send, receive)
        elif method == "GET":
            await self._get(headers, session, send, receive)
        elif method == "DELETE":
            await self._delete(session, send)
        else:
            await _refuse(
                send, 405, "Method Not Allowed", session,
                extra=((b"allow", b"GET, POST, DELETE"),),
            )  # fmt: skip

    async def _post(
        self,
        scope: Scope,
        headers: Headers,
        body: bytes,
        session: _Session | None,
        send: Send,
        receive: Receive,
    ) -> None:
        has_json, has_sse = _accepts(headers)
        if not (has_json and has_sse):
            message = (
                "Not Acceptable: Client must accept both application/json and text/event-stream"
            )
            await _refuse(send, 406, message, session)
            return
        if not _is_json(headers):
            message = "Unsupported Media Type: Content-Type must be application/json"
            await _refuse(send, 415, message, session)
            return
        try:
            message_in = jsonrpc_message_adapter.validate_json(body, by_name=False)
        except ValidationError:
            await self._malformed(body, session, send)
            return
        opening = isinstance(message_in, JSONRPCRequest) and message_in.method == "initialize"
        if session is None:
            if not opening:
                await _refuse(send, 400, "Bad Request: Missing session ID")
                return
            session = await self._open(scope.get(PRINCIPAL_SCOPE_KEY))
            if session is None:
                await _refuse(send, 503, "Too many open sessions", code=INTERNAL_ERROR)
                return
        if not isinstance(message_in, JSONRPCRequest):
            # A notification or the host's response to the server's request: accepted, then
            # passed on (an elicitation's answer reaches the request waiting for it).
            await _respond(send, 202, b"", [_JSON, session.id_header])
            if self._front is not None and self._front.took(session, message_in):
                return  # an answer to the front's question, or the cancel of a front's call
            metadata = ServerMessageMetadata(request_context=_Request(scope))
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                await session.intake.send(SessionMessage(message_in, metadata=metadata))
            return
        await self._answer(scope, message_in, session, send, receive)

    async def _malformed(self, body: bytes, session: _Session | None, send: Send) -> None:
        # The SDK's two answers, in its order: not JSON, then not a JSON-RPC message.
        try:
            raw = pydantic_core.from_json(body)
        except ValueError as exc:
            await _refuse(send, 400, f"Parse error: {exc}", session, PARSE_ERROR)
            return
        try:
            jsonrpc_message_adapter.validate_python(raw, by_name=False)
        except ValidationError as exc:
            await _refuse(send, 400, f"Validation error: {exc}", session, INVALID_PARAMS)

    async def _open(self, principal: object = None) -> _Session | None:
        """A new session with its server running, or None at the cap."""
        if len(self._sessions) >= _MAX_SESSIONS or self._group is None:
            return None
        session = _Session(uuid4().hex, principal)
        self._sessions[session.id] = session
        await self._group.start(self._serve, session)
        return session

    async def _serve(self, session: _Session, *, task_status: TaskStatus[None]) -> None:
        task_status.started()
        server = self._server
        try:
            async with session.received:
                from ._live import initialization_options

                await server.run(session.received, _Outbox(session), initialization_options(server))
        except Exception as exc:  # one session's failure must not end the others
            self._log.write(
                f"agentrt proxy: an HTTP session ended with an error: {sanitize(repr(exc))[:300]}\n"
            )
            self._log.flush()
        finally:
            session.end()
            if self._sessions.get(session.id) is session:
                del self._sessions[session.id]

    async def _answer(
        self,
        scope: Scope,
        message: JSONRPCRequest,
        session: _Session,
        send: Send,
        receive: Receive,
    ) -> None:
        key = str(message.id)
        if key in session.waiting:
            # The SDK would replace the first request's waiter, leaving it unanswered.
            await _refuse(
                send, 400, f"Bad Request: request id {sanitize(key)[:64]} is already in flight",
                session,
            )  # fmt: skip
            return
        waiter = _Waiter()
        session.waiting[key] = waiter
        try:
            front = self._front
            try:
                if (
                    front is not None
                    and session.client is not None
                    and front.answers(message.method)
                ):
                    # Answered by the front: the SDK's server never sees it (decision 0046).
                    self._start_answering(front, session, message, _Request(scope))
                else:
                    metadata = ServerMessageMetadata(
                        request_context=_Request(scope),
                        on_request_unanswered=partial(session.unanswered, message.id),
                    )
                    await session.intake.send(SessionMessage(message, metadata=metadata))
                first = await waiter.take()
            except (_Ended, anyio.ClosedResourceError, anyio.BrokenResourceError):
                await _refuse(
                    send, 500, "Session terminated before the request completed", session,
                    INTERNAL_ERROR,
                )  # fmt: skip
                return
            if first is not None and _final(first):
                if (
                    front is not None
                    and message.method == "initialize"
                    and isinstance(first, JSONRPCResponse)
                ):
                    front.opened(session, message)
                await _respond(send, 200, _dumped(first), [_JSON, session.id_header])
                return
            await self._stream(first, waiter, session, send, receive)
        finally:
            if session.waiting.get(key) is waiter:
                del session.waiting[key]

    def _start_answering(
        self, front: HTTPFront, session: _Session, message: JSONRPCRequest, request: _Request
    ) -> None:
        """The front answers `message` in a task of the loop's own: an anyio task group's
        `start_soon` costs a task handle and an event more per call (decision 0054).  The
        call's cancel scope is its own (`HTTPFront.answer`); shutdown cancels what is left."""
        task = asyncio.get_running_loop().create_task(
            self._answering_one(front, session, message, request)
        )
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _answering_one(
        self, front: HTTPFront, session: _Session, message: JSONRPCRequest, request: _Request
    ) -> None:
        try:
            await front.answer(session, message, request)
        except Exception as exc:
            # The host still gets an answer, and the other sessions go on.
            self._log.write(
                f"agentrt proxy: answering {sanitize(message.method)[:80]} failed: "
                f"{sanitize(repr(exc))[:300]}\n"
            )
            self._log.flush()
            error = ErrorData(code=INTERNAL_ERROR, message="Internal error")
            with contextlib.suppress(Exception):
                await session.route(
                    SessionMessage(JSONRPCError(jsonrpc="2.0", id=message.id, error=error))
                )

    async def _stream(
        self,
        first: JSONRPCMessage | Reply | None,
        waiter: _Waiter,
        session: _Session,
        send: Send,
        receive: Receive,
    ) -> None:
        """Answer on an event stream: `first` (None: nothing yet, a keep-alive), then every
        message for the request until its response."""
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_SSE_HEADERS, session.id_header]})  # fmt: skip
        async with anyio.create_task_group() as group:
            group.start_soon(_watch_disconnect, receive, waiter)
            message = first
            while True:
                if message is None:
                    await send({"type": "http.response.body", "body": _PING, "more_body": True})
                else:
                    final = _final(message)
                    await send({"type": "http.response.body", "body": _event(message),
                                "more_body": not final})  # fmt: skip
                    if final:
                        break
                try:
                    message = await waiter.take()
                except _Ended:
                    # The session ended or the host left mid-call: end the stream, as the SDK's.
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    break
            group.cancel_scope.cancel()

    async def _get(
        self, headers: Headers, session: _Session | None, send: Send, receive: Receive
    ) -> None:
        """The session's standalone stream: what the server sends related to no request."""
        if not _accepts(headers)[1]:
            message = "Not Acceptable: Client must accept text/event-stream"
            await _refuse(send, 406, message, session)
            return
        if session is None:
            await _refuse(send, 400, "Bad Request: Missing session ID")
            return
        if session.standalone is not None:
            await _refuse(
                send, 409, "Conflict: Only one SSE stream is allowed per session", session
            )
            return
        waiter = _Waiter()
        if self._draining:
            waiter.close()
        session.standalone = waiter
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [*_SSE_HEADERS, session.id_header]})  # fmt: skip
            async with anyio.create_task_group() as group:
                group.start_soon(_watch_disconnect, receive, waiter)
                while True:
                    try:
                        sent = await waiter.take()
                    except _Ended:
                        await send({"type": "http.response.body", "body": b"", "more_body": False})
                        break
                    frame = _PING if sent is None else _event(sent)
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
                group.cancel_scope.cancel()
        finally:
            if session.standalone is waiter:
                session.standalone = None

    async def _delete(self, session: _Session | None, send: Send) -> None:
        if session is None:
            await _refuse(send, 400, "Bad Request: Missing session ID")
            return
        # Forgotten first, so its id answers 404 from now on; then its waiters are answered.
        self._sessions.pop(session.id, None)
        session.end()
        await _respond(send, 200, b"", [_JSON, session.id_header])


def _same_principal(opener: object, scope: Scope) -> bool:
    """Whether a request is by the principal who opened its session."""
    return same_principal(opener, scope.get(PRINCIPAL_SCOPE_KEY))


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` for an app downstream of one that has read the body already."""
    replayed = False

    async def replay() -> Any:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
