"""One write per answer: uvicorn's httptools protocol with a connection's writes of one turn
of the event loop sent together (decision 0054).

uvicorn writes a response's status line and headers when the app sends
`http.response.start`, and its body on `http.response.body`: two `send`
system calls, two TCP segments (Nagle is off, decision 0019), and two
wake-ups of the host reading them, for every JSON answer.  The app sends the
two messages in one turn of the loop, so the connection's transport here
gathers what is written during a turn and writes it once, at the end of the
turn; an event stream's frames, written one at a time as they come, still go
out as they come.  Everything else (parsing, keep-alive, flow control,
pipelining, timeouts, shutdown) is uvicorn's own.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["GatheredWrites", "OneWriteHttpTools"]


class GatheredWrites:
    """A connection's transport whose writes in one turn of the loop are sent as one."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    def flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if self._transport.is_closing():
            return  # the host left: nothing to write to, as a closed transport drops it
        self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        # Reading, flow control, extra info: the transport's own.
        return getattr(self._transport, name)


class OneWriteHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol, writing through `GatheredWrites`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Flow control (pausing reads) stays on the transport itself.
        self.transport = GatheredWrites(transport, self.loop)  # type: ignore[assignment]
