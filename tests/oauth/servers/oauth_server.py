"""An authorization server and a protected MCP server, built from the SDK's `mcp.server.auth`.

Run: python oauth_server.py [--access-ttl SECONDS] [--scopes "read admin"]
[--default-scope read] [--client ID:SECRET] [--no-registration] [--state-file PATH]
It binds a free port on 127.0.0.1 and prints it.  One origin serves both
halves: the authorization server's metadata, registration, `/authorize`
(which sends the browser to a consent page with an "Allow" button), `/token`
and `/revoke`; and the MCP endpoint `/mcp`, which answers 401 with
`WWW-Authenticate` (RFC 9728) without a token issued for it.

Tokens expire after `--access-ttl` seconds; every refresh rotates the refresh
token and revokes the old one, so a refresh token used twice is refused, as
a real server's is.  The authorization response carries `iss` (RFC 9207).

Tools: `whoami` (any token) and `admin_reset` (needs the `admin` scope: without
it the server answers HTTP 403 `insufficient_scope`, the step-up challenge).
`POST /test/revoke-all` (no token) revokes every token, for the tests'
"revoked refresh token" case; `GET /test/log` returns the Authorization
headers the MCP endpoint saw, and the assertions the token endpoint took.

The grants without a person (decision 0045): `--jwt-client ID:PUBLIC_PEM` registers a
client that authenticates with `private_key_jwt` (RFC 7523 section 2.2: a JWT signed by
its key, `iss` and `sub` the client, `aud` the issuer); `--idp-key PRIVATE_PEM` makes
`/idp` an enterprise identity provider whose token endpoint `/idp/token` exchanges an ID
token it signed (audience `idp-client`) for an ID-JAG (RFC 8693, SEP-990), which
`/token` takes in the jwt-bearer grant from a `--client` with its secret.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import math
import secrets
import socket
import time
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode

import jwt
import uvicorn
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyUrl
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

CLIENT_ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ID_TOKEN = "urn:ietf:params:oauth:token-type:id_token"
ID_JAG = "urn:ietf:params:oauth:token-type:id-jag"


class LoopbackClient(OAuthClientInformationFull):
    """A registered client whose loopback redirect URI may name any port (RFC 8252 7.3)."""

    def validate_redirect_uri(self, redirect_uri: AnyUrl | None) -> AnyUrl:
        if redirect_uri is not None and redirect_uri.host == "127.0.0.1":
            for registered in self.redirect_uris or []:
                if (registered.scheme, registered.host, registered.path) == (
                    redirect_uri.scheme,
                    redirect_uri.host,
                    redirect_uri.path,
                ):
                    return redirect_uri
        return super().validate_redirect_uri(redirect_uri)


class Provider:
    """An in-memory authorization server: clients, codes and tokens in dictionaries."""

    def __init__(
        self,
        issuer: str,
        resource: str,
        access_ttl: int,
        default_scopes: list[str],
        scopes: list[str],
    ):
        self.scopes = scopes
        self.issuer = issuer
        self.resource = resource
        self.access_ttl = access_ttl
        self.default_scopes = default_scopes
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.pending: dict[str, tuple[str, AuthorizationParams]] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.refreshes = 0
        self.refresh_ttl: int | None = None
        # The grants without a person: clients' public keys, the identity provider's key,
        # and every assertion the token endpoints took (for the tests' leak searches).
        self.jwt_clients: dict[str, Any] = {}
        self.idp_key: Any = None
        self.idp_jag_client = ""
        self.idp_exchanges = 0
        self.assertions: list[str] = []

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        client = self.clients.get(client_id)
        return None if client is None else LoopbackClient.model_validate(client.model_dump())

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id is not None
        # A client may ask for any scope this server offers; the person decides at consent.
        client_info.scope = " ".join(self.scopes)
        self.clients[client_info.client_id] = client_info

    async def authorize(
        self, client: OAuthClientInformationFull, params: AuthorizationParams
    ) -> str:
        request_id = secrets.token_urlsafe(16)
        assert client.client_id is not None
        self.pending[request_id] = (client.client_id, params)
        return f"{self.issuer}/consent?{urlencode({'request': request_id})}"

    def approve(self, request_id: str) -> str:
        client_id, params = self.pending.pop(request_id)
        code = secrets.token_urlsafe(32)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or self.default_scopes,
            expires_at=time.time() + 300,
            client_id=client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        return construct_redirect_uri(
            str(params.redirect_uri), code=code, state=params.state, iss=self.issuer
        )

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        code = self.codes.get(authorization_code)
        return code if code is not None and code.client_id == client.client_id else None

    def _issue(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        access = "at-" + secrets.token_urlsafe(24)
        refresh = "rt-" + secrets.token_urlsafe(24)
        expires = math.ceil(time.time()) + self.access_ttl
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=expires, resource=resource
        )
        ends = None if self.refresh_ttl is None else math.ceil(time.time()) + self.refresh_ttl
        self.refresh[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, resource=resource, expires_at=ends
        )
        return OAuthToken(
            access_token=access,
            token_type="Bearer",
            expires_in=self.access_ttl,
            scope=" ".join(scopes),
            refresh_token=refresh,
        )

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)
        assert client.client_id is not None
        return self._issue(client.client_id, authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> RefreshToken | None:
        token = self.refresh.get(refresh_token)
        if token is not None and token.expires_at is not None and token.expires_at < time.time():
            return None  # ended
        return token if token is not None and token.client_id == client.client_id else None

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        if self.refresh.pop(refresh_token.token, None) is None:
            raise TokenError(error="invalid_grant", error_description="refresh token already used")
        self.refreshes += 1
        assert client.client_id is not None
        return self._issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def exchange_client_credentials(
        self, client: OAuthClientInformationFull, scopes: list[str], resource: str | None
    ) -> OAuthToken:
        assert client.client_id is not None
        return self._issue(client.client_id, scopes, resource)

    async def load_access_token(self, token: str) -> AccessToken | None:
        access = self.access.get(token)
        if access is None or (access.expires_at is not None and access.expires_at < time.time()):
            return None
        if access.resource != self.resource:
            return None  # a token issued for another resource is not accepted here
        return access

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)


def _requiring_admin(app: Any, provider: Provider, seen: list[str]) -> Any:
    """Answer 403 insufficient_scope to a call of `admin_reset` made without `admin`."""

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/mcp" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        authorization = dict(scope["headers"]).get(b"authorization", b"").decode()
        seen.append(authorization)
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        token = provider.access.get(authorization.removeprefix("Bearer "))
        try:
            message = json.loads(body)
        except ValueError:
            message = {}
        wants_admin = (
            isinstance(message, dict)
            and message.get("method") == "tools/call"
            and message.get("params", {}).get("name") == "admin_reset"
        )
        if wants_admin and token is not None and "admin" not in token.scopes:
            challenge = (
                'Bearer error="insufficient_scope", scope="read admin", '
                f'resource_metadata="{provider.issuer}/.well-known/oauth-protected-resource/mcp"'
            )
            await send(
                {
                    "type": "http.response.start",
                    "status": 403,
                    "headers": [(b"www-authenticate", challenge.encode())],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        delivered = False

        async def replay() -> Any:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await app(scope, replay, send)

    return guarded


def _misbehaving(app: Any, arguments: Any, resource: str) -> Any:
    """The attacks a test asks for: another resource in the metadata, metadata named on
    another origin, a token endpoint that answers a refresh with a redirect."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        path = scope["path"]
        if arguments.prm_resource and path.startswith("/.well-known/oauth-protected-resource"):
            origin = resource.rsplit("/", 1)[0]
            body = json.dumps(
                {"resource": arguments.prm_resource, "authorization_servers": [origin]}
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        if arguments.token_redirect and path == "/token":
            chunks = []
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            body = b"".join(chunks)
            if b"grant_type=refresh_token" in body:
                await send(
                    {
                        "type": "http.response.start",
                        "status": 307,
                        "headers": [(b"location", arguments.token_redirect.encode())],
                    }
                )
                await send({"type": "http.response.body", "body": b""})
                return
            delivered = False

            async def replay() -> Any:
                nonlocal delivered
                if delivered:
                    return await receive()
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}

            await app(scope, replay, send)
            return

        async def rewriting(message: Any) -> None:
            if arguments.metadata_origin and message["type"] == "http.response.start":
                headers = []
                for key, value in message["headers"]:
                    if key.lower() == b"www-authenticate":
                        value = value.replace(
                            resource.rsplit("/", 1)[0].encode(), arguments.metadata_origin.encode()
                        )
                    headers.append((key, value))
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive, rewriting)

    return wrapped


def _client_credentials(app: Any, provider: Provider) -> Any:
    """The client credentials grant at /token (the SDK's token handler has none): a
    pre-registered client with its secret, in the body or as HTTP Basic."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in ("/token", "/idp/token"):
            await app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        form = dict(parse_qsl(body.decode()))
        grant_type = form.get("grant_type")
        invalid_grant = False
        if scope["path"] == "/idp/token":
            status, answer = _idp_token_exchange(provider, form)
            await _answer(send, status, answer)
            return
        if grant_type not in ("client_credentials", JWT_BEARER):
            delivered = False

            async def replay() -> Any:
                nonlocal delivered
                if delivered:
                    return await receive()
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}

            await app(scope, replay, send)
            return
        client_id, secret = form.get("client_id"), form.get("client_secret")
        basic = dict(scope["headers"]).get(b"authorization", b"").decode()
        if basic.startswith("Basic "):
            client_id, _, secret = base64.b64decode(basic[6:]).decode().partition(":")
            client_id, secret = unquote(client_id), unquote(secret)
        if "client_assertion" in form:
            provider.assertions.append(form["client_assertion"])
            client_id = _assertion_client(provider, form)
            client = provider.clients.get(client_id or "")
        else:
            client = provider.clients.get(client_id or "")
            if client is None or not secret or client.client_secret != secret:
                client = None
        if client is not None and grant_type == JWT_BEARER:
            provider.assertions.append(form.get("assertion", ""))
            if not _id_jag_accepted(provider, form, client.client_id or ""):
                client, invalid_grant = None, True
        if client is None:
            status, answer = (400, {"error": "invalid_grant"}) if invalid_grant else (
                401, {"error": "invalid_client"})  # fmt: skip
        elif form.get("resource") != provider.resource:
            status, answer = 400, {"error": "invalid_target"}
        else:
            scopes = form.get("scope", "").split() or provider.default_scopes
            token = provider._issue(client.client_id or "", scopes, form.get("resource"))
            token.refresh_token = None
            status, answer = 200, token.model_dump(exclude_none=True)
        await _answer(send, status, answer)

    return wrapped


async def _answer(send: Any, status: int, answer: dict[str, Any]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(answer).encode()})


def _assertion_client(provider: Provider, form: dict[str, str]) -> str | None:
    """The client a `private_key_jwt` assertion proves, or None when it proves none."""
    if form.get("client_assertion_type") != CLIENT_ASSERTION_TYPE:
        return None
    try:
        claims = jwt.decode(form["client_assertion"], options={"verify_signature": False})
        key = provider.jwt_clients.get(str(claims.get("iss")))
        if key is None or claims.get("sub") != claims.get("iss"):
            return None
        jwt.decode(
            form["client_assertion"], key, algorithms=["ES256", "RS256", "EdDSA"],
            audience=[provider.issuer, provider.issuer + "/"], leeway=30,
        )  # fmt: skip
    except jwt.PyJWTError:
        return None
    return str(claims["iss"])


def _idp_token_exchange(provider: Provider, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """The identity provider's token exchange: its own ID token in, an ID-JAG out."""
    if provider.idp_key is None:
        return 404, {"error": "not_found"}
    provider.idp_exchanges += 1
    if (
        form.get("grant_type") != TOKEN_EXCHANGE
        or form.get("requested_token_type") != ID_JAG
        or form.get("subject_token_type") != ID_TOKEN
        or not form.get("audience")
        or not form.get("resource")
    ):
        return 400, {"error": "invalid_request"}
    try:
        claims = jwt.decode(
            form.get("subject_token", ""), provider.idp_key.public_key(), algorithms=["ES256"],
            audience="idp-client", issuer=provider.issuer + "/idp",
        )  # fmt: skip
    except jwt.PyJWTError:
        return 400, {"error": "invalid_grant"}
    now = int(time.time())
    grant = jwt.encode(
        {
            "iss": provider.issuer + "/idp", "sub": claims["sub"], "aud": form["audience"],
            "resource": form["resource"], "client_id": provider.idp_jag_client,
            "iat": now, "exp": now + 300, "jti": secrets.token_urlsafe(12),
        },
        provider.idp_key, algorithm="ES256", headers={"typ": "oauth-id-jag+jwt"},
    )  # fmt: skip
    provider.assertions.append(grant)
    return 200, {"access_token": grant, "issued_token_type": ID_JAG, "token_type": "N_A"}


def _id_jag_accepted(provider: Provider, form: dict[str, str], client_id: str) -> bool:
    """Whether the jwt-bearer grant's assertion is an ID-JAG for this server and client."""
    if provider.idp_key is None:
        return False
    try:
        if jwt.get_unverified_header(form.get("assertion", "")).get("typ") != "oauth-id-jag+jwt":
            return False
        claims = jwt.decode(
            form.get("assertion", ""), provider.idp_key.public_key(), algorithms=["ES256"],
            audience=[provider.issuer, provider.issuer + "/"], issuer=provider.issuer + "/idp",
        )  # fmt: skip
    except jwt.PyJWTError:
        return False
    return claims.get("client_id") == client_id and claims.get("resource") == provider.resource


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--access-ttl", type=int, default=3600)
    parser.add_argument("--scopes", default="read admin")
    parser.add_argument("--default-scope", default="read")
    parser.add_argument("--client", action="append", default=[])
    parser.add_argument("--no-registration", action="store_true")
    parser.add_argument("--prm-resource", help="publish this resource in the metadata instead")
    parser.add_argument("--metadata-origin", help="name resource metadata on this origin")
    parser.add_argument("--token-redirect", help="answer a refresh with a redirect here")
    parser.add_argument("--refresh-ttl", type=int, help="refresh tokens end after this")
    parser.add_argument("--jwt-client", action="append", default=[], help="ID:PUBLIC_PEM")
    parser.add_argument("--idp-key", help="the identity provider's private key (PEM)")
    arguments = parser.parse_args()

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    origin = f"http://127.0.0.1:{port}"
    resource = f"{origin}/mcp"
    scopes = arguments.scopes.split()
    provider = Provider(
        origin, resource, arguments.access_ttl, arguments.default_scope.split(), scopes
    )
    for pair in arguments.client:
        client_id, _, secret = pair.partition(":")
        provider.clients[client_id] = OAuthClientInformationFull(
            client_id=client_id,
            client_secret=secret or None,
            redirect_uris=None,
            token_endpoint_auth_method="client_secret_post" if secret else "none",
            grant_types=["authorization_code", "refresh_token", "client_credentials"],
            scope=" ".join(scopes),
        )
    for pair in arguments.jwt_client:
        client_id, _, key_path = pair.partition(":")
        with open(key_path, "rb") as handle:
            provider.jwt_clients[client_id] = load_pem_public_key(handle.read())
        provider.clients[client_id] = OAuthClientInformationFull(
            client_id=client_id,
            redirect_uris=None,
            token_endpoint_auth_method="private_key_jwt",
            grant_types=["client_credentials"],
            scope=" ".join(scopes),
        )
    if arguments.idp_key:
        with open(arguments.idp_key, "rb") as handle:
            provider.idp_key = load_pem_private_key(handle.read(), password=None)
        provider.idp_jag_client = arguments.client[0].partition(":")[0]
    server = MCPServer(
        "oauth-test",
        auth_server_provider=provider,  # type: ignore[arg-type]
        auth=AuthSettings(
            issuer_url=origin,  # type: ignore[arg-type]
            resource_server_url=resource,  # type: ignore[arg-type]
            validate_token_resource=True,
            client_registration_options=ClientRegistrationOptions(
                enabled=not arguments.no_registration, valid_scopes=scopes
            ),
            revocation_options=RevocationOptions(enabled=True),
            required_scopes=[],
        ),
    )

    @server.tool()
    def whoami() -> str:
        """Say who the caller is."""
        return "an authorized client"

    @server.tool()
    def admin_reset() -> str:
        """Reset everything (needs the admin scope)."""
        return "reset done"

    @server.custom_route("/consent", methods=["GET"])
    async def consent_page(request: Request) -> Response:
        request_id = request.query_params.get("request", "")
        if request_id not in provider.pending:
            return HTMLResponse("<p>unknown request</p>", status_code=400)
        scope = " ".join(provider.pending[request_id][1].scopes or provider.default_scopes)
        return HTMLResponse(
            "<!doctype html><title>Consent</title>"
            f"<p>Allow the client to use <b id='scope'>{html.escape(scope)}</b>?</p>"
            "<form method='post' action='/consent'>"
            f"<input type='hidden' name='request' value='{html.escape(request_id)}'>"
            "<button id='allow' type='submit'>Allow</button></form>"
        )

    @server.custom_route("/consent", methods=["POST"])
    async def consent(request: Request) -> Response:
        form = await request.form()
        request_id = str(form.get("request", ""))
        if request_id not in provider.pending:
            return HTMLResponse("<p>unknown request</p>", status_code=400)
        return RedirectResponse(provider.approve(request_id), status_code=302)

    seen: list[str] = []

    @server.custom_route("/test/revoke-all", methods=["POST"])
    async def revoke_all(request: Request) -> Response:
        provider.access.clear()
        provider.refresh.clear()
        return JSONResponse({"revoked": True})

    @server.custom_route("/test/log", methods=["GET"])
    async def log(request: Request) -> Response:
        return JSONResponse(
            {
                "authorization": seen,
                "refreshes": provider.refreshes,
                "assertions": provider.assertions,
                "idp_exchanges": provider.idp_exchanges,
            }
        )

    app = _requiring_admin(server.streamable_http_app(json_response=True), provider, seen)
    app = _misbehaving(_client_credentials(app, provider), arguments, resource)
    provider.refresh_ttl = arguments.refresh_ttl
    print(port, flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on")).run(sockets=[sock])


if __name__ == "__main__":
    main()
