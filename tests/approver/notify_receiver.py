"""A real receiving HTTP server for notifications: it checks each signature independently
(hmac over the documented input), counts what it got by idempotency key, and can be taken
down and brought back on the same port."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import uvicorn

from agentrt.inbox._serve import Listener, _bind, _Server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Receiver:
    """What arrived, by `Idempotency-Key`; requests whose signature failed, counted apart."""

    secret: bytes
    port: int = field(default_factory=free_port)
    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    bad_signatures: int = 0
    held: bool = False
    """Whether each signed delivery is left unanswered until `release()`: a receiver slower
    than anything the sender could wait for."""
    holding: int = 0
    _released: anyio.Event | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/agentrt"

    def release(self) -> None:
        """Answer the deliveries held so far, and those that come later, at once."""
        self.held = False
        if self._released is not None:
            self._released.set()

    def delivered_keys(self) -> set[str]:
        return {key for key, _ in self.received}

    def by_key(self) -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = {}
        for key, body in self.received:
            found.setdefault(key, []).append(body)
        return found

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {name.decode().lower(): value.decode() for name, value in scope["headers"]}
        signed = (
            f"{headers.get('x-approval-timestamp')}\n{headers.get('x-approval-nonce')}\n"
            f"{scope['method']}\n{scope['raw_path'].decode()}\n"
        ).encode() + body
        expected = "v1=" + hmac.new(self.secret, signed, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, headers.get("x-approval-signature", "")):
            self.bad_signatures += 1
            status = 401
        else:
            if self.held:
                if self._released is None:
                    self._released = anyio.Event()
                self.holding += 1
                await self._released.wait()
            self.received.append((headers.get("idempotency-key", ""), json.loads(body)))
            status = 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        sock = _bind(Listener("127.0.0.1", self.port))
        server = _Server(
            uvicorn.Config(self.app, log_level="warning", lifespan="off", interface="asgi3")
        )
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: server.serve(sockets=[sock]))
            while not server.started:
                await anyio.sleep(0.01)
            try:
                yield
            finally:
                server.should_exit = True
                server.force_exit = True
        sock.close()
