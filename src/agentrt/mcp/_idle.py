"""The standalone GET event stream of a legacy HTTP session, held open for the session's life.

On a 2025 session a server sends what no request asked for (a list change, a
resource update) on the stream a GET opens, and drops it when none is open.
`hold_event_stream` keeps one open while the connection lives, for a server
that advertised list changes or subscriptions (docs/decisions/0049): each
message on it goes to the transport's listener as read by no request
(`IDLE_READ`), at most `IDLE_MESSAGES_PER_SECOND` a second (a flood waits in
the server's socket).

A stream that ends or breaks is opened again after a wait: the server's
`retry` when it named one, else 1 s doubling to `MAX_BACKOFF`, back to the
start after a stream that carried a message.  It carries `Last-Event-ID` when
the server gave event ids, so a server that keeps its events replays what it
sent meanwhile.  A 405 means the server offers no such stream, and a 404 that
it no longer knows the session; any other refusal but 409 (another stream of
the session is open), 429 and 5xx, or a redirect or an answer that is not an
event stream, is taken the same way: nothing more is asked, and the per-call
stream of `_http` works as before.  Every stream is capped like any body
(`MAX_RESPONSE_BODY_BYTES`); past it, it is opened again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import anyio
import httpx2

from ._connection_errors import MCPConnectionError
from ._jsonrpc import IncomingKind, read_message
from ._stdio import IDLE_READ, IdleBudget

if TYPE_CHECKING:
    from ._http import HttpTransport, _SSEEvents

__all__ = ["FIRST_BACKOFF", "MAX_BACKOFF", "hold_event_stream"]

FIRST_BACKOFF: Final = 1.0
MAX_BACKOFF: Final = 30.0
"""Seconds between two attempts to open the stream, at most (the server's own `retry`
is capped at 10 s, as a resumption's is)."""
# A stream that lasted this long was healthy: the next wait starts from the first again.
_HEALTHY_SECONDS: Final = 30.0
_TRY_AGAIN: Final = frozenset({409, 429})


async def hold_event_stream(transport: HttpTransport) -> None:
    """Hold the session's standalone GET stream open until the transport closes or the
    server says it offers none (see the module's docstring)."""
    from ._http import _SSEEvents

    events = _SSEEvents()
    backoff = FIRST_BACKOFF
    budget = IdleBudget()
    with anyio.CancelScope() as scope:
        transport._in_flight.add(scope)  # `aclose` cancels it, as it does a request
        try:
            while transport._closed is None:
                opened = anyio.current_time()
                try:
                    carried = await _one_stream(transport, events, budget)
                except (httpx2.HTTPError, MCPConnectionError):
                    carried = False  # unreachable, broken, or over the cap: try again
                finally:
                    transport._stream_held = False
                if carried is None:
                    return
                if carried or anyio.current_time() - opened >= _HEALTHY_SECONDS:
                    backoff = FIRST_BACKOFF
                wait = backoff
                if events.retry_ms is not None:
                    wait = min(events.retry_ms / 1000, 10.0)
                await anyio.sleep(wait)
                backoff = min(backoff * 2, MAX_BACKOFF)
        finally:
            transport._in_flight.discard(scope)


async def _one_stream(
    transport: HttpTransport, events: _SSEEvents, budget: IdleBudget
) -> bool | None:
    """Open the stream once and read it to its end: whether it carried a message, or
    None when the server offers no stream (nothing more is to be asked)."""
    from ._http import LAST_EVENT_ID_HEADER, _sse_data

    headers = transport._headers()
    headers.pop("content-type", None)
    headers["accept"] = "text/event-stream"
    if events.last_id is not None:
        headers[LAST_EVENT_ID_HEADER] = events.last_id
    carried = False
    async with transport.client.stream("GET", transport.url, headers=headers) as response:
        status = response.status_code
        if status in _TRY_AGAIN or status >= 500:
            return False
        content_type = response.headers.get("content-type", "").partition(";")[0]
        if status != 200 or content_type.strip().lower() != "text/event-stream":
            return None  # 405 and the like: the server pushes nothing this way
        transport._stream_held = True
        events.restart()
        async for data in _sse_data(response, transport.server, events):
            if not data.strip():
                continue  # a priming event: an id, and maybe a retry
            incoming = read_message(data)
            listener = transport.listener
            if listener is not None and incoming.kind in (
                IncomingKind.REQUEST,
                IncomingKind.NOTIFICATION,
            ):
                carried = True
                await listener(incoming, IDLE_READ)
            await budget.spend()
    return carried
