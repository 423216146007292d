"""A streamable HTTP MCP server: one POST per message, answers read from raw bytes.

Each request is POSTed with `Accept: application/json, text/event-stream`;
the answer is a JSON body or an SSE stream whose `data` fields are parsed here,
from bytes, with `parse_json`.  The session id the server assigns at
`initialize` is sent back on every later message together with the negotiated
`MCP-Protocol-Version`, and the session is ended with DELETE on close.

On the 2026-07-28 revision there is no session: each request carries its own
`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` and `Mcp-Param-*` headers, given
by the connection.  On a legacy session, an event stream that ends or breaks
before its answer, after an event `id`, is resumed: after the server's `retry`
(capped) a GET with `Last-Event-ID` reads the rest, at most `MAX_RESUMPTIONS`
times; the request itself is never sent again (the revision has no resumption).

The standalone GET SSE stream is held open for the session's life when the
server advertised list changes or subscriptions (`_idle`), and else only while a
call that can answer the server's questions is in flight.

Not done, on purpose: sending a request again (a half-delivered call has no honest
retry), and following a redirect the caller's client does not follow
itself (a credential the client adds would go wherever a 3xx points).  A body
over `MAX_RESPONSE_BODY_BYTES` fails the read; it is counted while streaming,
after decompression, so neither a large body nor a compression bomb is held.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import anyio.abc
import httpx2

from ..canonical import JSONBoundaryError, parse_json
from ..sanitize import sanitize
from ._connection_errors import (
    ConnectionClosed,
    MCPConnectionError,
    NotSent,
    ProtocolViolation,
    RefusedRedirect,
)
from ._jsonrpc import Incoming, IncomingKind, answer_server_request, read_message
from ._server import Server

__all__ = ["MAX_RESPONSE_BODY_BYTES", "HttpTransport", "RefusedRedirect", "open_http"]

MAX_RESPONSE_BODY_BYTES: Final = 16 * 1024 * 1024

SESSION_ID_HEADER: Final = "mcp-session-id"
LAST_EVENT_ID_HEADER: Final = "last-event-id"
MODERN_REVISION: Final = "2026-07-28"

MAX_RESUMPTIONS: Final = 3
"""How many times a broken event stream is resumed before its request fails."""
# The wait before a resumption when the server named none, and the most any may ask.
_DEFAULT_RETRY_MS: Final = 1000
_MAX_RETRY_MS: Final = 10_000
PROTOCOL_VERSION_HEADER: Final = "mcp-protocol-version"

# Mirrors the SDK's defaults: a connect bound, and a read bound long enough
# for a slow tool (the call's own timeout is the real limit).
_DEFAULT_TIMEOUT: Final = httpx2.Timeout(30.0, read=300.0)
_CLOSE_TIMEOUT: Final = 2.0

# Clients owned by open connections, only to refuse a factory that hands out
# the same client twice.  Holds no client alive.
_clients_in_use: Final[weakref.WeakSet[httpx2.AsyncClient]] = weakref.WeakSet()


@dataclass(slots=True)
class HttpTransport:
    """Streamable HTTP: each request is one POST whose body carries its answer."""

    server: Server
    url: str
    client: httpx2.AsyncClient
    session_id: str | None = None
    protocol_version: str | None = None
    _in_flight: set[anyio.CancelScope] = field(default_factory=set)
    _closed: ConnectionClosed | None = None
    # The connection's handler of the server's notifications and requests, told the id
    # of the request on whose stream each arrived; None drops notifications.
    listener: Callable[[Incoming, int], Awaitable[None]] | None = None
    # The standalone GET stream is held open for the session's life (`_idle`).
    _stream_held: bool = False
    # The HTTP status of each request answered with an error status, until asked for.
    _error_statuses: dict[int, int] = field(default_factory=dict)

    def stderr_tail(self) -> str:
        return ""

    def error_status(self, request_id: int) -> int | None:
        """The HTTP error status (4xx, 5xx) that answered request `request_id`, once."""
        return self._error_statuses.pop(request_id, None)

    async def read_idle(self, *, pushes: bool) -> str | None:
        """While the connection lives, hold the standalone GET stream of a legacy session
        whose server advertised `pushes` (list changes, subscriptions), so what it sends
        between requests is heard (`_idle.hold_event_stream`); else return at once."""
        if pushes and self.session_id is not None and self._closed is None:
            from ._idle import hold_event_stream

            await hold_event_stream(self)
        return None

    def dead(self) -> str | None:
        """Never: an HTTP session is not restarted here (a lost one fails its calls)."""
        return None

    def negotiated(self, protocol_version: str) -> None:
        """Send `MCP-Protocol-Version` on every message from now on."""
        self.protocol_version = protocol_version

    def _name(self) -> str:
        return sanitize(self.server.name)

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
        }
        if self.session_id is not None:
            headers[SESSION_ID_HEADER] = self.session_id
        if self.protocol_version is not None:
            headers[PROTOCOL_VERSION_HEADER] = self.protocol_version
        if extra:
            headers.update(extra)  # a modern request's own, the protocol version among them
        return headers

    # -- requests and notifications --------------------------------------------

    async def request(
        self,
        request_id: int,
        method: str,
        message: bytes,
        headers: Mapping[str, str] | None = None,
        listen: bool = False,
    ) -> Incoming:
        """POST one request (with `headers` besides the transport's) and return the message
        that answers it.  `listen`: on a legacy session, hold the standalone GET stream open
        while the request is in flight, for the server's requests sent there (a server
        that does not tie its elicitation to the call's own stream)."""
        if self._closed is not None:
            raise NotSent(self.server.name, f"{self._closed}; the request was not sent")
        with anyio.CancelScope() as scope:
            self._in_flight.add(scope)
            try:
                if listen and self.session_id is not None and not self._stream_held:
                    return await self._post_listening(request_id, method, message, headers)
                return await self._post_request(request_id, method, message, headers)
            except httpx2.ConnectError as exc:
                # No connection was made, so no byte of the request left here.
                raise NotSent(
                    self.server.name,
                    f"{self._unreachable(exc, f' for {method}')}; the request was not sent",
                ) from None
            except httpx2.HTTPError as exc:
                raise self._unreachable(exc, f" for {method}") from None
            finally:
                self._in_flight.discard(scope)
        # Only `aclose` cancels this scope: the request fails cleanly, it is not cancelled.
        assert self._closed is not None
        raise self._closed

    async def send(self, message: bytes) -> None:
        """POST a notification or an answer to the server; 202 Accepted is the expected reply."""
        if self._closed is not None:
            raise self._closed
        try:
            async with self.client.stream(
                "POST", self.url, content=message, headers=self._headers()
            ) as response:
                self._refuse_redirect(response, "a notification or answer")
                if response.status_code >= 400:
                    raise ProtocolViolation(
                        self.server.name,
                        f'server "{self._name()}" refused a notification or answer with HTTP '
                        f"{response.status_code}",
                    )
                await _read_capped(response, self.server)
        except httpx2.HTTPError as exc:
            raise self._unreachable(exc, "") from None

    def _unreachable(self, error: httpx2.HTTPError, purpose: str) -> MCPConnectionError:
        return MCPConnectionError(
            self.server.name,
            f'server "{self._name()}" could not be reached{purpose}: '
            f"{sanitize(str(error) or type(error).__name__)}",
        )

    async def _post_request(
        self, request_id: int, method: str, message: bytes, headers: Mapping[str, str] | None
    ) -> Incoming:
        async with self.client.stream(
            "POST", self.url, content=message, headers=self._headers(headers)
        ) as response:
            self._refuse_redirect(response, method)
            if response.status_code == 202:
                raise ProtocolViolation(
                    self.server.name,
                    f'server "{self._name()}" answered {method} with 202 Accepted and no answer',
                )
            if response.status_code >= 400:
                refusal = await self._error_status(response, method)
                self._error_statuses[request_id] = response.status_code
                return refusal
            if method == "initialize":
                session_id = response.headers.get(SESSION_ID_HEADER)
                if session_id:
                    self.session_id = session_id
            content_type = response.headers.get("content-type", "").partition(";")[0]
            content_type = content_type.strip().lower()
            if content_type == "application/json":
                body = await _read_capped(response, self.server)
                answer = self._answer(read_message(body), request_id, method)
                if answer is None:
                    raise ProtocolViolation(
                        self.server.name,
                        f'server "{self._name()}" answered {method} with a JSON body '
                        "that is not the answer to it",
                    )
                return answer
            if content_type == "text/event-stream":
                events = _SSEEvents()
                answer = await self._read_events(response, events, request_id, method)
                if answer is not None:
                    return answer
                modern = (headers or {}).get(PROTOCOL_VERSION_HEADER) == MODERN_REVISION
                if events.last_id is None or modern:
                    # Nothing to resume from (the 2026-07-28 revision has no resumption).
                    raise ProtocolViolation(
                        self.server.name,
                        f'server "{self._name()}" ended its event stream without answering '
                        f"{method}",
                    )
            else:
                raise ProtocolViolation(
                    self.server.name,
                    f'server "{self._name()}" answered {method} with the content type '
                    f'"{sanitize(content_type)}"',
                )
        return await self._resume(events, request_id, method)

    async def _post_listening(
        self, request_id: int, method: str, message: bytes, headers: Mapping[str, str] | None
    ) -> Incoming:
        answer: Incoming | None = None
        failure: Exception | None = None
        async with anyio.create_task_group() as group:
            await group.start(self._listen, request_id)
            try:
                answer = await self._post_request(request_id, method, message, headers)
            except Exception as exc:  # re-raised below, outside the task group
                failure = exc
            group.cancel_scope.cancel()
        if failure is not None:
            raise failure
        assert answer is not None
        return answer

    async def _listen(
        self,
        request_id: int,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """The standalone GET stream, for as long as the request is in flight: the server's
        requests and notifications on it go to the listener as if read for `request_id`.
        Started (the request may go) once the server answered the GET, whatever it said."""
        started = False
        headers = self._headers()
        headers.pop("content-type", None)
        headers["accept"] = "text/event-stream"
        try:
            async with self.client.stream("GET", self.url, headers=headers) as response:
                task_status.started()
                started = True
                content_type = response.headers.get("content-type", "").partition(";")[0]
                if response.status_code != 200 or content_type.strip().lower() != (
                    "text/event-stream"
                ):
                    return
                async for data in _sse_data(response, self.server):
                    if not data.strip():
                        continue
                    incoming = read_message(data)
                    if self.listener is not None and incoming.kind in (
                        IncomingKind.REQUEST,
                        IncomingKind.NOTIFICATION,
                    ):
                        await self.listener(incoming, request_id)
        except Exception:  # noqa: S110 - a courtesy: the call's own stream carries its answer
            pass
        finally:
            if not started:
                task_status.started()

    async def _read_events(
        self, response: httpx2.Response, events: _SSEEvents, request_id: int, method: str
    ) -> Incoming | None:
        """Read an event stream until the answer to `request_id`; None when the stream ends
        (or breaks, after an event id that lets it be resumed) without it."""
        try:
            async for data in _sse_data(response, self.server, events):
                if not data.strip():
                    continue  # a priming event: an id (and maybe a retry) with no message
                incoming = read_message(data)
                if incoming.kind is IncomingKind.REQUEST:
                    if self.listener is not None:
                        await self.listener(incoming, request_id)  # the connection answers it
                    else:
                        await self.send(answer_server_request(incoming))
                    continue
                if incoming.kind is IncomingKind.NOTIFICATION and self.listener is not None:
                    await self.listener(incoming, request_id)
                    continue
                answer = self._answer(incoming, request_id, method)
                if answer is not None:
                    return answer
        except httpx2.TransportError:
            if events.last_id is None:
                raise
        return None

    async def _resume(self, events: _SSEEvents, request_id: int, method: str) -> Incoming:
        """Recover the answer to a request whose event stream ended without it: wait the
        server's `retry` (capped), then GET the stream again with `Last-Event-ID`, at most
        `MAX_RESUMPTIONS` times.  The request itself is never sent again."""
        name = self._name()
        for _attempt in range(MAX_RESUMPTIONS):
            wait = min(events.retry_ms if events.retry_ms is not None else _DEFAULT_RETRY_MS,
                       _MAX_RETRY_MS)  # fmt: skip
            await anyio.sleep(wait / 1000)
            headers = self._headers()
            headers.pop("content-type", None)
            headers["accept"] = "text/event-stream"
            assert events.last_id is not None
            headers[LAST_EVENT_ID_HEADER] = events.last_id
            async with self.client.stream("GET", self.url, headers=headers) as response:
                self._refuse_redirect(response, f"the resumption of {method}")
                content_type = response.headers.get("content-type", "").partition(";")[0]
                if response.status_code != 200 or content_type.strip().lower() != (
                    "text/event-stream"
                ):
                    raise ProtocolViolation(
                        self.server.name,
                        f'server "{name}" ended its event stream without answering {method} '
                        f"and did not resume it (HTTP {response.status_code})",
                    )
                events.restart()
                answer = await self._read_events(response, events, request_id, method)
                if answer is not None:
                    return answer
        raise ProtocolViolation(
            self.server.name,
            f'server "{name}" did not answer {method} in its event stream, resumed '
            f"{MAX_RESUMPTIONS} times",
        )

    def _answer(self, incoming: Incoming, request_id: int, method: str) -> Incoming | None:
        if incoming.request_id != request_id:
            return None
        if incoming.kind is IncomingKind.BAD_RESPONSE:
            raise ProtocolViolation(
                self.server.name,
                f'server "{self._name()}" answered {method} with a message this client '
                f"refuses: {sanitize(incoming.problem)}",
            )
        if incoming.kind is IncomingKind.RESPONSE:
            return incoming
        return None

    def _refuse_redirect(self, response: httpx2.Response, what: str) -> None:
        if 300 <= response.status_code < 400:
            location = sanitize(response.headers.get("location", "nowhere"))
            raise RefusedRedirect(
                self.server.name,
                f'server "{self._name()}" answered {what} with a redirect to {location}, '
                "which is not followed; use that URL as the endpoint if it is the intended server",
            )

    async def _error_status(self, response: httpx2.Response, method: str) -> Incoming:
        body = await _read_capped(response, self.server)
        incoming = read_message(body)
        if incoming.kind is IncomingKind.RESPONSE and incoming.error is not None:
            return incoming
        # A server may reject a request before reading its id and carry the
        # JSON-RPC error in the 4xx body with a null id: it still answers this POST.
        error = _error_member(body)
        if error is not None:
            return Incoming(IncomingKind.RESPONSE, request_id=None, error=error)
        if response.status_code == 404 and self.session_id is not None:
            raise ConnectionClosed(
                self.server.name, f'server "{self._name()}" no longer knows this session (HTTP 404)'
            )
        raise ProtocolViolation(
            self.server.name,
            f'server "{self._name()}" answered {method} with HTTP {response.status_code}',
        )

    # -- closing ---------------------------------------------------------------

    async def aclose(self, *, polite: bool = True) -> None:
        """End the session (DELETE) and close the client; a second call does nothing."""
        if self._closed is not None:
            return
        self._closed = ConnectionClosed(
            self.server.name, f'the connection to server "{self._name()}" is closed'
        )
        for scope in list(self._in_flight):
            scope.cancel()
        if self.session_id is not None:
            with anyio.move_on_after(_CLOSE_TIMEOUT):
                # The session ends on the server's side in any case.
                with contextlib.suppress(httpx2.HTTPError):
                    await self.client.delete(self.url, headers=self._headers())
        await self.client.aclose()
        _clients_in_use.discard(self.client)


def open_http(server: Server) -> HttpTransport:
    """The transport for `server.endpoint`, with a client of its own.

    With `http_client_factory` the client it returns is used for this
    connection alone (its headers, auth, TLS settings, timeouts and redirect
    choice) and closed with it; the factory must return a new client each
    call (a closed client, or one another open connection uses, is refused).
    Without one, a fresh client that follows no redirect.
    """
    assert server.endpoint is not None
    if server.http_client_factory is not None:
        client = server.http_client_factory()
        if not isinstance(client, httpx2.AsyncClient):
            raise MCPConnectionError(
                server.name,
                f'server "{sanitize(server.name)}": http_client_factory returned '
                f"{type(client).__name__}, not an httpx2.AsyncClient",
            )
        if client.is_closed or client in _clients_in_use:
            # Closing this connection closes its client: a shared one would take
            # its other users down with it.
            raise MCPConnectionError(
                server.name,
                f'server "{sanitize(server.name)}": http_client_factory returned a client '
                "that is closed or in use by another connection; it must return a new one",
            )
    else:
        client = httpx2.AsyncClient(follow_redirects=False, timeout=_DEFAULT_TIMEOUT)
    _clients_in_use.add(client)
    return HttpTransport(server=server, url=server.endpoint, client=client)


async def _read_capped(response: httpx2.Response, server: Server) -> bytes:
    _refuse_declared_length(response, server)
    chunks: list[bytes] = []
    total = 0
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > MAX_RESPONSE_BODY_BYTES:
            raise _too_large(server)
        chunks.append(chunk)
    return b"".join(chunks)


def _error_member(body: bytes) -> dict[str, Any] | None:
    try:
        value = parse_json(body)
    except JSONBoundaryError:
        return None
    if not isinstance(value, dict) or value.get("jsonrpc") != "2.0":
        return None
    error = value.get("error")
    if (
        isinstance(error, dict)
        and type(error.get("code")) is int
        and isinstance(error.get("message"), str)
    ):
        return error
    return None


def _refuse_declared_length(response: httpx2.Response, server: Server) -> None:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_RESPONSE_BODY_BYTES:
        raise _too_large(server)


def _too_large(server: Server) -> ProtocolViolation:
    return ProtocolViolation(
        server.name,
        f'server "{sanitize(server.name)}" sent a response body over '
        f"{MAX_RESPONSE_BODY_BYTES} bytes, so the read failed",
    )


async def _sse_data(
    response: httpx2.Response, server: Server, events: _SSEEvents | None = None
) -> AsyncIterator[bytes]:
    """The `data` of each `message` event of an SSE body, as bytes, the whole body capped.

    Lines end at CRLF, LF or CR; `data` fields of one event join with LF;
    comments and other fields are skipped; an event cut off by the end of the
    stream is dropped, as the SSE standard says.
    """
    _refuse_declared_length(response, server)
    if events is None:
        events = _SSEEvents()
    total = 0
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > MAX_RESPONSE_BODY_BYTES:
            raise _too_large(server)
        for data in events.feed(chunk, final=False):
            yield data
    for data in events.feed(b"", final=True):
        yield data


class _SSEEvents:
    """An incremental SSE parser over bytes (the subset MCP uses: `event`, `data`, and the
    `id` and `retry` a resumable stream carries: `last_id`, `retry_ms`)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._data_lines: list[bytes] = []
        self._event_type = b""
        self.last_id: str | None = None
        self.retry_ms: int | None = None

    def restart(self) -> None:
        """A new stream continues this one: drop what is half-read, keep the id and retry."""
        self._buffer.clear()
        self._data_lines = []
        self._event_type = b""

    def feed(self, chunk: bytes, *, final: bool) -> list[bytes]:
        """Add `chunk`; return the data of every `message` event it completes."""
        self._buffer += chunk
        completed: list[bytes] = []
        while True:
            line_end = _line_end(self._buffer, final=final)
            if line_end is None:
                return completed
            end, after = line_end
            line = bytes(self._buffer[:end])
            del self._buffer[:after]
            if not line:
                if self._data_lines and self._event_type in (b"", b"message"):
                    completed.append(b"\n".join(self._data_lines))
                self._data_lines = []
                self._event_type = b""
                continue
            if line.startswith(b":"):
                continue
            name, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if name == b"data":
                self._data_lines.append(value)
            elif name == b"event":
                self._event_type = value
            elif name == b"id" and b"\0" not in value:
                text = value.decode("utf-8", "replace")
                # An id is echoed in a header: only a visible-ASCII one is kept.
                self.last_id = text if text.isascii() and text.isprintable() else self.last_id
            elif name == b"retry" and value.isdigit():
                self.retry_ms = int(value)


def _line_end(buffer: bytearray, *, final: bool) -> tuple[int, int] | None:
    """Where the first line in `buffer` ends and the next begins, or None if incomplete."""
    newline = buffer.find(b"\n")
    carriage = buffer.find(b"\r")
    if carriage < 0 or (0 <= newline < carriage):
        return None if newline < 0 else (newline, newline + 1)
    if carriage + 1 == len(buffer):
        # A CR at the end may be the first half of CRLF, unless nothing follows.
        return (carriage, carriage + 1) if final else None
    if buffer[carriage + 1] == ord("\n"):
        return carriage, carriage + 2
    return carriage, carriage + 1
