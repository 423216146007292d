"""Streamable HTTP for the proxy: who may reach it, what its requests must be, and serving.

On a loopback address the listener is guarded against DNS rebinding: a page
on any site can make a browser send requests to 127.0.0.2 or `[::1]` under a
name its attacker controls, so every request must name this listener in its
`Host` (the bound address or `localhost`, with the bound port) and, when it
carries an `Origin`, come from one of those.  This holds for every loopback
address (all of 127/8, `[::1]` however written), not only the three the SDK
knows.  A non-loopback listener needs `--allow-remote` and a bearer token,
which guards it instead.  Every POST body is read once, capped at 4 MiB, and
screened (`_host_messages`) before anything decodes it.  `Doorkeeper` makes
these checks first in the one ASGI callable (`_streamable.StreamableHTTP`)
that uvicorn serves; decision 0020.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import ipaddress
import json
import socket
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import IO, TYPE_CHECKING, Any, Final

import anyio
from mcp.server.lowlevel import Server as LowLevelServer

from ..principals import Principal
from ..sanitize import sanitize
from ._host_messages import Refusal, screen
from ._resource import PRINCIPAL_SCOPE_KEY
from ._streamable import StreamableHTTP
from .config import ConfigError

if TYPE_CHECKING:
    from ._http_front import HTTPFront
    from ._resource import ProtectedResource
    from ._resource import Refusal as TokenRefusal

__all__ = ["Doorkeeper", "allowed_host_names", "is_loopback", "serve_http", "split_http"]

# The SDK's own cap on a request body; a longer one is refused as it would be.
MAX_BODY_BYTES: Final = 4 * 1024 * 1024

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_http(http: str) -> tuple[str, int]:
    host, colon, port = http.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise ConfigError(f"--http {sanitize(http)} is not HOST:PORT")
    return host.strip("[]"), int(port)


def allowed_host_names(bound: str) -> frozenset[str]:
    """The names a request's Host may give for a loopback listener on `bound`."""
    if bound == "localhost":
        return frozenset({"localhost", "127.0.0.1", "[::1]"})
    address = ipaddress.ip_address(bound)
    if address.version == 6:
        # As the operator wrote it and in its short form: the same address.
        return frozenset({f"[{bound.lower()}]", f"[{address.compressed}]", "localhost"})
    return frozenset({bound, str(address), "localhost"})


async def _plain_response(send: Send, status: int, text: str) -> None:
    await send(
        {"type": "http.response.start", "status": status,
         "headers": [(b"content-type", b"text/plain; charset=utf-8")]}
    )  # fmt: skip
    await send({"type": "http.response.body", "body": text.encode("utf-8") + b"\n"})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or []:
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


class Doorkeeper:
    """Who may reach the listener, and what a POST body must be, checked once per request
    before anything else reads it: the loopback guard (Host, then Origin), the bearer token,
    the body cap, the screen."""

    def __init__(
        self,
        bound: str | None,
        port: int,
        token: str | None,
        log: IO[str],
        resource: ProtectedResource | None = None,
    ) -> None:
        # `bound` is None off loopback, where the token guards the listener instead.
        self.names = allowed_host_names(bound) if bound is not None else None
        self._names_by_port: dict[int, tuple[frozenset[str], frozenset[str]]] = {}
        self.port = port
        self.expected = f"Bearer {token}".encode() if token is not None else None
        self.log = log
        # `"principals"`: each request's bearer JWT is checked and its principal recorded.
        self.resource = resource

    async def admit(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The request's body (b"" unless it is a POST) when it may pass; None when it was
        answered here."""
        if self.names is not None and not await self._names_this_listener(scope, send):
            return None
        if self.expected is not None:
            given = _header(scope, b"authorization") or ""
            if not hmac.compare_digest(given.encode("latin-1"), self.expected):
                await _plain_response(send, 401, "a bearer token is required")
                return None
        if self.resource is not None and not await self._principal(scope, send):
            return None
        if scope.get("method") != "POST":
            return b""
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None  # the client went away before its body arrived
            body += message.get("body", b"")
            if len(body) > MAX_BODY_BYTES:
                await _plain_response(send, 413, "Request body too large")
                return None
            if not message.get("more_body", False):
                break
        content_type = (_header(scope, b"content-type") or "").lower()
        if content_type.startswith("application/json"):
            refused = screen(bytes(body))
            if refused is not None:
                await self._answer(send, refused)
                return None
        return bytes(body)

    async def _principal(self, scope: Scope, send: Send) -> bool:
        """Serve the resource's metadata, or admit a request whose token proves a principal
        (left in its scope for the call handlers); refuse it as RFC 6750 says otherwise."""
        assert self.resource is not None
        path = scope.get("path")
        if path in (self.resource.metadata_path, "/.well-known/oauth-protected-resource"):
            body = json.dumps(self.resource.metadata()).encode("utf-8")
            await send(
                {"type": "http.response.start", "status": 200,
                 "headers": [(b"content-type", b"application/json"),
                             (b"cache-control", b"max-age=300"),
                             (b"content-length", str(len(body)).encode())]}
            )  # fmt: skip
            await send({"type": "http.response.body", "body": body})
            return False
        checked = await self.resource.principal(_header(scope, b"authorization"))
        if isinstance(checked, Principal):
            scope[PRINCIPAL_SCOPE_KEY] = checked
            return True
        await self._unauthorized(send, checked)
        return False

    async def _unauthorized(self, send: Send, refusal: TokenRefusal) -> None:
        assert self.resource is not None
        if refusal.error:  # a request with no token at all is a host's first knock, not news
            self.log.write(f"agentrt proxy: refused an HTTP request: {refusal.description}\n")
            self.log.flush()
        document = {"error": refusal.error or "invalid_request",
                    "error_description": refusal.description}  # fmt: skip
        body = json.dumps(document).encode("utf-8")
        challenge = self.resource.challenge(refusal).encode("latin-1", "replace")
        await send(
            {"type": "http.response.start", "status": refusal.status,
             "headers": [(b"content-type", b"application/json"),
                         (b"www-authenticate", challenge),
                         (b"content-length", str(len(body)).encode())]}
        )  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    async def _names_this_listener(self, scope: Scope, send: Send) -> bool:
        assert self.names is not None
        # The port actually bound (the operator may have asked for port 0).
        server = scope.get("server")
        port = server[1] if server else self.port
        allowed, origins = self._named(port)
        host = (_header(scope, b"host") or "").lower()
        if host not in allowed:
            self._refused("Host", host)
            await _plain_response(send, 421, "Invalid Host header")
            return False
        origin = _header(scope, b"origin")
        if origin is not None and origin.lower() not in origins:
            self._refused("Origin", origin)
            await _plain_response(send, 403, "Invalid Origin header")
            return False
        return True

    def _named(self, port: int) -> tuple[frozenset[str], frozenset[str]]:
        """The Host values and Origins naming this listener on `port` (made once a port)."""
        named = self._names_by_port.get(port)
        if named is None:
            assert self.names is not None
            allowed = frozenset(f"{name}:{port}" for name in self.names)
            named = (allowed, frozenset(f"http://{address}" for address in allowed))
            self._names_by_port[port] = named
        return named

    def _refused(self, header: str, value: str) -> None:
        self.log.write(
            f"agentrt proxy: refused an HTTP request whose {header} is "
            f"{sanitize(repr(value))[:200]}, not this listener\n"
        )
        self.log.flush()

    async def _answer(self, send: Send, refused: Refusal) -> None:
        self.log.write(refused.log_line + "\n")
        self.log.flush()
        status = 400 if "error" in refused.reply else 200
        body = refused.body()
        await send(
            {"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
        )  # fmt: skip
        await send({"type": "http.response.body", "body": body})


async def serve_http(
    server: LowLevelServer[Any],
    host: str,
    port: int,
    token: str | None,
    log: IO[str],
    stopping: anyio.Event,
    listener: socket.socket,
    resource: ProtectedResource | None = None,
    front: HTTPFront | None = None,
) -> None:
    """Serve streamable HTTP on `listener` (from `listen`) until `stopping` is set;
    calls in flight then finish and are answered, then the sessions end.  With
    `resource`, every request needs a bearer JWT it accepts (`_resource.py`)."""
    import uvicorn

    doorkeeper = Doorkeeper(host if is_loopback(host) else None, port, token, log, resource)
    app = StreamableHTTP(server, doorkeeper.admit, log, front=front)
    # One ASGI callable and nothing around it: no lifespan (the sessions run in
    # `app.running()`), no websockets, no X-Forwarded-* rewriting of the client's address
    # (nothing here reads it; uvicorn's middleware for it wrapped every request), and no
    # access log (its line was formatted per response even with the logger off).
    # httptools (decision 0019), each answer written once (`_http_writes`, decision 0054).
    from ._http_writes import OneWriteHttpTools

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="off", http=OneWriteHttpTools,
        ws="none", proxy_headers=False, access_log=False,
    )  # fmt: skip

    class _Server(uvicorn.Server):
        # uvicorn re-raises the signal it caught once it stops, which would end
        # the process before the calls in flight are recorded and the upstream
        # servers closed; the proxy's own watcher stops it instead.
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    server_http = _Server(config)

    async def stop_when_asked() -> None:
        await stopping.wait()
        # uvicorn waits for every open response before it stops: the standalone streams,
        # which never end by themselves, end now; the answers in flight are waited for.
        app.drain()
        server_http.should_exit = True

    shown = f"[{host}]" if ":" in host else host
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]  # "uvloop" or "asyncio"
    log.write(
        f"agentrt proxy: serving streamable HTTP on http://{shown}:{port}/mcp"
        f" (event loop: {loop})\n"
    )
    log.flush()
    async with app.running(), anyio.create_task_group() as group:
        group.start_soon(stop_when_asked)
        await server_http.serve(sockets=[listener])
        group.cancel_scope.cancel()


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything starts so a taken port is one sentence
    (and exit 1), not uvicorn's exit from inside the server."""
    shown = f"[{host}]" if ":" in host else host
    # IPPROTO_TCP named: asyncio turns Nagle off (TCP_NODELAY) only on a connection whose
    # socket says it is TCP, and an accepted socket inherits the listener's protocol.  With
    # Nagle on, a response's body waits behind its headers for the host's delayed ACK on a
    # kept-alive connection (~40 ms per answer).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(128)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"--http {shown}:{port}: the address is in use by another program; "
                "choose another port"
            ) from None
        raise ConfigError(f"--http {shown}:{port} cannot be served: {exc.strerror}") from None
    listener.setblocking(False)
    return listener
