"""The proxy's HTTP connections write each answer once (`_http_writes`, decision 0054):
the status line, headers and body of a JSON answer leave in one write, an event stream's
frames still leave as they come, and a closing connection sends what it holds first."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from agentrt.proxy._http_writes import OneWriteHttpTools

App = Callable[[Any, Any, Any], Awaitable[None]]


class _Transport(asyncio.Transport):
    """A connection that records what the server writes, each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _connection(protocol_class: type[HttpToolsProtocol], app: App) -> tuple[Any, _Transport]:
    config = Config(app, lifespan="off", http=protocol_class, log_level="warning")
    config.load()
    protocol = protocol_class(config, ServerState(), {}, _loop=asyncio.get_running_loop())
    transport = _Transport()
    protocol.connection_made(transport)
    return protocol, transport


_POST = (
    b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\n\r\n{}"
)


async def _json_answer(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    body = b'{"jsonrpc":"2.0","id":1,"result":{}}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


async def _settled(transport: _Transport, writes: int) -> None:
    for _ in range(100):
        if len(transport.writes) >= writes:
            break
        await asyncio.sleep(0)
    for _ in range(5):  # and nothing more comes of this turn
        await asyncio.sleep(0)


async def test_a_json_answer_leaves_the_proxy_in_one_write() -> None:
    protocol, transport = _connection(OneWriteHttpTools, _json_answer)
    protocol.data_received(_POST)
    await _settled(transport, 1)
    assert len(transport.writes) == 1
    (written,) = transport.writes
    assert written.startswith(b"HTTP/1.1 200 OK\r\n")
    assert written.endswith(b'\r\n\r\n{"jsonrpc":"2.0","id":1,"result":{}}')
    assert not transport.closed  # kept alive for the host's next request


async def test_uvicorns_own_protocol_writes_the_same_answer_twice() -> None:
    # What the proxy served before (and what the test above fails on): headers, then body.
    protocol, transport = _connection(HttpToolsProtocol, _json_answer)
    protocol.data_received(_POST)
    await _settled(transport, 2)
    assert len(transport.writes) == 2
    assert transport.writes[1] == b'{"jsonrpc":"2.0","id":1,"result":{}}'


async def test_an_event_streams_frames_leave_as_they_come_not_held_for_the_end() -> None:
    second = asyncio.Event()

    async def stream(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"data: progress\r\n\r\n",
                    "more_body": True})  # fmt: skip
        await second.wait()
        await send({"type": "http.response.body", "body": b"data: answer\r\n\r\n"})

    protocol, transport = _connection(OneWriteHttpTools, stream)
    protocol.data_received(_POST)
    await _settled(transport, 1)
    # The headers and the first frame, sent in one turn, went out together and at once.
    assert len(transport.writes) == 1
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"data: progress\r\n\r\n" in transport.writes[0]
    assert b"answer" not in transport.writes[0]
    second.set()
    await _settled(transport, 2)
    assert len(transport.writes) == 2
    assert b"data: answer\r\n\r\n" in transport.writes[1]
    assert transport.writes[1].endswith(b"0\r\n\r\n")  # the chunked stream's end


async def test_a_closing_connection_sends_the_answer_it_holds_before_it_closes() -> None:
    protocol, transport = _connection(OneWriteHttpTools, _json_answer)
    protocol.data_received(_POST.replace(b"Host:", b"Connection: close\r\nHost:"))
    for _ in range(20):
        if transport.closed:
            break
        await asyncio.sleep(0)
    assert transport.closed
    assert len(transport.writes) == 1
    assert transport.writes[0].endswith(b'{"jsonrpc":"2.0","id":1,"result":{}}')
    assert b"connection: close\r\n" in transport.writes[0]


async def test_nothing_is_written_to_a_connection_the_host_has_left() -> None:
    protocol, transport = _connection(OneWriteHttpTools, _json_answer)
    protocol.data_received(_POST)
    transport.closed = True  # the host went away within the turn the answer was sent
    await _settled(transport, 1)
    assert transport.writes == []


pytestmark = pytest.mark.anyio
