"""A real HTTP server on 127.0.0.1, in a thread, that plays a model endpoint.

Each test queues the answers it wants (`server.answer(...)`) and reads back
every request the server received (`server.requests`), so a test can prove
both what an adapter sent and that it sent nothing at all.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    chunked: bool = False
    delay: float = 0.0
    drop: bool = False


class QuietHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up on purpose (a refused body) is not news.
        pass


class FakeModelServer:
    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._answers: list[Answer] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                with server._lock:
                    server.requests.append(
                        Received("POST", self.path, dict(self.headers.items()), body)
                    )
                    answer = server._answers.pop(0) if server._answers else Answer(500, b"{}")
                if answer.delay:
                    time.sleep(answer.delay)
                if answer.drop:
                    # Read the whole request, then hang up without a byte of answer.
                    self.close_connection = True
                    return
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    if answer.chunked:
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        step = 64 * 1024
                        for start in range(0, len(answer.body), step):
                            piece = answer.body[start : start + step]
                            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                        self.wfile.write(b"0\r\n\r\n")
                    else:
                        self.send_header("Content-Length", str(len(answer.body)))
                        self.end_headers()
                        self.wfile.write(answer.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def answer(
        self,
        body: Any = None,
        *,
        status: int = 200,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        chunked: bool = False,
        delay: float = 0.0,
        drop: bool = False,
    ) -> None:
        data = raw if raw is not None else json.dumps(body).encode()
        all_headers = {"Content-Type": "application/json"}
        all_headers.update(headers or {})
        with self._lock:
            self._answers.append(Answer(status, data, all_headers, chunked, delay, drop))

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def model_server() -> Iterator[FakeModelServer]:
    server = FakeModelServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def other_server() -> Iterator[FakeModelServer]:
    """A second endpoint, e.g. the target of a redirect that must never be reached."""
    server = FakeModelServer()
    try:
        yield server
    finally:
        server.close()
