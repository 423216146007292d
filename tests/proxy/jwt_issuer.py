"""A small OAuth authorization server for the principals tests: real signed JWT access
tokens (RFC 9068) from its token endpoint, its keys at its `jwks_uri`, its metadata
(RFC 8414) — all on joserfc and the standard library, on a loopback port of its own.

`jwks_mode` makes its key endpoint misbehave on purpose: "slow" (answers after
`slow_seconds`), "garbage" (not JSON), "huge" (more than the proxy reads).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from joserfc import jwt
from joserfc.jwk import ECKey, KeySet, RSAKey


@dataclass
class Client:
    secret: str
    subject: str
    groups: tuple[str, ...] = ()


@dataclass
class Issuer:
    """The server's state, which a test may change while it runs."""

    origin: str = ""
    keys: list[Any] = field(default_factory=list)
    clients: dict[str, Client] = field(default_factory=dict)
    jwks_mode: str = "ok"
    slow_seconds: float = 8.0
    jwks_fetches: int = 0

    @property
    def signing_key(self) -> Any:
        return self.keys[0]

    def rotate(self) -> Any:
        """A new signing key, published beside the old ones."""
        key = RSAKey.generate_key(2048, parameters={"kid": uuid.uuid4().hex[:8]}, private=True)
        self.keys.insert(0, key)
        return key

    def jwks(self) -> dict[str, Any]:
        return KeySet(self.keys).as_dict(private=False)

    def mint(
        self,
        subject: str,
        audience: str | list[str],
        *,
        scope: str = "mcp:tools",
        lifetime: float = 300,
        key: Any = None,
        algorithm: str = "RS256",
        client_id: str = "test-client",
        groups: tuple[str, ...] = (),
        **extra: Any,
    ) -> str:
        """A signed access token as the token endpoint issues it (or as a forger would,
        given another `key`)."""
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.origin,
            "sub": subject,
            "aud": audience,
            "iat": now,
            "nbf": now,
            "exp": int(now + lifetime),
            "jti": uuid.uuid4().hex,
            "client_id": client_id,
            "scope": scope,
            **extra,
        }
        if groups:
            claims["groups"] = list(groups)
        signing = key if key is not None else self.signing_key
        header = {"alg": algorithm, "kid": signing.kid, "typ": "at+jwt"}
        return jwt.encode(header, claims, signing, algorithms=[algorithm])


def _handler(issuer: Issuer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def _json(self, status: int, document: Any) -> None:
            body = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/.well-known/oauth-authorization-server":
                self._json(200, {
                    "issuer": issuer.origin,
                    "jwks_uri": f"{issuer.origin}/jwks",
                    "token_endpoint": f"{issuer.origin}/token",
                    "grant_types_supported": ["client_credentials"],
                    "response_types_supported": ["code"],
                })  # fmt: skip
            elif self.path == "/jwks":
                issuer.jwks_fetches += 1
                if issuer.jwks_mode == "slow":
                    time.sleep(issuer.slow_seconds)
                if issuer.jwks_mode == "garbage":
                    body = b"<html>not keys{{{"
                    self.send_response(200)
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if issuer.jwks_mode == "huge":
                    self._json(200, {"keys": [], "padding": "x" * (1024 * 1024)})
                    return
                self._json(200, issuer.jwks())
            else:
                self._json(404, {"error": "not_found"})

        def do_POST(self) -> None:
            if self.path != "/token":
                self._json(404, {"error": "not_found"})
                return
            length = int(self.headers.get("content-length", "0"))
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
            client = issuer.clients.get(form.get("client_id", ""))
            if client is None or client.secret != form.get("client_secret"):
                self._json(401, {"error": "invalid_client"})
                return
            if form.get("grant_type") != "client_credentials" or "resource" not in form:
                self._json(400, {"error": "invalid_request"})
                return
            token = issuer.mint(
                client.subject, form["resource"], scope=form.get("scope", "mcp:tools"),
                client_id=form["client_id"], groups=client.groups,
            )  # fmt: skip
            self._json(200, {"access_token": token, "token_type": "Bearer", "expires_in": 300})

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The proxy hangs up on a key endpoint told to be slow: that is the test, not news.
        return


@contextmanager
def running_issuer() -> Iterator[Issuer]:
    """The authorization server on a free loopback port, stopped afterwards."""
    issuer = Issuer()
    issuer.rotate()
    issuer.keys.append(ECKey.generate_key("P-256", parameters={"kid": "ec-1"}, private=True))
    server = _Server(("127.0.0.1", 0), _handler(issuer))
    issuer.origin = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield issuer
    finally:
        server.shutdown()
        server.server_close()
